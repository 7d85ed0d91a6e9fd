#pragma once
// Activations as parameter-free layers (for Sequential and as the non-linearity of other layers).

#include <span>
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
    static constexpr bool position_wise = true;

    explicit LeakyReLU(T slope = T(0.01)) : slope_(slope) {}
    LeakyReLU(const Config& config, Generator&) : slope_(T(config.leaky_slope)) {}
    Tensor<T> forward(const Tensor<T>& x, const LayerContext& = {}) const { return leaky_relu(x, slope_); }
    void visit_parameters(ParameterVisitor<T>&) {}

private:
    T slope_;
};

/// A unary element-wise op as a parameter-free layer: Op is its key (olmax::op::mish, op::silu,
/// ...; ops/op_keys.hpp), run with its default attributes. The layer's name is the op's.
template <class Op, Real T = float>
class Elementwise {
public:
    using value_type = T;
    using config_type = Config;
    static constexpr std::string_view name = Op::name;
    static constexpr bool position_wise = true;

    Elementwise() = default;
    Elementwise(const Config&, Generator&) {}
    Tensor<T> forward(const Tensor<T>& x, const LayerContext& = {}) const {
        return Op::eager(std::span<const Tensor<T>>(&x, 1), typename Op::attrs{});
    }
    void visit_parameters(ParameterVisitor<T>&) {}
};

/// Mish: x * tanh(softplus(x)) (Misra 2019).
template <Real T = float>
using Mish = Elementwise<op::mish, T>;

/// GELU, tanh form (olmax::gelu): the activation of GPT-2's and nanoGPT's MLPs.
template <Real T = float>
using GELU = Elementwise<op::gelu, T>;

/// Elephant: 1 / (1 + |x/a|^d) (Lan & Mahmood 2023), a = 1, d = 4.
template <Real T = float>
using Elephant = Elementwise<op::elephant, T>;

}  // namespace olmax::nn
