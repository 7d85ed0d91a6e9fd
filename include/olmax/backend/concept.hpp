#pragma once
// The backend trait: what a compute backend must provide, checked as a C++20 concept.
//
// A backend is a stateless type with static members (like Eigen's devices, but a type so ops can
// be templates on it): allocation, parallel loops, GEMM, element-wise kernels and reductions.
// Optional ops are announced through `supports<Op>`; an op a backend does not support runs on the
// CPU reference (`kernel_backend_t`). Minimum surface (a stub backend needs exactly this):
//
//   static constexpr std::string_view name;
//   static void* allocate(std::size_t bytes);                  // 64-byte aligned host memory
//   static void  deallocate(void* p, std::size_t bytes);
//   static int   num_threads();
//   static void  parallel_for(std::size_t n, std::size_t work_per_item, F body);   // body(begin, end)
//   static void  gemm(bool trans_a, bool trans_b, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);  // row-major, float and double
//   static void  map(std::size_t n, T* out, F f, const In*... in);                 // out[i] = f(in[i]...)
//   static double sum(const T* x, std::size_t n);                                  // accumulates in double
//   template <class Op> static constexpr bool supports;                           // optional ops (tags below)

#include <concepts>
#include <cstddef>
#include <string_view>
#include <type_traits>

namespace olmax::backend {

/// Tags of optional ops a backend may implement natively. Ops not listed are composed from the
/// required primitives and run on every backend.
namespace op {
struct matmul {};
struct elementwise {};
struct reduction {};
struct linear_scan {};
}  // namespace op

namespace detail {
struct range_body_archetype {
    void operator()(std::size_t, std::size_t) const {}
};
template <class T>
struct unary_archetype {
    T operator()(T v) const { return v; }
};
}  // namespace detail

template <class B>
concept Backend = requires(std::size_t n, void* p, detail::range_body_archetype body, const float* xf, float* yf,
                           const double* xd, double* yd) {
    { B::name } -> std::convertible_to<std::string_view>;
    { B::allocate(n) } -> std::same_as<void*>;
    B::deallocate(p, n);
    { B::num_threads() } -> std::convertible_to<int>;
    B::parallel_for(n, n, body);
    B::gemm(false, false, n, n, n, 1.0f, xf, n, xf, n, 0.0f, yf, n);
    B::gemm(false, false, n, n, n, 1.0, xd, n, xd, n, 0.0, yd, n);
    B::map(n, yf, detail::unary_archetype<float>{}, xf);
    B::map(n, yd, detail::unary_archetype<double>{}, xd);
    { B::sum(xf, n) } -> std::same_as<double>;
    { B::sum(xd, n) } -> std::same_as<double>;
};

/// Whether backend `B` implements optional op `Op` natively (false when it does not say).
template <class B, class Op>
constexpr bool supports = [] {
    if constexpr (requires { B::template supports<Op>; }) return static_cast<bool>(B::template supports<Op>);
    else return false;
}();

/// Readable failure for a type that is not a backend.
template <class B>
constexpr void assert_backend() {
    static_assert(Backend<B>,
                  "OLMAX_NOT_A_BACKEND: this type does not model olmax::backend::Backend. A backend needs static name, "
                  "allocate, deallocate, num_threads, parallel_for, gemm (float and double), map and sum; see "
                  "olmax/backend/concept.hpp for the list.");
}

}  // namespace olmax::backend
