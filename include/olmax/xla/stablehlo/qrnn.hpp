#pragma once
// QRNN block modules: z = u W, hard-sigmoid forget gate, the linear scan, forward and a
// linear-memory backward that recomputes the forward.

#include <cstdint>
#include <string>
#include <string_view>

#include "olmax/xla/stablehlo/function_builder.hpp"
#include "olmax/xla/stablehlo/ir.hpp"
#include "olmax/xla/stablehlo/module.hpp"
#include "olmax/xla/stablehlo/scan.hpp"
#include "olmax/core/error.hpp"

namespace olmax::xla::stablehlo {

namespace detail {

/// hard_sigmoid(a) = clip((a + 3) / 6, 0, 1).
inline value hard_sigmoid(function_builder& b, const value& a) {
    return b.clamp(0.0, b.with_constant("divide", b.with_constant("add", a, 3.0), 6.0), 1.0);
}

struct qrnn_forward_values {
    value z, gate_pre, forget, inputs, h;  // gate_pre/forget/inputs/h in [H, T] rows layout
};

/// z = u W; x, a = z[:, :H], z[:, H:]; f = hard_sigmoid(a); h_t = f_t h_{t-1} + x_t from h_{-1} = 0.
inline qrnn_forward_values qrnn_forward_values_of(function_builder& b, const scan_strategy& strategy, const value& u, const value& w) {
    const std::int64_t steps = u.type.dims[0], hidden = w.type.dims[1] / 2;
    const value z = b.dot_general(u, w, {}, {}, {1}, {0});  // [T, 2H]
    const value inputs = b.transpose(b.slice(z, {0, 0}, {steps, hidden}), {1, 0});
    const value gate_pre = b.transpose(b.slice(z, {0, hidden}, {steps, 2 * hidden}), {1, 0});
    const value forget = hard_sigmoid(b, gate_pre);
    return {z, gate_pre, forget, inputs, emit_scan(b, strategy, forget, inputs)};
}

inline void check_qrnn_sizes(std::string_view op, std::int64_t steps, std::int64_t features, std::int64_t hidden) {
    check<value_error>(steps >= 1 && features >= 1 && hidden >= 1, op, ": sizes must be at least 1, got T=", steps, " F=", features,
                       " H=", hidden);
}

}  // namespace detail

/// QRNN block forward: (u [T,F], W [F,2H]) -> h [T,H] with the hard-sigmoid forget gate
/// (h_t = f_t h_{t-1} + x_t, f = clip((a+3)/6, 0, 1), as nn::QRNN).
inline emitted_module qrnn_block_forward(const scan_strategy& strategy, std::int64_t steps, std::int64_t features, std::int64_t hidden) {
    detail::check_qrnn_sizes("qrnn_block_forward", steps, features, hidden);
    const tensor_type tu = f32({steps, features}), tw = f32({features, 2 * hidden});
    function_builder b({tu, tw});
    const auto v = detail::qrnn_forward_values_of(b, strategy, b.arg(0), b.arg(1));
    const value h = b.transpose(v.h, {1, 0});
    const std::string key = "qrnn_block_forward." + strategy.name() + "." + std::to_string(steps) + "x" + std::to_string(features) + "x" +
                            std::to_string(hidden);
    return {key, b.finish("qrnn_block_forward", {h}), {tu, tw}, {h.type}};
}

/// QRNN block backward with linear memory (the forward is recomputed from u and W):
/// (u [T,F], W [F,2H], dh [T,H]) -> (du [T,F], dW [F,2H]). delta = reverse adjoint of dh,
/// dx = delta, df_t = delta_t h_{t-1} (h_{-1} = 0; the original used h_t, a bug), da = df/6 inside (-3, 3).
inline emitted_module qrnn_block_backward(const scan_strategy& strategy, std::int64_t steps, std::int64_t features, std::int64_t hidden) {
    detail::check_qrnn_sizes("qrnn_block_backward", steps, features, hidden);
    const tensor_type tu = f32({steps, features}), tw = f32({features, 2 * hidden}), th = f32({steps, hidden});
    function_builder b({tu, tw, th});
    const value u = b.arg(0), w = b.arg(1);
    const auto v = detail::qrnn_forward_values_of(b, strategy, u, w);
    const value delta = emit_reverse_adjoint(b, strategy, v.forget, b.transpose(b.arg(2), {1, 0}));  // [H, T]
    const value previous = detail::shift_up(b, v.h, 1, 1, 0.0);
    const value dforget = b.mul(delta, previous);
    const value inside = b.binary("and", b.compare(v.gate_pre, b.constant(-3.0, v.gate_pre.type), compare_direction::GT),
                                  b.compare(v.gate_pre, b.constant(3.0, v.gate_pre.type), compare_direction::LT));
    const value dgate = b.select(inside, b.with_constant("divide", dforget, 6.0), b.constant(0.0, dforget.type));
    const value dz = b.transpose(b.concatenate({delta, dgate}, 0), {1, 0});  // [T, 2H]
    const value du = b.dot_general(dz, w, {}, {}, {1}, {1});               // dz W^T
    const value dw = b.dot_general(u, dz, {}, {}, {0}, {0});               // u^T dz
    const std::string key = "qrnn_block_backward." + strategy.name() + "." + std::to_string(steps) + "x" + std::to_string(features) + "x" +
                            std::to_string(hidden);
    return {key, b.finish("qrnn_block_backward", {du, dw}), {tu, tw, th}, {tu, tw}};
}

}  // namespace olmax::xla::stablehlo
