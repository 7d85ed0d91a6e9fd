#pragma once
// Reverse-mode autodiff on a per-thread tape (a Wengert list): recording ops (`record`), nested
// tapes (`tape_scope`) and the reverse pass (`autodiff::backward`, and the definitions of
// `Tensor<T>::backward`, which core/tensor.hpp only declares; see docs/ARCHITECTURE.md).
//
// Semantics, stated once:
//  * Recording. While grad mode is on (the default; see `no_grad` in grad_mode.hpp) every op whose
//    inputs include a tensor that requires grad appends one node to the calling thread's current
//    tape. Each thread has its own tape stack; a graph must be built and differentiated on one
//    thread. Kernels inside an op may use many threads; that is invisible to the tape.
//  * Accumulation. Gradients are *added* into `grad()` of every tensor they reach, never
//    overwritten (gradient_sink.hpp). Leaves keep their gradient until `zero_grad()`; an
//    intermediate tensor's gradient is freed as soon as its producing node has run (unless
//    `retain_grad()`).
//  * Lifetime. `backward()` walks the tape from the root's node down to the first node, then frees
//    the whole tape (unless `retain_graph`). Without `retain_graph` each node also frees its
//    backward closure, and with it the values it saved, as soon as it has run (as PyTorch frees
//    saved tensors), so a graph's saved activations go during the reverse pass, not after it. A
//    later op or backward that reaches a tensor of a freed graph throws `autodiff_error` instead of
//    silently dropping gradient. Code that evaluates without differentiating (evaluation,
//    sampling) runs under `no_grad` so the tape does not grow.
//  * Activation memory. A node keeps its inputs to add their gradients, not their values: the
//    backward closure holds (handles to) exactly the values it reads, and a tensor whose last
//    handle goes while only nodes keep it lets go of its buffer (core/tensor.hpp). So a tensor
//    consumed only by ops whose backward does not read it (add, slice, tanh, which reads its own
//    output) is freed during the forward pass.
//  * Nesting. `tape_scope` pushes a fresh tape: ops inside record there and a backward inside
//    differentiates only them; gradients reaching tensors from the enclosing tape are accumulated
//    into those tensors and go no further. Reversible blocks recompute their forward this way.
//  * Custom backward passes, two ways on the same tape (custom_op.hpp): `custom_op` (a value plus a
//    closure that adds into input gradients) and `Function<Op>` (static forward/backward with a
//    `Context`).

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/autodiff/grad_mode.hpp"
#include "olmax/autodiff/gradient_sink.hpp"
#include "olmax/core/memory_profile.hpp"
#include "olmax/core/tensor.hpp"

