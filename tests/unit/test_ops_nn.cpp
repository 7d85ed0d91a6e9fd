#include "test_helpers.hpp"

#include <cmath>
#include <limits>
#include <optional>

using olmax::Shape;
using olmax::Tensor;
using olmax::testing::check_gradients;
using Inputs = std::vector<Tensor<double>>;
using Ids = Tensor<std::int32_t>;

namespace {

constexpr double inf = std::numeric_limits<double>::infinity();

bool all_finite(const Tensor<double>& t) {
    for (double v : t.span())
        if (!std::isfinite(v)) return false;
    return true;
}

/// Scalar-loop reference of the causal convolution (same definition as the op's comment); raw
/// indexing keeps it fast in debug builds.
template <class T>
Tensor<T> naive_conv(const Tensor<T>& x, const Tensor<T>& w, std::size_t groups, const Tensor<T>* bias = nullptr) {
    const std::size_t batch = x.shape()[0], time = x.shape()[1], cin = x.shape()[2];
    const std::size_t taps = w.shape()[0], cig = w.shape()[1], cout = w.shape()[2], cog = cout / groups;
    Tensor<T> out({batch, time, cout});
    const T *xp = x.data(), *wp = w.data();
    for (std::size_t b = 0; b < batch; ++b)
        for (std::size_t t = 0; t < time; ++t)
            for (std::size_t o = 0; o < cout; ++o) {
                double acc = bias ? double(bias->data()[o]) : 0.0;
                const std::size_t g = o / cog;
                for (std::size_t k = 0; k < taps; ++k) {
                    const long src = long(t) - long(taps - 1) + long(k);
                    if (src < 0) continue;
                    for (std::size_t c = 0; c < cig; ++c)
                        acc += double(xp[(b * time + std::size_t(src)) * cin + g * cig + c]) * double(wp[(k * cig + c) * cout + o]);
                }
                out.data()[(b * time + t) * cout + o] = T(acc);
            }
    return out;
}

Ids ids_from(const Shape& shape, std::initializer_list<std::int32_t> v) { return Ids::from(shape, v); }

}  // namespace

// ---- embedding ---------------------------------------------------------------------------------

TEST_CASE("embedding gathers rows and scatter-adds its gradient", "[ops][nn][embedding]") {
    olmax::Generator rng(11);
    auto table = olmax::randn<double>({5, 3}, rng);
    auto ids = ids_from({2, 3}, {4, 0, 4, 1, 2, 4});
    auto y = olmax::embedding(table, ids);
    REQUIRE(y.shape() == Shape{2, 3, 3});
    for (std::size_t i = 0; i < 2; ++i)
        for (std::size_t j = 0; j < 3; ++j)
            for (std::size_t f = 0; f < 3; ++f) CHECK(y(i, j, f) == table(std::size_t(ids(i, j)), f));

    auto w = olmax::parameter(table.clone());
    olmax::sum(olmax::embedding(w, ids)).backward();
    const double expect_rows[5] = {1, 1, 1, 0, 3};  // id 4 appears three times, id 3 never
    for (std::size_t v = 0; v < 5; ++v)
        for (std::size_t f = 0; f < 3; ++f) CHECK(w.grad()(v, f) == expect_rows[v]);

    CHECK(check_gradients([&](const Inputs& in) { return olmax::embedding(in[0], ids); }, {table}));
    CHECK(olmax::embedding(table, Ids({0})).shape() == Shape{0, 3});
    CHECK(olmax::embedding(table, Ids::scalar(2)).shape() == Shape{3});

    CHECK_THROWS_AS(olmax::embedding(table, ids_from({2}, {1, 5})), olmax::value_error);
    CHECK_THROWS_WITH(olmax::embedding(table, ids_from({2}, {1, 5})), Catch::Contains("id 5") && Catch::Contains("V=5"));
    CHECK_THROWS_AS(olmax::embedding(table, ids_from({1}, {-1})), olmax::value_error);
    CHECK_THROWS_AS(olmax::embedding(olmax::randn<double>({5}, rng), ids), olmax::shape_error);
}

// ---- causal convolution ------------------------------------------------------------------------

TEST_CASE("causal_conv1d matches a scalar-loop reference", "[ops][nn][conv]") {
    olmax::Generator rng(12);
    struct Case {
        std::size_t batch, time, cin, cout, taps, groups;
    };
    for (const Case c : {Case{2, 7, 4, 6, 3, 1}, Case{3, 5, 4, 6, 2, 2}, Case{1, 9, 6, 3, 4, 3}, Case{2, 3, 2, 2, 5, 1}, Case{2, 4, 4, 4, 1, 4}}) {
        auto x = olmax::randn<double>({c.batch, c.time, c.cin}, rng);
        auto w = olmax::randn<double>({c.taps, c.cin / c.groups, c.cout}, rng);
        auto b = olmax::randn<double>({c.cout}, rng);
        CHECK(olmax_test::max_abs_diff(olmax::causal_conv1d(x, w, c.groups), naive_conv(x, w, c.groups)) < 1e-12);
        CHECK(olmax_test::max_abs_diff(olmax::causal_conv1d(x, w, b, c.groups), naive_conv(x, w, c.groups, &b)) < 1e-12);
        CHECK(olmax_test::max_abs_diff(olmax_test::with_kernels<olmax::backend::cpu_serial>([&] { return olmax::causal_conv1d(x, w, b, c.groups); }), naive_conv(x, w, c.groups, &b)) < 1e-12);
    }
    // float, and a size where the backend takes its threaded path
    auto xf = olmax::randn<float>({4, 64, 32}, rng);
    auto wf = olmax::randn<float>({5, 16, 32}, rng);
    CHECK(olmax_test::max_abs_diff(olmax::causal_conv1d(xf, wf, 2), naive_conv(xf, wf, 2)) < 1e-3);
}

