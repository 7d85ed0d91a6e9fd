#pragma once
// Element-wise modules: one StableHLO unary or binary op over a tensor of any static shape.

#include <string>
#include <string_view>

#include "olmax/xla/stablehlo/function_builder.hpp"
#include "olmax/xla/stablehlo/ir.hpp"
#include "olmax/xla/stablehlo/module.hpp"

namespace olmax::xla::stablehlo {

/// y = op(x) for a StableHLO unary op name (negate, exponential, log, tanh, sqrt, abs, logistic, ...).
inline emitted_module elementwise_unary(std::string_view op, const dims_t& dims) {
    function_builder b({f32(dims)});
    const value y = b.unary(op, b.arg(0));
    return {"unary." + std::string(op) + "." + dims_key(dims), b.finish("unary", {y}), {f32(dims)}, {f32(dims)}};
}

/// z = op(x, y) for a StableHLO binary op name (add, subtract, multiply, divide, maximum, minimum, power).
inline emitted_module elementwise_binary(std::string_view op, const dims_t& dims) {
    function_builder b({f32(dims), f32(dims)});
    const value z = b.binary(op, b.arg(0), b.arg(1));
    return {"binary." + std::string(op) + "." + dims_key(dims), b.finish("binary", {z}), {f32(dims), f32(dims)}, {f32(dims)}};
}

}  // namespace olmax::xla::stablehlo
