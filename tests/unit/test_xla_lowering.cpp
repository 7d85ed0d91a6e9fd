// The layers' lowering rules (nn/lowering.hpp) and the traced training step of the main job's
// model (models/xla_training_step.hpp) against the eager library, both in double precision: the
// traced loss, every parameter's gradient and two AdamW steps must equal what ByteLM's eager
// forward, its tape and optim::AdamW compute. Running the step on a real PJRT plugin is in
// tests/xla/test_model_step.cpp.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <olmax/backend/xla/graph/emit.hpp>
#include <olmax/backend/xla/graph/evaluate.hpp>
#include <olmax/backend/xla/graph/gradients.hpp>
#include <olmax/models/xla_training_step.hpp>
#include <olmax/olmax.hpp>

namespace gx = olmax::xla::graph;
using gx::f32;
using gx::var;

namespace {

using Model = olmax::models::ByteLM<olmax::models::ConvMixer, double>;

struct tokens {
    olmax::Tensor<std::int32_t> ids, targets;
};

tokens random_tokens(std::size_t batch, std::size_t sequence, std::uint32_t seed) {
    tokens t{olmax::Tensor<std::int32_t>({batch, sequence}), olmax::Tensor<std::int32_t>({batch, sequence})};
    std::uint32_t state = seed;
    for (std::size_t i = 0; i < batch * sequence; ++i) {
        state = state * 1664525u + 1013904223u;
        t.ids.data()[i] = std::int32_t(state >> 24);
        t.targets.data()[i] = std::int32_t((state >> 16) & 255u);
    }
    return t;
}

gx::host_value host(const olmax::Tensor<double>& t) {
    return {f32(gx::dims_t(t.shape().begin(), t.shape().end())), std::vector<double>(t.data(), t.data() + t.size())};
}
gx::host_value host(const olmax::Tensor<std::int32_t>& t) {
    return {f32(gx::dims_t(t.shape().begin(), t.shape().end())), std::vector<double>(t.data(), t.data() + t.size())};
}

double worst_relative(const std::vector<double>& a, const double* b, std::size_t n) {
    REQUIRE(a.size() == n);
    double scale = 0, worst = 0;
    for (std::size_t i = 0; i < n; ++i) scale = std::max(scale, std::abs(b[i]));
    for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(scale, 1e-300));
    return worst;
}

/// The traced loss pair and gradients of `model` evaluated in double on `batch`.
struct traced_result {
    double loss = 0, objective = 0;
    std::vector<gx::host_value> grads;
};

/// Every parameter of `parameters` as an input of `g`: the values, the names a lowering looks them up
/// by, and their host values (the first inputs of an evaluation).
struct traced_parameters {
    std::vector<var> values;
    std::shared_ptr<gx::lowering::parameter_map> names = std::make_shared<gx::lowering::parameter_map>();
    std::vector<gx::host_value> inputs;
};
traced_parameters trace_parameters(gx::graph& g, const std::vector<olmax::optim::Parameter<double>>& parameters) {
    traced_parameters t;
    for (const auto& p : parameters) {
        t.values.push_back(g.input(host(p.tensor).type));
        (*t.names)[p.name] = t.values.back();
        t.inputs.push_back(host(p.tensor));
    }
    return t;
}

template <class AnyModel>
traced_result trace_and_evaluate(AnyModel& model, const tokens& batch) {
    gx::graph g;
    auto [params, names, inputs] = trace_parameters(g, model.parameters());
    const var ids = g.input(host(batch.ids).type), targets = g.input(host(batch.targets).type);
    inputs.push_back(host(batch.ids));
    inputs.push_back(host(batch.targets));
    const auto [loss, objective] = model.lower_loss(gx::lowering(names), ids, targets);
    std::vector<var> wanted{loss, objective};
    const auto grads = gx::gradients(objective, params);
    wanted.insert(wanted.end(), grads.begin(), grads.end());
    const auto r = gx::evaluate(g, inputs, wanted);
    return {r[0].data[0], r[1].data[0], std::vector<gx::host_value>(r.begin() + 2, r.end())};
}

constexpr double tolerance = 1e-10;  // double precision on both sides: only the summation orders differ

