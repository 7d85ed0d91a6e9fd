#pragma once
// Timing for every benchmark program: medians of repeated runs (a median resists the one run a
// shared machine's load slowed down), the first runs untimed where they pay for first allocations,
// page faults or a thread pool's start.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace olmax_bench {

/// The median of `values` (the mean of the two middle ones for an even count; 0 for none).
inline double median(std::vector<double> values) {
    if (values.empty()) return 0.0;
    std::sort(values.begin(), values.end());
    const std::size_t m = values.size() / 2;
    return values.size() % 2 ? values[m] : (values[m - 1] + values[m]) / 2;
}

/// Seconds from `start` to now, on the steady clock.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// Median seconds of `runs` calls of `run`, after `warmups` calls that are not timed.
inline double median_seconds(std::size_t runs, std::size_t warmups, const std::function<void()>& run) {
    for (std::size_t w = 0; w < warmups; ++w) run();
    std::vector<double> seconds;
    for (std::size_t r = 0; r < runs; ++r) {
        const auto start = std::chrono::steady_clock::now();
        run();
        seconds.push_back(seconds_since(start));
    }
    return median(std::move(seconds));
}

/// The 1-, 5- and 15-minute load averages of /proc/loadavg ("0.52 0.61 0.70"), which every figure
/// reports beside it; empty where that file is missing.
inline std::string load_average() {
    std::ifstream in("/proc/loadavg");
    std::string one, five, fifteen;
    if (!(in >> one >> five >> fifteen)) return "";
    return one + " " + five + " " + fifteen;
}

}  // namespace olmax_bench
