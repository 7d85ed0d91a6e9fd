#pragma once
// Causal convolutions along time (axis -2 of [B, T, F]) and the original's dense block.

#include <string_view>

#include "olmax/backend/backend.hpp"
#include "olmax/nn/contract.hpp"
#include "olmax/nn/init.hpp"
#include "olmax/ops/conv.hpp"
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/norm.hpp"

namespace olmax::nn {

/// Causal 1-D convolution with K taps: output t sees inputs t-K+1..t. Weight [K, Cin/groups, Cout]
/// with fan-in normal init (fan-in = K * Cin/groups).
template <std::size_t K, Real T = float, class B = backend::default_backend>
class CausalConv {
    static_assert(K >= 1, "olmax::nn::CausalConv: the kernel size K must be at least 1");

public:
    using value_type = T;
    using config_type = Config;
    static constexpr std::string_view name = "conv";

    CausalConv(const Config& config, Generator& rng) : CausalConv(config.features, config.features, rng, config.conv_groups, config.bias) {}
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
        return bias_.defined() ? causal_conv1d<B>(x, weight_, bias_, groups_) : causal_conv1d<B>(x, weight_, groups_);
    }
    void visit_parameters(ParameterVisitor<T>& visit) {
        visit("weight", weight_, Role::weight);
        if (bias_.defined()) visit("bias", bias_, Role::bias);
    }

private:
    Tensor<T> weight_, bias_;
    std::size_t groups_;
};

/// The original dense block: conv(K, F -> H) -> ScaleNorm + leaky-ReLU -> conv(K, H -> F),
/// H = Config::hidden() (2F by default).
template <std::size_t K, Real T = float, class B = backend::default_backend>
class DenseConv {
public:
    using value_type = T;
    using config_type = Config;
    static constexpr std::string_view name = "dense";

    DenseConv(const Config& config, Generator& rng)
        : conv0_(config.features, config.hidden(), rng, 1, false),
          mid_scale_(parameter(Tensor<T>({config.hidden()}, T{1}))),
          conv1_(config.hidden(), config.features, rng, 1, false),
          eps_(T(config.norm_eps)),
          slope_(T(config.leaky_slope)) {}

    Tensor<T> forward(const Tensor<T>& x, const LayerContext& ctx = {}) const {
        Tensor<T> h = conv0_.forward(x, ctx);
        h = leaky_relu<B>(scale_norm<B>(h, mid_scale_, eps_), slope_);
        return conv1_.forward(h, ctx);
    }
    void visit_parameters(ParameterVisitor<T>& visit) {
        visit.child("conv0", conv0_);
        visit("norm/scale", mid_scale_, Role::norm_scale);
        visit.child("conv1", conv1_);
    }

private:
    CausalConv<K, T, B> conv0_;
    Tensor<T> mid_scale_;
    CausalConv<K, T, B> conv1_;
    T eps_, slope_;
};

}  // namespace olmax::nn
