#include "test_helpers.hpp"

#include <olmax/ops/shape.hpp>

using olmax::Shape;
using olmax::Tensor;
using olmax::testing::check_gradients;
using Inputs = std::vector<Tensor<double>>;

namespace {

/// 0, 1, 2, ... in the given shape.
Tensor<double> iota(const Shape& shape) {
    auto t = Tensor<double>::uninitialized(shape);
    for (std::size_t i = 0; i < t.size(); ++i) t.data()[i] = double(i);
    return t;
}

}  // namespace

TEST_CASE("reshape shares the buffer, keeps values and differentiates", "[ops][shape]") {
    auto x = iota({2, 3, 4});
    auto y = olmax::reshape(x, {6, 4});
    CHECK(y.shape() == Shape{6, 4});
    CHECK(y.data() == x.data());  // no copy
    CHECK(y(5, 3) == 23.0);
    auto s = olmax::reshape(olmax::reshape(x, {24}), {4, 3, 2});
    CHECK(s(3, 2, 1) == 23.0);
    CHECK_THROWS_AS(olmax::reshape(x, {5, 5}), olmax::shape_error);
    CHECK_THROWS_WITH(olmax::reshape(x, {5, 5}), Catch::Contains("reshape") && Catch::Contains("[2, 3, 4]") && Catch::Contains("[5, 5]"));
    CHECK(olmax::reshape(Tensor<double>({0, 3}), {3, 0, 7}).size() == 0);
    CHECK(olmax::reshape(Tensor<double>::scalar(2.0), {1, 1}).item() == 2.0);

    olmax::Generator rng(1);
    auto res = check_gradients([](const Inputs& v) { return olmax::square(olmax::reshape(v[0], {3, 8})); }, {olmax::randn<double>({2, 3, 4}, rng)});
    CHECK(res);
}

TEST_CASE("transpose: matrix, batched and general permutations", "[ops][shape]") {
    auto m = iota({2, 3});
    auto mt = olmax::transpose(m);
    REQUIRE(mt.shape() == Shape{3, 2});
    for (std::size_t i = 0; i < 2; ++i)
        for (std::size_t j = 0; j < 3; ++j) CHECK(mt(j, i) == m(i, j));

    auto x = iota({2, 3, 4, 5});
    const std::vector<std::size_t> perm{2, 0, 3, 1};
    auto y = olmax::transpose(x, perm);
    REQUIRE(y.shape() == Shape{4, 2, 5, 3});
    for (std::size_t a = 0; a < 2; ++a)
        for (std::size_t b = 0; b < 3; ++b)
            for (std::size_t c = 0; c < 4; ++c)
                for (std::size_t d = 0; d < 5; ++d) CHECK(y(c, a, d, b) == x(a, b, c, d));

    // Every permutation of a rank-4 tensor with extents around the copy's 16-wide tiles.
    auto big = iota({3, 20, 2, 35});
    const Shape big_strides = olmax::row_major_strides(big.shape());
    std::vector<std::size_t> p{0, 1, 2, 3};
    do {
        auto t = olmax::transpose(big, p);
        const Shape out_strides = olmax::row_major_strides(t.shape());
        bool same = true;
        for (std::size_t flat = 0; flat < t.size(); ++flat) {
            std::size_t rem = flat, src = 0;
            for (std::size_t axis = 0; axis < 4; ++axis) {
                src += (rem / out_strides[axis]) * big_strides[p[axis]];
                rem %= out_strides[axis];
            }
            same = same && t.data()[flat] == big.data()[src];
        }
        CHECK(same);
    } while (std::next_permutation(p.begin(), p.end()));

    auto bt = olmax::transpose(x);  // swaps the last two axes
    REQUIRE(bt.shape() == Shape{2, 3, 5, 4});
    CHECK(bt(1, 2, 4, 3) == x(1, 2, 3, 4));

    CHECK_THROWS_AS(olmax::transpose(x, {0, 1, 2}), olmax::shape_error);
    CHECK_THROWS_AS(olmax::transpose(x, {0, 1, 1, 2}), olmax::shape_error);
    CHECK_THROWS_AS(olmax::transpose(x, {0, 1, 2, 4}), olmax::shape_error);
    CHECK_THROWS_WITH(olmax::transpose(x, {0, 0, 1, 2}), Catch::Contains("transpose") && Catch::Contains("[2, 3, 4, 5]"));
    CHECK_THROWS_AS(olmax::transpose(iota({4})), olmax::shape_error);
    CHECK(olmax::transpose(Tensor<double>({0, 3})).shape() == Shape{3, 0});
    CHECK(olmax::transpose(Tensor<double>::scalar(3.0), {}).item() == 3.0);

    olmax::Generator rng(2);
    CHECK(check_gradients([&](const Inputs& v) { return olmax::transpose(v[0], perm); }, {olmax::randn<double>({2, 3, 2, 3}, rng)}));
    CHECK(check_gradients([](const Inputs& v) { return olmax::matmul(olmax::transpose(v[0]), v[1]); },
                          {olmax::randn<double>({4, 3}, rng), olmax::randn<double>({4, 2}, rng)}));
}

