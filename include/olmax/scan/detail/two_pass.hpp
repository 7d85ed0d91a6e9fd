#pragma once
// two_pass, in place (no tile copy): the time-parallel, cache-partitioned two-pass scan and its
// fused backward. Needs one gate per channel (share == 1).
//
// Time is cut into rounds small enough that a round of every row fits in the L2 caches; a round is
// cut into segments (tasks = row x segment). Pass 1 reduces each segment to its affine map (A, X)
// reading a and x from memory; a short serial pass turns the maps into carries; pass 2 rescans each
// segment from its carry, reading a and x again, now from cache, and writes h. DRAM traffic stays
// near 3 moves per element (Zhang, Wang & Ross 2020). Eight segments are interleaved per thread so
// eight independent FMA chains hide the FMA latency of a single long row. Rows whose steps are
// adjacent in memory scan 16-step vector blocks in registers instead (vector_block.hpp); in bf16
// storage pass 1 keeps each block's scanned maps in cache and pass 2 only applies the carries.
// The backward runs the same passes over the reversed order with gates taken one step later, and
// pass 2 also writes da = g h(s-1).

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "olmax/core/tensor.hpp"
#include "olmax/scan/detail/denormals.hpp"
#include "olmax/scan/detail/problem.hpp"
#include "olmax/scan/detail/vector_block.hpp"

namespace olmax::scan::detail {

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
    static constexpr bool block_kernels = !Log && block_storage_available<T, Acc>;
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
                store_value(out[o], v);
                if constexpr (Bwd) {
                    Acc grad_a = v * Acc(h_prev[o]);
                    if constexpr (Log) grad_a *= std::exp(Acc(gates[o]));
                    store_value(da[o], grad_a);
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
            load_and_scan_block<Descending, Acc>(gate_base + o, values + o, a, x);
            px = a[N - 1] * px + x[N - 1];
            pa *= a[N - 1];
        }
        for (; i < len; ++i, o += step) {
            const Acc a = Acc(gate_base[o]);
            pa *= a;
            px = a * px + Acc(values[o]);
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
            load_and_scan_block<Descending, Acc>(gate_base + o, values + o, a, x);
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
            const Acc v = Acc(gate_base[o]) * st + Acc(values[o]);
            st = v;
            store_value(out[o], v);
            if constexpr (Bwd) store_value(da[o], v * Acc(h[o + step]));
        }
        state = st;
    }

    /// Pass 1 of the stored-maps form (one segment, adjacent steps): the block scans of
    /// reduce_blocks, whose results are also stored in `maps` for pass 2 (apply_stored_maps), which
    /// then only applies the carries: per block of N steps the N gate products, then the N values
    /// scanned from a zero state; after the last whole block, each step's raw (a, x). Returns the
    /// segment's map.
    void store_maps(const Segment& seg, Acc* maps, Acc& A, Acc& X) const {
        if (step == 1) store_maps_impl<false>(seg, maps, A, X);
        else store_maps_impl<true>(seg, maps, A, X);
    }

    /// Pass 2 of the stored-maps form: h = x_i + a_i carry per block from what store_maps kept for
    /// the same segment; `state` is the carry in, then the segment's final state.
    void apply_stored_maps(const Segment& seg, const Acc* maps, Acc& state) const {
        if (step == 1) apply_stored_maps_impl<false>(seg, maps, state);
        else apply_stored_maps_impl<true>(seg, maps, state);
    }

    template <bool Descending>
    void store_maps_impl(const Segment& seg, Acc* maps, Acc& A, Acc& X) const {
        constexpr std::size_t N = block_lanes<Acc>;
        const T* const gate_base = gates - (Bwd ? step : 0);
        const T* const value_base = values;  // (locals: the stores below could alias the members)
        const std::ptrdiff_t s = step;
        std::ptrdiff_t o = offset(seg, 0);
        Acc pa = 1, px = 0;
        std::size_t i = 0;
        for (; i + N <= seg.length; i += N, o += s * std::ptrdiff_t(N), maps += 2 * N) {
            block_of<Acc> a, x;
            load_and_scan_block<Descending, Acc>(gate_base + o, value_base + o, a, x);
            std::memcpy(maps, &a, sizeof a);
            std::memcpy(maps + N, &x, sizeof x);
            px = a[N - 1] * px + x[N - 1];
            pa *= a[N - 1];
        }
        for (; i < seg.length; ++i, o += s, maps += 2) {
            const Acc a = Acc(gate_base[o]), x = Acc(value_base[o]);
            maps[0] = a, maps[1] = x;
            pa *= a;
            px = a * px + x;
        }
        A = pa, X = px;
    }

    template <bool Descending>
    void apply_stored_maps_impl(const Segment& seg, const Acc* maps, Acc& state) const {
        constexpr std::size_t N = block_lanes<Acc>;
        T* const out_base = out;  // (locals: the stores below could alias the members)
        T* const da_base = da;
        const T* const h_base = h;
        const std::ptrdiff_t s = step;
        std::ptrdiff_t o = offset(seg, 0);
        Acc st = state;
        std::size_t i = 0;
        for (; i + N <= seg.length; i += N, o += s * std::ptrdiff_t(N), maps += 2 * N) {
            block_of<Acc> a, x;
            std::memcpy(&a, maps, sizeof a);
            std::memcpy(&x, maps + N, sizeof x);
            // The carry chain is one scalar FMA per block; taking it from v's last lane would put a
            // broadcast and a lane extract on the chain too.
            const Acc next = x[N - 1] + a[N - 1] * st;
            const block_of<Acc> v = x + a * st;
            st = next;
            store_steps<Descending>(out_base + o, v);
            if constexpr (Bwd) {
                block_of<Acc> h_prev;
                load_steps<Descending>(h_base + o + s, h_prev);
                store_steps<Descending>(da_base + o, h_prev * v);
            }
        }
        for (; i < seg.length; ++i, o += s, maps += 2) {
            const Acc v = maps[0] * st + maps[1];
            st = v;
            store_value(out_base[o], v);
            if constexpr (Bwd) store_value(da_base[o], v * Acc(h_base[o + s]));
        }
        state = st;
    }
