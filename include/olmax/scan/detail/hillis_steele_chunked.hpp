#pragma once
// hillis_steele_chunked in place, for [B, T, C] with one gate per channel; other geometries run
// the tile form (tile_hillis_steele_chunked, tile.hpp).
//
// hillis_steele_chunked<K> without a tile copy, reduce-then-scan: per span of contiguous channels,
// pass 1 reduces every chunk of K steps to its affine map (gate product, scan from a zero state;
// the first chunk from the initial state), reading a and x only; Hillis-Steele doubling over the
// ceil(T/K) chunk maps (doubling_steps of the tile engine: offsets K, 2K, ... in steps) gives the
// true state at every chunk end; pass 2 rescans each chunk from the previous chunk's end, writing
// h. 5 moves per element (read a, x twice, the second time mostly from cache; write h once),
// against the tile form's copy in, in-chunk pass, doubling steps and copy out.
// The backward is the same walk over processing steps r = 0 .. T-1 = forward steps T-1 .. 0, whose
// gate is the gate of the forward step after (none for r = 0: the initial state dh_last enters
// with gate 1); its pass 2 is the fused one-pass backward (dx = g, da = g h(s-1)).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string_view>

#include "olmax/scan/detail/channel_span.hpp"
#include "olmax/scan/detail/problem.hpp"
#include "olmax/scan/detail/tile.hpp"