namespace olmax::autodiff {

/// One recorded op. Concrete nodes are typed by element type; the tape only needs to run them.
class NodeBase {
public:
    virtual ~NodeBase() = default;
    /// Runs the node's backward closure; with `last_use` (the graph is not retained) frees the
    /// closure afterwards, so a later run throws autodiff_error instead of computing.
    virtual void run_backward(bool last_use) = 0;
    virtual std::string_view name() const = 0;
    /// Appends the identities (TensorImpl addresses) of the inputs this node adds gradients into;
    /// false when it cannot tell, and a gradient hook (gradient_hooks.hpp) then assumes any.
    virtual bool gradient_inputs(std::vector<const void*>&) const { return false; }
    /// Whether this node adds into `input` only within elements [offset, offset + size) (a slice
    /// op); false: anywhere in it, as far as anyone knows.
    virtual bool gradient_input_slice(const void* /*input*/, std::size_t& /*offset*/, std::size_t& /*size*/) const { return false; }
};

/// Elements [offset, offset + size) of input `input` of a node: the only ones its backward adds
/// into (`record`'s optional argument; gradient hooks use it to tell when a slice is final).
struct InputSlice {
    std::size_t input = 0, offset = 0, size = 0;
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

/// This thread's tapes, outermost first; never empty (the root tape is made on first use).
/// unique_ptr: references to a tape stay valid while nested tapes are pushed.
inline std::vector<std::unique_ptr<Tape>>& tape_stack() {
    thread_local std::vector<std::unique_ptr<Tape>> stack = [] {
        std::vector<std::unique_ptr<Tape>> root;
        root.push_back(std::make_unique<Tape>(Tape{next_tape_id(), {}}));
        return root;
    }();
    return stack;
}

/// Told about the reverse passes of this thread (gradient_hooks.hpp implements it). Only the
/// outermost pass is reported: `backward` hides the observer from the passes its nodes run inside
/// (a reversible block's recompute), whose gradients reach leaves through the outer node anyway.
class BackwardObserver {
public:
    virtual ~BackwardObserver() = default;
    /// Nodes count-1 down to 0 of `tape` are about to run (count 0: the root is a leaf).
    virtual void before_nodes(const Tape& tape, std::size_t count) = 0;
    virtual void after_node(std::size_t index) = 0;
    virtual void after_nodes() = 0;
};

inline BackwardObserver*& backward_observer() {
    thread_local BackwardObserver* observer = nullptr;
    return observer;
}

/// The reverse pass running on this thread, its observer (null: none, or a pass nested in a node)
/// and the node of it that is running now, so that code inside a node of the observed pass can
/// reach the observer, which `backward` hides from nested passes (gradient_hooks.hpp:
/// `offer_final_slice`).
struct ObservedNode {
    BackwardObserver* observer = nullptr;
    std::size_t index = 0;
};
inline ObservedNode& observed_node() {
    thread_local ObservedNode running;
    return running;
}

/// Whether the node `handle` points at is on one of this thread's live tapes.
inline bool is_live(const olmax::detail::NodeHandle& handle) {
    for (const auto& tape : tape_stack())
        if (tape->id == handle.tape_id) return true;
    return false;
}

}  // namespace detail

/// The tape ops record on right now (the innermost `tape_scope`, else the thread's root tape).
inline Tape& current_tape() { return *detail::tape_stack().back(); }
/// Number of nodes on the current tape.
inline std::size_t tape_size() { return current_tape().nodes.size(); }
/// Frees every node of the current tape (and with them the activations they keep alive).
inline void clear_tape() {
    Tape& tape = current_tape();
    tape.nodes.clear();
    tape.id = detail::next_tape_id();
}

/// RAII: a fresh nested tape; its nodes are freed when the scope ends.
class tape_scope {
public:
    tape_scope() { detail::tape_stack().push_back(std::make_unique<Tape>(Tape{detail::next_tape_id(), {}})); }
    ~tape_scope() { detail::tape_stack().pop_back(); }
    tape_scope(const tape_scope&) = delete;
    tape_scope& operator=(const tape_scope&) = delete;
};

/// A backward closure: receives the gradient of every output (zeros where none arrived) and adds
/// into the sink's input gradients.
template <Real T>
using BackwardFn = std::function<void(std::span<const Tensor<T>> grad_outputs, GradientSink<T>& grads)>;

template <Real T>
class Node final : public NodeBase {
public:
    Node(std::string name, std::vector<std::shared_ptr<olmax::detail::TensorImpl<T>>> inputs,
         const std::vector<Tensor<T>>& outputs, BackwardFn<T> fn, std::vector<InputSlice> slices = {})
        : name_(std::move(name)), inputs_(std::move(inputs)), slices_(std::move(slices)), fn_(std::move(fn)) {
        if (!outputs.empty()) device_ = outputs.front().device();
        for (const auto& o : outputs) {
            outputs_.push_back(olmax::detail::impl_ptr_of(o));
            output_shapes_.push_back(o.shape());
        }
    }

    std::string_view name() const override { return name_; }

    bool gradient_inputs(std::vector<const void*>& out) const override {
        for (const auto& in : inputs_)
            if (in) out.push_back(in.get());
        return true;
    }

    bool gradient_input_slice(const void* input, std::size_t& offset, std::size_t& size) const override {
        for (const auto& s : slices_)
            if (s.input < inputs_.size() && inputs_[s.input].get() == input) {
                offset = s.offset, size = s.size;
                return true;
            }
        return false;
    }

