#pragma once
// A number of a traced program, for the element-wise rules of ops/math_rules.hpp: each rule's
// value and derivative are written once, for floats and SIMD batches, and with this type the same
// code builds the traced op's value and gradient in the program (rules.hpp, `from_math_rule`), so
// the eager op and its traced form cannot disagree (a ReLU's gradient at 0, a NaN through a gate).
//
// A traced_number is a value of the program or a plain constant (the V(3) of a rule, folded on the
// host); where the two meet, the constant becomes a splat of the value's type. Comparisons give
// predicates (i1 values) for math::choose. Arithmetic makes graph values only: nothing is
// recorded on the tape (the op's gradient is the rule's derivative, recorded by the caller).

#include <cmath>

#include "olmax/core/error.hpp"
#include "olmax/core/traced.hpp"
#include "olmax/xla/graph/graph.hpp"

namespace olmax::trace {

class traced_number {
    using var = xla::graph::var;

public:
    explicit traced_number(double constant) : constant_(constant) {}  // a rule's V(3)
    explicit traced_number(var v) : var_(v) {}

    bool is_constant() const { return !var_.defined(); }
    double constant() const { return constant_; }
    /// Its value as a program value of `like`'s shape (element type f32, or i1 for a predicate).
    var value_like(const var& like) const {
        if (var_.defined()) return var_;
        return xla::graph::constant(like.owner(), constant_, xla::graph::tensor_type{like.dims(), predicate_ ? xla::graph::element::i1 : xla::graph::element::f32});
    }
    const var& value() const {
        check<trace_error>(var_.defined(), "olmax: trace: a rule's number is a constant, not a value of the program");
        return var_;
    }

    /// A constant predicate (a comparison of two constants).
    static traced_number predicate(bool holds) {
        traced_number t(holds ? 1.0 : 0.0);
        t.predicate_ = true;
        return t;
    }

    /// `f` on two numbers: folded when both are constants, else on program values (the constant
    /// made a splat of the other's type).
    template <class OnValues, class OnConstants>
    static traced_number combine(const traced_number& a, const traced_number& b, OnValues on_values, OnConstants on_constants) {
        if (a.is_constant() && b.is_constant()) return on_constants(a.constant(), b.constant());
        const var& like = a.is_constant() ? b.var_ : a.var_;
        return on_values(a.value_like(like), b.value_like(like));
    }

private:
    double constant_ = 0;  // when var_ is undefined
    var var_{};
    bool predicate_ = false;
};

namespace detail {
namespace gx = xla::graph;
template <class F>
traced_number unary(const traced_number& x, F f, double (*host)(double)) {
    return x.is_constant() ? traced_number(host(x.constant())) : traced_number(f(x.value()));
}
inline traced_number compared(const traced_number& a, const traced_number& b, gx::compare_direction d, bool (*host)(double, double)) {
    return traced_number::combine(
        a, b, [d](const gx::var& x, const gx::var& y) { return traced_number(gx::compare(x, y, d)); },
        [host](double x, double y) { return traced_number::predicate(host(x, y)); });
}
}  // namespace detail

inline traced_number operator+(const traced_number& a, const traced_number& b) {
    return traced_number::combine(a, b, [](const auto& x, const auto& y) { return traced_number(x + y); }, [](double x, double y) { return traced_number(x + y); });
}
inline traced_number operator-(const traced_number& a, const traced_number& b) {
    return traced_number::combine(a, b, [](const auto& x, const auto& y) { return traced_number(x - y); }, [](double x, double y) { return traced_number(x - y); });
}
inline traced_number operator*(const traced_number& a, const traced_number& b) {
    return traced_number::combine(a, b, [](const auto& x, const auto& y) { return traced_number(x * y); }, [](double x, double y) { return traced_number(x * y); });
}
inline traced_number operator/(const traced_number& a, const traced_number& b) {
    return traced_number::combine(a, b, [](const auto& x, const auto& y) { return traced_number(x / y); }, [](double x, double y) { return traced_number(x / y); });
}
inline traced_number operator-(const traced_number& x) { return detail::unary(x, [](const xla::graph::var& v) { return -v; }, [](double v) { return -v; }); }

inline traced_number operator<(const traced_number& a, const traced_number& b) {
    return detail::compared(a, b, xla::graph::compare_direction::LT, [](double x, double y) { return x < y; });
}
inline traced_number operator>(const traced_number& a, const traced_number& b) {
    return detail::compared(a, b, xla::graph::compare_direction::GT, [](double x, double y) { return x > y; });
}
inline traced_number operator<=(const traced_number& a, const traced_number& b) {
    return detail::compared(a, b, xla::graph::compare_direction::LE, [](double x, double y) { return x <= y; });
}
/// Both predicates: b where a holds, else false.
inline traced_number operator&&(const traced_number& a, const traced_number& b) {
    if (a.is_constant()) return a.constant() != 0 ? b : traced_number::predicate(false);
    return traced_number(xla::graph::select(a.value(), b.value_like(a.value()), traced_number::predicate(false).value_like(a.value())));
}
/// math::choose on traced numbers: on_true where `c` holds, else on_false.
inline traced_number choose(const traced_number& c, const traced_number& on_true, const traced_number& on_false) {
    if (c.is_constant()) return c.constant() != 0 ? on_true : on_false;
    const xla::graph::var& p = c.value();
    // constants become splats of the other branch's value, or of the predicate's shape when both are
    const xla::graph::var& like = !on_true.is_constant() ? on_true.value() : !on_false.is_constant() ? on_false.value() : p;
    return traced_number(xla::graph::select(p, on_true.value_like(like), on_false.value_like(like)));
}

// The functions the rules call unqualified (found by argument-dependent lookup).
inline traced_number exp(const traced_number& x) { return detail::unary(x, [](const auto& v) { return xla::graph::exp(v); }, [](double v) { return std::exp(v); }); }
inline traced_number log(const traced_number& x) { return detail::unary(x, [](const auto& v) { return xla::graph::log(v); }, [](double v) { return std::log(v); }); }
inline traced_number log1p(const traced_number& x) { return detail::unary(x, [](const auto& v) { return xla::graph::log1p(v); }, [](double v) { return std::log1p(v); }); }
inline traced_number sqrt(const traced_number& x) { return detail::unary(x, [](const auto& v) { return xla::graph::sqrt(v); }, [](double v) { return std::sqrt(v); }); }
inline traced_number tanh(const traced_number& x) { return detail::unary(x, [](const auto& v) { return xla::graph::tanh(v); }, [](double v) { return std::tanh(v); }); }
/// |x|: -x where x < 0, else x (NaN stays NaN).
inline traced_number abs(const traced_number& x) { return choose(x < traced_number(0.0), -x, x); }

}  // namespace olmax::trace