TEST_CASE("slice copies a range along an axis", "[ops][shape]") {
    auto x = iota({3, 4, 2});
    auto y = olmax::slice(x, 1, 1, 3);
    REQUIRE(y.shape() == Shape{3, 2, 2});
    for (std::size_t a = 0; a < 3; ++a)
        for (std::size_t b = 0; b < 2; ++b)
            for (std::size_t c = 0; c < 2; ++c) CHECK(y(a, b, c) == x(a, b + 1, c));
    auto last = olmax::slice(x, -1, 1, 2);
    REQUIRE(last.shape() == Shape{3, 4, 1});
    CHECK(last(2, 3, 0) == x(2, 3, 1));
    CHECK(olmax::slice(x, 0, 2, 2).size() == 0);  // empty range is fine
    CHECK(olmax::slice(x, 0, 0, 3).shape() == x.shape());

    CHECK_THROWS_AS(olmax::slice(x, 1, 3, 5), olmax::shape_error);
    CHECK_THROWS_AS(olmax::slice(x, 1, 3, 2), olmax::shape_error);
    CHECK_THROWS_AS(olmax::slice(x, 3, 0, 1), olmax::shape_error);
    CHECK_THROWS_WITH(olmax::slice(x, 1, 3, 5), Catch::Contains("slice") && Catch::Contains("[3, 4, 2]"));

    olmax::Generator rng(3);
    CHECK(check_gradients([](const Inputs& v) { return olmax::slice(v[0], 1, 1, 3); }, {olmax::randn<double>({3, 4, 2}, rng)}));
    CHECK(check_gradients([](const Inputs& v) { return olmax::slice(v[0], 0, 1, 2); }, {olmax::randn<double>({3, 4}, rng)}));
}

