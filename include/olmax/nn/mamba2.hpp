#pragma once
// The Mamba-2 block (Dao & Gu 2024, "Transformers are SSMs: Generalized Models and Efficient
// Algorithms Through Structured State Space Duality", arXiv:2405.21060, Section 7 and Figure 6),
// structured as the reference Mamba2 module of state-spaces/mamba: one input projection makes
// every input-dependent quantity at once, and the state-space part is the SSD
// (olmax/scan/ssd.hpp) with one scalar decay per head.
//
//     [z, x, B, C, dt_raw] = in_proj(u)              D -> E + (E + 2 G N) + H
//     [x, B, C] = SiLU(depthwise causal conv_K([x, B, C]) + conv_bias)
//     dt        = softplus(dt_raw + dt_bias)         [batch, T, H]
//     A         = -exp(A_log)                        [H]
//     y         = ssd(x, dt, A, B, C, D)             H heads of P channels, G groups of B and C
//     out       = out_proj(RMSNorm_G(y * SiLU(z)) * norm_weight)     E -> D
//
// The output gate is the reference module's default gated RMSNorm (rmsnorm = True,
// norm_before_gate = False): y is gated by SiLU(z) first, then normalised over each group's E / G
// channels (eps 1e-5) and scaled per channel.
//
// Packed documents: the optional resets [batch, T] (nonzero at the first position of a document)
// reach both recurrent parts: the convolution reads no input from before the document's start and
// the SSD drops its state there. The state between calls (forward_with_state) is the SSD state
// [batch, H, P, N] and the last K-1 convolution inputs [batch, K-1, E + 2 G N]; running a sequence
// in pieces with the state carried gives the outputs of one call on the whole.
//
// Traced (XLA): every part has a traced form (scan::ssd composes its chunked algorithm from ordinary
// ops there); a traced call takes no carried convolution state (as nn::SelectiveSSM).

#include <cmath>
#include <cstddef>
#include <numeric>
#include <string>
#include <string_view>

#include "olmax/core/random.hpp"
#include "olmax/nn/continuation.hpp"
#include "olmax/nn/contract.hpp"
#include "olmax/nn/init.hpp"
#include "olmax/nn/selective_ssm.hpp"  // detail::depthwise_conv_silu, shared with nn::SelectiveSSM
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/linalg.hpp"
#include "olmax/ops/math_rules.hpp"
#include "olmax/ops/norm.hpp"
#include "olmax/ops/pointwise.hpp"
#include "olmax/ops/shape.hpp"
#include "olmax/scan/ssd.hpp"

namespace olmax::nn {

/// Sizes and initialisation of nn::Mamba2: the reference module's defaults except N = 64 and
/// Q = 64 (its d_state 128 and chunk_size 256; 64 and 64 are the sizes of ssd_minimal's test).
struct Mamba2Config {
    std::size_t features = 256;   ///< D: width of the residual stream
    std::size_t expand = 2;       ///< E = expand D: inner width
    std::size_t head_dim = 64;    ///< P: channels per head (must divide E); H = E / P heads
    std::size_t state = 64;       ///< N: state size per head channel
    std::size_t groups = 1;       ///< G: groups of B and C (must divide H)
    std::size_t conv_kernel = 4;  ///< K: taps of the depthwise causal convolution
    std::size_t chunk = 64;       ///< Q: chunk length of the SSD (also its backward's checkpoint interval)
    double A_min = 1, A_max = 16;  ///< initial decay rates -A are uniform in [A_min, A_max]
    double dt_min = 1e-3;          ///< initial step sizes softplus(dt_bias) are log-uniform in [dt_min, dt_max]
    double dt_max = 1e-1;
    double dt_floor = 1e-4;        ///< ... and at least dt_floor
    double norm_eps = 1e-5;        ///< epsilon of the gated RMSNorm

    std::size_t inner_features() const { return expand * features; }
    std::size_t heads() const { return head_dim ? inner_features() / head_dim : 0; }

