#pragma once
// Reversible coupling blocks over a two-stream state [2, ...] (RevNet, Gomez et al. 2017; the
// original Olmax src/model/reversible.py; MomentumNet, Sander et al. 2021).
//
// Every coupling is built from one invertible *step* around a function layer f:
//   AdditiveCoupling (the Olmax form):  (a, b) -> (b, a + f(b));   inverse: b = o0, a = o1 - f(o0)
//   MomentumCoupling (MomentumNet):     (x, v) -> (x + v', v'), v' = beta v + (1 - beta) f(x);
//                                       inverse: x = o0 - o1, v = (o1 - (1 - beta) f(x)) / beta
// nn::Reversible<F, G> chains a step with F and a step with G; with the additive step that is
// exactly RevNet: y1 = x1 + F(x2), y2 = x2 + G(y1). nn::RevSwap<F> is a single Olmax step.
//
// Memory-free backward (`reverse`): given the outputs and their gradients, each step rebuilds its
// inputs, recomputes f once on a detached copy inside a local tape_scope with grad enabled,
// backpropagates through it (parameter gradients are added into the parameters), and frees that
// local graph. No activation of the block is kept between forward and backward; nn::Stack uses
// this to keep activation memory constant in depth. Random numbers (nn::Dropout) replay exactly:
// every draw is a function of LayerContext::random_seed, which each step derives the same way in
// forward, inverse and reverse (child_context), so no generator state has to be saved.

#include <array>
#include <numeric>
#include <tuple>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "olmax/autodiff/custom_op.hpp"
#include "olmax/autodiff/tape.hpp"
#include "olmax/nn/continuation.hpp"
#include "olmax/nn/contract.hpp"
#include "olmax/nn/views.hpp"
#include "olmax/ops/elementwise.hpp"

