#pragma once
// Depth stacking: nn::Stack<Block> (one Block type, any depth, parameters stored with a leading
// depth axis and run by a runtime loop — the C++ counterpart of the original's lax.scan over layers,
// PR #73: compile 600 s -> 70 s) and the flat variadic nn::Sequential<L...>.

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "olmax/autodiff/custom_op.hpp"
#include "olmax/autodiff/gradient_hooks.hpp"
#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/core/memory.hpp"
#include "olmax/nn/continuation.hpp"
#include "olmax/nn/contract.hpp"
#include "olmax/nn/parameters.hpp"
#include "olmax/nn/views.hpp"

namespace olmax::nn {

/// `depth` layers of `Block`, layer l called with layer_context(ctx, l, depth) (index, depth, own seed).
///
/// Parameters: every per-layer parameter of Block is one tensor [depth, ...] named
/// "stack/*/<block names>" (role kept); each layer is initialised on its own (true per-layer
/// orthogonal init). Parameters a Block declares `Sharing::tied` are stored once and shared by all
/// layers. `layer_parameters()` lists per-layer views named "stack/3/dense/conv0/weight".
///
/// When Block is invertible (nn::Reversible) with memory saving on, the whole stack is one custom op
/// whose backward walks the layers in reverse, rebuilding each layer's input from its output: the
/// activation memory of forward + backward does not grow with depth. Otherwise every layer's ops are
/// recorded on the tape (memory grows linearly with depth).
///
/// Recompute as a budget: `keep_activations(k)` (or `fit_activations(bytes, x)`) lets the first k
/// layers of such a stack keep their activations on the tape, so the backward does not recompute
/// them; the other depth - k are rebuilt as above. Time falls toward the plain stack's as k grows,
/// and the activation memory is k layers' worth (what `activation_bytes_per_layer` measures).
template <class Block>
class Stack {
    static_assert(assert_layer<Block>());

public:
    using value_type = typename Block::value_type;
    using config_type = typename Block::config_type;
    using T = value_type;
    static constexpr std::string_view name = "stack";

    /// Depth from `config.depth`.
    Stack(const config_type& config, Generator& rng) : Stack(config, config.depth, rng) {}
    Stack(const config_type& config, std::size_t depth) : Stack(config, depth, seeded(config)) {}
    Stack(const config_type& config, std::size_t depth, Generator&& rng) : Stack(config, depth, rng) {}
    Stack(const config_type& config, std::size_t depth, Generator& rng) : worker_(config, rng), depth_(depth) {
        check<value_error>(depth >= 1, "nn::Stack: depth must be at least 1, got 0");
        ParameterVisitor<T> describe([&](const std::string& pname, Tensor<T>& t, Role role, Sharing sharing) {
            Slot slot{pname, role, sharing, t.shape(), {}};
            if (sharing == Sharing::tied) {
                slot.stored = t;
            } else {
                Shape shape{depth};
                shape.insert(shape.end(), t.shape().begin(), t.shape().end());
                device_scope with_layer(t.device());
                slot.stored = Tensor<T>::uninitialized(shape);
                std::copy(t.begin(), t.end(), slot.stored.data());
            }
            slots_.push_back(std::move(slot));
        });
        worker_.visit_parameters(describe);
        for (std::size_t l = 1; l < depth; ++l) {
            Block layer(config, rng);  // its own initialisation draws
            std::size_t i = 0;
            ParameterVisitor<T> copy([&](const std::string& pname, Tensor<T>& t, Role, Sharing) {
                check<value_error>(i < slots_.size() && slots_[i].name == pname && slots_[i].shape == t.shape(), "nn::Stack: layer ", l,
                                   " of ", Block::name, " declared parameter '", pname, "' of shape ", to_string(t.shape()),
                                   " that layer 0 did not declare in this position (visit_parameters must be deterministic)");
                Slot& slot = slots_[i++];
                if (slot.sharing == Sharing::per_layer) std::copy(t.begin(), t.end(), slot.stored.data() + l * t.size());
            });
            layer.visit_parameters(copy);
        }
        for (auto& slot : slots_)
            if (slot.sharing == Sharing::per_layer) slot.stored.set_requires_grad(true);
        bind(worker_, 0, Binding::plain);  // drop layer 0's separate copies; every call rebinds anyway
    }

