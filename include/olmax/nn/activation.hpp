#pragma once
// Activations as parameter-free layers (for Sequential and as the non-linearity of other layers).

#include <string_view>

#include "olmax/backend/dispatch.hpp"
#include "olmax/nn/contract.hpp"
#include "olmax/ops/elementwise.hpp"

namespace olmax::nn {

/// Leaky ReLU with the original's slope 0.01 (Config::leaky_slope).
template <Real T = float>
class LeakyReLU {
public:
    using value_type = T;
    using config_type = Config;
    static constexpr std::string_view name = "leaky_relu";

    explicit LeakyReLU(T slope = T(0.01)) : slope_(slope) {}
    LeakyReLU(const Config& config, Generator&) : slope_(T(config.leaky_slope)) {}
    Tensor<T> forward(const Tensor<T>& x, const LayerContext& = {}) const { return leaky_relu(x, slope_); }
    void visit_parameters(ParameterVisitor<T>&) {}

private:
    T slope_;
};

/// Mish: x * tanh(softplus(x)) (Misra 2019).
template <Real T = float>
class Mish {
public:
    using value_type = T;
    using config_type = Config;
    static constexpr std::string_view name = "mish";

    Mish() = default;
    Mish(const Config&, Generator&) {}
    Tensor<T> forward(const Tensor<T>& x, const LayerContext& = {}) const { return mish(x); }
    void visit_parameters(ParameterVisitor<T>&) {}
};

/// GELU, tanh form (olmax::gelu): the activation of GPT-2's and nanoGPT's MLPs.
template <Real T = float>
class GELU {
public:
    using value_type = T;
    using config_type = Config;
    static constexpr std::string_view name = "gelu";

    GELU() = default;
    GELU(const Config&, Generator&) {}
    Tensor<T> forward(const Tensor<T>& x, const LayerContext& = {}) const { return gelu(x); }
    void visit_parameters(ParameterVisitor<T>&) {}
};

/// Elephant: 1 / (1 + |x/a|^d) (Lan & Mahmood 2023), a = 1, d = 4.
template <Real T = float>
class Elephant {
public:
    using value_type = T;
    using config_type = Config;
    static constexpr std::string_view name = "elephant";

    Elephant() = default;
    Elephant(const Config&, Generator&) {}
    Tensor<T> forward(const Tensor<T>& x, const LayerContext& = {}) const { return elephant(x); }
    void visit_parameters(ParameterVisitor<T>&) {}
};

}  // namespace olmax::nn
