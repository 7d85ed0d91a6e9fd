#pragma once
// The selective scan of Mamba (Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective
// State Spaces", arXiv:2312.00752, Algorithm 2) as one differentiable op with its own exact,
// linear-memory backward.
//
// Shapes: u, delta [batch, T, E]; A [E, N] (diagonal state matrix per channel); B, C [batch, T, N]
// (shared by all channels); D [E] (skip, optional); state h [batch, E, N]. Per channel e and state n:
//
//     abar_t = exp(delta_t A)                       (zero-order hold of A; 0 at a segment start)
//     h_t    = abar_t h_{t-1} + delta_t B_t u_t     (Mamba's simplified hold of B: delta B, not A^-1 (abar - 1) B)
//     y_t    = sum_n C_t h_t + D u_t,               h_{-1} = h0 (zeros when not given)
//
// Memory. The [batch, T, E, N] states are never stored: the forward keeps the state of each
// (batch, channel block) in a small buffer, fusing discretisation, recurrence and the C projection
// per step, and writes only the state entering every chunk of `chunk` steps
// ([batch, ceil(T/chunk), E, N], and only when the op is recorded). The backward walks the chunks
// from last to first, recomputes one chunk's states (and abar) from its checkpoint into
// per-task scratch [chunk, E_block, N], then runs the adjoint recurrence backwards through it:
//
//     g_t    = C_t dy_t + abar_{t+1} g_{t+1},       g_{T-1} = C dy_{T-1} + dh_last   (adjoint of h_t)
//     du_t   = D dy_t + delta_t sum_n g_t B_t
//     ddelta = u_t sum_n g_t B_t + sum_n A g_t abar_t h_{t-1}
//     dA     = sum_{b,t} delta_t g_t abar_t h_{t-1},   dD = sum_{b,t} dy_t u_t
//     dB_t   = sum_e g_t delta_t u_t,   dC_t = sum_e dy_t h_t,   dh0 = abar_0 g_0
//
// The recomputed states are bit-identical to the forward's (same expression, same order), so the
// result does not depend on the chunk size. Memory is linear in T: checkpoints B T E N / chunk,
// plus the gradients themselves and, for dB and dC (sums over channels), one partial [batch, T, N]
// per channel block.
//
// Segments (packed documents): `resets[b, t] != 0` marks position t as the first of a new
// sequence. The carried state is dropped there (abar_t = 0, so h_t = delta_t B_t u_t), and no
// gradient flows back across that step. With resets, h0 only reaches the first segment.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/core/error.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/ops/op_keys.hpp"
#include "olmax/detail/simd.hpp"
#include "olmax/ops/math_rules.hpp"
#include "olmax/scan/detail/denormals.hpp"

