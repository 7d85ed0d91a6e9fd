#pragma once
// One 64-byte vector of consecutive time steps of a single row, scanned in registers.
//
// A row whose steps are adjacent in memory (C = 1 in [B, T, C], any row of [B, C, T]) cannot be
// vectorised across channels, and one scalar FMA chain per row is latency-bound (4 cycles per
// step). Here a vector of N consecutive steps is scanned in place by log2(N) Hillis-Steele steps
// on lane shifts (lane i takes the composition of lanes i-d .. i), after which lane i holds the
// block's affine map up to step i: h_i = x_i + a_i h_in. Only the carry h_in -> h_{N-1} remains
// serial: one FMA and one lane broadcast per N steps.
//
// Written with the GCC/Clang vector extensions (`vector_size`, `__builtin_shufflevector`, GCC >= 12
// or Clang), which lower to AVX-512, AVX2 or SSE as the target allows; other compilers, and types
// other than float and double (and bfloat16 storage of float blocks), use the scalar kernels
// (`block_storage_available` is false).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "olmax/core/bfloat16.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace olmax::scan::detail {

#if (defined(__GNUC__) && __GNUC__ >= 12) || defined(__clang__)

template <class Acc>
inline constexpr bool block_scan_available = std::is_same_v<Acc, float> || std::is_same_v<Acc, double>;

/// Whether blocks of Acc can be loaded from and stored to storage of type T: the same type, or
/// bfloat16 storage with float blocks.
template <class T, class Acc>
inline constexpr bool block_storage_available =
    block_scan_available<Acc> && (std::is_same_v<T, Acc> || (std::is_same_v<T, bfloat16> && std::is_same_v<Acc, float>));

typedef float block_f32 __attribute__((vector_size(64)));
typedef double block_f64 __attribute__((vector_size(64)));

template <class Acc>
using block_of = std::conditional_t<std::is_same_v<Acc, float>, block_f32, block_f64>;

/// Lanes of a block: 16 floats or 8 doubles.
template <class Acc>
inline constexpr std::size_t block_lanes = 64 / sizeof(Acc);

// Vectors are passed by reference throughout: 64-byte vector parameters and return values change
// the calling convention with the target's ISA (GCC's -Wpsabi), references do not.

/// out: lane i <- lane i - D of v (lanes below D take `fill`, whose lanes are all equal). Written
/// as a window of the concatenation (fill, v) so it lowers to one lane-align (valignd).
template <std::size_t D, class V, std::size_t... I>
[[gnu::always_inline]] inline void block_shift(const V& v, const V& fill, V& out, std::index_sequence<I...>) {
    out = __builtin_shufflevector(fill, v, int(sizeof...(I) - D + I)...);
}

template <class V, std::size_t... I>
[[gnu::always_inline]] inline void block_reverse(V& v, std::index_sequence<I...>) {
    v = __builtin_shufflevector(v, v, int(sizeof...(I) - 1 - I)...);
}

/// Loads the N processing steps that start at `p`: p, p+1, ... (ascending) or p, p-1, ...
/// (descending, i.e. the memory p-N+1 .. p in reversed lane order).
template <bool Descending, class Acc>
[[gnu::always_inline]] inline void load_steps(const Acc* p, block_of<Acc>& v) {
    constexpr std::size_t N = block_lanes<Acc>;
    std::memcpy(&v, Descending ? p - (N - 1) : p, sizeof v);
    if constexpr (Descending) block_reverse(v, std::make_index_sequence<N>{});
}

template <bool Descending, class Acc>
[[gnu::always_inline]] inline void store_steps(Acc* p, const block_of<Acc>& v) {
    constexpr std::size_t N = block_lanes<Acc>;
    block_of<Acc> w = v;
    if constexpr (Descending) block_reverse(w, std::make_index_sequence<N>{});
    std::memcpy(Descending ? p - (N - 1) : p, &w, sizeof w);
}

