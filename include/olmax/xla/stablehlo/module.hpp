#pragma once
// What the emitter hands the PJRT runtime: an emitted module (cache key, text, input and output
// types, donated state, SPMD partitioning).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "olmax/xla/stablehlo/ir.hpp"

namespace olmax::xla::stablehlo {

/// One emitted module: its cache key (the module name and a hash of its text; the runtime compiles
/// each key once), text, and the types of its inputs and outputs.
struct emitted_module {
    std::string key;
    std::string text;
    std::vector<tensor_type> inputs;
    std::vector<tensor_type> outputs;
    /// The first `donated` inputs are donated to the last `donated` outputs (updated in place on the
    /// device; an execution consumes those argument buffers).
    std::size_t donated = 0;
    /// SPMD (graph::spmd_partitioning): with `partitions` P > 1 the module is ONE global program for P
    /// devices; inputs flagged in `split_leading` are split along their first axis into P equal shares
    /// (device p takes share p), every other input and every output is replicated.
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

}  // namespace olmax::xla::stablehlo
