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
// Backward (exact): P = exp(scale q k^T - lse) is recomputed from q, k and lse; with D = rowsum(dO * O),
//     dV += P^T dO,   dP = dO V^T,   dS = P * (dP - D),   dQ += scale dS K,   dK += scale dS^T Q,
// in FlashAttention-2's loop order: for each key tile of a (batch, head), the query tiles that see
// it (from its diagonal to the last query whose window or document reaches it), its dK and dV
// summed in tile buffers and dQ in a buffer of the (batch, head). Memory beyond the inputs and
// their gradients: lse and, per thread, copies of one (batch, head)'s k (transposed) and v in the
// forward, of its scaled q, dO and dQ sums in the backward ([T, Dh] each), D, and tile scratch;
// with Hkv < H, dK and dV are first accumulated per query head ([batch, T, H, Dh], the size of q)
// and then summed over each group. The forward runs the (batch, head, query tile) items on the
// threads, the backward the (batch, head) items, as PyTorch's CPU flash-attention kernel does; each
// item sums in one order, so the results do not depend on the thread count.
//
// The tile products run on register blocks (backend::SmallGemm: a few rows by a few SIMD vectors of
// the result held in registers through the whole inner dimension, no packing), skipping the terms
// where a probability tile is zero above its diagonal. Under the bf16 precision policy
// (Kernels::float_gemms_in_bf16) the float products run on backend::small_gemm_bf16 instead
// (backend::SmallProducts), so their operands are rounded as every float GEMM's are.
//
// On traced tensors (a program traced for XLA, olmax/trace/) the op traces the same function
// composed of traced ops with the T x T scores materialised (detail::attention_ops::traced): a first
// step, with the memory of plain attention.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/backend/small_products.hpp"
#include "olmax/backend/trace_rules.hpp"
#include "olmax/core/device.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/core/traced.hpp"
#include "olmax/detail/simd.hpp"
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/linalg.hpp"
#include "olmax/ops/loss.hpp"
#include "olmax/ops/masks.hpp"
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
    /// Continuing a sequence from a KV cache kept with room to grow: only the first `keys` steps
    /// of k and v are keys (0: all of them). Inference only, like fewer queries than keys.
    std::size_t keys = 0;
};

