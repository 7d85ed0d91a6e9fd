#pragma once
// The Mamba block (Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective State
// Spaces", arXiv:2312.00752, Section 3.4 and Figure 3): a selective state-space layer whose step
// size, input and output matrices depend on the input.
//
//     [x, z]  = in_proj(u)                                   D -> 2E
//     x       = SiLU(depthwise causal conv_K(x) + conv_bias)  per channel, K taps
//     [dt, B, C] = x_proj(x)                                 E -> R + 2N
//     delta   = softplus(dt_proj(dt) + dt_bias)              R -> E, [batch, T, E]
//     y       = selective_scan(x, delta, A = -exp(A_log), B, C, D)   (olmax/scan/selective_scan.hpp)
//     out     = out_proj(y * SiLU(z))                        E -> D
//
// Packed documents: the optional resets [batch, T] (nonzero at the first position of a document)
// reach both recurrent parts: the convolution reads no input from before the document's start
// and the scan drops its state there, so a packed row gives each document the outputs it would
// get alone. The state between calls (forward_with_state) is the scan state [batch, E, N] and the
// last K-1 convolution inputs [batch, K-1, E]; running a sequence in pieces with the state
// carried gives the outputs of one call on the whole.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/core/random.hpp"
#include "olmax/nn/continuation.hpp"
#include "olmax/nn/contract.hpp"
#include "olmax/nn/init.hpp"
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/linalg.hpp"
#include "olmax/ops/masks.hpp"
#include "olmax/ops/math_rules.hpp"
#include "olmax/ops/pointwise.hpp"
#include "olmax/ops/shape.hpp"
#include "olmax/scan/selective_scan.hpp"

namespace olmax::nn {

/// Sizes and initialisation of nn::SelectiveSSM (Mamba's defaults).
struct SelectiveSSMConfig {
    std::size_t features = 256;    ///< D: width of the residual stream
    std::size_t inner = 0;         ///< E: inner width; 0 means 2 D (Mamba's expand = 2)
    std::size_t state = 16;        ///< N: state size per inner channel
    std::size_t conv_kernel = 4;   ///< K: taps of the depthwise causal convolution
    std::size_t dt_rank = 0;       ///< R: rank of the step-size projection; 0 means ceil(D / 16)
    double dt_min = 1e-3;          ///< initial step sizes softplus(dt_bias) are log-uniform in [dt_min, dt_max]
    double dt_max = 1e-1;
    double dt_floor = 1e-4;        ///< ... and at least dt_floor
    std::size_t chunk = 64;        ///< time steps per checkpoint of the scan's backward (memory B T E N / chunk)

