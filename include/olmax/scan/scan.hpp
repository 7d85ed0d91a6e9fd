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

#include <string>
#include <vector>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/scan/detail/dispatch.hpp"
#include "olmax/scan/detail/problem.hpp"
#include "olmax/scan/options.hpp"
#include "olmax/scan/selective_scan.hpp"  // Mamba's selective scan (fused discretisation, linear-memory backward)
#include "olmax/scan/strategies.hpp"

namespace olmax::scan {

/// Scans h_t = a_t h_{t-1} + x_t with strategy `Strategy` on the inputs' device, returning h (shape of
/// x) and the final state h_last ([batch, channels], the state after the last processed step).
/// Differentiable in gates, x and opt.h0. Throws shape_error / value_error on mismatched shapes,
/// T = 0, empty rows or a chunk size < 1; NaN gates or inputs propagate as NaN.
template <class Strategy, Real T>
ScanResult<T> scan_with_state(const Tensor<T>& gates, const Tensor<T>& x, const ScanOptions<T>& opt = {}) {
    static_assert(detail::is_strategy<Strategy>,
                  "olmax::scan: unknown strategy tag; use one of the types in olmax/scan/strategies.hpp");
    const std::string op = olmax::detail::concat("scan<", Strategy::name, ">");
    backend::op_scope on(op, gates, x, opt.h0);
    const detail::Geometry g = detail::make_geometry(op, gates, x, opt);
    const std::size_t chunk = opt.chunk ? static_cast<std::size_t>(*opt.chunk) : detail::default_chunk<Strategy>();

    ScanResult<T> result{Tensor<T>::uninitialized(x.shape()), Tensor<T>::uninitialized({g.batch, g.channels})};
    const T* h0 = opt.h0.defined() ? opt.h0.data() : nullptr;
    detail::run_forward<Strategy>(g, detail::ForwardArgs<T>{gates.data(), x.data(), h0, result.h.data(), result.h_last.data()}, chunk);

    std::vector<Tensor<T>> inputs{gates, x, opt.h0};
    if (!autodiff::should_record(std::span<const Tensor<T>>(inputs))) return result;
    std::vector<Tensor<T>> outputs{result.h, result.h_last};
    autodiff::record<T>(
        op, inputs, outputs,
        [g, chunk, saved_gates = gates.detach(), saved_h = result.h.detach(),
         saved_h0 = opt.h0.defined() ? opt.h0.detach() : Tensor<T>()](std::span<const Tensor<T>> grads, autodiff::GradientSink<T>& sink) {
            const Tensor<T>& dh = grads[0];
            const Tensor<T>& dh_last = grads[1];
            auto dx = Tensor<T>::uninitialized(dh.shape());
            auto da = Tensor<T>::uninitialized(dh.shape());
            Tensor<T> dh0 = sink.needs(2) ? Tensor<T>::uninitialized({g.batch, g.channels}) : Tensor<T>();
            detail::BackwardArgs<T> args{dh.data(),  dh_last.data(), saved_gates.data(),
                                         saved_h.data(), saved_h0.defined() ? saved_h0.data() : nullptr,
                                         dx.data(),  da.data(),      dh0.defined() ? dh0.data() : nullptr};
            detail::run_backward<Strategy>(g, args, chunk);
            if (sink.needs(0)) {
                if (g.share == 1) {
                    sink.add(0, da);
                } else {  // shared gates: sum the per-channel gate gradients over each head
                    Tensor<T> d_gates(saved_gates.shape());
                    for (std::size_t b = 0; b < g.batch; ++b)
                        for (std::size_t t = 0; t < g.time; ++t)
                            for (std::size_t c = 0; c < g.channels; ++c)
                                d_gates.data()[g.gate_index(b, t, c)] += da.data()[g.x_index(b, t, c)];
                    sink.add(0, d_gates);
                }
            }
            sink.add(1, dx);
            if (dh0.defined()) sink.add(2, dh0);
        });
    result.h = outputs[0];
    result.h_last = outputs[1];
    return result;
}

/// Scans and returns h only (see scan_with_state).
template <class Strategy, Real T>
Tensor<T> scan(const Tensor<T>& gates, const Tensor<T>& x, const ScanOptions<T>& opt = {}) {
    return scan_with_state<Strategy>(gates, x, opt).h;
}

}  // namespace olmax::scan
