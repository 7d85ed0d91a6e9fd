#pragma once
// Which ops hold the tensor memory at a peak: `memory::profile_peak(f)` runs f with every tensor
// buffer labelled by the op that allocated it, and reports the buffers made inside f that were
// still live when their total was highest, summed by label. It answers "what is in the step's
// peak" (memory::stats() says only how much).
//
// Labels: an op names itself when it starts (backend::op_scope), and the reverse pass names the
// node whose backward is running (autodiff::backward); a buffer gets the innermost of each, e.g.
// "causal_conv1d, in backward of stack_reversible" for a convolution recomputed inside a reversible
// stack's backward, or "backward of chunked_cross_entropy" for a buffer a closure made itself.
// Buffers allocated on other threads than the op's (inside a parallel loop) are "unlabelled".
// Outside `profile_peak` the labelling costs two thread-local stores per op and one per backward node.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <iomanip>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "olmax/core/error.hpp"
#include "olmax/core/time_profile.hpp"

namespace olmax::memory {

/// The label of one group of buffers and what it held at the peak.
struct PeakEntry {
    std::string label;
    std::size_t bytes = 0;
    std::size_t buffers = 0;
};

/// The outcome of `profile_peak`: the highest total of the buffers allocated inside the profiled
/// call, and what made up that total, largest first.
struct PeakProfile {
    std::size_t peak_bytes = 0;
    std::vector<PeakEntry> entries;

    /// One line per entry: KiB, buffer count, label; and the total.
    std::string table() const {
        std::ostringstream out;
        out << std::fixed << std::setprecision(1);
        for (const auto& e : entries)
            out << std::setw(10) << double(e.bytes) / 1024.0 << " KiB  " << std::setw(4) << e.buffers << "x  " << e.label << "\n";
        out << std::setw(10) << double(peak_bytes) / 1024.0 << " KiB  in all at the peak\n";
        return out.str();
    }
};

namespace detail {

/// The running op and backward node of this thread (views of names that outlive their scope).
struct AllocationLabel {
    std::string_view op;
    std::string_view backward_of;
};
inline AllocationLabel& allocation_label() {
    thread_local AllocationLabel label;
    return label;
}

class PeakProfiler {
public:
    bool on() const { return on_.load(std::memory_order_relaxed); }

    void start() {
        std::lock_guard lock(mutex_);
        check<value_error>(!on(), "memory::profile_peak: a profile is already running (one at a time per process)");
        live_.clear();
        at_peak_.clear();
        current_ = peak_ = 0;
        on_.store(true);
    }
    PeakProfile stop() {
        on_.store(false);
        std::lock_guard lock(mutex_);
        PeakProfile profile;
        profile.peak_bytes = peak_;
        for (const auto& [label, entry] : at_peak_) profile.entries.push_back({label, entry.first, entry.second});
        std::sort(profile.entries.begin(), profile.entries.end(),
                  [](const PeakEntry& a, const PeakEntry& b) { return a.bytes != b.bytes ? a.bytes > b.bytes : a.label < b.label; });
        live_.clear();
        at_peak_.clear();
        return profile;
    }

    void allocated(const void* p, std::size_t bytes) {
        const AllocationLabel& now = allocation_label();
        std::string label = describe(now);
        std::lock_guard lock(mutex_);
        if (!on()) return;
        live_[p] = {std::move(label), bytes};
        current_ += bytes;
        if (current_ <= peak_) return;
        peak_ = current_;  // a new peak: what is live now is its content
        at_peak_.clear();
        for (const auto& [buffer, held] : live_) {
            auto& entry = at_peak_[held.first];
            entry.first += held.second;
            entry.second += 1;
        }
    }
    void freed(const void* p) {
        std::lock_guard lock(mutex_);
        const auto it = live_.find(p);
        if (it == live_.end()) return;  // allocated before the profile started
        current_ -= it->second.second;
        live_.erase(it);
    }

private:
    static std::string describe(const AllocationLabel& l) { return olmax::detail::scope_label(l.op, l.backward_of); }

    std::atomic<bool> on_{false};
    std::mutex mutex_;
    std::unordered_map<const void*, std::pair<std::string, std::size_t>> live_;
    std::map<std::string, std::pair<std::size_t, std::size_t>> at_peak_;  // label -> bytes, buffers
    std::size_t current_ = 0, peak_ = 0;
};
inline PeakProfiler& peak_profiler() {
    static PeakProfiler instance;
    return instance;
}

/// Called by the tensor allocator for every buffer.
inline void on_labelled_allocate(const void* p, std::size_t bytes) {
    if (peak_profiler().on()) peak_profiler().allocated(p, bytes);
}
inline void on_labelled_deallocate(const void* p) {
    if (peak_profiler().on()) peak_profiler().freed(p);
}

}  // namespace detail

/// RAII: names the op whose buffers this thread allocates until the scope ends (backend::op_scope
/// opens one for every op). `name` must outlive the scope.
class op_label_scope {
public:
    explicit op_label_scope(std::string_view name) : saved_(std::exchange(detail::allocation_label().op, name)) {
        olmax::detail::on_scope_enter(name, detail::allocation_label().backward_of);  // for profile_time
    }
    ~op_label_scope() {
        olmax::detail::on_scope_leave();
        detail::allocation_label().op = saved_;
    }
    op_label_scope(const op_label_scope&) = delete;
    op_label_scope& operator=(const op_label_scope&) = delete;

private:
    std::string_view saved_;
};

/// RAII: names the backward node running on this thread (autodiff::backward opens one per node);
/// ops inside it are labelled by their own name, outside any op scope.
class backward_label_scope {
public:
    explicit backward_label_scope(std::string_view node)
        : saved_(std::exchange(detail::allocation_label(), detail::AllocationLabel{{}, node})) {
        olmax::detail::on_scope_enter({}, node);  // for profile_time
    }
    ~backward_label_scope() {
        olmax::detail::on_scope_leave();
        detail::allocation_label() = saved_;
    }
    backward_label_scope(const backward_label_scope&) = delete;
    backward_label_scope& operator=(const backward_label_scope&) = delete;

private:
    detail::AllocationLabel saved_;
};

/// Runs f() and returns what the tensor buffers allocated inside it held at their peak, by label
/// (see the file comment). One profile at a time per process (a second one, nested or on another
/// thread, throws value_error); buffers that existed before f are not counted, even if f frees them.
template <class F>
PeakProfile profile_peak(F&& f) {
    auto& profiler = detail::peak_profiler();
    profiler.start();
    struct stop_on_throw {
        detail::PeakProfiler& profiler;
        bool done = false;
        ~stop_on_throw() {
            if (done) return;
            try {
                profiler.stop();
            } catch (...) {  // already unwinding: the profile is dropped either way
            }
        }
    } guard{profiler};
    f();
    guard.done = true;
    return profiler.stop();
}

}  // namespace olmax::memory
