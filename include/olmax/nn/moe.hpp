#pragma once
// Top-k gated mixture of experts with capacity and a load-balancing loss (Switch Transformer,
// Fedus et al. 2021, for k = 1; GShard, Lepikhin et al. 2020, for k = 2; the original Olmax's
// learned top-1 MoE before 2022-05), and the weight-tied variant (one expert bank shared by every
// layer of an nn::Stack, the original's PR #88 idea).
//
// Forward, x [B, S, F] flattened to N = B S tokens:
//     p        = softmax(x W_router)                          [N, E]
//     e_1..e_k = the k largest entries of p_n (ties: lowest index first)
//     y_n      = sum_{j : (n, e_j) kept} p_n[e_j] leaky_relu(x_n W_{e_j})
// The gates are the chosen experts' softmax probabilities, not renormalised over the k chosen
// (Switch's gate for k = 1; GShard renormalises p[e_1] + p[e_2] to 1, which we do not, so one
// formula serves every k).
//
// Capacity: each expert takes at most C = ceil(capacity_factor * k * S / E) assignments per
// sequence, first come first served in time order (at one step the first choice before the
// second), so whether token t is kept depends on tokens <= t only and the layer stays causal.
// A dropped assignment contributes nothing (a token dropped by all its experts gets y = 0; the
// residual coupling carries it). routing_stats() counts assignments and drops.
//
// Dispatch (Config::moe_dispatch): `sparse` gathers each expert's kept tokens, runs one GEMM per
// expert on just those rows and scatters the gated outputs back (gather_rows -> grouped_matmul ->
// scatter_rows): about k N F^2 multiply-adds whatever E. `dense` runs every expert on every token
// and masks (E N F^2): the reference. Both give the same values and gradients up to rounding.
//
// Load-balancing loss (Switch eq. 4, top-k counted): balance = E * sum_e f_e P_e, with f_e the
// fraction of the k N top-k choices that picked e (before capacity; a constant) and P_e the mean
// router probability of e; it is 1 when routing is uniform. Its weight alpha is
// Config::moe_balance_coefficient. The contract, identical gradients in both reversible modes:
//   * taped forward (grad on, not a recompute: a plain model, or reversible_backward = false):
//     the differentiable balance is added to this thread's `auxiliary_loss()`; the model adds
//     `balance_loss()` (= alpha * auxiliary_loss(), undefined when none) to its loss, and calls
//     `clear_auxiliary_loss()` after each step;
//   * reversible memory-saving mode: the forward runs without a tape (nothing to add: the layer
//     only logs the value), and the backward's recompute (ctx.recompute) attaches alpha *
//     d balance to the graph itself through an op that passes y through unchanged and seeds the
//     balance with alpha. `balance_loss()` stays undefined, so the same loop code
//     `if (b.defined()) loss = loss + b` gives the same gradient in both modes.
// Every forward except a recompute adds its routing counts and its balance value (detached) to
// routing_stats(). Copies of a layer (every layer of a Stack) share the auxiliary loss and the
// counters; the auxiliary loss is kept per thread (data_parallel_backward's shards each build their
// own graph) and the counters are guarded by a mutex.

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "olmax/autodiff/custom_op.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/nn/contract.hpp"
#include "olmax/nn/init.hpp"
#include "olmax/nn/views.hpp"
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/gather.hpp"
#include "olmax/ops/grouped_matmul.hpp"
#include "olmax/ops/linalg.hpp"
#include "olmax/ops/loss.hpp"
#include "olmax/ops/reduction.hpp"
#include "olmax/ops/shape.hpp"

namespace olmax::nn {

/// What an nn::MoE routed since the last clear_routing_stats() (recomputes not counted).
struct MoERoutingStats {
    std::uint64_t forwards = 0;     ///< forward calls counted (each layer of a Stack counts once per pass)
    std::uint64_t tokens = 0;       ///< tokens routed
    std::uint64_t assignments = 0;  ///< token-expert assignments: k per token
    std::uint64_t dropped = 0;      ///< assignments over their expert's capacity (no output)
    std::vector<std::uint64_t> assigned_per_expert, dropped_per_expert;
    double balance_sum = 0;         ///< sum of the forwards' balance losses (unweighted)

