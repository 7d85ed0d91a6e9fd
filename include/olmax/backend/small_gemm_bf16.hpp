#pragma once
// The small GEMM of small_gemm.hpp under the bf16 precision policy: C (fp32) = alpha op(A) op(B) +
// beta C with both operands rounded to bfloat16 (nearest even) and every product summed in fp32,
// the numbers of the CPU's bf16 units and of Kernels::gemm inside a bf16_matmul_scope, for the
// mixers' per-chunk and per-tile products on the calling thread.
//
// On a CPU with AVX512-BF16 (Intel Cooper Lake and later, AMD Zen 4 and later) it runs VDPBF16PS
// register blocks: each instruction multiplies 16 pairs of bf16 products into 16 fp32 sums, twice
// the multiply-adds of an fp32 FMA. The operands are first rounded into packed copies: op(A) as
// pairs (A(i, 2q), A(i, 2q + 1)) in one 32-bit word, and op(B) with rows 2q and 2q + 1 interleaved
// (word j of pair-row q holds (B(2q, j), B(2q + 1, j))), its columns padded to whole vectors with
// zeros; an odd k gets a zero last row. A block of up to 6 rows by 4 vectors of C stays in
// registers through the pairs, as in the fp32 kernel (Intel's intrinsics guide for VDPBF16PS and
// VCVTNE2PS2BF16; the latter rounds to nearest even, as bfloat16(float) does).
//
// On a CPU with AMX (Intel Sapphire Rapids and later) it runs AMX's tile product TDPBF16PS: each
// instruction multiplies a 16 x 32 bf16 tile of op(A) by a 32 x 16 one of op(B) into a 16 x 16
// fp32 tile, 16 times the multiply-adds of VDPBF16PS. op(A) is packed as the pairs above, row by
// row and padded with zeros to whole tiles (16 rows, 32 along k); op(B) interleaved as above, padded
// to whole tiles; C's tiles start from C (or zero) and are stored into it, through a per-thread
// buffer where alpha, beta or C's edges need it. Products too small or shallow to fill the tiles
// (tiles_pay) take the rounding form below. A process must ask Linux for the tile state before its
// first tile instruction (amx_usable).
//
// Elsewhere, and on CPUs whose VDPBF16PS does no more multiply-adds a cycle than their fp32 FMA
// (by fastest_form's rule, Intel's AVX-512 cores without AMX), it rounds the operands into float
// copies and runs SmallGemm<float>: the same products, near fp32 speed. Every form's |C - the exact
// product of the rounded operands| is within about k 2^-24 sum_p |a_p b_p| per element (fp32 sums in
// a different order). The environment variable OLMAX_BF16_GEMM_FORM=amx|dot|rounded overrides that
// choice for a process, so one CPU can run (and time) another CPU's code path.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/backend/cpu_features.hpp"
#include "olmax/backend/small_gemm.hpp"
#include "olmax/core/bfloat16.hpp"
#include "olmax/core/error.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define OLMAX_SMALL_GEMM_BF16_X86 1
#else
#define OLMAX_SMALL_GEMM_BF16_X86 0
#endif
#if OLMAX_SMALL_GEMM_BF16_X86 && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace olmax::backend {

/// Which form small_gemm_bf16 runs: the fastest one on this CPU (or the one OLMAX_BF16_GEMM_FORM
/// names), the rounding form, the VDPBF16PS kernel (where the CPU has AVX512-BF16, else the rounding
/// form) or AMX's tiles (where the CPU has AMX and Linux grants the tile state, else the rounding
/// form). The latter three are for tests and benchmarks; the results agree within the bound at the
/// top of this file.
enum class Bf16GemmForm { fastest, rounded, dot, amx };

