// Bad input is reported, never a crash: shape errors name the op and both shapes; empty tensors,
// zero-length axes and NaN inputs flow through every op; non-backends fail the concept.
#include "test_helpers.hpp"

#include <cmath>
#include <limits>
#include <string>

using olmax::Shape;
using olmax::Tensor;

namespace {

/// Runs `f`, REQUIREs an `olmax::shape_error`, and checks its message names `op` and every shape.
template <class F>
void expect_shape_error(F&& f, const std::string& op, const std::vector<Shape>& shapes) {
    try {
        f();
        FAIL("no shape_error thrown");
    } catch (const olmax::shape_error& e) {
        const std::string msg = e.what();
        INFO(msg);
        CHECK(msg.find(op) != std::string::npos);
        for (const Shape& s : shapes) CHECK(msg.find(olmax::to_string(s)) != std::string::npos);
    }
}

struct NotABackend {
    static constexpr std::string_view name = "nope";
    static void* allocate(std::size_t) { return nullptr; }  // and nothing else
};

}  // namespace

// A type that does not model the concept fails it at compile time (and assert_backend turns
// that into a readable static_assert message).
static_assert(!olmax::backend::Backend<int>);
static_assert(!olmax::backend::Backend<NotABackend>);
static_assert(!olmax::backend::Backend<Tensor<float>>);
static_assert(olmax::backend::Backend<olmax::backend::cpu_serial>);
static_assert(olmax::backend::Backend<olmax::backend::cpu_openmp>);

TEST_CASE("shape mismatches throw shape_error naming the op and both shapes", "[errors]") {
    const Tensor<double> a({2, 3}), b({4}), c({3, 2}), d({2, 4, 5});
    expect_shape_error([&] { olmax::add(a, b); }, "add", {a.shape(), b.shape()});
    expect_shape_error([&] { olmax::sub(a, c); }, "sub", {a.shape(), c.shape()});
    expect_shape_error([&] { olmax::mul(b, a); }, "mul", {b.shape(), a.shape()});
    expect_shape_error([&] { olmax::div(d, a); }, "div", {d.shape(), a.shape()});
    expect_shape_error([&] { olmax::maximum(a, d); }, "maximum", {a.shape(), d.shape()});
    expect_shape_error([&] { olmax::minimum(a, d); }, "minimum", {a.shape(), d.shape()});
    expect_shape_error([&] { a + b; }, "add", {a.shape(), b.shape()});
    expect_shape_error([&] { olmax::matmul(a, a); }, "matmul", {a.shape(), a.shape()});
    expect_shape_error([&] { olmax::matmul(d, a); }, "matmul", {d.shape(), a.shape()});
    expect_shape_error([&] { olmax::map([](double x, double y) { return x + y; }, a, b); }, "map", {a.shape(), b.shape()});
    expect_shape_error([&] { Tensor<double>::from({2, 2}, {1.0}); }, "Tensor::from", {Shape{2, 2}});
    expect_shape_error([&] { olmax::sum(a, {5}); }, "sum", {});
    expect_shape_error([&] { olmax::max(a, -3); }, "max", {});
    expect_shape_error([&] { olmax::broadcast_shapes({3}, {4}, "my_op"); }, "my_op", {Shape{3}, Shape{4}});
    // A wrong output gradient for backward.
    auto w = olmax::parameter(Tensor<double>({2}, 1.0));
    auto y = olmax::exp(w);
    expect_shape_error([&] { y.backward(Tensor<double>({3})); }, "backward", {Shape{3}, Shape{2}});
    olmax::autodiff::clear_tape();
}

TEST_CASE("a custom backward that returns a wrongly shaped gradient is reported", "[errors][autodiff]") {
    auto x = olmax::parameter(Tensor<double>({3}, 1.0));
    auto y = olmax::autodiff::custom_op("bad_shape", x.clone(), {x}, [](const Tensor<double>&, olmax::autodiff::GradientSink<double>& g) {
        g.add(0, Tensor<double>({4}));
    });
    try {
        olmax::sum(y).backward();
        FAIL("no autodiff_error thrown");
    } catch (const olmax::autodiff_error& e) {
        const std::string msg = e.what();
        CHECK(msg.find("bad_shape") != std::string::npos);
        CHECK(msg.find("[4]") != std::string::npos);
        CHECK(msg.find("[3]") != std::string::npos);
    }
    olmax::autodiff::clear_tape();
}

