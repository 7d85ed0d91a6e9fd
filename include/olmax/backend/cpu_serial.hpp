#pragma once
#include <cstddef>
#include <string_view>

#include "olmax/backend/concept.hpp"
#include "olmax/core/memory.hpp"
#include "olmax/detail/third_party.hpp"

namespace olmax::backend {

namespace detail {

/// Caps the OpenMP threads a library called on this thread may use (oneDNN's GEMM) for the guard's
/// lifetime (the ICV is per thread, so other threads are unaffected). olmax's own GEMM below never
/// asks OpenMP for threads.
class omp_thread_cap {
public:
    explicit omp_thread_cap(int threads) {
#if defined(_OPENMP)
        previous_ = omp_get_max_threads();
        omp_set_num_threads(threads);
#else
        (void)threads;
#endif
    }
    ~omp_thread_cap() {
#if defined(_OPENMP)
        omp_set_num_threads(previous_);
#endif
    }
    omp_thread_cap(const omp_thread_cap&) = delete;
    omp_thread_cap& operator=(const omp_thread_cap&) = delete;

private:
    int previous_ = 1;
};

/// C = beta * C on an m x n row-major block (beta 0 writes zeros: C may hold NaN).
template <class T>
void scale_rows(std::size_t m, std::size_t n, T beta, T* c, std::size_t ldc) {
    if (beta == T{1}) return;
    for (std::size_t i = 0; i < m; ++i) {
        T* row = c + i * ldc;
        if (beta == T{0}) {
            for (std::size_t j = 0; j < n; ++j) row[j] = T{0};
        } else {
#pragma omp simd
            for (std::size_t j = 0; j < n; ++j) row[j] *= beta;
        }
    }
}

/// C += alpha op(A) op(B) where C is one row (m = 1) or one column (n = 1): each output is a dot
/// product of contiguous rows, or one pass adds multiples of contiguous rows (axpy). Either way
/// the matrix operand is read once, in memory order.
template <class T>
void gemv_like(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a, std::size_t lda,
               const T* b, std::size_t ldb, T* c, std::size_t ldc) {
    // Written as y (len outputs, stride y_inc) += alpha * M v, with M's row i at m_data + i * m_row
    // and entry p at + p * m_col, and v's entry p at v_data + p * v_inc.
    const bool row = m == 1;
    const std::size_t len = row ? n : m, y_inc = row ? 1 : ldc;
    const T* m_data = row ? b : a;
    const std::size_t m_row = row ? (trans_b ? ldb : 1) : (trans_a ? 1 : lda);
    const std::size_t m_col = row ? (trans_b ? 1 : ldb) : (trans_a ? lda : 1);
    const T* v = row ? a : b;
    const std::size_t v_inc = row ? (trans_a ? lda : 1) : (trans_b ? 1 : ldb);
    if (m_col == 1 && v_inc == 1) {  // each output a dot product of a contiguous row of M with v
        // Four rows at a time: each load of v serves four products (Eigen's gemv does the same).
        std::size_t i = 0;
        for (; i + 4 <= len; i += 4) {
            const T *m0 = m_data + i * m_row, *m1 = m0 + m_row, *m2 = m1 + m_row, *m3 = m2 + m_row;
            T s0{0}, s1{0}, s2{0}, s3{0};
#pragma omp simd reduction(+ : s0, s1, s2, s3)
            for (std::size_t p = 0; p < k; ++p) {
                s0 += m0[p] * v[p];
                s1 += m1[p] * v[p];
                s2 += m2[p] * v[p];
                s3 += m3[p] * v[p];
            }
            c[i * y_inc] += alpha * s0;
            c[(i + 1) * y_inc] += alpha * s1;
            c[(i + 2) * y_inc] += alpha * s2;
            c[(i + 3) * y_inc] += alpha * s3;
        }
        for (; i < len; ++i) {
            const T* mi = m_data + i * m_row;
            T acc{0};
#pragma omp simd reduction(+ : acc)
            for (std::size_t p = 0; p < k; ++p) acc += mi[p] * v[p];
            c[i * y_inc] += alpha * acc;
        }
    } else if (m_row == 1 && y_inc == 1) {  // M's columns contiguous: y += (alpha v_p) column p
        // Four columns at a time: each load and store of y serves four of them.
        std::size_t p = 0;
        for (; p + 4 <= k; p += 4) {
            const T *q0 = m_data + p * m_col, *q1 = q0 + m_col, *q2 = q1 + m_col, *q3 = q2 + m_col;
            const T w0 = alpha * v[p * v_inc], w1 = alpha * v[(p + 1) * v_inc], w2 = alpha * v[(p + 2) * v_inc], w3 = alpha * v[(p + 3) * v_inc];
#pragma omp simd
            for (std::size_t i = 0; i < len; ++i) c[i] += w0 * q0[i] + w1 * q1[i] + w2 * q2[i] + w3 * q3[i];
        }
        for (; p < k; ++p) {
            const T* q = m_data + p * m_col;
            const T w = alpha * v[p * v_inc];
#pragma omp simd
            for (std::size_t i = 0; i < len; ++i) c[i] += w * q[i];
        }
    } else {  // strided v or y (a column of C, or a column of a matrix used as v)
        for (std::size_t i = 0; i < len; ++i) {
            T acc{0};
            for (std::size_t p = 0; p < k; ++p) acc += m_data[i * m_row + p * m_col] * v[p * v_inc];
            c[i * y_inc] += alpha * acc;
        }
    }
}

/// Row-major GEMM through Eigen, one thread: C = alpha * op(A) * op(B) + beta * C, with leading
/// dimensions. It calls Eigen's blocked GEMM routine (`internal::general_matrix_matrix_product`,
/// what `C.noalias() += A * B` runs for all but tiny or vector shapes; internal, but with the same
/// signature from Eigen 3.3.8 to 5) directly: the product expression would also compile Eigen's
/// matrix-vector and coefficient-wise product paths for each transpose combination, about 5 s of
/// -O2 compile time in every program (float and double). Tiny shapes run the blocked routine too
/// (0.7-1.6x the expression's time from 4x4x4 to 16x16x16, tens of nanoseconds either way); a
/// vector result goes to gemv_like, which streams the matrix once where the blocked routine would
/// first pack it.
template <class T>
void eigen_gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a, std::size_t lda,
                const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc) {
    static_assert(EIGEN_VERSION_AT_LEAST(3, 4, 0), "olmax needs Eigen 3.4 or newer");
    if (m == 0 || n == 0) return;
    scale_rows(m, n, beta, c, ldc);
    if (k == 0 || alpha == T{0}) return;
    if (m == 1 || n == 1) return gemv_like(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc);
    using Eigen::ColMajor, Eigen::RowMajor, Eigen::Dynamic;
    using I = Eigen::Index;
    // The blocking (cache-sized panels) exactly as Eigen's product evaluator sizes it.
    Eigen::internal::gemm_blocking_space<RowMajor, T, T, Dynamic, Dynamic, Dynamic, 1, false> blocking(I(m), I(n), I(k), 1, true);
    // A row-major operand read transposed is a column-major one with the same leading dimension.
    auto run = [&]<int a_order, int b_order>() {
        Eigen::internal::general_matrix_matrix_product<I, T, a_order, false, T, b_order, false, RowMajor, 1>::run(
            I(m), I(n), I(k), a, I(lda), b, I(ldb), c, 1, I(ldc), alpha, blocking, nullptr);
    };
    if (!trans_a && !trans_b) run.template operator()<RowMajor, RowMajor>();
    else if (trans_a && !trans_b) run.template operator()<ColMajor, RowMajor>();
    else if (!trans_a && trans_b) run.template operator()<RowMajor, ColMajor>();
    else run.template operator()<ColMajor, ColMajor>();
}

}  // namespace detail

