// One definition, every device: a model written only as eager olmax code (ops, a custom op with a
// hand-written backward, optim::AdamW) is traced into one StableHLO training step (olmax/trace/) and
// run on the real OpenXLA CPU plugin, and it must train exactly as the same code does on olmax's CPU:
// the losses and the parameters after several AdamW steps agree within float32 re-association. No
// layer or optimiser here has a second, traced definition.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <olmax/xla/pjrt_runtime.hpp>
#include <olmax/olmax.hpp>
#include <olmax/train/xla_trainer.hpp>
#include <olmax/trace/native_calls.hpp>
#include <olmax/trace/program.hpp>
#include <olmax/trace/trace.hpp>

#include "test_helpers.hpp"
#include "unruled_op.hpp"
#include "xla/cpu_plugin.hpp"
#include "xla/text_batch.hpp"

namespace {

using olmax::Tensor;
namespace trace = olmax::trace;

/// A user's layer with its own backward (not shipped by olmax): y = x^3 / 3 + x, dy/dx = x^2 + 1.
Tensor<float> soft_cube(const Tensor<float>& x) {
    Tensor<float> value;
    {
        olmax::autodiff::no_grad off;
        value = x * x * x * (1.0f / 3.0f) + x;
    }
    return olmax::autodiff::custom_op("soft_cube", value, {x}, [x](const Tensor<float>& dy, olmax::autodiff::GradientSink<float>& g) {
        g.add(0, dy * (x * x + 1.0f));
    });
}

/// A small byte-level model: embedding -> linear + bias -> tanh -> soft_cube -> linear -> loss.
struct TinyLM {
    Tensor<float> embed, w1, b1, w2;
    explicit TinyLM(std::uint64_t seed) {
        olmax::Generator rng(seed);
        embed = olmax::parameter(olmax::randn<float>({16, 8}, rng) * 0.5f);
        w1 = olmax::parameter(olmax::randn<float>({8, 12}, rng) * 0.3f);
        b1 = olmax::parameter(olmax::zeros<float>({12}));
        w2 = olmax::parameter(olmax::randn<float>({12, 16}, rng) * 0.3f);
    }
    Tensor<float> loss(const Tensor<std::int32_t>& ids, const Tensor<std::int32_t>& targets) const {
        const std::size_t n = ids.size();
        Tensor<float> h = olmax::reshape(olmax::embedding(embed, ids), {n, 8});
        h = soft_cube(olmax::tanh(olmax::add(olmax::matmul(h, w1), b1)));
        return olmax::cross_entropy(olmax::matmul(h, w2), targets);  // targets: [n]
    }
    std::vector<olmax::optim::Parameter<float>> parameters() {
        using olmax::nn::Role;
        return {{"embed", Role::embedding, embed}, {"w1", Role::weight, w1}, {"b1", Role::bias, b1}, {"w2", Role::weight, w2}};
    }
};

olmax::optim::AdamWConfig traced_adam_config() {
    olmax::optim::AdamWConfig c;
    c.schedule = olmax::optim::LrSchedule{3e-2, 2, 1e-2, -1, 0.0};
    c.weight_decay = 0.01;
    c.max_grad_norm = 1.0;
    // Adam turns a gradient of pure rounding noise (a weight whose true gradient is 0) into a whole
    // step of either sign, so with eps = 1e-8 the two runs can part at a discrete step: the conv/mixer
    // model at depth 3 agreed within 2e-7 for three steps, then 1e-3 apart, on an AMD EPYC (Zen 5).
    // With eps = 1e-5 noise stays noise: the same runs agree within 2e-7 over all ten steps.
    c.eps = 1e-5;
    return c;
}

void batch(std::size_t step, Tensor<std::int32_t>& ids, Tensor<std::int32_t>& targets) {
    for (std::size_t i = 0; i < ids.size(); ++i) {
        ids.data()[i] = std::int32_t((i * 7 + step * 3) % 16);
        targets.data()[i] = std::int32_t((i * 7 + step * 3 + 1) % 16);
    }
}

}  // namespace

