#pragma once
// Learning-rate schedule: linear warmup, then a decay that starts after warmup by default.
// `exponential` (the default): lr x (1 - r)^n (the original's (1 - 3e-6)^step decay started at step 0,
// inside warmup). `cosine` and `linear`: from the peak down to `min_lr` over the rest of the
// training, as nanoGPT and most speedruns do, so a run ends at the floor whether steps or a time
// budget end it. Their progress is the larger of the steps' fraction (`total_steps`) and the
// fraction of training the caller reports (train::Trainer reports the larger of steps done / steps
// and seconds / time budget, so a time-budgeted run decays over the budget).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string_view>

#include "olmax/core/error.hpp"

namespace olmax::optim {

/// The shape of the decay after warmup.
enum class LrDecay {
    exponential,  ///< lr x (1 - exponential_decay)^(steps after decay_start), floored at min_lr
    cosine,       ///< min_lr + (peak - min_lr) (1 + cos(pi p)) / 2 at progress p in [0, 1]
    linear,       ///< min_lr + (peak - min_lr) (1 - p)
};

inline LrDecay parse_lr_decay(std::string_view name) {
    if (name == "exponential") return LrDecay::exponential;
    if (name == "cosine") return LrDecay::cosine;
    if (name == "linear") return LrDecay::linear;
    throw value_error(olmax::detail::concat("LrSchedule: unknown decay '", name, "' (exponential, cosine or linear)"));
}

struct LrSchedule {
    double peak_lr = 1e-3;
    /// Steps of linear warmup: lr(t) = peak * t / warmup_steps for t <= warmup_steps (t counts from 1).
    std::int64_t warmup_steps = 0;
    /// Per-step decay rate r: lr is multiplied by (1 - r) each step after `decay_start`.
    double exponential_decay = 0.0;
    /// First step whose lr is not yet decayed; negative means "the end of warmup".
    std::int64_t decay_start = -1;
    /// Floor on the decayed learning rate (where cosine and linear decays end).
    double min_lr = 0.0;
    LrDecay decay = LrDecay::exponential;
    /// cosine / linear: the step at which the decay reaches min_lr (0: only the reported progress
    /// decays; see operator()).
    std::int64_t total_steps = 0;

    void validate() const {
        check(peak_lr >= 0 && std::isfinite(peak_lr), "LrSchedule: peak_lr must be finite and >= 0, got ", peak_lr);
        check(warmup_steps >= 0, "LrSchedule: warmup_steps must be >= 0, got ", warmup_steps);
        check(exponential_decay >= 0 && exponential_decay < 1, "LrSchedule: exponential_decay must be in [0, 1), got ", exponential_decay);
        check(min_lr >= 0, "LrSchedule: min_lr must be >= 0, got ", min_lr);
        check(total_steps >= 0, "LrSchedule: total_steps must be >= 0, got ", total_steps);
    }

    /// The learning rate of optimiser step `step` (1-based, as PyTorch and the original count).
    /// `progress`: the fraction of the training done, as the caller measures it (e.g. of a time
    /// budget); cosine and linear decays follow the larger of it and the steps' fraction (steps
    /// after decay_start over total_steps - decay_start). The exponential decay ignores it.
    double operator()(std::int64_t step, double progress = 0.0) const {
        check(step >= 1, "LrSchedule: steps count from 1, got ", step);
        const double warm = warmup_steps > 0 ? double(std::min(step, warmup_steps)) / double(warmup_steps) : 1.0;
        const std::int64_t start = decay_start < 0 ? warmup_steps : decay_start;
        if (decay != LrDecay::exponential) {
            double p = std::isfinite(progress) ? progress : 0.0;
            if (total_steps > start) p = std::max(p, double(step - start) / double(total_steps - start));
            p = std::clamp(p, 0.0, 1.0);
            const double shape = decay == LrDecay::cosine ? 0.5 * (1.0 + std::cos(std::numbers::pi * p)) : 1.0 - p;
            const double floor = std::min(min_lr, peak_lr);
            return warm * (floor + (peak_lr - floor) * shape);
        }
        const double decayed_steps = double(std::max<std::int64_t>(0, step - start));
        // (1 - r)^n via exp(n log1p(-r)): accurate for the tiny rates used (3e-6).
        const double decay = std::exp(decayed_steps * std::log1p(-exponential_decay));
        return std::max(peak_lr * warm * decay, std::min(min_lr, peak_lr * warm));
    }
};

}  // namespace olmax::optim
