// Scan engine: every strategy and backend against the fp64 sequential reference, exact gradients,
// linear backward memory, bad input.
#include "test_helpers.hpp"

#include <cmath>
#include <limits>
#include <tuple>

#include "olmax/scan/scan.hpp"
#include "scan_streaming_check.hpp"

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

namespace sc = olmax::scan;
using olmax::Shape;
using olmax::Tensor;

namespace {

enum class GateKind { zero, one, tiny, near_one, random };

template <class T>
Tensor<T> make_gates(const Shape& shape, GateKind kind, olmax::Generator& rng) {
    switch (kind) {
        case GateKind::zero: return Tensor<T>(shape, T(0));
        case GateKind::one: return Tensor<T>(shape, T(1));
        case GateKind::tiny: return Tensor<T>(shape, T(1e-30));
        case GateKind::near_one: return Tensor<T>(shape, T(0.9999));
        case GateKind::random: return olmax::rand<T>(shape, rng);
    }
    return {};
}

template <class T>
Tensor<T> uniform_pm1(const Shape& shape, olmax::Generator& rng) {
    Tensor<T> t = olmax::rand<T>(shape, rng);
    for (auto& v : t) v = T(2) * v - T(1);
    return t;
}

/// Normwise relative error max|h - ref| / max|ref| (ref in double).
/// Normwise relative error max|h - ref| / max|scale_of| (ref in double; scale_of defaults to ref).
template <class T>
double rel_error(const Tensor<T>& h, const Tensor<double>& ref, const Tensor<double>& scale_of = {}) {
    REQUIRE(h.shape() == ref.shape());
    double err = 0, scale = 0;
    for (std::size_t i = 0; i < h.size(); ++i) err = std::max(err, std::abs(double(h.data()[i]) - ref.data()[i]));
    const Tensor<double>& s = scale_of.defined() ? scale_of : ref;
    for (std::size_t i = 0; i < s.size(); ++i) scale = std::max(scale, std::abs(s.data()[i]));
    return scale > 0 ? err / scale : err;
}

struct Case {
    std::size_t T;
    GateKind gates;
    bool h0, reverse;
    sc::Layout layout;
};

std::vector<Case> grid(bool full) {
    std::vector<Case> cases;
    const std::size_t Ts[] = {1, 2, 3, 127, 128, 129, 1000, 4097};
    const GateKind kinds[] = {GateKind::zero, GateKind::one, GateKind::tiny, GateKind::near_one, GateKind::random};
    for (std::size_t T : Ts)
        for (GateKind k : kinds)
            for (int combo = 0; combo < 8; ++combo) {
                const bool h0 = combo & 1, reverse = combo & 2;
                const sc::Layout layout = combo & 4 ? sc::Layout::bct : sc::Layout::btc;
                // Default run: four of the eight (h0, reverse, layout) combinations, each option on in two.
                if (!full && combo != 0 && combo != 3 && combo != 5 && combo != 6) continue;
                cases.push_back({T, k, h0, reverse, layout});
            }
    return cases;
}

template <class S, class B, class T>
void check_scan_against_reference(bool full, std::size_t batch, std::size_t channels, double tol) {
    olmax::Generator rng(7);
    for (const Case& c : grid(full)) {
        const bool btc = c.layout == sc::Layout::btc;
        const Shape shape = btc ? Shape{batch, c.T, channels} : Shape{batch, channels, c.T};
        Tensor<T> gates = make_gates<T>(shape, c.gates, rng);
        Tensor<T> x = uniform_pm1<T>(shape, rng);
        Tensor<T> h0 = c.h0 ? uniform_pm1<T>({batch, channels}, rng) : Tensor<T>();
        sc::ScanOptions<T> opt{.h0 = h0, .reverse = c.reverse, .layout = c.layout};
        auto [h, h_last] = olmax_test::with_kernels<B>([&] { return sc::scan_with_state<S>(gates, x, opt); });
        sc::ScanOptions<double> ref_opt{.h0 = c.h0 ? olmax::cast<double>(h0) : Tensor<double>(), .reverse = c.reverse, .layout = c.layout};
        auto ref = sc::scan_with_state<sc::sequential_fp64>(olmax::cast<double>(gates), olmax::cast<double>(x), ref_opt);
        INFO(S::name << " on " << B::name << ": T=" << c.T << " gates=" << int(c.gates) << " h0=" << c.h0 << " reverse=" << c.reverse
                     << " layout=" << (btc ? "btc" : "bct"));
        CHECK(rel_error(h, ref.h) <= tol);
        CHECK(rel_error(h_last, ref.h_last, ref.h) <= tol);  // the final state on the scale of the whole sequence
    }
}

template <class S>
double double_tolerance() {
    // Log space loses absolute precision in the exponent: |cumulative log| reaches 64 * 700 within a
    // chunk of zero gates, and ulp(44800) = 7e-12 relative after exp.
    return std::is_same_v<S, sc::log_space> ? 1e-10 : 1e-12;
}

/// Expands gates [B, T, H] (or [B, H, T]) to per-channel gates for a reference run.
template <class T>
Tensor<T> expand_heads(const Tensor<T>& gates, std::size_t share, sc::Layout layout) {
    const bool btc = layout == sc::Layout::btc;
    Shape shape = gates.shape();
    shape[btc ? 2 : 1] *= share;
    Tensor<T> out(shape);
    for (std::size_t b = 0; b < shape[0]; ++b)
        for (std::size_t i = 0; i < shape[1]; ++i)
            for (std::size_t j = 0; j < shape[2]; ++j)
                out(b, i, j) = btc ? gates(b, i, j / share) : gates(b, i / share, j);
    return out;
}

}  // namespace