    double drop_rate() const { return assignments ? double(dropped) / double(assignments) : 0.0; }
    double mean_balance() const { return forwards ? balance_sum / double(forwards) : 0.0; }
};

namespace detail {

/// One forward's routing: the kept assignments, expert by expert, in time order within each.
struct MoERouting {
    std::vector<std::int32_t> rows;                ///< token (row of x [N, F]) of each kept assignment
    std::vector<std::int32_t> gates;               ///< its gate's position in p [N, E]: token * E + expert
    std::vector<std::size_t> offsets;              ///< E + 1 boundaries of the experts' blocks
    std::vector<std::uint64_t> assigned, dropped;  ///< per expert: top-k choices, and those over capacity
};

/// Top-k routing with per-sequence capacity on probabilities p [batch * sequence, experts]
/// (row-major); see the top of this file.
template <Real T>
MoERouting route(const T* p, std::size_t batch, std::size_t sequence, std::size_t experts, std::size_t k, std::size_t capacity) {
    MoERouting r;
    r.assigned.assign(experts, 0);
    r.dropped.assign(experts, 0);
    std::vector<std::vector<std::int32_t>> kept(experts);
    std::vector<std::size_t> used(experts), chosen(k);
    for (std::size_t b = 0; b < batch; ++b) {
        std::fill(used.begin(), used.end(), 0);
        for (std::size_t t = 0; t < sequence; ++t) {
            const std::size_t n = b * sequence + t;
            const T* row = p + n * experts;
            for (std::size_t j = 0; j < k; ++j) {  // the j-th largest, k <= 2 in practice: O(k E)
                std::size_t best = experts;
                for (std::size_t e = 0; e < experts; ++e) {
                    if (std::find(chosen.begin(), chosen.begin() + j, e) != chosen.begin() + j) continue;
                    if (best == experts || row[e] > row[best]) best = e;
                }
                chosen[j] = best;
                ++r.assigned[best];
                if (used[best] < capacity) {
                    ++used[best];
                    kept[best].push_back(std::int32_t(n));
                } else {
                    ++r.dropped[best];
                }
            }
        }
    }
    r.offsets.assign(experts + 1, 0);
    for (std::size_t e = 0; e < experts; ++e) {
        r.offsets[e + 1] = r.offsets[e] + kept[e].size();
        for (std::int32_t n : kept[e]) {
            r.rows.push_back(n);
            r.gates.push_back(std::int32_t(std::size_t(n) * experts + e));
        }
    }
    return r;
}

/// Returns y's value unchanged; its backward passes dy through to y and gives the scalar `loss`
/// the gradient `coefficient`, as if `coefficient * loss` had been added to the objective being
/// differentiated. How a term of the loss reaches the gradient inside a reversible recompute,
/// whose backward starts from the block's output alone.
template <Real T>
Tensor<T> attach_loss_gradient(const Tensor<T>& y, const Tensor<T>& loss, T coefficient) {
    return autodiff::custom_op<T>("nn::MoE balance", y, {y, loss},
                                  [coefficient, shape = loss.shape()](const Tensor<T>& dy, autodiff::GradientSink<T>& sink) {
                                      if (sink.needs(0)) sink.add(0, dy);
                                      if (sink.needs(1)) sink.add(1, Tensor<T>(shape, coefficient));
                                  });
}

/// State shared by the copies of one MoE layer.
template <Real T>
struct MoEShared {
    std::mutex mutex;
    std::vector<std::pair<std::thread::id, Tensor<T>>> auxiliary;  ///< per thread: sum of taped balance losses
    MoERoutingStats stats;
};

}  // namespace detail

/// x [B, S, F] -> [B, S, F]: top-k routed experts leaky_relu(x W_e), see the top of this file.
/// Parameters: router [F, E], experts [E, F, F] (Sharing::tied in TiedMoE).
template <Real T = float, bool TiedExperts = false>
class MoE {
public:
    using value_type = T;
    using config_type = Config;
    static constexpr std::string_view name = TiedExperts ? "tied_moe" : "moe";