namespace small_gemm_bf16_detail {

/// op(X)(i, p) at x[i rs + p cs] for X = A or B of a BLAS-style call.
struct Strided {
    const float* x;
    std::size_t rs, cs;
};

/// The rounding form: the operands rounded to bfloat16 into float copies (op(B) = B^T transposed on
/// the way), then SmallGemm<float> on them. The copies are made row by row in the operands' own
/// layout, so the rounding runs on whole SIMD vectors.
inline void rounded(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda,
                    const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc, SmallGemmBand band) {
    thread_local std::vector<float> ra, rb;
    const std::size_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;  // A as stored
    ra.resize(a_rows * a_cols);
    for (std::size_t r = 0; r < a_rows; ++r) round_to_bfloat16(a + r * lda, ra.data() + r * a_cols, a_cols);
    rb.resize(k * n);  // op(B), row-major [k, n]
    if (trans_b) {
        SmallGemm<float>::transpose(n, k, b, ldb, rb.data(), n);
        round_to_bfloat16(rb.data(), rb.data(), k * n);
    } else {
        for (std::size_t p = 0; p < k; ++p) round_to_bfloat16(b + p * ldb, rb.data() + p * n, n);
    }
    SmallGemm<float>::product(m, n, k, alpha, ra.data(), trans_a ? 1 : a_cols, trans_a ? a_cols : 1, rb.data(), n, beta, c, ldc, band);
}

#if OLMAX_SMALL_GEMM_BF16_X86
#define OLMAX_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

/// 32 floats (lo: elements 0-15, hi: 16-31) rounded to 32 bf16, in order.
OLMAX_BF16_TARGET inline __m512i round_32(__m512 lo, __m512 hi) { return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); }

/// Row i of op(A) as pairs: out[q] = (x[2q], x[2q + 1]) for the k contiguous floats at x, zero past k.
OLMAX_BF16_TARGET inline void pack_row_pairs(std::size_t k, const float* x, std::uint32_t* out) {
    for (std::size_t p = 0; p < k; p += 32) {
        const std::size_t left = std::min<std::size_t>(32, k - p);
        const __mmask16 lo = __mmask16((1u << std::min<std::size_t>(16, left)) - 1);
        const __mmask16 hi = left > 16 ? __mmask16((1u << (left - 16)) - 1) : __mmask16(0);
        const __m512i v = round_32(_mm512_maskz_loadu_ps(lo, x + p), _mm512_maskz_loadu_ps(hi, x + p + 16));
        _mm512_mask_storeu_epi32(out + p / 2, __mmask16((1u << ((left + 1) / 2)) - 1), v);
    }
}

/// pairs [kp][width] words: word (q, j) = (X(2q, j), X(2q + 1, j)) for the row-major X [k, n] at x
/// (rows ld apart), zero past k rows and past n columns; `width` a multiple of 16. Converts 16
/// columns of two rows at once, then interleaves them.
OLMAX_BF16_TARGET inline void pack_interleaved(std::size_t k, std::size_t n, const float* x, std::size_t ld, std::uint32_t* out,
                                               std::size_t width) {
    const std::size_t kp = (k + 1) / 2;
    const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3,
                                           18, 2, 17, 1, 16, 0);
    for (std::size_t q = 0; q < kp; ++q) {
        const float* r0 = x + 2 * q * ld;
        const float* r1 = 2 * q + 1 < k ? r0 + ld : nullptr;
        for (std::size_t j = 0; j < width; j += 16) {
            const std::size_t left = j < n ? std::min<std::size_t>(16, n - j) : 0;
            const __mmask16 mask = __mmask16((1u << left) - 1);
            const __m512 v0 = _mm512_maskz_loadu_ps(mask, r0 + j);
            const __m512 v1 = r1 ? _mm512_maskz_loadu_ps(mask, r1 + j) : _mm512_setzero_ps();
            _mm512_storeu_si512(out + q * width + j, _mm512_permutexvar_epi16(order, round_32(v0, v1)));
        }
    }
}

