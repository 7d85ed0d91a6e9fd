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
// Dispatch (MoEConfig::dispatch): `sparse` gathers each expert's kept tokens, runs one GEMM per
// expert on just those rows and scatters the gated outputs back (gather_rows -> grouped_matmul ->
// scatter_rows): about k N F^2 multiply-adds whatever E. `dense` runs every expert on every token
// and masks (E N F^2): the reference. `slots` gives each expert C slots per sequence and runs them
// all, empty ones too (E B C F^2, static shapes: what a traced program runs). All three give the
// same values and gradients up to rounding.
//
// Load-balancing loss (Switch eq. 4, top-k counted): balance = E * sum_e f_e P_e, with f_e the
// fraction of the k N top-k choices that picked e (before capacity; a constant) and P_e the mean
// router probability of e; it is 1 when routing is uniform. Its weight alpha is
// MoEConfig::balance_coefficient. The layer adds alpha * d balance to the gradient itself: every
// taped forward returns y through an op that passes dy through unchanged and seeds the balance
// with alpha, as if alpha * balance had been added to the objective being differentiated. So no
// model or training loop has to collect it, and the gradient is the same whether the forward was
// taped (a plain stack, kept layers) or recomputed in a reversible backward (ctx.recompute), or
// traced into a compiled step. Each forward call adds its own alpha * balance: data-parallel
// shards and micro-batches each add one. The balance's value is not part of any loss the model
// returns; routing_stats() logs it.
//
// Every eager forward except a recompute adds its routing counts and its balance value to
// routing_stats(). Copies of a layer (every layer of a Stack) share the counters, guarded by a
// mutex. Inside a traced program (olmax/trace/) the routing runs on the device (the op
// `moe_route`, the same top-k and capacity rule) and each expert runs on its capacity's slots of
// each sequence (static shapes: gather, one batched GEMM, gather back); no counters are kept.

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/autodiff/custom_op.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/backend/trace_rules.hpp"
#include "olmax/nn/contract.hpp"
#include "olmax/nn/init.hpp"
#include "olmax/nn/views.hpp"
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/gather.hpp"
#include "olmax/ops/grouped_matmul.hpp"
#include "olmax/ops/linalg.hpp"
#include "olmax/ops/loss.hpp"
#include "olmax/ops/op_keys.hpp"
#include "olmax/ops/reduction.hpp"
#include "olmax/ops/shape.hpp"

