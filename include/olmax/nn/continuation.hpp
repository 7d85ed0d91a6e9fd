#pragma once
// Continuing a sequence: running a layer on the next steps of sequences it has already seen, with
// what it carries from one call to the next (recurrent states, convolution tails, attention's keys
// and values) in a state object of its own. Decoding runs each new step through the layers once
// (models::ByteLM::sample) instead of running the whole window again for every step.
//
// A layer takes part in one of two ways:
//  - position-wise (each output step reads its own input step only: norms, projections,
//    activations): it declares `static constexpr bool position_wise = true;` and its forward
//    serves unchanged;
//  - with a state: `using sequence_state = ...;` (default-constructed means "nothing seen yet") and
//        Tensor<T> continue_sequence(const Tensor<T>& x, sequence_state& state, const LayerContext& ctx) const
//    which returns for the steps x [batch, t, ...] what forward returns for them when given the
//    whole sequence so far (up to rounding), and moves the state past them. A call that throws
//    (a shape that does not fit) may leave the state partly moved: start a new one.
// Containers (nn::Sandwich, nn::Reversible and nn::ReversibleChain, nn::Stack, nn::Sequential)
// take part when every part does. A layer that does neither (the hierarchical mixer, whose strided
// modes read later steps of a group; the MoE, whose capacity counts a whole sequence) is not a
// ContinuableLayer, and a model of it decodes by running its window again.

#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "olmax/nn/contract.hpp"
#include "olmax/ops/shape.hpp"

namespace olmax::nn {

/// A layer whose every output step reads only its own input step.
template <class L>
concept PositionWiseLayer = Layer<L> && requires {
    { L::position_wise } -> std::convertible_to<bool>;
    requires bool(L::position_wise);
};

/// A layer that carries a state from one call to the next (see the top of this file).
template <class L>
concept StatefulLayer = Layer<L> && std::default_initializable<typename L::sequence_state> &&
                        requires(const L& layer, const Tensor<typename L::value_type>& x, typename L::sequence_state& state,
                                 const LayerContext& ctx) {
                            { layer.continue_sequence(x, state, ctx) } -> std::same_as<Tensor<typename L::value_type>>;
                        };

/// A layer that can continue a sequence from an earlier call.
template <class L>
concept ContinuableLayer = PositionWiseLayer<L> || StatefulLayer<L>;

/// The state of a position-wise layer: nothing.
struct NoSequenceState {};

namespace detail {
template <class L>
struct sequence_state_of {
    using type = NoSequenceState;
};
template <StatefulLayer L>
struct sequence_state_of<L> {
    using type = typename L::sequence_state;
};
}  // namespace detail

/// What layer L carries between calls (NoSequenceState for a position-wise layer).
template <class L>
using sequence_state_t = typename detail::sequence_state_of<L>::type;

/// Runs `layer` on the next steps `x` of the sequences `state` has seen (an empty state: from the
/// start) and moves the state past them.
template <ContinuableLayer L>
Tensor<typename L::value_type> continue_sequence(const L& layer, const Tensor<typename L::value_type>& x, sequence_state_t<L>& state,
                                                 const LayerContext& ctx = {}) {
    if constexpr (StatefulLayer<L>) return layer.continue_sequence(x, state, ctx);
    else return layer.forward(x, ctx);
}

namespace detail {

/// A part of a container as a layer whose forward continues the part's sequence: what a
/// container's forward steps call (a coupling's F) reaches the part's own state this way.
template <class L>
struct continuing {
    const L& layer;
    sequence_state_t<L>& state;
    Tensor<typename L::value_type> forward(const Tensor<typename L::value_type>& x, const LayerContext& ctx) const {
        return nn::continue_sequence(layer, x, state, ctx);
    }
};

/// The continuation of a layer that has `forward_with_state(x, state)` returning {y, state}
/// (the recurrent mixers): its state moves to the returned one.
template <class L, class State>
Tensor<typename L::value_type> continue_with_state(const L& layer, const Tensor<typename L::value_type>& x, State& state) {
    auto out = layer.forward_with_state(x, state);
    state = std::move(out.state);
    return std::move(out.y);
}

/// The continuation of a causal convolution of `taps` taps along axis 1 of x [batch, t, C]
/// (`conv`: x -> its outputs, zero inputs before the first step): runs conv on the carried last
/// taps - 1 inputs (`tail`, [batch, taps - 1, C]; undefined: zeros, nothing seen) followed by x,
/// returns the outputs of x's steps and carries x's last taps - 1 inputs on.
template <Real T, class Conv>
Tensor<T> continue_taps(const Tensor<T>& x, Tensor<T>& tail, std::size_t taps, Conv&& conv, std::string_view layer) {
    if (taps <= 1) return conv(x);
    check<shape_error>(x.defined() && x.rank() == 3, layer, ": expected input [batch, T, features], got ",
                       x.defined() ? to_string(x.shape()) : std::string("an undefined tensor"));
    const std::size_t nb = x.extent(0), nt = x.extent(1), nc = x.extent(2);
    if (tail.defined())
        check<shape_error>(tail.shape() == Shape{nb, taps - 1, nc}, layer, ": carried inputs of shape ", to_string(tail.shape()),
                           " do not match [batch, taps - 1, features] = [", nb, ", ", taps - 1, ", ", nc, "]");
    const Tensor<T> seen = concat({tail.defined() ? tail : Tensor<T>({nb, taps - 1, nc}), x}, 1);
    const Tensor<T> out = slice(conv(seen), 1, taps - 1, taps - 1 + nt);
    tail = slice(seen, 1, nt, nt + taps - 1);
    return out;
}

}  // namespace detail

}  // namespace olmax::nn
