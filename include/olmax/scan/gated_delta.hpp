#pragma once
// The gated delta rule (Yang, Kautz & Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with
// Delta Rule", ICLR 2025, arXiv:2412.06464) as one differentiable op with an exact, linear-memory
// backward.
//
// Shapes: q, k [batch, T, H, K]; v [batch, T, H, V]; g, beta [batch, T, H] (g the log decay, meant
// to be <= 0; beta the write strength, meant to be in (0, 1)); state S [batch, H, K, V]. Per batch
// row b and head h:
//
//     S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   S_{-1} = h0 (zeros when not given)
//     o_t = scale S_t^T q_t                                              (scale defaults to 1 / sqrt(K))
//
// The op neither normalises q and k nor applies any gate to o (nn::GatedDeltaNet does).
//
// Forward: the chunked WY / UT form (the WY representation of products of Householder-like
// matrices, Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule",
// arXiv:2406.06484, extended with the gate by Gated Delta Networks). Within a chunk of L <= C steps
// with incoming state S, gamma = cumsum(g) (chunk-local), Gamma_ij = exp(gamma_i - gamma_j) for
// i >= j, and Q, K, V the chunk's rows:
//
//     A     = strict_tril(diag(beta) K K^T . Gamma)                    (L x L)
//     W     = (I + A)^-1 diag(beta) (K . e^gamma)                      (L x K, forward substitution)
//     U     = (I + A)^-1 diag(beta) V                                  (L x V)
//     V_new = U - W S                                                  (the rows u_t below)
//     O     = scale [ (Q . e^gamma) S + tril(Q K^T . Gamma) V_new ]
//     S'    = e^{gamma_L} S + (K . e^{gamma_L - gamma})^T V_new
//
// Derivation: S_t = a_t S_{t-1} + k_t u_t^T with a_t = e^{g_t} and u_t = beta_t (v_t - a_t S_{t-1}^T k_t);
// unrolled inside the chunk, S_t = e^{gamma_t} S + sum_{j <= t} Gamma_tj k_j u_j^T, and substituting
// that into u_t gives (I + A) U_all = diag(beta) V - diag(beta)(K . e^gamma) S, i.e. U_all = V_new.
// The GEMMs run in single-threaded Eigen directly on the operands' rows (strided by H K or H V),
// the unit-lower solve in Eigen on a map of A; one task per (batch, head), parallel on the current
// backend.
//
// Segments (packed documents): resets[b, t] != 0 zeroes the state before step t (S_{t-1} := 0),
// so S_t = beta_t k_t v_t^T there, g_t has no effect and no gradient crosses that step; h0 only
// reaches the first segment. The forward splits a chunk at every reset (each piece runs the form
// above, a piece that starts at a reset with S = 0).
//
// Memory. Only the state entering every chunk is kept for the backward ([batch, H, ceil(T / C), K, V]),
// and only when the op is recorded. Backward (the per-step adjoint, not a chunked-GEMM one): the
// chunks are walked from last to first carrying dS; a chunk's states S_t are recomputed
// sequentially from its checkpoint into per-task scratch [C, K, V], then, with G = dS_t (the
// adjoint arriving from later steps plus scale q_t do_t^T), P = S_{t-1}, x = P^T k_t,
// r = v_t - a_t x and y = G^T k_t, the adjoint of one step is
//
//     dq_t    = scale S_t do_t
//     dbeta_t = y . r
//     dv_t    = beta_t y
//     dk_t    = beta_t G r - a_t beta_t P y                 (k_t appears in the write and in x)
//     dg_t    = a_t <G, P - beta_t k_t x^T>                 (a_t times the pre-decay state)
//     dS_{t-1} = a_t (G - beta_t k_t y^T)
//
// and at a reset step P = 0: dbeta_t = y . v_t, dk_t = beta_t G v_t, dg_t = 0, dS_{t-1} = 0.
// dh0 is the carried dS after step 0. Memory is linear in T: the checkpoints B H K V T / C plus
// C K V scratch per task. The recomputed states come from the sequential recurrence, the
// forward's from the chunked form: they agree to rounding, not bit for bit.
//
// Traced (a program traced for XLA, olmax/trace/): the same chunked form composed of traced ops
// (detail::gated_delta::traced), no primitive or lowering rule of its own, so XLA gets batched
// GEMMs rather than a loop over steps, and the tape differentiates the ops (no hand-written
// backward). T is zero-padded to chunks C (k = v = q = 0, g = 0, beta = 0: a padded step leaves
// the state as it is, and its outputs are cut off) and every tensor reshaped to
// [batch, H, chunks, C, ...]; then, for all chunks at once,
//
//     gamma     = g U                       (U the constant upper-triangular ones [C, C]: a cumsum)
//     Gamma     = mask . exp(mask . (gamma_i - gamma_j))   (mask = [i >= j]: the masked exponent
//                                                           is 0, so no exp overflow times 0)
//     (I + A)^-1 by block forward substitution: diagonal blocks' inverses of size s merge into
//                 those of size 2s in two batched GEMMs, log2 C levels (unit_lower_inverse; no
//                 solve primitive, and stable where a power series of A is not)
//     W, U      = (I + A)^-1 diag(beta)(K . e^gamma), (I + A)^-1 diag(beta) V
//
// and the chunk-to-chunk recurrence unrolled (the number of chunks is static), two GEMMs a chunk:
// V_new = U - W S, S' = e^{gamma_C} S + (K . e^{gamma_C - gamma})^T V_new. The outputs then come
// for all chunks at once from the stacked states and V_new: O = scale [(Q . e^gamma) S +
// (Q K^T . Gamma) V_new]. Resets (a host tensor, captured as a constant, or a traced 0/1 input,
// not differentiated) act as exp(g_t) = 0 at a start: with count = resets U (the starts in the
// chunk up to each step), every decay product is multiplied by 1 - min(starts it spans, 1) (Gamma_ij
// by the starts in (j, i], e^gamma_i by those in [0, i], e^{gamma_C - gamma_i} by those in (i, C),
// e^{gamma_C} by all of the chunk's). Memory: the [batch, H, chunks, C, C] matrices (Gamma, A,
// the inverse), i.e. B H T C, besides the state entering every chunk.
//
// Not yet: a chunked-GEMM backward for the eager op.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/cpu_serial.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/backend/trace_rules.hpp"
#include "olmax/core/device.hpp"
#include "olmax/core/error.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/core/traced.hpp"
#include "olmax/detail/third_party.hpp"
#include "olmax/ops/shape.hpp"
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/linalg.hpp"
#include "olmax/scan/detail/denormals.hpp"

