#pragma once
// The traced program: a graph of StableHLO-level primitives that a whole training step (forward,
// gradients, optimiser update) is built into before it is emitted as ONE StableHLO module
// (emit.hpp) and compiled once by a PJRT plugin.
//
//     graph g;
//     var x = g.input(f32({8, 64})), w = g.input(f32({64, 32}));
//     var loss = sum(tanh(matmul(x, w)), {0, 1});
//     auto module = emit(g, "step", {loss});   // emit.hpp
//
// Programs are built by the tracer (olmax/trace/), which runs ordinary olmax code on traced
// tensors and records each primitive's gradient on olmax's one tape. Every primitive has a shape
// rule (checked here, so a bad program fails while it is built, naming the primitive), a StableHLO
// lowering (emit.hpp) and a double precision reference evaluation (evaluate.hpp, what the gradient
// tests check the tracer's rules against).
// Depth is a loop, not an unrolling: `scan_layers` runs one traced layer body over parameters
// stacked along a leading [depth] axis, so the program's size does not grow with depth.
//
// Values are f32 tensors with static shapes, plus i1 predicates (compare) for select.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/xla/stablehlo/ir.hpp"
#include "olmax/xla/stablehlo/scan_strategy.hpp"
#include "olmax/core/error.hpp"

namespace olmax::xla::graph {

using stablehlo::compare_direction;
using stablehlo::dims_t;
using stablehlo::element;
using stablehlo::f32;
using stablehlo::tensor_type;

/// A program that cannot be built, differentiated or lowered: a shape mismatch, a value of another
/// graph, a primitive without a rule. The message names the primitive.
class graph_error : public olmax::error {
public:
    using olmax::error::error;
};

/// The primitives. Their semantics are StableHLO's (openxla.org/stablehlo/spec) restricted as noted.
enum class op : std::uint8_t {
    input,             // a program argument
    constant,          // a splat of `scalar`
    iota,              // indices along `axis`, as f32
    add, subtract, multiply, divide, maximum,
    negate, exponential, log, tanh, logistic, sqrt,
    floor,             // round down (its gradient is zero)
    compare,           // i1 result, `direction`
    select,            // select(pred, on_true, on_false)
    stop_gradient,     // identity whose gradient is zero
    dot,               // matrix product contracting lhs dimension dims[0] with rhs dimension dims[1]; rank 3: a batch of them
    reduce_sum,        // over `dims`
    reduce_max,        // over `dims`
    broadcast_in_dim,  // operand dimension i -> result dimension dims[i] (increasing)
    reshape,
    transpose,         // permutation `dims`
    scan_layers,       // a layer body over stacked parameters (see scan_layers below); outputs: final carry, carries [depth, ...]
    scan_layers_backward,  // the reverse loop of scan_layers' gradient (made by the tracer's layer loop; it has no gradient of its own)
    all_reduce_sum,    // sum over the `axis` replicas of a replicated program (data parallelism inside one program)
    slice,             // the block starting at `dims` (one start per dimension) of the output's size, unit strides
    pad,               // zeros around the operand: `dims` low then high padding per dimension (non-negative)
    concatenate,       // operands joined along `axis`
    linear_scan,       // h_t = a_t h_{t-1} + x_t along dimension 1 of [B, T, ...] (see linear_scan); `axis` 1: from the end
    selective_scan,           // Mamba's scan fused over time (see selective_scan); `axis`: the checkpoint chunk
    selective_scan_backward,  // its gradient (made by selective_scan's rule; it has no gradient of its own)
    gather_rows,       // rows of a matrix [R, W] by f32 indices [M] -> [M, W]
    scatter_add_rows,  // its adjoint: [M, W] added into the rows [M] of `axis` zero rows -> [R, W]
};

/// The primitive's name as error messages and the gradient rules' table spell it.
inline std::string_view op_name(op o) {
    constexpr std::string_view names[] = {"input", "constant", "iota", "add", "subtract", "multiply", "divide", "maximum", "negate",
                                          "exponential", "log", "tanh", "logistic", "sqrt", "floor", "compare", "select", "stop_gradient", "dot",
                                          "reduce_sum", "reduce_max", "broadcast_in_dim", "reshape", "transpose", "scan_layers",
                                          "scan_layers_backward", "all_reduce_sum", "slice", "pad", "concatenate", "linear_scan",
                                          "selective_scan", "selective_scan_backward", "gather_rows", "scatter_add_rows"};
    return names[static_cast<std::size_t>(o)];
}

class graph;
struct layer_body;

/// One output of one node: the symbolic tensor a traced program computes with. Cheap to copy; valid
/// while its graph lives (graphs do not move).
class var {
public:
    var() = default;
    var(graph* owner, std::uint32_t node, std::uint32_t output) : owner_(owner), node_(node), output_(output) {}