#define OLMAX_SCAN_STRATEGIES                                                                                     \
    sc::sequential, sc::sequential_fp64, sc::sequential_vectorized, sc::two_pass, sc::hillis_steele,            \
        sc::hillis_steele_chunked<128>, sc::blelloch, sc::chunked_matmul<128>, sc::log_space

TEMPLATE_TEST_CASE("scan: every strategy and backend equals the fp64 sequential reference", "[scan]", OLMAX_SCAN_STRATEGIES) {
    check_scan_against_reference<TestType, olmax::backend::cpu_openmp, float>(false, 2, 3, 1e-5);
    check_scan_against_reference<TestType, olmax::backend::cpu_serial, float>(false, 1, 2, 1e-5);
    check_scan_against_reference<TestType, olmax::backend::cpu_openmp, double>(false, 1, 2, double_tolerance<TestType>());
}

TEMPLATE_TEST_CASE("scan: full reference sweep (all options, wider tiles)", "[scan][slow]", OLMAX_SCAN_STRATEGIES) {
    check_scan_against_reference<TestType, olmax::backend::cpu_openmp, float>(true, 3, 17, 1e-5);
    check_scan_against_reference<TestType, olmax::backend::cpu_serial, float>(true, 2, 5, 1e-5);
    check_scan_against_reference<TestType, olmax::backend::cpu_openmp, double>(true, 2, 17, double_tolerance<TestType>());
    check_scan_against_reference<TestType, olmax_test::stub_backend, double>(true, 1, 3, double_tolerance<TestType>());
}

TEST_CASE("scan: two_pass over many rounds and segments equals the reference", "[scan]") {
    auto& round = sc::detail::two_pass_round_elements();
    const std::size_t saved = round.load();
    round = 64;  // rounds of 64 * threads / rows steps, segments of a few steps
    check_scan_against_reference<sc::two_pass, olmax::backend::cpu_openmp, float>(false, 1, 1, 1e-5);
    check_scan_against_reference<sc::two_pass, olmax::backend::cpu_serial, double>(false, 1, 3, 1e-12);
    round = saved;
}