TEST_CASE("an eager model with a custom op and AdamW, traced once, trains on the CPU plugin as on olmax's CPU", "[cpu_plugin]") {
    auto client = olmax_test::cpu_client();
    constexpr std::size_t rows = 2, sequence = 6, steps = 4;

    TinyLM eager(7), traced(7);
    olmax::optim::AdamW<float> eager_opt(eager.parameters(), traced_adam_config()), traced_opt(traced.parameters(), traced_adam_config());

    // The traced step: the same calls as the eager loop below, once, on traced tensors.
    trace::traced_program program;
    {
        trace::tracing t;
        for (auto& p : traced.parameters()) t.bind_state(p.tensor);
        traced_opt.for_each_moment([&](const auto& m) { t.bind_state(m); });
        auto ids = t.input<std::int32_t>({rows, sequence});
        auto targets = t.input<std::int32_t>({rows * sequence});
        Tensor<float> loss = traced.loss(ids, targets);
        loss.backward();
        traced_opt.step();
        traced_opt.zero_grad();
        program = t.finish({loss});
    }
    REQUIRE(traced.w1.traced() == false);  // the host buffers are back
    trace::compiled_program device(client, std::move(program));

    Tensor<std::int32_t> ids({rows, sequence}), targets({rows * sequence});
    for (std::size_t step = 0; step < steps; ++step) {
        batch(step, ids, targets);
        Tensor<float> loss = eager.loss(ids, targets);
        loss.backward();
        eager_opt.step();
        eager_opt.zero_grad();
        const auto reported = device.run({trace::input_values(ids), trace::input_values(targets)});
        INFO("step " << step << ": olmax CPU " << loss.item() << ", traced on XLA " << reported[0][0]);
        CHECK(reported[0][0] == Approx(loss.item()).epsilon(1e-5));
    }
    CHECK(traced_opt.step_count() == std::int64_t(steps));
    device.download();
    auto pe = eager.parameters(), pt = traced.parameters();
    for (std::size_t i = 0; i < pe.size(); ++i)
        for (std::size_t e = 0; e < pe[i].tensor.size(); ++e) {
            INFO(pe[i].name << "[" << e << "]");
            CHECK(pt[i].tensor.data()[e] == Approx(pe[i].tensor.data()[e]).margin(2e-5));
        }
}

TEST_CASE("tracing refuses what it cannot lower, naming the op") {
    trace::tracing t;
    auto x = t.input<float>({3});
    SECTION("an op without a lowering rule") {
        CHECK_THROWS_WITH(olmax_test::hardtanh(x), Catch::Contains("my_hardtanh") && Catch::Contains("lowering rule"));
    }
    SECTION("code that reads the elements of a traced tensor") {
        CHECK_THROWS_AS(t.input<float>({1}).item(), olmax::trace_error);
        CHECK_THROWS_WITH(x.data(), Catch::Contains("traced tensor of shape [3]"));
    }
    SECTION("a double model") {
        auto d = t.input<double>({3});
        CHECK_THROWS_WITH(olmax::tanh(d), Catch::Contains("float32"));
    }
}

namespace {

using ConvLM = olmax::models::ByteLM<olmax::models::ConvMixer, float>;

using olmax_test::text_batch;

}  // namespace

