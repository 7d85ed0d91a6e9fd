#pragma once
// The ops' lowering rules: for each op that can run inside a traced program, its value in the
// traced primitives (primitives.hpp), whose recorded gradients make the op's backward. A rule is one
// overload `Out lower(op::<name>, Ts inputs, const op::<name>::attrs&)`; `register_all` registers
// one per entry of op::all (ops/op_keys.hpp) when this header is included, and does not compile when
// an entry has none (docs/ARCHITECTURE.md, "Adding an op").

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <vector>

#include "olmax/backend/trace_rules.hpp"
#include "olmax/nn/moe.hpp"
#include "olmax/nn/views.hpp"
#include "olmax/ops/conv.hpp"
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/embedding.hpp"
#include "olmax/ops/gather.hpp"
#include "olmax/ops/linalg.hpp"
#include "olmax/ops/loss.hpp"
#include "olmax/ops/math_rules.hpp"
#include "olmax/ops/norm.hpp"
#include "olmax/ops/op_keys.hpp"
#include "olmax/ops/reduction.hpp"
#include "olmax/ops/shape.hpp"
#include "olmax/scan/scan.hpp"
#include "olmax/scan/selective_scan.hpp"
#include "olmax/trace/primitives.hpp"
#include "olmax/trace/traced_number.hpp"

