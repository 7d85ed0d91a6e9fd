// Forward values and double-precision gradient checks for every op in olmax/ops/elementwise.hpp.
//
// Inputs of ops with kinks (abs, relu, leaky_relu, hard_sigmoid, maximum, elephant at 0) are drawn
// at least 0.1 away from the kink: a central difference of step 1e-6 straddling a kink measures
// neither one-sided derivative, so a check there would test the sampler, not the op. Ops defined on
// part of the real line (log, sqrt, rsqrt, the divisor of div) get inputs in [0.5, 2).
#include "test_helpers.hpp"

#include <cmath>
#include <limits>
#include <numbers>
#include <string>

using olmax::Shape;
using olmax::Tensor;
using Inputs = std::vector<Tensor<double>>;

namespace {

/// Pairs of shapes that broadcast, in both directions, with rank-0 and size-1 axes.
const std::vector<std::pair<Shape, Shape>> broadcast_pairs = {
    {{3, 4}, {3, 4}},       {{3, 4}, {4}},          {{4}, {3, 4}},    {{2, 3, 4}, {3, 1}}, {{3, 1}, {2, 3, 4}},
    {{2, 1, 4}, {1, 3, 1}}, {{}, {3, 4}},           {{3, 4}, {}},     {{1}, {3, 4}},       {{3, 1}, {1, 4}},
    {{}, {}},               {{1, 1}, {2, 1, 3}},    {{5}, {1}},
};

}  // namespace

TEST_CASE("binary ops: gradients with broadcasting in both directions", "[ops][elementwise][gradcheck]") {
    olmax::Generator rng(11);
    for (const auto& [sa, sb] : broadcast_pairs) {
        INFO("shapes " << olmax::to_string(sa) << " and " << olmax::to_string(sb));
        const auto a = olmax::randn<double>(sa, rng);
        const auto b = olmax::randn<double>(sb, rng);
        const auto b_pos = olmax_test::uniform(sb, rng, 0.5, 2.0);
        SECTION("add") { olmax_test::check_gradients([](const Inputs& v) { return olmax::add(v[0], v[1]); }, {a, b}); }
        SECTION("sub") { olmax_test::check_gradients([](const Inputs& v) { return olmax::sub(v[0], v[1]); }, {a, b}); }
        SECTION("mul") { olmax_test::check_gradients([](const Inputs& v) { return olmax::mul(v[0], v[1]); }, {a, b}); }
        SECTION("div") { olmax_test::check_gradients([](const Inputs& v) { return olmax::div(v[0], v[1]); }, {a, b_pos}); }
        SECTION("operators") {
            olmax_test::check_gradients([](const Inputs& v) { return (v[0] + v[1]) * v[0] - v[1] / (v[1] * v[1] + 1.0); }, {a, b});
        }
        SECTION("maximum (|a - b| >= 0.1)") {
            // Put a and b on disjoint grids (a near k + 0.25, b near k + 0.75): every pair that meets
            // under broadcasting differs by >= 0.3, so no element sits on the tie a == b.
            auto a_apart = a.clone(), b_apart = b.clone();
            for (double& v : a_apart) v = std::floor(v * 2) + 0.25 + 0.1 * std::tanh(v);
            for (double& v : b_apart) v = std::floor(v * 2) + 0.75 + 0.1 * std::tanh(v);
            olmax_test::check_gradients([](const Inputs& v) { return olmax::maximum(v[0], v[1]); }, {a_apart, b_apart});
            olmax_test::check_gradients([](const Inputs& v) { return olmax::minimum(v[0], v[1]); }, {a_apart, b_apart});
        }
    }
}

