#pragma once
// Module header: linear-recurrence scans h_t = a_t * h_{t-1} + x_t with exact, linear-memory
// custom backward passes.
//
//     namespace sc = olmax::scan;
//     auto h = sc::scan<sc::chunked_matmul<128>>(gates, x, {.h0 = h0, .reverse = false});
//     auto [h2, h_last] = sc::scan_with_state<sc::sequential_vectorized>(gates, x);
//
// Tensors are [batch, time, channels] (Layout::btc, default) or [batch, channels, time]
// (Layout::bct). Gates have the shape of x, or [batch, time, heads] / [batch, heads, time] with
// one gate shared by each head of channels / heads consecutive channels (Mamba-2 style).
//
// Backward (every strategy, exact): with upstream gradients dh (and dh_last for the final state),
// g_t = dh_t + a_{t+1} g_{t+1} (a reverse scan with gates shifted by one step), dx_t = g_t,
// da_t = g_t h_{t-1} with h_{-1} = h0, dh0 = a_0 g_0; log gates get da_t a_t; shared gates sum
// da over their head. The original Olmax used g_t h_t for the gate gradient, which is wrong.
// Saved state: the gates, h and h0 (handles to tensors that exist anyway), so O(B T C) memory;
// no log T intermediates.
//
// Which kernel family runs a strategy, forward and backward, on each geometry: the strategy table
// in scan/detail/dispatch.hpp.

#include <concepts>
#include <span>
#include <string>
#include <vector>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/core/bfloat16.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/ops/op_keys.hpp"
#include "olmax/scan/detail/dispatch.hpp"
#include "olmax/scan/detail/problem.hpp"
#include "olmax/scan/options.hpp"
#include "olmax/scan/selective_scan.hpp"  // Mamba's selective scan (fused discretisation, linear-memory backward)
#include "olmax/scan/ssd.hpp"  // Mamba-2's SSD (chunked state-space duality, linear-memory backward)
#include "olmax/scan/gated_delta.hpp"  // the gated delta rule (Gated DeltaNet: chunked WY forward, linear-memory backward)
#include "olmax/scan/matrix_scan.hpp"  // h_t = M_t h_{t-1} + X_t with a matrix gate (chunk-to-chunk state passing)
#include "olmax/scan/strategies.hpp"

