#pragma once
// The tensor ops olmax's layers are made of (olmax/ops), written in traced primitives so that a
// layer's lowering rule (nn layers' `lower`, lowering.hpp) reads like its eager forward. Each is a
// composition: its gradient comes from the primitives' rules, and the tests check it against the
// eager op in double precision (tests/unit/test_xla_lowering.cpp).

#include <algorithm>
#include <cstdint>
#include <vector>

#include "olmax/backend/xla/graph/graph.hpp"

namespace olmax::xla::graph {

/// The dimensions 0 .. rank-2 (every axis but the last).
inline dims_t leading_axes(const var& x) {
    dims_t axes;
    for (std::int64_t d = 0; d + 1 < static_cast<std::int64_t>(x.type().rank()); ++d) axes.push_back(d);
    return axes;
}

/// x / max(||x||_2, eps) over the last axis, times `scale` [F] when it is defined (the original
/// Olmax's ScaleNorm; ops::scale_norm).
inline var scale_norm(const var& x, const var& scale, double eps) {
    const std::int64_t last = static_cast<std::int64_t>(x.type().rank()) - 1;
    check<graph_error>(last >= 0, "xla::graph: scale_norm of a scalar");
    // max(||x||, eps) as sqrt(max(||x||^2, eps^2)): on a clamped (e.g. all-zero) row the gradient
    // then stops at the maximum instead of meeting sqrt's infinite slope at 0 (0 * inf = NaN).
    const var floor_sq = constant(x.owner(), eps * eps, f32(dims_t(x.dims().begin(), x.dims().end() - 1)));
    const var norm = sqrt(maximum(sum(x * x, {last}), floor_sq));
    var out = x / broadcast_in_dim(norm, x.dims(), leading_axes(x));
    if (scale.defined()) {
        check<graph_error>(scale.dims() == dims_t{x.dims().back()}, "xla::graph: scale_norm: scale ", scale.type().str(),
                           " does not match the last axis of ", x.type().str());
        out = out * broadcast_in_dim(scale, x.dims(), {last});
    }
    return out;
}

/// x for x >= 0, slope x below (ops::leaky_relu).
inline var leaky_relu(const var& x, double slope) {
    return select(compare(x, constant_like(x, 0.0), compare_direction::LT), x * slope, x);
}

/// log(1 + exp(x)) as max(x, 0) + log(1 + exp(-|x|)), which never overflows (ops::softplus).
inline var softplus(const var& x) {
    const var zero = constant_like(x, 0.0);
    return maximum(x, zero) + log(exp(-maximum(x, -x)) + 1.0);
}

/// clamp((x + 3) / 6, 0, 1) (ops::hard_sigmoid, the QRNN's forget gate).
inline var hard_sigmoid(const var& x) {
    const var lifted = maximum((x + 3.0) / 6.0, constant_like(x, 0.0));
    return -maximum(-lifted, constant_like(x, -1.0));
}

/// The linear recurrence h_t = a_t h_{t-1} + x_t along `axis` (h_{-1} = 0; olmax::scan::scan): the
/// axis moved last and the rest flattened into rows for the linear_scan primitive
/// (linear_scan_rows), which lowers by `strategy` and differentiates by the exact adjoint.
inline var linear_scan(const var& a, const var& x, std::int64_t axis,
                       const stablehlo::scan_strategy& strategy = stablehlo::scan_strategy::chunked_matmul<128>()) {
    const auto rank = static_cast<std::int64_t>(x.type().rank());
    check<graph_error>(a.type() == x.type() && axis >= 0 && axis < rank, "xla::graph: linear_scan: a ", a.type().str(), " and x ",
                       x.type().str(), " must agree, axis ", axis, " in range");
    dims_t to_last, back(static_cast<std::size_t>(rank));
    for (std::int64_t d = 0; d < rank; ++d)
        if (d != axis) to_last.push_back(d);
    to_last.push_back(axis);
    for (std::size_t d = 0; d < to_last.size(); ++d) back[static_cast<std::size_t>(to_last[d])] = static_cast<std::int64_t>(d);
    const bool moved = axis != rank - 1;
    const var at = moved ? transpose(a, to_last) : a, xt = moved ? transpose(x, to_last) : x;
    const std::int64_t steps = x.dims()[static_cast<std::size_t>(axis)], rows = x.type().elements() / std::max<std::int64_t>(steps, 1);
    const var h = reshape(linear_scan_rows(reshape(at, {rows, steps}), reshape(xt, {rows, steps}), strategy), at.dims());
    return moved ? transpose(h, back) : h;
}

/// Causal 1-D convolution along time of x [B, T, Cin] with w [K, Cin, Cout]:
/// out[b, t] = sum_k x[b, t - (K-1-k)] w[k] (ops::causal_conv1d, one group, no bias), as one GEMM
/// over the K shifted copies of x side by side: [B T, K Cin] x [K Cin, Cout].
inline var causal_conv1d(const var& x, const var& w) {
    check<graph_error>(x.type().rank() == 3 && w.type().rank() == 3 && w.dims()[1] == x.dims()[2], "xla::graph: causal_conv1d: x ",
                       x.type().str(), " (want [B, T, Cin]) and w ", w.type().str(), " (want [K, Cin, Cout]) do not match");
    const std::int64_t B = x.dims()[0], T = x.dims()[1], C = x.dims()[2], K = w.dims()[0], O = w.dims()[2];
    std::vector<var> taps;
    for (std::int64_t k = 0; k < K; ++k) taps.push_back(shift_later(x, 1, K - 1 - k));
    const var columns = reshape(concatenate(taps, 2), {B * T, K * C});
    return reshape(matmul(columns, reshape(w, {K * C, O})), {B, T, O});
}

/// Slice i of the leading axis, without that axis ([n, ...] -> [...]; nn::take_leading).
inline var take_leading(const var& x, std::int64_t i) {
    check<graph_error>(x.type().rank() >= 1 && i >= 0 && i < x.dims()[0], "xla::graph: take_leading: index ", i, " of ", x.type().str());
    dims_t start(x.type().rank(), 0), limit = x.dims();
    start[0] = i;
    limit[0] = i + 1;
    return reshape(slice(x, start, limit), dims_t(x.dims().begin() + 1, x.dims().end()));
}

/// The parts (equal types) stacked along a new leading axis ([...] x n -> [n, ...]; nn::stack_leading).
inline var stack_leading(const std::vector<var>& parts) {
    check<graph_error>(!parts.empty(), "xla::graph: stack_leading of nothing");
    std::vector<var> rows;
    for (const auto& p : parts) {
        dims_t one{1};
        one.insert(one.end(), p.dims().begin(), p.dims().end());
        rows.push_back(reshape(p, one));
    }
    return concatenate(rows, 0);
}

/// onehot(ids)[n, v] = (ids[n] == v), for f32 ids [N] and `vocab` classes.
inline var one_hot(const var& ids, std::int64_t vocab) {
    check<graph_error>(ids.type().rank() == 1, "xla::graph: one_hot takes ids [N], got ", ids.type().str());
    const dims_t nv{ids.dims()[0], vocab};
    const var classes = iota(ids.owner(), f32(nv), 1);
    const var hit = compare(broadcast_in_dim(ids, nv, {0}), classes, compare_direction::EQ);
    return select(hit, constant(ids.owner(), 1.0, f32(nv)), constant(ids.owner(), 0.0, f32(nv)));
}

/// Mean over rows of logsumexp(logits) - logits[target] (logits [N, V], targets f32 [N]).
inline var cross_entropy(const var& logits, const var& targets) {
    const var picked = sum(one_hot(targets, logits.dims()[1]) * logits, {1});
    return mean(logsumexp_last(logits) - picked, {0});
}

}  // namespace olmax::xla::graph
