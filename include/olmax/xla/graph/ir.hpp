#pragma once
// The traced program's IR: values (`var`), nodes, the graph, and the registry prim::all of the
// primitives a node applies. Each primitive is one struct in its family's header under
// xla/graph/primitives/ holding all of it: `make` (checks the operands, so a bad program fails while
// it is built, naming the primitive, and appends the node), `emit` (its StableHLO lowering),
// `evaluate` (its double-precision reference, what the gradient tests and the device runs are
// checked against) and `gradient` (its reverse-mode rule, written in the primitives, or one of the
// markers no_gradient and gradient_in_tracer below). A node points at its primitive's descriptor
// (`op`, made by `describe`), so the emitter, the reference evaluation and the tape
// (olmax/trace/primitives.hpp) hold no list of primitives. A struct missing a part, or missing from
// the registry, does not compile. A primitive defined outside olmax (a user's, a test's) declares
// `static constexpr bool defined_outside_olmax = true` instead of a registry entry: it is then in no
// table (find_primitive, the registry's tests). Worked example: docs/ARCHITECTURE.md, "Adding a primitive".

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "olmax/xla/stablehlo/function_builder.hpp"
#include "olmax/xla/stablehlo/ir.hpp"
#include "olmax/xla/stablehlo/scan_strategy.hpp"
#include "olmax/core/error.hpp"

namespace olmax::xla::graph {

using stablehlo::compare_direction;
using stablehlo::dims_t;
using stablehlo::element;
using stablehlo::f32;
using stablehlo::function_builder;
using stablehlo::tensor_type;
using stablehlo::value;

/// A program that cannot be built, differentiated or lowered: a shape mismatch, a value of another
/// graph, a primitive without a rule. The message names the primitive.
class graph_error : public olmax::error {
public:
    using olmax::error::error;
};

template <class... P>
struct primitive_list {
    static constexpr std::size_t size = sizeof...(P);
};

namespace prim {

/// THE REGISTRY: every primitive of a traced program, one entry each. An entry declares its struct
/// here (the elaborated `struct name`), which its family's header (named on the right) defines;
/// graph.hpp includes those headers and checks every entry. Semantics: StableHLO's
/// (openxla.org/stablehlo/spec), restricted as each struct notes.
using all = primitive_list<
    struct input,                                                                              // ir.hpp (below)
    struct constant, struct iota, struct add, struct subtract, struct multiply, struct divide,  // primitives/elementwise.hpp
    struct maximum, struct negate, struct exponential, struct log, struct log_plus_one, struct tanh, struct logistic, struct sqrt, struct floor,
    struct compare, struct select, struct stop_gradient,
    struct broadcast_in_dim, struct reshape, struct transpose, struct slice, struct pad,       // primitives/structure.hpp
    struct concatenate, struct reduce_sum, struct reduce_max,
    struct dot, struct all_reduce_sum,                                                          // primitives/dot.hpp
    struct gather_rows, struct scatter_add_rows,                                                // primitives/gather.hpp
    struct linear_scan, struct matrix_scan, struct selective_scan,                              // primitives/scans.hpp
    struct selective_scan_backward,
    struct scan_layers, struct scan_layers_backward>;                                           // primitives/layer_loop.hpp

}  // namespace prim

/// A dense row-major host tensor in double precision (i1 values as 0 / 1): the reference
/// evaluation's values.
struct host_value {
    tensor_type type;
    std::vector<double> data;
};

class graph;
struct node;
struct layer_body;
struct vjp;
struct primitive_info;

/// A node's primitive: a handle to its descriptor (name, lowering, evaluation, gradient).
class op {
public:
    op() = default;
    /// The primitive defined by struct P (one of prim::all).
    template <class P>
    static op of();

