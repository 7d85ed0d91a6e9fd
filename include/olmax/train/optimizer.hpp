#pragma once
// The optimiser keys of a program's config and the AdamW settings they make. Here rather than in
// optim: optim sits beside config in the layering and does not include it.

#include <cstdint>
#include <string>
#include <vector>

#include "olmax/config/key_value.hpp"
#include "olmax/core/error.hpp"
#include "olmax/optim/adam.hpp"
#include "olmax/optim/param.hpp"
#include "olmax/optim/schedule.hpp"

namespace olmax::train {

struct OptimizerConfig {
    double lr = 3e-3;
    std::int64_t warmup = 50;
    std::string lr_schedule = "exponential";
    double lr_decay = 1e-4;
    std::int64_t decay_start = -1;
    double min_lr = 0.0;
    // AdamW's own settings: optim::AdamWConfig::language_model()'s (recipe), so the library's
    // optimiser recipe and the programs' defaults are written once.
    static constexpr optim::AdamWConfig recipe = optim::AdamWConfig::language_model();
    double beta1 = recipe.beta1;
    double beta2 = recipe.beta2;
    double eps = recipe.eps;
    double weight_decay = recipe.weight_decay;
    std::string decay_policy{optim::to_string(recipe.decay_policy)};
    double agc_clip = recipe.agc.clip;
    double max_grad_norm = recipe.max_grad_norm;
    std::string adam_moments{optim::to_string(recipe.moments)};

    static const std::vector<config::Field<OptimizerConfig>>& fields() {
        using C = OptimizerConfig;
        using config::Field;
        constexpr double steps_max = 1e12;
        static const std::vector<Field<C>> f{
            Field<C>{"lr", &C::lr, "peak learning rate"}.greater_than(0).at_most(10),
            Field<C>{"warmup", &C::warmup, "linear warmup steps"}.in(0, steps_max),
            Field<C>{"lr_schedule", &C::lr_schedule, "decay after warmup: exponential (lr_decay per step), or cosine / linear from lr down to min_lr over "
                                                     "the run (its steps, or its time_budget_s when that ends it sooner)", {"exponential", "cosine", "linear"}},
            Field<C>{"lr_decay", &C::lr_decay, "exponential decay rate per step after decay_start"}.at_least(0).less_than(1),
            Field<C>{"decay_start", &C::decay_start, "first decayed step (-1: end of warmup)"}.in(-1, steps_max),
            Field<C>{"min_lr", &C::min_lr, "floor of the decayed learning rate"}.in(0, 10),
            Field<C>{"beta1", &C::beta1, "Adam first-moment decay"}.at_least(0).less_than(1),
            Field<C>{"beta2", &C::beta2, "Adam second-moment decay"}.at_least(0).less_than(1),
            Field<C>{"eps", &C::eps, "Adam epsilon"}.greater_than(0).at_most(1),
            Field<C>{"weight_decay", &C::weight_decay, "decoupled weight decay"}.in(0, 10),
            Field<C>{"decay_policy", &C::decay_policy, "which parameter roles are decayed", {"matrices", "embeddings_only", "all", "none"}},
            Field<C>{"agc_clip", &C::agc_clip, "unit-wise adaptive gradient clipping ratio (0: off)"}.in(0, 1e6),
            Field<C>{"max_grad_norm", &C::max_grad_norm, "global gradient-norm clip (0: off)"}.in(0, 1e12),
            Field<C>{"adam_moments", &C::adam_moments, "AdamW's moment type (fp32, as PyTorch: half the optimiser memory of fp64 and a faster update; bf16: half "
                                 "fp32's, stochastically rounded, --device=cpu only)", {"fp32", "fp64", "bf16"}},
        };
        return f;
    }

    /// The keys' ranges, and the floor of the schedule not above its peak.
    void validate() const {
        config::validate_fields(*this);
        check<config::config_error>(min_lr <= lr, "config: key 'min_lr' (", min_lr, ") must not exceed 'lr' (", lr, ")");
    }
};

/// The AdamW settings of the keys (schedule, betas, decay policy, AGC, global clip).
inline optim::AdamWConfig optimizer_config(const OptimizerConfig& c) {
    optim::AdamWConfig o = OptimizerConfig::recipe;  // its other fields (decay mode, AGC floors)
    o.schedule = optim::LrSchedule{c.lr, c.warmup, c.lr_decay, c.decay_start, c.min_lr, optim::parse_lr_decay(c.lr_schedule)};
    o.beta1 = c.beta1;
    o.beta2 = c.beta2;
    o.eps = c.eps;
    o.weight_decay = c.weight_decay;
    o.decay_policy = optim::parse_weight_decay_policy(c.decay_policy);
    o.agc.clip = c.agc_clip;
    o.max_grad_norm = c.max_grad_norm;
    o.moments = optim::parse_moment_precision(c.adam_moments);
    return o;
}

}  // namespace olmax::train
