#pragma once
// Causal convolutions along time (axis -2 of [B, T, F]) and the original's dense block.

#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/nn/continuation.hpp"
#include "olmax/nn/contract.hpp"
#include "olmax/nn/init.hpp"
#include "olmax/ops/conv.hpp"
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/math_rules.hpp"
#include "olmax/ops/norm.hpp"

namespace olmax::nn {

/// Causal 1-D convolution with K taps: output t sees inputs t-K+1..t. Weight [K, Cin/groups, Cout]
/// with fan-in normal init (fan-in = K * Cin/groups).
template <std::size_t K, Real T = float>
class CausalConv {
    static_assert(K >= 1, "olmax::nn::CausalConv: the kernel size K must be at least 1");

public:
    using value_type = T;
    using config_type = Config;
    static constexpr std::string_view name = "conv";

    CausalConv(const Config& config, Generator& rng)
        : CausalConv(config.checked_features("nn::CausalConv"), config.features, rng, config.conv_groups, config.bias) {}
    CausalConv(std::size_t in_features, std::size_t out_features, Generator& rng, std::size_t groups = 1, bool with_bias = false)
        : groups_(groups) {
        check<value_error>(in_features > 0 && out_features > 0 && groups > 0 && in_features % groups == 0 && out_features % groups == 0,
                           "nn::CausalConv<", K, ">: ", in_features, " input and ", out_features, " output features must be positive and divisible by ",
                           groups, " groups");
        weight_ = parameter(fan_in_normal<T>({K, in_features / groups, out_features}, K * (in_features / groups), rng));
        if (with_bias) bias_ = parameter(Tensor<T>({out_features}));
    }

    Tensor<T> forward(const Tensor<T>& x, const LayerContext& = {}) const {
        check<shape_error>(x.rank() == 3 && x.shape()[2] == weight_.shape()[1] * groups_, "nn::CausalConv<", K, ">: expected input [B, T, ",
                           weight_.shape()[1] * groups_, "], got ", to_string(x.shape()));
        return bias_.defined() ? causal_conv1d(x, weight_, bias_, groups_) : causal_conv1d(x, weight_, groups_);
    }

