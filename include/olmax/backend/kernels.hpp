#pragma once
// `Kernels`: the run-time face of a backend, the primitives every op is built from.
//
// Each device has one `Kernels` object (registry.hpp): ops ask for the kernels of the device their
// inputs live on and call these primitives, so a composite (a norm inside a block inside a stack,
// the optimiser, gradient accumulation) can never run on another device than its tensors by
// forgetting a template argument. The CPU backends stay static types (`cpu_serial`,
// `cpu_openmp`, checked by the `Backend` concept in concept.hpp); `kernels<B>()` wraps one in
// this interface. The virtual call is paid once per primitive (one per parallel loop, GEMM or
// reduction), never per element: loop bodies are compiled where the op is written and reach the
// backend as a `range_body` that the backend calls once per chunk.

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "olmax/backend/concept.hpp"
#include "olmax/backend/detail/bf16_notice.hpp"
#include "olmax/core/bfloat16.hpp"
#include "olmax/core/device.hpp"

namespace olmax::backend {

/// A non-owning reference to a callable `void(std::size_t begin, std::size_t end)`; valid while
/// the referenced callable lives (parallel loops call it before they return).
class range_body {
public:
    template <class F>
        requires(!std::is_same_v<std::remove_cvref_t<F>, range_body> && std::is_invocable_v<F&, std::size_t, std::size_t>)
    range_body(F&& f)  // NOLINT(google-explicit-constructor): a loop body converts implicitly
        : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
          call_([](void* object, std::size_t begin, std::size_t end) { (*static_cast<std::remove_reference_t<F>*>(object))(begin, end); }) {}
    void operator()(std::size_t begin, std::size_t end) const { call_(object_, begin, end); }

private:
    void* object_;
    void (*call_)(void*, std::size_t, std::size_t);
};

/// The primitives a device computes with. Semantics are those of the static backends
/// (concept.hpp): `parallel_for` calls `body` on contiguous chunks that cover [0, n) exactly once;
/// `gemm` is row-major C = alpha op(A) op(B) + beta C; `sum` accumulates in double.
class Kernels {
public:
    virtual ~Kernels() = default;
    virtual std::string_view name() const = 0;
    virtual int num_threads() const = 0;
    virtual void parallel_for(std::size_t n, std::size_t work_per_item, range_body body) const = 0;
    virtual void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda,
                      const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) const = 0;
    virtual void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, double alpha, const double* a,
                      std::size_t lda, const double* b, std::size_t ldb, double beta, double* c, std::size_t ldc) const = 0;
    virtual double sum(const float* x, std::size_t n) const = 0;
    virtual double sum(const double* x, std::size_t n) const = 0;

    /// `count` independent GEMMs C_i = alpha op(A_i) op(B_i) + beta C_i with A_i = a + i stride_a
    /// (likewise B_i and C_i, element strides); stride_b = 0 shares one B, e.g. a weight applied to
    /// every batch element. The default runs the items on the threads (each GEMM serial) when there
    /// are at least two and as many as threads, else one after another with threaded GEMMs. A
    /// backend overrides it where it can do better with the shared operand (Bf16MatmulKernels
    /// rounds a shared B to bfloat16 once instead of once per item).
    virtual void gemm_batched(std::size_t count, bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                              const float* a, std::size_t lda, std::size_t stride_a, const float* b, std::size_t ldb, std::size_t stride_b,
                              float beta, float* c, std::size_t ldc, std::size_t stride_c) const {
        batched_items(count, m * n * k, [&](std::size_t i) {
            gemm(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta, c + i * stride_c, ldc);
        });
    }
    virtual void gemm_batched(std::size_t count, bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, double alpha,
                              const double* a, std::size_t lda, std::size_t stride_a, const double* b, std::size_t ldb,
                              std::size_t stride_b, double beta, double* c, std::size_t ldc, std::size_t stride_c) const {
        batched_items(count, m * n * k, [&](std::size_t i) {
            gemm(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta, c + i * stride_c, ldc);
        });
    }

    /// bf16 x bf16 -> fp32: row-major C = alpha op(A) op(B) + beta C with A and B bfloat16 and C
    /// float. The default widens both operands to float (exact) and runs this device's fp32 `gemm`:
    /// the numbers of bf16 matrix units (every product of two bfloat16 is exact in fp32) at fp32
    /// speed, said once on stderr. A device with bf16 units overrides it; inside a
    /// `bf16_matmul_scope` it is the scope's product (Bf16MatmulKernels: e.g. oneDNN's on AMX or
    /// AVX512-BF16). Callers check the layout (backend::gemm_bf16 does).
    virtual void gemm_bf16(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const bfloat16* a,
                           std::size_t lda, const bfloat16* b, std::size_t ldb, float beta, float* c, std::size_t ldc) const;
    /// `count` bf16 products laid out as in `gemm_batched` (stride_b = 0 shares one B), run as it
    /// runs its items.
    virtual void gemm_batched_bf16(std::size_t count, bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                                   const bfloat16* a, std::size_t lda, std::size_t stride_a, const bfloat16* b, std::size_t ldb,
                                   std::size_t stride_b, float beta, float* c, std::size_t ldc, std::size_t stride_c) const {
        batched_items(count, m * n * k, [&](std::size_t i) {
            gemm_bf16(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta, c + i * stride_c, ldc);
        });
    }

    /// Whether this device's float GEMMs round both operands to bfloat16 first (true under the bf16
    /// precision policy, Bf16MatmulKernels). An op that passes one tensor to several GEMMs (a
    /// convolution: every tap, forward and backward) may then round it once itself and call
    /// `gemm_bf16`, which gives the same numbers with one rounding pass instead of one per GEMM
    /// (backend/gemm_operand.hpp).
    virtual bool float_gemms_in_bf16() const { return false; }

