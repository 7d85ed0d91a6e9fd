#pragma once
// Where gradients go: `accumulate_grad` adds one gradient into a tensor's gradient buffer,
// `GradientSink` is what a backward closure writes its input gradients into, and
// `private_gradients` redirects the buffers of chosen tensors for one thread (data parallelism).
//
// Gradients are always *added*, never assigned: a tensor used twice receives the sum. The adds run
// on the kernels of the gradient's device (olmax/backend/dispatch.hpp), above their parallel
// threshold on several threads: activation gradients of long sequences are hundreds of megabytes.

#include <algorithm>
#include <memory>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "olmax/backend/dispatch.hpp"
#include "olmax/core/tensor.hpp"

namespace olmax::autodiff {

/// RAII: while alive on this thread, gradients that backward passes add into the listed tensors
/// (typically the parameters) go into buffers of this object instead of the tensors' own `grad()`.
/// Threads that differentiate shards of one batch at the same time each hold one, so none writes
/// the shared parameters' gradients (`data_parallel_backward` sums the buffers afterwards in a fixed
/// order). Intermediate tensors are private to the thread that made them and need no redirect.
template <Real T>
class private_gradients {
public:
    explicit private_gradients(std::span<const Tensor<T>> shared) : previous_(active()) {
        for (const auto& t : shared)
            if (t.defined()) buffers_.emplace(&olmax::detail::impl_of(t), nullptr);
        active() = this;
    }
    ~private_gradients() { active() = previous_; }
    private_gradients(const private_gradients&) = delete;
    private_gradients& operator=(const private_gradients&) = delete;

    /// RAII: while alive, this thread's gradients go to the tensors' own `grad()` again, past every
    /// active scope (a shard thread that adds finished shard gradients into the shared ones).
    class suspend {
    public:
        suspend() : saved_(std::exchange(active(), nullptr)) {}
        ~suspend() { active() = saved_; }
        suspend(const suspend&) = delete;
        suspend& operator=(const suspend&) = delete;

    private:
        private_gradients* saved_;
    };

    /// The gradient collected for `t` (undefined when none arrived or `t` was not listed).
    Tensor<T> grad(const Tensor<T>& t) const {
        const auto it = t.defined() ? buffers_.find(&olmax::detail::impl_of(t)) : buffers_.end();
        if (it == buffers_.end() || !it->second) return {};
        auto impl = std::make_shared<olmax::detail::TensorImpl<T>>();
        impl->storage = it->second;
        impl->device = t.device();
        impl->shape = t.shape();
        return olmax::detail::TensorAccess<T>::from_impl(std::move(impl));
    }

    /// The gradient buffer of `impl` on this thread: a buffer of the innermost active scope that
    /// lists it, else the tensor's own.
    static std::shared_ptr<Storage<T>>& buffer_of(olmax::detail::TensorImpl<T>& impl) {
        for (private_gradients* scope = active(); scope != nullptr; scope = scope->previous_)
            if (const auto it = scope->buffers_.find(&impl); it != scope->buffers_.end()) return it->second;
        return impl.grad;
    }

private:
    static private_gradients*& active() {
        thread_local private_gradients* scope = nullptr;
        return scope;
    }

