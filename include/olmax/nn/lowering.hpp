#pragma once
// Layers as traced programs (the whole-step XLA path, docs/xla.md): a layer that can run inside a
// compiled training step has a lowering rule, a member
//     xla::graph::var lower(const xla::graph::lowering& at, const xla::graph::var& x) const;
// that builds its forward from traced primitives with its parameters as graph values
// (olmax/backend/xla/graph/lowering.hpp). Its gradient is the graph's reverse mode, so one rule
// serves forward and backward. A layer without one cannot be traced: `nn::lower` stops at a
// static_assert that names the missing rule, never a silent host fallback inside a compiled step.

#include <concepts>
#include <vector>

#include "olmax/backend/xla/graph/layer_ops.hpp"
#include "olmax/backend/xla/graph/lowering.hpp"
#include "olmax/nn/contract.hpp"

namespace olmax::nn {

/// A layer with a lowering rule (see above).
template <class L>
concept LowerableLayer = requires(const L& layer, const xla::graph::lowering& at, const xla::graph::var& x) {
    { layer.lower(at, x) } -> std::same_as<xla::graph::var>;
};

/// What an invertible layer's traced backward returns (`lower_reverse`, e.g. nn::Reversible's): its
/// input rebuilt from its output, that input's gradient, and the gradients of the parameters it was
/// asked about.
struct LoweredReverse {
    xla::graph::var input, input_grad;
    std::vector<xla::graph::var> parameter_grads;
};

/// An invertible layer whose traced backward rebuilds its input from its output:
///     LoweredReverse lower_reverse(const lowering& at, const var& y, const var& dy,
///                                  const std::vector<var>& parameters) const;
/// nn::Stack then differentiates its layer loop by walking back from the last output, storing nothing
/// per layer (the traced counterpart of the eager reversible stack).
template <class L>
concept ReversiblyLowerableLayer =
    LowerableLayer<L> && requires(const L& layer, const xla::graph::lowering& at, const xla::graph::var& x, const std::vector<xla::graph::var>& p) {
        { layer.lower_reverse(at, x, x, p) } -> std::same_as<LoweredReverse>;
    };

/// `layer`'s forward on the traced value x, its parameters taken from `at`.
template <class L>
xla::graph::var lower(const L& layer, const xla::graph::lowering& at, const xla::graph::var& x) {
    static_assert(LowerableLayer<L>,
                  "olmax::nn::lower: this layer type has no XLA lowering rule (a member `xla::graph::var lower(const "
                  "xla::graph::lowering&, const xla::graph::var&) const`), so it cannot run in a compiled step; the layers with one are "
                  "listed in docs/xla.md");
    return layer.lower(at, x);
}

}  // namespace olmax::nn