TEST_CASE("causal_conv1d gradients (groups, bias, K > T)", "[ops][nn][conv][gradcheck]") {
    olmax::Generator rng(13);
    auto plain = check_gradients([](const Inputs& v) { return olmax::causal_conv1d(v[0], v[1]); },
                                 {olmax::randn<double>({2, 5, 3}, rng), olmax::randn<double>({3, 3, 2}, rng)});
    CHECK(plain);
    auto grouped = check_gradients([](const Inputs& v) { return olmax::causal_conv1d(v[0], v[1], v[2], 2); },
                                   {olmax::randn<double>({2, 4, 4}, rng), olmax::randn<double>({2, 2, 6}, rng), olmax::randn<double>({6}, rng)});
    CHECK(grouped);
    auto long_kernel = check_gradients([](const Inputs& v) { return olmax::causal_conv1d(v[0], v[1], v[2], 1); },
                                       {olmax::randn<double>({1, 3, 2}, rng), olmax::randn<double>({5, 2, 2}, rng), olmax::randn<double>({2}, rng)});
    CHECK(long_kernel);
    // Under the bf16 policy an ungrouped convolution's forward and dw are one GEMM each on the
    // unfolded input (conv.hpp); double GEMMs stay exact there, so the same checks hold, K > T and
    // a single tap (no unfolding copy) included.
    olmax::backend::bf16_matmul_scope policy;
    CHECK(check_gradients([](const Inputs& v) { return olmax::causal_conv1d(v[0], v[1]); },
                          {olmax::randn<double>({2, 5, 3}, rng), olmax::randn<double>({3, 3, 2}, rng)}));
    CHECK(check_gradients([](const Inputs& v) { return olmax::causal_conv1d(v[0], v[1], v[2], 1); },
                          {olmax::randn<double>({2, 3, 2}, rng), olmax::randn<double>({5, 2, 2}, rng), olmax::randn<double>({2}, rng)}));
    CHECK(check_gradients([](const Inputs& v) { return olmax::causal_conv1d(v[0], v[1], v[2]); },
                          {olmax::randn<double>({2, 4, 3}, rng), olmax::randn<double>({1, 3, 2}, rng), olmax::randn<double>({2}, rng)}));
}

TEST_CASE("causal_conv1d under the bf16 policy matches the scalar-loop reference in double", "[ops][nn][conv][bf16]") {
    // The policy's unfolded forward (ungrouped) and per-tap forward (grouped); double GEMMs are exact.
    olmax::Generator rng(15);
    olmax::backend::bf16_matmul_scope policy;
    struct Case {
        std::size_t batch, time, cin, cout, taps, groups;
    };
    for (const Case c : {Case{2, 7, 4, 6, 3, 1}, Case{2, 3, 2, 2, 5, 1}, Case{3, 6, 3, 4, 1, 1}, Case{3, 5, 4, 6, 2, 2}}) {
        INFO("batch " << c.batch << " time " << c.time << " taps " << c.taps << " groups " << c.groups);
        auto x = olmax::randn<double>({c.batch, c.time, c.cin}, rng);
        auto w = olmax::randn<double>({c.taps, c.cin / c.groups, c.cout}, rng);
        auto b = olmax::randn<double>({c.cout}, rng);
        CHECK(olmax_test::max_abs_diff(olmax::causal_conv1d(x, w, c.groups), naive_conv(x, w, c.groups)) < 1e-12);
        CHECK(olmax_test::max_abs_diff(olmax::causal_conv1d(x, w, b, c.groups), naive_conv(x, w, c.groups, &b)) < 1e-12);
    }
}

TEST_CASE("causal_conv1d under the bf16 policy unfolds a large batch in groups of batch elements", "[ops][nn][conv][bf16]") {
    // One batch element unfolds to 40 x 5 x 250 = 50,000 elements, so a buffer of
    // unfolded_buffer_elements (2^17) holds two: the batch of 3 goes as groups of 2 and 1, whose
    // forward rows and dw sums must cover every element once. Checked against the scalar loop
    // (forward) and the per-tap path outside the policy (dx, dw), in double.
    static_assert(2 * 40 * 5 * 250 <= olmax::detail::conv_ops::unfolded_buffer_elements &&
                  3 * 40 * 5 * 250 > olmax::detail::conv_ops::unfolded_buffer_elements);
    olmax::Generator rng(16);
    auto x_value = olmax::randn<double>({3, 40, 250}, rng);
    auto w_value = olmax::randn<double>({5, 250, 4}, rng);
    auto r = olmax::randn<double>({3, 40, 4}, rng);
    auto grads = [&](bool policy_on) {
        std::optional<olmax::backend::bf16_matmul_scope> policy;
        if (policy_on) policy.emplace();
        auto x = olmax::parameter(x_value.clone()), w = olmax::parameter(w_value.clone());
        auto y = olmax::causal_conv1d(x, w);
        olmax::sum(olmax::mul(y, r)).backward();
        return std::vector<Tensor<double>>{y.detach(), x.grad(), w.grad()};
    };
    const auto grouped = grads(true), per_tap = grads(false);
    // An empty batch makes no group (and no out-of-range group size).
    {
        olmax::backend::bf16_matmul_scope policy;
        auto w = olmax::parameter(w_value.clone());
        auto y = olmax::causal_conv1d(olmax::parameter(Tensor<double>({0, 40, 250})), w);
        CHECK(y.shape() == Shape{0, 40, 4});
        olmax::sum(y).backward();
        CHECK(olmax_test::max_abs_diff(w.grad(), Tensor<double>(w.shape(), 0.0)) == 0.0);
    }
    CHECK(olmax_test::max_abs_diff(grouped[0], naive_conv(x_value, w_value, 1)) < 1e-11);
    CHECK(olmax_test::max_abs_diff(grouped[1], per_tap[1]) < 1e-11);
    CHECK(olmax_test::max_abs_diff(grouped[2], per_tap[2]) < 1e-10);
}