    bool defined() const { return owner_ != nullptr; }
    graph& owner() const {
        check<graph_error>(owner_ != nullptr, "xla::graph: use of an undefined var");
        return *owner_;
    }
    std::uint32_t node() const { return node_; }
    std::uint32_t output() const { return output_; }
    const tensor_type& type() const;
    const dims_t& dims() const { return type().dims; }
    friend bool operator==(const var&, const var&) = default;

private:
    graph* owner_ = nullptr;
    std::uint32_t node_ = 0, output_ = 0;
};

/// One primitive application.
struct node {
    op kind = op::input;
    std::vector<var> operands;
    std::vector<tensor_type> outputs;
    double scalar = 0;                      // constant: the value
    std::shared_ptr<const std::vector<float>> values;  // constant: its elements, row-major (null: every one is `scalar`)
    dims_t dims;                            // reduce axes, permutation, broadcast dims, dot's (lhs, rhs) contracting dims
    std::int64_t axis = 0;                  // iota: the axis; all_reduce_sum: the replica count
    compare_direction direction = compare_direction::EQ;
    std::shared_ptr<const layer_body> body;  // scan_layers(_backward): the traced layer (or its gradient)
    std::size_t stacked = 0;                 // scan_layers(_backward): how many parameters are stacked [depth, ...]
    /// scan_layers: the layer's reverse body (trace_reverse_layer), when it can rebuild its input
    /// from its output; scan_layers_backward: set when `body` is that reverse body, so the loop walks
    /// back from the final carry instead of reading stored carries.
    std::shared_ptr<const layer_body> reverse;
    /// scan_layers_backward of kept layers: values of `body`'s graph that each iteration reads from
    /// the forward loop's stacked outputs (the operands after the parameters, one per value, in
    /// this order) instead of computing them, so the body does not recompute the layer.
    std::vector<var> saved;
    stablehlo::scan_strategy scan{};          // linear_scan: how it lowers
    /// selective_scan(_backward): lowered to a custom call of olmax's own CPU kernel
    /// (trace/native_calls.hpp) instead of loops over time; only for a plugin with those registered.
    bool native_call = false;
};

/// A graph of primitives in the order they were built (which is a topological order).
class graph {
public:
    graph() = default;
    graph(const graph&) = delete;  // vars point at their graph
    graph& operator=(const graph&) = delete;

    /// A new program argument of type `type` (inputs are numbered in the order they are made).
    var input(tensor_type type) {
        check<graph_error>(type.elem == element::f32, "xla::graph: inputs are f32, got ", type.str());
        node n;
        n.kind = op::input;
        n.outputs = {std::move(type)};
        inputs_.push_back(static_cast<std::uint32_t>(nodes_.size()));
        return add(std::move(n));
    }

    const std::vector<node>& nodes() const { return nodes_; }
    const node& at(std::uint32_t index) const { return nodes_.at(index); }
    /// Node indices of the inputs, in argument order.
    const std::vector<std::uint32_t>& inputs() const { return inputs_; }
    std::vector<var> input_vars() {
        std::vector<var> out;
        for (auto i : inputs_) out.emplace_back(this, i, 0);
        return out;
    }