protected:
    /// Calls item(i) for i in [0, count): spread over the threads when there are at least two items
    /// and as many as threads (the work inside each then runs serially), else in order on this
    /// thread (the work inside may use the threads).
    template <class Item>
    void batched_items(std::size_t count, std::size_t work_per_item, Item&& item) const {
        if (count < 2 || count < std::size_t(num_threads())) {
            for (std::size_t i = 0; i < count; ++i) item(i);
            return;
        }
        parallel_for(count, work_per_item, [&](std::size_t begin, std::size_t end) {
            for (std::size_t i = begin; i < end; ++i) item(i);
        });
    }
};

namespace detail {

/// The calling thread's compute context: its current device (core) and the host kernels chosen
/// for it (registry.hpp). Parallel loops hand it to the threads that run their chunks, so that a
/// primitive called inside a chunk runs on the same kernels as the loop.
struct compute_context {
    std::uint32_t device_index;
    const Kernels* host_kernels;
};

/// This thread's host-kernel override (null: the process default).
inline const Kernels*& host_kernels_override() {
    thread_local const Kernels* kernels = nullptr;
    return kernels;
}

inline compute_context this_thread_context() { return {olmax::detail::current_device_index(), host_kernels_override()}; }

/// RAII: installs a context on this thread for one chunk.
class context_scope {
public:
    explicit context_scope(const compute_context& context) : previous_(this_thread_context()) { install(context); }
    ~context_scope() { install(previous_); }
    context_scope(const context_scope&) = delete;
    context_scope& operator=(const context_scope&) = delete;

private:
    static void install(const compute_context& context) {
        olmax::detail::current_device_index() = context.device_index;
        host_kernels_override() = context.host_kernels;
    }
    compute_context previous_;
};

}  // namespace detail

/// A static backend `B` (a type modelling the `Backend` concept) as run-time `Kernels`.
template <class B>
class static_kernels final : public Kernels {
    static_assert(Backend<B>, "olmax::backend::static_kernels: the type does not model olmax::backend::Backend (see concept.hpp)");

public:
    std::string_view name() const override { return B::name; }
    int num_threads() const override { return B::num_threads(); }
    void parallel_for(std::size_t n, std::size_t work_per_item, range_body body) const override {
        const detail::compute_context context = detail::this_thread_context();
        B::parallel_for(n, work_per_item, [&](std::size_t begin, std::size_t end) {
            detail::context_scope scope(context);
            body(begin, end);
        });
    }
    void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda,
              const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) const override {
        B::gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
    void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, double alpha, const double* a, std::size_t lda,
              const double* b, std::size_t ldb, double beta, double* c, std::size_t ldc) const override {
        B::gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
    double sum(const float* x, std::size_t n) const override { return B::sum(x, n); }
    double sum(const double* x, std::size_t n) const override { return B::sum(x, n); }
};

/// The one `Kernels` object of static backend `B` (lives for the whole process).
template <class B>
const Kernels& kernels() {
    static const static_kernels<B> instance;
    return instance;
}

namespace detail {

/// A rows x cols block of bfloat16 (leading dimension `ld`) widened, exactly, into `buffer` (dense
/// float, grown as needed) on the kernels `on`; returns its data. The callers' buffers are
/// thread_local: a scan calls a bf16 product once per chunk.
inline const float* widen_into(const Kernels& on, const bfloat16* src, std::size_t rows, std::size_t cols, std::size_t ld,
                               std::vector<float>& buffer) {
    if (buffer.size() < rows * cols) buffer.resize(rows * cols);
    float* dst = buffer.data();
    on.parallel_for(rows, cols, [&](std::size_t lo, std::size_t hi) {
        for (std::size_t r = lo; r < hi; ++r) to_float(src + r * ld, dst + r * cols, cols);
    });
    return dst;
}

}  // namespace detail

namespace detail {

/// op(A) op(B) of bfloat16 operands as the fp32 GEMM of `on` on their exact float values (dense
/// widened copies in this thread's buffers).
inline void gemm_widened(const Kernels& on, bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                         const bfloat16* a, std::size_t lda, const bfloat16* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
    const std::size_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k, b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
    thread_local std::vector<float> a32, b32;
    const float* wide_a = widen_into(on, a, a_rows, a_cols, lda, a32);
    const float* wide_b = widen_into(on, b, b_rows, b_cols, ldb, b32);
    on.gemm(trans_a, trans_b, m, n, k, alpha, wide_a, a_cols, wide_b, b_cols, beta, c, ldc);
}

}  // namespace detail

inline void Kernels::gemm_bf16(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const bfloat16* a,
                               std::size_t lda, const bfloat16* b, std::size_t ldb, float beta, float* c, std::size_t ldc) const {
    if (m == 0 || n == 0) return;
    detail::bf16_notice("portable", "olmax: bf16 GEMMs compute in fp32 (portable path: bfloat16 widened to float, Eigen GEMM); "
                                    "olmax/backend/onednn_gemm.hpp (CMake target olmax::onednn) uses the CPU's bf16 units");
    detail::gemm_widened(*this, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace olmax::backend