namespace olmax::nn {

/// How nn::MoE computes its experts: `sparse` gathers the tokens routed to each expert and runs one
/// GEMM on just those rows (flops independent of the number of experts); `dense` runs every expert
/// on every token and masks by the gates (E times the flops; the reference the tests compare with);
/// `slots` gives each expert its capacity's slots per sequence, empty ones included, and runs one
/// batched GEMM over them (static shapes: the form a traced program always takes).
enum class MoEDispatch { sparse, dense, slots };

/// What nn::MoE is built from: the shared nn::Config (features, leaky_slope, seed) and the
/// router's own settings. A container holding a MoE (Sequential, Reversible, Stack) is built from
/// it too (shared_config_t), and hands its other layers the nn::Config part.
struct MoEConfig : Config {
    std::size_t experts = 4;  ///< E
    /// Capacity per expert per sequence of S tokens: C = ceil(capacity_factor * top_k * S / experts).
    double capacity_factor = 1.25;
    /// Experts per token k, 1 <= k <= experts: 1 is Switch routing, 2 GShard's top-2. The gates
    /// are the chosen experts' softmax probabilities, not renormalised.
    std::size_t top_k = 1;
    /// Load-balancing loss weight alpha (Switch's 0.01): the layer adds the gradient of alpha times
    /// its balance loss to every backward through it itself; 0 turns it off.
    double balance_coefficient = 0.01;
    MoEDispatch dispatch = MoEDispatch::sparse;  ///< routed tokens only (sparse), every expert on every token (dense), or slots
};

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

/// The slot maps of a host routing, as moe_route computes them in a traced program, with C slots
/// per expert and sequence: slot_token [E B C] (the token row in expert e's slot c of sequence b;
/// 0 when empty) and token_slot [N E] (the slot row of each kept (token, expert); 0 where not kept).
inline std::pair<std::vector<std::int32_t>, std::vector<std::int32_t>> slot_maps(const MoERouting& routing, std::size_t batch, std::size_t sequence,
                                                                                 std::size_t experts, std::size_t slots) {
    std::vector<std::int32_t> slot_token(experts * batch * slots, 0), token_slot(batch * sequence * experts, 0);
    for (std::size_t e = 0; e < experts; ++e) {
        std::size_t b_last = batch, c = 0;  // rows of expert e come in time order, sequence by sequence
        for (std::size_t i = routing.offsets[e]; i < routing.offsets[e + 1]; ++i) {
            const auto n = std::size_t(routing.rows[i]), b = n / sequence;
            c = b == b_last ? c + 1 : 0;
            b_last = b;
            const std::size_t slot = (e * batch + b) * slots + c;
            slot_token[slot] = std::int32_t(n);
            token_slot[n * experts + e] = std::int32_t(slot);
        }
    }
    return {std::move(slot_token), std::move(token_slot)};
}

/// The routing of probabilities p [N, E] (N = batch * sequence tokens, top `k`, `capacity` per
/// expert and sequence) as moe_route's four values: keep [N, E] (1 at each kept assignment),
/// fraction [E] (the share of the k N choices that picked each expert), slot_token [E B C] and
/// token_slot [N, E] (slot_maps, C = min(capacity, sequence)). On traced p, the rule op::moe_route
/// inside the program; on host p, the same from `route` (the reference its rule is checked with).
template <Real T>
std::vector<Tensor<T>> route_values(const Tensor<T>& p, std::size_t batch, std::size_t sequence, std::size_t k, std::size_t capacity) {
    const std::size_t tokens = p.shape()[0], experts = p.shape()[1], slots = std::min(capacity, sequence);
    backend::op_scope on("nn::MoE route", p);
    return on.run<op::moe_route>({p}, {.batch = batch, .sequence = sequence, .k = k, .capacity = capacity}, [&] {
        const MoERouting routing = route(p.data(), batch, sequence, experts, k, capacity);
        Tensor<T> keep({tokens, experts}), fraction({experts});
        for (std::int32_t g : routing.gates) keep.data()[g] = T{1};
        for (std::size_t e = 0; e < experts; ++e) fraction.data()[e] = T(double(routing.assigned[e]) / (double(k) * double(tokens)));
        const auto [slot_token, token_slot] = slot_maps(routing, batch, sequence, experts, slots);
        auto values = [](const std::vector<std::int32_t>& v, const Shape& shape) {
            Tensor<T> t(shape);
            for (std::size_t i = 0; i < v.size(); ++i) t.data()[i] = T(v[i]);
            return t;
        };
        return std::vector<Tensor<T>>{keep, fraction, values(slot_token, {experts * batch * slots}), values(token_slot, {tokens, experts})};
    });
}

/// Returns y's value unchanged; its backward passes dy through to y and gives the scalar `loss`
/// the gradient `coefficient`, as if `coefficient * loss` had been added to the objective being
/// differentiated. How a layer's own term of the loss reaches the gradient wherever the layer runs
/// (inside a reversible recompute, whose backward starts from the block's output alone, too).
template <Real T>
Tensor<T> attach_loss_gradient(const Tensor<T>& y, const Tensor<T>& loss, T coefficient) {
    return autodiff::custom_op<T>("nn::MoE balance", y, {y, loss},
                                  [coefficient, shape = loss.shape()](const Tensor<T>& dy, autodiff::GradientSink<T>& sink) {
                                      if (sink.needs(0)) sink.add(0, dy);
                                      if (!sink.needs(1)) return;
                                      device_scope on(dy.device());  // the seed where dy is (a traced program's constant there)
                                      sink.add(1, Tensor<T>(shape, coefficient));
                                  });
}

/// State shared by the copies of one MoE layer.
struct MoEShared {
    std::mutex mutex;
    MoERoutingStats stats;
};

}  // namespace detail

/// x [B, S, F] -> [B, S, F]: top-k routed experts leaky_relu(x W_e), see the top of this file.
/// Parameters: router [F, E], experts [E, F, F] (Sharing::tied in TiedMoE).
template <Real T = float, bool TiedExperts = false>
class MoE {
public:
    using value_type = T;
    using config_type = MoEConfig;
    static constexpr std::string_view name = TiedExperts ? "tied_moe" : "moe";

