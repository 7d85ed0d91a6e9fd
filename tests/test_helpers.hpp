#pragma once
// Shared helpers for olmax's tests.
#include <catch2/catch.hpp>

#include <olmax/olmax.hpp>

namespace olmax_test {

/// Largest |a - b| over two tensors of equal shape (REQUIREs the shapes match).
template <class T>
double max_abs_diff(const olmax::Tensor<T>& a, const olmax::Tensor<T>& b) {
    REQUIRE(a.shape() == b.shape());
    double m = 0;
    for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a.data()[i]) - double(b.data()[i])));
    return m;
}

/// A backend that implements only the required primitives and announces no optional op, so
/// every op must fall back to the CPU reference for it (the minimum surface of the trait).
struct stub_backend {
    static constexpr std::string_view name = "stub";
    static void* allocate(std::size_t bytes) { return olmax::backend::cpu_serial::allocate(bytes); }
    static void deallocate(void* p, std::size_t bytes) { olmax::backend::cpu_serial::deallocate(p, bytes); }
    static int num_threads() { return 1; }
    template <class F>
    static void parallel_for(std::size_t n, std::size_t w, F&& body) { olmax::backend::cpu_serial::parallel_for(n, w, body); }
    template <class T>
    static void gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a, std::size_t lda, const T* b,
                     std::size_t ldb, T beta, T* c, std::size_t ldc) {
        olmax::backend::cpu_serial::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
    template <class T, class F, class... In>
    static void map(std::size_t n, T* out, F f, const In*... in) { olmax::backend::cpu_serial::map(n, out, f, in...); }
    template <class T>
    static double sum(const T* x, std::size_t n) { return olmax::backend::cpu_serial::sum(x, n); }
};

}  // namespace olmax_test
