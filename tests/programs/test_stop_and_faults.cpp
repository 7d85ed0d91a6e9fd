// Stopping and failing the way a user, a batch scheduler or a bug does (issue: reliability round 3):
//   [stop]           train_lm sent SIGTERM or SIGINT mid-run finishes the step, writes a checkpoint,
//                    says where and exits 128 + signal; resuming from it gives the uninterrupted
//                    run's checkpoint bit for bit; generate stops sampling at once on SIGINT.
//   [thread_faults]  a collective that throws on OverlappedAllreduce's thread, a kernel that throws
//                    on a pool thread, and an exception on a thread nobody catches (as Gloo's):
//                    one line on stderr and exit 1, never a signal (tests/programs/thread_faults.cpp).
//   [distributed]    two train_lm ranks over Gloo: ranks started with different settings both stop
//                    before any collective could crash, with exit 2 and the same line; SIGTERM to
//                    one rank stops both after the same step, and the two resume bit for bit; a
//                    second SIGINT ends a rank stuck waiting for its peer at once.
#include "harness.hpp"

#include <olmax/io/archive.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>

using namespace olmax_program_test;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

/// Waits until `file` (a started program's stdout or stderr) contains `needle`; false after `limit_s`.
bool wait_for_text(const fs::path& file, const std::string& needle, double limit_s = 60) {
    const auto start = Clock::now();
    while (seconds_since(start) < limit_s) {
        if (read_file(file).find(needle) != std::string::npos) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
}

/// The step in "stopped by SIGNAL after step K" (-1 if absent).
long stopped_step(const std::string& out) {
    std::smatch m;
    return std::regex_search(out, m, std::regex("stopped by SIG[A-Z]+ after step ([0-9]+)")) ? std::stol(m[1]) : -1;
}

/// Every entry of two checkpoints but the config text (which names each run's folder) is equal,
/// byte for byte: parameters, optimiser state, step, data position.
void check_same_state(const fs::path& a, const fs::path& b) {
    INFO(a.string() << " vs " << b.string());
    REQUIRE(fs::exists(a));
    REQUIRE(fs::exists(b));
    const auto x = olmax::io::load_archive(a), y = olmax::io::load_archive(b);
    REQUIRE(x.names() == y.names());
    std::size_t tensors = 0;
    for (const auto& name : x.names()) {
        if (name == "train/config") continue;
        INFO(name);
        CHECK(x.entry(name).kind == y.entry(name).kind);
        CHECK(x.entry(name).shape == y.entry(name).shape);
        CHECK(x.entry(name).data == y.entry(name).data);
        tensors += name.rfind("param/", 0) == 0 || name.rfind("optim/", 0) == 0;
    }
    CHECK(tensors > 4);
}

fs::path checkpoint(const fs::path& dir, long step) {
    char name[64];
    std::snprintf(name, sizeof name, "ckpt-%010ld.olmax", step);
    return dir / name;
}

/// A run of a few hundred 1 ms steps: long enough to be signalled midway, short enough to resume.
std::vector<std::string> stop_run(const fs::path& corpus, const fs::path& checkpoints, int steps) {
    return {"--data=" + corpus.string(), "--checkpoint_dir=" + checkpoints.string(), "--steps=" + std::to_string(steps), "--batch=4",
            "--sequence=32", "--features=16", "--depth=1", "--eval_every=50", "--eval_batches=1", "--log_every=1", "--threads=1",
            "--plot=false", "--sample_bytes=0"};
}

/// train_lm receives `signal` after step 20: it must finish its step, write a checkpoint, say where,
/// and exit 128 + signal; the same command resumes, and ends where an uninterrupted run ends.
void stop_and_resume(int signal) {
    const Program train_lm = train_lm_program();
    TempDir dir;
    write_file(dir.path / "corpus.txt", fortune_corpus());
    constexpr int steps = 1000;  // the signal comes near step 20: a margin for a loaded machine
    const auto args = stop_run(dir.path / "corpus.txt", dir.path / "stopped", steps);
    const Started started = start(train_lm, args, dir.path, "stopped");
    REQUIRE(wait_for_text(started.out_file, "step 20/"));
    REQUIRE(::kill(started.pid, signal) == 0);
    const auto signalled = Clock::now();
    const Outcome stopped = finish(started);
    const double took = seconds_since(signalled);
    INFO(stopped.describe());
    REQUIRE(stopped.exited);
    CHECK(stopped.code == 128 + signal);
    const long at = stopped_step(stopped.out);
    REQUIRE(at >= 20);
    REQUIRE(at < steps);
    CHECK_THAT(stopped.out, Catch::Contains("stopped by " + olmax::signal_name(signal) + " after step " + std::to_string(at) +
                                            "; checkpoint: " + checkpoint(dir.path / "stopped", at).string()));
    CHECK_THAT(stopped.err, Catch::Contains("train_lm: " + olmax::signal_name(signal) + " received: finishing the current step"));
    CHECK(fs::exists(checkpoint(dir.path / "stopped", at)));
    CHECK(took < 10);  // one 1 ms step and a checkpoint; generous for a loaded machine
    std::printf("%s: stopped after step %ld, %.3f s after the signal\n", olmax::signal_name(signal).c_str(), at, took);

    const Outcome resumed = run(train_lm, args, dir.path);
    INFO(resumed.describe());
    REQUIRE(resumed.exited);
    REQUIRE(resumed.code == 0);
    CHECK_THAT(resumed.out, Catch::Contains("at step " + std::to_string(at)));
    const Outcome whole = run(train_lm, stop_run(dir.path / "corpus.txt", dir.path / "whole", steps), dir.path);
    REQUIRE(whole.code == 0);
    check_same_state(checkpoint(dir.path / "stopped", steps), checkpoint(dir.path / "whole", steps));
}

}  // namespace