TEST_CASE("binary ops: forward values follow NumPy broadcasting", "[ops][elementwise]") {
    auto a = Tensor<double>::from({2, 1, 3}, {1, 2, 3, 4, 5, 6});
    auto b = Tensor<double>::from({2, 1}, {10, 20});
    auto y = olmax::add(a, b);
    REQUIRE(y.shape() == Shape{2, 2, 3});
    const double expect[] = {11, 12, 13, 21, 22, 23, 14, 15, 16, 24, 25, 26};
    for (std::size_t i = 0; i < 12; ++i) CHECK(y.data()[i] == expect[i]);
    auto m = olmax::maximum(Tensor<double>::from({3}, {1, 5, 3}), Tensor<double>::scalar(2.5));
    CHECK(m(0) == 2.5);
    CHECK(m(1) == 5);
    CHECK(m(2) == 3);
    auto lower = olmax::minimum(Tensor<double>::from({3}, {1, 5, 3}), Tensor<double>::scalar(2.5));
    CHECK(lower(0) == 1);
    CHECK(lower(1) == 2.5);
    CHECK(lower(2) == 2.5);
    auto d = olmax::div(Tensor<double>::scalar(1.0), Tensor<double>::from({2}, {2, 4}));
    CHECK(d(0) == 0.5);
    CHECK(d(1) == 0.25);
}

TEST_CASE("maximum and minimum: a tie sends the whole gradient to the first operand", "[ops][elementwise]") {
    auto a = olmax::parameter(Tensor<double>::from({2}, {1, 2}));
    auto b = olmax::parameter(Tensor<double>::from({2}, {1, 3}));
    olmax::sum(olmax::maximum(a, b)).backward();
    CHECK(a.grad()(0) == 1);
    CHECK(b.grad()(0) == 0);
    CHECK(a.grad()(1) == 0);
    CHECK(b.grad()(1) == 1);
    a.zero_grad();
    b.zero_grad();
    olmax::sum(olmax::minimum(a, b)).backward();
    CHECK(a.grad()(0) == 1);
    CHECK(b.grad()(0) == 0);
    CHECK(a.grad()(1) == 1);
    CHECK(b.grad()(1) == 0);
}

TEST_CASE("scalar ops: add_scalar, scale, neg and the scalar operators", "[ops][elementwise][gradcheck]") {
    olmax::Generator rng(12);
    const Inputs in{olmax::randn<double>({3, 5}, rng)};
    olmax_test::check_gradients([](const Inputs& v) { return olmax::add_scalar(v[0], 1.5); }, in);
    olmax_test::check_gradients([](const Inputs& v) { return olmax::scale(v[0], -2.5); }, in);
    olmax_test::check_gradients([](const Inputs& v) { return olmax::neg(v[0]); }, in);
    olmax_test::check_gradients([](const Inputs& v) { return 2.0 - 3.0 * (-v[0]) / 4.0 + 1.0; }, in);
    olmax_test::check_gradients([](const Inputs& v) { return (v[0] - 1.0) * 0.5 + (1.0 + v[0]); }, in);
    auto x = Tensor<double>::from({2}, {1, -2});
    auto y = 2.0 - x;
    CHECK(y(0) == 1);
    CHECK(y(1) == 4);
    CHECK((x / 4.0)(1) == -0.5);
}