TEST_CASE("scan: two_pass with cache-line-staggered segments and a short last round equals the reference", "[scan]") {
    // Rounds of 1024 steps per thread: segments of >= 128 steps are lengthened to an odd number of
    // cache lines, so full rounds and the shorter last round partition T differently.
    auto& round = sc::detail::two_pass_round_elements();
    const std::size_t saved = round.load();
    round = 1024;
    check_scan_against_reference<sc::two_pass, olmax::backend::cpu_openmp, float>(false, 1, 1, 1e-5);
    check_scan_against_reference<sc::two_pass, olmax::backend::cpu_serial, double>(false, 1, 1, 1e-12);
    olmax::Generator rng(5);
    for (bool reverse : {false, true}) {  // one long row (in-register block kernels), forward and backward
        Tensor<double> a = olmax::rand<double>({1, 20000, 1}, rng), x = uniform_pm1<double>({1, 20000, 1}, rng);
        Tensor<double> h0 = uniform_pm1<double>({1, 1}, rng);
        Tensor<double> r = uniform_pm1<double>({1, 20000, 1}, rng);
        auto grads = [&]<class S>(S) {  // h, then dL/da, dL/dx, dL/dh0 for L = sum(h * r)
            Tensor<double> ga = a.clone(), gx = x.clone(), gh0 = h0.clone();
            for (auto* t : {&ga, &gx, &gh0}) t->set_requires_grad(true);
            Tensor<double> h = sc::scan<S>(ga, gx, {.h0 = gh0, .reverse = reverse});
            h.backward(r);
            return std::vector<Tensor<double>>{h, ga.grad(), gx.grad(), gh0.grad()};
        };
        const auto ours = grads(sc::two_pass{}), ref = grads(sc::sequential_fp64{});
        INFO("reverse " << reverse);
        for (std::size_t i = 0; i < ours.size(); ++i) CHECK(rel_error(ours[i], ref[i]) <= 1e-12);
    }
    round = saved;
}

TEMPLATE_TEST_CASE("scan: chunk sizes that do not divide T", "[scan]", sc::hillis_steele_chunked<128>, sc::chunked_matmul<128>, sc::log_space) {
    olmax::Generator rng(11);
    for (long chunk : {1L, 3L, 16L, 200L}) {
        for (bool reverse : {false, true}) {
            Tensor<double> a = olmax::rand<double>({2, 300, 3}, rng), x = uniform_pm1<double>({2, 300, 3}, rng);
            Tensor<double> h0 = uniform_pm1<double>({2, 3}, rng);
            auto h = sc::scan<TestType>(a, x, {.h0 = h0, .reverse = reverse, .chunk = chunk});
            auto ref = sc::scan<sc::sequential_fp64>(a, x, {.h0 = h0, .reverse = reverse});
            INFO("chunk " << chunk << " reverse " << reverse);
            CHECK(rel_error(h, ref) <= 1e-11);
        }
    }
}

// The in-place kernels walk a row in cache-line pieces from the top when time runs down in memory
// (channel_span.hpp, for_lane_pieces): 37 channels are two whole lines of float plus a partial one.
TEMPLATE_TEST_CASE("scan: rows wider than a cache line, forward and backward in both directions", "[scan]", sc::sequential_vectorized,
                   sc::hillis_steele_chunked<128>) {
    olmax::Generator rng(11);
    for (const bool reverse : {false, true})
        for (const bool with_h0 : {false, true}) {
            const Shape shape{2, 300, 37};
            const Tensor<float> gates = olmax::rand<float>(shape, rng), x = uniform_pm1<float>(shape, rng), dh = uniform_pm1<float>(shape, rng);
            const Tensor<float> h0 = with_h0 ? uniform_pm1<float>({2, 37}, rng) : Tensor<float>();
            const sc::ScanOptions<float> opt{.h0 = h0, .reverse = reverse};
            const sc::ScanOptions<double> ref_opt{.h0 = with_h0 ? olmax::cast<double>(h0) : Tensor<double>(), .reverse = reverse};
            INFO(TestType::name << " reverse=" << reverse << " h0=" << with_h0);
            const Tensor<float> h = olmax_test::with_kernels<olmax::backend::cpu_openmp>([&] { return sc::scan<TestType>(gates, x, opt); });
            const Tensor<double> ref = sc::scan<sc::sequential_fp64>(olmax::cast<double>(gates), olmax::cast<double>(x), ref_opt);
            CHECK(rel_error(h, ref) <= 1e-5);
            const auto grads = olmax_test::with_kernels<olmax::backend::cpu_openmp>([&] { return sc::scan_backward<TestType>(gates, h, dh, opt); });
            const auto ref_grads = sc::scan_backward<sc::sequential_fp64>(olmax::cast<double>(gates), olmax::cast<double>(h), olmax::cast<double>(dh), ref_opt);
            CHECK(rel_error(grads.x, ref_grads.x) <= 1e-5);
            CHECK(rel_error(grads.gates, ref_grads.gates) <= 1e-5);
            if (with_h0) CHECK(rel_error(grads.h0, ref_grads.h0, ref_grads.x) <= 1e-5);
        }
}

