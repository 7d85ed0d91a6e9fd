#pragma once
// Grouped matrix product: consecutive row blocks of one matrix, each multiplied by its own weight
// matrix, one GEMM per block. The expert step of a sparse mixture of experts (nn::MoE): the
// tokens routed to expert g are rows [offsets[g], offsets[g+1]) of the gathered input, and only
// those rows meet W_g, so the flops are M K N whatever the number of groups.
//
//     y[offsets[g] : offsets[g+1]] = x[offsets[g] : offsets[g+1]] W_g        x [M, K], w [G, K, N]
//
// Backward per group: dx_g = dy_g W_g^T, dW_g = x_g^T dy_g (zero for an empty group). Each pass
// prepares its operands once (backend::GemmOperand: under the bf16 policy dy is rounded once for
// both backward products, not once per GEMM).

#include <algorithm>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/backend/gemm_operand.hpp"
#include "olmax/core/tensor.hpp"

namespace olmax {

namespace detail::grouped_ops {

/// Calls `gemm(g)` for every group: one at a time when there are fewer groups than threads (each
/// GEMM then free to use every thread), otherwise groups spread over threads (as batched_gemm).
template <class F>
void for_each_group(std::size_t groups, std::size_t work_per_group, F&& gemm) {
    if (groups < static_cast<std::size_t>(std::max(2, backend::current().num_threads()))) {
        for (std::size_t g = 0; g < groups; ++g) gemm(g);
        return;
    }
    backend::current().parallel_for(groups, work_per_group, [&](std::size_t lo, std::size_t hi) {
        for (std::size_t g = lo; g < hi; ++g) gemm(g);
    });
}

}  // namespace detail::grouped_ops

/// x [M, K] and w [G, K, N] with `offsets` (G + 1 row boundaries: offsets[0] = 0, non-decreasing,
/// offsets[G] = M) give y [M, N] whose rows [offsets[g], offsets[g+1]) are x's rows times w[g].
/// Differentiable in x and w.
template <Real T>
Tensor<T> grouped_matmul(const Tensor<T>& x, const Tensor<T>& w, std::span<const std::size_t> offsets) {
    constexpr std::string_view op = "grouped_matmul";
    backend::op_scope on(op, x, w);
    check<shape_error>(x.defined() && w.defined() && x.rank() == 2 && w.rank() == 3 && x.shape()[1] == w.shape()[1], op, ": x ",
                       x.defined() ? to_string(x.shape()) : std::string("(undefined)"), " and w ",
                       w.defined() ? to_string(w.shape()) : std::string("(undefined)"), " must be [M, K] and [G, K, N]");
    const std::size_t M = x.shape()[0], K = x.shape()[1], G = w.shape()[0], N = w.shape()[2];
    check<shape_error>(offsets.size() == G + 1, op, ": ", G, " groups need ", G + 1, " offsets, got ", offsets.size());
    check<value_error>(offsets[0] == 0 && offsets[G] == M, op, ": offsets must start at 0 and end at M = ", M, ", got ", offsets[0],
                       " and ", offsets[G]);
    for (std::size_t g = 0; g < G; ++g)
        check<value_error>(offsets[g] <= offsets[g + 1], op, ": offsets must not decrease, got ", offsets[g], " then ", offsets[g + 1],
                           " at group ", g);
    std::vector<std::size_t> bounds(offsets.begin(), offsets.end());
    auto y = Tensor<T>::uninitialized({M, N});
    const std::size_t work = G ? M / G * K * N + 1 : 1;
    const backend::GemmOperand<T> xs(x);
    {
        const backend::GemmOperand<T> ws(w);
        T* yp = y.data();
        detail::grouped_ops::for_each_group(G, work, [&](std::size_t g) {
            const std::size_t rows = bounds[g + 1] - bounds[g];
            if (rows) backend::gemm(false, false, rows, N, K, T{1}, xs.source() + bounds[g] * K, K, ws.source() + g * K * N, N, T{0}, yp + bounds[g] * N, N);
        });
    }
    const Tensor<T> inputs[2] = {x, w};
    autodiff::record<T>(op, inputs, std::span<Tensor<T>>(&y, 1),
                        [xk = xs.kept_for_backward(x), w = w.detach(), bounds = std::move(bounds), M, K, G, N, work](std::span<const Tensor<T>> g,
                                                                                                    autodiff::GradientSink<T>& sink) {
                            const backend::GemmOperand<T> dy(g[0]);
                            if (sink.needs(0)) {  // dx_g = dy_g W_g^T
                                const backend::GemmOperand<T> ws(w);
                                auto dx = Tensor<T>::uninitialized({M, K});
                                T* dxp = dx.data();
                                detail::grouped_ops::for_each_group(G, work, [&](std::size_t e) {
                                    const std::size_t rows = bounds[e + 1] - bounds[e];
                                    if (rows)
                                        backend::gemm(false, true, rows, K, N, T{1}, dy.source() + bounds[e] * N, N, ws.source() + e * K * N, N,
                                                      T{0}, dxp + bounds[e] * K, K);
                                });
                                sink.add(0, std::move(dx));
                            }
                            if (sink.needs(1)) {  // dW_g = x_g^T dy_g
                                const backend::GemmOperand<T> xs = xk.ready();
                                auto dw = Tensor<T>::uninitialized({G, K, N});
                                T* dwp = dw.data();
                                detail::grouped_ops::for_each_group(G, work, [&](std::size_t e) {
                                    const std::size_t rows = bounds[e + 1] - bounds[e];
                                    T* dst = dwp + e * K * N;
                                    if (rows)
                                        backend::gemm(true, false, K, N, rows, T{1}, xs.source() + bounds[e] * K, K, dy.source() + bounds[e] * N, N,
                                                      T{0}, dst, N);
                                    else
                                        std::fill_n(dst, K * N, T{0});
                                });
                                sink.add(1, std::move(dw));
                            }
                        });
    return y;
}

}  // namespace olmax