    /// Appends a node whose operands (all of this graph) and output types are set; returns output 0.
    var add(node n) {
        for (const auto& v : n.operands)
            check<graph_error>(&v.owner() == this, "xla::graph: ", op_name(n.kind), " takes a value of another graph");
        nodes_.push_back(std::move(n));
        return var(this, static_cast<std::uint32_t>(nodes_.size() - 1), 0);
    }

private:
    std::vector<node> nodes_;
    std::vector<std::uint32_t> inputs_;
};

inline const tensor_type& var::type() const { return owner().at(node_).outputs.at(output_); }

// ---- primitives ---------------------------------------------------------------------------------

namespace detail {

/// A node of one output; callers set its attributes before `commit`.
inline node make_node(op kind, std::vector<var> operands, tensor_type out) {
    check<graph_error>(!operands.empty(), "xla::graph: ", op_name(kind), " needs an operand");
    node n;
    n.kind = kind;
    n.operands = std::move(operands);
    n.outputs = {std::move(out)};
    return n;
}
/// Appends `n` to its operands' graph.
inline var commit(node n) {
    graph& g = n.operands.front().owner();
    return g.add(std::move(n));
}
inline var make(op kind, std::vector<var> operands, tensor_type out) { return commit(make_node(kind, std::move(operands), std::move(out))); }

inline void same_type(op kind, const var& a, const var& b) {
    check<graph_error>(a.type() == b.type(), "xla::graph: ", op_name(kind), ": operand types differ: ", a.type().str(), " and ",
                       b.type().str());
}

inline void require_f32(op kind, const var& x) {
    check<graph_error>(x.type().elem == element::f32, "xla::graph: ", op_name(kind), " takes f32, got ", x.type().str());
}

inline var binary(op kind, const var& a, const var& b) {
    same_type(kind, a, b);
    require_f32(kind, a);
    return make(kind, {a, b}, a.type());
}

inline var unary(op kind, const var& x) {
    require_f32(kind, x);
    return make(kind, {x}, x.type());
}

inline void check_axes(op kind, const tensor_type& t, const dims_t& axes) {
    for (std::size_t i = 0; i < axes.size(); ++i) {
        check<graph_error>(axes[i] >= 0 && axes[i] < static_cast<std::int64_t>(t.rank()), "xla::graph: ", op_name(kind), ": axis ",
                           axes[i], " out of range for ", t.str());
        check<graph_error>(i == 0 || axes[i] > axes[i - 1], "xla::graph: ", op_name(kind), ": axes must be increasing");
    }
}

}  // namespace detail

/// A splat constant of `type` in `g`.
inline var constant(graph& g, double value, tensor_type type) {
    node n;
    n.kind = op::constant;
    n.scalar = value;
    n.outputs = {std::move(type)};
    return g.add(std::move(n));
}
/// A constant of x's type (x only gives the graph and the shape).
/// A constant holding `values` (row-major) of `type` (f32): a host tensor captured by a traced program.
inline var dense_constant(graph& g, std::vector<float> values, tensor_type type) {
    check<graph_error>(type.elem == element::f32 && std::int64_t(values.size()) == type.elements(), "xla::graph: a dense constant of ",
                       values.size(), " values for ", type.str());
    node n;
    n.kind = op::constant;
    n.outputs = {std::move(type)};
    n.values = std::make_shared<const std::vector<float>>(std::move(values));
    return g.add(std::move(n));
}
inline var constant_like(const var& x, double value) { return constant(x.owner(), value, x.type()); }

/// f32 indices 0, 1, ... along `axis` of `type`.
inline var iota(graph& g, tensor_type type, std::int64_t axis) {
    detail::check_axes(op::iota, type, {axis});
    node n;
    n.kind = op::iota;
    n.axis = axis;
    n.outputs = {std::move(type)};
    return g.add(std::move(n));
}

inline var operator+(const var& a, const var& b) { return detail::binary(op::add, a, b); }
inline var operator-(const var& a, const var& b) { return detail::binary(op::subtract, a, b); }
inline var operator*(const var& a, const var& b) { return detail::binary(op::multiply, a, b); }
inline var operator/(const var& a, const var& b) { return detail::binary(op::divide, a, b); }
inline var operator-(const var& x) { return detail::unary(op::negate, x); }
inline var operator+(const var& a, double c) { return a + constant_like(a, c); }
inline var operator*(const var& a, double c) { return a * constant_like(a, c); }
inline var operator*(double c, const var& a) { return constant_like(a, c) * a; }
inline var operator-(const var& a, double c) { return a - constant_like(a, c); }
inline var operator-(double c, const var& a) { return constant_like(a, c) - a; }
inline var operator/(const var& a, double c) { return a / constant_like(a, c); }

inline var maximum(const var& a, const var& b) { return detail::binary(op::maximum, a, b); }
inline var exp(const var& x) { return detail::unary(op::exponential, x); }
inline var log(const var& x) { return detail::unary(op::log, x); }
inline var tanh(const var& x) { return detail::unary(op::tanh, x); }
inline var logistic(const var& x) { return detail::unary(op::logistic, x); }
inline var sqrt(const var& x) { return detail::unary(op::sqrt, x); }
inline var floor(const var& x) { return detail::unary(op::floor, x); }
inline var stop_gradient(const var& x) { return detail::make(op::stop_gradient, {x}, x.type()); }

inline var compare(const var& a, const var& b, compare_direction direction) {
    detail::same_type(op::compare, a, b);
    node n = detail::make_node(op::compare, {a, b}, {a.dims(), element::i1});
    n.direction = direction;
    return detail::commit(std::move(n));
}

inline var select(const var& predicate, const var& on_true, const var& on_false) {
    detail::same_type(op::select, on_true, on_false);
    check<graph_error>(predicate.type() == tensor_type{on_true.dims(), element::i1}, "xla::graph: select: predicate ",
                       predicate.type().str(), " does not match ", on_true.type().str());
    return detail::make(op::select, {predicate, on_true, on_false}, on_true.type());
}

/// Product of two matrices contracting lhs dimension `lhs_contract` with rhs dimension `rhs_contract`
/// (0 or 1, counted within the matrix); result [lhs free, rhs free]. Rank-3 operands are batches of
/// matrices with the same leading size, multiplied pairwise: result [batch, lhs free, rhs free].
/// matmul(a, b) = dot(a, b, 1, 0).
inline var dot(const var& lhs, const var& rhs, std::int64_t lhs_contract, std::int64_t rhs_contract) {
    detail::require_f32(op::dot, lhs);
    detail::require_f32(op::dot, rhs);
    const std::size_t rank = lhs.type().rank();
    check<graph_error>((rank == 2 || rank == 3) && rhs.type().rank() == rank && (lhs_contract == 0 || lhs_contract == 1) &&
                           (rhs_contract == 0 || rhs_contract == 1) && (rank == 2 || lhs.dims()[0] == rhs.dims()[0]),
                       "xla::graph: dot takes two matrices, or two batches of as many matrices (rank 3), and one contracting dimension each, got ",
                       lhs.type().str(), " x ", rhs.type().str());
    const std::size_t batch = rank - 2;  // 1 when the leading dimension is a batch
    const auto k = lhs.dims()[batch + std::size_t(lhs_contract)];
    check<graph_error>(k == rhs.dims()[batch + std::size_t(rhs_contract)], "xla::graph: dot: contracting sizes differ: ", lhs.type().str(),
                       " (matrix dimension ", lhs_contract, ") x ", rhs.type().str(), " (matrix dimension ", rhs_contract, ")");
    dims_t out;
    if (batch) out.push_back(lhs.dims()[0]);
    out.push_back(lhs.dims()[batch + std::size_t(1 - lhs_contract)]);
    out.push_back(rhs.dims()[batch + std::size_t(1 - rhs_contract)]);
    node n = detail::make_node(op::dot, {lhs, rhs}, f32(out));
    n.dims = {lhs_contract, rhs_contract};
    return detail::commit(std::move(n));
}
inline var matmul(const var& a, const var& b) { return dot(a, b, 1, 0); }

namespace detail {
inline var reduce(op kind, const var& x, dims_t axes) {
    require_f32(kind, x);
    check_axes(kind, x.type(), axes);
    dims_t out;
    for (std::int64_t d = 0; d < static_cast<std::int64_t>(x.type().rank()); ++d) {
        bool reduced = false;
        for (auto a : axes) reduced |= a == d;
        if (!reduced) out.push_back(x.dims()[static_cast<std::size_t>(d)]);
    }
    node n = make_node(kind, {x}, f32(out));
    n.dims = std::move(axes);
    return commit(std::move(n));
}
}  // namespace detail

/// Sum over `axes` (increasing); the reduced axes disappear.
inline var sum(const var& x, dims_t axes) { return detail::reduce(op::reduce_sum, x, std::move(axes)); }
/// Maximum over `axes` (increasing). Its gradient is split evenly among tied maxima.
inline var max(const var& x, dims_t axes) { return detail::reduce(op::reduce_max, x, std::move(axes)); }

/// Operand dimension i becomes result dimension `dims[i]` (increasing; operand size 1 or equal).
inline var broadcast_in_dim(const var& x, dims_t out_dims, dims_t dims) {
    detail::check_axes(op::broadcast_in_dim, tensor_type{out_dims, x.type().elem}, dims);
    check<graph_error>(dims.size() == x.type().rank(), "xla::graph: broadcast_in_dim: ", dims.size(), " dimensions for ", x.type().str());
    for (std::size_t i = 0; i < dims.size(); ++i)
        check<graph_error>(x.dims()[i] == 1 || x.dims()[i] == out_dims[static_cast<std::size_t>(dims[i])], "xla::graph: broadcast_in_dim: ",
                           x.type().str(), " does not broadcast to ", tensor_type{out_dims, x.type().elem}.str());
    node n = detail::make_node(op::broadcast_in_dim, {x}, {std::move(out_dims), x.type().elem});
    n.dims = std::move(dims);
    return detail::commit(std::move(n));
}

inline var reshape(const var& x, dims_t dims) {
    const tensor_type t{std::move(dims), x.type().elem};
    check<graph_error>(t.elements() == x.type().elements(), "xla::graph: reshape: ", x.type().str(), " to ", t.str(), " changes the size");
    return detail::make(op::reshape, {x}, t);
}

inline var transpose(const var& x, dims_t permutation) {
    check<graph_error>(permutation.size() == x.type().rank(), "xla::graph: transpose: permutation of ", permutation.size(), " for ",
                       x.type().str());
    std::vector<bool> seen(permutation.size(), false);
    tensor_type t{{}, x.type().elem};
    for (auto p : permutation) {
        check<graph_error>(p >= 0 && p < static_cast<std::int64_t>(seen.size()) && !seen[static_cast<std::size_t>(p)],
                           "xla::graph: transpose: not a permutation of ", x.type().rank(), " dimensions");
        seen[static_cast<std::size_t>(p)] = true;
        t.dims.push_back(x.dims()[static_cast<std::size_t>(p)]);
    }
    node n = detail::make_node(op::transpose, {x}, t);
    n.dims = std::move(permutation);
    return detail::commit(std::move(n));
}

/// The sum of x over all `replicas` copies of a replicated program (compiled with that many replicas,
/// xla::device_program); in a program of one replica, x itself. Its gradient is the same sum of the
/// gradients (every replica's output depends on every replica's input).
inline var all_reduce_sum(const var& x, std::int64_t replicas) {
    detail::require_f32(op::all_reduce_sum, x);
    check<graph_error>(replicas >= 1, "xla::graph: all_reduce_sum: replicas must be positive, got ", replicas);
    node n = detail::make_node(op::all_reduce_sum, {x}, x.type());
    n.axis = replicas;
    return detail::commit(std::move(n));
}

/// x[start[d] : limit[d]] along every dimension d (unit strides).
inline var slice(const var& x, const dims_t& start, const dims_t& limit) {
    const std::size_t rank = x.type().rank();
    check<graph_error>(start.size() == rank && limit.size() == rank, "xla::graph: slice: ", start.size(), " starts and ", limit.size(),
                       " limits for ", x.type().str());
    dims_t out;
    for (std::size_t d = 0; d < rank; ++d) {
        check<graph_error>(0 <= start[d] && start[d] <= limit[d] && limit[d] <= x.dims()[d], "xla::graph: slice: [", start[d], ", ", limit[d],
                           ") is out of range for dimension ", d, " of ", x.type().str());
        out.push_back(limit[d] - start[d]);
    }
    node n = detail::make_node(op::slice, {x}, {std::move(out), x.type().elem});
    n.dims = start;
    return detail::commit(std::move(n));
}

/// x with low[d] zeros before and high[d] zeros after it along every dimension d.
inline var pad(const var& x, const dims_t& low, const dims_t& high) {
    detail::require_f32(op::pad, x);
    const std::size_t rank = x.type().rank();
    check<graph_error>(low.size() == rank && high.size() == rank, "xla::graph: pad: ", low.size(), " low and ", high.size(),
                       " high paddings for ", x.type().str());
    dims_t out, both = low;
    for (std::size_t d = 0; d < rank; ++d) {
        check<graph_error>(low[d] >= 0 && high[d] >= 0, "xla::graph: pad: negative padding (", low[d], ", ", high[d], ") of dimension ", d);
        out.push_back(x.dims()[d] + low[d] + high[d]);
    }
    both.insert(both.end(), high.begin(), high.end());
    node n = detail::make_node(op::pad, {x}, f32(out));
    n.dims = std::move(both);
    return detail::commit(std::move(n));
}

/// The parts joined along `axis` (equal elsewhere).
inline var concatenate(const std::vector<var>& parts, std::int64_t axis) {
    check<graph_error>(!parts.empty(), "xla::graph: concatenate needs at least one part");
    const tensor_type& first = parts.front().type();
    check<graph_error>(axis >= 0 && axis < static_cast<std::int64_t>(first.rank()), "xla::graph: concatenate: axis ", axis,
                       " out of range for ", first.str());
    const auto a = static_cast<std::size_t>(axis);
    dims_t out = first.dims;
    out[a] = 0;
    for (const auto& p : parts) {
        bool same = p.type().rank() == first.rank() && p.type().elem == first.elem;
        for (std::size_t d = 0; same && d < first.rank(); ++d) same = d == a || p.dims()[d] == first.dims[d];
        check<graph_error>(same, "xla::graph: concatenate: ", p.type().str(), " and ", first.str(), " differ outside axis ", axis);
        out[a] += p.dims()[a];
    }
    if (parts.size() == 1) return parts.front();
    node n = detail::make_node(op::concatenate, parts, {std::move(out), first.elem});
    n.axis = axis;
    return detail::commit(std::move(n));
}

/// The linear recurrence h_t = a_t h_{t-1} + x_t along dimension 1 of [B, T, ...] values from a zero
/// state, or with `reverse` h_t = a_t h_{t+1} + x_t from the end (the direction of its adjoint).
/// One primitive, so that its gradient is the exact adjoint (one scan in the other direction plus
/// element-wise work, keeping only h: linear memory; olmax/trace/primitives.hpp) and it lowers to a scan `strategy`
/// (stablehlo/scan.hpp: a while loop over time, log-depth doubling, or chunked_matmul<C>'s
/// triangular matmuls on the matrix unit, the TPU form). The strategy changes how it lowers, not
/// its values.
inline var linear_scan(const var& a, const var& x, const stablehlo::scan_strategy& strategy, bool reverse = false) {
    detail::same_type(op::linear_scan, a, x);
    detail::require_f32(op::linear_scan, x);
    check<graph_error>(x.type().rank() >= 2, "xla::graph: linear_scan takes [B, T, ...] (time along dimension 1), got ", x.type().str());
    check<graph_error>(strategy.strategy != stablehlo::scan_strategy::kind::chunked_matmul || strategy.chunk >= 1,
                       "xla::graph: linear_scan: chunked_matmul's chunk must be positive, got ", strategy.chunk);
    node n = detail::make_node(op::linear_scan, {a, x}, x.type());
    n.scan = strategy;
    n.axis = reverse ? 1 : 0;
    return detail::commit(std::move(n));
}

/// out[m, :] = x[rows[m], :] for x [R, W] and rows [M] (f32 values holding integers in [0, R), as
/// all of a program's values are f32; exact below 2^24). The gradient is scatter_add_rows.
inline var gather_rows(const var& x, const var& rows) {
    detail::require_f32(op::gather_rows, x);
    check<graph_error>(x.type().rank() == 2 && rows.type().rank() == 1 && rows.type().elem == element::f32 && x.dims()[0] < (std::int64_t{1} << 24),
                       "xla::graph: gather_rows takes x [R, W] (R < 2^24) and rows [M], got ", x.type().str(), " and ", rows.type().str());
    return detail::make(op::gather_rows, {x, rows}, f32({rows.dims()[0], x.dims()[1]}));
}

/// out [count, W]: zeros with src[m, :] added to row rows[m] for every m (src [M, W], rows [M] as in
/// gather_rows; repeated rows accumulate). The gradient is gather_rows.
inline var scatter_add_rows(const var& src, const var& rows, std::int64_t count) {
    detail::require_f32(op::scatter_add_rows, src);
    check<graph_error>(src.type().rank() == 2 && rows.type().rank() == 1 && rows.dims()[0] == src.dims()[0] && count >= 0 &&
                           count < (std::int64_t{1} << 24),
                       "xla::graph: scatter_add_rows takes src [M, W] and rows [M] into 0 <= count < 2^24 rows, got ", src.type().str(), ", ",
                       rows.type().str(), " and ", count);
    node n = detail::make_node(op::scatter_add_rows, {src, rows}, f32({count, src.dims()[1]}));
    n.axis = count;
    return detail::commit(std::move(n));
}

/// The checkpoint chunk of a fused selective scan over `steps`: the smallest power of two at least
/// sqrt(steps), which keeps its memory near the minimum, B E N (steps / chunk + chunk).
inline std::int64_t selective_scan_chunk(std::int64_t steps) {
    std::int64_t chunk = 1;
    while (chunk * chunk < steps) chunk *= 2;
    return chunk;
}

namespace detail {

/// The shape rule shared by selective_scan and its backward: u, delta [B, T, E]; A [E, N];
/// Bm, C [B, T, N]; keep [B, T]; a state [B, E, N].
inline void check_selective_scan(op kind, const var& u, const var& delta, const var& A, const var& Bm, const var& C, const var& keep,
                                 const var& state, std::int64_t chunk) {
    for (const var* v : {&u, &delta, &A, &Bm, &C, &keep, &state}) require_f32(kind, *v);
    const dims_t& d = u.dims();
    const bool ranks = d.size() == 3 && A.dims().size() == 2;
    const std::int64_t n = ranks ? A.dims()[1] : 0;
    check<graph_error>(ranks && delta.dims() == d && A.dims()[0] == d[2] && Bm.dims() == dims_t{d[0], d[1], n} && C.dims() == Bm.dims() &&
                           keep.dims() == dims_t{d[0], d[1]} && state.dims() == dims_t{d[0], d[2], n} && chunk >= 1,
                       "xla::graph: ", op_name(kind), " takes u, delta [B, T, E], A [E, N], B, C [B, T, N], keep [B, T], a state [B, E, N] and a ",
                       "positive chunk; got u ", u.type().str(), ", delta ", delta.type().str(), ", A ", A.type().str(), ", B ", Bm.type().str(),
                       ", C ", C.type().str(), ", keep ", keep.type().str(), ", state ", state.type().str(), ", chunk ", chunk);
}

inline std::vector<var> outputs_of(const var& first) {
    std::vector<var> out;
    const node& n = first.owner().at(first.node());
    for (std::uint32_t k = 0; k < n.outputs.size(); ++k) out.emplace_back(&first.owner(), first.node(), k);
    return out;
}

}  // namespace detail

/// Mamba's selective scan (olmax/scan/selective_scan.hpp has the formulas) as ONE primitive fused
/// over time, so the [B, T, E, N] states are never materialised: per step abar = exp(delta_t A) keep_t
/// (keep [B, T] is 0 where a document starts), h_t = abar h_{t-1} + delta_t u_t B_t from h0,
/// y_t = sum_n C_t h_t. Outputs: y [B, T, E], the last state h [B, E, N], and the state entering
/// every `chunk` steps [B, ceil(T / chunk), E, N] for the gradient (emitted only when one uses it).
/// It lowers to loops over time (stablehlo/selective_scan.hpp), the form for CPUs, or with
/// `native_call` to a custom call of olmax's own CPU kernel (the XLA CPU plugin with olmax's native
/// calls registered: trace/native_calls.hpp).
inline std::vector<var> selective_scan(const var& u, const var& delta, const var& A, const var& Bm, const var& C, const var& keep, const var& h0,
                                       std::int64_t chunk, bool native_call = false) {
    detail::check_selective_scan(op::selective_scan, u, delta, A, Bm, C, keep, h0, chunk);
    const dims_t& d = u.dims();
    const std::int64_t chunks = (d[1] + chunk - 1) / chunk;
    node n = detail::make_node(op::selective_scan, {u, delta, A, Bm, C, keep, h0}, u.type());
    n.outputs.push_back(h0.type());
    n.outputs.push_back(f32({d[0], chunks, d[2], A.dims()[1]}));
    n.axis = chunk;
    n.native_call = native_call;
    return detail::outputs_of(detail::commit(std::move(n)));
}

/// The exact gradient of selective_scan from its operands (no h0: the checkpoints hold it), its
/// `checkpoints` and the gradients gy of y and gh of the last state: (du, ddelta, dA, dB, dC, dh0).
/// Chunks run from last to first; each recomputes its states from its checkpoint.
inline std::vector<var> selective_scan_backward(const var& u, const var& delta, const var& A, const var& Bm, const var& C, const var& keep,
                                                const var& checkpoints, const var& gy, const var& gh, std::int64_t chunk,
                                                bool native_call = false) {
    detail::check_selective_scan(op::selective_scan_backward, u, delta, A, Bm, C, keep, gh, chunk);
    const dims_t& d = u.dims();
    check<graph_error>(gy.type() == u.type() && checkpoints.dims() == dims_t{d[0], (d[1] + chunk - 1) / chunk, d[2], A.dims()[1]},
                       "xla::graph: selective_scan_backward: gy ", gy.type().str(), " and checkpoints ", checkpoints.type().str(),
                       " do not match u ", u.type().str(), " with chunk ", chunk);
    node n = detail::make_node(op::selective_scan_backward, {u, delta, A, Bm, C, keep, checkpoints, gy, gh}, u.type());
    n.outputs = {u.type(), u.type(), A.type(), Bm.type(), C.type(), gh.type()};
    n.axis = chunk;
    n.native_call = native_call;
    return detail::outputs_of(detail::commit(std::move(n)));
}

// ---- convenience forms (compositions of the primitives; they need no rules of their own) -------

/// x moved |steps| positions along `axis`: later for steps > 0, zeros entering at the front (a
/// causal shift), earlier for steps < 0, zeros entering at the end.
inline var shift(const var& x, std::int64_t axis, std::int64_t steps) {
    if (steps == 0) return x;
    const auto a = static_cast<std::size_t>(axis);
    check<graph_error>(axis >= 0 && a < x.type().rank(), "xla::graph: shift: axis ", axis, ", steps ", steps, " for ", x.type().str());
    const std::int64_t by = steps > 0 ? steps : -steps;
    if (by >= x.dims()[a]) return constant_like(x, 0.0);
    dims_t start(x.type().rank(), 0), limit = x.dims(), low(x.type().rank(), 0), high(x.type().rank(), 0);
    if (steps > 0) {  // keep the first T - by, pad in front
        limit[a] -= by;
        low[a] = by;
    } else {  // keep the last T - by, pad at the end
        start[a] = by;
        high[a] = by;
    }
    return pad(slice(x, start, limit), low, high);
}

/// x shifted `steps` (>= 0) positions later along `axis`, zeros entering at the front.
inline var shift_later(const var& x, std::int64_t axis, std::int64_t steps) {
    check<graph_error>(steps >= 0, "xla::graph: shift_later: axis ", axis, ", steps ", steps, " for ", x.type().str());
    return shift(x, axis, steps);
}

/// x broadcast to `out_dims` with numpy's trailing alignment (x's dims match the last ones or are 1).
inline var broadcast_to(const var& x, const dims_t& out_dims) {
    if (x.dims() == out_dims) return x;
    check<graph_error>(x.type().rank() <= out_dims.size(), "xla::graph: cannot broadcast ", x.type().str(), " to rank ", out_dims.size());
    dims_t dims;
    for (std::size_t i = 0; i < x.type().rank(); ++i) dims.push_back(static_cast<std::int64_t>(out_dims.size() - x.type().rank() + i));
    return broadcast_in_dim(x, out_dims, dims);
}
inline var mean(const var& x, const dims_t& axes) {
    double count = 1;
    for (auto a : axes) count *= double(x.dims().at(static_cast<std::size_t>(a)));
    return sum(x, axes) / count;
}
/// log(sum(exp(x))) over the last axis, stabilised by the (gradient-free) row maximum.
inline var logsumexp_last(const var& x) {
    const std::int64_t last = static_cast<std::int64_t>(x.type().rank()) - 1;
    dims_t kept(x.dims().begin(), x.dims().end() - 1), keep_dims;
    for (std::int64_t d = 0; d < last; ++d) keep_dims.push_back(d);
    const var m = stop_gradient(max(x, {last}));
    const var shifted = x - broadcast_in_dim(m, x.dims(), keep_dims);
    return log(sum(exp(shifted), {last})) + m;
}

// ---- depth as a loop ----------------------------------------------------------------------------

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
/// parameters, layer index (what trace_layer and trace_reverse_layer both start from).
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

/// The backward of an invertible layer, traced once: arguments (output carry, per-layer parameters...,
/// shared parameters..., layer index, gradient of the output carry) -> results (input carry, its
/// gradient, gradients of the per-layer and the shared parameters). With it the gradient of
/// `scan_layers` walks back from the final carry, rebuilding each layer's input from its output as
/// the eager reversible stack does: nothing per layer is stored, so the memory of forward and
/// backward does not grow with depth (RevNet, Gomez et al. 2017).
inline std::shared_ptr<const layer_body> trace_reverse_layer(
    const tensor_type& carry, const std::vector<tensor_type>& per_layer, const std::vector<tensor_type>& shared,
    const std::function<std::vector<var>(graph&, const var& output, const std::vector<var>& layer, const std::vector<var>& shared,
                                         const var& index, const var& output_grad)>& f) {
    const auto [body, a] = detail::new_layer_body(carry, per_layer, shared);
    graph& g = *body->g;
    const var gy = g.input(carry);
    body->results = f(g, a.carry, a.layer, a.shared, a.index, gy);
    check<graph_error>(body->results.size() == 2 + per_layer.size() + shared.size(), "xla::graph: trace_reverse_layer: the body must return ",
                       2 + per_layer.size() + shared.size(), " values (input, its gradient, one gradient per parameter), got ",
                       body->results.size());
    for (std::size_t i = 0; i < body->results.size(); ++i) {
        const var& r = body->results[i];
        const tensor_type& want = i < 2 ? carry : body->argument(i - 1);
        check<graph_error>(r.defined() && &r.owner() == &g && r.type() == want, "xla::graph: trace_reverse_layer: result ", i,
                           " must be a value of its own graph of type ", want.str());
    }
    return body;
}

/// carry_{l+1} = body(carry_l, stacked[.][l], shared..., l) for l = 0 .. depth-1, as ONE loop.
/// Returns the final carry; the node's second output holds every layer's input carry
/// [depth, carry...] for the gradient (emitted only when a gradient uses it). A body with more
/// results than the new carry (kept layers: the values its gradient reads) gives one more output
/// per extra result, its values of every iteration stacked [depth, ...]. Arguments of the body's
/// graph after the layer index get no value: the results must not depend on them.
/// With a `reverse` body (trace_reverse_layer, same carry and parameters) the gradient rebuilds the
/// carries from the outputs instead of storing them.
inline var scan_layers(const std::shared_ptr<const layer_body>& body, const var& carry, const std::vector<var>& stacked,
                       const std::vector<var>& shared, std::shared_ptr<const layer_body> reverse = nullptr) {
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
    n.kind = op::scan_layers;
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
    if (reverse) {
        bool same = reverse->per_layer == body->per_layer && reverse->shared == body->shared;
        for (std::size_t i = 0; same && i < 1 + body->per_layer + body->shared; ++i) same = reverse->argument(i) == body->argument(i);
        check<graph_error>(same, "xla::graph: scan_layers: the reverse body's carry and parameters differ from the layer body's");
        n.reverse = std::move(reverse);
    }
    return carry.owner().add(std::move(n));
}

/// The depth of a scan_layers node.
inline std::int64_t scan_depth(const node& n) { return n.outputs.at(1).dims.at(0); }

}  // namespace olmax::xla::graph
