#pragma once
// Collective communication between the processes ("ranks") of one training job, as an interface
// with no transport in it: code written against `Communicator` runs in one process with
// `LocalCommunicator` and across processes with `GlooCommunicator` (olmax/distributed/gloo.hpp,
// which needs Gloo and the CMake target olmax::distributed).
//
// Determinism: every implementation must give, on every rank, exactly (bit for bit) what
// `reduce_in_rank_order` computes from the ranks' inputs: the contributions added left to right in
// rank order, x_0 + x_1 + ... + x_{N-1}, in the element type, then (mean) divided by N. A single
// process that averages N shard gradients with that function therefore reproduces an N-process run
// exactly, for any N.
//
// Failures: a collective that a peer does not join within its timeout, or that loses a peer, throws
// `distributed_error` naming the operation and the rank. Collectives are blocking, are called from
// one thread at a time, and must be called in the same order with the same sizes on every rank.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "olmax/core/error.hpp"
#include "olmax/core/tensor.hpp"

namespace olmax::distributed {

/// A collective failed: a peer timed out, died or closed its connection, or the communicator was
/// already broken by an earlier failure. The message names the operation and the rank.
class distributed_error : public error {
public:
    using error::error;
};

enum class Reduction {
    sum,   // x_0 + x_1 + ... + x_{N-1}, added in rank order
    mean,  // the sum above, then divided by N
};

inline std::string_view to_string(Reduction op) { return op == Reduction::sum ? "sum" : "mean"; }

/// Timeouts are whole milliseconds (Gloo's unit).
using Timeout = std::chrono::milliseconds;

/// The reduction every communicator performs, element by element: `out[i] = c_0[i] + c_1[i] + ...`
/// in rank order in type T (then `/ T(N)` for the mean). `out` may be one of the contributions (the
/// same range, not a shifted one). Exposed so that a single process can reproduce an N-process
/// result bit for bit (tests/distributed checks that it does).
template <Real T>
void reduce_in_rank_order(std::span<const std::span<const T>> contributions, std::span<T> out, Reduction op) {
    check(!contributions.empty(), "reduce_in_rank_order: no contributions");
    for (const auto& c : contributions)
        check(c.size() == out.size(), "reduce_in_rank_order: a contribution has ", c.size(), " elements, the output ", out.size());
    const std::size_t ranks = contributions.size();
    const T divisor = static_cast<T>(ranks);
    const bool mean = op == Reduction::mean;
    // Blocks keep the running sums in cache while each contribution streams through once; within a
    // block every element still sees the same additions in the same order.
    constexpr std::size_t block = 2048;
    std::array<T, block> acc;
    for (std::size_t begin = 0; begin < out.size(); begin += block) {
        const std::size_t n = std::min(block, out.size() - begin);
        const T* first = contributions[0].data() + begin;
        for (std::size_t i = 0; i < n; ++i) acc[i] = first[i];
        for (std::size_t r = 1; r < ranks; ++r) {
            const T* c = contributions[r].data() + begin;
            for (std::size_t i = 0; i < n; ++i) acc[i] += c[i];
        }
        T* o = out.data() + begin;
        if (mean)
            for (std::size_t i = 0; i < n; ++i) o[i] = acc[i] / divisor;
        else
            for (std::size_t i = 0; i < n; ++i) o[i] = acc[i];
    }
}

/// Convenience overload: contributions as tensors of one size (a single process averaging shard
/// gradients); the result is written into `out`.
template <Real T>
void reduce_in_rank_order(const std::vector<Tensor<T>>& contributions, Tensor<T> out, Reduction op) {
    std::vector<std::span<const T>> spans;
    for (const auto& c : contributions) spans.emplace_back(c.data(), c.size());
    reduce_in_rank_order<T>(std::span<const std::span<const T>>(spans), std::span<T>(out.data(), out.size()), op);
}

/// The collectives of one group of processes. Non-virtual entry points check their arguments and
/// resolve the timeout (none given: `default_timeout()`), then call the implementation's `do_*`.
class Communicator {
public:
    virtual ~Communicator() = default;

