#pragma once
// The Gated DeltaNet layer (Yang, Kautz & Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with
// Delta Rule", ICLR 2025, arXiv:2412.06464): a linear-attention mixer whose state follows the gated
// delta rule (scan/gated_delta.hpp). With E = H d (H heads of size d = K = V):
//
//     [q, k, v, z, b, a] = in_proj(x)                               D -> 4E + 2H
//     q, k, v  = SiLU(depthwise causal conv(q, k, v) + conv_bias)    per channel, conv_kernel taps
//     q, k     = q / ||q||, k / ||k||                                per head (L2 over d)
//     beta     = sigmoid(b),   g = -exp(A_log) softplus(a + dt_bias) per head (a Mamba-2-style gate, g <= 0)
//     o, S     = gated_delta_rule(q, k, v, g, beta)                  scale 1 / sqrt(d)
//     y        = out_proj(RMSNorm(o) * SiLU(z))                      RMSNorm per head over d, learned scale [d]
//
// Packed documents: the optional resets [batch, T] (nonzero at the first position of a document)
// reach both recurrent parts, as in nn::SelectiveSSM: the convolution reads nothing from before a
// document's start and the delta rule zeroes its state there. The state between calls
// (forward_with_state) is the delta-rule state [batch, H, d, d] and the last conv_kernel - 1
// convolution inputs [batch, conv_kernel - 1, 3E]; running a sequence in pieces with the state
// carried gives the outputs of one call on the whole.
//
// Traced (XLA): the delta rule traces its chunked form from ops (scan/gated_delta.hpp); a traced
// forward takes no carried convolution state (forward_with_state with state.conv throws trace_error)
// and returns none (state.conv undefined); the delta-rule state is carried and returned.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "olmax/core/random.hpp"
#include "olmax/nn/continuation.hpp"
#include "olmax/nn/contract.hpp"
#include "olmax/nn/init.hpp"
#include "olmax/nn/selective_ssm.hpp"  // detail::depthwise_conv_silu
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/linalg.hpp"
#include "olmax/ops/norm.hpp"
#include "olmax/ops/pointwise.hpp"
#include "olmax/ops/shape.hpp"
#include "olmax/scan/gated_delta.hpp"

namespace olmax::nn {

/// Sizes and initialisation of nn::GatedDeltaNet.
struct GatedDeltaNetConfig {
    std::size_t features = 256;   ///< D: width of the residual stream
    std::size_t heads = 0;        ///< H; 0 means max(1, D / head_dim)
    std::size_t head_dim = 0;     ///< d = K = V per head; 0 means min(64, D)
    std::size_t conv_kernel = 4;  ///< taps of the short depthwise causal convolution on q, k and v
    std::size_t chunk = 64;       ///< steps per chunk of the delta rule's WY forward and backward checkpoints
    double norm_eps = 1e-6;       ///< epsilon of the per-head RMSNorm on o
    double l2_eps = 1e-6;         ///< q, k normalisation: x / max(||x||, l2_eps)
    double dt_min = 1e-3;         ///< initial softplus(dt_bias) log-uniform in [dt_min, dt_max] ...
    double dt_max = 1e-1;
    double dt_floor = 1e-4;       ///< ... and at least dt_floor
    double A_min = 1;             ///< initial exp(A_log) uniform in [A_min, A_max]
    double A_max = 16;

    std::size_t head_size() const { return head_dim ? head_dim : std::min<std::size_t>(64, features); }
    std::size_t head_count() const { return heads ? heads : std::max<std::size_t>(1, features / std::max<std::size_t>(head_size(), 1)); }
    std::size_t inner() const { return head_count() * head_size(); }
};

/// What nn::GatedDeltaNet carries from one call to the next (undefined tensors mean zeros).
template <Real T>
struct GatedDeltaNetState {
    Tensor<T> delta;  ///< delta-rule state S [batch, H, d, d]
    Tensor<T> conv;   ///< the last conv_kernel - 1 convolution inputs [batch, conv_kernel - 1, 3E] (q, k, v channels)
};

template <Real T>
struct GatedDeltaNetOutput {
    Tensor<T> y;                  ///< [batch, T, D]
    GatedDeltaNetState<T> state;  ///< after the last step; differentiable
};

/// The Gated DeltaNet mixer, D -> D (see the top of this file). Parameters (names as visited):
/// in_proj/weight [D, 4E + 2H] (columns q, k, v, z, b, a), conv/weight [conv_kernel, 3E],
/// conv/bias [3E], A_log [H], dt_bias [H], norm/weight [d], out_proj/weight [E, D]. A_log has
/// Role::other and dt_bias Role::bias, so the default weight-decay policy leaves them alone.
template <Real T = float>
class GatedDeltaNet {
public:
    using value_type = T;
    using config_type = Config;
    static constexpr std::string_view name = "gated_deltanet";

