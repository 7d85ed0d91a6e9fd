#pragma once
// The process's stop request: a program asks `stop_requested()` where it can stop cleanly (between
// training steps), and there finishes its work (a checkpoint) and exits, instead of being killed
// by the Ctrl-C of a user or the SIGTERM a batch scheduler (SLURM, Kubernetes) sends before it
// kills a job.
//
//     olmax::stop_on_signals stop("my_trainer", "finishing the current step, then saving");
//     for (...) {
//         step();
//         if (olmax::stop_requested()) { save(); return 128 + olmax::stop_signal(); }
//     }
//
// While a `stop_on_signals` guard lives, SIGINT and SIGTERM only record the request (the first
// signal wins) and print one notice on stderr. A second SIGINT while a stop is pending ends the
// process at once by SIGINT's default action (a program stuck in a long wait can still be
// interrupted); a repeated SIGTERM changes nothing. A signal that the process ignored when the
// guard was made stays ignored (`nohup`, a shell's background job ignores SIGINT). The guard
// restores the previous handlers when it ends. Several processes that train together must stop
// at the same step: olmax/distributed/stop.hpp agrees on it.
//
// The handler is async-signal-safe: it touches one lock-free atomic and write(2)s a notice
// prepared when the guard was made.

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <string>
#include <string_view>

#include <signal.h>  // sigaction (POSIX)
#include <unistd.h>  // write

#include "olmax/core/error.hpp"

namespace olmax {

namespace detail {

/// What the signal handler reads: the request and the notices, prepared outside the handler.
struct StopState {
    static constexpr int without_signal = -1;  // request_stop() with no signal
    std::atomic<int> request{0};               // 0: none; a signal number; without_signal
    static constexpr std::size_t capacity = 320;
    char first_int[capacity] = {}, first_term[capacity] = {}, again[capacity] = {};
    std::size_t first_int_length = 0, first_term_length = 0, again_length = 0;
};
static_assert(std::atomic<int>::is_always_lock_free, "the stop request must be usable from a signal handler");

inline StopState& stop_state() {
    static StopState state;
    return state;
}

inline void write_notice(const char* text, std::size_t length) {
    while (length > 0) {
        const ssize_t n = ::write(2, text, length);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        text += n, length -= std::size_t(n);
    }
}

inline void on_stop_signal(int signal) {
    const int saved_errno = errno;
    StopState& s = stop_state();
    int none = 0;
    if (s.request.compare_exchange_strong(none, signal)) {
        if (signal == SIGINT) write_notice(s.first_int, s.first_int_length);
        else write_notice(s.first_term, s.first_term_length);
    } else if (signal == SIGINT) {
        // A second Ctrl-C: die as an interrupted program does (the shell sees SIGINT). The signal is
        // blocked while this handler runs, so it is delivered, with the default action, on return.
        write_notice(s.again, s.again_length);
        ::signal(SIGINT, SIG_DFL);
        ::raise(SIGINT);
    }
    errno = saved_errno;
}

inline void prepare_notice(char (&buffer)[StopState::capacity], std::size_t& length, const std::string& text) {
    length = std::min(text.size(), StopState::capacity - 1);
    std::copy_n(text.data(), length, buffer);
    if (length > 0) buffer[length - 1] = '\n';  // one line, even when cut short
}

}  // namespace detail

/// Whether a stop was requested (by a signal while a `stop_on_signals` guard lives, or by
/// `request_stop()`). Cheap: one relaxed atomic load.
inline bool stop_requested() { return detail::stop_state().request.load(std::memory_order_relaxed) != 0; }

/// The signal that requested the stop (SIGINT, SIGTERM), or 0 when none did (no request, or
/// `request_stop()` without a signal).
inline int stop_signal() { return std::max(detail::stop_state().request.load(std::memory_order_relaxed), 0); }

/// Requests a stop from the program itself, as if `signal` (0: none) had arrived; the first
/// request wins.
inline void request_stop(int signal = 0) {
    int none = 0;
    detail::stop_state().request.compare_exchange_strong(none, signal > 0 ? signal : detail::StopState::without_signal);
}

/// Forgets the request (a program that handled it and goes on; tests).
inline void clear_stop_request() { detail::stop_state().request.store(0); }

/// "SIGINT", "SIGTERM", "signal 10".
inline std::string signal_name(int signal) {
    if (signal == SIGINT) return "SIGINT";
    if (signal == SIGTERM) return "SIGTERM";
    return "signal " + std::to_string(signal);
}

/// While it lives, SIGINT and SIGTERM request a stop instead of ending the process (see the top of
/// this header). `program` starts the notice printed on the first signal, `action` says what the
/// program does next: "train_lm: SIGTERM received: finishing the current step, then saving a
/// checkpoint (Ctrl-C again stops at once)".
class stop_on_signals {
public:
    explicit stop_on_signals(std::string_view program, std::string_view action = "stopping at the next safe point") {
        detail::StopState& s = detail::stop_state();
        const std::string prefix = program.empty() ? std::string() : std::string(program) + ": ";
        detail::prepare_notice(s.first_int, s.first_int_length,
                               prefix + "SIGINT received: " + std::string(action) + " (Ctrl-C again stops at once)\n");
        detail::prepare_notice(s.first_term, s.first_term_length,
                               prefix + "SIGTERM received: " + std::string(action) + " (SIGINT stops at once)\n");
        detail::prepare_notice(s.again, s.again_length, prefix + "SIGINT again: stopping at once\n");
        install(SIGINT, previous_int_, int_installed_);
        install(SIGTERM, previous_term_, term_installed_);
    }
    ~stop_on_signals() {
        if (term_installed_) ::sigaction(SIGTERM, &previous_term_, nullptr);
        if (int_installed_) ::sigaction(SIGINT, &previous_int_, nullptr);
    }
    stop_on_signals(const stop_on_signals&) = delete;
    stop_on_signals& operator=(const stop_on_signals&) = delete;

    /// Whether the guard handles SIGINT (false when the process ignored it) and SIGTERM.
    bool handles_sigint() const { return int_installed_; }
    bool handles_sigterm() const { return term_installed_; }

private:
    static void install(int signal, struct sigaction& previous, bool& installed) {
        check(::sigaction(signal, nullptr, &previous) == 0, "stop_on_signals: cannot read the action of ", signal_name(signal));
        if (previous.sa_handler == SIG_IGN) return;  // ignored on purpose by whoever started us
        struct sigaction action {};
        action.sa_handler = &detail::on_stop_signal;
        sigemptyset(&action.sa_mask);
        action.sa_flags = SA_RESTART;  // reads, writes and waits go on after the handler
        check(::sigaction(signal, &action, nullptr) == 0, "stop_on_signals: cannot handle ", signal_name(signal));
        installed = true;
    }

    struct sigaction previous_int_ {}, previous_term_ {};
    bool int_installed_ = false, term_installed_ = false;
};

}  // namespace olmax