// Large fp32 [B, T, C] scans write with streaming stores: SSE2's here (the baseline build),
// AVX-512's in tests/native.
TEST_CASE("scan: streaming stores give the ordinary stores' values bit for bit", "[scan]") { olmax_test::check_streaming_stores_bitwise(); }

TEMPLATE_TEST_CASE("scan: gates shared per head (Mamba-2 style) equal the expanded per-channel scan", "[scan]", sc::sequential,
                   sc::sequential_vectorized, sc::two_pass, sc::chunked_matmul<128>, sc::blelloch) {
    olmax::Generator rng(3);
    const std::size_t share = 4, heads = 3;
    for (sc::Layout layout : {sc::Layout::btc, sc::Layout::bct})
        for (std::size_t T : {1, 5, 130, 300})
            for (bool reverse : {false, true}) {
                const bool btc = layout == sc::Layout::btc;
                Tensor<double> a = olmax::rand<double>(btc ? Shape{2, T, heads} : Shape{2, heads, T}, rng);
                Tensor<double> x = uniform_pm1<double>(btc ? Shape{2, T, heads * share} : Shape{2, heads * share, T}, rng);
                Tensor<double> h0 = uniform_pm1<double>({2, heads * share}, rng);
                sc::ScanOptions<double> opt{.h0 = h0, .reverse = reverse, .layout = layout, .chunk = 64};
                auto h = sc::scan<TestType>(a, x, opt);
                auto ref = sc::scan<sc::sequential_fp64>(expand_heads(a, share, layout), x, opt);
                INFO("T=" << T << " reverse=" << reverse << " layout=" << (btc ? "btc" : "bct"));
                CHECK(rel_error(h, ref) <= 1e-12);
            }
}

TEMPLATE_TEST_CASE("scan: log gates equal linear gates", "[scan]", OLMAX_SCAN_STRATEGIES) {
    olmax::Generator rng(5);
    Tensor<double> a = olmax::rand<double>({2, 150, 5}, rng), x = uniform_pm1<double>({2, 150, 5}, rng);
    Tensor<double> log_a = a.clone();
    for (auto& v : log_a) v = std::log(v);
    for (bool reverse : {false, true}) {
        auto h = sc::scan<TestType>(log_a, x, {.reverse = reverse, .log_gates = true});
        auto ref = sc::scan<sc::sequential_fp64>(a, x, {.reverse = reverse});
        CHECK(rel_error(h, ref) <= 1e-10);
    }
}

// ---- the dispatch table (scan/detail/dispatch.hpp) ----------------------------------------------

namespace {

/// The kernel families a strategy is declared to run: with gates per channel in [B, T, C] and in
/// [B, C, T] (forward and backward alike), and with gates shared by heads (forward, backward).
struct DeclaredRoute {
    std::string contiguous, strided, shared_forward, shared_backward;
};

template <class S>
void check_route(const DeclaredRoute& want) {
    using sc::detail::Pass;
    auto geometry = [](sc::Layout layout, std::size_t heads) {
        const bool btc = layout == sc::Layout::btc;
        Tensor<double> x(btc ? Shape{1, 8, 4} : Shape{1, 4, 8}), a(btc ? Shape{1, 8, heads} : Shape{1, heads, 8});
        return sc::detail::make_geometry<double>("route", a, x, {.layout = layout});
    };
    for (sc::Layout layout : {sc::Layout::btc, sc::Layout::bct}) {
        INFO(S::name << " layout=" << (layout == sc::Layout::btc ? "btc" : "bct"));
        const auto per_channel = geometry(layout, 4);
        const std::string& want_per_channel = layout == sc::Layout::btc ? want.contiguous : want.strided;
        CHECK(std::string(sc::detail::family_name<S>(per_channel, Pass::forward)) == want_per_channel);
        CHECK(std::string(sc::detail::family_name<S>(per_channel, Pass::backward)) == want_per_channel);
        const auto shared = geometry(layout, 2);
        CHECK(std::string(sc::detail::family_name<S>(shared, Pass::forward)) == want.shared_forward);
        CHECK(std::string(sc::detail::family_name<S>(shared, Pass::backward)) == want.shared_backward);
    }
}

}  // namespace

