#pragma once
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <string_view>

#include "olmax/backend/concept.hpp"
#include "olmax/backend/cpu_serial.hpp"
#include "olmax/detail/third_party.hpp"

namespace olmax::backend {

/// The default backend: OpenMP threads over contiguous, statically partitioned ranges once the
/// work exceeds `parallel_threshold()` (below it the thread start-up costs more than it saves).
/// Nested calls (already inside a parallel region) run serially, so olmax never oversubscribes;
/// Eigen's GEMM likewise runs single-threaded when called inside a parallel region.
struct cpu_openmp {
    static constexpr std::string_view name = "cpu_openmp";
    template <class Op>
    static constexpr bool supports = true;

    /// Work units (roughly element operations) below which loops stay on one thread.
    static std::size_t parallel_threshold() { return threshold_ref().load(std::memory_order_relaxed); }
    static void set_parallel_threshold(std::size_t work) { threshold_ref().store(work, std::memory_order_relaxed); }

    static void* allocate(std::size_t bytes) { return cpu_serial::allocate(bytes); }
    static void deallocate(void* p, std::size_t bytes) { cpu_serial::deallocate(p, bytes); }

    static int num_threads() {
#if defined(_OPENMP)
        return omp_get_max_threads();
#else
        return 1;
#endif
    }

    /// Calls body(begin, end) on contiguous pieces of [0, n), one per thread.
    template <class F>
    static void parallel_for(std::size_t n, std::size_t work_per_item, F&& body) {
        if (n == 0) return;
#if defined(_OPENMP)
        const int threads = num_threads();
        if (threads > 1 && n > 1 && !omp_in_parallel() && n * std::max<std::size_t>(work_per_item, 1) >= parallel_threshold()) {
            const std::size_t pieces = std::min<std::size_t>(n, static_cast<std::size_t>(threads));
#pragma omp parallel num_threads(static_cast<int>(pieces))
            {
                const std::size_t t = static_cast<std::size_t>(omp_get_thread_num());
                const std::size_t p = static_cast<std::size_t>(omp_get_num_threads());
                const std::size_t begin = n * t / p, end = n * (t + 1) / p;
                if (begin < end) body(begin, end);
            }
            return;
        }
#endif
        (void)work_per_item;
        body(std::size_t{0}, n);
    }

    /// Eigen's GEMM with its own OpenMP parallelisation (it detects nesting and goes serial).
    template <class T>
    static void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a, std::size_t lda,
                     const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc) {
        if (m * n * k < parallel_threshold()) {
            cpu_serial::gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
            return;
        }
        detail::eigen_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }

    template <class T, class F, class... In>
    static void map(std::size_t n, T* out, F f, const In*... in) {
        parallel_for(n, 1, [&](std::size_t b, std::size_t e) { cpu_serial::map(e - b, out + b, f, (in + b)...); });
    }

    /// Sum in double. Above the threshold each thread sums one contiguous piece and the partial
    /// sums are added in piece order, so the result is the same on every run with the same thread
    /// count (an OpenMP `reduction` clause combines partials in an unspecified order).
    template <class T>
    static double sum(const T* x, std::size_t n) {
#if defined(_OPENMP)
        const int threads = num_threads();
        if (threads > 1 && n > 1 && !omp_in_parallel() && n >= parallel_threshold()) {
            const std::size_t pieces = std::min<std::size_t>(n, static_cast<std::size_t>(threads));
            double partial[max_pieces] = {};
            const std::size_t used = std::min(pieces, max_pieces);
            std::size_t teams = used;
#pragma omp parallel num_threads(static_cast<int>(used))
            {
                const std::size_t t = static_cast<std::size_t>(omp_get_thread_num());
                const std::size_t p = static_cast<std::size_t>(omp_get_num_threads());
#pragma omp single
                teams = p;  // the runtime may grant fewer threads than asked
                const std::size_t begin = n * t / p, end = n * (t + 1) / p;
                partial[t] = cpu_serial::sum(x + begin, end - begin);
            }
            double total = 0;
            for (std::size_t t = 0; t < teams; ++t) total += partial[t];
            return total;
        }
#endif
        return cpu_serial::sum(x, n);
    }

private:
    static constexpr std::size_t max_pieces = 1024;  // partial sums kept on the stack
    static std::atomic<std::size_t>& threshold_ref() {
        static std::atomic<std::size_t> value{1u << 15};
        return value;
    }
};

static_assert(Backend<cpu_openmp>);

/// Default backend of every op.
using default_backend = cpu_openmp;

/// The backend that runs op `Op` for a computation requested on `B`: `B` when it supports the op,
/// else the CPU reference.
template <class B, class Op>
using kernel_backend_t = std::conditional_t<supports<B, Op>, B, cpu_serial>;

}  // namespace olmax::backend
