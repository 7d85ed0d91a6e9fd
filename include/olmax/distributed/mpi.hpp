#pragma once
// `MpiCommunicator`: the collectives of olmax/distributed/communicator.hpp over MPI (the C API;
// tested with Open MPI 4.1, Debian: libopenmpi-dev). Link the CMake target olmax::distributed_mpi,
// which olmax defines only when CMake finds MPI. Start the ranks with the MPI launcher:
// `mpirun -np 2 ./app` (as root Open MPI also wants --allow-run-as-root).
//
// Construction: `MpiCommunicator(options)` joins MPI_COMM_WORLD, initialising MPI first
// (MPI_Init_thread, MPI_THREAD_SERIALIZED) when nobody has; olmax then finalises MPI when the last
// communicator that relied on that initialisation is destroyed (MPI cannot be initialised twice in
// one process, so a later construction fails with distributed_error). `MpiCommunicator(comm,
// options)` uses a communicator of an MPI that the caller initialised and will finalise. Either
// way the communicator is duplicated (MPI_Comm_dup, collective: every rank constructs it), so
// olmax's messages never mix with the caller's, and MPI errors on it are returned, not fatal.
//
// Allreduce (deterministic for any world size N): MPI_Allreduce promises no summation order, so it
// is not used. As in GlooCommunicator, the elements are cut into N contiguous segments, rank r
// owning segment r; a reduce-scatter (MPI_Ialltoallv: every rank sends segment p to rank p) lets
// each owner add its N copies with `reduce_in_rank_order` (rank 0's first, then rank 1's, ...), and
// an allgather (MPI_Iallgatherv, in place) sends every reduced segment to every rank. The result is
// bit for bit what `reduce_in_rank_order` computes from the N inputs. Each rank sends and receives
// 2 (N - 1) / N of the message, as in a ring allreduce. MPI counts are `int`: messages longer than
// `MpiOptions::max_count` elements (bytes for broadcast) go in several rounds.
//
// Timeouts: MPI has no timeout on a collective and cannot cancel one. olmax posts the non-blocking
// form of each collective and polls it (MPI_Test) until it completes or the deadline passes. On a
// timeout (a peer hung, or never called the collective) or an MPI error, the collective throws
// `distributed_error` naming the operation and the rank, and the communicator refuses every later
// collective. The abandoned collective still references its buffers, and the peers may be stuck in
// it, so the job cannot go on: when a broken communicator is destroyed it prints its failure on
// stderr and calls MPI_Abort, which makes the launcher end every rank of the job. A rank that dies
// (crash, kill, exit without MPI_Finalize) is handled by the launcher itself: Open MPI's mpirun
// ends all the other ranks at once (they get no exception), and exits with a nonzero status.

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API only (the MPI-2 C++ bindings are deprecated and need libmpi_cxx)
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "olmax/distributed/communicator.hpp"

namespace olmax::distributed {

struct MpiOptions {
    /// Every collective waits at most this long for the peers (MPI itself has no timeout).
    Timeout timeout = std::chrono::seconds(30);
    /// The largest count handed to one MPI call (elements for allreduce, bytes for broadcast); MPI
    /// counts and displacements are `int`, longer messages go in rounds. In [1, 2^30].
    std::size_t max_count = std::size_t(1) << 28;

