#pragma once
// Learning-rate schedule: linear warmup, then exponential decay that starts after warmup by default
// (the original's (1 - 3e-6)^step decay started at step 0, inside warmup).

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "olmax/core/error.hpp"

namespace olmax::optim {

struct LrSchedule {
    double peak_lr = 1e-3;
    /// Steps of linear warmup: lr(t) = peak * t / warmup_steps for t <= warmup_steps (t counts from 1).
    std::int64_t warmup_steps = 0;
    /// Per-step decay rate r: lr is multiplied by (1 - r) each step after `decay_start`.
    double exponential_decay = 0.0;
    /// First step whose lr is not yet decayed; negative means "the end of warmup".
    std::int64_t decay_start = -1;
    /// Floor on the decayed learning rate.
    double min_lr = 0.0;

    void validate() const {
        check(peak_lr >= 0 && std::isfinite(peak_lr), "LrSchedule: peak_lr must be finite and >= 0, got ", peak_lr);
        check(warmup_steps >= 0, "LrSchedule: warmup_steps must be >= 0, got ", warmup_steps);
        check(exponential_decay >= 0 && exponential_decay < 1, "LrSchedule: exponential_decay must be in [0, 1), got ", exponential_decay);
        check(min_lr >= 0, "LrSchedule: min_lr must be >= 0, got ", min_lr);
    }

    /// The learning rate of optimiser step `step` (1-based, as PyTorch and the original count).
    double operator()(std::int64_t step) const {
        check(step >= 1, "LrSchedule: steps count from 1, got ", step);
        const double warm = warmup_steps > 0 ? double(std::min(step, warmup_steps)) / double(warmup_steps) : 1.0;
        const std::int64_t start = decay_start < 0 ? warmup_steps : decay_start;
        const double decayed_steps = double(std::max<std::int64_t>(0, step - start));
        // (1 - r)^n via exp(n log1p(-r)): accurate for the tiny rates used (3e-6).
        const double decay = std::exp(decayed_steps * std::log1p(-exponential_decay));
        return std::max(peak_lr * warm * decay, std::min(min_lr, peak_lr * warm));
    }
};

}  // namespace olmax::optim