namespace olmax::scan {

/// The element types a scan stores: float and double (differentiable on the tape), and bfloat16
/// (storage only, half the bytes: carries and every intermediate are float, see
/// detail::accumulator_t; the gradient is `scan_backward`, called explicitly).
template <class T>
concept ScanElement = Real<T> || std::same_as<T, bfloat16>;

/// The gradients of a scan with respect to its inputs (`scan_backward`): d gates (the gates'
/// shape; d(log a) when opt.log_gates), dx, and dh0 (defined when h0 was given).
template <class T>
struct ScanGradients {
    Tensor<T> gates;
    Tensor<T> x;
    Tensor<T> h0;
};

namespace detail {

/// The adjoint of a forward scan of geometry g from its saved gates, h and h0 and the upstream
/// gradients dh and dh_last (may be undefined: zero).
template <class Strategy, ScanElement T>
ScanGradients<T> scan_gradients(const Geometry& g, std::size_t chunk, const Tensor<T>& gates, const Tensor<T>& h, const Tensor<T>& h0,
                                const Tensor<T>& dh, const Tensor<T>& dh_last, bool want_dh0) {
    using Acc = accumulator_t<Strategy, T>;
    ScanGradients<T> out{Tensor<T>(), Tensor<T>::uninitialized(dh.shape()), Tensor<T>()};
    auto da = Tensor<T>::uninitialized(dh.shape());
    if (want_dh0) out.h0 = Tensor<T>::uninitialized({g.batch, g.channels});
    BackwardArgs<T> args{dh.data(),  dh_last.defined() ? dh_last.data() : nullptr, gates.data(), h.data(), h0.defined() ? h0.data() : nullptr,
                         out.x.data(), da.data(), want_dh0 ? out.h0.data() : nullptr};
    run_backward<Strategy>(g, args, chunk);
    if (g.share == 1) {
        out.gates = da;
    } else {  // shared gates: sum the per-channel gate gradients over each head, in the accumulator
        std::vector<Acc> sums(gates.size(), Acc(0));
        for (std::size_t b = 0; b < g.batch; ++b)
            for (std::size_t t = 0; t < g.time; ++t)
                for (std::size_t c = 0; c < g.channels; ++c) sums[g.gate_index(b, t, c)] += Acc(da.data()[g.x_index(b, t, c)]);
        out.gates = Tensor<T>::uninitialized(gates.shape());
        for (std::size_t i = 0; i < sums.size(); ++i) out.gates.data()[i] = T(sums[i]);
    }
    return out;
}

}  // namespace detail

/// Scans h_t = a_t h_{t-1} + x_t with strategy `Strategy` on the inputs' device, returning h (shape of
/// x) and the final state h_last ([batch, channels], the state after the last processed step).
/// float and double: differentiable in gates, x and opt.h0. bfloat16: storage only (not recorded on
/// the tape; `scan_backward` gives its gradients), computed with float carries and each h rounded
/// once to bfloat16: |h - h_exact| <= 2^-8 |h_exact| plus the float recurrence's own rounding;
/// chunked_matmul with gates shared by heads multiplies on the device's bf16 product with its decay
/// matrix rounded to bf16, which adds 2^-8 of the scan on |inputs| (see docs/BF16.md, "Scans in
/// bf16 storage").
/// Throws shape_error / value_error on mismatched shapes, T = 0, empty rows or a chunk size < 1; NaN
/// gates or inputs propagate as NaN.
template <class Strategy, ScanElement T>
ScanResult<T> scan_with_state(const Tensor<T>& gates, const Tensor<T>& x, const ScanOptions<T>& opt = {}) {
    static_assert(detail::is_strategy<Strategy>,
                  "olmax::scan: unknown strategy tag; use one of the types in olmax/scan/strategies.hpp");
    static const std::string op = olmax::detail::concat("scan<", Strategy::name, ">");  // formed once, not per call
    backend::op_scope on(op, gates, x, opt.h0);
    const detail::Geometry g = detail::make_geometry(op, gates, x, opt);
    const std::size_t chunk = opt.chunk ? static_cast<std::size_t>(*opt.chunk) : detail::default_chunk<Strategy>();
    return on.run_composed(
        [&] {  // the rule of op::linear_scan: Strategy's StableHLO form where it has one that suits the device, else the device's
            check<trace_error>(opt.layout == Layout::btc && gates.shape() == x.shape(), op,
                               ": a traced scan takes gates of x's shape in the [batch, time, channels] layout");
            return backend::trace::results<ScanResult<T>, op::linear_scan>(
                {gates, x, opt.h0}, {.reverse = opt.reverse, .log_gates = opt.log_gates, .strategy = Strategy::name, .chunk = chunk});
        },
        [&] {
            ScanResult<T> result{Tensor<T>::uninitialized(x.shape()), Tensor<T>::uninitialized({g.batch, g.channels})};
            const T* h0 = opt.h0.defined() ? opt.h0.data() : nullptr;
            detail::run_forward<Strategy>(g, detail::ForwardArgs<T>{gates.data(), x.data(), h0, result.h.data(), result.h_last.data()}, chunk);

            if constexpr (Real<T>) {
                std::vector<Tensor<T>> inputs{gates, x, opt.h0};
                if (!autodiff::should_record(std::span<const Tensor<T>>(inputs))) return result;
                std::vector<Tensor<T>> outputs{result.h, result.h_last};
                autodiff::record<T>(
                    op, inputs, outputs,
                    [g, chunk, saved_gates = gates.detach(), saved_h = result.h.detach(),
                     saved_h0 = opt.h0.defined() ? opt.h0.detach() : Tensor<T>()](std::span<const Tensor<T>> grads, autodiff::GradientSink<T>& sink) {
                        ScanGradients<T> d = detail::scan_gradients<Strategy>(g, chunk, saved_gates, saved_h, saved_h0, grads[0], grads[1], sink.needs(2));
                        if (sink.needs(0)) sink.add(0, d.gates);
                        sink.add(1, d.x);
                        if (d.h0.defined()) sink.add(2, d.h0);
                    });
                result.h = outputs[0];
                result.h_last = outputs[1];
            }
            return result;
        });
}

/// Scans and returns h only (see scan_with_state).
template <class Strategy, ScanElement T>
Tensor<T> scan(const Tensor<T>& gates, const Tensor<T>& x, const ScanOptions<T>& opt = {}) {
    return scan_with_state<Strategy>(gates, x, opt).h;
}

/// The gradients of `scan_with_state<Strategy>(gates, x, opt)` from its gates, its output h, opt.h0
/// and the upstream gradients dh (shape of h) and dh_last ([batch, channels]; undefined: zero), for
/// code that runs its own backward pass (custom ops, bf16 storage). The same exact, linear-memory
/// adjoint the tape uses (see the top of this file); x itself is not needed. bfloat16 computes in
/// float and rounds each output once.
template <class Strategy, ScanElement T>
ScanGradients<T> scan_backward(const Tensor<T>& gates, const Tensor<T>& h, const Tensor<T>& dh, const ScanOptions<T>& opt = {},
                               const Tensor<T>& dh_last = {}) {
    static_assert(detail::is_strategy<Strategy>,
                  "olmax::scan: unknown strategy tag; use one of the types in olmax/scan/strategies.hpp");
    static const std::string op = olmax::detail::concat("scan_backward<", Strategy::name, ">");
    backend::op_scope on(op, gates, h, dh, dh_last, opt.h0);
    const detail::Geometry g = detail::make_geometry(op, gates, h, opt);
    check<shape_error>(dh.defined() && dh.shape() == h.shape(), op, ": dh of shape ", dh.defined() ? to_string(dh.shape()) : "(undefined)",
                       " does not match h of shape ", to_string(h.shape()));
    if (dh_last.defined())
        check<shape_error>(dh_last.rank() == 2 && dh_last.extent(0) == g.batch && dh_last.extent(1) == g.channels, op, ": dh_last of shape ",
                           to_string(dh_last.shape()), " does not match [batch, channels] = [", g.batch, ", ", g.channels, "]");
    const std::size_t chunk = opt.chunk ? static_cast<std::size_t>(*opt.chunk) : detail::default_chunk<Strategy>();
    if constexpr (Real<T>) {
        return detail::scan_gradients<Strategy>(g, chunk, gates.detach(), h.detach(), opt.h0.defined() ? opt.h0.detach() : Tensor<T>(),
                                                dh.detach(), dh_last.defined() ? dh_last.detach() : Tensor<T>(), opt.h0.defined());
    } else {
        return detail::scan_gradients<Strategy>(g, chunk, gates, h, opt.h0, dh, dh_last, opt.h0.defined());
    }
}

}  // namespace olmax::scan