    /// OLMAX_TIMEOUT_MS, optional (missing: the default above). Rank and world size come from MPI.
    static MpiOptions from_environment() {
        MpiOptions o;
        if (const char* value = std::getenv("OLMAX_TIMEOUT_MS"); value && *value) {
            char* end = nullptr;
            const long long parsed = std::strtoll(value, &end, 10);
            check(*end == '\0', "MpiOptions::from_environment: OLMAX_TIMEOUT_MS='", value, "' is not an integer");
            o.timeout = Timeout(parsed);
        }
        return o;
    }
};

namespace detail {

/// MPI's words for an error code.
inline std::string mpi_error_string(int code) {
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return olmax::detail::concat("MPI error code ", code);
    return std::string(text, std::size_t(std::max(0, length)));
}

/// What olmax did to MPI in this process: whether it called MPI_Init_thread, and how many live
/// communicators rely on that (the last one finalises).
struct MpiRuntime {
    std::mutex mutex;
    bool initialised_by_olmax = false;
    int users = 0;
};

inline MpiRuntime& mpi_runtime() {
    static MpiRuntime runtime;
    return runtime;
}

/// A failed MPI step inside a collective: `kind` in words, then MPI's detail.
struct MpiFailure : std::exception {
    std::string message;
    explicit MpiFailure(std::string m) : message(std::move(m)) {}
    const char* what() const noexcept override { return message.c_str(); }
};

inline void mpi_call(int code, std::string_view call) {
    if (code != MPI_SUCCESS) throw MpiFailure(olmax::detail::concat("MPI failed: ", call, ": ", mpi_error_string(code)));
}

template <Real T>
MPI_Datatype mpi_datatype() {
    if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
    else return MPI_DOUBLE;
}

}  // namespace detail

class MpiCommunicator final : public Communicator {
public:
    /// Joins MPI_COMM_WORLD, initialising MPI if nobody has (see the top of this file).
    explicit MpiCommunicator(const MpiOptions& options = {}) : timeout_(options.timeout), max_count_(options.max_count) {
        check_options();
        auto& runtime = detail::mpi_runtime();
        std::lock_guard lock(runtime.mutex);
        int initialised = 0, finalised = 0;
        MPI_Initialized(&initialised);
        MPI_Finalized(&finalised);
        check<distributed_error>(!finalised, "MpiCommunicator: MPI was already finalised in this process and cannot be initialised again",
                                 runtime.initialised_by_olmax ? " (olmax finalised it when its last MpiCommunicator was destroyed)" : "");
        if (!initialised) {
            int provided = MPI_THREAD_SINGLE;
            const int code = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
            check<distributed_error>(code == MPI_SUCCESS, "MpiCommunicator: MPI_Init_thread failed: ", detail::mpi_error_string(code));
            runtime.initialised_by_olmax = true;
            if (provided < MPI_THREAD_SERIALIZED) {
                MPI_Finalize();
                throw distributed_error(olmax::detail::concat("MpiCommunicator: this MPI provides thread level ", provided,
                                                              ", below MPI_THREAD_SERIALIZED (", MPI_THREAD_SERIALIZED, ")"));
            }
        }
        adopt(MPI_COMM_WORLD);
        if (runtime.initialised_by_olmax) {
            ++runtime.users;
            holds_runtime_ = true;
        }
    }

    /// Uses `comm` (duplicated) of an MPI that the caller initialised and will finalise.
    explicit MpiCommunicator(MPI_Comm comm, const MpiOptions& options = {}) : timeout_(options.timeout), max_count_(options.max_count) {
        check_options();
        int initialised = 0, finalised = 0;
        MPI_Initialized(&initialised);
        MPI_Finalized(&finalised);
        check<distributed_error>(initialised && !finalised, "MpiCommunicator: MPI is ", finalised ? "already finalised" : "not initialised",
                                 " (construct MpiCommunicator(options) to let olmax initialise it)");
        check<distributed_error>(comm != MPI_COMM_NULL, "MpiCommunicator: the communicator is MPI_COMM_NULL");
        adopt(comm);
    }

    MpiCommunicator(const MpiCommunicator&) = delete;
    MpiCommunicator& operator=(const MpiCommunicator&) = delete;