namespace olmax::trace {

namespace detail {

namespace p = primitives;
using Tf = Tensor<float>;
using Ts = std::span<const Tensor<float>>;
using Out = std::vector<Tensor<float>>;

/// The numpy broadcast of two shapes (the eager ops have checked that they broadcast).
inline Shape broadcast_shape(const Shape& a, const Shape& b) {
    const std::size_t rank = std::max(a.size(), b.size());
    Shape out(rank, 1);
    for (std::size_t i = 0; i < rank; ++i) {
        const std::size_t da = i + a.size() >= rank ? a[i + a.size() - rank] : 1, db = i + b.size() >= rank ? b[i + b.size() - rank] : 1;
        check<shape_error>(da == db || da == 1 || db == 1, "trace: shapes ", to_string(a), " and ", to_string(b), " do not broadcast");
        out[i] = da == 1 ? db : da;
    }
    return out;
}

/// An element-wise op of two operands broadcast to one shape (numpy's rules).
template <class F>
Out binary(Ts in, F f) {
    const Shape shape = broadcast_shape(in[0].shape(), in[1].shape());
    return {f(p::broadcast_to(in[0], shape), p::broadcast_to(in[1], shape))};
}

/// exp(x - max) along `axis` and its sum, the max carrying no gradient (as the eager ops' shift),
/// made safe for a line of -inf (every entry masked): its stabiliser is 0 instead of -inf and its
/// sum 1 instead of 0, so neither inf - inf nor 0 / 0 is formed (not even in a dropped branch of a
/// select, whose zero gradient would meet them). `masked` marks those lines ([.., 1, ..], i1).
struct ShiftedExp {
    gx::var masked;
    Tf max, safe_max, shifted, e, total;  // max, safe_max and total (the sum) keep the axis, of extent 1
};

inline gx::var below_every_float(const gx::var& v) {  // -inf
    return gx::compare(v, gx::constant_like(v, -double(std::numeric_limits<float>::max())), gx::compare_direction::LT);
}

inline ShiftedExp shifted_exp(const Tf& x, std::size_t axis) {
    ShiftedExp r;
    r.max = p::max_detached(x, axis);
    const gx::var mv = var_of(r.max);
    r.masked = below_every_float(mv);
    r.safe_max = p::constant(gx::select(r.masked, gx::constant_like(mv, 0.0), mv));
    r.shifted = p::sub(x, p::broadcast_to(r.safe_max, x.shape()));
    r.e = p::exp(r.shifted);
    r.total = p::select(r.masked, p::full(r.max.shape(), 1.0), p::sum(r.e, {std::int64_t(axis)}, true));
    return r;
}

/// log(sum(exp(x))) along `axis`, kept with extent 1: -inf with no gradient on a line of -inf,
/// as the eager op.
inline Tf logsumexp(const Tf& x, std::size_t axis) {
    const ShiftedExp s = shifted_exp(x, axis);
    return p::select(s.masked, p::full(s.max.shape(), -std::numeric_limits<double>::infinity()), p::add(p::log(s.total), s.safe_max));
}

/// Mean softmax cross-entropy of logits [N, V] against targets [N] (float32 class ids), plus
/// z_loss * mean(lse^2): the eager op's value, whose gradient the primitives' rules give. The
/// target's logit is picked by a select, not a product with the one-hot row, so that a masked
/// (-inf) logit elsewhere in the row does not make -inf * 0 = NaN. A row of -inf (every logit
/// masked) has lse = -inf with no gradient, as in the eager op: its loss is NaN (-inf - -inf) and
/// its gradient -onehot(target) / N.
inline Tensor<float> cross_entropy(const Tensor<float>& logits, const Tensor<float>& targets, double z_loss) {
    const std::size_t n = logits.shape()[0], vocab = logits.shape()[1];
    const Tensor<float> lse = logsumexp(logits, 1);  // [N, 1]
    const Tensor<float> picked = p::sum(p::select(p::class_hits(targets, vocab), logits, p::full(logits.shape(), 0.0)), {1}, true);
    Tensor<float> per_row = p::sub(lse, picked);
    if (z_loss != 0) per_row = p::add(per_row, p::scale(p::mul(lse, lse), z_loss));
    return p::scale(p::sum(per_row, {0, 1}, false), 1.0 / double(n));
}

/// L2 ScaleNorm (scale_norm) or RMSNorm over the last axis: x * r * w with r = 1 / max(||x||, eps)
/// or 1 / sqrt(mean(x^2) + eps), `w` undefined for no scale. r is formed from the sum of squares so
/// that a row of zeros (r clamped) has a finite gradient, as the eager op's.
inline Tensor<float> normalize(const Tensor<float>& x, const Tensor<float>& w, double eps, bool rms) {
    const std::size_t last = x.rank() - 1;
    const Tensor<float> sum_sq = p::sum(p::mul(x, x), {std::int64_t(last)}, true);
    const Tensor<float> clamped = rms ? p::add_scalar(p::scale(sum_sq, 1.0 / double(x.shape()[last])), eps)
                                      : p::maximum(sum_sq, p::full(sum_sq.shape(), eps * eps));
    const Tensor<float> r = p::div(p::full(sum_sq.shape(), 1.0), p::sqrt(clamped));
    Tensor<float> out = p::mul(x, p::broadcast_to(r, x.shape()));
    return w.defined() ? p::mul(out, p::broadcast_to(w, x.shape())) : out;
}

/// `x` [B, T, C] moved `steps` later along time (zeros enter at the front).
inline Tensor<float> shift_later(const Tensor<float>& x, std::size_t steps) {
    if (steps == 0) return x;
    const std::int64_t B = std::int64_t(x.shape()[0]), T = std::int64_t(x.shape()[1]), C = std::int64_t(x.shape()[2]), s = std::int64_t(steps);
    return p::slice(p::pad(x, {0, s, 0}, {0, 0, 0}), {0, 0, 0}, {B, T, C});
}

/// h_t = a_t h_{t-1} + x_t along axis 1 of [B, T, C] (from the end with `reverse`), from the state
/// h0 [B, C] (undefined: zeros), in `form` (by default the target device's: tracing::device_scan_form);
/// also returns the final state [B, C].
inline Out linear_scan(const Tensor<float>& gates, const Tensor<float>& x, const Tensor<float>& h0, bool reverse, bool log_gates,
                       const scan_form& form = active().device_scan_form()) {
    const std::size_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2];
    const Tf a = log_gates ? p::exp(gates) : gates;
    Tf in = x;
    if (h0.defined()) {  // a_first h0 enters at the first step processed
        const Tf start = p::pad(p::reshape(h0, {B, 1, C}), {0, reverse ? std::int64_t(T) - 1 : 0, 0}, {0, reverse ? 0 : std::int64_t(T) - 1, 0});
        in = p::add(x, p::mul(a, start));
    }
    const Tf h = p::linear_scan(a, in, form, reverse);
    const std::int64_t last = reverse ? 0 : std::int64_t(T) - 1;
    const Tf h_last = p::reshape(p::slice(h, {0, last, 0}, {std::int64_t(B), last + 1, std::int64_t(C)}), {B, C});
    return {h, h_last};
}

/// softmax (or log_softmax) along `axis`: x - max is exponentiated (the max carries no gradient,
/// as the eager op's shift), divided by (or, logged, minus the log of) its sum along the axis.
/// A line of -inf gives 0 (or -inf) and no gradient, as the eager op (shifted_exp); PyTorch and
/// JAX give NaN.
inline Tf softmax(const Tf& x, std::size_t axis, bool log) {
    const ShiftedExp s = shifted_exp(x, axis);
    const Tf total = p::broadcast_to(s.total, x.shape());
    if (!log) return p::div(s.e, total);
    return p::select(below_every_float(var_of(p::broadcast_to(s.max, x.shape()))), p::constant(var_of(s.shifted)), p::sub(s.shifted, p::log(total)));
}

/// MoE routing (nn::MoE's eager detail::route) inside the program, without a gradient: from the
/// router's probabilities p [N, E] of N = batch * sequence tokens (top k, capacity per expert and
/// sequence) to
///   keep [N, E]: 1 where token n's j-th choice (the j-th largest p, lowest index on ties) is e and
///                fewer than `capacity` earlier assignments (smaller positions) of its sequence went to e;
///   fraction [E]: the share of the k N choices that picked each expert, before capacity;
///   slot_token [E B C]: the token row n = b S + s held by expert e's slot c in sequence b
///                (C = min(capacity, S)); 0 for an empty slot, which no token reads back;
///   token_slot [N E]: each kept (n, e)'s slot row e B C + b C + c (0 where not kept, gate 0).
/// An assignment's slot c is its count of earlier assignments, an exclusive running sum along the
/// sequence (the program's linear scan, a = 1). The row maps let nn::MoE run each expert on its C
/// slots per sequence only (gather, batched GEMM, gather back) instead of on every token.
inline Out lower(op::moe_route, Ts in, const op::moe_route::attrs& a) {
    const Tf& probabilities = in[0];
    const std::int64_t batch = std::int64_t(a.batch), sequence = std::int64_t(a.sequence), k = std::int64_t(a.k), capacity = std::int64_t(a.capacity);
    const gx::var p = var_of(probabilities);
    const gx::dims_t ne = p.dims();
    const std::int64_t experts = ne.at(1);
    check<trace_error>(ne.at(0) == batch * sequence && k >= 1 && k <= experts, "olmax: moe_route: probabilities ", p.type().str(),
                       " do not match batch ", batch, " x sequence ", sequence, " with top ", k);
    gx::graph& g = p.owner();
    const gx::tensor_type type = gx::f32(ne);
    const gx::var index = gx::iota(g, type, 1), one = gx::constant(g, 1.0, type), zero = gx::constant(g, 0.0, type);
    gx::var left = p, chosen = zero;
    for (std::int64_t j = 0; j < k; ++j) {
        const gx::var best = gx::broadcast_in_dim(gx::max(left, {1}), ne, {0});
        const gx::var at_best = gx::select(gx::compare(left, best, gx::compare_direction::EQ), index, gx::constant(g, double(experts), type));
        const gx::var first = gx::broadcast_in_dim(-gx::max(-at_best, {1}), ne, {0});  // the lowest index among the maxima
        const gx::var pick = gx::compare(index, first, gx::compare_direction::EQ);
        chosen = chosen + gx::select(pick, one, zero);
        left = gx::select(pick, gx::constant(g, -1.0, type), left);  // probabilities are >= 0: never picked again
    }
    const gx::var steps = gx::reshape(chosen, {batch, sequence, experts});
    const gx::var running = gx::linear_scan(gx::constant(g, 1.0, steps.type()), steps, active().device_scan_form(), false);
    const gx::var earlier = gx::reshape(running - steps, ne);
    const gx::var room = gx::compare(earlier, gx::constant(g, double(capacity) - 0.5, type), gx::compare_direction::LT);
    const gx::var keep = gx::select(room, chosen, zero);
    // Slot maps, `slots` per expert and sequence (an expert takes at most one assignment per
    // token). In [B, S, E]: b and e by iota, the slot c = earlier (where kept).
    const std::int64_t slots = std::min(capacity, sequence);
    const gx::dims_t bse{batch, sequence, experts};
    const gx::var kept = gx::reshape(keep, bse), slot = gx::reshape(earlier, bse);
    const gx::tensor_type t_bse = gx::f32(bse);
    const gx::var b_index = gx::iota(g, t_bse, 0), e_index = gx::iota(g, t_bse, 2);
    const gx::var token_slot = gx::reshape(kept * (e_index * double(batch * slots) + b_index * double(slots) + slot), ne);
    // one_hot[b, s, e, c] = kept and slot == c; slot_token[b, e, c] = sum_s one_hot (b S + s).
    const gx::dims_t bsec{batch, sequence, experts, slots};
    const gx::tensor_type t_bsec = gx::f32(bsec);
    const gx::var hit = gx::compare(gx::broadcast_in_dim(slot, bsec, {0, 1, 2}), gx::iota(g, t_bsec, 3), gx::compare_direction::EQ);
    const gx::var one_hot = gx::select(hit, gx::broadcast_in_dim(kept, bsec, {0, 1, 2}), gx::constant(g, 0.0, t_bsec));
    const gx::var token = gx::iota(g, t_bsec, 0) * double(sequence) + gx::iota(g, t_bsec, 1);
    const gx::var slot_token = gx::reshape(gx::transpose(gx::sum(one_hot * token, {1}), {1, 0, 2}), {experts * batch * slots});
    return {wrap(keep), wrap(gx::sum(chosen, {0}) / double(k * batch * sequence)), wrap(slot_token), wrap(token_slot)};
}

/// 1 where x != 0 (NaN too), else 0, as a constant of the tape (the op has no gradient).
inline Tf nonzero_flags(const Tf& x) {
    const gx::var v = var_of(x);
    return wrap(gx::select(gx::compare(v, gx::constant_like(v, 0.0), gx::compare_direction::NE), gx::constant_like(v, 1.0), gx::constant_like(v, 0.0)));
}

/// Mamba's selective scan (scan/selective_scan.hpp). In a sequential scan form (CPUs): one primitive
/// fused over time that never stores the [B, T, E, N] states, as the eager op (its own kernels where
/// native calls are registered). Otherwise one linear scan over B E N rows in the device's form, from
/// the materialised abar = exp(delta A) (zeroed where a document starts) and drive delta u B.
inline Out lower(op::selective_scan, Ts in, const op::selective_scan::attrs&) {
    const Tf &u = in[0], &delta = in[1], &A = in[2], &B = in[3], &C = in[4], &D = in[5], &h0 = in[6], &resets = in[7];
    const std::size_t nb = u.shape()[0], nt = u.shape()[1], ne = u.shape()[2], ns = A.shape()[1];
    const Tf keep = resets.defined() ? p::add_scalar(p::neg(nonzero_flags(resets)), 1.0) : Tf();  // 0 where a document starts (resets != 0)
    Tf y, h_last;
    if (active().device_scan_form().strategy == scan_form::kind::sequential) {
        const auto out = p::selective_scan(u, delta, A, B, C, keep.defined() ? keep : p::full({nb, nt}, 1.0),
                                           h0.defined() ? h0 : p::full({nb, ne, ns}, 0.0), gx::selective_scan_chunk(std::int64_t(nt)),
                                           active().native_calls());
        y = out[0];
        h_last = out[1];
    } else {
        const Shape full{nb, nt, ne, ns};
        Tf abar = p::exp(p::mul(p::broadcast_to(p::reshape(delta, {nb, nt, ne, 1}), full), p::broadcast_to(A, full)));
        if (keep.defined()) abar = p::mul(abar, p::broadcast_to(p::reshape(keep, {nb, nt, 1, 1}), full));
        const Tf drive = p::mul(p::broadcast_to(p::reshape(p::mul(delta, u), {nb, nt, ne, 1}), full), p::broadcast_to(p::reshape(B, {nb, nt, 1, ns}), full));
        const Out h = linear_scan(p::reshape(abar, {nb, nt, ne * ns}), p::reshape(drive, {nb, nt, ne * ns}),
                                  h0.defined() ? p::reshape(h0, {nb, ne * ns}) : h0, false, false);
        y = p::sum(p::mul(p::reshape(h[0], full), p::broadcast_to(p::reshape(C, {nb, nt, 1, ns}), full)), {3}, false);
        h_last = p::reshape(h[1], {nb, ne, ns});
    }
    if (D.defined()) y = p::add(y, p::mul(u, p::broadcast_to(D, u.shape())));
    return {y, h_last};
}

/// An element-wise op whose value and derivative are a rule of math::rules (ops/math_rules.hpp),
/// the eager op's own: both are built in the program by the rule's code on traced numbers
/// (traced_number.hpp), and the tape records dy * derivative(x, y) as the op's gradient.
template <class Rule>
Tf from_math_rule(std::string_view name, const Tf& x, Rule rule = {}) {
    const gx::var v = var_of(x);
    const gx::var y = rule.value(traced_number(v)).value_like(v);
    return p::detail::record(name, {x}, wrap(y), [v, y, rule](const Tf& dy, autodiff::GradientSink<float>& sink) {
        sink.add(0, p::mul(dy, wrap(rule.derivative(traced_number(v), traced_number(y)).value_like(v))));
    });
}

// ---- the rules, one per key of op::all ----------------------------------------------------------

inline Out lower(op::add, Ts in, const op::add::attrs&) { return binary(in, p::add); }
inline Out lower(op::sub, Ts in, const op::sub::attrs&) { return binary(in, p::sub); }
inline Out lower(op::mul, Ts in, const op::mul::attrs&) { return binary(in, p::mul); }
inline Out lower(op::div, Ts in, const op::div::attrs&) { return binary(in, p::div); }
inline Out lower(op::maximum, Ts in, const op::maximum::attrs&) { return binary(in, p::maximum); }
/// min(a, b) = -max(-a, -b): the same ties (to a where a <= b) and NaN routing as the eager op.
inline Out lower(op::minimum, Ts in, const op::minimum::attrs&) {
    return binary(in, [](const Tf& a, const Tf& b) { return p::neg(p::maximum(p::neg(a), p::neg(b))); });
}
inline Out lower(op::exp, Ts in, const op::exp::attrs&) { return {from_math_rule<math::rules::exp>("exp", in[0])}; }
inline Out lower(op::log, Ts in, const op::log::attrs&) { return {from_math_rule<math::rules::log>("log", in[0])}; }
inline Out lower(op::sqrt, Ts in, const op::sqrt::attrs&) { return {from_math_rule<math::rules::sqrt>("sqrt", in[0])}; }
inline Out lower(op::rsqrt, Ts in, const op::rsqrt::attrs&) { return {from_math_rule<math::rules::rsqrt>("rsqrt", in[0])}; }
inline Out lower(op::square, Ts in, const op::square::attrs&) { return {from_math_rule<math::rules::square>("square", in[0])}; }
inline Out lower(op::tanh, Ts in, const op::tanh::attrs&) { return {from_math_rule<math::rules::tanh>("tanh", in[0])}; }
inline Out lower(op::sigmoid, Ts in, const op::sigmoid::attrs&) { return {from_math_rule<math::rules::sigmoid>("sigmoid", in[0])}; }
inline Out lower(op::relu, Ts in, const op::relu::attrs&) { return {from_math_rule<math::rules::relu>("relu", in[0])}; }
inline Out lower(op::silu, Ts in, const op::silu::attrs&) { return {from_math_rule<math::rules::silu>("silu", in[0])}; }
inline Out lower(op::hard_sigmoid, Ts in, const op::hard_sigmoid::attrs&) {
    return {from_math_rule<math::rules::hard_sigmoid>("hard_sigmoid", in[0])};
}
inline Out lower(op::softplus, Ts in, const op::softplus::attrs&) { return {from_math_rule<math::rules::softplus>("softplus", in[0])}; }
inline Out lower(op::nonzero, Ts in, const op::nonzero::attrs&) { return {nonzero_flags(in[0])}; }
inline Out lower(op::abs, Ts in, const op::abs::attrs&) { return {from_math_rule<math::rules::abs>("abs", in[0])}; }
inline Out lower(op::mish, Ts in, const op::mish::attrs&) { return {from_math_rule<math::rules::mish>("mish", in[0])}; }
inline Out lower(op::gelu, Ts in, const op::gelu::attrs&) { return {from_math_rule<math::rules::gelu>("gelu", in[0])}; }
inline Out lower(op::elephant, Ts in, const op::elephant::attrs& a) {
    return {from_math_rule("elephant", in[0], math::rules::elephant{a.a, a.d})};
}
inline Out lower(op::add_scalar, Ts in, const op::add_scalar::attrs& a) { return {p::add_scalar(in[0], a.value)}; }
inline Out lower(op::scale, Ts in, const op::scale::attrs& a) { return {p::scale(in[0], a.factor)}; }
inline Out lower(op::clamp, Ts in, const op::clamp::attrs& a) { return {from_math_rule("clamp", in[0], math::rules::clamp{a.lo, a.hi})}; }
inline Out lower(op::leaky_relu, Ts in, const op::leaky_relu::attrs& a) {
    return {from_math_rule("leaky_relu", in[0], math::rules::leaky_relu{a.slope})};
}

/// sum or mean over the key's axes.
inline Out reduce(const Tf& x, const std::vector<std::size_t>& axes, bool keepdims, bool average) {
    const std::vector<std::int64_t> ax(axes.begin(), axes.end());
    Tensor<float> y = p::sum(x, ax, keepdims);
    if (!average) return {y};
    double count = 1;
    for (auto axis : axes) count *= double(x.shape()[axis]);
    return {p::scale(y, count > 0 ? 1.0 / count : std::nan(""))};
}
inline Out lower(op::sum, Ts in, const op::sum::attrs& a) { return reduce(in[0], a.axes, a.keepdims, false); }
inline Out lower(op::mean, Ts in, const op::mean::attrs& a) { return reduce(in[0], a.axes, a.keepdims, true); }
/// The maximum over one axis, its gradient to the first maximal element as the eager op's (XLA's
/// reduce_max would split it among ties): the gradient is dy times the one-hot of the lowest index
/// where x equals the maximum (or is NaN, which the maximum then is).
inline Out lower(op::max, Ts in, const op::max::attrs& a) {
    const Tf& x = in[0];
    const gx::var v = var_of(x);
    const gx::dims_t dims = v.dims();
    const std::int64_t axis = std::int64_t(a.axis);
    gx::dims_t others;
    for (std::int64_t d = 0; d < std::int64_t(dims.size()); ++d)
        if (d != axis) others.push_back(d);
    const gx::var best = gx::max(v, {axis}), index = gx::iota(v.owner(), v.type(), axis);
    const gx::var beyond = gx::constant_like(v, double(dims[std::size_t(axis)]));
    const gx::var at_best = gx::select(gx::compare(v, gx::broadcast_in_dim(best, dims, others), gx::compare_direction::EQ), index,
                                       gx::select(gx::compare(v, v, gx::compare_direction::NE), index, beyond));
    const gx::var first = gx::broadcast_in_dim(-gx::max(-at_best, {axis}), dims, others);
    const Tf pick = wrap(gx::select(gx::compare(index, first, gx::compare_direction::EQ), gx::constant_like(v, 1.0), gx::constant_like(v, 0.0)));
    Shape kept = x.shape();
    kept[a.axis] = 1;
    Shape reduced = x.shape();
    reduced.erase(reduced.begin() + std::ptrdiff_t(a.axis));
    const Tf y = p::reshape(wrap(best), a.keepdims ? kept : reduced);
    return {p::detail::record("max", {x}, y, [pick, kept](const Tf& dy, autodiff::GradientSink<float>& sink) {
        sink.add(0, p::mul(p::broadcast_to(p::reshape(dy, kept), pick.shape()), pick));
    })};
}

inline Out lower(op::reshape, Ts in, const op::reshape::attrs& a) { return {p::reshape(in[0], a.shape)}; }
inline Out lower(op::transpose, Ts in, const op::transpose::attrs& a) {
    return {p::transpose(in[0], std::vector<std::int64_t>(a.perm.begin(), a.perm.end()))};
}
inline Out lower(op::slice, Ts in, const op::slice::attrs& a) {
    gx::dims_t start(in[0].rank(), 0), limit = dims_of(in[0].shape());
    start[a.axis] = std::int64_t(a.begin);
    limit[a.axis] = std::int64_t(a.end);
    return {p::slice(in[0], start, limit)};
}
/// The border gets `value`, x does not: x padded with zeros, plus value - value inside.
inline Out lower(op::pad, Ts in, const op::pad::attrs& a) {
    gx::dims_t low(in[0].rank(), 0), high(in[0].rank(), 0);
    low[a.axis] = std::int64_t(a.before);
    high[a.axis] = std::int64_t(a.after);
    Tf y = p::pad(in[0], low, high);
    if (a.value != 0) y = p::add_scalar(p::add(y, p::pad(p::full(in[0].shape(), -a.value), low, high)), a.value);
    return {y};
}
inline Out lower(op::concat, Ts in, const op::concat::attrs& a) { return {p::concatenate(std::vector<Tf>(in.begin(), in.end()), a.axis)}; }
inline Out lower(op::stack_leading, Ts in, const op::stack_leading::attrs&) { return {p::stack_leading(std::vector<Tf>(in.begin(), in.end()))}; }
inline Out lower(op::take_leading, Ts in, const op::take_leading::attrs& a) { return {p::take_leading(in[0], a.index)}; }

/// An op's GEMM: at the trace's precision (tracing::bf16_gemms: operands rounded to bfloat16 and f32
/// sums, forward and backward, as the eager ops' GEMMs under the bf16 policy).
inline Tf gemm(const Tf& a, const Tf& b) { return p::matmul(a, b, active().bf16_gemms()); }

/// [..., m, k] x [k, n] (the leading axes folded into m), or [..., m, k] x [..., k, n] with equal
/// leading axes (folded into one batch axis). The op has checked the shapes.
inline Out lower(op::matmul, Ts in, const op::matmul::attrs&) {
    const Tf &a = in[0], &b = in[1];
    const std::size_t m = a.shape()[a.rank() - 2], k = a.shape().back(), n = b.shape().back();
    Shape out = a.shape();
    out.back() = n;
    if (b.rank() == 2) return {p::reshape(gemm(p::reshape(a, {a.size() / (k ? k : 1), k}), b), out)};
    std::size_t batch = 1;
    for (std::size_t d = 0; d + 2 < a.rank(); ++d) batch *= a.shape()[d];
    return {p::reshape(gemm(p::reshape(a, {batch, m, k}), p::reshape(b, {batch, k, n})), out)};
}
/// x [..., K (axis), ...] with w [K, N]: the axis moved last, one product, moved back.
inline Out lower(op::contract_axis, Ts in, const op::contract_axis::attrs& a) {
    const Tf &x = in[0], &w = in[1];
    const std::size_t axis = a.axis, rank = x.rank();
    std::vector<std::int64_t> to_last, back(rank);
    for (std::size_t d = 0; d < rank; ++d)
        if (d != axis) to_last.push_back(std::int64_t(d));
    to_last.push_back(std::int64_t(axis));
    for (std::size_t d = 0; d < rank; ++d) back[std::size_t(to_last[d])] = std::int64_t(d);
    const Tf moved = axis + 1 == rank ? x : p::transpose(x, to_last);
    const std::size_t k = w.shape()[0], rows = x.size() / (k ? k : 1);
    Shape out = moved.shape();
    out.back() = w.shape()[1];
    const Tf y = p::reshape(gemm(p::reshape(moved, {rows, k}), w), out);
    return {axis + 1 == rank ? y : p::transpose(y, back)};
}
/// table [V, F], ids (any shape) -> ids.shape + [F], as one-hot rows times the table.
inline Out lower(op::embedding, Ts in, const op::embedding::attrs&) {
    const Tf &table = in[0], &ids = in[1];
    const std::size_t vocab = table.shape()[0], features = table.shape()[1], n = ids.size();
    active().require_indices(var_of(ids), vocab, "embedding", "id");
    const Tf rows = p::matmul(p::reshape(p::one_hot(ids, vocab), {n, vocab}), table);
    Shape out = ids.shape();
    out.push_back(features);
    return {p::reshape(rows, out)};
}
/// out[b, t] = sum_k x[b, t - (K-1-k)] w[k]: one GEMM over the K shifted copies side by side, or
/// with groups one batched GEMM over the groups (group g: input channels [g Cg, (g+1) Cg), output
/// channels [g Og, (g+1) Og)).
inline Out lower(op::causal_conv1d, Ts in, const op::causal_conv1d::attrs& a) {
    const Tf &x = in[0], &w = in[1];
    const std::size_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2], K = w.shape()[0], O = w.shape()[2];
    const std::size_t G = a.groups, Cg = C / G, Og = O / G;
    std::vector<Tf> taps;
    for (std::size_t k = 0; k < K; ++k) taps.push_back(shift_later(x, K - 1 - k));
    const Tf shifted = K == 1 ? taps[0] : p::concatenate(taps, 2);  // [B, T, K C], tap-major
    Tf y;
    if (G == 1) {
        y = p::reshape(gemm(p::reshape(shifted, {B * T, K * C}), p::reshape(w, {K * C, O})), {B, T, O});
    } else {
        const Tf columns = p::reshape(p::transpose(p::reshape(shifted, {B * T, K, G, Cg}), {2, 0, 1, 3}), {G, B * T, K * Cg});
        const Tf weights = p::reshape(p::transpose(p::reshape(w, {K, Cg, G, Og}), {2, 0, 1, 3}), {G, K * Cg, Og});
        y = p::reshape(p::transpose(gemm(columns, weights), {1, 0, 2}), {B, T, O});  // [G, B T, Og] -> [B T, G, Og]
    }
    if (in.size() > 2 && in[2].defined()) y = p::add(y, p::broadcast_to(in[2], y.shape()));
    return {y};
}
inline Out lower(op::scale_norm, Ts in, const op::scale_norm::attrs& a) { return {normalize(in[0], in[1], a.eps, false)}; }
inline Out lower(op::rms_norm, Ts in, const op::rms_norm::attrs& a) { return {normalize(in[0], in[1], a.eps, true)}; }
inline Out lower(op::softmax, Ts in, const op::softmax::attrs& a) { return {softmax(in[0], a.axis, false)}; }
inline Out lower(op::log_softmax, Ts in, const op::log_softmax::attrs& a) { return {softmax(in[0], a.axis, true)}; }
inline Out lower(op::logsumexp, Ts in, const op::logsumexp::attrs& a) {
    Tf lse = logsumexp(in[0], a.axis);
    if (a.keepdims) return {lse};
    Shape dropped = lse.shape();
    dropped.erase(dropped.begin() + std::ptrdiff_t(a.axis));
    return {p::reshape(lse, dropped)};
}
inline Out lower(op::cross_entropy, Ts in, const op::cross_entropy::attrs& a) {
    active().require_indices(var_of(in[1]), in[0].shape()[1], "cross_entropy", "target");
    return {cross_entropy(in[0], in[1], a.z_loss)};
}
/// hidden [N, F], w_out [F, V], targets [N]: the value leaves out the z-loss term that the
/// gradient includes (ops/loss.hpp).
inline Out lower(op::chunked_cross_entropy, Ts in, const op::chunked_cross_entropy::attrs& a) {
    active().require_indices(var_of(in[2]), in[1].shape()[1], "chunked_cross_entropy", "target");
    const Tf logits = gemm(in[0], in[1]);
    const Tf full = cross_entropy(logits, in[2], a.z_loss);
    if (a.z_loss == 0) return {full};
    const Tf plain = cross_entropy(logits, in[2], 0.0);
    return {p::add(full, wrap(var_of(plain) - var_of(full)))};  // value: the plain loss; gradient: the full one's
}
inline Out lower(op::gather_rows, Ts in, const op::gather_rows::attrs&) {
    active().require_indices(var_of(in[1]), in[0].shape()[0], "gather_rows", "index");
    return {p::gather_rows(in[0], in[1])};
}
inline Out lower(op::scatter_rows, Ts in, const op::scatter_rows::attrs& a) {
    active().require_indices(var_of(in[1]), a.rows, "scatter_rows", "index");
    return {p::scatter_add_rows(in[0], in[1], a.rows)};
}
inline Out lower(op::linear_scan, Ts in, const op::linear_scan::attrs& a) {
    return linear_scan(in[0], in[1], in[2], a.reverse, a.log_gates, active().scan_form_for(a.strategy, a.chunk));
}