TEST_CASE("train_lm: SIGTERM mid-run finishes the step, writes a checkpoint, exits 143, and resumes bit for bit", "[stop]") {
    stop_and_resume(SIGTERM);
}

TEST_CASE("train_lm: SIGINT mid-run finishes the step, writes a checkpoint, exits 130, and resumes bit for bit", "[stop]") {
    stop_and_resume(SIGINT);
}

TEST_CASE("generate: SIGINT stops sampling at once, after printing the text so far; exit 130", "[stop]") {
    const Program train_lm = train_lm_program(), generate = generate_program();
    TempDir dir;
    write_file(dir.path / "corpus.txt", fortune_corpus());
    const Outcome trained = run(train_lm, stop_run(dir.path / "corpus.txt", dir.path / "run", 30), dir.path);
    REQUIRE(trained.code == 0);
    // Greedy sampling from a fixed checkpoint is deterministic: it does not end the text by itself
    // within the bytes this test waits for.
    const Started started = start(generate,
                                  {"--checkpoint_dir=" + (dir.path / "run").string(), "--sample_bytes=1000000", "--temperature=0",
                                   "--prompt=the cat"},
                                  dir.path, "generate");
    const auto begun = Clock::now();
    while (read_file(started.out_file).size() < 40 && seconds_since(begun) < 60) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    REQUIRE(::kill(started.pid, SIGINT) == 0);
    const auto signalled = Clock::now();
    const Outcome o = finish(started);
    const double took = seconds_since(signalled);
    INFO(o.describe());
    REQUIRE(o.exited);
    CHECK(o.code == 130);
    CHECK(took < 2);
    std::smatch m;
    const std::string last = o.last_error_line();
    REQUIRE(std::regex_search(last, m, std::regex("^generate: stopped by SIGINT after ([0-9]+) of 1000000 bytes$")));
    CHECK(o.out.size() == std::string("the cat").size() + std::stoul(m[1]) + 1);  // the prompt, the bytes, a newline
    std::printf("generate: stopped %.3f s after SIGINT, %s bytes sampled\n", took, std::string(m[1]).c_str());
}

TEST_CASE("a failure on a library thread or a foreign one: one line, exit 1, never a signal", "[thread_faults]") {
    const Program faults = program("OLMAX_THREAD_FAULTS", "thread_faults");
    TempDir dir;
    const std::vector<std::pair<std::string, std::string>> cases{
        {"collective", "thread_faults: allreduce (rank 0 of 2, injected) of 4 float32 failed on another thread: injected failure"},
        {"kernel", "thread_faults: injected kernel failure on another thread"},
        {"stray", "thread_faults: a thread ended with an uncaught exception: injected failure on a thread nobody joins yet"}};
    for (const auto& [mode, line] : cases) {
        const Outcome o = run(faults, {mode}, dir.path, 60);
        INFO(mode << "\n" << o.describe());
        REQUIRE(o.exited);  // not SIGABRT
        CHECK(o.code == 1);
        CHECK(o.last_error_line() == line);
    }
}