    /// The head dim nn::Mamba2 takes from an nn::Config of width `features`: 64 when E = 2 D is a
    /// multiple of 64, else the largest power of two dividing E (gcd(E, 64)), so small widths work
    /// (D = 8: E = 16, one head of 16 channels).
    static std::size_t default_head_dim(std::size_t features) { return std::gcd(2 * features, std::size_t{64}); }
};

/// What nn::Mamba2 carries from one call to the next (undefined tensors mean zeros).
template <Real T>
struct Mamba2State {
    Tensor<T> ssm;   ///< SSD state h [batch, H, P, N]
    Tensor<T> conv;  ///< the last K-1 inputs of the convolution [batch, K-1, E + 2 G N] (zeros before a document start)
};

template <Real T>
struct Mamba2Output {
    Tensor<T> y;            ///< [batch, T, D]
    Mamba2State<T> state;   ///< after the last step; differentiable
};

/// Mamba-2's block, D -> D (see the top of this file). Parameters (names as visited):
/// in_proj/weight [D, 2E + 2GN + H], conv/weight [K, E + 2GN], conv/bias [E + 2GN], dt_bias [H],
/// A_log [H], D [H], norm/weight [E], out_proj/weight [E, D]. dt_bias, A_log and D have
/// Role::other, so the default weight-decay policy leaves them alone, as the reference does.
template <Real T = float>
class Mamba2 {
public:
    using value_type = T;
    using config_type = Config;
    static constexpr std::string_view name = "mamba2";

    /// features -> features with every other size at the reference defaults (E = 2 D, N = 64,
    /// G = 1, K = 4, chunk 64), except the head dim: Mamba2Config::default_head_dim(D).
    Mamba2(const Config& config, Generator& rng) : Mamba2(from_features(config.checked_features("nn::Mamba2")), rng) {}

    /// The reference initialisation: A_log = log(uniform[A_min, A_max]), D = 1, dt_bias =
    /// softplus^-1(dt) with dt log-uniform in [dt_min, dt_max] (at least dt_floor), the
    /// convolution uniform in +-K^-1/2, the norm's weight 1, projections fan-in normal.
    Mamba2(const Mamba2Config& config, Generator& rng) : config_(config) {
        const std::size_t D = config.features, E = config.inner_features(), P = config.head_dim, N = config.state, G = config.groups,
                          K = config.conv_kernel;
        check<value_error>(D > 0 && E > 0 && P > 0 && N > 0 && G > 0 && K > 0 && config.chunk > 0, "nn::Mamba2: features ", D, ", inner ", E,
                           ", head dim ", P, ", state ", N, ", groups ", G, ", conv kernel ", K, " and chunk ", config.chunk,
                           " must be positive");
        check<value_error>(E % P == 0, "nn::Mamba2: the head dim P = ", P, " does not divide the inner width E = ", E,
                           " (expand ", config.expand, " x features ", D, "); pick a head_dim that divides it");
        const std::size_t H = E / P;
        check<value_error>(H % G == 0, "nn::Mamba2: the ", H, " heads (E = ", E, " / P = ", P, ") do not divide into ", G, " groups");
        check<value_error>(config.norm_eps >= 0, "nn::Mamba2: norm_eps must be non-negative, got ", config.norm_eps);
        const std::size_t conv_width = E + 2 * G * N;
        in_proj_ = parameter(fan_in_normal<T>({D, E + conv_width + H}, D, rng));
        const T conv_bound = T(1 / std::sqrt(double(K)));
        conv_weight_ = parameter(olmax::rand<T>({K, conv_width}, rng, -conv_bound, conv_bound));
        conv_bias_ = parameter(olmax::rand<T>({conv_width}, rng, -conv_bound, conv_bound));
        dt_bias_ = parameter(step_size_bias<T>({H}, config.dt_min, config.dt_max, config.dt_floor, rng, "nn::Mamba2"));
        A_log_ = parameter(log_uniform_rates<T>({H}, config.A_min, config.A_max, rng, "nn::Mamba2"));
        D_ = parameter(Tensor<T>({H}, T{1}));
        norm_weight_ = parameter(Tensor<T>({E}, T{1}));
        out_proj_ = parameter(fan_in_normal<T>({E, D}, E, rng));
    }

    /// x [batch, T, D] -> [batch, T, D], each row one sequence.
    Tensor<T> forward(const Tensor<T>& x, const LayerContext& = {}) const { return run(x, {}, {}).y; }

    /// Packed rows: resets [batch, T] is nonzero at the first position of every document.
    Tensor<T> forward(const Tensor<T>& x, const Tensor<T>& resets, const LayerContext& = {}) const { return run(x, resets, {}).y; }

    /// Continues from `state` (the previous call's, or empty for zeros) and returns the new one.
    Mamba2Output<T> forward_with_state(const Tensor<T>& x, const Mamba2State<T>& state, const Tensor<T>& resets = {}) const {
        return run(x, resets, state);
    }

    /// The next steps of a sequence (nn::continue_sequence; empty state: from the start): forward_with_state
    /// with its state carried in `state`.
    using sequence_state = Mamba2State<T>;
    Tensor<T> continue_sequence(const Tensor<T>& x, sequence_state& state, const LayerContext& = {}) const {
        return detail::continue_with_state(*this, x, state);
    }

