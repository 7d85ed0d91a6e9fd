#pragma once
// The linear recurrence with a matrix gate, h_t = M_t h_{t-1} + X_t, as one differentiable op with
// an exact, linear-memory backward.
//
//     auto [h, h_last] = olmax::scan::matrix_scan(M, X, h0);   // M [B, n, K, K], X [B, n, K, V]
//
// h [B, n, K, V] holds the state after every step, h_last [B, K, V] the state after the last one
// processed; h0 [B, K, V] (undefined: zeros) is the state before the first; with `reverse` the
// steps run from the end, h_t = M_t h_{t+1} + X_t. This is what a chunked linear-attention form
// runs between its chunks: the gated delta rule's chunk-to-chunk state passing is
// S_{c+1} = (exp(g_c) I - K_c^T W_c) S_c + K_c^T U_c (scan/gated_delta.hpp). As one op, a traced
// program holds it as one loop (xla::graph's matrix_scan primitive) instead of n steps unrolled, so
// the program and its compile time do not grow with n.
//
// Backward (exact): with upstream gradients dh and dh_last, lambda_t = dh_t + M_{t+1}^T lambda_{t+1}
// (dh_last added at the last step processed; a scan the other way with the gates transposed),
// dX_t = lambda_t, dM_t = lambda_t h_{t-1}^T, dh0 = M_first^T lambda_first. Saved: the gates, h and
// h0, tensors that exist anyway, so O(B n K (K + V)) memory.
//
// Eager: parallel over the batch, each step one K x K by K x V product on backend::small_gemm, in
// the element type (no bf16 rounding: a state rounded at every step would drift).

#include <algorithm>
#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/backend/small_gemm.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/ops/op_keys.hpp"
#include "olmax/scan/options.hpp"

