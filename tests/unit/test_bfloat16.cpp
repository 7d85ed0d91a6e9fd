// bfloat16: rounding (ties to even, overflow, subnormals, NaN, signed zero, once from double),
// tensors of it (fill, print, cast both ways), .npy files interchangeable with ml_dtypes (jax),
// archives, and the portable bf16 GEMM against an fp64 reference of the same bf16 inputs.
#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <olmax/backend/bf16_gemm.hpp>
#include <olmax/backend/cpu_features.hpp>
#include <olmax/io/io.hpp>

#include "bf16_gemm_cases.hpp"
#include "test_helpers.hpp"

namespace {
using olmax_test::temp_dir;
using olmax_test::test_data_dir;

using olmax::bfloat16;
using olmax::Tensor;

std::uint16_t bits_of(float f) { return bfloat16(f).bits(); }
float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }

// Compile-time checks: a storage type, not a differentiable one.
static_assert(olmax::Scalar<bfloat16> && !olmax::Real<bfloat16>);
static_assert(olmax::dtype_name<bfloat16>() == "bfloat16");
static_assert(bfloat16(1.0f).bits() == 0x3F80 && float(bfloat16::from_bits(0xC020)) == -2.5f);  // constexpr both ways
static_assert(!std::is_convertible_v<float, bfloat16> && std::is_convertible_v<bfloat16, float>);  // rounding is explicit

}  // namespace

TEST_CASE("bfloat16: float -> bfloat16 rounds to nearest, ties to even", "[bfloat16]") {
    CHECK(bits_of(1.0f) == 0x3F80);
    CHECK(bits_of(-2.5f) == 0xC020);
    // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even neighbour (1).
    CHECK(bits_of(1.0f + 0x1p-8f) == 0x3F80);
    // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up.
    CHECK(bits_of(1.0f + 3 * 0x1p-8f) == 0x3F82);
    // Just above and below a tie round to the nearer neighbour.
    CHECK(bits_of(from_bits(0x3F808001)) == 0x3F81);
    CHECK(bits_of(from_bits(0x3F807FFF)) == 0x3F80);
    // Rounding up carries into the exponent: the largest float below 2 becomes 2.
    CHECK(bits_of(from_bits(0x3FFFFFFF)) == 0x4000);
}

