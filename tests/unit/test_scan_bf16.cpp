// Scans in bfloat16 storage with float carries: every strategy's forward and `scan_backward`
// against the fp64 adjoint of the same (bf16) inputs, within the stated error bound; the bound is
// tight enough to catch a carry rounded to bf16 at every step; scan_backward equals the tape.
#include "test_helpers.hpp"

#include <atomic>
#include <cmath>
#include <limits>
#include <string_view>
#include <vector>

#include "olmax/backend/bf16_matmul_kernels.hpp"
#include "olmax/scan/scan.hpp"

namespace sc = olmax::scan;
using olmax::bfloat16;
using olmax::Shape;
using olmax::Tensor;

namespace {

/// The error bound of a bf16-storage scan output y against the exact value of the same inputs:
/// one rounding to bf16 (unit roundoff 2^-8, relative) plus the float recurrence's rounding,
/// at most 2 roundings per step of every contribution, bounded by c T 2^-24 times the magnitude sum
/// (the same recurrence on |inputs|), plus bf16's smallest subnormal step for results near zero.
/// c = 4 leaves room for the tree and chunked orders (their depth is at most 2T combines).
constexpr double bf16_unit = 0x1p-8, float_unit = 0x1p-24, bf16_subnormal_step = 0x1p-133;

/// `rounded_terms`: the output is a float sum of terms that were each stored in bf16 first (a
/// shared gate's gradient sums its channels' bf16 gradients), which adds 2^-8 of the magnitude.
double bound(double ref, double magnitude, std::size_t T, bool rounded_terms = false) {
    return bf16_unit * std::abs(ref) + (4.0 * double(T) * float_unit + (rounded_terms ? bf16_unit : 0.0)) * magnitude + bf16_subnormal_step;
}

/// chunked_matmul with gates shared by heads runs the matrix-unit form in bf16 storage: its decay
/// matrix is rounded to bf16 before the GEMM, which adds 2^-8 of the magnitude to h (its gradients
/// run the float adjoint scan).
template <class S>
constexpr bool is_chunked_matmul = false;
template <std::size_t C>
constexpr bool is_chunked_matmul<sc::chunked_matmul<C>> = true;

/// Counts the elements of `got` outside the bound; reports the worst one.
std::size_t outside_bound(const Tensor<bfloat16>& got, const Tensor<double>& ref, const Tensor<double>& magnitude, std::size_t T,
                          bool rounded_terms = false) {
    REQUIRE(got.shape() == ref.shape());
    REQUIRE(magnitude.shape() == ref.shape());
    std::size_t bad = 0;
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        const double g = float(got.data()[i]), r = ref.data()[i];
        const double excess = std::abs(g - r) / bound(r, magnitude.data()[i], T, rounded_terms);
        if (!(excess <= 1.0)) ++bad;
        if (!(excess <= worst)) worst = excess;
    }
    INFO("worst |error| / bound = " << worst);
    CHECK(bad == 0);
    return bad;
}

Tensor<bfloat16> to_bf16(const Tensor<double>& t) { return olmax::cast<bfloat16>(t); }
Tensor<double> to_f64(const Tensor<bfloat16>& t) { return t.defined() ? olmax::cast<double>(t) : Tensor<double>(); }
Tensor<double> abs_of(const Tensor<double>& t) {
    if (!t.defined()) return t;
    Tensor<double> out = t.clone();
    for (auto& v : out) v = std::abs(v);
    return out;
}

enum class Gates { random, near_one, zero, one };

Tensor<double> make_bf16_gates(const Shape& shape, Gates kind, olmax::Generator& rng) {
    switch (kind) {
        case Gates::random: return olmax::rand<double>(shape, rng);
        case Gates::near_one: return olmax::rand<double>(shape, rng, 0.97, 1.0);
        case Gates::zero: return Tensor<double>(shape, 0.0);
        case Gates::one: return Tensor<double>(shape, 1.0);
    }
    return {};
}

struct Bf16Case {
    std::size_t T;
    Gates gates;
    bool h0, reverse;
    sc::Layout layout;
    std::size_t share;  // channels per gate
};

std::vector<Bf16Case> cases() {
    std::vector<Bf16Case> out;
    for (std::size_t T : {std::size_t(1), std::size_t(3), std::size_t(129), std::size_t(300)})
        for (Gates k : {Gates::random, Gates::near_one, Gates::zero, Gates::one})
            for (int combo = 0; combo < 4; ++combo)
                out.push_back({T, k, combo == 1 || combo == 3, combo >= 2, combo == 1 || combo == 2 ? sc::Layout::bct : sc::Layout::btc,
                               std::size_t(combo == 3 ? 4 : 1)});
    return out;
}

