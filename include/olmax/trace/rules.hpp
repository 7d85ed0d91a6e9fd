#pragma once
// The ops' lowering rules: for each op that can run inside a traced program, its value in the
// traced primitives (primitives.hpp), whose recorded gradients make the op's backward. One rule per
// op serves every program and every layer built from the op; an op missing here fails at trace
// time with a `trace_error` naming it (backend/trace_rules.hpp).
//
// The rules are registered when this header is included (a program that never traces includes
// none of it). Attributes follow each op's call of `backend::trace::call` in ops/.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "olmax/backend/trace_rules.hpp"
#include "olmax/trace/primitives.hpp"

namespace olmax::trace {

namespace detail {

namespace p = primitives;
using backend::trace::attributes;
using Ts = std::span<const Tensor<float>>;
using Out = std::vector<Tensor<float>>;

/// The numpy broadcast of two shapes (the eager ops have checked that they broadcast).
inline Shape broadcast_shape(const Shape& a, const Shape& b) {
    const std::size_t rank = std::max(a.size(), b.size());
    Shape out(rank, 1);
    for (std::size_t i = 0; i < rank; ++i) {
        const std::size_t da = i + a.size() >= rank ? a[i + a.size() - rank] : 1, db = i + b.size() >= rank ? b[i + b.size() - rank] : 1;
        check<shape_error>(da == db || da == 1 || db == 1, "trace: shapes ", to_string(a), " and ", to_string(b), " do not broadcast");
        out[i] = da == 1 ? db : da;
    }
    return out;
}

template <class F>
void binary(std::string_view name, F f) {
    backend::trace::register_rule(name, [f](Ts in, const attributes&) -> Out {
        const Shape shape = broadcast_shape(in[0].shape(), in[1].shape());
        return {f(p::broadcast_to(in[0], shape), p::broadcast_to(in[1], shape))};
    });
}

template <class F>
void unary(std::string_view name, F f) {
    backend::trace::register_rule(name, [f](Ts in, const attributes&) -> Out { return {f(in[0])}; });
}

/// Mean softmax cross-entropy of logits [N, V] against targets [N] (float32 class ids), plus
/// z_loss * mean(lse^2): the eager op's value, whose gradient the primitives' rules give.
inline Tensor<float> cross_entropy(const Tensor<float>& logits, const Tensor<float>& targets, double z_loss) {
    const std::size_t n = logits.shape()[0], vocab = logits.shape()[1];
    const Tensor<float> m = p::max_last_detached(logits);
    const Tensor<float> shifted = p::sub(logits, p::broadcast_to(m, logits.shape()));
    const Tensor<float> lse = p::add(p::log(p::sum(p::exp(shifted), {1}, true)), m);  // [N, 1]
    const Tensor<float> picked = p::sum(p::mul(logits, p::one_hot(targets, vocab)), {1}, true);
    Tensor<float> per_row = p::sub(lse, picked);
    if (z_loss != 0) per_row = p::add(per_row, p::scale(p::mul(lse, lse), z_loss));
    return p::scale(p::sum(per_row, {0, 1}, false), 1.0 / double(n));
}

inline bool register_all() {
    using Tf = Tensor<float>;
    binary("add", [](const Tf& a, const Tf& b) { return p::add(a, b); });
    binary("sub", [](const Tf& a, const Tf& b) { return p::sub(a, b); });
    binary("mul", [](const Tf& a, const Tf& b) { return p::mul(a, b); });
    binary("div", [](const Tf& a, const Tf& b) { return p::div(a, b); });
    binary("maximum", [](const Tf& a, const Tf& b) { return p::maximum(a, b); });
    unary("exp", [](const Tf& x) { return p::exp(x); });
    unary("log", [](const Tf& x) { return p::log(x); });
    unary("sqrt", [](const Tf& x) { return p::sqrt(x); });
    unary("rsqrt", [](const Tf& x) { return p::div(p::full(x.shape(), 1.0), p::sqrt(x)); });
    unary("square", [](const Tf& x) { return p::mul(x, x); });
    unary("tanh", [](const Tf& x) { return p::tanh(x); });
    unary("sigmoid", [](const Tf& x) { return p::logistic(x); });
    unary("relu", [](const Tf& x) { return p::maximum(x, p::full(x.shape(), 0.0)); });
    // The rank-0 sum and mean (a sum over no axes) are the identity.
    unary("sum", [](const Tf& x) { return x; });
    unary("mean", [](const Tf& x) { return x; });
    backend::trace::register_rule("add_scalar", [](Ts in, const attributes& a) -> Out { return {p::add_scalar(in[0], a.reals.at(0))}; });
    backend::trace::register_rule("scale", [](Ts in, const attributes& a) -> Out { return {p::scale(in[0], a.reals.at(0))}; });
    // sum / mean: ints = keepdims, then the reduced axes (increasing).
    auto reduction = [](bool average) {
        return [average](Ts in, const attributes& a) -> Out {
            const bool keepdims = a.ints.at(0) != 0;
            const std::vector<std::int64_t> axes(a.ints.begin() + 1, a.ints.end());
            Tensor<float> y = p::sum(in[0], axes, keepdims);
            if (!average) return {y};
            double count = 1;
            for (auto axis : axes) count *= double(in[0].shape()[std::size_t(axis)]);
            return {p::scale(y, count > 0 ? 1.0 / count : std::nan(""))};
        };
    };
    backend::trace::register_rule("sum", reduction(false));
    backend::trace::register_rule("mean", reduction(true));
    backend::trace::register_rule("reshape", [](Ts in, const attributes& a) -> Out { return {p::reshape(in[0], Shape(a.ints.begin(), a.ints.end()))}; });
    backend::trace::register_rule("transpose", [](Ts in, const attributes& a) -> Out { return {p::transpose(in[0], a.ints)}; });
    // matmul: [..., m, k] x [k, n] (the leading axes folded into m). The batched form has no rule yet.
    backend::trace::register_rule("matmul", [](Ts in, const attributes&) -> Out {
        const Tf &a = in[0], &b = in[1];
        check<trace_error>(b.rank() == 2 && a.rank() >= 2, "olmax: matmul: the traced program has no rule for a batched product (",
                           to_string(a.shape()), " x ", to_string(b.shape()), ") yet");
        const std::size_t k = a.shape().back(), rows = a.size() / (k ? k : 1);
        Shape out = a.shape();
        out.back() = b.shape()[1];
        return {p::reshape(p::matmul(p::reshape(a, {rows, k}), b), out)};
    });
    // cross_entropy: logits, targets (float32 ids); reals = z_loss.
    backend::trace::register_rule("cross_entropy", [](Ts in, const attributes& a) -> Out {
        return {cross_entropy(in[0], in[1], a.reals.at(0))};
    });
    // embedding: table [V, F], ids (float32, any shape) -> ids.shape + [F], as one-hot rows times the table.
    backend::trace::register_rule("embedding", [](Ts in, const attributes&) -> Out {
        const Tf &table = in[0], &ids = in[1];
        const std::size_t vocab = table.shape()[0], features = table.shape()[1], n = ids.size();
        const Tf rows = p::matmul(p::reshape(p::one_hot(ids, vocab), {n, vocab}), table);
        Shape out = ids.shape();
        out.push_back(features);
        return {p::reshape(rows, out)};
    });
    return true;
}

}  // namespace detail

/// Set when this header is included: the rules are registered once per process, before main.
inline const bool rules_registered = detail::register_all();

}  // namespace olmax::trace
