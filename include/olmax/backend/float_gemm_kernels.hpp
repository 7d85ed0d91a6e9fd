#pragma once
// The host kernels with another fp32 GEMM: e.g. oneDNN's (backend::onednn::gemm), which runs the
// byte LM's products 1.3-1.5x as fast as Eigen's on AVX-512 CPUs (benchmarks/RESULTS.md, "fp32 GEMMs
// through oneDNN"). Everything else, double GEMMs (the gradient checks' reference) included, stays
// with the wrapped kernels. `float_gemm_scope` installs it for the calling thread and the parallel
// loops it starts, as `bf16_matmul_scope` does for the bf16 policy.

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include "olmax/backend/detail/forwarding_kernels.hpp"
#include "olmax/core/error.hpp"

namespace olmax::backend {

class FloatGemmKernels final : public detail::ForwardingKernels {
public:
    /// Row-major C = alpha op(A) op(B) + beta C in fp32, with Kernels::gemm's float signature.
    using FloatGemm = std::function<void(bool, bool, std::size_t, std::size_t, std::size_t, float, const float*, std::size_t, const float*,
                                         std::size_t, float, float*, std::size_t)>;

    /// Wraps `base` (which must outlive this); `label` names the product in name(), e.g. "onednn".
    FloatGemmKernels(const Kernels& base, FloatGemm gemm, std::string_view label)
        : ForwardingKernels(base, std::string(base.name()) + "+" + std::string(label) + "_gemm"), gemm_(std::move(gemm)) {
        check<value_error>(static_cast<bool>(gemm_), "backend::FloatGemmKernels: no GEMM given");
    }

    using ForwardingKernels::gemm;
    void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda,
              const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) const override {
        gemm_(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }

private:
    FloatGemm gemm_;
};

/// The calling thread's host kernels with another fp32 GEMM while it lives: made from the product
/// and its label (FloatGemmKernels). Nests; not movable.
using float_gemm_scope = detail::wrapping_scope<FloatGemmKernels>;

}  // namespace olmax::backend
