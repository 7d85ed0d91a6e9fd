#pragma once
// Spans of contiguous channels walked on the current device's threads: the work partition shared by the
// in-place kernels that vectorise across channels (sequential_vectorized, hillis_steele_chunked).

#include <algorithm>
#include <cstddef>

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