namespace olmax::scan::detail {

template <bool Bwd, bool Log, class Acc, class T>
void hs_chunked_run(const Geometry& g, const T* gates, const T* values, const T* init, T* out, T* final_state, const T* h,
                    const T* h0, T* da, T* dh0, std::size_t K) {
    const std::size_t T_ = g.time, span = vector_span(g, backend::current().num_threads()), chunks = (T_ + K - 1) / K;
    // Memory time of processing step r.
    auto time_at = [&](std::size_t r) { return Bwd ? g.time_of(T_ - 1 - r) : g.time_of(r); };
    const bool descending = Bwd != g.reverse;  // time_at walks down in memory: rows in pieces from the top (for_lane_pieces)
    for_each_channel_span<Acc>(g, span, 2 * chunks * span + 2 * span, [&](std::size_t b, std::size_t c0, std::size_t n, Acc* scratch) {
        Acc* end_gate = scratch;
        Acc* end_scan = end_gate + chunks * span;
        Acc* state = end_scan + chunks * span;
        Acc* product = state + span;
        // Gates of step r: forward a(t(r)); backward a(t(r - 1)), none (gate 1) for r = 0.
        auto gate_row = [&](std::size_t r) -> const T* {
            if (Bwd && r == 0) return nullptr;
            return gates + g.x_index(b, time_at(Bwd ? r - 1 : r), c0);
        };
        auto initial_state = [&](Acc* st) {
            for (std::size_t w = 0; w < n; ++w) st[w] = init ? Acc(init[b * g.channels + c0 + w]) : Acc(0);
        };
        // Pass 1: the affine map of every chunk.
        for (std::size_t c = 0; c < chunks; ++c) {
            const std::size_t r0 = c * K, len = std::min(K, T_ - r0);
            if (c == 0) initial_state(state);
            else std::fill(state, state + n, Acc(0));
            std::fill(product, product + n, Acc(1));
            for (std::size_t r = r0; r < r0 + len; ++r) {
                const T* a = gate_row(r);
                const T* v = values + g.x_index(b, time_at(r), c0);
                for_lane_pieces<T>(n, descending, [&](std::size_t lo, std::size_t hi) __attribute__((always_inline)) {
                    if (a) {
#pragma omp simd
                        for (std::size_t w = lo; w < hi; ++w) {
                            const Acc gate = load_gate<Log, Acc>(a[w]);
                            state[w] = gate * state[w] + Acc(v[w]);
                            product[w] *= gate;
                        }
                    } else {
#pragma omp simd
                        for (std::size_t w = lo; w < hi; ++w) state[w] += Acc(v[w]);
                    }
                });
            }
            for (std::size_t w = 0; w < n; ++w) end_gate[c * n + w] = product[w], end_scan[c * n + w] = state[w];
        }
        doubling_steps(end_gate, end_scan, chunks, n, 1);
        // Pass 2: rescan every chunk from the true state before it.
        for (std::size_t c = 0; c < chunks; ++c) {
            const std::size_t r0 = c * K, len = std::min(K, T_ - r0);
            if (c == 0) initial_state(state);
            else std::copy(end_scan + (c - 1) * n, end_scan + c * n, state);
            for (std::size_t r = r0; r < r0 + len; ++r) {
                const std::size_t off = g.x_index(b, time_at(r), c0);
                const T* a = gate_row(r);
                const T* v = values + off;
                T* o = out + off;
                // Backward: da(s) = g(s) h(s-1), h(-1) = h0; log gates: times a(s).
                const T* hp = nullptr;
                if constexpr (Bwd) {
                    const std::size_t s = T_ - 1 - r;
                    hp = s > 0 ? h + g.x_index(b, g.time_of(s - 1), c0) : (h0 ? h0 + b * g.channels + c0 : nullptr);
                }
                for_lane_pieces<T>(n, descending, [&](std::size_t lo, std::size_t hi) __attribute__((always_inline)) {
                    if (a) {
#pragma omp simd
                        for (std::size_t w = lo; w < hi; ++w) {
                            state[w] = load_gate<Log, Acc>(a[w]) * state[w] + Acc(v[w]);
                            store_value(o[w], state[w]);
                        }
                    } else {
#pragma omp simd
                        for (std::size_t w = lo; w < hi; ++w) {
                            state[w] += Acc(v[w]);
                            store_value(o[w], state[w]);
                        }
                    }
                    if constexpr (Bwd) {
                        const T* a_self = gates + off;
                        T* d = da + off;
                        if (hp) {
#pragma omp simd
                            for (std::size_t w = lo; w < hi; ++w) {
                                Acc grad_a = state[w] * Acc(hp[w]);
                                if constexpr (Log) grad_a *= std::exp(Acc(a_self[w]));
                                store_value(d[w], grad_a);
                            }
                        } else {
                            std::fill(d + lo, d + hi, T(0));
                        }
                    }
                });
            }
        }
        const Acc* last = end_scan + (chunks - 1) * n;
        if (final_state)
            for (std::size_t w = 0; w < n; ++w) store_value(final_state[b * g.channels + c0 + w], last[w]);
        if (dh0)  // dh0 = a(forward step 0) g(forward step 0), the last processing step
            for (std::size_t w = 0; w < n; ++w)
                store_value(dh0[b * g.channels + c0 + w], load_gate<Log, Acc>(gates[g.x_index(b, g.time_of(0), c0 + w)]) * last[w]);
    });
}

template <bool Log, class Acc, class T>
void hs_chunked_forward_impl(const Geometry& g, const ForwardArgs<T>& args, std::size_t K) {
    hs_chunked_run<false, Log, Acc>(g, args.gates, args.x, args.h0, args.h, args.h_last, static_cast<const T*>(nullptr),
                                       static_cast<const T*>(nullptr), static_cast<T*>(nullptr), static_cast<T*>(nullptr), K);
}

template <bool Log, class Acc, class T>
void hs_chunked_backward_impl(const Geometry& g, const BackwardArgs<T>& args, std::size_t K) {
    hs_chunked_run<true, Log, Acc>(g, args.gates, args.dh, args.dh_last, args.dx, static_cast<T*>(nullptr), args.h, args.h0, args.da,
                                      args.dh0, K);
}

/// The in-place hillis_steele_chunked as a kernel family of the dispatch table (dispatch.hpp):
/// needs contiguous lanes ([B, T, C], gates per channel).
struct hillis_steele_chunked_family {
    static constexpr std::string_view name = "hillis_steele_chunked";
    template <class Acc, class T>
    static void forward(const Geometry& g, const ForwardArgs<T>& args, std::size_t chunk) {
        if (g.log_gates) hs_chunked_forward_impl<true, Acc>(g, args, chunk);
        else hs_chunked_forward_impl<false, Acc>(g, args, chunk);
    }
    template <class Acc, class T>
    static void backward(const Geometry& g, const BackwardArgs<T>& args, std::size_t chunk) {
        if (g.log_gates) hs_chunked_backward_impl<true, Acc>(g, args, chunk);
        else hs_chunked_backward_impl<false, Acc>(g, args, chunk);
    }
};

}  // namespace olmax::scan::detail
