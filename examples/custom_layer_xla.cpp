// A layer of your own, with a backward pass of your own, trained on olmax's CPU and — from the same
// code, traced once into one StableHLO program — on an XLA device through a PJRT plugin. Nothing
// here is written twice: the layer has no XLA version, the optimiser has none, the model has none.
//
//     build/examples/custom_layer_xla [PLUGIN.so] [steps]
//
// PLUGIN defaults to $OLMAX_PJRT_PLUGIN (the test set-up's XLA CPU plugin is
// .venv/lib/python3*/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so; docs/xla.md names the
// GPU and TPU plugins). It prints both loss curves side by side and exits 1 if they part by more
// than 1e-4 (relative): float32 on both sides, summed in different orders.

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <olmax/train/xla_trainer.hpp>
#include <olmax/olmax.hpp>

namespace nn = olmax::nn;
using olmax::Tensor;

/// y = c(x W) with c(z) = z^3 / 3 + z: a layer olmax does not ship, whose backward (dc/dz = z^2 + 1)
/// is written by hand with autodiff::custom_op. Traced, its forward and its backward lambda both
/// run on traced tensors: the program gets exactly this backward.
template <olmax::Real T = float>
class SoftCubeDense {
public:
    using value_type = T;
    using config_type = nn::Config;
    static constexpr std::string_view name = "soft_cube_dense";

    SoftCubeDense(const nn::Config& config, olmax::Generator& rng)
        : weight_(olmax::parameter(olmax::randn<T>({config.features, config.features}, rng, T{0}, T(0.5 / std::sqrt(double(config.features)))))) {}

    Tensor<T> forward(const Tensor<T>& x, const nn::LayerContext& = {}) const {
        const Tensor<T> z = olmax::matmul(x, weight_);
        Tensor<T> value;
        {
            olmax::autodiff::no_grad off;  // the value; its gradient is the closure below
            value = z * z * z * T(1.0 / 3.0) + z;
        }
        return olmax::autodiff::custom_op("soft_cube", value, {z}, [z](const Tensor<T>& dy, olmax::autodiff::GradientSink<T>& grads) {
            grads.add(0, dy * (z * z + T{1}));
        });
    }
    void visit_parameters(nn::ParameterVisitor<T>& visit) { visit("weight", weight_, nn::Role::weight); }

private:
    Tensor<T> weight_;
};

/// Bytes in, next byte out: embedding, the layer above, the output head.
struct TinyModel {
    using value_type = float;
    static constexpr std::string_view name = "tiny_model";

    explicit TinyModel(const nn::Config& config) : rng(config.seed), embedding(config, rng), layer(config, rng), head(config, rng) {}

    Tensor<float> loss(const olmax::data::Batch& batch) const { return head.loss(layer.forward(embedding(batch.inputs)), batch.targets); }

    void visit_parameters(nn::ParameterVisitor<float>& visit) {
        visit.child("embedding", embedding);
        visit.child("layer", layer);
        visit.child("head", head);
    }

    olmax::Generator rng;
    nn::Embedding<float> embedding;
    SoftCubeDense<float> layer;
    nn::OutputHead<float> head;
};

/// A batch of text-like bytes: a walk over a small alphabet that the model can learn.
olmax::data::Batch text(std::size_t rows, std::size_t sequence, std::uint32_t seed) {
    olmax::data::Batch b{Tensor<std::int32_t>({rows, sequence}), Tensor<std::int32_t>({rows, sequence}), Tensor<float>({rows, sequence}, 1.0f),
                         rows * sequence, 0};
    std::uint32_t state = seed;
    std::int32_t previous = 'a';
    for (std::size_t i = 0; i < rows * sequence; ++i) {
        state = state * 1664525u + 1013904223u;
        const std::int32_t next = 'a' + std::int32_t((std::uint32_t(previous) * 7u + (state >> 29)) % 12u);
        b.inputs.data()[i] = previous;
        b.targets.data()[i] = next;
        previous = next;
    }
    return b;
}

int main(int argc, char** argv) try {
    const char* env = std::getenv("OLMAX_PJRT_PLUGIN");
    const std::string plugin = argc > 1 ? argv[1] : env ? env : "";
    const int steps = argc > 2 ? std::atoi(argv[2]) : 30;
    if (plugin.empty() || steps < 1) {
        std::fprintf(stderr, "usage: custom_layer_xla PLUGIN.so [steps >= 1]   (or set OLMAX_PJRT_PLUGIN)\n");
        return 2;
    }
    nn::Config config;
    config.features = 32;
    config.depth = 1;
    config.seed = 7;
    TinyModel cpu(config), xla(config);  // the same initial parameters
    olmax::optim::AdamWConfig adam;
    adam.schedule.peak_lr = 3e-3;
    olmax::optim::AdamW<float> cpu_opt(olmax::optim::parameters_of(cpu), adam), xla_opt(olmax::optim::parameters_of(xla), adam);

    constexpr std::size_t rows = 4, sequence = 32;
    auto client = std::make_shared<olmax::xla::pjrt::client>(olmax::xla::pjrt::plugin::load(plugin));
    olmax::train::XlaTrainer<TinyModel> trainer(xla, xla_opt, client, rows, sequence);  // traced once, compiled once

    double worst = 0;
    std::printf("%5s %12s %12s\n", "step", "cpu loss", "xla loss");
    for (int step = 1; step <= steps; ++step) {
        const auto batch = text(rows, sequence, std::uint32_t(step));
        Tensor<float> loss = cpu.loss(batch);  // olmax's CPU: the eager step
        loss.backward();
        cpu_opt.step();
        cpu_opt.zero_grad();
        const double on_device = trainer.step(batch).loss;  // the same step, compiled, on the plugin's device
        worst = std::max(worst, std::abs(on_device - double(loss.item())) / double(loss.item()));
        if (step == 1 || step % 5 == 0 || step == steps) std::printf("%5d %12.6f %12.6f\n", step, double(loss.item()), on_device);
    }
    std::printf("largest relative difference of the two loss curves: %.2e (%s)\n", worst, client->platform_name().c_str());
    return worst <= 1e-4 ? 0 : 1;
} catch (const std::exception& e) {
    std::fprintf(stderr, "custom_layer_xla: %s\n", e.what());
    return 1;
}
