#pragma once
// A state dictionary: the state of a stateful object (an optimiser's step counters and moments) as
// an ordered list of named int64 counters and float/double tensors.
//
// Why it is in core: it is the vocabulary by which one module hands its state to another without
// either including the other. optim::AdamW exports and imports one (`state_dict`,
// `load_state_dict`); io's checkpoints store one under "optim/" and read it back, knowing nothing of
// optimisers. Both sit above core and beside each other (docs/ARCHITECTURE.md, "Layers").

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "olmax/core/error.hpp"
#include "olmax/core/tensor.hpp"

namespace olmax {

class StateDict {
public:
    /// A counter, or a tensor (shared with the object that exported it unless it says otherwise).
    using Value = std::variant<std::int64_t, Tensor<float>, Tensor<double>>;
    struct Entry {
        std::string name;
        Value value;
    };

    /// Appends an entry; names are unique (a second `add` of a name throws `value_error`).
    void add(std::string name, Value value) {
        check(!name.empty(), "StateDict: empty entry name");
        check(index_.emplace(name, entries_.size()).second, "StateDict: entry '", name, "' added twice");
        entries_.push_back(Entry{std::move(name), std::move(value)});
    }

    /// The entry called `name`, or nullptr.
    const Value* find(std::string_view name) const {
        const auto it = index_.find(name);
        return it == index_.end() ? nullptr : &entries_[it->second].value;
    }

    /// The value of entry `name` as a `V` (std::int64_t, Tensor<float> or Tensor<double>); throws
    /// `value_error` naming `who` when the entry is missing or holds another type.
    template <class V>
    const V& get(std::string_view name, std::string_view who) const {
        const Value* value = find(name);
        check(value != nullptr, who, ": no entry '", name, "'");
        const V* typed = std::get_if<V>(value);
        check(typed != nullptr, who, ": entry '", name, "' holds ", type_name(*value), ", expected ", type_name_of<V>());
        return *typed;
    }

    std::size_t size() const { return entries_.size(); }
    bool empty() const { return entries_.empty(); }
    /// Entries in the order they were added (the order a checkpoint stores them in).
    const std::vector<Entry>& entries() const { return entries_; }
    auto begin() const { return entries_.begin(); }
    auto end() const { return entries_.end(); }

    /// "an int64", "a float32 tensor" or "a float64 tensor", for messages.
    template <class V>
    static std::string type_name_of() {
        if constexpr (std::is_same_v<V, std::int64_t>) return "an int64";
        else return "a " + std::string(dtype_name<typename V::value_type>()) + " tensor";
    }
    static std::string type_name(const Value& value) {
        return std::visit([]<class V>(const V&) { return type_name_of<V>(); }, value);
    }

private:
    std::vector<Entry> entries_;
    std::map<std::string, std::size_t, std::less<>> index_;
};

}  // namespace olmax
