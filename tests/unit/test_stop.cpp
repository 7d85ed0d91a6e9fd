// The stop request (core/stop.hpp) and the ranks' vote on it (distributed/stop.hpp). Signals are
// raised in this process while a guard lives; the cases that end a process (a second SIGINT) run in
// a forked child. train_lm stopped by real signals and resumed: tests/programs/test_stop_and_faults.cpp.
#include "test_helpers.hpp"

#include "in_process_world.hpp"

#include <olmax/distributed/stop.hpp>

#include <csignal>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace dist = olmax::distributed;

namespace {

/// The handler function currently installed for `signal`.
void (*handler_of(int signal))(int) {
    struct sigaction now {};
    sigaction(signal, nullptr, &now);
    return now.sa_handler;
}

/// Runs `body` in a forked child and returns its wait status.
template <class Body>
int in_child(Body body) {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
        body();
        ::_exit(0);
    }
    REQUIRE(pid > 0);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    return status;
}

}  // namespace

TEST_CASE("stop_on_signals: SIGTERM and SIGINT request a stop, the first one wins, the guard restores the handlers", "[stop]") {
    olmax::clear_stop_request();
    const auto term_before = handler_of(SIGTERM), int_before = handler_of(SIGINT);
    {
        olmax::stop_on_signals guard("test_stop", "carrying on (the test raised it)");
        CHECK(guard.handles_sigterm());
        CHECK(guard.handles_sigint());
        CHECK_FALSE(olmax::stop_requested());
        REQUIRE(std::raise(SIGTERM) == 0);  // handled: this process goes on
        CHECK(olmax::stop_requested());
        CHECK(olmax::stop_signal() == SIGTERM);
        REQUIRE(std::raise(SIGTERM) == 0);  // a repeated SIGTERM changes nothing
        CHECK(olmax::stop_signal() == SIGTERM);
        olmax::clear_stop_request();
        REQUIRE(std::raise(SIGINT) == 0);  // the first SIGINT only asks
        CHECK(olmax::stop_signal() == SIGINT);
    }
    CHECK(handler_of(SIGTERM) == term_before);
    CHECK(handler_of(SIGINT) == int_before);
    olmax::clear_stop_request();
    CHECK_FALSE(olmax::stop_requested());
    olmax::request_stop();
    CHECK(olmax::stop_requested());
    CHECK(olmax::stop_signal() == 0);
    olmax::request_stop(SIGTERM);  // the first request wins
    CHECK(olmax::stop_signal() == 0);
    olmax::clear_stop_request();
    CHECK(olmax::signal_name(SIGINT) == "SIGINT");
    CHECK(olmax::signal_name(SIGTERM) == "SIGTERM");
}

TEST_CASE("stop_on_signals: a signal the process ignores stays ignored", "[stop]") {
    olmax::clear_stop_request();
    struct sigaction ignore {}, previous {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    REQUIRE(sigaction(SIGINT, &ignore, &previous) == 0);
    {
        olmax::stop_on_signals guard("test_stop");
        CHECK_FALSE(guard.handles_sigint());
        CHECK(guard.handles_sigterm());
        REQUIRE(std::raise(SIGINT) == 0);
        CHECK_FALSE(olmax::stop_requested());
    }
    CHECK(handler_of(SIGINT) == SIG_IGN);
    REQUIRE(sigaction(SIGINT, &previous, nullptr) == 0);
}

TEST_CASE("stop_on_signals: a second SIGINT ends the process at once, by SIGINT; a second SIGTERM does not", "[stop]") {
    const int interrupted = in_child([] {
        ::signal(SIGINT, SIG_DFL);
        olmax::stop_on_signals guard("test_stop child");
        std::raise(SIGINT);
        if (!olmax::stop_requested()) ::_exit(3);
        std::raise(SIGINT);  // does not return
        ::_exit(4);
    });
    CHECK(WIFSIGNALED(interrupted));
    CHECK(WTERMSIG(interrupted) == SIGINT);
    const int terminated = in_child([] {
        olmax::stop_on_signals guard("test_stop child");
        std::raise(SIGTERM);
        std::raise(SIGTERM);
        ::_exit(olmax::stop_signal() == SIGTERM ? 7 : 5);
    });
    CHECK(WIFEXITED(terminated));
    CHECK(WEXITSTATUS(terminated) == 7);
    const int term_then_int = in_child([] {  // SIGINT after a SIGTERM: the user insists
        ::signal(SIGINT, SIG_DFL);
        olmax::stop_on_signals guard("test_stop child");
        std::raise(SIGTERM);
        std::raise(SIGINT);
        ::_exit(6);
    });
    CHECK(WIFSIGNALED(term_then_int));
}

TEST_CASE("stop votes: SIGTERM wins over SIGINT over a request without a signal; all ranks read one decision", "[stop][distributed]") {
    olmax::clear_stop_request();
    CHECK(dist::stop_vote() == std::array<double, 3>{0, 0, 0});
    olmax::request_stop(SIGINT);
    CHECK(dist::stop_vote() == std::array<double, 3>{0, 1, 0});
    olmax::clear_stop_request();
    olmax::request_stop();
    CHECK(dist::stop_vote() == std::array<double, 3>{0, 0, 1});
    olmax::clear_stop_request();

    const std::array<double, 3> none{0, 0, 0}, mixed{1, 2, 0}, interrupts{0, 2, 0}, requests{0, 0, 1};
    CHECK_FALSE(dist::decide_stop(none).stop);
    CHECK(dist::decide_stop(none).exit_status() == 0);
    const auto d = dist::decide_stop(mixed);
    CHECK(d.stop);
    CHECK(d.signal == SIGTERM);
    CHECK(d.ranks == 3);
    CHECK(d.exit_status() == 143);
    CHECK(dist::decide_stop(interrupts).exit_status() == 130);
    CHECK(dist::decide_stop(requests).stop);
    CHECK(dist::decide_stop(requests).exit_status() == 0);
    CHECK_THROWS_AS(dist::decide_stop(std::span<const double>(mixed).first(2)), olmax::value_error);

    // Over three in-process ranks (which share this process's request): one allreduce, one decision.
    for (const bool asked : {false, true}) {
        if (asked) olmax::request_stop(SIGTERM);
        olmax_test::InProcessWorld world(3);
        std::array<dist::StopDecision, 3> decisions;
        const auto errors = world.run([&](dist::Communicator& comm) { decisions[std::size_t(comm.rank())] = dist::agree_to_stop(comm); });
        for (const auto& e : errors) CHECK_FALSE(e);
        CHECK(world.collectives() == 1);
        for (const auto& decision : decisions) {
            CHECK(decision.stop == asked);
            CHECK(decision.ranks == (asked ? 3 : 0));
            CHECK(decision.exit_status() == (asked ? 143 : 0));
        }
        olmax::clear_stop_request();
    }
}
