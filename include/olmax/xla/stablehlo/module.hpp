#pragma once
// What the module library returns: an emitted module (cache key, text, input and output types),
// the key spelling of a shape, and the cache that emits each op + shape once.

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "olmax/xla/stablehlo/ir.hpp"

namespace olmax::xla::stablehlo {

/// One emitted module: its cache key (op + shapes), text, and the types of its inputs and outputs.
struct emitted_module {
    std::string key;
    std::string text;
    std::vector<tensor_type> inputs;
    std::vector<tensor_type> outputs;
    /// The first `donated` inputs are donated to the last `donated` outputs (updated in place on the
    /// device; an execution consumes those argument buffers).
    std::size_t donated = 0;
    /// SPMD data parallelism (XLA's partitioner): with `partitions` P > 1 the module is ONE global
    /// program compiled for P devices. Inputs flagged in `split_leading` are split along their first
    /// axis into P equal shares (device p takes share p); every other input and every output is
    /// replicated on all P devices.
    std::size_t partitions = 1;
    std::vector<bool> split_leading{};

    bool is_split(std::size_t input) const { return partitions > 1 && input < split_leading.size() && split_leading[input]; }
    /// The part of input `i` one device holds: its share when split, the whole input otherwise.
    tensor_type local_input(std::size_t i) const {
        tensor_type t = inputs.at(i);
        if (is_split(i)) t.dims[0] /= static_cast<std::int64_t>(partitions);
        return t;
    }
};

inline std::string dims_key(const dims_t& dims) {
    std::string s;
    for (std::size_t i = 0; i < dims.size(); ++i) {
        if (i) s += 'x';
        s += std::to_string(dims[i]);  // appended, not "x" + to_string(...): GCC 12 -O3 warns falsely there (-Warray-bounds)
    }
    return s.empty() ? "scalar" : s;
}

/// Emitted modules by key, so each op + shape is emitted (and, by the runtime, compiled) once.
/// Thread-safe; entries live as long as the cache.
class module_cache {
public:
    template <class Emit>
    const emitted_module& get(const std::string& key, Emit&& emit) {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = modules_.find(key);
        if (it == modules_.end()) it = modules_.emplace(key, emit()).first;
        return it->second;
    }
    std::size_t size() const {
        std::lock_guard<std::mutex> lock(mutex_);
        return modules_.size();
    }

private:
    mutable std::mutex mutex_;
    std::map<std::string, emitted_module> modules_;
};

}  // namespace olmax::xla::stablehlo
