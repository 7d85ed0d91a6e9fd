#pragma once
// The primitives that move elements without computing (broadcast, reshape, transpose, slice, pad,
// concatenate) and the reductions (sum, max over axes): each one's gradient is another of them.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/xla/graph/ir.hpp"
#include "olmax/xla/graph/primitives/elementwise.hpp"

namespace olmax::xla::graph {

namespace prim {

/// Operand dimension i becomes result dimension `dims[i]` (increasing; operand size 1 or equal).
/// Its gradient sums over the result dimensions the operand does not have or stretched.
struct broadcast_in_dim {
    static constexpr std::string_view name = "broadcast_in_dim";
    static var make(const var& x, dims_t out_dims, dims_t dims) {
        detail::check_axes(name, tensor_type{out_dims, x.type().elem}, dims);
        check<graph_error>(dims.size() == x.type().rank(), "xla::graph: broadcast_in_dim: ", dims.size(), " dimensions for ", x.type().str());
        for (std::size_t i = 0; i < dims.size(); ++i)
            check<graph_error>(x.dims()[i] == 1 || x.dims()[i] == out_dims[static_cast<std::size_t>(dims[i])], "xla::graph: broadcast_in_dim: ",
                               x.type().str(), " does not broadcast to ", tensor_type{out_dims, x.type().elem}.str());
        node n = detail::make_node<broadcast_in_dim>({x}, {std::move(out_dims), x.type().elem});
        n.dims = std::move(dims);
        return detail::commit(std::move(n));
    }
    static value emit(function_builder& b, const node& n, const std::vector<value>& in) {
        return b.broadcast_in_dim(in[0], n.outputs[0].dims, n.dims);
    }
    static void evaluate(const node& n, const std::vector<const host_value*>& in, host_value& out) {
        const auto x_strides = detail::strides_of(in[0]->type.dims);
        detail::for_each_index(out.type.dims, [&](std::int64_t flat, const std::vector<std::int64_t>& idx) {
            std::int64_t o = 0;
            for (std::size_t k = 0; k < n.dims.size(); ++k)
                if (in[0]->type.dims[k] != 1) o += idx[std::size_t(n.dims[k])] * x_strides[k];
            out.data[std::size_t(flat)] = in[0]->data[std::size_t(o)];
        });
    }
    static void gradient(vjp& v);  // a sum: below reduce_sum
};

struct reshape {
    static constexpr std::string_view name = "reshape";
    static var make(const var& x, dims_t dims) {
        const tensor_type t{std::move(dims), x.type().elem};
        check<graph_error>(t.elements() == x.type().elements(), "xla::graph: reshape: ", x.type().str(), " to ", t.str(), " changes the size");
        return detail::make<reshape>({x}, t);
    }
    static value emit(function_builder& b, const node& n, const std::vector<value>& in) { return b.reshape(in[0], n.outputs[0].dims); }
    static void evaluate(const node&, const std::vector<const host_value*>& in, host_value& out) { out.data = in[0]->data; }
    static void gradient(vjp& v) { v.dx[0] = make(v.gy[0], dims_t(v.x[0].dims())); }
};

/// The dimensions permuted: result dimension i is operand dimension `dims[i]`.
struct transpose {
    static constexpr std::string_view name = "transpose";
    static var make(const var& x, dims_t permutation) {
        check<graph_error>(permutation.size() == x.type().rank(), "xla::graph: transpose: permutation of ", permutation.size(), " for ",
                           x.type().str());
        std::vector<bool> seen(permutation.size(), false);
        tensor_type t{{}, x.type().elem};
        for (auto p : permutation) {
            check<graph_error>(p >= 0 && p < static_cast<std::int64_t>(seen.size()) && !seen[static_cast<std::size_t>(p)],
                               "xla::graph: transpose: not a permutation of ", x.type().rank(), " dimensions");
            seen[static_cast<std::size_t>(p)] = true;
            t.dims.push_back(x.dims()[static_cast<std::size_t>(p)]);
        }
        node n = detail::make_node<transpose>({x}, t);
        n.dims = std::move(permutation);
        return detail::commit(std::move(n));
    }
    static value emit(function_builder& b, const node& n, const std::vector<value>& in) { return b.transpose(in[0], n.dims); }
    static void evaluate(const node& n, const std::vector<const host_value*>& in, host_value& out) {
        const auto x_strides = detail::strides_of(in[0]->type.dims);
        detail::for_each_index(out.type.dims, [&](std::int64_t flat, const std::vector<std::int64_t>& idx) {
            std::int64_t o = 0;
            for (std::size_t k = 0; k < n.dims.size(); ++k) o += idx[k] * x_strides[std::size_t(n.dims[k])];
            out.data[std::size_t(flat)] = in[0]->data[std::size_t(o)];
        });
    }
    static void gradient(vjp& v) {
        dims_t inverse(v.n.dims.size());
        for (std::size_t i = 0; i < v.n.dims.size(); ++i) inverse[std::size_t(v.n.dims[i])] = std::int64_t(i);
        v.dx[0] = make(v.gy[0], inverse);
    }
};

/// x with low[d] zeros before and high[d] zeros after it along every dimension d (`dims`: low,
/// then high).
struct pad {
    static constexpr std::string_view name = "pad";
    static var make(const var& x, const dims_t& low, const dims_t& high) {
        detail::require_f32(name, x);
        const std::size_t rank = x.type().rank();
        check<graph_error>(low.size() == rank && high.size() == rank, "xla::graph: pad: ", low.size(), " low and ", high.size(),
                           " high paddings for ", x.type().str());
        dims_t out, both = low;
        for (std::size_t d = 0; d < rank; ++d) {
            check<graph_error>(low[d] >= 0 && high[d] >= 0, "xla::graph: pad: negative padding (", low[d], ", ", high[d], ") of dimension ", d);
            out.push_back(x.dims()[d] + low[d] + high[d]);
        }
        both.insert(both.end(), high.begin(), high.end());
        node n = detail::make_node<pad>({x}, f32(out));
        n.dims = std::move(both);
        return detail::commit(std::move(n));
    }
    static value emit(function_builder& b, const node& n, const std::vector<value>& in) {
        const auto rank = static_cast<std::ptrdiff_t>(in[0].type.rank());
        return b.pad(in[0], 0.0, dims_t(n.dims.begin(), n.dims.begin() + rank), dims_t(n.dims.begin() + rank, n.dims.end()));
    }
    static void evaluate(const node& n, const std::vector<const host_value*>& in, host_value& out) {  // x placed at its low padding in zeros
        detail::for_each_in_block(in[0]->type.dims, out.type.dims, n.dims, [&](std::size_t x, std::size_t o) { out.data[o] = in[0]->data[x]; });
    }
    static void gradient(vjp& v);  // a slice
};

/// x[start[d] : limit[d]] along every dimension d, unit strides (`dims`: the starts).
struct slice {
    static constexpr std::string_view name = "slice";
    static var make(const var& x, const dims_t& start, const dims_t& limit) {
        const std::size_t rank = x.type().rank();
        check<graph_error>(start.size() == rank && limit.size() == rank, "xla::graph: slice: ", start.size(), " starts and ", limit.size(),
                           " limits for ", x.type().str());
        dims_t out;
        for (std::size_t d = 0; d < rank; ++d) {
            check<graph_error>(0 <= start[d] && start[d] <= limit[d] && limit[d] <= x.dims()[d], "xla::graph: slice: [", start[d], ", ", limit[d],
                               ") is out of range for dimension ", d, " of ", x.type().str());
            out.push_back(limit[d] - start[d]);
        }
        node n = detail::make_node<slice>({x}, {std::move(out), x.type().elem});
        n.dims = start;
        return detail::commit(std::move(n));
    }
    static value emit(function_builder& b, const node& n, const std::vector<value>& in) {
        dims_t limit;
        for (std::size_t d = 0; d < n.dims.size(); ++d) limit.push_back(n.dims[d] + n.outputs[0].dims[d]);
        return b.slice(in[0], n.dims, limit);
    }
    static void evaluate(const node& n, const std::vector<const host_value*>& in, host_value& out) {  // the block of x at n.dims
        detail::for_each_in_block(out.type.dims, in[0]->type.dims, n.dims, [&](std::size_t o, std::size_t x) { out.data[o] = in[0]->data[x]; });
    }
    static void gradient(vjp& v) {  // g in zeros where x was
        const dims_t x_dims = v.x[0].dims(), start = v.n.dims, out = v.n.outputs[0].dims;
        dims_t high;
        for (std::size_t d = 0; d < x_dims.size(); ++d) high.push_back(x_dims[d] - start[d] - out[d]);
        v.dx[0] = pad::make(v.gy[0], start, high);
    }
};

inline void pad::gradient(vjp& v) {  // the block where x went
    const dims_t x_dims = v.x[0].dims();
    const dims_t low(v.n.dims.begin(), v.n.dims.begin() + static_cast<std::ptrdiff_t>(x_dims.size()));
    dims_t limit;
    for (std::size_t d = 0; d < x_dims.size(); ++d) limit.push_back(low[d] + x_dims[d]);
    v.dx[0] = slice::make(v.gy[0], low, limit);
}

/// The parts joined along `axis` (equal elsewhere). One part is returned as it is, with no node.
struct concatenate {
    static constexpr std::string_view name = "concatenate";
    static var make(const std::vector<var>& parts, std::int64_t axis) {
        check<graph_error>(!parts.empty(), "xla::graph: concatenate needs at least one part");
        const tensor_type first = parts.front().type();
        check<graph_error>(axis >= 0 && axis < static_cast<std::int64_t>(first.rank()), "xla::graph: concatenate: axis ", axis,
                           " out of range for ", first.str());
        const auto a = static_cast<std::size_t>(axis);
        dims_t out = first.dims;
        out[a] = 0;
        for (const auto& p : parts) {
            bool same = p.type().rank() == first.rank() && p.type().elem == first.elem;
            for (std::size_t d = 0; same && d < first.rank(); ++d) same = d == a || p.dims()[d] == first.dims[d];
            check<graph_error>(same, "xla::graph: concatenate: ", p.type().str(), " and ", first.str(), " differ outside axis ", axis);
            out[a] += p.dims()[a];
        }
        if (parts.size() == 1) return parts.front();
        node n = detail::make_node<concatenate>(parts, {std::move(out), first.elem});
        n.axis = axis;
        return detail::commit(std::move(n));
    }
    static value emit(function_builder& b, const node& n, const std::vector<value>& in) { return b.concatenate(in, n.axis); }
    static void evaluate(const node& n, const std::vector<const host_value*>& in, host_value& out) {  // each part after the previous ones
        dims_t at(out.type.rank(), 0);
        for (const auto* part : in) {
            detail::for_each_in_block(part->type.dims, out.type.dims, at, [&](std::size_t x, std::size_t o) { out.data[o] = part->data[x]; });
            at[std::size_t(n.axis)] += part->type.dims[std::size_t(n.axis)];
        }
    }
    static void gradient(vjp& v) {  // each part's block of g
        const auto a = std::size_t(v.n.axis);
        const dims_t all = v.n.outputs[0].dims;
        std::int64_t at = 0;
        for (std::size_t i = 0; i < v.x.size(); ++i) {
            dims_t start(all.size(), 0), limit = all;
            start[a] = at;
            limit[a] = at + v.x[i].dims()[a];
            at = limit[a];
            if (v.needs(i)) v.dx[i] = slice::make(v.gy[0], start, limit);
        }
    }
};

}  // namespace prim

namespace detail {

/// A reduction over `dims` from P::init: P::apply folds each element into its result (the
/// reference) and P::body is the StableHLO op of the reduce region.
template <class P>
struct reduction {
    static var make(const var& x, dims_t axes) {
        require_f32(P::name, x);
        check_axes(P::name, x.type(), axes);
        dims_t out;
        for (std::int64_t d = 0; d < static_cast<std::int64_t>(x.type().rank()); ++d) {
            bool reduced = false;
            for (auto a : axes) reduced |= a == d;
            if (!reduced) out.push_back(x.dims()[static_cast<std::size_t>(d)]);
        }
        node n = make_node<P>({x}, f32(out));
        n.dims = std::move(axes);
        return commit(std::move(n));
    }
    static value emit(function_builder& b, const node& n, const std::vector<value>& in) { return b.reduce(in[0], P::init, n.dims, P::body); }
    static void evaluate(const node& n, const std::vector<const host_value*>& in, host_value& out) {
        std::fill(out.data.begin(), out.data.end(), P::init);
        const auto out_strides = strides_of(out.type.dims);
        const dims_t& x_dims = in[0]->type.dims;
        for_each_index(x_dims, [&](std::int64_t flat, const std::vector<std::int64_t>& idx) {
            std::int64_t o = 0;
            std::size_t k = 0;
            for (std::int64_t d = 0; d < std::int64_t(x_dims.size()); ++d) {
                if (std::find(n.dims.begin(), n.dims.end(), d) != n.dims.end()) continue;
                o += idx[std::size_t(d)] * out_strides[k++];
            }
            double& acc = out.data[std::size_t(o)];
            acc = P::apply(acc, in[0]->data[std::size_t(flat)]);
        });
    }
    /// The dimensions of x that the reduction keeps.
    static dims_t kept(const node& n, std::size_t rank) {
        dims_t out;
        for (std::int64_t d = 0; d < std::int64_t(rank); ++d)
            if (std::find(n.dims.begin(), n.dims.end(), d) == n.dims.end()) out.push_back(d);
        return out;
    }
};

}  // namespace detail

namespace prim {

/// Sum over `dims` (increasing); the reduced dimensions disappear. Its gradient broadcasts back.
struct reduce_sum : detail::reduction<reduce_sum> {
    static constexpr std::string_view name = "reduce_sum", body = "add";
    static constexpr double init = 0.0;
    static constexpr bool saved_by_kept_layers = true;
    static double apply(double acc, double x) { return acc + x; }
    static void gradient(vjp& v) { v.dx[0] = broadcast_in_dim::make(v.gy[0], dims_t(v.x[0].dims()), kept(v.n, v.x[0].type().rank())); }
};

/// Maximum over `dims` (increasing); a NaN among the reduced elements gives NaN (its body is
/// stablehlo.maximum). Its gradient is split evenly among tied maxima.
struct reduce_max : detail::reduction<reduce_max> {
    static constexpr std::string_view name = "reduce_max", body = "maximum";
    // -inf (written in hex: float_literal), so a line of -inf, a fully masked row, gives -inf.
    static constexpr double init = -std::numeric_limits<double>::infinity();
    static constexpr bool saved_by_kept_layers = true;
    static double apply(double acc, double x) { return maximum::apply(acc, x); }
    static void gradient(vjp& v) {  // g / (number of maxima) where x is a maximum
        const dims_t x_dims = v.x[0].dims(), keep = kept(v.n, x_dims.size());
        const var at_max = compare::make(v.x[0], broadcast_in_dim::make(v.y[0], x_dims, keep), compare_direction::EQ);
        const var ones = select::make(at_max, constant_like(v.x[0], 1.0), constant_like(v.x[0], 0.0));
        const var share = divide::make(v.gy[0], reduce_sum::make(ones, v.n.dims));
        v.dx[0] = multiply::make(ones, broadcast_in_dim::make(share, x_dims, keep));
    }
};

inline void broadcast_in_dim::gradient(vjp& v) {  // summed over the result dimensions x does not have or stretched, then x's shape
    const dims_t x_dims = v.x[0].dims(), out = v.n.outputs[0].dims, dims = v.n.dims;
    dims_t axes;
    for (std::int64_t d = 0; d < std::int64_t(out.size()); ++d) {
        bool kept = false;
        for (std::size_t i = 0; i < dims.size(); ++i) kept |= dims[i] == d && x_dims[i] == out[std::size_t(d)];
        if (!kept) axes.push_back(d);
    }
    const var s = axes.empty() ? v.gy[0] : reduce_sum::make(v.gy[0], axes);
    v.dx[0] = s.dims() == x_dims ? s : reshape::make(s, x_dims);
}

}  // namespace prim

inline var sum(const var& x, dims_t axes) { return prim::reduce_sum::make(x, std::move(axes)); }
inline var max(const var& x, dims_t axes) { return prim::reduce_max::make(x, std::move(axes)); }

inline var broadcast_in_dim(const var& x, dims_t out_dims, dims_t dims) { return prim::broadcast_in_dim::make(x, std::move(out_dims), std::move(dims)); }
inline var reshape(const var& x, dims_t dims) { return prim::reshape::make(x, std::move(dims)); }
inline var transpose(const var& x, dims_t permutation) { return prim::transpose::make(x, std::move(permutation)); }
inline var slice(const var& x, const dims_t& start, const dims_t& limit) { return prim::slice::make(x, start, limit); }
inline var pad(const var& x, const dims_t& low, const dims_t& high) { return prim::pad::make(x, low, high); }
inline var concatenate(const std::vector<var>& parts, std::int64_t axis) { return prim::concatenate::make(parts, axis); }

/// x moved |steps| positions along `axis`: later for steps > 0, zeros entering at the front (a
/// causal shift), earlier for steps < 0, zeros entering at the end. A composition (slice, pad).
inline var shift(const var& x, std::int64_t axis, std::int64_t steps) {
    if (steps == 0) return x;
    const auto a = static_cast<std::size_t>(axis);
    check<graph_error>(axis >= 0 && a < x.type().rank(), "xla::graph: shift: axis ", axis, ", steps ", steps, " for ", x.type().str());
    const std::int64_t by = steps > 0 ? steps : -steps;
    if (by >= x.dims()[a]) return constant_like(x, 0.0);
    dims_t start(x.type().rank(), 0), limit = x.dims(), low(x.type().rank(), 0), high(x.type().rank(), 0);
    if (steps > 0) {  // keep the first T - by, pad in front
        limit[a] -= by;
        low[a] = by;
    } else {  // keep the last T - by, pad at the end
        start[a] = by;
        high[a] = by;
    }
    return pad(slice(x, start, limit), low, high);
}

}  // namespace olmax::xla::graph