TEST_CASE("empty tensors and zero-length axes never crash", "[errors][empty]") {
    const Tensor<double> empty({0}), empty2({3, 0}), empty3({0, 4});
    SECTION("sum of empty is 0, mean of empty is NaN (NumPy)") {
        CHECK(olmax::sum(empty).item() == 0);
        CHECK(olmax::sum(empty2).item() == 0);
        CHECK(std::isnan(olmax::mean(empty).item()));
        CHECK(std::isnan(olmax::mean(empty3).item()));
        const auto rows = olmax::sum(empty2, {1});  // three sums over nothing
        REQUIRE(rows.shape() == Shape{3});
        CHECK(rows(0) == 0);
        CHECK(rows(2) == 0);
        const auto cols = olmax::sum(empty3, {0}, true);  // four sums over nothing
        REQUIRE(cols.shape() == Shape{1, 4});
        CHECK(cols(0, 3) == 0);
        CHECK(std::isnan(olmax::mean(empty3, {0})(1)));
        CHECK(olmax::sum(empty3, {1}).shape() == Shape{0});
    }
    SECTION("max over a zero-length axis throws; over a non-empty axis of an empty tensor it is empty") {
        CHECK_THROWS_AS(olmax::max(empty), olmax::shape_error);
        CHECK_THROWS_AS(olmax::max(empty2, 1), olmax::shape_error);
        CHECK(olmax::max(empty3, 1).shape() == Shape{0});
    }
    SECTION("element-wise ops and broadcasting with zero extents") {
        CHECK(olmax::exp(empty).size() == 0);
        CHECK(olmax::mish(empty2).shape() == Shape{3, 0});
        CHECK(olmax::add(empty3, Tensor<double>({4}, 1.0)).shape() == Shape{0, 4});
        CHECK(olmax::mul(empty2, Tensor<double>({3, 1}, 2.0)).shape() == Shape{3, 0});
        CHECK(olmax::add(Tensor<double>({0, 1}), Tensor<double>({1, 5})).shape() == Shape{0, 5});
    }
    SECTION("matmul with k = 0 gives zeros; m = 0 or n = 0 give empty results") {
        const auto z = olmax::matmul(Tensor<double>({3, 0}), Tensor<double>({0, 4}));
        REQUIRE(z.shape() == Shape{3, 4});
        CHECK(std::all_of(z.begin(), z.end(), [](double v) { return v == 0; }));
        const auto zb = olmax::matmul(Tensor<double>({2, 3, 0}), Tensor<double>({2, 0, 4}));
        REQUIRE(zb.shape() == Shape{2, 3, 4});
        CHECK(std::all_of(zb.begin(), zb.end(), [](double v) { return v == 0; }));
        CHECK(olmax::matmul(Tensor<double>({0, 3}), Tensor<double>({3, 4})).shape() == Shape{0, 4});
        CHECK(olmax::matmul(Tensor<double>({2, 3}), Tensor<double>({3, 0})).shape() == Shape{2, 0});
        CHECK(olmax::matmul(Tensor<double>({0, 2, 3}), Tensor<double>({0, 3, 4})).shape() == Shape{0, 2, 4});
    }
    SECTION("backward through empty tensors gives empty / zero gradients") {
        auto a = olmax::parameter(Tensor<double>({3, 0}));
        auto b = olmax::parameter(Tensor<double>({0, 4}));
        auto bias = olmax::parameter(Tensor<double>({4}, 1.0));
        auto loss = olmax::sum(olmax::matmul(a, b) + bias);
        CHECK(loss.item() == 12);
        loss.backward();
        CHECK(a.grad().shape() == Shape{3, 0});
        CHECK(b.grad().shape() == Shape{0, 4});
        CHECK(bias.grad()(0) == 3);
        auto e = olmax::parameter(Tensor<double>({0, 5}));
        auto scale_row = olmax::parameter(Tensor<double>({5}, 2.0));
        olmax::sum(olmax::tanh(e) * scale_row).backward();  // broadcast over a zero-length axis
        CHECK(e.grad().size() == 0);
        REQUIRE(scale_row.grad().defined());
        CHECK(scale_row.grad()(4) == 0);
        auto m = olmax::parameter(Tensor<double>({0}));
        olmax::mean(m).backward();  // NaN loss, empty gradient: no crash
        CHECK(m.grad().size() == 0);
    }
    SECTION("float as well") {
        CHECK(olmax::sum(Tensor<float>({0, 3})).item() == 0);
        CHECK(std::isnan(olmax::mean(Tensor<float>({0})).item()));
        CHECK(olmax::matmul(Tensor<float>({2, 0}), Tensor<float>({0, 2}))(1, 1) == 0);
    }
}