namespace {

struct UnaryCase {
    std::string name;
    Tensor<double> (*op)(const Tensor<double>&);
    double (*reference)(double);
    enum Domain { any, positive, off_zero, off_three } domain;
};

double ref_sigmoid(double v) { return 1 / (1 + std::exp(-v)); }
double ref_softplus(double v) { return std::log1p(std::exp(v)); }

const std::vector<UnaryCase> unary_cases = {
    {"exp", [](const Tensor<double>& x) { return olmax::exp(x); }, [](double v) { return std::exp(v); }, UnaryCase::any},
    {"log", [](const Tensor<double>& x) { return olmax::log(x); }, [](double v) { return std::log(v); }, UnaryCase::positive},
    {"sqrt", [](const Tensor<double>& x) { return olmax::sqrt(x); }, [](double v) { return std::sqrt(v); }, UnaryCase::positive},
    {"rsqrt", [](const Tensor<double>& x) { return olmax::rsqrt(x); }, [](double v) { return 1 / std::sqrt(v); }, UnaryCase::positive},
    {"square", [](const Tensor<double>& x) { return olmax::square(x); }, [](double v) { return v * v; }, UnaryCase::any},
    {"abs", [](const Tensor<double>& x) { return olmax::abs(x); }, [](double v) { return std::abs(v); }, UnaryCase::off_zero},
    {"tanh", [](const Tensor<double>& x) { return olmax::tanh(x); }, [](double v) { return std::tanh(v); }, UnaryCase::any},
    {"sigmoid", [](const Tensor<double>& x) { return olmax::sigmoid(x); }, ref_sigmoid, UnaryCase::any},
    {"hard_sigmoid", [](const Tensor<double>& x) { return olmax::hard_sigmoid(x); },
     [](double v) { return std::clamp((v + 3) / 6, 0.0, 1.0); }, UnaryCase::off_three},
    {"relu", [](const Tensor<double>& x) { return olmax::relu(x); }, [](double v) { return v > 0 ? v : 0.0; }, UnaryCase::off_zero},
    {"leaky_relu", [](const Tensor<double>& x) { return olmax::leaky_relu(x); }, [](double v) { return v > 0 ? v : 0.01 * v; },
     UnaryCase::off_zero},
    {"leaky_relu(0.2)", [](const Tensor<double>& x) { return olmax::leaky_relu(x, 0.2); }, [](double v) { return v > 0 ? v : 0.2 * v; },
     UnaryCase::off_zero},
    {"softplus", [](const Tensor<double>& x) { return olmax::softplus(x); }, ref_softplus, UnaryCase::any},
    {"mish", [](const Tensor<double>& x) { return olmax::mish(x); }, [](double v) { return v * std::tanh(ref_softplus(v)); },
     UnaryCase::any},
    {"gelu", [](const Tensor<double>& x) { return olmax::gelu(x); },
     [](double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (v + 0.044715 * v * v * v))); }, UnaryCase::any},
    {"elephant", [](const Tensor<double>& x) { return olmax::elephant(x); }, [](double v) { return 1 / (1 + std::pow(std::abs(v), 4)); },
     UnaryCase::off_zero},
    {"elephant(a=2, d=3)", [](const Tensor<double>& x) { return olmax::elephant(x, 2.0, 3.0); },
     [](double v) { return 1 / (1 + std::pow(std::abs(v / 2), 3)); }, UnaryCase::off_zero},
    {"clamp(-3, 3)", [](const Tensor<double>& x) { return olmax::clamp(x, -3.0, 3.0); }, [](double v) { return std::clamp(v, -3.0, 3.0); },
     UnaryCase::off_three},
};

Tensor<double> sample(UnaryCase::Domain domain, const Shape& shape, olmax::Generator& rng) {
    switch (domain) {
        case UnaryCase::positive: return olmax_test::uniform(shape, rng, 0.5, 2.0);
        case UnaryCase::off_zero: return olmax_test::randn_away_from(shape, rng, {0.0}, 0.1, 2.0);
        case UnaryCase::off_three: return olmax_test::randn_away_from(shape, rng, {-3.0, 3.0}, 0.1, 3.0);
        case UnaryCase::any: break;
    }
    return olmax::randn<double>(shape, rng, 0.0, 2.0);
}

}  // namespace

TEST_CASE("unary ops: forward matches the formula and gradients match central differences", "[ops][elementwise][gradcheck]") {
    olmax::Generator rng(13);
    for (const auto& c : unary_cases) {
        INFO("op " << c.name);
        for (const Shape& shape : {Shape{}, Shape{1}, Shape{4, 5}, Shape{2, 1, 3}}) {
            INFO("shape " << olmax::to_string(shape));
            const auto x = sample(c.domain, shape, rng);
            const auto y = c.op(x);
            REQUIRE(y.shape() == x.shape());
            for (std::size_t i = 0; i < x.size(); ++i) CHECK(y.data()[i] == Approx(c.reference(x.data()[i])).epsilon(1e-12).margin(1e-300));
            olmax_test::check_gradients([&c](const Inputs& v) { return c.op(v[0]); }, {x});
        }
    }
}

TEST_CASE("unary ops: gradients in the flat tails and the saturated ranges", "[ops][elementwise][gradcheck]") {
    // Large |x| where naive formulas overflow (softplus, mish, sigmoid) or the slope is tiny.
    const Inputs in{Tensor<double>::from({6}, {-30, -8, -3.5, 3.5, 8, 30})};
    for (const auto& c : unary_cases) {
        if (c.domain == UnaryCase::positive) continue;
        INFO("op " << c.name);
        const auto y = c.op(in[0]);
        for (double v : y) CHECK(std::isfinite(v));
        olmax_test::check_gradients([&c](const Inputs& v) { return c.op(v[0]); }, in);
    }
    auto big = olmax::softplus(Tensor<double>::from({2}, {800, -800}));
    CHECK(big(0) == 800);
    CHECK(big(1) == 0);
}

