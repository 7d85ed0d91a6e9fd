#pragma once
// Causal multi-head attention with O(T) memory and an exact backward, the FlashAttention-2 scheme
// (Dao 2023, "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning",
// arXiv:2307.08691) on the CPU:
//
//     out[b, t, h] = sum_s P[t, s] v[b, s, g(h)],   P[t, .] = softmax_s(scale q[b, t, h] . k[b, s, g(h)])
//
// over the keys s each query t may see: s <= t (causal), s > t - W with a sliding window W > 0, and
// s at or after the start of t's document when resets [batch, T] mark document starts (nonzero at
// the first position of each document of a packed row). These keys form one interval [lo(t), t],
// never empty, with lo non-decreasing in t. Grouped-query attention: k and v have Hkv heads, Hkv
// dividing H, and query head h reads kv head g(h) = h / (H / Hkv) (Hkv = 1 is multi-query).
//
// Forward: the queries of one (batch, head) are cut into tiles of `query_tile` rows; each tile walks
// the key tiles of `key_tile` columns covering [lo(first row), last row] (tiles wholly before the
// window or the document, or past the diagonal, are never visited) and keeps per row a running
// maximum m, a running sum l and an unnormalised output, rescaled by exp(m_old - m_new) when the
// maximum grows (the online softmax). The T x T matrix never exists: what the forward keeps for the
// backward is the output and the log-sum-exp lse = m + log l per row, [batch, H, T].
//
// Backward (exact; the same per-tile loop): P = exp(scale q k^T - lse) is recomputed from q, k and
// lse; with D = rowsum(dO * O),
//     dV += P^T dO,   dP = dO V^T,   dS = P * (dP - D),   dQ += scale dS K,   dK += scale dS^T Q.
// Memory beyond the inputs and their gradients: lse, D per tile, and per-thread tile scratch; with
// Hkv < H, dK and dV are first accumulated per query head ([batch, T, H, Dh], the size of q) and then
// summed over each group. The forward runs the (batch, head, query tile) items on the threads, the
// backward the (batch, head) items (each owns its rows of dQ and its per-head dK, dV), as PyTorch's
// CPU flash-attention kernel does. The tile GEMMs run on the device's `Kernels::gemm` (on the host
// Eigen's blocked GEMM on the raw row-major buffers, one thread inside a parallel chunk), so they
// follow the kernels in force (e.g. the bf16 precision policy rounds their float operands).
//
// On traced tensors (a program traced for XLA, olmax/trace/) the op traces the same function
// composed of traced ops with the T x T scores materialised (detail::attention_ops::traced): a first
// step, with the memory of plain attention.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/core/traced.hpp"
#include "olmax/backend/trace_rules.hpp"
#include "olmax/core/device.hpp"
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/linalg.hpp"
#include "olmax/ops/loss.hpp"
#include "olmax/ops/math_rules.hpp"
#include "olmax/ops/shape.hpp"