    bool defined() const { return info_ != nullptr; }
    const primitive_info& info() const {
        check<graph_error>(info_ != nullptr, "xla::graph: a node without a primitive");
        return *info_;
    }
    std::string_view name() const;
    friend bool operator==(const op&, const op&) = default;

private:
    explicit op(const primitive_info* info) : info_(info) {}
    const primitive_info* info_ = nullptr;
};

/// The primitive's name as error messages spell it.
inline std::string_view op_name(op o) { return o.name(); }

/// One output of one node: the symbolic tensor a traced program computes with. Cheap to copy; valid
/// while its graph lives (graphs do not move). Its type is a reference into the graph: copy it
/// before adding nodes.
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

/// One primitive application: its primitive, operands, output types and the attributes its
/// primitive reads.
struct node {
    op kind;
    std::vector<var> operands;
    std::vector<tensor_type> outputs;
    double scalar = 0;                      // constant: the value
    std::shared_ptr<const std::vector<float>> values;  // constant: its elements, row-major (null: every one is `scalar`)
    dims_t dims;                            // reduce axes, permutation, broadcast dims, dot's (lhs, rhs) contracting dims
    std::int64_t axis = 0;                  // iota: the axis; all_reduce_sum: the replica count; linear_scan, matrix_scan: 1 from the end; selective_scan(_backward): the chunk
    compare_direction direction = compare_direction::EQ;
    std::shared_ptr<const layer_body> body;  // scan_layers(_backward): the traced layer (or its gradient)
    std::size_t stacked = 0;                 // scan_layers(_backward): how many parameters are stacked [depth, ...]
    /// scan_layers_backward: `body` rebuilds each layer's input from its output (a reversible
    /// layer's backward), so the loop walks back from the final carry instead of reading stored ones.
    bool rebuilds = false;
    /// scan_layers_backward of kept layers: values of `body`'s graph that each iteration reads from
    /// the forward loop's stacked outputs (the operands after the parameters, one per value, in
    /// this order) instead of computing them, so the body does not recompute the layer.
    std::vector<var> saved;
    stablehlo::scan_strategy scan{};          // linear_scan: how it lowers
    /// selective_scan(_backward): lowered to a custom call of olmax's own CPU kernel
    /// (trace/native_calls.hpp) instead of loops over time; only for a plugin with those registered.
    bool native_call = false;
    /// dot: its operands rounded to bfloat16 (nearest even), their products summed in f32: a GEMM
    /// of the bf16 precision policy (docs/BF16.md), lowered as bf16 x bf16 -> f32.
    bool bf16_operands = false;

    /// Whether this node applies the primitive defined by struct P.
    template <class P>
    bool is() const {
        return kind == op::of<P>();
    }
};

/// What a gradient rule works with: a copy of the node (its attributes), its operands `x`, outputs
/// `y`, the gradients `gy` of the outputs the tape differentiates, and which operands want one. The
/// rule sets `dx[i]` (in the node's graph); one left undefined gets none (an index operand, a mask).
struct vjp {
    node n;
    std::vector<var> x, y, gy;
    std::vector<bool> wanted;
    std::vector<var> dx;

