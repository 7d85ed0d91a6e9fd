#pragma once
// Softmax, log-softmax and softmax cross-entropy (with optional z-loss), including the chunked
// cross-entropy of the original Olmax output head (src/model/loss.py): tokens are processed in
// chunks so the full [tokens, vocab] logits never exist, and the gradient is computed in the
// forward pass.
//
// Fully masked rows (every entry -inf): softmax gives 0 everywhere, log_softmax gives -inf
// everywhere, and both pass a zero gradient for such rows instead of NaN. A row with some -inf
// entries behaves as the limit: probability 0 there, finite gradients everywhere.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>
#include <string_view>
#include <span>
#include <type_traits>
#include <utility>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/backend/gemm_operand.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/detail/third_party.hpp"
#include "olmax/ops/op_keys.hpp"

namespace olmax {

namespace detail::loss_ops {

/// Calls f(line, base, stride, n) for every 1-D line of `shape` along `axis` (rows of the
/// softmax): `line` numbers the lines in the row-major order of the shape without the axis (where
/// a reduction along it writes the line's result), `base` is the line's first element.
template <class F>
void for_each_line(const Shape& shape, std::size_t axis, F&& f) {
    std::size_t outer = 1, inner = 1;
    for (std::size_t i = 0; i < axis; ++i) outer *= shape[i];
    for (std::size_t i = axis + 1; i < shape.size(); ++i) inner *= shape[i];
    const std::size_t n = shape[axis];
    backend::current().parallel_for(outer * inner, n, [&](std::size_t lo, std::size_t hi) {
        for (std::size_t line = lo; line < hi; ++line) f(line, (line / inner) * n * inner + line % inner, inner, n);
    });
}

/// Maximum of a line ignoring NaN (NaN then propagates through exp); -inf for an empty line.
template <class T>
T line_max(const T* x, std::size_t stride, std::size_t n) {
    T m = -std::numeric_limits<T>::infinity();
    for (std::size_t k = 0; k < n; ++k) m = x[k * stride] > m ? x[k * stride] : m;
    return m;
}

/// log(sum(exp(x))) of a line in double: -inf for fully masked (or empty) lines.
template <class T>
double line_logsumexp(const T* x, std::size_t stride, std::size_t n) {
    const T m = line_max(x, stride, n);
    if (m == -std::numeric_limits<T>::infinity()) return -std::numeric_limits<double>::infinity();
    double s = 0;
    for (std::size_t k = 0; k < n; ++k) s += std::exp(double(x[k * stride]) - double(m));
    return double(m) + std::log(s);
}

/// exp of n contiguous values in place, vectorised: Eigen's packet exp (AVX-512 / AVX2 / SSE),
/// within a few ulp of std::exp and an order of magnitude faster than a scalar libm loop.
template <Real T>
void exp_in_place(T* x, std::size_t n) {
    Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> values(x, Eigen::Index(n));
    values = values.exp();
}

/// Per row of logits z [rows, V]: lse (double) and, when `grad` is set, overwrites z with
/// scale * (softmax(z) * (1 + 2 z_loss lse) - onehot(target)) (the original's dz, §6.7).
/// Returns sum over rows of (lse - z[target]) and of lse^2 through the out-parameters.
/// One exp per logit: e = exp(z - max) (in place when `grad`, else in a scratch row), lse =
/// max + log(sum e) with the sum in double, softmax = e / sum e.
template <Real T>
void softmax_xent_rows(T* z, std::size_t rows, std::size_t vocab, const std::int32_t* targets, bool grad, double z_loss, double scale,
                       double& loss_sum, double& lse_sq_sum) {
    std::vector<double> loss(rows), lse_sq(rows);
    backend::current().parallel_for(rows, vocab, [&](std::size_t lo, std::size_t hi) {
        std::vector<T> scratch(grad ? 0 : vocab);
        for (std::size_t i = lo; i < hi; ++i) {
            T* row = z + i * vocab;
            const std::size_t t = std::size_t(targets[i]);
            const T top = line_max(row, 1, vocab);
            if (top == -std::numeric_limits<T>::infinity()) {  // fully masked row: zero probabilities
                loss[i] = -std::numeric_limits<double>::infinity() - double(row[t]);
                lse_sq[i] = std::numeric_limits<double>::infinity();
                if (grad) {
                    std::fill(row, row + vocab, T{0});
                    row[t] = T(-scale);
                }
                continue;
            }
            const T target_logit = row[t];
            T* e = grad ? row : scratch.data();
#pragma omp simd
            for (std::size_t j = 0; j < vocab; ++j) e[j] = row[j] - top;
            exp_in_place(e, vocab);
            double sum = 0;
#pragma omp simd reduction(+ : sum)
            for (std::size_t j = 0; j < vocab; ++j) sum += double(e[j]);
            const double lse = double(top) + std::log(sum);
            loss[i] = lse - double(target_logit);
            lse_sq[i] = lse * lse;
            if (!grad) continue;
            const T factor = T(scale * (1.0 + 2.0 * z_loss * lse) / sum);
#pragma omp simd
            for (std::size_t j = 0; j < vocab; ++j) row[j] *= factor;
            row[t] -= T(scale);
        }
    });
    for (std::size_t i = 0; i < rows; ++i) {  // serial sum: the result does not depend on the thread count
        loss_sum += loss[i];
        lse_sq_sum += lse_sq[i];
    }
}

inline void check_targets(std::string_view op, const std::int32_t* targets, std::size_t n, std::size_t vocab) {
    for (std::size_t i = 0; i < n; ++i)
        check<value_error>(targets[i] >= 0 && std::size_t(targets[i]) < vocab, op, ": target ", targets[i], " at position ", i,
                           " is out of range for a vocabulary of V=", vocab);
}

/// softmax (Log = false) or log_softmax (Log = true) of every line along axis `a`, max-shifted
/// through the line's logsumexp; a line of -inf (lse = -inf) gives 0 / -inf.
template <bool Log, class T>
Tensor<T> softmax_lines(const Tensor<T>& x, std::size_t a) {
    auto y = Tensor<T>::uninitialized(x.shape());
    const T* xp = x.data();
    T* yp = y.data();
    for_each_line(x.shape(), a, [&](std::size_t, std::size_t base, std::size_t stride, std::size_t n) {
        const double lse = line_logsumexp(xp + base, stride, n);
        const bool masked = lse == -std::numeric_limits<double>::infinity();
        for (std::size_t k = 0; k < n; ++k) {
            const double shifted = double(xp[base + k * stride]) - lse;
            if constexpr (Log) yp[base + k * stride] = masked ? -std::numeric_limits<T>::infinity() : T(shifted);
            else yp[base + k * stride] = masked ? T{0} : T(std::exp(shifted));
        }
    });
    return y;
}

}  // namespace detail::loss_ops

/// Softmax along `axis`, max-shifted for stability. See the file comment for -inf rows.
template <Real T>
Tensor<T> softmax(const Tensor<T>& x, long axis = -1) {
    backend::op_scope on("softmax", x);
    const std::size_t a = normalize_axis(axis, x.rank(), "softmax");
    return on.run<op::softmax>({x}, {.axis = a}, [&] {
        auto y = detail::loss_ops::softmax_lines<false>(x, a);
        autodiff::record<T>("softmax", std::span<const Tensor<T>>(&x, 1), std::span<Tensor<T>>(&y, 1),
                            [y = y.detach(), a](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                                // dx = y (dy - sum(dy y))
                                auto dx = Tensor<T>::uninitialized(y.shape());
                                const T *yp = y.data(), *gp = g[0].data();
                                T* dp = dx.data();
                                detail::loss_ops::for_each_line(y.shape(), a, [&](std::size_t, std::size_t base, std::size_t stride, std::size_t n) {
                                    double dot = 0;
                                    for (std::size_t k = 0; k < n; ++k) dot += double(gp[base + k * stride]) * double(yp[base + k * stride]);
                                    for (std::size_t k = 0; k < n; ++k) {
                                        const std::size_t i = base + k * stride;
                                        dp[i] = yp[i] == T{0} ? T{0} : T(double(yp[i]) * (double(gp[i]) - dot));
                                    }
                                });
                                sink.add(0, std::move(dx));
                            });
        return y;
    });
}

/// log(sum(exp(x))) along `axis`, max-shifted for stability: the axis dropped, or kept with extent
/// 1 (`keepdims`). Its gradient is softmax(x) along the axis. A line of -inf gives -inf with no
/// gradient (as softmax's lines of -inf); a NaN or +inf entry gives NaN, as in softmax.
template <Real T>
Tensor<T> logsumexp(const Tensor<T>& x, long axis = -1, bool keepdims = false) {
    backend::op_scope on("logsumexp", x);
    const std::size_t a = normalize_axis(axis, x.rank(), "logsumexp");
    return on.run<op::logsumexp>({x}, {.axis = a, .keepdims = keepdims}, [&] {
        Shape shape = x.shape();
        if (keepdims) shape[a] = 1;
        else shape.erase(shape.begin() + std::ptrdiff_t(a));
        auto y = Tensor<T>::uninitialized(shape);
        const T* xp = x.data();
        T* yp = y.data();
        detail::loss_ops::for_each_line(x.shape(), a, [&](std::size_t line, std::size_t base, std::size_t stride, std::size_t n) {
            yp[line] = T(detail::loss_ops::line_logsumexp(xp + base, stride, n));
        });
        autodiff::record<T>("logsumexp", std::span<const Tensor<T>>(&x, 1), std::span<Tensor<T>>(&y, 1),
                            [x = x.detach(), y = y.detach(), a](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                                // dx = dy exp(x - lse) along each line; 0 on a line of -inf
                                auto dx = Tensor<T>::uninitialized(x.shape());
                                const T *xp = x.data(), *yp = y.data(), *gp = g[0].data();
                                T* dp = dx.data();
                                detail::loss_ops::for_each_line(x.shape(), a, [&](std::size_t line, std::size_t base, std::size_t stride, std::size_t n) {
                                    const double lse = double(yp[line]), dy = double(gp[line]);
                                    const bool masked = lse == -std::numeric_limits<double>::infinity();
                                    for (std::size_t k = 0; k < n; ++k)
                                        dp[base + k * stride] = masked ? T{0} : T(dy * std::exp(double(xp[base + k * stride]) - lse));
                                });
                                sink.add(0, std::move(dx));
                            });
        return y;
    });
}

/// log(softmax(x)) along `axis`, computed as x - logsumexp(x). See the file comment for -inf rows.
template <Real T>
Tensor<T> log_softmax(const Tensor<T>& x, long axis = -1) {
    backend::op_scope on("log_softmax", x);
    const std::size_t a = normalize_axis(axis, x.rank(), "log_softmax");
    return on.run<op::log_softmax>({x}, {.axis = a}, [&] {
        auto y = detail::loss_ops::softmax_lines<true>(x, a);
        autodiff::record<T>("log_softmax", std::span<const Tensor<T>>(&x, 1), std::span<Tensor<T>>(&y, 1),
                            [y = y.detach(), a](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                                // dx = dy - softmax * sum(dy), softmax = exp(y); zero for fully masked lines
                                auto dx = Tensor<T>::uninitialized(y.shape());
                                const T *yp = y.data(), *gp = g[0].data();
                                T* dp = dx.data();
                                detail::loss_ops::for_each_line(y.shape(), a, [&](std::size_t, std::size_t base, std::size_t stride, std::size_t n) {
                                    double total = 0, mass = 0;
                                    for (std::size_t k = 0; k < n; ++k) {
                                        total += double(gp[base + k * stride]);
                                        mass += std::exp(double(yp[base + k * stride]));
                                    }
                                    for (std::size_t k = 0; k < n; ++k) {
                                        const std::size_t i = base + k * stride;
                                        dp[i] = mass == 0 ? T{0} : T(double(gp[i]) - std::exp(double(yp[i])) * total);
                                    }
                                });
                                sink.add(0, std::move(dx));
                            });
        return y;
    });
}

/// Mean softmax cross-entropy of `logits` [N, V] against integer `targets` [N] in [0, V), plus
/// the z-loss z_loss * mean(lse^2) (lse = logsumexp of a row; PaLM's auxiliary loss that keeps the
/// softmax normaliser near 1). Its gradient per row is (softmax (1 + 2 z_loss lse) - onehot) / N.
/// N = 0 gives NaN (the mean of nothing), as `mean` does.
template <Real T>
Tensor<T> cross_entropy(const Tensor<T>& logits, const Tensor<std::int32_t>& targets, std::type_identity_t<T> z_loss = 0) {
    backend::op_scope on("cross_entropy", logits, targets);
    if (!(logits.rank() == 2 && targets.rank() == 1 && targets.shape()[0] == logits.shape()[0]))
        throw shape_error(olmax::detail::concat("cross_entropy: logits must be [N, V] and targets [N], got ", to_string(logits.shape()),
                                                " and ", to_string(targets.shape())));
    const std::size_t n = logits.shape()[0], vocab = logits.shape()[1];
    return on.run<op::cross_entropy>({logits, targets}, {.z_loss = double(z_loss)}, [&] {  // targets: checked here, or where a traced program's inputs are made
        detail::loss_ops::check_targets("cross_entropy", targets.data(), n, vocab);
        // The forward pass works on a copy so the gradient can be formed in the same sweep when needed.
        const Tensor<T> in[1] = {logits};
        const bool recording = autodiff::should_record(std::span<const Tensor<T>>(in));
        Tensor<T> dlogits = recording ? logits.clone() : logits;
        double loss_sum = 0, lse_sq_sum = 0;
        detail::loss_ops::softmax_xent_rows(dlogits.data(), n, vocab, targets.data(), recording, double(z_loss), 1.0 / double(n), loss_sum,
                                               lse_sq_sum);
        auto y = Tensor<T>::scalar(T((loss_sum + double(z_loss) * lse_sq_sum) / double(n)));
        if (!recording) return y;
        autodiff::record<T>("cross_entropy", std::span<const Tensor<T>>(in), std::span<Tensor<T>>(&y, 1),
                            [dlogits](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                                const T s = g[0].item();
                                auto dx = Tensor<T>::uninitialized(dlogits.shape());
                                backend::map(dx.size(), dx.data(), [s](T v) { return v * s; }, dlogits.data());
                                sink.add(0, std::move(dx));
                            });
        return y;
    });
}

/// Options of `chunked_cross_entropy`.
struct ChunkedLossOptions {
    double z_loss = 0;              ///< weight of the z-loss term (gradient only, see below)
    std::size_t chunk_tokens = 1024;  ///< tokens per chunk: the largest logits buffer is chunk_tokens x V
};

/// Mean softmax cross-entropy of the output head `hidden [N, F] x w_out [F, V]` against `targets`
/// [N], without ever holding the [N, V] logits: tokens go in chunks of `chunk_tokens` (the last
/// one may be shorter), each chunk's logits live in one reused [chunk, V] buffer, lse is
/// accumulated in double, and the gradients dhidden and dw_out are formed right there in the
/// forward pass (as the original Olmax does, src/model/loss.py); backward only scales them by the
/// incoming gradient. As in the original, the returned value EXCLUDES the z-loss term while the
/// gradient INCLUDES it: dlogits = (softmax (1 + 2 z_loss lse) - onehot) / N. So with z_loss = 0
/// the value and gradients equal `cross_entropy(matmul(hidden, w_out), targets)`; with z_loss > 0
/// the gradients equal those of `cross_entropy(..., z_loss)` and the value is that minus
/// z_loss * mean(lse^2). Memory: O(chunk_tokens V + N F + F V) instead of O(N V).
template <Real T>
Tensor<T> chunked_cross_entropy(const Tensor<T>& hidden, const Tensor<T>& w_out, const Tensor<std::int32_t>& targets,
                                ChunkedLossOptions opt = {}) {
    backend::op_scope on("chunked_cross_entropy", hidden, w_out, targets);
    check<value_error>(opt.chunk_tokens > 0, "chunked_cross_entropy: chunk_tokens must be positive, got 0");
    if (!(hidden.rank() == 2 && w_out.rank() == 2 && targets.rank() == 1 && hidden.shape()[1] == w_out.shape()[0] &&
          targets.shape()[0] == hidden.shape()[0]))
        throw shape_error(olmax::detail::concat("chunked_cross_entropy: needs hidden [N, F], w_out [F, V] and targets [N], got ",
                                                to_string(hidden.shape()), ", ", to_string(w_out.shape()), " and ",
                                                to_string(targets.shape())));
    const std::size_t n = hidden.shape()[0], features = hidden.shape()[1], vocab = w_out.shape()[1];
    return on.run<op::chunked_cross_entropy>({hidden, w_out, targets}, {.z_loss = opt.z_loss}, [&] {
        detail::loss_ops::check_targets("chunked_cross_entropy", targets.data(), n, vocab);

        const Tensor<T> inputs[2] = {hidden, w_out};
        const bool recording = autodiff::should_record(std::span<const Tensor<T>>(inputs));
        const bool need_dh = recording && hidden.requires_grad(), need_dw = recording && w_out.requires_grad();
        Tensor<T> dhidden = need_dh ? Tensor<T>(hidden.shape()) : Tensor<T>();
        Tensor<T> dw = need_dw ? Tensor<T>(w_out.shape()) : Tensor<T>();
        const std::size_t chunk = std::min(opt.chunk_tokens, n);
        Tensor<T> logits = Tensor<T>::uninitialized({chunk, vocab});  // reused by every chunk (but a shorter last one)
        // Each operand prepared once (under the bf16 policy: rounded once, not once per GEMM).
        const backend::GemmOperand<T> hs(hidden), ws(w_out);
        double loss_sum = 0, lse_sq_sum = 0;
        for (std::size_t start = 0; start < n; start += chunk) {
            const std::size_t rows = std::min(chunk, n - start);
            if (rows != logits.shape()[0]) logits = Tensor<T>::uninitialized({rows, vocab});
            const backend::GemmSource<T> h_rows = hs.source() + start * features;
            backend::gemm(false, false, rows, vocab, features, T{1}, h_rows, features, ws.source(), vocab, T{0}, logits.data(), vocab);
            detail::loss_ops::softmax_xent_rows(logits.data(), rows, vocab, targets.data() + start, recording, opt.z_loss, 1.0 / double(n),
                                                   loss_sum, lse_sq_sum);
            if (!need_dh && !need_dw) continue;
            const backend::GemmOperand<T> dlogits(logits);
            if (need_dh)  // dhidden rows = dlogits w_out^T
                backend::gemm(false, true, rows, features, vocab, T{1}, dlogits.source(), vocab, ws.source(), vocab, T{0},
                              dhidden.data() + start * features, features);
            if (need_dw)  // dw_out += hidden_rows^T dlogits
                backend::gemm(true, false, features, vocab, rows, T{1}, h_rows, features, dlogits.source(), vocab, T{1}, dw.data(), vocab);
        }
        logits = Tensor<T>();
        auto y = Tensor<T>::scalar(T(loss_sum / double(n)));
        if (!recording) return y;
        autodiff::record<T>("chunked_cross_entropy", std::span<const Tensor<T>>(inputs), std::span<Tensor<T>>(&y, 1),
                            [dhidden, dw](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                                const T s = g[0].item();
                                auto scaled = [s](const Tensor<T>& t) {
                                    auto out = Tensor<T>::uninitialized(t.shape());
                                    backend::map(out.size(), out.data(), [s](T v) { return v * s; }, t.data());
                                    return out;
                                };
                                // The usual seed is 1: then the saved gradients are added as they are.
                                if (sink.needs(0) && dhidden.defined()) sink.add(0, s == T{1} ? dhidden : scaled(dhidden));
                                if (sink.needs(1) && dw.defined()) sink.add(1, s == T{1} ? dw : scaled(dw));
                            });
        return y;
    });
}

// ---- the keys of the losses' lowering rules (their rules: olmax/trace/rules.hpp) ---------------

namespace op {

/// softmax or log_softmax along `axis` (non-negative).
template <class K>
struct softmax_along : registered<K> {
    struct attrs {
        std::size_t axis = 0;
    };
    static std::vector<sample<attrs>> samples(Generator& rng) {
        const Tensor<float> x = samples::uniform(rng, {2, 3, 4}, -3, 3);
        return {{{x}, {2}}, {{x}, {1}}, {{x}, {0}}, {{samples::uniform(rng, {5}, -3, 3)}, {0}}};
    }
};
struct softmax : softmax_along<softmax> {
    static constexpr std::string_view name = "softmax";
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) { return olmax::softmax(in[0], long(a.axis)); }
};
struct log_softmax : softmax_along<log_softmax> {
    static constexpr std::string_view name = "log_softmax";
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) { return olmax::log_softmax(in[0], long(a.axis)); }
};

