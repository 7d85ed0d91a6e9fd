#pragma once
// Depth as a loop, not an unrolling: `scan_layers` runs one layer body, traced once, over parameters
// stacked along a leading [depth] axis as ONE `stablehlo.while` (layer l's parameters sliced out of
// the stacks); `scan_layers_backward` is the same loop from l = depth-1 down to 0, writing each
// layer's parameter gradients into their slots. Depth appears only in tensor types, so the program's
// size and XLA's compile time do not grow with it. The reverse loop's body is the layer's own
// backward, traced by olmax/trace/layer_loop.hpp, so scan_layers has no gradient rule of the graph.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/xla/graph/ir.hpp"

namespace olmax::xla::graph {

/// One layer, traced once into its own graph: arguments (carry, per-layer parameters..., shared
/// parameters..., layer index as an f32 scalar) -> new carry of the carry's type. The gradient's
/// body (built by olmax/trace/layer_loop.hpp) takes the output carry's gradient as one more
/// argument and returns the gradients of the carry, the per-layer and the shared parameters.
struct layer_body {
    std::shared_ptr<graph> g;
    std::vector<var> results;
    std::size_t per_layer = 0, shared = 0;

    const tensor_type& argument(std::size_t i) const { return g->at(g->inputs().at(i)).outputs[0]; }
    const tensor_type& carry() const { return argument(0); }
};

namespace detail {

/// A layer body's graph with its leading arguments made: carry, per-layer parameters, shared
/// parameters, layer index (what trace_layer and the tracer's loop bodies start from).
struct layer_arguments {
    var carry;
    std::vector<var> layer, shared;
    var index;
};
inline std::pair<std::shared_ptr<layer_body>, layer_arguments> new_layer_body(const tensor_type& carry, const std::vector<tensor_type>& per_layer,
                                                                              const std::vector<tensor_type>& shared) {
    auto body = std::make_shared<layer_body>();
    body->g = std::make_shared<graph>();
    body->per_layer = per_layer.size();
    body->shared = shared.size();
    graph& g = *body->g;
    layer_arguments a;
    a.carry = g.input(carry);
    for (const auto& t : per_layer) a.layer.push_back(g.input(t));
    for (const auto& t : shared) a.shared.push_back(g.input(t));
    a.index = g.input(f32({}));
    return {std::move(body), std::move(a)};
}

}  // namespace detail

/// Traces `f(g, carry, layer parameters, shared parameters, layer index)` once.
inline std::shared_ptr<const layer_body> trace_layer(
    const tensor_type& carry, const std::vector<tensor_type>& per_layer, const std::vector<tensor_type>& shared,
    const std::function<var(graph&, const var& carry, const std::vector<var>& layer, const std::vector<var>& shared, const var& index)>& f) {
    const auto [body, a] = detail::new_layer_body(carry, per_layer, shared);
    graph& g = *body->g;
    const var result = f(g, a.carry, a.layer, a.shared, a.index);
    body->results = {result};
    check<graph_error>(result.defined() && &result.owner() == &g && result.type() == carry,
                       "xla::graph: trace_layer: the body must return a value of its own graph of the carry's type ", carry.str());
    return body;
}

namespace detail {

/// A body's arguments: those the loop gives, then none for the rest of its graph's inputs (a kept
/// layer's forward runs its gradient's graph, whose last argument only the gradient reads).
inline std::vector<value> body_arguments(const layer_body& body, std::vector<value> args) {
    args.resize(body.g->inputs().size());
    return args;
}

/// The same for the reference evaluation: zeros for the rest of the graph's inputs.
inline std::vector<host_value> body_arguments(const layer_body& body, std::vector<host_value> args) {
    for (std::size_t i = args.size(); i < body.g->inputs().size(); ++i) {
        const tensor_type& type = body.argument(i);
        args.push_back({type, std::vector<double>(std::size_t(type.elements()), 0.0)});
    }
    return args;
}

inline host_value layer_of(const host_value& stacked, std::int64_t l) {
    host_value out{f32(dims_t(stacked.type.dims.begin() + 1, stacked.type.dims.end())), {}};
    const auto n = static_cast<std::size_t>(out.type.elements());
    out.data.assign(stacked.data.begin() + static_cast<std::ptrdiff_t>(std::size_t(l) * n),
                    stacked.data.begin() + static_cast<std::ptrdiff_t>(std::size_t(l + 1) * n));
    return out;
}

}  // namespace detail

/// The depth of a scan_layers node.
inline std::int64_t scan_depth(const node& n) { return n.outputs.at(1).dims.at(0); }

namespace prim {

/// carry_{l+1} = body(carry_l, stacked[.][l], shared..., l) for l = 0 .. depth-1, as ONE loop.
/// Returns the final carry; the node's second output holds every layer's input carry
/// [depth, carry...] for the gradient (emitted only when a gradient uses it). A body with more
/// results than the new carry (kept layers: the values its gradient reads) gives one more output
/// per extra result, its values of every iteration stacked [depth, ...]. Arguments of the body's
/// graph after the layer index get no value: the results must not depend on them.
struct scan_layers {
    static constexpr std::string_view name = "scan_layers";
    static constexpr gradient_in_tracer gradient{};
    static var make(const std::shared_ptr<const layer_body>& body, const var& carry, const std::vector<var>& stacked, const std::vector<var>& shared) {
        check<graph_error>(body && stacked.size() == body->per_layer && shared.size() == body->shared, "xla::graph: scan_layers: the body takes ",
                           body ? body->per_layer : 0, " stacked and ", body ? body->shared : 0, " shared parameters, got ", stacked.size(),
                           " and ", shared.size());
        check<graph_error>(carry.type() == body->carry(), "xla::graph: scan_layers: carry ", carry.type().str(), " does not match the body's ",
                           body->carry().str());
        check<graph_error>(!body->results.empty() && body->results[0].type() == carry.type(), "xla::graph: scan_layers: the body's first result must be the new carry, of type ",
                           carry.type().str());
        check<graph_error>(!stacked.empty() && !stacked.front().dims().empty(), "xla::graph: scan_layers: needs at least one stacked parameter (it gives the depth)");
        const std::int64_t depth = stacked.front().dims()[0];
        for (std::size_t i = 0; i < stacked.size(); ++i) {
            dims_t want{depth};
            const auto& layer = body->argument(1 + i).dims;
            want.insert(want.end(), layer.begin(), layer.end());
            check<graph_error>(stacked[i].dims() == want, "xla::graph: scan_layers: stacked parameter ", i, " is ", stacked[i].type().str(),
                               ", expected ", f32(want).str());
        }
        for (std::size_t i = 0; i < shared.size(); ++i)
            check<graph_error>(shared[i].type() == body->argument(1 + stacked.size() + i), "xla::graph: scan_layers: shared parameter ", i, " is ",
                               shared[i].type().str(), ", expected ", body->argument(1 + stacked.size() + i).str());
        node n;
        n.kind = op::of<scan_layers>();
        n.operands.push_back(carry);
        n.operands.insert(n.operands.end(), stacked.begin(), stacked.end());
        n.operands.insert(n.operands.end(), shared.begin(), shared.end());
        dims_t all{depth};
        all.insert(all.end(), carry.dims().begin(), carry.dims().end());
        n.outputs = {carry.type(), f32(all)};
        for (std::size_t k = 1; k < body->results.size(); ++k) {
            check<graph_error>(body->results[k].type().elem == element::f32, "xla::graph: scan_layers: stored result ", k, " is ",
                               body->results[k].type().str(), "; only f32 values are stored per layer");
            dims_t stacked_dims{depth};
            stacked_dims.insert(stacked_dims.end(), body->results[k].dims().begin(), body->results[k].dims().end());
            n.outputs.push_back(f32(stacked_dims));
        }
        n.body = body;
        n.stacked = stacked.size();
        return carry.owner().add(std::move(n));
    }
    /// `needed`: which of the node's outputs are used (the stored carries and the kept layers' saved
    /// values are emitted only then).
    static std::vector<value> emit(function_builder& b, const node& n, const std::vector<value>& in, const std::vector<bool>& needed) {
        const layer_body& body = *n.body;
        const std::int64_t depth = scan_depth(n);
        // carry of the loop: [l, carry, stacked..., shared..., stored outputs...], the stored outputs
        // being the needed ones of (carries, saved values...)
        std::vector<value> init{b.index(0)};
        init.insert(init.end(), in.begin(), in.end());
        std::vector<std::size_t> stored;  // output numbers
        for (std::size_t k = 1; k < n.outputs.size(); ++k)
            if (needed[k]) stored.push_back(k), init.push_back(b.constant(0.0, n.outputs[k]));
        const std::size_t params = in.size() - 1, first_stored = 1 + in.size();
        std::vector<var> results{body.results[0]};
        for (std::size_t k : stored)
            if (k >= 2) results.push_back(body.results[k - 1]);
        auto out = b.while_loop(
            init,
            [&](function_builder& r, const std::vector<value>& c) { return r.compare(c[0], r.index(depth), compare_direction::LT); },
            [&](function_builder& r, const std::vector<value>& c) {
                std::vector<value> args{c[1]};
                for (std::size_t k = 0; k < n.stacked; ++k) args.push_back(r.dynamic_index(c[2 + k], 0, c[0]));
                for (std::size_t k = n.stacked; k < params; ++k) args.push_back(c[2 + k]);
                args.push_back(r.convert(c[0], element::f32));
                const std::vector<value> y = detail::emit_graph(r, *body.g, detail::body_arguments(body, std::move(args)), results);
                std::vector<value> next = c;
                next[0] = r.add(c[0], r.index(1));
                next[1] = y[0];
                for (std::size_t s = 0, saved = 1; s < stored.size(); ++s)  // the carries hold each layer's input, the rest its results
                    next[first_stored + s] = r.dynamic_index_update(c[first_stored + s], 0, stored[s] == 1 ? c[1] : y[saved++], c[0]);
                return next;
            });
        std::vector<value> result(n.outputs.size());
        result[0] = out[1];
        for (std::size_t s = 0; s < stored.size(); ++s) result[stored[s]] = out[first_stored + s];
        return result;
    }
    static std::vector<host_value> evaluate(const node& n, const std::vector<const host_value*>& in) {
        const layer_body& body = *n.body;
        const std::int64_t depth = scan_depth(n);
        host_value carry = *in[0];
        std::vector<host_value> stored;  // carries [depth, ...], then the saved values' stacks
        for (std::size_t k = 1; k < n.outputs.size(); ++k) stored.push_back({n.outputs[k], {}});
        for (std::int64_t l = 0; l < depth; ++l) {
            stored[0].data.insert(stored[0].data.end(), carry.data.begin(), carry.data.end());
            std::vector<host_value> a{carry};
            for (std::size_t k = 0; k < n.stacked; ++k) a.push_back(detail::layer_of(*in[1 + k], l));
            for (std::size_t k = 1 + n.stacked; k < in.size(); ++k) a.push_back(*in[k]);
            a.push_back({f32({}), {double(l)}});
            const auto r = detail::evaluate_graph(*body.g, detail::body_arguments(body, std::move(a)), body.results);
            carry = r[0];
            for (std::size_t k = 1; k < r.size(); ++k) stored[k].data.insert(stored[k].data.end(), r[k].data.begin(), r[k].data.end());
        }
        std::vector<host_value> out{carry};
        out.insert(out.end(), stored.begin(), stored.end());
        return out;
    }
};

/// The reverse loop of scan_layers' gradient, over `body` (the traced gradient of a layer,
/// olmax/trace/layer_loop.hpp). Operands: the gradient of the final carry, then the carries the
/// forward loop stored [depth, ...] (or, `reverse` set: the body rebuilds each layer's input from its
/// output, the final carry), the stacked and the shared parameters, then the forward loop's stacked
/// values `saved` (kept layers). Outputs: the gradients of the initial carry and of every parameter.
struct scan_layers_backward {
    static constexpr std::string_view name = "scan_layers_backward";
    static constexpr no_gradient gradient{};
    static std::vector<var> make(const var& output_grad, const var& forward, std::shared_ptr<const layer_body> body, bool rebuilds,
                                 const std::vector<var>& stacked, const std::vector<var>& shared, std::vector<var> saved) {
        const node& loop = forward.owner().at(forward.node());
        check<graph_error>(loop.is<scan_layers>() && body && loop.outputs.size() == 2 + saved.size() && stacked.size() == loop.stacked,
                           "xla::graph: scan_layers_backward: the forward value is not a scan_layers loop of ", stacked.size(),
                           " stacked parameters storing ", saved.size(), " values");
        const tensor_type carry = loop.outputs[0];
        check<graph_error>(output_grad.type() == carry, "xla::graph: scan_layers_backward: the gradient ", output_grad.type().str(),
                           " does not match the carry ", carry.str());
        graph& g = forward.owner();
        node n;
        n.kind = op::of<scan_layers_backward>();
        n.stacked = stacked.size();
        n.body = body;
        n.rebuilds = rebuilds;
        n.operands = {output_grad, rebuilds ? var(&g, forward.node(), 0) : var(&g, forward.node(), 1)};  // the final carry, or the stored carries
        n.outputs.push_back(carry);
        for (const auto& w : stacked) {
            n.operands.push_back(w);
            n.outputs.push_back(w.type());
        }
        for (const auto& w : shared) {
            n.operands.push_back(w);
            n.outputs.push_back(w.type());
        }
        for (std::uint32_t k = 0; k < saved.size(); ++k) n.operands.push_back(var(&g, forward.node(), 2 + k));
        n.saved = std::move(saved);
        return detail::outputs_of(g.add(std::move(n)));
    }
    static std::vector<value> emit(function_builder& b, const node& n, const std::vector<value>& in, const std::vector<bool>&) {
        const layer_body& body = *n.body;
        const bool rebuilds = n.rebuilds;  // the body rebuilds the layer's input from its output
        const std::int64_t depth = n.operands[2].dims()[0];  // the first stacked parameter
        // in: g_final, carries [depth, ...] (or the final carry), stacked..., shared..., saved values [depth, ...]...;
        // loop carry: [l, g, carries (or the current carry), stacked..., shared..., saved..., g_stacked..., g_shared...]
        const std::size_t saved = n.saved.size(), params = in.size() - 2 - saved, first_grad = rebuilds ? 2 : 1;
        std::vector<value> init{b.index(depth - 1)};
        init.insert(init.end(), in.begin(), in.end());
        for (std::size_t k = 0; k < params; ++k) init.push_back(b.constant(0.0, in[2 + k].type));
        auto out = b.while_loop(
            init,
            [&](function_builder& r, const std::vector<value>& c) { return r.compare(c[0], r.index(0), compare_direction::GE); },
            [&](function_builder& r, const std::vector<value>& c) {
                std::vector<value> args{rebuilds ? c[2] : r.dynamic_index(c[2], 0, c[0])};
                for (std::size_t k = 0; k < n.stacked; ++k) args.push_back(r.dynamic_index(c[3 + k], 0, c[0]));
                for (std::size_t k = n.stacked; k < params; ++k) args.push_back(c[3 + k]);
                args.push_back(r.convert(c[0], element::f32));
                args.push_back(c[1]);
                detail::given_values given;  // this layer's saved values, read instead of recomputed
                for (std::size_t k = 0; k < saved; ++k) given.emplace_back(n.saved[k], r.dynamic_index(c[3 + params + k], 0, c[0]));
                // (input carry,) g carry, g layer..., g shared...
                const std::vector<value> grads = detail::emit_graph(r, *body.g, args, body.results, given);
                std::vector<value> next = c;
                next[0] = r.sub(c[0], r.index(1));
                next[1] = grads[first_grad - 1];
                if (rebuilds) next[2] = grads[0];
                const std::size_t acc = 3 + params + saved;
                for (std::size_t k = 0; k < n.stacked; ++k) next[acc + k] = r.dynamic_index_update(c[acc + k], 0, grads[first_grad + k], c[0]);
                for (std::size_t k = n.stacked; k < params; ++k) next[acc + k] = r.add(c[acc + k], grads[first_grad + k]);
                return next;
            });
        std::vector<value> result{out[1]};
        for (std::size_t k = 0; k < params; ++k) result.push_back(out[3 + params + saved + k]);
        return result;
    }
    static std::vector<host_value> evaluate(const node& n, const std::vector<const host_value*>& in) {
        // in: g_final, then the stored carries [depth, ...] or (reverse body) the final carry, then the parameters
        const layer_body& body = *n.body;
        const bool rebuilds = n.rebuilds;
        const std::int64_t depth = in[2]->type.dims[0];  // the first stacked parameter
        const std::size_t saved = n.saved.size(), params = in.size() - 2 - saved, first_grad = rebuilds ? 2 : 1;
        host_value g = *in[0], y = *in[1];
        std::vector<host_value> grads;
        for (std::size_t k = 0; k < params; ++k)
            grads.push_back({in[2 + k]->type, std::vector<double>(in[2 + k]->data.size(), 0.0)});
        for (std::int64_t l = depth - 1; l >= 0; --l) {
            std::vector<host_value> a{rebuilds ? y : detail::layer_of(*in[1], l)};
            for (std::size_t k = 0; k < n.stacked; ++k) a.push_back(detail::layer_of(*in[2 + k], l));
            for (std::size_t k = n.stacked; k < params; ++k) a.push_back(*in[2 + k]);
            a.push_back({f32({}), {double(l)}});
            a.push_back(g);
            detail::given_host_values kept;  // this layer's saved values, read instead of recomputed
            for (std::size_t k = 0; k < saved; ++k) kept.emplace_back(n.saved[k], detail::layer_of(*in[2 + params + k], l));
            const auto r = detail::evaluate_graph(*body.g, a, body.results, kept);
            if (rebuilds) y = r[0];
            g = r[first_grad - 1];
            for (std::size_t k = 0; k < params; ++k) {
                const std::size_t size = r[first_grad + k].data.size();
                const std::size_t at = k < n.stacked ? std::size_t(l) * size : 0;
                for (std::size_t e = 0; e < size; ++e) grads[k].data[at + e] += r[first_grad + k].data[e];
            }
        }
        std::vector<host_value> out{g};
        out.insert(out.end(), grads.begin(), grads.end());
        return out;
    }
};

}  // namespace prim

/// carry_{l+1} = body(carry_l, stacked[.][l], shared..., l) for l = 0 .. depth-1, as ONE loop (prim::scan_layers).
inline var scan_layers(const std::shared_ptr<const layer_body>& body, const var& carry, const std::vector<var>& stacked,
                       const std::vector<var>& shared) {
    return prim::scan_layers::make(body, carry, stacked, shared);
}

/// The gradient loop of the scan_layers loop `forward` (its final carry): prim::scan_layers_backward.
/// Returns the gradients of the initial carry, of the stacked and of the shared parameters.
inline std::vector<var> scan_layers_backward(const var& output_grad, const var& forward, std::shared_ptr<const layer_body> body, bool rebuilds,
                                             const std::vector<var>& stacked, const std::vector<var>& shared, std::vector<var> saved = {}) {
    return prim::scan_layers_backward::make(output_grad, forward, std::move(body), rebuilds, stacked, shared, std::move(saved));
}

}  // namespace olmax::xla::graph