/// R rows by N vectors of C = alpha sum_q A-pairs(r, q) . B-pairs(q, :) + beta C over pairs [0, kq):
/// A's pair (r, q) at a[r ars + q acs], B's pair-row q at b + q ldb; `last` masks the columns of the
/// last vector.
template <std::size_t R, std::size_t N>
OLMAX_BF16_TARGET void block(std::size_t kq, float alpha, const std::uint32_t* a, std::size_t ars, std::size_t acs, const std::uint32_t* b,
                             std::size_t ldb, float beta, float* c, std::size_t ldc, __mmask16 last) {
    // Every loop over r and j is unrolled (the pragmas), so that acc stays in 24 registers rather
    // than on the stack: without them GCC spilled it (~7% of an SSD step in the zeroing alone).
    __m512 acc[R][N];
#pragma GCC unroll 8
    for (std::size_t r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (std::size_t j = 0; j < N; ++j) acc[r][j] = _mm512_setzero_ps();
    for (std::size_t q = 0; q < kq; ++q, a += acs, b += ldb) {
        __m512bh bv[N];
#pragma GCC unroll 4
        for (std::size_t j = 0; j < N; ++j) bv[j] = (__m512bh)_mm512_loadu_si512(b + 16 * j);
#pragma GCC unroll 8
        for (std::size_t r = 0; r < R; ++r) {
            const __m512bh av = (__m512bh)_mm512_set1_epi32(int(a[r * ars]));
#pragma GCC unroll 4
            for (std::size_t j = 0; j < N; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], av, bv[j]);
        }
    }
    const __m512 al = _mm512_set1_ps(alpha), be = _mm512_set1_ps(beta);
#pragma GCC unroll 8
    for (std::size_t r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (std::size_t j = 0; j < N; ++j) {
            float* cp = c + r * ldc + 16 * j;
            const __mmask16 mask = j + 1 == N ? last : __mmask16(0xFFFF);
            __m512 x = _mm512_mul_ps(al, acc[r][j]);
            if (beta != 0.0f) x = _mm512_fmadd_ps(be, _mm512_maskz_loadu_ps(mask, cp), x);
            _mm512_mask_storeu_ps(cp, mask, x);
        }
}

using block_fn = void (*)(std::size_t, float, const std::uint32_t*, std::size_t, std::size_t, const std::uint32_t*, std::size_t, float, float*,
                          std::size_t, __mmask16);
inline constexpr std::size_t max_rows = 6, max_vectors = 4;
template <std::size_t... I>
constexpr std::array<block_fn, sizeof...(I)> blocks(std::index_sequence<I...>) {
    return {&block<I / max_vectors + 1, I % max_vectors + 1>...};
}

OLMAX_BF16_TARGET inline void avx512(std::size_t m, std::size_t n, std::size_t k, float alpha, Strided a, Strided b, float beta, float* c,
                                     std::size_t ldc, SmallGemmBand band) {
    static constexpr std::array<block_fn, max_rows * max_vectors> table = blocks(std::make_index_sequence<max_rows * max_vectors>{});
    const std::size_t kp = (k + 1) / 2, vectors = (n + 15) / 16, width = 16 * vectors;
    thread_local std::vector<std::uint32_t> pa, pb;
    thread_local std::vector<float> bt;
    // op(A) as pairs. Stored transposed (op(A)'s columns contiguous: a.cs = lda, a.rs = 1): [kp][m
    // rounded up to 16], op(A)^T's rows 2q and 2q + 1 interleaved, A's rows 1 word apart. Else
    // (a.cs = 1): [m][kp], each row's consecutive elements paired.
    std::size_t ars, acs;
    if (a.cs != 1) {
        const std::size_t mw = 16 * ((m + 15) / 16);
        pa.resize(kp * mw);
        pack_interleaved(k, m, a.x, a.cs, pa.data(), mw);
        ars = 1, acs = mw;
    } else {
        pa.resize(m * kp);
        for (std::size_t i = 0; i < m; ++i) pack_row_pairs(k, a.x + i * a.rs, pa.data() + i * kp);
        ars = kp, acs = 1;
    }
    const float* bx = b.x;
    std::size_t ldb = b.rs;
    if (b.cs != 1) {  // op(B) = B^T (b.cs = ldb, b.rs = 1): transposed into contiguous rows first (bits unchanged)
        bt.resize(k * n);
        SmallGemm<float>::transpose(n, k, b.x, b.cs, bt.data(), n);
        bx = bt.data(), ldb = n;
    }
    pb.resize(kp * width);
    pack_interleaved(k, n, bx, ldb, pb.data(), width);
    const std::size_t column_blocks = (vectors + max_vectors - 1) / max_vectors, row_blocks = (m + max_rows - 1) / max_rows;
    const auto clamp = [kp](std::ptrdiff_t q) { return std::size_t(std::clamp<std::ptrdiff_t>(q, 0, std::ptrdiff_t(kp))); };
    for (std::size_t jb = 0, j = 0; jb < column_blocks; ++jb) {
        const std::size_t nv = (vectors - j + column_blocks - jb - 1) / (column_blocks - jb);
        for (std::size_t ib = 0, i = 0; ib < row_blocks; ++ib) {
            const std::size_t nr = (m - i + row_blocks - ib - 1) / (row_blocks - ib);
            std::size_t nvr = nv;  // vectors this block runs
            if (band.lower_c) {
                if (i + nr <= 16 * j) {  // the whole block lies above the diagonal
                    i += nr;
                    continue;
                }
                nvr = std::min(nv, (i + nr - 16 * j + 15) / 16);
            }
            const std::size_t tail = std::min(n, 16 * (j + nvr)) - 16 * (j + nvr - 1);  // columns of the block's last vector
            const __mmask16 last = __mmask16((1u << tail) - 1);
            // The band in pairs: element p lies in pair p / 2.
            const std::size_t q0 = band.below == SmallGemmBand::none ? 0 : clamp((std::ptrdiff_t(i) - band.below) / 2);
            const std::size_t q1 = band.above == SmallGemmBand::none ? kp : clamp((std::ptrdiff_t(i + nr) + band.above + 1) / 2);
            table[(nr - 1) * max_vectors + nvr - 1](std::max(q0, q1) - q0, alpha, pa.data() + i * ars + q0 * acs, ars, acs,
                                                   pb.data() + q0 * width + 16 * j, width, beta, c + i * ldc + 16 * j, ldc, last);
            i += nr;
        }
        j += nv;
    }
}
#undef OLMAX_BF16_TARGET

#define OLMAX_AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16,amx-tile,amx-bf16")))

/// The tile configuration of every AMX product here (palette 1; Intel's SDM, LDTILECFG): tiles 0-3
/// hold 16 x 16 fp32 sums of C, tiles 4-5 16 rows of op(A) by 16 pairs, tiles 6-7 16 pair-rows of
/// op(B) by 16 columns; every tile 16 rows of 64 bytes. A constant, so that no store to it can be
/// dropped (the intrinsic tells the compiler it reads 8 of its 64 bytes).
struct alignas(64) TileConfig {
    std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
    std::uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
    std::uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};
inline constexpr TileConfig tile_config{};

/// R x N tiles (R, N in {1, 2}) of C at c (rows ldc apart) = (C's tiles if `add`, else 0) + the
/// sum over k-steps [s0, s1) of 32 of op(A)'s packed rows (a: pair (r, q) at a + r lda_words + q)
/// times op(B)'s pair-rows (b: pair-row q at b + q ldb_words). The tile numbers are immediates of
/// the instructions, hence the constant combinations.
template <int R, int N>
OLMAX_AMX_TARGET void amx_block(bool add, std::size_t s0, std::size_t s1, const std::uint32_t* a, std::size_t lda_words, const std::uint32_t* b,
                                std::size_t ldb_words, float* c, std::size_t ldc) {
    const long as = long(4 * lda_words), bs = long(4 * ldb_words), cs = long(4 * ldc);
    if (add) {
        _tile_loadd(0, c, cs);
        if constexpr (N > 1) _tile_loadd(1, c + 16, cs);
        if constexpr (R > 1) _tile_loadd(2, c + 16 * ldc, cs);
        if constexpr (R > 1 && N > 1) _tile_loadd(3, c + 16 * ldc + 16, cs);
    } else {
        _tile_zero(0);
        if constexpr (N > 1) _tile_zero(1);
        if constexpr (R > 1) _tile_zero(2);
        if constexpr (R > 1 && N > 1) _tile_zero(3);
    }
    for (std::size_t s = s0; s < s1; ++s) {
        const std::uint32_t* as0 = a + 16 * s;                // 16 pairs = 32 of k
        const std::uint32_t* bs0 = b + 16 * s * ldb_words;  // 16 pair-rows = 32 of k
        _tile_loadd(4, as0, as);
        _tile_loadd(6, bs0, bs);
        if constexpr (N > 1) _tile_loadd(7, bs0 + 16, bs);
        if constexpr (R > 1) _tile_loadd(5, as0 + 16 * lda_words, as);
        _tile_dpbf16ps(0, 4, 6);
        if constexpr (N > 1) _tile_dpbf16ps(1, 4, 7);
        if constexpr (R > 1) _tile_dpbf16ps(2, 5, 6);
        if constexpr (R > 1 && N > 1) _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, cs);
    if constexpr (N > 1) _tile_stored(1, c + 16, cs);
    if constexpr (R > 1) _tile_stored(2, c + 16 * ldc, cs);
    if constexpr (R > 1 && N > 1) _tile_stored(3, c + 16 * ldc + 16, cs);
}

/// The AMX form (amx_usable() must hold): pack, run the tiles in blocks of up to 2 x 2, and write
/// C. Blocks wholly inside C go straight to C when alpha = 1 and beta is 0 or 1 (every product of
/// the mixers): the tiles start from C's values or from zero. Others are summed in a per-thread
/// buffer and written with alpha and beta afterwards.
OLMAX_AMX_TARGET inline void amx(std::size_t m, std::size_t n, std::size_t k, float alpha, Strided a, Strided b, float beta, float* c,
                                 std::size_t ldc, SmallGemmBand band) {
    const std::size_t mp = 16 * ((m + 15) / 16), np = 16 * ((n + 15) / 16), steps = (k + 31) / 32, kw = 16 * steps;  // kw: pairs a row
    thread_local std::vector<std::uint32_t> pa, pb;
    thread_local std::vector<float> at, bt, sums;
    // op(A): rows of pairs, zero past k and past m.
    pa.resize(mp * kw);
    const float* ax = a.x;
    std::size_t lda = a.rs;
    if (a.cs != 1) {  // op(A) = A^T (a.rs = 1): its rows made contiguous first (bits unchanged)
        at.resize(m * k);
        SmallGemm<float>::transpose(k, m, a.x, a.cs, at.data(), k);
        ax = at.data(), lda = k;
    }
    const std::size_t used = (k + 1) / 2;
    for (std::size_t i = 0; i < m; ++i) {
        pack_row_pairs(k, ax + i * lda, pa.data() + i * kw);
        std::fill(pa.data() + i * kw + used, pa.data() + (i + 1) * kw, 0u);
    }
    std::fill(pa.data() + m * kw, pa.data() + mp * kw, 0u);
    // op(B): pair-rows interleaved, zero past k and past n.
    const float* bx = b.x;
    std::size_t ldb = b.rs;
    if (b.cs != 1) {
        bt.resize(k * n);
        SmallGemm<float>::transpose(n, k, b.x, b.cs, bt.data(), n);
        bx = bt.data(), ldb = n;
    }
    pb.resize(kw * np);
    pack_interleaved(k, n, bx, ldb, pb.data(), np);
    std::fill(pb.data() + used * np, pb.data() + kw * np, 0u);
    const bool direct = alpha == 1.0f && (beta == 0.0f || beta == 1.0f);
    const bool all_in_c = direct && mp == m && np == n;  // every block is stored straight into C
    if (!all_in_c) sums.resize(mp * np);
    const auto clamp = [k](std::ptrdiff_t p) { return std::size_t(std::clamp<std::ptrdiff_t>(p, 0, std::ptrdiff_t(k))); };
    _tile_loadconfig(&tile_config);
    for (std::size_t i = 0; i < mp; i += 32) {
        const std::size_t r = mp - i >= 32 ? 2 : 1;
        // The k-steps where this block's rows of op(A) can be nonzero (the rest of a step is zero).
        const std::size_t p0 = band.below == SmallGemmBand::none ? 0 : clamp(std::ptrdiff_t(i) - band.below);
        const std::size_t p1 = band.above == SmallGemmBand::none ? k : clamp(std::ptrdiff_t(i + 16 * r) + band.above);
        const std::size_t s0 = p0 / 32, s1 = std::max(s0, (p1 + 31) / 32);
        for (std::size_t j = 0; j < np; j += 32) {
            if (band.lower_c && j >= i + 16 * r) break;  // wholly above the diagonal: not wanted
            const std::size_t nt = np - j >= 32 ? 2 : 1;
            const bool in_c = direct && i + 16 * r <= m && j + 16 * nt <= n;
            float* cb = in_c ? c + i * ldc + j : sums.data() + i * np + j;
            const std::size_t ld = in_c ? ldc : np;
            const bool add = in_c && beta == 1.0f;
            const std::uint32_t* ab = pa.data() + i * kw;
            const std::uint32_t* bb = pb.data() + j;
            if (r == 2 && nt == 2) amx_block<2, 2>(add, s0, s1, ab, kw, bb, np, cb, ld);
            else if (r == 2) amx_block<2, 1>(add, s0, s1, ab, kw, bb, np, cb, ld);
            else if (nt == 2) amx_block<1, 2>(add, s0, s1, ab, kw, bb, np, cb, ld);
            else amx_block<1, 1>(add, s0, s1, ab, kw, bb, np, cb, ld);
        }
    }
    _tile_release();  // back to the initial state: no tile data to save on a context switch
    if (all_in_c) return;  // (sums may be empty: no pointer into it is formed)
    // The blocks summed in the buffer: C = alpha sums + beta C.
    const __m512 al = _mm512_set1_ps(alpha), be = _mm512_set1_ps(beta);
    for (std::size_t i = 0; i < m; ++i) {
        const std::size_t block_rows = mp - i / 32 * 32 >= 32 ? 32 : 16;
        const bool rows_in_c = i / 32 * 32 + block_rows <= m;
        const std::size_t row_n = band.lower_c ? std::min(n, i + 1) : n;
        const float* si = sums.data() + i * np;
        float* ci = c + i * ldc;
        for (std::size_t j = 0; j < row_n;) {
            const std::size_t block_cols = np - j >= 32 ? 32 : 16;
            if (direct && rows_in_c && j + block_cols <= n) {  // this block went to C
                j += block_cols;
                continue;
            }
            for (const std::size_t end = std::min(row_n, j + block_cols); j < end; j += 16) {
                const __mmask16 mask = __mmask16((1u << std::min<std::size_t>(16, end - j)) - 1);
                __m512 x = _mm512_mul_ps(al, _mm512_maskz_loadu_ps(mask, si + j));
                if (beta != 0.0f) x = _mm512_fmadd_ps(be, _mm512_maskz_loadu_ps(mask, ci + j), x);
                _mm512_mask_storeu_ps(ci + j, mask, x);
            }
        }
    }
}
#undef OLMAX_AMX_TARGET
#endif

/// Whether this CPU has AVX512-BF16 (checked once).
inline bool has_avx512_bf16() {
#if OLMAX_SMALL_GEMM_BF16_X86
    static const bool yes = cpu_bf16_features().avx512_bf16;
    return yes;
#else
    return false;
#endif
}

/// Whether this process may run AMX's tiles (asked once): the CPU has them (cpu_bf16_features) and
/// Linux granted this process the tile data state. Since Linux 5.16 a process must ask for it
/// (arch_prctl(ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18); the kernel's
/// Documentation/arch/x86/xstate.rst) before its first tile instruction, which otherwise raises
/// SIGILL. The grant is for the whole process; oneDNN asks for it the same way.
inline bool amx_usable() {
#if OLMAX_SMALL_GEMM_BF16_X86 && defined(__linux__)
    static const bool yes = cpu_bf16_features().amx_bf16 && ::syscall(SYS_arch_prctl, 0x1023L, 18L) == 0;
    return yes;
#else
    return false;
#endif
}

/// The form OLMAX_BF16_GEMM_FORM asks Bf16GemmForm::fastest to run, given its value: none when
/// unset or empty (the CPU's fastest form), else amx, dot or rounded. Any other value is a
/// value_error.
inline std::optional<Bf16GemmForm> requested_form(const char* value) {
    if (value == nullptr || *value == '\0') return std::nullopt;
    const std::string_view form(value);
    if (form == "amx") return Bf16GemmForm::amx;
    if (form == "dot") return Bf16GemmForm::dot;
    if (form == "rounded") return Bf16GemmForm::rounded;
    throw value_error(olmax::detail::concat("OLMAX_BF16_GEMM_FORM=", form,
                                            ": expected amx, dot or rounded (or unset: the fastest form on this CPU)"));
}

/// The form that runs when `form` is asked for: amx and dot where the CPU (and for AMX the OS)
/// has them, else the rounding form.
inline Bf16GemmForm runnable(Bf16GemmForm form) {
    if (form == Bf16GemmForm::amx) return amx_usable() ? form : Bf16GemmForm::rounded;
    if (form == Bf16GemmForm::dot) return has_avx512_bf16() ? form : Bf16GemmForm::rounded;
    return form;
}

/// The form Bf16GemmForm::fastest runs (decided once per process). Unless OLMAX_BF16_GEMM_FORM says
/// otherwise:
/// - AMX's tiles where the process may use them (for products where they pay, tiles_pay; the
///   rounding form for the rest): on an Emerald Rapids core, packing included, 64 x 64 x 64 took
///   0.47x the rounding form's time and 0.67x the fp32 kernel's, 128^3 0.28x and 0.37x;
/// - else VDPBF16PS where the CPU has AVX512-BF16 and either issues it as often as a 512-bit FMA
///   (AMD Zen 4 and 5: twice the FMA's multiply-adds; 175 against 110 GFLOPS at 64 x 64 x 64 on a
///   Zen 5 core, packing included) or the fp32 kernel was compiled for vectors narrower than 16
///   floats. On an Emerald Rapids Xeon core (AMX not used) the VDPBF16PS register block alone,
///   its operands packed and in L1, ran at 80 GFLOPS against 125-154 for the fp32 kernel's whole
///   64^3 product A B, and the rounding form's whole product at 84-114 against the dot kernel's 66-76;
/// - else the rounding form.
inline Bf16GemmForm fastest_form() {
    static const Bf16GemmForm form = [] {
        if (const std::optional<Bf16GemmForm> asked = requested_form(std::getenv("OLMAX_BF16_GEMM_FORM"))) return runnable(*asked);
        if (amx_usable()) return Bf16GemmForm::amx;
        if (has_avx512_bf16() && (cpu_bf16_features().dot_at_fma_rate || SmallGemm<float>::lanes < 16)) return Bf16GemmForm::dot;
        return Bf16GemmForm::rounded;
    }();
    return form;
}

/// Whether AMX's tiles beat the rounding form on a product of this size, where the fastest form is
/// AMX. A tile step is 32 deep, so k = 16 wastes half of it, and a small product's packing and tile
/// set-up outweigh its multiply-adds. Measured on an Emerald Rapids core (docs/BF16.md, "AMX's
/// tiles for the mixers' products"): AMX at 0.28-0.9x the rounding form's time wherever k >= 32
/// and m n k >= 32768, but 1.2-1.8x at k = 16.
inline bool tiles_pay(std::size_t m, std::size_t n, std::size_t k) { return k >= 32 && m * n * k >= 32768; }

/// A form's name in OLMAX_BF16_GEMM_FORM's words.
inline std::string_view form_name(Bf16GemmForm form) {
    switch (form) {
        case Bf16GemmForm::amx: return "amx";
        case Bf16GemmForm::dot: return "dot";
        case Bf16GemmForm::rounded: return "rounded";
        default: return "fastest";
    }
}

}  // namespace small_gemm_bf16_detail

