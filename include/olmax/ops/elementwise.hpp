#pragma once
// Element-wise ops with NumPy broadcasting, unary maths and activations; all differentiable.

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/ops/math_rules.hpp"
#include "olmax/ops/op_keys.hpp"

namespace olmax {

namespace detail {

/// Iterates over every element of `out_shape`, calling f(out_index, a_offset, b_offset) where the
/// operand offsets follow broadcasting (stride 0 along broadcast axes). Rows of the last axis are
/// handed out to backend threads.
template <class F>
void for_each_broadcast(const Shape& out_shape, const Shape& a_shape, const Shape& b_shape, F&& f) {
    const std::size_t rank = out_shape.size();
    auto broadcast_strides = [&](const Shape& s) {
        Shape st(rank, 0);
        const Shape rs = row_major_strides(s);
        for (std::size_t i = 0; i < s.size(); ++i) {
            const std::size_t axis = rank - s.size() + i;
            st[axis] = s[i] == 1 ? 0 : rs[i];
        }
        return st;
    };
    const Shape sa = broadcast_strides(a_shape), sb = broadcast_strides(b_shape);
    const std::size_t inner = rank ? out_shape[rank - 1] : 1;
    const std::size_t rows = inner ? numel(out_shape) / inner : 0;
    const std::size_t ia = rank ? sa[rank - 1] : 0, ib = rank ? sb[rank - 1] : 0;
    backend::current().parallel_for(rows, inner, [&](std::size_t begin, std::size_t end) {
        for (std::size_t row = begin; row < end; ++row) {
            std::size_t rem = row, oa = 0, ob = 0;
            for (std::size_t axis = rank ? rank - 1 : 0; axis-- > 0;) {  // rank 0: no outer axes
                const std::size_t idx = rem % out_shape[axis];
                rem /= out_shape[axis];
                oa += idx * sa[axis];
                ob += idx * sb[axis];
            }
            for (std::size_t j = 0; j < inner; ++j) f(row * inner + j, oa + j * ia, ob + j * ib);
        }
    });
}

/// out[o, i] = sum_k x[o, k, i] over a row-major [outer, n, inner] block, accumulated in double.
/// Rows are read front to back (whole rows, or segments of `max_width` when rows are very long),
/// each added into a per-item double accumulator, so memory streams sequentially. Work items are
/// (outer index, column segment, block of rows); rows are split into blocks only when there are
/// fewer (outer, segment) pairs than threads, and blocks are then combined in a fixed order.
template <Real T>
void sum_middle_axis(const T* x, T* out, std::size_t outer, std::size_t n, std::size_t inner) {
    if (outer * inner == 0) return;
    if (inner == 1) {
        if (outer == 1) {
            out[0] = T(backend::current().sum(x, n));  // one long row: the device's (parallel) full reduction
            return;
        }
        backend::current().parallel_for(outer, n, [&](std::size_t lo, std::size_t hi) {
            for (std::size_t o = lo; o < hi; ++o) {
                const T* row = x + o * n;
                double acc = 0;
#pragma omp simd reduction(+ : acc)
                for (std::size_t k = 0; k < n; ++k) acc += double(row[k]);
                out[o] = T(acc);
            }
        });
        return;
    }
    constexpr std::size_t max_width = 4096, min_rows_per_block = 64;
    const std::size_t width = std::min(inner, max_width);
    const std::size_t segments = (inner + width - 1) / width;
    const std::size_t threads = static_cast<std::size_t>(std::max(1, backend::current().num_threads()));
    const std::size_t pairs = outer * segments;
    const std::size_t blocks =
        pairs >= threads ? 1 : std::max<std::size_t>(1, std::min((threads + pairs - 1) / pairs, n / min_rows_per_block));
    const std::size_t items = pairs * blocks;
    std::vector<double> partial(blocks > 1 ? items * width : 0);
    backend::current().parallel_for(items, (n / blocks + 1) * width, [&](std::size_t lo, std::size_t hi) {
        std::vector<double> local(blocks > 1 ? 0 : width);
        for (std::size_t item = lo; item < hi; ++item) {
            const std::size_t pair = item / blocks, block = item % blocks;
            const std::size_t o = pair / segments, i0 = (pair % segments) * width, w = std::min(width, inner - i0);
            const std::size_t k0 = n * block / blocks, k1 = n * (block + 1) / blocks;
            double* acc = blocks > 1 ? partial.data() + item * width : local.data();
            std::fill_n(acc, w, 0.0);
            for (std::size_t k = k0; k < k1; ++k) {
                const T* row = x + (o * n + k) * inner + i0;
#pragma omp simd
                for (std::size_t j = 0; j < w; ++j) acc[j] += double(row[j]);
            }
            if (blocks == 1) {
                T* dst = out + o * inner + i0;
                for (std::size_t j = 0; j < w; ++j) dst[j] = T(acc[j]);
            }
        }
    });
    if (blocks == 1) return;
    for (std::size_t pair = 0; pair < pairs; ++pair) {  // small: fewer pairs than threads
        const std::size_t o = pair / segments, i0 = (pair % segments) * width, w = std::min(width, inner - i0);
        for (std::size_t j = 0; j < w; ++j) {
            double total = 0;
            for (std::size_t block = 0; block < blocks; ++block) total += partial[(pair * blocks + block) * width + j];
            out[o * inner + i0 + j] = T(total);
        }
    }
}

/// Sums `grad` (of a broadcast result shape) down to `shape`, undoing broadcasting. Consecutive
/// summed (or kept) axes are merged, then each run of summed axes is one parallel
/// `sum_middle_axis` pass, innermost first.
template <Real T>
Tensor<T> sum_to_shape(const Tensor<T>& grad, const Shape& shape) {
    if (grad.shape() == shape) return grad;
    const Shape& gs = grad.shape();
    auto fail = [&] {
        throw shape_error(concat("sum_to_shape: a gradient of shape ", to_string(gs), " does not broadcast from shape ", to_string(shape)));
    };
    if (shape.size() > gs.size()) fail();
    const std::size_t lead = gs.size() - shape.size();
    struct Run {
        std::size_t extent;
        bool summed;
    };
    std::vector<Run> runs;
    for (std::size_t i = 0; i < gs.size(); ++i) {
        const std::size_t target = i < lead ? 1 : shape[i - lead];
        if (target != 1 && target != gs[i]) fail();
        if (gs[i] == 1) continue;  // nothing to sum, nothing to keep apart
        const bool summed = target == 1;
        if (!runs.empty() && runs.back().summed == summed) runs.back().extent *= gs[i];
        else runs.push_back({gs[i], summed});
    }
    Tensor<T> out(shape);
    if (grad.empty() || out.empty()) return out;  // a sum over nothing is 0
    if (std::none_of(runs.begin(), runs.end(), [](const Run& run) { return run.summed; })) {
        std::copy(grad.begin(), grad.end(), out.begin());  // only extent-1 axes differ ([1, 3] -> [3])
        return out;
    }
    Tensor<T> current = grad;
    for (std::size_t r = runs.size(); r-- > 0;) {
        if (!runs[r].summed) continue;
        std::size_t outer = 1, inner = 1;
        for (std::size_t j = 0; j < r; ++j) outer *= runs[j].extent;
        for (std::size_t j = r + 1; j < runs.size(); ++j) inner *= runs[j].extent;
        const bool last_pass = std::none_of(runs.begin(), runs.begin() + long(r), [](const Run& run) { return run.summed; });
        Tensor<T> next = last_pass ? out : Tensor<T>::uninitialized({outer * inner});
        sum_middle_axis(current.data(), next.data(), outer, runs[r].extent, inner);
        current = next;
        runs.erase(runs.begin() + long(r));  // the kept runs on either side now touch: multiply them
        if (r > 0 && r < runs.size() && !runs[r - 1].summed && !runs[r].summed) {
            runs[r - 1].extent *= runs[r].extent;
            runs.erase(runs.begin() + long(r));
        }
    }
    return out;
}

/// Which values an element-wise op's derivative reads, so that its backward closure keeps only
/// those: a tensor no closure keeps is freed during the forward pass (core/tensor.hpp).
enum class Reads { nothing, input, output, both };

/// out[i] = f(in0[i], ...) on the current device's threads: on SIMD batches (math::transform:
/// vectorised exp, tanh, log, which GCC does not vectorise from std::) when `Batched` (f takes
/// xsimd batches), else through the device's element-wise map.
template <bool Batched, class T, class F, class... In>
void map_elements(std::size_t n, T* out, F&& f, const In*... in) {
    if constexpr (Batched)
        backend::current().parallel_for(n, 1, [&](std::size_t lo, std::size_t hi) { math::transform(hi - lo, out + lo, f, (in + lo)...); });
    else
        backend::map(n, out, f, in...);
}

/// A differentiable unary op: y = f(x), dx = dy * df(x, y); df reads what `reads` says (it is
/// given dy in place of a value it does not read). When f and df take SIMD batches (a rule of
/// ops/math_rules.hpp does: `unary_rule_op`), both passes run on them.
/// Traced, it returns its lowering rule's value, found by the op's key (`attrs`: the rule's
/// arguments); a key outside op::all has no rule, and then fails at trace time naming the op.
template <class Key, Reads reads = Reads::both, Real T, class F, class DF>
Tensor<T> unary_op(const Tensor<T>& x, F f, DF df, const typename Key::attrs& attrs = {}) {
    using batch = xsimd::batch<T>;
    static constexpr bool batched = std::is_invocable_v<F&, batch> && std::is_invocable_v<DF&, batch, batch>;
    constexpr std::string_view name = Key::name;
    backend::op_scope on(name, x);
    return on.run<Key>({x}, attrs, [&] {
        auto y = Tensor<T>::uninitialized(x.shape());
        map_elements<batched>(x.size(), y.data(), f, x.data());
        static constexpr bool keep_x = reads == Reads::input || reads == Reads::both, keep_y = reads == Reads::output || reads == Reads::both;
        autodiff::record<T>(name, std::span<const Tensor<T>>(&x, 1), std::span<Tensor<T>>(&y, 1),
                            [shape = x.shape(), x = keep_x ? x.detach() : Tensor<T>(), y = keep_y ? y.detach() : Tensor<T>(),
                             df](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                                auto dx = Tensor<T>::uninitialized(shape);
                                const T* gp = g[0].data();
                                const T *xp = keep_x ? x.data() : gp, *yp = keep_y ? y.data() : gp;
                                if constexpr (batched)
                                    map_elements<true>(dx.size(), dx.data(), [df](auto gi, auto xi, auto yi) { return gi * df(xi, yi); }, gp, xp, yp);
                                else
                                    map_elements<false>(dx.size(), dx.data(), [df](T gi, T xi, T yi) { return gi * df(xi, yi); }, gp, xp, yp);
                                sink.add(0, std::move(dx));
                            });
        return y;
    });
}

/// A unary op whose value and derivative are a rule of ops/math_rules.hpp (on SIMD batches);
/// `attrs` are the key's copy of a parameterised rule's parameters (its traced form builds the
/// same rule from them).
template <class Rule, class Key, Reads reads, Real T>
Tensor<T> unary_rule_op(const Tensor<T>& x, Rule rule = {}, const typename Key::attrs& attrs = {}) {
    return unary_op<Key, reads>(x, [rule](auto v) { return rule.value(v); }, [rule](auto v, auto y) { return rule.derivative(v, y); }, attrs);
}

/// Which of a, b and y a binary op's derivatives read (add's: none; mul's: a and b).
struct BinaryReads {
    bool a = true, b = true, y = true;
};

/// A differentiable binary op with broadcasting: y = f(a, b), da = dy * dfa(a, b, y), db = dy * dfb(a, b, y);
/// the derivatives read what `reads` says (they are given dy in place of a value they do not read).
/// Traced, it returns the lowering rule of the op's key.
template <class Key, BinaryReads reads = BinaryReads{}, Real T, class F, class DFA, class DFB>
Tensor<T> binary_op(const Tensor<T>& a, const Tensor<T>& b, F f, DFA dfa, DFB dfb) {
    constexpr std::string_view name = Key::name;
    backend::op_scope on(name, a, b);
    return on.run<Key>({a, b}, {}, [&] {
        const bool same = a.shape() == b.shape();
        const Shape out_shape = same ? a.shape() : broadcast_shapes(a.shape(), b.shape(), name);
        auto y = Tensor<T>::uninitialized(out_shape);
        {
            const T *ap = a.data(), *bp = b.data();
            T* yp = y.data();
            if (same) backend::map(y.size(), yp, f, ap, bp);
            else for_each_broadcast(out_shape, a.shape(), b.shape(), [&](std::size_t i, std::size_t ia, std::size_t ib) { yp[i] = f(ap[ia], bp[ib]); });
        }
        const Tensor<T> inputs[2] = {a, b};
        autodiff::record<T>(name, inputs, std::span<Tensor<T>>(&y, 1),
                            [a_shape = a.shape(), b_shape = b.shape(), a = reads.a ? a.detach() : Tensor<T>(), b = reads.b ? b.detach() : Tensor<T>(),
                             y = reads.y ? y.detach() : Tensor<T>(), dfa, dfb, same](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                                const T* gp = g[0].data();
                                // dy (output-shaped, read at the output index) stands in for a value not kept.
                                const T *ap = reads.a ? a.data() : gp, *bp = reads.b ? b.data() : gp, *yp = reads.y ? y.data() : gp;
                                const Shape& os = g[0].shape();
                                for (int side = 0; side < 2; ++side) {
                                    if (!sink.needs(side)) continue;
                                    auto full = Tensor<T>::uninitialized(os);
                                    T* dp = full.data();
                                    if (same && side == 0) {
                                        backend::map(full.size(), dp, [dfa](T gi, T ai, T bi, T yi) { return gi * dfa(ai, bi, yi); }, gp, ap, bp, yp);
                                    } else if (same) {
                                        backend::map(full.size(), dp, [dfb](T gi, T ai, T bi, T yi) { return gi * dfb(ai, bi, yi); }, gp, ap, bp, yp);
                                    } else {
                                        for_each_broadcast(os, a_shape, b_shape, [&](std::size_t i, std::size_t ia, std::size_t ib) {
                                            const T av = ap[reads.a ? ia : i], bv = bp[reads.b ? ib : i];
                                            dp[i] = gp[i] * (side == 0 ? dfa(av, bv, yp[i]) : dfb(av, bv, yp[i]));
                                        });
                                    }
                                    const Shape& target = side == 0 ? a_shape : b_shape;
                                    if (full.shape() == target) sink.add(side, std::move(full));  // first arrival: no copy
                                    else sink.add(side, sum_to_shape(full, target));
                                }
                            });
        return y;
    });
}

}  // namespace detail

// ---- binary arithmetic -------------------------------------------------------------------------

template <Real T>
Tensor<T> add(const Tensor<T>& a, const Tensor<T>& b) {
    return detail::binary_op<op::add, detail::BinaryReads{false, false, false}>(a, b, [](T x, T y) { return x + y; }, [](T, T, T) { return T{1}; }, [](T, T, T) { return T{1}; });
}
template <Real T>
Tensor<T> sub(const Tensor<T>& a, const Tensor<T>& b) {
    return detail::binary_op<op::sub, detail::BinaryReads{false, false, false}>(a, b, [](T x, T y) { return x - y; }, [](T, T, T) { return T{1}; }, [](T, T, T) { return T{-1}; });
}
template <Real T>
Tensor<T> mul(const Tensor<T>& a, const Tensor<T>& b) {
    return detail::binary_op<op::mul, detail::BinaryReads{true, true, false}>(a, b, [](T x, T y) { return x * y; }, [](T, T y, T) { return y; }, [](T x, T, T) { return x; });
}
template <Real T>
Tensor<T> div(const Tensor<T>& a, const Tensor<T>& b) {
    return detail::binary_op<op::div, detail::BinaryReads{false, true, true}>(a, b, [](T x, T y) { return x / y; }, [](T, T y, T) { return T{1} / y; },
                                [](T, T y, T out) { return -out / y; });
}
/// Element-wise maximum; the gradient goes to `a` where a >= b, else to `b`. A NaN in either
/// operand gives NaN (as `numpy.maximum`), with the gradient routed to the NaN operand.
template <Real T>
Tensor<T> maximum(const Tensor<T>& a, const Tensor<T>& b) {
    return detail::binary_op<op::maximum, detail::BinaryReads{true, true, false}>(a, b, [](T x, T y) { return (x >= y || x != x) ? x : y; },
                                [](T x, T y, T) { return T(x >= y || x != x); }, [](T x, T y, T) { return T(!(x >= y || x != x)); });
}
/// Element-wise minimum; the gradient goes to `a` where a <= b, else to `b`. NaN as in `maximum`.
template <Real T>
Tensor<T> minimum(const Tensor<T>& a, const Tensor<T>& b) {
    return detail::binary_op<op::minimum, detail::BinaryReads{true, true, false}>(a, b, [](T x, T y) { return (x <= y || x != x) ? x : y; },
                                [](T x, T y, T) { return T(x <= y || x != x); }, [](T x, T y, T) { return T(!(x <= y || x != x)); });
}

// ---- scalar arithmetic -------------------------------------------------------------------------

template <Real T>
Tensor<T> add_scalar(const Tensor<T>& x, T s) {
    return detail::unary_op<op::add_scalar, detail::Reads::nothing>(x, [s](T v) { return v + s; }, [](T, T) { return T{1}; }, {.value = double(s)});
}
template <Real T>
Tensor<T> scale(const Tensor<T>& x, T s) {
    return detail::unary_op<op::scale, detail::Reads::nothing>(x, [s](T v) { return v * s; }, [s](T, T) { return s; }, {.factor = double(s)});
}
template <Real T>
Tensor<T> neg(const Tensor<T>& x) { return scale(x, T{-1}); }

template <Real T> Tensor<T> operator+(const Tensor<T>& a, const Tensor<T>& b) { return add(a, b); }
template <Real T> Tensor<T> operator-(const Tensor<T>& a, const Tensor<T>& b) { return sub(a, b); }
template <Real T> Tensor<T> operator*(const Tensor<T>& a, const Tensor<T>& b) { return mul(a, b); }
template <Real T> Tensor<T> operator/(const Tensor<T>& a, const Tensor<T>& b) { return div(a, b); }
template <Real T> Tensor<T> operator-(const Tensor<T>& x) { return neg(x); }
template <Real T> Tensor<T> operator+(const Tensor<T>& x, std::type_identity_t<T> s) { return add_scalar(x, s); }
template <Real T> Tensor<T> operator+(std::type_identity_t<T> s, const Tensor<T>& x) { return add_scalar(x, s); }
template <Real T> Tensor<T> operator-(const Tensor<T>& x, std::type_identity_t<T> s) { return add_scalar(x, -s); }
template <Real T> Tensor<T> operator-(std::type_identity_t<T> s, const Tensor<T>& x) { return add_scalar(neg(x), s); }
template <Real T> Tensor<T> operator*(const Tensor<T>& x, std::type_identity_t<T> s) { return scale(x, s); }
template <Real T> Tensor<T> operator*(std::type_identity_t<T> s, const Tensor<T>& x) { return scale(x, s); }
template <Real T> Tensor<T> operator/(const Tensor<T>& x, std::type_identity_t<T> s) { return scale(x, T{1} / s); }

// ---- unary maths -------------------------------------------------------------------------------

template <Real T>
Tensor<T> exp(const Tensor<T>& x) {
    return detail::unary_rule_op<math::rules::exp, op::exp, detail::Reads::output>(x);
}
template <Real T>
Tensor<T> log(const Tensor<T>& x) {
    return detail::unary_rule_op<math::rules::log, op::log, detail::Reads::input>(x);
}
template <Real T>
Tensor<T> sqrt(const Tensor<T>& x) {
    return detail::unary_rule_op<math::rules::sqrt, op::sqrt, detail::Reads::output>(x);
}
template <Real T>
Tensor<T> rsqrt(const Tensor<T>& x) {
    return detail::unary_rule_op<math::rules::rsqrt, op::rsqrt, detail::Reads::both>(x);
}
template <Real T>
Tensor<T> square(const Tensor<T>& x) {
    return detail::unary_rule_op<math::rules::square, op::square, detail::Reads::input>(x);
}
template <Real T>
Tensor<T> abs(const Tensor<T>& x) {
    return detail::unary_rule_op<math::rules::abs, op::abs, detail::Reads::input>(x);
}
template <Real T>
Tensor<T> tanh(const Tensor<T>& x) {
    return detail::unary_rule_op<math::rules::tanh, op::tanh, detail::Reads::output>(x);
}
template <Real T>
Tensor<T> sigmoid(const Tensor<T>& x) {
    return detail::unary_rule_op<math::rules::sigmoid, op::sigmoid, detail::Reads::output>(x);
}
/// clip((x + 3) / 6, 0, 1): the QRNN gate of the original Olmax.
template <Real T>
Tensor<T> hard_sigmoid(const Tensor<T>& x) {
    return detail::unary_rule_op<math::rules::hard_sigmoid, op::hard_sigmoid, detail::Reads::input>(x);
}
template <Real T>
Tensor<T> relu(const Tensor<T>& x) {
    return detail::unary_rule_op<math::rules::relu, op::relu, detail::Reads::input>(x);
}
/// Leaky ReLU (Olmax default slope 0.01), gradient `slope` for x < 0.
template <Real T>
Tensor<T> leaky_relu(const Tensor<T>& x, T slope = T{0.01}) {
    return detail::unary_rule_op<math::rules::leaky_relu, op::leaky_relu, detail::Reads::input>(x, {double(slope)}, {.slope = double(slope)});
}
/// x limited to [lo, hi] (lo <= hi; either may be infinite), NaN kept; gradient 1 on [lo, hi], 0
/// outside (PyTorch's clamp).
template <Real T>
Tensor<T> clamp(const Tensor<T>& x, std::type_identity_t<T> lo, std::type_identity_t<T> hi) {
    check<value_error>(lo <= hi, "clamp: lo (", lo, ") must not exceed hi (", hi, ")");
    return detail::unary_rule_op<math::rules::clamp, op::clamp, detail::Reads::input>(x, {double(lo), double(hi)},
                                                                                      {.lo = double(lo), .hi = double(hi)});
}
/// 1 where x != 0 (NaN too), else 0: a flag, with no gradient (x does not reach the result
/// continuously). Packed-document resets go through it (masks::start_flags) before a traced form
/// computes with them as 0/1 values, so that any nonzero marks a document start on every device,
/// as `resets[b, t] != 0` does in the eager ops.
template <Real T>
Tensor<T> nonzero(const Tensor<T>& x) {
    backend::op_scope on("nonzero", x);
    return on.run<op::nonzero>({x}, {}, [&] {
        auto y = Tensor<T>::uninitialized(x.shape());
        const T* xp = x.data();
        T* yp = y.data();
        for (std::size_t i = 0; i < x.size(); ++i) yp[i] = xp[i] != T{0} ? T{1} : T{0};
        return y;
    });
}
template <Real T>
Tensor<T> softplus(const Tensor<T>& x) {
    return detail::unary_rule_op<math::rules::softplus, op::softplus, detail::Reads::input>(x);
}
/// SiLU (swish): x sigmoid(x), as one op (one pass, one saved pair).
template <Real T>
Tensor<T> silu(const Tensor<T>& x) {
    return detail::unary_rule_op<math::rules::silu, op::silu, detail::Reads::both>(x);
}
/// Mish: x * tanh(softplus(x)) (Misra 2019).
template <Real T>
Tensor<T> mish(const Tensor<T>& x) {
    return detail::unary_rule_op<math::rules::mish, op::mish, detail::Reads::input>(x);
}
/// GELU, tanh form: x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) / 2 (GPT-2's; PyTorch's
/// gelu(approximate="tanh")).
template <Real T>
Tensor<T> gelu(const Tensor<T>& x) {
    return detail::unary_rule_op<math::rules::gelu, op::gelu, detail::Reads::input>(x);
}
/// Elephant activation 1 / (1 + |x / a|^d) (Lan & Mahmood 2023); a > 0, d > 0.
template <Real T>
Tensor<T> elephant(const Tensor<T>& x, T a = T{1}, T d = T{4}) {
    check(a > T{0} && d > T{0}, "elephant: a and d must be positive, got a=", a, " d=", d);
    return detail::unary_rule_op<math::rules::elephant, op::elephant, detail::Reads::both>(x, {double(a), double(d)}, {.a = double(a), .d = double(d)});
}

/// Fused element-wise map into an existing tensor, not recorded on the tape:
/// out[i] = f(in0[i], in1[i], ...), one pass over memory for a whole chain of maths. Reusing `out`
/// across calls avoids the page faults of a fresh large allocation (the fastest form in a loop).
/// `out` may alias an input. All shapes must be equal.
template <Real T, class F, class... Rest>
void map_into(Tensor<T>& out, F f, const Tensor<T>& first, const Rest&... rest) {
    backend::op_scope on("map", out, first, rest...);
    auto same = [&](const Shape& s, std::string_view what) {
        if (s != first.shape())
            throw shape_error(detail::concat("map: ", what, " of shape ", to_string(s), " differs from the first input's ",
                                             to_string(first.shape())));
    };
    (same(rest.shape(), "an input"), ...);
    same(out.shape(), "the output");
    backend::map(first.size(), out.data(), f, first.data(), rest.data()...);
}

/// Fused element-wise map into a new tensor (see `map_into`).
template <Real T, class F, class... Rest>
Tensor<T> map(F f, const Tensor<T>& first, const Rest&... rest) {
    backend::op_scope on("map", first, rest...);
    auto out = Tensor<T>::uninitialized(first.shape());
    map_into(out, f, first, rest...);
    return out;
}

// ---- the keys of the element-wise ops' lowering rules (their rules: olmax/trace/rules.hpp) ------

namespace op {

/// An element-wise op of one input without attributes, sampled in [K::lo, K::hi).
template <class K>
struct elementwise_unary : registered<K> {
    struct attrs {};
    static std::vector<sample<attrs>> samples(Generator& rng) { return samples::unary<attrs>(rng, K::lo, K::hi); }
};

/// A broadcasting element-wise op of two inputs (the second from `second_input`).
template <class K>
struct elementwise_binary : registered<K> {
    struct attrs {};
    static Tensor<float> second_input(Generator& rng, const Shape& shape) { return samples::uniform(rng, shape); }
    static std::vector<sample<attrs>> samples(Generator& rng) {
        return samples::binary<attrs>(rng, [](Generator& r, const Shape& s) { return K::second_input(r, s); });
    }
};

struct add : elementwise_binary<add> {
    static constexpr std::string_view name = "add";
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) { return olmax::add(in[0], in[1]); }
};
struct sub : elementwise_binary<sub> {
    static constexpr std::string_view name = "sub";
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) { return olmax::sub(in[0], in[1]); }
};
struct mul : elementwise_binary<mul> {
    static constexpr std::string_view name = "mul";
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) { return olmax::mul(in[0], in[1]); }
};
struct div : elementwise_binary<div> {
    static constexpr std::string_view name = "div";
    static Tensor<float> second_input(Generator& rng, const Shape& shape) { return samples::signed_away_from_zero(rng, shape); }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) { return olmax::div(in[0], in[1]); }
};
struct maximum : elementwise_binary<maximum> {
    static constexpr std::string_view name = "maximum";
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) { return olmax::maximum(in[0], in[1]); }
};
struct minimum : elementwise_binary<minimum> {
    static constexpr std::string_view name = "minimum";
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) { return olmax::minimum(in[0], in[1]); }
};

