// backend::small_gemm and backend::SmallGemm (the register-blocked kernel of attention's tiles and
// the gated delta rule's blocks) against a naive triple loop: random shapes with n off the SIMD
// width, A and B transposed, alpha and beta (beta 0 must not read C), general strides of A, bands;
// small_gemm_transpose; and backend::small_gemm_bf16 (operands rounded to bfloat16, fp32 sums) in
// each of its forms (the one it picks, its VDPBF16PS kernel where the CPU has AVX512-BF16, its
// rounding form), against the naive product of the rounded operands.
#include "test_helpers.hpp"

#include "olmax/backend/small_gemm.hpp"
#include "olmax/backend/small_gemm_bf16.hpp"

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <limits>
#include <optional>
#include <random>
#include <vector>

namespace small_gemm_test {

using olmax::backend::SmallGemm;
using olmax::backend::SmallGemmBand;

/// Whether op(A)(i, p) may be nonzero under `band`.
inline bool in_band(std::size_t i, std::size_t p, SmallGemmBand band) {
    const auto ii = std::ptrdiff_t(i), pp = std::ptrdiff_t(p);
    return (band.below == SmallGemmBand::none || pp >= ii - band.below) && (band.above == SmallGemmBand::none || pp <= ii + band.above);
}

/// C = alpha op(A) B + beta C in double on the same operands, and the size of its terms (for a
/// relative tolerance).
template <class T>
void naive(std::size_t m, std::size_t n, std::size_t k, double alpha, const std::vector<T>& a, std::size_t ars, std::size_t acs,
           const std::vector<T>& b, std::size_t brs, std::size_t bcs, double beta, const std::vector<T>& c, std::size_t ldc,
           std::vector<double>& out, std::vector<double>& size) {
    out.assign(m * n, 0.0);
    size.assign(m * n, 0.0);
    for (std::size_t i = 0; i < m; ++i)
        for (std::size_t j = 0; j < n; ++j) {
            double s = 0, z = 0;
            for (std::size_t p = 0; p < k; ++p) {
                const double t = double(a[i * ars + p * acs]) * double(b[p * brs + j * bcs]);
                s += t;
                z += std::abs(t);
            }
            out[i * n + j] = alpha * s + (beta != 0 ? beta * double(c[i * ldc + j]) : 0.0);
            size[i * n + j] = std::abs(alpha) * z + (beta != 0 ? std::abs(beta * double(c[i * ldc + j])) : 0.0);
        }
}

/// Which product check_random_products runs: small_gemm (and, for some trials, SmallGemm::product
/// on general strides), or small_gemm_bf16 in the form it picks, on its VDPBF16PS kernel, or in its
/// rounding form.
enum class Kind { plain, bf16, bf16_dot, bf16_rounded, bf16_amx };

template <class T, Kind kind = Kind::plain>
void check_random_products(double tol) {
    constexpr bool bf16 = kind != Kind::plain;
    std::mt19937 rng(20261128);
    std::uniform_real_distribution<double> unit(-1.0, 1.0);
    // AMX's tiles are 16 rows by 32 of k: its shapes reach past two row blocks and three k-steps, so
    // that bands skip whole steps.
    constexpr bool tiles = kind == Kind::bf16_amx;
    std::uniform_int_distribution<std::size_t> rows(1, tiles ? 70 : 20), cols(1, 75), depth(0, tiles ? 100 : 40), pad(0, 3);
    std::uniform_int_distribution<int> pick(0, 3), offset(-3, 4);
    constexpr std::size_t lanes = SmallGemm<T>::lanes;
    const T sentinel = T(12345);
    for (int trial = 0; trial < 400; ++trial) {
        const std::size_t m = rows(rng), n = trial % 8 == 0 ? lanes * (1 + trial % 5) : cols(rng), k = depth(rng);
        const bool trans_a = pick(rng) % 2 == 1, trans_b = pick(rng) % 2 == 1, strided = !bf16 && trial % 5 == 0;
        const double alpha = trial % 3 == 0 ? 1.0 : unit(rng);
        const int beta_kind = pick(rng);
        const double beta = beta_kind == 0 ? 0.0 : beta_kind == 1 ? 1.0 : unit(rng);
        SmallGemmBand band;
        const int band_kind = pick(rng);
        if (band_kind == 1 || band_kind == 3) band.above = offset(rng);
        if (band_kind == 2 || band_kind == 3) band.below = offset(rng) + 3;
        band.lower_c = trial % 7 == 3;  // C's entries above the diagonal are then unspecified
        // op(A) [m, k]: row-major (lda >= k), stored transposed (lda >= m), or (strided) every other
        // element of a larger buffer in both directions.
        const std::size_t lda = (trans_a ? m : k) + pad(rng);
        std::size_t ars = trans_a ? 1 : lda, acs = trans_a ? lda : 1;
        if (strided) {
            ars *= 2;
            acs *= 2;
        }
        std::vector<T> a((m + 1) * (k + 1) * (lda + 1) * 4 + 8, T(0));
        for (std::size_t i = 0; i < m; ++i)
            for (std::size_t p = 0; p < k; ++p) a[i * ars + p * acs] = in_band(i, p, band) ? T(unit(rng)) : T(0);
        // op(B) [k, n]: B row-major [k, n] or B^T stored as [n, k].
        const std::size_t ldb = (trans_b ? k : n) + pad(rng);
        std::vector<T> b((trans_b ? n : k) * ldb + 1);
        for (T& x : b) x = T(unit(rng));
        const std::size_t brs = trans_b ? 1 : ldb, bcs = trans_b ? ldb : 1;
        const std::size_t ldc = n + pad(rng);
        std::vector<T> c(m * ldc, sentinel);
        for (std::size_t i = 0; i < m; ++i)
            for (std::size_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0 ? std::numeric_limits<T>::quiet_NaN() : T(unit(rng));
        std::vector<double> want, size;
        if constexpr (bf16) {  // the exact product of the rounded operands
            auto ra = a, rb = b;
            for (T& x : ra) x = T(float(olmax::bfloat16(x)));
            for (T& x : rb) x = T(float(olmax::bfloat16(x)));
            naive(m, n, k, alpha, ra, ars, acs, rb, brs, bcs, beta, c, ldc, want, size);
        } else {
            naive(m, n, k, alpha, a, ars, acs, b, brs, bcs, beta, c, ldc, want, size);
        }
        if constexpr (bf16) {
            olmax::backend::small_gemm_bf16(trans_a, trans_b, m, n, k, float(alpha), a.data(), lda, b.data(), ldb, float(beta), c.data(), ldc,
                                            band,
                                            kind == Kind::bf16_dot       ? olmax::backend::Bf16GemmForm::dot
                                            : kind == Kind::bf16_rounded ? olmax::backend::Bf16GemmForm::rounded
                                            : kind == Kind::bf16_amx     ? olmax::backend::Bf16GemmForm::amx
                                                                         : olmax::backend::Bf16GemmForm::fastest);
        } else if (strided) {  // the strided core directly (B^T copied first)
            std::vector<T> bt(k * n);
            for (std::size_t p = 0; p < k; ++p)
                for (std::size_t j = 0; j < n; ++j) bt[p * n + j] = b[p * brs + j * bcs];
            SmallGemm<T>::product(m, n, k, T(alpha), a.data(), ars, acs, bt.data(), n, T(beta), c.data(), ldc, band);
        } else {
            olmax::backend::small_gemm(trans_a, trans_b, m, n, k, T(alpha), a.data(), lda, b.data(), ldb, T(beta), c.data(), ldc, band);
        }
        INFO("trial " << trial << ": m " << m << " n " << n << " k " << k << " trans_a " << trans_a << " trans_b " << trans_b << " strided "
                      << strided << " alpha " << alpha << " beta " << beta << " band " << band.below << " " << band.above << " lower_c " << band.lower_c);
        for (std::size_t i = 0; i < m; ++i) {
            for (std::size_t j = 0; j < (band.lower_c ? std::min(n, i + 1) : n); ++j) {
                INFO("C(" << i << ", " << j << ") = " << c[i * ldc + j] << ", want " << want[i * n + j]);
                REQUIRE(std::abs(double(c[i * ldc + j]) - want[i * n + j]) <= tol * std::max(1.0, size[i * n + j]));
            }
            for (std::size_t j = n; j < ldc; ++j) REQUIRE(c[i * ldc + j] == sentinel);  // nothing past n written
        }
    }
}

template <class T>
void check_transpose() {
    constexpr std::size_t lanes = SmallGemm<T>::lanes;
    for (std::size_t rows : {std::size_t(1), lanes - 1, lanes, 2 * lanes + 3, 3 * lanes})
        for (std::size_t cols : {std::size_t(1), lanes, lanes + 1, 4 * lanes}) {
            const std::size_t lds = cols + 2, ldd = rows + 1;
            std::vector<T> src(rows * lds), dst(cols * ldd, T(-1));
            for (std::size_t i = 0; i < src.size(); ++i) src[i] = T(i);
            olmax::backend::small_gemm_transpose(rows, cols, src.data(), lds, dst.data(), ldd);
            for (std::size_t j = 0; j < cols; ++j) {
                for (std::size_t i = 0; i < rows; ++i) REQUIRE(dst[j * ldd + i] == src[i * lds + j]);
                REQUIRE(dst[j * ldd + rows] == T(-1));
            }
        }
}

}  // namespace small_gemm_test

TEST_CASE("small_gemm: random shapes, transposes, alpha, beta, strides and bands match a naive product (double, 1e-12)", "[small_gemm]") {
    small_gemm_test::check_random_products<double>(1e-12);
}

TEST_CASE("small_gemm: random shapes, transposes, alpha, beta, strides and bands match a naive product (float, 1e-5)", "[small_gemm]") {
    small_gemm_test::check_random_products<float>(1e-5);
}

TEST_CASE("small_gemm_bf16: random shapes, transposes, alpha, beta and bands match the product of the rounded operands (1e-5)",
          "[small_gemm]") {
    // The VDPBF16PS kernel runs where the CPU has AVX512-BF16 and AMX's tiles where the process may
    // use them; elsewhere those forms are the rounding form.
    INFO("AVX512-BF16: " << olmax::backend::small_gemm_bf16_detail::has_avx512_bf16()
                         << ", AMX: " << olmax::backend::small_gemm_bf16_detail::amx_usable()
                         << ", picked: " << olmax::backend::small_gemm_bf16_fastest_form());
    small_gemm_test::check_random_products<float, small_gemm_test::Kind::bf16>(1e-5);
    small_gemm_test::check_random_products<float, small_gemm_test::Kind::bf16_dot>(1e-5);
    small_gemm_test::check_random_products<float, small_gemm_test::Kind::bf16_rounded>(1e-5);
    small_gemm_test::check_random_products<float, small_gemm_test::Kind::bf16_amx>(1e-5);
}

TEST_CASE("small_gemm_bf16: rounds its operands (a product the fp32 kernel computes differently)", "[small_gemm]") {
    // 1 + 2^-9 is not a bfloat16 (8 fraction bits): it rounds to 1 (tie to even), so the product is 1, not 1 + 2^-8.
    const float a = 1.0f + 0x1p-9f, b = 1.0f + 0x1p-9f;
    using olmax::backend::Bf16GemmForm;
    for (Bf16GemmForm form : {Bf16GemmForm::fastest, Bf16GemmForm::dot, Bf16GemmForm::rounded, Bf16GemmForm::amx}) {
        float c = -1.0f;
        olmax::backend::small_gemm_bf16(false, false, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1, {}, form);
        REQUIRE(c == 1.0f);
    }
}

TEST_CASE("small_gemm_bf16: OLMAX_BF16_GEMM_FORM names the form the fastest choice runs, and a wrong value is refused", "[small_gemm]") {
    using olmax::backend::Bf16GemmForm;
    namespace d = olmax::backend::small_gemm_bf16_detail;
    CHECK_FALSE(d::requested_form(nullptr).has_value());
    CHECK_FALSE(d::requested_form("").has_value());
    CHECK(d::requested_form("amx") == Bf16GemmForm::amx);
    CHECK(d::requested_form("dot") == Bf16GemmForm::dot);
    CHECK(d::requested_form("rounded") == Bf16GemmForm::rounded);
    CHECK_THROWS_AS(d::requested_form("Dot"), olmax::value_error);
    CHECK_THROWS_WITH(d::requested_form("vdpbf16ps"), Catch::Matchers::Contains("OLMAX_BF16_GEMM_FORM=vdpbf16ps") &&
                                                          Catch::Matchers::Contains("expected amx, dot or rounded"));
    // A form the CPU lacks runs as the rounding form.
    CHECK(d::runnable(Bf16GemmForm::amx) == (d::amx_usable() ? Bf16GemmForm::amx : Bf16GemmForm::rounded));
    CHECK(d::runnable(Bf16GemmForm::dot) == (d::has_avx512_bf16() ? Bf16GemmForm::dot : Bf16GemmForm::rounded));
    // This process's choice follows the variable it was started with (CTest leaves it unset).
    const std::optional<Bf16GemmForm> asked = d::requested_form(std::getenv("OLMAX_BF16_GEMM_FORM"));
    const std::string_view picked = olmax::backend::small_gemm_bf16_fastest_form();
    if (asked) CHECK(picked == d::form_name(d::runnable(*asked)));
    else if (d::amx_usable()) CHECK(picked == "amx");
    else  // the CPU's rule (VDPBF16PS where it issues as often as a 512-bit FMA, or fp32 vectors are narrower)
        CHECK(picked == (d::has_avx512_bf16() && (olmax::backend::cpu_bf16_features().dot_at_fma_rate || olmax::backend::SmallGemm<float>::lanes < 16)
                             ? "dot"
                             : "rounded"));
}

TEST_CASE("small_gemm_transpose: whole register blocks and edges, leading dimensions past the extents", "[small_gemm]") {
    small_gemm_test::check_transpose<double>();
    small_gemm_test::check_transpose<float>();
}
