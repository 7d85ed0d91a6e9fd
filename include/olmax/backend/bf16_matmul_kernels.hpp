#pragma once
// The bf16 mixed-precision policy (issue 13, docs/BF16.md): host kernels whose float GEMM computes
// as the CPU's bf16 matrix units do (AMX's TDPBF16PS, AVX512-BF16's VDPBF16PS, a TPU's MXU): both
// operands rounded to bfloat16 (nearest even), every product exact in fp32, the sums in fp32.
// Everything else they forward to the kernels they wrap, so inside a `bf16_matmul_scope` the GEMMs
// of every forward and backward pass (linear layers, convolutions, the mixer, the output head) run
// in bf16, while norms, softmax, losses, scans, gradient accumulation and the optimiser (none of
// them a GEMM) stay in fp32, and parameters stay fp32 masters. That is PyTorch autocast's split on
// a CPU; like bf16 autocast it needs no loss scaling (bf16 has fp32's exponent range).
//
// The bf16 product itself is given as a function of `gemm_bf16`'s signature: the portable one by
// default (bfloat16 operands widened to float, the wrapped kernels' fp32 GEMM: the same numbers as
// the matrix units, at fp32 speed), or oneDNN's (backend::onednn::gemm_bf16, on the matrix units
// where the CPU has them).

#include <functional>
#include <type_traits>
#include <string>
#include <string_view>
#include <vector>

#include "olmax/backend/bf16_gemm.hpp"
#include "olmax/backend/detail/forwarding_kernels.hpp"
#include "olmax/backend/kernels.hpp"
#include "olmax/backend/registry.hpp"
#include "olmax/core/bfloat16.hpp"

namespace olmax::backend {

class Bf16MatmulKernels final : public detail::ForwardingKernels {
public:
    /// bf16 x bf16 -> fp32 GEMM with gemm_bf16's signature.
    using Bf16Gemm = std::function<void(bool, bool, std::size_t, std::size_t, std::size_t, float, const bfloat16*, std::size_t,
                                        const bfloat16*, std::size_t, float, float*, std::size_t)>;

    /// Several bf16 products in one call, with gemm_batched_bf16's signature; returns false, having
    /// computed nothing, for layouts it does not take (the items then go to `Bf16Gemm` one by one).
    using Bf16GemmBatched = std::function<bool(std::size_t, bool, bool, std::size_t, std::size_t, std::size_t, float, const bfloat16*,
                                               std::size_t, std::size_t, const bfloat16*, std::size_t, std::size_t, float, float*,
                                               std::size_t, std::size_t)>;

    /// Wraps `base` (which must outlive this); `bf16_gemm` empty: the portable product on `base`;
    /// `bf16_gemm_batched` empty: batches run item by item.
    explicit Bf16MatmulKernels(const Kernels& base, Bf16Gemm bf16_gemm = {}, Bf16GemmBatched bf16_gemm_batched = {})
        : ForwardingKernels(base, std::string(base.name()) + "+bf16_matmul"),
          bf16_gemm_(std::move(bf16_gemm)),
          bf16_gemm_batched_(std::move(bf16_gemm_batched)) {}

    using ForwardingKernels::gemm;  // double GEMMs are the reference path (gradient checks): left exact