TEST_CASE("NaN inputs propagate without crashing", "[errors][nan]") {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    auto x = olmax::parameter(Tensor<double>::from({4}, {1, nan, -2, 0.5}));
    SECTION("element-wise ops") {
        for (const auto& y : {olmax::exp(x), olmax::tanh(x), olmax::sigmoid(x), olmax::mish(x), olmax::gelu(x), olmax::softplus(x), olmax::square(x),
                              olmax::abs(x), olmax::elephant(x), olmax::relu(x), olmax::leaky_relu(x), olmax::maximum(x, x * 0.0),
                              olmax::maximum(x * 0.0 + 0.25, x), olmax::minimum(x * 0.0 + 0.25, x), olmax::sqrt(olmax::abs(x)), x + x, x * 2.0}) {
            CHECK(std::isnan(y(1)));
            CHECK_FALSE(std::isnan(y(0)));
        }
        olmax::autodiff::clear_tape();
    }
    SECTION("reductions and matmul") {
        CHECK(std::isnan(olmax::sum(x).item()));
        CHECK(std::isnan(olmax::mean(x).item()));
        CHECK(std::isnan(olmax::max(x, 0).item()));  // NaN wins the maximum, as in NumPy
        CHECK(std::isnan(olmax::max(Tensor<double>::from({3}, {nan, 5, 1}), 0).item()));
        const auto m = olmax::matmul(Tensor<double>::from({2, 2}, {nan, 0, 1, 1}), Tensor<double>::from({2, 1}, {1, 1}));
        CHECK(std::isnan(m(0, 0)));
        CHECK(m(1, 0) == 2);
        olmax::autodiff::clear_tape();
    }
    SECTION("backward carries NaN into the gradient, no crash") {
        olmax::sum(olmax::tanh(x) * x).backward();
        CHECK(std::isnan(x.grad()(1)));
        CHECK(std::isfinite(x.grad()(0)));
    }
    SECTION("infinities") {
        const double inf = std::numeric_limits<double>::infinity();
        const auto t = Tensor<double>::from({2}, {inf, -inf});
        CHECK(olmax::sigmoid(t)(0) == 1);
        CHECK(olmax::sigmoid(t)(1) == 0);
        CHECK(olmax::tanh(t)(1) == -1);
        CHECK(olmax::softplus(t)(1) == 0);
        CHECK(olmax::relu(t)(0) == inf);
    }
}

TEST_CASE("invalid arguments throw value_error", "[errors]") {
    CHECK_THROWS_AS(olmax::elephant(Tensor<double>({2}), -1.0, 2.0), olmax::value_error);
    olmax::Generator g(1);
    CHECK_THROWS_AS(g.below(0), olmax::value_error);
    CHECK_THROWS_AS(Tensor<double>().shape(), olmax::value_error);
    // Every olmax exception is an olmax::error.
    CHECK_THROWS_AS(olmax::add(Tensor<double>({2}), Tensor<double>({3})), olmax::error);
}

// ---- issue 38: the surprises a new user met, each with a message naming the cause and the fix ----

