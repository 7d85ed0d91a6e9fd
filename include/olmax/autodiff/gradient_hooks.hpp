#pragma once
// Gradient-ready notifications: `gradient_ready_hook` tells a caller, during a reverse pass, the
// moment each of a set of leaf tensors (typically the parameters) has received its last gradient
// from that pass, so that work on the finished gradients (a data-parallel reducer sending them to
// other processes, distributed/overlapped_allreduce.hpp) can start while the rest of backward runs.
// PyTorch's DDP registers per-parameter autograd hooks for the same purpose.
//
// When a leaf is final: the reverse pass runs the nodes from the latest-recorded to the earliest,
// and a node adds only into its own inputs; so a leaf receives nothing more once the
// earliest-recorded node that has it as an input has run. Leaves that no node of the pass has as
// input receive nothing at all and are final before the first node runs. Nested passes (a
// reversible block's recompute inside its node) add into leaves that the outer node lists as
// inputs, so they finish when that node does.
//
// Slices: a node that adds into a leaf in parts it computes one after another (the reversible
// stack adds layer l's slice of each stacked parameter once its backward reached layer l) can hand
// each part to the hook as it is done (`offer_final_slice`). A hook with a slice callback takes it
// when no other node of the pass adds into those elements (nodes say which inputs they add into,
// and where a node adds only into a slice, which: InputSlice in tape.hpp); the optimiser then
// updates that slice at once and the leaf's whole gradient never exists
// (optim::AdamW::step_during_backward).

#include <algorithm>
#include <cstddef>
#include <functional>
#include <limits>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "olmax/autodiff/tape.hpp"
#include "olmax/core/tensor.hpp"

namespace olmax::autodiff {

/// RAII: while alive, every outermost reverse pass on this thread (`backward()`; not the passes
/// nested in its nodes) calls `on_ready(i)` once for each `leaves[i]`, as soon as that leaf's
/// gradient is final for the pass, in the order they become final (ties: by index). It fires for
/// every leaf of every pass, also those the pass does not reach (first, before any node runs).
/// Hooks nest: only the innermost one on the thread is told; the outer one resumes when it ends.
/// `autodiff::data_parallel_backward` called on this thread takes the hook over for its shards:
/// it calls `on_ready(i)` once a parameter is final in every shard and the shard gradients are
/// summed, possibly from one of its worker threads (never two calls at once).
///
/// `on_ready` runs inside backward; an exception it throws leaves the pass there, like a failing
/// node. Without a hook the reverse pass pays one branch per node.
template <Real T>
class gradient_ready_hook final : public detail::BackwardObserver {
public:
    using Callback = std::function<void(std::size_t leaf_index)>;
    /// Takes `grad`, the final gradient of elements [offset, offset + grad.size()) of leaf
    /// `leaf_index`, instead of it being added to the leaf's gradient; returns false to decline.
    using SliceCallback = std::function<bool(std::size_t leaf_index, std::size_t offset, const Tensor<T>& grad)>;

    gradient_ready_hook(std::span<const Tensor<T>> leaves, Callback on_ready, SliceCallback take_slice = {})
        : on_ready_(std::move(on_ready)), take_slice_(std::move(take_slice)), previous_(detail::backward_observer()) {
        check<value_error>(static_cast<bool>(on_ready_), "gradient_ready_hook: the callback is empty");
        for (std::size_t i = 0; i < leaves.size(); ++i) {
            check<autodiff_error>(leaves[i].defined() && leaves[i].is_leaf(), "gradient_ready_hook: leaf ", i,
                                  " is undefined or not a leaf tensor (only leaves' gradients become final)");
            const bool fresh = index_.emplace(&olmax::detail::impl_of(leaves[i]), i).second;
            check<value_error>(fresh, "gradient_ready_hook: leaf ", i, " is listed twice");
            leaves_.push_back(leaves[i]);
        }
        detail::backward_observer() = this;
    }
    gradient_ready_hook(const std::vector<Tensor<T>>& leaves, Callback on_ready)
        : gradient_ready_hook(std::span<const Tensor<T>>(leaves), std::move(on_ready)) {}
    ~gradient_ready_hook() { detail::backward_observer() = previous_; }
    gradient_ready_hook(const gradient_ready_hook&) = delete;
    gradient_ready_hook& operator=(const gradient_ready_hook&) = delete;

    const std::vector<Tensor<T>>& leaves() const { return leaves_; }
    /// Calls the callback for leaf `i` (data_parallel_backward, on the hook's behalf).
    void notify(std::size_t i) { on_ready_(i); }

    /// The innermost hook of type T active on this thread, or null.
    static gradient_ready_hook* active() { return dynamic_cast<gradient_ready_hook*>(detail::backward_observer()); }

    /// Whether the hook has a slice callback.
    bool takes_slices() const { return static_cast<bool>(take_slice_); }
    /// Hands a final slice of leaf `i` to the slice callback without the node check
    /// (data_parallel_backward, which checks it in every shard's own pass); false: declined.
    bool take_slice(std::size_t i, std::size_t offset, const Tensor<T>& grad) { return take_slice_ && take_slice_(i, offset, grad); }

