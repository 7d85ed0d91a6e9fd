// Forward values and double-precision gradient checks for olmax/ops/reduction.hpp and linalg.hpp.
#include "test_helpers.hpp"

#include <cmath>
#include <limits>

using olmax::Shape;
using olmax::Tensor;
using Inputs = std::vector<Tensor<double>>;

namespace {

/// Reference sum of `x` over `axes` with NumPy semantics, by brute force over every element.
Tensor<double> reference_sum(const Tensor<double>& x, const std::vector<std::size_t>& axes, bool keepdims) {
    Shape out_keep = x.shape();
    for (auto a : axes) out_keep[a] = 1;
    Tensor<double> out(out_keep);
    const Shape strides = olmax::row_major_strides(x.shape()), out_strides = olmax::row_major_strides(out_keep);
    for (std::size_t flat = 0; flat < x.size(); ++flat) {
        std::size_t rem = flat, target = 0;
        for (std::size_t d = 0; d < x.rank(); ++d) {
            const std::size_t idx = rem / strides[d];
            rem %= strides[d];
            if (out_keep[d] != 1) target += idx * out_strides[d];
        }
        out.data()[target] += x.data()[flat];
    }
    if (keepdims) return out;
    Shape squeezed;
    for (std::size_t d = 0; d < x.rank(); ++d)
        if (std::find(axes.begin(), axes.end(), d) == axes.end()) squeezed.push_back(x.shape()[d]);
    return Tensor<double>::from(squeezed, out.span());
}

}  // namespace

TEST_CASE("sum and mean: single, multiple, negative axes, keepdims; values and gradients", "[ops][reduction][gradcheck]") {
    olmax::Generator rng(21);
    const auto x = olmax::randn<double>({3, 4, 5}, rng);
    struct Axes {
        std::vector<long> given;
        std::vector<std::size_t> resolved;
    };
    const std::vector<Axes> cases = {
        {{}, {0, 1, 2}}, {{0}, {0}}, {{1}, {1}},    {{2}, {2}},       {{-1}, {2}},
        {{-3}, {0}},     {{0, 2}, {0, 2}}, {{-1, 0}, {0, 2}}, {{1, 2}, {1, 2}}, {{0, 1, 2}, {0, 1, 2}},
    };
    for (const auto& c : cases)
        for (bool keepdims : {false, true}) {
            INFO("axes " << c.given.size() << " keepdims " << keepdims);
            const auto expect = reference_sum(x, c.resolved, keepdims);
            std::size_t count = 1;
            for (auto a : c.resolved) count *= x.shape()[a];
            const auto s = olmax::sum(x, c.given, keepdims);
            const auto m = olmax::mean(x, c.given, keepdims);
            REQUIRE(s.shape() == expect.shape());
            REQUIRE(m.shape() == expect.shape());
            for (std::size_t i = 0; i < s.size(); ++i) {
                CHECK(s.data()[i] == Approx(expect.data()[i]).margin(1e-12));
                CHECK(m.data()[i] == Approx(expect.data()[i] / double(count)).margin(1e-12));
            }
            olmax_test::check_gradients([&](const Inputs& v) { return olmax::sum(v[0], c.given, keepdims); }, {x});
            olmax_test::check_gradients([&](const Inputs& v) { return olmax::mean(v[0], c.given, keepdims); }, {x});
        }
}

TEST_CASE("sum and mean: rank-0 and size-1 inputs", "[ops][reduction][gradcheck]") {
    const Inputs scalar{Tensor<double>::scalar(2.5)};
    CHECK(olmax::sum(scalar[0]).item() == 2.5);
    CHECK(olmax::mean(scalar[0]).item() == 2.5);
    olmax_test::check_gradients([](const Inputs& v) { return olmax::sum(v[0]); }, scalar);
    olmax_test::check_gradients([](const Inputs& v) { return olmax::mean(v[0]); }, scalar);
    const Inputs ones{Tensor<double>::from({1, 3, 1}, {1, 2, 3})};
    olmax_test::check_gradients([](const Inputs& v) { return olmax::sum(v[0], {0, 2}); }, ones);
    olmax_test::check_gradients([](const Inputs& v) { return olmax::mean(v[0], {-1}, true); }, ones);
}