    /// This process's rank in [0, world_size()).
    virtual int rank() const = 0;
    virtual int world_size() const = 0;
    /// What the collectives wait at most when no timeout is passed.
    virtual Timeout default_timeout() const = 0;
    /// "local", "gloo": for messages.
    virtual std::string_view backend_name() const = 0;

    /// Replaces `data` on every rank by the reduction of all ranks' `data` (same size everywhere).
    void allreduce(std::span<float> data, Reduction op = Reduction::sum, std::optional<Timeout> timeout = {}) {
        do_allreduce(data, op, resolve(timeout, "allreduce"));
    }
    void allreduce(std::span<double> data, Reduction op = Reduction::sum, std::optional<Timeout> timeout = {}) {
        do_allreduce(data, op, resolve(timeout, "allreduce"));
    }
    /// In place on a tensor's elements (a handle: the caller's tensor changes).
    template <Real T>
    void allreduce(Tensor<T> tensor, Reduction op = Reduction::sum, std::optional<Timeout> timeout = {}) {
        allreduce(std::span<T>(tensor.data(), tensor.size()), op, timeout);
    }

    /// Copies rank `root`'s bytes into `data` on every other rank (same size everywhere).
    void broadcast(std::span<std::byte> data, int root = 0, std::optional<Timeout> timeout = {}) {
        check(root >= 0 && root < world_size(), "broadcast: root ", root, " is not a rank of a world of ", world_size());
        do_broadcast(data, root, resolve(timeout, "broadcast"));
    }
    template <class T>
        requires std::is_trivially_copyable_v<T>
    void broadcast(std::span<T> data, int root = 0, std::optional<Timeout> timeout = {}) {
        broadcast(std::as_writable_bytes(data), root, timeout);
    }
    template <Real T>
    void broadcast(Tensor<T> tensor, int root = 0, std::optional<Timeout> timeout = {}) {
        broadcast(std::span<T>(tensor.data(), tensor.size()), root, timeout);
    }

    /// Returns on every rank once all ranks have entered it.
    void barrier(std::optional<Timeout> timeout = {}) { do_barrier(resolve(timeout, "barrier")); }

protected:
    virtual void do_allreduce(std::span<float> data, Reduction op, Timeout timeout) = 0;
    virtual void do_allreduce(std::span<double> data, Reduction op, Timeout timeout) = 0;
    virtual void do_broadcast(std::span<std::byte> data, int root, Timeout timeout) = 0;
    virtual void do_barrier(Timeout timeout) = 0;

    /// "allreduce (rank 1 of 2, gloo)": the start of every error message.
    std::string describe(std::string_view operation) const {
        return olmax::detail::concat(operation, " (rank ", rank(), " of ", world_size(), ", ", backend_name(), ")");
    }

private:
    Timeout resolve(std::optional<Timeout> timeout, std::string_view operation) const {
        const Timeout t = timeout.value_or(default_timeout());
        check(t.count() > 0, describe(operation), ": the timeout must be positive, got ", t.count(), " ms");
        return t;
    }
};

/// The group of one process: every collective returns its input (the mean divides by 1, exactly).
class LocalCommunicator final : public Communicator {
public:
    explicit LocalCommunicator(Timeout timeout = std::chrono::seconds(30)) : timeout_(timeout) {}
    int rank() const override { return 0; }
    int world_size() const override { return 1; }
    Timeout default_timeout() const override { return timeout_; }
    std::string_view backend_name() const override { return "local"; }

protected:
    void do_allreduce(std::span<float>, Reduction, Timeout) override {}
    void do_allreduce(std::span<double>, Reduction, Timeout) override {}
    void do_broadcast(std::span<std::byte>, int, Timeout) override {}
    void do_barrier(Timeout) override {}

private:
    Timeout timeout_;
};

}  // namespace olmax::distributed
