#pragma once
// Block recipes of the byte LM (models::ByteLM<Recipe>): each names a block type, built per element
// type, and the facts the model needs before it builds anything (parameters per block, activation
// memory, the sequence multiple). The main job picks one at run time with `--block`
// (models::with_recipe), a switch over these few pre-instantiated types.
//
// Every recipe is a two-function reversible coupling (nn::Reversible): activation memory stays flat
// in depth, and the two functions split the work into token mixing and channel mixing.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <string_view>
#include <utility>

#include "olmax/core/core.hpp"
#include "olmax/nn/attention.hpp"
#include "olmax/nn/conv.hpp"
#include "olmax/nn/gated_deltanet.hpp"
#include "olmax/nn/mamba2.hpp"
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
/// mixer: Reversible(HierarchicalMixer<16>, Sandwich<MoE>) with nn::MoEConfig's experts (4) and
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

namespace detail {

/// The sandwich's two ScaleNorm scales [F].
inline double sandwich_parameters(double F) { return 2 * F; }

/// nn::Mamba2 built from nn::Config (E = 2F, P = gcd(2F, 64), H = E / P, N = 64, G = 1, K = 4):
/// in_proj [D, 2E + 2GN + H], conv [K, E + 2GN] + [E + 2GN], dt_bias, A_log and D [H] each,
/// the gated RMSNorm's weight [E], out_proj [E, D].
inline double mamba2_parameters(double F) {
    const double D = F, E = 2 * F, P = double(std::gcd(2 * std::size_t(F), std::size_t{64})), H = E / P, N = 64, G = 1, K = 4;
    const double conv = E + 2 * G * N;
    return D * (E + conv + H) + K * conv + conv + 3 * H + E + E * D;
}

/// nn::GatedDeltaNet built from nn::Config (d = min(64, F), H = max(1, F / d), E = H d, conv 4):
/// in_proj [D, 4E + 2H], conv [4, 3E] + [3E], A_log and dt_bias [H] each, the per-head RMSNorm's
/// weight [d], out_proj [E, D].
inline double gated_deltanet_parameters(double F) {
    const std::size_t f = std::size_t(F), dh = std::min<std::size_t>(64, f), heads = std::max<std::size_t>(1, f / dh);
    const double D = F, d = double(dh), H = double(heads), E = H * d;
    return D * (4 * E + 2 * H) + 4 * 3 * E + 3 * E + 2 * H + d + E * D;
}

/// nn::CausalSelfAttention built from nn::Config (H = F / 64 heads of 64 when 64 divides F, else one
/// head of F; no grouping, no qk-norm): qkv [D, 3D] and out_proj [D, D].
inline double attention_parameters(double F) { return 4 * F * F; }

}  // namespace detail

/// Mamba-2 (nn::Mamba2: the chunked SSD scan, expand 2, state 64, heads of up to 64) as both
/// functions of the coupling, each between two ScaleNorms, as the `mamba` recipe does with Mamba-1:
/// Reversible(Sandwich<Mamba2>, Sandwich<Mamba2>).
struct Mamba2Pair {
    static constexpr std::string_view key = "mamba2";
    template <Real T>
    using block = nn::Reversible<nn::Sandwich<nn::Mamba2<T>>, nn::Sandwich<nn::Mamba2<T>>>;

    static constexpr std::string_view description = "reversible(mamba2, mamba2)";
    static constexpr std::size_t sequence_multiple = 1;
    static double parameters_per_block(double F) { return 2 * (detail::mamba2_parameters(F) + detail::sandwich_parameters(F)); }
    /// Inner width 2F: in_proj's ~4F outputs, the conv's and gate's, the scan's chunk checkpoints.
    static constexpr double activation_floats_per_token_feature = 80;
};

/// Gated DeltaNet token mixing (nn::GatedDeltaNet: heads of up to 64, conv 4, chunk 64) between two
/// ScaleNorms, and a position-wise MLP: Reversible(Sandwich<GatedDeltaNet>, DenseConv<1>).
struct GatedDeltaNetMlp {
    static constexpr std::string_view key = "gated_deltanet";
    template <Real T>
    using block = nn::Reversible<nn::Sandwich<nn::GatedDeltaNet<T>>, nn::DenseConv<1, T>>;

