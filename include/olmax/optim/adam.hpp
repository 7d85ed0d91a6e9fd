#pragma once
// Adam / AdamW with bias correction (Kingma & Ba 2015, Algorithm 1; decoupled weight decay from
// Loshchilov & Hutter 2019). The arithmetic follows torch.optim.AdamW step by step so the
// reference values in tests/data/ (made by tools/make_optim_reference.py) match to rounding. The
// original Olmax never ran its bias correction (its `ema()` read the momentum type and discarded
// it, so the debiased branch never ran); here every EMA is debiased, m / (1 - beta1^t) and
// v / (1 - beta2^t) with t counted from 1. Moments are kept in double by default, as the original
// did since its PR #104 (AdamWConfig::moments; float32 moments, torch.optim.AdamW's for float
// parameters, halve the optimiser's memory and a third of a step's traffic; bfloat16 moments halve
// it again, see MomentPrecision::bfloat16).
//
// Speed: a step streams ~44 bytes per float parameter with double moments (parameter, gradient,
// two moments in; parameter and moments out; 28 with float32 moments), so it is written to be
// bound by that traffic: one pass over the
// gradients gives the global norm and the non-finite check together, global-norm clipping is
// applied inside the update (the gradients are not rewritten), and the update is one explicitly
// vectorised loop (xsimd; GCC does not vectorise std::sqrt because of errno) over all parameters,
// split across the threads of the parameters' device's kernels.
//
// Memory: `step_during_backward` applies each parameter's update inside the reverse pass, as soon as
// its gradient is final, and drops that gradient, so a step never holds every gradient at once
// (the optimiser step fused into backward, as PyTorch's post-accumulate-grad hooks do and LOMO,
// Lv et al. 2023, "Full Parameter Fine-tuning for Large Language Models with Limited Resources").
// With global-norm clipping it runs backward twice, as LOMO does: once for the norm, once to update.

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "olmax/autodiff/gradient_hooks.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/core/core.hpp"
#include "olmax/detail/simd.hpp"
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/reduction.hpp"
#include "olmax/ops/shape.hpp"
#include "olmax/optim/clipping.hpp"
#include "olmax/optim/param.hpp"
#include "olmax/optim/schedule.hpp"

