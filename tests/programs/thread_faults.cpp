// A program that makes threads fail on purpose, to check that every failure reaches the thread
// that waits for it and ends the program with one line and an exit status, never a signal
// (tests/programs/test_stop_and_faults.cpp runs it):
//
//   thread_faults collective   OverlappedAllreduce's worker thread runs a collective that throws
//                              (a communicator of two ranks whose allreduce fails)
//   thread_faults kernel       a kernel's loop body throws on a thread-pool worker, not the caller
//   thread_faults stray        a thread the library does not own (as Gloo's network thread) ends
//                              with an uncaught exception
//
// Each message says on which kind of thread it was thrown, so the test can check that it was not
// the main thread.

#include <atomic>
#include <chrono>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <olmax/olmax.hpp>
#include <olmax/distributed/overlapped_allreduce.hpp>

namespace {

namespace dist = olmax::distributed;

const std::thread::id main_thread = std::this_thread::get_id();

const char* where() { return std::this_thread::get_id() == main_thread ? "the main thread" : "another thread"; }

/// Rank 0 of a world of two whose allreduce fails (as a dead peer would make it).
class FailingCommunicator final : public dist::Communicator {
public:
    int rank() const override { return 0; }
    int world_size() const override { return 2; }
    dist::Timeout default_timeout() const override { return std::chrono::seconds(5); }
    std::string_view backend_name() const override { return "injected"; }

protected:
    void do_allreduce(std::span<float> data, dist::Reduction, dist::Timeout) override {
        throw dist::distributed_error(olmax::detail::concat(describe("allreduce"), " of ", data.size(), " float32 failed on ", where(),
                                                            ": injected failure"));
    }
    void do_allreduce(std::span<double>, dist::Reduction, dist::Timeout) override { throw dist::distributed_error("unexpected double allreduce"); }
    void do_broadcast(std::span<std::byte>, int, dist::Timeout) override { throw dist::distributed_error("unexpected broadcast"); }
    void do_barrier(dist::Timeout) override { throw dist::distributed_error("unexpected barrier"); }
};

void collective() {
    FailingCommunicator comm;
    auto w = olmax::parameter(olmax::Tensor<float>::from({3}, {1, 2, 3}));
    dist::OverlappedAllreduce<float> reducer(comm, {w});
    reducer.overlap([&] { olmax::sum(w * w).backward(); });  // throws here, on the caller's thread
}

void kernel() {
    olmax::backend::cpu_openmp::set_parallel_threshold(1);
    olmax::backend::detail::omp_thread_cap two(2);
    std::atomic<bool> thrown{false};
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    // The caller's chunks wait until a worker has thrown (at most 5 s), so that the failure happens
    // on a pool thread.
    olmax::backend::current().parallel_for(64, 1'000'000, [&](std::size_t, std::size_t) {
        if (std::this_thread::get_id() != main_thread) {
            thrown = true;
            throw olmax::value_error(olmax::detail::concat("injected kernel failure on ", where()));
        }
        while (!thrown && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(std::chrono::microseconds(100));
    });
    throw olmax::value_error("no pool worker ran a chunk within 5 s: the kernel's failure could not be injected on a pool thread");
}

void stray() {
    std::thread t([] { throw std::runtime_error("injected failure on a thread nobody joins yet"); });
    t.join();
}

int run(int argc, char** argv) {
    const std::string mode = argc == 2 ? argv[1] : "";
    if (mode == "collective") collective();
    else if (mode == "kernel") kernel();
    else if (mode == "stray") stray();
    else throw olmax::config::config_error("usage: thread_faults collective|kernel|stray");
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return olmax::config::run_program("thread_faults", run, argc, argv); }