TEST_CASE("causal_conv1d is causal: changing x at time t leaves earlier outputs unchanged", "[ops][nn][conv]") {
    olmax::Generator rng(14);
    auto x = olmax::randn<double>({2, 8, 4}, rng);
    auto w = olmax::randn<double>({3, 2, 4}, rng);
    const auto y = olmax::causal_conv1d(x, w, 2);
    const std::size_t t_changed = 5;
    auto x2 = x.clone();
    for (std::size_t c = 0; c < 4; ++c) x2(1, t_changed, c) += 10.0;
    const auto y2 = olmax::causal_conv1d(x2, w, 2);
    for (std::size_t t = 0; t < 8; ++t)
        for (std::size_t o = 0; o < 4; ++o) {
            CHECK(y2(0, t, o) == y(0, t, o));  // other batch untouched
            if (t < t_changed) CHECK(y2(1, t, o) == y(1, t, o));
        }
    double changed = 0;
    for (std::size_t o = 0; o < 4; ++o) changed += std::abs(y2(1, t_changed, o) - y(1, t_changed, o));
    CHECK(changed > 0);
}

TEST_CASE("causal_conv1d rejects bad shapes and handles empty sizes", "[ops][nn][conv]") {
    olmax::Generator rng(15);
    auto x = olmax::randn<double>({2, 5, 4}, rng);
    CHECK_THROWS_AS(olmax::causal_conv1d(x, olmax::randn<double>({3, 3, 2}, rng)), olmax::shape_error);  // Cin mismatch
    CHECK_THROWS_WITH(olmax::causal_conv1d(x, olmax::randn<double>({3, 3, 2}, rng)),
                      Catch::Contains("causal_conv1d") && Catch::Contains("[3, 3, 2]") && Catch::Contains("[2, 5, 4]"));
    CHECK_THROWS_AS(olmax::causal_conv1d(x, olmax::randn<double>({3, 2, 3}, rng), 2), olmax::shape_error);  // Cout % groups
    CHECK_THROWS_AS(olmax::causal_conv1d(x, olmax::randn<double>({3, 4, 3}, rng), 3), olmax::shape_error);  // Cin % groups
    CHECK_THROWS_AS(olmax::causal_conv1d(x, olmax::randn<double>({3, 4, 3}, rng), 0), olmax::value_error);
    CHECK_THROWS_AS(olmax::causal_conv1d(x, olmax::randn<double>({0, 4, 3}, rng)), olmax::shape_error);
    CHECK_THROWS_AS(olmax::causal_conv1d(x, olmax::randn<double>({2, 4, 3}, rng), olmax::randn<double>({4}, rng)), olmax::shape_error);
    CHECK_THROWS_AS(olmax::causal_conv1d(olmax::randn<double>({5, 4}, rng), olmax::randn<double>({2, 4, 3}, rng)), olmax::shape_error);
    CHECK(olmax::causal_conv1d(Tensor<double>({2, 0, 4}), olmax::randn<double>({2, 4, 3}, rng)).shape() == Shape{2, 0, 3});
    CHECK(olmax::causal_conv1d(Tensor<double>({0, 3, 4}), olmax::randn<double>({2, 4, 3}, rng)).shape() == Shape{0, 3, 3});
}

TEST_CASE("causal_conv1d gradients do not depend on the thread split (taps cut into column pieces)", "[ops][nn][conv]") {
    using olmax::backend::cpu_openmp;
    using olmax::backend::cpu_serial;
    olmax::Generator rng(28);
    struct Case {
        std::size_t batch, time, cin, cout, taps, groups;
    };
    // 5 and 4 (tap, group) blocks on 3 threads: dw's columns are cut into uneven pieces; K > T too
    for (const Case c : {Case{2, 6, 4, 5, 5, 1}, Case{3, 3, 4, 6, 4, 1}, Case{2, 5, 6, 4, 2, 2}}) {
        const auto x = olmax::randn<double>({c.batch, c.time, c.cin}, rng);
        const auto w = olmax::randn<double>({c.taps, c.cin / c.groups, c.cout}, rng);
        const auto b = olmax::randn<double>({c.cout}, rng);
        const auto seed = olmax::randn<double>({c.batch, c.time, c.cout}, rng);
        auto grads = [&](auto backend) {
            using B = decltype(backend);
            auto xp = olmax::parameter(x.clone()), wp = olmax::parameter(w.clone()), bp = olmax::parameter(b.clone());
            olmax_test::with_kernels<B>([&] {  // forward and backward on B's kernels
                olmax::causal_conv1d(xp, wp, bp, c.groups).backward(seed);
                return 0;
            });
            return std::vector<Tensor<double>>{xp.grad().clone(), wp.grad().clone(), bp.grad().clone()};
        };
        const auto serial = grads(cpu_serial{});
        olmax_test::ForceThreading force;
        const auto threaded = grads(cpu_openmp{});
        for (std::size_t i = 0; i < 3; ++i) CHECK(olmax_test::max_abs_diff(threaded[i], serial[i]) < 1e-12);
        const auto naive_y = naive_conv(x, w, c.groups, &b);
        CHECK(olmax_test::max_abs_diff(olmax_test::with_kernels<cpu_openmp>([&] { return olmax::causal_conv1d(x, w, b, c.groups); }), naive_y) < 1e-12);
    }
}