namespace olmax::optim {

namespace detail {

/// The constants of one parameter's update, in torch.optim.AdamW's order of operations:
///   p <- p * (1 - lr wd)                      (decoupled)   or   g <- g + wd p   (L2)
///   m <- beta1 m + (1 - beta1) g,   v <- beta2 v + (1 - beta2) g^2
///   p <- p - step_size * m / (sqrt(v) / sqrt(1 - beta2^t) + eps),   step_size = lr / (1 - beta1^t)
struct AdamCoefficients {
    double grad_scale = 1;  // global-norm clipping factor (1: none)
    double decay = 1;       // 1 - lr * wd (decoupled mode)
    double l2 = 0;          // wd (L2 mode)
    double beta1 = 0, one_minus_beta1 = 1, beta2 = 0, one_minus_beta2 = 1;
    double step_size = 0, bias_correction2_sqrt = 1, eps = 0;
    // bfloat16 moments only: the keys of their stochastic rounding this step (store_moment).
    std::uint32_t first_moment_key = 0, second_moment_key = 0;
};

/// The type an update computes in for moments stored as M: M itself, or float for bfloat16.
template <class M>
using moment_compute_t = std::conditional_t<std::is_same_v<M, bfloat16>, float, M>;

/// A 32-bit integer hash whose output bits each depend on every input bit ("lowbias32", from
/// Chris Wellons' hash-prospector, 2018: x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15;
/// x *= 0x846ca68b; x ^= x >> 16). U is std::uint32_t or a batch of them.
template <class U>
[[gnu::always_inline]] inline U mix32(U x) {
    x = x ^ (x >> 16);
    x = x * U(0x7feb352du);
    x = x ^ (x >> 15);
    x = x * U(0x846ca68bu);
    return x ^ (x >> 16);
}

/// Moments of M loaded as a batch of the type the update computes in.
template <class Arch, class M>
[[gnu::always_inline]] inline xsimd::batch<moment_compute_t<M>, Arch> load_moment(const M* p) {
    if constexpr (std::is_same_v<M, bfloat16>) {
        using bits = xsimd::batch<std::uint32_t, Arch>;
        alignas(64) std::uint32_t widened[bits::size];
        for (std::size_t k = 0; k < bits::size; ++k) widened[k] = std::uint32_t(p[k].bits()) << 16;  // exact
        return xsimd::bitwise_cast<xsimd::batch<float, Arch>>(bits::load_aligned(widened));
    } else {
        return xsimd::batch<M, Arch>::load_unaligned(p);
    }
}

/// Stores a batch of moments into M. Into bfloat16 with stochastic rounding: up with probability
/// equal to the dropped fraction of an ulp, so the stored value is the computed one in
/// expectation. Rounding to nearest would stall the second moment: with beta2 = 0.999 each step
/// moves v by ~0.1%, under half a bfloat16 ulp (0.2-0.4%), so v would stop following g^2 (test_optim
/// checks this). The random bits hash the element's index in its parameter with the step's `key`,
/// so they do not depend on threads, batches or update-in-backward slices, and a run repeats bit for
/// bit (also after a resume). Non-finite values stay non-finite.
template <class Arch, class M>
[[gnu::always_inline]] inline void store_moment(M* p, const xsimd::batch<moment_compute_t<M>, Arch>& x, std::size_t index,
                                                std::uint32_t key) {
    if constexpr (std::is_same_v<M, bfloat16>) {
        using bits = xsimd::batch<std::uint32_t, Arch>;
        static constexpr auto lanes = [] {
            std::array<std::uint32_t, bits::size> a{};
            for (std::size_t k = 0; k < a.size(); ++k) a[k] = std::uint32_t(k);
            return a;
        }();
        alignas(64) std::uint32_t lane[bits::size];
        const bits random = mix32((bits(std::uint32_t(index)) + bits::load_unaligned(lanes.data())) ^ bits(key));
        const bits rounded = (xsimd::bitwise_cast<bits>(x) + (random & bits(0xFFFFu))) >> 16;
        rounded.store_aligned(lane);
        for (std::size_t k = 0; k < bits::size; ++k) p[k] = bfloat16::from_bits(std::uint16_t(lane[k]));
    } else {
        x.store_unaligned(p);
    }
}

/// AdamCoefficients as values of the type an update computes with (`S`): SIMD batches on the host,
/// rank-0 tensors inside a traced program.
template <class S>
struct AdamTerms {
    S grad_scale, decay, l2, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, bias_correction2_sqrt, eps;
};

/// fma / fnma of tensors (what xsimd's are for batches), so that `adam_update_values` reads the same
/// for both: x * y + z and z - x * y.
template <Real T>
Tensor<T> fma(const Tensor<T>& x, const Tensor<T>& y, const Tensor<T>& z) { return x * y + z; }
template <Real T>
Tensor<T> fnma(const Tensor<T>& x, const Tensor<T>& y, const Tensor<T>& z) { return z - x * y; }

/// The update of one parameter value (or batch of them, or tensor): the one definition of AdamW's
/// arithmetic, run by the host's vectorised loop (V an xsimd batch) and by a traced step (V a
/// traced tensor), in torch.optim.AdamW's order (AdamCoefficients).
template <bool Decoupled, class V, class S>
[[gnu::always_inline]] inline void adam_update_values(V& param, V grad, V& m, V& v, const AdamTerms<S>& c) {
    grad = grad * c.grad_scale;
    if constexpr (Decoupled) param = param * c.decay;
    else grad = fma(c.l2, param, grad);
    m = fma(m, c.beta1, c.one_minus_beta1 * grad);
    v = fma(v, c.beta2, (c.one_minus_beta2 * grad) * grad);
    const V denom = sqrt(v) / c.bias_correction2_sqrt + c.eps;
    param = fnma(c.step_size, m / denom, param);
}

/// Updates `xsimd::batch<moment_compute_t<M>, Arch>::size` consecutive elements, computing in the
/// moments' type M (double, or float for float32 and bfloat16 moments); `index` is the first one's
/// in its parameter. Lanes are independent and every element, tails included, goes through this
/// one sequence of operations, so its result does not depend on the batch, thread or tail it falls
/// in (tests/unit/test_optim.cpp checks thread counts).
template <bool Decoupled, class Arch, Real T, class M>
[[gnu::always_inline]] inline void adam_update_batch(T* w, const T* g, M* m, M* v, std::size_t index, const AdamCoefficients& c) {
    using batch = xsimd::batch<moment_compute_t<M>, Arch>;
    const AdamTerms<batch> terms{batch(c.grad_scale), batch(c.decay),           batch(c.l2),        batch(c.beta1),
                                 batch(c.one_minus_beta1), batch(c.beta2),       batch(c.one_minus_beta2), batch(c.step_size),
                                 batch(c.bias_correction2_sqrt), batch(c.eps)};
    batch param = batch::load_unaligned(w), m_new = load_moment<Arch>(m), v_new = load_moment<Arch>(v);
    adam_update_values<Decoupled>(param, batch::load_unaligned(g), m_new, v_new, terms);
    store_moment<Arch>(m, m_new, index, c.first_moment_key);
    store_moment<Arch>(v, v_new, index, c.second_moment_key);
    param.store_unaligned(w);
}
/// Updates elements [0, n), the first of which is element `index` of its parameter: whole batches in
/// place, the last partial batch through zero-padded copies (the same code, so the same rounding).
/// `c` is a copy so that the compiler knows the
/// stores to the moments cannot change it and keeps the constants in registers. `Arch` (the
/// instruction set this translation unit is compiled for) is part of the function's name, so
/// translation units built for different CPUs never share one instantiation.
template <bool Decoupled, Real T, class M, class Arch = xsimd::default_arch>
void adam_update_range(T* w, const T* g, M* m, M* v, std::size_t n, std::size_t index, const AdamCoefficients c) {
    constexpr std::size_t lanes = xsimd::batch<moment_compute_t<M>, Arch>::size;
    std::size_t i = 0;
    for (; i + lanes <= n; i += lanes) adam_update_batch<Decoupled, Arch>(w + i, g + i, m + i, v + i, index + i, c);
    if (i == n) return;
    const std::size_t rest = n - i;
    T w_tail[lanes] = {}, g_tail[lanes] = {};
    M m_tail[lanes] = {}, v_tail[lanes] = {};
    std::copy_n(w + i, rest, w_tail);
    std::copy_n(g + i, rest, g_tail);
    std::copy_n(m + i, rest, m_tail);
    std::copy_n(v + i, rest, v_tail);
    adam_update_batch<Decoupled, Arch>(w_tail, g_tail, m_tail, v_tail, index + i, c);
    std::copy_n(w_tail, rest, w + i);
    std::copy_n(m_tail, rest, m + i);
    std::copy_n(v_tail, rest, v + i);
}

}  // namespace detail

/// A gradient held NaN or Inf; the step was refused and nothing was changed.
class non_finite_gradient : public value_error {
public:
    using value_error::value_error;
};

/// The type AdamW keeps its moments in (and computes the update in).
enum class MomentPrecision {
    float64,  // the default: the original Olmax's choice, 16 bytes of state per parameter
    float32,  // torch.optim.AdamW's for float parameters: half the state, 28 instead of 44 bytes
              // streamed per float parameter, and float arithmetic (the double update is bound by
              // its divisions and square roots: 237 against 69 ms for 42 M parameters on one
              // thread of an AMX Xeon); 30 updates agree with float64's to 5e-7 of the parameters'
              // scale (tests/unit/test_optim.cpp)
    bfloat16, // a quarter of float64's state (4 bytes per parameter), 20 bytes streamed per float
              // parameter; computed in float and stored with stochastic rounding (detail::store_moment),
              // which keeps the second moment following g^2 where rounding to nearest stalls it.
              // Accuracy against float32 moments: tests/unit/test_optim.cpp, docs/TRAIN_LM.md. CPU
              // only: a traced step refuses it (its rounding has no lowering rule)
};

inline std::string_view to_string(MomentPrecision precision) {
    switch (precision) {
        case MomentPrecision::float64: return "fp64";
        case MomentPrecision::float32: return "fp32";
        case MomentPrecision::bfloat16: return "bf16";
    }
    return "fp64";
}

/// "fp64", "fp32" or "bf16" (the names of train_lm's --adam_moments).
inline MomentPrecision parse_moment_precision(std::string_view text) {
    for (auto precision : {MomentPrecision::float64, MomentPrecision::float32, MomentPrecision::bfloat16})
        if (to_string(precision) == text) return precision;
    throw value_error(olmax::detail::concat("parse_moment_precision: unknown moment type '", text, "' (expected fp64, fp32 or bf16)"));
}

enum class WeightDecayMode {
    decoupled,  // AdamW: p <- p * (1 - lr_p * wd), outside the adaptive update
    l2,         // classic Adam: g <- g + wd * p before the moments
};

struct AdamWConfig {
    /// The learning rate: `schedule.peak_lr` (constant when the schedule has no warmup or decay).
    /// `AdamW(parameters, lr)` sets it from a number; `{.schedule = {.peak_lr = lr, .warmup_steps = ...}}`
    /// shapes it over the steps.
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
    /// The moments' type; checkpoints store them in it (bfloat16 ones widened to float32, exactly),
    /// and a state of another type is converted on loading.
    MomentPrecision moments = MomentPrecision::float64;