namespace olmax::scan {

/// Options of scan::matrix_scan.
struct MatrixScanOptions {
    /// Run from the last step to the first: h_t = M_t h_{t+1} + X_t.
    bool reverse = false;
};

namespace detail::matrix_scans {

inline constexpr std::string_view op_name = "matrix_scan";

struct Geometry {
    std::size_t batch = 0, steps = 0, key = 0, value = 0;
    bool reverse = false;
    std::size_t step(std::size_t k) const { return reverse ? steps - 1 - k : k; }  // the k-th step processed
    std::size_t gate_at(std::size_t b, std::size_t t) const { return (b * steps + t) * key * key; }
    std::size_t state_at(std::size_t b, std::size_t t) const { return (b * steps + t) * key * value; }
};

template <Real T>
Geometry make_geometry(const Tensor<T>& gates, const Tensor<T>& x, const Tensor<T>& h0, const MatrixScanOptions& options) {
    check<shape_error>(gates.defined() && x.defined() && gates.rank() == 4 && x.rank() == 4, op_name,
                       ": takes gates [batch, n, K, K] and inputs [batch, n, K, V], got ", gates.defined() ? to_string(gates.shape()) : "(undefined)",
                       " and ", x.defined() ? to_string(x.shape()) : "(undefined)");
    const Geometry g{x.extent(0), x.extent(1), x.extent(2), x.extent(3), options.reverse};
    check<shape_error>(gates.extent(0) == g.batch && gates.extent(1) == g.steps && gates.extent(2) == g.key && gates.extent(3) == g.key, op_name,
                       ": gates ", to_string(gates.shape()), " do not match inputs ", to_string(x.shape()), " (gates [batch, n, K, K] for inputs [batch, n, K, V])");
    check<value_error>(g.batch > 0 && g.steps > 0 && g.key > 0 && g.value > 0, op_name, ": empty size in inputs ", to_string(x.shape()));
    if (h0.defined())
        check<shape_error>(h0.shape() == Shape{g.batch, g.key, g.value}, op_name, ": h0 ", to_string(h0.shape()), " does not match the state [",
                           g.batch, ", ", g.key, ", ", g.value, "]");
    return g;
}

/// h (and h_last) of batch row b from its gates, inputs and h0 (null: zeros).
template <Real T>
void forward_row(const Geometry& g, std::size_t b, const T* gates, const T* x, const T* h0, T* h, T* h_last) {
    const std::size_t plane = g.key * g.value;
    const T* previous = h0;
    for (std::size_t k = 0; k < g.steps; ++k) {
        const std::size_t t = g.step(k);
        T* out = h + g.state_at(b, t);
        std::copy_n(x + g.state_at(b, t), plane, out);
        if (previous) backend::small_gemm(false, false, g.key, g.value, g.key, T{1}, gates + g.gate_at(b, t), g.key, previous, g.value, T{1}, out, g.value);
        previous = out;
    }
    std::copy_n(previous, plane, h_last + b * plane);
}

/// The gradients of batch row b (see the top of this file); dh, dh_last may be null (zero), dgates
/// and dh0 null when not wanted. dx holds lambda, which the step before reads.
template <Real T>
void backward_row(const Geometry& g, std::size_t b, const T* gates, const T* h, const T* h0, const T* dh, const T* dh_last, T* dgates, T* dx,
                  T* dh0) {
    const std::size_t plane = g.key * g.value;
    const T* later = nullptr;  // lambda of the step processed after this one
    for (std::size_t k = g.steps; k-- > 0;) {
        const std::size_t t = g.step(k);
        T* lambda = dx + g.state_at(b, t);
        if (dh) std::copy_n(dh + g.state_at(b, t), plane, lambda);
        else std::fill_n(lambda, plane, T{0});
        if (k + 1 == g.steps && dh_last)
            for (std::size_t i = 0; i < plane; ++i) lambda[i] += dh_last[b * plane + i];
        if (later)  // + M_later^T lambda_later
            backend::small_gemm(true, false, g.key, g.value, g.key, T{1}, gates + g.gate_at(b, g.step(k + 1)), g.key, later, g.value, T{1}, lambda,
                                g.value);
        if (dgates) {
            const T* earlier = k > 0 ? h + g.state_at(b, g.step(k - 1)) : (h0 ? h0 + b * plane : nullptr);
            T* dm = dgates + g.gate_at(b, t);
            if (earlier) backend::small_gemm(false, true, g.key, g.key, g.value, T{1}, lambda, g.value, earlier, g.value, T{0}, dm, g.key);
            else std::fill_n(dm, g.key * g.key, T{0});
        }
        later = lambda;
    }
    if (dh0) {
        std::fill_n(dh0 + b * plane, plane, T{0});
        backend::small_gemm(true, false, g.key, g.value, g.key, T{1}, gates + g.gate_at(b, g.step(0)), g.key, later, g.value, T{0}, dh0 + b * plane,
                            g.value);
    }
}

}  // namespace detail::matrix_scans

/// h_t = M_t h_{t-1} + X_t (see the top of this file): gates M [batch, n, K, K], inputs X
/// [batch, n, K, V], h0 [batch, K, V] (undefined: zeros). Returns h [batch, n, K, V] and h_last
/// [batch, K, V]. Differentiable in gates, x and h0. Throws shape_error naming the shapes that do
/// not match, value_error for an empty size.
template <Real T>
ScanResult<T> matrix_scan(const Tensor<T>& gates, const Tensor<T>& x, const Tensor<T>& h0 = {}, const MatrixScanOptions& options = {}) {
    namespace ms = detail::matrix_scans;
    backend::op_scope on(ms::op_name, gates, x, h0);
    const ms::Geometry g = ms::make_geometry(gates, x, h0, options);
    return on.run<op::matrix_scan>({gates, x, h0}, {.reverse = options.reverse}, [&] {
        ScanResult<T> result{Tensor<T>::uninitialized(x.shape()), Tensor<T>::uninitialized({g.batch, g.key, g.value})};
        const Tensor<T>& m = gates;
        const Tensor<T>& start = h0;
        backend::current().parallel_for(g.batch, g.steps * g.key * g.key * g.value + 1, [&](std::size_t lo, std::size_t hi) {
            for (std::size_t b = lo; b < hi; ++b)
                ms::forward_row(g, b, m.data(), x.data(), start.defined() ? start.data() + b * g.key * g.value : nullptr, result.h.data(),
                                result.h_last.data());
        });
        std::vector<Tensor<T>> inputs{gates, x, h0};
        if (!autodiff::should_record(std::span<const Tensor<T>>(inputs))) return result;
        std::vector<Tensor<T>> outputs{result.h, result.h_last};
        autodiff::record<T>(ms::op_name, inputs, outputs,
                            [g, m = m.detach(), h = result.h.detach(), start = start.defined() ? start.detach() : Tensor<T>()](
                                std::span<const Tensor<T>> grads, autodiff::GradientSink<T>& sink) {
                                const Tensor<T>& dh = grads[0];
                                const Tensor<T>& dh_last = grads[1];
                                auto dgates = sink.needs(0) ? Tensor<T>::uninitialized(m.shape()) : Tensor<T>();
                                auto dx = Tensor<T>::uninitialized(h.shape());
                                const bool want_dh0 = start.defined() && sink.needs(2);
                                auto dh0 = want_dh0 ? Tensor<T>::uninitialized(start.shape()) : Tensor<T>();
                                backend::current().parallel_for(g.batch, 2 * g.steps * g.key * g.key * g.value + 1, [&](std::size_t lo, std::size_t hi) {
                                    for (std::size_t b = lo; b < hi; ++b)
                                        ms::backward_row(g, b, m.data(), h.data(), start.defined() ? start.data() : nullptr,
                                                         dh.defined() ? dh.data() : nullptr, dh_last.defined() ? dh_last.data() : nullptr,
                                                         dgates.defined() ? dgates.data() : nullptr, dx.data(), want_dh0 ? dh0.data() : nullptr);
                                });
                                if (dgates.defined()) sink.add(0, dgates);
                                if (sink.needs(1)) sink.add(1, dx);
                                if (want_dh0) sink.add(2, dh0);
                            });
        result.h = outputs[0];
        result.h_last = outputs[1];
        return result;
    });
}

}  // namespace olmax::scan

