#pragma once
// Block recipes of the byte LM (models::ByteLM<Recipe>): each names a block type, built per element
// type, and the facts the model needs before it builds anything (parameters per block, activation
// memory, the sequence multiple). The main job picks one at run time with `--block`
// (models::with_recipe), a switch over these few pre-instantiated types.
//
// Every recipe is a two-function reversible coupling (nn::Reversible): activation memory stays flat
// in depth, and the two functions split the work into token mixing and channel mixing.

#include <array>
#include <cmath>
#include <cstddef>
#include <string_view>
#include <utility>

#include "olmax/core/core.hpp"
#include "olmax/nn/conv.hpp"
#include "olmax/nn/mixer.hpp"
#include "olmax/nn/moe.hpp"
#include "olmax/nn/norm.hpp"
#include "olmax/nn/qrnn_block.hpp"
#include "olmax/nn/reversible.hpp"
#include "olmax/nn/selective_ssm.hpp"

namespace olmax::models {

/// The original Olmax's stem: Reversible(DenseConv<5>, HierarchicalMixer<16>).
struct ConvMixer {
    static constexpr std::string_view key = "conv_mixer";
    static constexpr std::size_t conv_kernel = 5;
    static constexpr std::size_t mixer_chunk = 16;
    template <Real T>
    using block = nn::Reversible<nn::DenseConv<conv_kernel, T>, nn::HierarchicalMixer<mixer_chunk, T>>;

    static constexpr std::string_view description = "reversible(dense conv 5, mixer 16)";
    /// Sequence lengths must be a multiple of this (the mixer's chunk).
    static constexpr std::size_t sequence_multiple = mixer_chunk;
    /// Trainable parameters of one block of width F (each recipe's formula is checked against the
    /// real block in tests/programs): conv0 [K, F, 2F] + its norm scale [2F] + conv1 [K, 2F, F] +
    /// the mixer's two [16, 16] matrices and scale [F].
    static double parameters_per_block(double F) {
        const double K = double(conv_kernel), M = double(mixer_chunk);
        return 4 * K * F * F + 3 * F + 2 * M * M;
    }
    /// Activations kept per token and feature (floats): the reversible stack's two streams plus one
    /// block's recomputation, flat in depth.
    static constexpr double activation_floats_per_token_feature = 48;
};

namespace detail {

/// DenseConv<1>: the position-wise two-layer MLP F -> 2F -> F with ScaleNorm + leaky-ReLU between:
/// conv0 [1, F, 2F] + scale [2F] + conv1 [1, 2F, F].
inline double pointwise_mlp_parameters(double F) { return 4 * F * F + 2 * F; }

}  // namespace detail

/// QRNN token mixing (the scan engine's linear recurrence, between two ScaleNorms) and a
/// position-wise MLP: Reversible(Sandwich<QRNN>, DenseConv<1>).
struct QrnnMlp {
    static constexpr std::string_view key = "qrnn";
    template <Real T>
    using block = nn::Reversible<nn::QRNNBlock<scan::sequential_vectorized, T>, nn::DenseConv<1, T>>;

    static constexpr std::string_view description = "reversible(qrnn, mlp)";
    static constexpr std::size_t sequence_multiple = 1;
    /// QRNN (original pooling: candidate and forget gate) conv [5, F, 2F] + bias [2F], the
    /// sandwich's two scales [F], and the MLP.
    static double parameters_per_block(double F) { return 10 * F * F + 2 * F + 2 * F + detail::pointwise_mlp_parameters(F); }
    static constexpr double activation_floats_per_token_feature = 48;
};

/// Two Mamba blocks (nn::SelectiveSSM: expand 2, state 16, conv 4) per coupling, each between two
/// ScaleNorms: Reversible(Sandwich<SelectiveSSM>, Sandwich<SelectiveSSM>).
struct Mamba {
    static constexpr std::string_view key = "mamba";
    template <Real T>
    using block = nn::Reversible<nn::Sandwich<nn::SelectiveSSM<T>>, nn::Sandwich<nn::SelectiveSSM<T>>>;

    static constexpr std::string_view description = "reversible(mamba, mamba)";
    static constexpr std::size_t sequence_multiple = 1;
    /// One SelectiveSSM of width D = F (E = 2F, N = 16, K = 4, R = ceil(F / 16)): in_proj [D, 2E],
    /// conv [K, E] + [E], x_proj [E, R + 2N], dt_proj [R, E] + [E], A_log [E, N], D [E],
    /// out_proj [E, D]; plus the sandwich's two scales [F].
    static double ssm_parameters(double F) {
        const double D = F, E = 2 * F, N = 16, K = 4, R = std::ceil(F / 16);
        return D * 2 * E + K * E + E + E * (R + 2 * N) + R * E + E + E * N + E + E * D + 2 * F;
    }
    static double parameters_per_block(double F) { return 2 * ssm_parameters(F); }
    /// The inner width is 2F and each SSM keeps ~10 inner activations while it recomputes, plus the
    /// scan's chunk checkpoints (E N per 64 steps).
    static constexpr double activation_floats_per_token_feature = 64;
};

/// Switch-style sparse mixture of experts as the channel mixing beside the hierarchical token
/// mixer: Reversible(HierarchicalMixer<16>, Sandwich<MoE>) with nn::Config's experts (4) and
/// capacity factor (1.25).
struct SwitchMoE {
    static constexpr std::string_view key = "moe";
    static constexpr std::size_t mixer_chunk = 16;
    static constexpr std::size_t experts = 4;
    template <Real T>
    using block = nn::Reversible<nn::HierarchicalMixer<mixer_chunk, T>, nn::Sandwich<nn::MoE<T>>>;

    static constexpr std::string_view description = "reversible(mixer 16, switch moe 4 experts)";
    static constexpr std::size_t sequence_multiple = mixer_chunk;
    /// The mixer's two [16, 16] matrices and scale [F]; the router [F, E] and experts [E, F, F];
    /// the sandwich's two scales [F].
    static double parameters_per_block(double F) {
        const double M = double(mixer_chunk), E = double(experts);
        return 2 * M * M + F + F * E + E * F * F + 2 * F;
    }
    static constexpr double activation_floats_per_token_feature = 48;
};

/// The `--block` names, in the order the main job's help lists them.
inline constexpr std::array<std::string_view, 4> block_names{ConvMixer::key, QrnnMlp::key, Mamba::key, SwitchMoE::key};

/// Calls `f.template operator()<Recipe>()` for the recipe named `block` (one of block_names) and
/// returns its result: the one place that turns a run-time block name into a type.
template <class F>
decltype(auto) with_recipe(std::string_view block, F&& f) {
    if (block == ConvMixer::key) return std::forward<F>(f).template operator()<ConvMixer>();
    if (block == QrnnMlp::key) return std::forward<F>(f).template operator()<QrnnMlp>();
    if (block == Mamba::key) return std::forward<F>(f).template operator()<Mamba>();
    if (block == SwitchMoE::key) return std::forward<F>(f).template operator()<SwitchMoE>();
    throw value_error(olmax::detail::concat("models::with_recipe: unknown block '", block, "'; choose conv_mixer, qrnn, mamba or moe"));
}

}  // namespace olmax::models
