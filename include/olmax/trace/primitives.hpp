#pragma once
// The traced primitives on tensors: the small set every lowering rule (rules.hpp) is built from.
// Each makes values of the program (xla/graph) and records its node on the tape with the
// primitive's own gradient rule (`detail::bind`), so olmax's one reverse mode differentiates traced
// programs like any other, custom ops and reversible blocks included. The forms that are not one
// primitive (a numpy broadcast, a sum keeping its axes, a gather of rows of any rank) are
// compositions of bound primitives. Element-wise primitives take operands of one shape
// (`broadcast_to`, whose gradient sums back, makes them so). All values are float32.

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

/// Records `y` as the output of an op `name` on `inputs`; `vjp(dy, sink)` adds the inputs'
/// gradients (it runs during backward, where nothing records, so it may use the primitives freely).
/// For a composite with a gradient of its own (the layer loop); a primitive's is its rule (bind).
template <class Vjp>
T record(std::string_view name, std::vector<T> inputs, T y, Vjp vjp) {
    autodiff::record<float>(name, std::span<const T>(inputs), std::span<T>(&y, 1),
                            [vjp = std::move(vjp)](std::span<const T> g, autodiff::GradientSink<float>& sink) { vjp(g[0], sink); });
    return y;
}

/// What `apply` (below) does. A primitive without a gradient is not recorded (its outputs are
/// constants of the tape); only the outputs the tape differentiates are returned.
inline std::vector<T> bind(const gx::var& first, const std::vector<T>& operands) {
    gx::graph& g = first.owner();
    const std::uint32_t index = first.node();
    const gx::node& n = g.at(index);
    const gx::primitive_info& info = n.kind.info();
    check<trace_error>(operands.size() == n.operands.size(), "olmax: trace: ", info.name, " bound to ", operands.size(), " tensors for ",
                       n.operands.size(), " operands");
    check<trace_error>(!info.gradient_in_tracer, "olmax: trace: ", info.name, " records its own gradient");
    const std::size_t count = info.differentiated_outputs ? info.differentiated_outputs : n.outputs.size();
    std::vector<T> ys;
    for (std::uint32_t k = 0; k < count; ++k) ys.push_back(wrap(gx::var(&g, index, k)));
    if (info.gradient == nullptr) return ys;
    autodiff::record<float>(info.name, std::span<const T>(operands), std::span<T>(ys),
                            [at = gx::var(&g, index, 0)](std::span<const T> gy, autodiff::GradientSink<float>& sink) {
                                std::vector<gx::var> g_vars;
                                for (const auto& t : gy) g_vars.push_back(var_of(t));
                                std::vector<bool> wanted(at.owner().at(at.node()).operands.size());
                                for (std::size_t i = 0; i < wanted.size(); ++i) wanted[i] = sink.needs(i);
                                const std::vector<gx::var> dx = gx::gradient_of(at, g_vars, wanted);
                                for (std::size_t i = 0; i < dx.size(); ++i)
                                    if (wanted[i] && dx[i].defined()) sink.add(i, wrap(dx[i]));
                            });
    return ys;
}

inline T bind1(const gx::var& y, const std::vector<T>& operands) { return bind(y, operands)[0]; }

inline gx::dims_t all_axes(std::size_t rank) {
    gx::dims_t out;
    for (std::size_t a = 0; a < rank; ++a) out.push_back(std::int64_t(a));
    return out;
}

}  // namespace detail

/// The outputs of the node that made `first` (any primitive's, one defined outside olmax too) as
/// tensors of the program, recorded on the tape with its primitive's gradient rule; `operands` are
/// the node's operands as tensors, in order.
inline std::vector<T> apply(const gx::var& first, const std::vector<T>& operands) { return detail::bind(first, operands); }

/// A value that no gradient flows through (iota, comparisons, constants from the graph).
inline T constant(const gx::var& v) { return wrap(v); }
inline T full(const Shape& shape, double value) { return wrap(gx::constant(active().graph(), value, gx::f32(dims_of(shape)))); }

inline T reshape(const T& x, const Shape& shape) {
    if (x.shape() == shape) return x;
    return detail::bind1(gx::reshape(var_of(x), dims_of(shape)), {x});
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
    return reshape(detail::bind1(gx::sum(var_of(x), axes), {x}), out);
}

