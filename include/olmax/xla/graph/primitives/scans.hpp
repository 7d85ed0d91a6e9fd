#pragma once
// The scans: the linear recurrence h_t = a_t h_{t-1} + x_t (linear_scan), the same with a matrix
// for a_t (matrix_scan) and Mamba's selective scan fused over time with its gradient
// (selective_scan, selective_scan_backward).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/xla/graph/ir.hpp"
#include "olmax/xla/graph/primitives/dot.hpp"
#include "olmax/xla/graph/primitives/elementwise.hpp"
#include "olmax/xla/graph/primitives/structure.hpp"
#include "olmax/xla/stablehlo/scan.hpp"
#include "olmax/xla/stablehlo/selective_scan.hpp"

namespace olmax::xla::graph {

namespace prim {

/// The linear recurrence h_t = a_t h_{t-1} + x_t along dimension 1 of [B, T, ...] values from a zero
/// state, or (`axis` 1) h_t = a_t h_{t+1} + x_t from the end (the direction of its adjoint). One
/// primitive, so that its gradient is the exact adjoint (one scan in the other direction plus
/// element-wise work, keeping only h: linear memory). `scan` picks its lowering (stablehlo/scan.hpp),
/// not its values.
struct linear_scan {
    static constexpr std::string_view name = "linear_scan";
    static constexpr bool saved_by_kept_layers = true;
    static var make(const var& a, const var& x, const stablehlo::scan_strategy& strategy, bool reverse) {
        detail::same_type(name, a, x);
        detail::require_f32(name, x);
        check<graph_error>(x.type().rank() >= 2, "xla::graph: linear_scan takes [B, T, ...] (time along dimension 1), got ", x.type().str());
        check<graph_error>(strategy.strategy != stablehlo::scan_strategy::kind::chunked_matmul || strategy.chunk >= 1,
                           "xla::graph: linear_scan: chunked_matmul's chunk must be positive, got ", strategy.chunk);
        node n = detail::make_node<linear_scan>({a, x}, x.type());
        n.scan = strategy;
        n.axis = reverse ? 1 : 0;
        return detail::commit(std::move(n));
    }
    static value emit(function_builder& b, const node& n, const std::vector<value>& in) {
        if (n.axis == 0) return stablehlo::emit_scan(b, n.scan, in[0], in[1]);
        // from the end: the forward scan of the time-reversed rows, reversed back
        return b.reverse(stablehlo::emit_scan(b, n.scan, b.reverse(in[0], {1}), b.reverse(in[1], {1})), {1});
    }
    static void evaluate(const node& n, const std::vector<const host_value*>& in, host_value& out) {  // in time order (from the end when reversed)
        const std::size_t lead = std::size_t(out.type.dims[0]), steps = std::size_t(out.type.dims[1]);
        const std::size_t inner = out.data.size() / std::max<std::size_t>(1, lead * steps);
        for (std::size_t l = 0; l < lead; ++l)
            for (std::size_t i = 0; i < inner; ++i) {
                double h = 0;
                for (std::size_t k = 0; k < steps; ++k) {
                    const std::size_t at = (l * steps + (n.axis ? steps - 1 - k : k)) * inner + i;
                    h = in[0]->data[at] * h + in[1]->data[at];
                    out.data[at] = h;
                }
            }
    }
    /// The same scan run the other way: lambda_t = g_t + a_{t+1} lambda_{t+1}, dx = lambda,
    /// da_t = lambda_t h_{t-1}.
    static void gradient(vjp& v) {
        const bool reverse = v.n.axis != 0;
        const std::int64_t toward = reverse ? 1 : -1;  // the gates of the step the adjoint comes from
        const var next_gate = shift(v.x[0], 1, toward);
        const var lambda = make(next_gate, v.gy[0], v.n.scan, !reverse);
        if (v.needs(0)) v.dx[0] = multiply::make(lambda, shift(v.y[0], 1, -toward));
        v.dx[1] = lambda;
    }
};

/// The linear recurrence with a matrix for the gate, h_t = M_t h_{t-1} + X_t, along dimension 1 of
/// M [B, n, K, K] and X [B, n, K, V] from a zero state (`axis` 1: h_t = M_t h_{t+1} + X_t from the
/// end): h [B, n, K, V], the state after every step. A chunked form's chunk-to-chunk state passing
/// (the gated delta rule's) is one, so that a program holds one loop, not n steps unrolled: its size
/// and compile time do not grow with n. Lowered to one `stablehlo.while` over n with one batched
/// dot_general a step (n <= unrolled_steps: those steps one after another), in f32 under every precision policy (a recurrent state in bf16 would round
/// at every step). Its gradient is the same scan run the other way with the transposed gates,
/// lambda_t = g_t + M_{t+1}^T lambda_{t+1}, then dX = lambda and dM_t = lambda_t h_{t-1}^T (one
/// batched product), keeping only h: linear memory.
struct matrix_scan {
    static constexpr std::string_view name = "matrix_scan";
    static constexpr bool saved_by_kept_layers = true;
    static var make(const var& m, const var& x, bool reverse) {
        detail::require_f32(name, m);
        detail::require_f32(name, x);
        const dims_t& md = m.dims();
        const dims_t& xd = x.dims();
        check<graph_error>(md.size() == 4 && xd.size() == 4 && md[0] == xd[0] && md[1] == xd[1] && md[2] == md[3] && md[3] == xd[2],
                           "xla::graph: matrix_scan takes gates [B, n, K, K] and inputs [B, n, K, V], got ", m.type().str(), " and ",
                           x.type().str());
        node n = detail::make_node<matrix_scan>({m, x}, x.type());
        n.axis = reverse ? 1 : 0;
        return detail::commit(std::move(n));
    }
    /// Up to this many steps are written out one after another instead of looped: a loop of one to
    /// a few iterations (a chunked form at short T) costs XLA more than its copies of the step.
    static constexpr std::int64_t unrolled_steps = 4;
    static value emit(function_builder& b, const node& n, const std::vector<value>& in) {
        const bool reverse = n.axis != 0;
        const value m = reverse ? b.reverse(in[0], {1}) : in[0], x = reverse ? b.reverse(in[1], {1}) : in[1];
        const std::int64_t batch = x.type.dims[0], steps = x.type.dims[1], K = x.type.dims[2], V = x.type.dims[3];
        const dims_t state{batch, K, V};
        if (steps <= unrolled_steps) {
            std::vector<value> parts;
            value h;
            for (std::int64_t t = 0; t < steps; ++t) {
                const value drive = b.reshape(b.slice(x, {0, t, 0, 0}, {batch, t + 1, K, V}), state);
                if (t == 0) {
                    h = drive;  // from a zero state
                } else {
                    const value gate = b.reshape(b.slice(m, {0, t, 0, 0}, {batch, t + 1, K, K}), {batch, K, K});
                    h = b.add(b.dot_general(gate, h, {0}, {0}, {2}, {1}), drive);
                }
                parts.push_back(b.reshape(h, {batch, 1, K, V}));
            }
            const value all = steps == 1 ? parts[0] : b.concatenate(parts, 1);
            return reverse ? b.reverse(all, {1}) : all;
        }
        // Each step's slice is read in place: B runs of K K (or K V) contiguous elements.
        const auto results = b.while_loop(
            {b.index(0), b.constant(0.0, f32(state)), b.constant(0.0, x.type), m, x},
            [steps](function_builder& r, const std::vector<value>& c) { return r.compare(c[0], r.index(steps), compare_direction::LT); },
            [](function_builder& r, const std::vector<value>& c) {
                const value gate = r.dynamic_index(c[3], 1, c[0]), drive = r.dynamic_index(c[4], 1, c[0]);
                const value h = r.add(r.dot_general(gate, c[1], {0}, {0}, {2}, {1}), drive);  // [B, K, K] x [B, K, V]
                return std::vector<value>{r.add(c[0], r.index(1)), h, r.dynamic_index_update(c[2], 1, h, c[0]), c[3], c[4]};
            });
        return reverse ? b.reverse(results[2], {1}) : results[2];
    }
    static void evaluate(const node& n, const std::vector<const host_value*>& in, host_value& out) {
        const auto& d = out.type.dims;
        const std::size_t batch = std::size_t(d[0]), steps = std::size_t(d[1]), K = std::size_t(d[2]), V = std::size_t(d[3]);
        std::vector<double> h(K * V), next(K * V);
        for (std::size_t b = 0; b < batch; ++b) {
            std::fill(h.begin(), h.end(), 0.0);
            for (std::size_t k = 0; k < steps; ++k) {
                const std::size_t t = n.axis ? steps - 1 - k : k;
                const double* gate = in[0]->data.data() + (b * steps + t) * K * K;
                const double* drive = in[1]->data.data() + (b * steps + t) * K * V;
                for (std::size_t i = 0; i < K; ++i)
                    for (std::size_t j = 0; j < V; ++j) {
                        double s = drive[i * V + j];
                        for (std::size_t l = 0; l < K; ++l) s += gate[i * K + l] * h[l * V + j];
                        next[i * V + j] = s;
                    }
                h.swap(next);
                std::copy(h.begin(), h.end(), out.data.begin() + std::ptrdiff_t((b * steps + t) * K * V));
            }
        }
    }
    static void gradient(vjp& v) {
        const bool reverse = v.n.axis != 0;
        const std::int64_t toward = reverse ? 1 : -1;  // the gates of the step the adjoint comes from
        const var next_gate = shift(transpose::make(v.x[0], {0, 1, 3, 2}), 1, toward);
        const var lambda = make(next_gate, v.gy[0], !reverse);
        if (v.needs(0)) {  // dM_t = lambda_t h_{t-1}^T, one batched product over [B n]
            const dims_t& d = v.y[0].dims();
            const dims_t rows{d[0] * d[1], d[2], d[3]};
            const var earlier = shift(v.y[0], 1, -toward);
            v.dx[0] = reshape::make(dot::make(reshape::make(lambda, rows), reshape::make(earlier, rows), 1, 1), {d[0], d[1], d[2], d[2]});
        }
        v.dx[1] = lambda;
    }
};

}  // namespace prim

/// The checkpoint chunk of a fused selective scan over `steps`: the smallest power of two at least
/// sqrt(steps), which keeps its memory near the minimum, B E N (steps / chunk + chunk).
inline std::int64_t selective_scan_chunk(std::int64_t steps) {
    std::int64_t chunk = 1;
    while (chunk * chunk < steps) chunk *= 2;
    return chunk;
}

namespace detail {

/// The shape rule shared by selective_scan and its backward: u, delta [B, T, E]; A [E, N];
/// Bm, C [B, T, N]; keep [B, T]; a state [B, E, N].
inline void check_selective_scan(std::string_view name, const var& u, const var& delta, const var& A, const var& Bm, const var& C, const var& keep,
                                 const var& state, std::int64_t chunk) {
    for (const var* v : {&u, &delta, &A, &Bm, &C, &keep, &state}) require_f32(name, *v);
    const dims_t& d = u.dims();
    const bool ranks = d.size() == 3 && A.dims().size() == 2;
    const std::int64_t n = ranks ? A.dims()[1] : 0;
    check<graph_error>(ranks && delta.dims() == d && A.dims()[0] == d[2] && Bm.dims() == dims_t{d[0], d[1], n} && C.dims() == Bm.dims() &&
                           keep.dims() == dims_t{d[0], d[1]} && state.dims() == dims_t{d[0], d[2], n} && chunk >= 1,
                       "xla::graph: ", name, " takes u, delta [B, T, E], A [E, N], B, C [B, T, N], keep [B, T], a state [B, E, N] and a ",
                       "positive chunk; got u ", u.type().str(), ", delta ", delta.type().str(), ", A ", A.type().str(), ", B ", Bm.type().str(),
                       ", C ", C.type().str(), ", keep ", keep.type().str(), ", state ", state.type().str(), ", chunk ", chunk);
}

/// selective_scan in double, every state kept: (y, h_last, the states entering each chunk).
/// in: u, delta [B, T, E], A [E, N], Bm, C [B, T, N], keep [B, T], h0 [B, E, N].
struct selective_scan_states {
    std::size_t batch, steps, channels, states;
    std::vector<double> h;  // [B, T + 1, E, N]: h[b, t] is the state entering step t
    double& at(std::size_t b, std::size_t t, std::size_t e, std::size_t n) { return h[((b * (steps + 1) + t) * channels + e) * states + n]; }
};
inline selective_scan_states run_selective_scan(const std::vector<const host_value*>& in) {
    const dims_t& d = in[0]->type.dims;
    selective_scan_states s{std::size_t(d[0]), std::size_t(d[1]), std::size_t(d[2]), std::size_t(in[2]->type.dims[1]), {}};
    s.h.assign(s.batch * (s.steps + 1) * s.channels * s.states, 0.0);
    const auto &u = in[0]->data, &delta = in[1]->data, &A = in[2]->data, &Bm = in[3]->data, &keep = in[5]->data, &h0 = in[6]->data;
    for (std::size_t b = 0; b < s.batch; ++b)
        for (std::size_t e = 0; e < s.channels; ++e)
            for (std::size_t n = 0; n < s.states; ++n) {
                s.at(b, 0, e, n) = h0[(b * s.channels + e) * s.states + n];
                for (std::size_t t = 0; t < s.steps; ++t) {
                    const std::size_t bte = (b * s.steps + t) * s.channels + e;
                    const double abar = std::exp(delta[bte] * A[e * s.states + n]) * keep[b * s.steps + t];
                    s.at(b, t + 1, e, n) = abar * s.at(b, t, e, n) + delta[bte] * u[bte] * Bm[(b * s.steps + t) * s.states + n];
                }
            }
    return s;
}
inline std::vector<host_value> selective_scan_reference(const node& nd, const std::vector<const host_value*>& in) {
    selective_scan_states s = run_selective_scan(in);
    const auto chunk = std::size_t(nd.axis);
    std::vector<host_value> out;
    for (const auto& type : nd.outputs) out.push_back({type, std::vector<double>(std::size_t(type.elements()), 0.0)});
    const auto& C = in[4]->data;
    for (std::size_t b = 0; b < s.batch; ++b)
        for (std::size_t e = 0; e < s.channels; ++e)
            for (std::size_t n = 0; n < s.states; ++n) {
                for (std::size_t t = 0; t < s.steps; ++t)
                    out[0].data[(b * s.steps + t) * s.channels + e] += C[(b * s.steps + t) * s.states + n] * s.at(b, t + 1, e, n);
                out[1].data[(b * s.channels + e) * s.states + n] = s.at(b, s.steps, e, n);
                const std::size_t chunks = std::size_t(nd.outputs[2].dims[1]);
                for (std::size_t c = 0; c < chunks; ++c) out[2].data[((b * chunks + c) * s.channels + e) * s.states + n] = s.at(b, c * chunk, e, n);
            }
    return out;
}
/// selective_scan_backward in double (the states are recomputed from the first checkpoint, which is h0).
/// in: u, delta, A, Bm, C, keep, checkpoints, gy, gh.
inline std::vector<host_value> selective_scan_backward_reference(const node& nd, const std::vector<const host_value*>& in) {
    const host_value& checkpoints = *in[6];
    host_value h0{in[8]->type, {}};
    const std::size_t state_size = std::size_t(in[8]->type.elements()), chunks = std::size_t(checkpoints.type.dims[1]);
    const std::size_t per_batch = state_size / std::size_t(in[8]->type.dims[0]);
    for (std::size_t b = 0; b < std::size_t(in[8]->type.dims[0]); ++b)
        h0.data.insert(h0.data.end(), checkpoints.data.begin() + std::ptrdiff_t(b * chunks * per_batch),
                       checkpoints.data.begin() + std::ptrdiff_t((b * chunks + 1) * per_batch));
    selective_scan_states s = run_selective_scan({in[0], in[1], in[2], in[3], in[4], in[5], &h0});
    std::vector<host_value> out;
    for (const auto& type : nd.outputs) out.push_back({type, std::vector<double>(std::size_t(type.elements()), 0.0)});
    const auto &u = in[0]->data, &delta = in[1]->data, &A = in[2]->data, &Bm = in[3]->data, &C = in[4]->data, &keep = in[5]->data;
    const auto &gy = in[7]->data, &gh = in[8]->data;
    auto &du = out[0].data, &ddelta = out[1].data, &dA = out[2].data, &dB = out[3].data, &dC = out[4].data, &dh0 = out[5].data;
    for (std::size_t b = 0; b < s.batch; ++b)
        for (std::size_t e = 0; e < s.channels; ++e)
            for (std::size_t n = 0; n < s.states; ++n) {
                double g = gh[(b * s.channels + e) * s.states + n];
                for (std::size_t t = s.steps; t-- > 0;) {
                    const std::size_t bte = (b * s.steps + t) * s.channels + e, btn = (b * s.steps + t) * s.states + n;
                    g += C[btn] * gy[bte];
                    dC[btn] += gy[bte] * s.at(b, t + 1, e, n);
                    const double abar = std::exp(delta[bte] * A[e * s.states + n]) * keep[b * s.steps + t];
                    const double decay_grad = g * abar * s.at(b, t, e, n);
                    du[bte] += delta[bte] * g * Bm[btn];
                    ddelta[bte] += u[bte] * g * Bm[btn] + A[e * s.states + n] * decay_grad;
                    dA[e * s.states + n] += delta[bte] * decay_grad;
                    dB[btn] += g * delta[bte] * u[bte];
                    g *= abar;
                }
                dh0[(b * s.channels + e) * s.states + n] = g;
            }
    return out;
}


}  // namespace detail

namespace prim {

/// Mamba's selective scan (olmax/scan/selective_scan.hpp has the formulas) as ONE primitive fused
/// over time, so the [B, T, E, N] states are never materialised: per step abar = exp(delta_t A) keep_t
/// (keep [B, T] is 0 where a document starts), h_t = abar h_{t-1} + delta_t u_t B_t from h0,
/// y_t = sum_n C_t h_t. Operands u, delta, A, B, C, keep, h0; outputs: y [B, T, E], the last state
/// h [B, E, N], and the state entering every `axis` (the chunk) steps [B, ceil(T / chunk), E, N]
/// for the gradient (emitted only when one uses it; not differentiated). Lowered to loops over time
/// (stablehlo/selective_scan.hpp), or with `native_call` to a custom call of olmax's own CPU kernel
/// (trace/native_calls.hpp). Its gradient is one selective_scan_backward; keep gets none.
struct selective_scan {
    static constexpr std::string_view name = "selective_scan";
    static constexpr bool saved_by_kept_layers = true;
    static constexpr std::size_t differentiated_outputs = 2;
    static std::vector<var> make(const var& u, const var& delta, const var& A, const var& Bm, const var& C, const var& keep, const var& h0,
                                 std::int64_t chunk, bool native_call) {
        detail::check_selective_scan(name, u, delta, A, Bm, C, keep, h0, chunk);
        const dims_t d = u.dims();
        const std::int64_t chunks = (d[1] + chunk - 1) / chunk;
        node n = detail::make_node<selective_scan>({u, delta, A, Bm, C, keep, h0}, u.type());
        n.outputs.push_back(h0.type());
        n.outputs.push_back(f32({d[0], chunks, d[2], A.dims()[1]}));
        n.axis = chunk;
        n.native_call = native_call;
        return detail::outputs_of(detail::commit(std::move(n)));
    }
    static std::vector<value> emit(function_builder& b, const node& n, const std::vector<value>& in, const std::vector<bool>& needed) {
        return n.native_call ? b.custom_call(stablehlo::native_call::selective_scan, in, n.outputs, {{"chunk", n.axis}})
                             : stablehlo::emit_selective_scan(b, n.axis, needed[2], in[0], in[1], in[2], in[3], in[4], in[5], in[6]);
    }
    static std::vector<host_value> evaluate(const node& n, const std::vector<const host_value*>& in) { return detail::selective_scan_reference(n, in); }
    static void gradient(vjp& v);  // below selective_scan_backward
};

/// The exact gradient of selective_scan from its operands (no h0: the checkpoints hold it), its
/// checkpoints and the gradients gy of y and gh of the last state: outputs (du, ddelta, dA, dB, dC,
/// dh0). Chunks run from last to first; each recomputes its states from its checkpoint.
struct selective_scan_backward {
    static constexpr std::string_view name = "selective_scan_backward";
    static constexpr no_gradient gradient{};
    static std::vector<var> make(const var& u, const var& delta, const var& A, const var& Bm, const var& C, const var& keep, const var& checkpoints,
                                 const var& gy, const var& gh, std::int64_t chunk, bool native_call) {
        detail::check_selective_scan(name, u, delta, A, Bm, C, keep, gh, chunk);
        const dims_t d = u.dims();
        check<graph_error>(gy.type() == u.type() && checkpoints.dims() == dims_t{d[0], (d[1] + chunk - 1) / chunk, d[2], A.dims()[1]},
                           "xla::graph: selective_scan_backward: gy ", gy.type().str(), " and checkpoints ", checkpoints.type().str(),
                           " do not match u ", u.type().str(), " with chunk ", chunk);
        node n = detail::make_node<selective_scan_backward>({u, delta, A, Bm, C, keep, checkpoints, gy, gh}, u.type());
        n.outputs = {u.type(), u.type(), A.type(), Bm.type(), C.type(), gh.type()};
        n.axis = chunk;
        n.native_call = native_call;
        return detail::outputs_of(detail::commit(std::move(n)));
    }
    static std::vector<value> emit(function_builder& b, const node& n, const std::vector<value>& in, const std::vector<bool>&) {
        return n.native_call ? b.custom_call(stablehlo::native_call::selective_scan_backward, in, n.outputs, {{"chunk", n.axis}})
                             : stablehlo::emit_selective_scan_backward(b, n.axis, in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], in[8]);
    }
    static std::vector<host_value> evaluate(const node& n, const std::vector<const host_value*>& in) {
        return detail::selective_scan_backward_reference(n, in);
    }
};

inline void selective_scan::gradient(vjp& v) {
    const std::vector<var> d = selective_scan_backward::make(v.x[0], v.x[1], v.x[2], v.x[3], v.x[4], v.x[5], v.y[2], v.gy[0], v.gy[1], v.n.axis,
                                                             v.n.native_call);
    for (std::size_t i = 0; i < 5; ++i) v.dx[i] = d[i];  // u, delta, A, B, C; keep (5) gets none
    v.dx[6] = d[5];                                      // h0
}

}  // namespace prim

