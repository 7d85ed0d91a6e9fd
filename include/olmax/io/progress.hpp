#pragma once
// Training progress: a one-line progress bar (loss, tokens/s, ETA) redrawn in place on a terminal,
// and plain log lines when the output is not a TTY (CI logs, files), plus a CSV metrics log for
// scripts/plot_loss.py.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <ostream>
#include <string>

#include <unistd.h>

#include "olmax/core/core.hpp"

namespace olmax::io {

/// "1h02m", "3m05s", "12s"; "?" for unknown.
inline std::string format_duration(double seconds) {
    if (!std::isfinite(seconds) || seconds < 0) return "?";
    const auto s = static_cast<long long>(seconds + 0.5);
    char buf[32];
    if (s >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, (s / 60) % 60);
    else if (s >= 60) std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
    else std::snprintf(buf, sizeof buf, "%llds", s);
    return buf;
}

/// "950", "12.3k", "4.56M".
inline std::string format_count(double value) {
    char buf[32];
    if (value >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", value / 1e6);
    else if (value >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", value / 1e3);
    else std::snprintf(buf, sizeof buf, "%.0f", value);
    return buf;
}

inline bool stdout_is_terminal() { return ::isatty(STDOUT_FILENO) == 1; }

class ProgressBar {
public:
    using Clock = std::chrono::steady_clock;

    /// `interactive`: redraw one line with '\r' (a terminal); otherwise print a line every
    /// `log_every` steps. `out` is usually std::cout.
    ProgressBar(std::ostream& out, std::int64_t total_steps, bool interactive, std::int64_t log_every = 50, std::int64_t first_step = 0)
        : out_(out), total_(total_steps), interactive_(interactive), log_every_(std::max<std::int64_t>(1, log_every)),
          first_step_(first_step), start_(Clock::now()), last_draw_(start_ - std::chrono::seconds(1)) {}

    /// Reports that `step` (of total) is done; `tokens` counts tokens processed since construction.
    /// `seconds_left`: a bound on the time still to run (a time budget's remainder), so that the
    /// ETA is the sooner of it and the steps' pace; infinity when only the step count ends the run.
    void update(std::int64_t step, double loss, double tokens, const std::string& extra = {},
                double seconds_left = std::numeric_limits<double>::infinity()) {
        const auto now = Clock::now();
        const double elapsed = std::chrono::duration<double>(now - start_).count();
        const double done = double(step - first_step_);
        const double rate = elapsed > 0 ? tokens / elapsed : 0;
        double eta = done > 0 ? elapsed / done * double(total_ - step) : std::nan("");
        if (seconds_left < std::numeric_limits<double>::infinity()) eta = std::isfinite(eta) ? std::min(eta, seconds_left) : seconds_left;
        const std::string stats = line(step, loss, rate, elapsed, eta, extra);
        if (interactive_) {
            if (step < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;  // at most 10 redraws/s
            last_draw_ = now;
            const int width = 24;
            const int filled = total_ > 0 ? int(std::lround(width * std::clamp(double(step) / double(total_), 0.0, 1.0))) : width;
            out_ << '\r' << '[' << std::string(std::size_t(filled), '#') << std::string(std::size_t(width - filled), '.') << "] " << stats
                 << "\x1b[K" << std::flush;  // clear what a longer previous line left
            drawn_ = true;
        } else if (step % log_every_ == 0 || step == total_) {
            out_ << stats << '\n' << std::flush;
        }
    }

    /// Prints a message on its own line without breaking the bar.
    void message(const std::string& text) {
        if (interactive_ && drawn_) out_ << "\r\x1b[K";
        out_ << text << '\n' << std::flush;
        drawn_ = false;
    }

    void finish() {
        if (interactive_ && drawn_) out_ << '\n' << std::flush;
        drawn_ = false;
    }

private:
    std::string line(std::int64_t step, double loss, double rate, double elapsed, double eta, const std::string& extra) const {
        char buf[160];
        std::snprintf(buf, sizeof buf, "step %lld/%lld  loss %.4f  %s tok/s  elapsed %s  ETA %s", static_cast<long long>(step),
                      static_cast<long long>(total_), loss, format_count(rate).c_str(), format_duration(elapsed).c_str(),
                      format_duration(eta).c_str());
        return extra.empty() ? std::string(buf) : std::string(buf) + "  " + extra;
    }

    std::ostream& out_;
    std::int64_t total_;
    bool interactive_;
    std::int64_t log_every_;
    std::int64_t first_step_;
    Clock::time_point start_, last_draw_;
    bool drawn_ = false;
};

/// Appends rows `step,tokens,split,loss,bits_per_byte` to a CSV file (header written once).
class MetricsLog {
public:
    explicit MetricsLog(const std::filesystem::path& path, bool append = false) {
        const bool fresh = !append || !std::filesystem::exists(path) || std::filesystem::file_size(path) == 0;
        out_.open(path, append ? std::ios::app : std::ios::trunc);
        check(out_.good(), "MetricsLog: cannot open ", path.string());
        if (fresh) out_ << "step,tokens,split,loss,bits_per_byte\n";
    }
    /// `loss` in nats per byte; bits per byte = loss / ln 2.
    void write(std::int64_t step, double tokens, const std::string& split, double loss) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "%lld,%.0f,%s,%.6f,%.6f\n", static_cast<long long>(step), tokens, split.c_str(), loss,
                      loss / std::log(2.0));
        out_ << buf << std::flush;
    }

private:
    std::ofstream out_;
};

}  // namespace olmax::io