TEST_CASE("scan: the dispatch table runs each strategy's declared forward and backward kernels", "[scan]") {
    // Shared gates: every backward is the sequential tile kernel (the reason is in dispatch.hpp's
    // tile_route); a change of any entry must show up here.
    const std::string seq = "tile_sequential";
    check_route<sc::sequential>({seq, seq, seq, seq});
    check_route<sc::sequential_fp64>({seq, seq, seq, seq});
    check_route<sc::sequential_vectorized>({"sequential_vectorized", "sequential_vectorized", seq, seq});
    check_route<sc::two_pass>({"two_pass", "two_pass", seq, seq});
    check_route<sc::hillis_steele>({"tile_hillis_steele", "tile_hillis_steele", "tile_hillis_steele", seq});
    check_route<sc::hillis_steele_chunked<128>>({"hillis_steele_chunked", "tile_hillis_steele_chunked", "tile_hillis_steele_chunked", seq});
    check_route<sc::blelloch>({"tile_blelloch", "tile_blelloch", "tile_blelloch", seq});
    check_route<sc::chunked_matmul<128>>({"tile_chunked_matmul", "tile_chunked_matmul", "shared_gate_matmul", seq});
    check_route<sc::log_space>({"tile_log_space", "tile_log_space", "tile_log_space", seq});
    STATIC_REQUIRE_FALSE(sc::detail::is_strategy<int>);
}

// ---- gradients -----------------------------------------------------------------------------

template <class S>
void check_scan_gradients(sc::Layout layout, bool reverse, bool log_gates, std::size_t share, bool final_state, long chunk) {
    olmax::Generator rng(21);
    const std::size_t B = 2, T = 9, C = 4;
    const bool btc = layout == sc::Layout::btc;
    const std::size_t H = C / share;
    Tensor<double> a = olmax::rand<double>(btc ? Shape{B, T, H} : Shape{B, H, T}, rng);
    for (auto& v : a) v = log_gates ? std::log(0.2 + 0.75 * v) : 0.2 + 0.75 * v;
    Tensor<double> x = uniform_pm1<double>(btc ? Shape{B, T, C} : Shape{B, C, T}, rng);
    Tensor<double> h0 = uniform_pm1<double>({B, C}, rng);
    auto f = [&](const std::vector<Tensor<double>>& in) {
        sc::ScanOptions<double> opt{.h0 = in[2], .reverse = reverse, .layout = layout, .log_gates = log_gates, .chunk = chunk};
        auto r = sc::scan_with_state<S>(in[0], in[1], opt);
        return final_state ? r.h_last : r.h;
    };
    auto result = olmax::testing::check_gradients(f, {a, x, h0});
    INFO(S::name << " layout=" << (btc ? "btc" : "bct") << " reverse=" << reverse << " log=" << log_gates << " share=" << share
                 << " final_state=" << final_state << "\n" << result);
    CHECK(result.ok);
}

TEMPLATE_TEST_CASE("scan: gradients (double) for gates, x and h0, forward and reverse", "[scan][grad]", OLMAX_SCAN_STRATEGIES) {
    for (sc::Layout layout : {sc::Layout::btc, sc::Layout::bct})
        for (bool reverse : {false, true}) check_scan_gradients<TestType>(layout, reverse, false, 1, false, 4);
    check_scan_gradients<TestType>(sc::Layout::btc, false, true, 1, false, 4);   // log gates
    check_scan_gradients<TestType>(sc::Layout::bct, true, false, 1, true, 4);    // through h_last
    check_scan_gradients<TestType>(sc::Layout::btc, false, false, 1, true, 4);
    check_scan_gradients<TestType>(sc::Layout::btc, false, false, 2, false, 4);  // gates shared by 2 channels
    check_scan_gradients<TestType>(sc::Layout::bct, true, true, 4, true, 4);
}