    void validate() const {
        schedule.validate();
        check(beta1 >= 0 && beta1 < 1, "AdamW: beta1 must be in [0, 1), got ", beta1);
        check(beta2 >= 0 && beta2 < 1, "AdamW: beta2 must be in [0, 1), got ", beta2);
        check(eps >= 0, "AdamW: eps must be >= 0, got ", eps);
        check(weight_decay >= 0, "AdamW: weight_decay must be >= 0, got ", weight_decay);
        check(max_grad_norm >= 0, "AdamW: max_grad_norm must be >= 0, got ", max_grad_norm);
        check(agc.clip >= 0, "AdamW: agc.clip must be >= 0, got ", agc.clip);
    }

    /// The settings olmax trains its language models with, and the defaults of train::Trainer and
    /// train_lm (train::OptimizerConfig takes its defaults from here): beta2 0.99, decoupled weight
    /// decay 0.01 on matrices, global-norm clipping at 1 and float32 moments, as nanoGPT-style
    /// recipes do. A default AdamWConfig{} is the plain optimiser (torch.optim.AdamW's betas, no
    /// decay, no clipping; float64 moments).
    static constexpr AdamWConfig language_model() {
        AdamWConfig c;
        c.beta2 = 0.99;
        c.weight_decay = 0.01;
        c.max_grad_norm = 1.0;
        c.moments = MomentPrecision::float32;
        return c;
    }
};

/// What one optimiser step did.
struct StepReport {
    std::int64_t step = 0;            // the step just taken (1-based)
    double lr = 0;                    // scheduled learning rate (before per-parameter scales)
    double grad_norm = 0;             // global gradient norm after AGC, before global clipping
    std::size_t agc_clipped_units = 0;
};

/// Optimiser state of one parameter, for checkpoints (moments widened to double whatever
/// AdamWConfig::moments keeps them in).
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
    using value_type = T;

    /// AdamW with learning rate `lr` (constant; `config.schedule.peak_lr` is `lr`) and the rest of
    /// `config`, as `torch.optim.AdamW(params, lr=...)`. A config that names another peak_lr is an
    /// error rather than a silent choice between the two. (A template so that `AdamW(params, {})`
    /// still means the default config, not lr = 0.)
    template <std::floating_point Lr>
    AdamW(std::vector<Parameter<T>> params, Lr lr, AdamWConfig config = {}) : AdamW(std::move(params), with_lr(double(lr), std::move(config))) {}

    AdamW(std::vector<Parameter<T>> params, AdamWConfig config) : params_(std::move(params)), config_(std::move(config)) {
        config_.validate();
        std::set<std::string> names;
        std::set<const void*> buffers;
        for (const auto& p : params_) {
            check(!p.name.empty(), "AdamW: every parameter needs a name");
            check(names.insert(p.name).second, "AdamW: parameter name '", p.name, "' appears twice");
            check(p.tensor.defined(), "AdamW: parameter '", p.name, "' is an undefined tensor");
            check(p.tensor.requires_grad(), "AdamW: parameter '", p.name, "' does not require grad (use olmax::parameter)");
            check(buffers.insert(olmax::detail::impl_ptr_of(p.tensor).get()).second, "AdamW: parameter '", p.name, "' is the same tensor as another one");
            check(p.lr_scale >= 0 && std::isfinite(p.lr_scale), "AdamW: parameter '", p.name, "' has lr_scale ", p.lr_scale);
            device_scope with_parameter(p.tensor.device());  // the moments live where their parameter does
            Slot slot{p.name, 0, {}, {}, {}, {}, {}, {}};
            with_moment_type([&]<class M>(std::type_identity<M>) {
                slot.template moments<M>() = std::tuple(zeros<M>(p.tensor.shape()), zeros<M>(p.tensor.shape()));
            });
            slots_.push_back(std::move(slot));
        }
    }

    const std::vector<Parameter<T>>& parameters() const { return params_; }
    const AdamWConfig& config() const { return config_; }
    std::int64_t step_count() const { return step_; }
    /// The scheduled learning rate the next step will use.
    double next_lr() const { return config_.schedule(step_ + 1, progress_); }
    /// The fraction of the training done, for cosine and linear schedules (LrSchedule::operator());
    /// train::Trainer sets it after every step from its steps and time budget.
    void set_progress(double fraction) {
        check(std::isfinite(fraction) && fraction >= 0, "AdamW::set_progress: the fraction must be finite and >= 0, got ", fraction);
        progress_ = fraction;
    }
    double progress() const { return progress_; }

