#pragma once
// Reverse-mode autodiff on a per-thread tape (a Wengert list).
//
// Semantics, stated once:
//  * Recording. While grad mode is on (the default; see `no_grad`) every op whose inputs include a
//    tensor that requires grad appends one node to the calling thread's current tape. Each thread
//    has its own tape stack; a graph must be built and differentiated on one thread. Kernels inside
//    an op may use many threads; that is invisible to the tape.
//  * Accumulation. Gradients are *added* into `grad()` of every tensor they reach, never
//    overwritten. Leaves keep their gradient until `zero_grad()`; an intermediate tensor's gradient
//    is freed as soon as its producing node has run (unless `retain_grad()`).
//  * Lifetime. `backward()` walks the tape from the root's node down to the first node, then frees
//    the whole tape (unless `retain_graph`). A later op or backward that reaches a tensor of a freed
//    graph throws `autodiff_error` instead of silently dropping gradient. Code that evaluates without
//    differentiating (evaluation, sampling) runs under `no_grad` so the tape does not grow.
//  * Nesting. `tape_scope` pushes a fresh tape: ops inside record there and a backward inside
//    differentiates only them; gradients reaching tensors from the enclosing tape are accumulated
//    into those tensors and go no further. Reversible blocks recompute their forward this way.
//  * Custom backward passes, two ways on the same tape: `custom_op` (a value plus a closure that
//    adds into input gradients) and `Function<Op>` (static forward/backward with a `Context`).

#include <any>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "olmax/backend/cpu_openmp.hpp"
#include "olmax/core/tensor.hpp"