namespace detail::attention_ops {

struct Dims {
    std::size_t batch, time, heads, kv_heads, dim, query_tile, key_tile;
    double scale;
    /// Queries per row: the last `queries` of the `time` positions (a continued sequence's new
    /// steps over its cached keys); `time` in a training call. Only the forward takes fewer.
    std::size_t queries = time;
    /// Steps per batch row in k's and v's buffers: `time`, or more in a KV cache with room to
    /// grow (the forward only, like `queries`).
    std::size_t key_rows = time;
    std::size_t offset() const { return time - queries; }
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

constexpr std::size_t round_up(std::size_t n, std::size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

/// The products of the forward and the backward: C = A B or C += A B (`accumulate`), B row-major [k x n]
/// with n a multiple of the SIMD width (the callers pad B and C to whole vectors), A row-major
/// [m x k] or, `a_transposed`, stored as A^T [k x m]; on backend::SmallGemm (register blocks, no
/// packing: at these sizes, k = head_dim or a tile, Eigen's blocked GEMM called per tile took a
/// sixth of the op's time repacking operands; the op's forward + backward ran ~1.4x as fast as on
/// Eigen, AMD EPYC Zen 5, Dh = 64), or on backend::small_gemm_bf16 under the bf16 precision policy
/// (which rounds the operands of every float GEMM; attention's products follow it as matmul's do).
template <Real T>
struct Products {
    static constexpr std::ptrdiff_t no_band = backend::SmallGemmBand::none;
    backend::SmallProducts<T> gemm;

    static Products in_force() { return {backend::SmallProducts<T>::in_force()}; }

    /// `band` (when not no_band): A is zero past a diagonal, A(r, p) = 0 for p > r + band (or,
    /// a_transposed, for p < r - band), and the steps where a block's rows of A are zero are skipped:
    /// the probability tiles on the diagonal are lower triangles.
    void operator()(bool a_transposed, std::size_t m, std::size_t n, std::size_t k, const T* a, std::size_t lda, const T* b, std::size_t ldb,
                    bool accumulate, T* c, std::size_t ldc, std::ptrdiff_t band = no_band) const {
        gemm(a_transposed, false, m, n, k, T{1}, a, lda, b, ldb, accumulate ? T{1} : T{0}, c, ldc,
             a_transposed ? backend::SmallGemmBand{band, backend::SmallGemmBand::none} : backend::SmallGemmBand{backend::SmallGemmBand::none, band});
    }
};

/// The element-wise steps on rows of a score tile, n columns (a multiple of lanes) of which [a, e)
/// are visible (a < e), on SIMD batches.
template <Real T, class Arch = xsimd::default_arch>
struct tile_rows {
    using batch = xsimd::batch<T, Arch>;
    static constexpr std::size_t lanes = batch::size;
    static constexpr T minus_infinity = -std::numeric_limits<T>::infinity();

    static T largest(const batch& x) {
        alignas(64) T v[lanes];
        x.store_aligned(v);
        return *std::max_element(v, v + lanes);
    }

    /// The forward's online softmax on one row: x holds the scores scale q.k on entry and the
    /// probabilities exp(x - m_new) on return (0 outside [a, e)); the running maximum m and sum l
    /// become the row's new ones. Returns exp(m_old - m_new), the factor of the row's output so far.
    static T online_softmax(T* x, std::size_t n, std::size_t a, std::size_t e, T& m, T& l) {
        std::fill(x, x + a, minus_infinity);
        std::fill(x + e, x + n, minus_infinity);
        batch top(minus_infinity);
        for (std::size_t j = 0; j < n; j += lanes) top = xsimd::max(top, batch::load_unaligned(x + j));
        const T m_new = std::max(m, largest(top));
        const batch shift(m_new);
        batch sum(T{0});
        for (std::size_t j = 0; j < n; j += lanes) {  // exp(-inf) = 0 at the masked columns
            const batch p = xsimd::exp(batch::load_unaligned(x + j) - shift);
            p.store_unaligned(x + j);
            sum += p;
        }
        const T correction = std::exp(m - m_new);  // 0 on the row's first visible tile
        l = l * correction + xsimd::hadd(sum);
        m = m_new;
        return correction;
    }

    /// The backward's probabilities: x holds scale q.k on entry, exp(x - lse) in [a, e) and 0 elsewhere on return.
    static void probabilities(T* x, std::size_t n, std::size_t a, std::size_t e, T lse) {
        const batch shift(lse);
        for (std::size_t j = 0; j < n; j += lanes) xsimd::exp(batch::load_unaligned(x + j) - shift).store_unaligned(x + j);
        std::fill(x, x + a, T{0});
        std::fill(x + e, x + n, T{0});
    }

    /// dp[j] = p[j] (dp[j] - d): dS from dP.
    static void score_gradient(T* dp, const T* p, std::size_t n, T d) {
        const batch shift(d);
        for (std::size_t j = 0; j < n; j += lanes)
            (batch::load_unaligned(p + j) * (batch::load_unaligned(dp + j) - shift)).store_unaligned(dp + j);
    }

    static void scale(T* x, std::size_t n, T factor) {
        const batch f(factor);
        for (std::size_t j = 0; j < n; j += lanes) (batch::load_unaligned(x + j) * f).store_unaligned(x + j);
    }
};

/// An uninitialised scratch buffer of n elements (each is written before it is read).
template <Real T>
std::unique_ptr<T[]> scratch(std::size_t n) {
    return std::make_unique_for_overwrite<T[]>(n);
}

/// A buffer of at least n elements that this thread keeps for its next call (`Slot` tells a caller's
/// buffers apart; each is written before it is read). The forward's copies of a (batch, kv head)'s
/// keys and values are O(T Dh) each, and allocated afresh on every call (a decoding step makes one
/// per layer) they cost more in page faults than in copying. A thread keeps the largest it has
/// needed.
template <Real T, int Slot>
T* kept_scratch(std::size_t n) {
    thread_local std::vector<T> buffer;
    if (buffer.size() < n) buffer.resize(n);
    return buffer.data();
}

/// A decoding step's query rows (a continued sequence with at most `decode_rows` new steps, outside
/// the bf16 policy): each row's scores, softmax and output straight from the rows of k and v where
/// they lie. The tile form copies every key of a (batch, kv head) (k transposed) before its
/// products, which a tile of many query rows repays but one row does not: at 4096 cached keys that
/// copy was most of a decoding step. Rows t0 + r of the (batch, head) whose keys start at k, v (key
/// s at s ldk); writes out's rows (ldq apart) and lse.
inline constexpr std::size_t decode_rows = 4;

template <Real T>
void forward_rows_from_cache(std::size_t rows, std::size_t t0, const std::size_t* lo, std::size_t dim, T scale, const T* q, std::size_t ldq,
                             const T* k, const T* v, std::size_t ldk, T* out, T* lse, std::size_t lse_stride) {
    using rows_of = tile_rows<T>;
    constexpr std::size_t lanes = rows_of::lanes;
    T* const acc = kept_scratch<T, 2>(dim);
    for (std::size_t r = 0; r < rows; ++r) {
        const std::size_t t = t0 + r, first = lo[t], n = t + 1 - first, np = round_up(n, lanes);
        T* const p = kept_scratch<T, 3>(np);
        const T* qr = q + r * ldq;
        for (std::size_t s = 0; s < n; ++s) {
            const T* kr = k + (first + s) * ldk;
            T dot{0};
#pragma omp simd reduction(+ : dot)
            for (std::size_t i = 0; i < dim; ++i) dot += qr[i] * kr[i];
            p[s] = scale * dot;
        }
        T m = rows_of::minus_infinity, l{0};
        rows_of::online_softmax(p, np, 0, n, m, l);  // p: exp(score - m), 0 past n
        std::fill_n(acc, dim, T{0});
        for (std::size_t s = 0; s < n; ++s) {
            const T* vr = v + (first + s) * ldk;
            const T w = p[s];
#pragma omp simd
            for (std::size_t i = 0; i < dim; ++i) acc[i] += w * vr[i];
        }
        T* o = out + r * ldq;
        const T inv = T{1} / l;
        for (std::size_t i = 0; i < dim; ++i) o[i] = acc[i] * inv;
        lse[r * lse_stride] = m + std::log(l);
    }
}

/// rows x dim values with row stride `stride` (times `factor`) -> rows x padded (the columns past
/// dim zero).
template <Real T>
void copy_rows(std::size_t rows, std::size_t dim, const T* from, std::size_t stride, T factor, T* to, std::size_t padded) {
    for (std::size_t r = 0; r < rows; ++r) {
        const T* f = from + r * stride;
        T* t = to + r * padded;
        for (std::size_t i = 0; i < dim; ++i) t[i] = f[i] * factor;
        std::fill(t + dim, t + padded, T{0});
    }
}

/// rows x dim values with row stride `stride` -> their transpose, dim rows with row stride `ld`,
/// columns rows .. padded of each zero.
template <Real T>
void transpose_rows(std::size_t rows, std::size_t dim, const T* from, std::size_t stride, T* to, std::size_t ld, std::size_t padded) {
    constexpr std::size_t step = 16;  // 16 source rows at a time stay in L1 whatever their stride
    for (std::size_t r0 = 0; r0 < rows; r0 += step) {
        const std::size_t r1 = std::min(rows, r0 + step);
        for (std::size_t i = 0; i < dim; ++i)
            for (std::size_t r = r0; r < r1; ++r) to[i * ld + r] = from[r * stride + i];
    }
    for (std::size_t i = 0; i < dim; ++i) std::fill(to + i * ld + rows, to + i * ld + padded, T{0});
}

/// out [batch, Tq, H, Dh] and lse [batch, H, Tq] from q [batch, Tq, H, Dh], k and v [batch, T, Hkv, Dh],
/// query row i at position d.offset() + i (Tq = d.queries; Tq = T in training).
/// Each thread copies the keys of its items' (batch, kv head): k transposed, [Dh, T] (the score
/// products read key columns as vectors), and v with contiguous rows padded to whole vectors.
template <Real T>
void forward(const Dims& d, const std::size_t* lowest, const T* q, const T* k, const T* v, T* out, T* lse) {
    using rows_of = tile_rows<T>;
    constexpr std::size_t lanes = rows_of::lanes;
    const std::size_t tiles = (d.queries + d.query_tile - 1) / d.query_tile, offset = d.offset(), group = d.heads / d.kv_heads;
    const std::size_t ldq = d.heads * d.dim, ldk = d.kv_heads * d.dim;
    const std::size_t dp = round_up(d.dim, lanes), tp = d.time + lanes, kc = round_up(d.key_tile, lanes);
    const backend::Kernels& kernels = backend::current();
    const Products<T> product = Products<T>::in_force();
    const T scale = T(d.scale);

    const std::size_t work = std::min(d.query_tile, d.queries) * std::min(d.time, d.key_tile * 2) * d.dim * 2;
    if (offset > 0 && d.queries <= decode_rows && !product.gemm.bf16) {  // a decoding step (see forward_rows_from_cache)
        kernels.parallel_for(d.batch * d.heads, d.queries * d.time * d.dim * 4, [&](std::size_t first, std::size_t last) {
            for (std::size_t item = first; item < last; ++item) {
                const std::size_t b = item / d.heads, h = item % d.heads, at = (b * d.key_rows * d.kv_heads + h / group) * d.dim;
                forward_rows_from_cache(d.queries, offset, lowest + b * d.time, d.dim, scale, q + (b * d.queries * d.heads + h) * d.dim, ldq,
                                        k + at, v + at, ldk, out + (b * d.queries * d.heads + h) * d.dim, lse + item * d.queries, 1);
            }
        });
        return;
    }
    kernels.parallel_for(d.batch * d.heads * tiles, work, [&](std::size_t first, std::size_t last) {
        // The keys of the current (batch, kv head), k transposed [Dh, tp] and v [T, dp]: copied once
        // per chunk of items (consecutive items share them), up to the last key its items reach.
        T* const kt = kept_scratch<T, 0>(d.dim * tp);
        T* const vr = kept_scratch<T, 1>(d.time * dp);
        std::size_t packed = std::numeric_limits<std::size_t>::max();
        const auto qs = scratch<T>(d.query_tile * dp), scores = scratch<T>(d.query_tile * kc), acc = scratch<T>(d.query_tile * dp);
        std::vector<T> row_max(d.query_tile), row_sum(d.query_tile);
        for (std::size_t item = first; item < last; ++item) {
            const std::size_t b = item / (d.heads * tiles), h = item / tiles % d.heads, g = h / group;
            // Query rows [i0, i0 + rows) of q, at positions [t0, t1).
            const std::size_t i0 = item % tiles * d.query_tile, rows = std::min(d.queries, i0 + d.query_tile) - i0;
            const std::size_t t0 = offset + i0, t1 = t0 + rows;
            const std::size_t* lo = lowest + b * d.time;
            if (b * d.kv_heads + g != packed) {
                packed = b * d.kv_heads + g;
                std::size_t reach = t1;  // the items of this chunk that read these keys follow this one
                for (std::size_t next = item + 1; next < last && next / (d.heads * tiles) == b && next / tiles % d.heads / group == g; ++next)
                    reach = std::max(reach, offset + std::min(d.queries, next % tiles * d.query_tile + d.query_tile));
                const std::size_t at = (b * d.key_rows * d.kv_heads + g) * d.dim;
                transpose_rows(reach, d.dim, k + at, ldk, kt, tp, std::min(tp, reach + lanes));
                copy_rows(reach, d.dim, v + at, ldk, T{1}, vr, dp);
            }
            copy_rows(rows, d.dim, q + ((b * d.queries + i0) * d.heads + h) * d.dim, ldq, scale, qs.get(), dp);  // scale q
            std::fill_n(acc.get(), rows * dp, T{0});
            std::fill_n(row_max.begin(), rows, rows_of::minus_infinity);
            std::fill_n(row_sum.begin(), rows, T{0});
            for (std::size_t s0 = lo[t0]; s0 < t1; s0 += d.key_tile) {
                const std::size_t s1 = std::min(t1, s0 + d.key_tile), cols = s1 - s0, nc = round_up(cols, lanes);
                product(false, rows, nc, d.dim, qs.get(), dp, kt + s0, tp, false, scores.get(), nc);  // scale q k^T
                // Every row sees every key of the tile: no row's interval needs cutting.
                const bool whole = s0 >= lo[t1 - 1] && s1 <= t0 + 1;
                for (std::size_t r = 0; r < rows; ++r) {
                    const std::size_t t = t0 + r;
                    T* srow = scores.get() + r * nc;
                    // Keys [a, e) of this tile are visible to row t; the others get probability 0.
                    const auto [a, e] = whole ? std::pair<std::size_t, std::size_t>{0, cols} : visible_in_tile(lo[t], t, s0, s1);
                    if (a >= e) {
                        std::fill_n(srow, nc, T{0});
                        continue;
                    }
                    const T correction = rows_of::online_softmax(srow, nc, a, e, row_max[r], row_sum[r]);
                    if (correction != T{1}) rows_of::scale(acc.get() + r * dp, dp, correction);
                }
                // += P v; P[r][c] = 0 for key s0 + c > query t0 + r
                product(false, rows, dp, cols, scores.get(), nc, vr + s0 * dp, dp, true, acc.get(), dp, std::ptrdiff_t(t0) - std::ptrdiff_t(s0));
            }
            for (std::size_t r = 0; r < rows; ++r) {
                const T inv = T{1} / row_sum[r];
                T* orow = out + ((b * d.queries + i0 + r) * d.heads + h) * d.dim;
                const T* ar = acc.get() + r * dp;
                for (std::size_t i = 0; i < d.dim; ++i) orow[i] = ar[i] * inv;
                lse[(b * d.heads + h) * d.queries + i0 + r] = row_max[r] + std::log(row_sum[r]);
            }
        }
    });
}

/// dq [batch, T, H, Dh] and dk, dv per query head [batch, T, H, Dh] from the forward's inputs, out,
/// lse and dout; every element of them is written. FlashAttention-2's loop order: for each key tile
/// (its k, k^T and v^T copied once), the query tiles that see it, their dK and dV summed in
/// tile-sized buffers and dQ in a buffer of the (batch, head) item. Each (batch, head) item is one
/// thread's, so the sums run in the same order with any number of threads.
template <Real T>
void backward(const Dims& d, const std::size_t* lowest, const T* q, const T* k, const T* v, const T* out, const T* lse, const T* dout,
              T* dq, T* dk, T* dv) {
    using rows_of = tile_rows<T>;
    constexpr std::size_t lanes = rows_of::lanes;
    const std::size_t group = d.heads / d.kv_heads, ldq = d.heads * d.dim, ldk = d.kv_heads * d.dim;
    const std::size_t dp = round_up(d.dim, lanes), kc = round_up(d.key_tile, lanes);
    const std::size_t work = d.time * std::min(d.time, d.key_tile * 2) * d.dim * 5;
    const backend::Kernels& kernels = backend::current();
    const Products<T> product = Products<T>::in_force();
    const T scale = T(d.scale);
    kernels.parallel_for(d.batch * d.heads, work, [&](std::size_t first, std::size_t last) {
        // Per item: scale q, dout (rows padded to whole vectors), the dq sums, D = rowsum(dO * O).
        const auto qs = scratch<T>(d.time * dp), dos = scratch<T>(d.time * dp), dqs = scratch<T>(d.time * dp);
        const auto dsum = scratch<T>(d.time);
        // Per key tile: k^T, v^T, k and the dk, dv sums; per query tile: P and dP, then dS.
        const auto kt = scratch<T>(d.dim * kc), vt = scratch<T>(d.dim * kc), kr = scratch<T>(d.key_tile * dp);
        const auto dks = scratch<T>(d.key_tile * dp), dvs = scratch<T>(d.key_tile * dp);
        const auto p = scratch<T>(d.query_tile * kc), ds = scratch<T>(d.query_tile * kc);
        for (std::size_t item = first; item < last; ++item) {
            const std::size_t b = item / d.heads, h = item % d.heads, g = h / group;
            const std::size_t* lo = lowest + b * d.time;
            const std::size_t q_at = (b * d.time * d.heads + h) * d.dim, kv_at = (b * d.time * d.kv_heads + g) * d.dim;
            const T* lse_row = lse + (b * d.heads + h) * d.time;
            copy_rows(d.time, d.dim, q + q_at, ldq, scale, qs.get(), dp);
            copy_rows(d.time, d.dim, dout + q_at, ldq, T{1}, dos.get(), dp);
            std::fill_n(dqs.get(), d.time * dp, T{0});
            for (std::size_t t = 0; t < d.time; ++t) {
                const T *o = out + q_at + t * ldq, *dor = dout + q_at + t * ldq;
                T s{0};
#pragma omp simd reduction(+ : s)
                for (std::size_t i = 0; i < d.dim; ++i) s += o[i] * dor[i];
                dsum[t] = s;
            }
            for (std::size_t s0 = 0; s0 < d.time; s0 += d.key_tile) {
                const std::size_t s1 = std::min(d.time, s0 + d.key_tile), cols = s1 - s0, nc = round_up(cols, lanes);
                transpose_rows(cols, d.dim, k + kv_at + s0 * ldk, ldk, kt.get(), nc, nc);
                transpose_rows(cols, d.dim, v + kv_at + s0 * ldk, ldk, vt.get(), nc, nc);
                copy_rows(cols, d.dim, k + kv_at + s0 * ldk, ldk, T{1}, kr.get(), dp);
                std::fill_n(dks.get(), cols * dp, T{0});
                std::fill_n(dvs.get(), cols * dp, T{0});
                // The queries that see a key of [s0, s1): t >= s0 with lo(t) < s1 (lo is non-decreasing).
                const std::size_t t_end = std::size_t(std::upper_bound(lo + s0, lo + d.time, s1 - 1) - lo);
                for (std::size_t t0 = s0; t0 < t_end; t0 += d.query_tile) {
                    const std::size_t t1 = std::min(t_end, t0 + d.query_tile), rows = t1 - t0;
                    // Only the keys [f, u) of the tile can be visible to these rows (lo(t0) <= lo(t), t < t1):
                    // the products skip the columns outside, f rounded down to a whole vector.
                    const std::size_t u = std::min(cols, t1 - s0), f = (lo[t0] > s0 ? std::min(lo[t0] - s0, u - 1) : 0) / lanes * lanes;
                    const std::size_t width = u - f, nw = round_up(width, lanes);
                    const T *qt = qs.get() + t0 * dp, *dot = dos.get() + t0 * dp;
                    T *pf = p.get() + f, *dsf = ds.get() + f;
                    product(false, rows, nw, d.dim, qt, dp, kt.get() + f, nc, false, pf, nc);  // scale q k^T
                    const bool whole = lo[t1 - 1] <= s0 && s1 <= t0 + 1;
                    for (std::size_t r = 0; r < rows; ++r) {
                        const std::size_t t = t0 + r;
                        const auto [a, e] = whole ? std::pair<std::size_t, std::size_t>{0, cols} : visible_in_tile(lo[t], t, s0, s1);
                        rows_of::probabilities(pf + r * nc, nw, std::max(a, f) - f, std::max(e, f) - f, lse_row[t]);
                    }
                    product(false, rows, nw, d.dim, dot, dp, vt.get() + f, nc, false, dsf, nc);  // dP = dO v^T
                    for (std::size_t r = 0; r < rows; ++r) rows_of::score_gradient(dsf + r * nc, pf + r * nc, nw, dsum[t0 + r]);
                    // P and dS vanish where key s0 + f + c > query t0 + r.
                    const std::ptrdiff_t band = std::ptrdiff_t(t0) - std::ptrdiff_t(s0 + f);
                    product(true, width, dp, rows, pf, nc, dot, dp, true, dvs.get() + f * dp, dp, band);                    // dV += P^T dO
                    product(true, width, dp, rows, dsf, nc, qt, dp, true, dks.get() + f * dp, dp, band);                    // dK += dS^T (scale q)
                    product(false, rows, dp, width, dsf, nc, kr.get() + f * dp, dp, true, dqs.get() + t0 * dp, dp, band);  // dQ/scale += dS k
                }
                for (std::size_t s = s0; s < s1; ++s) {
                    const std::size_t at = ((b * d.time + s) * d.heads + h) * d.dim;
                    std::copy_n(dks.get() + (s - s0) * dp, d.dim, dk + at);
                    std::copy_n(dvs.get() + (s - s0) * dp, d.dim, dv + at);
                }
            }
            for (std::size_t t = 0; t < d.time; ++t)
                for (std::size_t i = 0; i < d.dim; ++i) dq[q_at + t * ldq + i] = scale * dqs[t * dp + i];
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

/// The traced form, composed of traced ops with the scores materialised ([batch, Hkv, H/Hkv, T, T]):
/// the same function, not the blocked algorithm. Masked scores get -1e9 added (exp underflows to 0;
/// every row keeps its diagonal): future keys and keys outside the window by masks::hidden_keys,
/// and keys of earlier documents by document ids d (masks::document_ids: a running count of the
/// starts; resets read as 0/1 flags by masks::start_flags, any nonzero a start, host ones captured
/// as constants, traced ones a per-call input) and the penalty -1e9 min(relu(d_t - d_s), 1). Both
/// masks are computed in the program, whose constants stay O(T).
template <Real T>
Tensor<T> traced(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, double scale, std::size_t window, const Tensor<T>& resets) {
    const std::size_t nb = q.extent(0), nt = q.extent(1), nh = q.extent(2), dim = q.extent(3), nkv = k.extent(2), group = nh / nkv;
    constexpr double masked = -1e9;
    // Query head h = g (H / Hkv) + j meets kv head g: the queries of a group become one [group T] block.
    const Tensor<T> qg = reshape(transpose(reshape(q, Shape{nb, nt, nkv, group, dim}), {0, 2, 3, 1, 4}), Shape{nb, nkv, group * nt, dim});
    const Tensor<T> kt = transpose(k, {0, 2, 3, 1});  // [B, Hkv, Dh, T]
    const Tensor<T> vh = transpose(v, {0, 2, 1, 3});  // [B, Hkv, T, Dh]
    Tensor<T> scores = add(reshape(olmax::scale(matmul(qg, kt), T(scale)), Shape{nb, nkv, group, nt, nt}),
                           reshape(olmax::scale(masks::hidden_keys<T>(nt, window), T(masked)), Shape{1, 1, 1, nt, nt}));
    if (resets.defined()) {
        // in the program also for host resets: computed on the host, the [batch, T, T] mask would become a constant
        const Tensor<T> other_document = masks::earlier_document(masks::document_ids(masks::start_flags(resets)));
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
///
/// A continued sequence (decoding with cached keys): q may hold fewer steps than k and v,
/// [batch, Tq, H, Dh] with Tq < T, the last Tq of the T positions (query i at position T - Tq + i;
/// resets, when given, are [batch, T], the keys' positions). Its rows are those of the call on all
/// T queries. k and v may hold more steps than T, a KV cache with room to grow: options.keys = T
/// says how many are keys. That form is for inference: it is refused where a gradient would be
/// recorded and in a traced program.
template <Real T>
Tensor<T> causal_attention(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const AttentionOptions<T>& options = {}) {
    constexpr std::string_view op = "causal_attention";
    backend::op_scope on(op, q, k, v, options.resets);
    check<value_error>(q.defined() && k.defined() && v.defined(), op, ": q, k and v must all be defined tensors");
    check<shape_error>(q.rank() == 4, op, ": q must be [batch, T, heads, head_dim], got shape ", to_string(q.shape()));
    const std::size_t nb = q.extent(0), nq = q.extent(1), nh = q.extent(2), dim = q.extent(3);
    check<value_error>(nb > 0 && nq > 0 && nh > 0 && dim > 0, op, ": q of shape ", to_string(q.shape()), " is empty");
    check<shape_error>(k.rank() == 4 && k.extent(0) == nb && k.extent(1) >= nq && k.extent(3) == dim && k.extent(2) > 0 && nh % k.extent(2) == 0,
                       op, ": k of shape ", to_string(k.shape()), " must be [batch, T, kv_heads, head_dim] = [", nb, ", ", nq,
                       ", kv_heads, ", dim, "] with kv_heads dividing the ", nh,
                       " query heads (or, continuing a sequence, hold at least q's ", nq, " steps)");
    const std::size_t nkv = k.extent(2), nt = options.keys ? options.keys : k.extent(1);
    check<shape_error>(v.shape() == k.shape(), op, ": v of shape ", to_string(v.shape()), " must match k of shape ", to_string(k.shape()));
    check<shape_error>(nt >= nq && nt <= k.extent(1), op, ": keys = ", options.keys, " must be at least q's ", nq, " steps and at most the ",
                       k.extent(1), " steps k and v hold");
    if (options.resets.defined())
        check<shape_error>(options.resets.rank() == 2 && options.resets.extent(0) == nb && options.resets.extent(1) == nt, op,
                           ": resets of shape ", to_string(options.resets.shape()), " does not match [batch, T] = [", nb, ", ", nt, "]");
    const double scale = options.scale ? *options.scale : 1.0 / std::sqrt(double(dim));
    check<value_error>(std::isfinite(scale) && scale != 0, op, ": scale must be finite and nonzero, got ", scale);
    check<value_error>(options.query_tile > 0 && options.key_tile > 0, op, ": query_tile (", options.query_tile, ") and key_tile (",
                       options.key_tile, ") must be positive");
    const bool continued = nq < nt || nt < k.extent(1);
    return on.run_composed([&] {
        if (continued)
            throw trace_error(olmax::detail::concat(op, ": q of ", nq, " steps over ", nt,
                                                    " keys (a continued sequence) has no traced form; trace the whole sequence"));
        return detail::attention_ops::traced(q, k, v, scale, options.window, options.resets);
    }, [&] {
        const Tensor<T> inputs[3] = {q, k, v};
        check<value_error>(!continued || !autodiff::should_record<T>(inputs), op,
                           ": q of ", nq, " steps over ", nt, " keys (a continued sequence) is for inference and has no gradient; "
                           "run it under autodiff::no_grad or pass all T queries");
        detail::attention_ops::Dims d{nb, nt, nh, nkv, dim, std::min(options.query_tile, nq), std::min(options.key_tile, nt), scale};
        d.queries = nq;
        d.key_rows = k.extent(1);
        auto lowest = detail::attention_ops::lowest_keys(d, options.window, options.resets);
        auto out = Tensor<T>::uninitialized(q.shape());
        auto lse = Tensor<T>::uninitialized({nb, nh, nq});
        detail::attention_ops::forward(d, lowest.data(), q.data(), k.data(), v.data(), out.data(), lse.data());
        if (continued) return out;

        autodiff::record<T>(op, inputs, std::span<Tensor<T>>(&out, 1),
                            [d, lowest = std::move(lowest), q = q.detach(), k = k.detach(), v = v.detach(), o = out.detach(), lse](
                                std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                                if (!sink.needs(0) && !sink.needs(1) && !sink.needs(2)) return;
                                // Every element is written; dk, dv per query head.
                                auto dq = Tensor<T>::uninitialized(q.shape()), dk = Tensor<T>::uninitialized(q.shape()),
                                     dv = Tensor<T>::uninitialized(q.shape());
                                detail::attention_ops::backward(d, lowest.data(), q.data(), k.data(), v.data(), o.data(), lse.data(), g[0].data(),
                                                                dq.data(), dk.data(), dv.data());
                                sink.add(0, std::move(dq));
                                if (sink.needs(1)) sink.add(1, detail::attention_ops::sum_groups(dk, d.kv_heads));
                                if (sink.needs(2)) sink.add(2, detail::attention_ops::sum_groups(dv, d.kv_heads));
                            });
        return out;
    });
}

}  // namespace olmax