    std::size_t inner_features() const { return inner ? inner : 2 * features; }
    std::size_t rank() const { return dt_rank ? dt_rank : (features + 15) / 16; }
};

/// What nn::SelectiveSSM carries from one call to the next (undefined tensors mean zeros).
template <Real T>
struct SelectiveSSMState {
    Tensor<T> ssm;   ///< scan state h [batch, E, N]
    Tensor<T> conv;  ///< the last K-1 inputs of the convolution [batch, K-1, E] (zeros before a document start)
};

template <Real T>
struct SelectiveSSMOutput {
    Tensor<T> y;                  ///< [batch, T, D]
    SelectiveSSMState<T> state;   ///< after the last step; differentiable
};

namespace detail {

/// Depthwise causal convolution + bias + SiLU over time on x [batch, T, E] with w [K, E], taps
/// reaching back K-1 steps:
///     pre[b, t, e] = bias[e] + sum_k w[k, e] x[b, t - (K-1) + k, e],   out = SiLU(pre)
/// Positions before 0 read `tail` [batch, K-1, E] (the previous call's last inputs) or zero; a
/// tap never reads a position before the last reset at or before t (the document start). The
/// second output is the new tail: the last K-1 positions of [tail; x], zero before the last
/// document start. One op (not conv + add + silu) because causal_conv1d with E groups would run
/// E one-channel GEMMs per tap; pre is recomputed in the backward (K multiply-adds per element)
/// instead of kept. `op` names it in errors and on the tape (nn::Mamba2 passes its own name).
template <Real T>
std::vector<Tensor<T>> depthwise_conv_silu(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias, const Tensor<T>& resets,
                                           const Tensor<T>& tail, std::string_view op = "nn::SelectiveSSM conv") {
    backend::op_scope on(op, x, w, bias, resets, tail);
    check<shape_error>(x.rank() == 3 && w.rank() == 2 && w.extent(1) == x.extent(2) && w.extent(0) > 0 && bias.rank() == 1 &&
                           bias.extent(0) == x.extent(2),
                       op, ": x ", to_string(x.shape()), ", w ", to_string(w.shape()), " and bias ", to_string(bias.shape()),
                       " must be [batch, T, E], [K, E] and [E]");
    const std::size_t nb = x.extent(0), nt = x.extent(1), ne = x.extent(2), K = w.extent(0), back = K - 1;
    check<value_error>(nb > 0 && nt > 0 && ne > 0, op, ": x of shape ", to_string(x.shape()), " is empty");
    if (resets.defined())
        check<shape_error>(resets.rank() == 2 && resets.extent(0) == nb && resets.extent(1) == nt, op, ": resets of shape ",
                           to_string(resets.shape()), " does not match [batch, T] = [", nb, ", ", nt, "]");
    return on.run_composed(
        [&]() -> std::vector<Tensor<T>> {  // the same function from ops: each tap a shifted copy, cut where a document starts
            check<trace_error>(!tail.defined(), op, ": a traced step takes no carried convolution state");
            Tensor<T> pre = add(mul(x, reshape(slice(w, 0, back, K), Shape{ne})), bias);  // tap K-1 reads x_t
            Tensor<T> open;  // 1 while no document started in (t - j, t]
            const Tensor<T> starts = resets.defined() ? masks::start_flags(resets) : Tensor<T>();  // 0/1
            for (std::size_t j = 1; j <= back && j < nt; ++j) {
                if (starts.defined()) {
                    const Tensor<T> step = add_scalar(neg(slice(pad(starts, 1, j - 1, 0), 1, 0, nt)), T{1});  // 1 - starts[t - j + 1]
                    open = open.defined() ? mul(open, step) : step;
                }
                Tensor<T> tap = mul(slice(pad(x, 1, j, 0), 1, 0, nt), reshape(slice(w, 0, back - j, back - j + 1), Shape{ne}));
                if (open.defined()) tap = mul(tap, reshape(open, Shape{nb, nt, 1}));
                pre = add(pre, tap);
            }
            return {olmax::silu(pre), Tensor<T>()};
        },
        [&] {
            if (tail.defined())
                check<shape_error>(tail.rank() == 3 && tail.extent(0) == nb && tail.extent(1) == back && tail.extent(2) == ne, op,
                                   ": conv state of shape ", to_string(tail.shape()), " does not match [batch, K-1, E] = [", nb, ", ", back, ", ", ne,
                                   "]");
            // lowest[b, t]: the first position tap reads at step t may use, in positions of [tail; x]
            // shifted by K-1 (tail position j is back + (j - back) = j, x position t is back + t).
            std::vector<std::size_t> lowest(nb * nt);
            for (std::size_t b = 0; b < nb; ++b) {
                std::size_t current = tail.defined() ? 0 : back;
                for (std::size_t t = 0; t < nt; ++t) {
                    if (resets.defined() && resets.data()[b * nt + t] != T{0}) current = back + t;
                    lowest[b * nt + t] = current;
                }
            }
            const Tensor<T> tail_in = tail.defined() ? tail.detach() : Tensor<T>();
            // Value at extended position p (0 .. back + T) of batch row b, channel e.
            auto value_at = [nt, ne, back](const T* xp, const T* tp, std::size_t b, std::size_t p, std::size_t e) -> T {
                if (p >= back) return xp[(b * nt + p - back) * ne + e];
                return tp ? tp[(b * back + p) * ne + e] : T{0};
            };
            // pre-activation of row (b, t) into dst[0 .. ne).
            auto pre_row = [nt, ne, K, back, value_at](const std::size_t* low, const T* xp, const T* tp, const T* wp, const T* bp, std::size_t b,
                                                        std::size_t t, T* dst) {
                for (std::size_t e = 0; e < ne; ++e) dst[e] = bp[e];
                const std::size_t lo = low[b * nt + t];
                for (std::size_t k = 0; k < K; ++k) {
                    const std::size_t p = t + k;  // extended position of tap k: back + t - (K-1) + k
                    if (p < lo) continue;
                    const T* wk = wp + k * ne;
                    if (p >= back) {
                        const T* xr = xp + (b * nt + p - back) * ne;
        #pragma omp simd
                        for (std::size_t e = 0; e < ne; ++e) dst[e] += wk[e] * xr[e];
                    } else {
                        for (std::size_t e = 0; e < ne; ++e) dst[e] += wk[e] * value_at(xp, tp, b, p, e);
                    }
                }
            };
            auto out = Tensor<T>::uninitialized(x.shape());
            {
                const T *xp = x.data(), *wp = w.data(), *bp = bias.data(), *tp = tail_in.defined() ? tail_in.data() : nullptr;
                T* outp = out.data();
                backend::current().parallel_for(nb * nt, ne * K, [&](std::size_t lo, std::size_t hi) {
                    for (std::size_t r = lo; r < hi; ++r) {
                        T* o = outp + r * ne;
                        pre_row(lowest.data(), xp, tp, wp, bp, r / nt, r % nt, o);
                        math::transform(ne, o, [](auto v) { return math::rules::silu::value(v); }, static_cast<const T*>(o));
                    }
                });
            }
            // The new tail: extended positions T .. T + back - 1 (the last K-1), zero before the last start.
            auto new_tail = Tensor<T>::uninitialized({nb, back, ne});
            for (std::size_t b = 0; b < nb; ++b) {
                const std::size_t start = lowest[b * nt + nt - 1];
                for (std::size_t j = 0; j < back; ++j)
                    for (std::size_t e = 0; e < ne; ++e) {
                        const std::size_t p = nt + j;
                        new_tail.data()[(b * back + j) * ne + e] =
                            p >= start ? value_at(x.data(), tail_in.defined() ? tail_in.data() : nullptr, b, p, e) : T{0};
                    }
            }
            std::vector<Tensor<T>> outputs{out, new_tail};
            const std::vector<Tensor<T>> inputs{x, w, bias, tail};
            autodiff::record<T>(
                op, inputs, outputs,
                [x = x.detach(), w = w.detach(), bias = bias.detach(), tail_in, lowest = std::move(lowest), nb, nt, ne, K, back,
                 pre_row](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                    const T *xp = x.data(), *wp = w.data(), *bp = bias.data(), *tp = tail_in.defined() ? tail_in.data() : nullptr;
                    const T *gp = g[0].data(), *gtail = g[1].data();
                    // dpre = dout SiLU'(pre), pre recomputed (the SiLU on SIMD batches: math::transform).
                    auto dpre_t = Tensor<T>::uninitialized(x.shape());
                    T* dpre = dpre_t.data();
                    backend::current().parallel_for(nb * nt, ne * K, [&](std::size_t lo, std::size_t hi) {
                        for (std::size_t r = lo; r < hi; ++r) {
                            T* d = dpre + r * ne;
                            pre_row(lowest.data(), xp, tp, wp, bp, r / nt, r % nt, d);
                            const T* gr = gp + r * ne;
                            math::transform(
                                ne, d, [](auto pre, auto dout) { return dout * math::rules::silu::derivative(pre, math::rules::silu::value(pre)); },
                                static_cast<const T*>(d), gr);
                        }
                    });
                    // Gradient of extended position p: taps of the steps t = p - k (k = 0 .. K-1) that may
                    // read p, plus the new tail's gradient where p is one of its positions.
                    auto grad_at = [&](std::size_t b, std::size_t p, T* dst) {
                        std::fill_n(dst, ne, T{0});
                        for (std::size_t k = 0; k < K; ++k) {
                            if (p < k || p - k >= nt) continue;
                            const std::size_t t = p - k;
                            if (p < lowest[b * nt + t]) continue;
                            const T *wk = wp + k * ne, *dr = dpre + (b * nt + t) * ne;
        #pragma omp simd
                            for (std::size_t e = 0; e < ne; ++e) dst[e] += wk[e] * dr[e];
                        }
                        if (p >= nt && p >= lowest[b * nt + nt - 1]) {
                            const T* gt = gtail + (b * back + p - nt) * ne;
                            for (std::size_t e = 0; e < ne; ++e) dst[e] += gt[e];
                        }
                    };
                    if (sink.needs(0)) {
                        auto dx = Tensor<T>::uninitialized(x.shape());
                        T* dxp = dx.data();
                        backend::current().parallel_for(nb * nt, ne * K,
                                                        [&](std::size_t lo, std::size_t hi) {
                                                            for (std::size_t r = lo; r < hi; ++r) grad_at(r / nt, back + r % nt, dxp + r * ne);
                                                        });
                        sink.add(0, std::move(dx));
                    }
                    if (sink.needs(3)) {
                        auto dtail = Tensor<T>::uninitialized({nb, back, ne});
                        for (std::size_t b = 0; b < nb; ++b)
                            for (std::size_t j = 0; j < back; ++j) grad_at(b, j, dtail.data() + (b * back + j) * ne);
                        sink.add(3, std::move(dtail));
                    }
                    if (sink.needs(1) || sink.needs(2)) {
                        // dw[k, e] = sum_{b,t} dpre[b, t, e] value(t + k), dbias[e] = sum dpre; columns in
                        // groups of 64 per task, rows in order (the same sums on any thread count). Sums
                        // of up to 64 rows in T (whole SIMD registers, no conversions), added into double
                        // sums after each 64: a sequence of thousands of rows keeps double's accuracy.
                        auto dw = Tensor<T>::uninitialized(w.shape());
                        auto dbias = Tensor<T>::uninitialized(bias.shape());
                        constexpr std::size_t width = 64, rows_per_part = 64;
                        const std::size_t groups = (ne + width - 1) / width;
                        backend::current().parallel_for(groups, nb * nt * width * K, [&](std::size_t lo, std::size_t hi) {
                            std::vector<double> acc((K + 1) * width);  // the K taps' sums, then the bias's
                            std::vector<T> part((K + 1) * width);
                            auto add_part = [&] {
                                for (std::size_t i = 0; i < part.size(); ++i) acc[i] += double(part[i]);
                                std::fill(part.begin(), part.end(), T{0});
                            };
                            for (std::size_t grp = lo; grp < hi; ++grp) {
                                const std::size_t e0 = grp * width, n = std::min(width, ne - e0);
                                std::fill(acc.begin(), acc.end(), 0.0);
                                std::fill(part.begin(), part.end(), T{0});
                                std::size_t rows = 0;
                                T* part_bias = part.data() + K * width;
                                for (std::size_t b = 0; b < nb; ++b)
                                    for (std::size_t t = 0; t < nt; ++t) {
                                        const T* dr = dpre + (b * nt + t) * ne + e0;
        #pragma omp simd
                                        for (std::size_t i = 0; i < n; ++i) part_bias[i] += dr[i];
                                        for (std::size_t k = 0; k < K; ++k) {
                                            const std::size_t p = t + k;
                                            if (p < lowest[b * nt + t]) continue;
                                            // value_at's row, read contiguously (a tail that is absent reads zeros: nothing to add)
                                            const T* src = p >= back ? xp + (b * nt + p - back) * ne + e0 : tp ? tp + (b * back + p) * ne + e0 : nullptr;
                                            if (!src) continue;
                                            T* a = part.data() + k * width;
        #pragma omp simd
                                            for (std::size_t i = 0; i < n; ++i) a[i] += dr[i] * src[i];
                                        }
                                        if (++rows == rows_per_part) add_part(), rows = 0;
                                    }
                                add_part();
                                for (std::size_t i = 0; i < n; ++i) {
                                    dbias.data()[e0 + i] = T(acc[K * width + i]);
                                    for (std::size_t k = 0; k < K; ++k) dw.data()[k * ne + e0 + i] = T(acc[k * width + i]);
                                }
                            }
                        });
                        sink.add(1, std::move(dw));
                        sink.add(2, std::move(dbias));
                    }
                });
            return outputs;
        });
}

}  // namespace detail

/// Mamba's selective state-space block, D -> D (see the top of this file). Parameters (names as
/// visited): in_proj/weight [D, 2E], conv/weight [K, E], conv/bias [E], x_proj/weight [E, R + 2N],
/// dt_proj/weight [R, E], dt_proj/bias [E], A_log [E, N], D [E], out_proj/weight [E, D]. A_log and
/// D have Role::other, so the default weight-decay policy leaves them alone, as Mamba does.
template <Real T = float>
class SelectiveSSM {
public:
    using value_type = T;
    using config_type = Config;
    static constexpr std::string_view name = "selective_ssm";