    bool needs(std::size_t i) const { return i < wanted.size() && wanted[i]; }
};

/// A primitive's descriptor, made once from its struct (`describe`).
struct primitive_info {
    std::string_view name;
    std::size_t index = 0;  // its position in prim::all (prim::all::size: defined outside olmax)
    /// Kept layers store its results per layer instead of recomputing them in the backward
    /// (products, reductions, scans, gathers: ops that read more than they write; trace/layer_loop.hpp).
    bool saved_by_kept_layers = false;
    /// How many of its outputs the tape differentiates (the first ones; the rest are what its
    /// gradient reads, e.g. a scan's checkpoints).
    std::size_t differentiated_outputs = 0;
    std::vector<value> (*emit)(function_builder&, const node&, const std::vector<value>& in, const std::vector<bool>& needed) = nullptr;
    std::vector<host_value> (*evaluate)(const node&, const std::vector<const host_value*>& in) = nullptr;
    void (*gradient)(vjp&) = nullptr;  // null: no rule (see the two markers below)
    bool gradient_in_tracer = false;   // the tracer records its gradient itself (the layer loop)
};

inline std::string_view op::name() const { return info_ ? info_->name : std::string_view("(no primitive)"); }

/// `gradient` of a primitive whose outputs carry no gradient (constants, comparisons, floor, the
/// gradients of other primitives): the tape treats its outputs as constants.
struct no_gradient {};
/// `gradient` of a primitive whose gradient the tracer records itself (scan_layers: the layer's
/// backward is traced into the reverse loop's body by olmax/trace/layer_loop.hpp).
struct gradient_in_tracer {};

namespace detail {

template <class P, class... Ps>
constexpr std::size_t registry_index(primitive_list<Ps...>) {
    std::size_t at = 0, found = sizeof...(Ps);
    ((std::is_same_v<P, Ps> ? (found = at, ++at) : ++at), ...);
    return found;
}

/// Emit of a primitive of one output: `value emit(b, node, in)`; of several (or one that reads
/// which outputs are used): `std::vector<value> emit(b, node, in, needed)`.
template <class P>
concept emits_one = requires(function_builder& b, const node& n, const std::vector<value>& in) {
    { P::emit(b, n, in) } -> std::same_as<value>;
};
template <class P>
concept emits_all = requires(function_builder& b, const node& n, const std::vector<value>& in, const std::vector<bool>& needed) {
    { P::emit(b, n, in, needed) } -> std::same_as<std::vector<value>>;
};
/// Evaluate of a primitive of one output: `void evaluate(node, in, out)` (out zeros of its type);
/// of several: `std::vector<host_value> evaluate(node, in)`.
template <class P>
concept evaluates_one = requires(const node& n, const std::vector<const host_value*>& in, host_value& out) {
    { P::evaluate(n, in, out) } -> std::same_as<void>;
};
template <class P>
concept evaluates_all = requires(const node& n, const std::vector<const host_value*>& in) {
    { P::evaluate(n, in) } -> std::same_as<std::vector<host_value>>;
};
template <class P>
concept has_gradient_rule = requires(vjp& v) {
    { P::gradient(v) } -> std::same_as<void>;
};
template <class P>
concept marks_gradient = std::is_same_v<std::remove_cvref_t<decltype(P::gradient)>, no_gradient> ||
                         std::is_same_v<std::remove_cvref_t<decltype(P::gradient)>, gradient_in_tracer>;

template <class P>
std::vector<value> emit_adapter(function_builder& b, const node& n, const std::vector<value>& in, const std::vector<bool>& needed) {
    if constexpr (emits_all<P>) return P::emit(b, n, in, needed);
    else return {P::emit(b, n, in)};
}

template <class P>
std::vector<host_value> evaluate_adapter(const node& n, const std::vector<const host_value*>& in) {
    if constexpr (evaluates_all<P>) {
        return P::evaluate(n, in);
    } else {
        host_value out{n.outputs.at(0), std::vector<double>(std::size_t(n.outputs.at(0).elements()), 0.0)};
        P::evaluate(n, in, out);
        return {std::move(out)};
    }
}

}  // namespace detail

/// Whether P declares itself a primitive defined outside olmax (not an entry of prim::all).
template <class P>
concept defined_outside_olmax = requires {
    requires P::defined_outside_olmax;
};

/// A complete primitive definition: a name, a lowering, a reference evaluation and a gradient rule
/// (or a marker for none).
template <class P>
concept primitive_definition = requires {
    { P::name } -> std::convertible_to<std::string_view>;
} && (detail::emits_one<P> || detail::emits_all<P>) && (detail::evaluates_one<P> || detail::evaluates_all<P>) &&
                               (detail::has_gradient_rule<P> || detail::marks_gradient<P>);

/// The descriptor of primitive P; fails to compile, naming the missing part, when P is incomplete
/// or not in the registry.
template <class P>
consteval primitive_info describe() {
    static_assert(detail::registry_index<P>(prim::all{}) < prim::all::size || defined_outside_olmax<P>,
                  "xla::graph: a primitive missing from the registry prim::all (ir.hpp)");
    static_assert(requires { { P::name } -> std::convertible_to<std::string_view>; }, "xla::graph: a primitive needs `static constexpr std::string_view name`");
    static_assert(detail::emits_one<P> || detail::emits_all<P>, "xla::graph: a primitive needs `emit` (its StableHLO lowering)");
    static_assert(detail::evaluates_one<P> || detail::evaluates_all<P>, "xla::graph: a primitive needs `evaluate` (its reference evaluation)");
    static_assert(detail::has_gradient_rule<P> || detail::marks_gradient<P>,
                  "xla::graph: a primitive needs `gradient`: `static void gradient(vjp&)`, or `no_gradient` / `gradient_in_tracer`");
    primitive_info info;
    info.name = P::name;
    info.index = detail::registry_index<P>(prim::all{});
    if constexpr (requires { P::saved_by_kept_layers; }) info.saved_by_kept_layers = P::saved_by_kept_layers;
    if constexpr (requires { P::differentiated_outputs; }) info.differentiated_outputs = P::differentiated_outputs;
    info.emit = &detail::emit_adapter<P>;
    info.evaluate = &detail::evaluate_adapter<P>;
    if constexpr (detail::has_gradient_rule<P>) info.gradient = &P::gradient;
    else info.gradient_in_tracer = std::is_same_v<std::remove_cvref_t<decltype(P::gradient)>, gradient_in_tracer>;
    return info;
}

/// The descriptor every node of primitive P points at.
template <class P>
inline constexpr primitive_info info_of = describe<P>();

template <class P>
op op::of() {
    return op(&info_of<P>);
}

namespace prim {

/// A program argument (graph::input makes it; emit and evaluate are given its value by the caller).
struct input {
    static constexpr std::string_view name = "input";
    static constexpr no_gradient gradient{};
    [[noreturn]] static value emit(function_builder&, const node&, const std::vector<value>&) { unbound(); }
    [[noreturn]] static void evaluate(const node&, const std::vector<const host_value*>&, host_value&) { unbound(); }

private:
    [[noreturn]] static void unbound() { throw graph_error("xla::graph: an input reached the lowering unbound"); }
};

}  // namespace prim

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
        n.kind = op::of<prim::input>();
        n.outputs = {std::move(type)};
        inputs_.push_back(static_cast<std::uint32_t>(nodes_.size()));
        return add(std::move(n));
    }

    const std::vector<node>& nodes() const { return nodes_; }
    const node& at(std::uint32_t index) const { return nodes_.at(index); }
    /// Node indices of the inputs, in argument order.
    const std::vector<std::uint32_t>& inputs() const { return inputs_; }

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