namespace olmax::nn {

namespace detail {

/// Inputs and gradients rebuilt by one step's reverse pass.
template <Real T>
struct StepReverse {
    Tensor<T> in0, in1, grad0, grad1;
};

/// Runs `f` on a detached copy of `x` that requires grad, on a fresh local tape, and backpropagates
/// `seed`: parameter gradients land in f's parameters, the input gradient is returned (undefined
/// when f does not depend on x). Returns f(x) as a plain tensor as well.
template <class F, Real T>
std::pair<Tensor<T>, Tensor<T>> recompute_vjp(const F& f, const Tensor<T>& x, const Tensor<T>& seed, const LayerContext& ctx) {
    autodiff::tape_scope scope;
    autodiff::enable_grad grad_on;
    Tensor<T> leaf = x.detach();
    leaf.set_requires_grad(true);
    LayerContext again = ctx;
    again.recompute = true;
    Tensor<T> fx = f.forward(leaf, again);
    if (fx.requires_grad()) fx.backward(seed);
    return {fx.detach(), leaf.grad()};
}

}  // namespace detail

/// The additive (Olmax / RevNet) step: (a, b) -> (b, a + f(b)). Lossless up to rounding.
struct AdditiveCoupling {
    template <class F, Real T>
    static std::pair<Tensor<T>, Tensor<T>> forward(const F& f, const Tensor<T>& a, const Tensor<T>& b, const LayerContext& ctx, double) {
        return {b, a + f.forward(b, ctx)};
    }
    template <class F, Real T>
    static std::pair<Tensor<T>, Tensor<T>> inverse(const F& f, const Tensor<T>& o0, const Tensor<T>& o1, const LayerContext& ctx, double) {
        autodiff::no_grad guard;
        return {o1 - f.forward(o0, ctx), o0};
    }
    /// dL/da = d1; dL/db = d0 + J_f(b)^T d1.
    template <class F, Real T>
    static detail::StepReverse<T> reverse(const F& f, const Tensor<T>& o0, const Tensor<T>& o1, const Tensor<T>& d0, const Tensor<T>& d1,
                                          const LayerContext& ctx, double) {
        auto [fb, db_from_f] = detail::recompute_vjp(f, o0, d1, ctx);
        autodiff::no_grad guard;
        return {o1 - fb, o0, d1, db_from_f.defined() ? d0 + db_from_f : d0};
    }
};

/// The MomentumNet step (Sander et al. 2021): (x, v) -> (x + v', v') with v' = beta v + (1 - beta) f(x).
/// Invertible for beta in (0, 1]; the inverse divides by beta, so rounding grows like beta^-depth.
struct MomentumCoupling {
    template <class F, Real T>
    static std::pair<Tensor<T>, Tensor<T>> forward(const F& f, const Tensor<T>& x, const Tensor<T>& v, const LayerContext& ctx, double beta) {
        Tensor<T> v_next = v * T(beta) + f.forward(x, ctx) * T(1 - beta);
        return {x + v_next, v_next};
    }
    template <class F, Real T>
    static std::pair<Tensor<T>, Tensor<T>> inverse(const F& f, const Tensor<T>& o0, const Tensor<T>& o1, const LayerContext& ctx, double beta) {
        autodiff::no_grad guard;
        Tensor<T> x = o0 - o1;
        return {x, (o1 - f.forward(x, ctx) * T(1 - beta)) * T(1 / beta)};
    }
    /// With dv'_total = d1 + d0: dL/dx = d0 + (1 - beta) J_f(x)^T dv'_total, dL/dv = beta dv'_total.
    template <class F, Real T>
    static detail::StepReverse<T> reverse(const F& f, const Tensor<T>& o0, const Tensor<T>& o1, const Tensor<T>& d0, const Tensor<T>& d1,
                                          const LayerContext& ctx, double beta) {
        Tensor<T> x, dv_total;
        {
            autodiff::no_grad guard;
            x = o0 - o1;
            dv_total = d0 + d1;
        }
        auto [fx, dx_from_f] = [&] {
            Tensor<T> seed;
            {
                autodiff::no_grad guard;
                seed = dv_total * T(1 - beta);
            }
            return detail::recompute_vjp(f, x, seed, ctx);
        }();
        autodiff::no_grad guard;
        Tensor<T> v = (o1 - fx * T(1 - beta)) * T(1 / beta);
        return {x, v, dx_from_f.defined() ? d0 + dx_from_f : d0, dv_total * T(beta)};
    }
};

template <class C>
concept CouplingStep = std::same_as<C, AdditiveCoupling> || std::same_as<C, MomentumCoupling>;

namespace detail {

template <Real T>
void check_state(const Tensor<T>& state, std::string_view layer) {
    check<shape_error>(state.rank() >= 2 && state.shape()[0] == 2, "nn::", layer,
                       ": expected a two-stream state of shape [2, ...] (see nn::two_streams), got ", to_string(state.shape()));
}

}  // namespace detail

/// Common implementation of Reversible and RevSwap: a chain of coupling steps over function layers.
template <class Coupling, class... Fs>
class CouplingBlock {
    static_assert((assert_layer<Fs>() && ...));
    static_assert(CouplingStep<Coupling>, "olmax::nn::Reversible: Coupling must be nn::AdditiveCoupling or nn::MomentumCoupling");

public:
    using value_type = typename std::tuple_element_t<0, std::tuple<Fs...>>::value_type;
    using config_type = shared_config_t<Fs...>;
    static_assert(!std::is_void_v<config_type>, "olmax::nn::Reversible: F's or G's config_type must derive from the other's (as "
                                                "nn::MoEConfig from nn::Config), so that one config builds both");
    static_assert((std::same_as<typename Fs::value_type, value_type> && ...),
                  "olmax::nn::Reversible: F and G must have the same value_type");
    using T = value_type;

    CouplingBlock(const config_type& config, Generator& rng)
        : fs_{Fs(config, rng)...}, beta_(beta_of(config)), memory_saving_(memory_saving_of(config)) {}

    /// [2, ...] -> [2, ...]. With memory saving on (the default) one custom op on the tape, whose
    /// backward is `reverse`; otherwise the plain composition of ops (every activation recorded).
    /// A standalone block's node still holds its input and output state (the tape keeps op inputs
    /// alive), so a chain of N standalone blocks holds 2N states; nn::Stack runs invertible blocks
    /// as one op and holds only the stack's input and output, whatever the depth.
    Tensor<T> forward(const Tensor<T>& state, const LayerContext& ctx = {}) const {
        if (!memory_saving_) return forward_recorded(state, ctx);
        detail::check_state(state, "Reversible");
        Tensor<T> y;
        {
            autodiff::no_grad guard;
            Tensor<T> s0 = take_leading(state, 0), s1 = take_leading(state, 1);
            detail::hint_two_streams(state, "Reversible", [&] { forward_steps(s0, s1, ctx, std::index_sequence_for<Fs...>{}); });
            y = stack_leading<T>({s0, s1});
        }
        // Parameters are inputs only so that the op records when they alone require grad; their
        // gradients are added by the recompute inside `reverse`, not through the sink.
        std::vector<Tensor<T>> inputs{state};
        CouplingBlock self = *this;  // handles: shares the parameters
        ParameterVisitor<T> collect([&](const std::string&, Tensor<T>& p, Role, Sharing) { inputs.push_back(p); });
        self.visit_parameters(collect);
        return autodiff::custom_op<T>("reversible", {y}, std::move(inputs),
                                      [self, y_saved = y.detach(), ctx](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                                          auto [x, dx] = self.reverse(y_saved, g[0], ctx);
                                          sink.add(0, dx);
                                      })[0];
    }

