#pragma once
// The dot product the scans' element-wise passes share (scan::ssd, scan::gated_delta_rule), most
// often over a row of 64 values (a head's P or N), tens of thousands of times per call. It runs in
// four vector-wide partial sums (one FMA chain would wait on the FMA's latency, 4 cycles a vector
// on AVX-512) and ends in one horizontal add of vectors. An `omp simd reduction` ended GCC 12's
// loop in a chain of one scalar add per lane through the stack: a third of this function's
// samples under perf, in scan::ssd's backward on a Zen 4.

#include <cstddef>

#include "olmax/detail/simd.hpp"

namespace olmax::scan::detail {

/// sum_i a[i] b[i] over n values.
template <class T>
T dot(const T* a, const T* b, std::size_t n) {
    using batch = xsimd::batch<T>;
    constexpr std::size_t W = batch::size;
    std::size_t i = 0;
    T sum{0};
    if (n >= W) {
        batch s0(T{0}), s1(T{0}), s2(T{0}), s3(T{0});
        for (; i + 4 * W <= n; i += 4 * W) {
            s0 = xsimd::fma(batch::load_unaligned(a + i), batch::load_unaligned(b + i), s0);
            s1 = xsimd::fma(batch::load_unaligned(a + i + W), batch::load_unaligned(b + i + W), s1);
            s2 = xsimd::fma(batch::load_unaligned(a + i + 2 * W), batch::load_unaligned(b + i + 2 * W), s2);
            s3 = xsimd::fma(batch::load_unaligned(a + i + 3 * W), batch::load_unaligned(b + i + 3 * W), s3);
        }
        for (; i + W <= n; i += W) s0 = xsimd::fma(batch::load_unaligned(a + i), batch::load_unaligned(b + i), s0);
        sum = xsimd::hadd((s0 + s1) + (s2 + s3));
    }
    for (; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

}  // namespace olmax::scan::detail
