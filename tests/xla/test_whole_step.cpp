// Traced programs on the real OpenXLA CPU plugin (OLMAX_TEST_CPU_PJRT_PLUGIN), below the level of a
// model: the linear scan and its adjoint in every StableHLO form against the double-precision
// reference evaluation, a wrong lowering caught by such a comparison, donated state updated in
// place, and clear errors for bad programs and bad calls. Whole models are in test_model_step.cpp
// and test_traced_step.cpp.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <olmax/xla/device_program.hpp>
#include <olmax/xla/graph/emit.hpp>
#include <olmax/xla/graph/evaluate.hpp>
#include <olmax/olmax.hpp>
#include <olmax/trace/program.hpp>
#include <olmax/trace/trace.hpp>

#include "test_helpers.hpp"
#include "xla/cpu_plugin.hpp"

namespace gx = olmax::xla::graph;
namespace pjrt = olmax::xla::pjrt;
namespace trace = olmax::trace;
using olmax::Shape;
using olmax::Tensor;

namespace {

using olmax_test::cpu_client;

/// A small traced training step: state w [6, 4] (bound from the host), per-call inputs x [6] and
/// target [6]; loss = mean((tanh(x w) summed over the 4 columns - target)^2), plain SGD on w.
trace::traced_program small_step() {
    olmax::Generator rng(2);
    Tensor<float> w = olmax::parameter(olmax::randn<float>({1, 4}, rng));
    trace::tracing t;
    t.bind_state(w);
    auto x = t.input<float>({6, 1}), target = t.input<float>({6});
    const Tensor<float> y = olmax::reshape(olmax::sum(olmax::tanh(olmax::matmul(x, w)), {1}), {6});
    Tensor<float> loss = olmax::mean(olmax::square(y - target));
    loss.backward();
    olmax::backend::trace::assign(w, w - w.grad() * 0.1f);
    return t.finish({loss}, "small_step");
}

}  // namespace

TEST_CASE("traced programs: the linear scan and its adjoint lower in every form", "[xla][cpu_plugin][whole_step]") {
    // f = sum(w * h) with h the scan of (a, x) from the start and from the end; its gradients are the
    // adjoint scans, recorded by the tape. Each form's module against the double reference: f32 rounding only.
    auto client = cpu_client();
    namespace hlo = olmax::xla::stablehlo;
    const std::size_t steps = 37;  // neither a multiple of the chunk nor a power of two
    // Time along axis 1 of [rows, T] (time-major loop), of [B, T, 3] (short runs: time-major too)
    // and of [B, T, 4, 5] (runs of 20: the loop slices axis 1 in place); and the shortest times,
    // one and two steps (one block, no padding).
    for (const Shape& shape : {Shape{3, steps}, Shape{2, steps, 3}, Shape{2, steps, 4, 5}, Shape{2, 1, 3}, Shape{3, 2}}) {
        std::mt19937 rng(5);
        std::uniform_real_distribution<double> gate(0.0, 1.0), value(-1.0, 1.0);
        std::vector<std::vector<float>> in(3, std::vector<float>(olmax::numel(shape)));
        for (auto& x : in[0]) x = float(gate(rng));
        for (std::size_t k = 1; k < 3; ++k)
            for (auto& x : in[k]) x = float(value(rng));
        for (const auto& strategy : {hlo::scan_strategy::sequential(), hlo::scan_strategy::hillis_steele(), hlo::scan_strategy::chunked_matmul<8>(),
                                     hlo::scan_strategy::chunked_matmul<128>(), hlo::scan_strategy::hillis_steele_chunked(), hlo::scan_strategy::hillis_steele_chunked(8),
                                     hlo::scan_strategy::hillis_steele_chunked(64)})
            for (bool reverse : {false, true}) {
                INFO(olmax::to_string(shape) << ", " << strategy.name() << (reverse ? ", from the end" : ", from the start"));
                trace::tracing t;
                auto a = t.input<float>(shape).set_requires_grad(true), x = t.input<float>(shape).set_requires_grad(true);
                auto w = t.input<float>(shape);
                const Tensor<float> h = trace::primitives::linear_scan(a, x, strategy, reverse);
                Tensor<float> f = olmax::sum(h * w);
                f.backward();
                const std::vector<Tensor<float>> results{h, a.grad(), x.grad()};
                std::vector<gx::host_value> values;
                for (const auto& v : in) values.push_back({trace::var_of(a).type(), std::vector<double>(v.begin(), v.end())});
                std::vector<gx::var> vars;
                for (const auto& r : results) vars.push_back(trace::var_of(r));
                const auto reference = gx::evaluate(t.graph(), values, vars);
                auto program = t.finish(results, "scan_" + strategy.name());
                if (strategy.strategy == hlo::scan_strategy::kind::chunked_matmul) CHECK(program.module.text.find("stablehlo.dot_general") != std::string::npos);
                olmax::xla::device_program device(client, program.module, 0);
                const auto out = device.run({in[0].data(), in[1].data(), in[2].data()});
                for (std::size_t r = 0; r < results.size(); ++r) {
                    double worst = 0;
                    for (std::size_t e = 0; e < out[r].size(); ++e) worst = std::max(worst, std::abs(double(out[r][e]) - reference[r].data[e]));
                    INFO("result " << r << " (h, da, dx): largest error " << worst);
                    CHECK(worst < 1e-4);  // values of order 1 to 10 after 37 steps of gates below 1
                }
            }
    }
}