    MoE(const MoEConfig& config, Generator& rng)
        : capacity_factor_(config.capacity_factor),
          balance_coefficient_(config.balance_coefficient),
          top_k_(config.top_k),
          dispatch_(config.dispatch),
          slope_(T(config.leaky_slope)),
          shared_(std::make_shared<detail::MoEShared>()) {
        config.checked_features("nn::MoE");
        check<value_error>(config.features >= 1 && config.experts >= 1 && config.capacity_factor > 0,
                           "nn::MoE: needs features >= 1, experts >= 1 and capacity_factor > 0, got ", config.features, ", ", config.experts,
                           " and ", config.capacity_factor);
        check<value_error>(config.top_k >= 1 && config.top_k <= config.experts, "nn::MoE: top_k must be in [1, experts = ", config.experts,
                           "], got ", config.top_k);
        check<value_error>(std::isfinite(config.balance_coefficient) && config.balance_coefficient >= 0,
                           "nn::MoE: balance_coefficient must be finite and >= 0, got ", config.balance_coefficient);
        check<value_error>(known(config.dispatch), "nn::MoE: dispatch must be MoEDispatch::sparse, dense or slots");
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
    /// Switches this copy between the sparse, dense and slot computations (same parameters).
    void set_dispatch(MoEDispatch dispatch) {
        check<value_error>(known(dispatch), "nn::MoE::set_dispatch: expected MoEDispatch::sparse, dense or slots");
        dispatch_ = dispatch;
    }

    Tensor<T> forward(const Tensor<T>& x, const LayerContext& ctx = {}) const {
        const std::size_t features = router_.shape()[0], E = experts();
        check<shape_error>(x.defined() && x.rank() == 3 && x.shape()[2] == features, "nn::MoE: expected input [B, S, ", features, "], got ",
                           x.defined() ? to_string(x.shape()) : std::string("an undefined tensor"));
        const std::size_t batch = x.shape()[0], sequence = x.shape()[1], tokens = batch * sequence;
        check<value_error>(tokens > 0, "nn::MoE: input of shape ", to_string(x.shape()), " is empty (B or S is 0)");
        check<value_error>(tokens * E <= std::size_t(INT32_MAX), "nn::MoE: ", tokens, " tokens x ", E,
                           " experts exceed the 32-bit gate index; split the batch");
        const Tensor<T> x2 = reshape(x, {tokens, features});
        const Tensor<T> probs = softmax(matmul(x2, router_), -1);  // [N, E]
        const backend::op_scope on("nn::MoE", probs);
        // y [N, F] and the share of the choices per expert [E]
        auto [y, fraction] = on.run_composed(
            [&] {  // the routing inside the program: keep mask [N, E], the shares [E], the slot maps
                const auto routed = detail::route_values(probs, batch, sequence, top_k_, capacity(sequence));
                using backend::trace::as_indices;
                return std::pair{slots(x2, mul(probs, routed[0]), as_indices(routed[2]), as_indices(reshape(routed[3], {tokens * E}))), routed[1]};
            },
            [&] {  // the routing on the host, then the dispatch chosen
                const detail::MoERouting routing = detail::route(probs.data(), batch, sequence, E, top_k_, capacity(sequence));
                Tensor<T> out;
                if (dispatch_ == MoEDispatch::sparse) {
                    out = sparse(x2, probs, routing);
                } else {
                    const Tensor<T> gates = mul(probs, keep_mask(probs, routing));
                    if (dispatch_ == MoEDispatch::dense) {
                        out = dense(x2, gates);
                    } else {
                        const auto [slot_token, token_slot] = slot_maps(routing, batch, sequence, x2.device());
                        out = slots(x2, gates, slot_token, token_slot);
                    }
                }
                Tensor<T> shares = choice_fraction(probs, routing);
                if (!ctx.recompute) account(probs, shares, routing);
                return std::pair{out, shares};
            });
        if (autodiff::is_grad_enabled() && probs.requires_grad() && balance_coefficient_ != 0)
            y = detail::attach_loss_gradient(y, balance(probs, fraction), T(balance_coefficient_));
        return reshape(y, {batch, sequence, features});
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

    /// 1 at each kept assignment's (token, expert), else 0: [N, E].
    Tensor<T> keep_mask(const Tensor<T>& probs, const detail::MoERouting& routing) const {
        device_scope on(probs.device());
        Tensor<T> keep(probs.shape());
        for (std::int32_t g : routing.gates) keep.data()[g] = T{1};
        return keep;
    }

    /// f_e: the share of the k N top-k choices that picked expert e (before capacity), [E].
    Tensor<T> choice_fraction(const Tensor<T>& probs, const detail::MoERouting& routing) const {
        const std::size_t E = experts();
        const double choices = double(top_k_) * double(probs.shape()[0]);
        device_scope on(probs.device());
        auto fraction = Tensor<T>::uninitialized({E});
        for (std::size_t e = 0; e < E; ++e) fraction.data()[e] = T(double(routing.assigned[e]) / choices);
        return fraction;
    }

    /// MoEDispatch::slots, and the traced program's dispatch, in static shapes: expert e runs on
    /// its C = min(capacity, S) slots per sequence only ([E, B C] rows gathered from the tokens by
    /// `slot_token`, one batched GEMM over the experts), and each token gathers back its experts'
    /// rows (`token_slot` [N E]) weighted by `gates` [N, E] (zero where an assignment is not kept).
    /// Expert work E B C F^2, about capacity_factor k N F^2, against E N F^2 for `dense`.
    Tensor<T> slots(const Tensor<T>& x2, const Tensor<T>& gates, const Tensor<std::int32_t>& slot_token,
                    const Tensor<std::int32_t>& token_slot) const {
        const std::size_t tokens = x2.shape()[0], features = x2.shape()[1], E = experts(), rows = slot_token.shape()[0];
        const Tensor<T> x_slots = reshape(gather_rows(x2, slot_token), {E, rows / E, features});
        const Tensor<T> h = reshape(leaky_relu(matmul(x_slots, experts_), slope_), {rows, features});  // [E B C, F]
        const Tensor<T> back = reshape(gather_rows(h, token_slot), {tokens, E, features});
        return sum(mul(back, reshape(gates, {tokens, E, 1})), {1});
    }

    /// The slot maps of a host routing (detail::slot_maps) on `device`.
    std::pair<Tensor<std::int32_t>, Tensor<std::int32_t>> slot_maps(const detail::MoERouting& routing, std::size_t batch, std::size_t sequence,
                                                                     Device device) const {
        const std::size_t E = experts(), C = std::min(capacity(sequence), sequence);
        auto [slot_token, token_slot] = detail::slot_maps(routing, batch, sequence, E, C);
        device_scope on(device);
        return {Tensor<std::int32_t>::from({E * batch * C}, slot_token), Tensor<std::int32_t>::from({batch * sequence * E}, token_slot)};
    }

    static bool known(MoEDispatch d) { return d == MoEDispatch::sparse || d == MoEDispatch::dense || d == MoEDispatch::slots; }

    /// Every expert on every token, weighted by `gates` [N, E] (the router's probabilities where an
    /// assignment is kept, else 0): the reference.
    Tensor<T> dense(const Tensor<T>& x2, const Tensor<T>& gates) const {
        Tensor<T> y;
        for (std::size_t e = 0; e < experts(); ++e) {
            Tensor<T> out = mul(slice(gates, -1, e, e + 1), leaky_relu(matmul(x2, take_leading(experts_, e)), slope_));
            y = y.defined() ? add(y, out) : out;
        }
        return y;
    }

    /// E * sum_e f_e P_e, differentiable in the probabilities (the fraction f is a constant).
    Tensor<T> balance(const Tensor<T>& probs, const Tensor<T>& fraction) const {
        return sum(mul(mean(probs, {0}), fraction)) * T(experts());
    }

    /// Routing counters and the balance value (detached) into routing_stats().
    void account(const Tensor<T>& probs, const Tensor<T>& fraction, const detail::MoERouting& routing) const {
        const std::size_t tokens = probs.shape()[0], E = experts();
        double value = 0;
        {
            autodiff::no_grad off;
            value = double(balance(probs, fraction).item());
        }
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
    }

    Tensor<T> router_, experts_;  // router [F, E], experts [E, F, F]
    double capacity_factor_, balance_coefficient_;
    std::size_t top_k_;
    MoEDispatch dispatch_;
    T slope_;
    std::shared_ptr<detail::MoEShared> shared_;
};

/// The weight-tied variant: inside an nn::Stack every layer shares one expert bank.
template <Real T = float>
using TiedMoE = MoE<T, true>;

}  // namespace olmax::nn

// ---- the key of the MoE routing's lowering rule (its rule: olmax/trace/rules.hpp) -------------

namespace olmax::op {

/// Probabilities [N, E] (no gradient) to nn::detail::route_values' four values.
struct moe_route : registered<moe_route> {
    static constexpr std::string_view name = "moe_route";
    struct attrs {
        std::size_t batch = 0, sequence = 0, k = 1, capacity = 0;
    };
    static std::vector<sample<attrs>> samples(Generator& rng) {
        auto probabilities = [&](std::size_t n, std::size_t e) {  // rows of a softmax: positive, summing to 1
            Tensor<float> p = samples::uniform(rng, {n, e}, 0.05f, 1.0f);
            for (std::size_t r = 0; r < n; ++r) {
                float total = 0;
                for (std::size_t c = 0; c < e; ++c) total += p.data()[r * e + c];
                for (std::size_t c = 0; c < e; ++c) p.data()[r * e + c] /= total;
            }
            return p;
        };
        return {{{probabilities(8, 3)}, {2, 4, 1, 2}, {0}},    // some assignments dropped
                {{probabilities(5, 4)}, {1, 5, 2, 2}, {0}},    // top 2
                {{probabilities(6, 2)}, {2, 3, 2, 9}, {0}}};   // capacity above the sequence
    }
    template <Real T> static std::vector<Tensor<T>> eager(std::span<const Tensor<T>> in, const attrs& a) {
        return nn::detail::route_values(in[0], a.batch, a.sequence, a.k, a.capacity);
    }
};

}  // namespace olmax::op