namespace olmax::scan {

/// Options of scan::gated_delta_rule.
struct GatedDeltaOptions {
    /// Factor on the outputs, o_t = scale S_t^T q_t; unset means 1 / sqrt(K).
    std::optional<double> scale = std::nullopt;
    /// Steps per chunk of the WY forward and per checkpoint of the backward (>= 1; unset = 64). T
    /// need not be a multiple of it.
    std::optional<long> chunk = std::nullopt;
};

/// o [batch, T, H, V] and the state after the last step, state [batch, H, K, V].
template <class T>
struct GatedDeltaResult {
    Tensor<T> o;
    Tensor<T> state;
};

namespace detail::gated_delta {

inline constexpr std::size_t default_chunk = 64;
inline constexpr std::string_view op_name = "scan::gated_delta_rule";

struct Geometry {
    std::size_t batch = 0, time = 0, heads = 0, key = 0, value = 0, chunk = default_chunk, chunks = 0;
    double scale = 1;
    std::size_t tasks() const { return batch * heads; }
    std::size_t qk(std::size_t b, std::size_t t, std::size_t h) const { return ((b * time + t) * heads + h) * key; }
    std::size_t vo(std::size_t b, std::size_t t, std::size_t h) const { return ((b * time + t) * heads + h) * value; }
    std::size_t gate(std::size_t b, std::size_t t, std::size_t h) const { return (b * time + t) * heads + h; }
    std::size_t state(std::size_t b, std::size_t h) const { return (b * heads + h) * key * value; }
    std::size_t checkpoint(std::size_t b, std::size_t h, std::size_t c) const { return ((b * heads + h) * chunks + c) * key * value; }
};

/// The operands as dense row-major buffers of the shapes at the top of this file; h0 and resets
/// may be null (zero initial state, one sequence per row).
template <class T>
struct Buffers {
    const T *q = nullptr, *k = nullptr, *v = nullptr, *g = nullptr, *beta = nullptr, *h0 = nullptr, *resets = nullptr;
    bool reset(const Geometry& geo, std::size_t b, std::size_t t) const { return resets && resets[b * geo.time + t] != T{0}; }
};

template <class T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using Vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;

template <Real T>
Geometry make_geometry(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Tensor<T>& g, const Tensor<T>& beta,
                       const Tensor<T>& h0, const Tensor<T>& resets, const GatedDeltaOptions& opt) {
    constexpr std::string_view op = op_name;
    check<value_error>(q.defined() && k.defined() && v.defined() && g.defined() && beta.defined(), op,
                       ": q, k, v, g and beta must be defined tensors");
    check<shape_error>(q.rank() == 4, op, ": q must have shape [batch, T, H, K], got ", to_string(q.shape()));
    Geometry geo;
    geo.batch = q.extent(0);
    geo.time = q.extent(1);
    geo.heads = q.extent(2);
    geo.key = q.extent(3);
    check<value_error>(geo.time > 0, op, ": the sequence is empty (T = 0) in q of shape ", to_string(q.shape()));
    check<value_error>(geo.batch > 0 && geo.heads > 0 && geo.key > 0, op, ": q of shape ", to_string(q.shape()),
                       " is empty (batch, H or K is 0)");
    check<shape_error>(k.shape() == q.shape(), op, ": k of shape ", to_string(k.shape()), " does not match q of shape ",
                       to_string(q.shape()), " (both [batch, T, H, K])");
    check<shape_error>(v.rank() == 4 && v.extent(0) == geo.batch && v.extent(1) == geo.time && v.extent(2) == geo.heads, op,
                       ": v of shape ", to_string(v.shape()), " does not match [batch, T, H, V] = [", geo.batch, ", ", geo.time, ", ",
                       geo.heads, ", V] (from q of shape ", to_string(q.shape()), ")");
    geo.value = v.extent(3);
    check<value_error>(geo.value > 0, op, ": v of shape ", to_string(v.shape()), " is empty (V is 0)");
    const Shape per_head{geo.batch, geo.time, geo.heads};
    check<shape_error>(g.shape() == per_head, op, ": g of shape ", to_string(g.shape()), " does not match [batch, T, H] = ",
                       to_string(per_head));
    check<shape_error>(beta.shape() == per_head, op, ": beta of shape ", to_string(beta.shape()), " does not match [batch, T, H] = ",
                       to_string(per_head));
    if (h0.defined()) {
        const Shape state{geo.batch, geo.heads, geo.key, geo.value};
        check<shape_error>(h0.shape() == state, op, ": h0 of shape ", to_string(h0.shape()), " does not match [batch, H, K, V] = ",
                           to_string(state));
    }
    if (resets.defined())
        check<shape_error>(resets.rank() == 2 && resets.extent(0) == geo.batch && resets.extent(1) == geo.time, op, ": resets of shape ",
                           to_string(resets.shape()), " does not match [batch, T] = [", geo.batch, ", ", geo.time, "]");
    if (opt.chunk) check<value_error>(*opt.chunk >= 1, op, ": chunk size must be >= 1, got ", *opt.chunk);
    if (opt.scale) check<value_error>(std::isfinite(*opt.scale), op, ": scale must be finite, got ", *opt.scale);
    geo.chunk = std::min<std::size_t>(opt.chunk ? std::size_t(*opt.chunk) : default_chunk, geo.time);
    geo.chunks = (geo.time + geo.chunk - 1) / geo.chunk;
    geo.scale = opt.scale ? *opt.scale : 1.0 / std::sqrt(double(geo.key));
    return geo;
}

/// Per-task scratch of the WY forward, sized for chunks of up to C steps (row-major).
template <class T>
struct ForwardScratch {
    std::vector<T> A, QK, W, U, S, gamma;  // [C, C], [C, C], [C, K], [C, V], [K, V], [C]
    explicit ForwardScratch(const Geometry& geo)
        : A(geo.chunk * geo.chunk), QK(geo.chunk * geo.chunk), W(geo.chunk * geo.key), U(geo.chunk * geo.value),
          S(geo.key * geo.value), gamma(geo.chunk) {}
};

/// C = alpha op(A) op(B) + beta C on row-major buffers, on the calling thread (single-threaded
/// Eigen, as the serial backend runs it: the tasks already fill the threads).
template <class T>
void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a, std::size_t lda, const T* b,
          std::size_t ldb, T beta, T* c, std::size_t ldc) {
    olmax::backend::cpu_serial::gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/// Steps [s, s + L) of (b, h), no reset after s, in the WY form; w.S is the state entering step s
/// and leaves as the state after step s + L - 1; writes o's rows.
template <Real T>
void wy_block(const Geometry& geo, const Buffers<T>& in, std::size_t b, std::size_t h, std::size_t s, std::size_t L, T* o,
              ForwardScratch<T>& w) {
    const std::size_t K = geo.key, V = geo.value, ldk = geo.heads * K, ldv = geo.heads * V, C = geo.chunk;
    const T *Q = in.q + geo.qk(b, s, h), *Kr = in.k + geo.qk(b, s, h), *Vr = in.v + geo.vo(b, s, h);
    T* O = o + geo.vo(b, s, h);
    T *A = w.A.data(), *QK = w.QK.data(), *W = w.W.data(), *U = w.U.data(), *S = w.S.data(), *gamma = w.gamma.data();
    T acc{0};
    for (std::size_t i = 0; i < L; ++i) gamma[i] = acc += in.g[geo.gate(b, s + i, h)];
    gemm(false, true, L, L, K, T{1}, Kr, ldk, Kr, ldk, T{0}, A, C);  // K K^T
    gemm(false, true, L, L, K, T{1}, Q, ldk, Kr, ldk, T{0}, QK, C);  // Q K^T
    for (std::size_t i = 0; i < L; ++i) {
        const T beta_i = in.beta[geo.gate(b, s + i, h)];
        for (std::size_t j = 0; j < L; ++j) {
            const T decay = j <= i ? T(std::exp(gamma[i] - gamma[j])) : T{0};  // Gamma_ij
            A[i * C + j] = j < i ? beta_i * A[i * C + j] * decay : T{0};      // strict lower: the unit-lower solve skips the diagonal
            QK[i * C + j] *= decay;
        }
        const T wk = beta_i * T(std::exp(gamma[i]));
        for (std::size_t n = 0; n < K; ++n) W[i * K + n] = wk * Kr[i * ldk + n];  // diag(beta)(K . e^gamma)
        for (std::size_t n = 0; n < V; ++n) U[i * V + n] = beta_i * Vr[i * ldv + n];  // diag(beta) V
    }
    {  // W, U <- (I + A)^-1 W, (I + A)^-1 U by forward substitution (the UT transform)
        const Eigen::Map<const Matrix<T>, 0, Eigen::OuterStride<>> Am(A, L, L, Eigen::OuterStride<>(C));
        Eigen::Map<Matrix<T>> Wm(W, L, K), Um(U, L, V);
        const auto unit_lower = Am.template triangularView<Eigen::UnitLower>();
        unit_lower.solveInPlace(Wm);
        unit_lower.solveInPlace(Um);
    }
    gemm(false, false, L, V, K, T{-1}, W, K, S, V, T{1}, U, V);  // V_new = U - W S
    const T scale = T(geo.scale);
    // O = scale [tril(Q K^T . Gamma) V_new + (Q . e^gamma) S]
    gemm(false, false, L, V, L, scale, QK, C, U, V, T{0}, O, ldv);
    for (std::size_t i = 0; i < L; ++i) {
        const T e = T(std::exp(gamma[i]));
        for (std::size_t n = 0; n < K; ++n) W[i * K + n] = e * Q[i * ldk + n];  // W is free again
    }
    gemm(false, false, L, V, K, scale, W, K, S, V, T{1}, O, ldv);
    // S' = e^{gamma_L} S + (K . e^{gamma_L - gamma})^T V_new
    const T last = gamma[L - 1];
    for (std::size_t i = 0; i < L; ++i) {
        const T e = T(std::exp(last - gamma[i]));
        for (std::size_t n = 0; n < K; ++n) W[i * K + n] = e * Kr[i * ldk + n];
    }
    const T decay_all = T(std::exp(last));
    for (std::size_t i = 0; i < K * V; ++i) S[i] *= decay_all;
    gemm(true, false, K, V, L, T{1}, W, K, U, V, T{1}, S, V);
}

/// Forward of (b, h): o, the final state, and the chunk checkpoints when `ckpt` is not null.
template <Real T>
void forward_task(const Geometry& geo, const Buffers<T>& in, std::size_t b, std::size_t h, T* o, T* state_out, T* ckpt,
                  ForwardScratch<T>& w) {
    const std::size_t KV = geo.key * geo.value;
    if (in.h0) std::copy_n(in.h0 + geo.state(b, h), KV, w.S.data());
    else std::fill(w.S.begin(), w.S.end(), T{0});
    for (std::size_t c = 0; c < geo.chunks; ++c) {
        const std::size_t t0 = c * geo.chunk, t1 = std::min(geo.time, t0 + geo.chunk);
        if (ckpt) std::copy_n(w.S.data(), KV, ckpt + geo.checkpoint(b, h, c));
        for (std::size_t s = t0; s < t1;) {  // pieces between resets
            std::size_t e = s + 1;
            while (e < t1 && !in.reset(geo, b, e)) ++e;
            if (in.reset(geo, b, s)) std::fill(w.S.begin(), w.S.end(), T{0});
            wy_block(geo, in, b, h, s, e - s, o, w);
            s = e;
        }
    }
    std::copy_n(w.S.data(), KV, state_out + geo.state(b, h));
}

/// Where the backward writes: every pointer [the shape of its input]; dh0 may be null.
template <class T>
struct Gradients {
    T *dq = nullptr, *dk = nullptr, *dv = nullptr, *dg = nullptr, *dbeta = nullptr, *dh0 = nullptr;
};

/// One step of the recurrence from P = S_{t-1} into S (may not alias P).
template <Real T>
void step(const Geometry& geo, const Buffers<T>& in, std::size_t b, std::size_t t, std::size_t h, const Eigen::Map<const Matrix<T>>& P,
          Eigen::Map<Matrix<T>>& S, Vector<T>& x) {
    const std::size_t K = geo.key, V = geo.value;
    const Eigen::Map<const Vector<T>> k(in.k + geo.qk(b, t, h), K), v(in.v + geo.vo(b, t, h), V);
    const T beta = in.beta[geo.gate(b, t, h)];
    if (in.reset(geo, b, t)) {
        S.noalias() = (beta * k) * v.transpose();
        return;
    }
    const T a = T(std::exp(in.g[geo.gate(b, t, h)]));
    x.noalias() = P.transpose() * k;
    S = a * P;
    S.noalias() += (beta * k) * (v - a * x).transpose();
}

/// Backward of (b, h). `hs` holds C K V values (the chunk's recomputed states).
template <Real T>
void backward_task(const Geometry& geo, const Buffers<T>& in, const T* dO, const T* dstate, const T* ckpt, const Gradients<T>& out,
                   std::size_t b, std::size_t h, T* hs) {
    const std::size_t K = geo.key, V = geo.value, KV = K * V;
    const T scale = T(geo.scale);
    Matrix<T> G(K, V);  // the adjoint of S_t, carried backwards
    Vector<T> x(V), y(V), r(V), dk(K);
    G = Eigen::Map<const Matrix<T>>(dstate + geo.state(b, h), K, V);
    for (std::size_t c = geo.chunks; c-- > 0;) {
        const std::size_t t0 = c * geo.chunk, t1 = std::min(geo.time, t0 + geo.chunk);
        const T* start = ckpt + geo.checkpoint(b, h, c);
        for (std::size_t t = t0; t < t1; ++t) {
            const Eigen::Map<const Matrix<T>> P(t == t0 ? start : hs + (t - t0 - 1) * KV, K, V);
            Eigen::Map<Matrix<T>> S(hs + (t - t0) * KV, K, V);
            step(geo, in, b, t, h, P, S, x);
        }
        for (std::size_t t = t1; t-- > t0;) {
            const Eigen::Map<const Matrix<T>> S(hs + (t - t0) * KV, K, V);
            const Eigen::Map<const Matrix<T>> P(t == t0 ? start : hs + (t - t0 - 1) * KV, K, V);
            const Eigen::Map<const Vector<T>> q(in.q + geo.qk(b, t, h), K), k(in.k + geo.qk(b, t, h), K), v(in.v + geo.vo(b, t, h), V),
                dot(dO + geo.vo(b, t, h), V);
            const std::size_t gi = geo.gate(b, t, h);
            const T beta = in.beta[gi];
            Eigen::Map<Vector<T>> dq(out.dq + geo.qk(b, t, h), K), dkt(out.dk + geo.qk(b, t, h), K), dv(out.dv + geo.vo(b, t, h), V);
            dq.noalias() = scale * (S * dot);
            G.noalias() += (scale * q) * dot.transpose();
            y.noalias() = G.transpose() * k;
            dv = beta * y;
            if (in.reset(geo, b, t)) {
                out.dbeta[gi] = y.dot(v);
                dkt.noalias() = beta * (G * v);
                out.dg[gi] = T{0};
                G.setZero();
                continue;
            }
            const T a = T(std::exp(in.g[gi]));
            x.noalias() = P.transpose() * k;
            r = v - a * x;
            out.dbeta[gi] = y.dot(r);
            dkt.noalias() = beta * (G * r);
            dkt.noalias() -= (a * beta) * (P * y);
            out.dg[gi] = a * ((G.cwiseProduct(P)).sum() - beta * x.dot(y));  // a <G, P - beta k x^T>
            G.noalias() -= (beta * k) * y.transpose();
            G *= a;
        }
    }
    if (out.dh0) std::copy_n(G.data(), KV, out.dh0 + geo.state(b, h));
}

/// Forward over every (batch, head) on the current backend.
template <Real T>
void forward(const Geometry& geo, const Buffers<T>& in, T* o, T* state_out, T* ckpt) {
    const std::size_t work = geo.time * geo.key * geo.value * (geo.chunk + geo.key + geo.value);
    backend::current().parallel_for(geo.tasks(), work, [&](std::size_t lo, std::size_t hi) {
        scan::detail::denormal_guard guard;
        ForwardScratch<T> scratch(geo);
        for (std::size_t task = lo; task < hi; ++task) forward_task(geo, in, task / geo.heads, task % geo.heads, o, state_out, ckpt, scratch);
    });
}

/// Backward over every (batch, head) on the current backend: each task writes its own rows.
template <Real T>
void backward(const Geometry& geo, const Buffers<T>& in, const T* dO, const T* dstate, const T* ckpt, const Gradients<T>& out) {
    const std::size_t work = 8 * geo.time * geo.key * geo.value;
    backend::current().parallel_for(geo.tasks(), work, [&](std::size_t lo, std::size_t hi) {
        scan::detail::denormal_guard guard;
        std::vector<T> hs(geo.chunk * geo.key * geo.value);
        for (std::size_t task = lo; task < hi; ++task)
            backward_task(geo, in, dO, dstate, ckpt, out, task / geo.heads, task % geo.heads, hs.data());
    });
}

/// A host tensor read by the traced program as a constant of type T (outside a trace, the tensor
/// itself: the traced form then runs eagerly, op by op).
template <Real T>
Tensor<T> constant(const Tensor<T>& host) {
    if (!olmax::detail::active_tracer()) return host;
    return backend::trace::as_type<T>(backend::trace::as_float(host));
}

/// 1 - min(x, 1) for counts x >= 0: 1 where no document starts in the range x counts.
template <Real T>
Tensor<T> no_start(const Tensor<T>& x) {
    return add_scalar(neg(sub(x, relu(add_scalar(x, T{-1})))), T{1});
}

/// (I + A)^-1 for a batch of strictly lower-triangular A [L, C, C], by block forward substitution
/// in batched GEMMs: the inverses of the diagonal blocks of size s merge into those of size 2s as
///     [[D11, 0], [A21, D22]]^-1 = [[D11^-1, 0], [-D22^-1 A21 D11^-1, D22^-1]],
/// log2 C levels (C padded to a power of two with an identity block). Unlike the power series
/// prod_j (I + (-A)^(2^j)), whose terms grow like binomial coefficients when the keys of a chunk
/// are alike (A near a triangle of equal entries: at C = 64 terms of ~1e9 cancel to O(1), which
/// float cannot), every product here is one of the exact inverse's own blocks.
template <Real T>
Tensor<T> unit_lower_inverse(const Tensor<T>& A) {
    const std::size_t L = A.extent(0), C = A.extent(1);
    std::size_t P = 1;
    while (P < C) P *= 2;
    const Tensor<T> Ap = P == C ? A : pad(pad(A, 1, 0, P - C), 2, 0, P - C);
    Tensor<T> D = Tensor<T>();  // the inverses of the diagonal blocks, [L, P / s, s, s]
    {
        device_scope host(Device::host());
        D = Tensor<T>({L, P, 1, 1}, T{1});
    }
    D = constant(D);
    for (std::size_t s = 1; s < P; s *= 2) {
        const std::size_t pairs = P / (2 * s);
        Tensor<T> same;  // [pairs, 1, pairs, 1]: 1 where the two pair indices agree (picks the diagonal blocks)
        {
            device_scope host(Device::host());
            same = Tensor<T>({pairs, 1, pairs, 1});
            for (std::size_t p = 0; p < pairs; ++p) same.data()[p * pairs + p] = T{1};
        }
        // A21 of each pair: rows of its second block, columns of its first, [L, pairs, s, s]
        const Tensor<T> blocks = reshape(Ap, Shape{L, pairs, 2, s, pairs, 2, s});
        const Tensor<T> lower_left = reshape(slice(slice(blocks, 2, 1, 2), 5, 0, 1), Shape{L, pairs, s, pairs, s});
        const Tensor<T> A21 = sum(mul(lower_left, constant(same)), {3});
        const Tensor<T> halves = reshape(D, Shape{L, pairs, 2, s, s});
        const Tensor<T> D11 = reshape(slice(halves, 2, 0, 1), Shape{L, pairs, s, s});
        const Tensor<T> D22 = reshape(slice(halves, 2, 1, 2), Shape{L, pairs, s, s});
        const Tensor<T> X = neg(matmul(matmul(D22, A21), D11));
        D = add(add(pad(pad(D11, 2, 0, s), 3, 0, s), pad(pad(X, 2, s, 0), 3, 0, s)), pad(pad(D22, 2, s, 0), 3, s, 0));
    }
    const Tensor<T> inverse = reshape(D, Shape{L, P, P});
    return P == C ? inverse : slice(slice(inverse, 1, 0, C), 2, 0, C);
}

/// The traced form (see the top of this file): the chunked WY / UT form over every chunk at once
/// in batched GEMMs ([batch, H, chunks, C, ...]), (I + A)^-1 as a product of ceil(log2 C) factors,
/// and the chunk-to-chunk state recurrence unrolled (2 GEMMs a chunk). Composed of traced ops, so
/// the tape differentiates it.
template <Real T>
GatedDeltaResult<T> traced(const Geometry& geo, const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Tensor<T>& g,
                           const Tensor<T>& beta, const Tensor<T>& h0_in, const Tensor<T>& resets_in) {
    const std::size_t nb = geo.batch, nt = geo.time, nh = geo.heads, C = geo.chunk, n = geo.chunks, extra = n * C - nt;
    Tensor<T> upper, lower, strict;  // [C, C]: i <= j (cumulative sums), i >= j, i > j
    {
        device_scope host(Device::host());  // the constants are built on the host, then captured
        upper = Tensor<T>({C, C});
        lower = Tensor<T>({C, C});
        strict = Tensor<T>({C, C});
        for (std::size_t i = 0; i < C; ++i)
            for (std::size_t j = 0; j < C; ++j) {
                upper.data()[i * C + j] = i <= j ? T{1} : T{0};
                lower.data()[i * C + j] = i >= j ? T{1} : T{0};
                strict.data()[i * C + j] = i > j ? T{1} : T{0};
            }
    }
    const Tensor<T> cumsum = constant(upper), causal = constant(lower), below = constant(strict);
    const Tensor<T> h0 = h0_in.defined() && !h0_in.traced() ? constant(h0_in) : h0_in;
    const Tensor<T> resets = !resets_in.defined() ? Tensor<T>() : resets_in.traced() ? resets_in.detach() : constant(resets_in);

    // [batch, T, H, X] -> [batch, H, chunks, C, X] and [batch, T, H] -> [batch, H, chunks, C], zero-padded to chunks C steps:
    // a padded step (k = v = q = 0, g = 0, beta = 0) leaves the state as it is.
    auto rows = [&](const Tensor<T>& x) {
        return reshape(transpose(extra ? pad(x, 1, 0, extra) : x, {0, 2, 1, 3}), Shape{nb, nh, n, C, x.extent(3)});
    };
    auto gates = [&](const Tensor<T>& x) { return reshape(transpose(extra ? pad(x, 1, 0, extra) : x, {0, 2, 1}), Shape{nb, nh, n, C}); };
    auto column = [](const Tensor<T>& x) {  // [..., C] -> [..., C, 1]
        Shape s = x.shape();
        s.push_back(1);
        return reshape(x, s);
    };
    auto row = [](const Tensor<T>& x) {  // [..., C] -> [..., 1, C]
        Shape s = x.shape();
        s.push_back(s.back());  // (not svector::insert: GCC 12 at -O3 warns falsely inside it, -Warray-bounds)
        s[s.size() - 2] = 1;
        return reshape(x, s);
    };
    const Tensor<T> Q = rows(q), Kc = rows(k), Vc = rows(v), betas = gates(beta);
    const Tensor<T> gamma = contract_axis(gates(g), cumsum, 3);  // chunk-local cumulative log decay
    const Tensor<T> last = slice(gamma, 3, C - 1, C);           // [batch, H, chunks, 1]
    // Gamma_ij = exp(gamma_i - gamma_j) for i >= j, else 0 (the exponent masked first: no inf * 0)
    Tensor<T> Gamma = mul(exp(mul(sub(column(gamma), row(gamma)), causal)), causal);
    Tensor<T> decay_in = exp(gamma), decay_out = exp(sub(last, gamma)), decay_all = exp(last);
    if (resets.defined()) {  // a start at t acts as exp(g_t) = 0: every decay product spanning it is zeroed
        const Tensor<T> starts = reshape(extra ? pad(resets, 1, 0, extra) : resets, Shape{nb, n, C});
        const Tensor<T> count = reshape(contract_axis(starts, cumsum, 2), Shape{nb, 1, n, C});  // starts in the chunk up to i
        const Tensor<T> count_last = slice(count, 3, C - 1, C);
        Gamma = mul(Gamma, no_start(relu(sub(column(count), row(count)))));  // starts in (j, i]
        decay_in = mul(decay_in, no_start(count));                           // starts in [0, i]
        decay_out = mul(decay_out, no_start(sub(count_last, count)));        // starts in (i, C)
        decay_all = mul(decay_all, no_start(count_last));
    }
    const Tensor<T> Kt = transpose(Kc);  // [batch, H, chunks, K, C]
    // A = strict_tril(diag(beta) K K^T . Gamma); (I + A)^-1 by block forward substitution (unit_lower_inverse)
    const Tensor<T> A = mul(mul(matmul(Kc, Kt), Gamma), mul(column(betas), below));
    const Tensor<T> inverse = reshape(unit_lower_inverse(reshape(A, Shape{nb * nh * n, C, C})), Shape{nb, nh, n, C, C});
    const Tensor<T> W = matmul(inverse, mul(Kc, column(mul(betas, decay_in))));  // [batch, H, chunks, C, K]
    const Tensor<T> U = matmul(inverse, mul(Vc, column(betas)));                 // [batch, H, chunks, C, V]
    const Tensor<T> Kout = transpose(mul(Kc, column(decay_out)));                // (K . e^{gamma_C - gamma})^T
    auto chunk_of = [&](const Tensor<T>& x, std::size_t c) {  // [batch, H, chunks, R, S] -> chunk c's [batch, H, R, S]
        return reshape(slice(x, 2, c, c + 1), Shape{nb, nh, x.extent(3), x.extent(4)});
    };
    std::vector<Tensor<T>> states, news;  // the state entering each chunk (none while it is zero), V_new of each chunk
    Tensor<T> S = h0;                     // undefined: zeros
    for (std::size_t c = 0; c < n; ++c) {
        const Tensor<T> Uc = chunk_of(U, c);
        const Tensor<T> vn = S.defined() ? sub(Uc, matmul(chunk_of(W, c), S)) : Uc;
        if (S.defined()) states.push_back(S);
        news.push_back(vn);
        const Tensor<T> write = matmul(chunk_of(Kout, c), vn);
        S = S.defined() ? add(mul(S, reshape(slice(decay_all, 2, c, c + 1), Shape{nb, nh, 1, 1})), write) : write;
    }
    auto stacked = [](const std::vector<Tensor<T>>& parts) {  // [chunks, batch, H, R, S] -> [batch, H, chunks, R, S]
        return transpose(stack_leading(parts), {1, 2, 0, 3, 4});
    };
    Tensor<T> O = matmul(mul(matmul(Q, Kt), Gamma), stacked(news));  // tril(Q K^T . Gamma) V_new
    if (!states.empty()) {                                          // + (Q . e^gamma) S, from the first chunk with a state
        const std::size_t first = n - states.size();
        const Tensor<T> Qe = mul(Q, column(decay_in));
        const Tensor<T> inter = matmul(first ? slice(Qe, 2, first, n) : Qe, stacked(states));
        O = add(O, first ? pad(inter, 2, first, 0) : inter);
    }
    O = reshape(olmax::scale(O, T(geo.scale)), Shape{nb, nh, n * C, geo.value});
    if (extra) O = slice(O, 2, 0, nt);
    return {transpose(O, {0, 2, 1, 3}), S};
}

}  // namespace detail::gated_delta

/// The gated delta rule (see the top of this file): returns o [batch, T, H, V] and the final state
/// [batch, H, K, V]. Differentiable in q, k, v, g, beta and h0 (undefined: zeros); resets [batch, T]
/// (nonzero where a document starts: the state is zeroed before that step) is not differentiated.
/// Parallel over batch x heads. Throws shape_error naming mismatched shapes, value_error for an
/// empty size, a chunk < 1 or a non-finite scale. On traced tensors it traces the chunked form from
/// ops (see the top of this file).
template <Real T>
GatedDeltaResult<T> gated_delta_rule(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Tensor<T>& g, const Tensor<T>& beta,
                                     const Tensor<T>& h0 = {}, const Tensor<T>& resets = {}, const GatedDeltaOptions& options = {}) {
    namespace gd = detail::gated_delta;
    backend::op_scope on(gd::op_name, q, k, v, g, beta, h0, resets);
    const gd::Geometry geo = gd::make_geometry(q, k, v, g, beta, h0, resets, options);
    if (on.traced()) return gd::traced(geo, q, k, v, g, beta, h0, resets);
    std::vector<Tensor<T>> inputs{q, k, v, g, beta, h0};
    const bool recording = autodiff::should_record(std::span<const Tensor<T>>(inputs));

    GatedDeltaResult<T> result{Tensor<T>::uninitialized(v.shape()), Tensor<T>::uninitialized({geo.batch, geo.heads, geo.key, geo.value})};
    Tensor<T> ckpt = recording ? Tensor<T>::uninitialized({geo.batch, geo.heads, geo.chunks, geo.key, geo.value}) : Tensor<T>();
    const Tensor<T> resets_in = resets.defined() ? resets.detach() : Tensor<T>();
    auto buffers = [](const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Tensor<T>& g, const Tensor<T>& beta,
                      const Tensor<T>& h0, const Tensor<T>& resets) {
        auto data = [](const Tensor<T>& t) { return t.defined() ? t.data() : static_cast<const T*>(nullptr); };
        return gd::Buffers<T>{q.data(), k.data(), v.data(), g.data(), beta.data(), data(h0), data(resets)};
    };
    gd::forward(geo, buffers(q, k, v, g, beta, h0, resets_in), result.o.data(), result.state.data(), ckpt.defined() ? ckpt.data() : nullptr);
    if (!recording) return result;

    std::vector<Tensor<T>> outputs{result.o, result.state};
    autodiff::record<T>(
        gd::op_name, inputs, outputs,
        [geo, buffers, q = q.detach(), k = k.detach(), v = v.detach(), g = g.detach(), beta = beta.detach(),
         h0 = h0.defined() ? h0.detach() : Tensor<T>(), resets_in, ckpt](std::span<const Tensor<T>> grads, autodiff::GradientSink<T>& sink) {
            auto dq = Tensor<T>::uninitialized(q.shape()), dk = Tensor<T>::uninitialized(k.shape());
            auto dv = Tensor<T>::uninitialized(v.shape());
            auto dg = Tensor<T>::uninitialized(g.shape()), dbeta = Tensor<T>::uninitialized(beta.shape());
            Tensor<T> dh0 = sink.needs(5) ? Tensor<T>::uninitialized(h0.shape()) : Tensor<T>();
            gd::backward(geo, buffers(q, k, v, g, beta, h0, resets_in), grads[0].data(), grads[1].data(), ckpt.data(),
                         gd::Gradients<T>{dq.data(), dk.data(), dv.data(), dg.data(), dbeta.data(), dh0.defined() ? dh0.data() : nullptr});
            sink.add(0, std::move(dq));
            sink.add(1, std::move(dk));
            sink.add(2, std::move(dv));
            sink.add(3, std::move(dg));
            sink.add(4, std::move(dbeta));
            if (dh0.defined()) sink.add(5, std::move(dh0));
        });
    result.o = outputs[0];
    result.state = outputs[1];
    return result;
}

}  // namespace olmax::scan
