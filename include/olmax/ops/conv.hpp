#pragma once
// Causal 1-D convolution over time on [batch, time, channels], with channel groups; all three
// passes (forward, dx, dw) are GEMMs on time-shifted row blocks, one per (batch, tap, group);
// ungrouped forward and dx batch them over the batch elements (Kernels::gemm_batched).
// (Measured against one im2col GEMM per pass on the byte LM's shapes in fp32: the same speed for
// forward and dx, half the speed for dw, so the unfolded copy is not worth its memory; at width
// 512 under the bf16 policy the unfolded step was 6% slower, 2026-11-24.) The exception: under the
// bf16 policy a small ungrouped convolution's forward and dw are GEMMs on the unfolded input
// (`unfolded_forward_elements`, `unfolded_dw_elements`), one per group of batch elements whose
// unfolding fits `unfolded_buffer_elements`, where oneDNN's per-call cost outweighs the copy. Each
// pass prepares its operands once (backend::GemmOperand): under the bf16 policy x, w and dy are
// rounded once for all taps, and x and w once for the forward and the backward.

#include <cstddef>
#include <vector>
#include <algorithm>
#include <numeric>
#include <optional>
#include <span>
#include <utility>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/cpu_features.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/backend/gemm_operand.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/ops/op_keys.hpp"