TEST_CASE("slice: the gradients of several slices of one tensor land in place, whatever arrives first", "[ops][shape][gradcheck]") {
    // A projection cut into pieces along its last axis, as the mixers cut theirs: pieces that
    // overlap, one used twice, a part no slice reads (gradient 0), and an empty slice.
    olmax::Generator rng(4);
    const auto pieces = [](const Tensor<double>& x) {
        const auto along_last = olmax::concat({olmax::slice(x, 2, 0, 3), olmax::slice(x, 2, 2, 5), olmax::slice(x, 2, 2, 5)}, 2);
        return olmax::add(olmax::sum(olmax::square(along_last)), olmax::sum(olmax::square(olmax::slice(x, 1, 1, 3))));
    };
    CHECK(check_gradients([&](const Inputs& v) { return olmax::concat({olmax::slice(v[0], 2, 0, 3), olmax::slice(v[0], 2, 2, 5)}, 2); },
                          {olmax::randn<double>({2, 3, 7}, rng)}));
    auto x = olmax::parameter(olmax::randn<double>({2, 3, 7}, rng));
    const auto weights = olmax::randn<double>({2, 3, 7}, rng);
    // The expected gradient by hand: each element once per slice that reads it, times the weight the
    // loss gives it. Then the same with the whole tensor's gradient arriving first and last.
    for (const bool whole_first : {false, true}) {
        x.zero_grad();
        const auto a = olmax::slice(x, 2, 0, 3), b = olmax::slice(x, 2, 2, 5), e = olmax::slice(x, 2, 4, 4);
        auto loss = olmax::sum(olmax::mul(a, olmax::slice(weights, 2, 0, 3)));
        loss = olmax::add(loss, olmax::scale(olmax::sum(olmax::mul(b, olmax::slice(weights, 2, 2, 5))), 2.0));
        loss = olmax::add(loss, olmax::sum(e));
        loss = whole_first ? olmax::add(olmax::sum(x), loss) : olmax::add(loss, olmax::sum(x));
        loss.backward();
        for (std::size_t i = 0; i < 2; ++i)
            for (std::size_t j = 0; j < 3; ++j)
                for (std::size_t k = 0; k < 7; ++k) {
                    double expected = 1.0;  // sum(x)
                    if (k < 3) expected += weights(i, j, k);
                    if (k >= 2 && k < 5) expected += 2.0 * weights(i, j, k);
                    INFO("whole first " << whole_first << " at " << i << ", " << j << ", " << k);
                    CHECK(std::abs(x.grad()(i, j, k) - expected) < 1e-12);
                }
    }
    // Only slices, one of them empty: the elements no slice reads get a gradient of zero.
    x.zero_grad();
    olmax::add(olmax::sum(olmax::slice(x, 1, 3, 3)), olmax::sum(olmax::slice(x, 2, 6, 7))).backward();
    for (std::size_t i = 0; i < x.size(); ++i) CHECK(x.grad().data()[i] == (i % 7 == 6 ? 1.0 : 0.0));
    // Threaded runs give the serial gradients.
    olmax_test::ForceThreading force;
    const auto big = olmax::randn<double>({3, 37, 21}, rng);
    const auto gradient_with = [&]<class Kernels>() {
        return olmax_test::with_kernels<Kernels>([&] {
            const auto v = olmax::parameter(big.detach());
            pieces(v).backward();
            return v.grad();
        });
    };
    CHECK(olmax_test::max_abs_diff(gradient_with.template operator()<olmax::backend::cpu_openmp>(),
                                   gradient_with.template operator()<olmax::backend::cpu_serial>()) == 0);
}

TEST_CASE("concat joins along an axis and splits the gradient", "[ops][shape]") {
    auto a = iota({2, 1, 3});
    auto b = olmax::scale(iota({2, 2, 3}), -1.0);
    auto y = olmax::concat({a, b}, 1);
    REQUIRE(y.shape() == Shape{2, 3, 3});
    for (std::size_t i = 0; i < 2; ++i)
        for (std::size_t k = 0; k < 3; ++k) {
            CHECK(y(i, 0, k) == a(i, 0, k));
            CHECK(y(i, 1, k) == b(i, 0, k));
            CHECK(y(i, 2, k) == b(i, 1, k));
        }
    auto z = olmax::concat(std::vector<Tensor<double>>{a, Tensor<double>({2, 0, 3}), a}, -2);
    CHECK(z.shape() == Shape{2, 2, 3});
    CHECK(olmax::concat(std::vector<Tensor<double>>{a}, 0).shape() == a.shape());

    CHECK_THROWS_AS(olmax::concat(std::vector<Tensor<double>>{a, iota({3, 1, 3})}, 1), olmax::shape_error);
    CHECK_THROWS_AS(olmax::concat(std::vector<Tensor<double>>{a, iota({2, 3})}, 1), olmax::shape_error);
    CHECK_THROWS_WITH(olmax::concat(std::vector<Tensor<double>>{a, iota({3, 1, 3})}, 1),
                      Catch::Contains("concat") && Catch::Contains("[3, 1, 3]") && Catch::Contains("[2, 1, 3]"));
    CHECK_THROWS_AS(olmax::concat(std::vector<Tensor<double>>{}, 0), olmax::value_error);

    olmax::Generator rng(4);
    CHECK(check_gradients([](const Inputs& v) { return olmax::concat(v, 0); },
                          {olmax::randn<double>({1, 3}, rng), olmax::randn<double>({2, 3}, rng), olmax::randn<double>({3, 3}, rng)}));
    CHECK(check_gradients([](const Inputs& v) { return olmax::concat(std::vector<Tensor<double>>{v[0], v[1], v[0]}, -1); },
                          {olmax::randn<double>({2, 2}, rng), olmax::randn<double>({2, 3}, rng)}));
}