TEST_CASE("the main job's model (reversible conv/mixer stack) traced from its eager code trains on the CPU plugin as on olmax's CPU",
          "[cpu_plugin]") {
    auto client = olmax_test::cpu_client();
    constexpr std::size_t rows = 2, sequence = 32, steps = 10;
    const std::size_t depth = GENERATE(1, 3);  // depth 3 at S = 32: mixer modes 0, 1, 0 (one loop of 2, one layer after it)
    const olmax::models::ByteLMConfig config{16, depth, 5};
    ConvLM eager(config), traced(config);
    olmax::optim::AdamW<float> eager_opt(eager.parameters(), traced_adam_config()), traced_opt(traced.parameters(), traced_adam_config());

    trace::traced_program program;
    {
        trace::tracing t;
        for (auto& p : traced.parameters()) t.bind_state(p.tensor);
        traced_opt.for_each_moment([&](const auto& m) { t.bind_state(m); });
        olmax::data::Batch b{t.input<std::int32_t>({rows, sequence}), t.input<std::int32_t>({rows, sequence}), Tensor<float>(), rows * sequence, 0};
        Tensor<float> loss = traced.loss(b);
        loss.backward();
        traced_opt.step();
        traced_opt.zero_grad();
        program = t.finish({loss});
    }
    // One loop in the module, whatever the depth: the layers are not unrolled.
    // The forward loop and its reverse (depth 1: one layer after an empty loop, none).
    CHECK(olmax_test::count_of(program.module.text, "stablehlo.while") == (depth >= 2 ? 2u : 0u));
    trace::compiled_program device(client, std::move(program));

    float first = 0, last = 0;
    for (std::size_t step = 0; step < steps; ++step) {
        const auto b = text_batch(rows, sequence, std::uint32_t(step + 1));
        Tensor<float> loss = eager.loss(b);
        loss.backward();
        eager_opt.step();
        eager_opt.zero_grad();
        const auto reported = device.run({trace::input_values(b.inputs), trace::input_values(b.targets)});
        INFO("depth " << depth << " step " << step << ": olmax CPU " << loss.item() << ", traced on XLA " << reported[0][0]);
        CHECK(reported[0][0] == Approx(loss.item()).epsilon(1e-4));
        if (step == 0) first = reported[0][0];
        last = reported[0][0];
    }
    CHECK(last < first);  // it learns
    device.download();
    double diff = 0, moved = 0;
    const auto pe = eager.parameters(), pt = traced.parameters();
    ConvLM start(config);
    const auto ps = start.parameters();
    for (std::size_t i = 0; i < pe.size(); ++i)
        for (std::size_t e = 0; e < pe[i].tensor.size(); ++e) {
            const double x = pe[i].tensor.data()[e], y = pt[i].tensor.data()[e], s = ps[i].tensor.data()[e];
            diff += (x - y) * (x - y);
            moved += (x - s) * (x - s);
        }
    // Adam's first steps are sign-like (m / sqrt(v) = +-1), so a near-zero gradient whose sign the two
    // runs round differently moves its weight a whole step apart (tests/xla/test_model_step.cpp).
    INFO("relative difference of the updates: " << std::sqrt(diff / moved));
    CHECK(std::sqrt(diff / moved) < 1e-2);
}

namespace {

/// ByteLM<Recipe> trained `steps` steps on olmax's CPU and, through XlaTrainer (its eager step traced
/// once), on the CPU plugin: every step's loss within 1e-4 relative; returns the plugin's first and
/// last loss.
template <class Recipe>
std::pair<double, double> trains_like_the_cpu(std::size_t rows, std::size_t sequence, std::size_t steps, std::uint32_t seed) {
    auto client = olmax_test::cpu_client();
    using LM = olmax::models::ByteLM<Recipe, float>;
    const olmax::models::ByteLMConfig config{16, 2, 3};
    LM eager(config), traced(config);
    olmax::optim::AdamW<float> eager_opt(eager.parameters(), traced_adam_config()), traced_opt(traced.parameters(), traced_adam_config());
    olmax::train::XlaTrainer<LM> trainer(traced, traced_opt, client, rows, sequence);
    double first = 0, last = 0;
    for (std::size_t step = 0; step < steps; ++step) {
        const auto b = text_batch(rows, sequence, std::uint32_t(step) + seed);
        Tensor<float> loss = eager.loss(b);
        loss.backward();
        eager_opt.step();
        eager_opt.zero_grad();
        const double reported = trainer.step(b).loss;
        INFO(Recipe::key << " step " << step << ": olmax CPU " << loss.item() << ", traced on XLA " << reported);
        CHECK(reported == Approx(loss.item()).epsilon(1e-4));
        if (step == 0) first = reported;
        last = reported;
    }
    return {first, last};
}

}  // namespace

TEST_CASE("the QRNN model traced from its eager code trains on the CPU plugin as on olmax's CPU", "[cpu_plugin]") {
    const auto [first, last] = trains_like_the_cpu<olmax::models::QrnnMlp>(2, 16, 10, 7);
    CHECK(last < first);
}

TEST_CASE("the Mamba model traced from its eager code trains on the CPU plugin as on olmax's CPU", "[cpu_plugin]") {
    trains_like_the_cpu<olmax::models::Mamba>(2, 16, 5, 3);
}

