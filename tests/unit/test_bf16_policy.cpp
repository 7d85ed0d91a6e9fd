// The bf16 mixed-precision policy (backend::bf16_matmul_scope, Bf16MatmulKernels): inside it every
// float GEMM computes with both operands rounded to bfloat16 and fp32 sums, the rest stays fp32,
// double GEMMs stay exact; the gradients of the GEMM ops through it against fp64 at a bf16
// tolerance; the main job's model trains under it.

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include <olmax/olmax.hpp>

namespace backend = olmax::backend;

namespace {

std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = normal(rng);
    return v;
}

std::vector<float> rounded(const std::vector<float>& v) {
    std::vector<float> out(v.size());
    olmax::round_to_bfloat16(v.data(), out.data(), v.size());
    return out;
}

}  // namespace

TEST_CASE("bf16 policy: round_to_bfloat16 gives the bfloat16 value as a float", "[bf16][policy]") {
    const std::vector<float> in{1.0f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 256, -2.5f, 3.0e38f, 1e-40f};
    for (float x : in) {
        float out = 0;
        olmax::round_to_bfloat16(&x, &out, 1);
        CHECK(out == float(olmax::bfloat16(x)));
    }
}

TEST_CASE("bf16 policy: a GEMM in the scope is the fp32 GEMM of the operands rounded to bfloat16", "[bf16][policy]") {
    const std::size_t m = 5, n = 7, k = 9, ld_pad = 3;
    for (bool ta : {false, true})
        for (bool tb : {false, true}) {
            INFO("trans_a " << ta << ", trans_b " << tb);
            const std::size_t a_rows = ta ? k : m, a_cols = (ta ? m : k), lda = a_cols + ld_pad;
            const std::size_t b_rows = tb ? n : k, b_cols = (tb ? k : n), ldb = b_cols + ld_pad;
            const auto a = random_floats(a_rows * lda, 1), b = random_floats(b_rows * ldb, 2), c0 = random_floats(m * n, 3);
            const auto& base = backend::host_kernels();
            auto expected = c0, got = c0;
            base.gemm(ta, tb, m, n, k, 0.5f, rounded(a).data(), lda, rounded(b).data(), ldb, 2.0f, expected.data(), n);
            {
                backend::bf16_matmul_scope bf16;
                CHECK(backend::current().name() == std::string(base.name()) + "+bf16_matmul");
                backend::current().gemm(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 2.0f, got.data(), n);
            }
            CHECK(got == expected);
            // the same through a given bf16 product (what oneDNN's gemm_bf16 plugs into)
            auto through = c0;
            backend::Bf16MatmulKernels portable(base, [](auto... args) { backend::gemm_bf16(args...); });
            portable.gemm(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 2.0f, through.data(), n);
            CHECK(through == expected);
        }
    // k = 0 leaves beta C; double GEMMs are not rounded
    backend::bf16_matmul_scope bf16;
    std::vector<float> c{1, 2};
    backend::current().gemm(false, false, 1, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 3.0f, c.data(), 2);
    CHECK(c == std::vector<float>{3, 6});
    const double a = 1.0 + 1e-9, b = 3.0;
    double d = 0;
    backend::current().gemm(false, false, 1, 1, 1, 1.0, &a, 1, &b, 1, 0.0, &d, 1);
    CHECK(d == a * b);
}

