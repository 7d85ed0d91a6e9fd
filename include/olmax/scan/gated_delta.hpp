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
// arXiv:2406.06484, extended with the gate by Gated Delta Networks). A chunk of C steps (the
// checkpoint interval) runs as blocks of L <= wy_block steps (16; see there). Within a block with
// incoming state S, gamma = cumsum(g) (block-local), Gamma_ij = exp(gamma_i - gamma_j) for i >= j,
// and Q, K, V the block's rows:
//
//     A     = strict_tril(diag(beta) K K^T . Gamma)                    (L x L)
//     W     = (I + A)^-1 diag(beta) (K . e^gamma)                      (L x K, forward substitution)
//     U     = (I + A)^-1 diag(beta) V                                  (L x V)
//     V_new = U - W S                                                  (the rows u_t below)
//     O     = scale [ (Q . e^gamma) S + tril(Q K^T . Gamma) V_new ]
//     S'    = e^{gamma_L} S + (K . e^{gamma_L - gamma})^T V_new
//
// Derivation: S_t = a_t S_{t-1} + k_t u_t^T with a_t = e^{g_t} and u_t = beta_t (v_t - a_t S_{t-1}^T k_t);
// unrolled inside the block, S_t = e^{gamma_t} S + sum_{j <= t} Gamma_tj k_j u_j^T, and substituting
// that into u_t gives (I + A) U_all = diag(beta) V - diag(beta)(K . e^gamma) S, i.e. U_all = V_new.
// (I + A)^-1 is formed explicitly by forward substitution (row i of the inverse from rows j < i,
// vectorised along the row), then W | U = (I + A)^-1 [diag(beta)(K . e^gamma) | diag(beta) V] in one
// GEMM. The GEMMs run on the calling thread on backend::small_gemm (register blocks, no packing;
// at these sizes 1.3-1.5x the GFLOPS of Eigen's blocked GEMM; under the bf16 precision policy on
// small_gemm_bf16, operands rounded to bfloat16, as every float GEMM's are there), skipping the
// zero triangles of (I + A)^-1, M and dM; the exponentials (Gamma, e^gamma, ...) in Eigen's
// vectorised exp; one task per (batch, head), parallel on the current backend, with per-thread
// scratch that is reused across calls.
//
// Segments (packed documents): resets[b, t] != 0 zeroes the state before step t (S_{t-1} := 0),
// so S_t = beta_t k_t v_t^T there, g_t has no effect and no gradient crosses that step; h0 only
// reaches the first segment. The forward splits a block at every reset (each piece runs the form
// above, a piece that starts at a reset with S = 0).
//
// Memory. Only the state entering every chunk is kept for the backward ([batch, H, ceil(T / C), K, V]),
// and only when the op is recorded.
//
// Backward: the chunked form differentiated (the same quantities as the chunked backward of
// Gated Delta Networks, Yang et al. 2024, derived here from the form above). The chunks are walked
// from last to first carrying dS, the adjoint of the state leaving the block; per chunk, every
// block's Gamma, A, T = (I + A)^-1 (explicit, by forward substitution), W | U = T [Wb | Ub]
// (Wb = diag(beta)(K . e^gamma), Ub = diag(beta) V) and V_new are recomputed from the inputs, the
// chunk's checkpoint and the states entering its later blocks (recomputed from it, S' above), then
// the blocks are differentiated from last to first. With M = tril(Q K^T . Gamma), Qg = Q . e^gamma,
// Kd = K . e^{gamma_L - gamma}, dO the block's rows of the output adjoint and s = scale:
//
//     dV_new = s M^T dO + Kd dS                     dM  = s dO V_new^T        (lower triangle)
//     dQg    = s dO S^T                             dKd = V_new dS^T
//     dW     = -dV_new S^T                          dS_in = e^{gamma_L} dS + s Qg^T dO - W^T dV_new
//     [dWb | dUb] = T^T [dW | dV_new]               dA  = -(dWb W^T + dUb U^T)  (strict lower; dT = -T dA T)
//
// then, with P = dA . diag(beta) Gamma (strict lower) and E = dA . A + dM . M,
//
//     dq_i    = ((dM . Gamma) K)_i + e^{gamma_i} dQg_i
//     dk_i    = ((dM . Gamma)^T Q + (P + P^T) K)_i + beta_i e^{gamma_i} dWb_i + e^{gamma_L - gamma_i} dKd_i
//     dv_i    = beta_i dUb_i
//     dbeta_i = sum_j dA_ij (K K^T . Gamma)_ij + e^{gamma_i} k_i . dWb_i + v_i . dUb_i
//     dgamma_i = rowsum_i(E) - colsum_i(E) + Wb_i . dWb_i + Qg_i . dQg_i - Kd_i . dKd_i
//     dgamma_L += sum_i Kd_i . dKd_i + e^{gamma_L} <S, dS>
//
// and dg by a reverse cumulative sum over the block, dg_j = sum_{i >= j} dgamma_i. About 20 GEMMs
// of a block's sizes (L x L x K, L x K x V, ...) per block. Resets: a block is split at its resets
// as in the forward; a piece that starts at a reset has S = 0 (the GEMMs with S are skipped, g at
// its first step gets 0) and passes no dS back, so the piece before it gets dS = 0. dh0 is the
// carried dS after the first chunk. Memory is linear in T: the checkpoints B H K V T / C plus
// per-thread scratch of O(C (L + K + V) + (C / L) K V) (one chunk's blocks and their states).
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
// and the chunk-to-chunk recurrence, V_new = U - W S, S' = e^{gamma_C} S + Kout^T V_new with
// Kout = K . e^{gamma_C - gamma}, which is linear in S: S' = (e^{gamma_C} I - Kout^T W) S + Kout^T U,
// one matrix_scan over the chunks (scan/matrix_scan.hpp: one loop in the program, one K x K by
// K x V product a chunk, so the program's size does not grow with T). The outputs then come for all
// chunks at once from the entering states S and V_new = U - W S: O = scale [(Q . e^gamma) S +
// (Q K^T . Gamma) V_new]. Resets (a host tensor, captured as a constant, or a traced input, read as
// 0/1 flags by masks::start_flags, any nonzero a start; not differentiated) act as exp(g_t) = 0 at
// a start: with count = resets U (the starts in the chunk up to each step), every decay product is
// multiplied by 1 - min(starts it spans, 1) (Gamma_ij by the starts in (j, i], e^gamma_i by those
// in [0, i], e^{gamma_C - gamma_i} by those in (i, C), e^{gamma_C} by all of the chunk's). Memory:
// the [batch, H, chunks, C, C] matrices (Gamma, A, the inverse), i.e. B H T C, besides the state
// entering every chunk.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/backend/small_products.hpp"
#include "olmax/backend/trace_rules.hpp"
#include "olmax/core/device.hpp"
#include "olmax/core/error.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/core/traced.hpp"
#include "olmax/detail/third_party.hpp"
#include "olmax/ops/shape.hpp"
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/linalg.hpp"
#include "olmax/ops/masks.hpp"
#include "olmax/scan/detail/denormals.hpp"
#include "olmax/scan/detail/dot.hpp"
#include "olmax/scan/matrix_scan.hpp"