    std::size_t depth() const { return depth_; }

    /// Recompute as a budget (invertible blocks with memory saving on; see the class comment): the
    /// first `layers` layers (at most depth) keep their activations for the backward. 0, the
    /// default, recomputes every layer.
    void keep_activations(std::size_t layers) { kept_ = std::min(layers, depth_); }
    std::size_t kept_activations() const { return kept_; }

    /// The activations one layer keeps on the tape for inputs like `x` (measured: the growth of
    /// olmax's counted tensor memory over one recorded layer, on a private tape that is then
    /// discarded; run as a recompute, so routing counts are not touched).
    std::size_t activation_bytes_per_layer(const Tensor<T>& x, const LayerContext& ctx = {}) const {
        autodiff::tape_scope private_tape;
        Block block = worker_;
        const std::size_t before = memory::stats().current_bytes;
        bind(block, 0, Binding::recorded);
        LayerContext probe = layer_context(ctx, 0, depth_);
        probe.recompute = true;
        const Tensor<T> y = kept_forward(block, x.detach(), probe);
        const std::size_t after = memory::stats().current_bytes;
        return after > before ? after - before : 0;
    }

    /// Keeps the activations of as many layers as fit `budget_bytes` for inputs like `x`
    /// (floor(budget / activation_bytes_per_layer)); returns how many.
    std::size_t fit_activations(std::size_t budget_bytes, const Tensor<T>& x, const LayerContext& ctx = {}) {
        keep_activations(budget_bytes / std::max<std::size_t>(activation_bytes_per_layer(x, ctx), 1));
        return kept_;
    }

    /// The block every layer runs (its parameter handles are rebound per call). State its copies
    /// share lives here, e.g. nn::MoE's routing counters.
    const Block& block() const { return worker_; }

    /// Traced, the layers become one loop in the program (traced_layers); else they run one after
    /// another on the tape, or reversibly.
    Tensor<T> forward(const Tensor<T>& x, const LayerContext& ctx = {}) const {
        const backend::op_scope on("nn::Stack", x);
        return on.run_composed([&] { return traced_layers(x, ctx); }, [&] {
            if constexpr (InvertibleLayer<Block>) {
                if (worker_.memory_saving()) return detail::hint_two_streams(x, "Stack", [&] { return forward_reversible(x, ctx); });
            }
            return recorded_layers(x, depth_, ctx);
        });
    }
    Tensor<T> operator()(const Tensor<T>& x, const LayerContext& ctx = {}) const { return forward(x, ctx); }

    /// The next steps of a sequence (nn::continue_sequence): every layer continues its own state,
    /// one after the other (an empty state starts all `depth` of them). Ordinary ops, recorded
    /// when gradients are on (as a plain stack's forward, not the reversible custom op).
    using sequence_state = std::vector<sequence_state_t<Block>>;
    Tensor<T> continue_sequence(const Tensor<T>& x, sequence_state& states, const LayerContext& ctx = {}) const
        requires ContinuableLayer<Block>
    {
        if (states.empty()) states.resize(depth_);
        check<value_error>(states.size() == depth_, "nn::Stack: a sequence state of ", states.size(), " layers for a stack of ", depth_);
        Block block = worker_;
        const Binding how = autodiff::is_grad_enabled() ? Binding::recorded : Binding::plain;
        Tensor<T> h = x;
        for (std::size_t l = 0; l < depth_; ++l) {
            bind(block, l, how);
            h = nn::continue_sequence(block, h, states[l], layer_context(ctx, l, depth_));
        }
        return h;
    }

    /// Stacked and tied parameters (the trainable leaves), named "<prefix>/*/<block names>" and
    /// "<prefix>/<block names>" for tied ones.
    void visit_parameters(ParameterVisitor<T>& visit) {
        for (auto& slot : slots_) visit(slot.sharing == Sharing::tied ? slot.name : "*/" + slot.name, slot.stored, slot.role, slot.sharing);
    }