TEST_CASE("gemm_batched: every item is the item's GEMM, in the scope too (shared B rounded once)", "[bf16][policy][backend]") {
    const std::size_t m = 6, n = 5, k = 7, pad = 2;
    for (std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(3), std::size_t(8)})
        for (bool shared_b : {false, true})
            for (bool ta : {false, true})
                for (bool tb : {false, true}) {
                    INFO("count " << count << ", shared B " << shared_b << ", trans_a " << ta << ", trans_b " << tb);
                    const std::size_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
                    const std::size_t stride_a = (ta ? k : m) * lda + 1, stride_b = shared_b ? 0 : (tb ? n : k) * ldb + 3,
                                      stride_c = m * ldc + 2;
                    const auto a = random_floats(count * stride_a + 1, 4), b = random_floats(std::max<std::size_t>(count, 1) * (tb ? n : k) * ldb + 3 * count + 1, 5);
                    const auto c0 = random_floats(count * stride_c + 1, 6);
                    for (bool bf16 : {false, true}) {
                        INFO("bf16 scope " << bf16);
                        // expected: one GEMM per item (in the scope: each rounds its own operands)
                        auto expected = c0, got = c0;
                        std::optional<backend::bf16_matmul_scope> scope;
                        if (bf16) scope.emplace();
                        for (std::size_t i = 0; i < count; ++i)
                            backend::current().gemm(ta, tb, m, n, k, 0.5f, a.data() + i * stride_a, lda, b.data() + i * stride_b, ldb, 1.5f,
                                                    expected.data() + i * stride_c, ldc);
                        backend::current().gemm_batched(count, ta, tb, m, n, k, 0.5f, a.data(), lda, stride_a, b.data(), ldb, stride_b, 1.5f,
                                                        got.data(), ldc, stride_c);
                        CHECK(got == expected);  // padding between items untouched too
                        if (!bf16) continue;
                        // the same through a given bf16 product (the bfloat16 operand path oneDNN plugs into)
                        backend::Bf16MatmulKernels through(backend::host_kernels(), [](auto... args) { backend::gemm_bf16(args...); });
                        auto via = c0;
                        through.gemm_batched(count, ta, tb, m, n, k, 0.5f, a.data(), lda, stride_a, b.data(), ldb, stride_b, 1.5f, via.data(), ldc,
                                             stride_c);
                        CHECK(via == expected);
                    }
                }
}

TEST_CASE("bf16 policy: gradients of the GEMM ops through it agree with fp64 at a bf16 tolerance", "[bf16][policy]") {
    // bf16 keeps 8 significant bits (each operand rounded by at most 2^-9 relative): a sum of such
    // products in fp32 stays within about 2^-8 of the exact value, relative to the result's scale.
    // The forward GEMMs and the backward ones (dA = dC B^T, dB = A^T dC) all run in the scope.
    constexpr double tolerance = 1.5e-2;
    olmax::Generator rng(5);
    auto relative_error = [](const olmax::Tensor<float>& got, const olmax::Tensor<double>& want) {
        double scale = 0, worst = 0;
        for (std::size_t i = 0; i < want.size(); ++i) scale = std::max(scale, std::abs(want.data()[i]));
        for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(double(got.data()[i]) - want.data()[i]));
        return worst / scale;
    };
    // loss = sum(op(a, b) * r): the gradients of a and b in float under the policy against fp64
    auto check_op = [&](const char* what, const olmax::Shape& a_shape, const olmax::Shape& b_shape, auto op) {
        INFO(what);
        const auto a64 = olmax::randn<double>(a_shape, rng), b64 = olmax::randn<double>(b_shape, rng);
        auto a = olmax::parameter(a64.clone()), b = olmax::parameter(b64.clone());
        const auto y64 = op(a, b);
        const auto r64 = olmax::randn<double>(y64.shape(), rng);
        olmax::sum(olmax::mul(y64, r64)).backward();
        auto af = olmax::parameter(olmax::cast<float>(a64)), bf = olmax::parameter(olmax::cast<float>(b64));
        {
            backend::bf16_matmul_scope bf16;
            olmax::sum(olmax::mul(op(af, bf), olmax::cast<float>(r64))).backward();
        }
        const double ea = relative_error(af.grad(), a.grad()), eb = relative_error(bf.grad(), b.grad());
        INFO("relative errors " << ea << " and " << eb);
        CHECK(ea < tolerance);
        CHECK(eb < tolerance);
        CHECK(ea > 1e-5);  // rounded: fp32 alone would be near 1e-7
        CHECK(eb > 1e-5);
    };
    check_op("matmul", {16, 32}, {32, 24}, [](const auto& a, const auto& b) { return olmax::matmul(a, b); });
    check_op("causal_conv1d", {2, 16, 8}, {3, 8, 12}, [](const auto& x, const auto& w) { return olmax::causal_conv1d(x, w); });
    check_op("causal_conv1d, 2 groups", {3, 16, 8}, {3, 4, 12}, [](const auto& x, const auto& w) { return olmax::causal_conv1d(x, w, 2); });
    check_op("matmul batched", {3, 8, 16}, {3, 16, 12}, [](const auto& a, const auto& b) { return olmax::matmul(a, b); });
    check_op("contract_axis (the mixer's)", {4, 16, 12}, {16, 16}, [](const auto& x, const auto& w) { return olmax::contract_axis(x, w, 1); });
    check_op("grouped_matmul (the MoE's)", {24, 16}, {3, 16, 12}, [](const auto& x, const auto& w) {
        return olmax::grouped_matmul(x, w, std::vector<std::size_t>{0, 5, 5, 24});
    });
}