/// log(sum(exp(x))) along `axis` (non-negative), the axis dropped unless `keepdims`.
struct logsumexp : registered<logsumexp> {
    static constexpr std::string_view name = "logsumexp";
    struct attrs {
        std::size_t axis = 0;
        bool keepdims = false;
    };
    static std::vector<sample<attrs>> samples(Generator& rng) {
        const Tensor<float> x = samples::uniform(rng, {2, 3, 4}, -3, 3);
        return {{{x}, {2, false}}, {{x}, {1, true}}, {{x}, {0, false}}, {{samples::uniform(rng, {5}, -3, 3)}, {0, false}}};
    }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) {
        return olmax::logsumexp(in[0], long(a.axis), a.keepdims);
    }
};

/// logits [N, V], targets [N] (class ids as values): the mean cross-entropy plus z_loss * mean(lse^2).
struct cross_entropy : registered<cross_entropy> {
    static constexpr std::string_view name = "cross_entropy";
    struct attrs {
        double z_loss = 0;
    };
    static std::vector<sample<attrs>> samples(Generator& rng) {
        auto logits = [&](std::size_t n, std::size_t v) { return samples::uniform(rng, {n, v}, -3, 3); };
        return {{{logits(4, 5), samples::indices(rng, {4}, 5)}, {0.0}, {1}}, {{logits(6, 3), samples::indices(rng, {6}, 3)}, {0.25}, {1}}};
    }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) {
        return olmax::cross_entropy(in[0], backend::trace::as_indices(in[1]), T(a.z_loss));
    }
};
/// hidden [N, F] x w_out [F, V] against targets [N]: the value without the z-loss term, the
/// gradient with it (ops/loss.hpp).
struct chunked_cross_entropy : registered<chunked_cross_entropy> {
    static constexpr std::string_view name = "chunked_cross_entropy";
    struct attrs {
        double z_loss = 0;
    };
    static std::vector<sample<attrs>> samples(Generator& rng) {
        auto u = [&](const Shape& s) { return samples::uniform(rng, s, -1.5f, 1.5f); };
        return {{{u({5, 3}), u({3, 4}), samples::indices(rng, {5}, 4)}, {0.0}, {2}},
                {{u({7, 2}), u({2, 6}), samples::indices(rng, {7}, 6)}, {0.125}, {2}}};
    }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) {
        return olmax::chunked_cross_entropy(in[0], in[1], backend::trace::as_indices(in[2]), {.z_loss = a.z_loss, .chunk_tokens = 3});
    }
};

}  // namespace op

}  // namespace olmax
