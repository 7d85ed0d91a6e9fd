#pragma once
// Gradient clipping: global-norm clipping (as torch.nn.utils.clip_grad_norm_) and unit-wise
// adaptive gradient clipping (AGC; Brock, De, Smith, Simonyan 2021, "High-Performance Large-Scale
// Image Recognition Without Normalization", §4.1): for every output unit i,
//     G_i <- G_i * min(1, clip * max(||W_i||, param_floor) / max(||G_i||, grad_floor)),
// with Frobenius norms over the unit's fan-in.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "olmax/backend/dispatch.hpp"
#include "olmax/core/core.hpp"
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/reduction.hpp"
#include "olmax/ops/shape.hpp"
#include "olmax/optim/param.hpp"

namespace olmax::optim {

struct AgcConfig {
    /// The largest allowed ratio ||G_i|| / ||W_i||; 0 turns AGC off. NFNet uses 0.01 at batch 4096;
    /// the original Olmax used 0.001.
    double clip = 0.0;
    /// Lower bound on ||W_i|| so zero-initialised units can still move (NFNet's epsilon, 1e-3).
    double param_floor = 1e-3;
    /// Lower bound on ||G_i|| in the denominator (avoids 0/0).
    double grad_floor = 1e-16;
};

namespace detail {

/// How AGC's units lie in a row-major tensor: elements are [stack][before][unit][after] (stack = the
/// stacked axes, unit = the unit axis, before / after = the fan-in axes around it), so the unit of
/// an element is stack * units_per_stack + unit and every unit's fan-in is `before` runs of `after`
/// contiguous elements.
struct UnitLayout {
    std::size_t stack = 1, before = 1, units_per_stack = 1, after = 1;
    std::size_t units() const { return stack * units_per_stack; }

    /// Calls f(unit, offset, length) for every contiguous run of one unit's elements.
    template <class F>
    void for_each_run(F&& f) const {
        for (std::size_t s = 0; s < stack; ++s)
            for (std::size_t b = 0; b < before; ++b)
                for (std::size_t u = 0; u < units_per_stack; ++u)
                    f(s * units_per_stack + u, ((s * before + b) * units_per_stack + u) * after, after);
    }

