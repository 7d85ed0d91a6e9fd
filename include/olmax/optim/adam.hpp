#pragma once
// Adam / AdamW with bias correction (Kingma & Ba 2015, Algorithm 1; decoupled weight decay from
// Loshchilov & Hutter 2019). The arithmetic follows torch.optim.AdamW step by step so the
// reference values in tests/data/ (made by tools/make_optim_reference.py) match to rounding. The
// original Olmax never ran its bias correction (olmax-techniques.md §0 #3); here every EMA is
// debiased with t counted from 1. Moments are kept in double, as the original did since PR #104.

#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "olmax/backend/cpu_openmp.hpp"
#include "olmax/core/core.hpp"
#include "olmax/optim/clipping.hpp"
#include "olmax/optim/param.hpp"
#include "olmax/optim/schedule.hpp"

namespace olmax::optim {

/// A gradient held NaN or Inf; the step was refused and nothing was changed.
class non_finite_gradient : public value_error {
public:
    using value_error::value_error;
};

enum class WeightDecayMode {
    decoupled,  // AdamW: p <- p * (1 - lr_p * wd), outside the adaptive update
    l2,         // classic Adam: g <- g + wd * p before the moments
};

struct AdamWConfig {
    LrSchedule schedule{};
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.0;
    WeightDecayPolicy decay_policy = WeightDecayPolicy::matrices;
    WeightDecayMode decay_mode = WeightDecayMode::decoupled;
    /// Unit-wise adaptive gradient clipping, applied first (clip 0 = off).
    AgcConfig agc{};
    /// Global-norm clipping after AGC (0 = off).
    double max_grad_norm = 0.0;

    void validate() const {
        schedule.validate();
        check(beta1 >= 0 && beta1 < 1, "AdamW: beta1 must be in [0, 1), got ", beta1);
        check(beta2 >= 0 && beta2 < 1, "AdamW: beta2 must be in [0, 1), got ", beta2);
        check(eps >= 0, "AdamW: eps must be >= 0, got ", eps);
        check(weight_decay >= 0, "AdamW: weight_decay must be >= 0, got ", weight_decay);
        check(max_grad_norm >= 0, "AdamW: max_grad_norm must be >= 0, got ", max_grad_norm);
        check(agc.clip >= 0, "AdamW: agc.clip must be >= 0, got ", agc.clip);
    }
};

/// What one optimiser step did.
struct StepReport {
    std::int64_t step = 0;            // the step just taken (1-based)
    double lr = 0;                    // scheduled learning rate (before per-parameter scales)
    double grad_norm = 0;             // global gradient norm after AGC, before global clipping
    std::size_t agc_clipped_units = 0;
};

/// Optimiser state of one parameter, for checkpoints.
struct SlotState {
    std::string name;
    std::int64_t step = 0;  // updates this parameter has received (bias-correction t)
    Tensor<double> first_moment;
    Tensor<double> second_moment;
};

struct AdamState {
    std::int64_t step = 0;  // optimiser steps taken (drives the schedule)
    std::vector<SlotState> slots;
};

template <Real T>
class AdamW {
public:
    AdamW(std::vector<Parameter<T>> params, AdamWConfig config) : params_(std::move(params)), config_(std::move(config)) {
        config_.validate();
        std::set<std::string> names;
        std::set<const void*> buffers;
        for (const auto& p : params_) {
            check(!p.name.empty(), "AdamW: every parameter needs a name");
            check(names.insert(p.name).second, "AdamW: parameter name '", p.name, "' appears twice");
            check(p.tensor.defined(), "AdamW: parameter '", p.name, "' is an undefined tensor");
            check(p.tensor.requires_grad(), "AdamW: parameter '", p.name, "' does not require grad (use olmax::parameter)");
            check(buffers.insert(p.tensor.impl_ptr().get()).second, "AdamW: parameter '", p.name, "' is the same tensor as another one");
            check(p.lr_scale >= 0 && std::isfinite(p.lr_scale), "AdamW: parameter '", p.name, "' has lr_scale ", p.lr_scale);
            slots_.push_back(SlotState{p.name, 0, zeros<double>(p.tensor.shape()), zeros<double>(p.tensor.shape())});
        }
    }

    const std::vector<Parameter<T>>& parameters() const { return params_; }
    const AdamWConfig& config() const { return config_; }
    std::int64_t step_count() const { return step_; }
    /// The scheduled learning rate the next step will use.
    double next_lr() const { return config_.schedule(step_ + 1); }

    /// Drops every parameter's gradient.
    void zero_grad() {
        for (auto& p : params_) p.tensor.zero_grad();
    }