TEST_CASE("bfloat16: range ends, subnormals, infinities, NaN and signed zero", "[bfloat16]") {
    using limits = std::numeric_limits<bfloat16>;
    const float max = float(limits::max());
    CHECK(max == 0x1.FEp127f);
    CHECK(bits_of(max) == 0x7F7F);
    CHECK(float(limits::lowest()) == -max);
    // Past max by less than half an ulp (2^119): stays max; from the halfway point up: infinity.
    CHECK(bits_of(from_bits(0x7F7F7FFF)) == 0x7F7F);
    CHECK(bits_of(from_bits(0x7F7F8000)) == 0x7F80);  // tie between max (odd) and 2^128: to even, infinity
    CHECK(bits_of(std::numeric_limits<float>::max()) == 0x7F80);
    CHECK(bits_of(-std::numeric_limits<float>::max()) == 0xFF80);
    CHECK(bits_of(std::numeric_limits<float>::infinity()) == 0x7F80);
    CHECK(bits_of(-std::numeric_limits<float>::infinity()) == 0xFF80);
    CHECK(std::isinf(float(limits::infinity())));
    // Subnormals: bfloat16 keeps float's subnormal range with 7 fraction bits.
    CHECK(float(limits::denorm_min()) == 0x1p-133f);
    CHECK(bits_of(0x1p-133f) == 0x0001);
    CHECK(bits_of(0x1p-134f) == 0x0000);  // tie between 0 (even) and denorm_min: 0
    CHECK(bits_of(0x1.8p-134f) == 0x0001);
    CHECK(bits_of(0x3p-134f) == 0x0002);  // 1.5 * denorm_min: tie, to even (2 * denorm_min)
    CHECK(bits_of(std::numeric_limits<float>::denorm_min()) == 0x0000);
    CHECK(bits_of(-std::numeric_limits<float>::denorm_min()) == 0x8000);  // sign kept: -0
    CHECK(float(limits::min()) == std::numeric_limits<float>::min());
    CHECK(bits_of(from_bits(0x007FFFFF)) == 0x0080);  // largest float subnormal rounds up to the smallest normal
    // Signed zero.
    CHECK(bits_of(0.0f) == 0x0000);
    CHECK(bits_of(-0.0f) == 0x8000);
    CHECK(std::signbit(float(bfloat16(-0.0f))));
    // NaN stays NaN (quiet), whatever its payload, with its sign; even a payload only in the low 16 bits.
    for (std::uint32_t nan : {0x7FC00000u, 0x7F800001u, 0x7FA00000u, 0xFFC00000u, 0x7F80FFFFu}) {
        const bfloat16 b(from_bits(nan));
        INFO(std::hex << nan);
        CHECK(std::isnan(float(b)));
        CHECK((b.bits() & 0x0040) != 0);  // quiet
        CHECK((b.bits() >> 15) == (nan >> 31));
    }
    CHECK(std::isnan(float(limits::quiet_NaN())));
    CHECK(std::isnan(float(limits::signaling_NaN())));
    // Every bfloat16 converts to float and back unchanged (NaNs as quiet NaNs).
    for (std::uint32_t u = 0; u <= 0xFFFF; ++u) {
        const auto b = bfloat16::from_bits(std::uint16_t(u));
        const bool nan = (u & 0x7FFF) > 0x7F80;
        if (nan) CHECK(bfloat16(float(b)).bits() == (u | 0x40));
        else if (bfloat16(float(b)).bits() != u) FAIL("bits " << u << " do not round-trip");
    }
    CHECK(float(limits::epsilon()) == 0x1p-7f);
}

TEST_CASE("bfloat16: doubles and integers are rounded once", "[bfloat16]") {
    // 1 + 2^-8 + 2^-30 is just above the tie 1 + 2^-8: up to 1 + 2^-7. Through float it would first
    // become the tie (2^-30 is below float's precision at 1), which then rounds down to 1.
    const double above_tie = 1.0 + 0x1p-8 + 0x1p-30;
    CHECK(bfloat16(above_tie).bits() == 0x3F81);
    CHECK(bfloat16(static_cast<float>(above_tie)).bits() == 0x3F80);
    CHECK(bfloat16(1.0 + 0x1p-8 - 0x1p-30).bits() == 0x3F80);
    CHECK(bfloat16(1.0 + 0x1p-8).bits() == 0x3F80);  // an exact tie still goes to even
    CHECK(bfloat16(-above_tie).bits() == 0xBF81);
    CHECK(bfloat16(1e300).bits() == 0x7F80);
    CHECK(bfloat16(-1e300).bits() == 0xFF80);
    CHECK(bfloat16(1e-300).bits() == 0x0000);
    CHECK(bfloat16(-1e-300).bits() == 0x8000);
    CHECK(std::isnan(float(bfloat16(std::nan("")))));
    CHECK(bfloat16(std::numeric_limits<double>::infinity()).bits() == 0x7F80);
    // Integers: 257 is a tie between 256 and 258 (8 significant bits): to even, 256; 259 -> 260.
    CHECK(float(bfloat16(257)) == 256.0f);
    CHECK(float(bfloat16(259)) == 260.0f);
    CHECK(float(bfloat16(std::int64_t(1) << 40)) == 0x1p40f);
    CHECK(float(bfloat16(std::uint8_t(255))) == 255.0f);   // 8 significant bits: exact
    CHECK(float(bfloat16(std::uint16_t(511))) == 512.0f);  // 9: a tie, to even
    CHECK(float(bfloat16(-3)) == -3.0f);
}

