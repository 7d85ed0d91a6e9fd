#pragma once
// A register-blocked GEMM for the small row-major products that ops run per tile or per block on
// the calling thread (attention's tiles, the gated delta rule's WY blocks): sizes of 16-128, where
// a blocked GEMM's packing of both operands on every call costs more than it saves.
//
// C = alpha op(A) B + beta C (B row-major, op(A) read through its strides, so a transposed A costs
// nothing): a block of up to max_rows rows by max_vectors SIMD vectors of C stays in registers
// through the whole k loop, each step loading the block's vectors of one row of B and broadcasting
// one element of A per row; no packing. A step's loads bound it: on AVX-512 (32 registers) 6 x 4
// blocks (10 loads per 24 multiply-adds) ran ~1.2x as fast as 4 x 6 or 3 x 8 blocks with the same
// number of registers; 3 x 3 with 16 registers. At these sizes the scheme runs at 1.3-1.5x the
// GFLOPS of Eigen's blocked routine: 100-110 GFLOPS in cache on a Zen 5 core, whose measured peak
// is ~117 (one 16-wide FMA a cycle).
//
// small_gemm(trans_a, trans_b, ...) is the BLAS-like form; op(B) = B^T is copied transposed into a
// per-thread buffer first (small_gemm_transpose, W x W blocks transposed in registers), which a
// caller reusing one B^T for several products can do once itself.

#include <algorithm>
#include <array>
#include <cstddef>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "olmax/detail/simd.hpp"

namespace olmax::backend {

/// Where op(A) can be nonzero: A(i, p) = 0 for p < i - below and for p > i + above (a triangular
/// or banded A; `none` for no bound). Each block of rows runs only the steps p where its rows of A
/// can be nonzero. `lower_c`: only C's lower triangle (C(i, j) for j <= i) is wanted; each block of
/// rows stops at the SIMD vector holding its last row's diagonal, and C's entries above the diagonal
/// are left unspecified (unset, or set to anything).
struct SmallGemmBand {
    static constexpr std::ptrdiff_t none = std::numeric_limits<std::ptrdiff_t>::max();
    std::ptrdiff_t below = none, above = none;
    bool lower_c = false;
};

/// op(A) lower triangular (A(i, p) = 0 for p > i) and upper triangular (A(i, p) = 0 for p < i);
/// only the lower triangle of C wanted.
inline constexpr SmallGemmBand lower_triangle{SmallGemmBand::none, 0}, upper_triangle{0, SmallGemmBand::none},
    lower_c_only{SmallGemmBand::none, SmallGemmBand::none, true};

namespace small_gemm_detail {

/// f(std::integral_constant<std::size_t, I>{}) for I = 0, ..., N - 1: a loop unrolled at compile time
/// (the register blocks are arrays indexed by constants, which the compiler keeps in registers).
template <std::size_t N, class F>
[[gnu::always_inline]] inline void unrolled(F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) { (f(std::integral_constant<std::size_t, I>{}), ...); }(std::make_index_sequence<N>{});
}

template <std::size_t D>
struct lane_xor {  // lane i reads lane i ^ D
    static constexpr unsigned get(unsigned i, unsigned) { return i ^ unsigned(D); }
};
template <std::size_t D>
struct lane_bit {  // lanes with bit D set
    static constexpr bool get(unsigned i, unsigned) { return (i & unsigned(D)) != 0; }
};

}  // namespace small_gemm_detail

template <class T, class Arch = xsimd::default_arch>
struct SmallGemm {
    using batch = xsimd::batch<T, Arch>;
    static constexpr std::size_t lanes = batch::size;
    // 32 vector registers (AVX-512): 6 x 4 accumulators, 4 vectors of B and a broadcast; else 16.
    static constexpr bool many_registers = std::is_base_of_v<xsimd::avx512f, Arch>;
    static constexpr std::size_t max_rows = many_registers ? 6 : 3, max_vectors = many_registers ? 4 : 3;