TEST_CASE("scan: two_pass gradients across many segments and rounds", "[scan][grad]") {
    auto& round = sc::detail::two_pass_round_elements();
    const std::size_t saved = round.load();
    round = 4;
    olmax::Generator rng(2);
    for (bool reverse : {false, true})
        for (sc::Layout layout : {sc::Layout::btc, sc::Layout::bct}) {
            const Shape shape = layout == sc::Layout::btc ? Shape{1, 40, 1} : Shape{1, 1, 40};
            Tensor<double> a = olmax::rand<double>(shape, rng), x = uniform_pm1<double>(shape, rng);
            Tensor<double> h0 = uniform_pm1<double>({1, 1}, rng);
            auto f = [&](const std::vector<Tensor<double>>& in) {
                auto r = sc::scan_with_state<sc::two_pass>(in[0], in[1], {.h0 = in[2], .reverse = reverse, .layout = layout});
                return olmax::concat(std::vector<Tensor<double>>{olmax::reshape(r.h, {40}), olmax::reshape(r.h_last, {1})}, 0);
            };
            auto result = olmax::testing::check_gradients(f, {a, x, h0});
            INFO(result);
            CHECK(result.ok);
        }
    round = saved;
}

TEST_CASE("scan: the gate gradient is g_t h_{t-1}; the original's g_t h_t is detected as wrong", "[scan][grad]") {
    // L = sum(h * r) for h_t = a_t h_{t-1} + x_t, one row of 16 steps with h0.
    olmax::Generator rng(16);
    const std::size_t T = 16;
    Tensor<double> a = olmax::rand<double>({1, T, 1}, rng), x = uniform_pm1<double>({1, T, 1}, rng);
    for (auto& v : a) v = 0.8 + 0.2 * v;
    Tensor<double> h0 = uniform_pm1<double>({1, 1}, rng), r = uniform_pm1<double>({1, T, 1}, rng);
    auto loss = [&](const Tensor<double>& gates) {
        auto h = sc::scan<sc::sequential_fp64>(gates, x, {.h0 = h0});
        double s = 0;
        for (std::size_t i = 0; i < T; ++i) s += h.data()[i] * r.data()[i];
        return s;
    };
    Tensor<double> ga = a.clone();
    ga.set_requires_grad(true);
    Tensor<double> h = sc::scan<sc::sequential>(ga, x, {.h0 = h0});
    h.backward(r);
    // The adjoint g (= dx) from our backward, to rebuild the original's formula g_t h_t.
    Tensor<double> gx = x.clone();
    gx.set_requires_grad(true);
    sc::scan<sc::sequential>(a, gx, {.h0 = h0}).backward(r);
    double worst_ours = 0, worst_original = 0;
    for (std::size_t t = 0; t < T; ++t) {
        Tensor<double> plus = a.clone(), minus = a.clone();
        plus.data()[t] += 1e-6;
        minus.data()[t] -= 1e-6;
        const double numeric = (loss(plus) - loss(minus)) / 2e-6;
        const double original = gx.grad().data()[t] * h.data()[t];
        worst_ours = std::max(worst_ours, std::abs(ga.grad().data()[t] - numeric));
        worst_original = std::max(worst_original, std::abs(original - numeric));
    }
    CHECK(worst_ours < 1e-7);
    CHECK(worst_original > 1e-2);
}

TEST_CASE("scan: backward memory is linear in T (no T log T intermediates)", "[scan][memory]") {
    auto measure = [](std::size_t T) {
        olmax::Generator rng(1);
        Tensor<float> a = olmax::rand<float>({1, T, 16}, rng), x = olmax::rand<float>({1, T, 16}, rng);
        a.set_requires_grad(true);
        x.set_requires_grad(true);
        olmax::memory::reset_peak();
        const std::size_t base = olmax::memory::stats().current_bytes;
        {
            Tensor<float> h = sc::scan<sc::hillis_steele>(a, x);
            h.backward(Tensor<float>({1, T, 16}, 1.0f));
        }
        return double(olmax::memory::stats().peak_bytes - base) / double(T * 16 * sizeof(float));
    };
    const double small = measure(1024), large = measure(16384);
    INFO("peak bytes per element: T=1024 " << small << ", T=16384 " << large);
    // h, dh, dx, da and the gradients of a and x, plus O(T) scratch per thread: a constant per element.
    CHECK(large <= 12.0);
    CHECK(large <= small * 1.1);
}

// ---- bad input, NaN, floating-point environment ---------------------------------------------------