namespace {

/// The policy's kernels, seen through a wrapper that counts the float and bf16 GEMMs reaching it and
/// can hide that the float ones round (`says_it_rounds` false): ops then pass float operands to every
/// GEMM and each rounds its own, the way the policy worked before ops rounded their operands once.
class CountingKernels final : public backend::Kernels {
public:
    CountingKernels(const backend::Kernels& policy, bool says_it_rounds) : policy_(policy), says_(says_it_rounds) {}
    std::string_view name() const override { return "counting"; }
    int num_threads() const override { return policy_.num_threads(); }
    void parallel_for(std::size_t n, std::size_t work, backend::range_body body) const override { policy_.parallel_for(n, work, body); }
    double sum(const float* x, std::size_t n) const override { return policy_.sum(x, n); }
    double sum(const double* x, std::size_t n) const override { return policy_.sum(x, n); }
    void gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, double alpha, const double* a, std::size_t lda, const double* b,
              std::size_t ldb, double beta, double* c, std::size_t ldc) const override {
        policy_.gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
    void gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda, const float* b,
              std::size_t ldb, float beta, float* c, std::size_t ldc) const override {
        ++float_gemms;
        policy_.gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
    void gemm_batched(std::size_t count, bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                      std::size_t lda, std::size_t stride_a, const float* b, std::size_t ldb, std::size_t stride_b, float beta, float* c,
                      std::size_t ldc, std::size_t stride_c) const override {
        float_gemms += count;
        policy_.gemm_batched(count, ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c);
    }
    void gemm_bf16(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha, const olmax::bfloat16* a, std::size_t lda,
                   const olmax::bfloat16* b, std::size_t ldb, float beta, float* c, std::size_t ldc) const override {
        ++bf16_gemms;
        policy_.gemm_bf16(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
    bool float_gemms_in_bf16() const override { return says_; }

    mutable std::atomic<std::size_t> float_gemms{0}, bf16_gemms{0};

private:
    const backend::Kernels& policy_;
    bool says_;
};

}  // namespace

TEST_CASE("bf16 policy: ops round each operand once, with the numbers of rounding per GEMM", "[bf16][policy]") {
    // Rounding is a function of the value, so an op that rounds x once for all of a convolution's
    // taps computes what rounding inside every GEMM computed: outputs and gradients bit for bit.
    olmax::Generator rng(11);
    auto run = [](auto op, const olmax::Tensor<float>& a0, const olmax::Tensor<float>& b0, const olmax::Tensor<float>& r,
                  const backend::Kernels& kernels) {
        auto a = olmax::parameter(a0.clone()), b = olmax::parameter(b0.clone());
        backend::host_kernels_scope on(kernels);
        auto y = op(olmax::scale(a, 1.0f), b);  // the first operand an activation: kept rounded for the backward pass
        olmax::sum(olmax::mul(y, r)).backward();
        return std::vector<olmax::Tensor<float>>{y.detach(), a.grad(), b.grad()};
    };
    // `sums_taps_at_once`: under the policy the op computes its value and weight gradient as one
    // GEMM each over every tap (an ungrouped convolution, conv.hpp's unfolded forward and dw), while
    // the per-GEMM path sums one product per tap (and batch element): the same rounded products,
    // summed in another order, so those two agree within fp32 summation error (1e-5 relative)
    // instead of bit for bit. dx is still computed per tap by both: bit for bit.
    auto check_op = [&](const char* what, const olmax::Shape& a_shape, const olmax::Shape& b_shape, auto op, bool sums_taps_at_once = false) {
        INFO(what);
        const auto a = olmax::randn<float>(a_shape, rng), b = olmax::randn<float>(b_shape, rng);
        olmax::Tensor<float> r;
        {
            olmax::autodiff::no_grad off;
            r = olmax::randn<float>(op(a, b).shape(), rng);
        }
        const backend::Bf16MatmulKernels policy(backend::host_kernels());
        CountingKernels once(policy, true), per_gemm(policy, false);
        const auto got = run(op, a, b, r, once), expected = run(op, a, b, r, per_gemm);
        for (std::size_t i = 0; i < got.size(); ++i) {
            INFO("output " << i << " (value, then the two gradients)");
            REQUIRE(got[i].shape() == expected[i].shape());
            if (sums_taps_at_once && i != 1) {
                for (std::size_t j = 0; j < got[i].size(); ++j)
                    REQUIRE(std::abs(got[i].data()[j] - expected[i].data()[j]) <= 1e-5f * (1.0f + std::abs(expected[i].data()[j])));
            } else {
                CHECK(std::equal(got[i].data(), got[i].data() + got[i].size(), expected[i].data()));
            }
        }
        CHECK(once.float_gemms == 0);  // every GEMM got operands the op had rounded
        CHECK(once.bf16_gemms > 0);
        CHECK(per_gemm.bf16_gemms == 0);
    };
    check_op("causal_conv1d", {2, 16, 8}, {3, 8, 12}, [](const auto& x, const auto& w) { return olmax::causal_conv1d(x, w); }, true);
    check_op("causal_conv1d, 2 groups", {3, 16, 8}, {3, 4, 12}, [](const auto& x, const auto& w) { return olmax::causal_conv1d(x, w, 2); });
    check_op("causal_conv1d, bias", {2, 9, 8}, {4, 8, 6}, [](const auto& x, const auto& w) {
        return olmax::causal_conv1d(x, w, olmax::Tensor<float>({6}, 0.25f));
    }, true);
    check_op("matmul", {16, 32}, {32, 24}, [](const auto& a, const auto& b) { return olmax::matmul(a, b); });
    check_op("matmul batched", {3, 8, 16}, {3, 16, 12}, [](const auto& a, const auto& b) { return olmax::matmul(a, b); });
    check_op("contract_axis", {4, 16, 12}, {16, 16}, [](const auto& x, const auto& w) { return olmax::contract_axis(x, w, 1); });
    check_op("grouped_matmul (an empty group too)", {24, 16}, {3, 16, 12}, [](const auto& x, const auto& w) {
        return olmax::grouped_matmul(x, w, std::vector<std::size_t>{0, 5, 5, 24});
    });
    const auto targets = olmax::Tensor<std::int32_t>::from({7}, {0, 3, 9, 1, 4, 4, 2});
    check_op("chunked_cross_entropy, chunks of 3 (the last one short)", {7, 12}, {12, 10}, [&](const auto& h, const auto& w) {
        return olmax::reshape(olmax::chunked_cross_entropy(h, w, targets, olmax::ChunkedLossOptions{0.0, 3}), {1});
    });
}

TEST_CASE("bf16 policy: a convolution over an empty batch or sequence has a zero weight gradient", "[bf16][policy]") {
    // Under the policy dw is written by its GEMMs rather than added into zeros; with nothing to
    // reduce over there is no GEMM, and dw must still come out zero, not uninitialised.
    backend::bf16_matmul_scope policy;
    olmax::Generator rng(5);
    for (const olmax::Shape& shape : {olmax::Shape{0, 6, 4}, olmax::Shape{2, 0, 4}}) {
        auto x = olmax::parameter(olmax::Tensor<float>(shape));
        auto w = olmax::parameter(olmax::randn<float>({3, 4, 5}, rng));
        olmax::sum(olmax::causal_conv1d(x, w)).backward();
        REQUIRE(w.grad().defined());
        CHECK(std::all_of(w.grad().begin(), w.grad().end(), [](float g) { return g == 0.0f; }));
    }
}

TEST_CASE("bf16 policy: a GEMM op keeps its activation operand in bfloat16, and the fp32 one is freed", "[bf16][policy][memory]") {
    olmax::Generator rng(8);
    auto w = olmax::parameter(olmax::randn<float>({64, 32}, rng));
    auto v = olmax::parameter(olmax::randn<float>({128, 64}, rng));
    for (bool conv : {false, true}) {
        INFO((conv ? "causal_conv1d" : "matmul"));
        backend::bf16_matmul_scope bf16;
        olmax::Tensor<float> y;
        std::size_t with_x = 0;
        {
            auto x = olmax::scale(v, 2.0f);  // an activation (scale's backward reads no values)
            y = conv ? olmax::causal_conv1d(olmax::reshape(x, {2, 64, 64}), olmax::reshape(w, {2, 32, 32}), 2) : olmax::matmul(x, w);
            with_x = olmax::memory::stats().current_bytes;
        }
        // x's fp32 buffer went with its handle; the op's backward keeps the bf16 copy (already counted).
        CHECK(olmax::memory::stats().current_bytes == with_x - 128 * 64 * sizeof(float));
        olmax::sum(y).backward();
        CHECK(w.grad().defined());
        CHECK(v.grad().defined());
        w.zero_grad();
        v.zero_grad();
    }
}

TEST_CASE("bf16 policy: an operand rounded in the scope still multiplies after it ends", "[bf16][policy][backend]") {
    // backend::gemm with one rounded and one float operand (a bf16 copy made under the policy, used
    // outside it): the rounded one is widened, exactly, and the float GEMM computes.
    const std::size_t m = 5, n = 4, k = 6;
    const auto a = random_floats(m * k, 21), b = random_floats(k * n, 22);
    auto a_tensor = olmax::Tensor<float>::from({m, k}, a);
    std::optional<backend::GemmOperand<float>> rounded_a;
    {
        backend::bf16_matmul_scope bf16;
        rounded_a.emplace(a_tensor);
    }
    REQUIRE(rounded_a->is_rounded());
    const backend::GemmOperand<float> full_b(olmax::Tensor<float>::from({k, n}, b));
    REQUIRE_FALSE(full_b.is_rounded());
    std::vector<float> got(m * n), expected(m * n);
    backend::gemm(false, false, m, n, k, 1.0f, rounded_a->source(), k, full_b.source(), n, 0.0f, got.data(), n);
    const auto ra = rounded(a);
    backend::current().gemm(false, false, m, n, k, 1.0f, ra.data(), k, b.data(), n, 0.0f, expected.data(), n);
    CHECK(got == expected);
}

TEST_CASE("bf16 policy: the main job's model trains under it, close to fp32", "[bf16][policy]") {
    using Model = olmax::models::ByteLM<olmax::models::ConvMixer, float>;
    Model fp32(olmax::models::ByteLMConfig{16, 2, 1}), bf16(olmax::models::ByteLMConfig{16, 2, 1});
    olmax::optim::AdamWConfig config;
    config.schedule = olmax::optim::LrSchedule{3e-3, 0, 0.0, -1, 0.0};
    olmax::optim::AdamW<float> fp32_opt(fp32.parameters(), config), bf16_opt(bf16.parameters(), config);
    olmax::data::Batch batch{olmax::Tensor<std::int32_t>({2, 32}), olmax::Tensor<std::int32_t>({2, 32}), olmax::Tensor<float>({2, 32}, 1.0f), 64, 0};
    for (std::size_t i = 0; i < 64; ++i) {
        batch.inputs.data()[i] = std::int32_t('a' + i % 7);
        batch.targets.data()[i] = std::int32_t('a' + (i + 1) % 7);
    }
    double first = 0, last_fp32 = 0, last_bf16 = 0;
    for (int step = 0; step < 30; ++step) {
        last_fp32 = fp32.accumulate_gradients(batch, 1, 1.0);
        fp32_opt.step();
        fp32_opt.zero_grad();
        {
            backend::bf16_matmul_scope policy;
            last_bf16 = bf16.accumulate_gradients(batch, 1, 1.0);
        }
        bf16_opt.step();
        bf16_opt.zero_grad();
        if (step == 0) {
            first = last_bf16;
            CHECK(std::abs(last_bf16 - last_fp32) < 1e-2 * last_fp32);  // same weights: only the rounding differs
            CHECK(last_bf16 != last_fp32);
        }
    }
    INFO("loss " << first << " -> bf16 " << last_bf16 << ", fp32 " << last_fp32);
    CHECK(last_bf16 < 0.5 * first);  // it learns the 7-byte cycle
    CHECK(std::abs(last_bf16 - last_fp32) < 0.1 * last_fp32 + 0.02);
}