    /// R rows by N vectors of C: C = alpha A B + beta C (C not read when beta = 0), A(i, p) at
    /// a[i ars + p acs] (`unit_rows`: ars = 1, a constant, so one address register serves all R
    /// rows), B's row p at b + p ldb.
    template <std::size_t R, std::size_t N, bool unit_rows>
    static void block(std::size_t k, T alpha, const T* a, std::size_t ars, std::size_t acs, const T* b, std::size_t ldb, T beta, T* c,
                      std::size_t ldc) {
        // The lambdas are forced inline: GCC otherwise calls the epilogue's (which branch on beta),
        // and the register block goes through memory (~8% of a 6 x 4 block at k = 64).
        using small_gemm_detail::unrolled;
        if constexpr (unit_rows) ars = 1;
        batch acc[R][N];
        unrolled<R>([&](auto r) __attribute__((always_inline)) {
            unrolled<N>([&](auto j) __attribute__((always_inline)) { acc[r][j] = batch(T{0}); });
        });
        for (std::size_t p = 0; p < k; ++p, a += acs, b += ldb) {
            batch bv[N];
            unrolled<N>([&](auto j) __attribute__((always_inline)) { bv[j] = batch::load_unaligned(b + j * lanes); });
            unrolled<R>([&](auto r) __attribute__((always_inline)) {
                const batch ar(a[r * ars]);
                unrolled<N>([&](auto j) __attribute__((always_inline)) { acc[r][j] = xsimd::fma(ar, bv[j], acc[r][j]); });
            });
        }
        const batch al(alpha), be(beta);
        unrolled<R>([&](auto r) __attribute__((always_inline)) {
            unrolled<N>([&](auto j) __attribute__((always_inline)) {
                T* cp = c + r * ldc + j * lanes;
                batch x = al * acc[r][j];
                if (beta != T{0}) x = xsimd::fma(be, batch::load_unaligned(cp), x);
                x.store_unaligned(cp);
            });
        });
    }

    using block_fn = void (*)(std::size_t, T, const T*, std::size_t, std::size_t, const T*, std::size_t, T, T*, std::size_t);
    template <bool unit_rows, std::size_t... I>
    static constexpr std::array<block_fn, sizeof...(I)> blocks(std::index_sequence<I...>) {
        return {&block<I / max_vectors + 1, I % max_vectors + 1, unit_rows>...};
    }

