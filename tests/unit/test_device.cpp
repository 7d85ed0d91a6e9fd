// Devices: every tensor knows its device, ops run on their inputs' device and refuse mixed
// devices, and a whole training step of the main job's model stays on its device.
#include "test_helpers.hpp"

#include <optional>
#include <sstream>

using Catch::Matchers::Contains;
using olmax::Device;
using olmax::Shape;
using olmax::Tensor;

TEST_CASE("tensors are made on the current device and keep it through views, copies and gradients", "[device]") {
    const Device counting = olmax_test::counting().device;
    CHECK(Tensor<float>({2}).device() == Device::host());
    CHECK(olmax::current_device().is_host());
    CHECK(Device::host().name() == "cpu");
    CHECK(counting.name() == "counting");
    CHECK(Device::from_index(counting.index()) == counting);
    CHECK_THROWS_AS(Device::from_index(1u << 20), olmax::device_error);

    Tensor<double> a;
    {
        olmax::device_scope on(counting);
        CHECK(olmax::current_device() == counting);
        a = olmax::parameter(olmax::ones<double>({2, 3}));
        CHECK(Tensor<std::int32_t>({4}).device() == counting);
    }
    CHECK(olmax::current_device().is_host());  // the scope restored the host
    CHECK(a.device() == counting);
    CHECK(a.detach().device() == counting);
    CHECK(a.clone().device() == counting);
    CHECK(olmax::zeros_like(a).device() == counting);
    CHECK(olmax::cast<float>(a).device() == counting);
    CHECK(olmax::reshape(a, {3, 2}).device() == counting);

    const auto on_host = a.to(Device::host());
    CHECK(on_host.device() == Device::host());
    CHECK(std::vector<double>(on_host.begin(), on_host.end()) == std::vector<double>(6, 1.0));

    // Results of ops with no host inputs, and their gradients, are on the inputs' device.
    auto y = olmax::sum(olmax::tanh(a) * a);
    CHECK(y.device() == counting);
    y.backward();
    REQUIRE(a.grad().defined());
    CHECK(a.grad().device() == counting);

    std::ostringstream printed;
    printed << a.detach();
    CHECK_THAT(printed.str(), Contains("on counting"));
}

TEST_CASE("an op with inputs on two devices throws device_error naming both", "[device][errors]") {
    const Device counting = olmax_test::counting().device;
    const auto host = olmax::ones<float>({2, 2});
    const auto there = host.to(counting);
    CHECK_THROWS_AS(olmax::add(host, there), olmax::device_error);
    CHECK_THROWS_WITH(olmax::matmul(host, there), Contains("matmul") && Contains("cpu") && Contains("counting") && Contains(".to(device)"));
    CHECK_THROWS_WITH(olmax::concat(std::vector<Tensor<float>>{there, there, host}, 0),
                      Contains("concat") && Contains("input 0 on counting") && Contains("input 2 on cpu"));
    const auto ids = Tensor<std::int32_t>({2}, 0);
    CHECK_THROWS_AS(olmax::embedding(there, ids), olmax::device_error);  // integer ids count too
    CHECK_NOTHROW(olmax::embedding(there, ids.to(counting)));
    // A gradient computed on another device than its tensor is refused, not silently added.
    auto w = olmax::parameter(olmax::ones<double>({3}).to(counting));
    CHECK_THROWS_AS(olmax::sum(w).backward(olmax::Tensor<double>::scalar(1.0)), olmax::device_error);
    // ... also when the gradient is a temporary whose buffer would be adopted rather than copied.
    auto misplaced = olmax::autodiff::custom_op("misplaced", olmax::square(w.detach()), {w},
                                                [](const Tensor<double>&, olmax::autodiff::GradientSink<double>& g) {
                                                    g.add(0, Tensor<double>({3}, 1.0).to(Device::host()));
                                                });
    CHECK_THROWS_WITH(olmax::sum(misplaced).backward(), Contains("misplaced") && Contains("on device cpu") && Contains("counting"));
}

TEST_CASE("backend::register_device refuses null kernels; kernels_for finds each device's kernels", "[device]") {
    CHECK_THROWS_AS(olmax::backend::register_device("broken", nullptr), olmax::device_error);
    CHECK(olmax::backend::kernels_for(Device::host()).name() == olmax::backend::host_kernels().name());
    CHECK(olmax::backend::kernels_for(olmax_test::counting().device).name() == "counting");
}