TEST_CASE("DenseConv's fused ScaleNorm + leaky-ReLU matches the two ops, values and gradients", "[ops][nn][conv][gradcheck]") {
    using olmax::backend::cpu_openmp;
    using olmax::backend::cpu_serial;
    olmax::Generator rng(27);
    const double eps = 1e-3, slope = 0.1;
    auto h = olmax::randn<double>({2, 3, 6}, rng);
    for (std::size_t f = 0; f < 6; ++f) h(1, 2, f) = 1e-4 * double(f);  // a clamped row: its norm is below eps
    const auto w = olmax::randn<double>({6}, rng);                        // signed scale: both leaky branches
    const auto seed = olmax::randn<double>({2, 3, 6}, rng);
    auto fused = [&](const Tensor<double>& a, const Tensor<double>& b) {
        return olmax_test::with_kernels<cpu_serial>([&] { return olmax::nn::detail::scale_norm_leaky_relu(a, b, eps, slope); });
    };
    auto two_ops = [&](const Tensor<double>& a, const Tensor<double>& b) { return olmax::leaky_relu(olmax::scale_norm(a, b, eps), slope); };
    auto grads = [&](auto&& f) {
        auto hp = olmax::parameter(h.clone()), wp = olmax::parameter(w.clone());
        f(hp, wp).backward(seed);
        return std::pair{hp.grad().clone(), wp.grad().clone()};
    };
    CHECK(olmax_test::max_abs_diff(fused(h, w), two_ops(h, w)) < 1e-15);
    const auto [dh_fused, dw_fused] = grads(fused);
    const auto [dh_ref, dw_ref] = grads(two_ops);
    CHECK(olmax_test::max_abs_diff(dh_fused, dh_ref) < 1e-12);
    CHECK(olmax_test::max_abs_diff(dw_fused, dw_ref) < 1e-12);
    {
        olmax_test::ForceThreading force;
        const auto [dh_threads, dw_threads] = grads([&](const Tensor<double>& a, const Tensor<double>& b) {
            return olmax_test::with_kernels<cpu_openmp>([&] { return olmax::nn::detail::scale_norm_leaky_relu(a, b, eps, slope); });
        });
        CHECK(olmax_test::max_abs_diff(dh_threads, dh_fused) == 0);
        CHECK(olmax_test::max_abs_diff(dw_threads, dw_fused) == 0);
    }
    // finite differences away from the leaky kink and the eps clamp (no zero or tiny rows)
    CHECK(check_gradients([&](const Inputs& v) { return fused(v[0], v[1]); }, {olmax::randn<double>({2, 3, 6}, rng), w}));
    CHECK_THROWS_AS(fused(h, olmax::randn<double>({5}, rng)), olmax::shape_error);
    CHECK_THROWS_AS(olmax_test::with_kernels<cpu_serial>([&] { return olmax::nn::detail::scale_norm_leaky_relu(h, w, 0.0, slope); }), olmax::value_error);
}

// ---- norms -------------------------------------------------------------------------------------

TEST_CASE("scale_norm is x / ||x||_2 * w over the last axis", "[ops][nn][norm]") {
    olmax::Generator rng(16);
    auto x = olmax::randn<double>({2, 3, 5}, rng);
    auto w = olmax::randn<double>({5}, rng);
    auto y = olmax::scale_norm(x, w);
    auto y_plain = olmax::scale_norm(x, Tensor<double>());
    for (std::size_t a = 0; a < 2; ++a)
        for (std::size_t b = 0; b < 3; ++b) {
            double ss = 0;
            for (std::size_t f = 0; f < 5; ++f) ss += x(a, b, f) * x(a, b, f);
            for (std::size_t f = 0; f < 5; ++f) {
                CHECK(y(a, b, f) == Approx(x(a, b, f) / std::sqrt(ss) * w(f)).epsilon(1e-12));
                CHECK(y_plain(a, b, f) == Approx(x(a, b, f) / std::sqrt(ss)).epsilon(1e-12));
            }
        }
    CHECK(check_gradients([](const Inputs& v) { return olmax::scale_norm(v[0], v[1]); }, {x, w}));
    CHECK(check_gradients([](const Inputs& v) { return olmax::scale_norm(v[0], Tensor<double>()); }, {x}));

    // A zero row: r = 1/eps, output 0, finite gradient r * dxhat (r is constant there).
    auto z = olmax::parameter(Tensor<double>({1, 4}));
    auto out = olmax::scale_norm(z, Tensor<double>(), 1e-3);
    CHECK(out(0, 0) == 0.0);
    olmax::sum(out).backward();
    for (double g : z.grad().span()) CHECK(g == Approx(1e3));
    // Rows below eps are linear in x (clamped branch), rows above are normalised.
    auto mixed = olmax::Tensor<double>::from({2, 3}, {0.01, -0.02, 0.03, 1.0, 2.0, -0.5});
    CHECK(check_gradients([](const Inputs& v) { return olmax::scale_norm(v[0], v[1], 0.5); }, {mixed, olmax::randn<double>({3}, rng)}));

    CHECK_THROWS_AS(olmax::scale_norm(x, olmax::randn<double>({4}, rng)), olmax::shape_error);
    CHECK_THROWS_WITH(olmax::scale_norm(x, olmax::randn<double>({4}, rng)), Catch::Contains("scale_norm") && Catch::Contains("[2, 3, 5]"));
    CHECK_THROWS_AS(olmax::scale_norm(Tensor<double>::scalar(1.0), w), olmax::shape_error);
    CHECK(olmax::scale_norm(Tensor<double>({0, 5}), w).shape() == Shape{0, 5});
    CHECK(olmax::scale_norm(Tensor<double>({3, 0}), Tensor<double>()).shape() == Shape{3, 0});
    auto nan_row = Tensor<double>::from({1, 2}, {std::nan(""), 1.0});
    CHECK(std::isnan(olmax::scale_norm(nan_row, Tensor<double>())(0, 1)));
}

