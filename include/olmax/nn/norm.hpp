#pragma once
// Normalisation layers: the original's L2 ScaleNorm, RMSNorm, and the sandwich wrapper.

#include <string_view>

#include "olmax/backend/dispatch.hpp"
#include "olmax/nn/continuation.hpp"
#include "olmax/nn/contract.hpp"
#include "olmax/ops/norm.hpp"

namespace olmax::nn {

/// x / max(||x||_2, eps) * w over the last axis (the original Olmax norm, not x / RMS(x)); w init 1.
template <Real T = float>
class ScaleNorm {
public:
    using value_type = T;
    using config_type = Config;
    static constexpr std::string_view name = "scale_norm";
    static constexpr bool position_wise = true;

    ScaleNorm(const Config& config, Generator&) : ScaleNorm(config.checked_features("nn::ScaleNorm"), config.norm_eps) {}
    /// `with_scale = false` gives the original's final output norm (no learned scale).
    explicit ScaleNorm(std::size_t features, double eps = 1e-16, bool with_scale = true) : eps_(T(eps)) {
        check<value_error>(features > 0 && eps > 0, "nn::ScaleNorm: needs features > 0 and eps > 0, got ", features, " and ", eps);
        if (with_scale) scale_ = parameter(Tensor<T>({features}, T{1}));
    }

    Tensor<T> forward(const Tensor<T>& x, const LayerContext& = {}) const { return scale_norm(x, scale_, eps_); }
    void visit_parameters(ParameterVisitor<T>& visit) {
        if (scale_.defined()) visit("scale", scale_, Role::norm_scale);
    }

private:
    Tensor<T> scale_;
    T eps_;
};

/// x / sqrt(mean(x^2) + eps) * w over the last axis (Zhang & Sennrich 2019); w init 1.
template <Real T = float>
class RMSNorm {
public:
    using value_type = T;
    using config_type = Config;
    static constexpr std::string_view name = "rms_norm";
    static constexpr bool position_wise = true;

    RMSNorm(const Config& config, Generator&) : RMSNorm(config.checked_features("nn::RMSNorm"), config.rms_eps) {}
    explicit RMSNorm(std::size_t features, double eps = 1e-6) : scale_(parameter(Tensor<T>({features}, T{1}))), eps_(T(eps)) {
        check<value_error>(features > 0 && eps >= 0, "nn::RMSNorm: needs features > 0 and eps >= 0, got ", features, " and ", eps);
    }

    Tensor<T> forward(const Tensor<T>& x, const LayerContext& = {}) const { return rms_norm(x, scale_, eps_); }
    void visit_parameters(ParameterVisitor<T>& visit) { visit("scale", scale_, Role::norm_scale); }

private:
    Tensor<T> scale_;
    T eps_;
};

/// Sandwich norm, the original's `prenorm` decorator: out = N_out(inner(N_in(x))), both ScaleNorms
/// with scales and no activation. Parameters sit in the inner layer's scope ("dense/norm_in/scale").
template <class Inner>
class Sandwich {
    static_assert(assert_layer<Inner>());

public:
    using value_type = typename Inner::value_type;
    using config_type = typename Inner::config_type;
    static constexpr std::string_view name = Inner::name;
    static constexpr bool position_wise = PositionWiseLayer<Inner>;
    using sequence_state = sequence_state_t<Inner>;

    Sandwich(const config_type& config, Generator& rng)
        : norm_in_(config.checked_features("nn::Sandwich"), config.norm_eps), inner_(config, rng), norm_out_(config.features, config.norm_eps) {}

    Tensor<value_type> forward(const Tensor<value_type>& x, const LayerContext& ctx = {}) const {
        return norm_out_.forward(inner_.forward(norm_in_.forward(x, ctx), ctx), ctx);
    }
    /// The next steps of a sequence (nn::continue_sequence): the inner layer's state is the sandwich's.
    Tensor<value_type> continue_sequence(const Tensor<value_type>& x, sequence_state& state, const LayerContext& ctx = {}) const
        requires ContinuableLayer<Inner>
    {
        return norm_out_.forward(nn::continue_sequence(inner_, norm_in_.forward(x, ctx), state, ctx), ctx);
    }
    void visit_parameters(ParameterVisitor<value_type>& visit) {
        visit.child("norm_in", norm_in_);
        inner_.visit_parameters(visit);
        visit.child("norm_out", norm_out_);
    }
    const Inner& inner() const { return inner_; }
    std::size_t layer_period(const Shape& input_shape) const { return nn::layer_period(inner_, input_shape); }

private:
    ScaleNorm<value_type> norm_in_;
    Inner inner_;
    ScaleNorm<value_type> norm_out_;
};

}  // namespace olmax::nn