TEST_CASE("scan: bad input throws clear errors", "[scan]") {
    Tensor<float> a({2, 5, 3}, 0.5f), x({2, 5, 3}, 1.0f);
    CHECK_THROWS_AS(sc::scan<sc::sequential>(Tensor<float>({2, 4, 3}, 0.5f), x), olmax::shape_error);
    CHECK_THROWS_AS(sc::scan<sc::sequential>(Tensor<float>({2, 5, 2}, 0.5f), x), olmax::shape_error);  // 2 does not divide 3
    CHECK_THROWS_AS(sc::scan<sc::sequential>(Tensor<float>({5, 3}, 0.5f), Tensor<float>({5, 3}, 1.0f)), olmax::shape_error);
    CHECK_THROWS_AS(sc::scan<sc::sequential>(Tensor<float>({2, 0, 3}), Tensor<float>({2, 0, 3})), olmax::value_error);
    CHECK_THROWS_AS(sc::scan<sc::sequential>(a, x, {.h0 = Tensor<float>({3, 2})}), olmax::shape_error);
    CHECK_THROWS_AS(sc::scan<sc::chunked_matmul<128>>(a, x, {.chunk = 0}), olmax::value_error);
    CHECK_THROWS_AS(sc::scan<sc::hillis_steele_chunked<128>>(a, x, {.chunk = -4}), olmax::value_error);
    CHECK_THROWS_AS(sc::scan<sc::sequential>(Tensor<float>(), x), olmax::value_error);
    try {
        sc::scan<sc::blelloch>(Tensor<float>({2, 4, 3}, 0.5f), x);
    } catch (const olmax::shape_error& e) {
        CHECK(std::string(e.what()).find("scan<blelloch>") != std::string::npos);
        CHECK(std::string(e.what()).find("[2, 4, 3]") != std::string::npos);
    }
}

TEMPLATE_TEST_CASE("scan: NaN gates propagate as NaN", "[scan]", OLMAX_SCAN_STRATEGIES) {
    Tensor<float> a({1, 300, 2}, 0.5f), x({1, 300, 2}, 1.0f);
    a(0, 100, 1) = std::numeric_limits<float>::quiet_NaN();
    Tensor<float> h = sc::scan<TestType>(a, x);
    CHECK(std::isfinite(h(0, 99, 1)));
    CHECK(std::isnan(h(0, 100, 1)));
    CHECK(std::isnan(h(0, 299, 1)));
    CHECK(std::isfinite(h(0, 299, 0)));
}

#if defined(__SSE2__)
TEST_CASE("scan: kernels restore the caller's flush-to-zero mode", "[scan]") {
    const unsigned before = _mm_getcsr();
    Tensor<float> a({4, 2000, 32}, 0.9999f), x({4, 2000, 32}, 1.0f);
    sc::scan<sc::sequential_vectorized>(a, x);
    sc::scan<sc::two_pass>(a, x);
    CHECK(_mm_getcsr() == before);
}
#endif

// ---- scan::matrix_scan: h_t = M_t h_{t-1} + X_t with a matrix gate --------------------------------

namespace {

/// h of the matrix recurrence by plain loops in double (the test's own reference).
Tensor<double> matrix_scan_reference(const Tensor<double>& m, const Tensor<double>& x, const Tensor<double>& h0, bool reverse) {
    const std::size_t B = x.extent(0), n = x.extent(1), K = x.extent(2), V = x.extent(3);
    Tensor<double> h(x.shape(), 0.0);
    for (std::size_t b = 0; b < B; ++b) {
        std::vector<double> state(K * V, 0.0);
        if (h0.defined())
            for (std::size_t i = 0; i < K * V; ++i) state[i] = h0.data()[b * K * V + i];
        for (std::size_t k = 0; k < n; ++k) {
            const std::size_t t = reverse ? n - 1 - k : k;
            std::vector<double> next(K * V);
            for (std::size_t i = 0; i < K; ++i)
                for (std::size_t j = 0; j < V; ++j) {
                    double s = x.data()[((b * n + t) * K + i) * V + j];
                    for (std::size_t l = 0; l < K; ++l) s += m.data()[((b * n + t) * K + i) * K + l] * state[l * V + j];
                    next[i * V + j] = s;
                }
            state = next;
            for (std::size_t i = 0; i < K * V; ++i) h.data()[(b * n + t) * K * V + i] = state[i];
        }
    }
    return h;
}

}  // namespace