TEST_CASE("sum_to_size: sums a broadcast back to its shape; values, gradients and refusals", "[ops][reduction][gradcheck]") {
    olmax::Generator rng(3);
    const auto x = olmax::randn<double>({2, 3, 4}, rng);
    CHECK(olmax::sum_to_size(x, x.shape()).data() == x.data());  // nothing to sum: the tensor itself
    const auto rows = olmax::sum_to_size(x, {3, 1});  // the leading axis dropped, the last summed
    REQUIRE(rows.shape() == Shape{3, 1});
    for (std::size_t j = 0; j < 3; ++j) {
        double want = 0;
        for (std::size_t i = 0; i < 2; ++i)
            for (std::size_t k = 0; k < 4; ++k) want += x(i, j, k);
        CHECK(rows(j, std::size_t{0}) == Approx(want).epsilon(1e-13));
    }
    for (const Shape& to : {Shape{4}, Shape{3, 1}, Shape{1, 3, 4}, Shape{2, 1, 4}, Shape{1}, Shape{}}) {
        INFO("to " << olmax::to_string(to));
        CHECK(olmax::sum_to_size(x, to).shape() == to);
        olmax_test::check_gradients([&](const Inputs& v) { return olmax::sum_to_size(v[0], to); }, {x});
    }
    CHECK_THROWS_AS(olmax::sum_to_size(x, {3}), olmax::shape_error);           // 3 is not the last axis' 4
    CHECK_THROWS_AS(olmax::sum_to_size(x, {5, 2, 3, 4}), olmax::shape_error);  // more axes than x
    CHECK_THROWS_WITH(olmax::sum_to_size(x, {2, 2, 4}), Catch::Contains("sum_to_size") && Catch::Contains("[2, 3, 4]"));
}

TEST_CASE("sum/mean reject repeated and out-of-range axes", "[ops][reduction][errors]") {
    const auto x = Tensor<double>({2, 3});
    CHECK_THROWS_AS(olmax::sum(x, {0, 0}), olmax::shape_error);
    CHECK_THROWS_AS(olmax::sum(x, {1, -1}), olmax::shape_error);
    CHECK_THROWS_AS(olmax::sum(x, {2}), olmax::shape_error);
    CHECK_THROWS_AS(olmax::mean(x, {-3}), olmax::shape_error);
    CHECK_THROWS_AS(olmax::max(x, 2), olmax::shape_error);
}

TEST_CASE("max: values, first-maximum gradient, keepdims, negative axes", "[ops][reduction][gradcheck]") {
    olmax::Generator rng(22);
    // Distinct values (a random permutation of a grid) so no maximum is tied.
    auto x = olmax::randn<double>({3, 4, 5}, rng);
    for (long axis : {0L, 1L, 2L, -1L, -2L})
        for (bool keepdims : {false, true}) {
            INFO("axis " << axis << " keepdims " << keepdims);
            const auto y = olmax::max(x, axis, keepdims);
            const std::size_t a = olmax::normalize_axis(axis, 3, "test");
            Shape expect_shape = x.shape();
            if (keepdims) expect_shape[a] = 1;
            else expect_shape.erase(expect_shape.begin() + long(a));
            REQUIRE(y.shape() == expect_shape);
            olmax_test::check_gradients([&](const Inputs& v) { return olmax::max(v[0], axis, keepdims); }, {x});
        }
    const auto m = olmax::max(Tensor<double>::from({2, 3}, {1, 7, 3, -4, -2, -9}), 1);
    CHECK(m(0) == 7);
    CHECK(m(1) == -2);

    SECTION("ties: the gradient goes to the first maximal element") {
        auto t = olmax::parameter(Tensor<double>::from({4}, {1, 3, 3, 2}));
        olmax::max(t, 0).backward();
        CHECK(t.grad()(0) == 0);
        CHECK(t.grad()(1) == 1);
        CHECK(t.grad()(2) == 0);
    }
}

