// oneDNN's GEMMs (olmax/backend/onednn_gemm.hpp, CMake target olmax::onednn): bf16 x bf16 -> fp32
// and fp32, against fp64 references of the same inputs, for odd and empty sizes and transposes;
// the path chosen from the CPU (accelerated, or fp32 with a one-time notice); bad shapes; the
// Trainer's precision scope (olmax/train/precision.hpp) on them when the program links the target.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <olmax/backend/onednn_gemm.hpp>
#include <olmax/olmax.hpp>

#include "bf16_gemm_cases.hpp"

#include <catch2/catch.hpp>

namespace {

using olmax::bfloat16;
using olmax::Tensor;
namespace backend = olmax::backend;
namespace onednn = olmax::backend::onednn;

struct Case {
    std::size_t m, n, k;
};
const Case cases[] = {{1, 1, 1}, {1, 7, 5}, {5, 1, 9}, {3, 4, 1}, {17, 13, 31}, {65, 33, 129}, {2, 3, 300}, {128, 96, 64}};

/// op(A) op(B) in double from the given values, and sum |a b| per element.
template <class T>
void reference(bool ta, bool tb, const Case& s, const std::vector<T>& a, const std::vector<T>& b, std::vector<double>& c,
               std::vector<double>& scale) {
    c.assign(s.m * s.n, 0.0);
    scale.assign(s.m * s.n, 0.0);
    for (std::size_t i = 0; i < s.m; ++i)
        for (std::size_t j = 0; j < s.n; ++j)
            for (std::size_t p = 0; p < s.k; ++p) {
                const double x = float(ta ? a[p * s.m + i] : a[i * s.k + p]), y = float(tb ? b[j * s.k + p] : b[p * s.n + j]);
                c[i * s.n + j] += x * y;
                scale[i * s.n + j] += std::abs(x * y);
            }
}

template <class T>
std::vector<T> random_values(std::size_t n, olmax::Generator& rng) {
    const auto f = olmax::randn<float>({n}, rng);
    if constexpr (std::is_same_v<T, float>) return std::vector<float>(f.begin(), f.end());
    else {
        const auto b = olmax::cast<bfloat16>(f);
        return std::vector<bfloat16>(b.begin(), b.end());
    }
}

/// Runs every case and transpose through `gemm` (with C prefilled, beta 0) and compares within
/// fp32 accumulation error: |C - ref| <= (k + 1) 2^-24 sum |a b|.
template <class T, class Gemm>
void check_against_reference(Gemm gemm) {
    olmax::Generator rng(5);
    for (const Case& s : cases)
        for (bool ta : {false, true})
            for (bool tb : {false, true}) {
                const auto a = random_values<T>(s.m * s.k, rng), b = random_values<T>(s.k * s.n, rng);
                std::vector<double> ref, scale;
                reference(ta, tb, s, a, b, ref, scale);
                std::vector<float> c(s.m * s.n, std::nanf(""));
                gemm(ta, tb, s.m, s.n, s.k, 1.0f, a.data(), ta ? s.m : s.k, b.data(), tb ? s.k : s.n, 0.0f, c.data(), s.n);
                const double tolerance = double(s.k + 1) * 0x1p-24;
                for (std::size_t i = 0; i < c.size(); ++i) {
                    INFO("m=" << s.m << " n=" << s.n << " k=" << s.k << " ta=" << ta << " tb=" << tb << " element " << i);
                    REQUIRE(std::abs(double(c[i]) - ref[i]) <= tolerance * scale[i] + 1e-30);
                }
            }
}

}  // namespace

TEST_CASE("onednn: bf16 support follows the CPU", "[onednn]") {
    const auto& support = onednn::bf16_support();
    INFO("oneDNN ISA " << support.isa << ", cpuid " << backend::cpu_bf16_features().to_string());
    CHECK(!support.isa.empty());
    // oneDNN's view can be lowered (ONEDNN_MAX_CPU_ISA) but never exceeds the hardware's.
    if (support.accelerated) CHECK(backend::cpu_bf16_features().any());
    const std::string impl = onednn::implementation(true, false, false, 64, 64, 64);
    INFO("bf16 implementation: '" << impl << "', fp32: '" << onednn::implementation(false, false, false, 64, 64, 64) << "'");
    if (!support.accelerated) CHECK(onednn::implementation(false, false, false, 64, 64, 64) != "");
    CHECK(impl.rfind("ref", 0) != 0);  // reference kernels are never used
}

TEST_CASE("onednn: fp32 GEMM equals an fp64 reference within fp32 accumulation error", "[onednn]") {
    check_against_reference<float>([](auto... args) { onednn::gemm(args...); });
}

