#pragma once
// Rotary position embedding, RoPE (Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary
// Position Embedding", arXiv:2104.09864): each head vector of x [batch, T, H, Dh] is rotated in
// Dh/2 planes by angles proportional to its position p, so that the dot product of a rotated query
// at p and a rotated key at s depends on p - s only. Planes pair coordinate i with i + Dh/2 (the
// "rotate_half" layout of most open implementations, not RoFormer's interleaved pairs 2i, 2i+1):
//
//     theta_i = base^(-2i / Dh),  i = 0 .. Dh/2 - 1,  angle = p theta_i
//     y[i]        = x[i] cos(angle) - x[i + Dh/2] sin(angle)
//     y[i + Dh/2] = x[i + Dh/2] cos(angle) + x[i] sin(angle)
//
// Positions: p = offset + t until the first document start of the row (resets [batch, T], nonzero
// where a document starts), then t minus the latest start, so every document of a packed row is
// rotated as if it began at 0. `offset` continues a sequence from an earlier call (carried state);
// a reset at t = 0 starts a new document there, so the offset then has no effect on that row.
// The backward is the inverse rotation (the rotation matrix is orthogonal): dx = R(-angle) dy.
// The eager kernel computes angles, cosines and sines in double and rounds them once to T; the
// traced form combines two small such tables in the program (detail::rope_ops::cosines_and_sines).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/backend/trace_rules.hpp"
#include "olmax/core/device.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/core/traced.hpp"
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/gather.hpp"
#include "olmax/ops/masks.hpp"
#include "olmax/ops/reduction.hpp"
#include "olmax/ops/shape.hpp"

