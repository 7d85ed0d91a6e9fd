// The rung after the quickstart: a model of your own from nn layers, its backward checked with
// testing::check_layer_gradients, then trained with AdamW to fit y = sin(x) on [-pi, pi].
// Exits non-zero when the check or the fit fails (CI runs it as a smoke test).
#include <olmax/olmax.hpp>

#include <cmath>
#include <cstdio>
#include <numbers>
#include <string_view>

namespace nn = olmax::nn;
using olmax::Tensor;

// 1 -> hidden -> 1 with a tanh between: a layer like any other (the contract of nn/contract.hpp),
// so nn::parameters, optim::parameters_of, checkpoints and the gradient check all work on it.
template <olmax::Real T>
class SineNet {
public:
    using value_type = T;
    using config_type = nn::Config;
    static constexpr std::string_view name = "sine_net";

    SineNet(const nn::Config& config, olmax::Generator& rng)
        : in_(1, config.features, rng, /*with_bias=*/true), out_(config.features, 1, rng, /*with_bias=*/true) {}
    Tensor<T> forward(const Tensor<T>& x, const nn::LayerContext& ctx = {}) const {  // [points, 1] -> [points, 1]
        return out_.forward(olmax::tanh(in_.forward(x, ctx)), ctx);
    }
    void visit_parameters(nn::ParameterVisitor<T>& visit) { visit.child("in", in_), visit.child("out", out_); }

private:
    nn::Linear<T> in_, out_;
};

// n points evenly spaced over [-pi, pi] (shifted by half a step for held-out points), as [n, 1].
Tensor<float> grid(std::size_t n, bool shifted) {
    auto x = olmax::arange<float>(n) * float(2 * std::numbers::pi / double(n)) + float(-std::numbers::pi);
    return olmax::reshape(shifted ? x + float(std::numbers::pi / double(n)) : x, {n, 1});
}

Tensor<float> sine(const Tensor<float>& x) { return olmax::map([](float v) { return std::sin(v); }, x); }

int main() {
    olmax::Generator rng(1);
    const nn::Config config{.features = 32};

    // 1. The backward of the model, input and every parameter, against fp64 central differences.
    const SineNet<double> probe(nn::Config{.features = 3}, rng);
    const auto check = olmax::testing::check_layer_gradients(probe, olmax::randn<double>({4, 1}, rng));
    std::printf("%s\n", check.ok ? "gradient check passed" : "GRADIENT CHECK FAILED");

    // 2. Training: AdamW on every parameter the model visits.
    SineNet<float> model(config, rng);
    olmax::optim::AdamW<float> optimizer(olmax::optim::parameters_of(model), /*lr=*/1e-2);
    const Tensor<float> x = grid(256, false), y = sine(x);
    float first = 0, last = 0;
    for (int step = 1; step <= 1500; ++step) {
        auto loss = olmax::mean(olmax::square(model.forward(x) - y));
        loss.backward();
        optimizer.step();
        optimizer.zero_grad();
        last = loss.item();
        if (step == 1) first = last;
        if (step == 1 || step % 300 == 0) std::printf("step %4d  mse %.6f\n", step, last);
    }

    // 3. Held-out points, without recording a graph.
    olmax::autodiff::no_grad eval;
    const Tensor<float> x_test = grid(100, true);
    const float test_mse = olmax::mean(olmax::square(model.forward(x_test) - sine(x_test))).item();
    std::printf("held-out mse %.6f (%zu parameters)\n", test_mse, nn::parameter_count(model));
    return check.ok && last < 0.02f * first && test_mse < 0.02f * first ? 0 : 1;
}