// ---- the key of the matrix scan's lowering rule (its rule: olmax/trace/rules.hpp) ----------------

namespace olmax::op {

/// h_t = M_t h_{t-1} + X_t along axis 1 of gates [B, n, K, K] and x [B, n, K, V] from h0 [B, K, V]
/// (undefined: zeros), from the end with `reverse`: h and its last state.
struct matrix_scan : registered<matrix_scan> {
    static constexpr std::string_view name = "matrix_scan";
    struct attrs {
        bool reverse = false;
    };
    static std::vector<sample<attrs>> samples(Generator& rng) {
        auto u = [&](const Shape& s, float lo, float hi) { return samples::uniform(rng, s, lo, hi); };
        return {{{u({2, 4, 3, 3}, -0.6f, 0.6f), u({2, 4, 3, 2}, -1, 1), Tensor<float>()}, {}},
                {{u({1, 5, 2, 2}, -0.7f, 0.7f), u({1, 5, 2, 3}, -1, 1), u({1, 2, 3}, -1, 1)}, {}},
                {{u({2, 3, 3, 3}, -0.6f, 0.6f), u({2, 3, 3, 1}, -1, 1), u({2, 3, 1}, -1, 1)}, {.reverse = true}},
                {{u({1, 1, 2, 2}, -1, 1), u({1, 1, 2, 2}, -1, 1), u({1, 2, 2}, -1, 1)}, {.reverse = true}}};
    }
    template <Real T> static std::vector<Tensor<T>> eager(std::span<const Tensor<T>> in, const attrs& a) {
        auto r = scan::matrix_scan(in[0], in[1], in[2], {.reverse = a.reverse});
        return {r.h, r.h_last};
    }
};

}  // namespace olmax::op
