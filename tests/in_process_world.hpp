#pragma once
// A world of N ranks inside one process, one thread per rank, for unit tests of code written
// against distributed::Communicator (agreement, stop votes). Its collectives are exact (allreduce
// by reduce_in_rank_order) and strict: every rank must make the same kind of collective with the
// same size and root, or every rank's collective throws `mismatch` and the world remembers it, so a
// test can assert that some code never asks the ranks for differently sized messages (what makes
// Gloo abort a process).
#include <olmax/distributed/communicator.hpp>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace olmax_test {

class InProcessWorld {
public:
    /// Every rank's collectives disagreed in kind, size or root.
    struct mismatch : std::runtime_error {
        using std::runtime_error::runtime_error;
    };

    explicit InProcessWorld(int size) : size_(size), arrived_(std::size_t(size)) {}

    class Rank final : public olmax::distributed::Communicator {
    public:
        Rank(InProcessWorld& world, int rank) : world_(world), rank_(rank) {}
        int rank() const override { return rank_; }
        int world_size() const override { return world_.size_; }
        olmax::distributed::Timeout default_timeout() const override { return std::chrono::seconds(10); }
        std::string_view backend_name() const override { return "in-process"; }

    protected:
        void do_allreduce(std::span<float> data, olmax::distributed::Reduction op, olmax::distributed::Timeout t) override {
            world_.collective(rank_, {kind_of<float>(op), data.data(), data.size_bytes(), -1}, t);
        }
        void do_allreduce(std::span<double> data, olmax::distributed::Reduction op, olmax::distributed::Timeout t) override {
            world_.collective(rank_, {kind_of<double>(op), data.data(), data.size_bytes(), -1}, t);
        }
        void do_broadcast(std::span<std::byte> data, int root, olmax::distributed::Timeout t) override {
            world_.collective(rank_, {"broadcast", data.data(), data.size(), root}, t);
        }
        void do_barrier(olmax::distributed::Timeout t) override { world_.collective(rank_, {"barrier", nullptr, 0, -1}, t); }

    private:
        template <class T>
        static const char* kind_of(olmax::distributed::Reduction op) {
            if constexpr (std::is_same_v<T, float>) return op == olmax::distributed::Reduction::sum ? "allreduce sum float" : "allreduce mean float";
            else return op == olmax::distributed::Reduction::sum ? "allreduce sum double" : "allreduce mean double";
        }
        InProcessWorld& world_;
        int rank_;
    };

    /// Runs `body(comm)` on one thread per rank; returns each rank's exception (null: it returned).
    std::vector<std::exception_ptr> run(const std::function<void(olmax::distributed::Communicator&)>& body) {
        std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size_));
        std::vector<std::thread> threads;
        for (int r = 0; r < size_; ++r)
            threads.emplace_back([&, r] {
                Rank comm(*this, r);
                try {
                    body(comm);
                } catch (...) {
                    errors[std::size_t(r)] = std::current_exception();
                }
            });
        for (auto& t : threads) t.join();
        return errors;
    }

    /// Collectives completed, and whether any of them disagreed between the ranks.
    int collectives() const {
        std::lock_guard lock(mutex_);
        return completed_;
    }
    bool mismatched() const {
        std::lock_guard lock(mutex_);
        return mismatched_;
    }

private:
    struct Call {
        std::string kind;
        void* data;
        std::size_t bytes;
        int root;
    };

    void collective(int rank, Call call, olmax::distributed::Timeout timeout) {
        std::unique_lock lock(mutex_);
        const long generation = generation_;
        arrived_[std::size_t(rank)] = call;
        if (++count_ == size_) {
            complete();
            count_ = 0;
            ++generation_;
            changed_.notify_all();
        } else if (!changed_.wait_for(lock, timeout, [&] { return generation_ != generation; })) {
            throw olmax::distributed::distributed_error("in-process world: a rank did not join the collective");
        }
        if (failed_generation_ == generation) throw mismatch("in-process world: the ranks' collectives differ: " + failure_);
    }

    void complete() {  // under mutex_, every rank arrived
        const Call& first = arrived_[0];
        for (const Call& c : arrived_)
            if (c.kind != first.kind || c.bytes != first.bytes || c.root != first.root) {
                mismatched_ = true;
                failed_generation_ = generation_;
                failure_ = first.kind + " of " + std::to_string(first.bytes) + " bytes vs " + c.kind + " of " + std::to_string(c.bytes) + " bytes";
                return;
            }
        ++completed_;
        if (first.kind == "broadcast") {
            const Call& root = arrived_[std::size_t(first.root)];
            for (const Call& c : arrived_)
                if (&c != &root && c.bytes > 0) std::memcpy(c.data, root.data, c.bytes);
        } else if (first.kind.find("float") != std::string::npos) {
            reduce<float>(first.kind.find("mean") != std::string::npos);
        } else if (first.kind.find("double") != std::string::npos) {
            reduce<double>(first.kind.find("mean") != std::string::npos);
        }
    }

    template <class T>
    void reduce(bool mean) {
        const std::size_t n = arrived_[0].bytes / sizeof(T);
        std::vector<std::vector<T>> copies;
        std::vector<std::span<const T>> parts;
        for (const Call& c : arrived_) copies.emplace_back(static_cast<const T*>(c.data), static_cast<const T*>(c.data) + n);
        for (const auto& c : copies) parts.emplace_back(c);
        std::vector<T> out(n);
        olmax::distributed::reduce_in_rank_order<T>(parts, out, mean ? olmax::distributed::Reduction::mean : olmax::distributed::Reduction::sum);
        for (const Call& c : arrived_) std::copy(out.begin(), out.end(), static_cast<T*>(c.data));
    }

    const int size_;
    mutable std::mutex mutex_;
    std::condition_variable changed_;
    std::vector<Call> arrived_;
    int count_ = 0, completed_ = 0;
    long generation_ = 0, failed_generation_ = -1;
    bool mismatched_ = false;
    std::string failure_;
};

}  // namespace olmax_test