namespace {

/// f's value and its gradients with respect to `inputs`, on olmax's CPU (eager) and as one traced
/// program run on the CPU plugin; checks they agree within `tolerance` (relative to the largest).
/// With `native_calls` the program calls olmax's own CPU kernels where it can (and must: the
/// checked module text then holds a custom call of `native_call`), else it holds none.
template <class F>
void check_traced_matches(const std::vector<Tensor<float>>& inputs, F f, double tolerance, bool native_calls = false,
                          std::string_view native_call = olmax::xla::stablehlo::native_call::selective_scan) {
    auto client = olmax_test::cpu_client();
    if (native_calls) REQUIRE(trace::enable_native_calls(*client));
    std::vector<Tensor<float>> leaves;
    for (const auto& x : inputs) leaves.push_back(olmax::parameter(x.clone()));
    Tensor<float> value = f(leaves);
    value.backward();
    trace::traced_program program;
    {
        trace::tracing t;
        t.set_target(client->platform_name());
        t.set_native_calls(native_calls);
        std::vector<Tensor<float>> traced;
        for (const auto& x : inputs) traced.push_back(t.input<float>(x.shape()).set_requires_grad(true));
        Tensor<float> loss = f(traced);
        loss.backward();
        std::vector<Tensor<float>> results{loss};
        for (const auto& x : traced) results.push_back(x.grad());
        program = t.finish(results);
    }
    CHECK((program.module.text.find("\"" + std::string(native_call) + "\"") != std::string::npos) == native_calls);
    trace::compiled_program device(client, std::move(program));
    std::vector<std::vector<float>> values;
    for (const auto& x : inputs) values.push_back(trace::input_values(x));
    const auto out = device.run(values);
    CHECK(out[0][0] == Approx(value.item()).epsilon(tolerance));
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        const Tensor<float> g = leaves[i].grad();
        double scale = 0, worst = 0;
        for (std::size_t e = 0; e < g.size(); ++e) scale = std::max(scale, double(std::abs(g.data()[e])));
        for (std::size_t e = 0; e < g.size(); ++e) worst = std::max(worst, double(std::abs(out[1 + i][e] - g.data()[e])));
        INFO("input " << i << ": largest gradient " << scale << ", largest difference " << worst);
        CHECK(worst <= tolerance * scale);
    }
}

}  // namespace

TEST_CASE("Mamba's selective scan with document resets and a carried state traces to the eager op's values and gradients", "[cpu_plugin]") {
    olmax::Generator rng(11);
    const std::size_t B = 2, T = 7, E = 3, N = 4;
    Tensor<float> resets({B, T});
    resets(0, 3) = 1;
    resets(1, 0) = 1;
    resets(1, 5) = 1;
    const std::vector<Tensor<float>> inputs{olmax::randn<float>({B, T, E}, rng),
                                            olmax::rand<float>({B, T, E}, rng, 0.1f, 0.9f),
                                            olmax::rand<float>({E, N}, rng, -1.5f, -0.2f),
                                            olmax::randn<float>({B, T, N}, rng),
                                            olmax::randn<float>({B, T, N}, rng),
                                            olmax::randn<float>({E}, rng),
                                            olmax::randn<float>({B, E, N}, rng)};
    const Tensor<float> weights = olmax::randn<float>({B, T, E}, rng);
    const auto loss = [&](const std::vector<Tensor<float>>& x) {
        const auto s = olmax::scan::selective_scan(x[0], x[1], x[2], x[3], x[4], x[5], {.h0 = x[6], .resets = resets});
        return olmax::sum(s.y * weights) + olmax::sum(s.h_last);
    };
    SECTION("as loops over time") { check_traced_matches(inputs, loss, 1e-4); }
    SECTION("as olmax's own CPU kernels (native calls)") {
        // the same kernels as the eager op, on the plugin's buffers: the same sums in the same order
        check_traced_matches(inputs, loss, 1e-6, true);
        check_traced_matches(inputs, loss, 1e-6, true, olmax::xla::stablehlo::native_call::selective_scan_backward);
    }
}