TEST_CASE("onednn: bf16 GEMM equals an fp64 reference of the bf16 inputs within fp32 accumulation error", "[onednn]") {
    std::vector<std::string> notices;
    backend::set_bf16_notice_sink([&](std::string_view m) { notices.emplace_back(m); });
    backend::reset_bf16_notices();
    check_against_reference<bfloat16>([](auto... args) { onednn::gemm_bf16(args...); });
    // Not accelerated here: said once, and only once.
    if (!onednn::bf16_support().accelerated) {
        REQUIRE(notices.size() == 1);
        CHECK(notices[0].find("not accelerated") != std::string::npos);
    }
    backend::set_bf16_notice_sink({});
}

TEST_CASE("onednn: leading dimensions, alpha and beta, empty sizes, threads, bad shapes", "[onednn]") {
    backend::set_bf16_notice_sink([](std::string_view) {});
    const auto [a, b] = make_padded_bf16_operands();
    std::vector<float> c = {1, 1, 7, 1, 1, 7};
    onednn::gemm_bf16(false, false, 2, 2, 3, 2.0f, a.data(), 5, b.data(), 4, 0.5f, c.data(), 3);
    CHECK(c == std::vector<float>{8.5f, 10.5f, 7, 20.5f, 22.5f, 7});
    std::vector<float> af(a.begin(), a.end()), bf(b.begin(), b.end()), cf = {1, 1, 7, 1, 1, 7};
    onednn::gemm(false, false, 2, 2, 3, 2.0f, af.data(), 5, bf.data(), 4, 0.5f, cf.data(), 3);
    CHECK(cf == std::vector<float>{8.5f, 10.5f, 7, 20.5f, 22.5f, 7});

    std::vector<float> c0 = {1, 2, 3, 4};
    onednn::gemm_bf16(false, false, 2, 2, 0, 1.0f, a.data(), 1, b.data(), 2, 2.0f, c0.data(), 2);
    CHECK(c0 == std::vector<float>{2, 4, 6, 8});
    const auto e1 = onednn::matmul_bf16(Tensor<bfloat16>({3, 0}), Tensor<bfloat16>({0, 4}));
    REQUIRE(e1.shape() == olmax::Shape{3, 4});
    for (float v : e1) CHECK(v == 0.0f);
    CHECK(onednn::matmul_bf16(Tensor<bfloat16>({0, 5}), Tensor<bfloat16>({5, 4})).shape() == olmax::Shape{0, 4});
    CHECK(onednn::matmul_bf16(Tensor<bfloat16>({2, 5}), Tensor<bfloat16>({5, 0})).shape() == olmax::Shape{2, 0});

    // The portable path's product, up to summation order; on the default and the serial kernels.
    olmax::Generator rng(9);
    const auto x = olmax::cast<bfloat16>(olmax::randn<float>({37, 70}, rng)), w = olmax::cast<bfloat16>(olmax::randn<float>({50, 70}, rng));
    const auto want = backend::matmul_bf16(x, w, false, true);
    for (bool serial : {false, true}) {
        std::optional<backend::host_kernels_scope> scope;
        if (serial) scope.emplace(backend::kernels<backend::cpu_serial>());
        const auto got = onednn::matmul_bf16(x, w, false, true);
        REQUIRE(got.shape() == olmax::Shape{37, 50});
        for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(std::abs(got.data()[i] - want.data()[i]) <= 1e-4f * (1 + std::abs(want.data()[i])));
    }

    CHECK_THROWS_WITH(onednn::matmul_bf16(Tensor<bfloat16>({2, 3}), Tensor<bfloat16>({2, 3})),
                      "onednn::matmul_bf16: a x b with a of shape [2, 3] and b of shape [2, 3] do not multiply (inner sizes 3 and 2)");
    CHECK_THROWS_AS(onednn::matmul_bf16(Tensor<bfloat16>({3}), Tensor<bfloat16>({3, 2})), olmax::shape_error);
    CHECK_THROWS_AS(onednn::gemm_bf16(false, false, 2, 2, 3, 1.0f, a.data(), 2, b.data(), 4, 0.0f, c.data(), 3), olmax::value_error);
    CHECK_THROWS_AS(onednn::gemm(false, true, 2, 2, 3, 1.0f, af.data(), 5, bf.data(), 2, 0.0f, cf.data(), 3), olmax::value_error);
    backend::set_bf16_notice_sink({});
}