/// The traced loss and every gradient of ByteLM<Recipe, double> against the eager model.
template <class Recipe>
void check_against_eager(std::size_t depth, std::size_t sequence) {
    INFO(Recipe::key << ", depth " << depth);
    olmax::models::ByteLM<Recipe, double> model(olmax::models::ByteLMConfig{8, depth, 11});
    const tokens batch = random_tokens(2, sequence, 5);
    const auto traced = trace_and_evaluate(model, batch);

    olmax::autodiff::tape_scope tape;
    const auto hidden = model.hidden(batch.ids);
    auto loss = model.head.loss(hidden, batch.targets);
    CHECK(std::abs(traced.loss - loss.item()) < tolerance * std::abs(loss.item()));
    CHECK(traced.objective > traced.loss);  // the z-loss term is in the differentiated value only
    loss.backward();
    const auto parameters = model.parameters();
    REQUIRE(traced.grads.size() == parameters.size());
    for (std::size_t i = 0; i < parameters.size(); ++i) {
        INFO(parameters[i].name);
        const auto grad = parameters[i].tensor.grad();
        REQUIRE(grad.defined());
        CHECK(worst_relative(traced.grads[i].data, grad.data(), grad.size()) < 1e-9);
    }
}

}  // namespace

TEST_CASE("xla lowering: ByteLM<ConvMixer>'s traced loss and gradients equal the eager model's", "[xla_lowering]") {
    // S = 32 with the mixer's chunk 16 gives two mixing modes (strides 1 and 2): depth 3 runs modes
    // 0, 1, 0, so the traced mode selection inside the layer loop is exercised.
    for (std::size_t depth : {1, 3}) check_against_eager<olmax::models::ConvMixer>(depth, 32);
}

TEST_CASE("xla lowering: ByteLM<QrnnMlp> (the QRNN's scan as the linear_scan primitive) equals the eager model", "[xla_lowering]") {
    check_against_eager<olmax::models::QrnnMlp>(2, 13);  // 13 steps: not a multiple of a chunk or a power of two
    gx::graph g;  // linear_scan itself, on a length that is not a power of two
    const var a = g.input(f32({2, 5})), x = g.input(f32({2, 5}));
    const auto r = gx::evaluate(g, {{f32({2, 5}), {0.5, 0.5, 0.5, 0.5, 0.5, 1, 2, 0, 1, 1}}, {f32({2, 5}), {1, 1, 1, 1, 1, 1, 1, 1, 1, 1}}},
                                {gx::linear_scan(a, x, 1)});
    CHECK(r[0].data == std::vector<double>{1, 1.5, 1.75, 1.875, 1.9375, 1, 3, 1, 2, 3});
}

TEST_CASE("xla lowering: ByteLM<Mamba> (the selective scan as linear_scan over the states) equals the eager model", "[xla_lowering]") {
    check_against_eager<olmax::models::Mamba>(2, 13);
}

TEST_CASE("xla lowering: softplus is log(1 + exp(x)) without overflow, with its gradient", "[xla_lowering]") {
    gx::graph g;
    const var x = g.input(f32({4}));
    const var y = gx::softplus(x);
    const auto r = gx::evaluate(g, {{f32({4}), {-800.0, -1.0, 0.5, 800.0}}}, {y, gx::gradients(gx::sum(y, {0}), {x})[0]});
    CHECK(r[0].data[0] == 0.0);
    CHECK(r[0].data[1] == Approx(std::log1p(std::exp(-1.0))).epsilon(1e-14));
    CHECK(r[0].data[2] == Approx(std::log1p(std::exp(0.5))).epsilon(1e-14));
    CHECK(r[0].data[3] == 800.0);
    CHECK(r[1].data[1] == Approx(1 / (1 + std::exp(1.0))).epsilon(1e-14));  // the logistic function
    CHECK(r[1].data[3] == 1.0);
}

