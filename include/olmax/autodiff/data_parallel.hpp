#pragma once
// Data parallelism over the threads of one process: the shards of a batch are differentiated at
// the same time, one graph per thread.
//
// Why: a small model's ops (a [512, 64] activation, a 64 x 128 GEMM) are too short to split across
// threads one at a time; every op's fork-join then costs about as much as it saves, and a thread
// descheduled by a busy machine stalls every op. Splitting the batch instead gives each thread a
// whole forward and backward with one fork-join per step, and the ops inside run serially (the
// OpenMP backend and Eigen go serial inside a parallel region).
//
// Each thread records on its own tape (tapes are per thread). The only shared mutable state is the
// parameters' gradients: shard 0 adds into them directly, every other shard into private buffers
// (`private_gradients`), which are added to the parameters after all shards finished, in shard
// order. The result is therefore the same for a given shard count whatever the thread count or
// scheduling, and equal up to rounding to differentiating the shards one after another.
//
// With a `gradient_ready_hook` on the calling thread (gradient_hooks.hpp; a reducer that overlaps
// the exchange with backward), each shard reports its own parameters as they become final; the
// shard that finishes a parameter last adds the private gradients into it, in shard order (the
// same additions as without the hook, so bit for bit the same result), and tells the hook. The
// sum then happens during backward instead of after it.

#include <algorithm>
#include <cstddef>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "olmax/autodiff/gradient_hooks.hpp"
#include "olmax/autodiff/gradient_sink.hpp"
#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/core/tensor.hpp"

