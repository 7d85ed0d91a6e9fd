#pragma once
// Top-1 gated mixture of experts with capacity and a load-balancing loss (Switch Transformer,
// Fedus et al. 2021; the original Olmax's learned top-1 MoE before 2022-05), and the weight-tied
// variant (one expert bank shared by every layer of an nn::Stack, the original's PR #88 idea).

#include <algorithm>
#include <cmath>
#include <memory>
#include <string_view>
#include <vector>

#include "olmax/backend/dispatch.hpp"
#include "olmax/nn/contract.hpp"
#include "olmax/nn/init.hpp"
#include "olmax/nn/views.hpp"
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/linalg.hpp"
#include "olmax/ops/loss.hpp"
#include "olmax/ops/reduction.hpp"
#include "olmax/ops/shape.hpp"

namespace olmax::nn {

/// x [B, S, F] -> sum_e gate_e(x) * leaky_relu(x W_e), gate = softmax(x W_router) masked to the
/// top-1 expert. Each expert takes at most C = ceil(capacity_factor * S / E) tokens per sequence,
/// first come first served in time order (so the layer stays causal); overflowing tokens get zero
/// output (the residual coupling carries them). Experts are computed densely (E matmuls) — simple
/// and exact, E times the flops of a sparse dispatch.
///
/// Load-balancing loss E * sum_e f_e P_e (f_e: fraction of tokens whose top-1 is e, P_e: mean
/// router probability of e) is added to `auxiliary_loss()` on every forward that records on the
/// tape and is not a reversible recompute (so not inside a memory-saving reversible block, whose
/// forward runs without a tape: use reversible_backward = false to train the balance there).
template <Real T = float, bool TiedExperts = false>
class MoE {
public:
    using value_type = T;
    using config_type = Config;
    static constexpr std::string_view name = TiedExperts ? "tied_moe" : "moe";

    MoE(const Config& config, Generator& rng)
        : router_(parameter(randn<T>({config.features, config.experts}, rng, T{0}, T(1.0 / std::sqrt(double(config.features)))))),
          experts_(parameter(orthogonal_init<T>({config.experts, config.features, config.features}, rng))),
          capacity_factor_(config.capacity_factor),
          slope_(T(config.leaky_slope)),
          aux_(std::make_shared<Tensor<T>>()) {
        check<value_error>(config.experts >= 1 && config.capacity_factor > 0, "nn::MoE: needs experts >= 1 and capacity_factor > 0, got ",
                           config.experts, " and ", config.capacity_factor);
    }

    std::size_t capacity(std::size_t sequence) const {
        const std::size_t experts = router_.shape()[1];
        return std::size_t(std::ceil(capacity_factor_ * double(sequence) / double(experts)));
    }

    Tensor<T> forward(const Tensor<T>& x, const LayerContext& ctx = {}) const {
        const std::size_t features = router_.shape()[0], experts = router_.shape()[1];
        check<shape_error>(x.rank() == 3 && x.shape()[2] == features, "nn::MoE: expected input [B, S, ", features, "], got ",
                           to_string(x.shape()));
        const std::size_t batch = x.shape()[0], sequence = x.shape()[1];
        Tensor<T> probs = softmax(matmul(x, router_), -1);  // [B, S, E]

        // Top-1 choice and capacity, per sequence in time order (constants: no gradient through argmax).
        Tensor<T> keep({batch, sequence, experts});
        std::vector<double> routed(experts, 0.0);
        const std::size_t cap = capacity(sequence);
        for (std::size_t b = 0; b < batch; ++b) {
            std::vector<std::size_t> used(experts, 0);
            for (std::size_t t = 0; t < sequence; ++t) {
                const T* p = probs.data() + (b * sequence + t) * experts;
                const std::size_t e = std::size_t(std::max_element(p, p + experts) - p);
                routed[e] += 1;
                if (used[e]++ < cap) keep(b, t, e) = T{1};
            }
        }
        Tensor<T> gates = mul(probs, keep);
        Tensor<T> y;
        for (std::size_t e = 0; e < experts; ++e) {
            Tensor<T> out = mul(slice(gates, -1, e, e + 1), leaky_relu(matmul(x, take_leading(experts_, e)), slope_));
            y = y.defined() ? add(y, out) : out;
        }
        if (autodiff::is_grad_enabled() && probs.requires_grad() && !ctx.recompute) {
            // E * sum_e f_e * P_e with P_e = mean over tokens of probs[..., e].
            device_scope on(probs.device());
            Tensor<T> fraction = Tensor<T>::uninitialized({experts});
            for (std::size_t e = 0; e < experts; ++e) fraction(e) = T(routed[e] / double(batch * sequence));
            Tensor<T> balance = sum(mul(mean(probs, {0, 1}), fraction)) * T(experts);
            *aux_ = aux_->defined() ? add(*aux_, balance) : balance;
        }
        return y;
    }

    /// Sum of the load-balancing losses of the forwards since the last `clear_auxiliary_loss()`
    /// (shared by copies of this layer, e.g. every layer of a Stack); undefined when none ran.
    Tensor<T> auxiliary_loss() const { return *aux_; }
    void clear_auxiliary_loss() const { *aux_ = Tensor<T>(); }

    void visit_parameters(ParameterVisitor<T>& visit) {
        visit("router", router_, Role::weight);
        visit("experts", experts_, Role::weight, TiedExperts ? Sharing::tied : Sharing::per_layer);
    }

private:
    Tensor<T> router_, experts_;  // router [F, E], experts [E, F, F]
    double capacity_factor_;
    T slope_;
    std::shared_ptr<Tensor<T>> aux_;
};

/// The weight-tied variant: inside an nn::Stack every layer shares one expert bank.
template <Real T = float>
using TiedMoE = MoE<T, true>;

}  // namespace olmax::nn
