#pragma once
// Zero-copy slices along the leading axis, used for the two streams of a reversible state
// ([2, ...]) and for one layer's slice of a stacked parameter ([depth, ...]).

#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/autodiff/gradient_hooks.hpp"
#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/op_keys.hpp"
#include "olmax/ops/shape.hpp"

namespace olmax::nn {

namespace detail {

/// A handle on `base`'s buffer starting `offset` elements in, with `shape`; not on the tape.
template <Real T>
Tensor<T> view_of(const Tensor<T>& base, std::size_t offset, const Shape& shape) {
    return olmax::detail::TensorAccess<T>::alias(base, offset, shape);
}

inline Shape drop_leading(const Shape& shape) { return Shape(shape.begin() + 1, shape.end()); }

}  // namespace detail

/// `x[index]` along the leading axis, sharing `x`'s buffer. Differentiable: the gradient is added
/// into the matching slice of `x`'s gradient.
template <Real T>
Tensor<T> take_leading(const Tensor<T>& x, std::size_t index) {
    backend::op_scope on("nn::take_leading", x);
    check<shape_error>(x.rank() >= 1 && index < x.shape()[0], "nn::take_leading: index ", index, " out of range for shape ",
                       to_string(x.shape()));
    return on.run<op::take_leading>({x}, {.index = index}, [&] {
        const Shape inner = detail::drop_leading(x.shape());
        const std::size_t offset = index * numel(inner);
        Tensor<T> out = detail::view_of(x, offset, inner);
        if (!autodiff::should_record(std::span<const Tensor<T>>(&x, 1))) return out;
        // The slice is all this node adds into, and all of it at once: a gradient hook may take it as
        // final (a stack's kept layer, whose optimiser update then runs here; gradient_hooks.hpp).
        autodiff::record<T>(
            "take_leading", std::span<const Tensor<T>>(&x, 1), std::span<Tensor<T>>(&out, 1),
            [impl = olmax::detail::impl_ptr_of(x), offset](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                if (!sink.needs(0)) return;
                if (!autodiff::offer_final_slice(*impl, offset, g[0]))
                    autodiff::accumulate_grad_slice(*impl, offset, g[0]);
            },
            {autodiff::InputSlice{0, offset, numel(inner)}});
        return out;
    });
}

/// Stacks equal-shaped tensors along a new leading axis: olmax::stack_leading (ops/shape.hpp).
using olmax::stack_leading;

/// The two-stream state [2, ...] of a reversible network from one input: both streams start as `x`
/// (the original Olmax feeds the embedding into both).
template <Real T>
Tensor<T> two_streams(const Tensor<T>& x) {
    return stack_leading<T>({x, x});
}

/// Sum of the two streams of a [2, ...] state (the original's `revnet_out`).
template <Real T>
Tensor<T> merge_streams(const Tensor<T>& state) {
    check<shape_error>(state.rank() >= 1 && state.shape()[0] == 2, "nn::merge_streams: expected a two-stream state [2, ...], got ",
                       to_string(state.shape()));
    return take_leading(state, 0) + take_leading(state, 1);
}

namespace detail {

/// Runs `f` (a reversible block's or stack's forward on `state`). A shape_error from a layer inside
/// gets a hint: a batch of 2 passed where nn::two_streams(x) belongs has the two-stream shape
/// [2, ...], so it is only the inner layer that finds each "stream" the wrong shape.
template <Real T, class F>
decltype(auto) hint_two_streams(const Tensor<T>& state, std::string_view layer, F&& f) {
    try {
        return std::forward<F>(f)();
    } catch (const shape_error& e) {
        const std::string what = e.what();
        if (what.find("nn::two_streams") != std::string::npos) throw;  // hinted already (a block inside a stack)
        Shape stream(state.shape().begin() + 1, state.shape().end());
        throw shape_error(olmax::detail::concat(what, " [in nn::", layer, ": its input ", to_string(state.shape()),
                                                " is read as two streams of shape ", to_string(stream),
                                                "; if it is a batch of 2, pass nn::two_streams(x) instead]"));
    }
}

}  // namespace detail

}  // namespace olmax::nn

// ---- the key of take_leading's lowering rule (its rule: olmax/trace/rules.hpp) ----------------

namespace olmax::op {

/// x[index] along the leading axis.
struct take_leading : registered<take_leading> {
    static constexpr std::string_view name = "take_leading";
    struct attrs {
        std::size_t index = 0;
    };
    static std::vector<sample<attrs>> samples(Generator& rng) {
        return {{{samples::uniform(rng, {3, 2, 4})}, {1}}, {{samples::uniform(rng, {4, 3})}, {3}}, {{samples::uniform(rng, {2})}, {0}}};
    }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) { return nn::take_leading(in[0], a.index); }
};

}  // namespace olmax::op
