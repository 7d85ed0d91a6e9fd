#pragma once
// sequential_vectorized, in place (no tile copy): sequential in time, vectorised across a span of
// contiguous channels ([B, T, C]) or 16 interleaved rows ([B, C, T]), with its fused one-pass
// backward. Needs one gate per channel (share == 1).

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <string_view>
#include <type_traits>

#include "olmax/backend/dispatch.hpp"
#include "olmax/scan/detail/channel_span.hpp"
#include "olmax/scan/detail/denormals.hpp"
#include "olmax/scan/detail/problem.hpp"
#include "olmax/scan/detail/streaming_store.hpp"

namespace olmax::scan::detail {

/// [B, T, C]: each task scans `n` contiguous channels of one batch element; per step the state
/// update is one vector FMA per 16 channels (3 moves per element: read a, read x, write h). The
/// state lives in a small per-thread buffer (L1). With `stream` (fp32 only) each step's row of h is
/// then copied from the state with streaming stores (streaming_store.hpp).
template <bool Log, class Acc, class T>
void vectorized_btc_span(const Geometry& g, const ForwardArgs<T>& args, std::size_t b, std::size_t c0, std::size_t n, Acc* state,
                         bool stream = false) {
    constexpr bool can_stream = std::is_same_v<T, float> && std::is_same_v<Acc, float>;
    for (std::size_t w = 0; w < n; ++w) state[w] = args.h0 ? Acc(args.h0[b * g.channels + c0 + w]) : Acc(0);
    for (std::size_t s = 0; s < g.time; ++s) {
        const std::size_t off = g.x_index(b, g.time_of(s), c0);
        const T* a = args.gates + off;
        const T* x = args.x + off;
        T* h = args.h + off;
        if constexpr (can_stream) {
            if (stream) {
                for_lane_pieces<T>(n, g.reverse, [&](std::size_t begin, std::size_t end) __attribute__((always_inline)) {
#pragma omp simd
                    for (std::size_t w = begin; w < end; ++w) state[w] = load_gate<Log, Acc>(a[w]) * state[w] + Acc(x[w]);
                });
                stream_copy(h, state, n);
                continue;
            }
        }
        for_lane_pieces<T>(n, g.reverse, [&](std::size_t begin, std::size_t end) __attribute__((always_inline)) {  // a reverse scan walks down in memory
#pragma omp simd
            for (std::size_t w = begin; w < end; ++w) {
                const Acc v = load_gate<Log, Acc>(a[w]) * state[w] + Acc(x[w]);
                state[w] = v;
                store_value(h[w], v);
            }
        });
    }
    if (can_stream && stream) streaming_stores_done();
    if (args.h_last)
        for (std::size_t w = 0; w < n; ++w) store_value(args.h_last[b * g.channels + c0 + w], state[w]);
}

/// [B, C, T]: 16 rows at a time, one step of each per iteration (16 independent FMA chains).
template <bool Log, class Acc, class T>
void vectorized_bct_rows(const Geometry& g, const ForwardArgs<T>& args, std::size_t r0, std::size_t rows) {
    constexpr std::size_t group = 16;
    std::array<Acc, group> state{};
    std::array<std::size_t, group> base{};
    for (std::size_t k = 0; k < rows; ++k) {
        state[k] = args.h0 ? Acc(args.h0[r0 + k]) : Acc(0);
        base[k] = (r0 + k) * g.time;
    }
    for (std::size_t s = 0; s < g.time; ++s) {
        const std::size_t t = g.time_of(s);
        for (std::size_t k = 0; k < rows; ++k) {
            const std::size_t i = base[k] + t;
            const Acc v = load_gate<Log, Acc>(args.gates[i]) * state[k] + Acc(args.x[i]);
            state[k] = v;
            store_value(args.h[i], v);
        }
    }
    if (args.h_last)
        for (std::size_t k = 0; k < rows; ++k) store_value(args.h_last[r0 + k], state[k]);
}

template <bool Log, class Acc, class T>
void vectorized_forward_impl(const Geometry& g, const ForwardArgs<T>& args) {
    if (g.layout == Layout::btc) {
        const std::size_t span = vector_span(g, backend::current().num_threads());
        const bool stream = streams_output(g.batch * g.time * g.channels * sizeof(T));
        for_each_channel_span<Acc>(g, span, span, [&](std::size_t b, std::size_t c0, std::size_t n, Acc* state) {
            vectorized_btc_span<Log, Acc>(g, args, b, c0, n, state, stream);
        });
    } else {
        const std::size_t groups = (g.rows() + 15) / 16;
        backend::current().parallel_for(groups, g.time * 16, [&](std::size_t begin, std::size_t end) {
            denormal_guard guard;
            for (std::size_t grp = begin; grp < end; ++grp)
                vectorized_bct_rows<Log, Acc>(g, args, grp * 16, std::min<std::size_t>(16, g.rows() - grp * 16));
        });
    }
}

/// Fused backward, one pass, 3 reads (dh, a, h) and 2 writes (dx, da) per element: walking the
/// forward steps s = T-1 .. 0, g = a(s+1) g + dh(s); dx(s) = g; da(s) = g h(s-1), h(-1) = h0.
/// UnitStride: lanes are adjacent in memory ([B, T, C]); the compiler then emits plain vector
/// loads instead of strided gathers (4-6x faster in cache, measured).
/// With `stream` (fp32 [B, T, C] only; `grad` then has 2 n elements) the step's da goes to
/// grad[n, 2n) and both rows are copied out with streaming stores (streaming_store.hpp).
template <bool Log, bool UnitStride, class Acc, class T>
void fused_backward_lanes_impl(const Geometry& g, const BackwardArgs<T>& args, std::size_t b, std::size_t c0, std::size_t n, Acc* grad,
                               bool stream) {
    constexpr bool can_stream = UnitStride && std::is_same_v<T, float> && std::is_same_v<Acc, float>;
    for (std::size_t w = 0; w < n; ++w) grad[w] = args.dh_last ? Acc(args.dh_last[b * g.channels + c0 + w]) : Acc(0);
    const std::size_t T_ = g.time, lane_stride = UnitStride ? 1 : g.xc;
    const T* h0 = args.h0 ? args.h0 + b * g.channels + c0 : nullptr;
    for (std::size_t r = 0; r < T_; ++r) {
        const std::size_t s = T_ - 1 - r;
        const std::size_t off = g.x_index(b, g.time_of(s), c0);
        const std::size_t next = r == 0 ? off : g.x_index(b, g.time_of(s + 1), c0);
        const std::size_t prev = s == 0 ? off : g.x_index(b, g.time_of(s - 1), c0);
        const T* dh = args.dh + off;
        const T* a_next = args.gates + next;
        const T* a_self = args.gates + off;
        const T* h_prev = args.h + prev;
        T* dx = args.dx + off;
        T* da = args.da + off;
        if constexpr (can_stream) {
            if (stream && r > 0 && s > 0) {
                Acc* da_row = grad + n;
                for_lane_pieces<T>(n, !g.reverse, [&](std::size_t begin, std::size_t end) __attribute__((always_inline)) {
#pragma omp simd
                    for (std::size_t w = begin; w < end; ++w) {
                        const Acc v = load_gate<Log, Acc>(a_next[w]) * grad[w] + Acc(dh[w]);
                        grad[w] = v;
                        Acc d = v * Acc(h_prev[w]);
                        if constexpr (Log) d *= std::exp(Acc(a_self[w]));
                        da_row[w] = d;
                    }
                });
                stream_copy(dx, grad, n);
                stream_copy(da, da_row, n);
                continue;
            }
        }
        if (r > 0 && s > 0) {  // every step but the two ends: no conditions in the vector loop
            auto lanes = [&](std::size_t begin, std::size_t end) __attribute__((always_inline)) {
#pragma omp simd
                for (std::size_t w = begin; w < end; ++w) {
                    const std::size_t i = w * lane_stride;
                    const Acc v = load_gate<Log, Acc>(a_next[i]) * grad[w] + Acc(dh[i]);
                    grad[w] = v;
                    store_value(dx[i], v);
                    Acc d = v * Acc(h_prev[i]);
                    if constexpr (Log) d *= std::exp(Acc(a_self[i]));
                    store_value(da[i], d);
                }
            };
            for_lane_pieces<T>(n, UnitStride && !g.reverse, lanes);  // time walks down in memory unless the scan is reversed
            continue;
        }
        const bool last_step = r == 0;  // no a(T): the carry there is dh_last, taken with gate 1
        const bool first_step = s == 0;
        for (std::size_t w = 0; w < n; ++w) {
            const std::size_t i = w * lane_stride;
            const Acc gate = last_step ? Acc(1) : load_gate<Log, Acc>(a_next[i]);
            const Acc v = gate * grad[w] + Acc(dh[i]);
            grad[w] = v;
            store_value(dx[i], v);
            const Acc hp = first_step ? (h0 ? Acc(h0[w]) : Acc(0)) : Acc(h_prev[i]);
            Acc d = v * hp;
            if constexpr (Log) d *= std::exp(Acc(a_self[i]));
            store_value(da[i], d);
        }
    }
    if (can_stream && stream) streaming_stores_done();
    if (args.dh0)
        for (std::size_t w = 0; w < n; ++w)
            store_value(args.dh0[b * g.channels + c0 + w], load_gate<Log, Acc>(args.gates[g.x_index(b, g.time_of(0), c0 + w)]) * grad[w]);
}

template <bool Log, class Acc, class T>
void fused_backward_lanes(const Geometry& g, const BackwardArgs<T>& args, std::size_t b, std::size_t c0, std::size_t n, Acc* grad,
                          bool stream = false) {
    if (g.xc == 1) fused_backward_lanes_impl<Log, true>(g, args, b, c0, n, grad, stream);
    else fused_backward_lanes_impl<Log, false>(g, args, b, c0, n, grad, false);
}

template <bool Log, class Acc, class T>
void vectorized_backward_impl(const Geometry& g, const BackwardArgs<T>& args) {
    // btc: lanes are contiguous channels (wide spans, see vector_span); bct: lanes are rows
    // (stride T), 16 chains at a time.
    const std::size_t lanes = g.layout == Layout::btc ? vector_span(g, backend::current().num_threads()) : 16;
    // dx and da: two outputs of the scan's size (streamed from a second row of scratch)
    const bool stream = g.layout == Layout::btc && streams_output(2 * g.batch * g.time * g.channels * sizeof(T));
    for_each_channel_span<Acc>(g, lanes, stream ? 2 * lanes : lanes, [&](std::size_t b, std::size_t c0, std::size_t n, Acc* grad) {
        fused_backward_lanes<Log, Acc>(g, args, b, c0, n, grad, stream);
    });
}

/// sequential_vectorized as a kernel family of the dispatch table (dispatch.hpp): gates per channel.
struct sequential_vectorized_family {
    static constexpr std::string_view name = "sequential_vectorized";
    template <class Acc, class T>
    static void forward(const Geometry& g, const ForwardArgs<T>& args, std::size_t) {
        if (g.log_gates) vectorized_forward_impl<true, Acc>(g, args);
        else vectorized_forward_impl<false, Acc>(g, args);
    }
    template <class Acc, class T>
    static void backward(const Geometry& g, const BackwardArgs<T>& args, std::size_t) {
        if (g.log_gates) vectorized_backward_impl<true, Acc>(g, args);
        else vectorized_backward_impl<false, Acc>(g, args);
    }
};

}  // namespace olmax::scan::detail