namespace olmax::scan {

/// Options of scan::selective_scan.
template <class T>
struct SelectiveScanOptions {
    /// Initial state h_{-1}, shape [batch, E, N]; undefined means zeros. Differentiable.
    Tensor<T> h0 = {};
    /// Segment starts, shape [batch, T]: nonzero where a new sequence begins (the carried state is
    /// zeroed before that step). Undefined means one sequence per row. Not differentiated.
    /// From a packed byte batch: resets = (inputs == ByteTokenizer::end_of_document), since every
    /// document's first input is the EOD byte that ended the one before (data/loader.hpp).
    Tensor<T> resets = {};
    /// Time steps per checkpoint chunk of the backward's recomputation (>= 1; unset = 64): the
    /// checkpoints take B T E N / chunk elements, the backward's scratch 2 chunk E_block N per task.
    std::optional<long> chunk = std::nullopt;
};

/// y [batch, T, E] and the state after the last step, h_last [batch, E, N].
template <class T>
struct SelectiveScanResult {
    Tensor<T> y;
    Tensor<T> h_last;
};

/// Sizes of a selective scan on caller-owned buffers (selective_scan_forward / _backward below).
/// `chunk` (>= 1) is the checkpoint interval; the checkpoints hold ceil(time / min(chunk, time))
/// states.
struct SelectiveScanSizes {
    std::size_t batch = 0, time = 0, channels = 0, state = 0, chunk = 64;
};

/// The operands as dense row-major buffers of the shapes at the top of this file; D, h0 and resets
/// may be null (no skip, zero initial state, one sequence per row).
template <class T>
struct SelectiveScanBuffers {
    const T *u = nullptr, *delta = nullptr, *A = nullptr, *B = nullptr, *C = nullptr, *D = nullptr, *h0 = nullptr, *resets = nullptr;
};

/// Where selective_scan_backward writes: du, ddelta, dB and dC always; dA, dD and dh0 when not null.
template <class T>
struct SelectiveScanGradients {
    T *du = nullptr, *ddelta = nullptr, *dA = nullptr, *dB = nullptr, *dC = nullptr, *dD = nullptr, *dh0 = nullptr;
};

namespace detail::selective {

inline constexpr std::size_t default_chunk = 64;

/// Sizes of one call. Work is split into (batch, channel block) tasks; `blocks` depends on the
/// sizes only, never on the thread count, so the partial sums of dB and dC over channel blocks,
/// and with them the gradients, are the same on every machine.
struct Geometry {
    std::size_t batch = 0, time = 0, channels = 0, state = 0, chunk = default_chunk, chunks = 0, blocks = 1;
    std::size_t block_begin(std::size_t k) const { return channels * k / blocks; }
    std::size_t tasks() const { return batch * blocks; }
};

/// About 64 tasks over batch x channel blocks, but no more blocks than E / N: each block's partial
/// dB and dC ([batch, T, N]) then take no more memory than u itself.
inline std::size_t channel_blocks(std::size_t batch, std::size_t channels, std::size_t state) {
    constexpr std::size_t target_tasks = 64;
    const std::size_t wanted = (target_tasks + batch - 1) / batch;
    return std::clamp<std::size_t>(wanted, 1, std::max<std::size_t>(1, channels / std::max<std::size_t>(state, 1)));
}

inline Geometry geometry_of(const SelectiveScanSizes& s) {
    check<value_error>(s.batch > 0 && s.time > 0 && s.channels > 0 && s.state > 0 && s.chunk > 0,
                       "scan::selective_scan: sizes batch ", s.batch, ", T ", s.time, ", E ", s.channels, ", N ", s.state, " and chunk ",
                       s.chunk, " must all be positive");
    Geometry g;
    g.batch = s.batch;
    g.time = s.time;
    g.channels = s.channels;
    g.state = s.state;
    g.chunk = std::min(s.chunk, s.time);
    g.chunks = (g.time + g.chunk - 1) / g.chunk;
    g.blocks = channel_blocks(g.batch, g.channels, g.state);
    return g;
}

template <class T>
Geometry make_geometry(const Tensor<T>& u, const Tensor<T>& delta, const Tensor<T>& A, const Tensor<T>& B, const Tensor<T>& C,
                       const Tensor<T>& D, const SelectiveScanOptions<T>& opt) {
    constexpr std::string_view op = "scan::selective_scan";
    check<value_error>(u.defined() && delta.defined() && A.defined() && B.defined() && C.defined(), op,
                       ": u, delta, A, B and C must be defined tensors");
    check<shape_error>(u.rank() == 3, op, ": u must have shape [batch, T, E], got ", to_string(u.shape()));
    Geometry g;
    g.batch = u.extent(0);
    g.time = u.extent(1);
    g.channels = u.extent(2);
    check<value_error>(g.time > 0, op, ": the sequence is empty (T = 0) in u of shape ", to_string(u.shape()));
    check<value_error>(g.batch > 0 && g.channels > 0, op, ": u of shape ", to_string(u.shape()), " has no rows (batch or E is 0)");
    check<shape_error>(delta.shape() == u.shape(), op, ": delta of shape ", to_string(delta.shape()), " does not match u of shape ",
                       to_string(u.shape()), " (both [batch, T, E])");
    check<shape_error>(A.rank() == 2 && A.extent(0) == g.channels && A.extent(1) > 0, op, ": A of shape ", to_string(A.shape()),
                       " must be [E, N] with E = ", g.channels, " (from u of shape ", to_string(u.shape()), ") and N > 0");
    g.state = A.extent(1);
    auto check_bc = [&](const Tensor<T>& t, std::string_view name) {
        check<shape_error>(t.rank() == 3 && t.extent(0) == g.batch && t.extent(1) == g.time && t.extent(2) == g.state, op, ": ", name,
                           " of shape ", to_string(t.shape()), " does not match [batch, T, N] = [", g.batch, ", ", g.time, ", ", g.state,
                           "] (batch and T from u ", to_string(u.shape()), ", N from A ", to_string(A.shape()), ")");
    };
    check_bc(B, "B");
    check_bc(C, "C");
    if (D.defined())
        check<shape_error>(D.rank() == 1 && D.extent(0) == g.channels, op, ": D of shape ", to_string(D.shape()), " must be [E] = [",
                           g.channels, "]");
    if (opt.h0.defined())
        check<shape_error>(opt.h0.rank() == 3 && opt.h0.extent(0) == g.batch && opt.h0.extent(1) == g.channels &&
                               opt.h0.extent(2) == g.state,
                           op, ": h0 of shape ", to_string(opt.h0.shape()), " does not match [batch, E, N] = [", g.batch, ", ", g.channels,
                           ", ", g.state, "]");
    if (opt.resets.defined())
        check<shape_error>(opt.resets.rank() == 2 && opt.resets.extent(0) == g.batch && opt.resets.extent(1) == g.time, op,
                           ": resets of shape ", to_string(opt.resets.shape()), " does not match [batch, T] = [", g.batch, ", ", g.time,
                           "]");
    if (opt.chunk) check<value_error>(*opt.chunk >= 1, op, ": chunk size must be >= 1, got ", *opt.chunk);
    return geometry_of({g.batch, g.time, g.channels, g.state, opt.chunk ? std::size_t(*opt.chunk) : default_chunk});
}

template <class T>
bool reset_at(const SelectiveScanBuffers<T>& in, const Geometry& g, std::size_t b, std::size_t t) {
    return in.resets && in.resets[b * g.time + t] != T{0};
}

/// One step of one channel: h = abar h_prev + (delta u) B with abar = exp(delta A), or
/// h = (delta u) B at a segment start. The forward and the backward's recomputation both call it,
/// so their states agree bit for bit. `h` may alias `h_prev`; `abar` receives the gates when
/// StoreGates. The exponentials, the step's cost, run on SIMD batches (xsimd: GCC does not
/// vectorise std::exp), the last partial batch through zero-padded copies (math::for_each_batch),
/// so every state takes the same code. `Arch` (the instruction set of this translation unit) is part of the name, so
/// translation units built for different CPUs never share one instantiation.
template <bool StoreGates, class T, class Arch = xsimd::default_arch>
inline void advance(std::size_t n_state, const T* a_row, const T* b_t, T dt, T x, bool reset, const T* h_prev, T* h, T* abar) {
    const T dtx = dt * x;
    if (reset) {
        for (std::size_t n = 0; n < n_state; ++n) {
            h[n] = dtx * b_t[n];
            if constexpr (StoreGates) abar[n] = T{0};
        }
        return;
    }
    using batch = xsimd::batch<T, Arch>;
    const batch dt_b(dt), dtx_b(dtx);
    auto step = [&](const T* a, const T* hp, const T* bt, T* out, T* gates) {
        const batch gate = xsimd::exp(dt_b * batch::load_unaligned(a));
        (gate * batch::load_unaligned(hp) + dtx_b * batch::load_unaligned(bt)).store_unaligned(out);
        if constexpr (StoreGates) gate.store_unaligned(gates);
    };
    math::for_each_batch<batch::size>(
        n_state, std::array<const T*, 3>{a_row, h_prev, b_t},
        [&](const std::array<const T*, 3>& p, std::size_t n) { step(p[0] + n, p[1] + n, p[2] + n, h + n, StoreGates ? abar + n : nullptr); },
        [&](const std::array<const T*, 3>& q, std::size_t n, std::size_t rest) {
            T out[batch::size], gates[batch::size];
            step(q[0], q[1], q[2], out, gates);
            std::copy_n(out, rest, h + n);
            if constexpr (StoreGates) std::copy_n(gates, rest, abar + n);
        });
}
/// Forward of channels [e0, e1) of batch b: y, h_last, and the chunk checkpoints when `ckpt`.
template <class T>
void forward_task(const Geometry& g, const SelectiveScanBuffers<T>& in, std::size_t b, std::size_t e0, std::size_t e1, T* y, T* h_last, T* ckpt,
                  T* state) {
    const std::size_t N = g.state, E = g.channels, ne = e1 - e0;
    for (std::size_t i = 0; i < ne * N; ++i) state[i] = in.h0 ? in.h0[(b * E + e0) * N + i] : T{0};
    for (std::size_t t = 0; t < g.time; ++t) {
        if (ckpt && t % g.chunk == 0) std::copy_n(state, ne * N, ckpt + ((b * g.chunks + t / g.chunk) * E + e0) * N);
        const bool reset = reset_at(in, g, b, t);
        const std::size_t row = (b * g.time + t) * E;
        const T *b_t = in.B + (b * g.time + t) * N, *c_t = in.C + (b * g.time + t) * N;
        for (std::size_t e = e0; e < e1; ++e) {
            T* h = state + (e - e0) * N;
            const T dt = in.delta[row + e], x = in.u[row + e];
            advance<false>(N, in.A + e * N, b_t, dt, x, reset, h, h, static_cast<T*>(nullptr));
            T acc = T{0};
#pragma omp simd reduction(+ : acc)
            for (std::size_t n = 0; n < N; ++n) acc += c_t[n] * h[n];
            y[row + e] = acc + (in.D ? in.D[e] * x : T{0});
        }
    }
    std::copy_n(state, ne * N, h_last + (b * E + e0) * N);
}

/// Where one backward task writes. dB_part / dC_part: [blocks, batch, T, N] (the block's partial
/// sums over its channels; the gradient itself when blocks == 1); dA_part [batch, E, N] and
/// dD_part [batch, E] in double (summed over batch afterwards, in batch order).
template <class T>
struct Outputs {
    T *du, *ddelta, *dB_part, *dC_part, *dh0;
    double *dA_part, *dD_part;
};

/// Backward of channels [e0, e1) (block k) of batch b; `scratch` holds 2 chunk ne N + ne N values.
template <class T>
void backward_task(const Geometry& g, const SelectiveScanBuffers<T>& in, const T* dy, const T* dh_last, const T* ckpt, const Outputs<T>& out,
                   std::size_t b, std::size_t k, T* scratch) {
    const std::size_t N = g.state, E = g.channels, e0 = g.block_begin(k), e1 = g.block_begin(k + 1), ne = e1 - e0;
    const std::size_t plane = ne * N;
    T* hs = scratch;                        // [chunk, ne, N] recomputed states
    T* gates = scratch + g.chunk * plane;   // [chunk, ne, N] abar
    T* carry = gates + g.chunk * plane;     // [ne, N] abar_{t+1} g_{t+1}, the adjoint arriving at h_t from later steps
    double* dA = out.dA_part + (b * E + e0) * N;
    double* dD = out.dD_part + b * E + e0;
    std::fill_n(dA, plane, 0.0);
    std::fill_n(dD, ne, 0.0);
    for (std::size_t i = 0; i < plane; ++i) carry[i] = dh_last[(b * E + e0) * N + i];
    std::vector<double> dB_t(N), dC_t(N);
    for (std::size_t c = g.chunks; c-- > 0;) {
        const std::size_t t0 = c * g.chunk, t1 = std::min(g.time, t0 + g.chunk);
        const T* start = ckpt + ((b * g.chunks + c) * E + e0) * N;  // h_{t0 - 1}
        // Recompute the chunk's states and gates from its checkpoint.
        for (std::size_t t = t0; t < t1; ++t) {
            const bool reset = reset_at(in, g, b, t);
            const std::size_t row = (b * g.time + t) * E;
            const T* b_t = in.B + (b * g.time + t) * N;
            const T* prev = t == t0 ? start : hs + (t - t0 - 1) * plane;
            for (std::size_t e = e0; e < e1; ++e) {
                const std::size_t off = (e - e0) * N;
                advance<true>(N, in.A + e * N, b_t, in.delta[row + e], in.u[row + e], reset, prev + off, hs + (t - t0) * plane + off,
                              gates + (t - t0) * plane + off);
            }
        }
        // The adjoint recurrence, backwards through the chunk.
        for (std::size_t t = t1; t-- > t0;) {
            const bool reset = reset_at(in, g, b, t);
            const std::size_t row = (b * g.time + t) * E, bt = (b * g.time + t) * N;
            const T *b_t = in.B + bt, *c_t = in.C + bt;
            const T* h_t = hs + (t - t0) * plane;
            const T* h_prev = t == t0 ? start : hs + (t - t0 - 1) * plane;
            const T* a_t = gates + (t - t0) * plane;
            std::fill(dB_t.begin(), dB_t.end(), 0.0);
            std::fill(dC_t.begin(), dC_t.end(), 0.0);
            double* dBl = dB_t.data();
            double* dCl = dC_t.data();
            for (std::size_t e = e0; e < e1; ++e) {
                const std::size_t off = (e - e0) * N;
                const T dyv = dy[row + e], dt = in.delta[row + e], x = in.u[row + e], dtx = dt * x;
                const T* a_row = in.A + e * N;
                T* gc = carry + off;
                double* dA_e = dA + off;
                T sum_gb = T{0}, sum_q = T{0};
                if (reset) {  // abar_t = 0: no gradient to A, delta through abar, or h_{t-1}
                    for (std::size_t n = 0; n < N; ++n) {
                        const T gn = gc[n] + c_t[n] * dyv;
                        dCl[n] += double(dyv * h_t[off + n]);
                        dBl[n] += double(gn * dtx);
                        sum_gb += gn * b_t[n];
                        gc[n] = T{0};
                    }
                } else {
#pragma omp simd reduction(+ : sum_gb, sum_q)
                    for (std::size_t n = 0; n < N; ++n) {
                        const T gn = gc[n] + c_t[n] * dyv;               // adjoint of h_t
                        const T q = gn * h_prev[off + n] * a_t[off + n];  // d loss / d (delta A) through abar
                        dCl[n] += double(dyv * h_t[off + n]);
                        dBl[n] += double(gn * dtx);
                        sum_gb += gn * b_t[n];
                        sum_q += q * a_row[n];
                        dA_e[n] += double(q * dt);
                        gc[n] = a_t[off + n] * gn;
                    }
                }
                out.du[row + e] = (in.D ? in.D[e] * dyv : T{0}) + dt * sum_gb;
                out.ddelta[row + e] = x * sum_gb + sum_q;
                dD[e - e0] += double(dyv) * double(x);
            }
            T* dB_out = out.dB_part + (k * g.batch * g.time + b * g.time + t) * N;
            T* dC_out = out.dC_part + (k * g.batch * g.time + b * g.time + t) * N;
            for (std::size_t n = 0; n < N; ++n) {
                dB_out[n] = T(dBl[n]);
                dC_out[n] = T(dCl[n]);
            }
        }
    }
    if (out.dh0) std::copy_n(carry, plane, out.dh0 + (b * E + e0) * N);  // after step 0 the carry is abar_0 g_0
}

/// dst[i] = sum_k part[k][i] over the blocks, in block order, accumulated in double.
template <class T>
void sum_blocks(const T* part, std::size_t blocks, std::size_t n, T* dst) {
    backend::current().parallel_for(n, blocks, [&](std::size_t lo, std::size_t hi) {
        for (std::size_t i = lo; i < hi; ++i) {
            double acc = 0;
            for (std::size_t k = 0; k < blocks; ++k) acc += double(part[k * n + i]);
            dst[i] = T(acc);
        }
    });
}

}  // namespace detail::selective

/// The op's forward on caller-owned buffers (the op below runs it; so does a traced program on the
/// XLA CPU plugin, through a native call: trace/native_calls.hpp): y [batch, T, E], h_last
/// [batch, E, N] and, when `checkpoints` is not null, the state entering every chunk
/// [batch, ceil(T / min(chunk, T)), E, N] for the backward. Parallel over batch x channel blocks on
/// the current backend. Throws value_error for a size of 0; the buffers must have the sizes' shapes
/// (the op checks its tensors, the native call its buffers).
template <Real T>
void selective_scan_forward(const SelectiveScanSizes& sizes, const SelectiveScanBuffers<T>& in, T* y, T* h_last, T* checkpoints) {
    namespace sel = detail::selective;
    const sel::Geometry g = sel::geometry_of(sizes);
    const std::size_t max_block = (g.channels + g.blocks - 1) / g.blocks + 1;
    backend::current().parallel_for(g.tasks(), g.time * (g.channels / g.blocks + 1) * g.state, [&](std::size_t lo, std::size_t hi) {
        detail::denormal_guard guard;
        Storage<T> state(max_block * g.state);
        for (std::size_t task = lo; task < hi; ++task) {
            const std::size_t b = task / g.blocks, k = task % g.blocks;
            sel::forward_task(g, in, b, g.block_begin(k), g.block_begin(k + 1), y, h_last, checkpoints, state.data());
        }
    });
}

/// The op's exact backward on caller-owned buffers, from the forward's operands, its checkpoints
/// and the gradients dy [batch, T, E] and dh_last [batch, E, N] of its outputs. The sums over batch
/// (dA, dD) and over channel blocks (dB, dC) run in a fixed order, so the result does not depend
/// on the thread count.
template <Real T>
void selective_scan_backward(const SelectiveScanSizes& sizes, const SelectiveScanBuffers<T>& in, const T* dy, const T* dh_last,
                             const T* checkpoints, const SelectiveScanGradients<T>& grads) {
    namespace sel = detail::selective;
    const sel::Geometry g = sel::geometry_of(sizes);
    const std::size_t bt_n = g.batch * g.time * g.state;
    // With one block per batch row the partial sums are the gradients themselves.
    Storage<T> dB_blocks(g.blocks == 1 ? 0 : g.blocks * bt_n), dC_blocks(g.blocks == 1 ? 0 : g.blocks * bt_n);
    Storage<double> dA_part(g.batch * g.channels * g.state), dD_part(g.batch * g.channels);
    const sel::Outputs<T> out{grads.du,       grads.ddelta,   g.blocks == 1 ? grads.dB : dB_blocks.data(),
                              g.blocks == 1 ? grads.dC : dC_blocks.data(), grads.dh0, dA_part.data(), dD_part.data()};
    const std::size_t max_block = (g.channels + g.blocks - 1) / g.blocks + 1;
    backend::current().parallel_for(g.tasks(), 3 * g.time * (g.channels / g.blocks + 1) * g.state, [&](std::size_t lo, std::size_t hi) {
        detail::denormal_guard guard;
        Storage<T> scratch((2 * g.chunk + 1) * max_block * g.state);
        for (std::size_t task = lo; task < hi; ++task)
            sel::backward_task(g, in, dy, dh_last, checkpoints, out, task / g.blocks, task % g.blocks, scratch.data());
    });
    if (g.blocks > 1) {
        sel::sum_blocks(dB_blocks.data(), g.blocks, bt_n, grads.dB);
        sel::sum_blocks(dC_blocks.data(), g.blocks, bt_n, grads.dC);
    }
    if (grads.dA) {  // dA[e, n] = sum over batch, in batch order
        const std::size_t en = g.channels * g.state;
        for (std::size_t i = 0; i < en; ++i) {
            double acc = 0;
            for (std::size_t b = 0; b < g.batch; ++b) acc += dA_part[b * en + i];
            grads.dA[i] = T(acc);
        }
    }
    if (grads.dD) {
        for (std::size_t e = 0; e < g.channels; ++e) {
            double acc = 0;
            for (std::size_t b = 0; b < g.batch; ++b) acc += dD_part[b * g.channels + e];
            grads.dD[e] = T(acc);
        }
    }
}

/// Mamba's selective scan (see the top of this file): returns y [batch, T, E] and the final state
/// h_last [batch, E, N]. Differentiable in u, delta, A, B, C, D (undefined: no skip term) and
/// opt.h0; opt.resets marks segment starts. Runs on the inputs' device, parallel over batch x
/// channel blocks. Throws shape_error naming the mismatched shapes, value_error for T = 0 or a
/// chunk size < 1.
template <Real T>
SelectiveScanResult<T> selective_scan(const Tensor<T>& u, const Tensor<T>& delta, const Tensor<T>& A, const Tensor<T>& B,
                                      const Tensor<T>& C, const Tensor<T>& D = {}, const SelectiveScanOptions<T>& opt = {}) {
    namespace sel = detail::selective;
    backend::op_scope on("scan::selective_scan", u, delta, A, B, C, D, opt.h0, opt.resets);
    const sel::Geometry g = sel::make_geometry(u, delta, A, B, C, D, opt);
    return on.run<op::selective_scan>({u, delta, A, B, C, D, opt.h0, opt.resets}, {}, [&] {
        std::vector<Tensor<T>> inputs{u, delta, A, B, C, D, opt.h0};
        const bool recording = autodiff::should_record(std::span<const Tensor<T>>(inputs));
        const SelectiveScanSizes sizes{g.batch, g.time, g.channels, g.state, g.chunk};

        SelectiveScanResult<T> result{Tensor<T>::uninitialized(u.shape()), Tensor<T>::uninitialized({g.batch, g.channels, g.state})};
        Tensor<T> ckpt = recording ? Tensor<T>::uninitialized({g.batch, g.chunks, g.channels, g.state}) : Tensor<T>();
        const Tensor<T> resets = opt.resets.defined() ? opt.resets.detach() : Tensor<T>();
        auto buffers = [](const Tensor<T>& u, const Tensor<T>& delta, const Tensor<T>& A, const Tensor<T>& B, const Tensor<T>& C,
                          const Tensor<T>& D, const Tensor<T>& h0, const Tensor<T>& resets) {
            auto data = [](const Tensor<T>& t) { return t.defined() ? t.data() : static_cast<const T*>(nullptr); };
            return SelectiveScanBuffers<T>{u.data(), delta.data(), A.data(), B.data(), C.data(), data(D), data(h0), data(resets)};
        };
        selective_scan_forward(sizes, buffers(u, delta, A, B, C, D, opt.h0, resets), result.y.data(), result.h_last.data(),
                               ckpt.defined() ? ckpt.data() : nullptr);
        if (!recording) return result;

        std::vector<Tensor<T>> outputs{result.y, result.h_last};
        autodiff::record<T>(
            "scan::selective_scan", inputs, outputs,
            [sizes, buffers, u = u.detach(), delta = delta.detach(), A = A.detach(), B = B.detach(), C = C.detach(),
             D = D.defined() ? D.detach() : Tensor<T>(), h0 = opt.h0.defined() ? opt.h0.detach() : Tensor<T>(), resets,
             ckpt](std::span<const Tensor<T>> grads, autodiff::GradientSink<T>& sink) {
                auto du = Tensor<T>::uninitialized(u.shape()), ddelta = Tensor<T>::uninitialized(u.shape());
                auto dB = Tensor<T>::uninitialized(B.shape()), dC = Tensor<T>::uninitialized(C.shape());
                Tensor<T> dA = sink.needs(2) ? Tensor<T>::uninitialized(A.shape()) : Tensor<T>();
                Tensor<T> dD = sink.needs(5) ? Tensor<T>::uninitialized(D.shape()) : Tensor<T>();
                Tensor<T> dh0 = sink.needs(6) ? Tensor<T>::uninitialized({sizes.batch, sizes.channels, sizes.state}) : Tensor<T>();
                auto data = [](Tensor<T>& t) { return t.defined() ? t.data() : static_cast<T*>(nullptr); };
                selective_scan_backward(sizes, buffers(u, delta, A, B, C, D, h0, resets), grads[0].data(), grads[1].data(), ckpt.data(),
                                        SelectiveScanGradients<T>{du.data(), ddelta.data(), data(dA), dB.data(), dC.data(), data(dD), data(dh0)});
                sink.add(0, std::move(du));
                sink.add(1, std::move(ddelta));
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

// ---- the key of the selective scan's lowering rule (its rule: olmax/trace/rules.hpp) ----------

namespace olmax::op {

/// u, delta [B, T, E], A [E, N], B, C [B, T, N], D [E], h0 [B, E, N] and resets [B, T] (the last
/// three undefined: none): y and the last state.
struct selective_scan : registered<selective_scan> {
    static constexpr std::string_view name = "selective_scan";
    struct attrs {};
    static std::vector<sample<attrs>> samples(Generator& rng) {
        auto u = [&](const Shape& s, float lo = -1, float hi = 1) { return samples::uniform(rng, s, lo, hi); };
        auto one = [&](std::size_t b, std::size_t t, std::size_t e, std::size_t n, bool extras) {
            return sample<attrs>{{u({b, t, e}), u({b, t, e}, 0.1f, 1.0f), u({e, n}, -1.5f, -0.2f), u({b, t, n}), u({b, t, n}),
                                  extras ? u({e}) : Tensor<float>(), extras ? u({b, e, n}) : Tensor<float>(),
                                  extras ? samples::bits(rng, {b, t}, 0.3) : Tensor<float>()},
                                 {},
                                 {7}};
        };
        return {one(2, 5, 3, 2, false), one(2, 6, 2, 3, true), one(1, 3, 1, 1, true)};
    }
    template <Real T> static std::vector<Tensor<T>> eager(std::span<const Tensor<T>> in, const attrs&) {
        auto r = scan::selective_scan(in[0], in[1], in[2], in[3], in[4], in[5], {.h0 = in[6], .resets = in[7]});
        return {r.y, r.h_last};
    }
};

}  // namespace olmax::op