TEST_CASE("stack_leading stacks along a new leading axis and splits the gradient", "[ops][shape][gradcheck]") {
    const auto a = iota({2, 3}), b = olmax::scale(iota({2, 3}), -1.0);
    const auto y = olmax::stack_leading(std::vector<Tensor<double>>{a, b, a});
    REQUIRE(y.shape() == Shape{3, 2, 3});
    for (std::size_t i = 0; i < 2; ++i)
        for (std::size_t k = 0; k < 3; ++k) {
            CHECK(y(std::size_t{0}, i, k) == a(i, k));
            CHECK(y(std::size_t{1}, i, k) == b(i, k));
            CHECK(y(std::size_t{2}, i, k) == a(i, k));
        }
    CHECK_THROWS_AS(olmax::stack_leading(std::vector<Tensor<double>>{}), olmax::shape_error);
    CHECK_THROWS_WITH(olmax::stack_leading(std::vector<Tensor<double>>{a, iota({3, 2})}),
                      Catch::Contains("stack_leading") && Catch::Contains("[2, 3]") && Catch::Contains("[3, 2]"));

    olmax::Generator rng(5);
    // Two parts, and one part used twice (its gradient is the sum of both slices').
    CHECK(check_gradients([](const Inputs& v) { return olmax::stack_leading(v); },
                          {olmax::randn<double>({2, 3}, rng), olmax::randn<double>({2, 3}, rng)}));
    CHECK(check_gradients([](const Inputs& v) { return olmax::stack_leading(std::vector<Tensor<double>>{v[0], v[1], v[0]}); },
                          {olmax::randn<double>({4}, rng), olmax::randn<double>({4}, rng)}));
}

TEST_CASE("pad adds constants before and after along an axis", "[ops][shape]") {
    auto x = iota({2, 3});
    auto y = olmax::pad(x, 1, 2, 1, -7.0);
    REQUIRE(y.shape() == Shape{2, 6});
    const double expect[2][6] = {{-7, -7, 0, 1, 2, -7}, {-7, -7, 3, 4, 5, -7}};
    for (std::size_t i = 0; i < 2; ++i)
        for (std::size_t j = 0; j < 6; ++j) CHECK(y(i, j) == expect[i][j]);
    auto rows = olmax::pad(x, 0, 0, 2);
    REQUIRE(rows.shape() == Shape{4, 3});
    CHECK(rows(3, 2) == 0.0);
    CHECK(rows(1, 2) == 5.0);
    CHECK(olmax::pad(Tensor<double>({2, 0}), 1, 1, 1, 1.0).shape() == Shape{2, 2});
    CHECK_THROWS_AS(olmax::pad(x, 2, 1, 1), olmax::shape_error);

    olmax::Generator rng(5);
    CHECK(check_gradients([](const Inputs& v) { return olmax::pad(v[0], 0, 1, 2, 3.0); }, {olmax::randn<double>({2, 3}, rng)}));
    CHECK(check_gradients([](const Inputs& v) { return olmax::pad(v[0], -1, 2, 0); }, {olmax::randn<double>({2, 3, 2}, rng)}));
}