#else
    template <bool Descending>
    void reduce_blocks(const Segment&, std::size_t, Acc&, Acc&) const {}
    template <bool Descending>
    void rescan_blocks(const Segment&, std::size_t, Acc&) const {}
    void store_maps(const Segment&, Acc*, Acc&, Acc&) const {}
    void apply_stored_maps(const Segment&, const Acc*, Acc&) const {}
#endif
};

template <bool Bwd, bool Log, class Acc, class T>
void two_pass_run(const Geometry& g, const T* gates, const T* values, const T* h, T* out, T* da, const T* init, T* final_state,
                  const T* h0_for_da, T* dh0) {
    const std::size_t R = g.rows(), T_ = g.time;
    const int threads = std::max(1, backend::current().num_threads());
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
    // Rows with adjacent steps in bf16 storage take the stored-maps form: pass 1 keeps each block's
    // scanned maps in float (2 per step of a round, in cache for pass 2), so pass 2 applies the
    // carries instead of loading, widening and scanning every block again (measured on one long
    // row: forward 1.6x, backward 1.8x faster). Float storage keeps the rescan: there the stored
    // form ran 0.9-1.1x the rescan's speed in 12 runs of 14 but fell to 0.4x in two (both while the
    // machine's memory ran in its faster state), unexplained.
    const bool stored_maps = pass.use_blocks() && !std::is_same_v<T, Acc>;
    Storage<Acc> maps;
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
        if (stored_maps && maps.size() < 2 * S * R * seg_len) maps.resize(2 * S * R * seg_len);
        auto maps_of = [&](std::size_t task) { return maps.data() + 2 * task * seg_len; };
        auto make = [&](std::size_t task) {
            const std::size_t k = task / R, r = task % R;
            const std::size_t start = s0 + k * seg_len;
            return Segment{row_base(r), start, std::min(seg_len, s0 + L - start)};
        };
        // Tasks that touch the global first/last processing index are peeled one element in the
        // backward (gate before index 0 does not exist; h before forward step 0 is h0).
        auto peels_first = [&](std::size_t task) { return Bwd && first_round && task / R == 0; };
        auto peels_last = [&](std::size_t task) { return Bwd && last_round && task / R == S - 1; };
        auto special = [&](std::size_t task) { return peels_first(task) || peels_last(task); };
        // Work items: up to 8 consecutive tasks of equal length and the same peeling run as 8
        // interleaved chains (a short group is padded with copies of its last task, whose results
        // are identical and discarded); with block kernels every task runs alone.
        struct Item {
            std::size_t first, count;
            bool alone;
        };
        std::vector<Item> items;
        auto for_groups = [&](std::size_t n, auto&& group8, auto&& single) {
            items.clear();
            for (std::size_t task = 0; task < n;) {
                if (pass.use_blocks()) {
                    items.push_back({task++, 1, true});
                    continue;
                }
                const std::size_t len = make(task).length;
                const bool first = peels_first(task), last = peels_last(task);
                std::size_t count = 1;
                while (count < 8 && task + count < n && make(task + count).length == len && peels_first(task + count) == first &&
                       peels_last(task + count) == last)
                    ++count;
                items.push_back({task, count, false});
                task += count;
            }
            backend::current().parallel_for(items.size(), seg_len * 8 * 4, [&](std::size_t begin, std::size_t end) {
                denormal_guard guard;
                for (std::size_t i = begin; i < end; ++i) {
                    if (items[i].alone) single(items[i].first);
                    else group8(items[i].first, items[i].count);
                }
            });
        };
        // Pass 1 over segments 0 .. S-2 (the last segment's map only feeds the next round, which
        // pass 2 provides as its final state); in the stored-maps form over every segment, whose
        // maps pass 2 reads (and with as many tasks as pass 2, so that each thread finds the maps
        // of its tasks in its own cache). A peeled first index has gate 1 (the carry is dh_last):
        // its map is (1, value), composed before the rest of the segment's.
        const std::size_t reduce_tasks = (stored_maps ? S : S - 1) * R;
        auto peel_first_map = [&](std::size_t task, Segment& seg) {
            if (!peels_first(task)) return Acc(0);
            const Acc x_first = Acc(values[pass.offset(seg, 0)]);
            ++seg.start, --seg.length;
            return x_first;
        };
        // The map (a, x) of a peeled task's remaining steps composed after (1, x_first).
        auto compose_peeled = [&](std::size_t task, Acc a, Acc x, Acc x_first) { return peels_first(task) ? a * x_first + x : x; };
        auto reduce_single = [&](std::size_t task) {
            Segment seg = make(task);
            if (stored_maps && !special(task)) return pass.store_maps(seg, maps_of(task), A[task], X[task]);
            if (task / R == S - 1) return;  // (a peeled last segment: pass 2 scans it from a and x)
            const Acc x_first = peel_first_map(task, seg);
            Acc a2 = 1, x2 = 0;
            pass.template reduce<1>(&seg, seg.length, &a2, &x2);
            A[task] = a2;
            X[task] = compose_peeled(task, a2, x2, x_first);
        };
        if (reduce_tasks > 0)
            for_groups(
                reduce_tasks,
                [&](std::size_t task, std::size_t count) {
                    std::array<Segment, 8> segs{};
                    std::array<Acc, 8> a_map{}, x_map{}, x_first{};
                    for (std::size_t j = 0; j < 8; ++j) {
                        const std::size_t member = task + std::min(j, count - 1);
                        segs[j] = make(member);
                        x_first[j] = peel_first_map(member, segs[j]);
                    }
                    pass.template reduce<8>(segs.data(), segs[0].length, a_map.data(), x_map.data());
                    for (std::size_t j = 0; j < count; ++j)
                        A[task + j] = a_map[j], X[task + j] = compose_peeled(task + j, a_map[j], x_map[j], x_first[j]);
                },
                reduce_single);
        for (std::size_t r = 0; r < R; ++r) {
            Acc c = carry[r];
            for (std::size_t k = 0; k < S; ++k) {
                carry_in[k * R + r] = c;
                if (k + 1 < S) c = A[k * R + r] * c + X[k * R + r];
            }
        }
        // Pass 2's peeled steps: the first index (gate 1) before the segment's chain, the last
        // (forward step 0, whose h before is h0) after it.
        auto rescan_first_step = [&](std::size_t task, Segment& seg, Acc& st) {
            const std::ptrdiff_t o = pass.offset(seg, 0);
            st = st + Acc(values[o]);
            store_value(out[o], st);
            const bool only_step = T_ == 1;  // index 0 is then also forward step 0
            const Acc hp = only_step ? (h0_for_da ? Acc(h0_for_da[task % R]) : Acc(0)) : Acc(h[o + pass.step]);
            Acc d = st * hp;
            if constexpr (Log) d *= std::exp(Acc(gates[o]));
            store_value(da[o], d);
            ++seg.start, --seg.length;
        };
        auto rescan_last_step = [&](std::size_t task, const Segment& seg, Acc& st) {
            const std::ptrdiff_t o = pass.offset(seg, seg.length);
            st = load_gate<Log, Acc>(gates[o - pass.step]) * st + Acc(values[o]);
            store_value(out[o], st);
            Acc d = st * (h0_for_da ? Acc(h0_for_da[task % R]) : Acc(0));
            if constexpr (Log) d *= std::exp(Acc(gates[o]));
            store_value(da[o], d);
        };
        auto rescan_single = [&](std::size_t task) {
            Segment seg = make(task);
            Acc st = carry_in[task];
            const std::size_t k = task / R;
            if (stored_maps && !special(task)) {
                pass.apply_stored_maps(seg, maps_of(task), st);
                if (k == S - 1) carry[task % R] = st;
                return;
            }
            if (peels_first(task)) rescan_first_step(task, seg, st);
            const bool peel_last = peels_last(task) && seg.length > 0;
            if (peel_last) --seg.length;
            pass.template rescan<1>(&seg, seg.length, &st);
            if (peel_last) rescan_last_step(task, seg, st);
            if (k == S - 1) carry[task % R] = st;
        };
        for_groups(
            S * R,
            [&](std::size_t task, std::size_t count) {
                std::array<Segment, 8> segs{};
                std::array<Acc, 8> st{};
                for (std::size_t j = 0; j < 8; ++j) {
                    const std::size_t member = task + std::min(j, count - 1);
                    segs[j] = make(member);
                    st[j] = carry_in[member];
                    if (peels_first(member)) rescan_first_step(member, segs[j], st[j]);
                }
                const bool peel_last = peels_last(task) && segs[0].length > 0;  // (the members' lengths are equal)
                if (peel_last)
                    for (Segment& seg : segs) --seg.length;
                pass.template rescan<8>(segs.data(), segs[0].length, st.data());
                if (peel_last)
                    for (std::size_t j = 0; j < 8; ++j) rescan_last_step(task + std::min(j, count - 1), segs[j], st[j]);
                for (std::size_t j = 0; j < count; ++j)
                    if ((task + j) / R == S - 1) carry[(task + j) % R] = st[j];
            },
            rescan_single);
    }
    if (final_state)
        for (std::size_t r = 0; r < R; ++r) store_value(final_state[r], carry[r]);
    if (dh0)  // dh0 = a(forward step 0) g(forward step 0)
        for (std::size_t r = 0; r < R; ++r)
            store_value(dh0[r], load_gate<Log, Acc>(gates[row_base(r) + g.time_of(0) * g.xt]) * carry[r]);
}

