#pragma once
// Rows of a matrix by index (an embedding's lookup) and its adjoint, the scatter-add of rows.
// Indices are f32 values holding integers, as all of a program's values are f32 (exact below 2^24).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/xla/graph/ir.hpp"

namespace olmax::xla::graph {

namespace prim {

/// out[m, :] = x[rows[m], :] for x [R, W] and rows [M] in [0, R). The gradient is scatter_add_rows;
/// the indices get none.
struct gather_rows {
    static constexpr std::string_view name = "gather_rows";
    static constexpr bool saved_by_kept_layers = true;
    static var make(const var& x, const var& rows) {
        detail::require_f32(name, x);
        check<graph_error>(x.type().rank() == 2 && rows.type().rank() == 1 && rows.type().elem == element::f32 && x.dims()[0] < (std::int64_t{1} << 24),
                           "xla::graph: gather_rows takes x [R, W] (R < 2^24) and rows [M], got ", x.type().str(), " and ", rows.type().str());
        return detail::make<gather_rows>({x, rows}, f32({rows.dims()[0], x.dims()[1]}));
    }
    static value emit(function_builder& b, const node&, const std::vector<value>& in) {
        return b.gather_rows(in[0], b.convert(in[1], element::i32));
    }
    static void evaluate(const node&, const std::vector<const host_value*>& in, host_value& out) {  // an index out of range is clamped, as StableHLO's gather does
        const std::size_t width = std::size_t(out.type.dims[1]), rows = std::size_t(in[0]->type.dims[0]);
        for (std::size_t m = 0; m < std::size_t(out.type.dims[0]); ++m) {
            const double at = std::clamp(in[1]->data[m], 0.0, double(rows) - 1);
            for (std::size_t w = 0; w < width; ++w) out.data[m * width + w] = in[0]->data[std::size_t(at) * width + w];
        }
    }
    static void gradient(vjp& v);  // a scatter_add_rows, below
};

/// out [count, W]: zeros with src[m, :] added to row rows[m] for every m (src [M, W], rows [M] as in
/// gather_rows; repeated rows accumulate; `axis`: count). The gradient is gather_rows.
struct scatter_add_rows {
    static constexpr std::string_view name = "scatter_add_rows";
    static constexpr bool saved_by_kept_layers = true;
    static var make(const var& src, const var& rows, std::int64_t count) {
        detail::require_f32(name, src);
        check<graph_error>(src.type().rank() == 2 && rows.type().rank() == 1 && rows.dims()[0] == src.dims()[0] && count >= 0 &&
                               count < (std::int64_t{1} << 24),
                           "xla::graph: scatter_add_rows takes src [M, W] and rows [M] into 0 <= count < 2^24 rows, got ", src.type().str(), ", ",
                           rows.type().str(), " and ", count);
        node n = detail::make_node<scatter_add_rows>({src, rows}, f32({count, src.dims()[1]}));
        n.axis = count;
        return detail::commit(std::move(n));
    }
    static value emit(function_builder& b, const node& n, const std::vector<value>& in) {
        return b.scatter_add_rows(b.constant(0.0, n.outputs[0]), b.convert(in[1], element::i32), in[0]);
    }
    static void evaluate(const node&, const std::vector<const host_value*>& in, host_value& out) {  // an index out of range is skipped, as StableHLO's scatter does
        const std::size_t width = std::size_t(out.type.dims[1]), rows = std::size_t(out.type.dims[0]);
        for (std::size_t m = 0; m < std::size_t(in[0]->type.dims[0]); ++m) {
            const double at = in[1]->data[m];
            if (!(at >= 0 && at < double(rows))) continue;
            for (std::size_t w = 0; w < width; ++w) out.data[std::size_t(at) * width + w] += in[0]->data[m * width + w];
        }
    }
    static void gradient(vjp& v) { v.dx[0] = gather_rows::make(v.gy[0], v.x[1]); }
};

inline void gather_rows::gradient(vjp& v) { v.dx[0] = scatter_add_rows::make(v.gy[0], v.x[1], v.x[0].dims()[0]); }

}  // namespace prim

/// prim::gather_rows: out[m, :] = x[rows[m], :].
inline var gather_rows(const var& x, const var& rows) { return prim::gather_rows::make(x, rows); }

/// prim::scatter_add_rows: [count, W] zeros with src[m, :] added to row rows[m].
inline var scatter_add_rows(const var& src, const var& rows, std::int64_t count) { return prim::scatter_add_rows::make(src, rows, count); }

}  // namespace olmax::xla::graph
