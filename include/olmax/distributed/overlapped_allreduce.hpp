#pragma once
// The gradient exchange overlapped with the backward pass (PyTorch DDP's bucketed hooks): while
// backward still runs, a worker thread of this process reduces each bucket of gradients over the
// ranks as soon as every gradient in it is final (autodiff::gradient_ready_hook says when), so
// that only what backward finishes last is left to exchange after it.
//
//     dist::OverlappedAllreduce<float> reducer(comm, tensors);    // once; owns a worker thread
//     for (...) {
//         opt.zero_grad();
//         reducer.overlap([&] { loss_of_shard(...).backward(); });  // start, hook, backward, finish
//         opt.step();
//     }
//
// Result contract: exactly `allreduce_gradients(comm, parameters, op, options)` (data_parallel.hpp),
// bit for bit on every rank: the same element-wise reduction of the same gradients, the same
// has-gradient flags (a parameter no rank had a gradient for keeps none; one that some ranks had
// gets zeros from the others). Buckets change only which elements travel together.
//
// Collective order: every rank must make the same collectives in the same order with the same
// sizes, but ranks need not see their gradients become final in the same order (threads, data-
// dependent graphs). So the worker reduces buckets strictly in the order of a plan that depends
// on nothing a rank observes alone: at first the reverse of the parameter list (gradients of the
// last-used parameters are final first, DDP's initial guess); after the first step, the order in
// which rank 0 saw its gradients become final, with a bucket boundary wherever it saw a gap
// (OverlapOptions::split_gap), broadcast once to every rank (DDP rebuilds its buckets from the
// order it observed too). A rank whose order differs from the plan waits for the bucket in turn;
// that costs overlap, never correctness. The has-gradient flags travel in the last bucket, the
// first one at which all of them are known.
//
// Threads: the worker owns the communicator from `start()` to `finish()`; nothing else may use it
// meanwhile. `ready(i)` may be called from any thread (data_parallel_backward's shards call it).
// A collective that fails or times out on the worker is rethrown by `finish()` on the caller's
// thread; the reducer and the communicator are then unusable (restart from a checkpoint). A step
// abandoned midway (backward threw) leaves the ranks out of step: the others fail at their
// timeout, and this reducer refuses further steps.

#include <algorithm>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "olmax/autodiff/gradient_hooks.hpp"
#include "olmax/autodiff/gradient_sink.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/distributed/communicator.hpp"
#include "olmax/distributed/data_parallel.hpp"

