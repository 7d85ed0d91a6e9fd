#pragma once
// The traced primitives with their gradients: the small set every lowering rule (rules.hpp) is
// built from. Each makes one value of the program (graph.hpp) and records itself on the tape with
// a backward closure written in the same primitives, so olmax's one reverse mode (the tape)
// differentiates traced programs like any other: the program's backward pass is what `backward()`
// records while it walks the tape, nodes of custom ops and reversible blocks included.
//
// Element-wise primitives take operands of one shape; `broadcast_to` (whose gradient sums back)
// makes them so. All values are float32.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/autodiff/tape.hpp"
#include "olmax/trace/tracer.hpp"

namespace olmax::trace::primitives {

using T = Tensor<float>;

namespace detail {

/// Records `y` as the output of primitive `name` on `inputs`; `vjp(dy, sink)` adds the inputs'
/// gradients (it runs during backward, where nothing records, so it may use the primitives freely).
template <class Vjp>
T record(std::string_view name, std::vector<T> inputs, T y, Vjp vjp) {
    autodiff::record<float>(name, std::span<const T>(inputs), std::span<T>(&y, 1),
                            [vjp = std::move(vjp)](std::span<const T> g, autodiff::GradientSink<float>& sink) { vjp(g[0], sink); });
    return y;
}

inline gx::dims_t all_axes(std::size_t rank) {
    gx::dims_t out;
    for (std::size_t a = 0; a < rank; ++a) out.push_back(std::int64_t(a));
    return out;
}

}  // namespace detail

/// A value that no gradient flows through (iota, comparisons, constants from the graph).
inline T constant(const gx::var& v) { return wrap(v); }
inline T full(const Shape& shape, double value) { return wrap(gx::constant(active().graph(), value, gx::f32(dims_of(shape)))); }

/// `g` summed down to `shape` (the gradient of a numpy broadcast to g's shape).
inline T sum_to(const T& g, const Shape& shape) {
    if (g.shape() == shape) return g;
    const gx::var& v = var_of(g);
    const std::size_t rank = g.rank(), lead = rank - shape.size();
    gx::dims_t axes;
    for (std::size_t a = 0; a < rank; ++a)
        if (a < lead || (shape[a - lead] == 1 && g.shape()[a] != 1)) axes.push_back(std::int64_t(a));
    gx::var s = axes.empty() ? v : gx::sum(v, axes);
    return wrap(gx::reshape(s, dims_of(shape)));
}

/// `x` broadcast to `shape` with numpy's rules (trailing alignment, size-1 axes stretched).
inline T broadcast_to(const T& x, const Shape& shape) {
    if (x.shape() == shape) return x;
    check<shape_error>(x.rank() <= shape.size(), "trace: cannot broadcast ", to_string(x.shape()), " to ", to_string(shape));
    const std::size_t lead = shape.size() - x.rank();
    gx::dims_t kept_dims, kept_sizes;
    for (std::size_t i = 0; i < x.rank(); ++i) {
        check<shape_error>(x.shape()[i] == 1 || x.shape()[i] == shape[lead + i], "trace: cannot broadcast ", to_string(x.shape()), " to ",
                           to_string(shape));
        if (x.shape()[i] == shape[lead + i]) {
            kept_dims.push_back(std::int64_t(lead + i));
            kept_sizes.push_back(std::int64_t(x.shape()[i]));
        }
    }
    const gx::var squeezed = gx::reshape(var_of(x), kept_sizes);  // the stretched size-1 axes dropped
    const T y = wrap(gx::broadcast_in_dim(squeezed, dims_of(shape), kept_dims));
    return detail::record("broadcast", {x}, y, [shape = x.shape()](const T& g, auto& sink) { sink.add(0, sum_to(g, shape)); });
}

inline T reshape(const T& x, const Shape& shape) {
    if (x.shape() == shape) return x;
    const T y = wrap(gx::reshape(var_of(x), dims_of(shape)));
    return detail::record("reshape", {x}, y, [shape = x.shape()](const T& g, auto& sink) { sink.add(0, reshape(g, shape)); });
}

inline T transpose(const T& x, const std::vector<std::int64_t>& perm) {
    const T y = wrap(gx::transpose(var_of(x), perm));
    std::vector<std::int64_t> inverse(perm.size());
    for (std::size_t i = 0; i < perm.size(); ++i) inverse[std::size_t(perm[i])] = std::int64_t(i);
    return detail::record("transpose", {x}, y, [inverse](const T& g, auto& sink) { sink.add(0, transpose(g, inverse)); });
}

/// The block [start, limit) of `x` (unit strides).
inline T slice(const T& x, const gx::dims_t& start, const gx::dims_t& limit) {
    const T y = wrap(gx::slice(var_of(x), start, limit));
    return detail::record("slice", {x}, y, [shape = x.shape(), start, limit](const T& g, auto& sink) {
        gx::dims_t high;
        for (std::size_t d = 0; d < shape.size(); ++d) high.push_back(std::int64_t(shape[d]) - limit[d]);
        sink.add(0, wrap(gx::pad(var_of(g), start, high)));
    });
}

/// `x` with zeros around it: `low` and `high` entries per axis.
inline T pad(const T& x, const gx::dims_t& low, const gx::dims_t& high) {
    const T y = wrap(gx::pad(var_of(x), low, high));
    return detail::record("pad", {x}, y, [shape = x.shape(), low](const T& g, auto& sink) {
        gx::dims_t limit;
        for (std::size_t d = 0; d < shape.size(); ++d) limit.push_back(low[d] + std::int64_t(shape[d]));
        sink.add(0, wrap(gx::slice(var_of(g), low, limit)));
    });
}

/// Parts joined along `axis`.
inline T concatenate(const std::vector<T>& parts, std::size_t axis) {
    std::vector<gx::var> vars;
    for (const auto& part : parts) vars.push_back(var_of(part));
    const T y = wrap(gx::concatenate(vars, std::int64_t(axis)));
    std::vector<Shape> shapes;
    for (const auto& part : parts) shapes.push_back(part.shape());
    return detail::record("concatenate", parts, y, [shapes, axis](const T& g, auto& sink) {
        std::int64_t at = 0;
        for (std::size_t i = 0; i < shapes.size(); ++i) {
            gx::dims_t start(shapes[i].size(), 0), limit = dims_of(g.shape());
            start[axis] = at;
            limit[axis] = at + std::int64_t(shapes[i][axis]);
            at = limit[axis];
            if (sink.needs(i)) sink.add(i, wrap(gx::slice(var_of(g), start, limit)));
        }
    });
}

/// Entries [begin, end) of the leading axis.
inline T slice_leading(const T& x, std::size_t begin, std::size_t end) {
    if (begin == 0 && end == x.shape()[0]) return x;
    gx::dims_t start(x.rank(), 0), limit = dims_of(x.shape());
    start[0] = std::int64_t(begin);
    limit[0] = std::int64_t(end);
    const T y = wrap(gx::slice(var_of(x), start, limit));
    return detail::record("slice", {x}, y, [shape = x.shape(), begin, end](const T& g, auto& sink) {
        gx::dims_t low(shape.size(), 0), high(shape.size(), 0);
        low[0] = std::int64_t(begin);
        high[0] = std::int64_t(shape[0] - end);
        sink.add(0, wrap(gx::pad(var_of(g), low, high)));
    });
}

/// x[index] along the leading axis.
inline T take_leading(const T& x, std::size_t index) {
    Shape inner(x.shape().begin() + 1, x.shape().end());
    return reshape(slice_leading(x, index, index + 1), inner);
}

/// Equal-shaped parts stacked along a new leading axis.
inline T stack_leading(const std::vector<T>& parts) {
    if (parts.size() == 1) {
        Shape one{1};
        one.insert(one.end(), parts[0].shape().begin(), parts[0].shape().end());
        return reshape(parts[0], one);
    }
    std::vector<gx::var> rows;
    for (const auto& part : parts) {
        gx::dims_t one{1};
        for (auto d : part.shape()) one.push_back(std::int64_t(d));
        rows.push_back(gx::reshape(var_of(part), one));
    }
    const T y = wrap(gx::concatenate(rows, 0));
    return detail::record("stack", parts, y, [count = parts.size()](const T& g, auto& sink) {
        for (std::size_t i = 0; i < count; ++i)
            if (sink.needs(i)) sink.add(i, take_leading(g, i));
    });
}

/// Sum over `axes` (increasing); `keepdims` keeps them with extent 1.
inline T sum(const T& x, const std::vector<std::int64_t>& axes, bool keepdims) {
    if (axes.empty()) return x;
    Shape out;
    for (std::size_t a = 0; a < x.rank(); ++a) {
        bool reduced = false;
        for (auto r : axes) reduced |= std::size_t(r) == a;
        if (!reduced) out.push_back(x.shape()[a]);
        else if (keepdims) out.push_back(1);
    }
    const T y = wrap(gx::reshape(gx::sum(var_of(x), axes), dims_of(out)));
    return detail::record("sum", {x}, y, [in = x.shape(), axes](const T& g, auto& sink) {
        Shape kept = in;  // g with the reduced axes as size 1, then stretched
        for (auto a : axes) kept[std::size_t(a)] = 1;
        sink.add(0, broadcast_to(reshape(g, kept), in));
    });
}

// ---- element-wise, operands of one shape --------------------------------------------------------

inline T add(const T& a, const T& b) {
    const T y = wrap(var_of(a) + var_of(b));
    return detail::record("add", {a, b}, y, [](const T& g, auto& sink) {
        sink.add(0, g);
        sink.add(1, g);
    });
}
inline T neg(const T& x) {
    const T y = wrap(-var_of(x));
    return detail::record("negate", {x}, y, [](const T& g, auto& sink) { sink.add(0, neg(g)); });
}
inline T sub(const T& a, const T& b) {
    const T y = wrap(var_of(a) - var_of(b));
    return detail::record("subtract", {a, b}, y, [](const T& g, auto& sink) {
        sink.add(0, g);
        if (sink.needs(1)) sink.add(1, neg(g));
    });
}
inline T mul(const T& a, const T& b) {
    const T y = wrap(var_of(a) * var_of(b));
    return detail::record("multiply", {a, b}, y, [a, b](const T& g, auto& sink) {
        if (sink.needs(0)) sink.add(0, mul(g, b));
        if (sink.needs(1)) sink.add(1, mul(g, a));
    });
}
inline T div(const T& a, const T& b) {
    const T y = wrap(var_of(a) / var_of(b));
    return detail::record("divide", {a, b}, y, [b, y](const T& g, auto& sink) {
        const T ga = div(g, b);
        if (sink.needs(1)) sink.add(1, neg(mul(ga, y)));  // d(a/b)/db = -y / b
        sink.add(0, ga);
    });
}
/// Element-wise maximum; the gradient goes to `a` where a >= b, else to `b` (as the eager op).
inline T maximum(const T& a, const T& b) {
    const T y = wrap(gx::maximum(var_of(a), var_of(b)));
    return detail::record("maximum", {a, b}, y, [a, b](const T& g, auto& sink) {
        const gx::var first = gx::compare(var_of(a), var_of(b), gx::compare_direction::GE);
        const gx::var zero = gx::constant_like(var_of(g), 0.0);
        sink.add(0, wrap(gx::select(first, var_of(g), zero)));
        sink.add(1, wrap(gx::select(first, zero, var_of(g))));
    });
}
inline T scale(const T& x, double s) {
    const T y = wrap(var_of(x) * s);
    return detail::record("scale", {x}, y, [s](const T& g, auto& sink) { sink.add(0, scale(g, s)); });
}
inline T add_scalar(const T& x, double s) {
    const T y = wrap(var_of(x) + s);
    return detail::record("add_scalar", {x}, y, [](const T& g, auto& sink) { sink.add(0, g); });
}
inline T exp(const T& x) {
    const T y = wrap(gx::exp(var_of(x)));
    return detail::record("exponential", {x}, y, [y](const T& g, auto& sink) { sink.add(0, mul(g, y)); });
}
inline T log(const T& x) {
    const T y = wrap(gx::log(var_of(x)));
    return detail::record("log", {x}, y, [x](const T& g, auto& sink) { sink.add(0, div(g, x)); });
}
inline T sqrt(const T& x) {
    const T y = wrap(gx::sqrt(var_of(x)));
    return detail::record("sqrt", {x}, y, [y](const T& g, auto& sink) { sink.add(0, div(scale(g, 0.5), y)); });
}
inline T tanh(const T& x) {
    const T y = wrap(gx::tanh(var_of(x)));
    return detail::record("tanh", {x}, y, [y](const T& g, auto& sink) { sink.add(0, mul(g, add_scalar(neg(mul(y, y)), 1.0))); });
}
inline T logistic(const T& x) {
    const T y = wrap(gx::logistic(var_of(x)));
    return detail::record("logistic", {x}, y, [y](const T& g, auto& sink) { sink.add(0, mul(g, mul(y, add_scalar(neg(y), 1.0)))); });
}

/// h_t = a_t h_{t-1} + x_t along axis 1 of [B, T, ...] (from the end with `reverse`:
/// h_t = a_t h_{t+1} + x_t), lowered in the form `strategy` names. Its exact adjoint is the same
/// scan run the other way: lambda_t = g_t + a_{t+1} lambda_{t+1}, dx = lambda, da_t = lambda_t h_{t-1}.
inline T linear_scan(const T& a, const T& x, const xla::stablehlo::scan_strategy& strategy, bool reverse) {
    const T h = wrap(gx::linear_scan(var_of(a), var_of(x), strategy, reverse));
    return detail::record("linear_scan", {a, x}, h, [a, h, strategy, reverse](const T& g, auto& sink) {
        const std::int64_t toward = reverse ? 1 : -1;  // the gates of the step the adjoint comes from
        const T next_gate = wrap(gx::shift(var_of(a), 1, toward));
        const T lambda = linear_scan(next_gate, g, strategy, !reverse);
        if (sink.needs(0)) sink.add(0, mul(lambda, wrap(gx::shift(var_of(h), 1, -toward))));
        sink.add(1, lambda);
    });
}

inline T scatter_add_rows(const T& src, const T& rows, std::size_t count);
/// Rows of x [R, ...] by `rows` [M] (the program's f32 values holding row indices): [M, ...]. Its
/// gradient scatters dy back into the rows (repeated rows accumulate).
inline T gather_rows(const T& x, const T& rows) {
    const std::size_t count = x.shape()[0], width = count ? x.size() / count : 0;
    const gx::var flat = gx::reshape(var_of(x), {std::int64_t(count), std::int64_t(width)});
    Shape out_shape = x.shape();
    out_shape[0] = rows.shape()[0];
    const T y = wrap(gx::reshape(gx::gather_rows(flat, var_of(rows)), dims_of(out_shape)));
    return detail::record("gather_rows", {x}, y, [rows, count](const T& g, auto& sink) { sink.add(0, scatter_add_rows(g, rows, count)); });
}
/// The adjoint of gather_rows: [count, ...] zeros with src[m] added to row rows[m] for every m.
inline T scatter_add_rows(const T& src, const T& rows, std::size_t count) {
    const std::size_t m = src.shape()[0], width = m ? src.size() / m : 0;
    const gx::var flat = gx::reshape(var_of(src), {std::int64_t(m), std::int64_t(width)});
    Shape out_shape = src.shape();
    out_shape[0] = count;
    const T y = wrap(gx::reshape(gx::scatter_add_rows(flat, var_of(rows), std::int64_t(count)), dims_of(out_shape)));
    return detail::record("scatter_add_rows", {src}, y, [rows](const T& g, auto& sink) { sink.add(0, gather_rows(g, rows)); });
}

/// Mamba's selective scan fused over time (xla/graph's selective_scan: the [B, T, E, N] states are
/// never stored) from u, delta [B, T, E], A [E, N], B, C [B, T, N], keep [B, T] (0 where a document
/// starts; no gradient) and h0 [B, E, N]: returns y [B, T, E] (without the D skip) and the last
/// state [B, E, N]. Its gradient is one primitive too: chunks of `chunk` steps from last to first,
/// each recomputed from the state the forward kept at its start. With `native_call` both run as
/// olmax's own CPU kernels (a custom call; the XLA CPU plugin with trace/native_calls.hpp registered).
inline std::array<T, 2> selective_scan(const T& u, const T& delta, const T& A, const T& B, const T& C, const T& keep, const T& h0, std::int64_t chunk,
                                       bool native_call = false) {
    const std::vector<gx::var> out =
        gx::selective_scan(var_of(u), var_of(delta), var_of(A), var_of(B), var_of(C), var_of(keep), var_of(h0), chunk, native_call);
    std::array<T, 2> ys{wrap(out[0]), wrap(out[1])};
    const std::vector<T> inputs{u, delta, A, B, C, h0};
    autodiff::record<float>("selective_scan", std::span<const T>(inputs), std::span<T>(ys),
                            [u, delta, A, B, C, keep, checkpoints = out[2], chunk, native_call](std::span<const T> g,
                                                                                                 autodiff::GradientSink<float>& sink) {
                                const std::vector<gx::var> d =
                                    gx::selective_scan_backward(var_of(u), var_of(delta), var_of(A), var_of(B), var_of(C), var_of(keep),
                                                                checkpoints, var_of(g[0]), var_of(g[1]), chunk, native_call);
                                for (std::size_t i = 0; i < d.size(); ++i) sink.add(i, wrap(d[i]));
                            });
    return ys;
}

/// [m, k] x [k, n], or [batch, m, k] x [batch, k, n] (the gradients below are the same batched products).
inline T matmul(const T& a, const T& b) {
    const T y = wrap(gx::dot(var_of(a), var_of(b), 1, 0));
    return detail::record("dot", {a, b}, y, [a, b](const T& g, auto& sink) {
        if (sink.needs(0)) sink.add(0, wrap(gx::dot(var_of(g), var_of(b), 1, 1)));  // dA = dY B^T
        if (sink.needs(1)) sink.add(1, wrap(gx::dot(var_of(a), var_of(g), 0, 0)));  // dB = A^T dY
    });
}

/// The maximum over `axis`, kept as size 1, with no gradient (a softmax's stabiliser).
inline T max_detached(const T& x, std::size_t axis) {
    Shape kept = x.shape();
    kept[axis] = 1;
    return wrap(gx::reshape(gx::max(var_of(x), {std::int64_t(axis)}), dims_of(kept)));
}

/// One-hot rows: [ids..., classes] with 1 where the class equals the id (no gradient).
inline T one_hot(const T& ids, std::size_t classes) {
    Shape out = ids.shape();
    out.push_back(classes);
    const std::int64_t last = std::int64_t(out.size()) - 1;
    gx::graph& g = var_of(ids).owner();
    const gx::var iota = gx::iota(g, gx::f32(dims_of(out)), last);
    const gx::var wide = gx::broadcast_in_dim(var_of(ids), dims_of(out), detail::all_axes(ids.rank()));
    const gx::var hit = gx::compare(iota, wide, gx::compare_direction::EQ);
    return wrap(gx::select(hit, gx::constant(g, 1.0, gx::f32(dims_of(out))), gx::constant(g, 0.0, gx::f32(dims_of(out)))));
}

}  // namespace olmax::trace::primitives
