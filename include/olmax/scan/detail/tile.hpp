#pragma once
// Tile engine for the tree, chunked and log-space strategies.
//
// A tile is W channels of one batch element, copied into thread-local scratch in processing order
// and time-major ([step][lane], lanes contiguous so every step vectorises across channels). h0 is
// folded into the first input (x_0 += a_0 * h0), so tile kernels scan from a zero state in place:
// on return x holds h. The backward is the same kernel on a second gather: the adjoint
// g_s = dh_s + a_{s+1} * g_{s+1} is a scan in the opposite direction whose gates are shifted by one
// step; the scatter then writes dx = g and da = g * h_{t-1} (exact, with h_{-1} = h0).
// Scratch is tensor storage (counted by memory::stats()): O(T * W) per thread.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string_view>

#include "olmax/core/tensor.hpp"
#include "olmax/scan/detail/denormals.hpp"
#include "olmax/scan/detail/problem.hpp"

namespace olmax::scan::detail {

/// Lanes per tile: 16 channels (one AVX-512 vector of fp32), fewer for very long sequences so a
/// tile stays below 2^21 elements of scratch.
inline std::size_t tile_width(const Geometry& g) {
    std::size_t w = 16;
    while (w > 1 && g.time * w > (std::size_t{1} << 21)) w /= 2;
    return std::min(w, g.channels);
}

// ---- tile kernels: in place on a[T][W], x[T][W]; x becomes h ------------------------------------

/// h_s = a_s h_{s-1} + x_s, one step after another.
struct tile_sequential {
    static constexpr std::string_view name = "tile_sequential";
    static std::size_t scratch(std::size_t, std::size_t, std::size_t) { return 0; }
    template <class Acc>
    static void run(Acc* a, Acc* x, std::size_t T, std::size_t W, std::size_t, Acc*) {
        for (std::size_t s = 1; s < T; ++s) {
            Acc* xs = x + s * W;
            const Acc* xp = xs - W;
            const Acc* as = a + s * W;
#pragma omp simd
            for (std::size_t w = 0; w < W; ++w) xs[w] += as[w] * xp[w];
        }
    }
};

/// Hillis-Steele doubling steps at offsets d = first, 2 first, ... while d < T: after the step at
/// offset d, (a_s, x_s) is the composition of the window of the last 2d steps. Running the loop
/// while d < T gives ceil(log2(T / first)) steps, so every T is fully scanned (the original's
/// floor(log2 T) left non-powers of two partially scanned). In place, t descending: the right-hand
/// sides read the values of the previous step.
template <class Acc>
void doubling_steps(Acc* a, Acc* x, std::size_t T, std::size_t W, std::size_t first) {
    for (std::size_t d = first; d < T; d *= 2) {
        const bool last = 2 * d >= T;  // the gate products are not needed after the last step
        for (std::size_t s = T - 1; s >= d; --s) {
            Acc* xs = x + s * W;
            Acc* as = a + s * W;
            const Acc* xd = xs - d * W;
            const Acc* ad = as - d * W;
#pragma omp simd
            for (std::size_t w = 0; w < W; ++w) xs[w] += as[w] * xd[w];
            if (!last) {
#pragma omp simd
                for (std::size_t w = 0; w < W; ++w) as[w] *= ad[w];
            }
        }
    }
}

struct tile_hillis_steele {
    static constexpr std::string_view name = "tile_hillis_steele";
    static std::size_t scratch(std::size_t, std::size_t, std::size_t) { return 0; }
    template <class Acc>
    static void run(Acc* a, Acc* x, std::size_t T, std::size_t W, std::size_t, Acc*) { doubling_steps(a, x, T, W, 1); }
};

/// The "Faster QRNN" form: the first log2(K) doubling steps are replaced by one O(T) in-chunk
/// pass (every step gets the composition of its chunk's prefix), and the doubling continues at
/// offsets K, 2K, 4K, ... on the chunk ends only: position c0 + i of chunk c needs the scan up to
/// the end of chunk c - 1, and nothing else, so doubling the other K - 1 positions of each chunk
/// (as the original did, O(T log(T/K)) work) adds no information. Here: O(T + (T/K) log(T/K))
/// work in three steps -- in-chunk prefix, Hillis-Steele over the ceil(T/K) chunk ends, one fix-up
/// pass h = local + (chunk prefix gate) * (previous chunk end).
struct tile_hillis_steele_chunked {
    static constexpr std::string_view name = "tile_hillis_steele_chunked";
    static std::size_t scratch(std::size_t T, std::size_t W, std::size_t K) { return 2 * ((T + K - 1) / K) * W; }
    template <class Acc>
    static void run(Acc* a, Acc* x, std::size_t T, std::size_t W, std::size_t K, Acc* scratch) {
        const std::size_t chunks = (T + K - 1) / K;
        Acc* end_gate = scratch;           // [chunk][lane]: product of the chunk's gates
        Acc* end_scan = scratch + chunks * W;  // [chunk][lane]: the chunk's scan from a zero state
        // 1. In-chunk prefix, in place: x_s <- scan of the chunk up to s, a_s <- product of its gates.
        for (std::size_t c = 0; c < chunks; ++c) {
            const std::size_t c0 = c * K, len = std::min(K, T - c0);
            for (std::size_t i = 1; i < len; ++i) {
                Acc* xs = x + (c0 + i) * W;
                Acc* as = a + (c0 + i) * W;
                const Acc* xp = xs - W;
                const Acc* ap = as - W;
#pragma omp simd
                for (std::size_t w = 0; w < W; ++w) {
                    xs[w] += as[w] * xp[w];
                    as[w] *= ap[w];
                }
            }
            const std::size_t last = (c0 + len - 1) * W;
            for (std::size_t w = 0; w < W; ++w) end_gate[c * W + w] = a[last + w], end_scan[c * W + w] = x[last + w];
        }
        // 2. Hillis-Steele doubling over the chunk ends (offsets K, 2K, ... in steps): end_scan[c]
        //    becomes h at the end of chunk c.
        doubling_steps(end_gate, end_scan, chunks, W, 1);
        // 3. Fix-up: h_s = local_s + P_s * h(end of the previous chunk).
        for (std::size_t c = 1; c < chunks; ++c) {
            const std::size_t c0 = c * K, len = std::min(K, T - c0);
            const Acc* carry = end_scan + (c - 1) * W;
            for (std::size_t i = 0; i < len; ++i) {
                Acc* xs = x + (c0 + i) * W;
                const Acc* as = a + (c0 + i) * W;
#pragma omp simd
                for (std::size_t w = 0; w < W; ++w) xs[w] += as[w] * carry[w];
            }
        }
    }
};

/// Work-efficient Blelloch / Brent-Kung scan: up-sweep builds block aggregates at positions
/// i with i+1 a multiple of 2d; the down-sweep completes positions i = 3d-1, 5d-1, ... from the
/// finished prefix at i-d. The carry into a prefix is zero, so the down-sweep needs no gate products.
struct tile_blelloch {
    static constexpr std::string_view name = "tile_blelloch";
    static std::size_t scratch(std::size_t, std::size_t, std::size_t) { return 0; }
    template <class Acc>
    static void run(Acc* a, Acc* x, std::size_t T, std::size_t W, std::size_t, Acc*) {
        std::size_t top = 1;
        for (std::size_t d = 1; d < T; d *= 2) {
            top = d;
            for (std::size_t i = 2 * d - 1; i < T; i += 2 * d) {
                Acc* xi = x + i * W;
                Acc* ai = a + i * W;
                const Acc* xd = xi - d * W;
                const Acc* ad = ai - d * W;
#pragma omp simd
                for (std::size_t w = 0; w < W; ++w) {
                    xi[w] += ai[w] * xd[w];
                    ai[w] *= ad[w];
                }
            }
        }
        for (std::size_t d = top; d >= 1; d /= 2) {
            for (std::size_t i = 3 * d - 1; i < T; i += 2 * d) {
                Acc* xi = x + i * W;
                const Acc* ai = a + i * W;
                const Acc* xd = xi - d * W;
#pragma omp simd
                for (std::size_t w = 0; w < W; ++w) xi[w] += ai[w] * xd[w];
            }
        }
    }
};

/// Per-channel chunked triangular matmul: within a chunk of Q steps h = L x + P carry with
/// L[i][j] = a_{j+1} ... a_i (1 on the diagonal) and P_i = a_0 ... a_i. L is built per channel
/// by row-wise cumulative products (L[i][j] = L[i-1][j] a_i), never by dividing cumulative products
/// or by differences of cumulative logs, so zero and tiny gates are exact.
struct tile_chunked_matmul {
    static constexpr std::string_view name = "tile_chunked_matmul";
    static std::size_t scratch(std::size_t, std::size_t, std::size_t Q) { return Q * Q + 2 * Q; }
    template <class Acc>
    static void run(Acc* a, Acc* x, std::size_t T, std::size_t W, std::size_t Q, Acc* scratch) {
        Acc* L = scratch;
        Acc* xs = scratch + Q * Q;
        Acc* hs = xs + Q;
        for (std::size_t w = 0; w < W; ++w) {
            Acc carry = 0;
            for (std::size_t c0 = 0; c0 < T; c0 += Q) {
                const std::size_t len = std::min(Q, T - c0);
                for (std::size_t i = 0; i < len; ++i) {
                    const Acc ai = a[(c0 + i) * W + w];
                    Acc* row = L + i * Q;
                    const Acc* prev = row - Q;
                    for (std::size_t j = 0; j < i; ++j) row[j] = prev[j] * ai;
                    row[i] = 1;
                    xs[i] = x[(c0 + i) * W + w];
                }
                const Acc a0 = a[c0 * W + w];
                for (std::size_t i = 0; i < len; ++i) {
                    const Acc* row = L + i * Q;
                    Acc acc = 0;
#pragma omp simd reduction(+ : acc)
                    for (std::size_t j = 0; j <= i; ++j) acc += row[j] * xs[j];
                    hs[i] = acc + (row[0] * a0) * carry;  // P_i = L[i][0] a_0
                }
                for (std::size_t i = 0; i < len; ++i) x[(c0 + i) * W + w] = hs[i];
                carry = hs[len - 1];
            }
        }
    }
};

/// Heinsen's log-space scan, chunk-local: within a chunk of K steps with cumulative log gates
/// c_s, h_s = e^{c_s} carry + e^{c_s + L+_s} - e^{c_s + L-_s}, where L+- = logcumsumexp of
/// log|x_j| - c_j over positive / negative x_j (the sign split makes it valid for any real x).
/// Needs gates >= 0 (log of a negative gate is NaN). Computes in the accumulator type (double).
struct tile_log_space {
    static constexpr std::string_view name = "tile_log_space";
    static std::size_t scratch(std::size_t, std::size_t, std::size_t) { return 0; }
    template <class Acc>
    static void run(Acc* a, Acc* x, std::size_t T, std::size_t W, std::size_t K, Acc*) {
        constexpr Acc neg_inf = -std::numeric_limits<Acc>::infinity();
        constexpr Acc log_floor = Acc(-700);  // log of a zero gate: e^-700 is below any contribution that matters
        auto logaddexp = [](Acc p, Acc q) {
            if (p == neg_inf) return q;
            if (q == neg_inf) return p;
            const Acc m = std::max(p, q);
            return m + std::log1p(std::exp(-std::abs(p - q)));
        };
        for (std::size_t w = 0; w < W; ++w) {
            Acc carry = 0;
            for (std::size_t c0 = 0; c0 < T; c0 += K) {
                const std::size_t len = std::min(K, T - c0);
                Acc cum = 0, pos = neg_inf, neg = neg_inf;
                for (std::size_t i = 0; i < len; ++i) {
                    const std::size_t k = (c0 + i) * W + w;
                    const Acc ga = a[k];
                    cum += ga == 0 ? log_floor : std::log(ga);
                    const Acc xv = x[k];
                    if (xv > 0) pos = logaddexp(pos, std::log(xv) - cum);
                    else if (xv < 0) neg = logaddexp(neg, std::log(-xv) - cum);
                    else if (std::isnan(xv)) pos = xv;
                    x[k] = std::exp(cum) * carry + std::exp(cum + pos) - std::exp(cum + neg);
                }
                carry = x[(c0 + len - 1) * W + w];
            }
        }
    }
};

// ---- drivers ---------------------------------------------------------------------------------

/// Visits every (step, lane) of a tile in the order that walks memory contiguously: steps outer
/// for [B, T, C] (lanes are adjacent channels), lanes outer for [B, C, T] (steps are adjacent).
template <class F>
void for_each_in_tile(const Geometry& g, std::size_t steps, std::size_t lanes, F&& f) {
    if (g.layout == Layout::btc) {
        for (std::size_t s = 0; s < steps; ++s)
            for (std::size_t w = 0; w < lanes; ++w) f(s, w);
    } else {
        for (std::size_t w = 0; w < lanes; ++w)
            for (std::size_t s = 0; s < steps; ++s) f(s, w);
    }
}

/// Walks every (batch, channel tile) of `g` on the current device's threads, with flush-to-zero on and a
/// per-thread buffer: body(b, c0, cw, a, x, scratch) gets the tile's batch, first channel, width,
/// two [T, cw] work arrays and the kernel's scratch space. Forward and backward share it.
template <class Kernel, class Acc, class Body>
void for_each_tile(const Geometry& g, std::size_t chunk, Body&& body) {
    const std::size_t T_ = g.time, W = tile_width(g);
    const std::size_t per_batch = (g.channels + W - 1) / W;
    const std::size_t scratch = Kernel::scratch(T_, W, chunk);
    backend::current().parallel_for(g.batch * per_batch, T_ * W * 4, [&](std::size_t begin, std::size_t end) {
        denormal_guard guard;
        Storage<Acc> buffer(2 * T_ * W + scratch + 1);
        for (std::size_t tile = begin; tile < end; ++tile) {
            const std::size_t b = tile / per_batch, c0 = (tile % per_batch) * W;
            const std::size_t cw = std::min(W, g.channels - c0);
            Acc* a = buffer.data();
            Acc* x = a + T_ * cw;
            body(b, c0, cw, a, x, buffer.data() + 2 * T_ * cw);
        }
    });
}

template <bool Log, class Kernel, class Acc, class T>
void tile_forward_impl(const Geometry& g, const ForwardArgs<T>& args, std::size_t chunk) {
    const std::size_t T_ = g.time;
    for_each_tile<Kernel, Acc>(g, chunk, [&](std::size_t b, std::size_t c0, std::size_t cw, Acc* a, Acc* x, Acc* scratch) {
        if (contiguous_lanes(g)) {  // rows of the tile are contiguous runs of memory: vectorised copies
            for (std::size_t s = 0; s < T_; ++s) {
                const std::size_t off = g.x_index(b, g.time_of(s), c0);
                const T* gs = args.gates + off;
                const T* xs = args.x + off;
                Acc* as = a + s * cw;
                Acc* ys = x + s * cw;
#pragma omp simd
                for (std::size_t w = 0; w < cw; ++w) as[w] = load_gate<Log, Acc>(gs[w]), ys[w] = Acc(xs[w]);
            }
        } else {
            for_each_in_tile(g, T_, cw, [&](std::size_t s, std::size_t w) {
                const std::size_t t = g.time_of(s);
                a[s * cw + w] = load_gate<Log, Acc>(args.gates[g.gate_index(b, t, c0 + w)]);
                x[s * cw + w] = Acc(args.x[g.x_index(b, t, c0 + w)]);
            });
        }
        if (args.h0)
            for (std::size_t w = 0; w < cw; ++w) x[w] += a[w] * Acc(args.h0[b * g.channels + c0 + w]);
        Kernel::run(a, x, T_, cw, chunk, scratch);
        if (contiguous_lanes(g)) {
            for (std::size_t s = 0; s < T_; ++s) {
                T* hs = args.h + g.x_index(b, g.time_of(s), c0);
                const Acc* ys = x + s * cw;
#pragma omp simd
                for (std::size_t w = 0; w < cw; ++w) store_value(hs[w], ys[w]);
            }
        } else {
            for_each_in_tile(g, T_, cw, [&](std::size_t s, std::size_t w) { store_value(args.h[g.x_index(b, g.time_of(s), c0 + w)], x[s * cw + w]); });
        }
        if (args.h_last)
            for (std::size_t w = 0; w < cw; ++w) store_value(args.h_last[b * g.channels + c0 + w], x[(T_ - 1) * cw + w]);
    });
}

template <class Kernel, class Acc, class T>
void tile_forward(const Geometry& g, const ForwardArgs<T>& args, std::size_t chunk) {
    if (g.log_gates) tile_forward_impl<true, Kernel, Acc>(g, args, chunk);
    else tile_forward_impl<false, Kernel, Acc>(g, args, chunk);
}

/// Backward through the tile engine. Backward step r handles forward step s = T-1-r:
/// g_r = dh(s) + a(s+1) g_{r-1}; then dx(s) = g, da(s) = g h(s-1) (h(-1) = h0), dh0 = a(0) g(0).
template <bool Log, class Kernel, class Acc, class T>
void tile_backward_impl(const Geometry& g, const BackwardArgs<T>& args, std::size_t chunk) {
    const std::size_t T_ = g.time;
    for_each_tile<Kernel, Acc>(g, chunk, [&](std::size_t b, std::size_t c0, std::size_t cw, Acc* a, Acc* x, Acc* scratch) {
        if (contiguous_lanes(g)) {  // see tile_forward_impl
            for (std::size_t r = 0; r < T_; ++r) {
                const std::size_t s = T_ - 1 - r;
                const T* dhs = args.dh + g.x_index(b, g.time_of(s), c0);
                const T* gs = r == 0 ? nullptr : args.gates + g.x_index(b, g.time_of(s + 1), c0);
                Acc* ar = a + r * cw;
                Acc* xr = x + r * cw;
#pragma omp simd
                for (std::size_t w = 0; w < cw; ++w) ar[w] = gs ? load_gate<Log, Acc>(gs[w]) : Acc(0), xr[w] = Acc(dhs[w]);
            }
        } else {
            for_each_in_tile(g, T_, cw, [&](std::size_t r, std::size_t w) {
                const std::size_t s = T_ - 1 - r, t = g.time_of(s);
                a[r * cw + w] = r == 0 ? Acc(0) : load_gate<Log, Acc>(args.gates[g.gate_index(b, g.time_of(s + 1), c0 + w)]);
                x[r * cw + w] = Acc(args.dh[g.x_index(b, t, c0 + w)]);
            });
        }
        if (args.dh_last)
            for (std::size_t w = 0; w < cw; ++w) x[w] += Acc(args.dh_last[b * g.channels + c0 + w]);
        Kernel::run(a, x, T_, cw, chunk, scratch);
        if (contiguous_lanes(g)) {
            for (std::size_t r = 0; r < T_; ++r) {
                const std::size_t s = T_ - 1 - r;
                const std::size_t off = g.x_index(b, g.time_of(s), c0);
                const T* h_prev = s > 0 ? args.h + g.x_index(b, g.time_of(s - 1), c0) : nullptr;
                const T* h0 = args.h0 ? args.h0 + b * g.channels + c0 : nullptr;
                const T* gs = args.gates + off;
                const Acc* gr = x + r * cw;
                T* dx = args.dx + off;
                T* da = args.da + off;
#pragma omp simd
                for (std::size_t w = 0; w < cw; ++w) {
                    const Acc hp = h_prev ? Acc(h_prev[w]) : (h0 ? Acc(h0[w]) : Acc(0));
                    Acc d = gr[w] * hp;
                    if constexpr (Log) d *= std::exp(Acc(gs[w]));
                    store_value(dx[w], gr[w]);
                    store_value(da[w], d);
                }
            }
        } else {
            for_each_in_tile(g, T_, cw, [&](std::size_t r, std::size_t w) {
                const std::size_t s = T_ - 1 - r, t = g.time_of(s), c = c0 + w;
                const Acc gr = x[r * cw + w];
                const Acc h_prev = s > 0 ? Acc(args.h[g.x_index(b, g.time_of(s - 1), c)])
                                         : (args.h0 ? Acc(args.h0[b * g.channels + c]) : Acc(0));
                Acc da = gr * h_prev;
                if constexpr (Log) da *= std::exp(Acc(args.gates[g.gate_index(b, t, c)]));
                store_value(args.dx[g.x_index(b, t, c)], gr);
                store_value(args.da[g.x_index(b, t, c)], da);
            });
        }
        if (args.dh0)
            for (std::size_t w = 0; w < cw; ++w)
                args.dh0[b * g.channels + c0 + w] =
                    T(load_gate<Log, Acc>(args.gates[g.gate_index(b, g.time_of(0), c0 + w)]) * x[(T_ - 1) * cw + w]);
    });
}

template <class Kernel, class Acc, class T>
void tile_backward(const Geometry& g, const BackwardArgs<T>& args, std::size_t chunk) {
    if (g.log_gates) tile_backward_impl<true, Kernel, Acc>(g, args, chunk);
    else tile_backward_impl<false, Kernel, Acc>(g, args, chunk);
}

/// The tile engine with tile kernel `Kernel` as a kernel family of the dispatch table (dispatch.hpp):
/// any geometry, forward and backward.
template <class Kernel>
struct tile_family {
    static constexpr std::string_view name = Kernel::name;
    template <class Acc, class T>
    static void forward(const Geometry& g, const ForwardArgs<T>& args, std::size_t chunk) {
        tile_forward<Kernel, Acc>(g, args, chunk);
    }
    template <class Acc, class T>
    static void backward(const Geometry& g, const BackwardArgs<T>& args, std::size_t chunk) {
        tile_backward<Kernel, Acc>(g, args, chunk);
    }
};

}  // namespace olmax::scan::detail
