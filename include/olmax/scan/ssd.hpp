#pragma once
// The state-space dual (SSD) layer of Mamba-2 (Dao & Gu 2024, "Transformers are SSMs: Generalized
// Models and Efficient Algorithms Through Structured State Space Duality", arXiv:2405.21060,
// Section 6 and Listing 1; the chunked reference is `ssd_minimal_discrete` in state-spaces/mamba's
// ssd_minimal.py) as one differentiable op with its own exact, linear-memory backward.
//
// Shapes: x [batch, T, H, P] (H heads of P channels), dt [batch, T, H] (step sizes, positive: the
// layer applies softplus), A [H] (one scalar decay rate per head, negative), B, C [batch, T, G, N]
// (G groups, each shared by H / G consecutive heads: head h reads group h / (H / G)), D [H] (skip,
// optional), state h [batch, H, P, N]. Per batch row and head, with B_t, C_t those of its group:
//
//     h_t = exp(dt_t A) h_{t-1} + (dt_t x_t) B_t^T          (h_t in R^{P x N})
//     y_t = h_t C_t + D x_t,                                 h_{-1} = h0 (zeros when not given)
//
// Chunked forward (the SSD algorithm). Time is cut into chunks of Q steps (the last may be
// shorter: T need not be a multiple of Q). Inside a chunk of L <= Q steps, with X_i = dt_i x_i
// (the "discrete" input), a_i = dt_i A and the chunk-local cumulative sums cum_i = sum_{s <= i} a_s:
//
//     Lambda[i, j] = exp(cum_i - cum_j)   for j <= i, else 0      (the decay mask; exponent <= 0)
//     Y     = ((C B^T) o Lambda) X                                (intra-chunk: two small GEMMs)
//           + diag(w) C S^T,     w_i = exp(cum_i)                 (the state S entering the chunk)
//           + D x
//     S'    = delta S + X^T diag(v) B,   v_l = exp(cum_{L-1} - cum_l),  delta = exp(cum_{L-1})
//
// and S' enters the next chunk (the inter-chunk pass runs chunk by chunk, which is the sequential
// form of the paper's (c+1) x (c+1) "decay_chunk" matrix). The cumulative sums are in double and
// every exponential is of a sum of dt A over a span, <= 0 for A <= 0, so none overflows (nothing is
// a ratio exp(cum_i) / exp(cum_j)). Costs per head and chunk:
// 2 L^2 N + 2 L^2 P (intra), 2 L N P (output from the state), 2 L P N (state update).
//
// Backward, in two passes. The first, per (batch, head) from the last chunk to the first, carries
// dS (the gradient of the state leaving a chunk; dh_last for the last one) back through every
// chunk, dS_in = delta dS + dY^T diag(w) C, and keeps the dS of each chunk (as many elements as
// the checkpoints). Given its S and dS, every chunk's gradients are then its own: the second pass
// runs over (batch, group, chunk), in parallel. The chunk's M = (C B^T) o Lambda, X and cum are
// recomputed from its inputs and the state S entering it (the only thing the forward keeps: one
// P x N state per chunk, so memory is linear in T, B H P N T / Q for the checkpoints). With dY
// the gradient of the chunk's outputs:
//
//     dX     = M^T dY + diag(v) B dS^T                      dM  = dY X^T (lower triangle)
//     dC     = (dM o Lambda) B + diag(w) dY S               dB  = (dM o Lambda)^T C + diag(v) X dS
//     dS_in  = delta dS + dY^T diag(w) C                    (carried to the previous chunk)
//     dcum_i = sum_j R[i, j] - sum_j R[j, i] + w_i <dY_i, S C_i> + [i = L-1] (sum_l v_l <X_l, dS B_l> + delta <dS, S>)
//              - v_i <X_i, dS B_i>,                         R = dM o M
//     da_s   = sum_{i >= s} dcum_i,    ddt_s = A da_s + <x_s, dX_s>,   dA = sum dt_s da_s
//     dx_s   = dt_s dX_s + D dY_s,     dD = sum <dY_s, x_s>,           dh0 = dS_in of chunk 0
//
// All products above are small GEMMs (sizes Q, P, N of 64-256) on backend::small_gemm, the
// register-blocked kernel that runs on the calling thread without packing its operands; under the
// bf16 precision policy (a bf16_matmul_scope) on small_gemm_bf16, with their operands rounded to
// bfloat16 and fp32 sums, as every float GEMM's are there. The products with a triangular operand
// (M, dG) skip its zero triangle, and C B^T and dM, of which only the lower triangle is read, stop
// at the diagonal: that halves the intra-chunk work. C B^T is the same for the H / G heads of a
// group: the forward (parallel over (batch, head)) computes it once per (batch, group, chunk)
// before the heads run (a temporary of batch G T Q elements when H > G), the backward's second
// pass once per task. dB and dC are sums over the heads of a group: that pass adds each head's
// dG = dM o Lambda and diag(v) X dS, diag(w) dY S terms in head order, then runs the dG products
// once for the group, so the gradients do not depend on the thread count and the intra-chunk dB,
// dC products cost one head's, not H / G.
//
// Segments (packed documents): `resets[b, t] != 0` marks position t as the first of a new
// sequence: the carried state is zeroed before that step (h_t = dt_t x_t B_t^T), and no gradient
// flows back across it. In the chunked form an entry of Lambda, w, v or delta whose span crosses a
// reset is zero. With resets, h0 only reaches the first segment.
//
// Traced (XLA): on traced tensors the op runs `detail::ssd::composed`, the same chunked algorithm
// written with ordinary ops that each have a lowering rule (the paper's Listing 1 with T padded to
// a multiple of Q and the inter-chunk states from its (chunks + 1)^2 decay matrix); its gradient
// is the tape's through those ops. It materialises the [Q, Q] blocks, so its memory is O(T Q) per
// head rather than the eager op's checkpoints; it reads resets as 0/1 flags (any nonzero a start).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/backend/small_products.hpp"
#include "olmax/core/device.hpp"
#include "olmax/core/error.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/linalg.hpp"
#include "olmax/ops/masks.hpp"
#include "olmax/ops/shape.hpp"
#include "olmax/scan/detail/denormals.hpp"
#include "olmax/scan/detail/dot.hpp"