    /// `offer_final_slice` on this hook, from node `node` of its pass: taken when no other node of
    /// the pass adds into the leaf's elements [offset, offset + grad.size()).
    bool offer_slice(std::size_t node, const olmax::detail::TensorImpl<T>& leaf, std::size_t offset, const Tensor<T>& grad) {
        if (!take_slice_ || !uses_known_) return false;
        const auto it = index_.find(&leaf);
        if (it == index_.end()) return false;
        const std::size_t end = offset + grad.size();
        for (const Use& u : uses_[it->second])
            if (u.node != node && (u.whole || (u.offset < end && offset < u.offset + u.size))) return false;  // more may come
        return take_slice_(it->second, offset, grad);
    }

private:
    static constexpr std::size_t unused = std::numeric_limits<std::size_t>::max();

    void before_nodes(const Tape& tape, std::size_t count) override {
        // last_use_[i]: the earliest node that adds into leaf i (its gradient is final after it).
        last_use_.assign(leaves_.size(), unused);
        std::vector<const void*> inputs;
        std::size_t assigned = 0;
        for (std::size_t n = 0; n < count && assigned < leaves_.size(); ++n) {
            inputs.clear();
            if (!tape.nodes[n]->gradient_inputs(inputs)) {  // a node that cannot say: it may touch every leaf
                for (auto& u : last_use_)
                    if (u == unused) u = n, ++assigned;
                break;
            }
            for (const void* in : inputs)
                if (const auto it = index_.find(in); it != index_.end() && last_use_[it->second] == unused) {
                    last_use_[it->second] = n;
                    ++assigned;
                }
        }
        // Firing order: untouched leaves first, then by decreasing node (the pass runs downwards).
        order_.resize(leaves_.size());
        for (std::size_t i = 0; i < order_.size(); ++i) order_[i] = i;
        std::stable_sort(order_.begin(), order_.end(), [&](std::size_t a, std::size_t b) {
            const bool ua = last_use_[a] == unused, ub = last_use_[b] == unused;
            if (ua != ub) return ua;
            return !ua && last_use_[a] > last_use_[b];
        });
        next_ = 0;
        if (take_slice_) record_uses(tape, count);
        while (next_ < order_.size() && last_use_[order_[next_]] == unused) on_ready_(order_[next_++]);
    }

    /// Every node of the pass that adds into a leaf, and where (slice offers check against them).
    void record_uses(const Tape& tape, std::size_t count) {
        uses_.assign(leaves_.size(), {});
        uses_known_ = true;
        std::vector<const void*> inputs;
        for (std::size_t n = 0; n < count; ++n) {
            inputs.clear();
            if (!tape.nodes[n]->gradient_inputs(inputs)) {  // it may add anywhere: no slice is known to be final
                uses_known_ = false;
                return;
            }
            for (const void* in : inputs)
                if (const auto it = index_.find(in); it != index_.end()) {
                    Use u{n, true, 0, 0};
                    u.whole = !tape.nodes[n]->gradient_input_slice(in, u.offset, u.size);
                    uses_[it->second].push_back(u);
                }
        }
    }

    void after_node(std::size_t index) override {
        while (next_ < order_.size() && last_use_[order_[next_]] == index) on_ready_(order_[next_++]);
    }

    void after_nodes() override {
        while (next_ < order_.size()) on_ready_(order_[next_++]);  // none left unless a node index was skipped
    }

    Callback on_ready_;
    SliceCallback take_slice_;
    detail::BackwardObserver* previous_;
    std::vector<Tensor<T>> leaves_;
    std::unordered_map<const void*, std::size_t> index_;
    std::vector<std::size_t> last_use_, order_;
    struct Use {
        std::size_t node;
        bool whole;  // anywhere in the leaf; else only in [offset, offset + size)
        std::size_t offset, size;
    };
    std::vector<std::vector<Use>> uses_;  // per leaf, with a slice callback only
    bool uses_known_ = false;
    std::size_t next_ = 0;
};

/// Called from inside a node's backward with `grad`, the whole of this node's gradient for elements
/// [offset, offset + grad.size()) of `leaf` (it adds nothing else there): true when the observed
/// pass's gradient hook took it (then the caller must not add it to the leaf's gradient), false
/// otherwise, when the caller adds it as usual. Declined unless no other node of the pass adds into
/// those elements. Nodes of passes nested in a node are not the observed pass's, so their offers are
/// declined; data_parallel_backward's shards have hooks of their own.
template <Real T>
bool offer_final_slice(const olmax::detail::TensorImpl<T>& leaf, std::size_t offset, const Tensor<T>& grad) {
    const detail::ObservedNode& running = detail::observed_node();
    if (running.observer == nullptr || detail::backward_observer() != nullptr) return false;  // none, or inside a nested pass's own hook
    auto* hook = dynamic_cast<gradient_ready_hook<T>*>(running.observer);
    return hook != nullptr && hook->offer_slice(running.index, leaf, offset, grad);
}
template <Real T>
bool offer_final_slice(const Tensor<T>& leaf, std::size_t offset, const Tensor<T>& grad) {
    return offer_final_slice(olmax::detail::impl_of(leaf), offset, grad);
}

}  // namespace olmax::autodiff