// ---- what the primitives' `make` share ----------------------------------------------------------

namespace detail {

/// A node of primitive P with one output; callers set its attributes before `commit`.
template <class P>
node make_node(std::vector<var> operands, tensor_type out) {
    check<graph_error>(!operands.empty(), "xla::graph: ", P::name, " needs an operand");
    node n;
    n.kind = op::of<P>();
    n.operands = std::move(operands);
    n.outputs = {std::move(out)};
    return n;
}
/// Appends `n` to its operands' graph.
inline var commit(node n) {
    graph& g = n.operands.front().owner();
    return g.add(std::move(n));
}
template <class P>
var make(std::vector<var> operands, tensor_type out) {
    return commit(make_node<P>(std::move(operands), std::move(out)));
}

inline void same_type(std::string_view name, const var& a, const var& b) {
    check<graph_error>(a.type() == b.type(), "xla::graph: ", name, ": operand types differ: ", a.type().str(), " and ", b.type().str());
}

inline void require_f32(std::string_view name, const var& x) {
    check<graph_error>(x.type().elem == element::f32, "xla::graph: ", name, " takes f32, got ", x.type().str());
}

inline void check_axes(std::string_view name, const tensor_type& t, const dims_t& axes) {
    for (std::size_t i = 0; i < axes.size(); ++i) {
        check<graph_error>(axes[i] >= 0 && axes[i] < static_cast<std::int64_t>(t.rank()), "xla::graph: ", name, ": axis ", axes[i],
                           " out of range for ", t.str());
        check<graph_error>(i == 0 || axes[i] > axes[i - 1], "xla::graph: ", name, ": axes must be increasing");
    }
}

/// Every output of the node that made `first`.
inline std::vector<var> outputs_of(const var& first) {
    std::vector<var> out;
    const node& n = first.owner().at(first.node());
    for (std::uint32_t k = 0; k < n.outputs.size(); ++k) out.emplace_back(&first.owner(), first.node(), k);
    return out;
}

// ---- the generic walks: lowering, reference evaluation, gradient -------------------------------

/// Values of a graph given from outside instead of computed (kept layers' saved values).
using given_values = std::vector<std::pair<var, value>>;
using given_host_values = std::vector<std::pair<var, host_value>>;

template <class V>
const V* given_value(const std::vector<std::pair<var, V>>& given, const var& v) {
    for (const auto& [at, x] : given)
        if (at == v) return &x;
    return nullptr;
}

/// Which outputs of which nodes `results` need (a given value needs nothing of its node).
template <class V>
std::vector<std::vector<bool>> needed_outputs(const graph& g, const std::vector<var>& results, const std::vector<std::pair<var, V>>& given) {
    std::vector<std::vector<bool>> needed(g.nodes().size());
    for (std::size_t i = 0; i < needed.size(); ++i) needed[i].assign(g.at(static_cast<std::uint32_t>(i)).outputs.size(), false);
    auto need = [&](const var& v) {
        if (!given_value(given, v)) needed[v.node()][v.output()] = true;
    };
    for (const auto& r : results) need(r);
    for (std::size_t i = needed.size(); i-- > 0;)
        if (std::find(needed[i].begin(), needed[i].end(), true) != needed[i].end())
            for (const auto& operand : g.at(static_cast<std::uint32_t>(i)).operands) need(operand);
    return needed;
}

/// The walk of the lowering and of the reference evaluation: `args` bind the graph's inputs
/// (checked by count), then every node that `results` need, in order, gets its outputs from
/// `apply(node, its operands' values, which of its outputs are needed)`.
template <class V, class Apply>
std::vector<V> walk_graph(const graph& g, const std::vector<V>& args, const std::vector<var>& results, const std::vector<std::pair<var, V>>& given,
                          Apply&& apply) {
    check<graph_error>(args.size() == g.inputs().size(), "xla::graph: ", args.size(), " inputs for a graph of ", g.inputs().size());
    const auto needed = needed_outputs(g, results, given);
    std::vector<std::vector<V>> v(g.nodes().size());
    auto value_of = [&](const var& x) -> const V& {
        const V* from_outside = given_value(given, x);
        return from_outside ? *from_outside : v[x.node()][x.output()];
    };
    for (std::size_t i = 0; i < args.size(); ++i) v[g.inputs()[i]] = {args[i]};
    for (std::uint32_t i = 0; i < g.nodes().size(); ++i) {
        const node& n = g.at(i);
        if (n.is<prim::input>() || std::find(needed[i].begin(), needed[i].end(), true) == needed[i].end()) continue;
        std::vector<const V*> in;
        for (const auto& operand : n.operands) in.push_back(&value_of(operand));
        v[i] = apply(n, in, needed[i]);
    }
    std::vector<V> out;
    for (const auto& r : results) out.push_back(value_of(r));
    return out;
}

/// `results` of `g` lowered into `b` from `args` (one per graph input), by each node's `emit`.
inline std::vector<value> emit_graph(function_builder& b, const graph& g, const std::vector<value>& args, const std::vector<var>& results,
                                     const given_values& given = {}) {
    return walk_graph(g, args, results, given, [&](const node& n, const std::vector<const value*>& in, const std::vector<bool>& needed) {
        std::vector<value> operands;
        for (const value* x : in) operands.push_back(*x);
        return n.kind.info().emit(b, n, operands, needed);
    });
}

/// `results` of `g` evaluated in double precision from `args` (one per graph input, of its type),
/// by each node's `evaluate`.
inline std::vector<host_value> evaluate_graph(const graph& g, const std::vector<host_value>& args, const std::vector<var>& results,
                                              const given_host_values& given = {}) {
    for (std::size_t i = 0; i < args.size() && i < g.inputs().size(); ++i) {
        const tensor_type& want = g.at(g.inputs()[i]).outputs[0];
        check<graph_error>(args[i].type == want && args[i].data.size() == std::size_t(want.elements()), "xla::graph: evaluate: input ", i,
                           " is ", args[i].type.str(), " with ", args[i].data.size(), " values, expected ", want.str());
    }
    return walk_graph(g, args, results, given,
                      [](const node& n, const std::vector<const host_value*>& in, const std::vector<bool>&) { return n.kind.info().evaluate(n, in); });
}

}  // namespace detail

