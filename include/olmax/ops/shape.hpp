#pragma once
// Shape ops: reshape, transpose (any permutation), slice, concat and constant pad; all
// differentiable. Every op except reshape copies into a fresh contiguous tensor.

#include <algorithm>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>
#include <span>
#include <utility>
#include <type_traits>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/ops/op_keys.hpp"

namespace olmax {

namespace detail::shape_ops {

/// A tensor handle over `t`'s buffer (same storage and offset) with another shape of the same size.
template <Scalar T>
Tensor<T> share_storage(const Tensor<T>& t, const Shape& shape) {
    return olmax::detail::TensorAccess<T>::alias(t, 0, shape);
}


/// For every outer index, copies `count` slabs of `inner` elements along the axis from
/// src[o, src_begin + j] to dst[o, dst_begin + j]; `src_n`/`dst_n` are the axis extents.
template <class T>
void copy_along_axis(const T* src, std::size_t src_n, std::size_t src_begin, T* dst, std::size_t dst_n, std::size_t dst_begin,
                     std::size_t count, std::size_t outer, std::size_t inner) {
    const std::size_t block = count * inner;
    if (block == 0) return;
    backend::current().parallel_for(outer, block, [&](std::size_t lo, std::size_t hi) {
        for (std::size_t o = lo; o < hi; ++o)
            std::copy_n(src + (o * src_n + src_begin) * inner, block, dst + (o * dst_n + dst_begin) * inner);
    });
}

/// dst (of shape in_shape permuted by perm) = src with its axes permuted: dst axis i is src axis perm[i].
/// When the last axes differ (a real transpose), the copy goes in square tiles of the two
/// contiguous axes (dst's last, src's last) so both sides stay in cache; otherwise rows are copied.
template <class T>
void permute_copy(const T* src, const Shape& in_shape, const std::vector<std::size_t>& perm, T* dst) {
    const std::size_t rank = in_shape.size();
    const std::size_t total = numel(in_shape);
    if (total == 0) return;
    if (rank == 0) {
        dst[0] = src[0];
        return;
    }
    const Shape in_strides = row_major_strides(in_shape);
    Shape out_shape(rank), stride(rank);  // stride[i]: step in src per step along dst axis i
    for (std::size_t i = 0; i < rank; ++i) {
        out_shape[i] = in_shape[perm[i]];
        stride[i] = in_strides[perm[i]];
    }
    const Shape out_strides = row_major_strides(out_shape);
    const std::size_t last = rank - 1;
    const std::size_t q =
        static_cast<std::size_t>(std::find(perm.begin(), perm.end(), last) - perm.begin());  // dst axis that is src's last
    if (q == last) {  // rows stay contiguous on both sides
        const std::size_t inner = out_shape[last];
        backend::current().parallel_for(total / inner, inner, [&](std::size_t lo, std::size_t hi) {
            for (std::size_t row = lo; row < hi; ++row) {
                std::size_t rem = row, base = 0;
                for (std::size_t axis = last; axis-- > 0;) {
                    base += (rem % out_shape[axis]) * stride[axis];
                    rem /= out_shape[axis];
                }
                std::copy_n(src + base, inner, dst + row * inner);
            }
        });
        return;
    }
    constexpr std::size_t tile = 16;  // 16x16 measured best of 8/16/32 on 512^2 and 2048^2 floats
    const std::size_t nq = out_shape[q], nl = out_shape[last], sl = stride[last], oq = out_strides[q];
    const std::size_t tiles_q = (nq + tile - 1) / tile, planes = total / (nq * nl);
    backend::current().parallel_for(planes * tiles_q, tile * nl, [&](std::size_t lo, std::size_t hi) {
        for (std::size_t item = lo; item < hi; ++item) {
            const std::size_t plane = item / tiles_q, a0 = (item % tiles_q) * tile, a1 = std::min(nq, a0 + tile);
            std::size_t rem = plane, in_base = 0, out_base = 0;  // offsets of the plane: every dst axis but q and last
            for (std::size_t axis = last; axis-- > 0;) {
                if (axis == q) continue;
                const std::size_t idx = rem % out_shape[axis];
                rem /= out_shape[axis];
                in_base += idx * stride[axis];
                out_base += idx * out_strides[axis];
            }
            for (std::size_t b0 = 0; b0 < nl; b0 += tile) {
                const std::size_t b1 = std::min(nl, b0 + tile);
                for (std::size_t a = a0; a < a1; ++a)
                    for (std::size_t b = b0; b < b1; ++b) dst[out_base + a * oq + b] = src[in_base + a + b * sl];
            }
        }
    });
}

template <Real T, class F>
void record_unary(std::string_view name, const Tensor<T>& x, Tensor<T>& y, F&& backward) {
    autodiff::record<T>(name, std::span<const Tensor<T>>(&x, 1), std::span<Tensor<T>>(&y, 1), std::forward<F>(backward));
}

}  // namespace detail::shape_ops

/// The same elements in another shape of equal element count (no copy: the result shares `x`'s
/// buffer, so writing into one is seen through the other). The gradient is reshaped back. Integer
/// tensors (token ids) reshape too.
template <Scalar T>
Tensor<T> reshape(const Tensor<T>& x, Shape shape) {
    backend::op_scope on("reshape", x);
    if (!(numel(shape) == x.size()))
        throw shape_error(olmax::detail::concat("reshape: cannot reshape a tensor of shape ", to_string(x.shape()), " (", x.size(),
                                                " elements) to ", to_string(shape), " (", numel(shape), " elements)"));
    return on.run<op::reshape>({x}, {.shape = shape}, [&] {
        Tensor<T> y = detail::shape_ops::share_storage(x, shape);
        if constexpr (Real<T>)
            detail::shape_ops::record_unary("reshape", x, y, [in_shape = x.shape()](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                sink.add(0, detail::shape_ops::share_storage(g[0], in_shape));
            });
        return y;
    });
}

/// Permutes the axes: result axis i is `x`'s axis `perm[i]` (NumPy `transpose(x, perm)`); `perm`
/// must be a permutation of 0..rank-1. Copies into a contiguous tensor.
template <Real T>
Tensor<T> transpose(const Tensor<T>& x, std::vector<std::size_t> perm) {
    backend::op_scope on("transpose", x);
    const std::size_t rank = x.rank();
    std::vector<bool> seen(rank, false);
    bool valid = perm.size() == rank;
    for (std::size_t p : perm) {
        if (!valid) break;
        valid = p < rank && !seen[p];
        if (valid) seen[p] = true;
    }
    if (!valid) {
        std::string listed;
        for (std::size_t i = 0; i < perm.size(); ++i) listed += (i ? ", " : "") + std::to_string(perm[i]);
        throw shape_error(olmax::detail::concat("transpose: [", listed, "] is not a permutation of the axes of a tensor of shape ",
                                                to_string(x.shape())));
    }
    return on.run<op::transpose>({x}, {.perm = perm}, [&] {
        Shape out_shape(rank);
        for (std::size_t i = 0; i < rank; ++i) out_shape[i] = x.shape()[perm[i]];
        auto y = Tensor<T>::uninitialized(out_shape);
        detail::shape_ops::permute_copy(x.data(), x.shape(), perm, y.data());
        std::vector<std::size_t> inverse(rank);
        for (std::size_t i = 0; i < rank; ++i) inverse[perm[i]] = i;
        detail::shape_ops::record_unary("transpose", x, y,
                                        [inverse = std::move(inverse), out_shape, in_shape = x.shape()](std::span<const Tensor<T>> g,
                                                                                                        autodiff::GradientSink<T>& sink) {
                                            auto dx = Tensor<T>::uninitialized(in_shape);
                                            detail::shape_ops::permute_copy(g[0].data(), out_shape, inverse, dx.data());
                                            sink.add(0, std::move(dx));
                                        });
        return y;
    });
}

/// Swaps the last two axes (the matrix transpose, batched over leading axes); needs rank >= 2.
template <Real T>
Tensor<T> transpose(const Tensor<T>& x) {
    const std::size_t rank = x.rank();
    if (!(rank >= 2))
        throw shape_error(olmax::detail::concat("transpose: swapping the last two axes needs rank >= 2, got shape ", to_string(x.shape())));
    std::vector<std::size_t> perm(rank);
    for (std::size_t i = 0; i < rank; ++i) perm[i] = i;
    std::swap(perm[rank - 2], perm[rank - 1]);
    return transpose(x, std::move(perm));
}

/// A copy of elements [begin, end) along `axis` (negative counts from the back); needs
/// begin <= end <= extent. The gradient is zero outside the slice.
template <Real T>
Tensor<T> slice(const Tensor<T>& x, long axis, std::size_t begin, std::size_t end) {
    backend::op_scope on("slice", x);
    const std::size_t a = normalize_axis(axis, x.rank(), "slice");
    const auto lay = olmax::detail::split_at(x.shape(), a);
    if (!(begin <= end && end <= lay.n))
        throw shape_error(olmax::detail::concat("slice: range [", begin, ", ", end, ") along axis ", axis, " of shape ",
                                                to_string(x.shape()), " is not within [0, ", lay.n, "] with begin <= end"));
    return on.run<op::slice>({x}, {.axis = a, .begin = begin, .end = end}, [&] {
        Shape out_shape = x.shape();
        out_shape[a] = end - begin;
        auto y = Tensor<T>::uninitialized(out_shape);
        detail::shape_ops::copy_along_axis(x.data(), lay.n, begin, y.data(), end - begin, 0, end - begin, lay.outer, lay.inner);
        detail::shape_ops::record_unary(
            "slice", x, y, [lay, begin, end](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                // one run of the slice's extent per outer index, into the input's gradient in place
                sink.add_strided(0, g[0], begin * lay.inner, (end - begin) * lay.inner, lay.n * lay.inner);
            });
        return y;
    });
}

/// Joins tensors along `axis`; all must have the same rank and equal extents on the other axes.
template <Real T>
Tensor<T> concat(const std::vector<Tensor<T>>& xs, long axis) {
    backend::op_scope on("concat", xs);
    check<value_error>(!xs.empty(), "concat: needs at least one tensor");
    const Shape& first = xs[0].shape();
    const std::size_t a = normalize_axis(axis, first.size(), "concat");
    Shape out_shape = first;
    out_shape[a] = 0;
    for (std::size_t i = 0; i < xs.size(); ++i) {
        const Shape& s = xs[i].shape();
        bool fits = s.size() == first.size();
        for (std::size_t d = 0; fits && d < s.size(); ++d) fits = d == a || s[d] == first[d];
        if (!fits)
            throw shape_error(olmax::detail::concat("concat: along axis ", axis, " tensor ", i, " of shape ", to_string(s),
                                                    " does not match tensor 0 of shape ", to_string(first)));
        out_shape[a] += s[a];
    }
    return on.run<op::concat>(xs, {.axis = a}, [&] {
        auto y = Tensor<T>::uninitialized(out_shape);
        const auto lay = olmax::detail::split_at(out_shape, a);
        std::vector<std::size_t> offsets;  // start of each input along the axis
        std::size_t at = 0;
        for (const auto& x : xs) {
            offsets.push_back(at);
            const std::size_t n = x.shape()[a];
            detail::shape_ops::copy_along_axis(x.data(), n, 0, y.data(), lay.n, at, n, lay.outer, lay.inner);
            at += n;
        }
        std::vector<Shape> shapes;
        for (const auto& x : xs) shapes.push_back(x.shape());
        autodiff::record<T>(
            "concat", std::span<const Tensor<T>>(xs), std::span<Tensor<T>>(&y, 1),
            [lay, a, offsets = std::move(offsets), shapes = std::move(shapes)](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                for (std::size_t i = 0; i < shapes.size(); ++i) {
                    if (!sink.needs(i)) continue;
                    const std::size_t n = shapes[i][a];
                    auto dx = Tensor<T>::uninitialized(shapes[i]);
                    detail::shape_ops::copy_along_axis(g[0].data(), lay.n, offsets[i], dx.data(), n, 0, n, lay.outer, lay.inner);
                    sink.add(i, std::move(dx));
                }
            });
        return y;
    });
}

/// `concat({a, b, c}, axis)` with the element type deduced from a braced list.
template <Real T>
Tensor<T> concat(std::initializer_list<Tensor<T>> xs, long axis) {
    return concat(std::vector<Tensor<T>>(xs), axis);
}

/// Adds `before` and `after` elements of constant `value` along `axis` (e.g. causal left padding
/// of a sequence). The gradient is the slice of the output gradient over the original elements.
template <Real T>
Tensor<T> pad(const Tensor<T>& x, long axis, std::size_t before, std::size_t after, std::type_identity_t<T> value = 0) {
    backend::op_scope on("pad", x);
    const std::size_t a = normalize_axis(axis, x.rank(), "pad");
    return on.run<op::pad>({x}, {.axis = a, .before = before, .after = after, .value = double(value)}, [&] {
        const auto lay = olmax::detail::split_at(x.shape(), a);
        Shape out_shape = x.shape();
        out_shape[a] = lay.n + before + after;
        Tensor<T> y(out_shape, value);
        detail::shape_ops::copy_along_axis(x.data(), lay.n, 0, y.data(), out_shape[a], before, lay.n, lay.outer, lay.inner);
        detail::shape_ops::record_unary("pad", x, y, [lay, before, padded = out_shape[a], in_shape = x.shape()](std::span<const Tensor<T>> g,
                                                                                                           autodiff::GradientSink<T>& sink) {
            auto dx = Tensor<T>::uninitialized(in_shape);
            detail::shape_ops::copy_along_axis(g[0].data(), padded, before, dx.data(), lay.n, 0, lay.n, lay.outer, lay.inner);
            sink.add(0, std::move(dx));
        });
        return y;
    });
}

/// Stacks equal-shaped tensors along a new leading axis (a copy). Differentiable.
template <Real T>
Tensor<T> stack_leading(const std::vector<Tensor<T>>& parts) {
    check<shape_error>(!parts.empty(), "stack_leading: no tensors given");
    backend::op_scope on("stack_leading", parts);
    const Shape inner = parts[0].shape();
    for (const auto& p : parts)
        check<shape_error>(p.shape() == inner, "stack_leading: shapes ", to_string(inner), " and ", to_string(p.shape()), " differ");
    return on.run<op::stack_leading>(parts, {}, [&] {
        Shape shape(inner.size() + 1);  // [count, inner...]
        shape[0] = parts.size();
        std::copy(inner.begin(), inner.end(), shape.begin() + 1);
        auto out = Tensor<T>::uninitialized(shape);
        const std::size_t n = numel(inner);
        for (std::size_t i = 0; i < parts.size(); ++i) std::copy(parts[i].begin(), parts[i].end(), out.data() + i * n);
        autodiff::record<T>("stack_leading", std::span<const Tensor<T>>(parts), std::span<Tensor<T>>(&out, 1),
                            [count = parts.size(), inner, n](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                                for (std::size_t i = 0; i < count; ++i)
                                    if (sink.needs(i)) sink.add(i, olmax::detail::TensorAccess<T>::alias(g[0], i * n, inner));
                            });
        return out;
    });
}

// ---- the keys of the shape ops' lowering rules (their rules: olmax/trace/rules.hpp) ------------

namespace op {

struct reshape : registered<reshape> {
    static constexpr std::string_view name = "reshape";
    struct attrs {
        Shape shape{};
    };
    static std::vector<sample<attrs>> samples(Generator& rng) {
        const Tensor<float> x = samples::uniform(rng, {2, 3, 4});
        return {{{x}, {{4, 6}}}, {{x}, {{24}}}, {{x}, {{2, 1, 12}}}, {{samples::uniform(rng, {6})}, {{3, 2}}}};
    }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) { return olmax::reshape(in[0], a.shape); }
};
/// Result axis i is input axis perm[i].
struct transpose : registered<transpose> {
    static constexpr std::string_view name = "transpose";
    struct attrs {
        std::vector<std::size_t> perm{};
    };
    static std::vector<sample<attrs>> samples(Generator& rng) {
        const Tensor<float> x = samples::uniform(rng, {2, 3, 4});
        return {{{x}, {{2, 0, 1}}}, {{x}, {{1, 0, 2}}}, {{x}, {{0, 2, 1}}}, {{samples::uniform(rng, {3, 5})}, {{1, 0}}}};
    }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) { return olmax::transpose(in[0], a.perm); }
};
/// Elements [begin, end) along `axis` (non-negative).
struct slice : registered<slice> {
    static constexpr std::string_view name = "slice";
    struct attrs {
        std::size_t axis = 0, begin = 0, end = 0;
    };
    static std::vector<sample<attrs>> samples(Generator& rng) {
        return {{{samples::uniform(rng, {3, 5})}, {1, 1, 4}}, {{samples::uniform(rng, {4, 2, 3})}, {0, 2, 4}}, {{samples::uniform(rng, {2, 3, 4})}, {2, 0, 1}}};
    }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) {
        return olmax::slice(in[0], long(a.axis), a.begin, a.end);
    }
};
/// `before` and `after` elements of `value` added along `axis` (non-negative).
struct pad : registered<pad> {
    static constexpr std::string_view name = "pad";
    struct attrs {
        std::size_t axis = 0, before = 0, after = 0;
        double value = 0;
    };
    static std::vector<sample<attrs>> samples(Generator& rng) {
        return {{{samples::uniform(rng, {3, 4})}, {1, 2, 1, 0.0}}, {{samples::uniform(rng, {2, 3})}, {0, 0, 2, 1.5}},
                {{samples::uniform(rng, {2, 3, 2})}, {1, 1, 0, -0.25}}};
    }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) {
        return olmax::pad(in[0], long(a.axis), a.before, a.after, T(a.value));
    }
};
/// Its inputs joined along `axis` (non-negative); equal extents on the other axes.
struct concat : registered<concat> {
    static constexpr std::string_view name = "concat";
    struct attrs {
        std::size_t axis = 0;
    };
    static std::vector<sample<attrs>> samples(Generator& rng) {
        return {{{samples::uniform(rng, {2, 3}), samples::uniform(rng, {2, 1}), samples::uniform(rng, {2, 2})}, {1}},
                {{samples::uniform(rng, {1, 3, 2}), samples::uniform(rng, {3, 3, 2})}, {0}},
                {{samples::uniform(rng, {2, 2, 3}), samples::uniform(rng, {2, 2, 1})}, {2}},
                {{samples::uniform(rng, {4})}, {0}}};
    }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) {
        return olmax::concat(std::vector<Tensor<T>>(in.begin(), in.end()), long(a.axis));
    }
};
/// Its inputs (equal shapes) stacked along a new leading axis.
struct stack_leading : registered<stack_leading> {
    static constexpr std::string_view name = "stack_leading";
    struct attrs {};
    static std::vector<sample<attrs>> samples(Generator& rng) {
        return {{{samples::uniform(rng, {3})}}, {{samples::uniform(rng, {2, 3}), samples::uniform(rng, {2, 3}), samples::uniform(rng, {2, 3})}}};
    }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) {
        return olmax::stack_leading(std::vector<Tensor<T>>(in.begin(), in.end()));
    }
};

}  // namespace op

}  // namespace olmax