TEST_CASE("rms_norm is x / sqrt(mean(x^2) + eps) * w", "[ops][nn][norm]") {
    olmax::Generator rng(17);
    auto x = olmax::randn<double>({4, 6}, rng);
    auto w = olmax::randn<double>({6}, rng);
    auto y = olmax::rms_norm(x, w, 1e-3);
    for (std::size_t i = 0; i < 4; ++i) {
        double ss = 0;
        for (std::size_t f = 0; f < 6; ++f) ss += x(i, f) * x(i, f);
        const double s = 1.0 / std::sqrt(ss / 6 + 1e-3);
        for (std::size_t f = 0; f < 6; ++f) CHECK(y(i, f) == Approx(x(i, f) * s * w(f)).epsilon(1e-12));
    }
    CHECK(check_gradients([](const Inputs& v) { return olmax::rms_norm(v[0], v[1], 1e-3); }, {x, w}));
    CHECK(check_gradients([](const Inputs& v) { return olmax::rms_norm(v[0], Tensor<double>()); }, {olmax::randn<double>({2, 3, 4}, rng)}));
    // all-zero rows stay finite thanks to eps
    auto z = olmax::parameter(Tensor<double>({2, 3}));
    olmax::sum(olmax::rms_norm(z, Tensor<double>())).backward();
    CHECK(all_finite(z.grad()));
    CHECK_THROWS_AS(olmax::rms_norm(x, olmax::randn<double>({2, 3}, rng)), olmax::shape_error);

    auto xf = olmax::randn<float>({3, 8}, rng);
    auto yf = olmax::rms_norm(xf, olmax::ones<float>({8}), 1e-6);  // a double eps converts to T
    CHECK(olmax::scale_norm(xf, Tensor<float>(), 1e-12).shape() == xf.shape());
    CHECK(olmax::cross_entropy(xf, ids_from({3}, {0, 1, 2}), 0.5).item() > 0);
    double ms = 0;
    for (std::size_t f = 0; f < 8; ++f) ms += double(yf(1, f)) * double(yf(1, f)) / 8;
    CHECK(ms == Approx(1.0).epsilon(1e-4));
}

// ---- softmax family ----------------------------------------------------------------------------

TEST_CASE("softmax and log_softmax: values, any axis, stability", "[ops][nn][softmax]") {
    olmax::Generator rng(18);
    auto x = olmax::randn<double>({3, 4, 2}, rng);
    for (long axis : {0L, 1L, -1L}) {
        auto p = olmax::softmax(x, axis);
        auto lp = olmax::log_softmax(x, axis);
        const std::size_t a = std::size_t(axis < 0 ? axis + 3 : axis);
        for (std::size_t i = 0; i < x.size(); ++i) CHECK(std::log(p.data()[i]) == Approx(lp.data()[i]).epsilon(1e-12));
        auto total = olmax::sum(p, {axis});
        for (double s : total.span()) CHECK(s == Approx(1.0).epsilon(1e-12));
        (void)a;
        CHECK(check_gradients([axis](const Inputs& v) { return olmax::softmax(v[0], axis); }, {x}));
        CHECK(check_gradients([axis](const Inputs& v) { return olmax::log_softmax(v[0], axis); }, {x}));
    }
    // hand-computed: softmax([0, ln 3]) = [1/4, 3/4], shifted by a huge constant
    auto big = Tensor<double>::from({1, 2}, {1000.0, 1000.0 + std::log(3.0)});
    auto p = olmax::softmax(big);
    CHECK(p(0, 0) == Approx(0.25));
    CHECK(p(0, 1) == Approx(0.75));
    CHECK(olmax::log_softmax(big)(0, 0) == Approx(std::log(0.25)));
    auto pf = olmax::softmax(Tensor<float>::from({3}, {-1e4f, 0.f, 1e4f}));
    CHECK(pf(2) == 1.f);
    CHECK(pf(0) == 0.f);
}

TEST_CASE("softmax with -inf entries and fully masked rows gives no NaN gradients", "[ops][nn][softmax]") {
    auto x = olmax::parameter(Tensor<double>::from({2, 3}, {-inf, -inf, -inf, 0.5, -inf, -0.5}));
    auto p = olmax::softmax(x);
    CHECK(p(0, 0) == 0.0);
    CHECK(p(1, 1) == 0.0);
    CHECK(p(1, 0) + p(1, 2) == Approx(1.0));
    olmax::sum(olmax::square(p)).backward();
    CHECK(all_finite(x.grad()));
    for (std::size_t j = 0; j < 3; ++j) CHECK(x.grad()(0, j) == 0.0);

    auto x2 = olmax::parameter(x.detach().clone());
    auto lp = olmax::log_softmax(x2);
    CHECK(lp(0, 1) == -inf);
    CHECK(lp(1, 1) == -inf);
    CHECK(std::isfinite(lp(1, 0)));
    lp.backward(olmax::ones<double>({2, 3}));
    CHECK(all_finite(x2.grad()));
    for (std::size_t j = 0; j < 3; ++j) CHECK(x2.grad()(0, j) == 0.0);

    CHECK(olmax::softmax(Tensor<double>({2, 0})).shape() == Shape{2, 0});
    CHECK(olmax::softmax(Tensor<double>({0, 4}), 0).shape() == Shape{0, 4});
    auto nan = olmax::softmax(Tensor<double>::from({2}, {std::nan(""), 1.0}));
    CHECK(std::isnan(nan(1)));
    CHECK_THROWS_AS(olmax::softmax(Tensor<double>({2, 3}), 2), olmax::shape_error);
}