    /// For `after == 1`: calls f(a + first unit, b + first unit, offset, units_per_stack) for every
    /// row of elements that holds one element of each unit of a stack entry (a, b: per-unit arrays).
    template <class F>
    void for_each_row(F&& f, double* a, double* b) const {
        for (std::size_t s = 0; s < stack; ++s)
            for (std::size_t r = 0; r < before; ++r)
                f(a + s * units_per_stack, b + s * units_per_stack, (s * before + r) * units_per_stack, units_per_stack);
    }
};

/// Units are indexed by the stacked axes and `unit_axis`; the norm runs over the remaining axes.
/// Tensors with at most one non-stacked axis are vectors: one unit per element.
inline UnitLayout unit_layout(const Shape& shape, std::size_t stacked_axes, long unit_axis) {
    const std::size_t rank = shape.size();
    check<shape_error>(stacked_axes <= rank, "adaptive_grad_clip: ", stacked_axes, " stacked axes for a tensor of shape ",
                       olmax::to_string(shape));
    UnitLayout layout;
    for (std::size_t a = 0; a < stacked_axes; ++a) layout.stack *= shape[a];
    if (rank - stacked_axes <= 1) {
        if (rank > stacked_axes) layout.units_per_stack = shape[stacked_axes];
        return layout;
    }
    const long r = long(rank);
    const long axis = unit_axis < 0 ? unit_axis + r : unit_axis;
    check<shape_error>(axis >= long(stacked_axes) && axis < r, "adaptive_grad_clip: unit axis ", unit_axis,
                       " is outside the non-stacked axes of shape ", olmax::to_string(shape));
    for (std::size_t a = stacked_axes; a < std::size_t(axis); ++a) layout.before *= shape[a];
    layout.units_per_stack = shape[std::size_t(axis)];
    for (std::size_t a = std::size_t(axis) + 1; a < rank; ++a) layout.after *= shape[a];
    return layout;
}

/// Unit-wise AGC of the gradient g of the parameter values p, both laid out as `layout`, in place.
/// Returns how many units were clipped. A unit never spans stack entries, so clipping a run of
/// whole stack entries on its own (one layer's slice of a stacked parameter) gives the numbers of
/// clipping the whole tensor.
template <Real P, Real G>
std::size_t clip_units(const P* p, G* g, const UnitLayout& layout, const AgcConfig& config) {
    const std::size_t units = layout.units();
    std::vector<double> param_sq(units, 0.0), grad_sq(units, 0.0);
    // With the unit axis last (the usual W[..., in, out]) every run is one element: walk whole
    // rows instead, accumulating all units of a row at once (vectorised; the same sums in the same
    // order as run by run).
    const bool unit_axis_last = layout.after == 1;
    if (unit_axis_last)
        layout.for_each_row([&](double* unit_param_sq, double* unit_grad_sq, std::size_t offset, std::size_t length) {
#pragma omp simd
            for (std::size_t u = 0; u < length; ++u) {
                unit_param_sq[u] += double(p[offset + u]) * double(p[offset + u]);
                unit_grad_sq[u] += double(g[offset + u]) * double(g[offset + u]);
            }
        }, param_sq.data(), grad_sq.data());
    else
        layout.for_each_run([&](std::size_t unit, std::size_t offset, std::size_t length) {
            double ps = 0, gs = 0;
            for (std::size_t i = offset; i < offset + length; ++i) {
                ps += double(p[i]) * double(p[i]);
                gs += double(g[i]) * double(g[i]);
            }
            param_sq[unit] += ps;
            grad_sq[unit] += gs;
        });
    std::vector<double> factor(units, 1.0);
    std::size_t clipped = 0;
    for (std::size_t u = 0; u < units; ++u) {
        const double max_norm = config.clip * std::max(std::sqrt(param_sq[u]), config.param_floor);
        const double grad_norm = std::sqrt(grad_sq[u]);
        if (grad_norm > max_norm) {
            factor[u] = max_norm / std::max(grad_norm, config.grad_floor);
            ++clipped;
        }
    }
    if (clipped && unit_axis_last)
        layout.for_each_row([&](double* unit_factor, double*, std::size_t offset, std::size_t length) {
#pragma omp simd
            for (std::size_t u = 0; u < length; ++u) g[offset + u] = G(double(g[offset + u]) * unit_factor[u]);
        }, factor.data(), factor.data());
    else if (clipped)
        layout.for_each_run([&](std::size_t unit, std::size_t offset, std::size_t length) {
            for (std::size_t i = offset; i < offset + length; ++i) g[i] = G(double(g[i]) * factor[unit]);
        });
    return clipped;
}

}  // namespace detail

/// Unit-wise AGC of `grad` (same shape as `param`), in place. Returns how many units were clipped.
template <Real P, Real G>
std::size_t adaptive_grad_clip(const Tensor<P>& param, Tensor<G>& grad, const AgcConfig& config, std::size_t stacked_axes = 0,
                               long unit_axis = -1) {
    check<shape_error>(param.shape() == grad.shape(), "adaptive_grad_clip: parameter shape ", olmax::to_string(param.shape()),
                       " differs from gradient shape ", olmax::to_string(grad.shape()));
    check(config.clip >= 0, "adaptive_grad_clip: clip must be >= 0, got ", config.clip);
    if (config.clip == 0 || param.empty()) return 0;
    return detail::clip_units(param.data(), grad.data(), detail::unit_layout(param.shape(), stacked_axes, unit_axis), config);
}

/// AGC as tensor ops, for a traced step (whose tensors have no values to loop over): grad times
/// min(1, clip max(||W_u||, param_floor) / max(||G_u||, grad_floor)) for each unit u (the tensors
/// reshaped to [stack, before, units, after], the norms over the fan-in axes 1 and 3). This is
/// adaptive_grad_clip's factor whenever clip param_floor >= grad_floor (then a unit within its limit
/// has a ratio of at least 1), which it checks.
template <Real T>
Tensor<T> adaptive_grad_clip_ops(const Tensor<T>& param, const Tensor<T>& grad, const AgcConfig& config, std::size_t stacked_axes = 0,
                                 long unit_axis = -1) {
    check<shape_error>(param.shape() == grad.shape(), "adaptive_grad_clip: parameter shape ", olmax::to_string(param.shape()),
                       " differs from gradient shape ", olmax::to_string(grad.shape()));
    check<value_error>(config.clip > 0 && config.clip * config.param_floor >= config.grad_floor,
                       "adaptive_grad_clip: as tensor ops (a traced step) it needs clip > 0 and clip * param_floor (",
                       config.clip * config.param_floor, ") >= grad_floor (", config.grad_floor, ")");
    const detail::UnitLayout l = detail::unit_layout(param.shape(), stacked_axes, unit_axis);
    const Shape units{l.stack, l.before, l.units_per_stack, l.after};
    const auto norm = [&](const Tensor<T>& x) { return sqrt(sum(square(reshape(x, units)), {1, 3}, true)); };
    const auto at_least = [](const Tensor<T>& x, double floor) { return maximum(x, Tensor<T>::scalar(T(floor))); };
    const Tensor<T> ratio = div(scale(at_least(norm(param), config.param_floor), T(config.clip)), at_least(norm(grad), config.grad_floor));
    const Tensor<T> factor = neg(maximum(neg(ratio), Tensor<T>::scalar(T(-1))));  // min(1, ratio)
    return reshape(mul(reshape(grad, units), factor), grad.shape());
}

namespace detail {

/// Sum of squares in double. In double a float's square cannot overflow (3.4e38^2 < 1.8e308 even
/// summed over 10^9 elements), so for float gradients the sum is non-finite exactly when some
/// element is NaN or Inf.
template <Real T>
double sum_of_squares(const T* x, std::size_t n) {
    double sum = 0;
#pragma omp simd reduction(+ : sum)
    for (std::size_t i = 0; i < n; ++i) sum += double(x[i]) * double(x[i]);
    return sum;
}

/// Contiguous elements whose squares are summed together; fixed, so that sums do not depend on
/// the thread count.
inline constexpr std::size_t norm_block = std::size_t(1) << 15;

/// The sums of squares of several arrays (pointer, length), computed in blocks of `norm_block`
/// elements shared by the threads of the current device's kernels; each array's sum adds its blocks' sums in
/// order, so the result is the same for every thread count.
template <Real T>
std::vector<double> sums_of_squares(std::span<const std::pair<const T*, std::size_t>> arrays) {
    std::vector<std::size_t> first_block(arrays.size() + 1, 0);
    for (std::size_t a = 0; a < arrays.size(); ++a)
        first_block[a + 1] = first_block[a] + (arrays[a].second + norm_block - 1) / norm_block;
    std::vector<double> block_sums(first_block.back(), 0.0);
    backend::current().parallel_for(block_sums.size(), norm_block, [&](std::size_t begin, std::size_t end) {
        std::size_t a = std::size_t(std::upper_bound(first_block.begin(), first_block.end(), begin) - first_block.begin()) - 1;
        for (std::size_t b = begin; b < end; ++b) {
            while (b >= first_block[a + 1]) ++a;
            const std::size_t offset = (b - first_block[a]) * norm_block;
            block_sums[b] = sum_of_squares(arrays[a].first + offset, std::min(norm_block, arrays[a].second - offset));
        }
    });
    std::vector<double> sums(arrays.size(), 0.0);
    for (std::size_t a = 0; a < arrays.size(); ++a)
        for (std::size_t b = first_block[a]; b < first_block[a + 1]; ++b) sums[a] += block_sums[b];
    return sums;
}

/// Whether every element is finite: sum of x * 0 is NaN exactly when some x is NaN or Inf (a
/// reduction vectorises, an early-exit search does not).
template <Real T>
bool all_finite(const T* x, std::size_t n) {
    double probe = 0;
#pragma omp simd reduction(+ : probe)
    for (std::size_t i = 0; i < n; ++i) probe += double(x[i]) * 0.0;
    return std::isfinite(probe);
}

/// torch.nn.utils.clip_grad_norm_'s factor min(1, max_norm / (norm + 1e-6)) (the 1e-6 is
/// PyTorch's, kept for matching references); 1 when clipping is off or the norm is not finite.
inline double clip_coefficient(double norm, double max_norm) {
    if (max_norm <= 0 || !std::isfinite(norm)) return 1.0;
    return std::min(1.0, max_norm / (norm + 1e-6));
}

}  // namespace detail

/// The L2 norm of all gradients together (undefined gradients count as zero).
template <Real T>
double global_grad_norm(std::span<const Parameter<T>> params) {
    std::vector<Tensor<T>> grads;  // holds the gradients alive while their pointers are used
    std::vector<std::pair<const T*, std::size_t>> arrays;
    for (const auto& p : params)
        if (Tensor<T> g = p.tensor.grad(); g.defined()) {
            arrays.emplace_back(g.data(), g.size());
            grads.push_back(std::move(g));
        }
    backend::op_scope on("global_grad_norm", grads);
    double sum_sq = 0;
    for (double s : detail::sums_of_squares<T>(arrays)) sum_sq += s;
    return std::sqrt(sum_sq);
}

/// Scales every gradient by min(1, max_norm / (norm + 1e-6)) like torch.nn.utils.clip_grad_norm_;
/// returns the norm before clipping. `max_norm` <= 0 only measures.
template <Real T>
double clip_grad_norm(std::span<const Parameter<T>> params, double max_norm) {
    const double norm = global_grad_norm(params);
    const double coef = detail::clip_coefficient(norm, max_norm);
    if (coef >= 1.0) return norm;
    for (const auto& p : params) {
        Tensor<T> g = p.tensor.grad();
        if (!g.defined()) continue;
        T* gp = g.data();
        const std::size_t n = g.size();
#pragma omp simd
        for (std::size_t i = 0; i < n; ++i) gp[i] = T(double(gp[i]) * coef);
    }
    return norm;
}

}  // namespace olmax::optim