namespace olmax {

namespace detail::conv_ops {

struct ConvDims {
    std::size_t batch = 0, time = 0, cin = 0, cout = 0, taps = 0, groups = 1;
    std::size_t cin_group() const { return cin / groups; }
    std::size_t cout_group() const { return cout / groups; }
};

template <Real T>
ConvDims validate(const Tensor<T>& x, const Tensor<T>& w, std::size_t groups) {
    check<value_error>(groups > 0, "causal_conv1d: groups must be positive, got 0");
    if (!(x.rank() == 3))
        throw shape_error(olmax::detail::concat("causal_conv1d: x must have shape [batch, time, channels], got ", to_string(x.shape())));
    if (!(w.rank() == 3))
        throw shape_error(olmax::detail::concat("causal_conv1d: w must have shape [K, Cin/groups, Cout], got ", to_string(w.shape())));
    ConvDims d;
    d.batch = x.shape()[0];
    d.time = x.shape()[1];
    d.cin = x.shape()[2];
    d.taps = w.shape()[0];
    d.cout = w.shape()[2];
    d.groups = groups;
    if (!(d.taps > 0)) throw shape_error(olmax::detail::concat("causal_conv1d: kernel size K = 0 in w of shape ", to_string(w.shape())));
    if (!(d.cin % groups == 0 && d.cout % groups == 0))
        throw shape_error(olmax::detail::concat("causal_conv1d: Cin = ", d.cin, " and Cout = ", d.cout, " must both divide by groups = ",
                                                groups, " (x ", to_string(x.shape()), ", w ", to_string(w.shape()), ")"));
    if (!(w.shape()[1] == d.cin / groups))
        throw shape_error(olmax::detail::concat("causal_conv1d: w of shape ", to_string(w.shape()), " needs Cin/groups = ", d.cin / groups,
                                                " input channels per group for x of shape ", to_string(x.shape()),
                                                " and groups = ", groups));
    return d;
}

/// With fewer independent items than threads, loop over them and let each GEMM use the threads.
inline bool few_items(std::size_t items) {
    return items < std::size_t(std::max(backend::current().num_threads(), 2));
}

/// Runs taps(first, count), the per-tap GEMMs of batch elements [first, first + count), over the
/// whole batch: ungrouped, as one call (its GEMMs are batched over the elements, whose weight is
/// shared: Kernels::gemm_batched); grouped, one call per element, the elements on separate threads
/// when there are enough of them (per-(tap, group) GEMMs are too small to be a parallel loop each).
template <class Taps>
void over_batch(const ConvDims& d, Taps&& taps) {
    if (d.groups == 1) return taps(std::size_t{0}, d.batch);
    if (few_items(d.batch)) {
        for (std::size_t b = 0; b < d.batch; ++b) taps(b, std::size_t{1});
        return;
    }
    backend::current().parallel_for(d.batch, d.time * d.cin * d.cout * d.taps / d.groups, [&](std::size_t lo, std::size_t hi) {
        for (std::size_t b = lo; b < hi; ++b) taps(b, std::size_t{1});
    });
}

/// Under the bf16 policy, an ungrouped forward whose unfolded input (taps x the input) has at
/// most this many elements runs on it (`forward_unfolded`; one GEMM per group of batch elements).
/// At the byte LM's 64-wide shapes (B 8, T 64, 5 taps, 64 <-> 128 channels) the unfolding copy and
/// one call ran 1.09-1.20x as fast as the 33 per-tap calls; at T 256 it was 0.95-1.05x, so the
/// limit keeps those per tap.
/// dx the same way (dy unfolded forwards in time, the taps' transposed weights stacked) gained
/// nothing once the weight's rearranging copy was counted (0.95-1.04x), so dx stays per tap.
/// (oneDNN bf16, AMD EPYC Zen 4, one thread, 2026-11-25;
/// benchmarks/gemm_bf16/onednn_batch_layouts.cpp.)
inline constexpr std::size_t unfolded_forward_elements = std::size_t(1) << 19;

/// Under the bf16 policy, an ungrouped dw whose unfolded input has at most this many elements runs
/// on it (`backward_weight_unfolded`): at the byte LM's 64-wide shapes, one [320 x 512] x
/// [512 x 128] product ran in 85-89 us against 107-108 us for its 40 per-(tap, batch element)
/// products (oneDNN bf16, AMD EPYC Zen 4, one thread, 2026-11-24;
/// benchmarks/gemm_bf16/onednn_batch_layouts.cpp); the per-call cost is what a larger
/// shape does not pay, and its unfolded copy (taps x the input, in bf16) would be large.
inline constexpr std::size_t unfolded_dw_elements = std::size_t(1) << 20;

/// The limit of `unfolded_dw_elements` on this CPU: none where it has AMX, whose tile products gain
/// more from dw's long reduction (K = batch x time per GEMM instead of time) than the unfolding
/// costs: at width 512 (B 8, T 256, 5 taps, 512 <-> 1024 channels) dw took 13.2-14.0 ms unfolded
/// against 15.8-17.3 ms per tap (oneDNN bf16 on AMX, Intel Xeon, one thread, 2026-11-26). On
/// AVX512-BF16 without AMX the unfolded step was slower at that width (see the file comment).
inline std::size_t unfolded_dw_limit() {
    static const std::size_t limit = backend::cpu_bf16_features().amx_bf16 ? ~std::size_t(0) : unfolded_dw_elements;
    return limit;
}

/// Whether a pass runs on the unfolded input: an ungrouped convolution under the bf16 policy whose
/// unfolded input has at most `limit` elements.
inline bool unfolds(const ConvDims& d, std::size_t limit) {
    return d.groups == 1 && backend::current().float_gemms_in_bf16() && d.taps * d.batch * d.time * d.cin <= limit;
}

/// Whether `backward_weight` writes every element of dw (its unfolded form with at least one
/// GEMM over a non-empty reduction), so that dw may start uninitialised; the per-tap form, and an
/// empty batch or sequence, add into a zeroed dw.
inline bool backward_weight_overwrites(const ConvDims& d) {
    return d.batch > 0 && d.time > 0 && unfolds(d, unfolded_dw_limit());
}

/// unfolded[(b, t), (k, c)] = x[b, t - s_k, c] (0 where t < s_k), s_k = K-1-k: the input as the
/// [B T, K Cin] matrix whose product with w read as [K Cin, Cout] is every tap at once (the
/// forward), and whose transposed product with dy is every tap's dw. E is bfloat16 for a rounded
/// source, else T.
template <class E>
void unfold(const ConvDims& d, const E* x, E* unfolded) {
    const std::size_t row = d.taps * d.cin;
    backend::current().parallel_for(d.batch * d.time, row, [&](std::size_t lo, std::size_t hi) {
        for (std::size_t r = lo; r < hi; ++r) {
            const std::size_t t = r % d.time;
            for (std::size_t k = 0; k < d.taps; ++k) {
                const std::size_t shift = d.taps - 1 - k;
                E* out = unfolded + r * row + k * d.cin;
                if (t >= shift) std::copy_n(x + (r - shift) * d.cin, d.cin, out);
                else std::fill_n(out, d.cin, E{});
            }
        }
    });
}

/// The most elements one unfolded buffer holds: the batch is unfolded in groups of whole batch
/// elements (at least one) that fit, each group's GEMM writing its rows of the output (forward) or
/// adding into dw. The full unfolding was the largest tensor of the byte LM's 64-wide bf16 step
/// ([512, 640] in bf16, 640 KiB, live at the step's peak in the second convolution's dw); in groups
/// of this size the 64-wide shapes take 2-3 calls instead of one, at the same step time.
inline constexpr std::size_t unfolded_buffer_elements = std::size_t(1) << 17;

/// Calls f(a, first, count) for consecutive groups of batch elements [first, first + count), a the
/// GEMM source of their unfolded input ([count T, K Cin], `unfold`); with one tap that is x's rows
/// themselves, in one group.
template <Real T, class F>
void for_unfolded_groups(const ConvDims& d, backend::GemmSource<T> x, F&& f) {
    if (d.taps == 1) return f(x, std::size_t{0}, d.batch);
    const std::size_t item = d.time * d.taps * d.cin;  // one batch element's unfolded elements
    const std::size_t group =
        std::clamp<std::size_t>(unfolded_buffer_elements / std::max<std::size_t>(item, 1), 1, std::max<std::size_t>(d.batch, 1));
    auto run = [&]<class E>(const E* source) {
        auto unfolded = Tensor<E>::uninitialized({group * d.time, d.taps * d.cin});  // every used element is written
        for (std::size_t first = 0; first < d.batch; first += group) {
            ConvDims part = d;
            part.batch = std::min(group, d.batch - first);
            unfold(part, source + first * d.time * d.cin, unfolded.data());
            backend::GemmSource<T> a;
            if constexpr (std::is_same_v<E, bfloat16>) a.rounded = unfolded.data();
            else a.full = unfolded.data();
            f(a, first, part.batch);
        }
    };
    if (x.full) run(x.full);
    else run(x.rounded);
}

/// out [B T, Cout] = beta out + unfold(x) w, w read as [K Cin, Cout] (groups = 1).
template <Real T>
void forward_unfolded(const ConvDims& d, backend::GemmSource<T> x, backend::GemmSource<T> w, T* out, T beta) {
    const std::size_t cols = d.taps * d.cin;
    for_unfolded_groups(d, x, [&](backend::GemmSource<T> a, std::size_t first, std::size_t count) {
        backend::gemm(false, false, count * d.time, d.cout, cols, T{1}, a, cols, w, d.cout, beta, out + first * d.time * d.cout, d.cout);
    });
}

/// dw [K Cin, Cout] = unfold(x)^T dy, one GEMM per group of batch elements (groups = 1); the first
/// overwrites, so dw may start uninitialised.
template <Real T>
void backward_weight_unfolded(const ConvDims& d, backend::GemmSource<T> x, backend::GemmSource<T> dy, T* dw) {
    const std::size_t cols = d.taps * d.cin;
    for_unfolded_groups(d, x, [&](backend::GemmSource<T> a, std::size_t first, std::size_t count) {
        backend::gemm(true, false, cols, d.cout, count * d.time, T{1}, a, cols, dy + first * d.time * d.cout, d.cout,
                      first == 0 ? T{0} : T{1}, dw, d.cout);
    });
}

/// out[b, t, group cols] = beta out + sum_k x[b, t - s_k, group cols] w[k, :, group cols] with s_k = K-1-k:
/// for tap k the output rows [s, T) take input rows [0, T - s), a GEMM on offset row blocks, batched
/// over the batch elements (Kernels::gemm_batched: the items run on the threads, and the bf16
/// policy rounds the shared weight once per tap instead of once per batch element). The
/// unshifted tap (s = 0) goes first and covers every row, so it alone applies beta: out may start
/// uninitialised when beta = 0.
template <Real T>
void forward(const ConvDims& d, backend::GemmSource<T> x, backend::GemmSource<T> w, T* out, T beta) {
    if (unfolds(d, unfolded_forward_elements)) return forward_unfolded(d, x, w, out, beta);
    const std::size_t cig = d.cin_group(), cog = d.cout_group();
    // The GEMMs of tap k and group g for batch elements [first, first + count).
    auto taps = [&](std::size_t first, std::size_t count) {
        for (std::size_t shift = 0; shift < std::min(d.taps, d.time); ++shift) {
            const std::size_t k = d.taps - 1 - shift;
            for (std::size_t g = 0; g < d.groups; ++g)
                backend::gemm_batched(count, false, false, d.time - shift, cog, cig, T{1}, x + first * d.time * d.cin + g * cig, d.cin,
                                                d.time * d.cin, w + k * cig * d.cout + g * cog, d.cout, 0, shift == 0 ? beta : T{1},
                                                out + (first * d.time + shift) * d.cout + g * cog, d.cout, d.time * d.cout);
        }
    };
    over_batch(d, taps);
}

/// dx[b, t - s] = sum_k dy[b, t, group out] w[k]^T, batched over the batch as the forward; the
/// unshifted tap goes first with beta = 0 and covers every row, so dx may start uninitialised.
template <Real T>
void backward_input(const ConvDims& d, backend::GemmSource<T> dy, backend::GemmSource<T> w, T* dx) {
    const std::size_t cig = d.cin_group(), cog = d.cout_group();
    auto taps = [&](std::size_t first, std::size_t count) {
        for (std::size_t shift = 0; shift < std::min(d.taps, d.time); ++shift) {
            const std::size_t k = d.taps - 1 - shift;
            for (std::size_t g = 0; g < d.groups; ++g)
                backend::gemm_batched(count, false, true, d.time - shift, cig, cog, T{1}, dy + (first * d.time + shift) * d.cout + g * cog,
                                                d.cout, d.time * d.cout, w + k * cig * d.cout + g * cog, d.cout, 0, shift == 0 ? T{0} : T{1},
                                                dx + first * d.time * d.cin + g * cig, d.cin, d.time * d.cin);
        }
    };
    over_batch(d, taps);
}

/// dw[k, :, group out] = sum_b x[b, rows [0, T-s), group in]^T dy[b, rows [s, T), group out] into a
/// zeroed dw (see `backward_weight_overwrites`); every (tap, group, column piece) block of dw
/// belongs to one thread, so the batch sum needs no atomics.
/// The output columns are cut into pieces when the K * groups blocks do not divide evenly over the
/// threads (5 taps on 2 threads would leave one thread a third of the work idle).
template <Real T>
void backward_weight(const ConvDims& d, backend::GemmSource<T> x, backend::GemmSource<T> dy, T* dw) {
    if (backward_weight_overwrites(d)) return backward_weight_unfolded(d, x, dy, dw);
    const std::size_t cig = d.cin_group(), cog = d.cout_group();
    const std::size_t blocks = d.taps * d.groups, threads = std::size_t(std::max(backend::current().num_threads(), 1));
    const std::size_t pieces = std::clamp<std::size_t>(threads / std::gcd(blocks, threads), 1, std::max<std::size_t>(cog, 1));
    auto one_block = [&](std::size_t item) {
        const std::size_t kg = item / pieces, piece = item % pieces;
        const std::size_t k = kg / d.groups, g = kg % d.groups, shift = d.taps - 1 - k;
        const std::size_t col0 = g * cog + cog * piece / pieces, cols = g * cog + cog * (piece + 1) / pieces - col0;
        if (shift >= d.time || cols == 0) return;
        for (std::size_t b = 0; b < d.batch; ++b)
            backend::gemm(true, false, cig, cols, d.time - shift, T{1}, x + b * d.time * d.cin + g * cig, d.cin,
                    dy + (b * d.time + shift) * d.cout + col0, d.cout, T{1}, dw + k * cig * d.cout + col0, d.cout);
    };
    const std::size_t items = blocks * pieces;
    if (few_items(items)) {
        for (std::size_t item = 0; item < items; ++item) one_block(item);
        return;
    }
    backend::current().parallel_for(items, d.batch * d.time * cig * cog / pieces, [&](std::size_t lo, std::size_t hi) {
        for (std::size_t item = lo; item < hi; ++item) one_block(item);
    });
}

template <Real T>
Tensor<T> conv(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>* bias, std::size_t groups) {
    backend::op_scope on("causal_conv1d", x, w, bias ? *bias : Tensor<T>());
    const ConvDims d = validate(x, w, groups);
    return on.run<op::causal_conv1d>({x, w, bias ? *bias : Tensor<T>()}, {.groups = groups}, [&] {
        if (bias)
            if (!(bias->rank() == 1 && bias->shape()[0] == d.cout))
                throw shape_error(olmax::detail::concat("causal_conv1d: bias of shape ", to_string(bias->shape()),
                                                        " does not match Cout = ", d.cout, " of w ", to_string(w.shape())));
        auto y = Tensor<T>::uninitialized({d.batch, d.time, d.cout});  // every element is written below
        if (bias) {
            const T* bp = bias->data();
            T* yp = y.data();
            backend::current().parallel_for(d.batch * d.time, d.cout, [&](std::size_t lo, std::size_t hi) {
                for (std::size_t r = lo; r < hi; ++r) std::copy_n(bp, d.cout, yp + r * d.cout);
            });
        }
        // Under the bf16 policy the backward reuses the forward's rounded weight (2 bytes per weight
        // held to the backward, as autocast's cast cache does) instead of rounding it again: at width
        // 512 on AMX that was 30 of 1,173 ms per step, for 66 MiB more at the step's peak.
        const backend::GemmOperand<T> xs(x), ws(w);
        forward(d, xs.source(), ws.source(), y.data(), bias ? T{1} : T{0});
        std::vector<Tensor<T>> inputs{x, w};
        if (bias) inputs.push_back(*bias);
        autodiff::record<T>(bias ? "causal_conv1d(bias)" : "causal_conv1d", std::span<const Tensor<T>>(inputs), std::span<Tensor<T>>(&y, 1),
                            [d, xs = xs.kept_for_backward(x), ws](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                                const T* dy = g[0].data();
                                const bool dx_needed = sink.needs(0), dw_needed = sink.needs(1);
                                const std::optional<backend::GemmOperand<T>> dys =
                                    dx_needed || dw_needed ? std::optional(backend::GemmOperand<T>(g[0])) : std::nullopt;
                                if (dx_needed) {
                                    auto dx = Tensor<T>::uninitialized({d.batch, d.time, d.cin});  // every element is written
                                    backward_input(d, dys->source(), ws.source(), dx.data());
                                    sink.add(0, std::move(dx));
                                }
                                if (dw_needed) {
                                    Tensor<T> dw = backward_weight_overwrites(d) ? Tensor<T>::uninitialized({d.taps, d.cin_group(), d.cout})
                                                                                 : Tensor<T>({d.taps, d.cin_group(), d.cout});
                                    backward_weight(d, xs.ready().source(), dys->source(), dw.data());
                                    sink.add(1, std::move(dw));
                                }
                                if (sink.needs(2)) {  // db[o] = sum over batch and time of dy[., ., o]
                                    auto db = Tensor<T>::uninitialized({d.cout});
                                    T* dbp = db.data();
                                    backend::current().parallel_for(d.cout, d.batch * d.time, [&](std::size_t lo, std::size_t hi) {
                                        for (std::size_t o = lo; o < hi; ++o) {
                                            double acc = 0;
                                            for (std::size_t r = 0; r < d.batch * d.time; ++r) acc += double(dy[r * d.cout + o]);
                                            dbp[o] = T(acc);
                                        }
                                    });
                                    sink.add(2, std::move(db));
                                }
                            });
        return y;
    });
}

}  // namespace detail::conv_ops

/// Causal 1-D convolution: x [B, T, Cin], w [K, Cin/groups, Cout] -> [B, T, Cout] with
///   out[b, t, o] = sum_k sum_c x[b, t - (K-1) + k, g*Cin/groups + c] * w[k, c, o],  g = o / (Cout/groups),
/// and zeros for times before 0 (left padding K-1), so output t sees only inputs at times <= t.
/// Note the weight layout: taps first, unlike the original's [Cout, K, Cin].
template <Real T>
Tensor<T> causal_conv1d(const Tensor<T>& x, const Tensor<T>& w, std::size_t groups = 1) {
    return detail::conv_ops::conv(x, w, static_cast<const Tensor<T>*>(nullptr), groups);
}

/// Causal 1-D convolution plus a bias [Cout] added at every time step.
template <Real T>
Tensor<T> causal_conv1d(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias, std::size_t groups = 1) {
    return detail::conv_ops::conv(x, w, &bias, groups);
}

// ---- the key of the convolution's lowering rule (its rule: olmax/trace/rules.hpp) -------------

namespace op {

/// x [B, T, Cin], w [K, Cin / groups, Cout], bias [Cout] (undefined: none).
struct causal_conv1d : registered<causal_conv1d> {
    static constexpr std::string_view name = "causal_conv1d";
    struct attrs {
        std::size_t groups = 1;
    };
    static std::vector<sample<attrs>> samples(Generator& rng) {
        auto u = [&](const Shape& s) { return samples::uniform(rng, s); };
        return {{{u({2, 5, 3}), u({3, 3, 4}), Tensor<float>()}, {1}},
                {{u({1, 6, 4}), u({2, 4, 2}), u({2})}, {1}},
                {{u({2, 4, 4}), u({3, 2, 6}), u({6})}, {2}},   // groups: 2 channels in, 3 out each
                {{u({1, 3, 2}), u({1, 2, 2}), Tensor<float>()}, {1}}};  // one tap
    }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) {
        return in[2].defined() ? olmax::causal_conv1d(in[0], in[1], in[2], a.groups) : olmax::causal_conv1d(in[0], in[1], a.groups);
    }
};

}  // namespace op

}  // namespace olmax