TEST_CASE("logsumexp: values on any axis with and without keepdims, stability, gradients, masked lines", "[ops][nn][softmax]") {
    olmax::Generator rng(24);
    const auto x = olmax::randn<double>({3, 4, 2}, rng);
    for (long axis : {0L, 1L, -1L}) {
        INFO("axis " << axis);
        const std::size_t a = std::size_t(axis < 0 ? axis + 3 : axis);
        const auto kept = olmax::logsumexp(x, axis, true), dropped = olmax::logsumexp(x, axis);
        Shape expect_kept = x.shape(), expect_dropped = x.shape();
        expect_kept[a] = 1;
        expect_dropped.erase(expect_dropped.begin() + std::ptrdiff_t(a));
        CHECK(kept.shape() == expect_kept);
        CHECK(dropped.shape() == expect_dropped);
        // log(sum(exp)) written out, against both results (the same elements in the same order)
        const auto direct = olmax::log(olmax::sum(olmax::exp(x), {axis}));
        for (std::size_t i = 0; i < direct.size(); ++i) {
            CHECK(dropped.data()[i] == Approx(direct.data()[i]).epsilon(1e-12));
            CHECK(kept.data()[i] == dropped.data()[i]);
        }
        CHECK(check_gradients([axis](const Inputs& v) { return olmax::logsumexp(v[0], axis); }, {x}));
        CHECK(check_gradients([axis](const Inputs& v) { return olmax::logsumexp(v[0], axis, true); }, {x}));
    }
    // shifted by a huge constant: log(e^1000 (1 + 3)) = 1000 + log 4
    CHECK(olmax::logsumexp(Tensor<double>::from({2}, {1000.0, 1000.0 + std::log(3.0)})).item() == Approx(1000.0 + std::log(4.0)));
    CHECK(olmax::logsumexp(Tensor<float>::from({3}, {-1e4f, 0.f, 1e4f})).item() == 1e4f);
    // a line of -inf: -inf with no gradient; a line with some -inf entries: the others' lse
    auto masked = olmax::parameter(Tensor<double>::from({2, 3}, {-inf, -inf, -inf, 0.5, -inf, -0.5}));
    const auto lse = olmax::logsumexp(masked, 1);
    CHECK(lse(0) == -inf);
    CHECK(lse(1) == Approx(std::log(std::exp(0.5) + std::exp(-0.5))));
    olmax::sum(lse * Tensor<double>::from({2}, {1, 1})).backward();
    CHECK(all_finite(masked.grad()));
    for (std::size_t j = 0; j < 3; ++j) CHECK(masked.grad()(0, j) == 0.0);
    CHECK(masked.grad()(1, 0) + masked.grad()(1, 2) == Approx(1.0));  // softmax of the line
    CHECK(masked.grad()(1, 1) == 0.0);
    // an empty axis: the log of an empty sum, -inf, per line (as torch.logsumexp); empty lines: no elements
    const auto empty_axis = olmax::logsumexp(Tensor<double>({2, 0}), 1);
    REQUIRE(empty_axis.shape() == Shape{2});
    CHECK(empty_axis(0) == -inf);
    CHECK(empty_axis(1) == -inf);
    CHECK(olmax::logsumexp(Tensor<double>({0, 4}), 1, true).shape() == Shape{0, 1});
    CHECK_THROWS_AS(olmax::logsumexp(Tensor<double>({2, 3}), 2), olmax::shape_error);
}

// ---- cross-entropy -----------------------------------------------------------------------------

TEST_CASE("cross_entropy: value, z-loss and gradients", "[ops][nn][loss]") {
    olmax::Generator rng(19);
    auto logits = olmax::randn<double>({5, 7}, rng, 0.0, 2.0);
    auto targets = ids_from({5}, {0, 6, 3, 3, 1});
    auto lp = olmax::log_softmax(logits);
    double expect = 0, lse_sq = 0;
    for (std::size_t i = 0; i < 5; ++i) {
        expect -= lp(i, std::size_t(targets(i))) / 5;
        const double lse = logits(i, 0) - lp(i, 0);
        lse_sq += lse * lse / 5;
    }
    CHECK(olmax::cross_entropy(logits, targets).item() == Approx(expect).epsilon(1e-12));
    CHECK(olmax::cross_entropy(logits, targets, 0.1).item() == Approx(expect + 0.1 * lse_sq).epsilon(1e-12));
    // Uniform logits: loss = log V.
    CHECK(olmax::cross_entropy(Tensor<double>({3, 8}), ids_from({3}, {0, 1, 7})).item() == Approx(std::log(8.0)));

    CHECK(check_gradients([&](const Inputs& v) { return olmax::cross_entropy(v[0], targets); }, {logits}));
    CHECK(check_gradients([&](const Inputs& v) { return olmax::cross_entropy(v[0], targets, 0.1); }, {logits}));

    CHECK_THROWS_AS(olmax::cross_entropy(logits, ids_from({5}, {0, 7, 0, 0, 0})), olmax::value_error);
    CHECK_THROWS_WITH(olmax::cross_entropy(logits, ids_from({5}, {0, 7, 0, 0, 0})), Catch::Contains("target 7") && Catch::Contains("V=7"));
    CHECK_THROWS_AS(olmax::cross_entropy(logits, ids_from({4}, {0, 1, 2, 3})), olmax::shape_error);
    CHECK_THROWS_AS(olmax::cross_entropy(olmax::randn<double>({5}, rng), targets), olmax::shape_error);
    CHECK(std::isnan(olmax::cross_entropy(Tensor<double>({0, 7}), Ids({0})).item()));
}

namespace {

struct HeadGrads {
    double loss;
    Tensor<double> dh, dw;
};

template <class F>
HeadGrads head_grads(F&& loss_fn, const Tensor<double>& hidden, const Tensor<double>& w_out) {
    auto h = olmax::parameter(hidden.clone());
    auto w = olmax::parameter(w_out.clone());
    auto loss = loss_fn(h, w);
    const double value = loss.item();
    olmax::scale(loss, 3.0).backward();  // a non-unit incoming gradient
    return {value, h.grad(), w.grad()};
}

}  // namespace

