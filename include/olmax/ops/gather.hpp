#pragma once
// Row gather and scatter-add along the leading axis, each the other's backward: the dispatch and
// combine steps of a sparse mixture of experts (nn::MoE), and the general form of `embedding`
// (which gathers table rows by token id but differentiates only the table).
//
//     gather_rows(x, rows)[m]      = x[rows[m]]                       x [N, ...] -> [M, ...]
//     scatter_rows(src, rows, n)[i] = sum_{m : rows[m] = i} src[m]     src [M, ...] -> [n, ...]
//
// An index may repeat (a token routed to two experts): the gather's backward and the scatter add
// the rows that share it. Threads own disjoint column ranges of the destination, so repeated
// indices never race and the sums are the same on any thread count.

#include <algorithm>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/backend/trace_rules.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/ops/op_keys.hpp"

namespace olmax {

namespace detail::gather_ops {

/// Checks that `rows` is 1-D, for op `op`.
inline void check_row_shape(std::string_view op, const Tensor<std::int32_t>& rows) {
    check<shape_error>(rows.defined() && rows.rank() == 1, op, ": rows must be a 1-D tensor of indices, got ",
                       rows.defined() ? to_string(rows.shape()) : std::string("an undefined tensor"));
}

/// Also every index in [0, n) (host indices only: a traced program's are its values, unchecked).
inline void check_rows(std::string_view op, const Tensor<std::int32_t>& rows, std::size_t n) {
    check_row_shape(op, rows);
    const std::int32_t* r = rows.data();
    for (std::size_t m = 0; m < rows.size(); ++m)
        check<value_error>(r[m] >= 0 && std::size_t(r[m]) < n, op, ": index ", r[m], " at position ", m, " is out of range [0, ", n, ")");
}

/// dst[m, :] = src[rows[m], :] for m in [0, count); rows of `inner` elements.
template <class T>
void gather(const T* src, const std::int32_t* rows, std::size_t count, std::size_t inner, T* dst) {
    backend::current().parallel_for(count, inner, [&](std::size_t lo, std::size_t hi) {
        for (std::size_t m = lo; m < hi; ++m) std::copy_n(src + std::size_t(rows[m]) * inner, inner, dst + m * inner);
    });
}

/// dst[rows[m], :] += src[m, :] for m in [0, count) (dst already holds its initial values). The
/// split is over columns, so each destination element is summed by one thread, in m order.
template <class T>
void scatter_add(const T* src, const std::int32_t* rows, std::size_t count, std::size_t inner, T* dst) {
    backend::current().parallel_for(inner, count, [&](std::size_t lo, std::size_t hi) {
        for (std::size_t m = 0; m < count; ++m) {
            T* d = dst + std::size_t(rows[m]) * inner;
            const T* s = src + m * inner;
#pragma omp simd
            for (std::size_t j = lo; j < hi; ++j) d[j] += s[j];
        }
    });
}

}  // namespace detail::gather_ops

/// Rows of `x` ([N, ...], rank >= 1) picked by `rows` (1-D [M], values in [0, N)): shape [M, ...].
/// Differentiable in `x` (scatter-add of the output gradient; repeated rows accumulate). An index
/// outside [0, N) throws `value_error` naming it.
template <Real T>
Tensor<T> gather_rows(const Tensor<T>& x, const Tensor<std::int32_t>& rows) {
    constexpr std::string_view op = "gather_rows";
    backend::op_scope on(op, x, rows);
    check<shape_error>(x.defined() && x.rank() >= 1, op, ": x must have a leading axis, got ",
                       x.defined() ? to_string(x.shape()) : std::string("an undefined tensor"));
    detail::gather_ops::check_row_shape(op, rows);
    return on.run<op::gather_rows>({x, rows}, {}, [&] {
        const std::size_t n = x.shape()[0], inner = n ? x.size() / n : 0;
        detail::gather_ops::check_rows(op, rows, n);
        Shape out_shape = x.shape();
        out_shape[0] = rows.size();
        auto y = Tensor<T>::uninitialized(out_shape);
        detail::gather_ops::gather(x.data(), rows.data(), rows.size(), inner, y.data());
        autodiff::record<T>(op, std::span<const Tensor<T>>(&x, 1), std::span<Tensor<T>>(&y, 1),
                            [rows, in_shape = x.shape(), inner](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                                if (!sink.needs(0)) return;
                                Tensor<T> dx(in_shape);
                                detail::gather_ops::scatter_add(g[0].data(), rows.data(), rows.size(), inner, dx.data());
                                sink.add(0, std::move(dx));
                            });
        return y;
    });
}

/// The adjoint of gather_rows: a [n, ...] tensor of zeros with row `rows[m]` increased by
/// `src[m]` for every m (`src` [M, ...], `rows` 1-D [M], values in [0, n)). Differentiable in
/// `src` (a gather of the output gradient). Rows no index names stay zero.
template <Real T>
Tensor<T> scatter_rows(const Tensor<T>& src, const Tensor<std::int32_t>& rows, std::size_t n) {
    constexpr std::string_view op = "scatter_rows";
    backend::op_scope on(op, src, rows);
    check<shape_error>(src.defined() && src.rank() >= 1 && rows.defined() && rows.rank() == 1 && rows.size() == src.shape()[0], op,
                       ": src [M, ...] and rows [M] must agree on M, got ",
                       src.defined() ? to_string(src.shape()) : std::string("an undefined tensor"), " and ",
                       rows.defined() ? to_string(rows.shape()) : std::string("an undefined tensor"));
    return on.run<op::scatter_rows>({src, rows}, {.rows = n}, [&] {
        detail::gather_ops::check_rows(op, rows, n);
        const std::size_t count = src.shape()[0];
        Shape out_shape = src.shape();
        out_shape[0] = n;
        const std::size_t inner = numel(out_shape) / std::max<std::size_t>(n, 1);
        Tensor<T> y(out_shape);
        if (n) detail::gather_ops::scatter_add(src.data(), rows.data(), count, inner, y.data());
        autodiff::record<T>(op, std::span<const Tensor<T>>(&src, 1), std::span<Tensor<T>>(&y, 1),
                            [rows, src_shape = src.shape(), inner](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                                if (!sink.needs(0)) return;
                                auto dsrc = Tensor<T>::uninitialized(src_shape);
                                detail::gather_ops::gather(g[0].data(), rows.data(), rows.size(), inner, dsrc.data());
                                sink.add(0, std::move(dsrc));
                            });
        return y;
    });
}

// ---- the keys of the row gathers' lowering rules (their rules: olmax/trace/rules.hpp) ----------

namespace op {

/// x [R, ...] and rows [M] (row numbers as values): x's rows [M, ...].
struct gather_rows : registered<gather_rows> {
    static constexpr std::string_view name = "gather_rows";
    struct attrs {};
    static std::vector<sample<attrs>> samples(Generator& rng) {
        return {{{samples::uniform(rng, {5, 3}), samples::indices(rng, {7}, 5)}, {}, {1}},  // rows repeat
                {{samples::uniform(rng, {4, 2, 3}), samples::indices(rng, {3}, 4)}, {}, {1}}};
    }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) {
        return olmax::gather_rows(in[0], backend::trace::as_indices(in[1]));
    }
};
/// src [M, ...] added into `rows` zero rows at rows [M] (row numbers as values).
struct scatter_rows : registered<scatter_rows> {
    static constexpr std::string_view name = "scatter_rows";
    struct attrs {
        std::size_t rows = 0;
    };
    static std::vector<sample<attrs>> samples(Generator& rng) {
        return {{{samples::uniform(rng, {7, 3}), samples::indices(rng, {7}, 4)}, {4}, {1}},  // rows repeat; some stay zero
                {{samples::uniform(rng, {3, 2, 2}), samples::indices(rng, {3}, 5)}, {5}, {1}}};
    }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) {
        return olmax::scatter_rows(in[0], backend::trace::as_indices(in[1]), a.rows);
    }
};

}  // namespace op

}  // namespace olmax
