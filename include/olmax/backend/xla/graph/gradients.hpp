#pragma once
// Reverse mode on the traced program: every primitive's vector-Jacobian product, written with the
// primitives themselves, so the gradient is more graph in the same module (forward, backward and
// the optimiser update compile as one program). `scan_layers` differentiates into one reverse loop
// (`scan_layers_backward`) over the layer body's own gradient graph, traced once: the gradient's
// size does not grow with depth either.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "olmax/backend/xla/graph/graph.hpp"

namespace olmax::xla::graph {

namespace detail {

/// Copies the nodes of `src` that `results` need into `dst`, with src's inputs replaced by `args`;
/// returns the copies of `results` (inlining a traced body).
inline std::vector<var> inline_graph(graph& dst, const graph& src, const std::vector<var>& args, const std::vector<var>& results) {
    check<graph_error>(args.size() == src.inputs().size(), "xla::graph: inlining a graph of ", src.inputs().size(), " inputs with ",
                       args.size(), " arguments");
    std::vector<std::vector<var>> copy(src.nodes().size());
    for (std::size_t i = 0; i < args.size(); ++i) copy[src.inputs()[i]] = {args[i]};
    for (std::uint32_t i = 0; i < src.nodes().size(); ++i) {
        const node& n = src.at(i);
        if (n.kind == op::input) continue;
        node c = n;
        for (auto& operand : c.operands) operand = copy[operand.node()][operand.output()];
        std::vector<var>& outs = copy[i];
        if (c.operands.empty()) {
            outs.push_back(dst.add(std::move(c)));  // constant, iota
        } else {
            const var first = commit(std::move(c));
            for (std::uint32_t o = 0; o < n.outputs.size(); ++o) outs.emplace_back(&dst, first.node(), o);
        }
    }
    std::vector<var> out;
    for (const auto& r : results) out.push_back(copy[r.node()][r.output()]);
    return out;
}

/// The kept dimensions 0 .. rank-1 except `removed`.
inline dims_t kept_dims(std::size_t rank, const dims_t& removed) {
    dims_t kept;
    for (std::int64_t d = 0; d < static_cast<std::int64_t>(rank); ++d) {
        bool gone = false;
        for (auto r : removed) gone |= r == d;
        if (!gone) kept.push_back(d);
    }
    return kept;
}

/// The gradient of broadcast_in_dim(x, dims): g summed back to x's shape.
inline var unbroadcast(const var& g, const tensor_type& x, const dims_t& dims) {
    dims_t axes;
    for (std::int64_t d = 0; d < static_cast<std::int64_t>(g.type().rank()); ++d) {
        bool mapped = false, expanded = false;
        for (std::size_t i = 0; i < dims.size(); ++i)
            if (dims[i] == d) {
                mapped = true;
                expanded = x.dims[i] == 1 && g.dims()[static_cast<std::size_t>(d)] != 1;
            }
        if (!mapped || expanded) axes.push_back(d);
    }
    const var summed = axes.empty() ? g : sum(g, axes);
    return summed.dims() == x.dims ? summed : reshape(summed, x.dims);
}

/// The gradient loop's body for `forward`: arguments (carry, layer..., shared..., index, g_out),
/// results (g_carry, g_layer..., g_shared...), the forward recomputed inside from the carry.
inline std::shared_ptr<const layer_body> layer_gradient_body(const layer_body& forward);

}  // namespace detail

/// Vector-Jacobian product: sum_k <cotangents[k], d outputs[k] / d wrt> for each var in `wrt`, as
/// new vars of the same graph (zeros where a wrt does not reach the outputs). Throws graph_error
/// naming the primitive when the path crosses one without a gradient rule.
inline std::vector<var> vjp(const std::vector<var>& outputs, const std::vector<var>& cotangents, const std::vector<var>& wrt) {
    check<graph_error>(!outputs.empty() && outputs.size() == cotangents.size(), "xla::graph: vjp takes one cotangent per output, got ",
                       cotangents.size(), " for ", outputs.size());
    graph& g = outputs.front().owner();
    for (std::size_t k = 0; k < outputs.size(); ++k)
        check<graph_error>(&outputs[k].owner() == &g && &cotangents[k].owner() == &g && outputs[k].type() == cotangents[k].type(),
                           "xla::graph: vjp: cotangent ", k, " is ", cotangents[k].type().str(), " for an output of ", outputs[k].type().str());
    const std::size_t count = g.nodes().size();  // nodes appended below are not visited

    std::vector<bool> depends(count, false);
    for (const auto& w : wrt) {
        check<graph_error>(&w.owner() == &g, "xla::graph: vjp: a wrt var belongs to another graph");
        depends[w.node()] = true;
    }
    for (std::uint32_t i = 0; i < count; ++i)
        for (const auto& operand : g.at(i).operands) depends[i] = depends[i] || depends[operand.node()];

    std::map<std::pair<std::uint32_t, std::uint32_t>, var> adjoint;
    auto contribute = [&](const var& target, const var& value) {
        if (!depends[target.node()]) return;
        auto [it, fresh] = adjoint.try_emplace({target.node(), target.output()}, value);
        if (!fresh) it->second = it->second + value;
    };
    for (std::size_t k = 0; k < outputs.size(); ++k) contribute(outputs[k], cotangents[k]);

    for (std::uint32_t i = static_cast<std::uint32_t>(count); i-- > 0;) {
        if (!depends[i] || g.at(i).kind == op::input) continue;
        const node n = g.at(i);  // a copy: the rules below append to g.nodes()
        std::vector<var> out_grad(n.outputs.size());
        bool any = false;
        for (std::uint32_t o = 0; o < n.outputs.size(); ++o) {
            auto it = adjoint.find({i, o});
            if (it != adjoint.end()) {
                out_grad[o] = it->second;
                any = true;
            }
        }
        if (!any) continue;
        const var y(&g, i, 0);
        const var& gy = out_grad[0];
        auto operand = [&](std::size_t k) -> const var& { return n.operands[k]; };
        switch (n.kind) {
            case op::add: contribute(operand(0), gy); contribute(operand(1), gy); break;
            case op::subtract: contribute(operand(0), gy); contribute(operand(1), -gy); break;
            case op::multiply:
                contribute(operand(0), gy * operand(1));
                contribute(operand(1), gy * operand(0));
                break;
            case op::divide:  // y = a / b: da = g / b, db = -g y / b
                contribute(operand(0), gy / operand(1));
                contribute(operand(1), -(gy * y) / operand(1));
                break;
            case op::maximum: {  // ties go to the first operand
                const var first = compare(operand(0), operand(1), compare_direction::GE);
                const var zero = constant_like(gy, 0.0);
                contribute(operand(0), select(first, gy, zero));
                contribute(operand(1), select(first, zero, gy));
                break;
            }
            case op::negate: contribute(operand(0), -gy); break;
            case op::exponential: contribute(operand(0), gy * y); break;
            case op::log: contribute(operand(0), gy / operand(0)); break;
            case op::tanh: contribute(operand(0), gy * (1.0 - y * y)); break;
            case op::logistic: contribute(operand(0), gy * (y * (1.0 - y))); break;
            case op::sqrt: contribute(operand(0), (gy * 0.5) / y); break;
            case op::select: {
                const var zero = constant_like(gy, 0.0);
                contribute(operand(1), select(operand(0), gy, zero));
                contribute(operand(2), select(operand(0), zero, gy));
                break;
            }
            case op::stop_gradient:
            case op::floor:
            case op::compare:
            case op::constant:
            case op::iota: break;  // no gradient flows through these
            case op::dot: {
                // y[i, j] = sum_k a[.., k ..] b[.., k ..]; a's free dim is i, b's is j.
                const std::int64_t ca = n.dims[0], cb = n.dims[1];
                const var ga = dot(gy, operand(1), 1, 1 - cb);  // [a free, a contract]
                contribute(operand(0), ca == 1 ? ga : transpose(ga, {1, 0}));
                const var gb = dot(operand(0), gy, 1 - ca, 0);  // [b contract, b free]
                contribute(operand(1), cb == 0 ? gb : transpose(gb, {1, 0}));
                break;
            }
            case op::reduce_sum:
                contribute(operand(0), broadcast_in_dim(gy, operand(0).dims(), detail::kept_dims(operand(0).type().rank(), n.dims)));
                break;
            case op::reduce_max: {  // split evenly among tied maxima
                const dims_t kept = detail::kept_dims(operand(0).type().rank(), n.dims);
                const var at_max = compare(operand(0), broadcast_in_dim(y, operand(0).dims(), kept), compare_direction::EQ);
                const var one = constant_like(operand(0), 1.0), zero = constant_like(operand(0), 0.0);
                const var ties = sum(select(at_max, one, zero), n.dims);
                contribute(operand(0), select(at_max, broadcast_in_dim(gy / ties, operand(0).dims(), kept), zero));
                break;
            }
            case op::broadcast_in_dim: contribute(operand(0), detail::unbroadcast(gy, operand(0).type(), n.dims)); break;
            case op::reshape: contribute(operand(0), reshape(gy, operand(0).dims())); break;
            case op::transpose: {
                dims_t inverse(n.dims.size());
                for (std::size_t d = 0; d < n.dims.size(); ++d) inverse[static_cast<std::size_t>(n.dims[d])] = static_cast<std::int64_t>(d);
                contribute(operand(0), transpose(gy, inverse));
                break;
            }
            case op::scan_layers: {
                check<graph_error>(!out_grad[1].defined(), "xla::graph: scan_layers: its stored carries have no gradient rule");
                node b;
                b.kind = op::scan_layers_backward;
                b.stacked = n.stacked;
                if (n.reverse) {  // walk back from the final carry, rebuilding each layer's input
                    b.body = n.reverse;
                    b.reverse = n.reverse;
                    b.operands = {gy, y};
                } else {  // read each layer's input from the carries the forward loop stores
                    b.body = detail::layer_gradient_body(*n.body);
                    b.operands = {gy, var(&g, i, 1)};
                }
                b.operands.insert(b.operands.end(), n.operands.begin() + 1, n.operands.end());  // stacked..., shared...
                for (const auto& o : n.operands) b.outputs.push_back(o.type());              // g carry, g stacked..., g shared...
                const var first = g.add(std::move(b));
                for (std::uint32_t k = 0; k < n.operands.size(); ++k) contribute(operand(k), var(&g, first.node(), k));
                break;
            }
            case op::all_reduce_sum: contribute(operand(0), all_reduce_sum(gy, n.axis)); break;
            case op::slice: {  // the gradient lands where the block was taken; zeros elsewhere
                dims_t high;
                for (std::size_t d = 0; d < n.dims.size(); ++d) high.push_back(operand(0).dims()[d] - n.dims[d] - gy.dims()[d]);
                contribute(operand(0), pad(gy, n.dims, high));
                break;
            }
            case op::pad: {
                const std::size_t rank = operand(0).type().rank();
                const dims_t low(n.dims.begin(), n.dims.begin() + static_cast<std::ptrdiff_t>(rank));
                dims_t limit;
                for (std::size_t d = 0; d < rank; ++d) limit.push_back(low[d] + operand(0).dims()[d]);
                contribute(operand(0), slice(gy, low, limit));
                break;
            }
            case op::concatenate: {
                const auto a = static_cast<std::size_t>(n.axis);
                std::int64_t at = 0;
                for (std::size_t k = 0; k < n.operands.size(); ++k) {
                    dims_t start(gy.type().rank(), 0), limit = gy.dims();
                    start[a] = at;
                    limit[a] = at + operand(k).dims()[a];
                    at = limit[a];
                    contribute(operand(k), slice(gy, start, limit));
                }
                break;
            }
            case op::linear_scan: {
                // Forward h_t = a_t h_{t-1} + x_t: the adjoint delta_t = g_t + a_{t+1} delta_{t+1} is the
                // same recurrence run from the end with the gates one step earlier; dx = delta and
                // da_t = delta_t h_{t-1} (h_{-1} = 0). The reverse scan mirrors it. Only h is kept.
                const bool reverse = n.axis != 0;
                const var delta = linear_scan_rows(shift(operand(0), 1, reverse ? 1 : -1), gy, n.scan, !reverse);
                contribute(operand(1), delta);
                contribute(operand(0), delta * shift(y, 1, reverse ? -1 : 1));
                break;
            }
            case op::input: break;
            case op::scan_layers_backward:
                throw graph_error(olmax::detail::concat("xla::graph: no gradient rule for ", op_name(n.kind),
                                                        " (gradients of gradients through a layer loop)"));
        }
    }
    std::vector<var> result;
    for (const auto& w : wrt) {
        auto it = adjoint.find({w.node(), w.output()});
        result.push_back(it != adjoint.end() ? it->second : constant_like(w, 0.0));
    }
    return result;
}

/// d output / d wrt for a scalar f32 `output`.
inline std::vector<var> gradients(const var& output, const std::vector<var>& wrt) {
    check<graph_error>(output.type() == f32({}), "xla::graph: gradients of a non-scalar ", output.type().str(),
                       " (reduce it to a scalar loss, or use vjp with a cotangent)");
    return vjp({output}, {constant_like(output, 1.0)}, wrt);
}

namespace detail {

inline std::shared_ptr<const layer_body> layer_gradient_body(const layer_body& forward) {
    auto body = std::make_shared<layer_body>();
    body->g = std::make_shared<graph>();
    graph& g = *body->g;
    std::vector<var> args;
    for (std::size_t i = 0; i < forward.g->inputs().size(); ++i) args.push_back(g.input(forward.argument(i)));
    const var g_out = g.input(forward.carry());
    const var out = inline_graph(g, *forward.g, args, forward.results)[0];
    std::vector<var> wrt(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(1 + forward.per_layer + forward.shared));
    body->results = vjp({out}, {g_out}, wrt);
    body->per_layer = forward.per_layer;
    body->shared = forward.shared;
    return body;
}

}  // namespace detail

}  // namespace olmax::xla::graph