/// prim::linear_scan (`reverse`: from the end).
inline var linear_scan(const var& a, const var& x, const stablehlo::scan_strategy& strategy, bool reverse = false) {
    return prim::linear_scan::make(a, x, strategy, reverse);
}

/// prim::matrix_scan: h_t = m_t h_{t-1} + x_t over [B, n, K, K] gates and [B, n, K, V] inputs
/// (`reverse`: from the end).
inline var matrix_scan(const var& m, const var& x, bool reverse = false) { return prim::matrix_scan::make(m, x, reverse); }

/// prim::selective_scan: (y, the last state, the chunk checkpoints).
inline std::vector<var> selective_scan(const var& u, const var& delta, const var& A, const var& Bm, const var& C, const var& keep, const var& h0,
                                       std::int64_t chunk, bool native_call = false) {
    return prim::selective_scan::make(u, delta, A, Bm, C, keep, h0, chunk, native_call);
}

/// The exact gradient of selective_scan (prim::selective_scan_backward): (du, ddelta, dA, dB, dC, dh0).
inline std::vector<var> selective_scan_backward(const var& u, const var& delta, const var& A, const var& Bm, const var& C, const var& keep,
                                                const var& checkpoints, const var& gy, const var& gh, std::int64_t chunk,
                                                bool native_call = false) {
    return prim::selective_scan_backward::make(u, delta, A, Bm, C, keep, checkpoints, gy, gh, chunk, native_call);
}

}  // namespace olmax::xla::graph
