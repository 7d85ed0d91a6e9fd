#pragma once
// The static backend concept: what a CPU kernel family provides so that `kernels<B>()`
// (kernels.hpp) can serve a device with it.
//
// A static backend is a stateless type with static members (like Eigen's devices): parallel
// loops, GEMM and a reduction. Ops never name one; they reach the kernels of their inputs' device
// at run time (dispatch.hpp). Minimum surface (a stub backend needs exactly this):
//
//   static constexpr std::string_view name;
//   static int    num_threads();
//   static void   parallel_for(std::size_t n, std::size_t work_per_item, F body);   // body(begin, end)
//   static void   gemm(bool trans_a, bool trans_b, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);  // row-major, float and double
//   static double sum(const T* x, std::size_t n);                                  // float and double, accumulates in double

#include <concepts>
#include <cstddef>
#include <string_view>

namespace olmax::backend {

namespace detail {
struct range_body_archetype {
    void operator()(std::size_t, std::size_t) const {}
};
}  // namespace detail

template <class B>
concept Backend = requires(std::size_t n, detail::range_body_archetype body, const float* xf, float* yf, const double* xd, double* yd) {
    { B::name } -> std::convertible_to<std::string_view>;
    { B::num_threads() } -> std::convertible_to<int>;
    B::parallel_for(n, n, body);
    B::gemm(false, false, n, n, n, 1.0f, xf, n, xf, n, 0.0f, yf, n);
    B::gemm(false, false, n, n, n, 1.0, xd, n, xd, n, 0.0, yd, n);
    { B::sum(xf, n) } -> std::same_as<double>;
    { B::sum(xd, n) } -> std::same_as<double>;
};

/// Readable failure for a type that is not a backend.
template <class B>
constexpr void assert_backend() {
    static_assert(Backend<B>,
                  "OLMAX_NOT_A_BACKEND: this type does not model olmax::backend::Backend. A backend needs static name, "
                  "num_threads, parallel_for, gemm (float and double) and sum (float and double); see "
                  "olmax/backend/concept.hpp for the list.");
}

}  // namespace olmax::backend
