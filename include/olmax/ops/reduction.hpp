#pragma once
// Reductions over axes: sum, mean, max; all differentiable.

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/op_keys.hpp"
#include "olmax/ops/shape.hpp"

namespace olmax {

namespace detail {

inline Shape reduced_shape(const Shape& s, std::size_t axis, bool keepdims) {
    Shape out;
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (i != axis) out.push_back(s[i]);
        else if (keepdims) out.push_back(1);
    }
    return out;
}

/// Sorted, unique, non-negative axes; empty input means every axis.
inline std::vector<std::size_t> resolve_axes(std::vector<long> axes, std::size_t rank, std::string_view op) {
    std::vector<std::size_t> out;
    if (axes.empty())
        for (std::size_t i = 0; i < rank; ++i) out.push_back(i);
    for (long a : axes) out.push_back(normalize_axis(a, rank, op));
    std::sort(out.begin(), out.end());
    if (std::adjacent_find(out.begin(), out.end()) != out.end()) throw shape_error(concat(op, ": an axis is repeated"));
    return out;
}

/// (outer, n, inner) around the run of axes [first, first + count): n is the product of the run.
inline AxisSplit split_run(const Shape& s, std::size_t first, std::size_t count) {
    AxisSplit r;
    r.n = 1;
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (i < first) r.outer *= s[i];
        else if (i < first + count) r.n *= s[i];
        else r.inner *= s[i];
    }
    return r;
}

/// `s` with the axes [first, first + count) set to 1 (keepdims) or removed.
inline Shape reduced_run_shape(const Shape& s, std::size_t first, std::size_t count, bool keepdims) {
    Shape out;
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (i < first || i >= first + count) out.push_back(s[i]);
        else if (keepdims) out.push_back(1);
    }
    return out;
}

/// Sum over the consecutive axes [first, first + count) (forward only); accumulates in double.
template <Real T>
Tensor<T> sum_run_values(const Tensor<T>& x, std::size_t first, std::size_t count, bool keepdims) {
    const auto sp = split_run(x.shape(), first, count);
    Tensor<T> out(reduced_run_shape(x.shape(), first, count, keepdims));
    sum_middle_axis(x.data(), out.data(), sp.outer, sp.n, sp.inner);
    return out;
}

/// Sum over one axis (forward only); accumulates in double.
template <Real T>
Tensor<T> sum_axis_values(const Tensor<T>& x, std::size_t axis, bool keepdims) {
    return sum_run_values(x, axis, 1, keepdims);
}

/// Copies `g` (shape with the run [first, first + count) of extent 1 or removed) along the run
/// back to `shape`, times `factor`. Rows of the result are spread over threads.
template <Real T>
Tensor<T> expand_run(const Tensor<T>& g, const Shape& shape, std::size_t first, std::size_t count, T factor) {
    const auto sp = split_run(shape, first, count);
    auto out = Tensor<T>::uninitialized(shape);
    const T* gp = g.data();
    T* op = out.data();
    if (sp.inner == 1) {  // rows of one element (e.g. the gradient of a full sum): fill runs of n
        backend::current().parallel_for(sp.outer * sp.n, 1, [&](std::size_t lo, std::size_t hi) {
            for (std::size_t row = lo; row < hi;) {
                const std::size_t o = row / sp.n, stop = std::min(hi, (o + 1) * sp.n);
                std::fill(op + row, op + stop, T(gp[o] * factor));
                row = stop;
            }
        });
        return out;
    }
    backend::current().parallel_for(sp.outer * sp.n, sp.inner, [&](std::size_t lo, std::size_t hi) {
        const std::size_t n = sp.n, inner = sp.inner;  // locals: stores to dst cannot change them
        const T scale = factor;
        for (std::size_t row = lo; row < hi; ++row) {
            const T* src = gp + (row / n) * inner;
            T* dst = op + row * inner;
#pragma omp simd
            for (std::size_t i = 0; i < inner; ++i) dst[i] = src[i] * scale;
        }
    });
    return out;
}

/// Copies `g` (shape with the reduced axis of extent 1 or removed) along `axis` back to `shape`, times `factor`.
template <Real T>
Tensor<T> expand_along(const Tensor<T>& g, const Shape& shape, std::size_t axis, T factor) {
    return expand_run(g, shape, axis, 1, factor);
}