TEST_CASE("a negative size is named as one, even beside a zero extent", "[errors]") {
    const long n = -1;
    CHECK_THROWS_WITH(olmax::zeros<float>({static_cast<std::size_t>(n), 3}),
                      Catch::Contains("extent 0 is -1 converted to an unsigned size; sizes must be >= 0"));
    CHECK_THROWS_WITH(olmax::zeros<float>({2, 0, static_cast<std::size_t>(-5L)}), Catch::Contains("extent 2 is -5"));
    CHECK_THROWS_AS(olmax::zeros<float>({static_cast<std::size_t>(n), 0}), olmax::shape_error);
    CHECK(olmax::zeros<float>({3, 0}).size() == 0);  // a genuinely empty tensor is still fine
}

TEST_CASE("a second backward through a freed graph says retain_graph first", "[errors][autodiff]") {
    auto w = olmax::parameter(olmax::full<float>({3}, 2.0f));
    auto loss = olmax::sum(olmax::square(w));
    loss.backward();
    try {
        loss.backward();
        FAIL("the second backward did not throw");
    } catch (const olmax::autodiff_error& e) {
        const std::string message = e.what();
        INFO(message);
        const auto hint = message.find("retain_graph");
        CHECK(hint != std::string::npos);
        CHECK(hint < message.find("another tape"));
    }
    auto y = olmax::square(w);
    olmax::sum(y).backward();
    CHECK_THROWS_WITH(olmax::sum(y * 2.0f).backward(), Catch::Contains("call that earlier backward(/*retain_graph=*/true)"));
}

TEST_CASE("gates given per channel are refused with the expansion that works", "[errors][scan]") {
    olmax::Generator rng(0);
    const auto x = olmax::randn<float>({2, 5, 4}, rng);
    const auto per_channel = olmax::parameter(olmax::full<float>({4}, 0.9f));
    using S = olmax::scan::sequential;
    CHECK_THROWS_WITH(olmax::scan::scan<S>(per_channel, x), Catch::Contains("gates + olmax::zeros_like(x)"));
    CHECK_THROWS_WITH(olmax::scan::scan<S>(olmax::full<float>({1, 1, 4}, 0.9f), x), Catch::Contains("expand them to x's shape first"));
    // A channel count that fits nothing gets no expansion advice.
    CHECK_THROWS_WITH(olmax::scan::scan<S>(olmax::full<float>({2, 5, 3}, 0.9f), x), !Catch::Contains("expand"));

    // The advice works, and the gradient reaches the per-channel gates.
    const auto h = olmax::scan::scan<S>(per_channel + olmax::zeros_like(x), x);
    const auto expected = olmax::scan::scan<S>(olmax::full<float>(x.shape(), 0.9f), x);
    CHECK(olmax_test::max_abs_diff(h.detach(), expected) == 0.0);
    olmax::sum(h).backward();
    REQUIRE(per_channel.grad().defined());
    CHECK(per_channel.grad().shape() == olmax::Shape{4});
}

TEST_CASE("nn::Config has no silent width or depth", "[errors][nn]") {
    olmax::Generator rng(1);
    const olmax::nn::Config unset;
    CHECK(unset.features == 0);
    CHECK_THROWS_WITH(olmax::nn::Linear<float>(unset, rng), Catch::Contains("nn::Linear: nn::Config::features is 0 (not set)"));
    CHECK_THROWS_WITH((olmax::nn::Sandwich<olmax::nn::QRNN<>>(unset, rng)), Catch::Contains("nn::Config::features is 0"));
    CHECK_THROWS_WITH(olmax::nn::Embedding<float>(unset, rng), Catch::Contains("nn::Embedding: nn::Config::features is 0"));
    CHECK_THROWS_WITH(olmax::nn::Stack<olmax::nn::Linear<float>>(olmax::nn::Config{.features = 4}, rng), Catch::Contains("depth must be at least 1, got 0"));
    CHECK(olmax::nn::Stack<olmax::nn::Linear<float>>(olmax::nn::Config{.features = 4, .depth = 3}, rng).depth() == 3);
}