namespace olmax::autodiff {

/// Differentiates `shard_loss(s)` for every shard s in [0, shards), as if by
///
///     for (s = 0; s < shards; ++s) { tape_scope t; auto loss = shard_loss(s); loss.backward(); }
///
/// but with the shards spread over the threads of the parameters' device's kernels (contiguous runs
/// of shards per thread; each shard's own ops then run on one thread).
/// `shard_loss` must return a scalar loss built only from `parameters` and its own data; it runs on
/// several threads at once, so it must not modify shared state. Gradients are accumulated into
/// `parameters`' `grad()` (added to what is there, as `backward()` does); gradients reaching any
/// other shared tensor are not supported (list every trainable tensor). Returns each shard's loss
/// value. An exception thrown by a shard is rethrown here (the lowest shard's first), after all
/// shards stopped; the parameters' gradients are then unspecified. Under a gradient_ready_hook on
/// the calling thread, each parameter is reported to it once every shard has finished it and the
/// shard gradients are summed (see the top of this file).
template <Real T, class ShardLoss>
    requires std::invocable<ShardLoss&, std::size_t> && std::same_as<std::invoke_result_t<ShardLoss&, std::size_t>, Tensor<T>>
std::vector<double> data_parallel_backward(std::span<const Tensor<T>> parameters, std::size_t shards, ShardLoss&& shard_loss) {
    check<value_error>(shards >= 1, "data_parallel_backward: shards must be at least 1");
    backend::op_scope on("data_parallel_backward", parameters);
    for (const auto& p : parameters)
        check<autodiff_error>(p.defined() && p.is_leaf() && p.requires_grad(),
                              "data_parallel_backward: every listed parameter must be a defined leaf tensor that requires grad");
    std::vector<double> losses(shards, 0.0);
    std::vector<std::exception_ptr> errors(shards);
    // private_grads[s][i]: shard s's gradient for parameters[i] (s >= 1; undefined if none).
    std::vector<std::vector<Tensor<T>>> private_grads(shards, std::vector<Tensor<T>>(parameters.size()));
    // Sums shard 1.. into parameter i's own gradient, in shard order (shard 0 added there directly).
    auto sum_shards = [&](std::size_t i) {
        for (std::size_t s = 1; s < shards; ++s)
            if (private_grads[s][i].defined()) accumulate_grad(olmax::detail::impl_of(parameters[i]), std::move(private_grads[s][i]), "data_parallel_backward");
    };

    // The caller's gradient hook, if any: parameter i is final for it once every shard finished it.
    gradient_ready_hook<T>* const outer = gradient_ready_hook<T>::active();
    std::vector<std::size_t> hook_index(parameters.size(), std::size_t(-1));  // parameter -> the outer hook's leaf index
    std::vector<std::size_t> shards_done(parameters.size(), 0);
    std::mutex count_mutex, notify_mutex;
    if (outer) {
        std::unordered_map<const void*, std::size_t> leaf_of;
        for (std::size_t j = 0; j < outer->leaves().size(); ++j) leaf_of.emplace(&olmax::detail::impl_of(outer->leaves()[j]), j);
        std::vector<bool> covered(outer->leaves().size(), false);
        for (std::size_t i = 0; i < parameters.size(); ++i)
            if (const auto it = leaf_of.find(&olmax::detail::impl_of(parameters[i])); it != leaf_of.end()) {
                hook_index[i] = it->second;
                covered[it->second] = true;
            }
        for (std::size_t j = 0; j < covered.size(); ++j)  // not a parameter here: no gradient reaches it
            if (!covered[j]) outer->notify(j);
    }
    // Final slices (offer_final_slice: a reversible stack's layer slices of a stacked parameter),
    // when the caller's hook takes them and the parameter had no gradient before: each shard's part
    // waits in `pending` until every shard has handed its part in; the sum in shard order (as
    // sum_shards adds) goes to the caller's hook, or into the parameter's gradient if it declines.
    // A completed slice is queued; a shard thread handing in a part delivers one queued slice when
    // no other thread is delivering (never waiting for it), so no thread queues behind another.
    std::vector<bool> sliceable(parameters.size(), false);
    if (outer && outer->takes_slices())
        for (std::size_t i = 0; i < parameters.size(); ++i) sliceable[i] = hook_index[i] != std::size_t(-1) && !parameters[i].grad().defined();
    struct Completed {
        std::size_t parameter, offset;
        std::vector<Tensor<T>> parts;
    };
    std::map<std::pair<std::size_t, std::size_t>, std::vector<Tensor<T>>> pending;  // (parameter, offset) -> part of each shard
    std::vector<Completed> completed;                                               // waiting for a thread to deliver them
    std::mutex pending_mutex;
    auto deliver = [&](const Completed& c) {  // holds notify_mutex
        Tensor<T> total;
        bool copied = false;  // total is a copy (a shard's tensor is not written into)
        for (const auto& part : c.parts) {
            if (!part.defined()) continue;  // a shard whose graph did not reach this slice
            if (!total.defined()) {
                total = part;
                continue;
            }
            if (!copied) total = total.clone(), copied = true;
            T* sum = total.data();
            backend::map(total.size(), sum, [](T a, T b) { return a + b; }, static_cast<const T*>(sum), part.data());
        }
        if (!total.defined() || outer->take_slice(hook_index[c.parameter], c.offset, total)) return;
        typename private_gradients<T>::suspend own;
        accumulate_grad_slice(olmax::detail::impl_of(parameters[c.parameter]), c.offset, total);
    };
    // Pops a queued slice (of `parameter` when given, else the oldest). Popping and delivering happen
    // under notify_mutex, so a parameter is reported final only after all its slices are delivered.
    auto pop_completed = [&](std::size_t parameter) {
        std::optional<Completed> next;
        std::lock_guard lock(pending_mutex);
        const auto it = parameter == std::size_t(-1) ? completed.begin()
                                                     : std::find_if(completed.begin(), completed.end(),
                                                                    [&](const Completed& c) { return c.parameter == parameter; });
        if (it != completed.end()) {
            next = std::move(*it);
            completed.erase(it);
        }
        return next;
    };
    auto shard_slice = [&](std::size_t s, std::size_t i, std::size_t offset, const Tensor<T>& grad) {
        if (!sliceable[i]) return false;
        {
            std::lock_guard lock(pending_mutex);
            std::vector<Tensor<T>>& waiting = pending[{i, offset}];
            if (waiting.empty()) waiting.resize(shards);
            check<autodiff_error>(!waiting[s].defined(), "data_parallel_backward: shard ", s, " handed in the gradient of elements ", offset,
                                  ".. of parameter ", i, " twice");
            waiting[s] = grad;
            if (std::count_if(waiting.begin(), waiting.end(), [](const Tensor<T>& t) { return t.defined(); }) == std::ptrdiff_t(shards)) {
                completed.push_back(Completed{i, offset, std::move(waiting)});
                pending.erase({i, offset});
            }
        }
        if (std::unique_lock lock(notify_mutex, std::try_to_lock); lock.owns_lock())
            while (auto next = pop_completed(std::size_t(-1))) deliver(*next);
        return true;
    };

    // Shard s finished parameter i (under a gradient hook, on the shard's thread).
    auto shard_finished = [&](std::size_t s, std::size_t i, const private_gradients<T>* redirect) {
        if (redirect) private_grads[s][i] = redirect->grad(parameters[i]);
        {
            std::lock_guard lock(count_mutex);  // also publishes private_grads[s][i] to the last shard
            if (++shards_done[i] < shards) return;
        }
        typename private_gradients<T>::suspend own;  // add into the parameter's own gradient, not this shard's buffer
        sum_shards(i);
        if (hook_index[i] != std::size_t(-1)) {
            {
                std::lock_guard lock(pending_mutex);  // slices some shard never handed in: what the others did
                for (auto it = pending.lower_bound({i, 0}); it != pending.end() && it->first.first == i; it = pending.erase(it))
                    completed.push_back(Completed{i, it->first.second, std::move(it->second)});
            }
            std::lock_guard lock(notify_mutex);
            while (auto next = pop_completed(i)) deliver(*next);  // every slice of parameter i before it is reported final
            outer->notify(hook_index[i]);
        }
    };

    auto run_shard = [&](std::size_t s) {
        try {
            std::optional<private_gradients<T>> redirect;
            if (s > 0) redirect.emplace(parameters);
            {
                tape_scope tape;
                std::optional<gradient_ready_hook<T>> hook;  // this shard's own: the caller's does not see shard passes
                if (outer) {
                    typename gradient_ready_hook<T>::SliceCallback slices;  // none unless the caller takes them
                    if (outer->takes_slices())
                        slices = [&, s](std::size_t i, std::size_t offset, const Tensor<T>& grad) { return shard_slice(s, i, offset, grad); };
                    hook.emplace(parameters, [&, s](std::size_t i) { shard_finished(s, i, redirect ? &*redirect : nullptr); }, std::move(slices));
                }
                Tensor<T> loss = shard_loss(s);
                check<shape_error>(loss.size() == 1, "data_parallel_backward: shard ", s, " returned a loss of shape ",
                                   to_string(loss.shape()), "; expected a scalar");
                losses[s] = double(loss.item());
                loss.backward();
            }
            if (redirect && !outer)
                for (std::size_t i = 0; i < parameters.size(); ++i) private_grads[s][i] = redirect->grad(parameters[i]);
        } catch (...) {
            errors[s] = std::current_exception();
        }
    };
    // Work per item: large enough that the backend always splits the shards over its threads.
    backend::current().parallel_for(shards, std::numeric_limits<std::size_t>::max() / shards, [&](std::size_t begin, std::size_t end) {
        for (std::size_t s = begin; s < end; ++s) run_shard(s);
    });
    for (const auto& e : errors)
        if (e) std::rethrow_exception(e);
    if (!outer)
        for (std::size_t i = 0; i < parameters.size(); ++i) sum_shards(i);
    return losses;
}

/// Convenience overload for a vector or array of parameters.
template <Real T, class ShardLoss>
std::vector<double> data_parallel_backward(const std::vector<Tensor<T>>& parameters, std::size_t shards, ShardLoss&& shard_loss) {
    return data_parallel_backward<T>(std::span<const Tensor<T>>(parameters), shards, std::forward<ShardLoss>(shard_loss));
}

}  // namespace olmax::autodiff