// ---- the key of the linear scan's lowering rule (its rule: olmax/trace/rules.hpp) -------------

namespace olmax::op {

/// h_t = a_t h_{t-1} + x_t along axis 1 of gates, x [B, T, C] from h0 [B, C] (undefined: zeros),
/// from the end with `reverse`, gates given as log a with `log_gates`: h and its last state.
struct linear_scan : registered<linear_scan> {
    static constexpr std::string_view name = "linear_scan";
    struct attrs {
        bool reverse = false, log_gates = false;
        std::string_view strategy = {};  ///< the tag's name (olmax/scan/strategies.hpp): its traced form; empty: the device's
        std::size_t chunk = 0;      ///< the tag's chunk, where it has one
    };
    static std::vector<sample<attrs>> samples(Generator& rng) {
        auto u = [&](const Shape& s, float lo, float hi) { return samples::uniform(rng, s, lo, hi); };
        return {{{u({2, 5, 3}, 0.2f, 1.1f), u({2, 5, 3}, -1, 1), Tensor<float>()}, {}},
                {{u({2, 6, 2}, -0.9f, 0.9f), u({2, 6, 2}, -1, 1), u({2, 2}, -1, 1)}, {.reverse = true}},
                {{u({1, 7, 3}, -1.0f, 0.1f), u({1, 7, 3}, -1, 1), u({1, 3}, -1, 1)}, {.log_gates = true}},
                {{u({2, 1, 4}, 0.2f, 1.0f), u({2, 1, 4}, -1, 1), u({2, 4}, -1, 1)}, {.reverse = true, .log_gates = true}},
                // written tags: traced in their own forms, or the device's with a notice (trace/scan_forms.hpp)
                {{u({2, 9, 2}, 0.2f, 1.1f), u({2, 9, 2}, -1, 1), u({2, 2}, -1, 1)}, {false, false, "chunked_matmul", 4}},
                {{u({1, 9, 3}, 0.2f, 1.1f), u({1, 9, 3}, -1, 1), Tensor<float>()}, {true, false, "hillis_steele_chunked", 2}},
                {{u({2, 5, 2}, 0.2f, 1.1f), u({2, 5, 2}, -1, 1), Tensor<float>()}, {false, false, "blelloch", 0}}};
    }
    template <Real T> static std::vector<Tensor<T>> eager(std::span<const Tensor<T>> in, const attrs& a) {
        auto r = scan::scan_with_state<scan::sequential>(in[0], in[1], {.h0 = in[2], .reverse = a.reverse, .log_gates = a.log_gates});
        return {r.h, r.h_last};
    }
};

}  // namespace olmax::op
