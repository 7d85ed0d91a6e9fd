#pragma once
// A user's chain of element-wise maths as one differentiable op: `olmax::pointwise(name, f, x...)`
// computes y[i] = f(x0[i], x1[i], ...) in one pass over memory, and its backward every input's
// gradient in one more pass, where the same chain written as separate ops makes one pass, one
// tensor and one tape node per step, forward and backward.
//
// f is written once, generically, over the `olmax::math` functions and + - * / (numbers on either
// side of + - *, on the right of /: the tensor ops have no number / tensor):
//
//     namespace m = olmax::math;
//     Tensor<float> input = olmax::pointwise("qrnn_input",
//         [](auto f, auto z) { return (1 - m::hard_sigmoid(f)) * m::tanh(z); }, forget_pre, candidate_pre);
//
// and olmax evaluates it three ways:
// - on SIMD batches of numbers (xsimd::batch, as many lanes as the instruction set the code is
//   compiled for holds), for the forward: the maths functions run vectorised, which GCC does not
//   do for std::exp or std::tanh in an ordinary loop (math_rules.hpp has the measurement);
// - on dual numbers of such batches (`math::Dual<batch, N>`: a value and its derivatives by each
//   of the N inputs, forward-mode differentiation per element), for the backward:
//   dx_k[i] = dy[i] * df/dx_k at the inputs, recomputed from the inputs (the op keeps its inputs,
//   not y or any intermediate);
// - on tensors, where every function is the olmax op of that name: this is how a traced program
//   (a PJRT device) receives the chain, op by op, through the ops' own lowering rules, and it is the
//   unfused reference the tests compare with.
// Broadcasting: every input has the output's shape (the longest input shape) or a suffix of it
// ([F] over [B, T, F]: a per-feature scale); a suffix input's gradient is summed over the leading
// axes.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/detail/simd.hpp"
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/math_rules.hpp"

