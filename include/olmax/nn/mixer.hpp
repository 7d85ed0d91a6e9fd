#pragma once
// Hierarchical causal MLP-mixer over the sequence (the original src/model/mixer.py, PR #75).

#include <algorithm>
#include <string_view>

#include "olmax/backend/dispatch.hpp"
#include "olmax/nn/contract.hpp"
#include "olmax/nn/init.hpp"
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/linalg.hpp"
#include "olmax/ops/norm.hpp"
#include "olmax/ops/shape.hpp"

namespace olmax::nn {

/// Token mixing within chunks of K positions with upper-triangular K x K matrices (output g sees
/// inputs k <= g, so it is causal), two matmuls with ScaleNorm + leaky-ReLU between them, no
/// channel MLP; memory O(S K) instead of O(S^2).
///
/// Modes alternate with the layer index: with L = ceil(log_K S) levels, layer l uses mode
/// m = l mod L and mixes positions p = c (K s) + k s + j along k for fixed (c, j), stride
/// s = min(K^m, S / K): mode 0 mixes K contiguous tokens (local), higher modes mix strided
/// ("axial") positions. For S = 4096, K = 512 that is the original's local / stride-8 pair.
/// Needs S % K == 0 (and S % (K s) == 0); otherwise throws shape_error naming the sizes.
template <std::size_t K, Real T = float>
class HierarchicalMixer {
    static_assert(K >= 2, "olmax::nn::HierarchicalMixer: the chunk size K must be at least 2");

public:
    using value_type = T;
    using config_type = Config;
    static constexpr std::string_view name = "mixer";

    HierarchicalMixer(const Config& config, Generator& rng)
        : w0_(parameter(orthogonal_init<T>({K, K}, rng))),
          w1_(parameter(orthogonal_init<T>({K, K}, rng))),
          scale_(parameter(Tensor<T>({config.checked_features("nn::HierarchicalMixer")}, T{1}))),
          mask_(Tensor<T>::uninitialized({K, K})),
          eps_(T(config.norm_eps)),
          slope_(T(config.leaky_slope)) {
        for (std::size_t k = 0; k < K; ++k)
            for (std::size_t g = 0; g < K; ++g) mask_(k, g) = k <= g ? T{1} : T{0};
    }

    /// Number of mixing levels for sequence length S: ceil(log_K S), at least 1.
    static std::size_t levels(std::size_t sequence) {
        std::size_t levels = 1;
        for (std::size_t span = K; span < sequence; span *= K) ++levels;
        return levels;
    }

    /// The stride layer `layer_index` mixes at, for sequence length S (checked).
    static std::size_t stride(std::size_t sequence, std::size_t layer_index) {
        check<shape_error>(sequence > 0 && sequence % K == 0, "nn::HierarchicalMixer<", K, ">: sequence length ", sequence,
                           " is not a positive multiple of the chunk size ", K);
        const std::size_t mode = layer_index % levels(sequence);
        std::size_t s = 1;
        for (std::size_t m = 0; m < mode; ++m) s *= K;
        s = std::min(s, sequence / K);
        check<shape_error>(sequence % (K * s) == 0, "nn::HierarchicalMixer<", K, ">: sequence length ", sequence,
                           " is not a multiple of K * stride = ", K, " * ", s, " (layer ", layer_index, ")");
        return s;
    }

    /// The mixer alternates its mode with the layer index (nn::layer_period): a period of `levels`.
    std::size_t layer_period(const Shape& input_shape) const { return input_shape.size() == 3 ? levels(input_shape[1]) : 1; }

    Tensor<T> forward(const Tensor<T>& x, const LayerContext& ctx = {}) const {
        check<shape_error>(x.rank() == 3 && x.shape()[2] == scale_.size(), "nn::HierarchicalMixer<", K, ">: expected input [B, S, ",
                           scale_.size(), "], got ", to_string(x.shape()));
        const std::size_t batch = x.shape()[0], sequence = x.shape()[1], features = x.shape()[2];
        const std::size_t s = stride(sequence, ctx.layer_index);
        const Shape grouped{batch, sequence / (K * s), K, s, features};
        Tensor<T> h = mix(reshape(x, grouped), w0_);
        h = leaky_relu(scale_norm(h, scale_, eps_), slope_);
        return reshape(mix(h, w1_), x.shape());
    }

    void visit_parameters(ParameterVisitor<T>& visit) {
        visit("w0", w0_, Role::weight);
        visit("w1", w1_, Role::weight);
        visit("norm/scale", scale_, Role::norm_scale);
    }

private:
    /// [B, G, K, s, F] -> same shape, out[.., g, ..] = sum_{k <= g} in[.., k, ..] W[k, g]: one
    /// [K, K] x [K, s F] GEMM per group on the grouped layout itself.
    Tensor<T> mix(const Tensor<T>& grouped, const Tensor<T>& w) const { return contract_axis(grouped, mul(w, mask_), 2); }

    Tensor<T> w0_, w1_, scale_, mask_;
    T eps_, slope_;
};

}  // namespace olmax::nn
