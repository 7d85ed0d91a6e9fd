#pragma once
// The small GEMM an op's per-chunk or per-tile products run on, chosen by the precision policy in
// force: backend::small_gemm, or, where the policy rounds the operands of every float GEMM to
// bfloat16 (Kernels::float_gemms_in_bf16: inside a bf16_matmul_scope), backend::small_gemm_bf16,
// which rounds them the same way (on VDPBF16PS where that beats the fp32 kernel). Double
// products are left exact, as the policy leaves double GEMMs.
//
// Taken once per op call on the calling thread (the policy is the calling thread's backend), then
// handed to the op's parallel tasks.

#include <cstddef>
#include <type_traits>

#include "olmax/backend/dispatch.hpp"
#include "olmax/backend/small_gemm.hpp"
#include "olmax/backend/small_gemm_bf16.hpp"

namespace olmax::backend {

template <class T>
struct SmallProducts {
    bool bf16 = false;  // float operands rounded to bfloat16

    /// The products of the policy in force on this thread.
    static SmallProducts in_force() {
        if constexpr (std::is_same_v<T, float>) return {current().float_gemms_in_bf16()};
        else return {};
    }

    /// C = alpha op(A) op(B) + beta C, as small_gemm.
    void operator()(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a, std::size_t lda, const T* b,
                    std::size_t ldb, T beta, T* c, std::size_t ldc, SmallGemmBand band = {}) const {
        if constexpr (std::is_same_v<T, float>)
            if (bf16) return small_gemm_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, band);
        small_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, band);
    }
};

}  // namespace olmax::backend