TEST_CASE("shape ops pass NaN through, work in float and on a minimal backend", "[ops][shape]") {
    auto x = Tensor<float>::from({2, 2}, {1.f, std::numeric_limits<float>::quiet_NaN(), 3.f, 4.f});
    auto y = olmax::transpose(olmax::pad(olmax::slice(x, 0, 0, 2), 1, 1, 0));
    REQUIRE(y.shape() == Shape{3, 2});
    CHECK(std::isnan(y(2, 0)));
    CHECK(y(2, 1) == 4.f);

    CHECK(olmax_test::with_kernels<olmax_test::stub_backend>([&] { return olmax::transpose(olmax::concat({x, x}, 0)); }).shape() == Shape{2, 4});
    CHECK(olmax_test::with_kernels<olmax_test::stub_backend>([&] { return olmax::pad(olmax::slice(x, 1, 1, 2), 0, 1, 1); }).shape() == Shape{4, 1});
    CHECK(olmax_test::with_kernels<olmax_test::stub_backend>([&] { return olmax::reshape(x, {4}); }).shape() == Shape{4});
    CHECK(olmax::pad(x, 0, 1, 0, 2.5)(0, 1) == 2.5f);  // a double value converts to T

    auto w = olmax::parameter(olmax::ones<float>({2, 3}));
    auto loss = olmax::sum(olmax::concat(std::vector<Tensor<float>>{olmax::reshape(w, {3, 2}), olmax::transpose(w)}, 0));
    loss.backward();
    REQUIRE(w.grad().defined());
    for (float g : w.grad().span()) CHECK(g == 2.f);
}

TEST_CASE("shape ops give the serial results when every loop is threaded", "[ops][shape]") {
    using olmax::backend::cpu_openmp;
    using olmax::backend::cpu_serial;
    olmax_test::ForceThreading force;  // even the smallest loop goes to the threads
    olmax::Generator rng(6);
    auto x = olmax::randn<double>({3, 37, 2, 21}, rng);
    for (const std::vector<std::size_t>& perm : {std::vector<std::size_t>{3, 1, 2, 0}, {0, 3, 2, 1}, {1, 0, 2, 3}})
        CHECK(olmax_test::max_abs_diff(olmax_test::with_kernels<cpu_openmp>([&] { return olmax::transpose(x, perm); }), olmax_test::with_kernels<cpu_serial>([&] { return olmax::transpose(x, perm); })) == 0);
    CHECK(olmax_test::max_abs_diff(olmax_test::with_kernels<cpu_openmp>([&] { return olmax::slice(x, 1, 3, 30); }), olmax_test::with_kernels<cpu_serial>([&] { return olmax::slice(x, 1, 3, 30); })) == 0);
    CHECK(olmax_test::max_abs_diff(olmax_test::with_kernels<cpu_openmp>([&] { return olmax::pad(x, 2, 1, 2); }), olmax_test::with_kernels<cpu_serial>([&] { return olmax::pad(x, 2, 1, 2); })) == 0);
    CHECK(olmax_test::max_abs_diff(olmax_test::with_kernels<cpu_openmp>([&] { return olmax::concat({x, x}, 3); }), olmax_test::with_kernels<cpu_serial>([&] { return olmax::concat({x, x}, 3); })) == 0);
    CHECK(check_gradients([](const Inputs& v) { return olmax_test::with_kernels<cpu_openmp>([&] { return olmax::transpose(v[0], {2, 0, 1}); }); }, {olmax::randn<double>({2, 17, 18}, rng)}));
}