    /// C [m, n] = alpha op(A) B + beta C, row-major C (leading dimension ldc) and B [k, n] (ldb);
    /// op(A) [m, k] has entry (i, p) at a[i ars + p acs] (row-major: ars = lda, acs = 1; stored
    /// transposed: ars = 1, acs = lda). Any n: where n is not a multiple of lanes, the column panel
    /// holding the last, partial vector runs on zero-padded copies of its columns of B and C.
    static void product(std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a, std::size_t ars, std::size_t acs, const T* b,
                        std::size_t ldb, T beta, T* c, std::size_t ldc, SmallGemmBand band = {}) {
        using shapes = std::make_index_sequence<max_rows * max_vectors>;
        static constexpr std::array<block_fn, max_rows * max_vectors> general = blocks<false>(shapes{}), unit = blocks<true>(shapes{});
        if (m == 0 || n == 0) return;
        const auto& table = ars == 1 ? unit : general;
        // Blocks as even as the register block allows (64 rows: 9 of 6 and 2 of 5, not 10 of 6 and
        // one of 4): a narrow block pays the same broadcasts or loads for fewer multiply-adds.
        const std::size_t vectors = (n + lanes - 1) / lanes, whole = n / lanes;
        const std::size_t column_blocks = (vectors + max_vectors - 1) / max_vectors, row_blocks = (m + max_rows - 1) / max_rows;
        const auto clamp = [k](std::ptrdiff_t p) { return std::size_t(std::clamp<std::ptrdiff_t>(p, 0, std::ptrdiff_t(k))); };
        thread_local std::vector<T> pad_b, pad_c;
        for (std::size_t jb = 0, j = 0; jb < column_blocks; ++jb) {  // a panel of B stays in L1 for all rows
            const std::size_t nv = (vectors - j + column_blocks - jb - 1) / (column_blocks - jb), width = nv * lanes;
            const std::size_t j0 = j * lanes, cols = std::min(n, j0 + width) - j0;
            const bool partial = j + nv > whole;
            const T* bp = b + j0;
            std::size_t ldbp = ldb;
            if (partial) {
                if (pad_b.size() < k * width) pad_b.resize(k * width);
                if (pad_c.size() < max_rows * width) pad_c.resize(max_rows * width);
                for (std::size_t p = 0; p < k; ++p) {
                    std::copy_n(b + p * ldb + j0, cols, pad_b.data() + p * width);
                    std::fill(pad_b.data() + p * width + cols, pad_b.data() + (p + 1) * width, T{0});
                }
                bp = pad_b.data();
                ldbp = width;
            }
            for (std::size_t ib = 0, i = 0; ib < row_blocks; ++ib) {
                const std::size_t nr = (m - i + row_blocks - ib - 1) / (row_blocks - ib);
                std::size_t nvr = nv;  // vectors this block runs
                if (band.lower_c) {
                    if (i + nr <= j0) {  // the whole block lies above the diagonal
                        i += nr;
                        continue;
                    }
                    nvr = std::min(nv, (i + nr - j0 + lanes - 1) / lanes);
                }
                const std::size_t p0 = band.below == SmallGemmBand::none ? 0 : clamp(std::ptrdiff_t(i) - band.below);
                const std::size_t p1 = band.above == SmallGemmBand::none ? k : clamp(std::ptrdiff_t(i + nr) + band.above);
                T* cp = c + i * ldc + j0;
                std::size_t ldcp = ldc;
                if (partial) {
                    if (beta != T{0})
                        for (std::size_t r = 0; r < nr; ++r) std::copy_n(c + (i + r) * ldc + j0, cols, pad_c.data() + r * width);
                    cp = pad_c.data();
                    ldcp = width;
                }
                table[(nr - 1) * max_vectors + nvr - 1](std::max(p0, p1) - p0, alpha, a + i * ars + p0 * acs, ars, acs, bp + p0 * ldbp, ldbp,
                                                       beta, cp, ldcp);
                if (partial)
                    for (std::size_t r = 0; r < nr; ++r) std::copy_n(pad_c.data() + r * width, cols, c + (i + r) * ldc + j0);
                i += nr;
            }
            j += nv;
        }
    }

    /// r[0..lanes) (lanes x lanes) transposed in registers. First the sub-blocks within each 16-byte
    /// lane, by interleaves (zip_lo / zip_hi work within 16-byte lanes on every x86 and NEON arch);
    /// then, for D = 16 bytes' elements up to lanes / 2, rounds swapping the off-diagonal D x D
    /// sub-blocks of every 2D x 2D block (two lane permutations and two blends per pair of rows).
    /// In-lane interleaves are cheaper than permutations: this way the rounds of permutations are
    /// two of four on AVX-512 (floats), which keeps the transposed copies at about the cost of
    /// intrinsics' shuffles.
    static void transpose_block(batch* r) {
        constexpr std::size_t per = 16 / sizeof(T);  // rows (and elements) of an in-lane sub-block
        small_gemm_detail::unrolled<lanes / per>([&](auto g) {
            batch* x = r + g * per;
            if constexpr (per == 2) {
                const batch t0 = xsimd::zip_lo(x[0], x[1]), t1 = xsimd::zip_hi(x[0], x[1]);
                x[0] = t0;
                x[1] = t1;
            } else {
                using wide = xsimd::batch<double, Arch>;
                const auto w = [](const batch& v) { return xsimd::bitwise_cast<wide>(v); };
                const auto n = [](const wide& v) { return xsimd::bitwise_cast<batch>(v); };
                const batch t0 = xsimd::zip_lo(x[0], x[1]), t1 = xsimd::zip_hi(x[0], x[1]);
                const batch t2 = xsimd::zip_lo(x[2], x[3]), t3 = xsimd::zip_hi(x[2], x[3]);
                x[0] = n(xsimd::zip_lo(w(t0), w(t2)));
                x[1] = n(xsimd::zip_hi(w(t0), w(t2)));
                x[2] = n(xsimd::zip_lo(w(t1), w(t3)));
                x[3] = n(xsimd::zip_hi(w(t1), w(t3)));
            }
        });
        swap_rounds<per>(r);
    }
    template <std::size_t D>
    static void swap_rounds(batch* r) {
        if constexpr (D < lanes) {
            using index = xsimd::batch<xsimd::as_unsigned_integer_t<T>, Arch>;
            constexpr auto flip = xsimd::make_batch_constant<index, small_gemm_detail::lane_xor<D>>();
            constexpr auto high = xsimd::make_batch_bool_constant<batch, small_gemm_detail::lane_bit<D>>();
            small_gemm_detail::unrolled<lanes>([&](auto i) {
                if constexpr ((decltype(i)::value & D) == 0) {
                    const batch lo = r[i], hi = r[i + D];
                    r[i] = xsimd::select(high, xsimd::swizzle(hi, flip), lo);
                    r[i + D] = xsimd::select(high, hi, xsimd::swizzle(lo, flip));
                }
            });
            swap_rounds<2 * D>(r);
        }
    }