    /// features -> features with every other size at Mamba's default (E = 2 D, N = 16, K = 4).
    SelectiveSSM(const Config& config, Generator& rng) : SelectiveSSM(SelectiveSSMConfig{.features = config.checked_features("nn::SelectiveSSM")}, rng) {}

    /// Mamba's initialisation: A_log[e, n] = log(n + 1) (so A = -(n + 1), the S4D-real init),
    /// D = 1, dt_bias = softplus^-1(dt) with dt log-uniform in [dt_min, dt_max], dt_proj uniform in
    /// +-R^-1/2, the convolution uniform in +-K^-1/2, projections fan-in normal.
    SelectiveSSM(const SelectiveSSMConfig& config, Generator& rng) : config_(config) {
        const std::size_t D = config.features, E = config.inner_features(), N = config.state, K = config.conv_kernel, R = config.rank();
        check<value_error>(D > 0 && E > 0 && N > 0 && K > 0 && R > 0 && config.chunk > 0, "nn::SelectiveSSM: features ", D, ", inner ", E,
                           ", state ", N, ", conv kernel ", K, ", dt rank ", R, " and chunk ", config.chunk, " must be positive");
        in_proj_ = parameter(fan_in_normal<T>({D, 2 * E}, D, rng));
        const T conv_bound = T(1 / std::sqrt(double(K)));
        conv_weight_ = parameter(olmax::rand<T>({K, E}, rng, -conv_bound, conv_bound));
        conv_bias_ = parameter(olmax::rand<T>({E}, rng, -conv_bound, conv_bound));
        x_proj_ = parameter(fan_in_normal<T>({E, R + 2 * N}, E, rng));
        const T dt_bound = T(1 / std::sqrt(double(R)));
        dt_weight_ = parameter(olmax::rand<T>({R, E}, rng, -dt_bound, dt_bound));
        dt_bias_ = parameter(step_size_bias<T>({E}, config.dt_min, config.dt_max, config.dt_floor, rng, "nn::SelectiveSSM"));
        A_log_ = Tensor<T>({E, N});
        for (std::size_t e = 0; e < E; ++e)
            for (std::size_t n = 0; n < N; ++n) A_log_(e, n) = T(std::log(double(n + 1)));
        A_log_ = parameter(A_log_);
        D_ = parameter(Tensor<T>({E}, T{1}));
        out_proj_ = parameter(fan_in_normal<T>({E, D}, E, rng));
    }

