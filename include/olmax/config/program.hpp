#pragma once
// The error contract of olmax's command-line programs: whatever goes wrong becomes one line on
// stderr, `program: what went wrong`, and an exit status; never a signal or an uncaught exception.
//
//     int main(int argc, char** argv) { return olmax::config::run_program("train_lm", run, argc, argv); }
//
// Exit status: what `run` returns when it returns; 2 for a usage error (`config_error`: an unknown
// flag, a value out of its range, a path of the wrong kind); 1 for every other failure (unreadable
// or malformed input, a damaged checkpoint, out of memory, a file-system error).

#include <exception>
#include <filesystem>
#include <iostream>
#include <new>
#include <string>
#include <string_view>

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
}  // namespace detail

/// Runs `run(argc, argv)` and turns every exception into one line on stderr and an exit status.
template <class Run>
int run_program(std::string_view program, Run&& run, int argc, char** argv) {
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