    /// One update from the parameters' current gradients. A parameter without a gradient is left
    /// alone (its moments do not advance), as in PyTorch. A NaN/Inf gradient throws
    /// `non_finite_gradient` before anything changes.
    StepReport step() {
        for (const auto& p : params_) {
            const Tensor<T> g = p.tensor.grad();
            if (!g.defined()) continue;
            // sum of g * 0 is NaN exactly when some g is NaN or Inf; a reduction vectorises, an
            // early-exit search does not.
            const T* gp = g.data();
            const std::size_t n = g.size();
            double probe = 0;
#pragma omp simd reduction(+ : probe)
            for (std::size_t i = 0; i < n; ++i) probe += double(gp[i]) * 0.0;
            if (!std::isfinite(probe))
                throw non_finite_gradient(olmax::detail::concat("AdamW::step: non-finite gradient in parameter '", p.name, "' at step ",
                                                         step_ + 1, "; parameters were not updated"));
        }
        StepReport report;
        report.step = step_ + 1;
        report.lr = config_.schedule(report.step);
        if (config_.agc.clip > 0)
            for (auto& p : params_) {
                Tensor<T> g = p.tensor.grad();
                if (g.defined()) report.agc_clipped_units += adaptive_grad_clip(p.tensor, g, config_.agc, p.stacked_axes, p.unit_axis);
            }
        report.grad_norm = clip_grad_norm(std::span<const Parameter<T>>(params_), config_.max_grad_norm);
        for (std::size_t i = 0; i < params_.size(); ++i) update(params_[i], slots_[i], report.lr);
        step_ = report.step;
        return report;
    }

    AdamState export_state() const {
        AdamState state{step_, {}};
        for (const auto& s : slots_) state.slots.push_back(SlotState{s.name, s.step, s.first_moment.clone(), s.second_moment.clone()});
        return state;
    }

    /// Restores a state saved by `export_state` for the same parameter set (names and shapes checked).
    void import_state(const AdamState& state) {
        check(state.step >= 0, "AdamW::import_state: negative step ", state.step);
        check(state.slots.size() == slots_.size(), "AdamW::import_state: state has ", state.slots.size(), " parameters, optimiser has ",
              slots_.size());
        std::vector<SlotState> restored;
        for (std::size_t i = 0; i < slots_.size(); ++i) {
            const SlotState* found = nullptr;
            for (const auto& s : state.slots)
                if (s.name == slots_[i].name) found = &s;
            check(found != nullptr, "AdamW::import_state: no state for parameter '", slots_[i].name, "'");
            check<shape_error>(found->first_moment.defined() && found->second_moment.defined() &&
                                   found->first_moment.shape() == params_[i].tensor.shape() &&
                                   found->second_moment.shape() == params_[i].tensor.shape(),
                               "AdamW::import_state: state of '", slots_[i].name, "' does not have the parameter's shape ",
                               olmax::to_string(params_[i].tensor.shape()));
            check(found->step >= 0 && found->step <= state.step, "AdamW::import_state: parameter '", slots_[i].name, "' has step ",
                  found->step, " beyond the optimiser step ", state.step);
            restored.push_back(SlotState{found->name, found->step, found->first_moment.clone(), found->second_moment.clone()});
        }
        slots_ = std::move(restored);
        step_ = state.step;
    }

private:
    void update(Parameter<T>& p, SlotState& slot, double scheduled_lr) {
        const Tensor<T> grad_tensor = p.tensor.grad();
        if (!grad_tensor.defined()) return;
        const double lr = scheduled_lr * p.lr_scale;
        const double wd = receives_weight_decay(p.role, config_.decay_policy) ? config_.weight_decay : 0.0;
        const bool decoupled = config_.decay_mode == WeightDecayMode::decoupled;
        slot.step += 1;
        const double t = double(slot.step);
        const double b1 = config_.beta1, b2 = config_.beta2;
        const double step_size = lr / (1.0 - std::pow(b1, t));
        const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(b2, t));
        T* w = p.tensor.data();
        const T* g = grad_tensor.data();
        double* m = slot.first_moment.data();
        double* v = slot.second_moment.data();
        const std::size_t n = p.tensor.size();
        const double eps = config_.eps;
        // Element-wise and independent: split across the default backend's threads (same result
        // for any thread count).
        auto run = [&]<bool Decoupled>(std::size_t begin, std::size_t end) {
            for (std::size_t i = begin; i < end; ++i) {
                double param = double(w[i]);
                double grad = double(g[i]);
                if constexpr (Decoupled) param *= 1.0 - lr * wd;
                else grad += wd * param;
                m[i] = m[i] * b1 + (1.0 - b1) * grad;
                v[i] = v[i] * b2 + (1.0 - b2) * grad * grad;
                const double denom = std::sqrt(v[i]) / bias_correction2_sqrt + eps;
                w[i] = T(param - step_size * (m[i] / denom));
            }
        };
        backend::default_backend::parallel_for(n, 16, [&](std::size_t begin, std::size_t end) {
            if (decoupled) run.template operator()<true>(begin, end);
            else run.template operator()<false>(begin, end);
        });
    }

    std::vector<Parameter<T>> params_;
    AdamWConfig config_;
    std::vector<SlotState> slots_;
    std::int64_t step_ = 0;
};

/// Classic Adam is AdamW with L2 weight decay folded into the gradient.
inline AdamWConfig adam_config(AdamWConfig config) {
    config.decay_mode = WeightDecayMode::l2;
    return config;
}

}  // namespace olmax::optim