/// The form Bf16GemmForm::fastest runs in this process: "amx" (AMX's tiles), "dot" (VDPBF16PS) or
/// "rounded". Throws value_error when OLMAX_BF16_GEMM_FORM holds anything but amx, dot, rounded or
/// nothing.
inline std::string_view small_gemm_bf16_fastest_form() { return small_gemm_bf16_detail::form_name(small_gemm_bf16_detail::fastest_form()); }

/// C = alpha op(A) op(B) + beta C (row-major, BLAS's arguments, C not read when beta = 0) with A and
/// B rounded to bfloat16 and the products summed in fp32, on the calling thread: on AMX's tiles or
/// VDPBF16PS where that is the fastest form (small_gemm_bf16_detail::fastest_form), else on rounded
/// float copies. `band` as in small_gemm.
inline void small_gemm_bf16(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                            std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc, SmallGemmBand band = {},
                            Bf16GemmForm form = Bf16GemmForm::fastest) {
    namespace d = small_gemm_bf16_detail;
    if (m == 0 || n == 0) return;
    if (k == 0) return SmallGemm<float>::product(m, n, 0, alpha, a, 1, 1, b, n, beta, c, ldc);  // beta C only
#if OLMAX_SMALL_GEMM_BF16_X86
    const Bf16GemmForm runs = form == Bf16GemmForm::fastest ? d::fastest_form() : d::runnable(form);
    const d::Strided sa{a, trans_a ? 1 : lda, trans_a ? lda : 1}, sb{b, trans_b ? 1 : ldb, trans_b ? ldb : 1};
    if (runs == Bf16GemmForm::amx && (form == Bf16GemmForm::amx || d::tiles_pay(m, n, k))) return d::amx(m, n, k, alpha, sa, sb, beta, c, ldc, band);
    if (runs == Bf16GemmForm::dot) return d::avx512(m, n, k, alpha, sa, sb, beta, c, ldc, band);
#else
    (void)form;
#endif
    d::rounded(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, band);
}

}  // namespace olmax::backend
