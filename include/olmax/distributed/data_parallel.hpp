#pragma once
// Data parallelism across processes: every rank differentiates its own shard of the global batch,
// then `allreduce_gradients` replaces each rank's gradients by their mean over the ranks, so that
// the optimiser steps are identical everywhere. `broadcast_parameters` makes the starting point
// identical (rank 0's initialisation everywhere).
//
// Contract (tests/distributed checks it): N ranks that each run backward on shard r of a batch and
// then `allreduce_gradients` (mean) hold exactly the gradients that one process gets by computing
// the N shard gradients g_0 .. g_{N-1} and combining them with `reduce_in_rank_order` (mean):
// (g_0 + g_1 + ... + g_{N-1}) / N, added in rank order in the parameters' type. Bit for bit, for
// any N and any bucket size: the reduction is element-wise, so how gradients are packed into
// buckets changes what travels together, never the arithmetic.
//
// Buckets: consecutive parameters are packed into one flat buffer of at most `bucket_bytes` (a
// larger parameter travels alone, in place) and reduced with one collective each, as PyTorch's
// DistributedDataParallel does: small tensors would otherwise pay one network latency each.
// `allreduce_gradients` starts after backward has finished; `OverlappedAllreduce`
// (overlapped_allreduce.hpp) gives the same result with each bucket reduced during backward, as
// soon as its last gradient is final (DDP's bucketed hooks), on a thread of its own.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "olmax/autodiff/gradient_sink.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/distributed/communicator.hpp"

namespace olmax::distributed {

struct BucketOptions {
    /// Upper bound of one bucket's payload (PyTorch DDP's default, 25 MiB).
    std::size_t bucket_bytes = std::size_t(25) << 20;
    /// Collective timeout (none: the communicator's default).
    std::optional<Timeout> timeout;
};

/// Consecutive index ranges [first, last) of `sizes` (element counts) whose payloads of
/// `element_bytes` each fit `bucket_bytes`; an element count that alone exceeds it gets its own.
inline std::vector<std::pair<std::size_t, std::size_t>> plan_buckets(std::span<const std::size_t> sizes, std::size_t element_bytes,
                                                                      std::size_t bucket_bytes) {
    check(element_bytes > 0, "plan_buckets: element_bytes must be positive");
    check(bucket_bytes > 0, "plan_buckets: bucket_bytes must be positive");
    std::vector<std::pair<std::size_t, std::size_t>> buckets;
    std::size_t first = 0, bytes = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
        const std::size_t b = sizes[i] * element_bytes;
        if (i > first && bytes + b > bucket_bytes) {
            buckets.emplace_back(first, i);
            first = i, bytes = 0;
        }
        bytes += b;
    }
    if (first < sizes.size()) buckets.emplace_back(first, sizes.size());
    return buckets;
}

namespace detail {

/// Runs `reduce(span)` on every bucket of `tensors`: in place for a bucket of one tensor, else on
/// one flat buffer that the bucket's tensors are copied into before and out of after.
template <Real T, class Reduce>
void for_each_bucket(std::span<Tensor<T>> tensors, std::size_t bucket_bytes, Reduce&& reduce) {
    std::vector<std::size_t> sizes;
    for (const auto& t : tensors) sizes.push_back(t.size());
    std::vector<T> flat;
    for (const auto& [first, last] : plan_buckets(sizes, sizeof(T), bucket_bytes)) {
        if (last - first == 1) {
            reduce(std::span<T>(tensors[first].data(), tensors[first].size()));
            continue;
        }
        std::size_t total = 0;
        for (std::size_t i = first; i < last; ++i) total += sizes[i];
        flat.resize(total);
        std::size_t at = 0;
        for (std::size_t i = first; i < last; ++i) {
            std::copy_n(tensors[i].data(), sizes[i], flat.data() + at);
            at += sizes[i];
        }
        reduce(std::span<T>(flat.data(), total));
        at = 0;
        for (std::size_t i = first; i < last; ++i) {
            std::copy_n(flat.data() + at, sizes[i], tensors[i].data());
            at += sizes[i];
        }
    }
}

}  // namespace detail