TEST_CASE("onednn: a batch of bf16 products in one call equals the products one by one", "[onednn]") {
    backend::set_bf16_notice_sink([](std::string_view) {});
    olmax::Generator rng(11);
    struct Layout {
        std::size_t count, m, n, k;
        bool ta, tb, share_a, share_b;
        float alpha, beta;
    };
    // The byte LM's: a convolution tap (shared weight B), the mixer (shared weight A, transposed),
    // its input gradient; then odd sizes, both operands per item, alpha and beta.
    const Layout layouts[] = {{8, 64, 128, 64, false, false, false, true, 1.0f, 0.0f}, {32, 16, 64, 16, true, false, true, false, 1.0f, 0.0f},
                              {32, 16, 64, 16, false, false, true, false, 1.0f, 1.0f}, {5, 7, 13, 9, false, true, false, false, 0.5f, 2.0f},
                              {3, 17, 5, 33, true, true, false, true, 1.0f, 1.0f}};
    for (const Layout& l : layouts) {
        INFO("count " << l.count << " m " << l.m << " n " << l.n << " k " << l.k << " ta " << l.ta << " tb " << l.tb << " shared A "
                      << l.share_a << " shared B " << l.share_b);
        const std::size_t stride_a = l.share_a ? 0 : l.m * l.k, stride_b = l.share_b ? 0 : l.k * l.n, stride_c = l.m * l.n;
        const auto a = random_values<bfloat16>(l.share_a ? l.m * l.k : l.count * l.m * l.k, rng);
        const auto b = random_values<bfloat16>(l.share_b ? l.k * l.n : l.count * l.k * l.n, rng);
        const auto c0 = random_values<float>(l.count * stride_c, rng);
        std::vector<float> batched = c0, one_by_one = c0;
        const std::size_t lda = l.ta ? l.m : l.k, ldb = l.tb ? l.k : l.n;
        const bool ran = onednn::gemm_batched_bf16(l.count, l.ta, l.tb, l.m, l.n, l.k, l.alpha, a.data(), lda, stride_a, b.data(), ldb,
                                                   stride_b, l.beta, batched.data(), l.n, stride_c);
        for (std::size_t i = 0; i < l.count; ++i)
            onednn::gemm_bf16(l.ta, l.tb, l.m, l.n, l.k, l.alpha, a.data() + i * stride_a, lda, b.data() + i * stride_b, ldb, l.beta,
                              one_by_one.data() + i * stride_c, l.n);
        // The model's layouts (the first three) run as one call on AVX512-BF16 (measured there;
        // on AMX which kernel oneDNN picks is its choice, and only the numbers are required).
        if (onednn::bf16_support().isa == "avx512_core_bf16" && &l - layouts < 3) CHECK(ran);
        if (!ran) {  // nothing computed: the caller runs the items (no bf16 units here, or no batch kernel)
            CHECK(batched == c0);
            continue;
        }
        // The same products; the kernels may block the sums differently: fp32 accumulation error.
        for (std::size_t i = 0; i < batched.size(); ++i) {
            INFO("element " << i);
            REQUIRE(std::abs(batched[i] - one_by_one[i]) <= 1e-5f * (1.0f + std::abs(one_by_one[i])));
        }
    }

    // Through the policy's kernels: a layout the batch kernels may refuse (items with gaps between
    // them) still gives the products, item by item.
    const std::size_t count = 4, m = 6, n = 8, k = 5, gap = 3;
    const auto a = random_values<bfloat16>(count * (m * k + gap), rng), b = random_values<bfloat16>(k * n, rng);
    std::vector<float> c(count * (m * n + gap), 0.0f), want = c;
    backend::Bf16MatmulKernels policy(backend::host_kernels(), onednn::gemm_bf16, onednn::gemm_batched_bf16);
    policy.gemm_batched_bf16(count, false, false, m, n, k, 1.0f, a.data(), k, m * k + gap, b.data(), n, 0, 0.0f, c.data(), n, m * n + gap);
    for (std::size_t i = 0; i < count; ++i)
        onednn::gemm_bf16(false, false, m, n, k, 1.0f, a.data() + i * (m * k + gap), k, b.data(), n, 0.0f, want.data() + i * (m * n + gap), n);
    for (std::size_t i = 0; i < c.size(); ++i) REQUIRE(std::abs(c[i] - want[i]) <= 1e-5f * (1.0f + std::abs(want[i])));

    // Items whose outputs overlap are not a batch: refused, nothing written.
    std::vector<float> overlapping(64, 1.0f);
    CHECK_FALSE(onednn::gemm_batched_bf16(2, false, false, m, n, k, 1.0f, a.data(), k, m * k, b.data(), n, 0, 0.0f, overlapping.data(), n, n));
    CHECK(overlapping == std::vector<float>(64, 1.0f));
    CHECK_FALSE(onednn::gemm_batched_bf16(1, false, false, m, n, k, 1.0f, a.data(), k, m * k, b.data(), n, 0, 0.0f, c.data(), n, m * n));
    CHECK_THROWS_AS(onednn::gemm_batched_bf16(2, false, false, m, n, k, 1.0f, a.data(), 2, m * k, b.data(), n, 0, 0.0f, c.data(), n, m * n),
                    olmax::value_error);
    backend::set_bf16_notice_sink({});
}

