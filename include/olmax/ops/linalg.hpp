#pragma once
// Matrix products through the GEMM of the inputs' device (Eigen on the CPU kernels). Each pass
// prepares its operands once (backend::GemmOperand: under the bf16 policy the output gradient is
// rounded once for both backward products).

#include <span>
#include <utility>
#include <vector>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/backend/gemm_operand.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/ops/op_keys.hpp"

namespace olmax {

namespace detail {

/// How a matmul folds its operands into GEMM calls.
struct MatmulPlan {
    std::size_t batch = 1, m = 0, k = 0, n = 0;
    bool batched_b = false;  // b has its own batch dimension
    Shape out_shape;
};

inline MatmulPlan plan_matmul(const Shape& a, const Shape& b) {
    auto fail = [&] {
        throw shape_error(concat("matmul: shapes ", to_string(a), " and ", to_string(b),
                                 " do not multiply (need [..., m, k] x [k, n], or equal batch dims [..., m, k] x [..., k, n])"));
    };
    if (a.size() < 2 || b.size() < 2) fail();
    MatmulPlan p;
    p.k = a[a.size() - 1];
    p.m = a[a.size() - 2];
    if (b[b.size() - 2] != p.k) fail();
    p.n = b[b.size() - 1];
    if (b.size() == 2) {  // [..., m, k] x [k, n]: fold leading dims of a into m
        for (std::size_t i = 0; i + 2 < a.size(); ++i) p.m *= a[i];
        p.out_shape = a;
        p.out_shape.back() = p.n;
        return p;
    }
    if (a.size() != b.size()) fail();
    for (std::size_t i = 0; i + 2 < a.size(); ++i) {
        if (a[i] != b[i]) fail();
        p.batch *= a[i];
    }
    p.batched_b = true;
    p.out_shape = a;
    p.out_shape.back() = p.n;
    return p;
}

/// C[batch] = op(A[batch]) op(B[batch]) (+ C when accumulate) for dense matrices: the device's
/// batched GEMM (Kernels::gemm_batched: batches spread over threads when there are at least as many
/// as threads, else one threaded GEMM after another).
template <Real T>
void batched_gemm(std::size_t batch, bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, backend::GemmSource<T> a,
                  std::size_t a_stride, backend::GemmSource<T> b, std::size_t b_stride, T* c, std::size_t c_stride, bool accumulate) {
    backend::gemm_batched(batch, ta, tb, m, n, k, T{1}, a, ta ? m : k, a_stride, b, tb ? k : n, b_stride, accumulate ? T{1} : T{0}, c, n, c_stride);
}

}  // namespace detail

/// Matrix product: `[..., m, k] x [k, n] -> [..., m, n]` (leading dims of `a` folded into one GEMM)
/// or batched `[..., m, k] x [..., k, n]` with equal batch dims.
template <Real T>
Tensor<T> matmul(const Tensor<T>& a, const Tensor<T>& b) {
    backend::op_scope on("matmul", a, b);
    const auto p = detail::plan_matmul(a.shape(), b.shape());
    return on.run<op::matmul>({a, b}, {}, [&] {
        auto y = Tensor<T>::uninitialized(p.out_shape);
        const std::size_t bs = p.batched_b ? p.k * p.n : 0;
        const backend::GemmOperand<T> a_op(a), b_op(b);
        detail::batched_gemm(p.batch, false, false, p.m, p.n, p.k, a_op.source(), p.m * p.k, b_op.source(), bs, y.data(), p.m * p.n, false);
        const Tensor<T> inputs[2] = {a, b};
        autodiff::record<T>("matmul", inputs, std::span<Tensor<T>>(&y, 1),
                            [a_shape = a.shape(), b_shape = b.shape(), ak = a_op.kept_for_backward(a), bk = b_op.kept_for_backward(b),
                             p](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
            const backend::GemmOperand<T> dy(g[0]);
            const std::size_t bs = p.batched_b ? p.k * p.n : 0;
            if (sink.needs(0)) {  // dA = dY B^T
                auto da = Tensor<T>::uninitialized(a_shape);
                detail::batched_gemm(p.batch, false, true, p.m, p.k, p.n, dy.source(), p.m * p.n, bk.ready().source(), bs, da.data(), p.m * p.k, false);
                sink.add(0, std::move(da));
            }
            if (sink.needs(1)) {  // dB = A^T dY (summed over batches when b is shared)
                auto db = Tensor<T>::uninitialized(b_shape);
                const backend::GemmOperand<T> as = ak.ready();
                if (p.batched_b)
                    detail::batched_gemm(p.batch, true, false, p.k, p.n, p.m, as.source(), p.m * p.k, dy.source(), p.m * p.n, db.data(), p.k * p.n,
                                         false);
                else
                    backend::gemm(true, false, p.k, p.n, p.m, T{1}, as.source(), p.k, dy.source(), p.n, T{0}, db.data(), p.n);
                sink.add(1, std::move(db));
            }
        });
        return y;
    });
}

/// Contraction of one axis with a matrix: x [..., K, ...] (K at `axis`) and w [K, N] give
/// y [..., N, ...] with y[pre, n, post] = sum_k x[pre, k, post] w[k, n]. Each `pre` block is one
/// GEMM w^T [N, K] x X_pre [K, post] on x's own layout, so no transposed copies are made (a
/// matmul would need the axis moved last and back: two copies each way).
template <Real T>
Tensor<T> contract_axis(const Tensor<T>& x, const Tensor<T>& w, std::size_t axis) {
    backend::op_scope on("contract_axis", x, w);
    if (!(axis < x.rank() && w.rank() == 2 && w.shape()[0] == x.shape()[axis]))
        throw shape_error(detail::concat("contract_axis: x of shape ", to_string(x.shape()), " (axis ", axis, ") and w of shape ",
                                         to_string(w.shape()), " do not contract (need w [x.shape[axis], N])"));
    return on.run<op::contract_axis>({x, w}, {.axis = axis}, [&] {
        const std::size_t k = w.shape()[0], n = w.shape()[1];
        std::size_t outer = 1, inner = 1;
        for (std::size_t i = 0; i < axis; ++i) outer *= x.shape()[i];
        for (std::size_t i = axis + 1; i < x.rank(); ++i) inner *= x.shape()[i];
        Shape out_shape = x.shape();
        out_shape[axis] = n;
        auto y = Tensor<T>::uninitialized(out_shape);
        // y_o [n, inner] = w^T x_o
        const backend::GemmOperand<T> xs(x);
        detail::batched_gemm(outer, true, false, n, inner, k, backend::GemmOperand<T>(w).source(), 0, xs.source(), k * inner, y.data(), n * inner,
                             false);
        const Tensor<T> inputs[2] = {x, w};
        autodiff::record<T>("contract_axis", inputs, std::span<Tensor<T>>(&y, 1),
                            [x_shape = x.shape(), xk = xs.kept_for_backward(x), w, outer, inner, k,
                             n](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                                const backend::GemmOperand<T> dy(g[0]);
                                if (sink.needs(0)) {  // dx_o [k, inner] = w dy_o
                                    auto dx = Tensor<T>::uninitialized(x_shape);
                                    detail::batched_gemm(outer, false, false, k, inner, n, backend::GemmOperand<T>(w).source(), 0, dy.source(), n * inner,
                                                         dx.data(), k * inner, false);
                                    sink.add(0, std::move(dx));
                                }
                                if (sink.needs(1)) {  // dw [k, n] = sum_o x_o dy_o^T, summed in order of o (thread-count independent)
                                    auto dw = Tensor<T>(w.shape());
                                    const backend::GemmOperand<T> xs = xk.ready();
                                    for (std::size_t o = 0; o < outer; ++o)
                                        backend::gemm(false, true, k, n, inner, T{1}, xs.source() + o * k * inner, inner, dy.source() + o * n * inner, inner,
                                                      T{1}, dw.data(), n);
                                    sink.add(1, std::move(dw));
                                }
                            });
        return y;
    });
}

// ---- the keys of the products' lowering rules (their rules: olmax/trace/rules.hpp) -------------

namespace op {

/// [..., m, k] x [k, n], or [..., m, k] x [..., k, n] with equal leading axes.
struct matmul : registered<matmul> {
    static constexpr std::string_view name = "matmul";
    struct attrs {};
    static std::vector<sample<attrs>> samples(Generator& rng) {
        auto u = [&](const Shape& s) { return samples::uniform(rng, s); };
        return {{{u({3, 4}), u({4, 5})}}, {{u({2, 3, 4}), u({4, 2})}}, {{u({2, 3, 4}), u({2, 4, 5})}}, {{u({2, 2, 1, 3}), u({2, 2, 3, 2})}}};
    }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) { return olmax::matmul(in[0], in[1]); }
};
/// x [..., K (axis), ...] with w [K, N].
struct contract_axis : registered<contract_axis> {
    static constexpr std::string_view name = "contract_axis";
    struct attrs {
        std::size_t axis = 0;
    };
    static std::vector<sample<attrs>> samples(Generator& rng) {
        auto u = [&](const Shape& s) { return samples::uniform(rng, s); };
        return {{{u({2, 3, 4}), u({3, 5})}, {1}}, {{u({2, 3, 4}), u({4, 2})}, {2}}, {{u({3, 2}), u({3, 4})}, {0}}};
    }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) { return olmax::contract_axis(in[0], in[1], a.axis); }
};

}  // namespace op

}  // namespace olmax