/// The matrix scan from h0: its first step processed (the last one with `reverse`) gets M h0 added
/// to its input, then one matrix_scan primitive from a zero state; h_last is that scan's last step.
inline Out lower(op::matrix_scan, Ts in, const op::matrix_scan::attrs& a) {
    const std::int64_t B = std::int64_t(in[1].shape()[0]), n = std::int64_t(in[1].shape()[1]), K = std::int64_t(in[1].shape()[2]),
                       V = std::int64_t(in[1].shape()[3]);
    const std::int64_t first = a.reverse ? n - 1 : 0, last = a.reverse ? 0 : n - 1;
    auto step = [&](const Tf& x, std::int64_t t) {  // x[:, t] of [B, n, R, S] as [B, R, S]
        const std::int64_t R = std::int64_t(x.shape()[2]), S = std::int64_t(x.shape()[3]);
        return p::reshape(p::slice(x, {0, t, 0, 0}, {B, t + 1, R, S}), {std::size_t(B), std::size_t(R), std::size_t(S)});
    };
    Tf drive = in[1];
    if (in[2].defined()) {
        const Tf entering = p::reshape(p::matmul(step(in[0], first), in[2]), {std::size_t(B), 1, std::size_t(K), std::size_t(V)});
        drive = p::add(drive, p::pad(entering, {0, first, 0, 0}, {0, n - 1 - first, 0, 0}));
    }
    const Tf h = p::matrix_scan(in[0], drive, a.reverse);
    return {h, step(h, last)};
}

// ---- registration -------------------------------------------------------------------------------

/// Whether key K has its rule above.
template <class K>
concept lowered = requires(Ts in, const typename K::attrs& a) {
    { lower(K{}, in, a) } -> std::same_as<Out>;
};

template <class K>
void register_key() {
    static_assert(lowered<K>, "olmax: an entry of op::all has no lowering rule: write `Out lower(op::<name>, Ts, const op::<name>::attrs&)` "
                              "in olmax/trace/rules.hpp");
    backend::trace::register_rule<K>([](Ts in, const typename K::attrs& a) { return lower(K{}, in, a); });
}

template <class... K>
bool register_keys(op::key_list<K...>) {
    (register_key<K>(), ...);
    return true;
}

/// Registers the rule of every entry of op::all in the process's registry (backend::trace::rules()).
inline bool register_all() { return register_keys(op::all{}); }

}  // namespace detail

/// Set when this header is included: the rules are registered once per process, before main.
inline const bool rules_registered = detail::register_all();

}  // namespace olmax::trace