TEST_CASE("xla lowering: the traced training step equals ByteLM + optim::AdamW over two steps", "[xla_lowering]") {
    Model eager(olmax::models::ByteLMConfig{8, 2, 3}), traced_model(olmax::models::ByteLMConfig{8, 2, 3});
    olmax::optim::AdamWConfig config;
    config.schedule = olmax::optim::LrSchedule{3e-3, 2, 1e-2, -1, 0.0};
    config.beta2 = 0.99;
    config.weight_decay = 0.1;
    config.max_grad_norm = 0.05;  // below the gradient norm: clipping is active
    olmax::optim::AdamW<double> opt(eager.parameters(), config);
    const auto parameters = traced_model.parameters();
    const auto step = olmax::models::trace_training_step(traced_model, parameters, config, 2, 16);
    REQUIRE(step.state_count() == 3 * parameters.size());

    std::vector<gx::host_value> state;
    for (const auto& p : parameters) state.push_back(host(p.tensor));
    for (int moment = 0; moment < 2; ++moment)
        for (const auto& p : parameters) state.push_back({host(p.tensor).type, std::vector<double>(p.tensor.size(), 0.0)});
    for (std::int64_t t = 1; t <= 2; ++t) {
        INFO("step " << t);
        const tokens batch = random_tokens(2, 16, std::uint32_t(t));
        olmax::data::Batch b{batch.ids, batch.targets, olmax::Tensor<float>({2, 16}, 1.0f), 32, 0};
        const double eager_loss = eager.accumulate_gradients(b, 1, 1.0);
        const auto report = opt.step();
        opt.zero_grad();

        std::vector<gx::host_value> inputs = state;
        inputs.push_back(host(batch.ids));
        inputs.push_back(host(batch.targets));
        const auto schedule = olmax::optim::lowered_adamw_schedule(config, t);
        // the same per-call values, in double: the reference must not inherit their f32 rounding
        const double lr = config.schedule(t);
        inputs.push_back({f32({3}), {lr, lr / (1 - std::pow(config.beta1, double(t))), std::sqrt(1 - std::pow(config.beta2, double(t)))}});
        CHECK(double(schedule[0]) == Approx(lr).epsilon(1e-7));
        const auto out = gx::evaluate(*step.graph, inputs, step.results);
        CHECK(std::abs(out[0].data[0] - eager_loss) < tolerance * eager_loss);
        CHECK(std::abs(out[1].data[0] - report.grad_norm) < 1e-9 * report.grad_norm);
        state.assign(out.begin() + 2, out.end());
        const auto moments = opt.export_state();
        const auto eager_parameters = eager.parameters();  // kept: the loop holds references into it
        for (std::size_t i = 0; i < parameters.size(); ++i) {
            INFO(parameters[i].name);
            const auto& p = eager_parameters[i].tensor;
            CHECK(worst_relative(state[i].data, p.data(), p.size()) < 1e-9);
            CHECK(worst_relative(state[parameters.size() + i].data, moments.slots[i].first_moment.data(), p.size()) < 1e-9);
            CHECK(worst_relative(state[2 * parameters.size() + i].data, moments.slots[i].second_moment.data(), p.size()) < 1e-9);
        }
    }
}

TEST_CASE("xla lowering: the model's step is one loop whatever the depth", "[xla_lowering]") {
    auto emitted = [](std::size_t depth) {
        Model model(olmax::models::ByteLMConfig{8, depth, 1});
        const auto parameters = model.parameters();
        const auto step = olmax::models::trace_training_step(model, parameters, olmax::optim::AdamWConfig{}, 2, 32);
        return gx::emit(*step.graph, "byte_lm_step", step.results).text;
    };
    auto count = [](const std::string& text, const std::string& what) {
        std::size_t n = 0;
        for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
        return n;
    };
    const std::string shallow = emitted(2), deep = emitted(64);
    CHECK(count(deep, "stablehlo.while") == 2);  // the forward loop and the reverse (gradient) loop
    CHECK(count(deep, "stablehlo.dot_general") == count(shallow, "stablehlo.dot_general"));
    CHECK(double(deep.size()) < 1.01 * double(shallow.size()));
}