/// Runs forward and backward of strategy S on bf16 storage for one case and checks every output
/// against the fp64 reference of the same bf16 inputs.
template <class S>
void check_case(const Bf16Case& c) {
    constexpr std::size_t batch = 2, channels = 24;
    olmax::Generator rng(11 + c.T);
    const bool btc = c.layout == sc::Layout::btc;
    const Shape x_shape = btc ? Shape{batch, c.T, channels} : Shape{batch, channels, c.T};
    const Shape gate_shape = btc ? Shape{batch, c.T, channels / c.share} : Shape{batch, channels / c.share, c.T};
    // Inputs are drawn in double and rounded to bf16 once; the reference uses the rounded values.
    const Tensor<bfloat16> gates = to_bf16(make_bf16_gates(gate_shape, c.gates, rng));
    const Tensor<bfloat16> x = to_bf16(olmax::rand<double>(x_shape, rng, -1.0, 1.0));
    const Tensor<bfloat16> h0 = c.h0 ? to_bf16(olmax::rand<double>({batch, channels}, rng, -1.0, 1.0)) : Tensor<bfloat16>();
    const Tensor<bfloat16> dh = to_bf16(olmax::rand<double>(x_shape, rng, -1.0, 1.0));
    const Tensor<bfloat16> dh_last = to_bf16(olmax::rand<double>({batch, channels}, rng, -1.0, 1.0));
    INFO(S::name << ": T=" << c.T << " gates=" << int(c.gates) << " h0=" << c.h0 << " reverse=" << c.reverse
                 << " layout=" << (btc ? "btc" : "bct") << " share=" << c.share);

    const sc::ScanOptions<bfloat16> opt{.h0 = h0, .reverse = c.reverse, .layout = c.layout};
    const auto [h, h_last] = sc::scan_with_state<S>(gates, x, opt);
    CHECK(!h.requires_grad());  // storage only: nothing recorded

    auto f64_opt = [&](const Tensor<double>& h0_value) { return sc::ScanOptions<double>{.h0 = h0_value, .reverse = c.reverse, .layout = c.layout}; };
    const auto ref = sc::scan_with_state<sc::sequential_fp64>(to_f64(gates), to_f64(x), f64_opt(to_f64(h0)));
    const auto mag = sc::scan_with_state<sc::sequential_fp64>(abs_of(to_f64(gates)), abs_of(to_f64(x)), f64_opt(abs_of(to_f64(h0))));
    const bool rounded_decay = is_chunked_matmul<S> && c.share > 1;
    outside_bound(h, ref.h, mag.h, c.T, rounded_decay);
    outside_bound(h_last, ref.h_last, mag.h_last, c.T, rounded_decay);

    // Backward from the bf16 h the forward stored (what a caller saves), against the fp64 adjoint
    // of the same values; the magnitude is the adjoint on |inputs|.
    const auto d = sc::scan_backward<S>(gates, h, dh, opt, dh_last);
    const auto d_ref = sc::scan_backward<sc::sequential_fp64>(to_f64(gates), to_f64(h), to_f64(dh), f64_opt(to_f64(h0)), to_f64(dh_last));
    const auto d_mag = sc::scan_backward<sc::sequential_fp64>(abs_of(to_f64(gates)), abs_of(to_f64(h)), abs_of(to_f64(dh)),
                                                              f64_opt(abs_of(to_f64(h0))), abs_of(to_f64(dh_last)));
    REQUIRE(d.gates.shape() == gates.shape());
    outside_bound(d.x, d_ref.x, d_mag.x, c.T);
    // A shared gate's gradient is the float sum of its channels' gradients, each stored in bf16.
    outside_bound(d.gates, d_ref.gates, d_mag.gates, c.T * c.share, c.share > 1);
    REQUIRE(d.h0.defined() == c.h0);
    if (c.h0) outside_bound(d.h0, d_ref.h0, d_mag.h0, c.T);
}

}  // namespace

#define OLMAX_BF16_SCAN_STRATEGIES                                                                                \
    sc::sequential, sc::sequential_fp64, sc::sequential_vectorized, sc::two_pass, sc::hillis_steele,            \
        sc::hillis_steele_chunked<128>, sc::blelloch, sc::chunked_matmul<128>, sc::chunked_matmul<8>, sc::log_space

TEMPLATE_TEST_CASE("scan in bf16 storage: forward and scan_backward within the float-carry bound of the fp64 adjoint", "[scan][bf16]",
                   OLMAX_BF16_SCAN_STRATEGIES) {
    for (const Bf16Case& c : cases()) check_case<TestType>(c);
}