    /// One entry per layer and per-layer parameter ("stack/3/dense/conv0/weight"), sharing the stacked
    /// storage (writing into one writes the stack), plus the tied ones once.
    std::vector<NamedParameter<T>> layer_parameters(const std::string& prefix = std::string(name)) const {
        std::vector<NamedParameter<T>> out;
        for (const auto& slot : slots_)
            if (slot.sharing == Sharing::tied) out.push_back({prefix + "/" + slot.name, slot.stored, slot.role, slot.sharing, false});
        for (std::size_t l = 0; l < depth_; ++l)
            for (const auto& slot : slots_)
                if (slot.sharing == Sharing::per_layer)
                    out.push_back({prefix + "/" + std::to_string(l) + "/" + slot.name, detail::view_of(slot.stored, l * numel(slot.shape), slot.shape),
                                   slot.role, slot.sharing, false});
        return out;
    }

    /// Inverse of the whole stack (invertible blocks only): rebuilds the input from the output.
    Tensor<T> inverse(const Tensor<T>& y, const LayerContext& ctx = {}) const
        requires InvertibleLayer<Block>
    {
        autodiff::no_grad guard;
        Block block = worker_;
        Tensor<T> h = y;
        for (std::size_t l = depth_; l-- > 0;) {
            bind(block, l, Binding::plain);
            h = block.inverse(h, layer_context(ctx, l, depth_));
        }
        return h;
    }

private:
    struct Slot {
        std::string name;
        Role role;
        Sharing sharing;
        Shape shape;       // one layer's shape
        Tensor<T> stored;  // [depth, ...shape] or the tied tensor
    };
    enum class Binding { recorded, plain, fresh_leaf };

    static Generator seeded(const config_type& config) {
        if constexpr (requires { config.seed; }) return Generator(config.seed);
        else return Generator(0);
    }

    /// Points `block`'s parameter handles at layer l's slice: a recorded slice (gradients flow into
    /// the stack), a plain view, or a fresh leaf view that collects this layer's gradient on its own.
    void bind(Block& block, std::size_t l, Binding how, std::vector<Tensor<T>>* leaves = nullptr) const {
        std::size_t i = 0;
        ParameterVisitor<T> rebind([&](const std::string&, Tensor<T>& t, Role, Sharing) {
            const Slot& slot = slots_[i++];
            if (slot.sharing == Sharing::tied) {
                t = how == Binding::fresh_leaf ? slot.stored.detach() : slot.stored;
            } else if (how == Binding::recorded) {
                t = take_leading(slot.stored, l);
            } else {
                t = detail::view_of(slot.stored, l * numel(slot.shape), slot.shape);
            }
            if (how == Binding::fresh_leaf) {
                if (slot.stored.requires_grad()) t.set_requires_grad(true);
                leaves->push_back(t);
            }
        });
        block.visit_parameters(rebind);
    }

    /// A layer whose activations are kept: its plain recorded forward (a block's own memory saving
    /// off, e.g. Reversible::forward_recorded), so its backward recomputes nothing.
    static Tensor<T> kept_forward(const Block& block, const Tensor<T>& x, const LayerContext& ctx) {
        if constexpr (requires { block.forward_recorded(x, ctx); }) return block.forward_recorded(x, ctx);
        else return block.forward(x, ctx);
    }