// ---- two ranks over Gloo (registered only when train_lm is built with Gloo) -------------------------

namespace {

struct Ranks {
    std::vector<Started> started;
    std::vector<Outcome> outcomes;
};

/// Starts rank 0 and rank 1 of train_lm with `common` flags plus each rank's own, meeting in a
/// fresh file rendezvous under `dir`.
Ranks start_ranks(const Program& train_lm, const fs::path& dir, const std::string& name, const std::vector<std::string>& common,
                  const std::vector<std::vector<std::string>>& own) {
    Ranks r;
    const fs::path store = dir / ("store-" + name);
    for (int rank = 0; rank < 2; ++rank) {
        auto args = common;
        args.insert(args.end(), own[std::size_t(rank)].begin(), own[std::size_t(rank)].end());
        args.insert(args.end(), {"--world_size=2", "--rank=" + std::to_string(rank), "--rendezvous=file:" + store.string()});
        r.started.push_back(start(train_lm, args, dir, name + std::to_string(rank)));
    }
    return r;
}

void finish_ranks(Ranks& r, int timeout_seconds = 120) {
    for (const auto& s : r.started) r.outcomes.push_back(finish(s, timeout_seconds));
}

}  // namespace

TEST_CASE("train_lm ranks started with different settings stop before their first collective: exit 2, one line, the same on both",
          "[distributed][agreement]") {
    const Program train_lm = train_lm_program();
    TempDir dir;
    write_file(dir.path / "corpus.txt", fortune_corpus());
    write_file(dir.path / "other.txt", fortune_corpus() + "one more document\n%\n");
    const std::vector<std::string> common{"--steps=5", "--batch=4", "--sequence=32", "--depth=1", "--eval_every=5", "--eval_batches=1",
                                          "--sample_bytes=0", "--plot=false", "--threads=1", "--collective_timeout_s=20"};
    const auto corpus = "--data=" + (dir.path / "corpus.txt").string();
    struct Case {
        std::vector<std::string> rank0, rank1;
        std::string expected;
    };
    const std::vector<Case> cases{
        // The report: a different model on each rank (Gloo aborted rank 1 with SIGABRT).
        {{corpus, "--features=64"}, {corpus, "--features=32"}, "ranks disagree on '--features': rank 0 has 64, rank 1 has 32"},
        {{corpus, "--features=16"}, {corpus, "--features=16", "--block=qrnn"}, "ranks disagree on '--block': rank 0 has conv_mixer, rank 1 has qrnn"},
        {{corpus, "--features=16", "--bucket_mb=0.001"}, {corpus, "--features=16"}, "ranks disagree on '--bucket_mb': rank 0 has 0.001, rank 1 has 25"},
        {{corpus, "--features=16", "--lr=0.001"}, {corpus, "--features=16"}, "ranks disagree on '--lr': rank 0 has 0.001, rank 1 has 0.003"},
        // The same flags, other training text behind --data.
        {{corpus, "--features=16"}, {"--data=" + (dir.path / "other.txt").string(), "--features=16"}, "ranks disagree on 'training documents'"},
    };
    int index = 0;
    for (const auto& c : cases) {
        const auto started = Clock::now();
        Ranks r = start_ranks(train_lm, dir.path, "case" + std::to_string(index++), common,
                              {with(c.rank0, {"--checkpoint_dir=" + (dir.path / ("run0-" + std::to_string(index))).string()}),
                               with(c.rank1, {"--checkpoint_dir=" + (dir.path / ("run1-" + std::to_string(index))).string()})});
        finish_ranks(r);
        const double took = seconds_since(started);
        INFO(r.outcomes[0].describe() << "\n" << r.outcomes[1].describe());
        for (const auto& o : r.outcomes) {
            REQUIRE(o.exited);  // never SIGABRT
            CHECK(o.code == 2);
            CHECK_THAT(o.last_error_line(), Catch::StartsWith("train_lm: " + c.expected));
        }
        CHECK(r.outcomes[0].last_error_line() == r.outcomes[1].last_error_line());
        CHECK(took < 20);  // within --collective_timeout_s, in fact at once
        std::printf("%s (both ranks done in %.2f s)\n", r.outcomes[0].last_error_line().c_str(), took);
    }
}

