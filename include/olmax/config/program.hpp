#pragma once
// The error contract of olmax's command-line programs: whatever goes wrong becomes one line on
// stderr, `program: what went wrong`, and an exit status; never a signal or an uncaught exception.
//
//     int main(int argc, char** argv) { return olmax::config::run_program("train_lm", run, argc, argv); }
//
// Exit status: what `run` returns when it returns; 2 for a usage error (`config_error`: an unknown
// flag, a value out of its range, a path of the wrong kind); 1 for every other failure (unreadable
// or malformed input, a damaged checkpoint, out of memory, a file-system error).
//
// Threads: the library's own threads (the thread pool, OverlappedAllreduce's worker, the TCP
// store's server) hand their failures to the thread that waits for them, which throws them into
// `run`. A thread the library does not own (a third-party library's, such as Gloo's network
// thread) may still end with an uncaught exception, which would call std::terminate and abort
// (SIGABRT). While `run` runs, a terminate handler turns that into one line on stderr naming the
// exception, and exit status 1, instead of the signal.

#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <new>
#include <string>
#include <string_view>

#include <unistd.h>  // write

#include "olmax/config/key_value.hpp"
#include "olmax/core/error.hpp"

namespace olmax::config {

/// Exit statuses of `run_program`.
enum exit_status : int { exit_ok = 0, exit_failure = 1, exit_usage = 2 };

namespace detail {
/// `message` without a leading "program: " (errors raised inside a program often name it already).
inline std::string_view without_prefix(std::string_view message, std::string_view program) {
    while (message.size() > program.size() + 1 && message.starts_with(program) && message.substr(program.size(), 2) == ": ")
        message.remove_prefix(program.size() + 2);
    return message;
}

inline int report(std::string_view program, std::string_view message, int status) {
    std::cerr << program << ": " << without_prefix(message, program) << std::endl;
    return status;
}

/// The program name for the terminate handler (set by run_program).
inline std::string& terminating_program() {
    static std::string name;
    return name;
}

/// The line the terminate handler prints for the exception `what` (or none).
inline std::string uncaught_line(std::string_view program, const std::string* what) {
    std::string line(program);
    line += ": a thread ended with an uncaught exception";
    if (what) {
        line += ": ";
        for (const char c : *what) line += c == '\n' ? ' ' : c;
        // Gloo's network thread, receiving a message longer than the buffer posted for it.
        if (what->find("preamble.length") != std::string::npos)
            line += " (a peer sent a message of another size than this rank expected: the ranks disagree on a collective; "
                    "start every rank with the same program and settings)";
    }
    return line + "\n";
}

/// std::terminate while run_program runs: one line, exit status 1, no SIGABRT. Writes with
/// write(2) and exits with _Exit: other threads may hold the streams' locks.
[[noreturn]] inline void on_terminate() noexcept {
    std::string line;
    try {
        std::string what;
        bool known = false;
        if (const auto e = std::current_exception()) {
            try {
                std::rethrow_exception(e);
            } catch (const std::exception& x) {
                what = x.what(), known = true;
            } catch (...) {
                what = "an exception of unknown type", known = true;
            }
        }
        line = uncaught_line(terminating_program(), known ? &what : nullptr);
    } catch (...) {
        line = "a thread ended with an uncaught exception\n";
    }
    for (std::size_t done = 0; done < line.size();) {
        const ssize_t n = ::write(2, line.data() + done, line.size() - done);
        if (n <= 0) break;
        done += std::size_t(n);
    }
    std::_Exit(exit_failure);
}

/// Installs on_terminate for the guard's lifetime.
class terminate_guard {
public:
    explicit terminate_guard(std::string_view program) : previous_(std::set_terminate(&on_terminate)) {
        terminating_program() = std::string(program);
    }
    ~terminate_guard() { std::set_terminate(previous_); }
    terminate_guard(const terminate_guard&) = delete;
    terminate_guard& operator=(const terminate_guard&) = delete;

private:
    std::terminate_handler previous_;
};
}  // namespace detail

/// Runs `run(argc, argv)` and turns every exception into one line on stderr and an exit status (an
/// exception on a thread nobody waits for too: see the top of this header).
template <class Run>
int run_program(std::string_view program, Run&& run, int argc, char** argv) {
    detail::terminate_guard on_terminate(program);
    try {
        return run(argc, argv);
    } catch (const config_error& e) {
        return detail::report(program, std::string(e.what()) + " (see --help)", exit_usage);
    } catch (const olmax::error& e) {
        return detail::report(program, e.what(), exit_failure);
    } catch (const std::filesystem::filesystem_error& e) {
        // what() already names the operation and the paths: "filesystem error: cannot create directories: Not a directory [runs/x]"
        return detail::report(program, e.what(), exit_failure);
    } catch (const std::bad_alloc&) {
        return detail::report(program, "out of memory (try a smaller --batch, --sequence, --features or --depth)", exit_failure);
    } catch (const std::exception& e) {
        return detail::report(program, std::string("unexpected error: ") + e.what(), exit_failure);
    } catch (...) {
        return detail::report(program, "unexpected error of unknown type", exit_failure);
    }
}

}  // namespace olmax::config