    MoE(const Config& config, Generator& rng)
        : capacity_factor_(config.capacity_factor),
          balance_coefficient_(config.moe_balance_coefficient),
          top_k_(config.moe_top_k),
          dispatch_(config.moe_dispatch),
          slope_(T(config.leaky_slope)),
          shared_(std::make_shared<detail::MoEShared<T>>()) {
        config.checked_features("nn::MoE");
        check<value_error>(config.features >= 1 && config.experts >= 1 && config.capacity_factor > 0,
                           "nn::MoE: needs features >= 1, experts >= 1 and capacity_factor > 0, got ", config.features, ", ", config.experts,
                           " and ", config.capacity_factor);
        check<value_error>(config.moe_top_k >= 1 && config.moe_top_k <= config.experts, "nn::MoE: moe_top_k must be in [1, experts = ",
                           config.experts, "], got ", config.moe_top_k);
        check<value_error>(std::isfinite(config.moe_balance_coefficient) && config.moe_balance_coefficient >= 0,
                           "nn::MoE: moe_balance_coefficient must be finite and >= 0, got ", config.moe_balance_coefficient);
        check<value_error>(config.moe_dispatch == MoEDispatch::sparse || config.moe_dispatch == MoEDispatch::dense,
                           "nn::MoE: moe_dispatch must be MoEDispatch::sparse or MoEDispatch::dense");
        router_ = parameter(randn<T>({config.features, config.experts}, rng, T{0}, T(1.0 / std::sqrt(double(config.features)))));
        experts_ = parameter(orthogonal_init<T>({config.experts, config.features, config.features}, rng));
        shared_->stats.assigned_per_expert.assign(config.experts, 0);
        shared_->stats.dropped_per_expert.assign(config.experts, 0);
    }

    /// C = ceil(capacity_factor * k * S / E): assignments each expert takes per sequence of S tokens.
    std::size_t capacity(std::size_t sequence) const {
        return std::size_t(std::ceil(capacity_factor_ * double(top_k_) * double(sequence) / double(experts())));
    }
    std::size_t experts() const { return router_.shape()[1]; }
    std::size_t top_k() const { return top_k_; }
    double balance_coefficient() const { return balance_coefficient_; }
    MoEDispatch dispatch() const { return dispatch_; }
    /// Switches this copy between the sparse and the dense computation (same parameters).
    void set_dispatch(MoEDispatch dispatch) {
        check<value_error>(dispatch == MoEDispatch::sparse || dispatch == MoEDispatch::dense,
                           "nn::MoE::set_dispatch: expected MoEDispatch::sparse or MoEDispatch::dense");
        dispatch_ = dispatch;
    }