    /// features -> features with every other size at its default (heads of 64, or one head of D
    /// when D < 64; conv kernel 4; chunk 64).
    GatedDeltaNet(const Config& config, Generator& rng)
        : GatedDeltaNet(GatedDeltaNetConfig{.features = config.checked_features("nn::GatedDeltaNet"), .norm_eps = config.rms_eps}, rng) {}

    /// Initialisation: projections fan-in normal, the convolution uniform in +-conv_kernel^-1/2,
    /// A = exp(A_log) uniform in [A_min, A_max], dt_bias = softplus^-1(dt) with dt log-uniform in
    /// [dt_min, dt_max] (floored at dt_floor), the norm's scale 1.
    GatedDeltaNet(const GatedDeltaNetConfig& config, Generator& rng) : config_(config) {
        constexpr std::string_view layer = "nn::GatedDeltaNet";
        const std::size_t D = config.features, H = config.head_count(), d = config.head_size(), E = H * d, Kc = config.conv_kernel;
        check<value_error>(D > 0 && H > 0 && d > 0 && Kc > 0 && config.chunk > 0, layer, ": features ", D, ", heads ", H, ", head_dim ", d,
                           ", conv_kernel ", Kc, " and chunk ", config.chunk, " must be positive");
        check<value_error>(config.norm_eps >= 0 && config.l2_eps > 0, layer, ": norm_eps (", config.norm_eps, ") must be >= 0 and l2_eps (",
                           config.l2_eps, ") > 0");
        in_proj_ = parameter(fan_in_normal<T>({D, 4 * E + 2 * H}, D, rng));
        const T conv_bound = T(1 / std::sqrt(double(Kc)));
        conv_weight_ = parameter(olmax::rand<T>({Kc, 3 * E}, rng, -conv_bound, conv_bound));
        conv_bias_ = parameter(olmax::rand<T>({3 * E}, rng, -conv_bound, conv_bound));
        A_log_ = parameter(log_uniform_rates<T>({H}, config.A_min, config.A_max, rng, layer));
        dt_bias_ = parameter(step_size_bias<T>({H}, config.dt_min, config.dt_max, config.dt_floor, rng, layer));
        norm_weight_ = parameter(Tensor<T>({d}, T{1}));
        out_proj_ = parameter(fan_in_normal<T>({E, D}, E, rng));
    }

    /// x [batch, T, D] -> [batch, T, D], each row one sequence.
    Tensor<T> forward(const Tensor<T>& x, const LayerContext& = {}) const { return run(x, {}, {}).y; }

    /// Packed rows: resets [batch, T] is nonzero at the first position of every document.
    Tensor<T> forward(const Tensor<T>& x, const Tensor<T>& resets, const LayerContext& = {}) const { return run(x, resets, {}).y; }

    /// Continues from `state` (the previous call's, or empty for zeros) and returns the new one.
    GatedDeltaNetOutput<T> forward_with_state(const Tensor<T>& x, const GatedDeltaNetState<T>& state, const Tensor<T>& resets = {}) const {
        return run(x, resets, state);
    }

    /// The next steps of a sequence (nn::continue_sequence; empty state: from the start): forward_with_state
    /// with its state carried in `state`.
    using sequence_state = GatedDeltaNetState<T>;
    Tensor<T> continue_sequence(const Tensor<T>& x, sequence_state& state, const LayerContext& = {}) const {
        return detail::continue_with_state(*this, x, state);
    }