struct exp : elementwise_unary<exp> {
    static constexpr std::string_view name = "exp";
    static constexpr float lo = -3, hi = 3;
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) { return olmax::exp(in[0]); }
};
struct log : elementwise_unary<log> {
    static constexpr std::string_view name = "log";
    static constexpr float lo = 0.25f, hi = 4;
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) { return olmax::log(in[0]); }
};
struct sqrt : elementwise_unary<sqrt> {
    static constexpr std::string_view name = "sqrt";
    static constexpr float lo = 0.25f, hi = 4;
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) { return olmax::sqrt(in[0]); }
};
struct rsqrt : elementwise_unary<rsqrt> {
    static constexpr std::string_view name = "rsqrt";
    static constexpr float lo = 0.25f, hi = 4;
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) { return olmax::rsqrt(in[0]); }
};
struct square : elementwise_unary<square> {
    static constexpr std::string_view name = "square";
    static constexpr float lo = -2, hi = 2;
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) { return olmax::square(in[0]); }
};
struct tanh : elementwise_unary<tanh> {
    static constexpr std::string_view name = "tanh";
    static constexpr float lo = -3, hi = 3;
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) { return olmax::tanh(in[0]); }
};
struct sigmoid : elementwise_unary<sigmoid> {
    static constexpr std::string_view name = "sigmoid";
    static constexpr float lo = -6, hi = 6;
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) { return olmax::sigmoid(in[0]); }
};
struct relu : elementwise_unary<relu> {
    static constexpr std::string_view name = "relu";
    static constexpr float lo = -2, hi = 2;
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) { return olmax::relu(in[0]); }
};
/// Samples with zeros among the values (and -0.0), none differentiated.
struct nonzero : registered<nonzero> {
    static constexpr std::string_view name = "nonzero";
    struct attrs {};
    static std::vector<sample<attrs>> samples(Generator& rng) {
        std::vector<sample<attrs>> out;
        for (const Shape& shape : {Shape{7}, Shape{3, 4}}) {
            Tensor<float> x = samples::signed_away_from_zero(rng, shape);
            const Tensor<float> keep = samples::bits(rng, shape, 0.5);
            for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] *= keep.data()[i];  // +-0.0 where not kept
            x.data()[0] = 0.0f, x.data()[1] = 2.5f;
            out.push_back({{x}, {}, {0}});
        }
        return out;
    }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) { return olmax::nonzero(in[0]); }
};
struct hard_sigmoid : elementwise_unary<hard_sigmoid> {
    static constexpr std::string_view name = "hard_sigmoid";
    static constexpr float lo = -5, hi = 5;  // both clipped ends and the slope between
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) { return olmax::hard_sigmoid(in[0]); }
};
struct silu : elementwise_unary<silu> {
    static constexpr std::string_view name = "silu";
    static constexpr float lo = -5, hi = 5;
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) { return olmax::silu(in[0]); }
};
struct softplus : elementwise_unary<softplus> {
    static constexpr std::string_view name = "softplus";
    static constexpr float lo = -30, hi = 30;  // where exp(x) under- and overflows in float
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) { return olmax::softplus(in[0]); }
};
struct abs : elementwise_unary<abs> {
    static constexpr std::string_view name = "abs";
    static constexpr float lo = -2, hi = 2;
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) { return olmax::abs(in[0]); }
};
struct mish : elementwise_unary<mish> {
    static constexpr std::string_view name = "mish";
    static constexpr float lo = -5, hi = 5;
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) { return olmax::mish(in[0]); }
};
struct gelu : elementwise_unary<gelu> {
    static constexpr std::string_view name = "gelu";
    static constexpr float lo = -5, hi = 5;
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) { return olmax::gelu(in[0]); }
};
/// 1 / (1 + |x / a|^d), a > 0, d > 0.
struct elephant : registered<elephant> {
    static constexpr std::string_view name = "elephant";
    struct attrs {
        double a = 1, d = 4;
    };
    static std::vector<sample<attrs>> samples(Generator& rng) {
        auto out = samples::unary<attrs>(rng, -3, 3, {1, 4});
        for (const attrs a : {attrs{0.5, 2}, attrs{1.5, 3.5}, attrs{2, 0.75}}) out.push_back({{samples::uniform(rng, {3, 4}, -3, 3)}, a});
        return out;
    }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) {
        return olmax::elephant(in[0], T(a.a), T(a.d));
    }
};