    Tensor<T> forward(const Tensor<T>& x, const LayerContext& ctx = {}) const {
        check<trace_error>(!x.traced(), "nn::MoE: has no traced form yet (its routing and balance loss run on the host); train it with "
                                        "--device=cpu");
        const std::size_t features = router_.shape()[0], E = experts();
        check<shape_error>(x.defined() && x.rank() == 3 && x.shape()[2] == features, "nn::MoE: expected input [B, S, ", features, "], got ",
                           x.defined() ? to_string(x.shape()) : std::string("an undefined tensor"));
        const std::size_t batch = x.shape()[0], sequence = x.shape()[1], tokens = batch * sequence;
        check<value_error>(tokens > 0, "nn::MoE: input of shape ", to_string(x.shape()), " is empty (B or S is 0)");
        check<value_error>(tokens * E <= std::size_t(INT32_MAX), "nn::MoE: ", tokens, " tokens x ", E,
                           " experts exceed the 32-bit gate index; split the batch");
        const Tensor<T> x2 = reshape(x, {tokens, features});
        const Tensor<T> probs = softmax(matmul(x2, router_), -1);  // [N, E]
        const detail::MoERouting routing = detail::route(probs.data(), batch, sequence, E, top_k_, capacity(sequence));
        Tensor<T> y = dispatch_ == MoEDispatch::sparse ? sparse(x2, probs, routing) : dense(x2, probs, routing);
        const bool taped = autodiff::is_grad_enabled() && probs.requires_grad();
        if (!ctx.recompute) {
            account(probs, routing, taped);
        } else if (taped && balance_coefficient_ != 0) {
            // Memory-saving reversible backward: the forward ran without a tape, so the model could
            // not add the balance loss; its gradient joins here, once per layer.
            y = detail::attach_loss_gradient(y, balance(probs, routing), T(balance_coefficient_));
        }
        return reshape(y, {batch, sequence, features});
    }

    /// Sum of the balance losses of this thread's taped forwards since its last
    /// `clear_auxiliary_loss()` (shared by copies of this layer, e.g. every layer of a Stack);
    /// undefined when none ran. Differentiable.
    Tensor<T> auxiliary_loss() const {
        std::lock_guard lock(shared_->mutex);
        for (const auto& [id, loss] : shared_->auxiliary)
            if (id == std::this_thread::get_id()) return loss;
        return {};
    }
    /// alpha * auxiliary_loss() (Config::moe_balance_coefficient): the term a model adds to its
    /// loss; undefined when no taped forward ran (e.g. in reversible memory-saving mode, where the
    /// recompute adds the same gradient itself).
    Tensor<T> balance_loss() const {
        const Tensor<T> aux = auxiliary_loss();
        return aux.defined() ? aux * T(balance_coefficient_) : aux;
    }
    /// Forgets this thread's auxiliary loss (after each training step).
    void clear_auxiliary_loss() const {
        std::lock_guard lock(shared_->mutex);
        std::erase_if(shared_->auxiliary, [](const auto& entry) { return entry.first == std::this_thread::get_id(); });
    }

    /// Counters since the last clear_routing_stats() (all threads, all copies of this layer).
    MoERoutingStats routing_stats() const {
        std::lock_guard lock(shared_->mutex);
        return shared_->stats;
    }
    void clear_routing_stats() const {
        std::lock_guard lock(shared_->mutex);
        MoERoutingStats& s = shared_->stats;
        s = MoERoutingStats{0, 0, 0, 0, std::vector<std::uint64_t>(experts(), 0), std::vector<std::uint64_t>(experts(), 0), 0};
    }

    void visit_parameters(ParameterVisitor<T>& visit) {
        visit("router", router_, Role::weight);
        visit("experts", experts_, Role::weight, TiedExperts ? Sharing::tied : Sharing::per_layer);
    }

private:
    /// gather -> one GEMM per expert on its kept rows -> gate -> scatter-add back to the tokens.
    Tensor<T> sparse(const Tensor<T>& x2, const Tensor<T>& probs, const detail::MoERouting& routing) const {
        const std::size_t tokens = x2.shape()[0], E = experts(), kept = routing.rows.size();
        Tensor<std::int32_t> rows, gate_index;
        {
            device_scope on(x2.device());
            rows = Tensor<std::int32_t>::from({kept}, routing.rows);
            gate_index = Tensor<std::int32_t>::from({kept}, routing.gates);
        }
        const Tensor<T> h = leaky_relu(grouped_matmul(gather_rows(x2, rows), experts_, routing.offsets), slope_);  // [M, F]
        const Tensor<T> gate = gather_rows(reshape(probs, {tokens * E, 1}), gate_index);                           // [M, 1]
        return scatter_rows(mul(h, gate), rows, tokens);
    }

