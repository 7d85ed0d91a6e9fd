// nn::QRNN: the four poolings, gradient-checked in double, and strategy independence.
#include "test_helpers.hpp"

#include "olmax/nn/qrnn.hpp"

namespace sc = olmax::scan;
using olmax::Tensor;
using olmax::nn::QrnnPooling;

namespace {

/// Points the layer's parameters at `weight` and `bias` (for the finite-difference checker).
template <class Layer>
void bind(Layer& layer, const Tensor<double>& weight, const Tensor<double>& bias) {
    olmax::nn::ParameterVisitor<double> visit([&](const std::string& name, Tensor<double>& t, olmax::nn::Role, olmax::nn::Sharing) {
        t = name == "weight" ? weight : bias;
    });
    layer.visit_parameters(visit);
}

template <class Layer>
std::vector<Tensor<double>> parameters_of(Layer& layer) {
    std::vector<Tensor<double>> out;
    olmax::nn::ParameterVisitor<double> visit(
        [&](const std::string&, Tensor<double>& t, olmax::nn::Role, olmax::nn::Sharing) { out.push_back(t.detach().clone()); });
    layer.visit_parameters(visit);
    return out;
}

}  // namespace

TEST_CASE("nn::QRNN: gradients (double) for every pooling", "[qrnn][grad]") {
    for (QrnnPooling pooling : {QrnnPooling::original, QrnnPooling::f, QrnnPooling::fo, QrnnPooling::ifo}) {
        olmax::Generator rng(4);
        olmax::nn::QRNN<sc::sequential, double> layer(3, 2, 2, pooling, rng);
        auto params = parameters_of(layer);
        Tensor<double> x = olmax::randn<double>({2, 6, 3}, rng);
        for (auto& v : params[1]) v = 0.3;  // bias: keep hard_sigmoid's input away from its kinks at +-3
        auto f = [&](const std::vector<Tensor<double>>& in) {
            bind(layer, in[1], in[2]);
            return layer.forward(in[0]);
        };
        auto result = olmax::testing::check_gradients(f, {x, params[0], params[1]});
        INFO("pooling " << int(pooling) << "\n" << result);
        CHECK(result.ok);
    }
}

TEST_CASE("nn::QRNN: the original form is h = f h + z and strategies agree", "[qrnn]") {
    olmax::Generator rng(9);
    olmax::nn::QRNN<sc::sequential, double> seq(4, 3, 3, QrnnPooling::fo, rng);
    olmax::Generator rng2(9);
    olmax::nn::QRNN<sc::hillis_steele_chunked<4>, double> tree(4, 3, 3, QrnnPooling::fo, rng2);
    Tensor<double> x = olmax::randn<double>({2, 37, 4}, rng);
    CHECK(olmax_test::max_abs_diff(seq.forward(x), tree.forward(x)) < 1e-12);

    olmax::Generator rng3(1);
    olmax::nn::QRNN<sc::sequential, double> original(2, 2, 1, QrnnPooling::original, rng3);
    auto p = parameters_of(original);
    Tensor<double> u = olmax::randn<double>({1, 5, 2}, rng3);
    Tensor<double> h = original.forward(u);
    // Manual: z = u W + b per step (kernel 1), f = hard_sigmoid(z[:, 2:4]), h = f h + z[:, 0:2].
    double state[2] = {0, 0};
    for (std::size_t t = 0; t < 5; ++t)
        for (std::size_t c = 0; c < 2; ++c) {
            auto proj = [&](std::size_t o) { return u(0, t, 0) * p[0](0, 0, o) + u(0, t, 1) * p[0](0, 1, o) + p[1](o); };
            const double f = std::clamp((proj(2 + c) + 3) / 6, 0.0, 1.0);
            state[c] = f * state[c] + proj(c);
            CHECK(h(0, t, c) == Approx(state[c]).epsilon(1e-12));
        }
}

TEST_CASE("nn::QRNN: bad sizes throw", "[qrnn]") {
    olmax::Generator rng(1);
    CHECK_THROWS_AS((olmax::nn::QRNN<sc::sequential, float>(0, 2, 2, QrnnPooling::f, rng)), olmax::value_error);
    olmax::nn::QRNN<sc::sequential, float> layer(3, 2, 2, QrnnPooling::f, rng);
    CHECK_THROWS_AS(layer.forward(Tensor<float>({1, 4, 5})), olmax::shape_error);
}
