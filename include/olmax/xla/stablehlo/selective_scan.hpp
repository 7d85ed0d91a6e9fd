#pragma once
// Mamba's selective scan as fused loops over time, the form for CPUs: the [B, T, E, N] states are
// never stored, as in olmax's own CPU op (olmax/scan/selective_scan.hpp, which has the formulas).
//   forward   one stablehlo.while over time (nested in one over chunks of `chunk` steps when the
//             gradient needs checkpoints): per step abar = exp(delta_t A) keep_t,
//             h = abar h + (delta_t u_t) B_t, y_t = sum_n C_t h; the state entering every chunk
//             is written to checkpoints [B, ceil(T/chunk), E, N].
//   backward  chunks from last to first: one chunk's entering states are recomputed from its
//             checkpoint into [B, chunk, E, N], then the adjoint g (of h_t) runs back through it:
//                 g += C_t dy_t;  dC_t = sum_e dy_t h_t;  gB = sum_n g B_t;
//                 du_t = delta_t gB;  ddelta_t = u_t gB + sum_n A g abar h_{t-1};
//                 dA += sum_b delta_t g abar h_{t-1};  dB_t = sum_e g delta_t u_t;  g = abar g
//             and dh0 is g after step 0.
// Memory: B E N (T/chunk + chunk) floats besides the operands and gradients (chunk ~ sqrt(T):
// 2 sqrt(T) states instead of T). Time is padded to a multiple of the chunk with steps that change
// nothing (delta = 0, keep = 1: abar = 1, no drive), whose gradients are sliced off.
// Operands: u, delta [B, T, E]; A [E, N]; Bm, C [B, T, N]; keep [B, T] (0 where a document
// starts: the carried state is dropped there); h0 [B, E, N].

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "olmax/xla/stablehlo/function_builder.hpp"
#include "olmax/xla/stablehlo/ir.hpp"
#include "olmax/xla/stablehlo/scan.hpp"

