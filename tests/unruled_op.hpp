#pragma once
// An op of a user's with a key but no lowering rule (every op of olmax has one), and a layer of it:
// on traced tensors the op fails at trace time with one line naming it. The tests of that refusal
// use them.
#include <string_view>

#include <olmax/olmax.hpp>

namespace olmax_test {

/// clip(x, -1, 1), eager only: its key is not an entry of op::all, and no rule is registered for it.
struct hardtanh_key {
    static constexpr std::string_view name = "my_hardtanh";
    struct attrs {};
};

template <olmax::Real T>
olmax::Tensor<T> hardtanh(const olmax::Tensor<T>& x) {
    olmax::backend::op_scope on(hardtanh_key::name, x);
    return on.run<hardtanh_key>({x}, {}, [&] {
        const olmax::Tensor<T> minus_one(x.shape(), T{-1});
        return olmax::neg(olmax::maximum(olmax::neg(olmax::maximum(x, minus_one)), minus_one));
    });
}

/// A layer of it, D -> D, for a stack.
template <olmax::Real T = float>
class HardTanh {
public:
    using value_type = T;
    using config_type = olmax::nn::Config;
    static constexpr std::string_view name = "hardtanh";

    HardTanh() = default;
    HardTanh(const olmax::nn::Config&, olmax::Generator&) {}
    olmax::Tensor<T> forward(const olmax::Tensor<T>& x, const olmax::nn::LayerContext& = {}) const { return hardtanh(x); }
    void visit_parameters(olmax::nn::ParameterVisitor<T>&) {}
};

}  // namespace olmax_test
