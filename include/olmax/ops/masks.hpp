#pragma once
// Masks for the composed (traced) forms of the sequence ops: triangles as constants of a program,
// and packed-document masks computed inside it from resets [batch, T] (0/1 values, 1 where a
// document starts). Traced attention masks keys of earlier documents, traced RoPE restarts its
// positions, and the traced SSD and gated delta rule zero every decay that spans a start.

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

/// Document ids d [batch, T]: the number of document starts at or before t, d = resets U.
template <Real T>
Tensor<T> document_ids(const Tensor<T>& resets) {
    return matmul(resets, backend::trace::in_program(triangle<T>(resets.extent(1), Triangle::upper)));
}

/// [batch, T, T] from document ids: 1 where step s lies in an earlier document than step t,
/// min(relu(d_t - d_s), 1); 0 within t's document and for every s after t.
template <Real T>
Tensor<T> earlier_document(const Tensor<T>& ids) {
    const std::size_t nb = ids.extent(0), nt = ids.extent(1);
    return at_most_one(relu(sub(reshape(ids, Shape{nb, nt, 1}), reshape(ids, Shape{nb, 1, nt}))));
}

}  // namespace olmax::masks
