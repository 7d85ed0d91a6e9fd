#pragma once
// What a training loop needs from the main job's TrainConfig besides the model: the optimiser's
// settings and the number of row shards per batch. Here, not in olmax::config: config sits beside
// optim in the layering and does not include it.

#include <algorithm>
#include <cstddef>

#include "olmax/backend/registry.hpp"
#include "olmax/config/train_config.hpp"
#include "olmax/optim/adam.hpp"
#include "olmax/optim/param.hpp"
#include "olmax/optim/schedule.hpp"

namespace olmax::models {

/// The AdamW settings of a training config (schedule, betas, decay policy, AGC, global clip).
inline optim::AdamWConfig optimizer_config(const config::TrainConfig& c) {
    optim::AdamWConfig o;
    o.schedule = optim::LrSchedule{c.lr, c.warmup, c.lr_decay, c.decay_start, c.min_lr};
    o.beta1 = c.beta1;
    o.beta2 = c.beta2;
    o.eps = c.eps;
    o.weight_decay = c.weight_decay;
    o.decay_policy = optim::parse_weight_decay_policy(c.decay_policy);
    o.agc.clip = c.agc_clip;
    o.max_grad_norm = c.max_grad_norm;
    return o;
}

/// Row shards per batch: one per host thread when `data_parallel` is on (ByteLM::accumulate_gradients).
inline std::size_t shards_for(const config::TrainConfig& c) {
    return c.data_parallel ? std::size_t(std::max(backend::host_kernels().num_threads(), 1)) : 1;
}

}  // namespace olmax::models
