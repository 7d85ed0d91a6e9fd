#pragma once
// What a layer's lowering rule sees while a model is traced into a graph: its parameters as graph
// values, found by the names its `visit_parameters` gives them, and its position in a layer loop.
//
// A layer lowers itself with a member
//     var lower(const graph::lowering& at, const var& x) const;
// that builds the same function as its eager `forward` from primitives (layer_ops.hpp), asking
// `at.parameter("w0")` for a parameter and `at.child("conv0")` for a sub-layer's view (the same
// prefixes visit_parameters uses: "dense/conv0/weight"). nn::Stack runs its block's rule inside
// `scan_layers`, where the block's parameters are one layer's slices and `layer_index()` is the
// loop's counter. The gradient needs no rule of its own: it is the graph's reverse mode.

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "olmax/backend/xla/graph/graph.hpp"

namespace olmax::xla::graph {

class lowering {
public:
    /// Parameters by their full name ("stack/*/dense/conv0/weight").
    using parameter_map = std::map<std::string, var, std::less<>>;

    explicit lowering(std::shared_ptr<const parameter_map> parameters, var layer_index = {}, std::size_t layer_count = 1, std::string prefix = {})
        : parameters_(std::move(parameters)), layer_index_(layer_index), layer_count_(layer_count), prefix_(std::move(prefix)) {}

    /// The parameter this layer's visit_parameters names `name`.
    const var& parameter(std::string_view name) const {
        const std::string full = join(name);
        const auto it = parameters_->find(full);
        if (it == parameters_->end()) {
            std::string known;
            for (const auto& [k, v] : *parameters_) known += (known.empty() ? "" : ", ") + k;
            throw graph_error(olmax::detail::concat("xla::graph: lowering asked for parameter '", full, "', which is not traced (traced: ",
                                                    known.empty() ? std::string("none") : known, ")"));
        }
        return it->second;
    }
    /// The view of a sub-layer that visit_parameters visits as `visit.child(name, layer)`.
    lowering child(std::string_view name) const { return lowering(parameters_, layer_index_, layer_count_, join(name)); }
    /// The index of the layer being traced (f32 scalar) inside nn::Stack's loop; undefined outside
    /// one, where layers behave as layer 0 (LayerContext's default).
    const var& layer_index() const { return layer_index_; }
    /// How many layers the enclosing loop runs (1 outside one): a rule that depends on the layer
    /// index traces only the cases that occur.
    std::size_t layer_count() const { return layer_count_; }
    const std::string& prefix() const { return prefix_; }

private:
    std::string join(std::string_view name) const {
        if (prefix_.empty()) return std::string(name);
        return name.empty() ? prefix_ : prefix_ + "/" + std::string(name);
    }

    std::shared_ptr<const parameter_map> parameters_;
    var layer_index_;
    std::size_t layer_count_ = 1;
    std::string prefix_;
};

}  // namespace olmax::xla::graph
