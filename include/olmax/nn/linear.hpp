#pragma once
// Linear map over the last axis: y = x W (+ b), W [in, out].

#include <string_view>

#include "olmax/backend/dispatch.hpp"
#include "olmax/nn/contract.hpp"
#include "olmax/nn/init.hpp"
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/linalg.hpp"

namespace olmax::nn {

template <Real T = float>
class Linear {
public:
    using value_type = T;
    using config_type = Config;
    static constexpr std::string_view name = "linear";
    static constexpr bool position_wise = true;

    /// features -> features, orthogonal init (the original's default for weights).
    Linear(const Config& config, Generator& rng) : Linear(config.checked_features("nn::Linear"), config.features, rng, config.bias) {}
    Linear(std::size_t in_features, std::size_t out_features, Generator& rng, bool with_bias = false) {
        check<value_error>(in_features > 0 && out_features > 0, "nn::Linear: features must be positive, got in=", in_features,
                           " out=", out_features);
        weight_ = parameter(orthogonal_init<T>({in_features, out_features}, rng));
        if (with_bias) bias_ = parameter(Tensor<T>({out_features}));
    }

    Tensor<T> forward(const Tensor<T>& x, const LayerContext& = {}) const {
        check<shape_error>(x.rank() >= 1 && x.shape().back() == weight_.shape()[0], "nn::Linear: input of shape ", to_string(x.shape()),
                           " does not end in the layer's ", weight_.shape()[0], " input features");
        Tensor<T> y = matmul(x, weight_);
        return bias_.defined() ? add(y, bias_) : y;
    }

    void visit_parameters(ParameterVisitor<T>& visit) {
        visit("weight", weight_, Role::weight);
        if (bias_.defined()) visit("bias", bias_, Role::bias);
    }

    std::size_t in_features() const { return weight_.shape()[0]; }
    std::size_t out_features() const { return weight_.shape()[1]; }

private:
    Tensor<T> weight_, bias_;
};

}  // namespace olmax::nn
