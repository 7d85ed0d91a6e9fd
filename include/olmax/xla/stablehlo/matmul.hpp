#pragma once
// Matrix-product modules: C = op(A) op(B), the batched product, and the gradients of C = A B.

#include <cstdint>
#include <string>

#include "olmax/xla/stablehlo/function_builder.hpp"
#include "olmax/xla/stablehlo/ir.hpp"
#include "olmax/xla/stablehlo/module.hpp"
#include "olmax/core/error.hpp"

namespace olmax::xla::stablehlo {

/// C = op(A) op(B) with op = transpose when asked; A is [M,K] (or [K,M]), B is [K,N] (or [N,K]).
inline emitted_module matmul(std::int64_t m, std::int64_t k, std::int64_t n, bool transpose_a = false, bool transpose_b = false) {
    check<value_error>(m >= 1 && k >= 1 && n >= 1, "matmul: sizes must be at least 1, got m=", m, " k=", k, " n=", n);
    const tensor_type ta = transpose_a ? f32({k, m}) : f32({m, k});
    const tensor_type tb = transpose_b ? f32({n, k}) : f32({k, n});
    function_builder b({ta, tb});
    const value c = b.dot_general(b.arg(0), b.arg(1), {}, {}, {transpose_a ? 0 : 1}, {transpose_b ? 1 : 0});
    const std::string key = "matmul." + std::string(transpose_a ? "T" : "N") + (transpose_b ? "T" : "N") + "." + std::to_string(m) + "x" +
                            std::to_string(k) + "x" + std::to_string(n);
    return {key, b.finish("matmul", {c}), {ta, tb}, {c.type}};
}

/// C[i] = A[i] B[i] for A [batch,M,K], B [batch,K,N].
inline emitted_module batched_matmul(std::int64_t batch, std::int64_t m, std::int64_t k, std::int64_t n) {
    check<value_error>(batch >= 1 && m >= 1 && k >= 1 && n >= 1, "batched_matmul: sizes must be at least 1");
    const tensor_type ta = f32({batch, m, k}), tb = f32({batch, k, n});
    function_builder b({ta, tb});
    const value c = b.dot_general(b.arg(0), b.arg(1), {0}, {0}, {2}, {1});
    const std::string key = "batched_matmul." + std::to_string(batch) + "x" + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
    return {key, b.finish("batched_matmul", {c}), {ta, tb}, {c.type}};
}

/// Gradients of C = A B: (A [M,K], B [K,N], dC [M,N]) -> (dA = dC B^T, dB = A^T dC).
inline emitted_module matmul_backward(std::int64_t m, std::int64_t k, std::int64_t n) {
    check<value_error>(m >= 1 && k >= 1 && n >= 1, "matmul_backward: sizes must be at least 1");
    const tensor_type ta = f32({m, k}), tb = f32({k, n}), tc = f32({m, n});
    function_builder b({ta, tb, tc});
    const value da = b.dot_general(b.arg(2), b.arg(1), {}, {}, {1}, {1});
    const value db = b.dot_general(b.arg(0), b.arg(2), {}, {}, {0}, {0});
    const std::string key = "matmul_backward." + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
    return {key, b.finish("matmul_backward", {da, db}), {ta, tb, tc}, {ta, tb}};
}

}  // namespace olmax::xla::stablehlo