    /// Drops every parameter's gradient.
    void zero_grad() {
        for (auto& p : params_) p.tensor.zero_grad();
    }

    /// One update from the parameters' current gradients. A parameter without a gradient is left
    /// alone (its moments do not advance), as in PyTorch. A NaN/Inf gradient throws
    /// `non_finite_gradient` before anything changes. Global-norm clipping scales the gradients as
    /// they are read and leaves the stored gradients unchanged; AGC (if on) clips them in place.
    StepReport step() {
        std::vector<Tensor<T>> grads;
        grads.reserve(params_.size());
        std::vector<Tensor<T>> tensors;
        for (const auto& p : params_) {
            grads.push_back(p.tensor.grad());
            tensors.push_back(p.tensor);
        }
        // The update runs where the parameters are (all on one device, their gradients with them).
        backend::op_scope on("AdamW::step", tensors, grads);
        return on.run_composed([&] { return traced_step(grads); }, [&] {  // traced: the same update in the program's ops
            StepReport report;
            report.step = step_ + 1;
            report.lr = config_.schedule(report.step, progress_);
            if (config_.agc.clip > 0) {
                // AGC rewrites gradients, so all of them are checked before it runs.
                for (std::size_t i = 0; i < params_.size(); ++i)
                    if (grads[i].defined() && !detail::all_finite(grads[i].data(), grads[i].size())) throw_non_finite(i);
                for (std::size_t i = 0; i < params_.size(); ++i)
                    if (grads[i].defined())
                        report.agc_clipped_units +=
                            adaptive_grad_clip(params_[i].tensor, grads[i], config_.agc, params_[i].stacked_axes, params_[i].unit_axis);
            }
            // The global norm's pass is also the non-finite check: a parameter's sum of squares is
            // non-finite when one of its gradients is, or (double gradients only) when squares of
            // finite gradients above ~1e154 overflow, which the element-wise check tells apart.
            std::vector<std::pair<const T*, std::size_t>> arrays;
            std::vector<std::size_t> owners;
            for (std::size_t i = 0; i < params_.size(); ++i)
                if (grads[i].defined()) {
                    arrays.emplace_back(grads[i].data(), grads[i].size());
                    owners.push_back(i);
                }
            const std::vector<double> sums = detail::sums_of_squares<T>(arrays);
            double sum_sq = 0;
            for (std::size_t a = 0; a < arrays.size(); ++a) {
                if (!std::isfinite(sums[a]) && !detail::all_finite(arrays[a].first, arrays[a].second)) throw_non_finite(owners[a]);
                sum_sq += sums[a];
            }
            report.grad_norm = std::sqrt(sum_sq);
            const double grad_scale = detail::clip_coefficient(report.grad_norm, config_.max_grad_norm);
            with_moment_type([&]<class M>(std::type_identity<M>) {
                std::vector<UpdateJob<M>> jobs;
                std::size_t total = 0;
                for (std::size_t i = 0; i < params_.size(); ++i) {
                    if (!grads[i].defined()) continue;
                    const detail::AdamCoefficients c = begin_update(i, report.lr, grad_scale);
                    const std::size_t n = params_[i].tensor.size();
                    if (n == 0) continue;
                    auto [m, v] = slots_[i].template moments<M>();
                    jobs.push_back(UpdateJob<M>{params_[i].tensor.data(), grads[i].data(), m.data(), v.data(), total, n, c});
                    total += n;
                }
                run_jobs(jobs, total);
            });
            step_ = report.step;
            return report;
        });
    }

    /// One step whose update runs inside the reverse pass. `run_backward()` runs the step's
    /// backward pass on this thread (`loss.backward()`, or `autodiff::data_parallel_backward` /
    /// `ByteLM::accumulate_gradients`, whose shards report to this thread's hook); as soon as a
    /// parameter's gradient is final (autodiff::gradient_ready_hook) its update is applied and its
    /// gradient dropped. A reversible `nn::Stack` hands over each layer's slice of its stacked
    /// parameters as soon as backward has passed that layer (autodiff::offer_final_slice), and the
    /// slice is updated then, so a stacked gradient is never stored whole. A step's gradient memory
    /// is then what backward has in flight (about one layer's), not one buffer per parameter.
    ///
    /// The same arithmetic as `step()` element for element, and no op reads a parameter after its
    /// gradient is final (the node that reads it is the one that finishes it), so parameters and
    /// moments come out bit for bit as from `run_backward(); step(); zero_grad();`
    /// (tests/unit/test_optim.cpp). A gradient that was already there (accumulated micro-batches) is
    /// part of the update. AGC is unit-wise and a unit never spans layers, so it runs on each
    /// parameter or layer slice as it is updated (on a copy of the gradient), with step()'s numbers.
    ///
    /// Global-norm clipping (`max_grad_norm` > 0) needs every gradient before the first update, so
    /// the step calls `run_backward()` twice (as LOMO does, Lv et al. 2023): the
    /// first run only measures the norm, dropping each gradient as it is final; the second updates
    /// with the clip factor of that norm. Memory stays that of one pass; time is one more backward.
    /// `run_backward` must then give the same gradients twice: run the forward inside it (or keep
    /// the graph for the second run), on the same batch, with the same dropout masks. The second
    /// run's gradients are checked against the first's (each piece's sum of squares, exactly); if
    /// they differ, the parameters have been updated with the first run's factor and
    /// `autodiff_error` says so. Every parameter must start without a gradient (nothing
    /// accumulated), since the first run drops what it finishes. A NaN/Inf gradient is found by
    /// the first run, before any update: with clipping the step is all-or-nothing. The norm is summed
    /// per parameter and slice, so it can differ from step()'s in the last bits when slices are
    /// handed over, and the updates then by the rounding of the clip factor (tested at 1e-6).
    ///
    /// Without clipping, a NaN/Inf gradient throws `non_finite_gradient` out of backward, but the
    /// parameters (and slices) whose gradients were final before it have been updated: the step is
    /// not all-or-nothing (nor after any other exception out of `run_backward`), and the optimiser's
    /// step count does not advance. Restart from a checkpoint, as after divergence.
    /// Layer slices come from a stack's recomputed layers and from its kept layers (`keep_activations`;
    /// `nn::take_leading` hands them over), with data_parallel_backward's shards summed first. A
    /// slice that another node of the pass also adds into is not handed over; it is stored, and the
    /// rest of its parameter is updated once the parameter is final.
    template <class RunBackward>
        requires std::invocable<RunBackward&>
    StepReport step_during_backward(RunBackward&& run_backward) {
        StepReport report;
        report.step = step_ + 1;
        report.lr = config_.schedule(report.step, progress_);
        if (config_.max_grad_norm == 0) {
            const FusedPass pass = fused_pass(run_backward, report.lr, 1.0, /*apply=*/true);
            report.grad_norm = pass.norm();
            report.agc_clipped_units = pass.agc_clipped_units;
            step_ = report.step;
            return report;
        }
        for (const auto& p : params_)
            check(!p.tensor.grad().defined(), "AdamW::step_during_backward: parameter '", p.name,
                  "' already holds a gradient; with global-norm clipping (max_grad_norm=", config_.max_grad_norm,
                  ") backward runs twice and the first run drops every gradient it finishes, so nothing may be accumulated "
                  "before the step (accumulate micro-batches with backward + step(), or set max_grad_norm=0)");
        const FusedPass measured = fused_pass(run_backward, report.lr, 1.0, /*apply=*/false);
        report.grad_norm = measured.norm();
        const FusedPass applied = fused_pass(run_backward, report.lr, detail::clip_coefficient(report.grad_norm, config_.max_grad_norm),
                                             /*apply=*/true);
        report.agc_clipped_units = applied.agc_clipped_units;
        step_ = report.step;  // the updates are done: the step counts even if the check below fails
        const auto [was, is] = std::mismatch(measured.pieces.begin(), measured.pieces.end(), applied.pieces.begin(), applied.pieces.end());
        if (was != measured.pieces.end() || is != applied.pieces.end()) {
            const GradientPiece& first = was != measured.pieces.end() ? *was : *is;
            throw autodiff_error(olmax::detail::concat(
                "AdamW::step_during_backward: with global-norm clipping backward runs twice, and the second run gave other gradients "
                "than the first (parameter '",
                params_[first.parameter].name, "', elements from ", first.offset,
                "): run_backward must be deterministic (same batch, same dropout masks); the parameters were updated with the "
                "first run's clip factor at step ",
                report.step));
        }
        return report;
    }