TEST_CASE("bfloat16: tensors store it, print it and cast to and from it", "[bfloat16]") {
    Tensor<bfloat16> z({2, 3});
    for (bfloat16 v : z) CHECK(v.bits() == 0);
    const auto o = olmax::ones<bfloat16>({4});
    for (bfloat16 v : o) CHECK(float(v) == 1.0f);
    const auto r = olmax::arange<bfloat16>(5);
    CHECK(float(r(4)) == 4.0f);
    auto t = Tensor<bfloat16>::from({2, 2}, {bfloat16(1.5f), bfloat16(-2.0f), bfloat16(0.1f), bfloat16(300.0f)});
    std::ostringstream out;
    out << t;
    CHECK(out.str() == "Tensor<bfloat16>[2, 2] [[1.5, -2],\n [0.100098, 300]]");
    CHECK(t.clone()(1, 1).bits() == t(1, 1).bits());

    // float -> bfloat16 -> float: each element the float nearest... of the bfloat16 nearest.
    olmax::Generator rng(3);
    auto f = olmax::randn<float>({7, 33}, rng, 0.0f, 100.0f);
    f.data()[0] = std::numeric_limits<float>::infinity();
    f.data()[1] = -0.0f;
    f.data()[2] = std::numeric_limits<float>::quiet_NaN();
    f.data()[3] = 1.0f + 0x1p-8f;
    const auto b = olmax::cast<bfloat16>(f);
    REQUIRE(b.shape() == f.shape());
    for (std::size_t i = 0; i < f.size(); ++i) {
        if (b.data()[i].bits() != bfloat16(f.data()[i]).bits()) FAIL("element " << i);
        const float back = b.data()[i];
        if (!std::isnan(back) && std::isfinite(f.data()[i]) && std::abs(back - f.data()[i]) > std::abs(f.data()[i]) * 0x1p-8f)
            FAIL("element " << i << ": " << f.data()[i] << " -> " << back);
    }
    const auto f2 = olmax::cast<float>(b);
    CHECK(std::isinf(f2.data()[0]));
    CHECK(std::signbit(f2.data()[1]));
    CHECK(std::isnan(f2.data()[2]));
    CHECK(f2.data()[3] == 1.0f);
    // A second trip changes nothing: bfloat16 -> float is exact.
    const auto b2 = olmax::cast<bfloat16>(f2);
    for (std::size_t i = 0; i < b.size(); ++i)
        if (b2.data()[i].bits() != b.data()[i].bits()) FAIL("element " << i);
    // double, through the same single rounding; and integers.
    const auto d = olmax::cast<double>(b);
    CHECK(d.data()[3] == 1.0);
    const auto bd = olmax::cast<bfloat16>(Tensor<double>::from({2}, {1.0 + 0x1p-8 + 0x1p-30, -7.0}));
    CHECK(bd(0).bits() == 0x3F81);
    CHECK(float(bd(1)) == -7.0f);
    const auto i32 = olmax::cast<std::int32_t>(olmax::cast<bfloat16>(Tensor<std::int32_t>::from({3}, {257, -3, 1000})));
    CHECK(i32(0) == 256);
    CHECK(i32(1) == -3);
    CHECK(i32(2) == 1000);
}

