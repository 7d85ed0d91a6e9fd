#pragma once
// An op's GEMM operands, rounded once. Under the bf16 precision policy (Kernels::float_gemms_in_bf16,
// Bf16MatmulKernels) every float GEMM rounds both of its operands to bfloat16. A causal convolution
// passes its input to one GEMM per tap in the forward pass and again per tap and batch element in
// the weight gradient, and a matmul's backward passes the output gradient to two GEMMs: rounding
// per call made the rounding 14% of a 64-wide bf16 training step (perf, RESULTS.md). An op instead
// prepares each tensor once (`GemmOperand`) and calls `gemm` / `gemm_batched` below with offsets into
// it: the same numbers (rounding is a function of the value), one pass per tensor.

#include <cstddef>
#include <type_traits>
#include <vector>

#include "olmax/backend/dispatch.hpp"
#include "olmax/core/bfloat16.hpp"
#include "olmax/core/tensor.hpp"

namespace olmax::backend {

/// Where a GEMM operand's elements start: in a buffer of T (`full`) or of its values rounded to
/// bfloat16 (`rounded`); exactly one is set.
template <Real T>
struct GemmSource {
    const T* full = nullptr;
    const bfloat16* rounded = nullptr;

    GemmSource operator+(std::size_t offset) const { return full ? GemmSource{full + offset, nullptr} : GemmSource{nullptr, rounded + offset}; }
};

/// A tensor as the current device's GEMMs take it: a float tensor on a device whose float GEMMs
/// round their operands (the bf16 policy) is rounded to bfloat16 here, once, into a tensor of its
/// own; otherwise the operand is the tensor itself (shared, not copied). Make it where the GEMMs
/// run (forward or backward closure), so that it follows the policy in force there.
template <Real T>
class GemmOperand {
public:
    explicit GemmOperand(const Tensor<T>& t) {
        if constexpr (std::is_same_v<T, float>) {
            if (current().float_gemms_in_bf16()) {
                rounded_ = Tensor<bfloat16>::uninitialized(t.shape());
                const float* src = t.data();
                bfloat16* dst = rounded_.data();
                current().parallel_for(t.size(), 1, [&](std::size_t lo, std::size_t hi) { to_bfloat16(src + lo, dst + lo, hi - lo); });
                return;
            }
        }
        full_ = t;
    }

    bool is_rounded() const { return rounded_.defined(); }
    GemmSource<T> source() const { return is_rounded() ? GemmSource<T>{nullptr, rounded_.data()} : GemmSource<T>{full_.data(), nullptr}; }

    /// What a backward closure keeps of `t`, the tensor this operand was made from: the bfloat16
    /// copy when `t` was rounded and is an activation (the closure then holds half the bytes, and
    /// the fp32 activation is freed once nothing else reads it, core/tensor.hpp; the backward GEMMs
    /// would round it to the same values), else `t` itself (a parameter or an input lives anyway,
    /// and rounding it again costs less than a second copy).
    GemmOperand kept_for_backward(const Tensor<T>& t) const { return is_rounded() && !t.is_leaf() ? *this : GemmOperand(t, as_is{}); }
    /// Ready for GEMMs now: a rounded copy as it is; a kept tensor prepared under the policy in force.
    GemmOperand ready() const { return is_rounded() ? *this : GemmOperand(full_); }

private:
    struct as_is {};
    GemmOperand(const Tensor<T>& t, as_is) : full_(t) {}

    Tensor<T> full_;
    Tensor<bfloat16> rounded_;
};

namespace detail {

/// A rows x cols block of either source as T (the rounded one widened, exactly, into this thread's
/// buffer `slot`: 0 for A, 1 for B); `ld` becomes cols when it was widened.
template <Real T>
const T* as_full(GemmSource<T> src, std::size_t rows, std::size_t cols, std::size_t& ld, int slot) {
    if (src.full) return src.full;
    if constexpr (std::is_same_v<T, float>) {
        thread_local std::vector<float> buffers[2];
        const float* wide = widen_into(current(), src.rounded, rows, cols, ld, buffers[slot]);
        ld = cols;
        return wide;
    } else {
        return nullptr;  // a double operand is never rounded
    }
}

}  // namespace detail

/// C = alpha op(A) op(B) + beta C on the current device (row-major, as Kernels::gemm). Both
/// operands rounded: its bf16 product (`Kernels::gemm_bf16`); both full: its T GEMM (which rounds
/// them itself under the policy). One of each (an operand rounded while the policy was on, used
/// after it ended): the rounded one widened, exactly, and the T GEMM.
template <Real T>
void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha, GemmSource<T> a, std::size_t lda,
          GemmSource<T> b, std::size_t ldb, T beta, T* c, std::size_t ldc) {
    if constexpr (std::is_same_v<T, float>) {
        if (a.rounded && b.rounded) return current().gemm_bf16(trans_a, trans_b, m, n, k, alpha, a.rounded, lda, b.rounded, ldb, beta, c, ldc);
    }
    const T* full_a = detail::as_full(a, trans_a ? k : m, trans_a ? m : k, lda, 0);
    const T* full_b = detail::as_full(b, trans_b ? n : k, trans_b ? k : n, ldb, 1);
    current().gemm(trans_a, trans_b, m, n, k, alpha, full_a, lda, full_b, ldb, beta, c, ldc);
}

/// `count` GEMMs laid out as Kernels::gemm_batched (stride_b = 0 shares one B), on the sources as
/// `gemm` above.
template <Real T>
void gemm_batched(std::size_t count, bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha, GemmSource<T> a,
                  std::size_t lda, std::size_t stride_a, GemmSource<T> b, std::size_t ldb, std::size_t stride_b, T beta, T* c,
                  std::size_t ldc, std::size_t stride_c) {
    if constexpr (std::is_same_v<T, float>) {
        if (a.rounded && b.rounded)
            return current().gemm_batched_bf16(count, trans_a, trans_b, m, n, k, alpha, a.rounded, lda, stride_a, b.rounded, ldb, stride_b, beta,
                                               c, ldc, stride_c);
    }
    if (a.full && b.full)
        return current().gemm_batched(count, trans_a, trans_b, m, n, k, alpha, a.full, lda, stride_a, b.full, ldb, stride_b, beta, c, ldc,
                                      stride_c);
    for (std::size_t i = 0; i < count; ++i)
        gemm(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta, c + i * stride_c, ldc);
}

}  // namespace olmax::backend