    void visit_parameters(ParameterVisitor<T>& visit) {
        visit("in_proj/weight", in_proj_, Role::weight);
        visit("conv/weight", conv_weight_, Role::weight);
        visit("conv/bias", conv_bias_, Role::bias);
        visit("A_log", A_log_, Role::other);
        visit("dt_bias", dt_bias_, Role::bias);
        visit("norm/weight", norm_weight_, Role::norm_scale);
        visit("out_proj/weight", out_proj_, Role::weight);
    }

    const GatedDeltaNetConfig& config() const { return config_; }

private:
    GatedDeltaNetOutput<T> run(const Tensor<T>& x, const Tensor<T>& resets, const GatedDeltaNetState<T>& state) const {
        constexpr std::string_view layer = "nn::GatedDeltaNet";
        const std::size_t D = in_proj_.extent(0), H = A_log_.extent(0), d = norm_weight_.extent(0), E = H * d,
                          Kc = conv_weight_.extent(0);
        check<shape_error>(x.defined() && x.rank() == 3 && x.extent(2) == D, layer, ": expected input [batch, T, ", D, "], got ",
                           x.defined() ? to_string(x.shape()) : std::string("an undefined tensor"));
        const std::size_t B = x.extent(0), nt = x.extent(1);
        check<value_error>(B > 0 && nt > 0, layer, ": input of shape ", to_string(x.shape()), " is empty (batch or T is 0)");
        if (resets.defined())
            check<shape_error>(resets.shape() == Shape{B, nt}, layer, ": resets of shape ", to_string(resets.shape()),
                               " does not match [batch, T] = [", B, ", ", nt, "]");
        if (state.delta.defined())
            check<shape_error>(state.delta.shape() == Shape{B, H, d, d}, layer, ": carried delta-rule state of shape ",
                               to_string(state.delta.shape()), " does not match [batch, H, d, d] = [", B, ", ", H, ", ", d, ", ", d, "]");
        if (state.conv.defined())
            check<shape_error>(state.conv.shape() == Shape{B, Kc - 1, 3 * E}, layer, ": carried conv state of shape ",
                               to_string(state.conv.shape()), " does not match [batch, conv_kernel - 1, 3E] = [", B, ", ", Kc - 1, ", ",
                               3 * E, "]");
        const Tensor<T> p = matmul(x, in_proj_);  // [batch, T, 4E + 2H]
        const auto conv = detail::depthwise_conv_silu(slice(p, 2, 0, 3 * E), conv_weight_, conv_bias_, resets, state.conv);
        const Shape heads{B, nt, H, d};
        const T l2_eps = T(config_.l2_eps);
        const Tensor<T> q = scale_norm(reshape(slice(conv[0], 2, 0, E), heads), Tensor<T>(), l2_eps);
        const Tensor<T> k = scale_norm(reshape(slice(conv[0], 2, E, 2 * E), heads), Tensor<T>(), l2_eps);
        const Tensor<T> v = reshape(slice(conv[0], 2, 2 * E, 3 * E), heads);
        const Tensor<T> beta = sigmoid(slice(p, 2, 4 * E, 4 * E + H));
        const Tensor<T> g = pointwise(
            "gdn_gate", [](auto a, auto dt_bias, auto A_log) { return -math::exp(A_log) * math::softplus(a + dt_bias); },
            slice(p, 2, 4 * E + H, 4 * E + 2 * H), dt_bias_, A_log_);
        const auto s = scan::gated_delta_rule(q, k, v, g, beta, state.delta, resets, {.chunk = long(config_.chunk)});
        const Tensor<T> o = reshape(rms_norm(s.o, norm_weight_, T(config_.norm_eps)), Shape{B, nt, E});
        const Tensor<T> gated = pointwise("gdn_gated_output", [](auto y, auto z) { return y * math::silu(z); }, o, slice(p, 2, 3 * E, 4 * E));
        return {matmul(gated, out_proj_), {s.state, conv[1]}};
    }

    GatedDeltaNetConfig config_;
    Tensor<T> in_proj_, conv_weight_, conv_bias_, A_log_, dt_bias_, norm_weight_, out_proj_;
};

}  // namespace olmax::nn