TEST_CASE("kinks: the documented one-sided derivatives", "[ops][elementwise]") {
    auto x = olmax::parameter(Tensor<double>::from({5}, {-3, 0, 3, -1, 1}));
    SECTION("relu'(0) = 0, abs'(0) = 0") {
        olmax::sum(olmax::relu(x) + olmax::abs(x)).backward();
        const double expect[] = {-1, 0, 2, -1, 2};
        for (std::size_t i = 0; i < 5; ++i) CHECK(x.grad()(i) == expect[i]);
    }
    SECTION("hard_sigmoid is flat at and beyond +-3") {
        olmax::sum(olmax::hard_sigmoid(x)).backward();
        const double expect[] = {0, 1.0 / 6, 0, 1.0 / 6, 1.0 / 6};
        for (std::size_t i = 0; i < 5; ++i) CHECK(x.grad()(i) == Approx(expect[i]));
    }
    SECTION("clamp is 1 at its bounds (included) and 0 beyond them, as PyTorch's") {
        olmax::sum(olmax::clamp(x, -1.0, 1.0)).backward();
        const double expect[] = {0, 1, 0, 1, 1};
        for (std::size_t i = 0; i < 5; ++i) CHECK(x.grad()(i) == expect[i]);
    }
    SECTION("elephant'(0) = 0") {
        olmax::sum(olmax::elephant(x)).backward();
        CHECK(x.grad()(1) == 0);
        CHECK(x.grad()(3) == Approx(1.0));  // -d u^(d-1) sign(x) / a * y^2 = -4 * 1 * (-1) * 0.25
    }
}

TEST_CASE("elephant rejects non-positive a and d", "[ops][elementwise][errors]") {
    const auto x = Tensor<double>::from({2}, {1, 2});
    CHECK_THROWS_AS(olmax::elephant(x, 0.0, 4.0), olmax::value_error);
    CHECK_THROWS_AS(olmax::elephant(x, 1.0, -1.0), olmax::value_error);
}

TEST_CASE("clamp: bounds may be infinite, NaN stays NaN, and lo > hi is refused", "[ops][elementwise][errors]") {
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    const auto x = Tensor<double>::from({4}, {-2, 0.5, 7, nan});
    const auto above_zero = olmax::clamp(x, 0.0, inf);
    CHECK(above_zero(0) == 0);
    CHECK(above_zero(2) == 7);
    CHECK(std::isnan(above_zero(3)));
    CHECK(olmax::clamp(x, -inf, 1.0)(2) == 1);
    CHECK(olmax::clamp(x, 0.5, 0.5)(0) == 0.5);
    CHECK_THROWS_WITH(olmax::clamp(x, 1.0, 0.0), Catch::Matchers::Contains("clamp: lo (1) must not exceed hi (0)"));
}

TEST_CASE("map: fused, unrecorded element-wise chain", "[ops][elementwise]") {
    auto a = olmax::parameter(Tensor<double>::from({3}, {1, 2, 3}));
    auto b = Tensor<double>::from({3}, {4, 5, 6});
    auto y = olmax::map([](double u, double v) { return u * v + 1; }, a, b);
    CHECK_FALSE(y.requires_grad());
    CHECK(y(2) == 19);
    CHECK_THROWS_AS(olmax::map([](double u, double v) { return u + v; }, a, Tensor<double>({4})), olmax::shape_error);
}

TEST_CASE("elementwise ops in float agree with double", "[ops][elementwise]") {
    olmax::Generator rng(14);
    const auto xd = olmax::randn<double>({64}, rng);
    const auto xf = olmax::cast<float>(xd);
    for (const auto& [name, fd, ff] :
         std::vector<std::tuple<std::string, Tensor<double> (*)(const Tensor<double>&), Tensor<float> (*)(const Tensor<float>&)>>{
             {"mish", [](const Tensor<double>& x) { return olmax::mish(x); }, [](const Tensor<float>& x) { return olmax::mish(x); }},
             {"softplus", [](const Tensor<double>& x) { return olmax::softplus(x); }, [](const Tensor<float>& x) { return olmax::softplus(x); }},
             {"gelu", [](const Tensor<double>& x) { return olmax::gelu(x); }, [](const Tensor<float>& x) { return olmax::gelu(x); }},
             {"sigmoid", [](const Tensor<double>& x) { return olmax::sigmoid(x); }, [](const Tensor<float>& x) { return olmax::sigmoid(x); }},
             {"elephant", [](const Tensor<double>& x) { return olmax::elephant(x); }, [](const Tensor<float>& x) { return olmax::elephant(x); }},
         }) {
        INFO(name);
        CHECK(olmax_test::max_abs_diff(fd(xd), olmax::cast<double>(ff(xf))) < 1e-6);
    }
}

