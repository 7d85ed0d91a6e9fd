#pragma once
// Depth as a loop: the lowering of `backend::trace::layer_loop` (what nn::Stack asks for on traced
// tensors). The layers' body is traced ONCE into one `stablehlo.while` over the stacked [depth, ...]
// parameters, so the program's size does not grow with depth. Its gradient is one reverse loop: a
// reversible layer's body is its own memory-free backward (rebuilding each input from the output),
// any other's re-runs the layer from its stored input and calls backward(); kept layers loop apart,
// storing what their backward reads. Each iteration runs `period` layers (a layer whose behaviour
// depends on its index declares the period); the depth % period left over run after the loop.
// How and why: docs/xla.md, "Depth is a loop" and "Kept layers skip the recompute, as on the CPU".

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "olmax/autodiff/grad_mode.hpp"
#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/trace_rules.hpp"
#include "olmax/trace/primitives.hpp"
#include "olmax/trace/tracer.hpp"

namespace olmax::trace {

namespace detail {

namespace p = primitives;
using Tf = Tensor<float>;

/// f(), a trace_error from inside naming the stack too (`where`: "a layer", "the backward of a layer").
template <class F>
auto in_layer(const backend::trace::layer_loop& loop, std::string_view where, F&& f) {
    try {
        return f();
    } catch (const trace_error& e) {
        throw trace_error(olmax::detail::concat(e.what(), " (in ", where, " of ", loop.name, ")"));
    }
}

/// loop.body of layer `position`.
inline Tf run_layer(const backend::trace::layer_loop& loop, const Tf& h, std::span<const Tf> layer, std::span<const Tf> shared,
                    std::size_t position) {
    return in_layer(loop, "a layer", [&] { return loop.body(h, layer, shared, position); });
}

/// The program's values of `tensors`.
inline std::vector<gx::var> vars_of(const std::vector<Tf>& tensors) {
    std::vector<gx::var> out;
    for (const auto& t : tensors) out.push_back(var_of(t));
    return out;
}

/// `period` layers in a row on traced values of one body: `layer` holds [period, ...] slices
/// (period > 1) or one layer's parameters.
inline Tf run_period(const backend::trace::layer_loop& loop, Tf h, std::span<const Tf> layer, std::span<const Tf> shared) {
    for (std::size_t position = 0; position < loop.period; ++position) {
        std::vector<Tf> own;
        for (const auto& w : layer) own.push_back(loop.period > 1 ? p::take_leading(w, position) : w);
        h = run_layer(loop, h, own, shared, position);
    }
    return h;
}

/// The gradient of `x`, or zeros where none reached it.
inline Tf grad_or_zero(const Tf& x) {
    const Tf g = x.grad();
    return g.defined() ? g : p::full(x.shape(), 0.0);
}

/// A loop body's graph with its arguments as traced tensors: carry, per-layer..., shared..., the
/// layer index (unused: the layers' behaviour is static within a body), then `extra` arguments.
struct body_graph {
    std::shared_ptr<gx::layer_body> body;
    Tf carry;
    std::vector<Tf> layer, shared, extra;
};

inline body_graph new_body(const Tf& carry, const std::vector<Tf>& layer_types, const std::vector<Tf>& shared_types, std::size_t extra) {
    std::vector<gx::tensor_type> per_layer, shared;
    for (const auto& t : layer_types) {
        const auto& d = var_of(t).dims();
        per_layer.push_back(gx::f32(gx::dims_t(d.begin() + 1, d.end())));  // one iteration's slice
    }
    for (const auto& t : shared_types) shared.push_back(var_of(t).type());
    auto [body, args] = gx::detail::new_layer_body(var_of(carry).type(), per_layer, shared);
    body_graph out;
    out.body = body;
    out.carry = wrap(args.carry);
    for (const auto& v : args.layer) out.layer.push_back(wrap(v));
    for (const auto& v : args.shared) out.shared.push_back(wrap(v));
    for (std::size_t i = 0; i < extra; ++i) out.extra.push_back(wrap(body->g->input(var_of(carry).type())));
    return out;
}

/// The reverse loop's body: from the layer's input (or, reversible, its output), its parameters and
/// the gradient of its output, the gradients of its input and parameters (and, reversible, the
/// input itself first).
/// `forward_output` (not reversible only): set to the layer's output inside the body.
inline std::shared_ptr<gx::layer_body> gradient_body(const backend::trace::layer_loop& loop, const Tf& carry, const std::vector<Tf>& looped,
                                                     bool reversible, gx::var* forward_output = nullptr) {
    body_graph b = new_body(carry, looped, loop.shared, 1);
    const tracing::body_scope into(active(), *b.body->g);
    autodiff::tape_scope tape;
    std::vector<Tf> shared;  // leaves: their gradients are the body's results
    for (const auto& w : b.shared) shared.push_back(wrap(var_of(w)).set_requires_grad(true));
    std::vector<gx::var> results;
    if (reversible) {
        // Each position's parameters as leaves of their own; the layers last to first.
        std::vector<std::vector<Tf>> own(loop.period);
        for (std::size_t position = 0; position < loop.period; ++position)
            for (const auto& w : b.layer) own[position].push_back(wrap(var_of(loop.period > 1 ? p::take_leading(w, position) : w)).set_requires_grad(true));
        Tf y = b.carry, dy = b.extra[0];
        for (std::size_t position = loop.period; position-- > 0;)
            std::tie(y, dy) = in_layer(loop, "the backward of a layer", [&] { return loop.reverse(y, dy, own[position], shared, position); });
        results = {var_of(y), var_of(dy)};
        for (std::size_t k = 0; k < b.layer.size(); ++k) {
            std::vector<Tf> per_position;
            for (std::size_t position = 0; position < loop.period; ++position) per_position.push_back(grad_or_zero(own[position][k]));
            results.push_back(var_of(loop.period > 1 ? p::stack_leading(per_position) : per_position[0]));
        }
    } else {
        // Leaves of a fresh tape: the input and every parameter, then the layers again with gradients on.
        autodiff::enable_grad on;
        Tf x = wrap(var_of(b.carry));
        x.set_requires_grad(true);
        std::vector<Tf> layer;
        for (const auto& w : b.layer) layer.push_back(wrap(var_of(w)).set_requires_grad(true));
        Tf y = run_period(loop, x, layer, shared);
        if (forward_output) *forward_output = var_of(y);
        if (y.requires_grad()) y.backward(b.extra[0]);
        results.push_back(var_of(grad_or_zero(x)));
        for (const auto& w : layer) results.push_back(var_of(grad_or_zero(w)));
    }
    for (const auto& w : shared) results.push_back(var_of(grad_or_zero(w)));
    b.body->results = std::move(results);
    return b.body;
}

/// Values of a gradient body's forward half (computed without the output's gradient, its last
/// argument) that its backward half or its results read, directly or through element-wise and shape
/// ops, and that depend on the layer's input: what a kept layer's forward loop stores. Only results
/// of primitives marked saved_by_kept_layers are stored (JAX's "dots saveable" policy, widened); the
/// ops between them are recomputed in the backward, fused by XLA into their readers. Storing every
/// intermediate was slower than rebuilding the layers (benchmarks/RESULTS.md, "Kept layers on XLA").
inline std::vector<gx::var> saved_for_backward(const gx::layer_body& body) {
    const gx::graph& g = *body.g;
    const std::uint32_t input = g.inputs().front(), output_grad = g.inputs().back();
    std::vector<char> from_input(g.nodes().size(), 0), from_grad(g.nodes().size(), 0), visited(g.nodes().size(), 0);
    for (std::uint32_t i = 0; i < g.nodes().size(); ++i) {
        from_input[i] = i == input;
        from_grad[i] = i == output_grad;
        for (const auto& operand : g.at(i).operands) {
            from_input[i] |= from_input[operand.node()];
            from_grad[i] |= from_grad[operand.node()];
        }
    }
    std::vector<gx::var> saved;
    std::function<void(const gx::var&)> save = [&](const gx::var& v) {
        const gx::node& n = g.at(v.node());
        if (!from_input[v.node()] || from_grad[v.node()] || n.is<gx::prim::input>()) return;
        if (n.kind.info().saved_by_kept_layers) {
            if (std::find(saved.begin(), saved.end(), v) == saved.end()) saved.push_back(v);
            return;
        }
        if (visited[v.node()]) return;  // recomputed from its operands
        visited[v.node()] = 1;
        for (const auto& operand : n.operands) save(operand);
    };
    for (std::uint32_t i = 0; i < g.nodes().size(); ++i)
        if (from_grad[i])
            for (const auto& operand : g.at(i).operands) save(operand);
    for (const auto& r : body.results) save(r);
    return saved;
}

/// One scan_layers node running `body` over `looped`, whose first result must keep the carry's type.
inline gx::var scan_node(const backend::trace::layer_loop& loop, const Tf& carry, const std::vector<Tf>& looped,
                         const std::shared_ptr<const gx::layer_body>& body) {
    const gx::tensor_type& out = body->results.at(0).type();
    check<trace_error>(out == var_of(carry).type(), "olmax: ", loop.name, ": a layer changed the shape of its input (", var_of(carry).type().str(),
                       " to ", out.str(), "); a stack's layers keep it");
    return gx::scan_layers(body, var_of(carry), vars_of(looped), vars_of(loop.shared));
}

/// Records the loop `out` (a scan_layers node over `looped`) on the tape. Its gradient is one
/// scan_layers_backward node over the body `backward()` traces: walking back from the final carry
/// (`rebuild`, a reversible layer's own backward) or reading the stored carries, and reading the
/// node's stored values `saved` (kept layers) after the parameters.
inline Tf record_loop(const backend::trace::layer_loop& loop, const Tf& carry, const std::vector<Tf>& looped, const gx::var& out,
                      std::function<std::shared_ptr<const gx::layer_body>()> backward, bool rebuild, std::vector<gx::var> saved = {}) {
    std::vector<Tf> inputs{carry};
    inputs.insert(inputs.end(), looped.begin(), looped.end());
    inputs.insert(inputs.end(), loop.shared.begin(), loop.shared.end());
    return p::detail::record("layer_loop", inputs, wrap(out), [loop, looped, out, backward, rebuild, saved](const Tf& gy, autodiff::GradientSink<float>& sink) {
        const std::vector<gx::var> grads = gx::scan_layers_backward(var_of(gy), out, backward(), rebuild, vars_of(looped), vars_of(loop.shared), saved);
        for (std::size_t k = 0; k < grads.size(); ++k)
            if (sink.needs(k)) sink.add(k, wrap(grads[k]));
    });
}

/// The kept layers' loop: its body the gradient body's forward half, storing what the backward
/// half reads; its gradient the reverse loop over the gradient body reading those values.
inline Tf kept_loop_node(const backend::trace::layer_loop& loop, const Tf& carry, const std::vector<Tf>& looped) {
    gx::var y_in_body;
    const std::shared_ptr<gx::layer_body> backward = gradient_body(loop, carry, looped, false, &y_in_body);
    const std::vector<gx::var> saved = saved_for_backward(*backward);
    auto forward = std::make_shared<gx::layer_body>(*backward);  // the same graph, other results
    forward->results = {y_in_body};
    forward->results.insert(forward->results.end(), saved.begin(), saved.end());
    return record_loop(loop, carry, looped, scan_node(loop, carry, looped, forward), [backward] { return backward; }, false, saved);
}

/// The loop over `iterations` x `period` layers: one scan_layers node, its gradient one
/// scan_layers_backward node.
inline Tf loop_node(const backend::trace::layer_loop& loop, const Tf& carry, const std::vector<Tf>& looped) {
    body_graph b = new_body(carry, looped, loop.shared, 0);
    {
        const tracing::body_scope into(active(), *b.body->g);
        autodiff::no_grad off;  // the forward loop records nothing: its gradient is the reverse loop below
        b.body->results = {var_of(run_period(loop, b.carry, b.layer, b.shared))};
    }
    const bool rebuild = static_cast<bool>(loop.reverse);
    return record_loop(loop, carry, looped, scan_node(loop, carry, looped, b.body),
                       [loop, carry, looped, rebuild] { return std::shared_ptr<const gx::layer_body>(gradient_body(loop, carry, looped, rebuild)); }, rebuild);
}

inline Tf lower_layer_loop(const backend::trace::layer_loop& loop) {
    check<trace_error>(loop.period >= 1 && loop.depth >= 1, "olmax: ", loop.name, ": a layer loop needs a depth and a period >= 1");
    Tf h = loop.input;
    if (loop.stacked.empty()) {  // layers without parameters of their own: nothing to loop over, so one after another
        for (std::size_t l = 0; l < loop.depth; ++l) h = run_layer(loop, h, {}, loop.shared, l % loop.period);
        return h;
    }
    const std::size_t iterations = loop.depth / loop.period, rest = loop.depth % loop.period;
    // the first whole periods of kept layers (when a gradient is being traced) loop apart from the rest
    const std::size_t kept = autodiff::is_grad_enabled() ? std::min(loop.kept, loop.depth) / loop.period : 0;
    auto looped = [&](std::size_t first, std::size_t last) {  // iterations first .. last-1: [iterations, (period,) ...]
        std::vector<Tf> out;
        for (const auto& w : loop.stacked) {
            Tf v = p::slice_leading(w, first * loop.period, last * loop.period);
            if (loop.period > 1) {
                Shape split{last - first, loop.period};
                split.insert(split.end(), w.shape().begin() + 1, w.shape().end());
                v = p::reshape(v, split);
            }
            out.push_back(v);
        }
        return out;
    };
    if (kept > 0) h = kept_loop_node(loop, h, looped(0, kept));
    if (iterations > kept) h = loop_node(loop, h, looped(kept, iterations));
    for (std::size_t r = 0; r < rest; ++r) {  // the layers after the last whole period, recorded as they run
        std::vector<Tf> own;
        for (const auto& w : loop.stacked) own.push_back(p::take_leading(w, iterations * loop.period + r));
        h = run_layer(loop, h, own, loop.shared, r);
    }
    return h;
}

inline bool register_loop() {
    backend::trace::register_loop_rule(lower_layer_loop);
    return true;
}

}  // namespace detail

inline const bool loop_rule_registered = detail::register_loop();

}  // namespace olmax::trace