namespace olmax::autodiff {

/// One recorded op. Concrete nodes are typed by element type; the tape only needs to run them.
class NodeBase {
public:
    virtual ~NodeBase() = default;
    virtual void run_backward() = 0;
    virtual std::string_view name() const = 0;
};

/// An append-only list of nodes; `id` changes whenever the tape is cleared so that handles into a
/// freed graph are recognised as stale.
struct Tape {
    std::uint64_t id;
    std::vector<std::unique_ptr<NodeBase>> nodes;
};

namespace detail {

inline std::uint64_t next_tape_id() {
    static std::atomic<std::uint64_t> counter{1};
    return counter.fetch_add(1, std::memory_order_relaxed);
}

struct ThreadState {
    std::vector<std::unique_ptr<Tape>> stack;  // unique_ptr: references stay valid while nested tapes are pushed
    bool grad_enabled = true;
    ThreadState() { stack.push_back(std::make_unique<Tape>(Tape{next_tape_id(), {}})); }
};

inline ThreadState& thread_state() {
    thread_local ThreadState state;
    return state;
}

inline bool is_live(const olmax::detail::NodeHandle& handle) {
    for (const auto& tape : thread_state().stack)
        if (tape->id == handle.tape_id) return true;
    return false;
}

}  // namespace detail

/// The tape ops record on right now (the innermost `tape_scope`, else the thread's root tape).
inline Tape& current_tape() { return *detail::thread_state().stack.back(); }
/// Number of nodes on the current tape.
inline std::size_t tape_size() { return current_tape().nodes.size(); }
/// Frees every node of the current tape (and with them the activations they keep alive).
inline void clear_tape() {
    Tape& tape = current_tape();
    tape.nodes.clear();
    tape.id = detail::next_tape_id();
}

inline bool is_grad_enabled() { return detail::thread_state().grad_enabled; }

/// RAII: ops inside record nothing (evaluation, sampling, optimiser updates).
class no_grad {
public:
    no_grad() : previous_(detail::thread_state().grad_enabled) { detail::thread_state().grad_enabled = false; }
    ~no_grad() { detail::thread_state().grad_enabled = previous_; }
    no_grad(const no_grad&) = delete;
    no_grad& operator=(const no_grad&) = delete;

private:
    bool previous_;
};

/// RAII: turns recording back on, e.g. inside a custom backward that recomputes its forward.
class enable_grad {
public:
    enable_grad() : previous_(detail::thread_state().grad_enabled) { detail::thread_state().grad_enabled = true; }
    ~enable_grad() { detail::thread_state().grad_enabled = previous_; }
    enable_grad(const enable_grad&) = delete;
    enable_grad& operator=(const enable_grad&) = delete;

private:
    bool previous_;
};

/// RAII: a fresh nested tape; its nodes are freed when the scope ends.
class tape_scope {
public:
    tape_scope() { detail::thread_state().stack.push_back(std::make_unique<Tape>(Tape{detail::next_tape_id(), {}})); }
    ~tape_scope() { detail::thread_state().stack.pop_back(); }
    tape_scope(const tape_scope&) = delete;
    tape_scope& operator=(const tape_scope&) = delete;
};

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
            if (t.defined()) buffers_.emplace(&t.impl(), nullptr);
        active() = this;
    }
    ~private_gradients() { active() = previous_; }
    private_gradients(const private_gradients&) = delete;
    private_gradients& operator=(const private_gradients&) = delete;

    /// The gradient collected for `t` (undefined when none arrived or `t` was not listed).
    Tensor<T> grad(const Tensor<T>& t) const {
        const auto it = t.defined() ? buffers_.find(&t.impl()) : buffers_.end();
        if (it == buffers_.end() || !it->second) return {};
        auto impl = std::make_shared<olmax::detail::TensorImpl<T>>();
        impl->storage = it->second;
        impl->shape = t.shape();
        return Tensor<T>::from_impl(std::move(impl));
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

/// Adds `grad` into the gradient buffer of `impl` (allocating it on first use). Copies and adds
/// run on the default backend's threads above its parallel threshold (activation gradients of
/// long sequences are hundreds of megabytes).
template <Real T>
void accumulate_grad(olmax::detail::TensorImpl<T>& impl, const Tensor<T>& grad, std::string_view op) {
    if (grad.shape() != impl.shape)
        throw autodiff_error(olmax::detail::concat(op, ": backward produced a gradient of shape ", to_string(grad.shape()),
                                                   " for an input of shape ", to_string(impl.shape)));
    const std::size_t n = grad.size();
    const T* src = grad.data();
    std::shared_ptr<Storage<T>>& buffer = private_gradients<T>::buffer_of(impl);
    if (!buffer) {
        buffer = std::make_shared<Storage<T>>(n);
        backend::cpu_openmp::map(n, buffer->data(), [](T v) { return v; }, src);
        return;
    }
    T* dst = buffer->data();
    backend::cpu_openmp::map(n, dst, [](T a, T b) { return a + b; }, static_cast<const T*>(dst), src);
}

/// Same, taking over the buffer of a temporary gradient instead of copying it when nothing else
/// can see that buffer (first gradient to arrive, sole handle, sole owner of the storage).
template <Real T>
void accumulate_grad(olmax::detail::TensorImpl<T>& impl, Tensor<T>&& grad, std::string_view op) {
    std::shared_ptr<Storage<T>>& buffer = private_gradients<T>::buffer_of(impl);
    if (!buffer && grad.defined() && grad.shape() == impl.shape && grad.impl_ptr().use_count() == 1) {
        auto& source = grad.impl();
        if (source.offset == 0 && source.storage && source.storage.use_count() == 1 && source.storage->size() == grad.size()) {
            buffer = std::move(source.storage);
            grad = Tensor<T>();
            return;
        }
    }
    accumulate_grad(impl, static_cast<const Tensor<T>&>(grad), op);
}

/// What a backward closure writes into: one slot per op input, in the order they were recorded.
template <Real T>
class GradientSink {
public:
    GradientSink(std::span<const std::shared_ptr<olmax::detail::TensorImpl<T>>> inputs, std::string_view op)
        : inputs_(inputs), op_(op) {}

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

private:
    std::span<const std::shared_ptr<olmax::detail::TensorImpl<T>>> inputs_;
    std::string_view op_;
};

/// A backward closure: receives the gradient of every output (zeros where none arrived) and adds
/// into the sink's input gradients.
template <Real T>
using BackwardFn = std::function<void(std::span<const Tensor<T>> grad_outputs, GradientSink<T>& grads)>;

template <Real T>
class Node final : public NodeBase {
public:
    Node(std::string name, std::vector<std::shared_ptr<olmax::detail::TensorImpl<T>>> inputs,
         const std::vector<Tensor<T>>& outputs, BackwardFn<T> fn)
        : name_(std::move(name)), inputs_(std::move(inputs)), fn_(std::move(fn)) {
        for (const auto& o : outputs) {
            outputs_.push_back(o.impl_ptr());
            output_shapes_.push_back(o.shape());
        }
    }

    std::string_view name() const override { return name_; }

    void run_backward() override {
        std::vector<Tensor<T>> grads(outputs_.size());
        std::vector<std::shared_ptr<olmax::detail::TensorImpl<T>>> alive(outputs_.size());
        bool any = false;
        for (std::size_t i = 0; i < outputs_.size(); ++i) {
            alive[i] = outputs_[i].lock();
            if (alive[i] && alive[i]->grad) {
                grads[i] = Tensor<T>::from_impl(alive[i]).grad();
                any = true;
            }
        }
        if (!any) return;  // nothing downstream depends on this op
        for (std::size_t i = 0; i < grads.size(); ++i)
            if (!grads[i].defined()) grads[i] = Tensor<T>(output_shapes_[i]);
        GradientSink<T> sink(inputs_, name_);
        fn_(std::span<const Tensor<T>>(grads), sink);
        for (auto& o : alive)
            if (o && !o->retains_grad) o->grad.reset();
    }

private:
    std::string name_;
    std::vector<std::shared_ptr<olmax::detail::TensorImpl<T>>> inputs_;  // null where no grad is needed
    std::vector<std::weak_ptr<olmax::detail::TensorImpl<T>>> outputs_;   // weak: the tape must not keep dead outputs alive
    std::vector<Shape> output_shapes_;
    BackwardFn<T> fn_;
};

/// Whether an op with these inputs records a node (grad mode on and some input requires grad).
template <Real T>
bool should_record(std::span<const Tensor<T>> inputs) {
    if (!is_grad_enabled()) return false;
    for (const auto& t : inputs)
        if (t.defined() && t.requires_grad()) return true;
    return false;
}

/// Records one node with these inputs and outputs. Outputs become non-leaf tensors that require grad.
/// Does nothing (outputs stay constants) when no input requires grad or grad mode is off.
template <Real T>
void record(std::string_view name, std::span<const Tensor<T>> inputs, std::span<Tensor<T>> outputs, BackwardFn<T> fn) {
    if (!should_record(inputs)) return;
    std::vector<std::shared_ptr<olmax::detail::TensorImpl<T>>> slots;
    slots.reserve(inputs.size());
    for (const auto& t : inputs) {
        if (!t.defined() || !t.requires_grad()) {
            slots.push_back(nullptr);
            continue;
        }
        if (!t.is_leaf() && !detail::is_live(t.impl().node))
            throw autodiff_error(olmax::detail::concat(
                name, ": an input belongs to a graph that an earlier backward() freed (or to another thread's tape); "
                      "recompute it, or call backward(/*retain_graph=*/true)"));
        slots.push_back(t.impl_ptr());
    }
    Tape& tape = current_tape();
    std::vector<Tensor<T>> outs(outputs.begin(), outputs.end());
    tape.nodes.push_back(std::make_unique<Node<T>>(std::string(name), std::move(slots), outs, std::move(fn)));
    for (auto& o : outputs) {
        o.impl().requires_grad = true;
        o.impl().node = {tape.id, tape.nodes.size() - 1};
    }
}

/// Lambda-level custom backward: returns `value` recorded as the result of `inputs`; `backward`
/// is called as `backward(grad_output, grads)` and must `grads.add(i, ...)` for each input.
///
///     auto y = olmax::autodiff::custom_op("cube", cube_values, {x},
///         [x](const Tensor<double>& dy, GradientSink<double>& g) { g.add(0, 3 * x * x * dy); });
template <Real T, class F>
    requires std::invocable<F&, const Tensor<T>&, GradientSink<T>&>
Tensor<T> custom_op(std::string_view name, Tensor<T> value, std::initializer_list<Tensor<T>> inputs, F&& backward) {
    std::vector<Tensor<T>> in(inputs);
    if (!should_record(std::span<const Tensor<T>>(in))) return value;
    if (!value.is_leaf() || value.requires_grad()) value = value.detach();
    record<T>(name, in, std::span<Tensor<T>>(&value, 1),
              [fn = std::forward<F>(backward)](std::span<const Tensor<T>> g, GradientSink<T>& sink) mutable { fn(g[0], sink); });
    return value;
}

/// Multi-output form: `backward(std::span<const Tensor<T>> grad_outputs, grads)`.
template <Real T, class F>
    requires std::invocable<F&, std::span<const Tensor<T>>, GradientSink<T>&>
std::vector<Tensor<T>> custom_op(std::string_view name, std::vector<Tensor<T>> values, std::vector<Tensor<T>> inputs, F&& backward) {
    if (!should_record(std::span<const Tensor<T>>(inputs))) return values;
    for (auto& v : values)
        if (!v.is_leaf() || v.requires_grad()) v = v.detach();
    record<T>(name, inputs, values, BackwardFn<T>(std::forward<F>(backward)));
    return values;
}

/// Everything a class-level custom op (`Function<Op>`) keeps between forward and backward.
template <Real T>
class Context {
public:
    /// Tensors the backward needs (inputs, outputs or anything computed in forward).
    template <class... Ts>
    void save_for_backward(const Ts&... tensors) { (saved_.push_back(tensors), ...); }
    const std::vector<Tensor<T>>& saved_tensors() const { return saved_; }
    /// Whether input `i` (counting tensor arguments of `forward`, in order) needs a gradient.
    bool needs_input_grad(std::size_t i) const { return i < needs_.size() && needs_[i]; }
    /// Non-tensor state (sizes, options) by name.
    std::map<std::string, std::any, std::less<>> saved_data;

    std::vector<bool> needs_;  // set by Function::apply

private:
    std::vector<Tensor<T>> saved_;
};

namespace detail {
template <class A>
struct tensor_arg : std::false_type {};
template <Real T>
struct tensor_arg<Tensor<T>> : std::true_type {
    using scalar = T;
};
template <class... Args>
struct first_real;
// Dispatch on a bool (not std::conditional_t, which would name `tensor_arg<A>::scalar` even for a
// non-tensor argument such as a `double` option and fail to compile).
template <bool IsTensor, class A, class... Rest>
struct first_real_step {
    using type = typename tensor_arg<std::remove_cvref_t<A>>::scalar;
};
template <class A, class... Rest>
struct first_real_step<false, A, Rest...> {
    using type = typename first_real<Rest...>::type;
};
template <class A, class... Rest>
struct first_real<A, Rest...> : first_real_step<tensor_arg<std::remove_cvref_t<A>>::value, A, Rest...> {};
template <>
struct first_real<> {
    using type = void;
};
}  // namespace detail

/// Class-level custom backward (the LibTorch `autograd::Function` shape):
///
///     struct Cube : olmax::autodiff::Function<Cube> {
///         template <class T> static Tensor<T> forward(Context<T>& ctx, const Tensor<T>& x) {
///             ctx.save_for_backward(x); return x * x * x; }
///         template <class T> static std::vector<Tensor<T>> backward(Context<T>& ctx, std::vector<Tensor<T>> dy) {
///             const auto& x = ctx.saved_tensors()[0]; return {3 * x * x * dy[0]}; }
///     };
///     auto y = Cube::apply(x);
///
/// `forward` runs with recording off and returns a `Tensor<T>` or a `std::vector<Tensor<T>>`;
/// `backward` returns one gradient per tensor argument of `forward` (undefined = none).
template <class Derived>
struct Function {
    template <class... Args>
    static auto apply(Args&&... args) {
        using T = typename detail::first_real<Args...>::type;
        static_assert(!std::is_void_v<T>, "olmax::autodiff::Function::apply needs at least one Tensor<float> or Tensor<double> argument");
        std::vector<Tensor<T>> inputs;
        auto collect = [&](const auto& a) {
            if constexpr (detail::tensor_arg<std::remove_cvref_t<decltype(a)>>::value) inputs.push_back(a);
        };
        (collect(args), ...);
        auto ctx = std::make_shared<Context<T>>();
        for (const auto& t : inputs) ctx->needs_.push_back(t.defined() && t.requires_grad());
        const bool rec = should_record(std::span<const Tensor<T>>(inputs));
        auto result = [&] {
            no_grad guard;
            return Derived::forward(*ctx, std::forward<Args>(args)...);
        }();
        using Result = decltype(result);
        static_assert(std::is_same_v<Result, Tensor<T>> || std::is_same_v<Result, std::vector<Tensor<T>>>,
                      "olmax::autodiff::Function: forward must return Tensor<T> or std::vector<Tensor<T>>");
        if (!rec) return result;
        std::vector<Tensor<T>> outs;
        if constexpr (std::is_same_v<Result, Tensor<T>>) outs.push_back(result);
        else outs = result;
        for (auto& o : outs)
            if (!o.is_leaf() || o.requires_grad()) o = o.detach();
        const std::size_t n_inputs = inputs.size();
        record<T>(typeid(Derived).name(), inputs, outs,
                  [ctx, n_inputs](std::span<const Tensor<T>> g, GradientSink<T>& sink) {
                      std::vector<Tensor<T>> grads_in = Derived::backward(*ctx, std::vector<Tensor<T>>(g.begin(), g.end()));
                      if (grads_in.size() != n_inputs)
                          throw autodiff_error(olmax::detail::concat(typeid(Derived).name(), "::backward returned ", grads_in.size(),
                                                                     " gradients for ", n_inputs, " tensor inputs"));
                      for (std::size_t i = 0; i < n_inputs; ++i)
                          if (grads_in[i].defined()) sink.add(i, grads_in[i]);
                  });
        if constexpr (std::is_same_v<Result, Tensor<T>>) return outs[0];
        else return outs;
    }
};

/// Runs the reverse pass from `root` seeded with `grad_output`.
template <Real T>
void backward(const Tensor<T>& root, const Tensor<T>& grad_output, bool retain_graph = false) {
    if (!root.requires_grad())
        throw autodiff_error("backward: the tensor does not require grad (no input of the ops that made it requires grad, "
                             "or it was computed under no_grad)");
    if (grad_output.shape() != root.shape())
        throw shape_error(olmax::detail::concat("backward: grad_output of shape ", to_string(grad_output.shape()),
                                                " does not match the tensor's shape ", to_string(root.shape())));
    Tape& tape = current_tape();
    const auto handle = root.impl().node;
    // Validate before seeding, so a refused backward leaves no partial gradient behind.
    if (!root.is_leaf() && handle.tape_id != tape.id)
        throw autodiff_error("backward: the tensor was recorded on another tape (an enclosing tape_scope, another thread, "
                             "or a graph that an earlier backward() freed)");
    accumulate_grad(root.impl(), grad_output, "backward");
    if (root.is_leaf()) return;
    {
        no_grad guard;  // backward closures compute with plain tensors; they re-enable grad explicitly if they recompute
        for (std::size_t i = handle.index + 1; i-- > 0;) tape.nodes[i]->run_backward();
    }
    if (!retain_graph) clear_tape();
}

}  // namespace olmax::autodiff

namespace olmax {

template <Scalar T>
void Tensor<T>::backward(bool retain_graph) {
    if constexpr (Real<T>) {
        check<shape_error>(size() == 1, "backward: called without an output gradient on a tensor of shape ", to_string(shape()),
                           "; pass grad_output for non-scalar outputs");
        autodiff::backward(*this, Tensor<T>(shape(), T{1}), retain_graph);
    } else {
        static_assert(Real<T>, "olmax: backward() needs a float or double tensor");
    }
}

template <Scalar T>
void Tensor<T>::backward(const Tensor<T>& grad_output, bool retain_graph) {
    if constexpr (Real<T>) autodiff::backward(*this, grad_output, retain_graph);
    else static_assert(Real<T>, "olmax: backward() needs a float or double tensor");
}

}  // namespace olmax