/// `x` broadcast to `shape` with numpy's rules (trailing alignment, size-1 axes stretched).
inline T broadcast_to(const T& x, const Shape& shape) {
    if (x.shape() == shape) return x;
    check<shape_error>(x.rank() <= shape.size(), "trace: cannot broadcast ", to_string(x.shape()), " to ", to_string(shape));
    const std::size_t lead = shape.size() - x.rank();
    gx::dims_t kept_dims;
    Shape kept_sizes;
    for (std::size_t i = 0; i < x.rank(); ++i) {
        check<shape_error>(x.shape()[i] == 1 || x.shape()[i] == shape[lead + i], "trace: cannot broadcast ", to_string(x.shape()), " to ",
                           to_string(shape));
        if (x.shape()[i] == shape[lead + i]) {
            kept_dims.push_back(std::int64_t(lead + i));
            kept_sizes.push_back(x.shape()[i]);
        }
    }
    const T squeezed = reshape(x, kept_sizes);  // the stretched size-1 axes dropped
    return detail::bind1(gx::broadcast_in_dim(var_of(squeezed), dims_of(shape), kept_dims), {squeezed});
}

inline T transpose(const T& x, const std::vector<std::int64_t>& perm) { return detail::bind1(gx::transpose(var_of(x), perm), {x}); }

/// The block [start, limit) of `x` (unit strides).
inline T slice(const T& x, const gx::dims_t& start, const gx::dims_t& limit) { return detail::bind1(gx::slice(var_of(x), start, limit), {x}); }

/// `x` with zeros around it: `low` and `high` entries per axis.
inline T pad(const T& x, const gx::dims_t& low, const gx::dims_t& high) { return detail::bind1(gx::pad(var_of(x), low, high), {x}); }

/// Parts joined along `axis`.
inline T concatenate(const std::vector<T>& parts, std::size_t axis) {
    if (parts.size() == 1) return parts[0];
    std::vector<gx::var> vars;
    for (const auto& part : parts) vars.push_back(var_of(part));
    return detail::bind1(gx::concatenate(vars, std::int64_t(axis)), parts);
}

/// Entries [begin, end) of the leading axis.
inline T slice_leading(const T& x, std::size_t begin, std::size_t end) {
    if (begin == 0 && end == x.shape()[0]) return x;
    gx::dims_t start(x.rank(), 0), limit = dims_of(x.shape());
    start[0] = std::int64_t(begin);
    limit[0] = std::int64_t(end);
    return slice(x, start, limit);
}

/// x[index] along the leading axis.
inline T take_leading(const T& x, std::size_t index) {
    Shape inner(x.shape().begin() + 1, x.shape().end());
    return reshape(slice_leading(x, index, index + 1), inner);
}

/// Equal-shaped parts stacked along a new leading axis.
inline T stack_leading(const std::vector<T>& parts) {
    std::vector<T> rows;
    for (const auto& part : parts) {
        Shape one{1};
        one.insert(one.end(), part.shape().begin(), part.shape().end());
        rows.push_back(reshape(part, one));
    }
    return concatenate(rows, 0);
}

// ---- element-wise, operands of one shape --------------------------------------------------------

inline T add(const T& a, const T& b) { return detail::bind1(var_of(a) + var_of(b), {a, b}); }
inline T neg(const T& x) { return detail::bind1(-var_of(x), {x}); }
inline T sub(const T& a, const T& b) { return detail::bind1(var_of(a) - var_of(b), {a, b}); }
inline T mul(const T& a, const T& b) { return detail::bind1(var_of(a) * var_of(b), {a, b}); }
inline T div(const T& a, const T& b) { return detail::bind1(var_of(a) / var_of(b), {a, b}); }
/// Element-wise maximum (NaN where either is NaN); the gradient goes to `a` where a >= b or a is
/// NaN, else to `b` (as the eager op).
inline T maximum(const T& a, const T& b) { return detail::bind1(gx::maximum(var_of(a), var_of(b)), {a, b}); }
/// on_true where `predicate` (an i1 value of the program, no gradient) holds, else on_false; the
/// gradient goes to the operand chosen, element by element.
inline T select(const gx::var& predicate, const T& on_true, const T& on_false) {
    return detail::bind1(gx::select(predicate, var_of(on_true), var_of(on_false)), {constant(predicate), on_true, on_false});
}
inline T scale(const T& x, double s) { return mul(x, constant(gx::constant_like(var_of(x), s))); }
inline T add_scalar(const T& x, double s) { return add(x, constant(gx::constant_like(var_of(x), s))); }
inline T exp(const T& x) { return detail::bind1(gx::exp(var_of(x)), {x}); }
inline T log(const T& x) { return detail::bind1(gx::log(var_of(x)), {x}); }
inline T sqrt(const T& x) { return detail::bind1(gx::sqrt(var_of(x)), {x}); }
inline T tanh(const T& x) { return detail::bind1(gx::tanh(var_of(x)), {x}); }
inline T logistic(const T& x) { return detail::bind1(gx::logistic(var_of(x)), {x}); }