    /// dst [cols, rows] (leading dimension ldd) = src [rows, cols]^T (leading dimension lds): whole
    /// lanes x lanes blocks in registers, the edges element by element.
    static void transpose(std::size_t rows, std::size_t cols, const T* src, std::size_t lds, T* dst, std::size_t ldd) {
        const std::size_t rows_whole = rows / lanes * lanes, cols_whole = cols / lanes * lanes;
        for (std::size_t i0 = 0; i0 < rows_whole; i0 += lanes) {
            for (std::size_t j0 = 0; j0 < cols_whole; j0 += lanes) {
                batch r[lanes];
                small_gemm_detail::unrolled<lanes>([&](auto q) { r[q] = batch::load_unaligned(src + (i0 + q) * lds + j0); });
                transpose_block(r);
                small_gemm_detail::unrolled<lanes>([&](auto q) { r[q].store_unaligned(dst + (j0 + q) * ldd + i0); });
            }
            for (std::size_t j = cols_whole; j < cols; ++j)
                for (std::size_t q = 0; q < lanes; ++q) dst[j * ldd + i0 + q] = src[(i0 + q) * lds + j];
        }
        for (std::size_t i = rows_whole; i < rows; ++i)
            for (std::size_t j = 0; j < cols; ++j) dst[j * ldd + i] = src[i * lds + j];
    }
};

/// dst [cols, rows] = src [rows, cols]^T (see SmallGemm::transpose).
template <class T>
void small_gemm_transpose(std::size_t rows, std::size_t cols, const T* src, std::size_t lds, T* dst, std::size_t ldd) {
    SmallGemm<T>::transpose(rows, cols, src, lds, dst, ldd);
}

/// C = alpha op(A) op(B) + beta C on row-major buffers, BLAS's arguments (C not read when beta = 0),
/// on the calling thread. op(B) = B^T is first copied transposed into a per-thread buffer.
template <class T>
void small_gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a, std::size_t lda, const T* b,
                std::size_t ldb, T beta, T* c, std::size_t ldc, SmallGemmBand band = {}) {
    if (m == 0 || n == 0) return;
    if (trans_b && k > 0) {
        thread_local std::vector<T> buffer;
        if (buffer.size() < k * n) buffer.resize(k * n);
        SmallGemm<T>::transpose(n, k, b, ldb, buffer.data(), n);
        b = buffer.data();
        ldb = n;
    }
    SmallGemm<T>::product(m, n, k, alpha, a, trans_a ? 1 : lda, trans_a ? lda : 1, b, ldb, beta, c, ldc, band);
}

}  // namespace olmax::backend