template <bool Log, class Acc, class T>
void two_pass_forward_impl(const Geometry& g, const ForwardArgs<T>& args) {
    two_pass_run<false, Log, Acc>(g, args.gates, args.x, static_cast<const T*>(nullptr), args.h, static_cast<T*>(nullptr), args.h0,
                                     args.h_last, static_cast<const T*>(nullptr), static_cast<T*>(nullptr));
}

template <bool Log, class Acc, class T>
void two_pass_backward_impl(const Geometry& g, const BackwardArgs<T>& args) {
    two_pass_run<true, Log, Acc>(g, args.gates, args.dh, args.h, args.dx, args.da, args.dh_last, static_cast<T*>(nullptr), args.h0,
                                    args.dh0);
}

/// two_pass as a kernel family of the dispatch table (dispatch.hpp): gates per channel.
struct two_pass_family {
    static constexpr std::string_view name = "two_pass";
    template <class Acc, class T>
    static void forward(const Geometry& g, const ForwardArgs<T>& args, std::size_t) {
        if (g.log_gates) two_pass_forward_impl<true, Acc>(g, args);
        else two_pass_forward_impl<false, Acc>(g, args);
    }
    template <class Acc, class T>
    static void backward(const Geometry& g, const BackwardArgs<T>& args, std::size_t) {
        if (g.log_gates) two_pass_backward_impl<true, Acc>(g, args);
        else two_pass_backward_impl<false, Acc>(g, args);
    }
};

}  // namespace olmax::scan::detail