namespace olmax::distributed {

struct OverlapOptions {
    /// Bucket size cap and collective timeout, as for allreduce_gradients.
    BucketOptions buckets;
    /// The learned plan also ends a bucket where rank 0 saw more than this pass between two
    /// gradients becoming final in the first step: a bucket waits for its last gradient, so one
    /// that mixes early and late ones cannot start early. (A model whose gradients are final in
    /// groups, such as olmax's stacked layers, then gets a bucket per group.) None: by bytes only.
    std::optional<std::chrono::microseconds> split_gap = std::chrono::milliseconds(2);
};

template <Real T>
class OverlappedAllreduce {
public:
    /// `parameters`: every trainable tensor, in the same order on every rank (as for
    /// `allreduce_gradients`). Starts the worker thread when the world has more than one rank.
    OverlappedAllreduce(Communicator& comm, std::vector<Tensor<T>> parameters, Reduction op = Reduction::mean, OverlapOptions options = {})
        : comm_(comm), params_(std::move(parameters)), op_(op), options_(options.buckets), split_gap_(options.split_gap),
          ready_(params_.size(), 0) {
        for (const auto& p : params_)
            check<autodiff_error>(p.defined() && p.is_leaf() && p.requires_grad(),
                                  "OverlappedAllreduce: every parameter must be a defined leaf tensor that requires grad");
        check(options_.bucket_bytes > 0, "OverlappedAllreduce: bucket_bytes must be positive");
        std::vector<std::size_t> order(params_.size());
        for (std::size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
        plan(std::move(order), std::vector<bool>(params_.size(), false));
        if (comm_.world_size() > 1) worker_ = std::thread([this] { work(); });
    }
    ~OverlappedAllreduce() {
        {
            std::lock_guard lock(mutex_);
            stop_ = true;
        }
        changed_.notify_all();
        if (worker_.joinable()) worker_.join();  // at most the collective in flight, bounded by its timeout
    }
    OverlappedAllreduce(const OverlappedAllreduce&) = delete;
    OverlappedAllreduce& operator=(const OverlappedAllreduce&) = delete;

    /// Runs `backward()` (the step's last backward pass) with the exchange overlapped: `start()`, a
    /// gradient_ready_hook over the parameters, `backward()`, `finish()`. Returns what it returns.
    /// If it throws, the step is abandoned (see the header) and the exception passes through.
    template <class F>
        requires std::invocable<F&>
    std::invoke_result_t<F&> overlap(F&& backward) {
        using R = std::invoke_result_t<F&>;
        start();
        std::optional<std::conditional_t<std::is_void_v<R>, int, R>> result;
        try {
            autodiff::gradient_ready_hook<T> hook(params_, [this](std::size_t i) { ready(i); });
            if constexpr (std::is_void_v<R>) backward();
            else result.emplace(backward());
        } catch (...) {
            abandon();
            throw;
        }
        finish();
        if constexpr (!std::is_void_v<R>) return std::move(*result);
    }

    /// A step begins: from now on the worker reduces buckets as their gradients are reported final.
    void start() {
        std::lock_guard lock(mutex_);
        check<distributed_error>(!broken_, "OverlappedAllreduce: unusable since an earlier step failed or was abandoned");
        check<value_error>(!in_step_, "OverlappedAllreduce: start() during a step (finish() it first)");
        std::fill(ready_.begin(), ready_.end(), 0);
        for (std::size_t b = 0; b < buckets_.size(); ++b) missing_[b] = buckets_[b].last - buckets_[b].first;
        ready_count_ = next_bucket_ = 0;
        observed_.clear();
        observed_at_.clear();
        in_step_ = true;
    }

    /// Parameter `i`'s gradient is final for this step (any thread). Reporting one twice in a step
    /// is an error: its bucket may already be on its way.
    void ready(std::size_t i) {
        {
            std::lock_guard lock(mutex_);
            check<value_error>(in_step_, "OverlappedAllreduce: ready(", i, ") outside a step (call start() first)");
            check<value_error>(i < params_.size(), "OverlappedAllreduce: ready(", i, "): there are ", params_.size(), " parameters");
            check<autodiff_error>(!ready_[i], "OverlappedAllreduce: parameter ", i,
                                  " was reported final twice in one step (two backward passes under one hook? overlap only the last)");
            mark_ready(i);
        }
        changed_.notify_all();
    }

    /// Backward is over: every gradient is final. Waits for the remaining buckets (bounded by the
    /// collectives' timeout), rethrows the worker's failure, and applies the has-gradient flags.
    /// After the first step, agrees on the bucket order for the next ones (one broadcast).
    void finish() {
        const auto started = std::chrono::steady_clock::now();
        struct timed {
            std::chrono::steady_clock::time_point started;
            double& seconds;
            ~timed() { seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(); }
        } timing{started, finish_seconds_};
        std::unique_lock lock(mutex_);
        check<value_error>(in_step_, "OverlappedAllreduce: finish() without start()");
        reported_early_ = ready_count_;
        reduced_early_ = next_bucket_;
        for (std::size_t i = 0; i < params_.size(); ++i)
            if (!ready_[i]) mark_ready(i);
        changed_.notify_all();
        done_.wait(lock, [&] { return error_ || next_bucket_ == buckets_.size() || comm_.world_size() == 1; });
        in_step_ = false;
        if (error_) {
            broken_ = true;
            std::rethrow_exception(error_);
        }
        if (comm_.world_size() == 1) return;  // as allreduce_gradients: one contribution is the result
        for (std::size_t i = 0; i < params_.size(); ++i)
            if (sidecar_[i] == T{0}) params_[i].zero_grad();  // no rank had a gradient: keep none, as one process would
        if (!learned_) learn();
    }

    /// Gives up the step in flight (backward failed): waits until the worker is out of its
    /// collective, then refuses further steps. Peers waiting for this rank's buckets time out.
    void abandon() {
        std::unique_lock lock(mutex_);
        if (!in_step_) return;
        in_step_ = false;
        broken_ = true;
        done_.wait(lock, [&] { return !busy_; });
    }

    /// Of the last finished step: the gradients reported final before `finish()`, and the buckets
    /// already reduced by then (the exchange that overlapped backward).
    std::size_t reported_during_backward() const { return reported_early_; }
    std::size_t reduced_during_backward() const { return reduced_early_; }
    /// Buckets of the step in flight reduced so far (any thread).
    std::size_t buckets_reduced() const {
        std::lock_guard lock(mutex_);
        return next_bucket_;
    }
    /// Seconds the last `finish()` took: the part of the exchange that backward did not hide.
    double finish_seconds() const { return finish_seconds_; }

    /// The current plan: parameter indices in bucket order, and each bucket's [first, last) in it
    /// (the last bucket also carries the has-gradient flags).
    const std::vector<std::size_t>& order() const { return order_; }
    std::vector<std::pair<std::size_t, std::size_t>> buckets() const {
        std::vector<std::pair<std::size_t, std::size_t>> out;
        for (const auto& b : buckets_) out.emplace_back(b.first, b.last);
        return out;
    }

private:
    struct Bucket {
        std::size_t first, last;  // in order_
        bool flags;               // carries the has-gradient flags (the last bucket)
    };

    /// After the first step (on every rank, all buckets done): rank 0's order of final gradients
    /// and where it saw gaps, broadcast in one collective (the top bit of an entry: a new group).
    void learn() {
        learned_ = true;
        constexpr std::uint64_t group_bit = std::uint64_t(1) << 63;
        std::vector<std::uint64_t> message(observed_.size());
        for (std::size_t k = 0; k < observed_.size(); ++k) {
            const bool gap = k > 0 && split_gap_ && observed_at_[k] - observed_at_[k - 1] > *split_gap_;
            message[k] = std::uint64_t(observed_[k]) | (gap ? group_bit : 0);
        }
        try {
            comm_.broadcast(std::span<std::uint64_t>(message), 0, options_.timeout);
        } catch (...) {
            broken_ = true;
            throw;
        }
        std::vector<bool> seen(params_.size(), false), starts(params_.size(), false);
        std::vector<std::size_t> order;
        for (std::size_t k = 0; k < message.size(); ++k) {
            const std::uint64_t i = message[k] & ~group_bit;
            check<distributed_error>(i < params_.size() && !seen[i], "OverlappedAllreduce: rank 0's bucket order is not a permutation of ",
                                     params_.size(), " parameters (do all ranks list the same parameters?)");
            seen[i] = true;
            starts[k] = (message[k] & group_bit) != 0;
            order.push_back(std::size_t(i));
        }
        plan(std::move(order), std::move(starts));
    }

    /// Buckets over `order` of at most bucket_bytes, none across a group start; the flags last.
    void plan(std::vector<std::size_t> order, const std::vector<bool>& group_starts) {
        order_ = std::move(order);
        buckets_.clear();
        bucket_of_.assign(params_.size(), 0);
        std::size_t group = 0;
        for (std::size_t k = 1; k <= order_.size(); ++k) {
            if (k < order_.size() && !group_starts[k]) continue;
            std::vector<std::size_t> sizes;  // group [group, k)
            for (std::size_t j = group; j < k; ++j) sizes.push_back(params_[order_[j]].size());
            for (const auto& [first, last] : plan_buckets(sizes, sizeof(T), options_.bucket_bytes)) {
                buckets_.push_back({group + first, group + last, false});
                for (std::size_t j = group + first; j < group + last; ++j) bucket_of_[order_[j]] = buckets_.size() - 1;
            }
            group = k;
        }
        // The flags ride with the last bucket when they fit it, else alone.
        const std::size_t flag_bytes = params_.size() * sizeof(T);
        std::size_t last_bytes = 0;
        if (!buckets_.empty())
            for (std::size_t j = buckets_.back().first; j < buckets_.back().last; ++j) last_bytes += params_[order_[j]].size() * sizeof(T);
        if (buckets_.empty() || last_bytes + flag_bytes > options_.bucket_bytes) buckets_.push_back({order_.size(), order_.size(), true});
        else buckets_.back().flags = true;
        missing_.assign(buckets_.size(), 0);
    }

    void mark_ready(std::size_t i) {  // under mutex_
        ready_[i] = 1;
        observed_.push_back(i);
        observed_at_.push_back(std::chrono::steady_clock::now());
        ++ready_count_;
        --missing_[bucket_of_[i]];
    }

    bool bucket_ready(std::size_t b) const {  // under mutex_
        return missing_[b] == 0 && (!buckets_[b].flags || ready_count_ == params_.size());
    }

    /// The worker thread's body: nothing escapes it. A failure outside the collective (none is
    /// expected) ends the worker like a failed collective: the caller's finish() rethrows it.
    void work() noexcept {
        try {
            work_until_stopped();
        } catch (...) {
            std::lock_guard lock(mutex_);
            busy_ = false;
            if (!error_) error_ = std::current_exception();
            done_.notify_all();
        }
    }

    void work_until_stopped() {
        std::unique_lock lock(mutex_);
        for (;;) {
            changed_.wait(lock, [&] { return stop_ || (in_step_ && !error_ && next_bucket_ < buckets_.size() && bucket_ready(next_bucket_)); });
            if (stop_) return;
            const std::size_t b = next_bucket_;
            busy_ = true;
            lock.unlock();
            std::exception_ptr failure;
            try {
                reduce(buckets_[b]);
            } catch (...) {
                failure = std::current_exception();
            }
            lock.lock();
            busy_ = false;
            if (failure) error_ = failure;
            else ++next_bucket_;
            done_.notify_all();
        }
    }

    /// One collective: the bucket's gradients (zeros for a missing one) and, in the last, the flags.
    void reduce(const Bucket& bucket) {
        if (sidecar_.size() != params_.size()) sidecar_.assign(params_.size(), T{0});
        std::vector<Tensor<T>> grads;
        for (std::size_t k = bucket.first; k < bucket.last; ++k) {
            Tensor<T> p = params_[order_[k]];
            sidecar_[order_[k]] = p.grad().defined() ? T{1} : T{0};
            if (!p.grad().defined()) {
                device_scope on(p.device());
                autodiff::accumulate_grad(olmax::detail::impl_of(p), zeros<T>(p.shape()), "OverlappedAllreduce");
            }
            grads.push_back(p.grad());
        }
        if (grads.size() == 1 && !bucket.flags) {  // alone: in place, as allreduce_gradients does
            comm_.allreduce(std::span<T>(grads[0].data(), grads[0].size()), op_, options_.timeout);
            return;
        }
        std::size_t total = bucket.flags ? sidecar_.size() : 0;
        for (const auto& g : grads) total += g.size();
        flat_.resize(total);
        std::size_t at = 0;
        for (const auto& g : grads) {
            std::copy_n(g.data(), g.size(), flat_.data() + at);
            at += g.size();
        }
        if (bucket.flags) std::copy(sidecar_.begin(), sidecar_.end(), flat_.data() + at);
        comm_.allreduce(std::span<T>(flat_.data(), total), op_, options_.timeout);
        at = 0;
        for (auto& g : grads) {
            std::copy_n(flat_.data() + at, g.size(), g.data());
            at += g.size();
        }
        if (bucket.flags) std::copy_n(flat_.data() + at, sidecar_.size(), sidecar_.begin());
    }

    Communicator& comm_;
    std::vector<Tensor<T>> params_;
    Reduction op_;
    BucketOptions options_;
    // The plan (changed only between steps).
    std::vector<std::size_t> order_, bucket_of_;
    std::vector<Bucket> buckets_;
    bool learned_ = false;
    std::optional<std::chrono::microseconds> split_gap_;
    double finish_seconds_ = 0;
    // The step, under mutex_.
    mutable std::mutex mutex_;
    std::condition_variable changed_, done_;  // worker: something to do; caller: a bucket done or the worker idle
    std::vector<char> ready_;
    std::vector<std::size_t> missing_, observed_;
    std::vector<std::chrono::steady_clock::time_point> observed_at_;
    std::size_t ready_count_ = 0, next_bucket_ = 0, reported_early_ = 0, reduced_early_ = 0;
    bool in_step_ = false, busy_ = false, stop_ = false, broken_ = false;
    std::exception_ptr error_;
    // The worker's buffers.
    std::vector<T> sidecar_, flat_;
    std::thread worker_;
};

}  // namespace olmax::distributed