    /// The plain composition of ops whatever memory_saving() says (every activation recorded): what
    /// nn::Stack runs for the layers whose activations it keeps (Stack::keep_activations).
    Tensor<T> forward_recorded(const Tensor<T>& state, const LayerContext& ctx = {}) const {
        detail::check_state(state, "Reversible");
        Tensor<T> s0 = take_leading(state, 0), s1 = take_leading(state, 1);
        detail::hint_two_streams(state, "Reversible", [&] { forward_steps(s0, s1, ctx, std::index_sequence_for<Fs...>{}); });
        return stack_leading<T>({s0, s1});
    }

    /// The next steps of a sequence (nn::continue_sequence) on the two streams [2, batch, t, F]:
    /// the coupling's steps as in forward, each function continuing its own state. Ordinary ops
    /// (recorded when gradients are on), as forward_recorded.
    using sequence_state = std::tuple<sequence_state_t<Fs>...>;
    Tensor<T> continue_sequence(const Tensor<T>& state, sequence_state& carried, const LayerContext& ctx = {}) const
        requires(ContinuableLayer<Fs> && ...)
    {
        detail::check_state(state, "Reversible");
        Tensor<T> s0 = take_leading(state, 0), s1 = take_leading(state, 1);
        continue_steps(s0, s1, carried, ctx, std::index_sequence_for<Fs...>{});
        return stack_leading<T>({s0, s1});
    }

    /// Rebuilds the input state from the output state (no grad).
    Tensor<T> inverse(const Tensor<T>& y, const LayerContext& ctx = {}) const {
        detail::check_state(y, "Reversible");
        autodiff::no_grad guard;
        Tensor<T> s0 = take_leading(y, 0), s1 = take_leading(y, 1);
        inverse_steps(s0, s1, ctx, std::index_sequence_for<Fs...>{});
        return stack_leading<T>({s0, s1});
    }

    /// Memory-free backward: from the output `y` and its gradient `dy`, returns {x, dx} and adds the
    /// parameter gradients into the parameters.
    std::pair<Tensor<T>, Tensor<T>> reverse(const Tensor<T>& y, const Tensor<T>& dy, const LayerContext& ctx = {}) const {
        detail::check_state(y, "Reversible");
        check<shape_error>(dy.shape() == y.shape(), "nn::Reversible::reverse: gradient of shape ", to_string(dy.shape()), " for output ",
                           to_string(y.shape()));
        Tensor<T> s0, s1, d0, d1;
        {
            autodiff::no_grad off;  // views of the streams (slices inside a traced program), not on the tape
            s0 = take_leading(y, 0), s1 = take_leading(y, 1), d0 = take_leading(dy, 0), d1 = take_leading(dy, 1);
        }
        reverse_steps(s0, s1, d0, d1, ctx, std::index_sequence_for<Fs...>{});
        autodiff::no_grad guard;
        return {stack_leading<T>({s0, s1}), stack_leading<T>({d0, d1})};
    }

    bool memory_saving() const { return memory_saving_; }
    /// The least common multiple of the steps' periods (nn::layer_period); each sees one stream.
    std::size_t layer_period(const Shape& state_shape) const {
        const Shape stream = state_shape.empty() ? state_shape : detail::drop_leading(state_shape);
        std::size_t period = 1;
        std::apply([&](const auto&... f) { ((period = std::lcm(period, nn::layer_period(f, stream))), ...); }, fs_);
        return period;
    }

    void visit_parameters(ParameterVisitor<T>& visit) {
        visit_each(visit, std::index_sequence_for<Fs...>{});
    }