/// Replaces every parameter's gradient by its reduction over the ranks (default: the mean),
/// bucket by bucket. Call it on every rank after backward, with the same parameters in the same
/// order. A parameter that no rank gave a gradient keeps none (as a single process would: the
/// optimiser skips it); one that some ranks gave a gradient gets a zero gradient on the others.
///
/// One collective per bucket and nothing else: the per-parameter "has a gradient" flags travel in
/// the first bucket as values of type T (counts, exact). To learn them in the same collective,
/// every rank sends a zero gradient for each parameter it has none for, and afterwards drops the
/// ones no rank had. (A small model fits one bucket, so its exchange is one collective; each
/// collective costs at least a network round trip.)
template <Real T>
void allreduce_gradients(Communicator& comm, std::span<const Tensor<T>> parameters, Reduction op = Reduction::mean,
                         const BucketOptions& options = {}) {
    for (const auto& p : parameters)
        check<autodiff_error>(p.defined() && p.requires_grad(), "allreduce_gradients: every parameter must be a defined tensor that requires grad");
    if (comm.world_size() == 1) return;  // the sum and the mean of one contribution are that contribution, exactly
    // the has_grad flags, reduced with the gradients in the first bucket
    auto sidecar = Tensor<T>::uninitialized({parameters.size()});
    std::vector<Tensor<T>> buffers{sidecar};
    for (std::size_t i = 0; i < parameters.size(); ++i) {
        sidecar.data()[i] = parameters[i].grad().defined() ? T{1} : T{0};
        if (!parameters[i].grad().defined()) {
            device_scope on(parameters[i].device());
            autodiff::accumulate_grad(olmax::detail::impl_of(parameters[i]), zeros<T>(parameters[i].shape()), "allreduce_gradients");
        }
        buffers.push_back(parameters[i].grad());
    }
    detail::for_each_bucket<T>(std::span<Tensor<T>>(buffers), options.bucket_bytes,
                               [&](std::span<T> bucket) { comm.allreduce(bucket, op, options.timeout); });
    for (std::size_t i = 0; i < parameters.size(); ++i)
        if (sidecar.data()[i] == T{0}) {  // no rank had a gradient: keep none, as one process would
            Tensor<T> p = parameters[i];
            p.zero_grad();
        }
}

template <Real T>
void allreduce_gradients(Communicator& comm, const std::vector<Tensor<T>>& parameters, Reduction op = Reduction::mean,
                         const BucketOptions& options = {}) {
    allreduce_gradients<T>(comm, std::span<const Tensor<T>>(parameters), op, options);
}

/// Copies rank `root`'s parameter values into every other rank's parameters (same shapes and
/// order everywhere), bucket by bucket; gradients are left alone. Call it once after building the
/// model so that all ranks start from the same point whatever their random initialisation.
template <Real T>
void broadcast_parameters(Communicator& comm, std::span<const Tensor<T>> parameters, int root = 0, const BucketOptions& options = {}) {
    std::vector<Tensor<T>> tensors;
    for (const auto& p : parameters) {
        check(p.defined(), "broadcast_parameters: a parameter is an undefined tensor");
        tensors.push_back(p);
    }
    check(root >= 0 && root < comm.world_size(), "broadcast_parameters: root ", root, " is not a rank of a world of ", comm.world_size());
    if (comm.world_size() == 1) return;
    detail::for_each_bucket<T>(tensors, options.bucket_bytes, [&](std::span<T> bucket) { comm.broadcast(bucket, root, options.timeout); });
}

template <Real T>
void broadcast_parameters(Communicator& comm, const std::vector<Tensor<T>>& parameters, int root = 0, const BucketOptions& options = {}) {
    broadcast_parameters<T>(comm, std::span<const Tensor<T>>(parameters), root, options);
}

/// The tensors of any list of named parameters (`nn::parameters(model)`, `AdamW::parameters()`):
/// anything whose elements have a `tensor` member.
template <class Named>
    requires requires(const Named& p) { p.tensor; }
auto tensors_of(const std::vector<Named>& named) {
    std::vector<std::remove_cvref_t<decltype(named.front().tensor)>> out;
    for (const auto& p : named) out.push_back(p.tensor);
    return out;
}

}  // namespace olmax::distributed
