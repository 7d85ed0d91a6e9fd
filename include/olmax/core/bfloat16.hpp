#pragma once
// `bfloat16`: the upper 16 bits of an IEEE binary32 (1 sign, 8 exponent, 7 fraction bits), the
// storage type of mixed precision. It has float32's exponent, hence its range (no loss scaling is
// needed, unlike fp16), and 8 significant bits. It is a storage type: arithmetic on it converts to
// float (exactly) and computes there; olmax accumulates every reduction and GEMM in fp32 or wider.
//
// Conversions into bfloat16 round to nearest, ties to even (what AVX512-BF16's vcvtneps2bf16, AMX,
// TPUs, jax and PyTorch do); NaN stays a (quiet) NaN with its sign, infinities stay infinite, and
// finite values past the largest bfloat16 round to infinity. They are explicit, because they lose
// precision; the conversion to float is implicit, because it is exact.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace olmax {

class bfloat16 {
public:
    /// Uninitialised, like a float (so tensors of it can be allocated without a fill).
    bfloat16() = default;

    /// The nearest bfloat16 (ties to even). A double or a 64-bit integer is rounded once, not
    /// twice: double -> float rounds to odd, which keeps the bits a tie decision needs.
    template <class U>
        requires(std::is_arithmetic_v<U> && !std::is_same_v<U, bool>)
    constexpr explicit bfloat16(U value) noexcept : bits_(round(value)) {}

    /// Exact: every bfloat16 is a float.
    constexpr operator float() const noexcept { return std::bit_cast<float>(std::uint32_t(bits_) << 16); }

    /// The raw 16 bits (for storage and tests).
    constexpr std::uint16_t bits() const noexcept { return bits_; }
    static constexpr bfloat16 from_bits(std::uint16_t bits) noexcept {
        bfloat16 b;
        b.bits_ = bits;
        return b;
    }

    /// Round to nearest even of a float's bit pattern; NaN becomes quiet NaN with the same sign and
    /// leading payload bits. Branch-free on the finite path, so loops of it vectorise.
    static constexpr std::uint16_t round_bits(std::uint32_t u) noexcept {
        if ((u & 0x7FFFFFFFu) > 0x7F800000u) return std::uint16_t((u >> 16) | 0x0040u);
        return std::uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    }

private:
    template <class U>
    static constexpr std::uint16_t round(U value) noexcept {
        if constexpr (std::is_same_v<U, float>) return round_bits(std::bit_cast<std::uint32_t>(value));
        else if constexpr (std::is_floating_point_v<U> || sizeof(U) > 2)
            return round_bits(std::bit_cast<std::uint32_t>(to_float_round_odd(static_cast<double>(value))));
        else return round_bits(std::bit_cast<std::uint32_t>(static_cast<float>(value)));  // 8/16-bit integers are exact in float
    }

    /// The float nearest `d` toward zero, with the last bit set when that is inexact ("round to
    /// odd"). float has 16 more fraction bits than bfloat16, so rounding this result to nearest even
    /// gives what rounding `d` directly would have.
    static constexpr float to_float_round_odd(double d) noexcept {
        const float f = static_cast<float>(d);
        if (d != d || static_cast<double>(f) == d) return f;  // NaN or exact
        std::uint32_t u = std::bit_cast<std::uint32_t>(f);
        const double fd = static_cast<double>(f);
        if ((fd < 0 ? -fd : fd) > (d < 0 ? -d : d)) --u;  // rounded away from zero (or to infinity): step back
        return std::bit_cast<float>(u | 1u);
    }

    std::uint16_t bits_;
};

static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16> && std::is_trivially_default_constructible_v<bfloat16>);
static_assert(std::is_standard_layout_v<bfloat16>);

/// Element-wise float -> bfloat16 (round to nearest even) and back, written so that the compiler
/// vectorises them.
inline void to_bfloat16(const float* in, bfloat16* out, std::size_t n) noexcept {
#pragma omp simd
    for (std::size_t i = 0; i < n; ++i) out[i] = bfloat16::from_bits(bfloat16::round_bits(std::bit_cast<std::uint32_t>(in[i])));
}
/// Element-wise float -> nearest bfloat16 (ties to even) -> float: the value a bf16 matrix unit
/// computes with, kept in a float (the bf16 mixed-precision policy's portable operands).
inline void round_to_bfloat16(const float* in, float* out, std::size_t n) noexcept {
#pragma omp simd
    for (std::size_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(std::uint32_t(bfloat16::round_bits(std::bit_cast<std::uint32_t>(in[i]))) << 16);
}
inline void to_float(const bfloat16* in, float* out, std::size_t n) noexcept {
#pragma omp simd
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
}

}  // namespace olmax

template <>
struct std::numeric_limits<olmax::bfloat16> {
    using B = olmax::bfloat16;
    static constexpr bool is_specialized = true;
    static constexpr bool is_signed = true;
    static constexpr bool is_integer = false;
    static constexpr bool is_exact = false;
    static constexpr bool has_infinity = true;
    static constexpr bool has_quiet_NaN = true;
    static constexpr bool has_signaling_NaN = true;
    static constexpr std::float_denorm_style has_denorm = std::denorm_present;
    static constexpr bool has_denorm_loss = false;
    static constexpr std::float_round_style round_style = std::round_to_nearest;
    static constexpr bool is_iec559 = false;  // no IEEE interchange format of this width
    static constexpr bool is_bounded = true;
    static constexpr bool is_modulo = false;
    static constexpr int digits = 8;
    static constexpr int digits10 = 2;
    static constexpr int max_digits10 = 4;
    static constexpr int radix = 2;
    static constexpr int min_exponent = -125;
    static constexpr int min_exponent10 = -37;
    static constexpr int max_exponent = 128;
    static constexpr int max_exponent10 = 38;
    static constexpr bool traps = false;
    static constexpr bool tinyness_before = false;
    static constexpr B min() noexcept { return B::from_bits(0x0080); }
    static constexpr B lowest() noexcept { return B::from_bits(0xFF7F); }
    static constexpr B max() noexcept { return B::from_bits(0x7F7F); }
    static constexpr B epsilon() noexcept { return B::from_bits(0x3C00); }  // 2^-7
    static constexpr B round_error() noexcept { return B::from_bits(0x3F00); }  // 0.5
    static constexpr B infinity() noexcept { return B::from_bits(0x7F80); }
    static constexpr B quiet_NaN() noexcept { return B::from_bits(0x7FC0); }
    static constexpr B signaling_NaN() noexcept { return B::from_bits(0x7FA0); }
    static constexpr B denorm_min() noexcept { return B::from_bits(0x0001); }
};