/// x + value.
struct add_scalar : registered<add_scalar> {
    static constexpr std::string_view name = "add_scalar";
    struct attrs {
        double value = 0;
    };
    static std::vector<sample<attrs>> samples(Generator& rng) { return samples::unary<attrs>(rng, -2, 2, {-1.25}); }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) { return olmax::add_scalar(in[0], T(a.value)); }
};
/// x * factor.
struct scale : registered<scale> {
    static constexpr std::string_view name = "scale";
    struct attrs {
        double factor = 1;
    };
    static std::vector<sample<attrs>> samples(Generator& rng) { return samples::unary<attrs>(rng, -2, 2, {-0.375}); }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) { return olmax::scale(in[0], T(a.factor)); }
};
/// x where x >= 0, else slope * x.
struct leaky_relu : registered<leaky_relu> {
    static constexpr std::string_view name = "leaky_relu";
    struct attrs {
        double slope = 0.01;
    };
    static std::vector<sample<attrs>> samples(Generator& rng) { return samples::unary<attrs>(rng, -2, 2, {0.125}); }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) { return olmax::leaky_relu(in[0], T(a.slope)); }
};
/// x limited to [lo, hi].
struct clamp : registered<clamp> {
    static constexpr std::string_view name = "clamp";
    struct attrs {
        double lo = 0, hi = 1;
    };
    static std::vector<sample<attrs>> samples(Generator& rng) {
        auto out = samples::unary<attrs>(rng, -2, 2, {-0.625, 0.75});
        out.push_back({{samples::uniform(rng, {3, 4}, -2, 2)}, attrs{0, std::numeric_limits<double>::infinity()}});
        return out;
    }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) { return olmax::clamp(in[0], T(a.lo), T(a.hi)); }
};

}  // namespace op

}  // namespace olmax