TEST_CASE("a native call refuses a malformed call with an error naming it, not a crash", "[cpu_plugin]") {
    // A custom call of the selective scan whose A is [E, N + 1]: the handler checks every shape and
    // returns an XLA error, which the run throws as a pjrt_error.
    auto client = olmax_test::cpu_client();
    REQUIRE(olmax::trace::enable_native_calls(*client));
    namespace sh = olmax::xla::stablehlo;
    const std::int64_t B = 1, T = 4, E = 2, N = 3;
    sh::function_builder b({sh::f32({B, T, E}), sh::f32({B, T, E}), sh::f32({E, N + 1}), sh::f32({B, T, N}), sh::f32({B, T, N}),
                            sh::f32({B, T}), sh::f32({B, E, N})});
    std::vector<sh::value> in(b.args().begin(), b.args().end());
    const auto out = b.custom_call(sh::native_call::selective_scan, in, {sh::f32({B, T, E}), sh::f32({B, E, N}), sh::f32({B, 2, E, N})},
                                   {{"chunk", 2}});
    sh::emitted_module m;
    m.key = "malformed_native_call";
    m.text = b.finish("malformed", {out[0]});
    for (std::size_t i = 0; i < 7; ++i) m.inputs.push_back(b.arg(i).type);
    m.outputs = {out[0].type};
    std::vector<std::vector<float>> values;
    for (const auto& t : m.inputs) values.emplace_back(std::size_t(t.elements()), 0.5f);
    std::vector<const float*> pointers;
    for (const auto& v : values) pointers.push_back(v.data());
    CHECK_THROWS_WITH(client->run(m, pointers), Catch::Contains("olmax native call olmax_selective_scan") && Catch::Contains("wrong shape"));
}

TEST_CASE("the Mamba layer with document resets traces to the eager layer's values and input gradients", "[cpu_plugin]") {
    olmax::Generator rng(12);
    const olmax::nn::SelectiveSSM<float> layer(olmax::nn::SelectiveSSMConfig{.features = 8}, rng);
    Tensor<float> resets({2, 9});
    resets(0, 4) = 1;
    resets(1, 1) = 1;
    resets(1, 2) = 1;
    const Tensor<float> weights = olmax::randn<float>({2, 9, 8}, rng);
    check_traced_matches({olmax::randn<float>({2, 9, 8}, rng)},
                         [&](const std::vector<Tensor<float>>& x) { return olmax::sum(layer.forward(x[0], resets) * weights); }, 1e-4);
}


