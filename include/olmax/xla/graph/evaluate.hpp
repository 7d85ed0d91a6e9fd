#pragma once
// The reference semantics of a traced program: every primitive evaluated on the host in double
// precision, straight loops, no device. The tests check each gradient rule against finite
// differences of this evaluation, and the emitted module's results (run by a PJRT plugin) against it.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "olmax/xla/graph/graph.hpp"

namespace olmax::xla::graph {

/// A dense row-major host tensor (i1 values as 0 / 1).
struct host_value {
    tensor_type type;
    std::vector<double> data;
};

namespace detail {

inline std::vector<std::int64_t> strides_of(const dims_t& dims) {
    std::vector<std::int64_t> s(dims.size(), 1);
    for (std::size_t d = dims.size(); d-- > 1;) s[d - 1] = s[d] * dims[d];
    return s;
}

/// Calls f(flat index, multi-index) for every element of `dims`.
template <class F>
void for_each_index(const dims_t& dims, F&& f) {
    std::int64_t total = 1;
    for (auto d : dims) total *= d;
    std::vector<std::int64_t> index(dims.size(), 0);
    for (std::int64_t flat = 0; flat < total; ++flat) {
        f(flat, index);
        for (std::size_t d = dims.size(); d-- > 0;) {
            if (++index[d] < dims[d]) break;
            index[d] = 0;
        }
    }
}

/// Calls f(flat index in the block, flat index in the whole) for every element of a block of
/// `block` dims placed at `start` inside a tensor of `whole` dims (slice reads such a block, pad and
/// concatenate write one).
template <class F>
void for_each_in_block(const dims_t& block, const dims_t& whole, const dims_t& start, F&& f) {
    const auto whole_strides = strides_of(whole);
    for_each_index(block, [&](std::int64_t flat, const std::vector<std::int64_t>& idx) {
        std::int64_t w = 0;
        for (std::size_t d = 0; d < idx.size(); ++d) w += (idx[d] + start[d]) * whole_strides[d];
        f(std::size_t(flat), std::size_t(w));
    });
}

/// Values of a graph given from outside instead of computed (kept layers' saved values).
using given_host_values = std::vector<std::pair<var, host_value>>;

inline std::vector<host_value> evaluate_graph(const graph& g, const std::vector<host_value>& args, const std::vector<var>& results,
                                              const given_host_values& given = {});

/// A body's arguments: those the loop gives, then zeros for the rest of its graph's inputs (a kept
/// layer's forward runs its gradient's graph, whose last argument only the gradient reads).
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

/// selective_scan in double, every state kept: (y, h_last, the states entering each chunk).
/// in: u, delta [B, T, E], A [E, N], Bm, C [B, T, N], keep [B, T], h0 [B, E, N].
struct selective_scan_states {
    std::size_t batch, steps, channels, states;
    std::vector<double> h;  // [B, T + 1, E, N]: h[b, t] is the state entering step t
    double& at(std::size_t b, std::size_t t, std::size_t e, std::size_t n) { return h[((b * (steps + 1) + t) * channels + e) * states + n]; }
};
inline selective_scan_states run_selective_scan(const std::vector<const host_value*>& in) {
    const dims_t& d = in[0]->type.dims;
    selective_scan_states s{std::size_t(d[0]), std::size_t(d[1]), std::size_t(d[2]), std::size_t(in[2]->type.dims[1]), {}};
    s.h.assign(s.batch * (s.steps + 1) * s.channels * s.states, 0.0);
    const auto &u = in[0]->data, &delta = in[1]->data, &A = in[2]->data, &Bm = in[3]->data, &keep = in[5]->data, &h0 = in[6]->data;
    for (std::size_t b = 0; b < s.batch; ++b)
        for (std::size_t e = 0; e < s.channels; ++e)
            for (std::size_t n = 0; n < s.states; ++n) {
                s.at(b, 0, e, n) = h0[(b * s.channels + e) * s.states + n];
                for (std::size_t t = 0; t < s.steps; ++t) {
                    const std::size_t bte = (b * s.steps + t) * s.channels + e;
                    const double abar = std::exp(delta[bte] * A[e * s.states + n]) * keep[b * s.steps + t];
                    s.at(b, t + 1, e, n) = abar * s.at(b, t, e, n) + delta[bte] * u[bte] * Bm[(b * s.steps + t) * s.states + n];
                }
            }
    return s;
}
inline std::vector<host_value> selective_scan_reference(const node& nd, const std::vector<const host_value*>& in) {
    selective_scan_states s = run_selective_scan(in);
    const auto chunk = std::size_t(nd.axis);
    std::vector<host_value> out;
    for (const auto& type : nd.outputs) out.push_back({type, std::vector<double>(std::size_t(type.elements()), 0.0)});
    const auto& C = in[4]->data;
    for (std::size_t b = 0; b < s.batch; ++b)
        for (std::size_t e = 0; e < s.channels; ++e)
            for (std::size_t n = 0; n < s.states; ++n) {
                for (std::size_t t = 0; t < s.steps; ++t)
                    out[0].data[(b * s.steps + t) * s.channels + e] += C[(b * s.steps + t) * s.states + n] * s.at(b, t + 1, e, n);
                out[1].data[(b * s.channels + e) * s.states + n] = s.at(b, s.steps, e, n);
                const std::size_t chunks = std::size_t(nd.outputs[2].dims[1]);
                for (std::size_t c = 0; c < chunks; ++c) out[2].data[((b * chunks + c) * s.channels + e) * s.states + n] = s.at(b, c * chunk, e, n);
            }
    return out;
}
/// selective_scan_backward in double (the states are recomputed from the first checkpoint, which is h0).
/// in: u, delta, A, Bm, C, keep, checkpoints, gy, gh.
inline std::vector<host_value> selective_scan_backward_reference(const node& nd, const std::vector<const host_value*>& in) {
    const host_value& checkpoints = *in[6];
    host_value h0{in[8]->type, {}};
    const std::size_t state_size = std::size_t(in[8]->type.elements()), chunks = std::size_t(checkpoints.type.dims[1]);
    const std::size_t per_batch = state_size / std::size_t(in[8]->type.dims[0]);
    for (std::size_t b = 0; b < std::size_t(in[8]->type.dims[0]); ++b)
        h0.data.insert(h0.data.end(), checkpoints.data.begin() + std::ptrdiff_t(b * chunks * per_batch),
                       checkpoints.data.begin() + std::ptrdiff_t((b * chunks + 1) * per_batch));
    selective_scan_states s = run_selective_scan({in[0], in[1], in[2], in[3], in[4], in[5], &h0});
    std::vector<host_value> out;
    for (const auto& type : nd.outputs) out.push_back({type, std::vector<double>(std::size_t(type.elements()), 0.0)});
    const auto &u = in[0]->data, &delta = in[1]->data, &A = in[2]->data, &Bm = in[3]->data, &C = in[4]->data, &keep = in[5]->data;
    const auto &gy = in[7]->data, &gh = in[8]->data;
    auto &du = out[0].data, &ddelta = out[1].data, &dA = out[2].data, &dB = out[3].data, &dC = out[4].data, &dh0 = out[5].data;
    for (std::size_t b = 0; b < s.batch; ++b)
        for (std::size_t e = 0; e < s.channels; ++e)
            for (std::size_t n = 0; n < s.states; ++n) {
                double g = gh[(b * s.channels + e) * s.states + n];
                for (std::size_t t = s.steps; t-- > 0;) {
                    const std::size_t bte = (b * s.steps + t) * s.channels + e, btn = (b * s.steps + t) * s.states + n;
                    g += C[btn] * gy[bte];
                    dC[btn] += gy[bte] * s.at(b, t + 1, e, n);
                    const double abar = std::exp(delta[bte] * A[e * s.states + n]) * keep[b * s.steps + t];
                    const double decay_grad = g * abar * s.at(b, t, e, n);
                    du[bte] += delta[bte] * g * Bm[btn];
                    ddelta[bte] += u[bte] * g * Bm[btn] + A[e * s.states + n] * decay_grad;
                    dA[e * s.states + n] += delta[bte] * decay_grad;
                    dB[btn] += g * delta[bte] * u[bte];
                    g *= abar;
                }
                dh0[(b * s.channels + e) * s.states + n] = g;
            }
    return out;
}

}  // namespace detail

/// Evaluates `results` of `g` on `inputs` (one per graph input, in order) in double precision.
inline std::vector<host_value> evaluate(const graph& g, const std::vector<host_value>& inputs, const std::vector<var>& results) {
    return detail::evaluate_graph(g, inputs, results);
}

namespace detail {

inline std::vector<host_value> evaluate_graph(const graph& g, const std::vector<host_value>& args, const std::vector<var>& results,
                                              const given_host_values& given) {
    check<graph_error>(args.size() == g.inputs().size(), "xla::graph: evaluate: ", args.size(), " inputs for a graph of ", g.inputs().size());
    auto value_of = [&](const std::vector<std::vector<host_value>>& v, const var& x) -> const host_value& {
        for (const auto& [at, value] : given)
            if (at == x) return value;
        return v[x.node()][x.output()];
    };
    std::vector<std::vector<host_value>> v(g.nodes().size());
    for (std::size_t i = 0; i < args.size(); ++i) {
        const tensor_type& want = g.at(g.inputs()[i]).outputs[0];
        check<graph_error>(args[i].type == want && args[i].data.size() == std::size_t(want.elements()), "xla::graph: evaluate: input ", i,
                           " is ", args[i].type.str(), " with ", args[i].data.size(), " values, expected ", want.str());
        v[g.inputs()[i]] = {args[i]};
    }
    for (std::uint32_t i = 0; i < g.nodes().size(); ++i) {
        const node& n = g.at(i);
        if (n.kind == op::input) continue;
        std::vector<const host_value*> in;
        for (const auto& operand : n.operands) in.push_back(&value_of(v, operand));
        host_value out{n.outputs[0], std::vector<double>(std::size_t(n.outputs[0].elements()), 0.0)};
        auto map1 = [&](auto f) { for (std::size_t k = 0; k < out.data.size(); ++k) out.data[k] = f(in[0]->data[k]); };
        auto map2 = [&](auto f) { for (std::size_t k = 0; k < out.data.size(); ++k) out.data[k] = f(in[0]->data[k], in[1]->data[k]); };
        switch (n.kind) {
            case op::input: break;
            case op::constant:
                if (n.values) std::copy(n.values->begin(), n.values->end(), out.data.begin());
                else std::fill(out.data.begin(), out.data.end(), n.scalar);
                break;
            case op::iota:
                for_each_index(out.type.dims, [&](std::int64_t flat, const std::vector<std::int64_t>& idx) {
                    out.data[std::size_t(flat)] = double(idx[std::size_t(n.axis)]);
                });
                break;
            case op::add: map2([](double a, double b) { return a + b; }); break;
            case op::subtract: map2([](double a, double b) { return a - b; }); break;
            case op::multiply: map2([](double a, double b) { return a * b; }); break;
            case op::divide: map2([](double a, double b) { return a / b; }); break;
            case op::maximum: map2([](double a, double b) { return std::max(a, b); }); break;
            case op::negate: map1([](double a) { return -a; }); break;
            case op::exponential: map1([](double a) { return std::exp(a); }); break;
            case op::log: map1([](double a) { return std::log(a); }); break;
            case op::tanh: map1([](double a) { return std::tanh(a); }); break;
            case op::logistic: map1([](double a) { return 1.0 / (1.0 + std::exp(-a)); }); break;
            case op::sqrt: map1([](double a) { return std::sqrt(a); }); break;
            case op::floor: map1([](double a) { return std::floor(a); }); break;
            case op::slice:  // out = the block of x at n.dims
                for_each_in_block(out.type.dims, in[0]->type.dims, n.dims,
                                  [&](std::size_t o, std::size_t x) { out.data[o] = in[0]->data[x]; });
                break;
            case op::pad:  // x placed at n.dims (its low padding) in zeros
                for_each_in_block(in[0]->type.dims, out.type.dims, n.dims,
                                  [&](std::size_t x, std::size_t o) { out.data[o] = in[0]->data[x]; });
                break;
            case op::linear_scan: {  // along dimension 1 of [B, T, ...], in time order (from the end when reversed)
                const std::size_t lead = std::size_t(out.type.dims[0]), steps = std::size_t(out.type.dims[1]);
                const std::size_t inner = out.data.size() / std::max<std::size_t>(1, lead * steps);
                for (std::size_t l = 0; l < lead; ++l)
                    for (std::size_t i = 0; i < inner; ++i) {
                        double h = 0;
                        for (std::size_t k = 0; k < steps; ++k) {
                            const std::size_t at = (l * steps + (n.axis ? steps - 1 - k : k)) * inner + i;
                            h = in[0]->data[at] * h + in[1]->data[at];
                            out.data[at] = h;
                        }
                    }
                break;
            }
            case op::gather_rows: {  // an index out of range is clamped, as StableHLO's gather does
                const std::size_t width = std::size_t(out.type.dims[1]), rows = std::size_t(in[0]->type.dims[0]);
                for (std::size_t m = 0; m < std::size_t(out.type.dims[0]); ++m) {
                    const double at = std::clamp(in[1]->data[m], 0.0, double(rows) - 1);
                    for (std::size_t w = 0; w < width; ++w) out.data[m * width + w] = in[0]->data[std::size_t(at) * width + w];
                }
                break;
            }
            case op::scatter_add_rows: {  // an index out of range is skipped, as StableHLO's scatter does
                const std::size_t width = std::size_t(out.type.dims[1]), rows = std::size_t(out.type.dims[0]);
                for (std::size_t m = 0; m < std::size_t(in[0]->type.dims[0]); ++m) {
                    const double at = in[1]->data[m];
                    if (!(at >= 0 && at < double(rows))) continue;
                    for (std::size_t w = 0; w < width; ++w) out.data[std::size_t(at) * width + w] += in[0]->data[m * width + w];
                }
                break;
            }
            case op::selective_scan:
                v[i] = selective_scan_reference(n, in);
                continue;
            case op::selective_scan_backward:
                v[i] = selective_scan_backward_reference(n, in);
                continue;
            case op::concatenate: {  // each part placed after the previous ones along the axis
                dims_t at(out.type.rank(), 0);
                for (const auto* part : in) {
                    for_each_in_block(part->type.dims, out.type.dims, at, [&](std::size_t x, std::size_t o) { out.data[o] = part->data[x]; });
                    at[std::size_t(n.axis)] += part->type.dims[std::size_t(n.axis)];
                }
                break;
            }
            case op::compare: {
                const auto d = n.direction;
                map2([d](double a, double b) {
                    switch (d) {
                        case compare_direction::EQ: return double(a == b);
                        case compare_direction::NE: return double(a != b);
                        case compare_direction::GE: return double(a >= b);
                        case compare_direction::GT: return double(a > b);
                        case compare_direction::LE: return double(a <= b);
                        case compare_direction::LT: return double(a < b);
                    }
                    return 0.0;
                });
                break;
            }
            case op::select:
                for (std::size_t k = 0; k < out.data.size(); ++k) out.data[k] = in[0]->data[k] != 0 ? in[1]->data[k] : in[2]->data[k];
                break;
            case op::stop_gradient: out.data = in[0]->data; break;
            case op::all_reduce_sum:  // the reference evaluates one replica
                check<graph_error>(n.axis == 1, "xla::graph: evaluate runs one replica; all_reduce_sum over ", n.axis,
                                   " replicas needs a replicated device_program");
                out.data = in[0]->data;
                break;
            case op::dot: {  // rank 3: a batch of matrices along dimension 0
                const auto& a = *in[0];
                const auto& b = *in[1];
                const std::size_t lead = a.type.rank() - 2;
                const std::int64_t batches = lead ? a.type.dims[0] : 1;
                const std::int64_t ca = n.dims[0], cb = n.dims[1];
                const std::int64_t K = a.type.dims[lead + std::size_t(ca)], I = out.type.dims[lead], J = out.type.dims[lead + 1];
                const std::int64_t a_cols = a.type.dims[lead + 1], b_cols = b.type.dims[lead + 1];
                const std::int64_t a_size = a.type.dims[lead] * a_cols, b_size = b.type.dims[lead] * b_cols;
                for (std::int64_t q = 0; q < batches; ++q)
                    for (std::int64_t i = 0; i < I; ++i)
                        for (std::int64_t j = 0; j < J; ++j) {
                            double s = 0;
                            for (std::int64_t k = 0; k < K; ++k) {
                                const double x = a.data[std::size_t(q * a_size + (ca == 1 ? i * a_cols + k : k * a_cols + i))];
                                const double y = b.data[std::size_t(q * b_size + (cb == 0 ? k * b_cols + j : j * b_cols + k))];
                                s += x * y;
                            }
                            out.data[std::size_t((q * I + i) * J + j)] = s;
                        }
                break;
            }
            case op::reduce_sum:
            case op::reduce_max: {
                const bool is_sum = n.kind == op::reduce_sum;
                std::fill(out.data.begin(), out.data.end(), is_sum ? 0.0 : -std::numeric_limits<double>::infinity());
                const auto out_strides = strides_of(out.type.dims);
                const dims_t& x_dims = in[0]->type.dims;
                for_each_index(x_dims, [&](std::int64_t flat, const std::vector<std::int64_t>& idx) {
                    std::int64_t o = 0;
                    std::size_t k = 0;
                    for (std::int64_t d = 0; d < std::int64_t(x_dims.size()); ++d) {
                        if (std::find(n.dims.begin(), n.dims.end(), d) != n.dims.end()) continue;
                        o += idx[std::size_t(d)] * out_strides[k++];
                    }
                    double& acc = out.data[std::size_t(o)];
                    const double x = in[0]->data[std::size_t(flat)];
                    acc = is_sum ? acc + x : std::max(acc, x);
                });
                break;
            }
            case op::broadcast_in_dim: {
                const auto x_strides = strides_of(in[0]->type.dims);
                for_each_index(out.type.dims, [&](std::int64_t flat, const std::vector<std::int64_t>& idx) {
                    std::int64_t o = 0;
                    for (std::size_t k = 0; k < n.dims.size(); ++k)
                        if (in[0]->type.dims[k] != 1) o += idx[std::size_t(n.dims[k])] * x_strides[k];
                    out.data[std::size_t(flat)] = in[0]->data[std::size_t(o)];
                });
                break;
            }
            case op::reshape: out.data = in[0]->data; break;
            case op::transpose: {
                const auto x_strides = strides_of(in[0]->type.dims);
                for_each_index(out.type.dims, [&](std::int64_t flat, const std::vector<std::int64_t>& idx) {
                    std::int64_t o = 0;
                    for (std::size_t k = 0; k < n.dims.size(); ++k) o += idx[k] * x_strides[std::size_t(n.dims[k])];
                    out.data[std::size_t(flat)] = in[0]->data[std::size_t(o)];
                });
                break;
            }
            case op::scan_layers: {
                const layer_body& body = *n.body;
                const std::int64_t depth = scan_depth(n);
                host_value carry = *in[0];
                std::vector<host_value> stored;  // carries [depth, ...], then the saved values' stacks
                for (std::size_t k = 1; k < n.outputs.size(); ++k) stored.push_back({n.outputs[k], {}});
                for (std::int64_t l = 0; l < depth; ++l) {
                    stored[0].data.insert(stored[0].data.end(), carry.data.begin(), carry.data.end());
                    std::vector<host_value> a{carry};
                    for (std::size_t k = 0; k < n.stacked; ++k) a.push_back(layer_of(*in[1 + k], l));
                    for (std::size_t k = 1 + n.stacked; k < in.size(); ++k) a.push_back(*in[k]);
                    a.push_back({f32({}), {double(l)}});
                    const auto r = evaluate_graph(*body.g, body_arguments(body, std::move(a)), body.results);
                    carry = r[0];
                    for (std::size_t k = 1; k < r.size(); ++k) stored[k].data.insert(stored[k].data.end(), r[k].data.begin(), r[k].data.end());
                }
                v[i] = {carry};
                v[i].insert(v[i].end(), stored.begin(), stored.end());
                continue;
            }
            case op::scan_layers_backward: {
                // in: g_final, then the stored carries [depth, ...] or (reverse body) the final carry, then the parameters
                const layer_body& body = *n.body;
                const bool rebuilds = n.reverse != nullptr;
                const std::int64_t depth = in[2]->type.dims[0];  // the first stacked parameter
                const std::size_t saved = n.saved.size(), params = in.size() - 2 - saved, first_grad = rebuilds ? 2 : 1;
                host_value g = *in[0], y = *in[1];
                std::vector<host_value> grads;
                for (std::size_t k = 0; k < params; ++k)
                    grads.push_back({in[2 + k]->type, std::vector<double>(in[2 + k]->data.size(), 0.0)});
                for (std::int64_t l = depth - 1; l >= 0; --l) {
                    std::vector<host_value> a{rebuilds ? y : layer_of(*in[1], l)};
                    for (std::size_t k = 0; k < n.stacked; ++k) a.push_back(layer_of(*in[2 + k], l));
                    for (std::size_t k = n.stacked; k < params; ++k) a.push_back(*in[2 + k]);
                    a.push_back({f32({}), {double(l)}});
                    a.push_back(g);
                    given_host_values kept;  // this layer's saved values, read instead of recomputed
                    for (std::size_t k = 0; k < saved; ++k) kept.emplace_back(n.saved[k], layer_of(*in[2 + params + k], l));
                    const auto r = evaluate_graph(*body.g, a, body.results, kept);
                    if (rebuilds) y = r[0];
                    g = r[first_grad - 1];
                    for (std::size_t k = 0; k < params; ++k) {
                        const std::size_t size = r[first_grad + k].data.size();
                        const std::size_t at = k < n.stacked ? std::size_t(l) * size : 0;
                        for (std::size_t e = 0; e < size; ++e) grads[k].data[at + e] += r[first_grad + k].data[e];
                    }
                }
                v[i] = {g};
                v[i].insert(v[i].end(), grads.begin(), grads.end());
                continue;
            }
        }
        v[i] = {std::move(out)};
    }
    std::vector<host_value> out;
    for (const auto& r : results) out.push_back(value_of(v, r));
    return out;
}

}  // namespace detail

}  // namespace olmax::xla::graph