/// The gradients of the operands of the node that made `first`, by its primitive's rule: `gy` the
/// gradients of its first `differentiated_outputs` outputs, `wanted` one flag per operand. Returns
/// one value per operand, undefined where none was wanted or the rule gives none.
inline std::vector<var> gradient_of(const var& first, const std::vector<var>& gy, const std::vector<bool>& wanted) {
    graph& g = first.owner();
    vjp v{g.at(first.node()), {}, {}, gy, wanted, {}};  // a copy of the node: the rule adds nodes to its graph
    const primitive_info& info = v.n.kind.info();
    check<graph_error>(info.gradient != nullptr, "xla::graph: ", info.name, " has no gradient rule",
                       info.gradient_in_tracer ? " of the graph (the tracer records it)" : "");
    v.x = v.n.operands;
    v.y = detail::outputs_of(first);
    v.wanted.resize(v.x.size(), false);
    v.dx.resize(v.x.size());
    info.gradient(v);
    check<graph_error>(v.dx.size() == v.x.size(), "xla::graph: the gradient rule of ", info.name, " changed the number of operands");
    for (std::size_t i = 0; i < v.dx.size(); ++i)
        if (v.dx[i].defined())
            check<graph_error>(&v.dx[i].owner() == &g && v.dx[i].type() == v.x[i].type(), "xla::graph: the gradient rule of ", info.name,
                               " gave operand ", i, " (", v.x[i].type().str(), ") a gradient of type ", v.dx[i].type().str());
    return v.dx;
}

// ---- helpers of the reference evaluations -------------------------------------------------------

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

/// Calls f(flat index in the block, flat index in the whole) for every element of a `block` placed
/// at `start` inside `whole` (slice reads such a block, pad and concatenate write one).
template <class F>
void for_each_in_block(const dims_t& block, const dims_t& whole, const dims_t& start, F&& f) {
    const auto whole_strides = strides_of(whole);
    for_each_index(block, [&](std::int64_t flat, const std::vector<std::int64_t>& idx) {
        std::int64_t w = 0;
        for (std::size_t d = 0; d < idx.size(); ++d) w += (idx[d] + start[d]) * whole_strides[d];
        f(std::size_t(flat), std::size_t(w));
    });
}

}  // namespace detail

}  // namespace olmax::xla::graph