TEST_CASE("scan::matrix_scan: values equal the recurrence, from the start and the end, with and without h0", "[scan][matrix_scan]") {
    olmax::Generator rng(301);
    const Tensor<double> m = uniform_pm1<double>({2, 7, 3, 3}, rng), x = uniform_pm1<double>({2, 7, 3, 2}, rng), h0 = uniform_pm1<double>({2, 3, 2}, rng);
    for (bool reverse : {false, true})
        for (bool with_h0 : {false, true}) {
            INFO((reverse ? "from the end" : "from the start") << (with_h0 ? ", h0" : ", no h0"));
            const Tensor<double> start = with_h0 ? h0 : Tensor<double>();
            const auto r = sc::matrix_scan(m, x, start, {.reverse = reverse});
            const Tensor<double> expected = matrix_scan_reference(m, x, start, reverse);
            CHECK(olmax_test::max_abs_diff(r.h, expected) < 1e-14);
            const std::size_t last = reverse ? 0 : 6;
            for (std::size_t b = 0; b < 2; ++b)
                for (std::size_t i = 0; i < 6; ++i) CHECK(r.h_last.data()[b * 6 + i] == r.h.data()[(b * 7 + last) * 6 + i]);
            const auto f = sc::matrix_scan(olmax::cast<float>(m), olmax::cast<float>(x), with_h0 ? olmax::cast<float>(h0) : Tensor<float>(), {.reverse = reverse});
            CHECK(olmax_test::max_abs_diff(olmax::cast<double>(f.h), expected) < 1e-5);
        }
}

TEST_CASE("scan::matrix_scan: gradients (double) for gates, x and h0 through h and h_last, forward and reverse", "[scan][matrix_scan][grad]") {
    olmax::Generator rng(302);
    const Tensor<double> m = uniform_pm1<double>({2, 5, 3, 3}, rng), x = uniform_pm1<double>({2, 5, 3, 4}, rng), h0 = uniform_pm1<double>({2, 3, 4}, rng);
    for (bool reverse : {false, true})
        for (bool through_last : {false, true}) {
            INFO((reverse ? "from the end" : "from the start") << (through_last ? ", through h_last" : ", through h"));
            auto f = [&](const std::vector<Tensor<double>>& in) {
                const auto r = sc::matrix_scan(in[0], in[1], in[2], {.reverse = reverse});
                return through_last ? r.h_last : r.h;
            };
            olmax_test::check_gradients(f, {m, x, h0});
        }
    auto no_h0 = [&](const std::vector<Tensor<double>>& in) { return sc::matrix_scan(in[0], in[1]).h; };  // one step: no earlier state
    olmax_test::check_gradients(no_h0, {uniform_pm1<double>({1, 1, 2, 2}, rng), uniform_pm1<double>({1, 1, 2, 3}, rng)});
    olmax_test::check_gradients(no_h0, {m, x});
    auto fixed_gates = [&](const std::vector<Tensor<double>>& in) { return sc::matrix_scan(m, in[0], in[1], {.reverse = true}).h; };  // no dM wanted
    olmax_test::check_gradients(fixed_gates, {x, h0});
}

TEST_CASE("scan::matrix_scan: bad shapes are refused naming the op", "[scan][matrix_scan]") {
    const Tensor<float> m({2, 4, 3, 3}, 0.5f), x({2, 4, 3, 2}, 1.0f);
    CHECK_THROWS_WITH(sc::matrix_scan(Tensor<float>({2, 4, 3, 2}, 0.5f), x), Catch::Contains("matrix_scan") && Catch::Contains("[2, 4, 3, 2]"));
    CHECK_THROWS_WITH(sc::matrix_scan(Tensor<float>({2, 5, 3, 3}, 0.5f), x), Catch::Contains("matrix_scan: gates [2, 5, 3, 3] do not match inputs"));
    CHECK_THROWS_WITH(sc::matrix_scan(m, Tensor<float>({2, 4, 3}, 1.0f)), Catch::Contains("matrix_scan: takes gates [batch, n, K, K]"));
    CHECK_THROWS_WITH(sc::matrix_scan(m, x, Tensor<float>({2, 2, 3}, 0.0f)), Catch::Contains("matrix_scan: h0 [2, 2, 3] does not match the state [2, 3, 2]"));
    CHECK_THROWS_AS(sc::matrix_scan(Tensor<float>({2, 0, 3, 3}), Tensor<float>({2, 0, 3, 2})), olmax::value_error);
    CHECK_THROWS_AS(sc::matrix_scan(Tensor<float>(), x), olmax::shape_error);
}
