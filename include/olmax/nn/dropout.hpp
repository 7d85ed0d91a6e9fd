#pragma once
// Dropout whose mask is a pure function of LayerContext::random_seed, so a reversible recompute
// draws the identical mask (RevLib saves and restores RNG states for the same purpose).

#include <string_view>

#include "olmax/backend/dispatch.hpp"
#include "olmax/nn/contract.hpp"
#include "olmax/ops/elementwise.hpp"

namespace olmax::nn {

/// Inverted dropout: keeps each element with probability 1 - p and scales it by 1 / (1 - p);
/// identity when p = 0 or `ctx.training` is false.
template <Real T = float>
class Dropout {
public:
    using value_type = T;
    using config_type = Config;
    static constexpr std::string_view name = "dropout";

    Dropout(const Config& config, Generator&) : Dropout(config.dropout) {}
    explicit Dropout(double p) : p_(p) {
        check<value_error>(p >= 0 && p < 1, "nn::Dropout: the drop probability must be in [0, 1), got ", p);
    }

    Tensor<T> forward(const Tensor<T>& x, const LayerContext& ctx = {}) const {
        if (p_ == 0 || !ctx.training) return x;
        Generator rng(mix_seed(ctx.random_seed, 0x64726f70));  // "drop"
        backend::op_scope on("nn::Dropout", x);
        auto mask = Tensor<T>::uninitialized(x.shape());
        const T keep_scale = T(1 / (1 - p_));
        for (T& m : mask) m = rng.uniform() < p_ ? T{0} : keep_scale;
        return mul(x, mask);
    }
    void visit_parameters(ParameterVisitor<T>&) {}

private:
    double p_;
};

}  // namespace olmax::nn