    /// A copy of the state, moments as double.
    AdamState export_state() const {
        AdamState state{step_, {}};
        for (const auto& s : slots_)
            with_moment_type([&]<class M>(std::type_identity<M>) {
                const auto [m, v] = s.template moments<M>();
                state.slots.push_back(SlotState{s.name, s.step, cast<double>(m), cast<double>(v)});
            });
        return state;
    }

    /// Restores a state saved by `export_state` for the same parameter set (names and shapes checked).
    void import_state(const AdamState& state) {
        check(state.step >= 0, "AdamW::import_state: negative step ", state.step);
        check(state.slots.size() == slots_.size(), "AdamW::import_state: state has ", state.slots.size(), " parameters, optimiser has ",
              slots_.size());
        std::vector<Slot> restored;
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
            const Device device = params_[i].tensor.device();  // a checkpoint's moments come back to their parameter's device
            Slot slot{found->name, found->step, {}, {}, {}, {}, {}, {}};
            with_moment_type([&]<class M>(std::type_identity<M>) {
                slot.template moments<M>() = std::tuple(cast<M>(found->first_moment).to(device), cast<M>(found->second_moment).to(device));
            });
            restored.push_back(std::move(slot));
        }
        slots_ = std::move(restored);
        step_ = state.step;
    }

    /// The state as named entries, the form checkpoints store (olmax/io/checkpoint.hpp): "step",
    /// then per parameter "<name>/step", "<name>/first_moment" and "<name>/second_moment", in
    /// parameter order, the moments in AdamWConfig::moments' type (bfloat16 ones as float32 copies,
    /// exact). float32 and float64 moment tensors share this optimiser's buffers, which the next
    /// step changes: clone them (or use export_state) to keep a snapshot.
    StateDict state_dict() const {
        StateDict entries;
        entries.add("step", step_);
        for (const auto& s : slots_) {
            entries.add(s.name + "/step", s.step);
            with_moment_type([&]<class M>(std::type_identity<M>) {
                const auto [m, v] = s.template moments<M>();
                if constexpr (std::is_same_v<M, bfloat16>) {
                    entries.add(s.name + "/first_moment", cast<float>(m));
                    entries.add(s.name + "/second_moment", cast<float>(v));
                } else {
                    entries.add(s.name + "/first_moment", m);
                    entries.add(s.name + "/second_moment", v);
                }
            });
        }
        return entries;
    }

    /// Restores a state in `state_dict()`'s form for the same parameter set. Checks every entry
    /// (present, of the right type and shape, no entry this optimiser does not know) before
    /// changing anything.
    void load_state_dict(const StateDict& entries) {
        constexpr std::string_view who = "AdamW::load_state_dict";
        AdamState state;
        state.step = entries.get<std::int64_t>("step", who);
        // A moment of either type (a checkpoint written with the other MomentPrecision), as double.
        auto moment = [&](const std::string& name) {
            const StateDict::Value* value = entries.find(name);
            if (value != nullptr)
                if (const auto* narrow = std::get_if<Tensor<float>>(value)) return cast<double>(*narrow);
            return entries.get<Tensor<double>>(name, who);
        };
        for (const auto& s : slots_)
            state.slots.push_back(SlotState{s.name, entries.get<std::int64_t>(s.name + "/step", who), moment(s.name + "/first_moment"),
                                            moment(s.name + "/second_moment")});
        check(entries.size() == 1 + 3 * slots_.size(), who, ": ", entries.size(), " entries for an optimiser of ", slots_.size(),
              " parameters (expected ", 1 + 3 * slots_.size(), "): the state is of another model or optimiser");
        import_state(state);
    }

    /// Calls f(tensor) for each moment tensor (first and second of each parameter, in parameter
    /// order; a Tensor<double>, Tensor<float> or Tensor<bfloat16>, AdamWConfig::moments), sharing this optimiser's
    /// buffers: the optimiser's part of a traced step's state (olmax/trace/).
    template <class F>
    void for_each_moment(F&& f) const {
        for (const auto& s : slots_)
            with_moment_type([&]<class M>(std::type_identity<M>) {
                const auto [m, v] = s.template moments<M>();
                f(m), f(v);
            });
    }

