#pragma once
// Kernels that work on the tensors in place (no tile copy): the channel-vectorised sequential
// scan, the time-parallel cache-partitioned two-pass scan, their fused backward passes, and the
// shared-gate chunked matmul. They need one gate per channel (share == 1), except the matmul.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "olmax/core/tensor.hpp"
#include "olmax/scan/detail/denormals.hpp"
#include "olmax/scan/detail/problem.hpp"
#include "olmax/scan/detail/tile.hpp"
#include "olmax/scan/detail/vector_block.hpp"

namespace olmax::scan::detail {

// ---- channel-vectorised sequential -------------------------------------------------------------

/// Channels per task of the vectorised scan, at least: 64 fp32 lanes = 4 AVX-512 vectors of state.
inline constexpr std::size_t vector_block = 64;

/// Channels per task of the [B, T, C] vectorised scans: as wide as the rows allow (up to 2048
/// channels, an 8 KB fp32 state that stays in L1) while leaving a task for every thread. Wide spans
/// matter: each step then reads and writes whole contiguous runs of a row, which the hardware
/// prefetchers follow, instead of 256-byte pieces one row-stride apart (a new page every step
/// when C >= 1024, as narrow blocks did at 0.55 of triad).
inline std::size_t vector_span(const Geometry& g, int threads) {
    std::size_t width = std::min<std::size_t>(g.channels, 2048);
    auto tasks = [&](std::size_t w) { return g.batch * ((g.channels + w - 1) / w); };
    while (width > vector_block && tasks(width) < std::size_t(std::max(threads, 1)))
        width = std::max(vector_block, (width / 2 + 15) / 16 * 16);
    return width;
}

/// Runs body(b, c0, n, scratch) for every span of `span` contiguous channels (n in the last one
/// may be smaller) on the backend's threads, with flush-to-zero on and `scratch_size` elements of
/// per-thread scratch.
template <class Acc, class B, class Body>
void for_each_channel_span(const Geometry& g, std::size_t span, std::size_t scratch_size, Body&& body) {
    const std::size_t blocks = (g.channels + span - 1) / span;
    B::parallel_for(g.batch * blocks, g.time * span, [&](std::size_t begin, std::size_t end) {
        denormal_guard guard;
        Storage<Acc> scratch(scratch_size);
        for (std::size_t task = begin; task < end; ++task) {
            const std::size_t b = task / blocks, c0 = (task % blocks) * span;
            body(b, c0, std::min(span, g.channels - c0), scratch.data());
        }
    });
}

/// [B, T, C]: each task scans `n` contiguous channels of one batch element; per step the state
/// update is one vector FMA per 16 channels (3 moves per element: read a, read x, write h). The
/// state lives in a small per-thread buffer (L1).
template <bool Log, class Acc, class T>
void vectorized_btc_span(const Geometry& g, const ForwardArgs<T>& args, std::size_t b, std::size_t c0, std::size_t n, Acc* state) {
    for (std::size_t w = 0; w < n; ++w) state[w] = args.h0 ? Acc(args.h0[b * g.channels + c0 + w]) : Acc(0);
    for (std::size_t s = 0; s < g.time; ++s) {
        const std::size_t off = g.x_index(b, g.time_of(s), c0);
        const T* a = args.gates + off;
        const T* x = args.x + off;
        T* h = args.h + off;
#pragma omp simd
        for (std::size_t w = 0; w < n; ++w) {
            const Acc v = load_gate<Log, Acc>(a[w]) * state[w] + Acc(x[w]);
            state[w] = v;
            h[w] = T(v);
        }
    }
    if (args.h_last)
        for (std::size_t w = 0; w < n; ++w) args.h_last[b * g.channels + c0 + w] = T(state[w]);
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
            args.h[i] = T(v);
        }
    }
    if (args.h_last)
        for (std::size_t k = 0; k < rows; ++k) args.h_last[r0 + k] = T(state[k]);
}