TEST_CASE("scan in bf16 storage: log gates within the float-carry bound", "[scan][bf16]") {
    constexpr std::size_t T = 200;
    olmax::Generator rng(5);
    const Tensor<bfloat16> log_gates = to_bf16(olmax::rand<double>({2, T, 16}, rng, -0.05, 0.0));
    const Tensor<bfloat16> x = to_bf16(olmax::rand<double>({2, T, 16}, rng, -1.0, 1.0));
    const Tensor<double> linear_gates = [&] {
        Tensor<double> a = to_f64(log_gates);
        for (auto& v : a) v = std::exp(v);
        return a;
    }();
    const auto ref = sc::scan<sc::sequential_fp64>(to_f64(log_gates), to_f64(x), {.log_gates = true});
    const auto mag = sc::scan<sc::sequential_fp64>(linear_gates, abs_of(to_f64(x)));
    outside_bound(sc::scan<sc::sequential_vectorized>(log_gates, x, {.log_gates = true}), ref, mag, T);
    outside_bound(sc::scan<sc::two_pass>(log_gates, x, {.log_gates = true}), ref, mag, T);
    outside_bound(sc::scan<sc::chunked_matmul<128>>(log_gates, x, {.log_gates = true}), ref, mag, T);
}

TEST_CASE("scan in bf16 storage: shared-gate chunked_matmul multiplies on the device's bf16 product", "[scan][bf16]") {
    // Inside a bf16_matmul_scope given a bf16 product (oneDNN's on the CPU's bf16 units in real
    // use), the in-chunk GEMMs of the matrix-unit form are handed to it with the bf16 inputs as
    // they are stored; so is backend::gemm_bf16. Here the product is a counting wrapper around the
    // portable one, and the result stays within the bound.
    olmax::Generator rng(3);
    for (const bool btc : {true, false})
        for (const bool reverse : {false, true}) {
            constexpr std::size_t T = 300, heads = 3, share = 8;
            const Shape x_shape = btc ? Shape{2, T, heads * share} : Shape{2, heads * share, T};
            const Shape gate_shape = btc ? Shape{2, T, heads} : Shape{2, heads, T};
            const Tensor<bfloat16> gates = to_bf16(olmax::rand<double>(gate_shape, rng, 0.9, 1.0));
            const Tensor<bfloat16> x = to_bf16(olmax::rand<double>(x_shape, rng, -1.0, 1.0));
            const sc::ScanOptions<bfloat16> opt{.reverse = reverse, .layout = btc ? sc::Layout::btc : sc::Layout::bct};
            std::atomic<int> calls{0};
            Tensor<bfloat16> h;
            {
                olmax::backend::set_bf16_notice_sink([](std::string_view) {});
                olmax::backend::bf16_matmul_scope policy([&](bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha,
                                                             const bfloat16* a, std::size_t lda, const bfloat16* b, std::size_t ldb, float beta,
                                                             float* c, std::size_t ldc) {
                    ++calls;
                    olmax::backend::kernels<olmax::backend::cpu_serial>().gemm_bf16(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
                });
                h = sc::scan<sc::chunked_matmul<128>>(gates, x, opt);
                INFO("btc=" << btc << " reverse=" << reverse);
                CHECK(calls.load() == int(2 * heads * 3));  // batch x heads x ceil(300 / 128) chunks
                const bfloat16 one(1.0f);
                float c = 0;
                olmax::backend::gemm_bf16(false, false, 1, 1, 1, 1.0f, &one, 1, &one, 1, 0.0f, &c, 1);
                CHECK(calls.load() == int(2 * heads * 3 + 1));
                CHECK(c == 1.0f);
                olmax::backend::set_bf16_notice_sink({});
            }
            const sc::ScanOptions<double> ref_opt{.reverse = reverse, .layout = opt.layout};
            const Tensor<double> ref = sc::scan<sc::sequential_fp64>(to_f64(gates), to_f64(x), ref_opt);
            const Tensor<double> mag = sc::scan<sc::sequential_fp64>(to_f64(gates), abs_of(to_f64(x)), ref_opt);
            outside_bound(h, ref, mag, T, true);
        }
}

TEST_CASE("scan in bf16 storage: the bound catches a carry rounded to bf16 at every step", "[scan][bf16]") {
    // What the float carry buys: the same recurrence with h rounded to bf16 after every step
    // (a bf16 carry) drifts by about sqrt(T) bf16 roundings of h and leaves the bound, which the
    // float-carry scan meets.
    constexpr std::size_t T = 1000, C = 64;
    olmax::Generator rng(3);
    const Tensor<bfloat16> gates = to_bf16(olmax::rand<double>({1, T, C}, rng, 0.99, 1.0));
    const Tensor<bfloat16> x = to_bf16(olmax::rand<double>({1, T, C}, rng, 0.0, 1.0));
    const auto ref = sc::scan<sc::sequential_fp64>(to_f64(gates), to_f64(x));
    Tensor<bfloat16> bf16_carry = Tensor<bfloat16>::uninitialized({1, T, C});
    for (std::size_t c = 0; c < C; ++c) {
        bf16_carry(0, 0, c) = x(0, 0, c);
        for (std::size_t t = 1; t < T; ++t)
            bf16_carry(0, t, c) = bfloat16(float(gates(0, t, c)) * float(bf16_carry(0, t - 1, c)) + float(x(0, t, c)));
    }
    std::size_t violations = 0;
    for (std::size_t i = 0; i < ref.size(); ++i)
        if (std::abs(double(float(bf16_carry.data()[i])) - ref.data()[i]) > bound(ref.data()[i], ref.data()[i], T)) ++violations;
    CHECK(violations > ref.size() / 10);
    outside_bound(sc::scan<sc::sequential_vectorized>(gates, x), ref, ref, T);  // x >= 0, gates > 0: the magnitude is h itself
}

TEST_CASE("scan_backward equals the tape's gradients (double, every option)", "[scan][grad]") {
    olmax::Generator rng(9);
    for (bool shared : {false, true})
        for (bool reverse : {false, true}) {
            const Tensor<double> gates = olmax::rand<double>({2, 37, std::size_t(shared ? 3 : 12)}, rng).set_requires_grad(true);
            const Tensor<double> x = olmax::rand<double>({2, 37, 12}, rng, -1.0, 1.0).set_requires_grad(true);
            const Tensor<double> h0 = olmax::rand<double>({2, 12}, rng, -1.0, 1.0).set_requires_grad(true);
            const Tensor<double> dh = olmax::rand<double>({2, 37, 12}, rng, -1.0, 1.0);
            const Tensor<double> dh_last = olmax::rand<double>({2, 12}, rng, -1.0, 1.0);
            const sc::ScanOptions<double> opt{.h0 = h0, .reverse = reverse};
            const auto [h, h_last] = sc::scan_with_state<sc::two_pass>(gates, x, opt);
            olmax::autodiff::backward(h, dh, true);
            olmax::autodiff::backward(h_last, dh_last);
            const auto d = sc::scan_backward<sc::two_pass>(gates, h, dh, opt, dh_last);
            INFO("shared=" << shared << " reverse=" << reverse);
            CHECK(olmax_test::max_abs_diff(d.gates, gates.grad()) <= 1e-14);
            CHECK(olmax_test::max_abs_diff(d.x, x.grad()) <= 1e-14);
            CHECK(olmax_test::max_abs_diff(d.h0, h0.grad()) <= 1e-14);
        }
}

TEST_CASE("scan_backward: bad input throws clear errors", "[scan]") {
    const Tensor<bfloat16> a(Shape{1, 4, 3}, bfloat16(0.5f)), h(Shape{1, 4, 3}, bfloat16(1.0f));
    CHECK_THROWS_AS(sc::scan_backward<sc::sequential>(a, h, Tensor<bfloat16>(Shape{1, 4, 2})), olmax::shape_error);
    CHECK_THROWS_AS(sc::scan_backward<sc::sequential>(a, h, Tensor<bfloat16>()), olmax::shape_error);
    CHECK_THROWS_AS(sc::scan_backward<sc::sequential>(a, h, h, {}, Tensor<bfloat16>(Shape{1, 2})), olmax::shape_error);
    CHECK_THROWS_AS(sc::scan_backward<sc::sequential>(a, h, h, {.h0 = Tensor<bfloat16>(Shape{2, 3})}), olmax::shape_error);
    CHECK_THROWS_AS(sc::scan_with_state<sc::two_pass>(Tensor<bfloat16>(Shape{1, 0, 3}), Tensor<bfloat16>(Shape{1, 0, 3})), olmax::value_error);
}

TEMPLATE_TEST_CASE("scan in bf16 storage: NaN inputs propagate as NaN", "[scan][bf16]", sc::sequential_vectorized, sc::two_pass,
                   sc::chunked_matmul<128>) {
    // Steps adjacent in memory ([B, C, T]) take two_pass's vector-block path, 16 steps a block.
    Tensor<bfloat16> gates(Shape{1, 3, 40}, bfloat16(0.5f)), x(Shape{1, 3, 40}, bfloat16(1.0f));
    x(0, 1, 20) = bfloat16(std::numeric_limits<float>::quiet_NaN());
    const Tensor<bfloat16> h = sc::scan<TestType>(gates, x, {.layout = sc::Layout::bct});
    CHECK(float(h(0, 1, 19)) == Approx(2.0).epsilon(0x1p-7));
    for (std::size_t t = 20; t < 40; ++t) CHECK(std::isnan(float(h(0, 1, t))));
    for (std::size_t t = 0; t < 40; ++t) CHECK(!std::isnan(float(h(0, 0, t))));
}
