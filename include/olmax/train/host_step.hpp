#pragma once
// The step on the host (olmax's kernels): gradient accumulation over micro-batches, each rank
// differentiating its own rows of every global batch, then the ranks' gradients averaged, plainly
// after backward or overlapped with the last backward; optionally AdamW applied inside backward.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "olmax/backend/registry.hpp"
#include "olmax/config/key_value.hpp"
#include "olmax/core/error.hpp"
#include "olmax/core/memory.hpp"
#include "olmax/distributed/data_parallel.hpp"
#include "olmax/distributed/overlapped_allreduce.hpp"
#include "olmax/train/model.hpp"
#include "olmax/train/step.hpp"

namespace olmax::train {

/// The host step's settings, and its keys in a program's config.
struct HostStepOptions {
    std::int64_t grad_accumulation = 1;  ///< micro-batches per optimiser step, each weighted 1 / grad_accumulation
    /// AdamW applied to each parameter as soon as backward has finished its gradient (one process;
    /// with global-norm clipping backward runs twice and grad_accumulation must be 1).
    bool update_in_backward = false;
    bool data_parallel = true;   ///< split each batch's rows over the host threads (one shard each)
    /// With several ranks: exchange gradient buckets during the last backward, from a thread of its
    /// own (distributed::OverlappedAllreduce), instead of all after it. The same result, bit for bit;
    /// measured faster for the tiny preset on 2 processes here, a wash for small (docs/DISTRIBUTED.md).
    bool overlap_allreduce = true;
    double bucket_mb = 25;       ///< MiB of gradients per collective (PyTorch DDP's default)

    static const std::vector<config::Field<HostStepOptions>>& fields() {
        using C = HostStepOptions;
        using config::Field;
        static const std::vector<Field<C>> f{
            Field<C>{"grad_accumulation", &C::grad_accumulation, "micro-batches summed per optimiser step"}.in(1, 1 << 16),
            Field<C>{"update_in_backward", &C::update_in_backward,
                     "apply AdamW to each parameter (each layer's slice of the stacked ones) as soon as backward has finished its "
                     "gradient, and drop it: the gradients of the whole model never exist at once (the same numbers as the separate "
                     "step; with max_grad_norm > 0 backward runs twice, the first run measuring the norm, and needs grad_accumulation=1; "
                     "one process and the CPU path)"},
            Field<C>{"data_parallel", &C::data_parallel,
                     "with several threads, split each batch's rows over them (one forward/backward per thread) instead of each op"},
            Field<C>{"overlap_allreduce", &C::overlap_allreduce,
                     "with world_size > 1, send each bucket of gradients to the other processes as soon as backward has finished it, "
                     "from a thread of its own, instead of all after backward (the same result, bit for bit; docs/DISTRIBUTED.md)"},
            Field<C>{"bucket_mb", &C::bucket_mb, "with world_size > 1, MiB of gradients exchanged per collective (smaller: more "
                                                 "collectives, each of which can start earlier with --overlap_allreduce)"}.greater_than(0).at_most(1e6),
        };
        return f;
    }
};

/// Row shards per batch: one per host thread with `data_parallel` (the model's accumulate_gradients).
inline std::size_t shards_for(const HostStepOptions& o) {
    return o.data_parallel ? std::size_t(std::max(backend::host_kernels().num_threads(), 1)) : 1;
}

template <TrainableModel Model>
class HostStep final : public StepStrategy<Model> {
public:
    using T = typename Model::value_type;

    explicit HostStep(HostStepOptions options) : options_(options) {
        check<value_error>(options_.grad_accumulation >= 1, "train::HostStep: grad_accumulation must be at least 1, got ",
                           options_.grad_accumulation);
        check<value_error>(options_.bucket_mb > 0, "train::HostStep: bucket_mb must be positive, got ", options_.bucket_mb);
    }