    template <std::size_t I>
    const auto& function() const { return std::get<I>(fs_); }

private:
    // Step i runs with child_context(ctx, i): its own random seed, identical in forward, inverse and reverse.
    template <std::size_t... I>
    void forward_steps(Tensor<T>& s0, Tensor<T>& s1, const LayerContext& ctx, std::index_sequence<I...>) const {
        ((std::tie(s0, s1) = Coupling::forward(std::get<I>(fs_), s0, s1, child_context(ctx, I), beta_)), ...);
    }
    template <std::size_t... I>
    void continue_steps(Tensor<T>& s0, Tensor<T>& s1, sequence_state& carried, const LayerContext& ctx, std::index_sequence<I...>) const {
        ((std::tie(s0, s1) = Coupling::forward(detail::continuing<std::tuple_element_t<I, std::tuple<Fs...>>>{std::get<I>(fs_), std::get<I>(carried)},
                                               s0, s1, child_context(ctx, I), beta_)),
         ...);
    }
    template <std::size_t... I>
    void inverse_steps(Tensor<T>& s0, Tensor<T>& s1, const LayerContext& ctx, std::index_sequence<I...>) const {
        constexpr std::size_t n = sizeof...(Fs);
        ((std::tie(s0, s1) = Coupling::inverse(std::get<n - 1 - I>(fs_), s0, s1, child_context(ctx, n - 1 - I), beta_)), ...);
    }
    template <std::size_t... I>
    void reverse_steps(Tensor<T>& s0, Tensor<T>& s1, Tensor<T>& d0, Tensor<T>& d1, const LayerContext& ctx, std::index_sequence<I...>) const {
        constexpr std::size_t n = sizeof...(Fs);
        auto step = [&](const auto& f, std::size_t i) {
            auto r = Coupling::reverse(f, s0, s1, d0, d1, child_context(ctx, i), beta_);
            s0 = r.in0, s1 = r.in1, d0 = r.grad0, d1 = r.grad1;
        };
        (step(std::get<n - 1 - I>(fs_), n - 1 - I), ...);
    }
    template <std::size_t... I>
    void visit_each(ParameterVisitor<T>& visit, std::index_sequence<I...>) {
        (visit.child(child_name<I>(), std::get<I>(fs_)), ...);
    }
    /// The function's own name, with its position appended when two functions share a name.
    template <std::size_t I>
    static std::string child_name() {
        using F = std::tuple_element_t<I, std::tuple<Fs...>>;
        const bool shared = ((std::string_view(Fs::name) == std::string_view(F::name) ? 1 : 0) + ...) > 1;
        return shared ? std::string(F::name) + std::to_string(I) : std::string(F::name);
    }
    static double beta_of(const config_type& config) {
        if constexpr (std::same_as<Coupling, MomentumCoupling>) {
            check<value_error>(config.momentum_beta > 0 && config.momentum_beta <= 1,
                               "nn::Reversible<MomentumCoupling>: momentum_beta must be in (0, 1], got ", config.momentum_beta);
            return config.momentum_beta;
        }
        return 0;
    }
    static bool memory_saving_of(const config_type& config) {
        if constexpr (requires { config.reversible_backward; }) return config.reversible_backward;
        return true;
    }

    std::tuple<Fs...> fs_;
    double beta_;
    bool memory_saving_;
};

/// RevNet block: y1 = x1 + F(x2), y2 = x2 + G(y1) over a [2, ...] state (with AdditiveCoupling).
template <class F, class G, class Coupling = AdditiveCoupling>
class Reversible : public CouplingBlock<Coupling, F, G> {
public:
    using CouplingBlock<Coupling, F, G>::CouplingBlock;
    static constexpr std::string_view name = "reversible";
};

/// A chain of additive couplings over any number of functions: each step adds its function of one
/// stream to the other and swaps them, as Reversible<F, G> does for two (an even count keeps the
/// streams in their order). A hybrid block, say three recurrent mixers and one attention layer
/// each followed by an MLP, is one chain of eight, and an nn::Stack of such chains repeats the
/// pattern over depth with the same memory-free backward.
template <class... Fs>
class ReversibleChain : public CouplingBlock<AdditiveCoupling, Fs...> {
    static_assert(sizeof...(Fs) >= 1, "olmax::nn::ReversibleChain: give at least one function layer");

public:
    using CouplingBlock<AdditiveCoupling, Fs...>::CouplingBlock;
    static constexpr std::string_view name = "reversible_chain";
};

/// The original Olmax step over a [2, ...] state: y0 = x1, y1 = x0 + f(x1).
template <class F, class Coupling = AdditiveCoupling>
class RevSwap : public CouplingBlock<Coupling, F> {
public:
    using CouplingBlock<Coupling, F>::CouplingBlock;
    static constexpr std::string_view name = "revswap";
};

}  // namespace olmax::nn