    static constexpr std::string_view description = "reversible(gated deltanet, mlp)";
    static constexpr std::size_t sequence_multiple = 1;
    static double parameters_per_block(double F) {
        return detail::gated_deltanet_parameters(F) + detail::sandwich_parameters(F) + detail::pointwise_mlp_parameters(F);
    }
    static constexpr double activation_floats_per_token_feature = 64;
};

/// A transformer block made reversible: causal multi-head attention with RoPE (nn::CausalSelfAttention,
/// O(T) memory) between two ScaleNorms, and a position-wise MLP:
/// Reversible(Sandwich<CausalSelfAttention>, DenseConv<1>).
struct AttentionMlp {
    static constexpr std::string_view key = "attention";
    template <Real T>
    using block = nn::Reversible<nn::Sandwich<nn::CausalSelfAttention<T>>, nn::DenseConv<1, T>>;

    static constexpr std::string_view description = "reversible(causal attention, mlp)";
    static constexpr std::size_t sequence_multiple = 1;
    static double parameters_per_block(double F) {
        return detail::attention_parameters(F) + detail::sandwich_parameters(F) + detail::pointwise_mlp_parameters(F);
    }
    static constexpr double activation_floats_per_token_feature = 48;
};

/// The 2026 hybrid pattern (Qwen3-Next, Kimi Linear: three linear-recurrent layers per attention
/// layer): one block is three Gated DeltaNet layers and one attention layer, each followed by a
/// position-wise MLP, as one reversible chain of eight; `depth` counts such blocks (so 4 layers of
/// token mixing each). nn::ReversibleChain<Sandwich<GDN>, MLP, Sandwich<GDN>, MLP, Sandwich<GDN>,
/// MLP, Sandwich<Attention>, MLP>.
struct Hybrid {
    static constexpr std::string_view key = "hybrid";
    template <Real T>
    using mlp = nn::DenseConv<1, T>;
    template <Real T>
    using block = nn::ReversibleChain<nn::Sandwich<nn::GatedDeltaNet<T>>, mlp<T>, nn::Sandwich<nn::GatedDeltaNet<T>>, mlp<T>,
                                      nn::Sandwich<nn::GatedDeltaNet<T>>, mlp<T>, nn::Sandwich<nn::CausalSelfAttention<T>>, mlp<T>>;

    static constexpr std::string_view description = "reversible chain(3 x (gated deltanet, mlp), (causal attention, mlp))";
    static constexpr std::size_t sequence_multiple = 1;
    static double parameters_per_block(double F) {
        return 3 * GatedDeltaNetMlp::parameters_per_block(F) + AttentionMlp::parameters_per_block(F);
    }
    static constexpr double activation_floats_per_token_feature = 64;
};

/// The `--block` names, in the order the main job's help lists them.
inline constexpr std::array<std::string_view, 8> block_names{ConvMixer::key, QrnnMlp::key,   Mamba::key,  SwitchMoE::key,
                                                             Mamba2Pair::key, GatedDeltaNetMlp::key, AttentionMlp::key, Hybrid::key};

/// Calls `f.template operator()<Recipe>()` for the recipe named `block` (one of block_names) and
/// returns its result: the one place that turns a run-time block name into a type.
template <class F>
decltype(auto) with_recipe(std::string_view block, F&& f) {
    if (block == ConvMixer::key) return std::forward<F>(f).template operator()<ConvMixer>();
    if (block == QrnnMlp::key) return std::forward<F>(f).template operator()<QrnnMlp>();
    if (block == Mamba::key) return std::forward<F>(f).template operator()<Mamba>();
    if (block == SwitchMoE::key) return std::forward<F>(f).template operator()<SwitchMoE>();
    if (block == Mamba2Pair::key) return std::forward<F>(f).template operator()<Mamba2Pair>();
    if (block == GatedDeltaNetMlp::key) return std::forward<F>(f).template operator()<GatedDeltaNetMlp>();
    if (block == AttentionMlp::key) return std::forward<F>(f).template operator()<AttentionMlp>();
    if (block == Hybrid::key) return std::forward<F>(f).template operator()<Hybrid>();
    throw value_error(olmax::detail::concat("models::with_recipe: unknown block '", block,
                                            "'; choose conv_mixer, qrnn, mamba, moe, mamba2, gated_deltanet, attention or hybrid"));
}

}  // namespace olmax::models