namespace olmax::scan {

/// Options of scan::ssd.
template <class T>
struct SsdOptions {
    /// Initial state h_{-1}, shape [batch, H, P, N]; undefined means zeros. Differentiable.
    Tensor<T> h0 = {};
    /// Segment starts, shape [batch, T]: nonzero where a new sequence begins (the carried state is
    /// zeroed before that step). Undefined means one sequence per row. Not differentiated.
    Tensor<T> resets = {};
    /// Chunk length Q of the SSD algorithm (>= 1; unset = 64). Also the checkpoint interval of the
    /// backward: the checkpoints take batch H P N ceil(T / Q) elements.
    std::optional<long> chunk = std::nullopt;
};

/// y [batch, T, H, P] and the state after the last step, h_last [batch, H, P, N].
template <class T>
struct SsdResult {
    Tensor<T> y;
    Tensor<T> h_last;
};

/// Sizes of an SSD on caller-owned buffers (ssd_forward / ssd_backward below). `chunk` (>= 1) is
/// the chunk length Q; the checkpoints hold ceil(time / min(chunk, time)) states per batch row and
/// head.
struct SsdSizes {
    std::size_t batch = 0, time = 0, heads = 0, head_dim = 0, groups = 0, state = 0, chunk = 64;
};

/// The operands as dense row-major buffers of the shapes at the top of this file; D, h0 and resets
/// may be null (no skip, zero initial state, one sequence per row).
template <class T>
struct SsdBuffers {
    const T *x = nullptr, *dt = nullptr, *A = nullptr, *B = nullptr, *C = nullptr, *D = nullptr, *h0 = nullptr, *resets = nullptr;
};

/// Where ssd_backward writes: dx, ddt, dB and dC always; dA, dD and dh0 when not null.
template <class T>
struct SsdGradients {
    T *dx = nullptr, *ddt = nullptr, *dA = nullptr, *dB = nullptr, *dC = nullptr, *dD = nullptr, *dh0 = nullptr;
};

namespace detail::ssd {

inline constexpr std::size_t default_chunk = 64;
inline constexpr std::string_view op_name = "scan::ssd";

struct Geometry {
    std::size_t batch = 0, time = 0, heads = 0, head_dim = 0, groups = 0, state = 0, chunk = default_chunk, chunks = 0;
    std::size_t heads_per_group() const { return heads / groups; }
    std::size_t tasks() const { return batch * heads; }
    std::size_t plane() const { return head_dim * state; }
};

template <class T>
using Buffers = SsdBuffers<T>;

inline Geometry geometry_of(const SsdSizes& s) {
    check<value_error>(s.batch > 0 && s.time > 0 && s.heads > 0 && s.head_dim > 0 && s.groups > 0 && s.state > 0 && s.chunk > 0,
                       op_name, ": sizes batch ", s.batch, ", T ", s.time, ", H ", s.heads, ", P ", s.head_dim, ", G ", s.groups, ", N ",
                       s.state, " and chunk ", s.chunk, " must all be positive");
    check<value_error>(s.heads % s.groups == 0, op_name, ": H = ", s.heads, " heads do not divide into G = ", s.groups, " groups");
    Geometry g;
    g.batch = s.batch;
    g.time = s.time;
    g.heads = s.heads;
    g.head_dim = s.head_dim;
    g.groups = s.groups;
    g.state = s.state;
    g.chunk = std::min(s.chunk, s.time);
    g.chunks = (g.time + g.chunk - 1) / g.chunk;
    return g;
}

template <class T>
Geometry make_geometry(const Tensor<T>& x, const Tensor<T>& dt, const Tensor<T>& A, const Tensor<T>& B, const Tensor<T>& C,
                       const Tensor<T>& D, const SsdOptions<T>& opt) {
    constexpr std::string_view op = op_name;
    check<value_error>(x.defined() && dt.defined() && A.defined() && B.defined() && C.defined(), op,
                       ": x, dt, A, B and C must be defined tensors");
    check<shape_error>(x.rank() == 4, op, ": x must have shape [batch, T, H, P], got ", to_string(x.shape()));
    Geometry g;
    g.batch = x.extent(0);
    g.time = x.extent(1);
    g.heads = x.extent(2);
    g.head_dim = x.extent(3);
    check<value_error>(g.time > 0, op, ": the sequence is empty (T = 0) in x of shape ", to_string(x.shape()));
    check<value_error>(g.batch > 0 && g.heads > 0 && g.head_dim > 0, op, ": x of shape ", to_string(x.shape()),
                       " is empty (batch, H or P is 0)");
    check<shape_error>(dt.rank() == 3 && dt.extent(0) == g.batch && dt.extent(1) == g.time && dt.extent(2) == g.heads, op, ": dt of shape ",
                       to_string(dt.shape()), " does not match [batch, T, H] = [", g.batch, ", ", g.time, ", ", g.heads, "] (from x of shape ",
                       to_string(x.shape()), ")");
    check<shape_error>(A.rank() == 1 && A.extent(0) == g.heads, op, ": A of shape ", to_string(A.shape()), " must be [H] = [", g.heads,
                       "] (one decay rate per head)");
    check<shape_error>(B.rank() == 4 && B.extent(0) == g.batch && B.extent(1) == g.time, op, ": B of shape ", to_string(B.shape()),
                       " must be [batch, T, G, N] with batch ", g.batch, " and T ", g.time, " (from x of shape ", to_string(x.shape()), ")");
    g.groups = B.extent(2);
    g.state = B.extent(3);
    check<value_error>(g.groups > 0 && g.state > 0, op, ": B of shape ", to_string(B.shape()), " is empty (G or N is 0)");
    check<shape_error>(g.heads % g.groups == 0, op, ": the H = ", g.heads, " heads of x ", to_string(x.shape()), " do not divide into the G = ",
                       g.groups, " groups of B ", to_string(B.shape()));
    check<shape_error>(C.shape() == B.shape(), op, ": C of shape ", to_string(C.shape()), " does not match B of shape ", to_string(B.shape()),
                       " (both [batch, T, G, N])");
    if (D.defined())
        check<shape_error>(D.rank() == 1 && D.extent(0) == g.heads, op, ": D of shape ", to_string(D.shape()), " must be [H] = [", g.heads, "]");
    if (opt.h0.defined())
        check<shape_error>(opt.h0.rank() == 4 && opt.h0.extent(0) == g.batch && opt.h0.extent(1) == g.heads &&
                               opt.h0.extent(2) == g.head_dim && opt.h0.extent(3) == g.state,
                           op, ": h0 of shape ", to_string(opt.h0.shape()), " does not match [batch, H, P, N] = [", g.batch, ", ", g.heads,
                           ", ", g.head_dim, ", ", g.state, "]");
    if (opt.resets.defined())
        check<shape_error>(opt.resets.rank() == 2 && opt.resets.extent(0) == g.batch && opt.resets.extent(1) == g.time, op,
                           ": resets of shape ", to_string(opt.resets.shape()), " does not match [batch, T] = [", g.batch, ", ", g.time, "]");
    if (opt.chunk) check<value_error>(*opt.chunk >= 1, op, ": chunk length must be >= 1, got ", *opt.chunk);
    return geometry_of({g.batch, g.time, g.heads, g.head_dim, g.groups, g.state, opt.chunk ? std::size_t(*opt.chunk) : default_chunk});
}

/// Per-task scratch: every buffer of one chunk, sized for Q = g.chunk.
template <class T>
struct Scratch {
    std::vector<double> cum;     // [Q] chunk-local cumulative sums of dt A
    std::vector<double> dcum;    // [Q]
    std::vector<long> last_reset;  // [Q] the last reset at or before i inside the chunk, -1 if none
    Storage<T> X, Xv, M, Lam, dM, dX, Z, T1, Cw, S, dS, CB, dG;
    backend::SmallProducts<T> gemm;  // the products, under the precision policy of the op's caller