    void run_backward(bool last_use) override {
        // Frees the closure (its saved values) when this is its last run, on every way out.
        struct release_after {
            BackwardFn<T>& fn;
            bool last_use;
            ~release_after() {
                if (last_use) fn = nullptr;
            }
        } release{fn_, last_use};
        std::vector<Tensor<T>> grads(outputs_.size());
        std::vector<std::shared_ptr<olmax::detail::TensorImpl<T>>> alive(outputs_.size());
        bool any = false;
        for (std::size_t i = 0; i < outputs_.size(); ++i) {
            alive[i] = outputs_[i].lock();
            if (alive[i] && (alive[i]->grad || alive[i]->grad_symbol)) {
                grads[i] = olmax::detail::TensorAccess<T>::from_impl(alive[i]).grad();
                any = true;
            }
        }
        if (!any) return;  // nothing downstream depends on this op
        if (!fn_)
            throw autodiff_error(olmax::detail::concat("backward: the node '", name_,
                                                       "' already ran in an earlier backward, which freed what it saved; "
                                                       "call that backward with retain_graph=true to run a graph twice"));
        device_scope on(device_);  // the backward closure computes where the forward did
        for (std::size_t i = 0; i < grads.size(); ++i)
            if (!grads[i].defined()) grads[i] = Tensor<T>(output_shapes_[i]);
        // An output's gradient is needed no longer than this run (unless retained): `grads` alone
        // holds it from here, so a closure that takes it (take_grad_output) frees it when done.
        for (auto& o : alive)
            if (o && !o->retains_grad) {
                o->grad.reset();
                o->grad_symbol.reset();
            }
        GradientSink<T> sink(inputs_, name_, last_use, std::span<Tensor<T>>(grads));
        fn_(std::span<const Tensor<T>>(grads), sink);
    }

private:
    std::string name_;
    std::vector<std::shared_ptr<olmax::detail::TensorImpl<T>>> inputs_;  // null where no grad is needed
    std::vector<InputSlice> slices_;                                      // inputs added into only in part
    std::vector<std::weak_ptr<olmax::detail::TensorImpl<T>>> outputs_;   // weak: the tape must not keep dead outputs alive
    std::vector<Shape> output_shapes_;
    Device device_;  // of the outputs (an op's outputs share its inputs' device)
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
/// Does nothing (outputs stay constants) when no input requires grad or grad mode is off. `slices`
/// names inputs whose gradient the backward adds into only in part (InputSlice).
template <Real T>
void record(std::string_view name, std::span<const Tensor<T>> inputs, std::span<Tensor<T>> outputs, BackwardFn<T> fn,
            std::vector<InputSlice> slices = {}) {
    if (!should_record(inputs)) return;
    std::vector<std::shared_ptr<olmax::detail::TensorImpl<T>>> slots;
    slots.reserve(inputs.size());
    for (const auto& t : inputs) {
        if (!t.defined() || !t.requires_grad()) {
            slots.push_back(nullptr);
            continue;
        }
        if (!t.is_leaf() && !detail::is_live(olmax::detail::impl_of(t).node))
            throw autodiff_error(olmax::detail::concat(
                name, ": an input belongs to a graph that an earlier backward() freed (or to another thread's tape); "
                      "call that earlier backward(/*retain_graph=*/true) to keep the graph, or recompute the input"));
        slots.push_back(olmax::detail::impl_ptr_of(t));
    }
    Tape& tape = current_tape();
    std::vector<Tensor<T>> outs(outputs.begin(), outputs.end());
    tape.nodes.push_back(std::make_unique<Node<T>>(std::string(name), std::move(slots), outs, std::move(fn), std::move(slices)));
    for (auto& o : outputs) {
        olmax::detail::impl_of(o).requires_grad = true;
        olmax::detail::impl_of(o).node = {tape.id, tape.nodes.size() - 1};
    }
}

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
    const auto handle = olmax::detail::impl_of(root).node;
    // Validate before seeding, so a refused backward leaves no partial gradient behind.
    if (!root.is_leaf() && handle.tape_id != tape.id)
        throw autodiff_error("backward: the tensor's graph is not on this thread's current tape: an earlier backward() freed it "
                             "(call that first backward(/*retain_graph=*/true) to run backward through a graph twice), or it was "
                             "recorded on another tape (an enclosing tape_scope, another thread)");
    accumulate_grad(olmax::detail::impl_of(root), grad_output, "backward");
    // A gradient hook sees this pass only, not the ones nested in its nodes; null (the usual case)
    // costs one branch per node.
    detail::BackwardObserver* const observer = std::exchange(detail::backward_observer(), nullptr);
    struct restore {
        detail::BackwardObserver* observer;
        ~restore() { detail::backward_observer() = observer; }
    } restore_observer{observer};
    const std::size_t count = root.is_leaf() ? 0 : handle.index + 1;
    if (observer) observer->before_nodes(tape, count);
    {
        no_grad guard;  // backward closures compute with plain tensors; they re-enable grad explicitly if they recompute
        struct restore_node {
            detail::ObservedNode saved = detail::observed_node();
            ~restore_node() { detail::observed_node() = saved; }
        } restore_running;
        for (std::size_t i = count; i-- > 0;) {
            detail::observed_node() = {observer, i};  // null in passes nested in a node: their nodes are not the observed pass's
            memory::backward_label_scope label(tape.nodes[i]->name());  // for memory::profile_peak
            tape.nodes[i]->run_backward(/*last_use=*/!retain_graph);
            if (observer) observer->after_node(i);
        }
    }
    if (observer) observer->after_nodes();
    if (!root.is_leaf() && !retain_graph) clear_tape();
}

}  // namespace olmax::autodiff

// The member functions core/tensor.hpp declares. They are defined here, not in core, because core
// sits below autodiff (docs/ARCHITECTURE.md, "Layers"): a translation unit that calls
// `t.backward()` must include this header (olmax/autodiff/autodiff.hpp and olmax/olmax.hpp do);
// without it the call compiles against the declaration and the link reports an undefined
// `olmax::Tensor<T>::backward`.
namespace olmax {

template <Scalar T>
void Tensor<T>::backward(bool retain_graph) {
    if constexpr (Real<T>) {
        check<shape_error>(size() == 1, "backward: called without an output gradient on a tensor of shape ", to_string(shape()),
                           "; pass grad_output for non-scalar outputs");
        device_scope on(device());  // the seed lives with the tensor
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
