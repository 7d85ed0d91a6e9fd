#pragma once
// Normalisations over the last axis with fused custom backward passes: the original Olmax L2
// ScaleNorm (x / ||x||_2 * w) and RMSNorm (x / RMS(x) * w).

#include <algorithm>
#include <cmath>
#include <string_view>
#include <vector>
#include <span>
#include <type_traits>
#include <utility>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/ops/op_keys.hpp"

namespace olmax {

namespace detail::norm_ops {

/// Gradient of a norm's scale w [f] from rows of dy, x [rows, f] and the rows' factors r:
/// dw[j] = sum_i dy[i, j] x[i, j] r[i] in double. Each thread owns a run of columns and walks the
/// rows in order (contiguous reads; every column sums rows 0..rows-1 whatever the thread count).
template <Real T>
Tensor<T> scale_gradient(const T* dy, const T* x, const T* r, std::size_t rows, std::size_t f) {
    auto dw = Tensor<T>::uninitialized({f});
    T* dwp = dw.data();
    backend::current().parallel_for(f, rows, [&](std::size_t lo, std::size_t hi) {
        const std::size_t n = f, count = rows;  // locals: stores cannot change them
        std::vector<double> acc(hi - lo, 0.0);
        double* a = acc.data();
        for (std::size_t i = 0; i < count; ++i) {
            const T *dy_row = dy + i * n + lo, *x_row = x + i * n + lo;
            const double ri = double(r[i]);
#pragma omp simd
            for (std::size_t j = 0; j < hi - lo; ++j) a[j] += double(dy_row[j]) * double(x_row[j]) * ri;
        }
        for (std::size_t j = lo; j < hi; ++j) dwp[j] = T(acc[j - lo]);
    });
    return dw;
}

/// Input gradient of a norm out = x r w (w null: no scale) from dy, x, the rows' factors r and
/// their clamp flags (Olmax norm.py, §6.2): with dxhat = dy w, dx = r dxhat - r^3 x sum(dxhat x) /
/// mean_divisor, and dx = r dxhat on clamped rows (r did not depend on x there).
template <Real T>
Tensor<T> input_gradient(const T* dy, const T* x, const T* w, const T* r, const unsigned char* clamped, const Shape& shape,
                         double mean_divisor) {
    const std::size_t f = shape.back(), rows = f ? numel(shape) / f : 0;
    auto dx = Tensor<T>::uninitialized(shape);
    T* dp = dx.data();
    backend::current().parallel_for(rows, 2 * f, [&](std::size_t lo, std::size_t hi) {
        const std::size_t n = f;  // locals throughout: the compiler must see that stores cannot change them
        const T* scale = w;
        const double divisor = mean_divisor;
        for (std::size_t i = lo; i < hi; ++i) {
            const T *row = x + i * n, *grow = dy + i * n;
            T* out = dp + i * n;
            const T rr = r[i];
            double dot = 0;
            if (scale) {
#pragma omp simd reduction(+ : dot)
                for (std::size_t j = 0; j < n; ++j) {
                    const T dxhat = grow[j] * scale[j];
                    out[j] = rr * dxhat;
                    dot += double(dxhat) * double(row[j]);
                }
            } else {
#pragma omp simd reduction(+ : dot)
                for (std::size_t j = 0; j < n; ++j) {
                    out[j] = rr * grow[j];
                    dot += double(grow[j]) * double(row[j]);
                }
            }
            if (clamped[i]) continue;
            const T c = T(double(rr) * double(rr) * double(rr) * dot / divisor);
#pragma omp simd
            for (std::size_t j = 0; j < n; ++j) out[j] -= c * row[j];
        }
    });
    return dx;
}

/// ScaleNorm's row factor r = 1 / max(||x||_2, eps) from the row's sum of squares; `clamped` when
/// eps won (a NaN norm stays NaN).
template <Real T>
T l2_factor(double sum_sq, T eps, bool& clamped) {
    const double norm = std::sqrt(sum_sq);
    clamped = !(norm > double(eps));
    return T(1.0 / (clamped && !std::isnan(norm) ? double(eps) : norm));
}

/// Shared by both norms: per row (all axes but the last) a factor r = factor_of(sum of squares),
/// out = x * r * w. `clamped` marks rows where r did not depend on x (the eps branch), whose
/// gradient is then just r * dxhat. `mean_divisor` is 1 for the L2 norm and F for RMS. Runs inside
/// the calling norm's op_scope.
template <Real T, class FactorOf>
Tensor<T> normalize(std::string_view name, const Tensor<T>& x, const Tensor<T>& w, FactorOf factor_of, T mean_divisor) {
    if (!(x.rank() >= 1))
        throw shape_error(
            olmax::detail::concat(name, ": needs a tensor of rank >= 1 (normalises the last axis), got shape ", to_string(x.shape())));
    const std::size_t f = x.shape().back();
    std::size_t rows = 1;
    for (std::size_t i = 0; i + 1 < x.rank(); ++i) rows *= x.shape()[i];
    const bool scaled = w.defined();
    if (scaled)
        if (!(w.rank() == 1 && w.shape()[0] == f))
            throw shape_error(olmax::detail::concat(name, ": scale of shape ", to_string(w.shape()), " does not match [", f,
                                                    "] (the last axis of x of shape ", to_string(x.shape()), ")"));
    auto y = Tensor<T>::uninitialized(x.shape());
    auto r = Tensor<T>::uninitialized({rows});
    std::vector<unsigned char> clamped(rows);
    const T *xp = x.data(), *wp = scaled ? w.data() : nullptr;
    T *yp = y.data(), *rp = r.data();
    backend::current().parallel_for(rows, f, [&](std::size_t lo, std::size_t hi) {
        const std::size_t n = f;  // locals throughout: the compiler must see that stores cannot change them
        const T* scale = wp;
        for (std::size_t i = lo; i < hi; ++i) {
            const T* row = xp + i * n;
            double ss = 0;
#pragma omp simd reduction(+ : ss)
            for (std::size_t j = 0; j < n; ++j) ss += double(row[j]) * double(row[j]);
            bool clamp = false;
            const T factor = factor_of(ss, clamp);
            rp[i] = factor;
            clamped[i] = clamp;
            T* out = yp + i * n;
            if (scale) {
#pragma omp simd
                for (std::size_t j = 0; j < n; ++j) out[j] = row[j] * factor * scale[j];
            } else {
#pragma omp simd
                for (std::size_t j = 0; j < n; ++j) out[j] = row[j] * factor;
            }
        }
    });
    const Tensor<T> inputs[2] = {x, w};  // w only when scaled
    autodiff::record<T>(name, std::span<const Tensor<T>>(inputs, scaled ? 2 : 1), std::span<Tensor<T>>(&y, 1),
                        [x, w, r, clamped = std::move(clamped), rows, f, scaled, mean_divisor](std::span<const Tensor<T>> g,
                                                                                              autodiff::GradientSink<T>& sink) {
                            const T *xp = x.data(), *wp = scaled ? w.data() : nullptr, *rp = r.data(), *gp = g[0].data();
                            if (sink.needs(0)) {
                                sink.add(0, input_gradient(gp, xp, wp, rp, clamped.data(), x.shape(), double(mean_divisor)));
                            }
                            if (scaled && sink.needs(1)) {  // dw = sum over rows of dy * xhat
                                sink.add(1, scale_gradient(gp, xp, rp, rows, f));
                            }
                        });
    return y;
}

}  // namespace detail::norm_ops

/// The original Olmax L2 ScaleNorm over the last axis: r = 1 / max(||x||_2, eps), out = x r w
/// (no sqrt(F) factor, no mean subtraction). `w` is [F], or an undefined tensor for no scale.
/// Fused backward keeping only x and r: dx = r dxhat - r^3 x sum(dxhat x) with dxhat = dy w; rows
/// whose norm is below eps (r clamped to 1/eps) get dx = r dxhat, the exact gradient there.
template <Real T>
Tensor<T> scale_norm(const Tensor<T>& x, const Tensor<T>& w, std::type_identity_t<T> eps = T(1e-16)) {
    backend::op_scope on("scale_norm", x, w);
    check<value_error>(eps > T{0}, "scale_norm: eps must be positive, got ", eps);
    return on.run<op::scale_norm>({x, w}, {.eps = double(eps)}, [&] {
        return detail::norm_ops::normalize(
            "scale_norm", x, w,
            [eps](double sum_sq, bool& clamped) { return detail::norm_ops::l2_factor(sum_sq, T(eps), clamped); },
            T{1});
    });
}

/// RMSNorm over the last axis: out = x / sqrt(mean(x^2) + eps) * w (Zhang & Sennrich 2019);
/// `w` is [F] or an undefined tensor for no scale. Fused backward:
/// dx = s dxhat - s^3 x sum(dxhat x) / F with s = 1 / sqrt(mean(x^2) + eps).
template <Real T>
Tensor<T> rms_norm(const Tensor<T>& x, const Tensor<T>& w, std::type_identity_t<T> eps = T(1e-6)) {
    backend::op_scope on("rms_norm", x, w);
    check<value_error>(eps >= T{0}, "rms_norm: eps must be non-negative, got ", eps);
    if (!(x.rank() >= 1))
        throw shape_error(
            olmax::detail::concat("rms_norm: needs a tensor of rank >= 1 (normalises the last axis), got shape ", to_string(x.shape())));
    const double features = double(x.shape().back());
    return on.run<op::rms_norm>({x, w}, {.eps = double(eps)}, [&] {
        return detail::norm_ops::normalize(
            "rms_norm", x, w,
            [eps, features](double sum_sq, bool& clamped) {
                clamped = false;
                return T(1.0 / std::sqrt(sum_sq / features + double(eps)));
            },
            T(features));
    });
}

// ---- the keys of the norms' lowering rules (their rules: olmax/trace/rules.hpp) ----------------

namespace op {

/// x [..., F] normalised over its last axis and scaled by w [F] (undefined: no scale).
template <class K>
struct norm_over_last_axis : registered<K> {
    struct attrs {
        double eps = 0;
    };
    static std::vector<sample<attrs>> samples(Generator& rng) {
        Tensor<float> zero_row = samples::uniform(rng, {3, 4});  // a row of zeros: scale_norm's clamped factor
        for (std::size_t i = 0; i < 4; ++i) zero_row.data()[i] = 0.0f;
        return {{{samples::uniform(rng, {3, 4}), samples::uniform(rng, {4})}, {K::eps}},
                {{samples::uniform(rng, {2, 3, 5}), Tensor<float>()}, {K::eps}},
                {{zero_row, samples::uniform(rng, {4})}, {K::eps}}};
    }
};
struct scale_norm : norm_over_last_axis<scale_norm> {
    static constexpr std::string_view name = "scale_norm";
    static constexpr double eps = 0x1p-20;
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) { return olmax::scale_norm(in[0], in[1], T(a.eps)); }
};
struct rms_norm : norm_over_last_axis<rms_norm> {
    static constexpr std::string_view name = "rms_norm";
    static constexpr double eps = 0x1p-10;
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) { return olmax::rms_norm(in[0], in[1], T(a.eps)); }
};

}  // namespace op

}  // namespace olmax