/// h_t = a_t h_{t-1} + x_t along axis 1 of [B, T, ...] (from the end with `reverse`), lowered in the
/// form `strategy` names (xla/graph's linear_scan; its gradient is the same scan run the other way).
inline T linear_scan(const T& a, const T& x, const xla::stablehlo::scan_strategy& strategy, bool reverse) {
    return detail::bind1(gx::linear_scan(var_of(a), var_of(x), strategy, reverse), {a, x});
}

/// h_t = m_t h_{t-1} + x_t along axis 1 of gates [B, n, K, K] and x [B, n, K, V] from a zero
/// state (from the end with `reverse`): one loop in the program (xla/graph's matrix_scan; its
/// gradient is the same scan run the other way with the gates transposed).
inline T matrix_scan(const T& m, const T& x, bool reverse) { return detail::bind1(gx::matrix_scan(var_of(m), var_of(x), reverse), {m, x}); }

/// Rows of x [R, ...] by `rows` [M] (the program's f32 values holding row indices): [M, ...]. Its
/// gradient scatters dy back into the rows (repeated rows accumulate).
inline T gather_rows(const T& x, const T& rows) {
    const std::size_t count = x.shape()[0], width = count ? x.size() / count : 0;
    const T flat = reshape(x, {count, width});
    Shape out_shape = x.shape();
    out_shape[0] = rows.shape()[0];
    return reshape(detail::bind1(gx::gather_rows(var_of(flat), var_of(rows)), {flat, rows}), out_shape);
}
/// The adjoint of gather_rows: [count, ...] zeros with src[m] added to row rows[m] for every m.
inline T scatter_add_rows(const T& src, const T& rows, std::size_t count) {
    const std::size_t m = src.shape()[0], width = m ? src.size() / m : 0;
    const T flat = reshape(src, {m, width});
    Shape out_shape = src.shape();
    out_shape[0] = count;
    return reshape(detail::bind1(gx::scatter_add_rows(var_of(flat), var_of(rows), std::int64_t(count)), {flat, rows}), out_shape);
}

/// Mamba's selective scan fused over time (xla/graph's selective_scan) from u, delta [B, T, E],
/// A [E, N], B, C [B, T, N], keep [B, T] (0 where a document starts; no gradient) and h0 [B, E, N]:
/// y [B, T, E] (without the D skip) and the last state [B, E, N]. Its gradient is one primitive too
/// (chunks of `chunk` steps, each recomputed from its checkpoint); `native_call`: olmax's CPU kernels.
inline std::array<T, 2> selective_scan(const T& u, const T& delta, const T& A, const T& B, const T& C, const T& keep, const T& h0, std::int64_t chunk,
                                       bool native_call = false) {
    const std::vector<gx::var> out =
        gx::selective_scan(var_of(u), var_of(delta), var_of(A), var_of(B), var_of(C), var_of(keep), var_of(h0), chunk, native_call);
    const std::vector<T> ys = detail::bind(out[0], {u, delta, A, B, C, keep, h0});
    return {ys[0], ys[1]};
}

/// [m, k] x [k, n], or [batch, m, k] x [batch, k, n]. `bf16_operands`: both rounded to bfloat16,
/// f32 sums, forward and gradients (the bf16 policy's GEMM; xla::graph::prim::dot).
inline T matmul(const T& a, const T& b, bool bf16_operands = false) {
    return detail::bind1(gx::dot(var_of(a), var_of(b), 1, 0, bf16_operands), {a, b});
}

/// The maximum over `axis`, kept as size 1, with no gradient (a softmax's stabiliser).
inline T max_detached(const T& x, std::size_t axis) {
    Shape kept = x.shape();
    kept[axis] = 1;
    return wrap(gx::reshape(gx::max(var_of(x), {std::int64_t(axis)}), dims_of(kept)));
}

/// [ids..., classes]: true where the class equals the id (an i1 value, for select).
inline gx::var class_hits(const T& ids, std::size_t classes) {
    Shape out = ids.shape();
    out.push_back(classes);
    const std::int64_t last = std::int64_t(out.size()) - 1;
    const gx::var iota = gx::iota(var_of(ids).owner(), gx::f32(dims_of(out)), last);
    const gx::var wide = gx::broadcast_in_dim(var_of(ids), dims_of(out), detail::all_axes(ids.rank()));
    return gx::compare(iota, wide, gx::compare_direction::EQ);
}

/// One-hot rows: [ids..., classes] with 1 where the class equals the id (no gradient).
inline T one_hot(const T& ids, std::size_t classes) {
    const gx::var hit = class_hits(ids, classes);
    const gx::tensor_type type = gx::f32(hit.dims());
    return wrap(gx::select(hit, gx::constant(hit.owner(), 1.0, type), gx::constant(hit.owner(), 0.0, type)));
}

}  // namespace olmax::trace::primitives