namespace olmax {

/// Options of olmax::causal_attention.
template <Real T>
struct AttentionOptions {
    std::optional<double> scale = {};  ///< multiplies q k^T; default 1 / sqrt(head_dim)
    std::size_t window = 0;        ///< W > 0: query t sees keys s in (t - W, t]; 0: every key s <= t
    Tensor<T> resets = {};         ///< [batch, T], nonzero at a document start: no query sees a key before its document's start
    std::size_t query_tile = 64;   ///< queries per tile (rows of the score tile)
    std::size_t key_tile = 128;    ///< keys per tile (columns of the score tile)
};

namespace detail::attention_ops {

struct Dims {
    std::size_t batch, time, heads, kv_heads, dim, query_tile, key_tile;
    double scale;
};

/// lo(t) for every (b, t) row: the first key the query may see (see the top of this file).
template <Real T>
std::vector<std::size_t> lowest_keys(const Dims& d, std::size_t window, const Tensor<T>& resets) {
    std::vector<std::size_t> lowest(d.batch * d.time);
    for (std::size_t b = 0; b < d.batch; ++b) {
        std::size_t start = 0;
        for (std::size_t t = 0; t < d.time; ++t) {
            if (resets.defined() && resets.data()[b * d.time + t] != T{0}) start = t;
            const std::size_t in_window = window > 0 && t + 1 > window ? t + 1 - window : 0;
            lowest[b * d.time + t] = std::max(start, in_window);
        }
    }
    return lowest;
}

/// The keys query t sees within the key tile [s0, s1), as offsets [first, end) into the tile (its
/// interval is [lo_t, t]); first >= end when it sees none there. The forward and the backward cut
/// their tiles by it.
inline std::pair<std::size_t, std::size_t> visible_in_tile(std::size_t lo_t, std::size_t t, std::size_t s0, std::size_t s1) {
    const std::size_t end = std::min(t + 1, s1);
    return {std::max(lo_t, s0) - s0, end > s0 ? end - s0 : 0};
}

/// x[i] = exp(x[i] - shift) for i in [0, n), on SIMD batches.
template <Real T>
void exp_shifted(std::size_t n, T* x, T shift) {
    math::transform(n, x, [shift](auto s) { using std::exp; return exp(s - decltype(s)(shift)); }, static_cast<const T*>(x));
}

/// out [batch, T, H, Dh] and lse [batch, H, T] from q [batch, T, H, Dh], k and v [batch, T, Hkv, Dh].
template <Real T>
void forward(const Dims& d, const std::size_t* lowest, const T* q, const T* k, const T* v, T* out, T* lse) {
    const std::size_t tiles = (d.time + d.query_tile - 1) / d.query_tile, group = d.heads / d.kv_heads;
    const std::size_t ldq = d.heads * d.dim, ldk = d.kv_heads * d.dim;
    const std::size_t work = d.query_tile * std::min(d.time, d.key_tile * 2) * d.dim * 2;
    const backend::Kernels& kernels = backend::current();
    kernels.parallel_for(d.batch * d.heads * tiles, work, [&](std::size_t first, std::size_t last) {
        std::vector<T> scores(d.query_tile * d.key_tile), acc(d.query_tile * d.dim), row_max(d.query_tile), row_sum(d.query_tile);
        for (std::size_t item = first; item < last; ++item) {
            const std::size_t b = item / (d.heads * tiles), h = item / tiles % d.heads, g = h / group;
            const std::size_t t0 = item % tiles * d.query_tile, t1 = std::min(d.time, t0 + d.query_tile), rows = t1 - t0;
            const std::size_t* lo = lowest + b * d.time;
            const T* qp = q + ((b * d.time + t0) * d.heads + h) * d.dim;
            std::fill_n(acc.begin(), rows * d.dim, T{0});
            std::fill_n(row_max.begin(), rows, -std::numeric_limits<T>::infinity());
            std::fill_n(row_sum.begin(), rows, T{0});
            for (std::size_t s0 = lo[t0]; s0 < t1; s0 += d.key_tile) {
                const std::size_t s1 = std::min(t1, s0 + d.key_tile), cols = s1 - s0;
                const T* kp = k + ((b * d.time + s0) * d.kv_heads + g) * d.dim;
                const T* vp = v + ((b * d.time + s0) * d.kv_heads + g) * d.dim;
                kernels.gemm(false, true, rows, cols, d.dim, T(d.scale), qp, ldq, kp, ldk, T{0}, scores.data(), cols);
                for (std::size_t r = 0; r < rows; ++r) {
                    const std::size_t t = t0 + r;
                    T* srow = scores.data() + r * cols;
                    // Keys [a, e) of this tile are visible to row t; the others get probability 0.
                    const auto [a, e] = visible_in_tile(lo[t], t, s0, s1);
                    if (a >= e) {
                        std::fill_n(srow, cols, T{0});
                        continue;
                    }
                    T m = row_max[r];
#pragma omp simd reduction(max : m)
                    for (std::size_t c = a; c < e; ++c) m = std::max(m, srow[c]);
                    const T correction = std::exp(row_max[r] - m);  // 0 on the row's first visible tile
                    std::fill_n(srow, a, T{0});
                    exp_shifted(e - a, srow + a, m);
                    std::fill(srow + e, srow + cols, T{0});
                    T sum{0};
#pragma omp simd reduction(+ : sum)
                    for (std::size_t c = a; c < e; ++c) sum += srow[c];
                    row_sum[r] = row_sum[r] * correction + sum;
                    row_max[r] = m;
                    if (correction != T{1}) {
                        T* ar = acc.data() + r * d.dim;
                        for (std::size_t i = 0; i < d.dim; ++i) ar[i] *= correction;
                    }
                }
                kernels.gemm(false, false, rows, d.dim, cols, T{1}, scores.data(), cols, vp, ldk, T{1}, acc.data(), d.dim);
            }
            for (std::size_t r = 0; r < rows; ++r) {
                const T inv = T{1} / row_sum[r];
                T* orow = out + ((b * d.time + t0 + r) * d.heads + h) * d.dim;
                const T* ar = acc.data() + r * d.dim;
                for (std::size_t i = 0; i < d.dim; ++i) orow[i] = ar[i] * inv;
                lse[(b * d.heads + h) * d.time + t0 + r] = row_max[r] + std::log(row_sum[r]);
            }
        }
    });
}

/// dq [batch, T, H, Dh] and dk, dv per query head [batch, T, H, Dh], all zero on entry, from the
/// forward's inputs, out, lse and dout.
template <Real T>
void backward(const Dims& d, const std::size_t* lowest, const T* q, const T* k, const T* v, const T* out, const T* lse, const T* dout,
              T* dq, T* dk, T* dv) {
    const std::size_t group = d.heads / d.kv_heads, ldq = d.heads * d.dim, ldk = d.kv_heads * d.dim;
    const std::size_t work = d.time * std::min(d.time, d.key_tile * 2) * d.dim * 5;
    const backend::Kernels& kernels = backend::current();
    kernels.parallel_for(d.batch * d.heads, work, [&](std::size_t first, std::size_t last) {
        std::vector<T> p(d.query_tile * d.key_tile), dp(d.query_tile * d.key_tile), dsum(d.query_tile);
        for (std::size_t item = first; item < last; ++item) {
            const std::size_t b = item / d.heads, h = item % d.heads, g = h / group;
            const std::size_t* lo = lowest + b * d.time;
            for (std::size_t t0 = 0; t0 < d.time; t0 += d.query_tile) {
                const std::size_t t1 = std::min(d.time, t0 + d.query_tile), rows = t1 - t0;
                const std::size_t q_at = ((b * d.time + t0) * d.heads + h) * d.dim;
                const T *qp = q + q_at, *dop = dout + q_at;
                T* dqp = dq + q_at;
                const T* lse_rows = lse + (b * d.heads + h) * d.time + t0;
                for (std::size_t r = 0; r < rows; ++r) {
                    const T *o = out + q_at + r * ldq, *dor = dop + r * ldq;
                    T s{0};
#pragma omp simd reduction(+ : s)
                    for (std::size_t i = 0; i < d.dim; ++i) s += o[i] * dor[i];
                    dsum[r] = s;
                }
                for (std::size_t s0 = lo[t0]; s0 < t1; s0 += d.key_tile) {
                    const std::size_t s1 = std::min(t1, s0 + d.key_tile), cols = s1 - s0;
                    const T* kp = k + ((b * d.time + s0) * d.kv_heads + g) * d.dim;
                    const T* vp = v + ((b * d.time + s0) * d.kv_heads + g) * d.dim;
                    const std::size_t kv_at = ((b * d.time + s0) * d.heads + h) * d.dim;  // this head's rows of dk, dv
                    kernels.gemm(false, true, rows, cols, d.dim, T(d.scale), qp, ldq, kp, ldk, T{0}, p.data(), cols);
                    for (std::size_t r = 0; r < rows; ++r) {
                        const std::size_t t = t0 + r;
                        T* prow = p.data() + r * cols;
                        const auto [a, e] = visible_in_tile(lo[t], t, s0, s1);
                        if (a >= e) {
                            std::fill_n(prow, cols, T{0});
                            continue;
                        }
                        std::fill_n(prow, a, T{0});
                        exp_shifted(e - a, prow + a, lse_rows[r]);
                        std::fill(prow + e, prow + cols, T{0});
                    }
                    kernels.gemm(true, false, cols, d.dim, rows, T{1}, p.data(), cols, dop, ldq, T{1}, dv + kv_at, ldq);  // dV += P^T dO
                    kernels.gemm(false, true, rows, cols, d.dim, T{1}, dop, ldq, vp, ldk, T{0}, dp.data(), cols);          // dP = dO V^T
                    for (std::size_t r = 0; r < rows; ++r) {
                        T* dprow = dp.data() + r * cols;
                        const T* prow = p.data() + r * cols;
                        const T dr = dsum[r];
#pragma omp simd
                        for (std::size_t c = 0; c < cols; ++c) dprow[c] = prow[c] * (dprow[c] - dr);  // dS
                    }
                    kernels.gemm(false, false, rows, d.dim, cols, T(d.scale), dp.data(), cols, kp, ldk, T{1}, dqp, ldq);   // dQ += scale dS K
                    kernels.gemm(true, false, cols, d.dim, rows, T(d.scale), dp.data(), cols, qp, ldq, T{1}, dk + kv_at, ldq);  // dK += scale dS^T Q
                }
            }
        }
    });
}

/// [batch, T, H, Dh] per query head -> [batch, T, Hkv, Dh]: the sum over each group of H / Hkv heads.
template <Real T>
Tensor<T> sum_groups(const Tensor<T>& per_head, std::size_t kv_heads) {
    const std::size_t nb = per_head.extent(0), nt = per_head.extent(1), nh = per_head.extent(2), dim = per_head.extent(3);
    if (kv_heads == nh) return per_head;
    const std::size_t group = nh / kv_heads;
    auto out = Tensor<T>::uninitialized({nb, nt, kv_heads, dim});
    const T* src = per_head.data();
    T* dst = out.data();
    backend::current().parallel_for(nb * nt, nh * dim, [&](std::size_t first, std::size_t last) {
        for (std::size_t row = first; row < last; ++row)
            for (std::size_t g = 0; g < kv_heads; ++g) {
                T* o = dst + (row * kv_heads + g) * dim;
                const T* s = src + (row * nh + g * group) * dim;
                std::copy_n(s, dim, o);
                for (std::size_t j = 1; j < group; ++j)
                    for (std::size_t i = 0; i < dim; ++i) o[i] += s[j * dim + i];
            }
    });
    return out;
}

/// A host tensor read by the traced program as a constant of type T.
template <Real T>
Tensor<T> traced_constant(const Tensor<T>& host) {
    return backend::trace::as_type<T>(backend::trace::as_float(host));
}

/// The traced form, composed of traced ops with the scores materialised ([batch, Hkv, H/Hkv, T, T]):
/// the same function, not the blocked algorithm. Masked scores get -1e9 added (exp underflows to 0;
/// every row keeps its diagonal). Host resets are folded into the constant mask; traced resets
/// (a per-call input, read as 0/1 values) give document ids d = resets U (U[s, t] = 1 for s <= t,
/// a running count of starts) and the penalty -1e9 min(relu(d_t - d_s), 1) for keys of an earlier
/// document.
template <Real T>
Tensor<T> traced(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, double scale, std::size_t window, const Tensor<T>& resets) {
    const std::size_t nb = q.extent(0), nt = q.extent(1), nh = q.extent(2), dim = q.extent(3), nkv = k.extent(2), group = nh / nkv;
    constexpr double masked = -1e9;
    const bool host_resets = resets.defined() && !resets.traced();
    Tensor<T> mask, upper;
    {
        device_scope host(Device::host());  // the constants are built on the host, then captured
        const Dims d{host_resets ? nb : 1, nt, nh, nkv, dim, 1, 1, scale};
        const auto lowest = lowest_keys(d, window, host_resets ? resets : Tensor<T>());
        mask = Tensor<T>({d.batch, 1, 1, nt, nt});
        for (std::size_t b = 0; b < d.batch; ++b)
            for (std::size_t t = 0; t < nt; ++t)
                for (std::size_t s = 0; s < nt; ++s) mask.data()[(b * nt + t) * nt + s] = s >= lowest[b * nt + t] && s <= t ? T{0} : T(masked);
        if (resets.defined() && !host_resets) {
            upper = Tensor<T>({nt, nt});
            for (std::size_t s = 0; s < nt; ++s)
                for (std::size_t t = s; t < nt; ++t) upper.data()[s * nt + t] = T{1};
        }
    }
    // Query head h = g (H / Hkv) + j meets kv head g: the queries of a group become one [group T] block.
    const Tensor<T> qg = reshape(transpose(reshape(q, Shape{nb, nt, nkv, group, dim}), {0, 2, 3, 1, 4}), Shape{nb, nkv, group * nt, dim});
    const Tensor<T> kt = transpose(k, {0, 2, 3, 1});  // [B, Hkv, Dh, T]
    const Tensor<T> vh = transpose(v, {0, 2, 1, 3});  // [B, Hkv, T, Dh]
    Tensor<T> scores = add(reshape(olmax::scale(matmul(qg, kt), T(scale)), Shape{nb, nkv, group, nt, nt}), traced_constant(mask));
    if (upper.defined()) {
        const Tensor<T> doc = matmul(resets, traced_constant(upper));  // [B, T]: starts at or before t
        const Tensor<T> later = relu(sub(reshape(doc, Shape{nb, nt, 1}), reshape(doc, Shape{nb, 1, nt})));  // d_t - d_s where >= 0
        const Tensor<T> other_document = sub(later, relu(add_scalar(later, T{-1})));                         // min(., 1)
        scores = add(scores, reshape(olmax::scale(other_document, T(masked)), Shape{nb, 1, 1, nt, nt}));
    }
    const Tensor<T> p = reshape(softmax(scores, -1), Shape{nb, nkv, group * nt, nt});
    const Tensor<T> o = reshape(matmul(p, vh), Shape{nb, nkv, group, nt, dim});
    return reshape(transpose(o, {0, 3, 1, 2, 4}), Shape{nb, nt, nh, dim});
}

}  // namespace detail::attention_ops

/// Causal softmax attention of q [batch, T, H, Dh] over k, v [batch, T, Hkv, Dh] (Hkv divides H),
/// returning [batch, T, H, Dh]; see the top of this file for the masks and the algorithm.
/// Differentiable in q, k and v (the resets are not differentiated). On traced tensors it traces
/// the materialised form (detail::attention_ops::traced: the same function, T x T scores).
template <Real T>
Tensor<T> causal_attention(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const AttentionOptions<T>& options = {}) {
    constexpr std::string_view op = "causal_attention";
    backend::op_scope on(op, q, k, v, options.resets);
    check<value_error>(q.defined() && k.defined() && v.defined(), op, ": q, k and v must all be defined tensors");
    check<shape_error>(q.rank() == 4, op, ": q must be [batch, T, heads, head_dim], got shape ", to_string(q.shape()));
    const std::size_t nb = q.extent(0), nt = q.extent(1), nh = q.extent(2), dim = q.extent(3);
    check<value_error>(nb > 0 && nt > 0 && nh > 0 && dim > 0, op, ": q of shape ", to_string(q.shape()), " is empty");
    check<shape_error>(k.rank() == 4 && k.extent(0) == nb && k.extent(1) == nt && k.extent(3) == dim && k.extent(2) > 0 && nh % k.extent(2) == 0,
                       op, ": k of shape ", to_string(k.shape()), " must be [batch, T, kv_heads, head_dim] = [", nb, ", ", nt,
                       ", kv_heads, ", dim, "] with kv_heads dividing the ", nh, " query heads");
    const std::size_t nkv = k.extent(2);
    check<shape_error>(v.shape() == k.shape(), op, ": v of shape ", to_string(v.shape()), " must match k of shape ", to_string(k.shape()));
    if (options.resets.defined())
        check<shape_error>(options.resets.rank() == 2 && options.resets.extent(0) == nb && options.resets.extent(1) == nt, op,
                           ": resets of shape ", to_string(options.resets.shape()), " does not match [batch, T] = [", nb, ", ", nt, "]");
    const double scale = options.scale ? *options.scale : 1.0 / std::sqrt(double(dim));
    check<value_error>(std::isfinite(scale) && scale != 0, op, ": scale must be finite and nonzero, got ", scale);
    check<value_error>(options.query_tile > 0 && options.key_tile > 0, op, ": query_tile (", options.query_tile, ") and key_tile (",
                       options.key_tile, ") must be positive");
    if (on.traced()) return detail::attention_ops::traced(q, k, v, scale, options.window, options.resets);

    const detail::attention_ops::Dims d{nb, nt, nh, nkv, dim, std::min(options.query_tile, nt), std::min(options.key_tile, nt), scale};
    auto lowest = detail::attention_ops::lowest_keys(d, options.window, options.resets);
    auto out = Tensor<T>::uninitialized(q.shape());
    auto lse = Tensor<T>::uninitialized({nb, nh, nt});
    detail::attention_ops::forward(d, lowest.data(), q.data(), k.data(), v.data(), out.data(), lse.data());

    const std::vector<Tensor<T>> inputs{q, k, v};
    autodiff::record<T>(op, inputs, std::span<Tensor<T>>(&out, 1),
                        [d, lowest = std::move(lowest), q = q.detach(), k = k.detach(), v = v.detach(), o = out.detach(), lse](
                            std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                            if (!sink.needs(0) && !sink.needs(1) && !sink.needs(2)) return;
                            Tensor<T> dq(q.shape()), dk(q.shape()), dv(q.shape());  // zeros; dk, dv per query head
                            detail::attention_ops::backward(d, lowest.data(), q.data(), k.data(), v.data(), o.data(), lse.data(), g[0].data(),
                                                            dq.data(), dk.data(), dv.data());
                            sink.add(0, std::move(dq));
                            if (sink.needs(1)) sink.add(1, detail::attention_ops::sum_groups(dk, d.kv_heads));
                            if (sink.needs(2)) sink.add(2, detail::attention_ops::sum_groups(dv, d.kv_heads));
                        });
    return out;
}

}  // namespace olmax