TEST_CASE("the 2026 mixers' ops trace to their eager values and gradients on the CPU plugin", "[cpu_plugin][mixers]") {
    olmax::Generator rng(21);
    const std::size_t B = 2, T = 11, H = 2;
    Tensor<float> resets({B, T});
    resets(0, 4) = 1;
    resets(1, 8) = 1;
    SECTION("causal attention, a window and resets") {
        const std::vector<Tensor<float>> inputs{olmax::randn<float>({B, T, H, 4}, rng), olmax::randn<float>({B, T, H, 4}, rng),
                                                olmax::randn<float>({B, T, H, 4}, rng)};
        const Tensor<float> weights = olmax::randn<float>({B, T, H, 4}, rng);
        check_traced_matches(inputs, [&](const std::vector<Tensor<float>>& x) {
            return olmax::sum(olmax::causal_attention(x[0], x[1], x[2], {.window = 6, .resets = resets}) * weights);
        }, 1e-4);
    }
    SECTION("Mamba-2's SSD, chunks of 4, h0 and resets") {
        const std::vector<Tensor<float>> inputs{olmax::randn<float>({B, T, H, 3}, rng), olmax::rand<float>({B, T, H}, rng, 0.1f, 0.9f),
                                                olmax::rand<float>({H}, rng, -1.5f, -0.2f),   olmax::randn<float>({B, T, 1, 4}, rng),
                                                olmax::randn<float>({B, T, 1, 4}, rng),        olmax::randn<float>({H}, rng),
                                                olmax::randn<float>({B, H, 3, 4}, rng)};
        const Tensor<float> weights = olmax::randn<float>({B, T, H, 3}, rng);
        check_traced_matches(inputs, [&](const std::vector<Tensor<float>>& x) {
            const auto s = olmax::scan::ssd(x[0], x[1], x[2], x[3], x[4], x[5], {.h0 = x[6], .resets = resets, .chunk = 4});
            return olmax::sum(s.y * weights) + olmax::sum(s.h_last);
        }, 1e-4);
    }
    SECTION("the gated delta rule, chunks of 4, h0 and resets") {
        auto unit_rows = [&](const Tensor<float>& x) { return x / olmax::sqrt(olmax::sum(x * x, {-1}, true)); };
        const std::vector<Tensor<float>> inputs{olmax::randn<float>({B, T, H, 3}, rng), unit_rows(olmax::randn<float>({B, T, H, 3}, rng)),
                                                olmax::randn<float>({B, T, H, 5}, rng), olmax::rand<float>({B, T, H}, rng, -1.0f, -0.05f),
                                                olmax::rand<float>({B, T, H}, rng, 0.1f, 0.9f), olmax::randn<float>({B, H, 3, 5}, rng)};
        const Tensor<float> weights = olmax::randn<float>({B, T, H, 5}, rng);
        check_traced_matches(inputs, [&](const std::vector<Tensor<float>>& x) {
            const auto s = olmax::scan::gated_delta_rule(x[0], x[1], x[2], x[3], x[4], x[5], resets, {.chunk = 4});
            return olmax::sum(s.o * weights) + olmax::sum(s.state);
        }, 1e-4);
    }
    SECTION("the gated delta rule with alike keys over one chunk of 64") {
        // Every key nearly the same unit vector and beta 0.9: A = strict_tril(beta K K^T . Gamma) is near a
        // triangle of equal entries, whose power series cancels terms of ~1e9 in float; the traced
        // form's block substitution must stay within float rounding of the eager solve.
        const std::size_t T64 = 64;
        Tensor<float> keys = olmax::full<float>({1, T64, 1, 4}, 0.5f) + olmax::randn<float>({1, T64, 1, 4}, rng) * 0.01f;
        keys = keys / olmax::sqrt(olmax::sum(keys * keys, {-1}, true));
        const std::vector<Tensor<float>> inputs{olmax::randn<float>({1, T64, 1, 4}, rng), keys, olmax::randn<float>({1, T64, 1, 4}, rng),
                                                olmax::full<float>({1, T64, 1}, -0.01f), olmax::full<float>({1, T64, 1}, 0.9f)};
        const Tensor<float> weights = olmax::randn<float>({1, T64, 1, 4}, rng);
        check_traced_matches(inputs, [&](const std::vector<Tensor<float>>& x) {
            const auto s = olmax::scan::gated_delta_rule(x[0], x[1], x[2], x[3], x[4], Tensor<float>(), Tensor<float>(), {.chunk = 64});
            return olmax::sum(s.o * weights) + olmax::sum(s.state);
        }, 1e-4);
    }
}

TEST_CASE("the 2026 mixers' layers trace to their eager values and input gradients on the CPU plugin", "[cpu_plugin][mixers]") {
    olmax::Generator rng(22);
    const std::size_t B = 2, T = 19, F = 16;
    const Tensor<float> weights = olmax::randn<float>({B, T, F}, rng);
    const auto loss_of = [&](const auto& layer) {
        return [&](const std::vector<Tensor<float>>& x) { return olmax::sum(layer.forward(x[0]) * weights); };
    };
    olmax::nn::Config config;
    config.features = F;
    SECTION("nn::Mamba2") { check_traced_matches({olmax::randn<float>({B, T, F}, rng)}, loss_of(olmax::nn::Mamba2<float>(config, rng)), 1e-4); }
    SECTION("nn::GatedDeltaNet") {
        check_traced_matches({olmax::randn<float>({B, T, F}, rng)}, loss_of(olmax::nn::GatedDeltaNet<float>(config, rng)), 1e-4);
    }
    SECTION("nn::CausalSelfAttention") {
        check_traced_matches({olmax::randn<float>({B, T, F}, rng)}, loss_of(olmax::nn::CausalSelfAttention<float>(config, rng)), 1e-4);
    }
}