/// The reference backend: every loop on the calling thread, GEMM through single-threaded Eigen.
/// Other backends are tested against it (the conformance suite).
struct cpu_serial {
    static constexpr std::string_view name = "cpu_serial";
    static int num_threads() { return 1; }

    template <class F>
    static void parallel_for(std::size_t n, std::size_t /*work_per_item*/, F&& body) {
        if (n) body(std::size_t{0}, n);
    }

    template <class T>
    static void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a, std::size_t lda,
                     const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc) {
        detail::eigen_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }

    /// out[i] = f(in[i]...). `f` and the pointers are local copies, so the compiler can see that a
    /// store to out[i] cannot change them (a functor reached through a reference, e.g. a lambda's
    /// captured slope, is reloaded after every store and the loop stays scalar: measured 1.8-3.8
    /// ns per element for leaky-ReLU vs ~0.1 vectorised).
    template <class T, class F, class... In>
    static void map(std::size_t n, T* out, F f, const In*... in) {
        const F local = f;
#pragma omp simd
        for (std::size_t i = 0; i < n; ++i) out[i] = local(in[i]...);
    }

    template <class T>
    static double sum(const T* x, std::size_t n) {
        double s = 0;
#pragma omp simd reduction(+ : s)
        for (std::size_t i = 0; i < n; ++i) s += double(x[i]);
        return s;
    }
};

static_assert(Backend<cpu_serial>);

}  // namespace olmax::backend