TEST_CASE("bfloat16: .npy files are those of ml_dtypes (jax)", "[bfloat16][io]") {
    namespace io = olmax::io;
    // Written by ml_dtypes through numpy.save (tests/data/make_npy_bfloat16_reference.py): descriptor
    // '<V2', the float32 values below rounded by ml_dtypes.
    const float source[] = {1.0f, -2.5f, 1 + 0x1p-8f, 1 + 3 * 0x1p-8f, 3.3895314e38f, 3.4e38f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), -0.0f, 0x1p-133f, 1.0e-38f, std::numeric_limits<float>::quiet_NaN()};
    const auto ref = io::load_npy<bfloat16>(test_data_dir() / "npy_bfloat16_3x4.npy");
    REQUIRE(ref.shape() == olmax::Shape{3, 4});
    for (std::size_t i = 0; i < 12; ++i) {
        INFO("element " << i);
        CHECK(ref.data()[i].bits() == bfloat16(source[i]).bits());  // our rounding is ml_dtypes' rounding
    }
    const auto fortran = io::load_npy<bfloat16>(test_data_dir() / "npy_bfloat16_fortran_2x3.npy");
    REQUIRE(fortran.shape() == olmax::Shape{2, 3});
    CHECK(float(fortran(0, 1)) == -1.5f);
    CHECK(float(fortran(1, 0)) == 0.5f);
    // A bfloat16 file is not silently read as another type, nor another type as bfloat16.
    CHECK_THROWS_AS(io::load_npy<float>(test_data_dir() / "npy_bfloat16_3x4.npy"), olmax::value_error);
    CHECK_THROWS_WITH(io::load_npy<bfloat16>(test_data_dir() / "npy_float64_2x3.npy"), Catch::Contains("not a bfloat16 array"));

    // Round trip, and the header ml_dtypes / numpy.load expect.
    const auto dir = temp_dir("npy");
    io::save_npy(dir / "b.npy", ref);
    const auto back = io::load_npy<bfloat16>(dir / "b.npy");
    REQUIRE(back.shape() == ref.shape());
    for (std::size_t i = 0; i < ref.size(); ++i) CHECK(back.data()[i].bits() == ref.data()[i].bits());
    std::ifstream in(dir / "b.npy", std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(bytes.find("'descr': '<V2'") != std::string::npos);
    CHECK(bytes.size() % 2 == 0);
    io::save_npy(dir / "empty.npy", Tensor<bfloat16>({0, 3}));
    CHECK(io::load_npy<bfloat16>(dir / "empty.npy").shape() == olmax::Shape{0, 3});
    std::filesystem::remove_all(dir);
}

TEST_CASE("bfloat16: archives store it", "[bfloat16][io]") {
    namespace io = olmax::io;
    io::Archive a;
    const auto t = Tensor<bfloat16>::from({3}, {bfloat16(1.5f), bfloat16::from_bits(0x7FC1), bfloat16(-0.0f)});
    a.put("h", t);
    a.put("w", Tensor<float>::from({1}, {2.0f}));
    const auto back = io::Archive::deserialize(a.serialize());
    CHECK(back.entry("h").kind == io::EntryKind::bfloat16);
    CHECK(back.entry("h").data.size() == 6);
    const auto h = back.get<bfloat16>("h");
    REQUIRE(h.shape() == t.shape());
    for (std::size_t i = 0; i < 3; ++i) CHECK(h.data()[i].bits() == t.data()[i].bits());
    CHECK_THROWS_WITH(back.get<float>("h"), Catch::Contains("holds bfloat16, not float32"));
    CHECK_THROWS_WITH(back.get<bfloat16>("w"), Catch::Contains("holds float32, not bfloat16"));
}

namespace {

/// op(A) op(B) in double from the bf16 values (exact products, double sums), and sum |a||b| per
/// element (the scale of fp32 accumulation's error).
void reference_gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, const std::vector<bfloat16>& a,
                    const std::vector<bfloat16>& b, std::vector<double>& c, std::vector<double>& scale) {
    c.assign(m * n, 0.0);
    scale.assign(m * n, 0.0);
    for (std::size_t i = 0; i < m; ++i)
        for (std::size_t j = 0; j < n; ++j)
            for (std::size_t p = 0; p < k; ++p) {
                const double x = float(ta ? a[p * m + i] : a[i * k + p]), y = float(tb ? b[j * k + p] : b[p * n + j]);
                c[i * n + j] += x * y;
                scale[i * n + j] += std::abs(x * y);
            }
}