namespace olmax::scan {

/// Options of scan::gated_delta_rule.
struct GatedDeltaOptions {
    /// Factor on the outputs, o_t = scale S_t^T q_t; unset means 1 / sqrt(K).
    std::optional<double> scale = std::nullopt;
    /// Steps per chunk (>= 1; unset = 64): per checkpoint of the backward, and per WY chunk of the
    /// traced form; the eager op runs each chunk as WY blocks of at most 16 steps. T need not be a
    /// multiple of it.
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
/// Steps per WY block: a chunk (the checkpoint interval) runs as blocks of at most this many steps.
/// Per step, the [L, L] products of a block of L cost ~L (K + V) and the state products ~K V
/// whatever L, so small blocks save work, down to where short products and the states the backward
/// recomputes inside a chunk (one per block) cost more: at chunk 64, fp32, K = V = 64 and 128
/// (AVX-512), blocks of 16 beat 8, 24, 32 and 64 (by 8% to 30% over 64).
inline constexpr std::size_t wy_block = 16;
inline constexpr std::string_view op_name = "scan::gated_delta_rule";

struct Geometry {
    std::size_t batch = 0, time = 0, heads = 0, key = 0, value = 0, chunk = default_chunk, chunks = 0, block = wy_block;
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
    geo.block = std::min(geo.chunk, wy_block);
    geo.scale = opt.scale ? *opt.scale : 1.0 / std::sqrt(double(geo.key));
    return geo;
}

using backend::small_gemm_transpose;
/// op(A) lower or upper triangular ((I + A)^-1, M, dM): the products skip the zero triangle's steps.
using backend::lower_triangle;
using backend::upper_triangle;

/// Where the backward writes: every pointer [the shape of its input]; dh0 may be null.
template <class T>
struct Gradients {
    T *dq = nullptr, *dk = nullptr, *dv = nullptr, *dg = nullptr, *dbeta = nullptr, *dh0 = nullptr;
};

/// exp in place on n contiguous values (Eigen's vectorised exp).
template <class T>
void exp_in_place(T* x, std::size_t n) {
    if (n == 0) return;
    Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> a(x, Eigen::Index(n));
    a = a.exp();
}

/// Elements per 64-byte line: every scratch part starts on one, and the columns of one block of
/// the forward substitution forming (I + A)^-1.
template <class T>
inline constexpr std::size_t line = 64 / sizeof(T);
template <class T>
constexpr std::size_t whole_lines(std::size_t n) {
    return (n + line<T> - 1) / line<T> * line<T>;
}

/// One run of L <= block steps [s, s + L) of a chunk with no reset after s, and its WY quantities
/// (prepare): gamma (block-local), e^gamma, e^{gamma_last - gamma}, Gamma, AK = strict_tril(K K^T .
/// Gamma), M = tril(Q K^T . Gamma), Tinv = (I + A)^-1 (A = diag(beta) AK; leading dimension
/// whole_lines(L), the padding zero), W | U = Tinv [diag(beta)(K . e^gamma) | diag(beta) V] and
/// V_new = U - W S. S: the state entering step s, null where it is zero.
template <class T>
struct Piece {
    std::size_t s = 0, L = 0;
    const T* S = nullptr;
    T decay_all{1};  // e^{gamma_last}
    T *gamma = nullptr, *eg = nullptr, *eout = nullptr, *Gam = nullptr, *AK = nullptr, *M = nullptr, *Tinv = nullptr, *WU = nullptr,
      *Vn = nullptr;
    T *Qc = nullptr, *Kc = nullptr;  // the block's rows of q and k, contiguous [L, K]
};

/// Per-task scratch, carved from one buffer per thread that only grows (no allocation per call once
/// warm; every part 64-byte aligned): work space for one piece of up to `block` steps, and an
/// arena holding every piece of one chunk (their quantities, and the states entering those that
/// start inside the chunk without a reset) for the backward.
template <class T>
struct Scratch {
    T *dgam, *colsum, *dbeta;  // [c]
    T *dM, *dA;                // [c, c]
    T *Xb, *dWV;               // [c, K + V]: right-hand sides of W | U (later dWb | dUb); dW | dV_new
    T *Qg, *Kd, *dQg, *dKd;    // [c, K]: Q . e^gamma, K . e^{gamma_last - gamma} and their adjoints
    T *S, *dS;                 // [K, V]: the forward's state; the state adjoint carried backwards
    T *Kt, *St;                // [K, c], [V, K]: K^T, S^T (right operands of two products each)
    T *Oc, *dOc, *dQc, *dKc;   // [c, V], [c, V], [c, K], [c, K]: a block's rows of o, do, dq, dk, contiguous
    T *arena = nullptr, *arena_at = nullptr, *arena_end = nullptr;
    std::vector<Piece<T>>& pieces;