    void visit_parameters(ParameterVisitor<T>& visit) {
        visit("in_proj/weight", in_proj_, Role::weight);
        visit("conv/weight", conv_weight_, Role::weight);
        visit("conv/bias", conv_bias_, Role::bias);
        visit("dt_bias", dt_bias_, Role::other);
        visit("A_log", A_log_, Role::other);
        visit("D", D_, Role::other);
        visit("norm/weight", norm_weight_, Role::norm_scale);
        visit("out_proj/weight", out_proj_, Role::weight);
    }

    const Mamba2Config& config() const { return config_; }

private:
    static Mamba2Config from_features(std::size_t features) {
        Mamba2Config c;
        c.features = features;
        c.head_dim = Mamba2Config::default_head_dim(features);
        return c;
    }

    Mamba2Output<T> run(const Tensor<T>& u, const Tensor<T>& resets, const Mamba2State<T>& state) const {
        const std::size_t D = config_.features, E = config_.inner_features(), P = config_.head_dim, H = E / P, N = config_.state,
                          G = config_.groups, K = config_.conv_kernel, GN = G * N, conv_width = E + 2 * GN;
        check<shape_error>(u.defined() && u.rank() == 3 && u.extent(2) == D, "nn::Mamba2: expected input [batch, T, ", D, "], got ",
                           u.defined() ? to_string(u.shape()) : std::string("an undefined tensor"));
        const std::size_t nb = u.extent(0), nt = u.extent(1);
        check<value_error>(nb > 0 && nt > 0, "nn::Mamba2: input of shape ", to_string(u.shape()), " is empty (batch or T is 0)");
        if (resets.defined())
            check<shape_error>(resets.rank() == 2 && resets.extent(0) == nb && resets.extent(1) == nt, "nn::Mamba2: resets of shape ",
                               to_string(resets.shape()), " does not match [batch, T] = [", nb, ", ", nt, "]");
        if (state.ssm.defined())
            check<shape_error>(state.ssm.shape() == Shape{nb, H, P, N}, "nn::Mamba2: SSD state of shape ", to_string(state.ssm.shape()),
                               " does not match [batch, H, P, N] = [", nb, ", ", H, ", ", P, ", ", N, "]");
        if (state.conv.defined())
            check<shape_error>(state.conv.shape() == Shape{nb, K - 1, conv_width}, "nn::Mamba2: conv state of shape ",
                               to_string(state.conv.shape()), " does not match [batch, K-1, E + 2GN] = [", nb, ", ", K - 1, ", ", conv_width,
                               "]");
        const Tensor<T> proj = matmul(u, in_proj_);  // [batch, T, E + (E + 2GN) + H]
        const auto conv = detail::depthwise_conv_silu(slice(proj, 2, E, E + conv_width), conv_weight_, conv_bias_, resets, state.conv,
                                                     "nn::Mamba2 conv");
        const Tensor<T>& xbc = conv[0];  // [batch, T, E + 2GN]
        const Tensor<T> x = reshape(slice(xbc, 2, 0, E), Shape{nb, nt, H, P});
        const Tensor<T> B = reshape(slice(xbc, 2, E, E + GN), Shape{nb, nt, G, N});
        const Tensor<T> C = reshape(slice(xbc, 2, E + GN, E + 2 * GN), Shape{nb, nt, G, N});
        const Tensor<T> dt = pointwise("mamba2_dt", [](auto v, auto b) { return math::softplus(v + b); },
                                       slice(proj, 2, E + conv_width, E + conv_width + H), dt_bias_);
        const Tensor<T> A = neg(exp(A_log_));
        const auto s = scan::ssd(x, dt, A, B, C, D_, {.h0 = state.ssm, .resets = resets, .chunk = long(config_.chunk)});
        // Gated RMSNorm: norm(y SiLU(z)) over each group's E / G channels, then the per-channel weight.
        const Tensor<T> gated =
            pointwise("gated_output", [](auto y, auto z) { return y * math::silu(z); }, reshape(s.y, Shape{nb, nt, E}), slice(proj, 2, 0, E));
        const T eps = T(config_.norm_eps);
        const Tensor<T> normed = G == 1 ? rms_norm(gated, norm_weight_, eps)
                                        : mul(reshape(rms_norm(reshape(gated, Shape{nb, nt, G, E / G}), Tensor<T>(), eps), Shape{nb, nt, E}),
                                              norm_weight_);
        return {matmul(normed, out_proj_), {s.h_last, conv[1]}};
    }

    Mamba2Config config_;
    Tensor<T> in_proj_, conv_weight_, conv_bias_, dt_bias_, A_log_, D_, norm_weight_, out_proj_;
};

}  // namespace olmax::nn