private:
    static AdamWConfig with_lr(double lr, AdamWConfig config) {
        const double unset = LrSchedule{}.peak_lr;
        check(config.schedule.peak_lr == unset || config.schedule.peak_lr == lr, "AdamW: the learning rate is given twice, lr=", lr,
              " and config.schedule.peak_lr=", config.schedule.peak_lr, "; give it once");
        config.schedule.peak_lr = lr;
        return config;
    }
    [[noreturn]] void throw_non_finite(std::size_t i) const {
        throw non_finite_gradient(olmax::detail::concat("AdamW::step: non-finite gradient in parameter '", params_[i].name, "' at step ",
                                                        step_ + 1, "; parameters were not updated"));
    }

    /// One parameter's state: its update count and its moments in AdamWConfig::moments' type (the
    /// other pair undefined).
    struct Slot {
        std::string name;
        std::int64_t step = 0;  // updates this parameter has received (bias-correction t)
        Tensor<double> first64, second64;
        Tensor<float> first32, second32;
        Tensor<bfloat16> first16, second16;

        /// The pair of type M, as references (std::tie).
        template <class M>
        auto moments() {
            if constexpr (std::is_same_v<M, double>) return std::tie(first64, second64);
            else if constexpr (std::is_same_v<M, float>) return std::tie(first32, second32);
            else return std::tie(first16, second16);
        }
        template <class M>
        auto moments() const {
            if constexpr (std::is_same_v<M, double>) return std::tie(first64, second64);
            else if constexpr (std::is_same_v<M, float>) return std::tie(first32, second32);
            else return std::tie(first16, second16);
        }
    };

    /// f(std::type_identity<M>{}) for the moments' type M.
    template <class F>
    void with_moment_type(F&& f) const {
        switch (config_.moments) {
            case MomentPrecision::float64: return f(std::type_identity<double>{});
            case MomentPrecision::float32: return f(std::type_identity<float>{});
            case MomentPrecision::bfloat16: return f(std::type_identity<bfloat16>{});
        }
        throw value_error(olmax::detail::concat("AdamW: unknown MomentPrecision ", int(config_.moments)));
    }

    /// One parameter's share of the update: its buffers and constants, at `start` in the
    /// concatenation of all parameters' elements.
    template <class M>
    struct UpdateJob {
        T* w;
        const T* g;
        M* m;
        M* v;
        std::size_t start, size;
        detail::AdamCoefficients coefficients;
        std::size_t index = 0;  // of w[0] in its parameter (the key of bfloat16 moments' rounding)
    };

    /// The constants of parameter i's update this step, in torch.optim.AdamW's order; its moments'
    /// step count advances. `grad_scale` is the global-norm clipping factor.
    detail::AdamCoefficients begin_update(std::size_t i, double scheduled_lr, double grad_scale) {
        const bool decoupled = config_.decay_mode == WeightDecayMode::decoupled;
        Slot& slot = slots_[i];
        slot.step += 1;
        const double lr = scheduled_lr * params_[i].lr_scale;
        const double wd = receives_weight_decay(params_[i].role, config_.decay_policy) ? config_.weight_decay : 0.0;
        const double t = double(slot.step);
        detail::AdamCoefficients c;
        c.grad_scale = grad_scale;
        c.decay = decoupled ? 1.0 - lr * wd : 1.0;
        c.l2 = decoupled ? 0.0 : wd;
        c.beta1 = config_.beta1;
        c.one_minus_beta1 = 1.0 - config_.beta1;
        c.beta2 = config_.beta2;
        c.one_minus_beta2 = 1.0 - config_.beta2;
        c.step_size = lr / (1.0 - std::pow(config_.beta1, t));
        c.bias_correction2_sqrt = std::sqrt(1.0 - std::pow(config_.beta2, t));
        c.eps = config_.eps;
        // Per parameter, update and moment: the same in every run, so runs and resumes repeat.
        const std::uint32_t key = detail::mix32(std::uint32_t(i) * 0x9E3779B9u ^ detail::mix32(std::uint32_t(slot.step)));
        c.first_moment_key = detail::mix32(key);
        c.second_moment_key = detail::mix32(key + 1u);
        return c;
    }

    /// `step()` inside a traced program (olmax/trace/): the same update (adam_update_values) on the
    /// traced parameters, gradients and moments, whose new values become the program's. The
    /// schedule's learning rate and the bias corrections are per-call inputs the host computes
    /// before each run, and the step counters advance after each run, so one compiled program
    /// serves every step. Every parameter must have a gradient; a traced step cannot refuse a
    /// non-finite one (the caller watches the loss). AGC runs as tensor ops (adaptive_grad_clip_ops);
    /// the report has no count of clipped units.
    StepReport traced_step(const std::vector<Tensor<T>>& grads) {
        if constexpr (!std::is_same_v<T, float>) {
            throw trace_error("AdamW::step: traced programs compute in float32; trace a float model");
        } else {
            check<trace_error>(config_.moments != MomentPrecision::bfloat16,
                               "AdamW::step: bfloat16 moments (their stochastic rounding) have no lowering rule yet; trace with float32 "
                               "moments");
            for (std::size_t i = 0; i < params_.size(); ++i) {
                check<trace_error>(grads[i].defined(), "AdamW::step: parameter '", params_[i].name,
                                   "' has no gradient in the traced step; every parameter of a traced step must receive one");
                check<trace_error>(slots_[i].step == step_, "AdamW::step: parameter '", params_[i].name, "' has taken ", slots_[i].step,
                                   " updates of ", step_, " steps; a traced step updates every parameter every step");
            }
            const AdamWConfig config = config_;
            auto per_call = [this, config](int which) {
                return backend::trace::host_values(1, [this, config, which] {
                    const double t = double(step_ + 1), lr = config.schedule(step_ + 1, progress_);
                    const double value = which == 0   ? lr
                                         : which == 1 ? lr / (1.0 - std::pow(config.beta1, t))
                                                      : std::sqrt(1.0 - std::pow(config.beta2, t));
                    return std::vector<float>{float(value)};
                });
            };
            const Tensor<float> lr = reshape(per_call(0), {}), step_size = reshape(per_call(1), {}), correction2 = reshape(per_call(2), {});
            backend::trace::after_each_run([this] {
                ++step_;
                for (auto& slot : slots_) ++slot.step;
            });
            std::vector<Tensor<float>> clipped = grads;  // AGC first, as step() (the global norm is taken after it)
            if (config_.agc.clip > 0)
                for (std::size_t i = 0; i < params_.size(); ++i)
                    clipped[i] = adaptive_grad_clip_ops(params_[i].tensor, grads[i], config_.agc, params_[i].stacked_axes, params_[i].unit_axis);
            Tensor<float> sum_sq = Tensor<float>::scalar(0.0f);
            for (const auto& g : clipped) sum_sq = sum_sq + sum(g * g);
            const Tensor<float> grad_norm = sqrt(sum_sq);
            backend::trace::report("grad_norm", grad_norm);  // each run reports it, as step() does (StepReport::grad_norm)
            Tensor<float> grad_scale = Tensor<float>::scalar(1.0f);
            if (config_.max_grad_norm > 0) {  // detail::clip_coefficient: min(1, max_norm / (norm + 1e-6))
                const Tensor<float> wanted = Tensor<float>::scalar(float(config_.max_grad_norm)) / (grad_norm + 1e-6f);
                grad_scale = -maximum(Tensor<float>::scalar(-1.0f), -wanted);
            }
            auto constant = [](double v) { return Tensor<float>::scalar(float(v)); };
            const bool decoupled = config_.decay_mode == WeightDecayMode::decoupled;
            for (std::size_t i = 0; i < params_.size(); ++i) {
                const double wd = receives_weight_decay(params_[i].role, config_.decay_policy) ? config_.weight_decay : 0.0;
                const double lr_scale = params_[i].lr_scale;
                const detail::AdamTerms<Tensor<float>> terms{grad_scale,
                                                              decoupled ? 1.0f - lr * float(lr_scale * wd) : constant(1.0),
                                                              constant(decoupled ? 0.0 : wd),
                                                              constant(config_.beta1),
                                                              constant(1.0 - config_.beta1),
                                                              constant(config_.beta2),
                                                              constant(1.0 - config_.beta2),
                                                              step_size * float(lr_scale),
                                                              correction2,
                                                              constant(config_.eps)};
                with_moment_type([&]<class M>(std::type_identity<M>) {
                    if constexpr (!std::is_same_v<M, bfloat16>) {  // (bfloat16 was refused above)
                        auto [first, second] = slots_[i].template moments<M>();
                        Tensor<float> w = params_[i].tensor, m = backend::trace::as_float(first), v = backend::trace::as_float(second);
                        if (decoupled) detail::adam_update_values<true>(w, clipped[i], m, v, terms);
                        else detail::adam_update_values<false>(w, clipped[i], m, v, terms);
                        backend::trace::assign(params_[i].tensor, w);
                        backend::trace::assign(first, m);
                        backend::trace::assign(second, v);
                    }
                });
            }
            StepReport report;
            report.step = step_ + 1;
            return report;
        }
    }

    /// Applies the queued updates (the parameters without a gradient, and their moments, stay as
    /// they are, as in PyTorch).
    template <class M>
    void run_jobs(const std::vector<UpdateJob<M>>& jobs, std::size_t total) const {
        const bool decoupled = config_.decay_mode == WeightDecayMode::decoupled;
        // Element-wise and independent: one split of all parameters' elements across the threads
        // of their device's kernels (one parallel region per step, same result for any thread count).
        backend::current().parallel_for(total, 16, [&](std::size_t begin, std::size_t end) {
            auto job = std::upper_bound(jobs.begin(), jobs.end(), begin, [](std::size_t e, const UpdateJob<M>& j) { return e < j.start; }) - 1;
            for (; begin < end; ++job) {
                const std::size_t lo = begin - job->start, hi = std::min(end - job->start, job->size);
                if (decoupled)
                    detail::adam_update_range<true>(job->w + lo, job->g + lo, job->m + lo, job->v + lo, hi - lo, job->index + lo,
                                                    job->coefficients);
                else
                    detail::adam_update_range<false>(job->w + lo, job->g + lo, job->m + lo, job->v + lo, hi - lo, job->index + lo,
                                                     job->coefficients);
                begin = job->start + hi;
            }
        });
    }

    /// A gradient, or a slice of one, as a fused pass saw it: where it is and its sum of squares
    /// (after AGC).
    struct GradientPiece {
        std::size_t parameter = 0, offset = 0, size = 0;
        double sum_of_squares = 0;
        bool operator==(const GradientPiece&) const = default;
    };

    /// What one run of backward under step_during_backward's hook saw.
    struct FusedPass {
        std::vector<GradientPiece> pieces;  // in parameter and offset order (data-parallel shards finish in any order)
        std::size_t agc_clipped_units = 0;
        /// The global norm, summed in the pieces' order: the same for any order of the hook's calls.
        double norm() const {
            double sum_sq = 0;
            for (const auto& piece : pieces) sum_sq += piece.sum_of_squares;
            return std::sqrt(sum_sq);
        }
    };

    /// One run of `run_backward` with the hook of step_during_backward: every gradient (or layer
    /// slice) is checked, AGC-clipped, measured and, if `apply`, used for its parameter's update
    /// scaled by `grad_scale`; then dropped.
    template <class RunBackward>
    FusedPass fused_pass(RunBackward& run_backward, double lr, double grad_scale, bool apply) {
        std::vector<Tensor<T>> tensors;
        for (const auto& p : params_) tensors.push_back(p.tensor);
        FusedPass pass;
        // Per parameter: the constants of its update once its first slice came, and the slices taken.
        struct Sliced {
            bool started = false;
            detail::AdamCoefficients coefficients;
            std::vector<std::pair<std::size_t, std::size_t>> taken;  // [offset, offset + size)
        };
        std::vector<Sliced> sliced(params_.size());
        auto start_update = [&](std::size_t i) { return apply ? begin_update(i, lr, grad_scale) : detail::AdamCoefficients{}; };
        // AGC's units for elements [offset, offset + n) of parameter i: whole stack entries (layers).
        auto agc_layout = [&](std::size_t i, std::size_t offset, std::size_t n) {
            detail::UnitLayout layout = detail::unit_layout(params_[i].tensor.shape(), params_[i].stacked_axes, params_[i].unit_axis);
            const std::size_t entry = params_[i].tensor.size() / layout.stack;  // elements per layer
            check<autodiff_error>(offset % entry == 0 && n % entry == 0,
                                  "AdamW::step_during_backward: AGC needs whole layers of parameter '", params_[i].name,
                                  "', got elements ", offset, "..", offset + n, " (", entry, " per layer)");
            layout.stack = n / entry;
            return layout;
        };
        std::vector<T> clipped;  // AGC rewrites a copy: a handed-over slice gradient may be shared
        // Hook calls never overlap (data_parallel_backward serialises its threads' calls), so no lock.
        auto update = [&](std::size_t i, std::size_t offset, const T* grad, std::size_t n, const detail::AdamCoefficients& c) {
            if (config_.agc.clip > 0 && n > 0) {
                if (!detail::all_finite(grad, n)) throw_non_finite(i);
                clipped.assign(grad, grad + n);
                pass.agc_clipped_units +=
                    detail::clip_units(params_[i].tensor.data() + offset, clipped.data(), agc_layout(i, offset, n), config_.agc);
                grad = clipped.data();
            }
            const std::pair<const T*, std::size_t> values{grad, n};
            const double sq = detail::sums_of_squares<T>(std::span(&values, 1)).front();
            if (!std::isfinite(sq) && !detail::all_finite(grad, n)) throw_non_finite(i);
            pass.pieces.push_back(GradientPiece{i, offset, n, sq});
            if (apply)
                with_moment_type([&]<class M>(std::type_identity<M>) {
                    auto [m, v] = slots_[i].template moments<M>();
                    run_jobs<M>({UpdateJob<M>{params_[i].tensor.data() + offset, grad, m.data() + offset, v.data() + offset, 0, n, c, offset}},
                                n);
                });
        };
        auto take_slice = [&](std::size_t i, std::size_t offset, const Tensor<T>& grad) {
            Sliced& s = sliced[i];
            if (!s.started && params_[i].tensor.grad().defined()) return false;  // it has a gradient: update it whole
            check<autodiff_error>(offset + grad.size() <= params_[i].tensor.size(), "AdamW::step_during_backward: a slice at ", offset,
                                  " of ", grad.size(), " elements is outside parameter '", params_[i].name, "'");
            backend::op_scope on("AdamW::step_during_backward", params_[i].tensor, grad);
            if (!s.started) {
                s.coefficients = start_update(i);
                s.started = true;
            }
            update(i, offset, grad.data(), grad.size(), s.coefficients);
            s.taken.emplace_back(offset, grad.size());
            return true;
        };
        auto on_ready = [&](std::size_t i) {
            Tensor<T> grad = params_[i].tensor.grad();
            Sliced& s = sliced[i];
            if (!s.started && !grad.defined()) return;  // no gradient this step: the parameter and its moments stay (as in step())
            backend::op_scope on("AdamW::step_during_backward", params_[i].tensor, grad);
            if (!s.started) {
                update(i, 0, grad.data(), grad.size(), start_update(i));
            } else {
                // The elements no slice covered: from the stored gradient where there is one, else
                // zeros (what step() reads from a stored gradient that only some slices reached).
                std::sort(s.taken.begin(), s.taken.end());
                if (grad.defined())  // stored after the slices were taken: what it holds there would be lost
                    for (const auto& [offset, size] : s.taken)
                        check<autodiff_error>(std::all_of(grad.data() + offset, grad.data() + offset + size, [](T g) { return g == T(0); }),
                                              "AdamW::step_during_backward: parameter '", params_[i].name, "' received gradient at elements ",
                                              offset, ".. after they were updated; use backward + step() for this model");
                std::size_t at = 0;
                std::vector<T> zeros;
                s.taken.emplace_back(params_[i].tensor.size(), 0);
                for (const auto& [offset, size] : s.taken) {
                    check<autodiff_error>(offset >= at, "AdamW::step_during_backward: parameter '", params_[i].name,
                                          "' received the gradient of elements ", offset, ".. twice");
                    if (offset > at) {
                        if (!grad.defined()) zeros.assign(offset - at, T(0));
                        update(i, at, grad.defined() ? grad.data() + at : zeros.data(), offset - at, s.coefficients);
                    }
                    at = offset + size;
                }
            }
            grad = Tensor<T>();
            params_[i].tensor.zero_grad();
        };
        {
            autodiff::gradient_ready_hook<T> hook(tensors, on_ready, take_slice);
            run_backward();
        }
        std::sort(pass.pieces.begin(), pass.pieces.end(),
                  [](const GradientPiece& a, const GradientPiece& b) { return std::tie(a.parameter, a.offset) < std::tie(b.parameter, b.offset); });
        return pass;
    }

    std::vector<Parameter<T>> params_;
    AdamWConfig config_;
    std::vector<Slot> slots_;
    std::int64_t step_ = 0;
    double progress_ = 0.0;  // set_progress
};

/// Classic Adam is AdamW with L2 weight decay folded into the gradient.
inline AdamWConfig adam_config(AdamWConfig config) {
    config.decay_mode = WeightDecayMode::l2;
    return config;
}

}  // namespace olmax::optim
