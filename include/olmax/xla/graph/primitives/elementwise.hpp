#pragma once
// The element-wise primitives (and the values made from nothing: constants, iota). Values are f32;
// compare makes i1 predicates for select. Operands are of one type (broadcast_in_dim makes them so).

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/xla/graph/ir.hpp"

namespace olmax::xla::graph {

namespace detail {

/// An element-wise primitive of one f32 operand: y = P::apply(x), lowered to `stablehlo.<name>`.
template <class P>
struct unary_elementwise {
    static var make(const var& x) {
        require_f32(P::name, x);
        return detail::make<P>({x}, x.type());
    }
    static value emit(function_builder& b, const node&, const std::vector<value>& in) { return b.unary(P::name, in[0]); }
    static void evaluate(const node&, const std::vector<const host_value*>& in, host_value& out) {
        for (std::size_t k = 0; k < out.data.size(); ++k) out.data[k] = P::apply(in[0]->data[k]);
    }
};

/// An element-wise primitive of two f32 operands of one type: z = P::apply(x, y), lowered to
/// `stablehlo.<name>`.
template <class P>
struct binary_elementwise {
    static var make(const var& a, const var& b) {
        same_type(P::name, a, b);
        require_f32(P::name, a);
        return detail::make<P>({a, b}, a.type());
    }
    static value emit(function_builder& b, const node&, const std::vector<value>& in) { return b.binary(P::name, in[0], in[1]); }
    static void evaluate(const node&, const std::vector<const host_value*>& in, host_value& out) {
        for (std::size_t k = 0; k < out.data.size(); ++k) out.data[k] = P::apply(in[0]->data[k], in[1]->data[k]);
    }
};

}  // namespace detail

namespace prim {

/// A splat of `scalar`, or (`values` set) a dense tensor: a host tensor captured by a traced program.
struct constant {
    static constexpr std::string_view name = "constant";
    static constexpr no_gradient gradient{};
    static var make(graph& g, double v, tensor_type type) {
        node n;
        n.kind = op::of<constant>();
        n.scalar = v;
        n.outputs = {std::move(type)};
        return g.add(std::move(n));
    }
    /// All values equal and finite (a host tensor of ones captured by a traced op): a splat, one
    /// number of program text instead of one per element.
    static var make_dense(graph& g, std::vector<float> values, tensor_type type) {
        check<graph_error>(type.elem == element::f32 && std::int64_t(values.size()) == type.elements(), "xla::graph: a dense constant of ",
                           values.size(), " values for ", type.str());
        const auto bits = [](float v) { return std::bit_cast<std::uint32_t>(v); };
        if (!values.empty() && std::isfinite(values[0]) &&
            std::all_of(values.begin(), values.end(), [&](float v) { return bits(v) == bits(values[0]); }))
            return make(g, values[0], std::move(type));
        node n;
        n.kind = op::of<constant>();
        n.outputs = {std::move(type)};
        n.values = std::make_shared<const std::vector<float>>(std::move(values));
        return g.add(std::move(n));
    }
    static value emit(function_builder& b, const node& n, const std::vector<value>&) {
        return n.values ? b.dense_constant(*n.values, n.outputs[0]) : b.constant(n.scalar, n.outputs[0]);
    }
    static void evaluate(const node& n, const std::vector<const host_value*>&, host_value& out) {
        if (n.values) std::copy(n.values->begin(), n.values->end(), out.data.begin());
        else std::fill(out.data.begin(), out.data.end(), n.scalar);
    }
};

/// f32 indices 0, 1, ... along `axis`.
struct iota {
    static constexpr std::string_view name = "iota";
    static constexpr no_gradient gradient{};
    static var make(graph& g, tensor_type type, std::int64_t axis) {
        detail::check_axes(name, type, {axis});
        node n;
        n.kind = op::of<iota>();
        n.axis = axis;
        n.outputs = {std::move(type)};
        return g.add(std::move(n));
    }
    static value emit(function_builder& b, const node& n, const std::vector<value>&) {
        return b.convert(b.iota({n.outputs[0].dims, element::i32}, n.axis), element::f32);
    }
    static void evaluate(const node& n, const std::vector<const host_value*>&, host_value& out) {
        detail::for_each_index(out.type.dims, [&](std::int64_t flat, const std::vector<std::int64_t>& idx) {
            out.data[std::size_t(flat)] = double(idx[std::size_t(n.axis)]);
        });
    }
};

struct add : detail::binary_elementwise<add> {
    static constexpr std::string_view name = "add";
    static double apply(double a, double b) { return a + b; }
    static void gradient(vjp& v) { v.dx = {v.gy[0], v.gy[0]}; }
};

struct negate : detail::unary_elementwise<negate> {
    static constexpr std::string_view name = "negate";
    static double apply(double a) { return -a; }
    static void gradient(vjp& v) { v.dx[0] = make(v.gy[0]); }
};

struct subtract : detail::binary_elementwise<subtract> {
    static constexpr std::string_view name = "subtract";
    static double apply(double a, double b) { return a - b; }
    static void gradient(vjp& v) {
        v.dx[0] = v.gy[0];
        if (v.needs(1)) v.dx[1] = negate::make(v.gy[0]);
    }
};

struct multiply : detail::binary_elementwise<multiply> {
    static constexpr std::string_view name = "multiply";
    static double apply(double a, double b) { return a * b; }
    static void gradient(vjp& v) {
        if (v.needs(0)) v.dx[0] = make(v.gy[0], v.x[1]);
        if (v.needs(1)) v.dx[1] = make(v.gy[0], v.x[0]);
    }
};

struct divide : detail::binary_elementwise<divide> {
    static constexpr std::string_view name = "divide";
    static double apply(double a, double b) { return a / b; }
    static void gradient(vjp& v) {
        const var ga = make(v.gy[0], v.x[1]);
        if (v.needs(1)) v.dx[1] = negate::make(multiply::make(ga, v.y[0]));  // d(a/b)/db = -y / b
        v.dx[0] = ga;
    }
};

/// Values of one f32 type, compared element-wise: an i1 predicate of their shape.
struct compare {
    static constexpr std::string_view name = "compare";
    static constexpr no_gradient gradient{};
    static var make(const var& a, const var& b, compare_direction direction) {
        detail::same_type(name, a, b);
        node n = detail::make_node<compare>({a, b}, {a.dims(), element::i1});
        n.direction = direction;
        return detail::commit(std::move(n));
    }
    static value emit(function_builder& b, const node& n, const std::vector<value>& in) { return b.compare(in[0], in[1], n.direction); }
    static void evaluate(const node& n, const std::vector<const host_value*>& in, host_value& out) {
        const auto d = n.direction;
        for (std::size_t k = 0; k < out.data.size(); ++k) {
            const double a = in[0]->data[k], b = in[1]->data[k];
            bool r = false;
            switch (d) {
                case compare_direction::EQ: r = a == b; break;
                case compare_direction::NE: r = a != b; break;
                case compare_direction::GE: r = a >= b; break;
                case compare_direction::GT: r = a > b; break;
                case compare_direction::LE: r = a <= b; break;
                case compare_direction::LT: r = a < b; break;
            }
            out.data[k] = double(r);
        }
    }
};

/// select(pred, on_true, on_false); the predicate gets no gradient.
struct select {
    static constexpr std::string_view name = "select";
    static var make(const var& predicate, const var& on_true, const var& on_false) {
        detail::same_type(name, on_true, on_false);
        check<graph_error>(predicate.type() == tensor_type{on_true.dims(), element::i1}, "xla::graph: select: predicate ", predicate.type().str(),
                           " does not match ", on_true.type().str());
        return detail::make<select>({predicate, on_true, on_false}, on_true.type());
    }
    static value emit(function_builder& b, const node&, const std::vector<value>& in) { return b.select(in[0], in[1], in[2]); }
    static void evaluate(const node&, const std::vector<const host_value*>& in, host_value& out) {
        for (std::size_t k = 0; k < out.data.size(); ++k) out.data[k] = in[0]->data[k] != 0 ? in[1]->data[k] : in[2]->data[k];
    }
    static void gradient(vjp& v) {
        const var zero = constant::make(v.gy[0].owner(), 0.0, tensor_type(v.gy[0].type()));
        if (v.needs(1)) v.dx[1] = make(v.x[0], v.gy[0], zero);
        if (v.needs(2)) v.dx[2] = make(v.x[0], zero, v.gy[0]);
    }
};

/// Element-wise maximum. A NaN in either operand gives NaN, as stablehlo.maximum (IEEE 754
/// maximum) and the eager op do; std::max would return the other operand when the NaN is second.
/// The gradient goes where the eager op's does: to `a` where a >= b or a is NaN, else to `b`.
struct maximum : detail::binary_elementwise<maximum> {
    static constexpr std::string_view name = "maximum";
    static double apply(double a, double b) { return (a >= b || a != a) ? a : b; }
    static void gradient(vjp& v) {
        const var ge = compare::make(v.x[0], v.x[1], compare_direction::GE);
        const var a_is_nan = compare::make(v.x[0], v.x[0], compare_direction::NE);  // a >= b is false there
        const var zero = constant::make(v.gy[0].owner(), 0.0, tensor_type(v.gy[0].type()));
        v.dx[0] = select::make(a_is_nan, v.gy[0], select::make(ge, v.gy[0], zero));
        v.dx[1] = select::make(a_is_nan, zero, select::make(ge, zero, v.gy[0]));
    }
};

struct exponential : detail::unary_elementwise<exponential> {
    static constexpr std::string_view name = "exponential";
    static double apply(double a) { return std::exp(a); }
    static void gradient(vjp& v) { v.dx[0] = multiply::make(v.gy[0], v.y[0]); }
};

struct log : detail::unary_elementwise<log> {
    static constexpr std::string_view name = "log";
    static double apply(double a) { return std::log(a); }
    static void gradient(vjp& v) { v.dx[0] = divide::make(v.gy[0], v.x[0]); }
};

/// log(1 + x), accurate where x is tiny (softplus's log1p(exp(-|x|)) far from 0).
struct log_plus_one : detail::unary_elementwise<log_plus_one> {
    static constexpr std::string_view name = "log_plus_one";
    static double apply(double a) { return std::log1p(a); }
    static void gradient(vjp& v) { v.dx[0] = divide::make(v.gy[0], add::make(v.x[0], constant::make(v.gy[0].owner(), 1.0, tensor_type(v.x[0].type())))); }
};

struct sqrt : detail::unary_elementwise<sqrt> {
    static constexpr std::string_view name = "sqrt";
    static double apply(double a) { return std::sqrt(a); }
    static void gradient(vjp& v) {  // g / (2 y)
        const var half = constant::make(v.gy[0].owner(), 0.5, tensor_type(v.gy[0].type()));
        v.dx[0] = divide::make(multiply::make(v.gy[0], half), v.y[0]);
    }
};

struct tanh : detail::unary_elementwise<tanh> {
    static constexpr std::string_view name = "tanh";
    static double apply(double a) { return std::tanh(a); }
    static void gradient(vjp& v) {  // g (1 - y^2)
        const var minus_square = negate::make(multiply::make(v.y[0], v.y[0]));
        const var one = constant::make(v.gy[0].owner(), 1.0, tensor_type(v.y[0].type()));
        v.dx[0] = multiply::make(v.gy[0], add::make(minus_square, one));
    }
};

struct logistic : detail::unary_elementwise<logistic> {
    static constexpr std::string_view name = "logistic";
    static double apply(double a) { return 1.0 / (1.0 + std::exp(-a)); }
    static void gradient(vjp& v) {  // g y (1 - y)
        const var minus_y = negate::make(v.y[0]);
        const var one = constant::make(v.gy[0].owner(), 1.0, tensor_type(v.y[0].type()));
        v.dx[0] = multiply::make(v.gy[0], multiply::make(v.y[0], add::make(minus_y, one)));
    }
};

/// Round down; its gradient is zero.
struct floor : detail::unary_elementwise<floor> {
    static constexpr std::string_view name = "floor";
    static constexpr no_gradient gradient{};
    static double apply(double a) { return std::floor(a); }
};

/// The identity, whose gradient is zero.
struct stop_gradient {
    static constexpr std::string_view name = "stop_gradient";
    static constexpr no_gradient gradient{};
    static var make(const var& x) { return detail::make<stop_gradient>({x}, x.type()); }
    static value emit(function_builder&, const node&, const std::vector<value>& in) { return in[0]; }
    static void evaluate(const node&, const std::vector<const host_value*>& in, host_value& out) { out.data = in[0]->data; }
};

}  // namespace prim

inline var constant(graph& g, double value, tensor_type type) { return prim::constant::make(g, value, std::move(type)); }
/// A constant holding `values` (row-major) of `type` (f32): a host tensor captured by a traced program.
inline var dense_constant(graph& g, std::vector<float> values, tensor_type type) {
    return prim::constant::make_dense(g, std::move(values), std::move(type));
}
/// A constant of x's type (x only gives the graph and the shape).
inline var constant_like(const var& x, double value) { return constant(x.owner(), value, tensor_type(x.type())); }
inline var iota(graph& g, tensor_type type, std::int64_t axis) { return prim::iota::make(g, std::move(type), axis); }

inline var operator+(const var& a, const var& b) { return prim::add::make(a, b); }
inline var operator-(const var& a, const var& b) { return prim::subtract::make(a, b); }
inline var operator*(const var& a, const var& b) { return prim::multiply::make(a, b); }
inline var operator/(const var& a, const var& b) { return prim::divide::make(a, b); }
inline var operator-(const var& x) { return prim::negate::make(x); }
inline var operator+(const var& a, double c) { return a + constant_like(a, c); }
inline var operator*(const var& a, double c) { return a * constant_like(a, c); }
inline var operator*(double c, const var& a) { return constant_like(a, c) * a; }
inline var operator-(const var& a, double c) { return a - constant_like(a, c); }
inline var operator-(double c, const var& a) { return constant_like(a, c) - a; }
inline var operator/(const var& a, double c) { return a / constant_like(a, c); }

inline var maximum(const var& a, const var& b) { return prim::maximum::make(a, b); }
inline var exp(const var& x) { return prim::exponential::make(x); }
inline var log(const var& x) { return prim::log::make(x); }
inline var log1p(const var& x) { return prim::log_plus_one::make(x); }
inline var tanh(const var& x) { return prim::tanh::make(x); }
inline var logistic(const var& x) { return prim::logistic::make(x); }
inline var sqrt(const var& x) { return prim::sqrt::make(x); }
inline var floor(const var& x) { return prim::floor::make(x); }
inline var stop_gradient(const var& x) { return prim::stop_gradient::make(x); }
inline var compare(const var& a, const var& b, compare_direction direction) { return prim::compare::make(a, b, direction); }
inline var select(const var& predicate, const var& on_true, const var& on_false) { return prim::select::make(predicate, on_true, on_false); }

}  // namespace olmax::xla::graph
