#pragma once
// Packed documents in the ops' traced forms (compositions of ops, so they run inside a program):
// resets [batch, T], read as 0/1 values (1 where a document starts), become document ids and an
// "earlier document" indicator. Traced attention masks keys with it; traced RoPE restarts its
// positions by it.

#include <cstddef>

#include "olmax/backend/trace_rules.hpp"
#include "olmax/core/device.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/linalg.hpp"
#include "olmax/ops/shape.hpp"

namespace olmax::detail::document_ops {

/// min(v, 1) for v >= 0.
template <Real T>
Tensor<T> at_most_one(const Tensor<T>& v) {
    return sub(v, relu(add_scalar(v, T{-1})));
}

/// Document ids d [batch, T]: the number of document starts at or before t, d = resets U with
/// U[s, t] = 1 for s <= t (a constant of the program).
template <Real T>
Tensor<T> ids(const Tensor<T>& resets) {
    const std::size_t nt = resets.extent(1);
    Tensor<T> upper;
    {
        device_scope host(Device::host());  // built on the host, then captured
        upper = Tensor<T>({nt, nt});
        for (std::size_t s = 0; s < nt; ++s)
            for (std::size_t t = s; t < nt; ++t) upper.data()[s * nt + t] = T{1};
    }
    return matmul(resets, backend::trace::in_program(upper));
}

/// [batch, T, T] from document ids: 1 where step s lies in an earlier document than step t,
/// min(relu(d_t - d_s), 1); 0 within t's document and for every s after t.
template <Real T>
Tensor<T> earlier(const Tensor<T>& ids) {
    const std::size_t nb = ids.extent(0), nt = ids.extent(1);
    return at_most_one(relu(sub(reshape(ids, Shape{nb, nt, 1}), reshape(ids, Shape{nb, 1, nt}))));
}

}  // namespace olmax::detail::document_ops
