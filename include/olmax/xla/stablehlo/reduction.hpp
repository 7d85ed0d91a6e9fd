#pragma once
// Reduction modules: the sum or the maximum of a tensor over some of its axes.

#include <string>

#include "olmax/xla/stablehlo/function_builder.hpp"
#include "olmax/xla/stablehlo/ir.hpp"
#include "olmax/xla/stablehlo/module.hpp"

namespace olmax::xla::stablehlo {

enum class reduction_kind { sum, max };

/// Sum or max of x over `axes`.
inline emitted_module reduce(reduction_kind kind, const dims_t& dims, const dims_t& axes) {
    function_builder b({f32(dims)});
    const bool sum = kind == reduction_kind::sum;
    const value y = b.reduce(b.arg(0), sum ? 0.0 : -3.4028234663852886e38, axes, sum ? "add" : "maximum");
    const std::string key = std::string(sum ? "reduce_sum." : "reduce_max.") + dims_key(dims) + ".axes" + dims_key(axes);
    return {key, b.finish("reduce", {y}), {f32(dims)}, {y.type}};
}

}  // namespace olmax::xla::stablehlo