TEST_CASE("traced programs: a batched matmul and its gradients lower to dot_general with a batch dimension", "[xla][cpu_plugin][whole_step]") {
    // f = sum(w * (a b)) for a [2, 3, 5, 4] and b [2, 3, 4, 6]: the values on the plugin against the
    // eager op, the gradients against the double-precision reference evaluation.
    auto client = cpu_client();
    const Shape a_shape{2, 3, 5, 4}, b_shape{2, 3, 4, 6}, c_shape{2, 3, 5, 6};
    olmax::Generator rng(9);
    const Tensor<float> a0 = olmax::randn<float>(a_shape, rng), b0 = olmax::randn<float>(b_shape, rng), w0 = olmax::randn<float>(c_shape, rng);
    const Tensor<float> eager = olmax::matmul(a0, b0);
    trace::tracing t;
    auto a = t.input<float>(a_shape).set_requires_grad(true), b = t.input<float>(b_shape).set_requires_grad(true);
    auto w = t.input<float>(c_shape);
    const Tensor<float> c = olmax::matmul(a, b);
    Tensor<float> f = olmax::sum(c * w);
    f.backward();
    const std::vector<Tensor<float>> results{c, a.grad(), b.grad()};
    std::vector<gx::host_value> values;
    const std::vector<std::pair<const Tensor<float>*, gx::var>> bound{{&a0, trace::var_of(a)}, {&b0, trace::var_of(b)}, {&w0, trace::var_of(w)}};
    for (const auto& [x, v] : bound) values.push_back({v.type(), std::vector<double>(x->begin(), x->end())});
    std::vector<gx::var> vars;
    for (const auto& r : results) vars.push_back(trace::var_of(r));
    const auto reference = gx::evaluate(t.graph(), values, vars);
    auto program = t.finish(results, "batched_matmul");
    CHECK(program.module.text.find("lhs_batching_dimensions = [0]") != std::string::npos);
    olmax::xla::device_program device(client, program.module, 0);
    const auto out = device.run({a0.data(), b0.data(), w0.data()});
    double worst_value = 0;
    for (std::size_t e = 0; e < eager.size(); ++e) worst_value = olmax_test::worse(worst_value, std::abs(double(out[0][e]) - double(eager.data()[e])));
    CHECK(worst_value < 1e-5);
    for (std::size_t r = 0; r < results.size(); ++r) {
        double worst = 0;
        for (std::size_t e = 0; e < out[r].size(); ++e) worst = olmax_test::worse(worst, std::abs(double(out[r][e]) - reference[r].data[e]));
        INFO("result " << r << " (c, da, db): largest error " << worst);
        CHECK(worst < 1e-5);
    }
}