    private_gradients* previous_;
    std::unordered_map<const olmax::detail::TensorImpl<T>*, std::shared_ptr<Storage<T>>> buffers_;
};

namespace detail {

/// A gradient must have its tensor's shape and live on its tensor's device; `op` names the op whose
/// backward produced it.
template <Real T>
void check_gradient_fits(const olmax::detail::TensorImpl<T>& impl, const Tensor<T>& grad, std::string_view op) {
    if (grad.shape() != impl.shape)
        throw autodiff_error(olmax::detail::concat(op, ": backward produced a gradient of shape ", to_string(grad.shape()),
                                                   " for an input of shape ", to_string(impl.shape),
                                                   " (an input that was broadcast takes its gradient summed back to its own shape: "
                                                   "olmax::sum_to_size(grad, input.shape()))"));
    if (grad.device() != impl.device)
        throw device_error(olmax::detail::concat(op, ": backward produced a gradient on device ", grad.device().name(),
                                                 " for an input on device ", impl.device.name()));
}

}  // namespace detail

/// Adds `grad` into the gradient buffer of `impl` (allocating it on first use). `op` names the op
/// whose backward produced the gradient, for the error a wrong shape or device raises.
template <Real T>
void accumulate_grad(olmax::detail::TensorImpl<T>& impl, const Tensor<T>& grad, std::string_view op) {
    detail::check_gradient_fits(impl, grad, op);
    if (impl.traced || grad.traced()) {  // a traced program: the sum is a value of the program (core/traced.hpp)
        const auto& symbol = olmax::detail::impl_of(grad).symbol;
        const olmax::detail::Tracer* tracer = olmax::detail::active_tracer();
        check<trace_error>(impl.traced && symbol && tracer, op, ": a gradient and its tensor are not both values of the program being traced");
        impl.grad_symbol = impl.grad_symbol ? tracer->add(*impl.grad_symbol, *symbol, impl.shape) : symbol;
        return;
    }
    device_scope on(impl.device);  // the adds run on the tensor's device
    const std::size_t n = grad.size();
    const T* src = grad.data();
    std::shared_ptr<Storage<T>>& buffer = private_gradients<T>::buffer_of(impl);
    if (!buffer) {
        buffer = std::make_shared<Storage<T>>(n);
        backend::map(n, buffer->data(), [](T v) { return v; }, src);
        return;
    }
    T* dst = buffer->data();
    backend::map(n, dst, [](T a, T b) { return a + b; }, static_cast<const T*>(dst), src);
}

/// Same, taking over the buffer of a temporary gradient instead of copying it when nothing else
/// can see that buffer (first gradient to arrive, sole handle, sole owner of the storage).
template <Real T>
void accumulate_grad(olmax::detail::TensorImpl<T>& impl, Tensor<T>&& grad, std::string_view op) {
    detail::check_gradient_fits(impl, grad, op);  // before a buffer is adopted, not only when it is copied
    std::shared_ptr<Storage<T>>& buffer = private_gradients<T>::buffer_of(impl);
    if (!buffer && olmax::detail::impl_ptr_of(grad).use_count() == 1) {
        auto& source = olmax::detail::impl_of(grad);
        if (source.offset == 0 && source.storage && source.storage.use_count() == 1 && source.storage->size() == grad.size()) {
            buffer = std::move(source.storage);
            grad = Tensor<T>();
            return;
        }
    }
    accumulate_grad(impl, static_cast<const Tensor<T>&>(grad), op);
}

/// Adds `grad` into `impl`'s gradient buffer (zero-filled on first use) as runs of `run` contiguous
/// elements, run r at element offset + r * stride. A slice hands back its gradient this way: a slice
/// along any axis without a full-size zero tensor of its own, and without the full-size add that
/// would follow for every further slice of the same tensor (a projection cut into six pieces: one
/// pass over its gradient, not eleven). The first run to arrive is copied, not added to zeros.
template <Real T>
void accumulate_grad_strided(olmax::detail::TensorImpl<T>& impl, const Tensor<T>& grad, std::size_t offset, std::size_t run,
                             std::size_t stride) {
    const std::size_t total = numel(impl.shape), n = grad.size(), runs = run == 0 ? 0 : n / run;
    check<trace_error>(!impl.traced && !grad.traced(), "olmax: a gradient added into a slice of a tensor (accumulate_grad_strided) has no "
                                                       "lowering rule yet");
    check<autodiff_error>(n == 0 || (runs * run == n && (runs == 1 || stride >= run) && offset + (runs - 1) * stride + run <= total),
                          "slice gradient of ", n, " elements in runs of ", run, " every ", stride, " from offset ", offset,
                          " does not fit a tensor of shape ", to_string(impl.shape));
    device_scope on(impl.device);
    std::shared_ptr<Storage<T>>& buffer = private_gradients<T>::buffer_of(impl);  // this thread's, see data_parallel_backward
    const bool first = !buffer;
    if (first) buffer = std::make_shared<Storage<T>>(total);
    T* dst = buffer->data();
    const T* src = grad.data();
    if (first) std::fill_n(dst, n == 0 ? total : offset, T{0});
    backend::current().parallel_for(runs, first ? std::max(stride, run) : run, [=](std::size_t lo, std::size_t hi) {
        for (std::size_t r = lo; r < hi; ++r) {
            T* to = dst + offset + r * stride;
            const T* from = src + r * run;
            if (!first) {
#pragma omp simd
                for (std::size_t i = 0; i < run; ++i) to[i] += from[i];
                continue;
            }
            std::copy_n(from, run, to);
            const std::size_t gap_end = r + 1 < runs ? offset + (r + 1) * stride : total;  // zeros up to the next run
            std::fill(to + run, dst + gap_end, T{0});
        }
    });
}

/// Adds `grad` into elements [offset, offset + grad.size()) of `impl`'s gradient buffer (zero-filled
/// on first use), so a slice hands back its gradient without a full-size tensor of its own (a layer's
/// slice of a stacked parameter, nn::Stack; one stream of a reversible state, nn::take_leading).
template <Real T>
void accumulate_grad_slice(olmax::detail::TensorImpl<T>& impl, std::size_t offset, const Tensor<T>& grad) {
    accumulate_grad_strided(impl, grad, offset, grad.size(), grad.size());
}

/// What a backward closure writes into: one slot per op input, in the order they were recorded.
template <Real T>
class GradientSink {
public:
    GradientSink(std::span<const std::shared_ptr<olmax::detail::TensorImpl<T>>> inputs, std::string_view op, bool last_use = false,
                 std::span<Tensor<T>> grad_outputs = {})
        : inputs_(inputs), op_(op), last_use_(last_use), grad_outputs_(grad_outputs) {}