namespace olmax::xla::stablehlo {

/// The custom-call targets under which trace/native_calls.hpp registers olmax's own CPU kernels of
/// the selective scan (operands and results as graph::selective_scan and its backward list them).
namespace native_call {
inline constexpr std::string_view selective_scan = "olmax_selective_scan";
inline constexpr std::string_view selective_scan_backward = "olmax_selective_scan_backward";
}  // namespace native_call

namespace detail {

/// What one step reads: u_t, delta_t [B, E]; B_t, C_t [B, N]; keep_t [B]; with the derived abar
/// [B, E, N] and the drive's scale delta_t u_t [B, E].
struct selective_step {
    value u, delta, b, c, abar, delta_u;
};
inline selective_step read_step(function_builder& r, const value& u, const value& delta, const value& A, const value& Bm, const value& C,
                                const value& keep, const value& t) {
    selective_step s;
    s.u = r.dynamic_index(u, 1, t);
    s.delta = r.dynamic_index(delta, 1, t);
    s.b = r.dynamic_index(Bm, 1, t);
    s.c = C.type.rank() == 3 ? r.dynamic_index(C, 1, t) : value{};
    const dims_t full{u.type.dims[0], u.type.dims[2], A.type.dims[1]};
    const value decay = r.unary("exponential", r.mul(r.broadcast_in_dim(s.delta, full, {0, 1}), r.broadcast_in_dim(A, full, {1, 2})));
    s.abar = r.mul(decay, r.broadcast_in_dim(r.dynamic_index(keep, 1, t), full, {0}));
    s.delta_u = r.mul(s.delta, s.u);
    return s;
}
/// abar h + (delta_t u_t) B_t.
inline value advance(function_builder& r, const selective_step& s, const value& h) {
    const dims_t& full = h.type.dims;
    return r.add(r.mul(s.abar, h), r.mul(r.broadcast_in_dim(s.delta_u, full, {0, 1}), r.broadcast_in_dim(s.b, full, {0, 2})));
}

/// What run_steps returns: the state after the steps, y with their steps written (or the entering
/// states), and the operands as the loop carried them out. Passing those on, rather than the
/// operands the loop was given, leaves the loop their only user, so XLA updates its carry in place
/// instead of copying every operand into each nested loop.
struct steps_result {
    value h, out;
    std::vector<value> operands;
};

/// Runs steps first .. first + count - 1 from state h: y with their steps written into `out`, or
/// with `entering` the state entering each step into `out` [B, count, E, N]. Operands: u, delta,
/// A, Bm, C, keep.
inline steps_result run_steps(function_builder& b, const value& first, std::int64_t count, const value& h, const value& out, bool entering,
                              const std::vector<value>& operands) {
    // carry: [k, first, h, out, u, delta, A, Bm, C, keep]
    std::vector<value> init{b.index(0), first, h, out};
    init.insert(init.end(), operands.begin(), operands.end());
    const auto done = b.while_loop(
        init, [count](function_builder& r, const std::vector<value>& c) { return r.compare(c[0], r.index(count), compare_direction::LT); },
        [entering](function_builder& r, const std::vector<value>& c) {
            const value t = r.add(c[1], c[0]);
            const selective_step s = read_step(r, c[4], c[5], c[6], c[7], entering ? value{} : c[8], c[9], t);
            const value h = advance(r, s, c[2]);
            std::vector<value> next = c;
            next[0] = r.add(c[0], r.index(1));
            next[2] = h;
            if (entering) {
                next[3] = r.dynamic_index_update(c[3], 1, c[2], c[0]);
            } else {
                const value y = r.reduce(r.mul(h, r.broadcast_in_dim(s.c, h.type.dims, {0, 2})), 0.0, {2}, "add");
                next[3] = r.dynamic_index_update(c[3], 1, y, t);
            }
            return next;
        });
    return {done[2], done[3], std::vector<value>(done.begin() + 4, done.end())};
}

}  // namespace detail

/// Forward: (y [B, T, E], h_last [B, E, N], checkpoints [B, ceil(T/chunk), E, N], or an undefined
/// value when `checkpoints` is false and nothing needs them).
inline std::vector<value> emit_selective_scan(function_builder& b, std::int64_t chunk, bool checkpoints, const value& u, const value& delta,
                                              const value& A, const value& Bm, const value& C, const value& keep, const value& h0) {
    const std::int64_t batch = u.type.dims[0], steps = u.type.dims[1], channels = u.type.dims[2], states = A.type.dims[1];
    const std::int64_t chunks = (steps + chunk - 1) / chunk, padded = chunks * chunk;
    const std::vector<value> operands{detail::pad_time(b, u, padded, 0.0), detail::pad_time(b, delta, padded, 0.0), A,
                                      detail::pad_time(b, Bm, padded, 0.0), detail::pad_time(b, C, padded, 0.0),
                                      detail::pad_time(b, keep, padded, 1.0)};
    const value y0 = b.constant(0.0, f32({batch, padded, channels}));
    if (!checkpoints) {
        const detail::steps_result done = detail::run_steps(b, b.index(0), padded, h0, y0, false, operands);
        return {detail::unpad_time(b, done.out, steps), done.h, value{}};
    }
    // carry: [c, h, y, checkpoints, u, delta, A, Bm, C, keep]
    std::vector<value> init{b.index(0), h0, y0, b.constant(0.0, f32({batch, chunks, channels, states}))};
    init.insert(init.end(), operands.begin(), operands.end());
    const auto done = b.while_loop(
        init, [chunks](function_builder& r, const std::vector<value>& c) { return r.compare(c[0], r.index(chunks), compare_direction::LT); },
        [chunk](function_builder& r, const std::vector<value>& c) {
            std::vector<value> next = c;
            next[3] = r.dynamic_index_update(c[3], 1, c[1], c[0]);
            const value first = r.mul(c[0], r.index(chunk));
            const detail::steps_result done = detail::run_steps(r, first, chunk, c[1], c[2], false, std::vector<value>(c.begin() + 4, c.end()));
            next[1] = done.h;
            next[2] = done.out;
            std::copy(done.operands.begin(), done.operands.end(), next.begin() + 4);
            next[0] = r.add(c[0], r.index(1));
            return next;
        });
    return {detail::unpad_time(b, done[2], steps), done[1], done[3]};
}

/// Backward: from the forward's operands, its checkpoints and the gradients gy [B, T, E] of y and
/// gh [B, E, N] of h_last, (du, ddelta [B, T, E], dA [E, N], dB, dC [B, T, N], dh0 [B, E, N]).
inline std::vector<value> emit_selective_scan_backward(function_builder& b, std::int64_t chunk, const value& u, const value& delta, const value& A,
                                                       const value& Bm, const value& C, const value& keep, const value& checkpoints,
                                                       const value& gy, const value& gh) {
    const std::int64_t batch = u.type.dims[0], steps = u.type.dims[1], channels = u.type.dims[2], states = A.type.dims[1];
    const std::int64_t chunks = checkpoints.type.dims[1], padded = chunks * chunk;
    const value ue = detail::pad_time(b, u, padded, 0.0), de = detail::pad_time(b, delta, padded, 0.0);
    const value be = detail::pad_time(b, Bm, padded, 0.0), ce = detail::pad_time(b, C, padded, 0.0);
    const value ke = detail::pad_time(b, keep, padded, 1.0), ge = detail::pad_time(b, gy, padded, 0.0);
    const tensor_type te = f32({batch, padded, channels}), tn = f32({batch, padded, states});
    // carry: [c, g, du, ddelta, dA, dB, dC, u, delta, A, Bm, C, keep, checkpoints, gy]
    const std::vector<value> init{b.index(chunks - 1), gh, b.constant(0.0, te), b.constant(0.0, te), b.constant(0.0, A.type),
                                  b.constant(0.0, tn), b.constant(0.0, tn), ue, de, A, be, ce, ke, checkpoints, ge};
    const auto done = b.while_loop(
        init, [](function_builder& r, const std::vector<value>& c) { return r.compare(c[0], r.index(0), compare_direction::GE); },
        [chunk](function_builder& r, const std::vector<value>& c) {
            const value first = r.mul(c[0], r.index(chunk));
            const value start = r.dynamic_index(c[13], 1, c[0]);
            const dims_t& s = start.type.dims;
            const value none = r.constant(0.0, f32({s[0], chunk, s[1], s[2]}));
            const detail::steps_result recomputed = detail::run_steps(r, first, chunk, start, none, true, std::vector<value>(c.begin() + 7, c.begin() + 13));
            // inner carry: [k, first, g, du, ddelta, dA, dB, dC, entering, u, delta, A, Bm, C, keep, gy]
            std::vector<value> inner{r.index(chunk - 1), first};
            inner.insert(inner.end(), c.begin() + 1, c.begin() + 7);
            inner.push_back(recomputed.out);
            inner.insert(inner.end(), recomputed.operands.begin(), recomputed.operands.end());
            inner.push_back(c[14]);
            const auto back = r.while_loop(
                inner, [](function_builder& q, const std::vector<value>& k) { return q.compare(k[0], q.index(0), compare_direction::GE); },
                [](function_builder& q, const std::vector<value>& k) {
                    const value t = q.add(k[1], k[0]);
                    const detail::selective_step st = detail::read_step(q, k[9], k[10], k[11], k[12], k[13], k[14], t);
                    const value previous = q.dynamic_index(k[8], 1, k[0]);
                    const value h = detail::advance(q, st, previous);
                    const dims_t& full = h.type.dims;
                    const value dy = q.dynamic_index(k[15], 1, t);
                    const value dy_wide = q.broadcast_in_dim(dy, full, {0, 1});
                    const value g = q.add(k[2], q.mul(dy_wide, q.broadcast_in_dim(st.c, full, {0, 2})));
                    // The sums over E (dC, dB) and gB's over N as batched dot products: on the XLA
                    // CPU plugin the reverse loop took 0.82x the time of reduces (B 16, T 128, E 256).
                    const value dC = q.dot_general(h, dy, {0}, {0}, {1}, {1});
                    const value gB = q.dot_general(g, st.b, {0}, {0}, {2}, {1});
                    const value decay_grad = q.mul(q.mul(g, st.abar), previous);  // g abar h_{t-1}
                    const value dA = q.reduce(q.mul(q.broadcast_in_dim(st.delta, full, {0, 1}), decay_grad), 0.0, {0}, "add");
                    const value ddelta = q.add(q.mul(st.u, gB), q.reduce(q.mul(q.broadcast_in_dim(k[11], full, {1, 2}), decay_grad), 0.0, {2}, "add"));
                    const value dB = q.dot_general(g, st.delta_u, {0}, {0}, {1}, {1});
                    std::vector<value> next = k;
                    next[0] = q.sub(k[0], q.index(1));
                    next[2] = q.mul(st.abar, g);
                    next[3] = q.dynamic_index_update(k[3], 1, q.mul(st.delta, gB), t);
                    next[4] = q.dynamic_index_update(k[4], 1, ddelta, t);
                    next[5] = q.add(k[5], dA);
                    next[6] = q.dynamic_index_update(k[6], 1, dB, t);
                    next[7] = q.dynamic_index_update(k[7], 1, dC, t);
                    return next;
                });
            std::vector<value> next = c;
            next[0] = r.sub(c[0], r.index(1));
            for (std::size_t i = 1; i < 7; ++i) next[i] = back[i + 1];
            for (std::size_t i = 7; i < 13; ++i) next[i] = back[i + 2];  // the operands, as the loops carried them
            next[14] = back[15];
            return next;
        });
    return {detail::unpad_time(b, done[2], steps), detail::unpad_time(b, done[3], steps), done[4], detail::unpad_time(b, done[5], steps),
            detail::unpad_time(b, done[6], steps), done[1]};
}

}  // namespace olmax::xla::stablehlo