TEST_CASE("xla lowering: a reversible stack's traced backward rebuilds inputs and stores nothing per layer", "[xla_lowering]") {
    // Stack<Reversible<F, G>> with memory saving on (the default) differentiates its loop with the
    // block's reverse rule (nn::Reversible::lower_reverse), walking back from the last output; with it
    // off, the loop stores every layer's input. Both must equal the eager stack's gradients.
    using Block = olmax::nn::Reversible<olmax::nn::DenseConv<3, double>, olmax::nn::HierarchicalMixer<4, double>>;
    constexpr std::size_t depth = 12;  // S = 16, K = 4: two mixer modes
    for (bool memory_saving : {true, false}) {
        INFO("memory saving " << memory_saving);
        olmax::nn::Config c;
        c.features = 4;
        c.reversible_backward = memory_saving;
        olmax::nn::Stack<Block> stack(c, depth, olmax::Generator(3));
        olmax::Generator rng(4);
        const auto x = olmax::randn<double>({2, 2, 16, 4}, rng), dy = olmax::randn<double>({2, 2, 16, 4}, rng);

        gx::graph g;
        const auto parameters = olmax::optim::parameters_of(stack);
        auto [params, names, inputs] = trace_parameters(g, parameters);
        const var xv = g.input(host(x).type), dyv = g.input(host(dy).type);
        inputs.push_back(host(x));
        inputs.push_back(host(dy));
        const var loss = gx::sum(olmax::nn::lower(stack, gx::lowering(names), xv) * dyv, {0, 1, 2, 3});
        const auto grads = gx::gradients(loss, params);
        const std::string text = gx::emit(g, "stack", grads).text;
        // the stored carries would be one [depth, 2, B, S, F] buffer
        CHECK((text.find("tensor<12x2x2x16x4xf32>") == std::string::npos) == memory_saving);

        auto eager = olmax::sum(olmax::mul(stack.forward(x), dy));
        eager.backward();
        const auto traced = gx::evaluate(g, inputs, grads);
        for (std::size_t i = 0; i < parameters.size(); ++i) {
            INFO(parameters[i].name);
            const auto grad = parameters[i].tensor.grad();
            CHECK(worst_relative(traced[i].data, grad.data(), grad.size()) < 1e-9);
        }
    }
}

TEST_CASE("xla lowering: what cannot be lowered is an error naming it", "[xla_lowering]") {
    static_assert(olmax::nn::LowerableLayer<olmax::nn::DenseConv<5, double>>);
    static_assert(olmax::nn::LowerableLayer<Model::block_type>);
    // Wrappers are lowerable exactly when what they wrap is, so a model's trait is deep: the
    // SwitchMoE recipe (MoE in a Sandwich in a Reversible in a Stack) has no rule, and says so.
    static_assert(!olmax::nn::LowerableLayer<olmax::nn::MoE<double>>);
    static_assert(!olmax::nn::LowerableLayer<olmax::nn::Stack<olmax::models::SwitchMoE::block<double>>>);
    static_assert(!olmax::models::LowerableModel<olmax::models::ByteLM<olmax::models::SwitchMoE, double>>);
    static_assert(olmax::models::LowerableModel<Model>);
    static_assert(olmax::models::LowerableModel<olmax::models::ByteLM<olmax::models::Mamba, double>>);

    olmax::nn::Config c;
    c.features = 4;
    olmax::Generator rng(1);
    gx::graph g;
    const var x = g.input(f32({1, 8, 4}));
    olmax::nn::CausalConv<3, double> grouped(4, 4, rng, 2);
    CHECK_THROWS_WITH(grouped.lower(gx::lowering(std::make_shared<gx::lowering::parameter_map>()), x),
                      Catch::Contains("no lowering rule for grouped convolutions"));
    olmax::nn::DenseConv<3, double> dense(c, rng);
    auto names = std::make_shared<gx::lowering::parameter_map>();
    (*names)["conv0/weight"] = g.input(f32({3, 4, 8}));
    CHECK_THROWS_WITH(dense.lower(gx::lowering(names), x), Catch::Contains("parameter 'norm/scale', which is not traced"));
    olmax::optim::AdamWConfig agc;
    agc.agc.clip = 0.01;
    Model model(olmax::models::ByteLMConfig{8, 1, 1});
    CHECK_THROWS_WITH(olmax::models::trace_training_step(model, model.parameters(), agc, 2, 16), Catch::Contains("without AGC"));
}