TEST_CASE("matmul: 2-D, N-D x 2-D and batched; values and gradients", "[ops][linalg][gradcheck]") {
    olmax::Generator rng(23);
    SECTION("2-D against a hand-written product") {
        const auto a = Tensor<double>::from({2, 3}, {1, 2, 3, 4, 5, 6});
        const auto b = Tensor<double>::from({3, 2}, {7, 8, 9, 10, 11, 12});
        const auto y = olmax::matmul(a, b);
        REQUIRE(y.shape() == Shape{2, 2});
        CHECK(y(0, 0) == 58);
        CHECK(y(0, 1) == 64);
        CHECK(y(1, 0) == 139);
        CHECK(y(1, 1) == 154);
    }
    const std::vector<std::pair<Shape, Shape>> shapes = {
        {{3, 4}, {4, 5}},          {{1, 4}, {4, 1}},          {{2, 3, 4}, {4, 5}},    {{2, 2, 3, 4}, {4, 2}},
        {{2, 3, 4}, {2, 4, 5}},    {{2, 2, 3, 4}, {2, 2, 4, 3}}, {{5, 1, 4}, {5, 4, 1}},
    };
    for (const auto& [sa, sb] : shapes) {
        INFO("shapes " << olmax::to_string(sa) << " x " << olmax::to_string(sb));
        const Inputs in{olmax::randn<double>(sa, rng), olmax::randn<double>(sb, rng)};
        olmax_test::check_gradients([](const Inputs& v) { return olmax::matmul(v[0], v[1]); }, in);
        olmax_test::check_gradients([](const Inputs& v) { return olmax::matmul(v[0], v[1]); }, in, {.skip_inputs = {0}});
        olmax_test::check_gradients([](const Inputs& v) { return olmax::matmul(v[0], v[1]); }, in, {.skip_inputs = {1}});
        // Each batch / folded row against a brute-force product.
        const auto y = olmax::matmul(in[0], in[1]);
        const std::size_t m = sa[sa.size() - 2], k = sa.back(), n = sb.back();
        const std::size_t batches = in[0].size() / (m * k);
        const bool shared_b = sb.size() == 2;
        for (std::size_t bi = 0; bi < batches; ++bi)
            for (std::size_t i = 0; i < m; ++i)
                for (std::size_t j = 0; j < n; ++j) {
                    double acc = 0;
                    for (std::size_t p = 0; p < k; ++p)
                        acc += in[0].data()[(bi * m + i) * k + p] * in[1].data()[(shared_b ? 0 : bi * k * n) + p * n + j];
                    CHECK(y.data()[(bi * m + i) * n + j] == Approx(acc).margin(1e-12));
                }
    }
    SECTION("the same matrix on both sides (x x^T-like reuse)") {
        const Inputs sq{olmax::randn<double>({4, 4}, rng)};
        olmax_test::check_gradients([](const Inputs& v) { return olmax::matmul(v[0], v[0]); }, sq);
    }
}

TEST_CASE("matmul: shapes that do not multiply throw shape_error naming both", "[ops][linalg][errors]") {
    const std::vector<std::pair<Shape, Shape>> bad = {
        {{3, 4}, {5, 6}}, {{4}, {4, 2}}, {{3, 4}, {4}}, {{2, 3, 4}, {3, 4, 5}}, {{2, 3, 4}, {2, 2, 4, 5}},
    };
    for (const auto& [sa, sb] : bad) {
        INFO(olmax::to_string(sa) << " x " << olmax::to_string(sb));
        try {
            olmax::matmul(Tensor<double>(sa), Tensor<double>(sb));
            FAIL("no exception");
        } catch (const olmax::shape_error& e) {
            const std::string msg = e.what();
            CHECK(msg.find("matmul") != std::string::npos);
            CHECK(msg.find(olmax::to_string(sa)) != std::string::npos);
            CHECK(msg.find(olmax::to_string(sb)) != std::string::npos);
        }
    }
}

TEST_CASE("contract_axis: equals moving the axis last, matmul and back; gradients", "[ops][linalg][gradcheck]") {
    olmax::Generator rng(31);
    struct Case {
        olmax::Shape shape;
        std::size_t axis, n;
    };
    for (const auto& c : {Case{{2, 3, 4, 5}, 2, 3}, Case{{4, 3}, 0, 2}, Case{{3, 4}, 1, 5}, Case{{2, 5, 3, 2, 2}, 2, 3}}) {
        INFO("shape " << olmax::to_string(c.shape) << " axis " << c.axis);
        const auto x = olmax::randn<double>(c.shape, rng);
        const auto w = olmax::randn<double>({c.shape[c.axis], c.n}, rng);
        std::vector<std::size_t> to_last, back;
        for (std::size_t i = 0; i < c.shape.size(); ++i)
            if (i != c.axis) to_last.push_back(i);
        to_last.push_back(c.axis);
        back.assign(c.shape.size(), 0);
        for (std::size_t i = 0; i < to_last.size(); ++i) back[to_last[i]] = i;
        const auto reference = olmax::transpose(olmax::matmul(olmax::transpose(x, to_last), w), back);
        CHECK(olmax_test::max_abs_diff(olmax::contract_axis(x, w, c.axis), reference) < 1e-12);
        olmax_test::check_gradients([&](const Inputs& v) { return olmax::contract_axis(v[0], v[1], c.axis); }, {x, w});
    }
    {  // threads: many blocks spread over threads give the same values and weight gradient
        olmax_test::ForceThreading threads;
        const auto x = olmax::randn<double>({9, 4, 6}, rng);
        const auto w = olmax::randn<double>({4, 4}, rng);
        olmax_test::check_gradients([&](const Inputs& v) { return olmax::contract_axis(v[0], v[1], 1); }, {x, w});
    }
    CHECK_THROWS_AS(olmax::contract_axis(olmax::randn<double>({2, 3}, rng), olmax::randn<double>({2, 2}, rng), 1), olmax::shape_error);
    CHECK_THROWS_AS(olmax::contract_axis(olmax::randn<double>({2, 3}, rng), olmax::randn<double>({3, 2}, rng), 2), olmax::shape_error);
}
