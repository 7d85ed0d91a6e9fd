#pragma once
// Masks for the composed (traced) forms of the sequence ops: triangles and the identity as
// constants of a program (for chunk-sized squares), masks over a whole sequence computed inside it
// from positions (an O(T) constant), and packed-document masks computed inside it from resets
// [batch, T] (taken as 0/1 values by start_flags, 1 where a document starts). Traced attention
// masks future keys and keys of earlier documents, traced RoPE restarts its positions, and the
// traced SSD and gated delta rule zero every decay that spans a start. The masks over a whole
// sequence put no [T, T] constant into a program: at T = 4096 one would be 16.7 M numbers of
// program text (`triangle` is for chunk-sized squares).

#include <cstddef>

#include "olmax/backend/trace_rules.hpp"
#include "olmax/core/device.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/linalg.hpp"
#include "olmax/ops/shape.hpp"

namespace olmax::masks {

enum class Triangle {
    upper,           ///< row <= column: v U is the inclusive cumulative sum of a row vector v
    lower,           ///< column <= row: the causal mask
    strictly_lower,  ///< column < row
};

/// [n, n]: 1 on the triangle, 0 elsewhere. Made on the host, so that an op on traced tensors
/// reading it (through trace::in_program) captures it as a constant of the program.
template <Real T>
Tensor<T> triangle(std::size_t n, Triangle which) {
    device_scope on_host(Device::host());
    Tensor<T> m({n, n});
    for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < n; ++j) {
            const bool on = which == Triangle::upper ? i <= j : which == Triangle::lower ? j <= i : j < i;
            m.data()[i * n + j] = on ? T{1} : T{0};
        }
    return m;
}

/// [n, n]: the identity, made on the host like `triangle`.
template <Real T>
Tensor<T> identity(std::size_t n) {
    device_scope on_host(Device::host());
    Tensor<T> m({n, n});
    for (std::size_t i = 0; i < n; ++i) m.data()[i * n + i] = T{1};
    return m;
}

/// min(v, 1) for v >= 0.
template <Real T>
Tensor<T> at_most_one(const Tensor<T>& v) {
    return sub(v, relu(add_scalar(v, T{-1})));
}

/// 1 where a whole count >= 0 is 0, else 0 (relu(1 - count)): "no document starts in the span"
/// for a count of starts.
template <Real T>
Tensor<T> is_zero_count(const Tensor<T>& count) {
    return relu(add_scalar(neg(count), T{1}));
}

/// 0, 1, ..., n - 1 as a [1, n] host tensor: read through trace::in_program, a constant of O(n).
/// Whole numbers, exact in float up to 2^24.
template <Real T>
Tensor<T> positions(std::size_t n) {
    device_scope on_host(Device::host());
    Tensor<T> p({1, n});
    for (std::size_t i = 0; i < n; ++i) p.data()[i] = T(i);
    return p;
}

/// [n, n], 1 where key s is hidden from query t (row t, column s) under causal attention with a
/// sliding window of `window` keys (0: none): s > t, or t - s >= window. Computed in the program
/// from positions, so its only constant has n numbers.
template <Real T>
Tensor<T> hidden_keys(std::size_t n, std::size_t window) {
    const Tensor<T> pos = backend::trace::in_program(positions<T>(n));
    const Tensor<T> ahead = sub(pos, reshape(pos, Shape{n, 1}));  // [t, s]: s - t
    Tensor<T> hidden = at_most_one(relu(ahead));
    if (window > 0) hidden = add(hidden, at_most_one(relu(add_scalar(neg(ahead), T(1) - T(window)))));  // t - s >= window
    return hidden;
}

/// Inclusive running sum (op = add) or maximum (op = maximum) along the last axis, in log2(n)
/// rounds of y = op(y, y shifted by 2^k) (Hillis & Steele 1986: each round a slice, a pad and the
/// op), so that a program holds no [n, n] constant. The shift fills with 0: for the maximum, the
/// values must be >= 0. Exact for whole numbers below 2^24 in float.
template <Real T, class Op>
Tensor<T> running(const Tensor<T>& x, Op op) {
    const std::size_t axis = x.rank() - 1, n = x.extent(axis);
    Tensor<T> y = x;
    for (std::size_t shift = 1; shift < n; shift *= 2) y = op(y, pad(slice(y, long(axis), 0, n - shift), long(axis), shift, 0));
    return y;
}

/// Resets [batch, T] as 0/1 values (1 where resets != 0), in the program (host resets become a
/// constant of it): the traced forms count and compare starts, so a start marked 2 or -1, which
/// the eager ops read as a start, must count once.
template <Real T>
Tensor<T> start_flags(const Tensor<T>& resets) {
    return nonzero(backend::trace::in_program(resets)).detach();
}

/// Document ids d [batch, T]: the number of document starts at or before t (a running sum of the
/// resets).
template <Real T>
Tensor<T> document_ids(const Tensor<T>& resets) {
    return running(resets, [](const Tensor<T>& a, const Tensor<T>& b) { return add(a, b); });
}

/// The first step of t's document [batch, T]: the last s <= t with a reset there (a running maximum
/// of s resets_s), 0 when there is none.
template <Real T>
Tensor<T> document_starts(const Tensor<T>& resets) {
    const Tensor<T> starts = mul(resets, backend::trace::in_program(positions<T>(resets.extent(1))));
    return running(starts, [](const Tensor<T>& a, const Tensor<T>& b) { return maximum(a, b); });
}

/// [batch, T, T] from document ids: 1 where step s lies in an earlier document than step t,
/// min(relu(d_t - d_s), 1); 0 within t's document and for every s after t.
template <Real T>
Tensor<T> earlier_document(const Tensor<T>& ids) {
    const std::size_t nb = ids.extent(0), nt = ids.extent(1);
    return at_most_one(relu(sub(reshape(ids, Shape{nb, nt, 1}), reshape(ids, Shape{nb, 1, nt}))));
}

}  // namespace olmax::masks
