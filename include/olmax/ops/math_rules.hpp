#pragma once
// The value and derivative of each element-wise function, written once: the tensor ops
// (ops/elementwise.hpp: olmax::exp, olmax::tanh, ...), the fused chains of olmax::pointwise
// (ops/pointwise.hpp) and the ops' traced forms (trace/rules.hpp, on trace::traced_number) all
// compute them from these rules. derivative(v, y) is dy/dv at the argument v, given the value
// y = value(v). A rule uses only + - * /, negation, < > <=, &&, choose and exp, log, log1p, sqrt,
// tanh, abs: what a traced number has too. A rule is an object: most are empty, a parameterised
// one (leaky_relu's slope, elephant's a and d) holds its parameters, and every caller takes an
// instance (`Rule{}` for the empty ones).
//
// Each rule is written for a number V (float, double) and, with the same code, for a SIMD batch of
// them (xsimd::batch: the maths functions are found by argument-dependent lookup, choices are
// lane-wise `choose`s), which is how olmax::pointwise evaluates a chain several elements at a time:
// a scalar std::tanh takes ~8 ns per float where a 16-lane batch takes ~0.4 ns per element
// (AVX-512, GCC 12, 2026-11-27).

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <utility>

#include "olmax/detail/simd.hpp"

namespace olmax::math {

/// c ? a : b, on numbers or lane by lane on SIMD batches. NaN compares false, so a choice written
/// as choose(v <= 0, 0, v) keeps a NaN v.
template <class V>
    requires std::is_floating_point_v<V>
V choose(bool c, V a, V b) { return c ? a : b; }
template <class T, class A>
xsimd::batch<T, A> choose(const xsimd::batch_bool<T, A>& c, const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) {
    return xsimd::select(c, a, b);
}

/// Calls step(p, j) for each full batch of `lanes` elements [j, j + lanes) of [0, count), p the
/// input pointers; then, for a last partial batch of `rest` elements, tail(q, j, rest) with q
/// pointing at zero-padded copies of them. Every element thus goes through the same batch code,
/// so its result does not depend on where it falls (in a thread's range, or in the tail).
template <std::size_t lanes, class T, std::size_t N, class Step, class Tail>
[[gnu::always_inline]] inline void for_each_batch(std::size_t count, const std::array<const T*, N>& x, Step&& step, Tail&& tail) {
    std::size_t j = 0;
    for (; j + lanes <= count; j += lanes) step(x, j);
    if (j == count) return;
    T padded[N > 0 ? N : 1][lanes] = {};
    std::array<const T*, N> q;
    for (std::size_t k = 0; k < N; ++k) {
        std::copy_n(x[k] + j, count - j, padded[k]);
        q[k] = padded[k];
    }
    tail(q, j, count - j);
}

namespace detail {
template <class Arch, class T, std::size_t... K, class F, std::size_t N>
void transform(std::index_sequence<K...>, std::size_t n, T* out, F& f, const std::array<const T*, N>& in) {
    using batch = xsimd::batch<T, Arch>;
    for_each_batch<batch::size>(
        n, in, [&](const std::array<const T*, N>& p, std::size_t j) { batch(f(batch::load_unaligned(p[K] + j)...)).store_unaligned(out + j); },
        [&](const std::array<const T*, N>& q, std::size_t j, std::size_t rest) {
            alignas(64) T result[batch::size];
            batch(f(batch::load_unaligned(q[K])...)).store_aligned(result);
            std::copy_n(result, rest, out + j);
        });
}
}  // namespace detail

/// out[i] = f(in0[i], in1[i], ...) for i in [0, n) on SIMD batches: f takes and returns
/// xsimd::batch<T, Arch> (a generic lambda over the rules below does). `out` may alias an input.
/// `Arch` (the instruction set of this translation unit) is part of the name, so translation
/// units built for different CPUs never share one instantiation.
template <class Arch = xsimd::default_arch, class T, class F, class... In>
void transform(std::size_t n, T* out, F&& f, const In*... in) {
    detail::transform<Arch>(std::index_sequence_for<In...>{}, n, out, f, std::array<const T*, sizeof...(In)>{in...});
}

namespace rules {

struct exp {
    template <class V> static V value(V v) { using std::exp; return exp(v); }
    template <class V> static V derivative(V, V y) { return y; }
};
struct log {
    template <class V> static V value(V v) { using std::log; return log(v); }
    template <class V> static V derivative(V v, V) { return V(1) / v; }
};
struct sqrt {
    template <class V> static V value(V v) { using std::sqrt; return sqrt(v); }
    template <class V> static V derivative(V, V y) { return V(0.5) / y; }
};
struct rsqrt {
    template <class V> static V value(V v) { using std::sqrt; return V(1) / sqrt(v); }
    template <class V> static V derivative(V v, V y) { return V(-0.5) * y / v; }
};
/// |v|; its derivative is sign(v): 0 at 0 (and at NaN).
struct abs {
    template <class V> static V value(V v) { using std::abs; return abs(v); }
    template <class V> static V derivative(V v, V) { return choose(v > V(0), V(1), choose(v < V(0), V(-1), V(0))); }
};
struct square {
    template <class V> static V value(V v) { return v * v; }
    template <class V> static V derivative(V v, V) { return V(2) * v; }
};
struct tanh {
    template <class V> static V value(V v) { using std::tanh; return tanh(v); }
    template <class V> static V derivative(V, V y) { return V(1) - y * y; }
};
struct sigmoid {
    template <class V> static V value(V v) { using std::exp; return V(1) / (V(1) + exp(-v)); }
    template <class V> static V derivative(V, V y) { return y * (V(1) - y); }
};
/// clip((v + 3) / 6, 0, 1): the QRNN gate of the original Olmax (NaN stays NaN).
struct hard_sigmoid {
    template <class V> static V value(V v) {
        const V u = (v + V(3)) / V(6);
        return choose(u < V(0), V(0), choose(u > V(1), V(1), u));
    }
    template <class V> static V derivative(V v, V) { return choose(v > V(-3) && v < V(3), V(1) / V(6), V(0)); }
};
/// max(v, 0), keeping a NaN v (a choice on v <= 0 rather than on v > 0).
struct relu {
    template <class V> static V value(V v) { return choose(v <= V(0), V(0), v); }
    template <class V> static V derivative(V v, V) { return choose(v > V(0), V(1), V(0)); }
};
/// log(1 + e^v) = max(v, 0) + log(1 + e^-|v|), without overflow; its derivative is sigmoid(v).
struct softplus {
    template <class V> static V value(V v) {
        using std::abs, std::exp, std::log1p;
        return choose(v > V(0), v, V(0)) + log1p(exp(-abs(v)));
    }
    template <class V> static V derivative(V v, V) { return sigmoid::value(v); }
};
/// v sigmoid(v) (SiLU, swish); its derivative s + y (1 - s) with s = sigmoid(v).
struct silu {
    template <class V> static V value(V v) { return v * sigmoid::value(v); }
    template <class V> static V derivative(V v, V y) {
        const V s = sigmoid::value(v);
        return s + y * (V(1) - s);
    }
};

/// Mish: v tanh(softplus(v)) (Misra 2019).
struct mish {
    template <class V> static V value(V v) { using std::tanh; return v * tanh(softplus::value(v)); }
    template <class V> static V derivative(V v, V) {
        using std::tanh;
        const V t = tanh(softplus::value(v));
        return t + v * (V(1) - t * t) * sigmoid::value(v);
    }
};

/// GELU in its tanh form, v (1 + tanh(u)) / 2 with u = sqrt(2 / pi) (v + 0.044715 v^3) (Hendrycks
/// & Gimpel 2016; GPT-2's, and PyTorch's gelu(approximate="tanh")). u is formed from v clamped to
/// [-10, 10], where tanh(u) is already +-1 in double, so v^3 cannot overflow: the value is v above
/// 10 (+inf at +inf), 0 below -10 (also at -inf, where v (1 + tanh) would be -inf * 0), and the
/// derivative 1 or 0 there; NaN stays NaN.
struct gelu {
    static constexpr double k = 0.7978845608028654;  // sqrt(2 / pi)
    static constexpr double c = 0.044715;
    template <class V> static V clamped(V v) { return choose(v > V(10), V(10), choose(v < V(-10), V(-10), v)); }
    template <class V> static V tanh_u(V w) {
        using std::tanh;
        return tanh(V(k) * (w + V(c) * w * w * w));
    }
    template <class V> static V value(V v) { return choose(v < V(-10), V(0), V(0.5) * v * (V(1) + tanh_u(clamped(v)))); }
    template <class V> static V derivative(V v, V) {
        const V w = clamped(v), t = tanh_u(w);
        return V(0.5) * (V(1) + t) + V(0.5) * w * (V(1) - t * t) * V(k) * (V(1) + V(3 * c) * w * w);
    }
};

/// v limited to [lo, hi] (NaN stays NaN); its derivative 1 on [lo, hi], bounds included, and 0
/// outside and at NaN, as PyTorch's clamp.
struct clamp {
    double lo = 0, hi = 1;
    template <class V> V value(V v) const { return choose(v < V(lo), V(lo), choose(V(hi) < v, V(hi), v)); }
    template <class V> V derivative(V v, V) const { return choose(V(lo) <= v && v <= V(hi), V(1), V(0)); }
};

/// v for v >= 0 (and NaN), slope v below; its derivative slope below 0, else 1.
struct leaky_relu {
    double slope = 0.01;
    template <class V> V value(V v) const { return choose(v < V(0), V(slope) * v, v); }
    template <class V> V derivative(V v, V) const { return choose(v < V(0), V(slope), V(1)); }
};

/// The elephant activation 1 / (1 + P), P = |v / a|^d (Lan & Mahmood 2023; a > 0, d > 0), with
/// P = exp(d log |v / a|) (0 at v = 0; NaN stays NaN). Its derivative
/// -d P |v / a|^-1 sign(v) / a y^2 is written -d (P y) y / v, and P y = P / (1 + P) is taken as 1
/// where y has underflowed to 0 (P huge or infinite, where P y would be inf * 0): so the tails
/// give 0, not NaN, and v = 0 gives 0 (the one-sided derivatives differ there when d <= 1).
struct elephant {
    double a = 1, d = 4;
    template <class V> V power(V v) const {
        using std::abs, std::exp, std::log;
        const V u = abs(v) / V(a);
        const auto zero = u <= V(0);
        return choose(zero, V(0), exp(V(d) * log(choose(zero, V(1), u))));
    }
    template <class V> V value(V v) const { return V(1) / (V(1) + power(v)); }
    template <class V> V derivative(V v, V y) const {
        using std::abs;
        const auto zero = abs(v) <= V(0);
        const V py = choose(y > V(0), power(v) * y, V(1));
        return choose(zero, V(0), V(-d) * py * y / choose(zero, V(1), v));
    }
};

}  // namespace rules
}  // namespace olmax::math