    /// The layers inside a traced program (olmax/trace/): ONE loop over the stacked parameters
    /// (backend::trace::layer_loop), its body this block's own forward, traced once; a reversible
    /// block's backward is the block's own `reverse`, as in the eager stack, except for its kept
    /// layers (keep_activations), whose forward loop stores what their backward reads.
    Tensor<T> traced_layers(const Tensor<T>& x, const LayerContext& ctx) const {
        if constexpr (!std::is_same_v<T, float>) {
            throw trace_error("nn::Stack: traced programs compute in float32; trace a float model");
        } else {
            backend::trace::layer_loop loop;
            loop.name = olmax::detail::concat("nn::Stack<", Block::name, ">");
            loop.input = x;
            loop.depth = depth_;
            loop.period = layer_period(worker_, x.shape());
            loop.kept = depth_;  // as the tape keeps a plain stack's activations
            for (const auto& slot : slots_) (slot.sharing == Sharing::tied ? loop.shared : loop.stacked).push_back(slot.stored);
            // A copy of the block whose parameters are this layer's traced ones.
            auto bound = [this](std::span<const Tensor<T>> per_layer, std::span<const Tensor<T>> shared) {
                Block block = worker_;
                std::size_t next_layer = 0, next_shared = 0, i = 0;
                ParameterVisitor<T> rebind([&](const std::string&, Tensor<T>& t, Role, Sharing) {
                    t = slots_[i++].sharing == Sharing::tied ? shared[next_shared++] : per_layer[next_layer++];
                });
                block.visit_parameters(rebind);
                return block;
            };
            loop.body = [this, ctx, bound](const Tensor<T>& h, std::span<const Tensor<T>> per_layer, std::span<const Tensor<T>> shared,
                                           std::size_t position) {
                return kept_forward(bound(per_layer, shared), h, layer_context(ctx, position, depth_));
            };
            if constexpr (InvertibleLayer<Block>)
                if (worker_.memory_saving()) {
                    loop.reverse = [this, ctx, bound](const Tensor<T>& y, const Tensor<T>& dy, std::span<const Tensor<T>> per_layer,
                                                      std::span<const Tensor<T>> shared, std::size_t position) {
                        return bound(per_layer, shared).reverse(y, dy, layer_context(ctx, position, depth_));
                    };
                    loop.kept = kept_;  // the rest rebuild their inputs, as in the eager stack
                }
            return backend::trace::loop_layers(loop);
        }
    }

    /// Layers 0 .. count-1 recorded on the tape, every activation kept (the plain stack, and the
    /// kept layers of a memory-saving one).
    Tensor<T> recorded_layers(const Tensor<T>& x, std::size_t count, const LayerContext& ctx) const {
        Block block = worker_;
        Tensor<T> h = x;
        for (std::size_t l = 0; l < count; ++l) {
            bind(block, l, Binding::recorded);
            h = kept_forward(block, h, layer_context(ctx, l, depth_));
        }
        return h;
    }

    /// The first kept_ layers recorded on the tape, then the rest as one reversible custom op.
    Tensor<T> forward_reversible(const Tensor<T>& x, const LayerContext& ctx) const
        requires InvertibleLayer<Block>
    {
        const std::size_t kept = autodiff::is_grad_enabled() ? kept_ : 0;
        const Tensor<T> h = recorded_layers(x, kept, ctx);
        return kept == depth_ ? h : reversible_layers(h, kept, ctx);
    }

    /// Layers first .. depth-1 as one custom op: the forward stores nothing per layer, the backward
    /// walks back from the output, rebuilding each layer's input.
    Tensor<T> reversible_layers(const Tensor<T>& x, std::size_t first, const LayerContext& ctx) const
        requires InvertibleLayer<Block>
    {
        Tensor<T> y;
        {
            autodiff::no_grad guard;
            Block block = worker_;
            y = x;
            for (std::size_t l = first; l < depth_; ++l) {
                bind(block, l, Binding::plain);
                y = block.forward(y, layer_context(ctx, l, depth_));
            }
        }
        std::vector<Tensor<T>> inputs{x};
        std::vector<autodiff::InputSlice> slices;  // per-layer parameters: only layers first.. (the kept ones are recorded apart)
        for (const auto& slot : slots_) {
            if (slot.sharing != Sharing::tied)
                slices.push_back({inputs.size(), first * numel(slot.shape), (depth_ - first) * numel(slot.shape)});
            inputs.push_back(slot.stored);
        }
        // The closure keeps the output (needed to start the reverse walk), the parameters and the
        // stack description; no per-layer activation. The walk takes the incoming gradient over, and
        // on the closure's last run the output too, so both are freed once the top layer is reversed.
        return autodiff::custom_op<T>(
            "stack_reversible", {y}, std::move(inputs),
            [self = *this, y_saved = y.detach(), ctx, first](std::span<const Tensor<T>>, autodiff::GradientSink<T>& sink) mutable {
                Block block = self.worker_;
                Tensor<T> out = sink.last_use() ? std::exchange(y_saved, Tensor<T>()) : y_saved, dout = sink.take_grad_output(0);
                std::vector<Tensor<T>> leaves;
                for (std::size_t l = self.depth_; l-- > first;) {
                    leaves.clear();
                    self.bind(block, l, Binding::fresh_leaf, &leaves);
                    auto [in, din] = block.reverse(out, dout, layer_context(ctx, l, self.depth_));
                    for (std::size_t i = 0; i < leaves.size(); ++i) {
                        const Slot& slot = self.slots_[i];
                        const Tensor<T> grad = leaves[i].grad();
                        if (!grad.defined() || !sink.needs(i + 1)) continue;
                        if (slot.sharing == Sharing::tied) {
                            autodiff::accumulate_grad_slice(olmax::detail::impl_of(slot.stored), 0, grad);
                            continue;
                        }
                        // Layer l's slice gets nothing more from this node: a gradient hook may take it
                        // (optim::AdamW::step_during_backward updates it now) instead of it being stored.
                        const std::size_t offset = l * grad.size();
                        if (!autodiff::offer_final_slice(slot.stored, offset, grad))
                            autodiff::accumulate_grad_slice(olmax::detail::impl_of(slot.stored), offset, grad);
                    }
                    out = in;
                    dout = din;
                }
                sink.add(0, dout);
            },
            std::move(slices))[0];
    }

