#pragma once
// Spans of contiguous channels walked on the current device's threads: the work partition shared by the
// in-place kernels that vectorise across channels (sequential_vectorized, hillis_steele_chunked).

#include <algorithm>
#include <cstddef>

#include "olmax/backend/dispatch.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/scan/detail/denormals.hpp"
#include "olmax/scan/detail/problem.hpp"

namespace olmax::scan::detail {

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

/// Calls lanes(begin, end) over [0, n) in one piece, or, when `descending`, in cache-line pieces
/// (64 bytes of T) from the top down. A scan step touches one row segment per stream; when the walk
/// over time goes to lower addresses (a backward pass, a reverse scan), rows read upwards make
/// every stream a saw-tooth that the hardware prefetchers do not follow, while lines taken top
/// down make it one descending stream, which they do (pieces of 2 to 8 lines measured slower:
/// the streams must descend line by line). Measured (AMD EPYC Zen 4, 2 threads, [16,
/// 4096, 1024], sequential_vectorized backward): bf16 3.3 -> 6.2 G elements/s (0.47 -> 0.89-0.98
/// of a 3-read/2-write stream kernel), fp32 2.3-2.5 -> 3.4-3.6 (benchmarks/RESULTS.md).
template <class T, class Lanes>
[[gnu::always_inline]] inline void for_lane_pieces(std::size_t n, bool descending, Lanes&& lanes) {
    constexpr std::size_t line = std::max<std::size_t>(64 / sizeof(T), 1);
    if (!descending || n <= line) return lanes(std::size_t{0}, n);
    for (std::size_t end = n; end > 0;) {
        const std::size_t begin = end > line ? end - line : 0;
        lanes(begin, end);
        end = begin;
    }
}

/// Runs body(b, c0, n, scratch) for every span of `span` contiguous channels (n in the last one
/// may be smaller) on the current device's threads, with flush-to-zero on and `scratch_size` elements of
/// per-thread scratch.
template <class Acc, class Body>
void for_each_channel_span(const Geometry& g, std::size_t span, std::size_t scratch_size, Body&& body) {
    const std::size_t blocks = (g.channels + span - 1) / span;
    backend::current().parallel_for(g.batch * blocks, g.time * span, [&](std::size_t begin, std::size_t end) {
        denormal_guard guard;
        Storage<Acc> scratch(scratch_size);
        for (std::size_t task = begin; task < end; ++task) {
            const std::size_t b = task / blocks, c0 = (task % blocks) * span;
            body(b, c0, std::min(span, g.channels - c0), scratch.data());
        }
    });
}

}  // namespace olmax::scan::detail
