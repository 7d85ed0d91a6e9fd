#pragma once
// Mixed-precision GEMM: C (fp32) = alpha op(A) op(B) + beta C with A and B in bfloat16, on the
// current device's bf16 product (`Kernels::gemm_bf16`). Its portable default widens both operands
// to float (exact) and multiplies them with the device's fp32 GEMM (Eigen on the CPU), so every
// build has a correct bf16 product; it is not faster than fp32 (it computes in fp32) and says so
// once. Inside a `bf16_matmul_scope` given a bf16 product (bf16_matmul_kernels.hpp) the same call
// runs on it; with the optional oneDNN target, olmax/backend/onednn_gemm.hpp is such a product, on
// the CPU's bf16 units when it has them (falling back to fp32 compute, saying so once, when not).
//
// Accumulation is in fp32 either way: |C - exact product of the bf16 inputs| is bounded by about
// k 2^-24 sum_i |a_i||b_i| per element, whatever path runs.

#include <cstddef>
#include <functional>
#include <mutex>
#include <string_view>

#include "olmax/backend/detail/bf16_notice.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/core/bfloat16.hpp"
#include "olmax/core/error.hpp"
#include "olmax/core/tensor.hpp"

namespace olmax::backend {

namespace detail {

/// Throws `value_error` naming `who` when a leading dimension is shorter than its rows.
inline void check_gemm_layout(std::string_view who, bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k,
                              std::size_t lda, std::size_t ldb, std::size_t ldc) {
    const std::size_t a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
    check(lda >= a_cols && ldb >= b_cols && ldc >= n, who, ": leading dimensions lda=", lda, ", ldb=", ldb, ", ldc=", ldc,
          " are shorter than the rows (", a_cols, ", ", b_cols, ", ", n, ") of a ", m, "x", k, " by ", k, "x", n, " product",
          trans_a ? " (a transposed)" : "", trans_b ? " (b transposed)" : "");
}

}  // namespace detail

/// Where bf16 notices ("bf16 GEMMs compute in fp32 ...") go instead of stderr; an empty function
/// restores stderr. Each notice is shown once per process.
inline void set_bf16_notice_sink(std::function<void(std::string_view)> sink) {
    auto& state = detail::bf16_notices();
    std::lock_guard<std::mutex> lock(state.mutex);
    state.sink = std::move(sink);
}
/// Forgets which notices were shown (tests).
inline void reset_bf16_notices() {
    auto& state = detail::bf16_notices();
    std::lock_guard<std::mutex> lock(state.mutex);
    state.shown.clear();
}

/// Row-major C = alpha op(A) op(B) + beta C (as `Kernels::gemm`), A and B bfloat16, C float, on the
/// current device's bf16 product (`Kernels::gemm_bf16`): fp32 compute on its GEMM by default, the
/// policy's product (e.g. oneDNN on the CPU's bf16 units) inside a `bf16_matmul_scope` given one.
inline void gemm_bf16(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const bfloat16* a,
                      std::size_t lda, const bfloat16* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
    detail::check_gemm_layout("gemm_bf16", trans_a, trans_b, m, n, k, lda, ldb, ldc);
    current().gemm_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/// The sizes of op(a) [m, k] x op(b) [k, n] for two matrices; `shape_error` naming `who` and both
/// shapes otherwise.
struct Bf16MatmulPlan {
    std::size_t m = 0, n = 0, k = 0;
    std::size_t lda = 0, ldb = 0;  // the stored row lengths of a and b
};
inline Bf16MatmulPlan plan_matmul_bf16(std::string_view who, const Shape& a, const Shape& b, bool trans_a, bool trans_b) {
    auto op = [](bool t) { return t ? "^T" : ""; };
    check<shape_error>(a.size() == 2 && b.size() == 2, who, ": needs two matrices, got a of shape ", to_string(a), " and b of shape ",
                       to_string(b));
    Bf16MatmulPlan p;
    p.m = trans_a ? a[1] : a[0];
    p.k = trans_a ? a[0] : a[1];
    p.n = trans_b ? b[0] : b[1];
    const std::size_t kb = trans_b ? b[1] : b[0];
    check<shape_error>(p.k == kb, who, ": a", op(trans_a), " x b", op(trans_b), " with a of shape ", to_string(a), " and b of shape ",
                       to_string(b), " do not multiply (inner sizes ", p.k, " and ", kb, ")");
    p.lda = a[1];
    p.ldb = b[1];
    return p;
}

namespace detail {

/// The tensor form of a bf16 GEMM entry point with gemm_bf16's signature (this header's or
/// oneDNN's): op(a) x op(b) as a new float tensor [m, n] on their device; errors name `who`.
template <class Gemm>
Tensor<float> matmul_bf16_through(std::string_view who, const Tensor<bfloat16>& a, const Tensor<bfloat16>& b, bool trans_a,
                                  bool trans_b, Gemm&& gemm) {
    op_scope on(who, a, b);
    const auto p = plan_matmul_bf16(who, a.shape(), b.shape(), trans_a, trans_b);
    auto c = Tensor<float>::uninitialized({p.m, p.n});
    gemm(trans_a, trans_b, p.m, p.n, p.k, 1.0f, a.data(), p.lda, b.data(), p.ldb, 0.0f, c.data(), p.n);
    return c;
}

}  // namespace detail

/// op(a) x op(b) for bfloat16 matrices, as a new float tensor [m, n] on their device (not
/// differentiable: a building block of the mixed-precision ops). The portable path; see
/// olmax::backend::onednn::matmul_bf16 for the accelerated one.
inline Tensor<float> matmul_bf16(const Tensor<bfloat16>& a, const Tensor<bfloat16>& b, bool trans_a = false, bool trans_b = false) {
    return detail::matmul_bf16_through("matmul_bf16", a, b, trans_a, trans_b, [](auto... args) { gemm_bf16(args...); });
}

}  // namespace olmax::backend
