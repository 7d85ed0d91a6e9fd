// Fits a two-layer tanh MLP to y = sin(x) on [-pi, pi] with olmax's autodiff and a hand-written Adam
// step, printing the training loss as it falls and the error on held-out points at the end.
// Exits non-zero when the fit fails (final loss not below 2% of the initial loss), so it doubles as a
// smoke test of the ops, the tape and backward() working together.
#include <olmax/olmax.hpp>

#include <cmath>
#include <cstdio>
#include <numbers>
#include <vector>

namespace {

using olmax::Tensor;

/// Adam (Kingma & Ba 2015) on one parameter, updated in place under no_grad.
struct AdamState {
    std::vector<float> m, v;
};

void adam_step(Tensor<float>& p, AdamState& s, int step, float lr) {
    constexpr float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
    const Tensor<float> g = p.grad();
    if (s.m.empty()) s.m.assign(p.size(), 0.0f), s.v.assign(p.size(), 0.0f);
    const float c1 = 1.0f - std::pow(beta1, float(step)), c2 = 1.0f - std::pow(beta2, float(step));
    float* w = p.data();
    for (std::size_t i = 0; i < p.size(); ++i) {
        const float gi = g.data()[i];
        s.m[i] = beta1 * s.m[i] + (1 - beta1) * gi;
        s.v[i] = beta2 * s.v[i] + (1 - beta2) * gi * gi;
        w[i] -= lr * (s.m[i] / c1) / (std::sqrt(s.v[i] / c2) + eps);
    }
    p.zero_grad();
}

/// Points x_i evenly spaced over [-pi, pi] (offset by half a step when `shifted`) and sin(x_i).
std::pair<Tensor<float>, Tensor<float>> sine_data(std::size_t n, bool shifted) {
    auto x = Tensor<float>::uninitialized({n, 1});
    auto y = Tensor<float>::uninitialized({n, 1});
    const double step = 2 * std::numbers::pi / double(n);
    for (std::size_t i = 0; i < n; ++i) {
        const double xi = -std::numbers::pi + step * (double(i) + (shifted ? 0.5 : 0.0));
        x.data()[i] = float(xi);
        y.data()[i] = float(std::sin(xi));
    }
    return {x, y};
}

}  // namespace

int main() {
    constexpr std::size_t points = 256, hidden = 32;
    constexpr int steps = 1500;
    olmax::Generator rng(1);
    auto w1 = olmax::parameter(olmax::randn<float>({1, hidden}, rng));
    auto b1 = olmax::parameter(olmax::zeros<float>({hidden}));
    auto w2 = olmax::parameter(olmax::randn<float>({hidden, 1}, rng, 0.0f, 1.0f / std::sqrt(float(hidden))));
    auto b2 = olmax::parameter(olmax::zeros<float>({1}));
    std::vector<Tensor<float>*> params{&w1, &b1, &w2, &b2};
    std::vector<AdamState> state(params.size());

    auto model = [&](const Tensor<float>& x) { return olmax::matmul(olmax::tanh(olmax::matmul(x, w1) + b1), w2) + b2; };
    const auto [x, y] = sine_data(points, false);

    std::printf("fitting y = sin(x) with a 1-%zu-1 tanh MLP, %zu points, Adam lr 1e-2\n", hidden, points);
    float first = 0, last = 0;
    for (int step = 1; step <= steps; ++step) {
        auto loss = olmax::mean(olmax::square(model(x) - y));
        loss.backward();
        {
            olmax::autodiff::no_grad guard;
            for (std::size_t i = 0; i < params.size(); ++i) adam_step(*params[i], state[i], step, 1e-2f);
        }
        last = loss.item();
        if (step == 1) first = last;
        if (step == 1 || step % 150 == 0) std::printf("step %5d  mse %.6f\n", step, last);
    }

    const auto [x_test, y_test] = sine_data(100, true);
    olmax::autodiff::no_grad guard;
    const float test_mse = olmax::mean(olmax::square(model(x_test) - y_test)).item();
    std::printf("held-out mse %.6f (initial training mse %.6f)\n", test_mse, first);
    const bool fitted = last < 0.02f * first && test_mse < 0.02f * first;
    std::printf("%s\n", fitted ? "fit ok" : "FIT FAILED: the loss did not fall below 2% of its initial value");
    return fitted ? 0 : 1;
}