TEST_CASE("traced programs: a wrong lowering is caught by comparing with the reference", "[xla][cpu_plugin][whole_step]") {
    auto client = cpu_client();
    auto run = [&](bool break_it) {
        auto step = small_step();
        if (break_it) {  // tanh emitted as logistic: a plausible-looking but wrong lowering
            const auto at = step.module.text.find("\"stablehlo.tanh\"");
            REQUIRE(at != std::string::npos);
            step.module.text.replace(at, 16, "\"stablehlo.logistic\"");
            step.module.key += ".broken";
        }
        trace::compiled_program device(client, std::move(step));
        return device.run({{0.1f, -0.3f, 0.5f, 0.7f, -0.9f, 0.2f}, {0.5f, 0.1f, -0.2f, 0.3f, 0.4f, -0.6f}})[0][0];
    };
    olmax::Generator rng(2);  // the eager loss of the same step (small_step's initial w)
    const Tensor<float> w = olmax::randn<float>({1, 4}, rng);
    const Tensor<float> x = Tensor<float>::from({6, 1}, {0.1f, -0.3f, 0.5f, 0.7f, -0.9f, 0.2f}), target = Tensor<float>::from({6}, {0.5f, 0.1f, -0.2f, 0.3f, 0.4f, -0.6f});
    const float eager = olmax::mean(olmax::square(olmax::reshape(olmax::sum(olmax::tanh(olmax::matmul(x, w)), {1}), {6}) - target)).item();
    CHECK(run(false) == Approx(eager).epsilon(1e-6));
    CHECK(std::abs(run(true) - eager) > 1e-3);
}

TEST_CASE("whole step: donated state is updated in place: the device consumes the old buffer, and XLA's memory plan counts it once", "[xla][cpu_plugin][whole_step]") {
    auto client = cpu_client();
    for (bool donate : {true, false}) {
        INFO("donated " << donate);
        gx::graph g;
        const gx::var state = g.input(gx::f32({4})), input = g.input(gx::f32({4}));
        const auto module = gx::emit(g, donate ? "donating" : "copying", {gx::sum(state, {0}), state * 2.0 + input}, donate ? 1 : 0);
        CHECK((module.text.find("{tf.aliasing_output = 1 : i32}") != std::string::npos) == donate);
        const auto& exe = client->compile(module);
        // XLA's plan as the plugin reports it: two f32[4] arguments, the new state reusing the old one's buffer when donated
        REQUIRE(exe.memory.has_value());
        CHECK(exe.memory->arguments == 32);
        CHECK(exe.memory->outputs >= 20);
        CHECK(exe.memory->aliased == (donate ? 16 : 0));
        const std::vector<float> x{1, 2, 3, 4}, y{1, 1, 1, 1};
        auto old_state = client->upload(x.data(), {4});
        const auto step = client->upload(y.data(), {4});
        auto out = client->execute(exe, {&old_state, &step});
        CHECK(old_state.is_deleted() == donate);
        CHECK_FALSE(step.is_deleted());
        std::vector<float> next(4), total(1);
        client->download(out[1], next.data(), next.size());
        client->download(out[0], total.data(), total.size());
        CHECK(next == std::vector<float>{3, 5, 7, 9});
        CHECK(total[0] == 10.0f);
    }
    gx::graph g;
    const gx::var a = g.input(gx::f32({4}));
    CHECK_THROWS_WITH(gx::emit(g, "bad", {gx::sum(a, {0})}, 1), Catch::Contains("cannot be updated in place"));
}

TEST_CASE("whole step: bad programs and bad calls are clear errors", "[xla][cpu_plugin][whole_step]") {
    auto client = cpu_client();
    const auto step = small_step();
    const auto& module = step.module;
    olmax::xla::device_program program(client, module, step.state.size());
    const std::vector<float> ids(6, 1.0f);
    CHECK_THROWS_WITH(program.run({ids.data()}), Catch::Contains("takes 2 per-call inputs, got 1"));
    CHECK_THROWS_WITH(program.run({ids.data(), ids.data()}), Catch::Contains("state tensor 0 was never set"));
    CHECK_THROWS_WITH(program.set_state(0, {1.0f, 2.0f}), Catch::Contains("got 2 values"));
    CHECK_THROWS_WITH(program.set_state(99, {}), Catch::Contains("no state tensor 99"));
    // one executable per replica count, even for the same module
    const auto& single = client->compile(module, 1);
    const auto& pair = client->compile(module, 2);
    CHECK(&single != &pair);
    CHECK(single.replicas == 1);
    CHECK(pair.replicas == 2);
    CHECK_THROWS_WITH(client->execute_replicated(pair, {{}}), Catch::Contains("compiled for 2 devices, got arguments for 1"));
    // state that leaves with another type than it entered
    CHECK_THROWS_AS(olmax::xla::device_program(client, module, 2), olmax::shape_error);
    // a module XLA rejects: the plugin's own message comes back as pjrt_error
    auto broken = module;
    broken.text.replace(broken.text.find("\"stablehlo.tanh\""), 16, "\"stablehlo.tahn\"");
    broken.key += ".broken";
    CHECK_THROWS_AS(olmax::xla::device_program(client, broken, step.state.size()), pjrt::pjrt_error);
}
