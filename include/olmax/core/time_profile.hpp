#pragma once
// Where a call's time goes, by op: `profile_time(f)` runs f and reports, for every op and backward
// node, the time spent in it and not in an op nested inside it (self time), largest first. It is
// the time twin of `memory::profile_peak` and uses the same labels: an op names itself when it
// starts (backend::op_scope), the reverse pass names the node whose backward runs
// (autodiff::backward), and an op inside a node's backward is "op, in backward of node".
//
// Times are wall-clock per thread, summed over the threads that ran ops: with data-parallel shards
// on two threads a label's time is about twice its wall time. Work an op hands to a parallel loop
// counts to the op (its thread waits for it). Time on the calling thread outside every op and
// backward node (host loops, the optimiser's own kernels) is the entry "outside any op".
// Outside `profile_time` the hooks cost one relaxed atomic load per op and per backward node.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <iomanip>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/core/error.hpp"

namespace olmax {

/// One label's share of a profiled call.
struct TimeEntry {
    std::string label;
    double seconds = 0;       // self time, summed over threads
    std::size_t calls = 0;    // how many scopes with this label ended
};

/// The outcome of `profile_time`: the call's wall time and its self times by label, largest first.
struct TimeProfile {
    double wall_seconds = 0;
    std::vector<TimeEntry> entries;

    /// The summed seconds of the entries whose label contains `part` (e.g. "matmul").
    double seconds_of(std::string_view part) const {
        double s = 0;
        for (const auto& e : entries)
            if (e.label.find(part) != std::string::npos) s += e.seconds;
        return s;
    }
    double total_seconds() const {
        double s = 0;
        for (const auto& e : entries) s += e.seconds;
        return s;
    }

    /// One line per entry (ms, share of the summed time, calls, label), then the wall time. Entries
    /// under `min_share` of the total are folded into one "other" line.
    std::string table(double min_share = 0.002) const {
        const double total = total_seconds();
        std::ostringstream out;
        out << std::fixed;
        double other = 0;
        std::size_t other_calls = 0, other_labels = 0;
        for (const auto& e : entries) {
            if (total > 0 && e.seconds < min_share * total) {
                other += e.seconds;
                other_calls += e.calls;
                ++other_labels;
                continue;
            }
            out << std::setprecision(2) << std::setw(10) << e.seconds * 1e3 << " ms " << std::setprecision(1) << std::setw(5)
                << (total > 0 ? 100 * e.seconds / total : 0.0) << "% " << std::setw(7) << e.calls << "x  " << e.label << "\n";
        }
        if (other_labels > 0)
            out << std::setprecision(2) << std::setw(10) << other * 1e3 << " ms " << std::setprecision(1) << std::setw(5)
                << (total > 0 ? 100 * other / total : 0.0) << "% " << std::setw(7) << other_calls << "x  (" << other_labels
                << " other labels, each under " << std::setprecision(1) << 100 * min_share << "%)\n";
        out << std::setprecision(2) << std::setw(10) << total * 1e3 << " ms in all (summed over threads); wall "
            << wall_seconds * 1e3 << " ms\n";
        return out.str();
    }
};

namespace detail {

/// The label of a scope as both profiles print it: "op", "backward of node", "op, in backward of
/// node", or "unlabelled".
inline std::string scope_label(std::string_view op, std::string_view backward_of) {
    if (op.empty() && backward_of.empty()) return "unlabelled";
    if (backward_of.empty()) return std::string(op);
    if (op.empty()) return "backward of " + std::string(backward_of);
    return std::string(op) + ", in backward of " + std::string(backward_of);
}

class TimeProfiler {
public:
    using clock = std::chrono::steady_clock;
    bool on() const { return on_.load(std::memory_order_relaxed); }

    void start() {
        std::lock_guard lock(mutex_);
        check<value_error>(!on(), "profile_time: a profile is already running (one at a time per process)");
        totals_.clear();
        ++generation_;
        on_.store(true);
    }
    std::map<std::string, std::pair<double, std::size_t>> stop() {
        on_.store(false);
        std::lock_guard lock(mutex_);
        return std::exchange(totals_, {});
    }

    /// A scope opens on this thread: `op` and `backward_of` as memory_profile.hpp's labels.
    void enter(std::string_view op, std::string_view backward_of) {
        auto& s = stack();
        if (s.generation != generation_) s = ThreadStack{generation_, {}};
        s.frames.push_back({scope_label(op, backward_of), clock::now(), 0.0});
    }
    void leave() {
        auto& s = stack();
        if (s.generation != generation_ || s.frames.empty()) return;  // opened before the profile started
        Frame f = std::move(s.frames.back());
        s.frames.pop_back();
        const double elapsed = std::chrono::duration<double>(clock::now() - f.start).count();
        if (!s.frames.empty()) s.frames.back().children += elapsed;
        std::lock_guard lock(mutex_);
        if (!on()) return;
        auto& total = totals_[std::move(f.label)];
        total.first += elapsed - f.children;
        total.second += 1;
    }

private:
    struct Frame {
        std::string label;
        clock::time_point start;
        double children;
    };
    struct ThreadStack {
        unsigned generation = 0;
        std::vector<Frame> frames;
    };
    static ThreadStack& stack() {
        thread_local ThreadStack s;
        return s;
    }

    std::atomic<bool> on_{false};
    std::atomic<unsigned> generation_{0};
    std::mutex mutex_;
    std::map<std::string, std::pair<double, std::size_t>> totals_;  // label -> self seconds, calls
};
inline TimeProfiler& time_profiler() {
    static TimeProfiler instance;
    return instance;
}

/// Hooks for the label scopes of memory_profile.hpp (each op and each backward node).
inline void on_scope_enter(std::string_view op, std::string_view backward_of) {
    if (time_profiler().on()) time_profiler().enter(op, backward_of);
}
inline void on_scope_leave() {
    if (time_profiler().on()) time_profiler().leave();
}

}  // namespace detail

/// Runs f() and returns its wall time and the self time of every op and backward node inside it,
/// by label (see the file comment). One profile at a time per process (a second one throws
/// value_error). The entry "outside any op" is the calling thread's wall time not spent in an op.
template <class F>
TimeProfile profile_time(F&& f) {
    auto& profiler = detail::time_profiler();
    profiler.start();
    struct stop_on_throw {
        detail::TimeProfiler& profiler;
        bool done = false;
        ~stop_on_throw() {
            if (!done) profiler.stop();
        }
    } guard{profiler};
    // The calling thread's time inside ops is the wall time minus the time in one umbrella frame's
    // children, so the umbrella's self time is exactly the time outside any op.
    profiler.enter("outside any op", {});
    const auto begin = std::chrono::steady_clock::now();
    f();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    profiler.leave();
    guard.done = true;
    TimeProfile profile;
    profile.wall_seconds = wall;
    for (auto& [label, total] : profiler.stop()) profile.entries.push_back({label, total.first, total.second});
    std::sort(profile.entries.begin(), profile.entries.end(),
              [](const TimeEntry& a, const TimeEntry& b) { return a.seconds != b.seconds ? a.seconds > b.seconds : a.label < b.label; });
    return profile;
}

}  // namespace olmax
