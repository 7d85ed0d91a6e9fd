#pragma once
// optim::AdamW's step written in traced primitives (the whole-step XLA path, docs/xla.md), so the
// update compiles into the same program as the forward and backward passes and its state stays
// on the device. It is AdamW::step's arithmetic in the same order (torch.optim.AdamW's), on f32
// values where the host keeps its moments in double:
//     c = min(1, max_norm / (||g||_2 + 1e-6))            (global-norm clipping, max_norm > 0)
//     p <- p (1 - lr_p wd_p)                             (decoupled weight decay)
//     m <- b1 m + (1 - b1) c g,   v <- b2 v + (1 - b2) (c g)^2
//     p <- p - step_size_p m / (sqrt(v) / sqrt(1 - b2^t) + eps),   step_size_p = lr_p / (1 - b1^t)
// with lr_p = lr * lr_scale_p. The schedule's learning rate and the two bias corrections depend on
// the step number only; they come in per call as the three values of `schedule_inputs`, so one
// compiled program serves every step.

#include <cmath>
#include <cstdint>
#include <vector>

#include "olmax/backend/xla/graph/graph.hpp"
#include "olmax/optim/adam.hpp"
#include "olmax/optim/param.hpp"

namespace olmax::optim {

/// The per-call values of a lowered AdamW step for optimiser step `step` (1-based): the scheduled
/// learning rate, lr / (1 - b1^t) and sqrt(1 - b2^t), as AdamW::step computes them.
inline std::vector<float> lowered_adamw_schedule(const AdamWConfig& config, std::int64_t step) {
    const double lr = config.schedule(step), t = double(step);
    return {float(lr), float(lr / (1.0 - std::pow(config.beta1, t))), float(std::sqrt(1.0 - std::pow(config.beta2, t)))};
}

/// One lowered AdamW step's results: the new parameters and moments, and the global gradient norm.
struct LoweredAdamW {
    std::vector<xla::graph::var> parameters, first_moments, second_moments;
    xla::graph::var grad_norm;
};

/// The update of `params` (one traced value per optimiser parameter `infos`, same order) from their
/// gradients and moments; `schedule` is the f32 [3] per-call input (lowered_adamw_schedule).
template <Real T>
LoweredAdamW lower_adamw_step(const std::vector<Parameter<T>>& infos, const AdamWConfig& config, const std::vector<xla::graph::var>& params,
                              const std::vector<xla::graph::var>& grads, const std::vector<xla::graph::var>& m,
                              const std::vector<xla::graph::var>& v, const xla::graph::var& schedule) {
    namespace gx = xla::graph;
    config.validate();
    check<value_error>(config.decay_mode == WeightDecayMode::decoupled && config.agc.clip == 0,
                       "optim::lower_adamw_step: only decoupled weight decay without AGC is lowered (got ",
                       config.decay_mode == WeightDecayMode::decoupled ? "AGC clip " : "L2 weight decay", config.agc.clip, ")");
    check<value_error>(infos.size() == params.size() && params.size() == grads.size() && grads.size() == m.size() && m.size() == v.size() &&
                           !params.empty(),
                       "optim::lower_adamw_step: ", infos.size(), " parameters, ", params.size(), " values, ", grads.size(),
                       " gradients and ", m.size(), " / ", v.size(), " moments");
    check<value_error>(schedule.type() == gx::f32({3}), "optim::lower_adamw_step: the schedule input must be f32 [3], got ",
                       schedule.type().str());
    gx::graph& g = schedule.owner();
    auto element = [&](std::int64_t i) { return gx::reshape(gx::slice(schedule, {i}, {i + 1}), {}); };
    const gx::var lr = element(0), step_size = element(1), correction2 = element(2);

    gx::var sum_sq = gx::constant(g, 0.0, gx::f32({}));
    for (const auto& grad : grads) {
        gx::dims_t all;
        for (std::int64_t d = 0; d < static_cast<std::int64_t>(grad.type().rank()); ++d) all.push_back(d);
        sum_sq = sum_sq + (all.empty() ? grad * grad : gx::sum(grad * grad, all));
    }
    LoweredAdamW out;
    out.grad_norm = gx::sqrt(sum_sq);
    gx::var scale = gx::constant(g, 1.0, gx::f32({}));
    if (config.max_grad_norm > 0) {
        const gx::var wanted = gx::constant(g, config.max_grad_norm, gx::f32({})) / (out.grad_norm + 1e-6);
        scale = gx::select(gx::compare(wanted, scale, gx::compare_direction::LT), wanted, scale);
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
        const auto& dims = params[i].dims();
        const double wd = receives_weight_decay(infos[i].role, config.decay_policy) ? config.weight_decay : 0.0;
        const double lr_scale = infos[i].lr_scale;
        const gx::var grad = grads[i] * gx::broadcast_to(scale, dims);
        const gx::var decayed = wd != 0 ? params[i] * gx::broadcast_to(1.0 - lr * (lr_scale * wd), dims) : params[i];
        const gx::var m_next = m[i] * config.beta1 + grad * (1 - config.beta1);
        const gx::var v_next = v[i] * config.beta2 + (grad * (1 - config.beta2)) * grad;
        const gx::var denom = gx::sqrt(v_next) / gx::broadcast_to(correction2, dims) + config.eps;
        out.parameters.push_back(decayed - gx::broadcast_to(step_size * lr_scale, dims) * (m_next / denom));
        out.first_moments.push_back(m_next);
        out.second_moments.push_back(v_next);
    }
    return out;
}

}  // namespace olmax::optim