TEST_CASE("train_lm: SIGTERM to one rank stops both after the same step with rank 0's checkpoint; both resume bit for bit",
          "[distributed][stop]") {
    const Program train_lm = train_lm_program();
    TempDir dir;
    write_file(dir.path / "corpus.txt", fortune_corpus());
    constexpr int steps = 300;
    auto args_for = [&](const std::string& run) {
        return with(stop_run(dir.path / "corpus.txt", dir.path / run, steps), {"--collective_timeout_s=30"});
    };
    Ranks r = start_ranks(train_lm, dir.path, "stopped", args_for("stopped"), {{}, {}});
    REQUIRE(wait_for_text(r.started[0].out_file, "step 20/"));
    REQUIRE(::kill(r.started[1].pid, SIGTERM) == 0);  // only rank 1 is told
    finish_ranks(r);
    INFO(r.outcomes[0].describe() << "\n" << r.outcomes[1].describe());
    for (const auto& o : r.outcomes) {
        REQUIRE(o.exited);
        CHECK(o.code == 143);
    }
    const long at = stopped_step(r.outcomes[0].out);
    REQUIRE(at >= 20);
    REQUIRE(at < steps);
    CHECK(stopped_step(r.outcomes[1].out) == at);
    CHECK_THAT(r.outcomes[1].out, Catch::Contains("rank 1: stopped by SIGTERM after step " + std::to_string(at) + " together with the other ranks"));
    CHECK_THAT(r.outcomes[1].err, Catch::Contains("train_lm: SIGTERM received"));
    CHECK(fs::exists(checkpoint(dir.path / "stopped", at)));
    std::printf("two ranks: rank 1 got SIGTERM, both stopped after step %ld\n", at);

    Ranks resumed = start_ranks(train_lm, dir.path, "resumed", args_for("stopped"), {{}, {}});
    finish_ranks(resumed);
    for (const auto& o : resumed.outcomes) {
        INFO(o.describe());
        REQUIRE(o.code == 0);
    }
    CHECK_THAT(resumed.outcomes[0].out, Catch::Contains("at step " + std::to_string(at)));
    Ranks whole = start_ranks(train_lm, dir.path, "whole", args_for("whole"), {{}, {}});
    finish_ranks(whole);
    for (const auto& o : whole.outcomes) REQUIRE(o.code == 0);
    check_same_state(checkpoint(dir.path / "stopped", steps), checkpoint(dir.path / "whole", steps));
}

TEST_CASE("train_lm: a second SIGINT ends a rank stuck waiting for its peer at once, by SIGINT", "[distributed][stop]") {
    const Program train_lm = train_lm_program();
    TempDir dir;
    write_file(dir.path / "corpus.txt", fortune_corpus());
    // Rank 0 of 2 alone: it waits at the rendezvous for up to 60 s.
    auto args = with(stop_run(dir.path / "corpus.txt", dir.path / "run", 100),
                     {"--world_size=2", "--rank=0", "--rendezvous=file:" + (dir.path / "store").string(), "--collective_timeout_s=60"});
    const Started started = start(train_lm, args, dir.path, "alone");
    // Once its address is in the store it waits in the rendezvous (its handlers were installed before).
    const auto begun = Clock::now();
    auto in_store = [&] {
        std::error_code ec;
        for (auto it = fs::recursive_directory_iterator(dir.path / "store", ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
            if (it->is_regular_file()) return true;
        return false;
    };
    while (!in_store() && seconds_since(begun) < 30) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    REQUIRE(in_store());
    // The first SIGINT only asks: its notice, and the process goes on waiting.
    REQUIRE(::kill(started.pid, SIGINT) == 0);
    REQUIRE(wait_for_text(started.err_file, "train_lm: SIGINT received", 10));
    REQUIRE(::kill(started.pid, SIGINT) == 0);
    const auto signalled = Clock::now();
    const Outcome o = finish(started, 90);
    const double took = seconds_since(signalled);
    INFO(o.describe());
    CHECK_FALSE(o.exited);
    CHECK(o.signal == SIGINT);
    CHECK(took < 2);
    CHECK_THAT(o.err, Catch::Contains("train_lm: SIGINT again: stopping at once"));
    CHECK_FALSE(fs::exists(dir.path / "run"));
}