    Block worker_;  // layer 0's instance; its parameter handles are rebound per layer
    std::size_t depth_;
    std::vector<Slot> slots_;
    std::size_t kept_ = 0;  // leading layers whose activations are kept (recompute as a budget)
};

/// A flat list of different layers applied in order (no recursive nesting): layer i's parameters
/// are named "<i>/<its name>/...". All layers share value_type; it is built from the most derived of
/// their config types (shared_config_t).
template <class... Ls>
class Sequential {
    static_assert(sizeof...(Ls) >= 1, "olmax::nn::Sequential needs at least one layer");
    static_assert((assert_layer<Ls>() && ...));

public:
    using value_type = typename std::tuple_element_t<0, std::tuple<Ls...>>::value_type;
    using config_type = shared_config_t<Ls...>;
    static_assert((std::same_as<typename Ls::value_type, value_type> && ...),
                  "olmax::nn::Sequential: all layers must have the same value_type");
    static_assert(!std::is_void_v<config_type>, "olmax::nn::Sequential: one layer's config_type must derive from all the others' (as "
                                                "nn::MoEConfig from nn::Config), so that one config builds every layer");
    using T = value_type;
    static constexpr std::string_view name = "sequential";

    Sequential(const config_type& config, Generator& rng) : layers_{Ls(config, rng)...} {}

    Tensor<T> forward(const Tensor<T>& x, const LayerContext& ctx = {}) const {
        Tensor<T> h = x;
        std::size_t i = 0;
        std::apply([&](const auto&... layer) { ((h = layer.forward(h, child_context(ctx, i++))), ...); }, layers_);
        return h;
    }
    void visit_parameters(ParameterVisitor<T>& visit) { visit_each(visit, std::index_sequence_for<Ls...>{}); }

    /// The next steps of a sequence (nn::continue_sequence): each layer continues its own state.
    using sequence_state = std::tuple<sequence_state_t<Ls>...>;
    Tensor<T> continue_sequence(const Tensor<T>& x, sequence_state& states, const LayerContext& ctx = {}) const
        requires(ContinuableLayer<Ls> && ...)
    {
        return continue_each(x, states, ctx, std::index_sequence_for<Ls...>{});
    }

    template <std::size_t I>
    auto& get() { return std::get<I>(layers_); }

private:
    template <std::size_t... I>
    Tensor<T> continue_each(const Tensor<T>& x, sequence_state& states, const LayerContext& ctx, std::index_sequence<I...>) const {
        Tensor<T> h = x;
        ((h = nn::continue_sequence(std::get<I>(layers_), h, std::get<I>(states), child_context(ctx, I))), ...);
        return h;
    }
    template <std::size_t... I>
    void visit_each(ParameterVisitor<T>& visit, std::index_sequence<I...>) {
        (visit.child(std::to_string(I) + "/" + std::string(std::tuple_element_t<I, std::tuple<Ls...>>::name), std::get<I>(layers_)), ...);
    }

    std::tuple<Ls...> layers_;
};

}  // namespace olmax::nn