    /// x [batch, T, D] -> [batch, T, D], each row one sequence.
    Tensor<T> forward(const Tensor<T>& x, const LayerContext& = {}) const { return run(x, {}, {}).y; }

    /// Packed rows: resets [batch, T] is nonzero at the first position of every document (see the
    /// top of this file).
    Tensor<T> forward(const Tensor<T>& x, const Tensor<T>& resets, const LayerContext& = {}) const { return run(x, resets, {}).y; }

    /// Continues from `state` (the previous call's, or empty for zeros) and returns the new one.
    SelectiveSSMOutput<T> forward_with_state(const Tensor<T>& x, const SelectiveSSMState<T>& state, const Tensor<T>& resets = {}) const {
        return run(x, resets, state);
    }

    /// The next steps of a sequence (nn::continue_sequence; empty state: from the start): forward_with_state
    /// with its state carried in `state`.
    using sequence_state = SelectiveSSMState<T>;
    Tensor<T> continue_sequence(const Tensor<T>& x, sequence_state& state, const LayerContext& = {}) const {
        return detail::continue_with_state(*this, x, state);
    }


    void visit_parameters(ParameterVisitor<T>& visit) {
        visit("in_proj/weight", in_proj_, Role::weight);
        visit("conv/weight", conv_weight_, Role::weight);
        visit("conv/bias", conv_bias_, Role::bias);
        visit("x_proj/weight", x_proj_, Role::weight);
        visit("dt_proj/weight", dt_weight_, Role::weight);
        visit("dt_proj/bias", dt_bias_, Role::bias);
        visit("A_log", A_log_, Role::other);
        visit("D", D_, Role::other);
        visit("out_proj/weight", out_proj_, Role::weight);
    }