std::vector<bfloat16> random_bf16(std::size_t n, olmax::Generator& rng) {
    const auto f = olmax::randn<float>({n}, rng);
    const auto b = olmax::cast<bfloat16>(f);
    return std::vector<bfloat16>(b.begin(), b.end());
}

}  // namespace

TEST_CASE("bf16 GEMM (portable): equals an fp64 product of the bf16 inputs within fp32 accumulation error", "[bfloat16][gemm]") {
    olmax::backend::set_bf16_notice_sink([](std::string_view) {});
    olmax::Generator rng(11);
    struct Case {
        std::size_t m, n, k;
    };
    for (Case s : {Case{1, 1, 1}, Case{1, 7, 5}, Case{5, 1, 9}, Case{3, 4, 1}, Case{17, 13, 31}, Case{65, 33, 129}, Case{2, 3, 300}})
        for (bool ta : {false, true})
            for (bool tb : {false, true}) {
                const auto a = random_bf16(s.m * s.k, rng), b = random_bf16(s.k * s.n, rng);
                std::vector<double> ref, scale;
                reference_gemm(ta, tb, s.m, s.n, s.k, a, b, ref, scale);
                std::vector<float> c(s.m * s.n, 123.0f);
                olmax::backend::gemm_bf16(ta, tb, s.m, s.n, s.k, 1.0f, a.data(), ta ? s.m : s.k, b.data(), tb ? s.k : s.n, 0.0f, c.data(), s.n);
                // fp32 accumulation of k products: |error| <= about k 2^-24 sum |a b| (plus the final rounding).
                const double tolerance = double(s.k + 1) * 0x1p-24;
                for (std::size_t i = 0; i < c.size(); ++i) {
                    INFO("m=" << s.m << " n=" << s.n << " k=" << s.k << " ta=" << ta << " tb=" << tb << " element " << i);
                    REQUIRE(std::abs(double(c[i]) - ref[i]) <= tolerance * scale[i] + 1e-30);
                }
                // Through tensors: the same values.
                auto ta_shape = ta ? olmax::Shape{s.k, s.m} : olmax::Shape{s.m, s.k};
                auto tb_shape = tb ? olmax::Shape{s.n, s.k} : olmax::Shape{s.k, s.n};
                const auto ct = olmax::backend::matmul_bf16(Tensor<bfloat16>::from(ta_shape, std::span<const bfloat16>(a)),
                                                            Tensor<bfloat16>::from(tb_shape, std::span<const bfloat16>(b)), ta, tb);
                REQUIRE(ct.shape() == olmax::Shape{s.m, s.n});
                for (std::size_t i = 0; i < c.size(); ++i) REQUIRE(ct.data()[i] == c[i]);
            }
    olmax::backend::set_bf16_notice_sink({});
}

