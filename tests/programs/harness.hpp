#pragma once
// Running olmax's command-line programs from a test as a user would: in a folder of their own, with
// stdin closed, their output captured, a time limit, and their exit status or signal reported.
// Shared by tests/programs' test files; the programs' paths come from environment variables that
// CTest sets (tests/programs/CMakeLists.txt).
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace olmax_program_test {

struct Outcome {
    bool exited = false;     // exited normally (not killed by a signal)
    int code = -1;           // exit status when exited
    int signal = 0;          // the signal that ended it otherwise
    bool timed_out = false;  // killed by this harness after the time limit
    std::string out, err;
    std::string command;

    std::string last_error_line() const {
        std::istringstream in(err);
        std::string line, last;
        while (std::getline(in, line))
            if (!line.empty()) last = line;
        return last;
    }
    std::string describe() const {
        std::ostringstream s;
        s << command << "\n  -> " << (timed_out ? "timed out" : exited ? "exit " + std::to_string(code) : "signal " + std::to_string(signal))
          << "\n  stderr: " << err.substr(0, 2000) << "\n  stdout tail: " << out.substr(out.size() > 1500 ? out.size() - 1500 : 0);
        return s.str();
    }
};

inline std::string read_file(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_file(const fs::path& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary);
    out << text;
}

/// A program under test: its executable and the name it reports errors under.
struct Program {
    std::string path, name;
};

inline Program program(const char* variable, const char* name) {
    const char* path = std::getenv(variable);
    if (!path) FAIL(variable << " is not set: run these tests through CTest (tests/programs/CMakeLists.txt sets it)");
    return {path, name};
}
inline Program train_lm_program() { return program("OLMAX_TRAIN_LM", "train_lm"); }
inline Program generate_program() { return program("OLMAX_GENERATE", "generate"); }

/// A program started by `start` and not yet waited for: its process and where its output goes.
struct Started {
    pid_t pid = -1;
    std::string command;
    fs::path out_file, err_file;
    std::chrono::steady_clock::time_point started;

    /// What it has written to stdout so far.
    std::string out_so_far() const { return read_file(out_file); }
};

/// Starts `program args...` in `workdir` with stdin closed, stdout and stderr to files named after
/// `name` there, and SIGINT and SIGTERM at their default actions (whatever the test runner's were).
inline Started start(const Program& tested, const std::vector<std::string>& args, const fs::path& workdir, const std::string& name = "") {
    const std::string& program = tested.path;
    Started s;
    s.command = program;
    for (const auto& a : args) s.command += " '" + a + "'";
    s.out_file = workdir / ("." + name + "stdout");
    s.err_file = workdir / ("." + name + "stderr");
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(program.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::fflush(nullptr);
    s.started = std::chrono::steady_clock::now();
    s.pid = ::fork();
    if (s.pid == 0) {
        if (::chdir(workdir.c_str()) != 0) ::_exit(126);
        const int in = ::open("/dev/null", O_RDONLY), out = ::open(s.out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644),
                  err = ::open(s.err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (in < 0 || out < 0 || err < 0) ::_exit(126);
        ::dup2(in, 0), ::dup2(out, 1), ::dup2(err, 2);
        ::signal(SIGINT, SIG_DFL);
        ::signal(SIGTERM, SIG_DFL);
        ::execv(program.c_str(), argv.data());
        ::_exit(127);
    }
    REQUIRE(s.pid > 0);
    return s;
}

/// Waits for a started program (killing it after `timeout_seconds` from its start); never throws
/// on the program's failure.
inline Outcome finish(const Started& s, int timeout_seconds = 180) {
    Outcome o;
    o.command = s.command;
    int status = 0;
    const auto deadline = s.started + std::chrono::seconds(timeout_seconds);
    for (;;) {
        const pid_t done = ::waitpid(s.pid, &status, WNOHANG);
        if (done == s.pid) break;
        if (std::chrono::steady_clock::now() > deadline) {
            ::kill(s.pid, SIGKILL);
            ::waitpid(s.pid, &status, 0);
            o.timed_out = true;
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    o.exited = !o.timed_out && WIFEXITED(status);
    if (o.exited) o.code = WEXITSTATUS(status);
    else if (WIFSIGNALED(status)) o.signal = WTERMSIG(status);
    o.out = read_file(s.out_file);
    o.err = read_file(s.err_file);
    return o;
}

/// Runs `program args...` in `workdir` with stdin closed and a time limit; never throws on the
/// program's failure.
inline Outcome run(const Program& tested, const std::vector<std::string>& args, const fs::path& workdir, int timeout_seconds = 180) {
    return finish(start(tested, args, workdir), timeout_seconds);
}

/// A unique, empty folder removed at the end of the test.
struct TempDir {
    fs::path path;
    TempDir() {
        static int counter = 0;
        path = fs::temp_directory_path() / ("olmax_programs_" + std::to_string(::getpid()) + "_" + std::to_string(++counter));
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
};

/// A small fortune-format corpus (documents separated by lines holding "%").
inline std::string fortune_corpus() {
    std::string text;
    std::mt19937 rng(7);
    const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "slept", "under", "warm", "sun", "while", "birds", "sang"};
    for (int doc = 0; doc < 60; ++doc) {
        for (int w = 0; w < 25; ++w) text += std::string(words[rng() % 16]) + (w % 9 == 8 ? "\n" : " ");
        text += "\n%\n";
    }
    return text;
}

/// Flags that make every run tiny: two steps of a 8-wide depth-1 model, no plot.
inline std::vector<std::string> tiny_run(const fs::path& corpus, const fs::path& checkpoints) {
    return {"--data=" + corpus.string(), "--checkpoint_dir=" + checkpoints.string(), "--steps=2", "--batch=2", "--sequence=16",
            "--features=8", "--depth=1", "--eval_every=1", "--eval_batches=1", "--checkpoint_every=1", "--sample_bytes=4",
            "--log_every=1", "--threads=1", "--plot=false"};
}

inline std::vector<std::string> with(std::vector<std::string> base, std::initializer_list<std::string> more) {
    base.insert(base.end(), more);
    return base;
}

/// The contract every run must keep, whatever its input.
inline void check_contract(const Outcome& o, const Program& tested, bool diverging_allowed = false) {
    const std::string& program = tested.name;
    INFO(o.describe());
    REQUIRE_FALSE(o.timed_out);
    REQUIRE(o.exited);  // never a signal
    CHECK((o.code == 0 || o.code == 1 || o.code == 2 || (diverging_allowed && o.code == 3)));
    CHECK(o.err.find(program + ": " + program + ":") == std::string::npos);
    if (o.code == 1 || o.code == 2) {
        const std::string last = o.last_error_line();
        CHECK(last.rfind(program + ": ", 0) == 0);
    }
}

inline Outcome expect_usage_error(const Program& program, const std::vector<std::string>& args, const fs::path& dir, const std::string& needle) {
    const Outcome o = run(program, args, dir);
    check_contract(o, program);
    INFO(o.describe());
    CHECK(o.code == 2);
    CHECK_THAT(o.last_error_line(), Catch::Contains(needle));
    return o;
}

}  // namespace olmax_program_test