    static std::size_t piece_bound(const Geometry& geo) {  // one piece's parts, at most, per step of it (+ per piece)
        return 3 + 4 * geo.block + line<T> + 3 * geo.key + 2 * geo.value;
    }
    backend::SmallProducts<T> gemm;  // the products, under the precision policy of the op's caller

    Scratch(const Geometry& geo, bool backward, backend::SmallProducts<T> products) : pieces(piece_list()), gemm(products) {
        const std::size_t c = geo.block, K = geo.key, V = geo.value, KV = K * V;
        struct Part {
            T** p;
            std::size_t n;
        };
        const Part parts[] = {{&dgam, c}, {&colsum, c}, {&dbeta, c},  {&dM, c * c},  {&dA, c * c}, {&Xb, c * (K + V)}, {&dWV, c * (K + V)},
                              {&Qg, c * K}, {&Kd, c * K},  {&dQg, c * K}, {&dKd, c * K}, {&S, KV},    {&dS, KV},
                              {&Kt, K * c}, {&St, KV}, {&Oc, c * V}, {&dOc, c * V}, {&dQc, c * K}, {&dKc, c * K}};
        std::size_t total = line<T>;
        for (const Part& part : parts) total += whole_lines<T>(part.n);
        // Pieces of a chunk: at most C, of total length C, each part of a piece of L steps at most L
        // block (or L whole_lines(L)) elements plus a line; states for at most ceil(C / c) of them.
        const std::size_t C = backward ? geo.chunk : c;
        const std::size_t arena = C * (piece_bound(geo) + 11 * line<T>) + (C + c - 1) / c * whole_lines<T>(KV);
        total += arena;
        thread_local std::vector<T> buffer;
        if (buffer.size() < total) buffer.resize(total);
        T* at = buffer.data();
        at += (line<T> - (reinterpret_cast<std::uintptr_t>(at) / sizeof(T)) % line<T>) % line<T>;
        for (const Part& part : parts) {
            *part.p = at;
            at += whole_lines<T>(part.n);
        }
        this->arena = arena_at = at;
        arena_end = at + arena;
        pieces.reserve(C);
    }
    static std::vector<Piece<T>>& piece_list() {
        thread_local std::vector<Piece<T>> list;
        list.clear();
        return list;
    }
    T* take(std::size_t n) {  // n elements from the arena
        T* p = arena_at;
        arena_at += whole_lines<T>(n);
        check<value_error>(arena_at <= arena_end, op_name, ": internal error, scratch arena overrun");
        return p;
    }
};

/// Allocates piece p's parts from the arena and computes its WY quantities (see Piece), V_new
/// included (from p.S).
template <Real T>
void prepare(const Geometry& geo, const Buffers<T>& in, std::size_t b, std::size_t h, Piece<T>& p, Scratch<T>& w) {
    const std::size_t L = p.L, K = geo.key, V = geo.value, KV = K + V, ldk = geo.heads * K, ldv = geo.heads * V, ldg = geo.heads;
    const std::size_t lt = whole_lines<T>(L);
    const T *Q = in.q + geo.qk(b, p.s, h), *Kr = in.k + geo.qk(b, p.s, h), *Vr = in.v + geo.vo(b, p.s, h);
    const T *g = in.g + geo.gate(b, p.s, h), *beta = in.beta + geo.gate(b, p.s, h);
    p.gamma = w.take(L);
    p.eg = w.take(L);
    p.eout = w.take(L);
    p.Gam = w.take(L * L);
    p.AK = w.take(L * L);
    p.M = w.take(L * L);
    p.Tinv = w.take(L * lt);
    p.WU = w.take(L * KV);
    p.Vn = w.take(L * V);
    p.Qc = w.take(L * K);
    p.Kc = w.take(L * K);
    // The rows of q and k, strided by H K, copied once: the products below read them repeatedly
    // (rows 2-4 KB apart share few cache sets).
    for (std::size_t i = 0; i < L; ++i) {
        std::copy_n(Q + i * ldk, K, p.Qc + i * K);
        std::copy_n(Kr + i * ldk, K, p.Kc + i * K);
    }
    T *gamma = p.gamma, *Gam = p.Gam, *AK = p.AK, *M = p.M, *Tinv = p.Tinv, *Xb = w.Xb;
    T acc{0};
    for (std::size_t i = 0; i < L; ++i) gamma[i] = acc += g[i * ldg];
    const T last = gamma[L - 1];
    for (std::size_t i = 0; i < L; ++i) {
        p.eg[i] = gamma[i];
        p.eout[i] = last - gamma[i];
    }
    exp_in_place(p.eg, L);
    exp_in_place(p.eout, L);
    p.decay_all = T(std::exp(last));
    // Gamma_ij = exp(gamma_i - gamma_j) for j <= i, else 0 (the exponent is 0 above the diagonal: no overflow)
    for (std::size_t i = 0; i < L; ++i) {
        T* row = Gam + i * L;
        const T gi = gamma[i];
#pragma omp simd
        for (std::size_t j = 0; j < L; ++j) row[j] = j <= i ? gi - gamma[j] : T{0};
    }
    exp_in_place(Gam, L * L);
    small_gemm_transpose(L, K, p.Kc, K, w.Kt, L);                           // K^T, the right operand of both
    w.gemm(false, false, L, L, K, T{1}, p.Kc, K, w.Kt, L, T{0}, AK, L);  // K K^T
    w.gemm(false, false, L, L, K, T{1}, p.Qc, K, w.Kt, L, T{0}, M, L);   // Q K^T
    for (std::size_t i = 0; i < L; ++i) {
        T *row = Gam + i * L, *ak = AK + i * L, *m = M + i * L;
        for (std::size_t j = i + 1; j < L; ++j) row[j] = T{0};
#pragma omp simd
        for (std::size_t j = 0; j < L; ++j) {
            ak[j] = j < i ? ak[j] * row[j] : T{0};
            m[j] *= row[j];
        }
    }
    // (I + A)^-1 by forward substitution, row by row: T_i = e_i - sum_{j < i} A_ij T_j. Row j of the
    // inverse is zero right of column j, so a block of B columns starting at c0 takes rows j >= c0
    // only; the block's row accumulates in two register-sized halves (independent FMA chains).
    constexpr std::size_t B = line<T>;
    std::fill_n(Tinv, L * lt, T{0});
    for (std::size_t c0 = 0; c0 < L; c0 += B) {
        for (std::size_t i = c0; i < L; ++i) {
            const T bi = beta[i * ldg];
            const T* ak = AK + i * L;
            T acc0[B] = {}, acc1[B] = {};
            std::size_t j = c0;
            for (; j + 1 < i; j += 2) {
                const T a0 = bi * ak[j], a1 = bi * ak[j + 1];
                const T *t0 = Tinv + j * lt + c0, *t1 = t0 + lt;
#pragma omp simd
                for (std::size_t m = 0; m < B; ++m) {
                    acc0[m] -= a0 * t0[m];
                    acc1[m] -= a1 * t1[m];
                }
            }
            if (j < i) {
                const T a0 = bi * ak[j];
                const T* t0 = Tinv + j * lt + c0;
#pragma omp simd
                for (std::size_t m = 0; m < B; ++m) acc0[m] -= a0 * t0[m];
            }
            T* ti = Tinv + i * lt + c0;
#pragma omp simd
            for (std::size_t m = 0; m < B; ++m) ti[m] = acc0[m] + acc1[m];
            if (i < c0 + B) ti[i - c0] = T{1};
        }
    }
    for (std::size_t i = 0; i < L; ++i) {
        const T bi = beta[i * ldg], wk = bi * p.eg[i];
        const T *kr = p.Kc + i * K, *vr = Vr + i * ldv;
        T* x = Xb + i * KV;
#pragma omp simd
        for (std::size_t n = 0; n < K; ++n) x[n] = wk * kr[n];
#pragma omp simd
        for (std::size_t n = 0; n < V; ++n) x[K + n] = bi * vr[n];
    }
    w.gemm(false, false, L, KV, L, T{1}, Tinv, lt, Xb, KV, T{0}, p.WU, KV, lower_triangle);  // W | U
    // V_new = U - W S
    for (std::size_t i = 0; i < L; ++i) std::copy_n(p.WU + i * KV + K, V, p.Vn + i * V);
    if (p.S) w.gemm(false, false, L, V, K, T{-1}, p.WU, KV, p.S, V, T{1}, p.Vn, V);
}

/// rows[i, :] = scales[i] * src[i, :] for L rows of n (src strided by lds, dst dense).
template <class T>
void scaled_rows(std::size_t L, std::size_t n, const T* scales, const T* src, std::size_t lds, T* dst) {
    for (std::size_t i = 0; i < L; ++i) {
        const T e = scales[i];
        const T* x = src + i * lds;
        T* y = dst + i * n;
#pragma omp simd
        for (std::size_t j = 0; j < n; ++j) y[j] = e * x[j];
    }
}

/// The state after a prepared piece, S' = e^{gamma_last} S + (K . e^{gamma_last - gamma})^T V_new, into
/// `out` (may be p.S's buffer).
template <Real T>
void state_after(const Geometry& geo, const Piece<T>& p, T* out, Scratch<T>& w) {
    const std::size_t K = geo.key, V = geo.value;
    scaled_rows(p.L, K, p.eout, p.Kc, K, w.Kd);
    if (p.S && out != p.S) std::copy_n(p.S, K * V, out);
    w.gemm(true, false, K, V, p.L, T{1}, w.Kd, K, p.Vn, V, p.S ? p.decay_all : T{0}, out, V);
}

/// The pieces of steps [t0, t1) of row b: runs of at most `block` steps (blocks start at t0, t0 +
/// block, ...) further split where a document starts; calls f(s, e) for each in order.
template <class T, class F>
void for_each_piece(const Geometry& geo, const Buffers<T>& in, std::size_t b, std::size_t t0, std::size_t t1, F&& f) {
    for (std::size_t s = t0; s < t1;) {
        const std::size_t block_end = std::min(t1, t0 + ((s - t0) / geo.block + 1) * geo.block);
        std::size_t e = s + 1;
        while (e < block_end && !in.reset(geo, b, e)) ++e;
        f(s, e);
        s = e;
    }
}

/// Asks the cache for rows [s, e) of (b, h) of x ([batch, T, H, n]; e clamped to T), to write them
/// or to read them: the next block's rows, fetched while this block computes. The rows of one head
/// are H n apart (2 KB at H n = 512 floats): the products' first touches of them otherwise wait on
/// memory (3-10x the time of a product of 16 x 64 x 16 on data in cache).
template <class T>
void prefetch_rows(const Geometry& geo, const T* x, std::size_t n, std::size_t b, std::size_t h, std::size_t s, std::size_t e, bool write) {
#if defined(__GNUC__)
    e = std::min(e, geo.time);
    for (std::size_t t = s; t < e; ++t) {
        const T* row = x + ((b * geo.time + t) * geo.heads + h) * n;
        for (std::size_t j = 0; j < n; j += line<T>) {
            if (write) __builtin_prefetch(row + j, 1);
            else __builtin_prefetch(row + j, 0);
        }
    }
#else
    (void)geo, (void)x, (void)n, (void)b, (void)h, (void)s, (void)e, (void)write;
#endif
}

/// Forward of (b, h): o, the final state, and the chunk checkpoints when `ckpt` is not null.
template <Real T>
void forward_task(const Geometry& geo, const Buffers<T>& in, std::size_t b, std::size_t h, T* o, T* state_out, T* ckpt, Scratch<T>& w) {
    const std::size_t K = geo.key, V = geo.value, KV = K * V;
    const T scale = T(geo.scale);
    bool zero = !in.h0;  // w.S is zero (not read)
    if (in.h0) std::copy_n(in.h0 + geo.state(b, h), KV, w.S);
    for (std::size_t c = 0; c < geo.chunks; ++c) {
        const std::size_t t0 = c * geo.chunk, t1 = std::min(geo.time, t0 + geo.chunk);
        if (ckpt) {
            if (zero) std::fill_n(ckpt + geo.checkpoint(b, h, c), KV, T{0});
            else std::copy_n(w.S, KV, ckpt + geo.checkpoint(b, h, c));
        }
        for_each_piece(geo, in, b, t0, t1, [&](std::size_t s, std::size_t e) {
            Piece<T> p;
            p.s = s;
            p.L = e - s;
            p.S = zero || in.reset(geo, b, s) ? nullptr : w.S;
            w.arena_at = w.arena;
            const std::size_t next = e + geo.block;  // the next block's rows (a bound: blocks can be shorter)
            prefetch_rows(geo, in.q, K, b, h, e, next, false);
            prefetch_rows(geo, in.k, K, b, h, e, next, false);
            prefetch_rows(geo, in.v, V, b, h, e, next, false);
            prefetch_rows(geo, o, V, b, h, e, next, true);
            prepare(geo, in, b, h, p, w);
            // O = scale [tril(Q K^T . Gamma) V_new + (Q . e^gamma) S], then copied to o's rows
            w.gemm(false, false, p.L, V, p.L, scale, p.M, p.L, p.Vn, V, T{0}, w.Oc, V, lower_triangle);
            if (p.S) {
                scaled_rows(p.L, K, p.eg, p.Qc, K, w.Qg);
                w.gemm(false, false, p.L, V, K, scale, w.Qg, K, p.S, V, T{1}, w.Oc, V);
            }
            for (std::size_t i = 0; i < p.L; ++i) std::copy_n(w.Oc + i * V, V, o + geo.vo(b, s + i, h));
            state_after(geo, p, w.S, w);
            zero = false;
        });
    }
    if (zero) std::fill_n(state_out + geo.state(b, h), KV, T{0});
    else std::copy_n(w.S, KV, state_out + geo.state(b, h));
}

/// Backward of a prepared piece of (b, h) (see the top of this file). dS: the adjoint of the state
/// after the piece (null: zero); dO: the adjoint of o. Writes the piece's rows of dq, dk, dv, dg
/// and dbeta; returns the adjoint of p.S, computed in place of dS (or in w.dS when dS is null),
/// or null when p.S is null (nothing flows further back).
template <Real T>
T* backward_piece(const Geometry& geo, const Buffers<T>& in, const T* dO, const Gradients<T>& out, std::size_t b, std::size_t h,
                  const Piece<T>& p, T* dS, Scratch<T>& w) {
    const std::size_t L = p.L, s = p.s, K = geo.key, V = geo.value, KV = K + V, ldv = geo.heads * V, ldg = geo.heads;
    const std::size_t lt = whole_lines<T>(L);
    const T scale = T(geo.scale), decay_all = p.decay_all;
    const T* S = p.S;
    const T *Q = p.Qc, *Kr = p.Kc, *Vr = in.v + geo.vo(b, s, h), *beta = in.beta + geo.gate(b, s, h);
    T *dq = w.dQc, *dk = w.dKc, *dv = out.dv + geo.vo(b, s, h);  // dq and dk go to their rows at the end
    T* dOr = w.dOc;  // the rows of do, contiguous
    for (std::size_t i = 0; i < L; ++i) std::copy_n(dO + geo.vo(b, s + i, h), V, dOr + i * V);
    T *dg = out.dg + geo.gate(b, s, h), *dbeta_out = out.dbeta + geo.gate(b, s, h);
    const T *W = p.WU, *U = p.WU + K, *Vn = p.Vn;
    T *dW = w.dWV, *dVn = w.dWV + K, *dWb = w.Xb, *dUb = w.Xb + K, *dA = w.dA, *dM = w.dM;
    // dV_new = scale M^T dO + Kd dS; dKd = V_new dS^T; dM = scale dO V_new^T
    w.gemm(true, false, L, V, L, scale, p.M, L, dOr, V, T{0}, dVn, KV, upper_triangle);
    if (dS) {
        scaled_rows(L, K, p.eout, Kr, K, w.Kd);
        w.gemm(false, false, L, V, K, T{1}, w.Kd, K, dS, V, T{1}, dVn, KV);
        w.gemm(false, true, L, K, V, T{1}, Vn, V, dS, V, T{0}, w.dKd, K);
    }
    w.gemm(false, true, L, L, V, scale, dOr, V, Vn, V, T{0}, dM, L);
    const T sd = S && dS ? dot(S, dS, K * V) : T{0};  // <S, dS>, before dS becomes dS_in
    T* dS_in = nullptr;
    if (S) {
        // dQg = scale dO S^T; dW = -dV_new S^T; dS_in = e^{gamma_L} dS + scale Qg^T dO - W^T dV_new
        scaled_rows(L, K, p.eg, Q, K, w.Qg);
        small_gemm_transpose(K, V, S, V, w.St, K);  // S^T, the right operand of both
        w.gemm(false, false, L, K, V, scale, dOr, V, w.St, K, T{0}, w.dQg, K);
        w.gemm(false, false, L, K, V, T{-1}, dVn, KV, w.St, K, T{0}, dW, KV);
        dS_in = dS ? dS : w.dS;
        w.gemm(true, false, K, V, L, scale, w.Qg, K, dOr, V, dS ? decay_all : T{0}, dS_in, V);
        w.gemm(true, false, K, V, L, T{-1}, W, KV, dVn, KV, T{1}, dS_in, V);
        // [dWb | dUb] = Tinv^T [dW | dV_new]; dA = -(dWb W^T + dUb U^T)
        w.gemm(true, false, L, KV, L, T{1}, p.Tinv, lt, dW, KV, T{0}, dWb, KV, upper_triangle);
        w.gemm(false, true, L, L, KV, T{-1}, dWb, KV, W, KV, T{0}, dA, L);
    } else {  // W S = 0: dW = 0, dWb = 0
        w.gemm(true, false, L, V, L, T{1}, p.Tinv, lt, dVn, KV, T{0}, dUb, KV, upper_triangle);
        w.gemm(false, true, L, L, V, T{-1}, dUb, KV, U, KV, T{0}, dA, L);
    }
    // Elementwise on the triangles: dbeta_i's share sum_j dA_ij AK_ij; E = dA . A + dM . M (row and
    // column sums: gamma's gradient through Gamma); dA becomes P = dA . diag(beta) Gamma (strict
    // lower), dM becomes dM . Gamma (lower).
    T* colsum = w.colsum;
    std::fill_n(colsum, L, T{0});
    for (std::size_t i = 0; i < L; ++i) {
        const T bi = beta[i * ldg];
        T *da = dA + i * L, *dm = dM + i * L;
        const T *ak = p.AK + i * L, *m = p.M + i * L, *gam = p.Gam + i * L;
        T db{0}, rs{0};
#pragma omp simd reduction(+ : db, rs)
        for (std::size_t j = 0; j < i; ++j) {
            const T dak = da[j] * ak[j];
            const T e = bi * dak + dm[j] * m[j];
            db += dak;
            rs += e;
            colsum[j] += e;
            da[j] *= bi * gam[j];
            dm[j] *= gam[j];
        }
        for (std::size_t j = i; j < L; ++j) da[j] = T{0};
        for (std::size_t j = i + 1; j < L; ++j) dm[j] = T{0};
        w.dbeta[i] = db;
        w.dgam[i] = rs;
    }
    for (std::size_t i = 0; i < L; ++i)  // P + P^T
        for (std::size_t j = 0; j < i; ++j) dA[j * L + i] = dA[i * L + j];
    // dQ = (dM . Gamma) K (+ e^gamma . dQg below); dK = (dM . Gamma)^T Q + (P + P^T) K (+ ...)
    w.gemm(false, false, L, K, L, T{1}, dM, L, Kr, K, T{0}, dq, K, lower_triangle);
    w.gemm(true, false, L, K, L, T{1}, dM, L, Q, K, T{0}, dk, K, upper_triangle);
    w.gemm(false, false, L, K, L, T{1}, dA, L, Kr, K, T{1}, dk, K);
    T* dgam = w.dgam;
    T dlast{0};
    for (std::size_t i = 0; i < L; ++i) {
        const T bi = beta[i * ldg], egi = p.eg[i], eouti = p.eout[i];
        const T *kr = Kr + i * K, *vr = Vr + i * ldv, *qr = Q + i * K, *dub = dUb + i * KV;
        T *dqr = dq + i * K, *dkr = dk + i * K, *dvr = dv + i * ldv;
        T dgi = dgam[i] - colsum[i], dbi = w.dbeta[i];
        T vu{0};
#pragma omp simd reduction(+ : vu)
        for (std::size_t n = 0; n < V; ++n) {
            dvr[n] = bi * dub[n];
            vu += vr[n] * dub[n];
        }
        dbi += vu;
        if (S) {
            const T *dwb = dWb + i * KV, *dqg = w.dQg + i * K;
            T kw{0}, qq{0};
            const T bk = bi * egi;
#pragma omp simd reduction(+ : kw, qq)
            for (std::size_t n = 0; n < K; ++n) {
                kw += kr[n] * dwb[n];
                qq += qr[n] * dqg[n];
                dqr[n] += egi * dqg[n];
                dkr[n] += bk * dwb[n];
            }
            dbi += egi * kw;
            dgi += bk * kw + egi * qq;
        }
        if (dS) {
            const T* dkd = w.dKd + i * K;
            T kd{0};
#pragma omp simd reduction(+ : kd)
            for (std::size_t n = 0; n < K; ++n) {
                kd += kr[n] * dkd[n];
                dkr[n] += eouti * dkd[n];
            }
            dgi -= eouti * kd;
            dlast += eouti * kd;
        }
        dgam[i] = dgi;
        dbeta_out[i * ldg] = dbi;
        std::copy_n(dqr, K, out.dq + geo.qk(b, s + i, h));
        std::copy_n(dkr, K, out.dk + geo.qk(b, s + i, h));
    }
    dgam[L - 1] += dlast + decay_all * sd;
    // dg_j = sum_{i >= j} dgamma_i; with no state entering, g_s multiplies nothing
    T acc{0};
    for (std::size_t i = L; i-- > 0;) dg[i * ldg] = acc += dgam[i];
    if (!S) dg[0] = T{0};
    return dS_in;
}

/// Backward of (b, h): the chunks from last to first, carrying the adjoint of the state. Per chunk
/// the pieces are prepared in order from the checkpoint (the states entering the later ones
/// recomputed into the arena), then differentiated from last to first.
template <Real T>
void backward_task(const Geometry& geo, const Buffers<T>& in, const T* dO, const T* dstate, const T* ckpt, const Gradients<T>& out,
                   std::size_t b, std::size_t h, Scratch<T>& w) {
    const std::size_t KV = geo.key * geo.value;
    std::copy_n(dstate + geo.state(b, h), KV, w.dS);
    T* dS = w.dS;  // null once nothing flows back (a reset, or a zero initial state)
    for (std::size_t c = geo.chunks; c-- > 0;) {
        const std::size_t t0 = c * geo.chunk, t1 = std::min(geo.time, t0 + geo.chunk);
        w.arena_at = w.arena;
        w.pieces.clear();
        const T* S = c > 0 || in.h0 || out.dh0 ? ckpt + geo.checkpoint(b, h, c) : nullptr;  // the state entering step s
        for_each_piece(geo, in, b, t0, t1, [&](std::size_t s, std::size_t e) {
            Piece<T>& p = w.pieces.emplace_back();
            p.s = s;
            p.L = e - s;
            p.S = in.reset(geo, b, s) ? nullptr : S;
            prefetch_rows(geo, in.q, geo.key, b, h, e, e + geo.block, false);
            prefetch_rows(geo, in.k, geo.key, b, h, e, e + geo.block, false);
            prefetch_rows(geo, in.v, geo.value, b, h, e, e + geo.block, false);
            prepare(geo, in, b, h, p, w);
            if (e < t1 && !in.reset(geo, b, e)) {  // the next piece starts at a block boundary: its state
                T* next = w.take(KV);
                state_after(geo, p, next, w);
                S = next;
            }
        });
        for (std::size_t i = w.pieces.size(); i-- > 0;) {
            const std::size_t s = w.pieces[i].s, before = s - std::min(s, geo.block);  // the rows of the block processed next
            prefetch_rows(geo, dO, geo.value, b, h, before, s, false);
            prefetch_rows(geo, out.dq, geo.key, b, h, before, s, true);
            prefetch_rows(geo, out.dk, geo.key, b, h, before, s, true);
            prefetch_rows(geo, out.dv, geo.value, b, h, before, s, true);
            if (i == 0) {  // the next chunk's first block
                prefetch_rows(geo, in.q, geo.key, b, h, before, s, false);
                prefetch_rows(geo, in.k, geo.key, b, h, before, s, false);
                prefetch_rows(geo, in.v, geo.value, b, h, before, s, false);
            }
            dS = backward_piece(geo, in, dO, out, b, h, w.pieces[i], dS, w);
        }
    }
    if (out.dh0) {
        if (dS) std::copy_n(dS, KV, out.dh0 + geo.state(b, h));
        else std::fill_n(out.dh0 + geo.state(b, h), KV, T{0});
    }
}

/// Forward over every (batch, head) on the current backend.
template <Real T>
void forward(const Geometry& geo, const Buffers<T>& in, T* o, T* state_out, T* ckpt) {
    const std::size_t work = geo.time * geo.key * geo.value * (geo.chunk + geo.key + geo.value);
    const auto gemm = backend::SmallProducts<T>::in_force();
    backend::current().parallel_for(geo.tasks(), work, [&](std::size_t lo, std::size_t hi) {
        scan::detail::denormal_guard guard;
        Scratch<T> scratch(geo, false, gemm);
        for (std::size_t task = lo; task < hi; ++task) forward_task(geo, in, task / geo.heads, task % geo.heads, o, state_out, ckpt, scratch);
    });
}

/// Backward over every (batch, head) on the current backend: each task writes its own rows.
template <Real T>
void backward(const Geometry& geo, const Buffers<T>& in, const T* dO, const T* dstate, const T* ckpt, const Gradients<T>& out) {
    const std::size_t work = 4 * geo.time * geo.key * geo.value * (geo.chunk + geo.key + geo.value);
    const auto gemm = backend::SmallProducts<T>::in_force();
    backend::current().parallel_for(geo.tasks(), work, [&](std::size_t lo, std::size_t hi) {
        scan::detail::denormal_guard guard;
        Scratch<T> scratch(geo, true, gemm);
        for (std::size_t task = lo; task < hi; ++task)
            backward_task(geo, in, dO, dstate, ckpt, out, task / geo.heads, task % geo.heads, scratch);
    });
}

using backend::trace::in_program;

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
    D = in_program(D);
    for (std::size_t s = 1; s < P; s *= 2) {
        const std::size_t pairs = P / (2 * s);
        // [pairs, 1, pairs, 1]: 1 where the two pair indices agree (picks the diagonal blocks)
        const Tensor<T> same = reshape(masks::identity<T>(pairs), Shape{pairs, 1, pairs, 1});
        // A21 of each pair: rows of its second block, columns of its first, [L, pairs, s, s]
        const Tensor<T> blocks = reshape(Ap, Shape{L, pairs, 2, s, pairs, 2, s});
        const Tensor<T> lower_left = reshape(slice(slice(blocks, 2, 1, 2), 5, 0, 1), Shape{L, pairs, s, pairs, s});
        const Tensor<T> A21 = sum(mul(lower_left, in_program(same)), {3});
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
/// in batched GEMMs ([batch, H, chunks, C, ...]), (I + A)^-1 by block forward substitution, and
/// the chunk-to-chunk state recurrence as one matrix_scan (a loop in the program). Composed of
/// traced ops, so the tape differentiates it.
template <Real T>
GatedDeltaResult<T> traced(const Geometry& geo, const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Tensor<T>& g,
                           const Tensor<T>& beta, const Tensor<T>& h0_in, const Tensor<T>& resets_in) {
    const std::size_t nb = geo.batch, nt = geo.time, nh = geo.heads, C = geo.chunk, n = geo.chunks, extra = n * C - nt;
    using masks::triangle, masks::Triangle;  // [C, C]: i <= j (cumulative sums), i >= j, i > j
    const Tensor<T> cumsum = in_program(triangle<T>(C, Triangle::upper)), causal = in_program(triangle<T>(C, Triangle::lower)),
                    below = in_program(triangle<T>(C, Triangle::strictly_lower));
    const Tensor<T> h0 = in_program(h0_in);
    const Tensor<T> resets = resets_in.defined() ? masks::start_flags(resets_in) : Tensor<T>();  // 0/1

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
        Gamma = mul(Gamma, masks::is_zero_count(relu(sub(column(count), row(count)))));  // starts in (j, i]
        decay_in = mul(decay_in, masks::is_zero_count(count));                           // starts in [0, i]
        decay_out = mul(decay_out, masks::is_zero_count(sub(count_last, count)));        // starts in (i, C)
        decay_all = mul(decay_all, masks::is_zero_count(count_last));
    }
    const Tensor<T> Kt = transpose(Kc);  // [batch, H, chunks, K, C]
    // A = strict_tril(diag(beta) K K^T . Gamma); (I + A)^-1 by block forward substitution (unit_lower_inverse)
    const Tensor<T> A = mul(mul(matmul(Kc, Kt), Gamma), mul(column(betas), below));
    const Tensor<T> inverse = reshape(unit_lower_inverse(reshape(A, Shape{nb * nh * n, C, C})), Shape{nb, nh, n, C, C});
    const Tensor<T> W = matmul(inverse, mul(Kc, column(mul(betas, decay_in))));  // [batch, H, chunks, C, K]
    const Tensor<T> U = matmul(inverse, mul(Vc, column(betas)));                 // [batch, H, chunks, C, V]
    const Tensor<T> Kout = transpose(mul(Kc, column(decay_out)));                // (K . e^{gamma_C - gamma})^T
    // The chunk-to-chunk recurrence S_{c+1} = e^{gamma_C} S_c + Kout_c (U_c - W_c S_c), linear in S: one
    // matrix scan (one loop in the program, not n chunks unrolled) with gates e^{gamma_C} I - Kout_c W_c
    // and inputs Kout_c U_c. Without h0 the first chunk is entered with S = 0, so the state after it
    // is its input and the scan starts at the second chunk (no products with a zero state).
    const std::size_t K = geo.key, V = geo.value, first = h0.defined() ? 0 : 1;  // the first chunk entered with a state
    auto from_first = [&](const Tensor<T>& x) { return first ? slice(x, 2, first, n) : x; };  // chunks first .. n-1
    auto to_all = [&](const Tensor<T>& x) { return first ? pad(x, 2, first, 0) : x; };        // and back, zeros before
    const Tensor<T> inputs = matmul(Kout, U);                                                   // [batch, H, chunks, K, V]
    const Tensor<T> start = first ? reshape(slice(inputs, 2, 0, 1), Shape{nb, nh, K, V}) : h0;  // the state entering chunk `first`
    Tensor<T> news = U, final_state = start, from_state;  // V_new, the state after the last chunk, (Q . e^gamma) S
    if (n > first) {
        const std::size_t m = n - first;
        const Tensor<T> W_on = from_first(W);
        const Tensor<T> transition =
            sub(mul(reshape(from_first(decay_all), Shape{nb, nh, m, 1, 1}), in_program(masks::identity<T>(K))), matmul(from_first(Kout), W_on));
        const auto [after, last_state] = matrix_scan(reshape(transition, Shape{nb * nh, m, K, K}),
                                                     reshape(from_first(inputs), Shape{nb * nh, m, K, V}), reshape(start, Shape{nb * nh, K, V}));
        // the state entering each of those chunks: `start`, then the state after each but the last
        const Tensor<T> entering =
            add(slice(pad(reshape(after, Shape{nb, nh, m, K, V}), 2, 1, 0), 2, 0, m), pad(reshape(start, Shape{nb, nh, 1, K, V}), 2, 0, m - 1));
        news = sub(U, to_all(matmul(W_on, entering)));  // V_new = U - W S
        from_state = to_all(matmul(from_first(mul(Q, column(decay_in))), entering));
        final_state = reshape(last_state, Shape{nb, nh, K, V});
    }
    // O = tril(Q K^T . Gamma) V_new + (Q . e^gamma) S
    Tensor<T> O = matmul(mul(matmul(Q, Kt), Gamma), news);
    if (from_state.defined()) O = add(O, from_state);
    O = reshape(olmax::scale(O, T(geo.scale)), Shape{nb, nh, n * C, geo.value});
    if (extra) O = slice(O, 2, 0, nt);
    return {transpose(O, {0, 2, 1, 3}), final_state};
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
    return on.run_composed([&] { return gd::traced(geo, q, k, v, g, beta, h0, resets); }, [&] {
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
    });
}

}  // namespace olmax::scan