namespace olmax {

/// Options of olmax::rope.
template <Real T>
struct RopeOptions {
    double base = 10000;       ///< theta_i = base^(-2i / Dh)
    std::size_t offset = 0;    ///< position of the first step (a sequence continued from an earlier call)
    Tensor<T> resets = {};     ///< [batch, T], nonzero at a document start (positions restart at 0 there); optional
};

namespace detail::rope_ops {

/// theta_i = base^(-2i / Dh), the angle per unit of position of plane i.
inline double frequency(std::size_t i, std::size_t dim, double base) { return std::pow(base, -2.0 * double(i) / double(dim)); }

/// Position of every (b, t) row, [batch * T].
template <Real T>
std::vector<double> positions(std::size_t batch, std::size_t time, std::size_t offset, const Tensor<T>& resets) {
    std::vector<double> pos(batch * time);
    for (std::size_t b = 0; b < batch; ++b) {
        bool started = false;
        std::size_t start = 0;
        for (std::size_t t = 0; t < time; ++t) {
            if (resets.defined() && resets.data()[b * time + t] != T{0}) started = true, start = t;
            pos[b * time + t] = started ? double(t - start) : double(offset) + double(t);
        }
    }
    return pos;
}

/// y = R(sign * angle) x for every head of every row; sign -1 is the inverse (the backward).
template <Real T>
void rotate(const T* x, T* y, const std::vector<double>& pos, std::size_t heads, std::size_t dim, double base, double sign) {
    const std::size_t half = dim / 2, rows = pos.size();
    std::vector<double> inv_freq(half);
    for (std::size_t i = 0; i < half; ++i) inv_freq[i] = frequency(i, dim, base);
    // The cosines and sines once per distinct position (the rows of a batch share them: without
    // resets every row has positions offset .. offset + T - 1), not once per row.
    std::vector<double> distinct(pos);
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    std::vector<T> cos_table(distinct.size() * half), sin_table(distinct.size() * half);
    backend::current().parallel_for(distinct.size(), half * 40, [&](std::size_t lo, std::size_t hi) {
        for (std::size_t u = lo; u < hi; ++u)
            for (std::size_t i = 0; i < half; ++i) {
                const double angle = distinct[u] * inv_freq[i];
                cos_table[u * half + i] = T(std::cos(angle));
                sin_table[u * half + i] = T(sign * std::sin(angle));
            }
    });
    backend::current().parallel_for(rows, heads * dim * 2, [&](std::size_t lo, std::size_t hi) {
        for (std::size_t r = lo; r < hi; ++r) {
            const std::size_t u = std::size_t(std::lower_bound(distinct.begin(), distinct.end(), pos[r]) - distinct.begin());
            const T* c = cos_table.data() + u * half;
            const T* s = sin_table.data() + u * half;
            for (std::size_t h = 0; h < heads; ++h) {
                const T* xr = x + (r * heads + h) * dim;
                T* yr = y + (r * heads + h) * dim;
#pragma omp simd
                for (std::size_t i = 0; i < half; ++i) {
                    const T a = xr[i], b = xr[i + half];
                    yr[i] = a * c[i] - b * s[i];
                    yr[i + half] = b * c[i] + a * s[i];
                }
            }
        }
    });
}

/// cos(p theta_i) and sin(p theta_i), each [count, Dh/2], for the positions p = first + t, t < count,
/// computed in the program from O(sqrt(count)) constants instead of captured as a [count, Dh/2]
/// table: at T = 4096 and Dh = 64 two such tables are 0.5 M numbers of program text a call, and a
/// traced attention step calls RoPE four times or more (q and k, forward and rebuilt). With
/// p = first + j L + l (L the power of two nearest above sqrt(count)), the host computes, in double and
/// rounded once, the angles' cosines and sines of first + j L ([ceil(count / L), 1, Dh/2]) and of
/// l ([1, L, Dh/2]); the program combines them by cos(a + b) = cos a cos b - sin a sin b and
/// sin(a + b) = sin a cos b + cos a sin b, so each entry is within a few ulps of T of its rounded
/// value.
template <Real T>
std::pair<Tensor<T>, Tensor<T>> cosines_and_sines(double first, std::size_t count, std::size_t dim, double base) {
    const std::size_t half = dim / 2;
    std::size_t block = 1;
    while (block * block < count) block *= 2;
    const std::size_t blocks = (count + block - 1) / block;
    Tensor<T> cos_block, sin_block, cos_step, sin_step;
    {
        device_scope host(Device::host());  // the constants are built on the host, then captured
        cos_block = Tensor<T>({blocks, 1, half}), sin_block = Tensor<T>({blocks, 1, half});
        cos_step = Tensor<T>({1, block, half}), sin_step = Tensor<T>({1, block, half});
        for (std::size_t i = 0; i < half; ++i) {
            const double theta = frequency(i, dim, base);
            for (std::size_t j = 0; j < blocks; ++j) {
                const double angle = (first + double(j * block)) * theta;
                cos_block.data()[j * half + i] = T(std::cos(angle));
                sin_block.data()[j * half + i] = T(std::sin(angle));
            }
            for (std::size_t l = 0; l < block; ++l) {
                cos_step.data()[l * half + i] = T(std::cos(double(l) * theta));
                sin_step.data()[l * half + i] = T(std::sin(double(l) * theta));
            }
        }
    }
    using backend::trace::in_program;
    const Tensor<T> ca = in_program(cos_block), sa = in_program(sin_block), cb = in_program(cos_step), sb = in_program(sin_step);
    const Shape flat{blocks * block, half};
    const Tensor<T> cosines = reshape(sub(mul(ca, cb), mul(sa, sb)), flat), sines = reshape(add(mul(sa, cb), mul(ca, sb)), flat);
    if (blocks * block == count) return {cosines, sines};
    return {slice(cosines, 0, 0, count), slice(sines, 0, 0, count)};
}

/// The traced form: y = [x1 c - x2 s, x2 c + x1 s] for the halves x1, x2 of each head vector, with
/// c, s [T, Dh/2] per row from cosines_and_sines (element-wise, so no product is rounded to bf16
/// under the bf16 policy, as the eager kernel rounds none). Without resets c and s are those of the
/// positions offset .. offset + T - 1, shared by every row. With resets (host ones captured as
/// constants, traced ones a per-call input; read as 0/1 flags by masks::start_flags, any nonzero a
/// start) the positions are computed in the program and c, s are rows of a table of the positions
/// 0 .. T - 1 (after a start) and offset .. offset + T - 1 (before the first), gathered per
/// (batch, t): t's row is t - start_t once a document has started (its document id, the running
/// count of starts, is >= 1; start_t the step of the last start at or before t,
/// masks::document_starts) and T + t before. Both are running sums or maxima in the program, so its
/// constants stay O(T) (the positions) and the tables' O(sqrt(T)).
template <Real T>
Tensor<T> traced(const Tensor<T>& x, std::size_t offset, const Tensor<T>& resets, double base) {
    using backend::trace::in_program;
    const std::size_t nb = x.extent(0), nt = x.extent(1), dim = x.extent(3), half = dim / 2;
    auto [c, s] = cosines_and_sines<T>(double(offset), nt, dim, base);
    if (resets.defined()) {  // rows 0 .. T - 1: positions from 0 (after a start); T .. 2T - 1: from the offset
        const auto [c_start, s_start] = offset ? cosines_and_sines<T>(0, nt, dim, base) : std::pair{c, s};
        c = olmax::concat<T>({c_start, c}, 0);
        s = olmax::concat<T>({s_start, s}, 0);
        const Tensor<T> starts = masks::start_flags(resets);                                                       // [B, T], 0/1
        const Tensor<T> started = masks::at_most_one(masks::document_ids(starts));
        const Tensor<T> step = in_program(masks::positions<T>(nt));                                                // [1, T]: t
        const Tensor<T> in_document = sub(step, masks::document_starts(starts));                                   // t - start_t
        const Tensor<T> row = add(mul(started, in_document), mul(add_scalar(neg(started), T{1}), add_scalar(step, T(nt))));  // or T + t
        const Tensor<std::int32_t> index = backend::trace::as_indices(reshape(row, Shape{nb * nt}));
        c = gather_rows(c, index);
        s = gather_rows(s, index);
    }
    const Shape table{resets.defined() ? nb : 1, nt, 1, half};
    c = reshape(c, table);
    s = reshape(s, table);
    const Tensor<T> x1 = slice(x, 3, 0, half), x2 = slice(x, 3, half, dim);
    return olmax::concat<T>({sub(mul(x1, c), mul(x2, s)), add(mul(x2, c), mul(x1, s))}, 3);
}

}  // namespace detail::rope_ops

/// Rotary position embedding of x [batch, T, H, Dh] (Dh even), see the top of this file.
/// Differentiable in x; the resets are not differentiated. On traced tensors it traces the
/// rotation element-wise, with cosines and sines the program computes from O(sqrt(T)) constants,
/// gathered by positions it computes when there are resets (detail::rope_ops::traced).
template <Real T>
Tensor<T> rope(const Tensor<T>& x, const RopeOptions<T>& options = {}) {
    constexpr std::string_view op = "rope";
    backend::op_scope on(op, x, options.resets);
    check<value_error>(x.defined(), op, ": x is an undefined tensor");
    check<shape_error>(x.rank() == 4, op, ": x must be [batch, T, heads, head_dim], got shape ", to_string(x.shape()));
    const std::size_t nb = x.extent(0), nt = x.extent(1), nh = x.extent(2), dim = x.extent(3);
    check<value_error>(nb > 0 && nt > 0 && nh > 0 && dim > 0, op, ": x of shape ", to_string(x.shape()), " is empty");
    check<shape_error>(dim % 2 == 0, op, ": head_dim must be even (pairs i, i + head_dim/2 rotate), got ", dim, " in x of shape ",
                       to_string(x.shape()));
    check<value_error>(std::isfinite(options.base) && options.base > 0, op, ": base must be positive and finite, got ", options.base);
    if (options.resets.defined())
        check<shape_error>(options.resets.rank() == 2 && options.resets.extent(0) == nb && options.resets.extent(1) == nt, op,
                           ": resets of shape ", to_string(options.resets.shape()), " does not match [batch, T] = [", nb, ", ", nt, "]");
    return on.run_composed([&] { return detail::rope_ops::traced(x, options.offset, options.resets, options.base); }, [&] {
            auto pos = detail::rope_ops::positions(nb, nt, options.offset, options.resets);
            auto y = Tensor<T>::uninitialized(x.shape());
            detail::rope_ops::rotate(x.data(), y.data(), pos, nh, dim, options.base, 1.0);
            autodiff::record<T>(op, std::span<const Tensor<T>>(&x, 1), std::span<Tensor<T>>(&y, 1),
                                [pos = std::move(pos), nh, dim, base = options.base](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                                    if (!sink.needs(0)) return;
                                    auto dx = Tensor<T>::uninitialized(g[0].shape());
                                    detail::rope_ops::rotate(g[0].data(), dx.data(), pos, nh, dim, base, -1.0);
                                    sink.add(0, std::move(dx));
                                });
            return y;
        });
}

}  // namespace olmax