TEST_CASE("map_into writes a fused chain into an existing tensor, also in place", "[ops][elementwise]") {
    auto a = Tensor<float>::from({4}, {1, 2, 3, 4});
    auto b = Tensor<float>::from({4}, {5, 6, 7, 8});
    Tensor<float> out({4});
    olmax::map_into(out, [](float u, float v) { return (u + v) * 2 - u; }, a, b);
    CHECK(out(0) == 11);
    CHECK(out(3) == 20);
    olmax::map_into(a, [](float u, float v) { return u * v; }, a, b);  // aliasing the output with an input
    CHECK(a(1) == 12);
    Tensor<float> wrong({3});
    CHECK_THROWS_AS(olmax::map_into(wrong, [](float u) { return u; }, a), olmax::shape_error);
}

// ---- olmax::pointwise: a chain of element-wise maths as one op ------------------------------------

namespace {
namespace m = olmax::math;
// Chains written once and run two ways: fused (olmax::pointwise) and op by op (the same f on tensors).
const auto qrnn_input = [](auto f, auto z) { return (1 - m::hard_sigmoid(f)) * m::tanh(z); };
const auto smooth_chain = [](auto a, auto b, auto c) {
    return m::exp(a * 0.5) / (1 + m::square(b)) - m::log(m::sqrt(c) + 1) * m::silu(a) + m::sigmoid(b) * m::tanh(c) - b / 3 + 2 * m::sqrt(c);
};
const auto kinked_chain = [](auto a, auto b, auto c) {
    return m::leaky_relu(b - a, 0.1) + 2 * m::relu(c - 1) + m::maximum(a, b) / c + m::hard_sigmoid(a * 4) * b + m::clamp(a, -0.5, 0.75);
};
const auto more_chain = [](auto a, auto b, auto c) {
    return m::mish(a) * m::rsqrt(c) - m::abs(a - b) + m::softplus(b) * m::log(c) + m::gelu(b * 2) * c;
};

}  // namespace

TEST_CASE("pointwise: a fused chain equals the same chain op by op, in values and gradients", "[ops][elementwise][pointwise]") {
    olmax::Generator rng(21);
    const Shape shape{3, 5, 4};
    const auto a = olmax::randn<double>(shape, rng), b = olmax::randn<double>(shape, rng);
    const auto c = olmax_test::uniform(shape, rng, 0.5, 2.0);
    auto compare = [&]<std::size_t N>(auto f, const std::array<Tensor<double>, N>& inputs) {
        olmax::Generator draw(5);
        std::array<Tensor<double>, N> fused_in, ops_in;
        for (std::size_t k = 0; k < N; ++k) {
            fused_in[k] = inputs[k].clone().set_requires_grad(true);
            ops_in[k] = inputs[k].clone().set_requires_grad(true);
        }
        // One graph at a time: backward() frees the tape it runs.
        const Tensor<double> fused = std::apply([&](const auto&... x) { return olmax::pointwise("chain", f, x...); }, fused_in);
        const auto r = olmax::randn<double>(fused.shape(), draw);
        olmax::sum(olmax::mul(fused, r)).backward();
        const Tensor<double> ops = std::apply(f, ops_in);
        olmax::sum(olmax::mul(ops, r)).backward();
        REQUIRE(fused.shape() == ops.shape());
        double worst = olmax_test::max_abs_diff(fused, ops);
        for (std::size_t k = 0; k < N; ++k) {
            REQUIRE(fused_in[k].grad().defined());
            worst = olmax_test::worse(worst, olmax_test::max_abs_diff(fused_in[k].grad(), ops_in[k].grad()));
        }
        return worst;
    };
    using Two = std::array<Tensor<double>, 2>;
    using Three = std::array<Tensor<double>, 3>;
    CHECK(compare(qrnn_input, Two{a, b}) < 1e-13);
    CHECK(compare(smooth_chain, Three{a, b, c}) < 1e-12);
    CHECK(compare(kinked_chain, Three{a, b, c}) < 1e-13);
    CHECK(compare(more_chain, Three{a, b, c}) < 1e-12);
    // Broadcast inputs (suffixes of the output's shape): their gradients are summed over the leading axes.
    CHECK(compare(smooth_chain, Three{a, olmax::randn<double>({4}, rng), olmax_test::uniform({5, 4}, rng, 0.5, 2.0)}) < 1e-12);
    CHECK(compare(kinked_chain, Three{olmax::randn<double>({4}, rng), b, c}) < 1e-13);
}