    std::size_t size() const { return inputs_.size(); }
    /// Whether input `i` wants a gradient (skip the work when it does not).
    bool needs(std::size_t i) const { return i < inputs_.size() && inputs_[i] != nullptr; }
    /// Adds `grad` to input `i`'s gradient; ignored when the input does not require grad.
    void add(std::size_t i, const Tensor<T>& grad) {
        if (!needs(i)) return;
        accumulate_grad(*inputs_[i], grad, op_);
    }
    /// A temporary gradient: its buffer becomes the input's gradient when it is the first to arrive.
    void add(std::size_t i, Tensor<T>&& grad) {
        if (!needs(i)) return;
        accumulate_grad(*inputs_[i], std::move(grad), op_);
    }
    /// Adds `grad` into part of input `i`'s gradient: runs of `run` elements, run r at element
    /// offset + r * stride (accumulate_grad_strided; a slice's backward).
    void add_strided(std::size_t i, const Tensor<T>& grad, std::size_t offset, std::size_t run, std::size_t stride) {
        if (!needs(i)) return;
        accumulate_grad_strided(*inputs_[i], grad, offset, run, stride);
    }

    /// Whether this is the closure's last run: the graph is not retained, so the node frees the
    /// closure (and what it saved) right after it returns. A closure that walks a long chain (nn::Stack's
    /// reverse pass) may then move a saved value out and drop it as soon as it is used, instead of
    /// holding it to the end; with `retain_graph` it must leave its saved values as they were.
    bool last_use() const { return last_use_; }
    /// Takes output `i`'s incoming gradient out of the node, so it is freed once the closure drops
    /// it rather than when the closure returns (a long walk such as nn::Stack's reverse pass moves
    /// past it after its first layer). The closure's `grad_outputs[i]` is empty afterwards.
    Tensor<T> take_grad_output(std::size_t i) {
        check<autodiff_error>(i < grad_outputs_.size() && grad_outputs_[i].defined(), op_, ": no incoming gradient ", i,
                              " to take (out of range, or taken already)");
        return std::exchange(grad_outputs_[i], Tensor<T>());
    }

private:
    std::span<const std::shared_ptr<olmax::detail::TensorImpl<T>>> inputs_;
    std::string_view op_;
    bool last_use_ = false;
    std::span<Tensor<T>> grad_outputs_;  // the node's, handed to the closure as its grad_outputs
};

}  // namespace olmax::autodiff
