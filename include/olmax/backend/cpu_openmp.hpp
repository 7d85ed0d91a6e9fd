#pragma once
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <string_view>

#include "olmax/backend/concept.hpp"
#include "olmax/backend/cpu_serial.hpp"
#include "olmax/backend/detail/thread_pool.hpp"
#include "olmax/detail/third_party.hpp"

namespace olmax::backend {

/// The default backend: loops cut into contiguous chunks that run on the calling thread and the
/// workers of a small pool of its own (`detail::thread_pool`) once the work exceeds
/// `parallel_threshold()` (below it the hand-off costs more than it saves).
///
/// Why not OpenMP regions (this backend's name is historical; OpenMP remains its thread-count
/// control and its `simd` loops): on a machine whose cores are shared with other processes an
/// OpenMP region's end barrier waits a whole time slice for a descheduled worker that also holds
/// half of the work, and libgomp's idle workers spin between regions. Here the caller takes chunks
/// itself and never waits for a worker that has not started, so a busy machine costs at most the
/// serial speed (measured in benchmarks/RESULTS.md, "Threads under contention").
///
/// Thread count: `num_threads()` follows OpenMP's setting on the calling thread (OMP_NUM_THREADS,
/// omp_set_num_threads; train_lm's --threads), so existing controls keep working.
/// Determinism: chunk boundaries depend only on n and the thread count, never on which thread runs
/// a chunk or when, so results are bit-identical for a given thread count.
/// Nested calls (inside a chunk, or inside a user's OpenMP region) run serially: no
/// oversubscription; inside a chunk `num_threads()` still reports the loop's thread count.
/// GEMM: large products are cut into blocks of rows (or columns) of C, each computed by
/// single-threaded Eigen and run through the same pool (Eigen's own parallel GEMM makes its threads
/// busy-wait on each other's packed panels, which collapses under contention).
struct cpu_openmp {
    static constexpr std::string_view name = "cpu_openmp";

    /// Work units (roughly element operations) below which loops stay on one thread.
    static std::size_t parallel_threshold() { return threshold_ref().load(std::memory_order_relaxed); }
    static void set_parallel_threshold(std::size_t work) { threshold_ref().store(work, std::memory_order_relaxed); }

    /// Chunks per thread of a parallel loop: more than one, so that a thread slowed down by another
    /// process leaves its remaining chunks to the others; few, so that per-chunk costs stay small.
    static constexpr std::size_t chunks_per_thread = 4;

    static int num_threads() {
        if (const int in_loop = detail::this_thread_region().threads) return in_loop;
#if defined(_OPENMP)
        return omp_get_max_threads();
#else
        return 1;
#endif
    }

    /// The chunks a parallel loop over n items is cut into at the current thread count (1: serial).
    /// Depends on n and the thread count only.
    static std::size_t chunk_count(std::size_t n, std::size_t work_per_item) {
        const int threads = num_threads();
        if (threads < 2 || n < 2 || nested() || n * std::max<std::size_t>(work_per_item, 1) < parallel_threshold()) return 1;
        return std::min<std::size_t>(n, std::size_t(threads) * chunks_per_thread);
    }

    /// Calls body(begin, end) on contiguous chunks of [0, n) that together cover it exactly once.
    template <class F>
    static void parallel_for(std::size_t n, std::size_t work_per_item, F&& body) {
        if (n == 0) return;
        const std::size_t chunks = chunk_count(n, work_per_item);
        if (chunks == 1) {
            body(std::size_t{0}, n);
            return;
        }
        auto chunk = [&](std::size_t c) { body(detail::chunk_begin(n, chunks, c), detail::chunk_begin(n, chunks, c + 1)); };
        detail::thread_pool::shared().run(chunks, num_threads(), chunk);
    }

    /// Single-threaded Eigen on blocks of C run through the pool (see the struct's comment); below
    /// the threshold, or nested, one single-threaded Eigen call.
    template <class T>
    static void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a, std::size_t lda,
                     const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc) {
        const int threads = num_threads();
        // Blocks of at least min_block rows/columns keep Eigen's kernel efficient and its packing of
        // the other operand (repeated per block) small against the block's arithmetic.
        constexpr std::size_t min_block = 64;
        const bool by_rows = m >= n;
        const std::size_t extent = by_rows ? m : n;
        const std::size_t blocks = std::min(std::size_t(threads) * 2, extent / min_block);
        if (threads < 2 || nested() || blocks < 2 || m * n * k < parallel_threshold()) {
            cpu_serial::gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
            return;
        }
        auto block = [&](std::size_t i) {
            const std::size_t lo = detail::chunk_begin(extent, blocks, i), hi = detail::chunk_begin(extent, blocks, i + 1);
            if (by_rows)  // rows lo..hi of C: rows of op(A) (columns of A when transposed)
                cpu_serial::gemm(trans_a, trans_b, hi - lo, n, k, alpha, trans_a ? a + lo : a + lo * lda, lda, b, ldb, beta, c + lo * ldc, ldc);
            else  // columns lo..hi of C: columns of op(B) (rows of B when transposed)
                cpu_serial::gemm(trans_a, trans_b, m, hi - lo, k, alpha, a, lda, trans_b ? b + lo * ldb : b + lo, ldb, beta, c + lo, ldc);
        };
        detail::thread_pool::shared().run(blocks, threads, block);
    }

    template <class T, class F, class... In>
    static void map(std::size_t n, T* out, F f, const In*... in) {
        parallel_for(n, 1, [&](std::size_t b, std::size_t e) { cpu_serial::map(e - b, out + b, f, (in + b)...); });
    }

    /// Sum in double. Above the threshold each chunk sums its contiguous piece and the partial sums
    /// are added in chunk order, so the result is the same on every run with the same thread count.
    template <class T>
    static double sum(const T* x, std::size_t n) {
        const std::size_t chunks = std::min(chunk_count(n, 1), max_pieces);
        if (chunks == 1) return cpu_serial::sum(x, n);
        double partial[max_pieces];
        auto chunk = [&](std::size_t c) {
            const std::size_t begin = detail::chunk_begin(n, chunks, c);
            partial[c] = cpu_serial::sum(x + begin, detail::chunk_begin(n, chunks, c + 1) - begin);
        };
        detail::thread_pool::shared().run(chunks, num_threads(), chunk);
        double total = 0;
        for (std::size_t c = 0; c < chunks; ++c) total += partial[c];
        return total;
    }

private:
    static constexpr std::size_t max_pieces = 1024;  // partial sums kept on the stack
    /// Inside one of our chunks, or inside a user's OpenMP region.
    static bool nested() {
        if (detail::this_thread_region().threads) return true;
#if defined(_OPENMP)
        return omp_in_parallel();
#else
        return false;
#endif
    }
    static std::atomic<std::size_t>& threshold_ref() {
        static std::atomic<std::size_t> value{1u << 15};
        return value;
    }
};

static_assert(Backend<cpu_openmp>);

}  // namespace olmax::backend