TEST_CASE("pointwise: gradients match finite differences, broadcast inputs included", "[ops][elementwise][pointwise][gradcheck]") {
    olmax::Generator rng(22);
    using V = std::vector<Tensor<double>>;
    const auto a = olmax::randn<double>({2, 3, 4}, rng), b = olmax::randn<double>({2, 3, 4}, rng);
    const auto c = olmax_test::uniform({2, 3, 4}, rng, 0.5, 2.0);
    olmax_test::check_gradients([](const V& v) { return olmax::pointwise("qrnn_input", qrnn_input, v[0], v[1]); }, {a, b});
    olmax_test::check_gradients([](const V& v) { return olmax::pointwise("smooth", smooth_chain, v[0], v[1], v[2]); }, {a, b, c});
    olmax_test::check_gradients([](const V& v) { return olmax::pointwise("more", more_chain, v[0], v[1], v[2]); }, {a, b, c});
    olmax_test::check_gradients([](const V& v) { return olmax::pointwise("smooth", smooth_chain, v[0], v[1], v[2]); },
                                {olmax::randn<double>({4}, rng), b, olmax_test::uniform({3, 4}, rng, 0.5, 2.0)});
    // One input: a unary chain; the kinked functions away from their kinks (leaky_relu at 0, hard_sigmoid at +-3).
    auto apart = olmax::randn<double>({2, 3, 4}, rng);
    for (double& v : apart) v = (v < 0 ? -0.2 : 0.2) + 0.5 * v;
    olmax_test::check_gradients(
        [](const V& v) { return olmax::pointwise("unary", [](auto x) { return m::leaky_relu(x, 0.2) * m::hard_sigmoid(x) + m::exp(-x); }, v[0]); },
        {apart});
}

TEST_CASE("pointwise: in float it agrees with the double chain; inputs without gradients get none", "[ops][elementwise][pointwise]") {
    olmax::Generator rng(23);
    const auto a = olmax::randn<double>({4, 64}, rng), b = olmax::randn<double>({4, 64}, rng);
    const auto c = olmax_test::uniform({64}, rng, 0.5, 2.0);
    const Tensor<double> reference = smooth_chain(a, b, c);
    const Tensor<float> fused = olmax::pointwise("smooth", smooth_chain, olmax::cast<float>(a), olmax::cast<float>(b), olmax::cast<float>(c));
    CHECK(olmax_test::max_abs_diff(olmax::cast<double>(fused), reference) < 1e-5);

    auto x = a.clone().set_requires_grad(true);
    const auto y = b.clone();  // no gradient wanted
    olmax::sum(olmax::pointwise("qrnn_input", qrnn_input, x, y)).backward();
    CHECK(x.grad().defined());
    CHECK_FALSE(y.grad().defined());
}

TEST_CASE("pointwise: an input that is neither the output's shape nor a suffix of it is a shape error naming the op", "[ops][elementwise][pointwise]") {
    const Tensor<float> a({2, 3}), b({2}), c({3, 1});
    auto f = [](auto u, auto v) { return u * v; };
    CHECK_THROWS_AS(olmax::pointwise("gate", f, a, b), olmax::shape_error);
    CHECK_THROWS_WITH(olmax::pointwise("gate", f, a, c), Catch::Matchers::Contains("pointwise(gate): input 1 of shape [3, 1]"));
    CHECK(olmax::pointwise("gate", f, a, Tensor<float>({3})).shape() == Shape{2, 3});
}