TEST_CASE("chunked_cross_entropy equals cross_entropy(matmul(hidden, w_out))", "[ops][nn][loss]") {
    olmax::Generator rng(20);
    const std::size_t n = 10, f = 4, v = 7;  // V < 128
    auto hidden = olmax::randn<double>({n, f}, rng);
    auto w_out = olmax::randn<double>({f, v}, rng);
    auto targets = Ids::uninitialized({n});
    for (std::size_t i = 0; i < n; ++i) targets(i) = std::int32_t(rng.below(v));

    for (double z : {0.0, 0.05}) {
        const auto full = head_grads([&](const Tensor<double>& h, const Tensor<double>& w) { return olmax::cross_entropy(olmax::matmul(h, w), targets, z); },
                                     hidden, w_out);
        const double z_term = [&] {
            auto logits = olmax::matmul(hidden, w_out);
            auto lp = olmax::log_softmax(logits);
            double s = 0;
            for (std::size_t i = 0; i < n; ++i) s += std::pow(logits(i, 0) - lp(i, 0), 2) / double(n);
            return z * s;
        }();
        for (std::size_t chunk : {std::size_t(1), std::size_t(3), std::size_t(5), std::size_t(10), std::size_t(1000)}) {
            INFO("z_loss " << z << ", chunk_tokens " << chunk);
            const auto chunked = head_grads(
                [&](const Tensor<double>& h, const Tensor<double>& w) {
                    return olmax::chunked_cross_entropy(h, w, targets, olmax::ChunkedLossOptions{z, chunk});
                },
                hidden, w_out);
            CHECK(chunked.loss == Approx(full.loss - z_term).epsilon(1e-12));  // value excludes the z-loss term
            CHECK(olmax_test::max_abs_diff(chunked.dh, full.dh) < 1e-12);       // gradient includes it
            CHECK(olmax_test::max_abs_diff(chunked.dw, full.dw) < 1e-12);
        }
    }
}

TEST_CASE("chunked_cross_entropy in float agrees with the unchunked loss", "[ops][nn][loss]") {
    olmax::Generator rng(25);
    const std::size_t n = 37, f = 16, v = 300;
    auto hidden = olmax::randn<float>({n, f}, rng);
    auto w_out = olmax::randn<float>({f, v}, rng, 0.f, 0.5f);
    auto targets = Ids::uninitialized({n});
    for (std::size_t i = 0; i < n; ++i) targets(i) = std::int32_t(rng.below(v));
    auto h1 = olmax::parameter(hidden.clone()), w1 = olmax::parameter(w_out.clone());
    auto h2 = olmax::parameter(hidden.clone()), w2 = olmax::parameter(w_out.clone());
    auto chunked = olmax::chunked_cross_entropy(h1, w1, targets, {0.0, 8});
    chunked.backward();  // frees the tape, so the second graph is built afterwards
    auto full = olmax::cross_entropy(olmax::matmul(h2, w2), targets);
    full.backward();
    CHECK(chunked.item() == Approx(full.item()).epsilon(1e-5));
    CHECK(olmax_test::max_abs_diff(h1.grad(), h2.grad()) < 1e-5);
    CHECK(olmax_test::max_abs_diff(w1.grad(), w2.grad()) < 1e-5);
}

TEST_CASE("chunked_cross_entropy gradient check: remainder chunk and chunk_tokens > N", "[ops][nn][loss][gradcheck]") {
    olmax::Generator rng(21);
    auto targets = ids_from({7}, {0, 4, 2, 2, 1, 3, 4});
    const Inputs in{olmax::randn<double>({7, 3}, rng), olmax::randn<double>({3, 5}, rng)};
    for (std::size_t chunk : {std::size_t(3), std::size_t(64)}) {
        INFO("chunk_tokens " << chunk);
        CHECK(check_gradients([&](const Inputs& v) { return olmax::chunked_cross_entropy(v[0], v[1], targets, {0.0, chunk}); }, in));
    }
    // only one input requiring grad
    auto w = olmax::parameter(in[1].clone());
    olmax::chunked_cross_entropy(in[0], w, targets, {0.0, 2}).backward();  // seed 1: saved gradient added as is
    auto w_ref = olmax::parameter(in[1].clone());
    olmax::cross_entropy(olmax::matmul(in[0], w_ref), targets).backward();
    REQUIRE(w.grad().defined());
    CHECK(olmax_test::max_abs_diff(w.grad(), w_ref.grad()) < 1e-12);
}

TEST_CASE("chunked_cross_entropy never allocates the [N, V] logits", "[ops][nn][loss]") {
    olmax::Generator rng(22);
    const std::size_t n = 4096, f = 8, v = 512, chunk = 256;
    auto hidden = olmax::parameter(olmax::randn<float>({n, f}, rng));
    auto w_out = olmax::parameter(olmax::randn<float>({f, v}, rng, 0.f, 0.3f));
    auto targets = Ids::uninitialized({n});
    for (std::size_t i = 0; i < n; ++i) targets(i) = std::int32_t(rng.below(v));

    olmax::memory::reset_peak();
    const std::size_t before = olmax::memory::stats().current_bytes;
    auto loss = olmax::chunked_cross_entropy(hidden, w_out, targets, {0.0, chunk});
    loss.backward();
    const std::size_t peak_increase = olmax::memory::stats().peak_bytes - before;
    const std::size_t full_logits = n * v * sizeof(float);
    INFO("peak increase " << peak_increase << " bytes; [N, V] logits would be " << full_logits);
    // dhidden (twice: saved + scaled), dw_out (twice) and one [chunk, V] buffer fit in a quarter.
    CHECK(peak_increase < full_logits / 4);
    CHECK(std::isfinite(loss.item()));
    CHECK(hidden.grad().defined());
}

TEST_CASE("chunked_cross_entropy errors and evaluation mode", "[ops][nn][loss]") {
    olmax::Generator rng(23);
    auto h = olmax::randn<double>({4, 3}, rng);
    auto w = olmax::randn<double>({3, 5}, rng);
    auto t = ids_from({4}, {0, 1, 2, 4});
    CHECK_THROWS_AS(olmax::chunked_cross_entropy(h, w, t, {0.0, 0}), olmax::value_error);
    CHECK_THROWS_AS(olmax::chunked_cross_entropy(h, olmax::randn<double>({4, 5}, rng), t), olmax::shape_error);
    CHECK_THROWS_WITH(olmax::chunked_cross_entropy(h, olmax::randn<double>({4, 5}, rng), t),
                      Catch::Contains("chunked_cross_entropy") && Catch::Contains("[4, 3]") && Catch::Contains("[4, 5]"));
    CHECK_THROWS_AS(olmax::chunked_cross_entropy(h, w, ids_from({3}, {0, 1, 2})), olmax::shape_error);
    CHECK_THROWS_AS(olmax::chunked_cross_entropy(h, w, ids_from({4}, {0, 1, 2, 5})), olmax::value_error);
    CHECK(std::isnan(olmax::chunked_cross_entropy(Tensor<double>({0, 3}), w, Ids({0})).item()));

    auto wp = olmax::parameter(w.clone());
    {
        olmax::autodiff::no_grad eval;
        auto loss = olmax::chunked_cross_entropy(h, wp, t, {0.0, 3});
        CHECK_FALSE(loss.requires_grad());
        CHECK(loss.item() == Approx(olmax::cross_entropy(olmax::matmul(h, w), t).item()).epsilon(1e-12));
    }
    CHECK(olmax::autodiff::tape_size() == 0);
}

