#include <olmax/olmax.hpp>

#include <cstdio>

namespace nn = olmax::nn;
namespace scan = olmax::scan;

int main() {
    // Two reversible blocks, each a QRNN (its recurrence runs on the scan engine) coupled with a
    // linear layer; backward rebuilds their activations from the outputs instead of storing them.
    using Block = nn::Reversible<nn::QRNNBlock<scan::sequential_vectorized>, nn::Sandwich<nn::Linear<float>>>;
    olmax::Generator rng(0);
    nn::Stack<Block> model(nn::Config{.features = 16, .depth = 2}, rng);
    olmax::optim::AdamW<float> optimizer(olmax::optim::parameters_of(model), /*lr=*/1e-2);

    // Learn y_t = 0.9 y_{t-1} + x_t on 16 channels (a leaky running sum: itself a scan).
    const auto x = olmax::randn<float>({8, 32, 16}, rng);
    const auto y = scan::scan<scan::sequential>(olmax::full<float>(x.shape(), 0.9f), x);
    float first = 0, last = 0;
    for (int step = 1; step <= 200; ++step) {
        const auto prediction = nn::merge_streams(model.forward(nn::two_streams(x)));  // [2, 8, 32, 16] state inside
        auto loss = olmax::mean(olmax::square(prediction - y));
        loss.backward();  // fills the parameters' grad()
        optimizer.step();
        optimizer.zero_grad();
        last = loss.item();
        if (step == 1) first = last;
        if (step == 1 || step % 40 == 0) std::printf("step %3d  loss %.4f\n", step, last);
    }
    return last < first / 10 ? 0 : 1;  // a smoke test in CI: the loss must fall tenfold
}