template <bool Log, class Acc, class B, class T>
void vectorized_forward_impl(const Geometry& g, const ForwardArgs<T>& args) {
    if (g.layout == Layout::btc) {
        const std::size_t span = vector_span(g, B::num_threads());
        for_each_channel_span<Acc, B>(g, span, span, [&](std::size_t b, std::size_t c0, std::size_t n, Acc* state) {
            vectorized_btc_span<Log, Acc>(g, args, b, c0, n, state);
        });
    } else {
        const std::size_t groups = (g.rows() + 15) / 16;
        B::parallel_for(groups, g.time * 16, [&](std::size_t begin, std::size_t end) {
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
template <bool Log, bool UnitStride, class Acc, class T>
void fused_backward_lanes_impl(const Geometry& g, const BackwardArgs<T>& args, std::size_t b, std::size_t c0, std::size_t n, Acc* grad) {
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
        if (r > 0 && s > 0) {  // every step but the two ends: no conditions in the vector loop
#pragma omp simd
            for (std::size_t w = 0; w < n; ++w) {
                const std::size_t i = w * lane_stride;
                const Acc v = load_gate<Log, Acc>(a_next[i]) * grad[w] + Acc(dh[i]);
                grad[w] = v;
                dx[i] = T(v);
                Acc d = v * Acc(h_prev[i]);
                if constexpr (Log) d *= std::exp(Acc(a_self[i]));
                da[i] = T(d);
            }
            continue;
        }
        const bool last_step = r == 0;  // no a(T): the carry there is dh_last, taken with gate 1
        const bool first_step = s == 0;
        for (std::size_t w = 0; w < n; ++w) {
            const std::size_t i = w * lane_stride;
            const Acc gate = last_step ? Acc(1) : load_gate<Log, Acc>(a_next[i]);
            const Acc v = gate * grad[w] + Acc(dh[i]);
            grad[w] = v;
            dx[i] = T(v);
            const Acc hp = first_step ? (h0 ? Acc(h0[w]) : Acc(0)) : Acc(h_prev[i]);
            Acc d = v * hp;
            if constexpr (Log) d *= std::exp(Acc(a_self[i]));
            da[i] = T(d);
        }
    }
    if (args.dh0)
        for (std::size_t w = 0; w < n; ++w)
            args.dh0[b * g.channels + c0 + w] = T(load_gate<Log, Acc>(args.gates[g.x_index(b, g.time_of(0), c0 + w)]) * grad[w]);
}

template <bool Log, class Acc, class T>
void fused_backward_lanes(const Geometry& g, const BackwardArgs<T>& args, std::size_t b, std::size_t c0, std::size_t n, Acc* grad) {
    if (g.xc == 1) fused_backward_lanes_impl<Log, true>(g, args, b, c0, n, grad);
    else fused_backward_lanes_impl<Log, false>(g, args, b, c0, n, grad);
}

template <bool Log, class Acc, class B, class T>
void vectorized_backward_impl(const Geometry& g, const BackwardArgs<T>& args) {
    // btc: lanes are contiguous channels (wide spans, see vector_span); bct: lanes are rows
    // (stride T), 16 chains at a time.
    const std::size_t lanes = g.layout == Layout::btc ? vector_span(g, B::num_threads()) : 16;
    for_each_channel_span<Acc, B>(g, lanes, lanes, [&](std::size_t b, std::size_t c0, std::size_t n, Acc* grad) {
        fused_backward_lanes<Log, Acc>(g, args, b, c0, n, grad);
    });
}

// ---- time-parallel, cache-partitioned two-pass scan ---------------------------------------------
//
// Time is cut into rounds small enough that a round of every row fits in the L2 caches; a round is
// cut into segments (tasks = row x segment). Pass 1 reduces each segment to its affine map (A, X)
// reading a and x from memory; a short serial pass turns the maps into carries; pass 2 rescans each
// segment from its carry, reading a and x again, now from cache, and writes h. DRAM traffic stays
// near 3 moves per element (Zhang, Wang & Ross 2020). Eight segments are interleaved per thread so
// eight independent FMA chains hide the FMA latency of a single long row.
// The backward runs the same passes over the reversed order with gates taken one step later, and
// pass 2 also writes da = g h(s-1).

/// Elements per thread in one round of the two-pass scan (about 2^17: a, x and h of a round fit in
/// a 2 MB L2). Tests lower it to exercise many rounds on small inputs.
inline std::atomic<std::size_t>& two_pass_round_elements() {
    static std::atomic<std::size_t> value{std::size_t(1) << 17};
    return value;
}

struct Segment {
    std::size_t row_base;  // offset of the row's time 0
    std::size_t start;     // first processing index
    std::size_t length;
};

template <bool Bwd, bool Log, class Acc, class T>
struct SegmentPass {
    const Geometry* g;
    const T* gates;
    const T* values;  // x (forward) or dh (backward)
    const T* h;       // backward: saved h
    T* out;           // h (forward) or dx (backward)
    T* da;            // backward only
    std::ptrdiff_t step;    // signed element step per processing index
    std::size_t first_off;  // time offset of processing index 0 (times xt)

    std::ptrdiff_t offset(const Segment& seg, std::size_t i) const {
        return std::ptrdiff_t(seg.row_base + first_off) + std::ptrdiff_t(seg.start + i) * step;
    }

    // The K chains share base pointers and differ by one offset each (K + 4 integer registers; one
    // pointer per chain and array would spill on x86-64's 16 registers).

    /// Rows whose steps are adjacent in memory (|step| = 1) run one segment at a time through
    /// in-register block scans (vector_block.hpp) instead of interleaved scalar chains.
    static constexpr bool block_kernels = !Log && std::is_same_v<T, Acc> && block_scan_available<Acc>;
    bool use_blocks() const { return block_kernels && (step == 1 || step == -1); }

    /// The affine map of K segments of equal length (interleaved chains).
    template <std::size_t K>
    void reduce(const Segment* segs, std::size_t len, Acc* A, Acc* X) const {
        if constexpr (K == 1 && block_kernels) {
            if (step == 1) return reduce_blocks<false>(segs[0], len, *A, *X);
            if (step == -1) return reduce_blocks<true>(segs[0], len, *A, *X);
        }
        std::array<std::ptrdiff_t, K> off{};
        std::array<Acc, K> pa{}, px{};
        const T* gate_base = gates - (Bwd ? step : 0);  // backward: the gate of the previous index
        for (std::size_t k = 0; k < K; ++k) off[k] = offset(segs[k], 0), pa[k] = 1, px[k] = 0;
        for (std::size_t i = 0; i < len; ++i) {
            for (std::size_t k = 0; k < K; ++k) {
                const Acc a = load_gate<Log, Acc>(gate_base[off[k]]);
                pa[k] *= a;
                px[k] = a * px[k] + Acc(values[off[k]]);
                off[k] += step;
            }
        }
        for (std::size_t k = 0; k < K; ++k) A[k] = pa[k], X[k] = px[k];
    }

    /// Rescans K segments of equal length from their carries; returns the final states in `state`.
    template <std::size_t K>
    void rescan(const Segment* segs, std::size_t len, Acc* state) const {
        if constexpr (K == 1 && block_kernels) {
            if (step == 1) return rescan_blocks<false>(segs[0], len, *state);
            if (step == -1) return rescan_blocks<true>(segs[0], len, *state);
        }
        std::array<std::ptrdiff_t, K> off{};
        std::array<Acc, K> st{};
        const T* gate_base = gates - (Bwd ? step : 0);
        const T* h_prev = Bwd ? h + step : nullptr;  // backward: h at the forward-previous step
        for (std::size_t k = 0; k < K; ++k) off[k] = offset(segs[k], 0), st[k] = state[k];
        for (std::size_t i = 0; i < len; ++i) {
            for (std::size_t k = 0; k < K; ++k) {
                const std::ptrdiff_t o = off[k];
                const Acc v = load_gate<Log, Acc>(gate_base[o]) * st[k] + Acc(values[o]);
                st[k] = v;
                out[o] = T(v);
                if constexpr (Bwd) {
                    Acc grad_a = v * Acc(h_prev[o]);
                    if constexpr (Log) grad_a *= std::exp(Acc(gates[o]));
                    da[o] = T(grad_a);
                }
                off[k] = o + step;
            }
        }
        for (std::size_t k = 0; k < K; ++k) state[k] = st[k];
    }

#if (defined(__GNUC__) && __GNUC__ >= 12) || defined(__clang__)
    /// reduce<1> on one segment with adjacent steps: per block of N steps one in-register scan,
    /// then (A, X) <- (a_blk A, a_blk X + x_blk) with the block's total map.
    template <bool Descending>
    void reduce_blocks(const Segment& seg, std::size_t len, Acc& A, Acc& X) const {
        constexpr std::size_t N = block_lanes<Acc>;
        const T* gate_base = gates - (Bwd ? step : 0);
        std::ptrdiff_t o = offset(seg, 0);
        Acc pa = 1, px = 0;
        std::size_t i = 0;
        for (; i + N <= len; i += N, o += step * std::ptrdiff_t(N)) {
            block_of<Acc> a, x;
            load_and_scan_block<Descending>(gate_base + o, values + o, a, x);
            px = a[N - 1] * px + x[N - 1];
            pa *= a[N - 1];
        }
        for (; i < len; ++i, o += step) {
            const Acc a = gate_base[o];
            pa *= a;
            px = a * px + values[o];
        }
        A = pa, X = px;
    }

    /// rescan<1> on one segment with adjacent steps: h_blk = x_blk + a_blk * carry, carry = last lane.
    template <bool Descending>
    void rescan_blocks(const Segment& seg, std::size_t len, Acc& state) const {
        constexpr std::size_t N = block_lanes<Acc>;
        const T* gate_base = gates - (Bwd ? step : 0);
        std::ptrdiff_t o = offset(seg, 0);
        Acc st = state;
        std::size_t i = 0;
        for (; i + N <= len; i += N, o += step * std::ptrdiff_t(N)) {
            block_of<Acc> a, x;
            load_and_scan_block<Descending>(gate_base + o, values + o, a, x);
            const block_of<Acc> v = x + a * st;
            st = v[N - 1];
            store_steps<Descending>(out + o, v);
            if constexpr (Bwd) {
                block_of<Acc> h_prev;
                load_steps<Descending>(h + o + step, h_prev);
                store_steps<Descending>(da + o, h_prev * v);
            }
        }
        for (; i < len; ++i, o += step) {
            const Acc v = gate_base[o] * st + values[o];
            st = v;
            out[o] = v;
            if constexpr (Bwd) da[o] = v * h[o + step];
        }
        state = st;
    }
#else
    template <bool Descending>
    void reduce_blocks(const Segment&, std::size_t, Acc&, Acc&) const {}
    template <bool Descending>
    void rescan_blocks(const Segment&, std::size_t, Acc&) const {}
#endif
};

template <bool Bwd, bool Log, class Acc, class B, class T>
void two_pass_run(const Geometry& g, const T* gates, const T* values, const T* h, T* out, T* da, const T* init, T* final_state,
                  const T* h0_for_da, T* dh0) {
    const std::size_t R = g.rows(), T_ = g.time;
    const int threads = std::max(1, B::num_threads());
    // Round: about 2^17 elements per thread over all rows (a, x, h of a round fit in L2).
    const std::size_t per_thread = two_pass_round_elements().load(std::memory_order_relaxed);
    const std::size_t round = std::max<std::size_t>(std::min<std::size_t>(1024, per_thread), per_thread * std::size_t(threads) / R);
    const std::size_t want_tasks = std::size_t(threads) * 8;
    const std::size_t min_segment = std::min<std::size_t>(256, std::max<std::size_t>(1, per_thread / 64));
    const std::ptrdiff_t xt = std::ptrdiff_t(g.xt);
    // Forward processing index i is time time_of(i); backward index r is forward step T-1-r.
    const bool ascending = Bwd ? g.reverse : !g.reverse;
    SegmentPass<Bwd, Log, Acc, T> pass{&g, gates, values, h, out, da, ascending ? xt : -xt, ascending ? 0 : (T_ - 1) * g.xt};

    Storage<Acc> carry(R), A(R * 64), X(R * 64), carry_in(R * 64);
    for (std::size_t r = 0; r < R; ++r) carry[r] = init ? Acc(init[r]) : Acc(0);
    auto row_base = [&](std::size_t r) { return (r / g.channels) * g.xb + (r % g.channels) * g.xc; };
    // h0, h_last and dh0 are [batch, channels]: indexed by the row number.

    // Segments per round and their length for a round of L steps (equal lengths, the last may be short).
    auto partition = [&](std::size_t L) {
        std::size_t S = std::min<std::size_t>(64, std::max<std::size_t>(1, (want_tasks + R - 1) / R));
        S = std::max<std::size_t>(1, std::min(S, L / min_segment));
        const std::size_t seg_len = (L + S - 1) / S;
        return std::pair{(L + seg_len - 1) / seg_len, seg_len};
    };
    // Full rounds get a segment length whose byte stride is an odd number of cache lines: with a
    // power-of-two stride the interleaved chains of a row all map to the same L1 set (64 KB apart
    // for 2^14-step segments) and evict each other -- 5-6x slower, measured at T = 2^24.
    auto [full_segments, full_length] = partition(round);
    const std::size_t step_bytes = g.xt * sizeof(T);
    if (full_segments > 1 && full_length * step_bytes >= 512)
        while ((full_length * step_bytes / 64) % 2 == 0) ++full_length;
    const std::size_t full_round = full_segments * full_length;
    for (std::size_t s0 = 0; s0 < T_; s0 += full_round) {
        const std::size_t L = std::min(full_round, T_ - s0);
        const auto shape = L == full_round ? std::pair{full_segments, full_length} : partition(L);
        const std::size_t S = shape.first, seg_len = shape.second;
        const bool first_round = s0 == 0, last_round = s0 + L == T_;
        auto make = [&](std::size_t task) {
            const std::size_t k = task / R, r = task % R;
            const std::size_t start = s0 + k * seg_len;
            return Segment{row_base(r), start, std::min(seg_len, s0 + L - start)};
        };
        // Tasks that touch the global first/last processing index are peeled one element in the
        // backward (gate before index 0 does not exist; h before forward step 0 is h0).
        auto special = [&](std::size_t task) {
            const std::size_t k = task / R;
            return Bwd && ((first_round && k == 0) || (last_round && k == S - 1));
        };
        // Work items: up to 8 consecutive tasks of equal length run as 8 interleaved chains (a short
        // group is padded with copies of its last task, whose results are identical and discarded);
        // peeled tasks run alone.
        struct Item {
            std::size_t first, count;
            bool alone;
        };
        std::vector<Item> items;
        auto for_groups = [&](std::size_t n, auto&& group8, auto&& single) {
            items.clear();
            for (std::size_t task = 0; task < n;) {
                if (pass.use_blocks() || special(task)) {
                    items.push_back({task++, 1, true});
                    continue;
                }
                const std::size_t len = make(task).length;
                std::size_t count = 1;
                while (count < 8 && task + count < n && !special(task + count) && make(task + count).length == len) ++count;
                items.push_back({task, count, false});
                task += count;
            }
            B::parallel_for(items.size(), seg_len * 8 * 4, [&](std::size_t begin, std::size_t end) {
                denormal_guard guard;
                for (std::size_t i = begin; i < end; ++i) {
                    if (items[i].alone) single(items[i].first);
                    else group8(items[i].first, items[i].count);
                }
            });
        };
        // Pass 1 over segments 0 .. S-2 (the last segment's map only feeds the next round, which
        // pass 2 provides as its final state).
        const std::size_t reduce_tasks = (S - 1) * R;
        auto reduce_single = [&](std::size_t task) {
            Segment seg = make(task);
            Acc a_map = 1, x_map = 0;
            if (Bwd && first_round && task / R == 0) {  // index 0: gate 1 (the carry is dh_last)
                x_map = Acc(values[pass.offset(seg, 0)]);
                ++seg.start, --seg.length;
            }
            Acc a2 = 1, x2 = 0;
            pass.template reduce<1>(&seg, seg.length, &a2, &x2);
            A[task] = a2 * a_map;
            X[task] = a2 * x_map + x2;
        };
        if (reduce_tasks > 0)
            for_groups(
                reduce_tasks,
                [&](std::size_t task, std::size_t count) {
                    std::array<Segment, 8> segs{};
                    std::array<Acc, 8> a_map{}, x_map{};
                    for (std::size_t j = 0; j < 8; ++j) segs[j] = make(task + std::min(j, count - 1));
                    pass.template reduce<8>(segs.data(), segs[0].length, a_map.data(), x_map.data());
                    for (std::size_t j = 0; j < count; ++j) A[task + j] = a_map[j], X[task + j] = x_map[j];
                },
                reduce_single);
        for (std::size_t r = 0; r < R; ++r) {
            Acc c = carry[r];
            for (std::size_t k = 0; k < S; ++k) {
                carry_in[k * R + r] = c;
                if (k + 1 < S) c = A[k * R + r] * c + X[k * R + r];
            }
        }
        auto rescan_single = [&](std::size_t task) {
            Segment seg = make(task);
            Acc st = carry_in[task];
            const std::size_t k = task / R;
            if (Bwd && first_round && k == 0) {  // index 0: gate 1 (the carry is dh_last)
                const std::ptrdiff_t o = pass.offset(seg, 0);
                st = st + Acc(values[o]);
                out[o] = T(st);
                const bool only_step = T_ == 1;  // index 0 is then also forward step 0
                const Acc hp = only_step ? (h0_for_da ? Acc(h0_for_da[task % R]) : Acc(0)) : Acc(h[o + pass.step]);
                Acc d = st * hp;
                if constexpr (Log) d *= std::exp(Acc(gates[o]));
                da[o] = T(d);
                ++seg.start, --seg.length;
            }
            const bool peel_last = Bwd && last_round && k == S - 1 && seg.length > 0;
            if (peel_last) --seg.length;
            pass.template rescan<1>(&seg, seg.length, &st);
            if (peel_last) {
                const std::ptrdiff_t o = pass.offset(seg, seg.length);
                st = load_gate<Log, Acc>(gates[o - pass.step]) * st + Acc(values[o]);
                out[o] = T(st);
                Acc d = st * (h0_for_da ? Acc(h0_for_da[task % R]) : Acc(0));
                if constexpr (Log) d *= std::exp(Acc(gates[o]));
                da[o] = T(d);
            }
            if (k == S - 1) carry[task % R] = st;
        };
        for_groups(
            S * R,
            [&](std::size_t task, std::size_t count) {
                std::array<Segment, 8> segs{};
                std::array<Acc, 8> st{};
                for (std::size_t j = 0; j < 8; ++j) {
                    segs[j] = make(task + std::min(j, count - 1));
                    st[j] = carry_in[task + std::min(j, count - 1)];
                }
                pass.template rescan<8>(segs.data(), segs[0].length, st.data());
                for (std::size_t j = 0; j < count; ++j)
                    if ((task + j) / R == S - 1) carry[(task + j) % R] = st[j];
            },
            rescan_single);
    }
    if (final_state)
        for (std::size_t r = 0; r < R; ++r) final_state[r] = T(carry[r]);
    if (dh0)  // dh0 = a(forward step 0) g(forward step 0)
        for (std::size_t r = 0; r < R; ++r)
            dh0[r] = T(load_gate<Log, Acc>(gates[row_base(r) + g.time_of(0) * g.xt]) * carry[r]);
}

template <bool Log, class Acc, class B, class T>
void two_pass_forward_impl(const Geometry& g, const ForwardArgs<T>& args) {
    two_pass_run<false, Log, Acc, B>(g, args.gates, args.x, static_cast<const T*>(nullptr), args.h, static_cast<T*>(nullptr), args.h0,
                                     args.h_last, static_cast<const T*>(nullptr), static_cast<T*>(nullptr));
}

template <bool Log, class Acc, class B, class T>
void two_pass_backward_impl(const Geometry& g, const BackwardArgs<T>& args) {
    two_pass_run<true, Log, Acc, B>(g, args.gates, args.dh, args.h, args.dx, args.da, args.dh_last, static_cast<T*>(nullptr), args.h0,
                                    args.dh0);
}

// ---- Hillis-Steele over chunk ends, in place ([B, T, C], one gate per channel) --------------------
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

template <bool Bwd, bool Log, class Acc, class B, class T>
void hs_chunked_run(const Geometry& g, const T* gates, const T* values, const T* init, T* out, T* final_state, const T* h,
                    const T* h0, T* da, T* dh0, std::size_t K) {
    const std::size_t T_ = g.time, span = vector_span(g, B::num_threads()), chunks = (T_ + K - 1) / K;
    // Memory time of processing step r.
    auto time_at = [&](std::size_t r) { return Bwd ? g.time_of(T_ - 1 - r) : g.time_of(r); };
    for_each_channel_span<Acc, B>(g, span, 2 * chunks * span + 2 * span, [&](std::size_t b, std::size_t c0, std::size_t n, Acc* scratch) {
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
                if (a) {
#pragma omp simd
                    for (std::size_t w = 0; w < n; ++w) {
                        const Acc gate = load_gate<Log, Acc>(a[w]);
                        state[w] = gate * state[w] + Acc(v[w]);
                        product[w] *= gate;
                    }
                } else {
#pragma omp simd
                    for (std::size_t w = 0; w < n; ++w) state[w] += Acc(v[w]);
                }
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
                if (a) {
#pragma omp simd
                    for (std::size_t w = 0; w < n; ++w) {
                        state[w] = load_gate<Log, Acc>(a[w]) * state[w] + Acc(v[w]);
                        o[w] = T(state[w]);
                    }
                } else {
#pragma omp simd
                    for (std::size_t w = 0; w < n; ++w) {
                        state[w] += Acc(v[w]);
                        o[w] = T(state[w]);
                    }
                }
                if constexpr (Bwd) {  // da(s) = g(s) h(s-1), h(-1) = h0; log gates: times a(s)
                    const std::size_t s = T_ - 1 - r;
                    const T* hp = s > 0 ? h + g.x_index(b, g.time_of(s - 1), c0) : (h0 ? h0 + b * g.channels + c0 : nullptr);
                    const T* a_self = gates + off;
                    T* d = da + off;
                    if (hp) {
#pragma omp simd
                        for (std::size_t w = 0; w < n; ++w) {
                            Acc grad_a = state[w] * Acc(hp[w]);
                            if constexpr (Log) grad_a *= std::exp(Acc(a_self[w]));
                            d[w] = T(grad_a);
                        }
                    } else {
                        std::fill(d, d + n, T(0));
                    }
                }
            }
        }
        const Acc* last = end_scan + (chunks - 1) * n;
        if (final_state)
            for (std::size_t w = 0; w < n; ++w) final_state[b * g.channels + c0 + w] = T(last[w]);
        if (dh0)  // dh0 = a(forward step 0) g(forward step 0), the last processing step
            for (std::size_t w = 0; w < n; ++w)
                dh0[b * g.channels + c0 + w] = T(load_gate<Log, Acc>(gates[g.x_index(b, g.time_of(0), c0 + w)]) * last[w]);
    });
}

template <bool Log, class Acc, class B, class T>
void hs_chunked_forward_impl(const Geometry& g, const ForwardArgs<T>& args, std::size_t K) {
    hs_chunked_run<false, Log, Acc, B>(g, args.gates, args.x, args.h0, args.h, args.h_last, static_cast<const T*>(nullptr),
                                       static_cast<const T*>(nullptr), static_cast<T*>(nullptr), static_cast<T*>(nullptr), K);
}

template <bool Log, class Acc, class B, class T>
void hs_chunked_backward_impl(const Geometry& g, const BackwardArgs<T>& args, std::size_t K) {
    hs_chunked_run<true, Log, Acc, B>(g, args.gates, args.dh, args.dh_last, args.dx, static_cast<T*>(nullptr), args.h, args.h0, args.da,
                                      args.dh0, K);
}

// ---- shared-gate chunked matmul (one gate per head of P channels) -------------------------------

/// Within a chunk of Q steps of one head: H = M X + p carry^T with the Q x Q decay matrix M
/// (lower-triangular forward, upper-triangular reverse; entries are products of the head's gates
/// built by row-wise cumulative products) multiplying the chunk's [Q x P] inputs with one GEMM
/// (B::gemm, Eigen on the CPU backends). Reads x and writes h in place (btc: rows of ld C; bct:
/// the transposed product with ld T).
template <bool Log, class B, class T>
void shared_matmul_forward_impl(const Geometry& g, const ForwardArgs<T>& args, std::size_t Q) {
    const std::size_t H = g.gate_channels, P = g.share, T_ = g.time;
    const bool btc = g.layout == Layout::btc;
    B::parallel_for(g.batch * H, T_ * P * Q, [&](std::size_t begin, std::size_t end) {
        denormal_guard guard;
        Storage<T> M(Q * Q), decay(Q), gate(Q);
        Storage<T> carry(P);
        for (std::size_t task = begin; task < end; ++task) {
            const std::size_t b = task / H, head = task % H, c0 = head * P;
            for (std::size_t p = 0; p < P; ++p) carry[p] = args.h0 ? args.h0[b * g.channels + c0 + p] : T(0);
            const std::size_t chunks = (T_ + Q - 1) / Q;
            for (std::size_t n = 0; n < chunks; ++n) {
                // Chunks in processing order; t0 = first time index of the chunk in memory.
                const std::size_t len = std::min(Q, T_ - n * Q);
                const std::size_t t0 = g.reverse ? T_ - n * Q - len : n * Q;
                for (std::size_t i = 0; i < len; ++i) gate[i] = load_gate<Log, T>(args.gates[g.gate_index(b, t0 + i, c0)]);
                std::fill(M.begin(), M.begin() + std::ptrdiff_t(len * len), T(0));
                if (!g.reverse) {
                    for (std::size_t i = 0; i < len; ++i) {
                        T* row = M.data() + i * len;
                        const T* above = i > 0 ? row - len : row;
                        for (std::size_t j = 0; i > 0 && j < i; ++j) row[j] = above[j] * gate[i];
                        row[i] = 1;
                        decay[i] = i == 0 ? gate[0] : decay[i - 1] * gate[i];
                    }
                } else {
                    for (std::size_t i = len; i-- > 0;) {
                        T* row = M.data() + i * len;
                        for (std::size_t j = i + 1; j < len; ++j) row[j] = row[j + len] * gate[i];
                        row[i] = 1;
                        decay[i] = i + 1 == len ? gate[i] : gate[i] * decay[i + 1];
                    }
                }
                const std::size_t xoff = g.x_index(b, t0, c0);
                if (btc) {
                    B::gemm(false, false, len, P, len, T(1), M.data(), len, args.x + xoff, g.channels, T(0), args.h + xoff, g.channels);
                    for (std::size_t i = 0; i < len; ++i) {
                        T* hr = args.h + xoff + i * g.channels;
                        for (std::size_t p = 0; p < P; ++p) hr[p] += decay[i] * carry[p];
                    }
                    const T* last = args.h + xoff + (g.reverse ? 0 : len - 1) * g.channels;
                    for (std::size_t p = 0; p < P; ++p) carry[p] = last[p];
                } else {
                    B::gemm(false, true, P, len, len, T(1), args.x + xoff, T_, M.data(), len, T(0), args.h + xoff, T_);
                    for (std::size_t p = 0; p < P; ++p) {
                        T* hr = args.h + xoff + p * T_;
                        for (std::size_t i = 0; i < len; ++i) hr[i] += decay[i] * carry[p];
                        carry[p] = hr[g.reverse ? 0 : len - 1];
                    }
                }
            }
            if (args.h_last)
                for (std::size_t p = 0; p < P; ++p) args.h_last[b * g.channels + c0 + p] = carry[p];
        }
    });
}

}  // namespace olmax::scan::detail
