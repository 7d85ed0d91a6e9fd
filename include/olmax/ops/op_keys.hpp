#pragma once
// The registry of olmax's traced ops: one typed key per op that has a lowering rule
// (backend/trace_rules.hpp says how an op reaches its rule through its key on traced inputs).
//
// An op's key is one struct in namespace olmax::op, defined in the op's header right after the op
// (docs/ARCHITECTURE.md, "Adding an op"):
//
//     struct slice : registered<slice> {
//         static constexpr std::string_view name = "slice";
//         struct attrs { std::size_t axis = 0, begin = 0, end = 0; };            // the rule's arguments, typed
//         static std::vector<sample<attrs>> samples(Generator& rng);            // inputs for the eager-traced check
//         template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs& a) {
//             return olmax::slice(in[0], long(a.axis), a.begin, a.end);         // the op itself
//         }
//     };
//
// and the op returns through it: `on.run<op::slice>({x}, {.axis = a, ...}, [&] { ...kernels... })`.
// Its rule is `lower(op::slice, ...)` in olmax/trace/rules.hpp. The key's base fails to compile
// unless the key is an entry of `op::all` below, and trace/rules.hpp fails to compile unless every
// entry has a rule there: so every op of olmax that runs through a key has a rule, and the
// one generic test (tests/unit/test_op_rules.cpp) finds every op in the registry with its samples
// and eager form, and checks it.

#include <cstddef>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "olmax/backend/trace_rules.hpp"
#include "olmax/core/random.hpp"
#include "olmax/core/tensor.hpp"

namespace olmax::op {

template <class... K>
struct key_list {
    static constexpr std::size_t size = sizeof...(K);
};

/// THE REGISTRY: every op of olmax that has a lowering rule, one entry each. An entry declares its
/// key (the elaborated `struct name` declares olmax::op::name here), which the op's header defines.
using all = key_list<
    struct add, struct sub, struct mul, struct div, struct maximum, struct minimum,                          // ops/elementwise.hpp
    struct exp, struct log, struct sqrt, struct rsqrt, struct square, struct tanh, struct sigmoid, struct relu,
    struct hard_sigmoid, struct silu, struct softplus, struct abs, struct mish, struct gelu, struct elephant, struct add_scalar, struct scale,
    struct leaky_relu, struct clamp, struct nonzero,
    struct sum, struct mean, struct max,                                                                     // ops/reduction.hpp
    struct matmul, struct contract_axis,                                                                     // ops/linalg.hpp
    struct reshape, struct transpose, struct slice, struct pad, struct concat, struct stack_leading,          // ops/shape.hpp
    struct embedding,                                                                                        // ops/embedding.hpp
    struct causal_conv1d,                                                                                    // ops/conv.hpp
    struct scale_norm, struct rms_norm,                                                                      // ops/norm.hpp
    struct softmax, struct logsumexp, struct log_softmax, struct cross_entropy, struct chunked_cross_entropy,                  // ops/loss.hpp
    struct gather_rows, struct scatter_rows,                                                                 // ops/gather.hpp
    struct linear_scan,                                                                                      // scan/scan.hpp
    struct matrix_scan,                                                                                      // scan/matrix_scan.hpp
    struct selective_scan,                                                                                   // scan/selective_scan.hpp
    struct take_leading,                                                                                     // nn/views.hpp
    struct moe_route>;                                                                                       // nn/moe.hpp

template <class K, class... Ks>
consteval bool listed(key_list<Ks...>) {
    return (std::is_same_v<K, Ks> || ...);
}

/// The base of every key of olmax: fails to compile when K is not an entry of op::all.
template <class K>
struct registered {
    static_assert(listed<K>(all{}), "olmax: an op key missing from the registry op::all (ops/op_keys.hpp)");
};

using backend::trace::sample;

/// Helpers of the keys' samples: host float32 values exactly representable, so that the eager
/// reference in double and the traced program see the same numbers.
namespace samples {

/// Values uniform in [lo, hi).
inline Tensor<float> uniform(Generator& rng, const Shape& shape, float lo = -2.0f, float hi = 2.0f) { return rand<float>(shape, rng, lo, hi); }

/// Values uniform in [lo, hi) with a random sign (away from zero: a divisor, an input of log).
inline Tensor<float> signed_away_from_zero(Generator& rng, const Shape& shape, float lo = 0.5f, float hi = 2.0f) {
    Tensor<float> t = uniform(rng, shape, lo, hi);
    for (std::size_t i = 0; i < t.size(); ++i)
        if (rng.uniform() < 0.5) t.data()[i] = -t.data()[i];
    return t;
}

/// Integers in [0, n) held as float32 values (token ids, row numbers).
inline Tensor<float> indices(Generator& rng, const Shape& shape, std::size_t n) {
    Tensor<float> t(shape);
    for (std::size_t i = 0; i < t.size(); ++i) t.data()[i] = float(std::size_t(rng.uniform() * double(n)) % n);
    return t;
}

/// 0 / 1 values, 1 with probability p (a mask, document starts).
inline Tensor<float> bits(Generator& rng, const Shape& shape, double p) {
    Tensor<float> t(shape);
    for (std::size_t i = 0; i < t.size(); ++i) t.data()[i] = rng.uniform() < p ? 1.0f : 0.0f;
    return t;
}

/// An element-wise op of one input: shapes [5], [3, 4] and [2, 3, 4], values in [lo, hi).
template <class Attrs>
std::vector<sample<Attrs>> unary(Generator& rng, float lo, float hi, Attrs attrs = {}) {
    std::vector<sample<Attrs>> out;
    for (const Shape& shape : {Shape{5}, Shape{3, 4}, Shape{2, 3, 4}}) out.push_back({{uniform(rng, shape, lo, hi)}, attrs});
    return out;
}

/// A broadcasting element-wise op of two inputs: equal shapes, a trailing suffix on either side,
/// extent-1 axes stretched on both, a scalar; the second input from `second`.
template <class Attrs, class Second>
std::vector<sample<Attrs>> binary(Generator& rng, Second second) {
    std::vector<sample<Attrs>> out;
    const std::pair<Shape, Shape> shapes[] = {{{3, 4}, {3, 4}}, {{2, 3, 4}, {4}}, {{4}, {2, 3, 4}}, {{3, 1}, {1, 4}}, {{2, 3, 4}, {2, 1, 4}}, {{3, 4}, {}}};
    for (const auto& [a, b] : shapes) out.push_back({{uniform(rng, a), second(rng, b)}});
    return out;
}

}  // namespace samples

}  // namespace olmax::op
