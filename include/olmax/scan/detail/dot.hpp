#pragma once
// The dot product the scans' element-wise passes share (scan::ssd, scan::gated_delta_rule). Long
// sums (a whole state, K V or P N values) run in four vector-wide partial sums: one FMA chain is
// bound by the FMA's latency (4 cycles a 16-float vector on AVX-512), ~1,000 cycles over a 64 x 64
// state against ~150 for the loads. Short ones (a row of 64) run in one chain: there the extra
// partial sums' set-up and final adds cost more than the latency they hide.

#include <cstddef>

namespace olmax::scan::detail {

/// sum_i a[i] b[i] over n values.
template <class T>
T dot(const T* a, const T* b, std::size_t n) {
    constexpr std::size_t W = 64 / sizeof(T);  // one cache line: a vector on AVX-512
    T sum{0};
    std::size_t i = 0;
    if (n >= 16 * W) {
        T part[4][W] = {};
        for (; i + 4 * W <= n; i += 4 * W)
#pragma GCC unroll 4
            for (std::size_t u = 0; u < 4; ++u)
#pragma omp simd
                for (std::size_t l = 0; l < W; ++l) part[u][l] += a[i + u * W + l] * b[i + u * W + l];
#pragma omp simd reduction(+ : sum)
        for (std::size_t l = 0; l < W; ++l) sum += (part[0][l] + part[1][l]) + (part[2][l] + part[3][l]);
    }
#pragma omp simd reduction(+ : sum)
    for (std::size_t j = i; j < n; ++j) sum += a[j] * b[j];
    return sum;
}

}  // namespace olmax::scan::detail