TEST_CASE("a parallel loop hands its caller's device and host kernels to the threads that run its chunks", "[device][backend]") {
    olmax_test::ForceThreading force;
    const Device counting = olmax_test::counting().device;
    olmax::backend::host_kernels_scope serial(olmax::backend::kernels<olmax::backend::cpu_serial>());
    olmax::device_scope on(counting);
    std::atomic<int> wrong{0};
    olmax::backend::kernels<olmax::backend::cpu_openmp>().parallel_for(64, 1, [&](std::size_t, std::size_t) {
        if (olmax::current_device() != counting || olmax::backend::host_kernels().name() != "cpu_serial") ++wrong;
    });
    CHECK(wrong == 0);
}

namespace {

/// A small main-job configuration: the real model (embedding, reversible stack, output head with
/// chunked cross-entropy) at test size, with AGC and global-norm clipping on.
olmax::train::TrainConfig tiny_config() {
    olmax::train::TrainConfig c;
    c.features = 8;
    c.depth = 2;
    c.batch = 2;
    c.sequence = 32;
    c.agc_clip = 0.01;
    c.max_grad_norm = 1.0;
    return c;
}

olmax::data::Batch tiny_batch(const olmax::train::TrainConfig& c) {
    const Shape shape{std::size_t(c.batch), std::size_t(c.sequence)};
    olmax::data::Batch b;
    b.inputs = Tensor<std::int32_t>(shape);
    b.targets = Tensor<std::int32_t>(shape);
    b.mask = Tensor<float>(shape, 1.0f);
    for (std::size_t i = 0; i < b.inputs.size(); ++i) {
        b.inputs.data()[i] = std::int32_t((i * 37 + 11) % 256);
        b.targets.data()[i] = std::int32_t((i * 53 + 7) % 256);
    }
    b.real_targets = b.inputs.size();
    return b;
}

olmax::data::Batch batch_on(const olmax::data::Batch& b, Device device) {
    return {b.inputs.to(device), b.targets.to(device), b.mask.to(device), b.real_targets, b.epoch};
}

struct StepResult {
    double loss;
    std::vector<Tensor<float>> parameters;
};

/// Builds the model on `device`, runs two training steps (forward, backward, AGC, clipping, AdamW)
/// with `shards` data-parallel shards, and returns the losses and final parameters.
StepResult train_on(Device device, std::size_t shards) {
    const auto c = tiny_config();
    std::optional<olmax::models::ByteLM<>> model;
    {
        olmax::device_scope on(device);  // the model's parameters are made here; everything after
        model.emplace(c);                // runs on the host's scope and must follow the tensors
    }
    olmax::optim::AdamW<float> adam(model->parameters(), olmax::train::optimizer_config(c));
    const auto batch = batch_on(tiny_batch(c), device);
    double loss = 0;
    for (int step = 0; step < 2; ++step) {
        adam.zero_grad();
        loss = model->accumulate_gradients(batch, shards, 1.0);
        adam.step();
    }
    StepResult r{loss, {}};
    for (const auto& p : model->parameters()) r.parameters.push_back(p.tensor);
    for (const auto& s : adam.export_state().slots) CHECK(s.first_moment.device() == device);
    return r;
}

}  // namespace

TEST_CASE("a training step of the main job's model runs entirely on its device; the host computes nothing", "[device][nn][optim]") {
    const auto& counting = olmax_test::counting();
    const StepResult reference = olmax_test::with_kernels<olmax::backend::cpu_serial>([] { return train_on(Device::host(), 1); });
    for (std::size_t shards : {std::size_t{1}, std::size_t{2}}) {
        INFO(shards << " data-parallel shard(s)");
        const std::size_t before = counting.kernels->calls(), gemms_before = counting.kernels->gemms;
        olmax_test::refusing_kernels refusing;  // any primitive that reaches the host throws
        const StepResult there = [&] {
            olmax::backend::host_kernels_scope host(refusing);
            return train_on(counting.device, shards);
        }();
        CHECK(counting.kernels->calls() > before + 100);  // hundreds of loops, GEMMs and sums reached the device
        CHECK(counting.kernels->gemms > gemms_before);
        REQUIRE(there.parameters.size() == reference.parameters.size());
        for (std::size_t i = 0; i < there.parameters.size(); ++i) {
            CHECK(there.parameters[i].device() == counting.device);
            CHECK(there.parameters[i].grad().device() == counting.device);
        }
        if (shards == 1) {
            // The counting device computes with cpu_serial, so the step is the host's, bit for bit.
            CHECK(there.loss == reference.loss);
            for (std::size_t i = 0; i < there.parameters.size(); ++i) CHECK(olmax_test::max_abs_diff(there.parameters[i], reference.parameters[i]) == 0);
        } else {
            CHECK(there.loss == Approx(reference.loss).epsilon(1e-5));
        }
    }
}
