#pragma once
// Strategy tags of olmax::scan::scan. Swap the tag to compare strategies in one line:
//
//     auto h = olmax::scan::scan<olmax::scan::chunked_matmul<128>>(gates, x, {.h0 = h0});
//
// Error bounds below are normwise, max|h - h_fp64| / max|h_fp64| over the tensor, for gates in
// [0, 1] (products of gates never grow), measured by tests/unit/test_scan.cpp against
// sequential_fp64: fp32 strategies stay below 1e-5 for T <= 4097, double ones below 1e-12.
// Every strategy computes in fp32 for float tensors (fp64 where stated) and runs with
// flush-to-zero/denormals-are-zero set inside its kernels.

#include <cstddef>
#include <string_view>

namespace olmax::scan {

/// The reference loop, one step after another (T - 1 FMAs per row). Error: sum over steps of one
/// rounding each, O(T eps) worst case.
struct sequential {
    static constexpr std::string_view name = "sequential";
};

/// The sequential loop accumulating in double for any storage type: the ground truth of tests.
/// Error: one final rounding to the storage type (for float), O(T eps_64) otherwise.
struct sequential_fp64 {
    static constexpr std::string_view name = "sequential_fp64";
};

/// The fastest CPU form for many rows: sequential in time, vectorised across spans of up to 2048
/// contiguous channels ([B, T, C]) or 16 interleaved rows ([B, C, T]), parallel over batch x
/// channel spans; fused one-pass backward (3 reads, 2 writes per element). Same rounding as
/// sequential.
/// Gates shared across channels fall back to the tile engine.
struct sequential_vectorized {
    static constexpr std::string_view name = "sequential_vectorized";
};

/// Time-parallel, cache-partitioned two-pass scan for few long rows (reduce-then-scan on
/// L2-sized rounds; rows with adjacent steps run in-register 16-step block scans, others eight
/// interleaved chains per thread); fused backward. Error: the sequential bound plus one
/// re-association per segment boundary and O(log 16 eps) inside a block.
struct two_pass {
    static constexpr std::string_view name = "two_pass";
};

/// The original Olmax log-depth loop (x += shift(x) a; a *= shift(a)) with ceil(log2 T) doubling
/// steps, O(T log T) work. Error: O(log T eps) (tree re-association).
struct hillis_steele {
    static constexpr std::string_view name = "hillis_steele";
};

/// The "Faster QRNN" variant: the first log2(K) doubling steps replaced by one O(T) in-chunk
/// prefix pass, then doubling at offsets K, 2K, ... over the ceil(T/K) chunk ends, and one fix-up
/// pass: O(T + (T/K) log(T/K)) work. Error: O((K + log T) eps).
template <std::size_t K = 128>
struct hillis_steele_chunked {
    static_assert(K > 0, "olmax::scan::hillis_steele_chunked: chunk size must be positive");
    static constexpr std::string_view name = "hillis_steele_chunked";
    static constexpr std::size_t chunk = K;
};

/// Work-efficient Blelloch / Brent-Kung up-sweep and down-sweep, about 2T combines.
/// Error: O(log T eps).
struct blelloch {
    static constexpr std::string_view name = "blelloch";
};

/// The 128x128 triangular-matmul form: within a chunk h = L x + P h_prev. Per-channel gates build
/// one C x C matrix per channel per chunk in thread-local scratch (matrix-vector work, 2C flops per
/// element); gates shared by a head of P channels (gates [B, T, H], C = H P) run one real GEMM per
/// head and chunk through the device's GEMM in the forward (the backward of shared gates is the sequential
/// tile scan for every strategy; detail/dispatch.hpp says why). Error: O(C eps) per chunk plus the
/// carry chain.
template <std::size_t C = 128>
struct chunked_matmul {
    static_assert(C > 0, "olmax::scan::chunked_matmul: chunk size must be positive");
    static constexpr std::string_view name = "chunked_matmul";
    static constexpr std::size_t chunk = C;
};

/// Heinsen's log-space form (cumulative log gates and logcumsumexp, sign-split for real x),
/// chunk-local over 64 steps, computed in double. Needs gates >= 0 (negative gates give NaN).
/// Error: O(|log h| eps_64) per element plus the final rounding.
struct log_space {
    static constexpr std::string_view name = "log_space";
    static constexpr std::size_t chunk = 64;
};

}  // namespace olmax::scan