    Scratch(const Geometry& g, bool backward, backend::SmallProducts<T> products)
        : cum(g.chunk), dcum(g.chunk), last_reset(g.chunk), gemm(products) {
        const std::size_t Q = g.chunk, P = g.head_dim, N = g.state;
        X.resize(Q * P);
        Xv.resize(Q * P);
        M.resize(Q * Q);
        Lam.resize(Q * Q);
        Cw.resize(Q * N);
        S.resize(P * N);
        if (backward) {
            dM.resize(Q * Q);
            dX.resize(Q * P);
            Z.resize(Q * P);
            T1.resize(Q * N);
            dS.resize(P * N);
            CB.resize(Q * Q);
            dG.resize(Q * Q);
        }
    }
};

/// Where one (batch, head) task and one chunk of it live in the buffers.
struct Chunk {
    std::size_t b, h, grp, t0, len;
    long first_reset;  // the first reset inside the chunk (len if none): w_i is nonzero for i < first_reset
    long end_reset;    // last_reset[len - 1]: v_l is nonzero for l >= max(end_reset, 0); delta is zero unless -1
};

using backend::lower_triangle;
using backend::upper_triangle;

/// The lower triangle (j <= i) of C B^T [L, L] for one chunk (C, B: [L, N] rows ld apart): about
/// half a full product. Entries above the diagonal are unspecified and must not be read.
template <class T>
void chunk_product(const backend::SmallProducts<T>& gemm, std::size_t L, std::size_t N, const T* Cc, const T* Bc, std::size_t ld, T* out) {
    gemm(false, true, L, L, N, T{1}, Cc, ld, Bc, ld, T{0}, out, L, backend::lower_c_only);
}

/// Where chunk c of group grp of batch row b keeps its C B^T in group_products' buffer.
inline std::size_t product_offset(const Geometry& g, std::size_t b, std::size_t grp, std::size_t c) {
    return ((b * g.groups + grp) * g.chunks + c) * g.chunk * g.chunk;
}

/// C B^T of every chunk of every (batch, group), [len, len] each at product_offset: shared by the
/// H / G heads of a group, so computed once for all of them (when H > G).
template <class T>
void group_products(const Geometry& g, const Buffers<T>& in, const backend::SmallProducts<T>& gemm, T* products) {
    const std::size_t N = g.state, GN = g.groups * N, T_ = g.time;
    backend::current().parallel_for(g.batch * g.groups * g.chunks, 2 * g.chunk * g.chunk * N, [&](std::size_t lo, std::size_t hi) {
        for (std::size_t i = lo; i < hi; ++i) {
            const std::size_t c = i % g.chunks, grp = (i / g.chunks) % g.groups, b = i / (g.chunks * g.groups);
            const std::size_t t0 = c * g.chunk, L = std::min(g.chunk, T_ - t0);
            const T* Cc = in.C + ((b * T_ + t0) * g.groups + grp) * N;
            const T* Bc = in.B + ((b * T_ + t0) * g.groups + grp) * N;
            chunk_product(gemm, L, N, Cc, Bc, GN, products + product_offset(g, b, grp, c));
        }
    });
}

/// The chunk's cumulative sums of dt A and its resets (all the backward's first pass reads).
template <class T>
Chunk chunk_decays(const Geometry& g, const Buffers<T>& in, std::size_t b, std::size_t h, std::size_t c, Scratch<T>& s) {
    const std::size_t H = g.heads, T_ = g.time;
    Chunk ch{b, h, h / g.heads_per_group(), c * g.chunk, std::min(g.chunk, T_ - c * g.chunk), 0, -1};
    const std::size_t L = ch.len;
    const double A = double(in.A[h]);
    double acc = 0;
    long last = -1;
    ch.first_reset = long(L);
    for (std::size_t i = 0; i < L; ++i) {
        const std::size_t t = ch.t0 + i;
        acc += double(in.dt[(b * T_ + t) * H + h]) * A;
        s.cum[i] = acc;
        if (in.resets && in.resets[b * T_ + t] != T{0}) {
            last = long(i);
            if (ch.first_reset == long(L)) ch.first_reset = long(i);
        }
        s.last_reset[i] = last;
    }
    ch.end_reset = last;
    return ch;
}

/// The chunk's decays and resets (chunk_decays), X = dt x (contiguous [len, P]), the decay mask
/// Lambda (lower triangle, zero elsewhere and across resets) and M = (C B^T) o Lambda (zero where
/// Lambda is), with the lower triangle of the chunk's C B^T ([len, len]) from `cb` or, when null,
/// computed here.
template <class T>
Chunk prepare_chunk(const Geometry& g, const Buffers<T>& in, const T* cb, std::size_t b, std::size_t h, std::size_t c, Scratch<T>& s) {
    const std::size_t H = g.heads, P = g.head_dim, N = g.state, GN = g.groups * N, T_ = g.time;
    const Chunk ch = chunk_decays(g, in, b, h, c, s);
    const std::size_t L = ch.len;
    for (std::size_t i = 0; i < L; ++i) {
        const std::size_t t = ch.t0 + i;
        const T dt = in.dt[(b * T_ + t) * H + h];
        const T* xr = in.x + ((b * T_ + t) * H + h) * P;
        T* Xr = s.X.data() + i * P;
#pragma omp simd
        for (std::size_t p = 0; p < P; ++p) Xr[p] = dt * xr[p];
    }
    // Lambda: row i holds exp(cum_i - cum_j) for max(last_reset_i, 0) <= j <= i, made row by row as
    // row i-1 times exp(a_i) (a_i = cum_i - cum_{i-1}): one exponential per row, not per entry. Each
    // entry is then a product of at most Q factors in (0, 1], within about Q rounding errors of the
    // exponential of its sum (in float no worse than exp of the sum rounded to float). Each row of
    // M = (C B^T) o Lambda is made with its row of Lambda, on the lower triangle (C B^T is not set
    // above it).
    T *lam = s.Lam.data(), *m = s.M.data();
    if (!cb) {
        const T* Cc = in.C + ((b * T_ + ch.t0) * g.groups + ch.grp) * N;
        const T* Bc = in.B + ((b * T_ + ch.t0) * g.groups + ch.grp) * N;
        chunk_product(s.gemm, L, N, Cc, Bc, GN, m);
        cb = m;  // read row by row below before each row of M is written
    }
    for (std::size_t i = 0; i < L; ++i) {
        T *row = lam + i * L, *mr = m + i * L;
        if (i == 0 || s.last_reset[i] == long(i)) std::fill_n(row, i, T{0});  // a reset at i: no term before it
        else {
            const T decay = T(std::exp(s.cum[i] - s.cum[i - 1]));
            const T* prev = row - L;
#pragma omp simd
            for (std::size_t j = 0; j < i; ++j) row[j] = prev[j] * decay;
        }
        row[i] = T{1};
        std::fill(row + i + 1, row + L, T{0});
        const T* cr = cb + i * L;
#pragma omp simd
        for (std::size_t j = 0; j <= i; ++j) mr[j] = cr[j] * row[j];
        std::fill(mr + i + 1, mr + L, T{0});
    }
    return ch;
}

/// Forward of one (batch, head): y, h_last and, when `ckpt`, the state entering every chunk
/// ([batch, H, chunks, P, N]).
template <class T>
void forward_task(const Geometry& g, const Buffers<T>& in, const T* products, std::size_t b, std::size_t h, T* y, T* h_last, T* ckpt,
                  Scratch<T>& s) {
    const std::size_t H = g.heads, P = g.head_dim, N = g.state, GN = g.groups * N, HP = H * P, PN = g.plane(), T_ = g.time;
    T* S = s.S.data();
    if (in.h0) std::copy_n(in.h0 + (b * H + h) * PN, PN, S);
    else std::fill_n(S, PN, T{0});
    const T Dh = in.D ? in.D[h] : T{0};
    for (std::size_t c = 0; c < g.chunks; ++c) {
        if (ckpt) std::copy_n(S, PN, ckpt + ((b * H + h) * g.chunks + c) * PN);
        const Chunk ch = prepare_chunk(g, in, products ? products + product_offset(g, b, h / g.heads_per_group(), c) : nullptr, b, h, c, s);
        const std::size_t L = ch.len;
        const T* Cc = in.C + ((b * T_ + ch.t0) * g.groups + ch.grp) * N;
        const T* Bc = in.B + ((b * T_ + ch.t0) * g.groups + ch.grp) * N;
        T* yc = y + ((b * T_ + ch.t0) * H + h) * P;
        // Intra-chunk: Y = M X.
        s.gemm(false, false, L, P, L, T{1}, s.M.data(), L, s.X.data(), P, T{0}, yc, HP, lower_triangle);
        // From the entering state: Y[i] += w_i C_i S^T for the rows before the chunk's first reset.
        const std::size_t nw = std::size_t(ch.first_reset);
        if (nw > 0) {
            const T w0 = T(std::exp(s.cum[0]));
            for (std::size_t i = 0; i < nw; ++i) {
                const T w = s.Lam[i * L] * w0;  // exp(cum_i): no reset before i < nw
                const T* cr = Cc + i * GN;
                T* dst = s.Cw.data() + i * N;
#pragma omp simd
                for (std::size_t n = 0; n < N; ++n) dst[n] = w * cr[n];
            }
            s.gemm(false, true, nw, P, N, T{1}, s.Cw.data(), N, S, N, T{1}, yc, HP);
        }
        if (in.D) {
            for (std::size_t i = 0; i < L; ++i) {
                const T* xr = in.x + ((b * T_ + ch.t0 + i) * H + h) * P;
                T* yr = yc + i * HP;
#pragma omp simd
                for (std::size_t p = 0; p < P; ++p) yr[p] += Dh * xr[p];
            }
        }
        // The state leaving the chunk: S' = delta S + X^T diag(v) B, v_l zero before the last reset.
        const std::size_t lo = std::size_t(std::max<long>(ch.end_reset, 0));
        const T delta = ch.end_reset < 0 ? T(std::exp(s.cum[L - 1])) : T{0};
        for (std::size_t l = lo; l < L; ++l) {
            const T v = s.Lam[(L - 1) * L + l];  // exp(cum_{L-1} - cum_l)
            const T* xr = s.X.data() + l * P;
            T* dst = s.Xv.data() + l * P;
#pragma omp simd
            for (std::size_t p = 0; p < P; ++p) dst[p] = v * xr[p];
        }
        s.gemm(true, false, P, N, L - lo, T{1}, s.Xv.data() + lo * P, P, Bc + lo * GN, GN, delta, S, N);
    }
    std::copy_n(S, PN, h_last + (b * H + h) * PN);
}

/// Where the backward writes. dB, dC: [batch, T, G, N] (each chunk's rows written by one task);
/// dA_part, dD_part [batch, H, chunks] in double (summed over batch and chunks afterwards, in
/// that order).
template <class T>
struct Outputs {
    T *dx, *ddt, *dB, *dC;
    double *dA_part, *dD_part;
};

/// The backward's first pass, one (batch, head), from the last chunk to the first: the gradient dS
/// of the state leaving every chunk ([batch, H, chunks, P, N] in `state_grads`; dh_last for the
/// last chunk), carried back as dS_in = delta dS + dY^T diag(w) C over the rows before the chunk's
/// first reset; dh0 (when not null) gets the carry out of chunk 0. The one sequential part of the
/// backward: one product per chunk.
template <class T>
void state_gradient_task(const Geometry& g, const Buffers<T>& in, const T* dy, const T* dh_last, std::size_t b, std::size_t h, T* state_grads,
                         T* dh0, Scratch<T>& s) {
    const std::size_t H = g.heads, P = g.head_dim, N = g.state, GN = g.groups * N, HP = H * P, PN = g.plane(), T_ = g.time;
    T* dS = s.dS.data();
    std::copy_n(dh_last + (b * H + h) * PN, PN, dS);
    for (std::size_t c = g.chunks; c-- > 0;) {
        std::copy_n(dS, PN, state_grads + ((b * H + h) * g.chunks + c) * PN);
        const Chunk ch = chunk_decays(g, in, b, h, c, s);
        const std::size_t L = ch.len, nw = std::size_t(ch.first_reset);
        const T delta = ch.end_reset < 0 ? T(std::exp(s.cum[L - 1])) : T{0};
        if (nw > 0) {
            const T* Cc = in.C + ((b * T_ + ch.t0) * g.groups + ch.grp) * N;
            for (std::size_t i = 0; i < nw; ++i) {
                const T w = T(std::exp(s.cum[i]));  // no reset before i < nw
                const T* cr = Cc + i * GN;
                T* cw = s.Cw.data() + i * N;
#pragma omp simd
                for (std::size_t n = 0; n < N; ++n) cw[n] = w * cr[n];
            }
            s.gemm(true, false, P, N, nw, T{1}, dy + ((b * T_ + ch.t0) * H + h) * P, HP, s.Cw.data(), N, delta, dS, N);
        } else {
            for (std::size_t i = 0; i < PN; ++i) dS[i] *= delta;
        }
    }
    if (dh0) std::copy_n(dS, PN, dh0 + (b * H + h) * PN);
}

/// The backward's second pass, one chunk of one (batch, group): every head of the group on it, in
/// head order, from the state entering the chunk (`ckpt`) and the gradient of the state leaving it
/// (`state_grads`). Writes the chunk's rows of dx, ddt, dB and dC and its dA and dD terms. The
/// heads' terms dG = dM o Lambda of dB and dC are summed first, so dC += (sum dG) B and
/// dB += (sum dG)^T C are two products per group, not per head.
template <class T>
void chunk_backward_task(const Geometry& g, const Buffers<T>& in, const T* dy, const T* ckpt, const T* state_grads, const Outputs<T>& out,
                         std::size_t b, std::size_t grp, std::size_t c, Scratch<T>& s) {
    const std::size_t H = g.heads, P = g.head_dim, N = g.state, GN = g.groups * N, HP = H * P, PN = g.plane(), T_ = g.time, hpg = g.heads_per_group();
    const std::size_t t0 = c * g.chunk, L = std::min(g.chunk, T_ - t0);
    const T* Cc = in.C + ((b * T_ + t0) * g.groups + grp) * N;
    const T* Bc = in.B + ((b * T_ + t0) * g.groups + grp) * N;
    T* dBc = out.dB + ((b * T_ + t0) * g.groups + grp) * N;
    T* dCc = out.dC + ((b * T_ + t0) * g.groups + grp) * N;
    for (std::size_t i = 0; i < L; ++i) {
        std::fill_n(dBc + i * GN, N, T{0});
        std::fill_n(dCc + i * GN, N, T{0});
    }
    if (hpg > 1) chunk_product(s.gemm, L, N, Cc, Bc, GN, s.CB.data());
    T* dG = s.dG.data();  // sum over the heads of dM o Lambda, lower triangle (zero above)
    std::fill_n(dG, L * L, T{0});
    double* dcum = s.dcum.data();
    for (std::size_t h = grp * hpg; h < (grp + 1) * hpg; ++h) {
        const Chunk ch = prepare_chunk(g, in, hpg > 1 ? s.CB.data() : nullptr, b, h, c, s);
        const std::size_t nw = std::size_t(ch.first_reset), lo = std::size_t(std::max<long>(ch.end_reset, 0));
        const T A = in.A[h], Dh = in.D ? in.D[h] : T{0};
        const T* S = ckpt + ((b * H + h) * g.chunks + c) * PN;         // the state entering the chunk
        const T* dS = state_grads + ((b * H + h) * g.chunks + c) * PN;  // the gradient of the state leaving it
        const T* dyc = dy + ((b * T_ + t0) * H + h) * P;
        std::fill_n(dcum, L, 0.0);

        // Intra-chunk: dX = M^T dY; dM = dY X^T; R = dM o M feeds dcum; dG += dM o Lambda.
        s.gemm(true, false, L, P, L, T{1}, s.M.data(), L, dyc, HP, T{0}, s.dX.data(), P, upper_triangle);
        // dM's lower triangle only: M is zero above it.
        s.gemm(false, true, L, L, P, T{1}, dyc, HP, s.X.data(), P, T{0}, s.dM.data(), L, backend::lower_c_only);
        {
            const T *dm = s.dM.data(), *m = s.M.data(), *lam = s.Lam.data();
            for (std::size_t i = 0; i < L; ++i) {
                const std::size_t j0 = std::size_t(std::max<long>(s.last_reset[i], 0));
                const T *dmr = dm + i * L, *mr = m + i * L, *lr = lam + i * L;
                T* dgr = dG + i * L;
                double row = 0;
                // The diagonal's R adds to and subtracts from dcum_i: no net term.
#pragma omp simd reduction(+ : row)
                for (std::size_t j = j0; j < i; ++j) {
                    const double r = double(dmr[j]) * double(mr[j]);
                    row += r;
                    dcum[j] -= r;
                }
                dcum[i] += row;
#pragma omp simd
                for (std::size_t j = 0; j <= i; ++j) dgr[j] += dmr[j] * lr[j];  // zero off the mask
            }
        }

        // The state leaving the chunk: S' = delta S + X^T diag(v) B.
        const T delta = ch.end_reset < 0 ? T(std::exp(s.cum[L - 1])) : T{0};
        if (delta != T{0}) dcum[L - 1] += double(delta) * double(dot(dS, S, PN));
        if (lo < L) {
            // Z = B dS^T: dv_l = <X_l, Z_l>, dX_l += v_l Z_l; dB_l += v_l X_l dS.
            s.gemm(false, true, L - lo, P, N, T{1}, Bc + lo * GN, GN, dS, N, T{0}, s.Z.data() + lo * P, P);
            for (std::size_t l = lo; l < L; ++l) {
                const T v = s.Lam[(L - 1) * L + l];  // exp(cum_{L-1} - cum_l)
                const T *zr = s.Z.data() + l * P, *xr = s.X.data() + l * P;
                const double dv = double(dot(xr, zr, P)) * double(v);
                dcum[L - 1] += dv;
                dcum[l] -= dv;
                T* dxr = s.dX.data() + l * P;
                T* xv = s.Xv.data() + l * P;
#pragma omp simd
                for (std::size_t p = 0; p < P; ++p) {
                    dxr[p] += v * zr[p];
                    xv[p] = v * xr[p];
                }
            }
            s.gemm(false, false, L - lo, N, P, T{1}, s.Xv.data() + lo * P, P, dS, N, T{1}, dBc + lo * GN, GN);
        }
        // The entering state's term Y[i] += w_i C_i S^T (rows before the first reset):
        // T1 = dY S, dw_i = <T1_i, C_i>, dC_i += w_i T1_i (dS_in is the first pass's).
        if (nw > 0) {
            s.gemm(false, false, nw, N, P, T{1}, dyc, HP, S, N, T{0}, s.T1.data(), N);
            const T w0 = T(std::exp(s.cum[0]));
            for (std::size_t i = 0; i < nw; ++i) {
                const T w = s.Lam[i * L] * w0;  // exp(cum_i): no reset before i < nw
                const T *t1 = s.T1.data() + i * N, *cr = Cc + i * GN;
                dcum[i] += double(w) * double(dot(t1, cr, N));
                T* dcr = dCc + i * GN;
#pragma omp simd
                for (std::size_t n = 0; n < N; ++n) dcr[n] += w * t1[n];
            }
        }

        // da_s = sum_{i >= s} dcum_i (zero at a reset: its decay multiplies a zeroed state), then
        // dt, x, A and D.
        double da = 0, dA = 0, dD = 0;
        for (std::size_t i = L; i-- > 0;) {
            da += dcum[i];
            const bool reset = s.last_reset[i] == long(i);
            const double da_i = reset ? 0.0 : da;
            const std::size_t t = t0 + i;
            const T dt = in.dt[(b * T_ + t) * H + h];
            const T *xr = in.x + ((b * T_ + t) * H + h) * P, *dyr = dyc + i * HP, *dxr = s.dX.data() + i * P;
            T* dx_out = out.dx + ((b * T_ + t) * H + h) * P;
#pragma omp simd
            for (std::size_t p = 0; p < P; ++p) dx_out[p] = dt * dxr[p] + Dh * dyr[p];
            out.ddt[(b * T_ + t) * H + h] = T(double(A) * da_i + double(dot(xr, dxr, P)));
            dA += double(dt) * da_i;
            if (in.D) dD += double(dot(dyr, xr, P));
        }
        out.dA_part[(b * H + h) * g.chunks + c] = dA;
        out.dD_part[(b * H + h) * g.chunks + c] = dD;
    }
    // dC = dG B and dB = dG^T C, summed over the group's heads, on the terms above.
    s.gemm(false, false, L, N, L, T{1}, dG, L, Bc, GN, T{1}, dCc, GN, lower_triangle);
    s.gemm(true, false, L, N, L, T{1}, dG, L, Cc, GN, T{1}, dBc, GN, upper_triangle);
}

/// The same SSD written with ordinary differentiable ops (the paper's Listing 1 on chunks of Q
/// steps, T padded to a multiple of Q with steps of dt = 0, which neither decay nor add to the
/// state): what the op runs on traced tensors, where each op has a lowering rule and the gradient
/// is the tape's. Inter-chunk states come from the (chunks + 1)^2 decay matrix of the paper
/// (its "decay_chunk"), with h0 as state 0. Materialises [Q, Q] per (batch, head, chunk) and
/// every intermediate, so its memory is O(T Q) per head (fine for a compiled program; the eager
/// op keeps only chunk states). Resets are read as 0/1 flags (masks::start_flags: any nonzero is a
/// start, as in the eager op); host ones become a constant of the program and its masks are
/// computed in it (computed on the host, they would be constants of batch T Q elements).
template <Real T>
SsdResult<T> composed(const Geometry& g, const Tensor<T>& x, const Tensor<T>& dt, const Tensor<T>& A, const Tensor<T>& B, const Tensor<T>& C,
                      const Tensor<T>& D, const Tensor<T>& h0, const Tensor<T>& resets_in) {
    const Tensor<T> resets = resets_in.defined() ? masks::start_flags(resets_in) : Tensor<T>();  // 0/1
    const std::size_t b = g.batch, T_ = g.time, H = g.heads, P = g.head_dim, G = g.groups, N = g.state, hpg = g.heads_per_group(),
                      Q = g.chunk, c = g.chunks, padding = c * Q - T_;
    auto padded = [&](const Tensor<T>& t) { return padding ? pad(t, 1, 0, padding) : t; };
    using masks::is_zero_count, masks::triangle, masks::Triangle;
    const Tensor<T> upper = triangle<T>(Q, Triangle::upper), causal = triangle<T>(Q, Triangle::lower);
    // Heads as [G, hpg] (head h = grp hpg + j), chunks as [c, Q]; matrices last.
    const Tensor<T> X = transpose(reshape(padded(mul(x, reshape(dt, Shape{b, T_, H, 1}))), Shape{b, c, Q, G, hpg, P}), {0, 3, 4, 1, 2, 5});
    const Tensor<T> a = transpose(reshape(padded(mul(dt, A)), Shape{b, c, Q, G, hpg}), {0, 3, 4, 1, 2});
    const Tensor<T> cum = matmul(a, upper);                               // [b, G, hpg, c, Q]
    const Tensor<T> cum_last = slice(cum, 4, Q - 1, Q);                   // [b, G, hpg, c, 1]
    auto groups_first = [&](const Tensor<T>& t) {                         // [b, T, G, N] -> [b, G, 1, c, Q, N]
        return reshape(transpose(reshape(padded(t), Shape{b, c, Q, G, N}), {0, 3, 1, 2, 4}), Shape{b, G, 1, c, Q, N});
    };
    const Tensor<T> Bg = groups_first(B), Cg = groups_first(C);
    // Reset masks (1 = no reset in the span): within-chunk cumulative counts of resets.
    Tensor<T> same, before, after, clear;  // [b,1,1,c,Q,Q], [b,1,1,c,Q] x 2, [b,1,1,c]
    if (resets.defined()) {
        const Tensor<T> count = matmul(reshape(padded(resets), Shape{b, c, Q}), upper);  // [b, c, Q]
        const Tensor<T> last = slice(count, 2, Q - 1, Q);                                // [b, c, 1]
        same = mul(is_zero_count(sub(reshape(count, Shape{b, c, Q, 1}), reshape(count, Shape{b, c, 1, Q}))), causal);
        same = reshape(same, Shape{b, 1, 1, c, Q, Q});
        before = reshape(is_zero_count(count), Shape{b, 1, 1, c, Q});
        after = reshape(is_zero_count(sub(last, count)), Shape{b, 1, 1, c, Q});
        clear = reshape(is_zero_count(last), Shape{b, 1, 1, c});
    }
    // Intra-chunk: Y = ((C B^T) o Lambda) X with Lambda = exp(cum_i - cum_j) on the mask.
    const Tensor<T> mask = resets.defined() ? same : causal;
    const Tensor<T> seg = sub(reshape(cum, Shape{b, G, hpg, c, Q, 1}), reshape(cum, Shape{b, G, hpg, c, 1, Q}));
    const Tensor<T> lambda = mul(olmax::exp(mul(seg, mask)), mask);  // the exponent is masked first: no exp of a positive
    Tensor<T> Y = matmul(mul(matmul(Cg, transpose(Bg)), lambda), X);  // [b, G, hpg, c, Q, P]
    // Chunk states: X^T diag(v) B, v_l = exp(cum_last - cum_l).
    Tensor<T> v = olmax::exp(sub(cum_last, cum));
    if (resets.defined()) v = mul(v, after);
    const Tensor<T> ones = [&] {
        device_scope on_host(Device::host());
        return Tensor<T>(Shape{1, 1, hpg, 1, 1, 1}, T{1});
    }();
    const Tensor<T> states = matmul(transpose(mul(X, reshape(v, Shape{b, G, hpg, c, Q, 1}))), mul(Bg, ones));  // [b, G, hpg, c, P, N]
    // Inter-chunk: S[i] = sum_{k <= i} W[i, k] s_k over s = [h0, states...], W[i, k] = prod_{k <= m < i} delta_m.
    Tensor<T> log_delta = reshape(cum_last, Shape{b, G, hpg, c});
    const Tensor<T> upper_c = triangle<T>(c + 1, Triangle::upper), causal_c = triangle<T>(c + 1, Triangle::lower);
    const Tensor<T> dcum = matmul(pad(log_delta, 3, 1, 0), upper_c);  // [b, G, hpg, c + 1]
    Tensor<T> chunk_mask = causal_c;
    if (resets.defined()) {
        const Tensor<T> blocked = matmul(pad(reshape(add_scalar(neg(clear), T{1}), Shape{b, c}), 1, 1, 0), upper_c);  // [b, c + 1]
        chunk_mask = reshape(mul(is_zero_count(sub(reshape(blocked, Shape{b, c + 1, 1}), reshape(blocked, Shape{b, 1, c + 1}))), causal_c),
                             Shape{b, 1, 1, c + 1, c + 1});
    }
    const Tensor<T> W = mul(olmax::exp(mul(sub(reshape(dcum, Shape{b, G, hpg, c + 1, 1}), reshape(dcum, Shape{b, G, hpg, 1, c + 1})), chunk_mask)),
                            chunk_mask);
    Tensor<T> stacked = pad(reshape(states, Shape{b, G, hpg, c, P * N}), 3, 1, 0);
    if (h0.defined()) stacked = add(stacked, pad(reshape(h0, Shape{b, G, hpg, 1, P * N}), 3, 0, c));
    const Tensor<T> S_all = matmul(W, stacked);  // [b, G, hpg, c + 1, P N]
    const Tensor<T> S_in = reshape(slice(S_all, 3, 0, c), Shape{b, G, hpg, c, P, N});
    const Tensor<T> h_last = reshape(slice(S_all, 3, c, c + 1), Shape{b, H, P, N});
    // From the entering state: Y += diag(w) C S^T, w_i = exp(cum_i).
    Tensor<T> w = olmax::exp(cum);
    if (resets.defined()) w = mul(w, before);
    Y = add(Y, matmul(mul(Cg, reshape(w, Shape{b, G, hpg, c, Q, 1})), transpose(S_in)));
    Tensor<T> y = reshape(transpose(Y, {0, 3, 4, 1, 2, 5}), Shape{b, c * Q, H, P});
    if (padding) y = slice(y, 1, 0, T_);
    if (D.defined()) y = add(y, mul(x, reshape(D, Shape{H, 1})));
    return {y, h_last};
}

/// Work estimate per (batch, head) task of the forward for parallel_for.
inline std::size_t task_work(const Geometry& g) {
    return g.time * (g.chunk * (g.head_dim + g.state) + 2 * g.head_dim * g.state) + 1;
}

}  // namespace detail::ssd

/// The op's forward on caller-owned buffers (the op below runs it): y [batch, T, H, P], h_last
/// [batch, H, P, N] and, when `checkpoints` is not null, the state entering every chunk
/// [batch, H, ceil(T / min(chunk, T)), P, N] for the backward. Parallel over (batch, head) on the
/// current backend, its products on backend::small_gemm (small_gemm_bf16 under the bf16 policy).
/// Throws value_error for a size of 0 or heads that do not divide into the groups; the buffers must
/// have the sizes' shapes.
template <Real T>
void ssd_forward(const SsdSizes& sizes, const SsdBuffers<T>& in, T* y, T* h_last, T* checkpoints) {
    namespace sd = detail::ssd;
    const sd::Geometry g = sd::geometry_of(sizes);
    const auto gemm = backend::SmallProducts<T>::in_force();
    Storage<T> products(g.heads_per_group() > 1 ? g.batch * g.groups * g.chunks * g.chunk * g.chunk : 0);
    if (products.size()) sd::group_products(g, in, gemm, products.data());
    const T* cb = products.size() ? products.data() : nullptr;
    backend::current().parallel_for(g.tasks(), sd::task_work(g), [&](std::size_t lo, std::size_t hi) {
        detail::denormal_guard guard;
        sd::Scratch<T> scratch(g, false, gemm);
        for (std::size_t task = lo; task < hi; ++task)
            sd::forward_task(g, in, cb, task / g.heads, task % g.heads, y, h_last, checkpoints, scratch);
    });
}

/// The op's exact backward on caller-owned buffers, from the forward's operands, its checkpoints
/// and the gradients dy [batch, T, H, P] and dh_last [batch, H, P, N] of its outputs. Two passes
/// (the top of this file): the state gradients per (batch, head), kept in a temporary as large as
/// the checkpoints, then every chunk's gradients, parallel over (batch, group, chunk). The sums over
/// batch and chunks (dA, dD) and over the heads of a group (dB, dC) run in a fixed order, so the
/// result does not depend on the thread count.
template <Real T>
void ssd_backward(const SsdSizes& sizes, const SsdBuffers<T>& in, const T* dy, const T* dh_last, const T* checkpoints,
                  const SsdGradients<T>& grads) {
    namespace sd = detail::ssd;
    const sd::Geometry g = sd::geometry_of(sizes);
    const auto gemm = backend::SmallProducts<T>::in_force();
    Storage<T> state_grads(g.tasks() * g.chunks * g.plane());
    Storage<double> dA_part(g.tasks() * g.chunks), dD_part(g.tasks() * g.chunks);
    backend::current().parallel_for(g.tasks(), g.chunks * 2 * g.chunk * g.plane() + 1, [&](std::size_t lo, std::size_t hi) {
        detail::denormal_guard guard;
        sd::Scratch<T> scratch(g, true, gemm);
        for (std::size_t task = lo; task < hi; ++task)
            sd::state_gradient_task(g, in, dy, dh_last, task / g.heads, task % g.heads, state_grads.data(), grads.dh0, scratch);
    });
    const sd::Outputs<T> out{grads.dx, grads.ddt, grads.dB, grads.dC, dA_part.data(), dD_part.data()};
    const std::size_t chunk_tasks = g.batch * g.groups * g.chunks;
    backend::current().parallel_for(chunk_tasks, 3 * g.heads_per_group() * sd::task_work(g) / g.chunks, [&](std::size_t lo, std::size_t hi) {
        detail::denormal_guard guard;
        sd::Scratch<T> scratch(g, true, gemm);
        for (std::size_t task = lo; task < hi; ++task) {
            const std::size_t c = task % g.chunks, grp = (task / g.chunks) % g.groups, b = task / (g.chunks * g.groups);
            sd::chunk_backward_task(g, in, dy, checkpoints, state_grads.data(), out, b, grp, c, scratch);
        }
    });
    for (std::size_t h = 0; h < g.heads; ++h) {  // dA, dD: sums over batch and chunks, in that order
        double a = 0, d = 0;
        for (std::size_t b = 0; b < g.batch; ++b)
            for (std::size_t c = 0; c < g.chunks; ++c) a += dA_part[(b * g.heads + h) * g.chunks + c], d += dD_part[(b * g.heads + h) * g.chunks + c];
        if (grads.dA) grads.dA[h] = T(a);
        if (grads.dD) grads.dD[h] = T(d);
    }
}

/// Mamba-2's SSD (see the top of this file): returns y [batch, T, H, P] and the final state
/// h_last [batch, H, P, N]. Differentiable in x, dt, A, B, C, D (undefined: no skip term) and
/// opt.h0; opt.resets marks segment starts; opt.chunk is the chunk length Q. Runs on the inputs'
/// device, parallel over (batch, head), its products on backend::small_gemm (small_gemm_bf16 under
/// the bf16 policy); on traced tensors as
/// ordinary ops (see the top of this file). Throws shape_error naming the mismatched shapes and
/// value_error for an empty extent or a chunk length < 1.
template <Real T>
SsdResult<T> ssd(const Tensor<T>& x, const Tensor<T>& dt, const Tensor<T>& A, const Tensor<T>& B, const Tensor<T>& C, const Tensor<T>& D = {},
                 const SsdOptions<T>& opt = {}) {
    namespace sd = detail::ssd;
    backend::op_scope on("scan::ssd", x, dt, A, B, C, D, opt.h0, opt.resets);
    const sd::Geometry g = sd::make_geometry(x, dt, A, B, C, D, opt);
    return on.run_composed([&] { return sd::composed(g, x, dt, A, B, C, D, opt.h0, opt.resets); },  // ordinary ops, each with its lowering rule
                           [&] {
        std::vector<Tensor<T>> inputs{x, dt, A, B, C, D, opt.h0};
        const bool recording = autodiff::should_record(std::span<const Tensor<T>>(inputs));
        const SsdSizes sizes{g.batch, g.time, g.heads, g.head_dim, g.groups, g.state, g.chunk};

        SsdResult<T> result{Tensor<T>::uninitialized(x.shape()), Tensor<T>::uninitialized({g.batch, g.heads, g.head_dim, g.state})};
        Tensor<T> ckpt = recording ? Tensor<T>::uninitialized({g.batch, g.heads, g.chunks, g.head_dim, g.state}) : Tensor<T>();
        const Tensor<T> resets = opt.resets.defined() ? opt.resets.detach() : Tensor<T>();
        auto buffers = [](const Tensor<T>& x, const Tensor<T>& dt, const Tensor<T>& A, const Tensor<T>& B, const Tensor<T>& C, const Tensor<T>& D,
                          const Tensor<T>& h0, const Tensor<T>& resets) {
            auto data = [](const Tensor<T>& t) { return t.defined() ? t.data() : static_cast<const T*>(nullptr); };
            return SsdBuffers<T>{x.data(), dt.data(), A.data(), B.data(), C.data(), data(D), data(h0), data(resets)};
        };
        ssd_forward(sizes, buffers(x, dt, A, B, C, D, opt.h0, resets), result.y.data(), result.h_last.data(), ckpt.defined() ? ckpt.data() : nullptr);
        if (!recording) return result;

        std::vector<Tensor<T>> outputs{result.y, result.h_last};
        autodiff::record<T>(
            "scan::ssd", inputs, outputs,
            [sizes, buffers, x = x.detach(), dt = dt.detach(), A = A.detach(), B = B.detach(), C = C.detach(),
             D = D.defined() ? D.detach() : Tensor<T>(), h0 = opt.h0.defined() ? opt.h0.detach() : Tensor<T>(), resets,
             ckpt](std::span<const Tensor<T>> grads, autodiff::GradientSink<T>& sink) {
                auto dx = Tensor<T>::uninitialized(x.shape()), ddt = Tensor<T>::uninitialized(dt.shape());
                auto dB = Tensor<T>::uninitialized(B.shape()), dC = Tensor<T>::uninitialized(C.shape());
                Tensor<T> dA = sink.needs(2) ? Tensor<T>::uninitialized(A.shape()) : Tensor<T>();
                Tensor<T> dD = D.defined() && sink.needs(5) ? Tensor<T>::uninitialized(D.shape()) : Tensor<T>();
                Tensor<T> dh0 = h0.defined() && sink.needs(6) ? Tensor<T>::uninitialized(h0.shape()) : Tensor<T>();
                auto data = [](Tensor<T>& t) { return t.defined() ? t.data() : static_cast<T*>(nullptr); };
                ssd_backward(sizes, buffers(x, dt, A, B, C, D, h0, resets), grads[0].data(), grads[1].data(), ckpt.data(),
                             SsdGradients<T>{dx.data(), ddt.data(), data(dA), dB.data(), dC.data(), data(dD), data(dh0)});
                sink.add(0, std::move(dx));
                sink.add(1, std::move(ddt));
                if (dA.defined()) sink.add(2, std::move(dA));
                sink.add(3, std::move(dB));
                sink.add(4, std::move(dC));
                if (dD.defined()) sink.add(5, std::move(dD));
                if (dh0.defined()) sink.add(6, std::move(dh0));
            });
        result.y = outputs[0];
        result.h_last = outputs[1];
        return result;
    });
}

}  // namespace olmax::scan