TEST_CASE("onednn: inside a float_gemm_scope an op's fp32 GEMMs, forward and backward, run on oneDNN; double ones stay on the wrapped kernels",
          "[onednn]") {
    olmax::Generator rng(12);
    const auto x = olmax::randn<float>({33, 65}, rng), w = olmax::randn<float>({65, 17}, rng);
    auto run = [&] {  // y = x w, and the gradients of sum(y * y)
        Tensor<float> xs = x.detach().set_requires_grad(true), ws = w.detach().set_requires_grad(true);
        olmax::sum(olmax::square(olmax::matmul(xs, ws))).backward();
        return std::vector<Tensor<float>>{olmax::matmul(x, w), xs.grad(), ws.grad()};
    };
    const auto eigen = run();
    std::size_t calls = 0;
    std::vector<Tensor<float>> through;
    {
        backend::float_gemm_scope scope([&](auto... args) { ++calls, onednn::gemm(args...); }, "onednn");
        CHECK(std::string(backend::host_kernels().name()).find("+onednn_gemm") != std::string::npos);
        through = run();
        CHECK(calls >= 3);  // the product and both gradients
        const std::size_t before = calls;
        const auto xd = olmax::randn<double>({4, 5}, rng), wd = olmax::randn<double>({5, 3}, rng);
        (void)olmax::matmul(xd, wd);
        CHECK(calls == before);  // double GEMMs (the gradient checks' reference) left exact
    }
    CHECK(std::string(backend::host_kernels().name()).find("onednn") == std::string::npos);  // the scope is gone
    for (std::size_t t = 0; t < eigen.size(); ++t)
        for (std::size_t i = 0; i < eigen[t].size(); ++i) {
            INFO("tensor " << t << " element " << i);
            REQUIRE(std::abs(through[t].data()[i] - eigen[t].data()[i]) <= 1e-4f * (1.0f + std::abs(eigen[t].data()[i])));  // fp32 sums in another order
        }
}

TEST_CASE("onednn: a program linking olmax::onednn gets its GEMMs from the Trainer's precision scope, bf16 and fp32", "[onednn][train]") {
    static_assert(olmax::train::links_onednn, "the target olmax::onednn defines OLMAX_HAS_ONEDNN for the code that links it");
    backend::set_bf16_notice_sink([](std::string_view) {});  // a CPU without bf16 units says so once
    olmax::Generator rng(21);
    const auto a = olmax::randn<float>({7, 33}, rng), b = olmax::randn<float>({33, 9}, rng);
    Tensor<float> library, direct;
    {
        const olmax::train::PrecisionScope precision("bf16");  // what Trainer::run() holds for TrainerOptions::precision = "bf16"
        CHECK(precision.note() == "precision bf16: GEMMs on " + onednn::bf16_gemm_description());
        CHECK(precision.bf16_gemm() == onednn::bf16_gemm_description());
        library = olmax::matmul(a, b);
    }
    {
        backend::bf16_matmul_scope scope(onednn::gemm_bf16, onednn::gemm_batched_bf16);
        direct = olmax::matmul(a, b);
    }
    CHECK(library.shape() == direct.shape());
    CHECK(std::equal(library.data(), library.data() + library.size(), direct.data()));  // the same product, bit for bit
    {
        const olmax::train::PrecisionScope precision("fp32");
        CHECK(precision.note().empty());
        CHECK(precision.fp32_gemm() == "onednn " + onednn::version());
        CHECK(std::string(backend::host_kernels().name()).find("+onednn_gemm") != std::string::npos);
    }
    {
        const olmax::train::PrecisionScope precision("fp32", /*onednn_fp32_gemm=*/false);  // train_step --fp32_gemm eigen
        CHECK(precision.fp32_gemm().empty());
        CHECK(std::string(backend::host_kernels().name()).find("onednn") == std::string::npos);
    }
    backend::set_bf16_notice_sink({});
}