    /// op(A) op(B) with A and B rounded to bfloat16 first (dense copies; the callers' buffers are
    /// not touched), accumulated in fp32.
    void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda,
              const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) const override {
        if (m == 0 || n == 0) return;
        if (k == 0) return base_.gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);  // beta C only
        on_operands([&]<class Out>(std::vector<Out>& a_buffer, std::vector<Out>& b_buffer) {
            product(trans_a, trans_b, m, n, k, alpha, rounded_a(trans_a, m, k, a, lda, a_buffer), rounded_b(trans_b, n, k, b, ldb, b_buffer), beta, c,
                    ldc);
        });
    }
    /// Items that share one B (stride_b = 0: a weight applied to every batch element) round it
    /// once for all of them; each item's A is rounded on the thread that runs the item.
    void gemm_batched(std::size_t count, bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                      std::size_t lda, std::size_t stride_a, const float* b, std::size_t ldb, std::size_t stride_b, float beta, float* c,
                      std::size_t ldc, std::size_t stride_c) const override {
        if (count < 2 || stride_b != 0 || m == 0 || n == 0 || k == 0)
            return Kernels::gemm_batched(count, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c);
        on_operands([&]<class Out>(std::vector<Out>&, std::vector<Out>& b_buffer) {
            const Out* shared_b = rounded_b(trans_b, n, k, b, ldb, b_buffer);
            batched_items(count, m * n * k, [&](std::size_t i) {
                thread_local std::vector<Out> item_a;  // this thread's; the caller's b_buffer stays untouched
                product(trans_a, trans_b, m, n, k, alpha, rounded_a(trans_a, m, k, a + i * stride_a, lda, item_a), shared_b, beta, c + i * stride_c,
                        ldc);
            });
        });
    }

    /// Operands already in bfloat16 (a scan's chunks in bf16 storage): straight to the bf16 product
    /// when one was given, else the wrapped kernels' (portable) one.
    void gemm_bf16(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const bfloat16* a, std::size_t lda,
                   const bfloat16* b, std::size_t ldb, float beta, float* c, std::size_t ldc) const override {
        if (m == 0 || n == 0) return;
        if (bf16_gemm_) return bf16_gemm_(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        portable_notice();
        detail::gemm_widened(base_, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
    /// A batch in one call of the batched product when it was given one and takes the layout, else
    /// item by item.
    void gemm_batched_bf16(std::size_t count, bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                           const bfloat16* a, std::size_t lda, std::size_t stride_a, const bfloat16* b, std::size_t ldb, std::size_t stride_b,
                           float beta, float* c, std::size_t ldc, std::size_t stride_c) const override {
        if (bf16_gemm_ && bf16_gemm_batched_ &&
            bf16_gemm_batched_(count, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c))
            return;
        Kernels::gemm_batched_bf16(count, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c);
    }
    /// Its float GEMMs round their operands (ops may round them once for several GEMMs instead,
    /// backend/gemm_operand.hpp).
    bool float_gemms_in_bf16() const override { return true; }

private:
    /// Calls f(a_buffer, b_buffer) with this thread's operand buffers of the type the product takes:
    /// bfloat16 for the given bf16 product, float (holding bfloat16 values) for the portable one,
    /// which says once that it is not accelerated.
    template <class F>
    void on_operands(F&& f) const {
        if (bf16_gemm_) {
            thread_local std::vector<bfloat16> a16, b16;
            f.template operator()<bfloat16>(a16, b16);
        } else {
            portable_notice();
            thread_local std::vector<float> a32, b32;
            f.template operator()<float>(a32, b32);
        }
    }
    static void portable_notice() {
        detail::bf16_notice("policy", "olmax: bf16 precision policy on the portable path: GEMM operands are rounded to bfloat16 and "
                                      "multiplied by the fp32 GEMM (the numbers of bf16 matrix units, at fp32 speed; pass "
                                      "backend::onednn::gemm_bf16 to use the CPU's bf16 units where it has them)");
    }
    /// The product of dense rounded operands (leading dimensions = their column counts).
    template <class Out>
    void product(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const Out* a, const Out* b, float beta,
                 float* c, std::size_t ldc) const {
        const std::size_t a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
        if constexpr (std::is_same_v<Out, bfloat16>) bf16_gemm_(trans_a, trans_b, m, n, k, alpha, a, a_cols, b, b_cols, beta, c, ldc);
        else base_.gemm(trans_a, trans_b, m, n, k, alpha, a, a_cols, b, b_cols, beta, c, ldc);
    }
    template <class Out>
    const Out* rounded_a(bool trans_a, std::size_t m, std::size_t k, const float* a, std::size_t lda, std::vector<Out>& buffer) const {
        return rounded(a, trans_a ? k : m, trans_a ? m : k, lda, buffer);
    }
    template <class Out>
    const Out* rounded_b(bool trans_b, std::size_t n, std::size_t k, const float* b, std::size_t ldb, std::vector<Out>& buffer) const {
        return rounded(b, trans_b ? n : k, trans_b ? k : n, ldb, buffer);
    }
    /// rows x cols of `src` (leading dimension ld) rounded to bfloat16, dense, into `buffer` (stored
    /// as Out: bfloat16, or float holding the bfloat16 value exactly); returns its data. The callers'
    /// buffers are thread_local and only grow: at small widths allocating and zeroing two fresh
    /// operands per GEMM cost about as much as the product (the default model's bf16 step on oneDNN
    /// went from 4.58 to 3.27 ms, docs/BF16.md). A thread keeps its largest operands until it ends.
    template <class Out>
    const Out* rounded(const float* src, std::size_t rows, std::size_t cols, std::size_t ld, std::vector<Out>& buffer) const {
        if (buffer.size() < rows * cols) buffer.resize(rows * cols);
        Out* dst = buffer.data();
        base_.parallel_for(rows, cols, [&](std::size_t lo, std::size_t hi) {
            for (std::size_t r = lo; r < hi; ++r) {
                if constexpr (std::is_same_v<Out, bfloat16>) to_bfloat16(src + r * ld, dst + r * cols, cols);
                else round_to_bfloat16(src + r * ld, dst + r * cols, cols);
            }
        });
        return dst;
    }

    Bf16Gemm bf16_gemm_;
    Bf16GemmBatched bf16_gemm_batched_;
};

/// The bf16 policy for the calling thread while it lives (and the parallel loops it starts): its host
/// kernels are the current ones with bf16 GEMMs (Bf16MatmulKernels, made from the arguments: the
/// bf16 product and its batched form, both optional). Nests; not movable.
using bf16_matmul_scope = detail::wrapping_scope<Bf16MatmulKernels>;

}  // namespace olmax::backend