namespace olmax {

namespace math {

namespace detail {
/// The number type of V: V itself, or the lanes' type of a SIMD batch.
template <class V>
struct scalar_of {
    using type = V;
};
template <class T, class A>
struct scalar_of<xsimd::batch<T, A>> {
    using type = T;
};
}  // namespace detail

/// A value and its derivatives by N independent variables (forward-mode differentiation), V a
/// number or a SIMD batch of numbers (one dual number per lane). With N = 0 it is the value alone:
/// the forward of olmax::pointwise runs f on Dual<batch, 0>, so that numbers in f (1 - x, x / 3)
/// meet this type's operators, which take any number, and not the batch's, which take only its own.
template <class V, std::size_t N>
struct Dual {
    using scalar = typename detail::scalar_of<V>::type;
    V value{};
    std::array<V, N> grad{};
};

namespace detail {
template <class V, std::size_t N>
using number_t = typename Dual<V, N>::scalar;

/// The result of a unary function with value y and derivative dy_dx at x (the chain rule); the
/// derivative is a callable, not evaluated when there are no derivatives to carry (N = 0).
template <class V, std::size_t N, class Derivative>
[[gnu::always_inline]] inline Dual<V, N> chain(const Dual<V, N>& x, const V& y, Derivative&& dy_dx) {
    Dual<V, N> r{y, {}};
    if constexpr (N > 0) {
        const V d = dy_dx();
        for (std::size_t k = 0; k < N; ++k) r.grad[k] = d * x.grad[k];
    }
    return r;
}
/// The result of a binary function with value y and partial derivatives da, db.
template <class V, std::size_t N, class Derivatives>
[[gnu::always_inline]] inline Dual<V, N> chain(const Dual<V, N>& a, const Dual<V, N>& b, const V& y, Derivatives&& partials) {
    Dual<V, N> r{y, {}};
    if constexpr (N > 0) {
        const auto [da, db] = partials();
        for (std::size_t k = 0; k < N; ++k) r.grad[k] = da * a.grad[k] + db * b.grad[k];
    }
    return r;
}
template <class V, std::size_t N, class Rule>
[[gnu::always_inline]] inline Dual<V, N> apply(const Dual<V, N>& x, const Rule& rule = {}) {
    const V y = rule.value(x.value);
    return chain(x, y, [&] { return rule.derivative(x.value, y); });
}
}  // namespace detail

// ---- arithmetic on dual numbers (with each other and with numbers) ------------------------------

template <class V, std::size_t N>
[[gnu::always_inline]] inline Dual<V, N> operator+(const Dual<V, N>& a, const Dual<V, N>& b) {
    return detail::chain(a, b, V(a.value + b.value), [] { return std::pair(V(1), V(1)); });
}
template <class V, std::size_t N>
[[gnu::always_inline]] inline Dual<V, N> operator-(const Dual<V, N>& a, const Dual<V, N>& b) {
    return detail::chain(a, b, V(a.value - b.value), [] { return std::pair(V(1), V(-1)); });
}
template <class V, std::size_t N>
[[gnu::always_inline]] inline Dual<V, N> operator*(const Dual<V, N>& a, const Dual<V, N>& b) {
    return detail::chain(a, b, V(a.value * b.value), [&] { return std::pair(b.value, a.value); });
}
template <class V, std::size_t N>
[[gnu::always_inline]] inline Dual<V, N> operator/(const Dual<V, N>& a, const Dual<V, N>& b) {
    const V y = a.value / b.value;
    return detail::chain(a, b, y, [&] { return std::pair(V(V(1) / b.value), V(-y / b.value)); });
}
template <class V, std::size_t N>
[[gnu::always_inline]] inline Dual<V, N> operator-(const Dual<V, N>& a) { return detail::chain(a, V(-a.value), [] { return V(-1); }); }
template <class V, std::size_t N>
[[gnu::always_inline]] inline Dual<V, N> operator+(const Dual<V, N>& a, detail::number_t<V, N> s) { return detail::chain(a, V(a.value + V(s)), [] { return V(1); }); }
template <class V, std::size_t N>
[[gnu::always_inline]] inline Dual<V, N> operator+(detail::number_t<V, N> s, const Dual<V, N>& a) { return detail::chain(a, V(V(s) + a.value), [] { return V(1); }); }
template <class V, std::size_t N>
[[gnu::always_inline]] inline Dual<V, N> operator-(const Dual<V, N>& a, detail::number_t<V, N> s) { return detail::chain(a, V(a.value - V(s)), [] { return V(1); }); }
template <class V, std::size_t N>
[[gnu::always_inline]] inline Dual<V, N> operator-(detail::number_t<V, N> s, const Dual<V, N>& a) { return detail::chain(a, V(V(s) - a.value), [] { return V(-1); }); }
template <class V, std::size_t N>
[[gnu::always_inline]] inline Dual<V, N> operator*(const Dual<V, N>& a, detail::number_t<V, N> s) { return detail::chain(a, V(a.value * V(s)), [&] { return V(s); }); }
template <class V, std::size_t N>
[[gnu::always_inline]] inline Dual<V, N> operator*(detail::number_t<V, N> s, const Dual<V, N>& a) { return detail::chain(a, V(V(s) * a.value), [&] { return V(s); }); }
template <class V, std::size_t N>
[[gnu::always_inline]] inline Dual<V, N> operator/(const Dual<V, N>& a, detail::number_t<V, N> s) {
    return detail::chain(a, V(a.value / V(s)), [&] { return V(V(1) / V(s)); });
}
template <class V, std::size_t N>
[[gnu::always_inline]] inline Dual<V, N> operator/(detail::number_t<V, N> s, const Dual<V, N>& a) {
    const V y = V(s) / a.value;
    return detail::chain(a, y, [&] { return V(-y / a.value); });
}

// ---- the functions, each on dual numbers and on tensors -------------------------------------------
// Each takes its value and derivative from its rule (ops/math_rules.hpp, which the tensor ops use
// too); on tensors it is the olmax op of the same name.

#define OLMAX_POINTWISE_FUNCTION(fn)                                                                            \
    template <class V, std::size_t N>                                                                           \
    [[gnu::always_inline]] inline Dual<V, N> fn(const Dual<V, N>& x) { return detail::apply<V, N, rules::fn>(x); }                            \
    template <Real T>                                                                                           \
    Tensor<T> fn(const Tensor<T>& x) { return ::olmax::fn(x); }
OLMAX_POINTWISE_FUNCTION(exp)
OLMAX_POINTWISE_FUNCTION(log)
OLMAX_POINTWISE_FUNCTION(sqrt)
OLMAX_POINTWISE_FUNCTION(square)
OLMAX_POINTWISE_FUNCTION(tanh)
OLMAX_POINTWISE_FUNCTION(sigmoid)
OLMAX_POINTWISE_FUNCTION(hard_sigmoid)
OLMAX_POINTWISE_FUNCTION(relu)
OLMAX_POINTWISE_FUNCTION(softplus)
OLMAX_POINTWISE_FUNCTION(silu)
OLMAX_POINTWISE_FUNCTION(rsqrt)
OLMAX_POINTWISE_FUNCTION(abs)
OLMAX_POINTWISE_FUNCTION(mish)
OLMAX_POINTWISE_FUNCTION(gelu)
#undef OLMAX_POINTWISE_FUNCTION

/// Leaky ReLU: v for v >= 0, slope v below.
template <class V, std::size_t N>
[[gnu::always_inline]] inline Dual<V, N> leaky_relu(const Dual<V, N>& x, detail::number_t<V, N> slope) {
    return detail::apply<V, N>(x, rules::leaky_relu{double(slope)});
}
template <Real T>
Tensor<T> leaky_relu(const Tensor<T>& x, std::type_identity_t<T> slope) { return ::olmax::leaky_relu(x, slope); }

/// v limited to [lo, hi] (olmax::clamp; here lo <= hi is the caller's to keep: a SIMD lane cannot throw).
template <class V, std::size_t N>
[[gnu::always_inline]] inline Dual<V, N> clamp(const Dual<V, N>& x, detail::number_t<V, N> lo, detail::number_t<V, N> hi) {
    return detail::apply<V, N>(x, rules::clamp{double(lo), double(hi)});
}
template <Real T>
Tensor<T> clamp(const Tensor<T>& x, std::type_identity_t<T> lo, std::type_identity_t<T> hi) { return ::olmax::clamp(x, lo, hi); }

namespace detail {
/// a where `take_a` holds (lane by lane), else b: value and gradients.
template <class V, std::size_t N, class Mask>
[[gnu::always_inline]] inline Dual<V, N> pick(const Mask& take_a, const Dual<V, N>& a, const Dual<V, N>& b) {
    Dual<V, N> r{choose(take_a, a.value, b.value), {}};
    for (std::size_t k = 0; k < N; ++k) r.grad[k] = choose(take_a, a.grad[k], b.grad[k]);
    return r;
}
}  // namespace detail

/// The larger of a and b; a where they tie and where a is NaN, as `olmax::maximum`.
template <class V, std::size_t N>
[[gnu::always_inline]] inline Dual<V, N> maximum(const Dual<V, N>& a, const Dual<V, N>& b) {
    return detail::pick(a.value >= b.value || a.value != a.value, a, b);
}
template <Real T>
Tensor<T> maximum(const Tensor<T>& a, const Tensor<T>& b) { return ::olmax::maximum(a, b); }

/// The smaller of a and b; a where they tie and where a is NaN, as `olmax::minimum`.
template <class V, std::size_t N>
[[gnu::always_inline]] inline Dual<V, N> minimum(const Dual<V, N>& a, const Dual<V, N>& b) {
    return detail::pick(a.value <= b.value || a.value != a.value, a, b);
}
template <Real T>
Tensor<T> minimum(const Tensor<T>& a, const Tensor<T>& b) { return ::olmax::minimum(a, b); }

}  // namespace math

namespace detail::pointwise_ops {

/// The output shape (the longest input shape), having checked that every input's shape is it or
/// a suffix of it.
template <Real T, std::size_t N>
Shape output_shape(std::string_view name, const std::array<const Tensor<T>*, N>& in) {
    Shape out = in[0]->shape();
    for (const Tensor<T>* t : in)
        if (t->rank() > out.size()) out = t->shape();
    for (std::size_t k = 0; k < N; ++k) {
        const Shape& s = in[k]->shape();
        if (!std::equal(s.begin(), s.end(), out.end() - long(s.size())))
            throw shape_error(concat("pointwise(", name, "): input ", k, " of shape ", to_string(s), " is neither the output's shape ",
                                     to_string(out), " nor a suffix of it (a tensor broadcast over the leading axes)"));
    }
    return out;
}

/// Calls body(first, count, offsets) for runs of the output's elements [first, first + count)
/// over which every input is contiguous, input k starting at offsets[k]: the whole output when no
/// input is broadcast, else rows the length of the smallest broadcast input, handed to the
/// backend's threads.
template <std::size_t N, class Body>
void for_each_run(std::size_t total, const std::array<std::size_t, N>& sizes, Body&& body) {
    std::size_t row = total;
    for (std::size_t s : sizes)
        if (s < row) row = s;
    if (row == total || row == 0) {
        backend::current().parallel_for(total, 1, [&](std::size_t lo, std::size_t hi) {
            std::array<std::size_t, N> offsets;
            offsets.fill(lo);
            body(lo, hi - lo, offsets);
        });
        return;
    }
    backend::current().parallel_for(total / row, row, [&](std::size_t lo, std::size_t hi) {
        for (std::size_t r = lo; r < hi; ++r) {
            std::array<std::size_t, N> offsets;
            for (std::size_t k = 0; k < N; ++k) offsets[k] = (r * row) % sizes[k];
            body(r * row, row, offsets);
        }
    });
}

template <std::size_t... K, class Arch, Real T, std::size_t N, class F>
void forward(std::index_sequence<K...>, Arch, const F& f, const std::array<const T*, N>& x, const std::array<std::size_t, N>& sizes, T* y,
             std::size_t total) {
    using batch = xsimd::batch<T, Arch>;
    for_each_run<N>(total, sizes, [&](std::size_t first, std::size_t count, const std::array<std::size_t, N>& at) {
        math::transform<Arch>(count, y + first, [&](const auto&... v) { return f(math::Dual<batch, 0>{v}...).value; }, (x[K] + at[K])...);
    });
}

/// Input K of N as a dual number: its value, derivative 1 by itself and 0 by the others.
template <std::size_t K, std::size_t N, class V>
[[gnu::always_inline]] inline math::Dual<V, N> variable(const V& value) {
    math::Dual<V, N> d{value, {}};
    for (std::size_t k = 0; k < N; ++k) d.grad[k] = V(k == K ? 1 : 0);
    return d;
}

/// dx_k[i] = dy[i] * df/dx_k for the inputs whose gradient is needed (dx_k not null), into
/// output-sized buffers.
template <std::size_t... K, class Arch, Real T, std::size_t N, class F>
void backward(std::index_sequence<K...>, Arch, const F& f, const std::array<const T*, N>& x, const std::array<std::size_t, N>& sizes,
              const T* dy, const std::array<T*, N>& dx, std::size_t total) {
    using batch = xsimd::batch<T, Arch>;
    for_each_run<N>(total, sizes, [&](std::size_t first, std::size_t count, const std::array<std::size_t, N>& at) {
        std::array<const T*, N + 1> in{(x[K] + at[K])..., dy + first};
        auto grads = [&](const std::array<const T*, N + 1>& p, std::size_t j) {
            const math::Dual<batch, N> r = f(variable<K, N>(batch::load_unaligned(p[K] + j))...);
            const batch g = batch::load_unaligned(p[N] + j);
            return std::array<batch, N>{(g * r.grad[K])...};
        };
        math::for_each_batch<batch::size>(
            count, in,
            [&](const std::array<const T*, N + 1>& p, std::size_t j) {
                const auto d = grads(p, j);
                ((dx[K] ? d[K].store_unaligned(dx[K] + first + j) : void()), ...);
            },
            [&](const std::array<const T*, N + 1>& p, std::size_t j, std::size_t rest) {
                const auto d = grads(p, 0);
                alignas(64) T result[batch::size];
                ((dx[K] ? (d[K].store_aligned(result), void(std::copy_n(result, rest, dx[K] + first + j))) : void()), ...);
            });
    });
}

/// U, once per element of a pack (the argument types f is called with).
template <class, class U>
using each = U;

/// Whether f, called with Args, returns something convertible to R.
template <class R, class F, class... Args>
constexpr bool returns() {
    if constexpr (std::is_invocable_v<const F&, Args...>) return std::is_convertible_v<std::invoke_result_t<const F&, Args...>, R>;
    else return false;
}

}  // namespace detail::pointwise_ops

/// y[i] = f(x0[i], x1[i], ...) as one differentiable op named `name` (see the file comment): f is
/// a generic callable over `olmax::math`'s functions and + - * / (with numbers too), returning the
/// same type it is given. Inputs: equal shapes, or suffixes of the longest shape. `Arch`: the SIMD
/// instruction set the chain is compiled for (part of the function's name, so that translation
/// units built for different CPUs never share one instantiation).
template <class F, Real T, class... Rest, class Arch = xsimd::default_arch>
    requires(std::is_same_v<Rest, Tensor<T>> && ...)
Tensor<T> pointwise(std::string_view name, F f, const Tensor<T>& first, const Rest&... rest) {
    static constexpr std::size_t N = 1 + sizeof...(Rest);
    namespace ops = detail::pointwise_ops;
    using batch = xsimd::batch<T, Arch>;
    static_assert(ops::returns<math::Dual<batch, N>, F, math::Dual<batch, N>, ops::each<Rest, math::Dual<batch, N>>...>(),
                  "olmax::pointwise: f must take olmax::math::Dual numbers and return one: write f over auto arguments, with "
                  "olmax::math's functions (not std::'s) and + - * / with numbers");
    static_assert(ops::returns<Tensor<T>, F, const Tensor<T>&, const Rest&...>(),
                  "olmax::pointwise: f must also take tensors and return one (its traced form: olmax::math's functions have "
                  "tensor overloads)");
    backend::op_scope on(name, first, rest...);
    const std::array<const Tensor<T>*, N> in{&first, &rest...};
    const Shape shape = ops::output_shape<T, N>(name, in);
    return on.run_composed([&] { return f(first, rest...); },  // the chain op by op, through each op's lowering rule
                           [&] {
        std::array<const T*, N> x;
        std::array<std::size_t, N> sizes;
        for (std::size_t k = 0; k < N; ++k) x[k] = in[k]->data(), sizes[k] = in[k]->size();
        auto y = Tensor<T>::uninitialized(shape);  // every element is written
        ops::forward(std::make_index_sequence<N>{}, Arch{}, f, x, sizes, y.data(), y.size());
        const std::array<Tensor<T>, N> inputs{first, rest...};
        autodiff::record<T>(name, std::span<const Tensor<T>>(inputs), std::span<Tensor<T>>(&y, 1),
                            [f, shape, kept = std::array<Tensor<T>, N>{first.detach(), rest.detach()...}](std::span<const Tensor<T>> g,
                                                                                                         autodiff::GradientSink<T>& sink) {
                                std::array<const T*, N> xs;
                                std::array<std::size_t, N> sizes;
                                std::array<Tensor<T>, N> full;
                                std::array<T*, N> dx{};
                                for (std::size_t k = 0; k < N; ++k) {
                                    xs[k] = kept[k].data(), sizes[k] = kept[k].size();
                                    if (!sink.needs(k)) continue;
                                    full[k] = Tensor<T>::uninitialized(shape);  // every element is written
                                    dx[k] = full[k].data();
                                }
                                detail::pointwise_ops::backward(std::make_index_sequence<N>{}, Arch{}, f, xs, sizes, g[0].data(), dx, numel(shape));
                                for (std::size_t k = 0; k < N; ++k) {
                                    if (!dx[k]) continue;
                                    if (kept[k].shape() == shape) sink.add(k, std::move(full[k]));
                                    else sink.add(k, olmax::detail::sum_to_shape(full[k], kept[k].shape()));
                                }
                            });
        return y;
    });
}

}  // namespace olmax