/// One recorded reduction over the consecutive axes [first, first + count), times `factor`.
template <Real T>
Tensor<T> sum_run(const Tensor<T>& x, std::size_t first, std::size_t count, bool keepdims, T factor, std::string_view name) {
    Tensor<T> y = sum_run_values(x, first, count, keepdims);
    if (factor != T{1}) backend::map(y.size(), y.data(), [factor](T v) { return v * factor; }, y.data());
    autodiff::record<T>(name, std::span<const Tensor<T>>(&x, 1), std::span<Tensor<T>>(&y, 1),
                        [shape = x.shape(), first, count, factor](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                            sink.add(0, expand_run(g[0], shape, first, count, factor));
                        });
    return y;
}

template <Real T>
Tensor<T> sum_one_axis(const Tensor<T>& x, std::size_t axis, bool keepdims, T factor, std::string_view name) {
    return sum_run(x, axis, 1, keepdims, factor, name);
}

/// A reduction's attributes for its lowering rule: keepdims (0 or 1), then the reduced axes (every
/// axis when `axes` is empty).
/// The axes a traced sum or mean reduces: `axes`, or every axis when it is empty.
inline std::vector<std::size_t> traced_axes(const std::vector<std::size_t>& axes, std::size_t rank) {
    if (!axes.empty()) return axes;
    std::vector<std::size_t> all(rank);
    for (std::size_t a = 0; a < rank; ++a) all[a] = a;
    return all;
}

/// Sum (mean when `average`) over sorted unique `axes`: each run of consecutive axes is one pass
/// (all axes of a contiguous tensor: a single reduction over the buffer), last run first so the
/// axis numbers of earlier runs stay valid when the reduced axes are dropped.
template <Real T>
Tensor<T> reduce_runs(const Tensor<T>& x, const std::vector<std::size_t>& axes, bool keepdims, bool average, std::string_view name) {
    Tensor<T> y = x;
    for (std::size_t end = axes.size(); end > 0;) {
        std::size_t begin = end - 1;
        while (begin > 0 && axes[begin - 1] + 1 == axes[begin]) --begin;
        const std::size_t first = axes[begin], count = end - begin;
        T factor{1};
        if (average) {
            const std::size_t n = split_run(y.shape(), first, count).n;
            factor = n ? T{1} / T(n) : std::numeric_limits<T>::quiet_NaN();
        }
        y = sum_run(y, first, count, keepdims, factor, name);
        end = begin;
    }
    return y;
}

}  // namespace detail

/// Sum over `axes` (all axes when empty). `keepdims` keeps reduced axes with extent 1.
template <Real T>
Tensor<T> sum(const Tensor<T>& x, std::vector<long> axes = {}, bool keepdims = false) {
    backend::op_scope on("sum", x);
    const auto ax = detail::resolve_axes(std::move(axes), x.rank(), "sum");
    return on.run<op::sum>({x}, {.axes = detail::traced_axes(ax, x.rank()), .keepdims = keepdims}, [&] {
        if (ax.empty()) return detail::unary_op<op::sum, detail::Reads::nothing>(x, [](T v) { return v; }, [](T, T) { return T{1}; });  // rank-0 input
        return detail::reduce_runs(x, ax, keepdims, /*average=*/false, "sum");
    });
}

/// `x` summed down to `shape`, a shape it broadcasts from (NumPy's rules: axes added in front,
/// extent-1 axes stretched), like PyTorch's `sum_to_size`. What a custom backward returns for an
/// input that was broadcast: the gradient must have the input's shape (docs/GUIDE.md section 3).
/// Differentiable, and traced like `sum`.
template <Real T>
Tensor<T> sum_to_size(const Tensor<T>& x, const Shape& shape) {
    if (x.shape() == shape) return x;
    const std::size_t rank = x.rank();
    bool broadcasts = shape.size() <= rank;
    std::vector<long> axes;
    for (std::size_t i = 0; broadcasts && i < rank; ++i) {
        const std::size_t lead = rank - shape.size(), target = i < lead ? 1 : shape[i - lead];
        if (target != 1 && target != x.extent(i)) broadcasts = false;
        else if (target == 1 && x.extent(i) != 1) axes.push_back(long(i));
    }
    check<shape_error>(broadcasts, "sum_to_size: shape ", to_string(x.shape()), " does not broadcast from ", to_string(shape));
    return reshape(axes.empty() ? x : sum(x, std::move(axes), /*keepdims=*/true), shape);
}

/// Mean over `axes` (all axes when empty). The mean of zero elements is NaN, as in NumPy.
template <Real T>
Tensor<T> mean(const Tensor<T>& x, std::vector<long> axes = {}, bool keepdims = false) {
    backend::op_scope on("mean", x);
    const auto ax = detail::resolve_axes(std::move(axes), x.rank(), "mean");
    return on.run<op::mean>({x}, {.axes = detail::traced_axes(ax, x.rank()), .keepdims = keepdims}, [&] {
        if (ax.empty()) return detail::unary_op<op::mean, detail::Reads::nothing>(x, [](T v) { return v; }, [](T, T) { return T{1}; });
        return detail::reduce_runs(x, ax, keepdims, /*average=*/true, "mean");
    });
}