    /// Every expert on every token, masked to the kept assignments (the reference).
    Tensor<T> dense(const Tensor<T>& x2, const Tensor<T>& probs, const detail::MoERouting& routing) const {
        const std::size_t tokens = x2.shape()[0], E = experts();
        Tensor<T> keep;
        {
            device_scope on(probs.device());
            keep = Tensor<T>({tokens, E});
            for (std::int32_t g : routing.gates) keep.data()[g] = T{1};
        }
        const Tensor<T> gates = mul(probs, keep);
        Tensor<T> y;
        for (std::size_t e = 0; e < E; ++e) {
            Tensor<T> out = mul(slice(gates, -1, e, e + 1), leaky_relu(matmul(x2, take_leading(experts_, e)), slope_));
            y = y.defined() ? add(y, out) : out;
        }
        return y;
    }

    /// E * sum_e f_e P_e, differentiable in the probabilities (f_e is a constant).
    Tensor<T> balance(const Tensor<T>& probs, const detail::MoERouting& routing) const {
        const std::size_t E = experts();
        const double choices = double(top_k_) * double(probs.shape()[0]);
        Tensor<T> fraction;
        {
            device_scope on(probs.device());
            fraction = Tensor<T>::uninitialized({E});
            for (std::size_t e = 0; e < E; ++e) fraction.data()[e] = T(double(routing.assigned[e]) / choices);
        }
        return sum(mul(mean(probs, {0}), fraction)) * T(E);
    }

    /// Routing counters and the balance value (in double, detached); the differentiable balance
    /// into this thread's auxiliary loss when the forward is taped.
    void account(const Tensor<T>& probs, const detail::MoERouting& routing, bool taped) const {
        const std::size_t tokens = probs.shape()[0], E = experts();
        std::vector<double> mean_p(E, 0.0);
        const T* p = probs.data();
        for (std::size_t n = 0; n < tokens; ++n)
            for (std::size_t e = 0; e < E; ++e) mean_p[e] += double(p[n * E + e]);
        double value = 0;
        for (std::size_t e = 0; e < E; ++e)
            value += double(routing.assigned[e]) / (double(top_k_) * double(tokens)) * mean_p[e] / double(tokens);
        value *= double(E);
        Tensor<T> loss = taped ? balance(probs, routing) : Tensor<T>();
        std::lock_guard lock(shared_->mutex);
        MoERoutingStats& s = shared_->stats;
        s.forwards += 1;
        s.tokens += tokens;
        s.assignments += tokens * top_k_;
        for (std::size_t e = 0; e < E; ++e) {
            s.assigned_per_expert[e] += routing.assigned[e];
            s.dropped_per_expert[e] += routing.dropped[e];
            s.dropped += routing.dropped[e];
        }
        s.balance_sum += value;
        if (!taped) return;
        for (auto& [id, aux] : shared_->auxiliary)
            if (id == std::this_thread::get_id()) {
                try {
                    aux = add(aux, loss);
                } catch (const autodiff_error&) {
                    throw autodiff_error(olmax::detail::concat(
                        "nn::MoE: this thread's auxiliary loss still holds a graph that an earlier backward() freed; call "
                        "clear_auxiliary_loss() after each training step (or after any backward that did not use it)"));
                }
                return;
            }
        shared_->auxiliary.emplace_back(std::this_thread::get_id(), std::move(loss));
    }

    Tensor<T> router_, experts_;  // router [F, E], experts [E, F, F]
    double capacity_factor_, balance_coefficient_;
    std::size_t top_k_;
    MoEDispatch dispatch_;
    T slope_;
    std::shared_ptr<detail::MoEShared<T>> shared_;
};

/// The weight-tied variant: inside an nn::Stack every layer shares one expert bank.
template <Real T = float>
using TiedMoE = MoE<T, true>;

}  // namespace olmax::nn