TEST_CASE("nn ops run on a backend with only the required primitives", "[ops][nn]") {
    using Stub = olmax_test::stub_backend;
    olmax::Generator rng(24);
    auto x = olmax::randn<double>({2, 5, 4}, rng);
    auto w = olmax::randn<double>({3, 2, 4}, rng);
    CHECK(olmax_test::max_abs_diff(olmax_test::with_kernels<Stub>([&] { return olmax::causal_conv1d(x, w, 2); }), naive_conv(x, w, 2)) < 1e-12);
    auto h = olmax::randn<double>({6, 4}, rng);
    auto t = ids_from({6}, {0, 1, 2, 3, 3, 0});
    auto w_out = olmax::randn<double>({4, 4}, rng);
    CHECK(olmax_test::with_kernels<Stub>([&] { return olmax::chunked_cross_entropy(h, w_out, t, {0.0, 4}); }).item() ==
          Approx(olmax_test::with_kernels<Stub>([&] { return olmax::cross_entropy(olmax::matmul(h, w_out), t); }).item()).epsilon(1e-12));
    CHECK(olmax_test::max_abs_diff(olmax_test::with_kernels<Stub>([&] { return olmax::softmax(h); }), olmax::softmax(h)) == 0);
    CHECK(olmax_test::max_abs_diff(olmax_test::with_kernels<Stub>([&] { return olmax::log_softmax(h, 0); }), olmax::log_softmax(h, 0)) == 0);
    CHECK(olmax_test::max_abs_diff(olmax_test::with_kernels<Stub>([&] { return olmax::scale_norm(h, Tensor<double>()); }), olmax::scale_norm(h, Tensor<double>())) == 0);
    CHECK(olmax_test::max_abs_diff(olmax_test::with_kernels<Stub>([&] { return olmax::rms_norm(h, Tensor<double>()); }), olmax::rms_norm(h, Tensor<double>())) == 0);
    CHECK(olmax_test::max_abs_diff(olmax_test::with_kernels<Stub>([&] { return olmax::embedding(h, t); }), olmax::embedding(h, t)) == 0);
}

TEST_CASE("nn ops give the serial results when every loop is threaded", "[ops][nn]") {
    using olmax::backend::cpu_openmp;
    using olmax::backend::cpu_serial;
    olmax_test::ForceThreading force;  // even the smallest loop goes to the threads
    olmax::Generator rng(26);
    auto x = olmax::randn<double>({3, 6, 4}, rng);
    auto w = olmax::randn<double>({2, 2, 6}, rng);
    auto b = olmax::randn<double>({6}, rng);
    auto h = olmax::randn<double>({9, 4}, rng);
    auto w_out = olmax::randn<double>({4, 5}, rng);
    auto t = ids_from({9}, {0, 1, 2, 3, 4, 4, 3, 2, 1});
    CHECK(olmax_test::max_abs_diff(olmax_test::with_kernels<cpu_openmp>([&] { return olmax::causal_conv1d(x, w, b, 2); }), olmax_test::with_kernels<cpu_serial>([&] { return olmax::causal_conv1d(x, w, b, 2); })) < 1e-12);
    CHECK(olmax_test::max_abs_diff(olmax_test::with_kernels<cpu_openmp>([&] { return olmax::softmax(x, 1); }), olmax_test::with_kernels<cpu_serial>([&] { return olmax::softmax(x, 1); })) == 0);
    CHECK(olmax_test::max_abs_diff(olmax_test::with_kernels<cpu_openmp>([&] { return olmax::scale_norm(x, Tensor<double>()); }), olmax_test::with_kernels<cpu_serial>([&] { return olmax::scale_norm(x, Tensor<double>()); })) == 0);
    CHECK(olmax_test::max_abs_diff(olmax_test::with_kernels<cpu_openmp>([&] { return olmax::embedding(h, t); }), olmax_test::with_kernels<cpu_serial>([&] { return olmax::embedding(h, t); })) == 0);
    CHECK(olmax_test::with_kernels<cpu_openmp>([&] { return olmax::chunked_cross_entropy(h, w_out, t, {0.0, 4}); }).item() ==
          Approx(olmax_test::with_kernels<cpu_serial>([&] { return olmax::chunked_cross_entropy(h, w_out, t, {0.0, 4}); }).item()).epsilon(1e-14));
    CHECK(check_gradients([](const Inputs& v) { return olmax_test::with_kernels<cpu_openmp>([&] { return olmax::causal_conv1d(v[0], v[1], v[2], 2); }); }, {x, w, b}));
    CHECK(check_gradients([](const Inputs& v) { return olmax_test::with_kernels<cpu_openmp>([&] { return olmax::rms_norm(v[0], v[1]); }); }, {h, olmax::randn<double>({4}, rng)}));
    CHECK(check_gradients([&](const Inputs& v) { return olmax_test::with_kernels<cpu_openmp>([&] { return olmax::embedding(v[0], t); }); }, {h}));
    CHECK(check_gradients([&](const Inputs& v) { return olmax_test::with_kernels<cpu_openmp>([&] { return olmax::chunked_cross_entropy(v[0], v[1], t, {0.0, 4}); }); }, {h, w_out}));
}