/// Maximum along one axis; the gradient flows to the first maximal element. NaN propagates.
/// Throws `shape_error` on a zero-length axis (the maximum of nothing is undefined).
template <Real T>
Tensor<T> max(const Tensor<T>& x, long axis = -1, bool keepdims = false) {
    backend::op_scope on("max", x);
    const std::size_t a = normalize_axis(axis, x.rank(), "max");
    const auto sp = detail::split_at(x.shape(), a);
    check<shape_error>(sp.n > 0, "max: axis ", axis, " of shape ", to_string(x.shape()), " has length 0");
    return on.run<op::max>({x}, {.axis = a, .keepdims = keepdims}, [&] {
        auto y = Tensor<T>::uninitialized(detail::reduced_shape(x.shape(), a, keepdims));
        std::vector<std::size_t> arg(sp.outer * sp.inner);
        const T* xp = x.data();
        T* yp = y.data();
        backend::current().parallel_for(arg.size(), sp.n, [&](std::size_t lo, std::size_t hi) {
            for (std::size_t r = lo; r < hi; ++r) {
                const std::size_t o = r / sp.inner, i = r % sp.inner;
                std::size_t best = 0;
                T bv = xp[o * sp.n * sp.inner + i];
                for (std::size_t k = 1; k < sp.n && !std::isnan(bv); ++k) {
                    const T v = xp[(o * sp.n + k) * sp.inner + i];
                    if (v > bv || std::isnan(v)) bv = v, best = k;
                }
                yp[r] = bv;
                arg[r] = best;
            }
        });
        autodiff::record<T>("max", std::span<const Tensor<T>>(&x, 1), std::span<Tensor<T>>(&y, 1),
                            [shape = x.shape(), sp, arg = std::move(arg)](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                                Tensor<T> dx(shape);
                                for (std::size_t r = 0; r < arg.size(); ++r) {
                                    const std::size_t o = r / sp.inner, i = r % sp.inner;
                                    dx.data()[(o * sp.n + arg[r]) * sp.inner + i] += g[0].data()[r];
                                }
                                sink.add(0, std::move(dx));
                            });
        return y;
    });
}

namespace op {

/// The sum or mean over `axes` (increasing; empty only for a rank-0 input), `keepdims` keeping them
/// with extent 1.
template <class K>
struct reduction : registered<K> {
    struct attrs {
        std::vector<std::size_t> axes{};
        bool keepdims = false;
    };
    static std::vector<sample<attrs>> samples(Generator& rng) {
        const Tensor<float> x = samples::uniform(rng, {2, 3, 4});
        return {{{x}, {{1}, false}}, {{x}, {{0, 2}, true}}, {{x}, {{0, 1, 2}, false}}, {{x}, {{2}, true}},
                {{samples::uniform(rng, {})}, {{}, false}}};
    }
    static std::vector<long> axes_of(const attrs& a) { return std::vector<long>(a.axes.begin(), a.axes.end()); }
};
struct sum : reduction<sum> {
    static constexpr std::string_view name = "sum";
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) {
        return olmax::sum(in[0], axes_of(a), a.keepdims);
    }
};
struct mean : reduction<mean> {
    static constexpr std::string_view name = "mean";
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) {
        return olmax::mean(in[0], axes_of(a), a.keepdims);
    }
};
/// The maximum over one axis (non-negative); the gradient goes to the first maximal element.
struct max : registered<max> {
    static constexpr std::string_view name = "max";
    struct attrs {
        std::size_t axis = 0;
        bool keepdims = false;
    };
    static std::vector<sample<attrs>> samples(Generator& rng) {
        const Tensor<float> x = samples::uniform(rng, {2, 3, 4});
        Tensor<float> ties({2, 5}, 0.5f);  // ties: the first maximum takes the gradient
        ties.data()[1] = ties.data()[3] = ties.data()[7] = 1.25f;
        return {{{x}, {0, false}}, {{x}, {1, true}}, {{x}, {2, false}}, {{samples::uniform(rng, {5})}, {0, false}}, {{ties}, {1, false}},
                {{ties}, {0, true}}};
    }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) {
        return olmax::max(in[0], long(a.axis), a.keepdims);
    }
};

}  // namespace op

}  // namespace olmax
