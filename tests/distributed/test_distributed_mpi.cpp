// One rank of a multi-process test of olmax/distributed over MPI (run_mpi.sh starts the ranks with
// mpirun):
//
//   test_distributed_mpi --case=NAME [--timeout_ms=T]
//
// Cases (cases.hpp, shared with the Gloo test): collectives, train, overlap (the collectives on
// OverlappedAllreduce's worker thread: MPI_THREAD_SERIALIZED suffices), agreement, peer_exit, peer_hang; and
//   collectives  also: allreduce and broadcast in several rounds (max_count 1000), two
//                communicators side by side, bad options refused, MPI finalised by olmax once
//                the last communicator is gone (a new one is then refused with distributed_error).
//   adopt        the program initialises MPI itself, olmax uses its MPI_COMM_WORLD (and leaves
//                finalising to the program).
// Exit status 0 when every check of this rank passed; the first failed check is printed. In the
// fault cases the job ends by MPI_Abort (rank 0's broken communicator) or by mpirun (a dead rank):
// run_mpi.sh checks how and how fast.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include <olmax/distributed/mpi.hpp>

#include "cases.hpp"

using namespace olmax_distributed_test;

namespace {

/// Allreduce and broadcast split into rounds of at most 1000 elements (bytes), on a second
/// communicator beside the first.
void check_rounds(dist::Communicator& first, long timeout_ms) {
    dist::MpiOptions options;
    options.timeout = dist::Timeout(timeout_ms);
    options.max_count = 1000;
    dist::MpiCommunicator comm(options);
    expect(comm.rank() == first.rank() && comm.world_size() == first.world_size(), "a second communicator has another rank or size");
    std::uint64_t salt = 500;
    for (std::size_t n : {std::size_t(999), std::size_t(1000), std::size_t(1001), std::size_t(100003)})
        for (auto op : {dist::Reduction::sum, dist::Reduction::mean}) {
            check_allreduce<float>(comm, n, op, ++salt);
            check_allreduce<double>(comm, n, op, ++salt);
        }
    for (int root = 0; root < comm.world_size(); ++root) {
        const auto source = input_of<double>(root, 12345, 9);
        auto data = comm.rank() == root ? source : std::vector<double>(source.size(), -1.0);
        comm.broadcast(std::span<double>(data), root);
        expect(same_bits<double>(data, source), "broadcast in rounds from rank ", root, ": wrong values");
    }
    first.barrier();  // the two communicators' traffic does not mix
    std::printf("rounds of 1000: allreduce of up to 100003 elements and broadcast of 98760 bytes, equal to the reference\n");
}

void expect_refused(std::string_view what, const std::function<void()>& body) {
    bool refused = false;
    try {
        body();
    } catch (const olmax::value_error& e) {
        refused = true;
        std::printf("refused as expected: %s\n", e.what());
    }
    expect(refused, what, " was not refused");
}

void case_mpi_collectives(long timeout_ms) {
    {
        dist::MpiOptions options;
        options.timeout = dist::Timeout(timeout_ms);
        dist::MpiCommunicator comm(options);
        expect(comm.backend_name() == "mpi", "backend_name is not mpi");
        case_collectives(comm);
        check_rounds(comm, timeout_ms);
        expect_refused("a zero timeout", [] { dist::MpiCommunicator bad(dist::MpiOptions{dist::Timeout(0)}); });
        expect_refused("max_count 0", [] {
            dist::MpiOptions o;
            o.max_count = 0;
            dist::MpiCommunicator bad(o);
        });
        expect_refused("a collective with a zero timeout", [&] { comm.barrier(dist::Timeout(0)); });
        comm.barrier();
    }
    // The last communicator is gone: olmax finalised the MPI it had initialised.
    int finalised = 0;
    MPI_Finalized(&finalised);
    expect(finalised == 1, "MPI was not finalised when the last communicator was destroyed");
    bool refused = false;
    try {
        dist::MpiCommunicator again;
    } catch (const dist::distributed_error& e) {
        refused = std::string_view(e.what()).find("finalised") != std::string_view::npos;
        std::printf("after MPI_Finalize: %s\n", e.what());
    }
    expect(refused, "a communicator after MPI_Finalize was not refused with a clear error");
}

void case_adopt(long timeout_ms) {
    int provided = 0;
    expect(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) == MPI_SUCCESS, "MPI_Init_thread failed");
    dist::MpiOptions options;
    options.timeout = dist::Timeout(timeout_ms);
    {
        dist::MpiCommunicator comm(MPI_COMM_WORLD, options);
        dist::MpiCommunicator joined(options);  // MPI already initialised by the program: olmax does not own it
        check_allreduce<float>(comm, 1001, dist::Reduction::mean, 1);
        check_allreduce<double>(joined, 1001, dist::Reduction::sum, 2);
    }
    int finalised = 0;
    MPI_Finalized(&finalised);
    expect(finalised == 0, "olmax finalised an MPI that the program had initialised");
    int value = 1, sum = 0;  // the program's own use of MPI_COMM_WORLD still works
    MPI_Allreduce(&value, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    expect(sum == size, "MPI_COMM_WORLD unusable after olmax's communicators");
    expect_refused("MPI_COMM_NULL", [&] {
        try {
            dist::MpiCommunicator bad(MPI_COMM_NULL, options);
        } catch (const dist::distributed_error& e) {
            throw olmax::value_error(e.what());  // reported as distributed_error; counted here as refused
        }
    });
    MPI_Finalize();
    std::printf("adopt: olmax used the program's MPI_COMM_WORLD and left MPI initialised\n");
}

}  // namespace

int main(int argc, char** argv) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    std::string name;
    long timeout_ms = 20000;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg.starts_with("--case=")) name = arg.substr(7);
        else if (arg.starts_with("--timeout_ms=")) timeout_ms = std::atol(argv[i] + 13);
        else {
            std::fprintf(stderr, "usage: test_distributed_mpi --case=NAME [--timeout_ms=T]\n");
            return 2;
        }
    }
    // Failures are reported before a broken communicator is destroyed (which aborts the job).
    auto checked = [](const std::function<void()>& body) {
        try {
            body();
            return 0;
        } catch (const Failure& f) {
            std::fprintf(stderr, "FAILED: %s\n", f.what());
        } catch (const std::exception& e) {
            std::fprintf(stderr, "FAILED with an exception: %s\n", e.what());
        }
        return 1;
    };
    if (name == "collectives") return checked([&] { case_mpi_collectives(timeout_ms); std::printf("all checks passed\n"); });
    if (name == "adopt") return checked([&] { case_adopt(timeout_ms); std::printf("all checks passed\n"); });
    if (name != "train" && name != "overlap" && name != "agreement" && name != "peer_exit" && name != "peer_hang") {
        std::fprintf(stderr, "test_distributed_mpi: unknown case '%s'\n", name.c_str());
        return 2;
    }
    std::unique_ptr<dist::MpiCommunicator> comm;
    int status = checked([&] {
        dist::MpiOptions options;
        options.timeout = dist::Timeout(timeout_ms);
        comm = std::make_unique<dist::MpiCommunicator>(options);
        std::printf("rank %d of %d: MPI communicator ready\n", comm->rank(), comm->world_size());
        if (name == "train") case_train(*comm);
        else if (name == "overlap") case_overlap(*comm);
        else if (name == "agreement") case_agreement(*comm);
        else if (name == "peer_exit") case_peer_exit(*comm);
        else case_peer_hang(*comm);
        std::printf("rank %d: all checks passed\n", comm->rank());
    });
    comm.reset();  // a communicator broken by the fault cases aborts the job here
    return status;
}
