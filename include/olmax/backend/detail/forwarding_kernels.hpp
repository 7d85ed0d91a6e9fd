#pragma once
// Kernels that wrap other kernels: every call goes to the wrapped ones unless the wrapper overrides
// it (Bf16MatmulKernels: GEMMs in bf16; FloatGemmKernels: another fp32 GEMM). `gemm_batched` keeps
// Kernels' default, which runs the items through this object's `gemm`, so a wrapper's own product
// serves batches too. The wrapped kernels must outlive the wrapper. `wrapping_scope` installs one
// around the calling thread's current host kernels (bf16_matmul_scope, float_gemm_scope).

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "olmax/backend/kernels.hpp"
#include "olmax/backend/registry.hpp"

namespace olmax::backend::detail {

class ForwardingKernels : public Kernels {
public:
    ForwardingKernels(const Kernels& base, std::string name) : base_(base), name_(std::move(name)) {}

    std::string_view name() const override { return name_; }
    int num_threads() const override { return base_.num_threads(); }
    void parallel_for(std::size_t n, std::size_t work_per_item, range_body body) const override { base_.parallel_for(n, work_per_item, body); }
    double sum(const float* x, std::size_t n) const override { return base_.sum(x, n); }
    double sum(const double* x, std::size_t n) const override { return base_.sum(x, n); }
    void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda,
              const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) const override {
        base_.gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
    void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, double alpha, const double* a, std::size_t lda,
              const double* b, std::size_t ldb, double beta, double* c, std::size_t ldc) const override {
        base_.gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
    void gemm_bf16(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const bfloat16* a, std::size_t lda,
                   const bfloat16* b, std::size_t ldb, float beta, float* c, std::size_t ldc) const override {
        base_.gemm_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
    void gemm_batched_bf16(std::size_t count, bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                           const bfloat16* a, std::size_t lda, std::size_t stride_a, const bfloat16* b, std::size_t ldb, std::size_t stride_b,
                           float beta, float* c, std::size_t ldc, std::size_t stride_c) const override {
        base_.gemm_batched_bf16(count, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c);
    }
    bool float_gemms_in_bf16() const override { return base_.float_gemms_in_bf16(); }

protected:
    const Kernels& base_;

private:
    std::string name_;
};

/// The calling thread's host kernels (and the parallel loops it starts) wrapped in a `Wrapper`,
/// made from them and `arguments`, while this lives. Nests; not movable.
template <class Wrapper>
class wrapping_scope {
public:
    template <class... Arguments>
    explicit wrapping_scope(Arguments&&... arguments) : kernels_(host_kernels(), std::forward<Arguments>(arguments)...), scope_(kernels_) {}
    wrapping_scope(const wrapping_scope&) = delete;
    wrapping_scope& operator=(const wrapping_scope&) = delete;
    const Wrapper& kernels() const { return kernels_; }

private:
    Wrapper kernels_;
    host_kernels_scope scope_;
};

}  // namespace olmax::backend::detail
