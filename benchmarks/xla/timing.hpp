#pragma once
// Timing of the XLA benchmarks: the median of repeated runs after warm-ups (the first runs of a
// compiled program also pay for its first allocations).

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <vector>

namespace olmax_bench {

/// Median seconds of `runs` calls of `run`, after `warmups` calls that are not timed.
inline double median_seconds(std::size_t runs, std::size_t warmups, const std::function<void()>& run) {
    std::vector<double> seconds;
    for (std::size_t r = 0; r < warmups + runs; ++r) {
        const auto start = std::chrono::steady_clock::now();
        run();
        if (r >= warmups) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(seconds.begin(), seconds.end());
    return seconds[seconds.size() / 2];
}

}  // namespace olmax_bench