// bfloat16 storage with float blocks: 16 steps are 32 bytes, widened exactly on load (the bits
// shifted into a float's upper half) and rounded to nearest even on store, lane-wise as
// bfloat16::round_bits does (NaN stays a quiet NaN).
typedef std::uint16_t block_bf16_bits __attribute__((vector_size(32)));
typedef std::uint32_t block_f32_bits __attribute__((vector_size(64)));

template <bool Descending>
[[gnu::always_inline]] inline void load_steps(const bfloat16* p, block_f32& v) {
#if defined(__AVX512F__)
    // One zero-extending widen of all 16 lanes (GCC splits the generic conversion in two halves).
    const __m512i wide = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(Descending ? p - 15 : p))), 16);
#else
    block_bf16_bits bits;
    std::memcpy(&bits, Descending ? p - 15 : p, sizeof bits);
    const block_f32_bits wide = __builtin_convertvector(bits, block_f32_bits) << 16;
#endif
    std::memcpy(&v, &wide, sizeof v);
    if constexpr (Descending) block_reverse(v, std::make_index_sequence<16>{});
}

template <bool Descending>
[[gnu::always_inline]] inline void store_steps(bfloat16* p, const block_f32& v) {
    block_f32 w = v;
    if constexpr (Descending) block_reverse(w, std::make_index_sequence<16>{});
#if defined(__AVX512BF16__)
    // vcvtneps2bf16: the same rounding in one instruction (NaN quieted the same way; it reads a
    // denormal as zero, and the scan kernels store none: they run with denormals flushed,
    // denormals.hpp).
    __m512 in;
    std::memcpy(&in, &w, sizeof in);
    const __m256bh bits = _mm512_cvtneps_pbh(in);
#else
    block_f32_bits u;
    std::memcpy(&u, &w, sizeof u);
    const block_f32_bits rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    const block_f32_bits nan = (u & 0x7FFFFFFFu) > 0x7F800000u;  // lanes all ones where NaN
    const block_f32_bits result = (rounded & ~nan) | (((u >> 16) | 0x0040u) & nan);
    const block_bf16_bits bits = __builtin_convertvector(result, block_bf16_bits);
#endif
    std::memcpy(static_cast<void*>(Descending ? p - 15 : p), &bits, sizeof bits);
}

/// One Hillis-Steele step at lane offset D: (a_i, x_i) <- (a_i a_{i-D}, x_i + a_i x_{i-D}).
template <std::size_t D, class V>
[[gnu::always_inline]] inline void block_doubling_step(V& a, V& x, const V& zero, const V& one) {
    constexpr auto lanes = std::make_index_sequence<sizeof(V) / sizeof(a[0])>{};
    V shifted;
    block_shift<D>(x, zero, shifted, lanes);
    x += a * shifted;
    block_shift<D>(a, one, shifted, lanes);
    a *= shifted;
}

/// In place: x_i <- x_i + a_i x_{i-1} + ... (the scan of the block from a zero state), a_i <- a_0 ... a_i.
/// Always inlined: an out-of-line call spills both vectors and costs more than the scan (measured).
template <class Acc>
[[gnu::always_inline]] inline void scan_block(block_of<Acc>& a, block_of<Acc>& x) {
    using V = block_of<Acc>;
    const V zero{}, one = zero + Acc(1);
    block_doubling_step<1>(a, x, zero, one);
    block_doubling_step<2>(a, x, zero, one);
    block_doubling_step<4>(a, x, zero, one);
    if constexpr (block_lanes<Acc> > 8) block_doubling_step<8>(a, x, zero, one);
}

/// Loads the N steps of gates and values that start at the given pointers (see load_steps) and
/// scans them: on return lane i holds the block's map up to step i.
template <bool Descending, class Acc, class T>
[[gnu::always_inline]] inline void load_and_scan_block(const T* gates, const T* values, block_of<Acc>& a, block_of<Acc>& x) {
    load_steps<Descending>(gates, a);
    load_steps<Descending>(values, x);
    scan_block<Acc>(a, x);
}

#else

template <class Acc>
inline constexpr bool block_scan_available = false;
template <class T, class Acc>
inline constexpr bool block_storage_available = false;

#endif

}  // namespace olmax::scan::detail