    /// The next steps of a sequence (nn::continue_sequence): the state is the last K-1 inputs
    /// [batch, K-1, Cin] (undefined: zeros, as before a sequence's first step); the convolution runs
    /// over them and x, and the outputs of x's steps are returned.
    using sequence_state = Tensor<T>;
    Tensor<T> continue_sequence(const Tensor<T>& x, sequence_state& tail, const LayerContext& ctx = {}) const {
        static const std::string layer = olmax::detail::concat("nn::CausalConv<", K, ">");  // formed once, not per call
        return detail::continue_taps(x, tail, K, [&](const Tensor<T>& seen) { return forward(seen, ctx); }, layer);
    }
    void visit_parameters(ParameterVisitor<T>& visit) {
        visit("weight", weight_, Role::weight);
        if (bias_.defined()) visit("bias", bias_, Role::bias);
    }

private:
    Tensor<T> weight_, bias_;
    std::size_t groups_;
};

namespace detail {

/// leaky_relu(scale_norm(h, scale, eps), slope) over the last axis as one op, with the two ops'
/// maths (olmax/ops/norm.hpp, olmax/ops/elementwise.hpp): r = 1 / max(||h||_2, eps) per row,
/// z = h r w, out = z for z >= 0 and slope z below (math::rules::leaky_relu). Backward:
/// dz = dout (slope where z < 0), then ScaleNorm's dh = r dzhat - r^3 h sum(dzhat h) with
/// dzhat = dz w (dh = r dzhat on clamped rows) and dw = sum over rows of dz h r. It keeps only h
/// and r for the backward (z is recomputed with the forward's expression, so its sign is the
/// forward's): one [rows, F] tensor less on the tape than the two ops, and the element loops are
/// branch-free so they vectorise.
template <Real T>
Tensor<T> scale_norm_leaky_relu(const Tensor<T>& h, const Tensor<T>& scale, T eps, T slope) {
    backend::op_scope on("nn::DenseConv norm", h, scale);
    check<value_error>(eps > T{0}, "nn::DenseConv: the norm's eps must be positive, got ", eps);
    check<shape_error>(h.rank() >= 1 && scale.rank() == 1 && scale.shape()[0] == h.shape().back(), "nn::DenseConv: norm scale of shape ",
                       to_string(scale.shape()), " does not match the last axis of ", to_string(h.shape()));
    return on.run_composed([&] { return leaky_relu(scale_norm(h, scale, eps), slope); }, [&] {  // traced: the same function from its parts
        const std::size_t f = h.shape().back();
        std::size_t rows = 1;
        for (std::size_t i = 0; i + 1 < h.rank(); ++i) rows *= h.shape()[i];
        auto out = Tensor<T>::uninitialized(h.shape());
        auto r = Tensor<T>::uninitialized({rows});
        std::vector<unsigned char> clamped(rows);
        {
            const T *hp = h.data(), *wp = scale.data();
            T *op = out.data(), *rp = r.data();
            backend::current().parallel_for(rows, 2 * f, [&](std::size_t lo, std::size_t hi) {
                for (std::size_t i = lo; i < hi; ++i) {
                    const T* row = hp + i * f;
                    double sum_sq = 0;
    #pragma omp simd reduction(+ : sum_sq)
                    for (std::size_t j = 0; j < f; ++j) sum_sq += double(row[j]) * double(row[j]);
                    bool clamp = false;
                    const T factor = olmax::detail::norm_ops::l2_factor(sum_sq, eps, clamp);
                    rp[i] = factor;
                    clamped[i] = clamp;
                    T* o = op + i * f;
                    const math::rules::leaky_relu leaky{double(slope)};  // a local: the select needs no conditional load, so it vectorises
    #pragma omp simd
                    for (std::size_t j = 0; j < f; ++j) o[j] = leaky.value(T(row[j] * factor * wp[j]));
                }
            });
        }
        const Tensor<T> inputs[2] = {h, scale};
        autodiff::record<T>("scale_norm_leaky_relu", inputs, std::span<Tensor<T>>(&out, 1),
                            [h, scale, r, clamped = std::move(clamped), rows, f, slope](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                                const bool need_dh = sink.needs(0), need_dw = sink.needs(1);
                                if (!need_dh && !need_dw) return;
                                const T *hp = h.data(), *wp = scale.data(), *rp = r.data(), *gp = g[0].data();
                                // dz = dout through the leaky-ReLU (its sign from the forward's z), then ScaleNorm's gradients.
                                auto dz_tensor = Tensor<T>::uninitialized(h.shape());
                                T* dz = dz_tensor.data();
                                backend::current().parallel_for(rows, 2 * f, [&](std::size_t lo, std::size_t hi) {
                                    const std::size_t n = f;
                                    const math::rules::leaky_relu leaky{double(slope)};
                                    for (std::size_t i = lo; i < hi; ++i) {
                                        const T *row = hp + i * n, *grow = gp + i * n;
                                        T* dzr = dz + i * n;
                                        const T rr = rp[i];
    #pragma omp simd
                                        for (std::size_t j = 0; j < n; ++j) {
                                            const T z = row[j] * rr * wp[j];
                                            dzr[j] = grow[j] * leaky.derivative(z, z);
                                        }
                                    }
                                });
                                if (need_dh)
                                    sink.add(0, olmax::detail::norm_ops::input_gradient(dz, hp, wp, rp, clamped.data(), h.shape(), 1.0));
                                if (need_dw) sink.add(1, olmax::detail::norm_ops::scale_gradient(dz, hp, rp, rows, f));
                            });
        return out;
    });
}

}  // namespace detail

/// The original dense block: conv(K, F -> H) -> ScaleNorm + leaky-ReLU -> conv(K, H -> F),
/// H = Config::hidden() (2F by default).
template <std::size_t K, Real T = float>
class DenseConv {
public:
    using value_type = T;
    using config_type = Config;
    static constexpr std::string_view name = "dense";

    DenseConv(const Config& config, Generator& rng)
        : conv0_(config.checked_features("nn::DenseConv"), config.hidden(), rng, 1, false),
          mid_scale_(parameter(Tensor<T>({config.hidden()}, T{1}))),
          conv1_(config.hidden(), config.features, rng, 1, false),
          eps_(T(config.norm_eps)),
          slope_(T(config.leaky_slope)) {}

    Tensor<T> forward(const Tensor<T>& x, const LayerContext& ctx = {}) const {
        Tensor<T> h = conv0_.forward(x, ctx);
        h = detail::scale_norm_leaky_relu(h, mid_scale_, eps_, slope_);  // = leaky_relu(scale_norm(h, scale, eps), slope)
        return conv1_.forward(h, ctx);
    }

    /// The next steps of a sequence (nn::continue_sequence): the two convolutions' carried inputs.
    struct sequence_state {
        Tensor<T> conv0, conv1;
    };
    Tensor<T> continue_sequence(const Tensor<T>& x, sequence_state& state, const LayerContext& ctx = {}) const {
        Tensor<T> h = conv0_.continue_sequence(x, state.conv0, ctx);
        h = detail::scale_norm_leaky_relu(h, mid_scale_, eps_, slope_);
        return conv1_.continue_sequence(h, state.conv1, ctx);
    }
    void visit_parameters(ParameterVisitor<T>& visit) {
        visit.child("conv0", conv0_);
        visit("norm/scale", mid_scale_, Role::norm_scale);
        visit.child("conv1", conv1_);
    }

private:
    CausalConv<K, T> conv0_;
    Tensor<T> mid_scale_;
    CausalConv<K, T> conv1_;
    T eps_, slope_;
};

}  // namespace olmax::nn