    std::string prepare(StepContext<Model> context) override {
        context_.emplace(context);
        check<value_error>(!options_.update_in_backward || context.comm.world_size() == 1,
                           "train::HostStep: update_in_backward needs one process (gradients are exchanged before any update), got ",
                           context.comm.world_size());
        check<value_error>(!options_.update_in_backward || context.optimizer.config().max_grad_norm == 0 || options_.grad_accumulation == 1,
                           "train::HostStep: update_in_backward with global-norm clipping runs backward twice and cannot keep earlier "
                           "micro-batches' gradients: needs grad_accumulation=1, got ", options_.grad_accumulation);
        tensors_ = distributed::tensors_of(context.optimizer.parameters());
        buckets_ = distributed::BucketOptions{std::max<std::size_t>(1, std::size_t(options_.bucket_mb * double(1 << 20))), {}};
        if (options_.overlap_allreduce && context.comm.world_size() > 1)
            reducer_.emplace(context.comm, tensors_, distributed::Reduction::mean, distributed::OverlapOptions{buckets_});
        shards_ = shards_for(options_);  // counted now: the program has set the thread count
        return {};
    }

    std::int64_t micro_batches() const override { return options_.grad_accumulation; }

    StepLoss compute(const std::function<data::Batch()>& next_batch) override {
        check(context_.has_value(), "train::HostStep: compute before prepare");
        // Named references, not a structured binding: lambdas capture them (clang < 16 cannot).
        auto& model = context_->model;
        auto& optimizer = context_->optimizer;
        auto& comm = context_->comm;
        const auto n = options_.grad_accumulation;
        double loss_sum = 0, exchange_seconds = 0;
        for (std::int64_t micro = 0; micro < n; ++micro) {
            const data::Batch batch = own_rows(next_batch(), comm);
            const bool last = micro + 1 == n;
            auto backward = [&] { return model.accumulate_gradients(batch, shards_, 1.0 / double(n)); };
            if (options_.update_in_backward && last) {
                double loss = 0;
                optimizer.step_during_backward([&] { loss = backward(); });
                loss_sum += loss;
            } else if (reducer_ && last) {
                loss_sum += reducer_->overlap(backward);  // gradients are final in the last micro-batch only
                exchange_seconds += reducer_->finish_seconds();  // what backward did not hide
            } else {
                loss_sum += backward();
            }
        }
        if (!reducer_ && comm.world_size() > 1) {
            const auto started = std::chrono::steady_clock::now();
            distributed::allreduce_gradients(comm, tensors_, distributed::Reduction::mean, buckets_);
            exchange_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        }
        return {loss_sum / double(n), std::nullopt, exchange_seconds};
    }

    void update() override {
        auto& optimizer = context_->optimizer;
        if (!options_.update_in_backward) optimizer.step();
        optimizer.zero_grad();
    }

    /// The tensor peak (what an XLA step's memory plan compares with), and the overlapped exchange's buckets.
    std::string summary() const override {
        char line[240];
        std::snprintf(line, sizeof line, "tensor memory at its peak: %.1f MiB (olmax's allocator)", double(memory::stats().peak_bytes) / 1048576.0);
        std::string said = line;
        if (!reducer_) return said;
        std::snprintf(line, sizeof line,
                      "\noverlapped exchange: %zu bucket(s) per step (at most %.3g MiB, split where gradients became final apart), "
                      "%zu sent before backward ended in the last step",
                      reducer_->buckets().size(), options_.bucket_mb, reducer_->reduced_during_backward());
        return said + line;
    }

private:
    /// This rank's equal share of a global batch's rows (so the mean of the ranks' mean gradients
    /// is the batch's).
    static data::Batch own_rows(data::Batch batch, distributed::Communicator& comm) {
        const std::size_t ranks = std::size_t(comm.world_size()), rank = std::size_t(comm.rank());
        if (ranks == 1) return batch;
        const std::size_t rows = batch.inputs.shape()[0];
        check<value_error>(rows % ranks == 0, "train::HostStep: a batch of ", rows, " rows does not split into ", ranks, " equal shares");
        return data::batch_rows(batch, rows * rank / ranks, rows * (rank + 1) / ranks);
    }

    HostStepOptions options_;
    std::optional<StepContext<Model>> context_;
    std::vector<Tensor<T>> tensors_;
    distributed::BucketOptions buckets_;
    std::optional<distributed::OverlappedAllreduce<T>> reducer_;
    std::size_t shards_ = 1;
};

}  // namespace olmax::train