TEST_CASE("bf16 GEMM (portable): leading dimensions, alpha and beta, empty sizes, and bad shapes", "[bfloat16][gemm]") {
    namespace backend = olmax::backend;
    backend::set_bf16_notice_sink([](std::string_view) {});
    // A 2x3 block inside rows of 5, B 3x2 inside rows of 4, C inside rows of 3: C = 2 A B + 0.5 C.
    const auto [a, b] = make_padded_bf16_operands();
    std::vector<float> c = {1, 1, 7, 1, 1, 7};
    backend::gemm_bf16(false, false, 2, 2, 3, 2.0f, a.data(), 5, b.data(), 4, 0.5f, c.data(), 3);
    CHECK(c == std::vector<float>{8.5f, 10.5f, 7, 20.5f, 22.5f, 7});  // A B = [[4, 5], [10, 11]]; column 2 untouched

    // k = 0: C = beta C; m or n = 0: nothing.
    std::vector<float> c0 = {1, 2, 3, 4};
    backend::gemm_bf16(false, false, 2, 2, 0, 1.0f, a.data(), 1, b.data(), 2, 0.0f, c0.data(), 2);
    CHECK(c0 == std::vector<float>{0, 0, 0, 0});
    const auto e1 = backend::matmul_bf16(Tensor<bfloat16>({3, 0}), Tensor<bfloat16>({0, 4}));
    REQUIRE(e1.shape() == olmax::Shape{3, 4});
    for (float v : e1) CHECK(v == 0.0f);
    CHECK(backend::matmul_bf16(Tensor<bfloat16>({0, 5}), Tensor<bfloat16>({5, 4})).shape() == olmax::Shape{0, 4});
    CHECK(backend::matmul_bf16(Tensor<bfloat16>({2, 5}), Tensor<bfloat16>({5, 0})).shape() == olmax::Shape{2, 0});
    CHECK(backend::matmul_bf16(Tensor<bfloat16>({5, 0}), Tensor<bfloat16>({5, 4}), true).shape() == olmax::Shape{0, 4});

    // Sizes that do not multiply, ranks other than 2, short leading dimensions.
    CHECK_THROWS_AS(backend::matmul_bf16(Tensor<bfloat16>({2, 3}), Tensor<bfloat16>({2, 3})), olmax::shape_error);
    CHECK_THROWS_WITH(backend::matmul_bf16(Tensor<bfloat16>({2, 3}), Tensor<bfloat16>({2, 3})),
                      "matmul_bf16: a x b with a of shape [2, 3] and b of shape [2, 3] do not multiply (inner sizes 3 and 2)");
    CHECK_NOTHROW(backend::matmul_bf16(Tensor<bfloat16>({2, 3}), Tensor<bfloat16>({2, 3}), false, true));
    CHECK_THROWS_WITH(backend::matmul_bf16(Tensor<bfloat16>({2, 3}), Tensor<bfloat16>({4, 3}), true, true),
                      Catch::Contains("a^T x b^T") && Catch::Contains("inner sizes 2 and 3"));
    CHECK_THROWS_AS(backend::matmul_bf16(Tensor<bfloat16>({2, 2, 3}), Tensor<bfloat16>({3, 2})), olmax::shape_error);
    CHECK_THROWS_AS(backend::gemm_bf16(false, false, 2, 2, 3, 1.0f, a.data(), 2, b.data(), 4, 0.0f, c.data(), 3), olmax::value_error);
    backend::set_bf16_notice_sink({});
}

TEST_CASE("bf16 GEMM (portable): says once that it computes in fp32", "[bfloat16][gemm]") {
    namespace backend = olmax::backend;
    std::vector<std::string> notices;
    backend::set_bf16_notice_sink([&](std::string_view m) { notices.emplace_back(m); });
    backend::reset_bf16_notices();
    const Tensor<bfloat16> a({4, 4}), b({4, 4});
    (void)backend::matmul_bf16(a, b);
    (void)backend::matmul_bf16(a, b);
    REQUIRE(notices.size() == 1);
    CHECK(notices[0].find("compute in fp32") != std::string::npos);
    backend::set_bf16_notice_sink({});
}

TEST_CASE("bf16 CPU features agree with the kernel's /proc/cpuinfo", "[bfloat16]") {
    const auto features = olmax::backend::cpu_bf16_features();
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line;
    while (std::getline(cpuinfo, line) && line.rfind("flags", 0) != 0) {}
    if (line.empty()) {
        WARN("no flags line in /proc/cpuinfo: not compared");
        return;
    }
    line += ' ';
    INFO(features.to_string());
    CHECK(features.avx512_bf16 == (line.find(" avx512_bf16 ") != std::string::npos));
    CHECK(features.amx_bf16 == (line.find(" amx_bf16 ") != std::string::npos));
    CHECK(features.to_string() == (features.any() ? features.to_string() : std::string("none")));
}