    ~MpiCommunicator() override {
        int finalised = 0;
        MPI_Finalized(&finalised);
        if (!failure_.empty() && !finalised) {
            std::fflush(stdout);
            std::fprintf(stderr, "olmax: MpiCommunicator (rank %d of %d): ending the MPI job (MPI_Abort) after a failed collective, "
                                 "which MPI cannot cancel: %s\n", rank_, size_, failure_.c_str());
            std::fflush(stderr);
            MPI_Abort(comm_, 1);
        }
        if (!finalised && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
        if (holds_runtime_) {
            auto& runtime = detail::mpi_runtime();
            std::lock_guard lock(runtime.mutex);
            if (--runtime.users == 0) {
                MPI_Finalized(&finalised);
                if (!finalised) MPI_Finalize();
            }
        }
    }

    int rank() const override { return rank_; }
    int world_size() const override { return size_; }
    Timeout default_timeout() const override { return timeout_; }
    std::string_view backend_name() const override { return "mpi"; }

    /// Whether an earlier collective failed (every later one then throws at once; destroying the
    /// communicator then aborts the MPI job).
    bool broken() const { return !failure_.empty(); }
    /// olmax's duplicate of the communicator, for MPI's own collectives (benchmarks/distributed
    /// compares MPI_Allreduce).
    MPI_Comm mpi_comm() const { return comm_; }

protected:
    void do_allreduce(std::span<float> data, Reduction op, Timeout timeout) override { allreduce_impl(data, op, timeout); }
    void do_allreduce(std::span<double> data, Reduction op, Timeout timeout) override { allreduce_impl(data, op, timeout); }

    void do_broadcast(std::span<std::byte> data, int root, Timeout timeout) override {
        run(olmax::detail::concat(describe("broadcast"), " of ", data.size(), " bytes from rank ", root), timeout, [&](clock::time_point deadline) {
            if (size_ == 1) return;
            for (std::size_t at = 0; at < data.size(); at += max_count_) {
                const int count = int(std::min(max_count_, data.size() - at));
                MPI_Request request = MPI_REQUEST_NULL;
                detail::mpi_call(MPI_Ibcast(data.data() + at, count, MPI_BYTE, root, comm_, &request), "MPI_Ibcast");
                wait(request, deadline, "MPI_Ibcast");
            }
        });
    }

    void do_barrier(Timeout timeout) override {
        run(describe("barrier"), timeout, [&](clock::time_point deadline) {
            if (size_ == 1) return;
            MPI_Request request = MPI_REQUEST_NULL;
            detail::mpi_call(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
            wait(request, deadline, "MPI_Ibarrier");
        });
    }

private:
    using clock = std::chrono::steady_clock;

    static long long elapsed_ms(clock::time_point start) {
        return std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - start).count();
    }

    void check_options() const {
        check(timeout_.count() > 0, "MpiCommunicator: the timeout must be positive, got ", timeout_.count(), " ms");
        check(max_count_ >= 1 && max_count_ <= (std::size_t(1) << 30), "MpiCommunicator: max_count must be in [1, 2^30], got ", max_count_);
    }

    void adopt(MPI_Comm comm) {
        const int code = MPI_Comm_dup(comm, &comm_);
        check<distributed_error>(code == MPI_SUCCESS, "MpiCommunicator: MPI_Comm_dup failed: ", detail::mpi_error_string(code));
        MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
        MPI_Comm_rank(comm_, &rank_);
        MPI_Comm_size(comm_, &size_);
    }

    /// Runs one collective: refuses when broken, turns any failure into distributed_error and
    /// marks the communicator broken.
    template <class Body>
    void run(const std::string& what, Timeout timeout, Body&& body) {
        check<distributed_error>(failure_.empty(), what, ": the communicator is unusable since an earlier collective failed: ", failure_);
        const auto start = clock::now();
        try {
            body(start + timeout);
        } catch (const std::exception& e) {
            failure_ = olmax::detail::concat(what, " failed after ", elapsed_ms(start), " ms (timeout ", timeout.count(), " ms): ", e.what(),
                                             "; MPI cannot cancel a collective: destroying this communicator aborts the MPI job");
            throw distributed_error(failure_);
        }
    }

    /// Polls `request` until it completes; past `deadline` it is abandoned (kept, never freed).
    void wait(MPI_Request& request, clock::time_point deadline, std::string_view call) {
        int done = 0;
        for (unsigned spin = 0;; ++spin) {
            detail::mpi_call(MPI_Test(&request, &done, MPI_STATUS_IGNORE), call);
            if (done) return;
            if ((spin & 63) == 63 && clock::now() >= deadline) {
                abandoned_.push_back(request);
                throw detail::MpiFailure(olmax::detail::concat(
                    "a peer did not take part within the timeout (hung, dead or never started): ", call, " did not complete"));
            }
        }
    }

    template <Real T>
    void allreduce_impl(std::span<T> data, Reduction op, Timeout timeout) {
        const std::string what = olmax::detail::concat(describe("allreduce"), " ", to_string(op), " of ", data.size(), " ", dtype_name<T>());
        run(what, timeout, [&](clock::time_point deadline) {
            if (size_ == 1) return;  // a world of one: the sum is the input, the mean divides by 1
            for (std::size_t at = 0; at < data.size(); at += max_count_)
                allreduce_round<T>(data.subspan(at, std::min(max_count_, data.size() - at)), op, deadline);
        });
    }

    /// One round of at most max_count_ (<= 2^30) elements, so every count and displacement fits an int.
    template <Real T>
    void allreduce_round(std::span<T> data, Reduction op, clock::time_point deadline) {
        const std::size_t n = data.size();
        const int world = size_, me = rank_;
        auto begin_of = [&](int r) { return n / std::size_t(world) * std::size_t(r) + std::min<std::size_t>(std::size_t(r), n % std::size_t(world)); };
        auto length_of = [&](int r) { return begin_of(r + 1) - begin_of(r); };
        const std::size_t mine = length_of(me);
        // Received copies of this rank's segment, one row per peer in rank order (this rank skipped).
        auto& scratch = scratch_for<T>();
        if (scratch.size() < std::size_t(world - 1) * mine) scratch.resize(std::size_t(world - 1) * mine);
        auto row = [&](int peer) { return std::size_t(peer < me ? peer : peer - 1) * mine; };

        std::vector<int> send_counts(world), send_displs(world), recv_counts(world), recv_displs(world);
        for (int p = 0; p < world; ++p) {
            send_counts[p] = p == me ? 0 : int(length_of(p));
            send_displs[p] = int(begin_of(p));
            recv_counts[p] = p == me ? 0 : int(mine);
            recv_displs[p] = p == me ? 0 : int(row(p));
        }
        const MPI_Datatype type = detail::mpi_datatype<T>();
        MPI_Request request = MPI_REQUEST_NULL;
        detail::mpi_call(MPI_Ialltoallv(data.data(), send_counts.data(), send_displs.data(), type, scratch.data(), recv_counts.data(),
                                        recv_displs.data(), type, comm_, &request),
                         "MPI_Ialltoallv (reduce-scatter)");
        wait(request, deadline, "MPI_Ialltoallv (reduce-scatter)");

        if (mine) {
            std::vector<std::span<const T>> parts(world);
            for (int r = 0; r < world; ++r)
                parts[r] = r == me ? std::span<const T>(data.data() + begin_of(me), mine) : std::span<const T>(scratch.data() + row(r), mine);
            reduce_in_rank_order<T>(parts, data.subspan(begin_of(me), mine), op);
        }

        for (int r = 0; r < world; ++r) {
            recv_counts[r] = int(length_of(r));
            recv_displs[r] = int(begin_of(r));
        }
        detail::mpi_call(MPI_Iallgatherv(MPI_IN_PLACE, 0, type, data.data(), recv_counts.data(), recv_displs.data(), type, comm_, &request),
                         "MPI_Iallgatherv (allgather)");
        wait(request, deadline, "MPI_Iallgatherv (allgather)");
    }

    template <Real T>
    std::vector<T>& scratch_for() {
        if constexpr (std::is_same_v<T, float>) return scratch_float_;
        else return scratch_double_;
    }

    Timeout timeout_;
    std::size_t max_count_;
    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0;
    int size_ = 1;
    bool holds_runtime_ = false;
    std::string failure_;                // empty while usable
    std::vector<MPI_Request> abandoned_;  // collectives given up at a timeout (MPI cannot cancel them)
    std::vector<float> scratch_float_;
    std::vector<double> scratch_double_;
};

}  // namespace olmax::distributed
