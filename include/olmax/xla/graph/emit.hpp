#pragma once
// Lowering of a traced program to ONE StableHLO module (function_builder), nodes the results do
// not need left out. `scan_layers` becomes one `stablehlo.while` whose body slices layer l's
// parameters out of the stacked [depth, ...] tensors (`dynamic_slice`) and runs the layer body
// traced once; `scan_layers_backward` is the same loop run from l = depth-1 down to 0, writing each
// layer's parameter gradient into its slot (`dynamic_update_slice`). Depth appears only in tensor
// types, so the module's text (and XLA's compile time) does not grow with it.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/xla/graph/graph.hpp"
#include "olmax/xla/stablehlo/function_builder.hpp"
#include "olmax/xla/stablehlo/module.hpp"
#include "olmax/xla/stablehlo/scan.hpp"
#include "olmax/xla/stablehlo/selective_scan.hpp"

namespace olmax::xla::graph {

namespace detail {

using stablehlo::function_builder;
using stablehlo::value;

/// Values of a graph given from outside instead of computed (kept layers' saved values).
using given_values = std::vector<std::pair<var, value>>;

inline const value* given_value(const given_values& given, const var& v) {
    for (const auto& [at, x] : given)
        if (at == v) return &x;
    return nullptr;
}

/// Which outputs of which nodes `results` need (a given value needs nothing of its node).
inline std::vector<std::vector<bool>> needed_outputs(const graph& g, const std::vector<var>& results, const given_values& given = {}) {
    std::vector<std::vector<bool>> needed(g.nodes().size());
    for (std::size_t i = 0; i < needed.size(); ++i) needed[i].assign(g.at(static_cast<std::uint32_t>(i)).outputs.size(), false);
    auto need = [&](const var& v) {
        if (!given_value(given, v)) needed[v.node()][v.output()] = true;
    };
    for (const auto& r : results) need(r);
    for (std::size_t i = needed.size(); i-- > 0;) {
        bool any = false;
        for (bool b : needed[i]) any = any || b;
        if (!any) continue;
        for (const auto& operand : g.at(static_cast<std::uint32_t>(i)).operands) need(operand);
    }
    return needed;
}

inline std::vector<value> emit_graph(function_builder& b, const graph& g, const std::vector<value>& args, const std::vector<var>& results,
                                     const given_values& given = {});

/// A body's arguments: those the loop gives, then none for the rest of its graph's inputs (a kept
/// layer's forward runs its gradient's graph, whose last argument only the gradient reads).
inline std::vector<value> body_arguments(const layer_body& body, std::vector<value> args) {
    args.resize(body.g->inputs().size());
    return args;
}

/// `needed`: which of the node's outputs are used (the stored carries and the kept layers' saved
/// values are emitted only then).
inline std::vector<value> emit_scan_layers(function_builder& b, const node& n, const std::vector<value>& in, const std::vector<bool>& needed) {
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
            const std::vector<value> y = emit_graph(r, *body.g, body_arguments(body, std::move(args)), results);
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

inline std::vector<value> emit_scan_layers_backward(function_builder& b, const node& n, const std::vector<value>& in) {
    const layer_body& body = *n.body;
    const bool rebuilds = n.reverse != nullptr;  // the body rebuilds the layer's input from its output
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
            given_values given;  // this layer's saved values, read instead of recomputed
            for (std::size_t k = 0; k < saved; ++k) given.emplace_back(n.saved[k], r.dynamic_index(c[3 + params + k], 0, c[0]));
            // (input carry,) g carry, g layer..., g shared...
            const std::vector<value> grads = emit_graph(r, *body.g, args, body.results, given);
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

inline std::vector<value> emit_graph(function_builder& b, const graph& g, const std::vector<value>& args, const std::vector<var>& results,
                                     const given_values& given) {
    check<graph_error>(args.size() == g.inputs().size(), "xla::graph: emitting a graph of ", g.inputs().size(), " inputs with ", args.size(),
                       " arguments");
    const auto needed = needed_outputs(g, results, given);
    auto value_of = [&](const std::vector<std::vector<value>>& v, const var& x) {
        const value* from_outside = given_value(given, x);
        return from_outside ? *from_outside : v[x.node()][x.output()];
    };
    std::vector<std::vector<value>> v(g.nodes().size());
    for (std::size_t i = 0; i < args.size(); ++i) v[g.inputs()[i]] = {args[i]};
    for (std::uint32_t i = 0; i < g.nodes().size(); ++i) {
        const node& n = g.at(i);
        bool any = false;
        for (bool x : needed[i]) any = any || x;
        if (!any || n.kind == op::input) continue;
        std::vector<value> in;
        for (const auto& operand : n.operands) in.push_back(value_of(v, operand));
        auto one = [&](value x) { v[i] = {std::move(x)}; };
        switch (n.kind) {
            case op::input: break;
            case op::constant: one(n.values ? b.dense_constant(*n.values, n.outputs[0]) : b.constant(n.scalar, n.outputs[0])); break;
            case op::iota: one(b.convert(b.iota({n.outputs[0].dims, element::i32}, n.axis), element::f32)); break;
            case op::add: one(b.add(in[0], in[1])); break;
            case op::subtract: one(b.sub(in[0], in[1])); break;
            case op::multiply: one(b.mul(in[0], in[1])); break;
            case op::divide: one(b.div(in[0], in[1])); break;
            case op::maximum: one(b.max(in[0], in[1])); break;
            case op::negate: one(b.unary("negate", in[0])); break;
            case op::exponential: one(b.unary("exponential", in[0])); break;
            case op::log: one(b.unary("log", in[0])); break;
            case op::tanh: one(b.unary("tanh", in[0])); break;
            case op::logistic: one(b.unary("logistic", in[0])); break;
            case op::sqrt: one(b.unary("sqrt", in[0])); break;
            case op::floor: one(b.unary("floor", in[0])); break;
            case op::slice: {
                dims_t limit;
                for (std::size_t d = 0; d < n.dims.size(); ++d) limit.push_back(n.dims[d] + n.outputs[0].dims[d]);
                one(b.slice(in[0], n.dims, limit));
                break;
            }
            case op::pad: {
                const auto rank = static_cast<std::ptrdiff_t>(in[0].type.rank());
                one(b.pad(in[0], 0.0, dims_t(n.dims.begin(), n.dims.begin() + rank), dims_t(n.dims.begin() + rank, n.dims.end())));
                break;
            }
            case op::concatenate: one(b.concatenate(in, n.axis)); break;
            case op::linear_scan:
                if (n.axis == 0) {
                    one(stablehlo::emit_scan(b, n.scan, in[0], in[1]));
                } else {  // from the end: the forward scan of the time-reversed rows, reversed back
                    one(b.reverse(stablehlo::emit_scan(b, n.scan, b.reverse(in[0], {1}), b.reverse(in[1], {1})), {1}));
                }
                break;
            case op::gather_rows: one(b.gather_rows(in[0], b.convert(in[1], element::i32))); break;
            case op::scatter_add_rows: one(b.scatter_add_rows(b.constant(0.0, n.outputs[0]), b.convert(in[1], element::i32), in[0])); break;
            case op::selective_scan:
                v[i] = n.native_call ? b.custom_call(stablehlo::native_call::selective_scan, in, n.outputs, {{"chunk", n.axis}})
                                     : stablehlo::emit_selective_scan(b, n.axis, needed[i][2], in[0], in[1], in[2], in[3], in[4], in[5], in[6]);
                break;
            case op::selective_scan_backward:
                v[i] = n.native_call ? b.custom_call(stablehlo::native_call::selective_scan_backward, in, n.outputs, {{"chunk", n.axis}})
                                     : stablehlo::emit_selective_scan_backward(b, n.axis, in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], in[8]);
                break;
            case op::compare: one(b.compare(in[0], in[1], n.direction)); break;
            case op::select: one(b.select(in[0], in[1], in[2])); break;
            case op::stop_gradient: one(in[0]); break;
            case op::dot: {  // rank 3: dimension 0 is the batch, the contracting ones follow it
                const std::int64_t batch = std::int64_t(in[0].type.rank()) - 2;
                const dims_t batch_dims = batch ? dims_t{0} : dims_t{};
                one(b.dot_general(in[0], in[1], batch_dims, batch_dims, {batch + n.dims[0]}, {batch + n.dims[1]}));
                break;
            }
            case op::reduce_sum: one(b.reduce(in[0], 0.0, n.dims, "add")); break;
            case op::reduce_max: one(b.reduce(in[0], -3.4028234663852886e38, n.dims, "maximum")); break;
            case op::broadcast_in_dim: one(b.broadcast_in_dim(in[0], n.outputs[0].dims, n.dims)); break;
            case op::reshape: one(b.reshape(in[0], n.outputs[0].dims)); break;
            case op::transpose: one(b.transpose(in[0], n.dims)); break;
            case op::scan_layers: v[i] = emit_scan_layers(b, n, in, needed[i]); break;
            case op::scan_layers_backward: v[i] = emit_scan_layers_backward(b, n, in); break;
            case op::all_reduce_sum: one(n.axis == 1 ? in[0] : b.all_reduce_sum(in[0], n.axis)); break;
        }
    }
    std::vector<value> out;
    for (const auto& r : results) out.push_back(value_of(v, r));
    return out;
}

}  // namespace detail

/// Data parallelism by XLA's SPMD partitioner: the program is written for the global batch and
/// compiled for `devices` devices; `split_inputs` (inputs of the graph, e.g. the batch) are split
/// along their first axis, one equal share per device, everything else is replicated. The
/// partitioner inserts the collectives the split implies (the all-reduce of a gradient summed over
/// the batch), so the traced program has none.
struct spmd_partitioning {
    std::size_t devices = 1;
    std::vector<var> split_inputs{};
};

/// The program as a StableHLO module: `@main` takes the graph's inputs in the order they were made
/// and returns `results`. `name` becomes the module name and the start of its cache key. With
/// `donated_state` = k, inputs 0 .. k-1 are donated to the last k results (a step's state, which the
/// device then updates in place instead of holding the old and the new copy at once). With
/// `spmd.devices` > 1 the module is annotated for the SPMD partitioner (spmd_partitioning).
inline stablehlo::emitted_module emit(const graph& g, std::string_view name, const std::vector<var>& results, std::size_t donated_state = 0,
                                      const spmd_partitioning& spmd = {}) {
    check<graph_error>(!results.empty(), "xla::graph: emit: no results");
    std::vector<tensor_type> inputs;
    for (auto i : g.inputs()) inputs.push_back(g.at(i).outputs[0]);
    for (const auto& r : results)
        check<graph_error>(&r.owner() == &g && r.type().elem == element::f32, "xla::graph: emit: results must be f32 values of this graph");
    check<graph_error>(donated_state <= inputs.size() && donated_state <= results.size(), "xla::graph: emit: ", donated_state,
                       " donated state tensors for ", inputs.size(), " inputs and ", results.size(), " results");
    stablehlo::function_builder b(inputs);
    for (std::size_t i = 0; i < donated_state; ++i) {
        const std::size_t out = results.size() - donated_state + i;
        check<graph_error>(results[out].type() == inputs[i], "xla::graph: emit: state ", i, " enters as ", inputs[i].str(), " but leaves as ",
                           results[out].type().str(), ", so it cannot be updated in place");
        b.alias_output(i, out);
    }
    std::vector<bool> split(inputs.size(), false);
    if (spmd.devices > 1) {
        for (const auto& x : spmd.split_inputs) {
            const auto at = std::find(g.inputs().begin(), g.inputs().end(), x.node());
            check<graph_error>(&x.owner() == &g && at != g.inputs().end(), "xla::graph: emit: a value to split over the devices is not an input of this graph");
            split[std::size_t(at - g.inputs().begin())] = true;
        }
        b.partition(spmd.devices, split);
    }
    const auto values = detail::emit_graph(b, g, b.args(), results);
    stablehlo::emitted_module m;
    m.partitions = std::max<std::size_t>(spmd.devices, 1);
    m.split_leading = split;
    m.text = b.finish(name, values);
    m.key = std::string(name) + "." + std::to_string(std::hash<std::string>{}(m.text));
    m.inputs = inputs;
    for (const auto& r : results) m.outputs.push_back(r.type());
    m.donated = donated_state;
    return m;
}

}  // namespace olmax::xla::graph