    const SelectiveSSMConfig& config() const { return config_; }

private:
    SelectiveSSMOutput<T> run(const Tensor<T>& x, const Tensor<T>& resets, const SelectiveSSMState<T>& state) const {
        const std::size_t D = in_proj_.extent(0), E = A_log_.extent(0), N = A_log_.extent(1), R = dt_weight_.extent(0);
        check<shape_error>(x.defined() && x.rank() == 3 && x.extent(2) == D, "nn::SelectiveSSM: expected input [batch, T, ", D, "], got ",
                           x.defined() ? to_string(x.shape()) : std::string("an undefined tensor"));
        check<value_error>(x.extent(0) > 0 && x.extent(1) > 0, "nn::SelectiveSSM: input of shape ", to_string(x.shape()),
                           " is empty (batch or T is 0)");
        const Tensor<T> xz = matmul(x, in_proj_);  // [batch, T, 2E]
        const auto conv = detail::depthwise_conv_silu(slice(xz, 2, 0, E), conv_weight_, conv_bias_, resets, state.conv);
        const Tensor<T>& u = conv[0];
        const Tensor<T> p = matmul(u, x_proj_);  // [batch, T, R + 2N]
        const Tensor<T> delta = pointwise("delta", [](auto v, auto b) { return math::softplus(v + b); }, matmul(slice(p, 2, 0, R), dt_weight_), dt_bias_);
        const Tensor<T> A = neg(exp(A_log_));
        const auto s = scan::selective_scan(u, delta, A, slice(p, 2, R, R + N), slice(p, 2, R + N, R + 2 * N), D_,
                                            {.h0 = state.ssm, .resets = resets, .chunk = long(config_.chunk)});
        // y silu(z) as one op: one pass and no silu(z) tensor, forward or backward.
        const Tensor<T> gated = pointwise("gated_output", [](auto y, auto z) { return y * math::silu(z); }, s.y, slice(xz, 2, E, 2 * E));
        return {matmul(gated, out_proj_), {s.h_last, conv[1]}};
    }

    SelectiveSSMConfig config_;
    Tensor<T> in_proj_, conv_weight_, conv_bias_, x_proj_, dt_weight_, dt_bias_, A_log_, D_, out_proj_;
};

}  // namespace olmax::nn
