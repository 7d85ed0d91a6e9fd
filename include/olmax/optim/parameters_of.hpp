#pragma once
// The one bridge from layers to optimisers: every trainable tensor of a layer or model, with what the
// optimiser needs to know about it, read off the layer's own parameter walk (visit_parameters).

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "olmax/nn/contract.hpp"
#include "olmax/optim/param.hpp"

namespace olmax::optim {

/// Anything that walks its parameters the way layers do (a layer, a Stack, a whole model).
template <class M>
concept ParameterOwner = requires { typename M::value_type; } && Real<typename M::value_type> &&
                         requires(M& m, nn::ParameterVisitor<typename M::value_type>& visit) { m.visit_parameters(visit); };

/// Stacked axes of a parameter named by its walk: nn::Stack names each per-layer parameter
/// "*/<name>" over storage with a leading [depth] axis, so every "*" path segment is one axis that
/// indexes layers (nested stacks give several).
inline std::size_t stacked_axes_of(std::string_view name) {
    std::size_t axes = 0, start = 0;
    while (start <= name.size()) {
        const std::size_t end = std::min(name.find('/', start), name.size());
        if (name.substr(start, end - start) == "*") ++axes;
        start = end + 1;
    }
    return axes;
}

/// Every parameter of `owner` as optimiser::Parameter, in walk order, names prefixed by `prefix`
/// (none by default: a model's parameters are named by its own walk, e.g. "stack/*/reversible/...").
/// The same tensors in the same order as nn::parameters(owner), whose names add the owner's own
/// name in front ("stack/" + this name).
/// - role: as the layer declared it (weight decay groups select by role);
/// - stacked_axes: the "*" segments of the name (AGC never mixes layers of a Stack);
/// - unit_axis: 0 for embedding tables ([vocab, features]: one AGC unit per token row), else the
///   default -1 (the output axis of olmax's y = x @ W[in, out] layout).
template <ParameterOwner M>
std::vector<Parameter<typename M::value_type>> parameters_of(M& owner, std::string prefix = {}) {
    using T = typename M::value_type;
    std::vector<Parameter<T>> out;
    nn::ParameterVisitor<T> visit(
        [&out](const std::string& name, Tensor<T>& tensor, nn::Role role, nn::Sharing) {
            Parameter<T> p{name, role, tensor};
            p.stacked_axes = stacked_axes_of(name);
            if (role == nn::Role::embedding) p.unit_axis = 0;
            out.push_back(std::move(p));
        },
        std::move(prefix));
    owner.visit_parameters(visit);
    return out;
}

}  // namespace olmax::optim
