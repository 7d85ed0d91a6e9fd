#pragma once
// Shared helpers for olmax's tests.
#include <catch2/catch.hpp>

#include <olmax/olmax.hpp>

#include <cmath>
#include <initializer_list>
#include <vector>

namespace olmax_test {

/// Runs `olmax::testing::check_gradients` and CHECKs it, printing the checker's report on failure.
template <class F>
void check_gradients(F&& f, const std::vector<olmax::Tensor<double>>& inputs, const olmax::testing::GradientCheckOptions& options = {}) {
    const auto result = olmax::testing::check_gradients(std::forward<F>(f), inputs, options);
    INFO(result);
    CHECK(result.ok);
    CHECK(result.checked > 0);
}

/// Normal samples moved at least `margin` away from every point in `kinks` (where the op's
/// derivative jumps): central differences straddling a kink compare against neither one-sided
/// derivative, so gradient tests sample smooth neighbourhoods only.
template <class T = double>
olmax::Tensor<T> randn_away_from(const olmax::Shape& shape, olmax::Generator& rng, std::initializer_list<double> kinks,
                                 double margin = 0.1, double scale = 1.0) {
    auto t = olmax::randn<T>(shape, rng, T{0}, T(scale));
    for (T& v : t)
        for (double kink : kinks)
            if (std::abs(double(v) - kink) < margin) v = T(kink + (double(v) >= kink ? margin : -margin));
    return t;
}

/// Uniform samples in [low, high), for ops defined on part of the real line (log, sqrt, division).
template <class T = double>
olmax::Tensor<T> uniform(const olmax::Shape& shape, olmax::Generator& rng, double low, double high) {
    return olmax::rand<T>(shape, rng, T(low), T(high));
}

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

/// Forces cpu_openmp to thread even tiny loops, with an odd thread count (uneven pieces), for the
/// guard's lifetime; restores both settings even if a check throws.
class ForceThreading {
public:
    ForceThreading() { olmax::backend::cpu_openmp::set_parallel_threshold(1); }
    ~ForceThreading() { olmax::backend::cpu_openmp::set_parallel_threshold(threshold_); }
    ForceThreading(const ForceThreading&) = delete;
    ForceThreading& operator=(const ForceThreading&) = delete;

private:
    std::size_t threshold_ = olmax::backend::cpu_openmp::parallel_threshold();
    olmax::backend::detail::omp_thread_cap threads_{3};  // saves and restores the thread count
};

}  // namespace olmax_test
