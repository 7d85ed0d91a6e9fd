// The tracer (olmax/trace/): every op's lowering rule and the traced primitives' gradients, checked
// the way every olmax op is, against central finite differences in double precision. The program
// is traced from ordinary olmax code (ops, layers, nn::Stack), differentiated by the tape, and
// evaluated by the graph's double-precision reference evaluation; no PJRT plugin is needed here
// (tests/xla/test_traced_step.cpp runs traced programs on the real one).

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <olmax/xla/graph/evaluate.hpp>
#include <olmax/olmax.hpp>
#include <olmax/trace/trace.hpp>

#include "op_rules_check.hpp"
#include "test_helpers.hpp"
#include "unruled_op.hpp"

namespace gx = olmax::xla::graph;
namespace trace = olmax::trace;
using olmax::Shape;
using olmax::Tensor;

namespace {

struct traced_check {
    double worst = 0;  // largest |tape gradient - finite difference| / max(1, |finite difference|)
    std::string where;
};

using Traced = std::vector<Tensor<float>>;

/// Traces loss = sum(f(inputs) * weights) with inputs of `shapes` (values uniform in [lo, hi],
/// `fill` may set some), differentiates it with the tape, and compares each input's gradient with
/// central differences (h = 1e-6) of the program's double-precision evaluation. `state` tensors
/// (a layer's parameters) are bound as the program's state and checked too. `per_tensor`: at most
/// that many elements of each input and state tensor are differenced, spread evenly over it (a
/// whole model's program is evaluated twice per element: its large tensors are sampled).
traced_check check_traced(const std::vector<Shape>& shapes, const std::function<Tensor<float>(const Traced&)>& f, double lo = -1.5,
                          double hi = 1.5, const std::vector<Tensor<float>>& state = {},
                          const std::function<void(std::vector<gx::host_value>&)>& fill = {}, const std::string& target = "",
                          std::size_t per_tensor = std::size_t(-1)) {
    std::vector<std::vector<double>> state_values;  // read before binding: a bound tensor is traced
    for (const auto& s : state) state_values.emplace_back(s.begin(), s.end());
    trace::tracing t;
    t.set_target(target);  // the rules' forms follow the device (a scan: a loop on the CPU, doubling on GPUs)
    for (const auto& s : state) t.bind_state(s);
    Traced inputs;
    for (const auto& s : shapes) inputs.push_back(t.input<float>(s).set_requires_grad(true));
    const Tensor<float> y = f(inputs);
    const Tensor<float> w = t.input<float>(y.shape());
    Tensor<float> loss = olmax::sum(olmax::mul(y, w));
    loss.backward();
    std::vector<gx::var> wanted{trace::var_of(loss)};
    auto grad_of = [](const Tensor<float>& x) { return x.grad().defined() ? trace::var_of(x.grad()) : gx::constant(trace::var_of(x).owner(), 0.0, trace::var_of(x).type()); };
    for (const auto& s : state) wanted.push_back(grad_of(s));
    for (const auto& x : inputs) wanted.push_back(grad_of(x));

    const gx::graph& g = t.graph();
    std::mt19937 rng(7);
    std::uniform_real_distribution<double> uniform(lo, hi);
    std::vector<gx::host_value> values;
    for (auto i : g.inputs()) {
        const auto& type = g.at(i).outputs[0];
        gx::host_value v{type, std::vector<double>(std::size_t(type.elements()))};
        for (auto& x : v.data) x = uniform(rng);
        values.push_back(v);
    }
    for (std::size_t k = 0; k < state.size(); ++k) values[k].data = state_values[k];  // the state's own values
    if (fill) fill(values);
    const auto analytic = gx::evaluate(g, values, wanted);
    traced_check result;
    const double h = 1e-6;
    const std::size_t checked = state.size() + inputs.size();
    for (std::size_t k = 0; k < checked; ++k) {
        const std::size_t n = values[k].data.size(), samples = std::min(n, per_tensor);
        for (std::size_t i = 0; i < samples; ++i) {
            const std::size_t e = i * n / samples;
            auto plus = values, minus = values;
            plus[k].data[e] += h;
            minus[k].data[e] -= h;
            const double fd = (gx::evaluate(g, plus, {wanted[0]})[0].data[0] - gx::evaluate(g, minus, {wanted[0]})[0].data[0]) / (2 * h);
            const double err = std::abs(analytic[1 + k].data[e] - fd) / std::max(1.0, std::abs(fd));
            if (err > result.worst) {
                result.worst = err;
                result.where = "input " + std::to_string(k) + " element " + std::to_string(e) + ": tape " + std::to_string(analytic[1 + k].data[e]) +
                               ", finite difference " + std::to_string(fd);
            }
        }
    }
    return result;
}

constexpr double tolerance = 1e-6;  // double precision, h = 1e-6

#define CHECK_TRACED(...)                          \
    do {                                           \
        const auto r = check_traced(__VA_ARGS__);  \
        INFO(r.where);                             \
        CHECK(r.worst < tolerance);                \
    } while (0)

}  // namespace

TEST_CASE("trace: element-wise ops' rules and gradients match finite differences", "[trace]") {
    using olmax::Tensor;
    const std::vector<Shape> two{{2, 3}, {2, 3}};
    CHECK_TRACED(two, [](const Traced& x) { return olmax::add(x[0], x[1]); });
    CHECK_TRACED(two, [](const Traced& x) { return olmax::sub(x[0], x[1]); });
    CHECK_TRACED(two, [](const Traced& x) { return olmax::mul(x[0], x[1]); });
    CHECK_TRACED(two, [](const Traced& x) { return olmax::div(x[0], x[1]); }, 0.5, 2.0);
    CHECK_TRACED(two, [](const Traced& x) { return olmax::maximum(x[0], x[1]); });
    // broadcasting: [2, 3] with [3] and [2, 1]
    CHECK_TRACED({{2, 3}, {3}}, [](const Traced& x) { return olmax::mul(x[0], x[1]); });
    CHECK_TRACED({{2, 1}, {2, 3}}, [](const Traced& x) { return olmax::div(x[1], x[0]); }, 0.5, 2.0);
    const std::vector<Shape> one{{2, 3}};
    CHECK_TRACED(one, [](const Traced& x) { return olmax::exp(x[0]); });
    CHECK_TRACED(one, [](const Traced& x) { return olmax::log(x[0]); }, 0.5, 2.0);
    CHECK_TRACED(one, [](const Traced& x) { return olmax::sqrt(x[0]); }, 0.5, 2.0);
    CHECK_TRACED(one, [](const Traced& x) { return olmax::rsqrt(x[0]); }, 0.5, 2.0);
    CHECK_TRACED(one, [](const Traced& x) { return olmax::square(x[0]); });
    CHECK_TRACED(one, [](const Traced& x) { return olmax::tanh(x[0]); });
    CHECK_TRACED(one, [](const Traced& x) { return olmax::sigmoid(x[0]); });
    CHECK_TRACED(one, [](const Traced& x) { return olmax::relu(x[0]); });
    CHECK_TRACED(one, [](const Traced& x) { return olmax::leaky_relu(x[0], 0.1f); });
    CHECK_TRACED(one, [](const Traced& x) { return olmax::hard_sigmoid(x[0]); }, -5.0, 5.0);
    CHECK_TRACED(one, [](const Traced& x) { return olmax::softplus(x[0]); }, -30.0, 30.0);
    CHECK_TRACED(one, [](const Traced& x) { return olmax::add_scalar(olmax::scale(x[0], 3.0f), -1.0f); });
    CHECK_TRACED(one, [](const Traced& x) { return x[0] * x[0] / 2.0f - x[0]; });
}

TEST_CASE("trace: a fused olmax::pointwise chain traces op by op, its gradient matching finite differences and its values the eager op's", "[trace]") {
    namespace m = olmax::math;
    auto chain = [](auto a, auto b) { return (1 - m::hard_sigmoid(a)) * m::tanh(b) + m::softplus(a * b) - m::silu(b) / (1 + m::square(a)); };
    CHECK_TRACED({{2, 3}, {2, 3}}, [&](const Traced& x) { return olmax::pointwise("chain", chain, x[0], x[1]); });
    CHECK_TRACED({{2, 3}, {3}}, [&](const Traced& x) { return olmax::pointwise("chain", chain, x[0], x[1]); });  // a broadcast input
    // The values: the traced program evaluated in double against the eager (fused) op in float.
    olmax::Generator rng(3);
    const Tensor<float> a = olmax::randn<float>({4, 5}, rng), b = olmax::randn<float>({5}, rng);
    const Tensor<float> eager = olmax::pointwise("chain", chain, a, b);
    trace::tracing t;
    const Tensor<float> ta = t.input<float>(a.shape()), tb = t.input<float>(b.shape());
    const std::vector<gx::host_value> values{{trace::var_of(ta).type(), std::vector<double>(a.begin(), a.end())},
                                             {trace::var_of(tb).type(), std::vector<double>(b.begin(), b.end())}};
    const auto out = gx::evaluate(t.graph(), values, {trace::var_of(olmax::pointwise("chain", chain, ta, tb))})[0];
    REQUIRE(out.data.size() == eager.size());
    double worst = 0;
    for (std::size_t e = 0; e < eager.size(); ++e) worst = olmax_test::worse(worst, std::abs(out.data[e] - double(eager.data()[e])));
    CHECK(worst < 1e-5);
}

TEST_CASE("trace: max, maximum and minimum with NaN inputs and a tie give the eager ops' values and gradients", "[trace]") {
    const auto failures = olmax_test::check_nan_max(olmax_test::op_rule_reference);
    INFO(olmax_test::failure_lines(failures));
    CHECK(failures.empty());
}

TEST_CASE("trace: the element-wise ops of math::rules match the eager ops at 0, -0, their kinks, +-inf and NaN, values and gradients", "[trace]") {
    const auto failures = olmax_test::check_math_rules_special(olmax_test::op_rule_reference);
    INFO(olmax_test::failure_lines(failures));
    CHECK(failures.empty());
}

TEST_CASE("trace: softmax, log_softmax and logsumexp of lines masked with -inf give the eager ops' values and gradients", "[trace]") {
    const auto failures = olmax_test::check_masked_softmax(olmax_test::op_rule_reference);
    INFO(olmax_test::failure_lines(failures));
    CHECK(failures.empty());
}

TEST_CASE("trace: cross_entropy of logits with masked (-inf) entries gives the eager op's loss and gradient", "[trace]") {
    const auto failures = olmax_test::check_masked_cross_entropy(olmax_test::op_rule_reference);
    INFO(olmax_test::failure_lines(failures));
    CHECK(failures.empty());
}

TEST_CASE("trace: every traced form reads any nonzero reset as a document start, as the eager ops do", "[trace]") {
    // The composed forms count and compare starts in the program; fed starts marked 2.5, -1, 0.5 and
    // 7 (each a start to the eager ops, which test resets != 0), they must compute what the eager ops
    // compute from them. Before masks::start_flags they took the values as given.
    olmax::Generator rng(17);
    const std::size_t B = 2, T = 9;
    Tensor<float> marks({B, T});
    marks(0, 3) = 2.5f, marks(0, 4) = -1.0f, marks(1, 0) = 7.0f, marks(1, 6) = 0.5f;
    const Tensor<float> x = olmax::randn<float>({B, T, 2, 4}, rng), dt = olmax::rand<float>({B, T, 2}, rng, 0.05f, 0.5f);
    const Tensor<float> A = Tensor<float>::from({2}, {-0.5f, -1.5f}), Bm = olmax::randn<float>({B, T, 1, 3}, rng), C = olmax::randn<float>({B, T, 1, 3}, rng);
    const Tensor<float> k = olmax::randn<float>({B, T, 2, 4}, rng), g = olmax::rand<float>({B, T, 2}, rng, -0.5f, -0.05f),
                        beta = olmax::rand<float>({B, T, 2}, rng, 0.2f, 0.9f);
    const Tensor<float> u = olmax::randn<float>({B, T, 3}, rng), delta = olmax::rand<float>({B, T, 3}, rng, 0.05f, 0.5f),
                        As = Tensor<float>::from({3, 2}, {-0.5f, -1, -0.7f, -1.3f, -2, -0.2f}), Bs = olmax::randn<float>({B, T, 2}, rng),
                        Cs = olmax::randn<float>({B, T, 2}, rng);
    olmax::Generator layer_rng(5);
    olmax::nn::Mamba2Config config;
    config.features = 4, config.head_dim = 2, config.state = 3, config.groups = 1, config.conv_kernel = 3, config.chunk = 4;
    const olmax::nn::Mamba2<float> mamba2(config, layer_rng);
    const Tensor<float> features = olmax::randn<float>({B, T, 4}, rng);
    // In a trace, the first operand becomes a constant of the program (in_program: the identity
    // outside one), so that each form runs traced with host resets too.
    const auto in = [](const Tensor<float>& t) { return olmax::backend::trace::in_program(t); };
    const std::vector<std::pair<std::string, std::function<Tensor<float>(const Tensor<float>&)>>> forms{
        {"scan::ssd", [&](const Tensor<float>& r) { return olmax::scan::ssd(in(x), dt, A, Bm, C, {}, {.resets = r, .chunk = 4}).y; }},
        {"scan::gated_delta_rule", [&](const Tensor<float>& r) { return olmax::scan::gated_delta_rule(in(x), k, x, g, beta, {}, r, {.chunk = 4}).o; }},
        {"causal_attention", [&](const Tensor<float>& r) { return olmax::causal_attention(in(x), k, x, {.resets = r}); }},
        {"rope", [&](const Tensor<float>& r) { return olmax::rope(in(x), {.offset = 2, .resets = r}); }},
        {"scan::selective_scan", [&](const Tensor<float>& r) { return olmax::scan::selective_scan(in(u), delta, As, Bs, Cs, {}, {.resets = r}).y; }},
        {"nn::Mamba2 (its convolution)", [&](const Tensor<float>& r) { return mamba2.forward(in(features), r); }},
    };
    for (const auto& [name, form] : forms) {
        INFO(name);
        const Tensor<float> eager = form(marks);
        for (bool as_input : {false, true}) {  // host resets (a constant of the program), traced resets (an input)
            INFO((as_input ? "traced resets" : "host resets"));
            trace::tracing t;
            const Tensor<float> r = as_input ? t.input<float>(marks.shape()) : marks;
            const Tensor<float> y = form(r);
            std::vector<gx::host_value> values;
            if (as_input) values.push_back({trace::var_of(r).type(), std::vector<double>(marks.begin(), marks.end())});
            const auto out = gx::evaluate(t.graph(), values, {trace::var_of(y)})[0];
            REQUIRE(out.data.size() == eager.size());
            double worst = 0;
            for (std::size_t e = 0; e < eager.size(); ++e) worst = olmax_test::worse(worst, std::abs(out.data[e] - double(eager.data()[e])));
            CHECK(worst < 1e-4);
        }
    }
}

TEST_CASE("trace: products, reductions, shapes, norms and losses match finite differences", "[trace]") {
    CHECK_TRACED({{2, 3, 4}, {4, 5}}, [](const Traced& x) { return olmax::matmul(x[0], x[1]); });
    CHECK_TRACED({{2, 3, 4}, {2, 4, 5}}, [](const Traced& x) { return olmax::matmul(x[0], x[1]); });  // batched
    CHECK_TRACED({{2, 2, 3, 2}, {2, 2, 2, 3}}, [](const Traced& x) { return olmax::matmul(x[0], x[1]); });
    CHECK_TRACED({{2, 3, 4}, {3, 5}}, [](const Traced& x) { return olmax::contract_axis(x[0], x[1], 1); });
    CHECK_TRACED({{2, 3, 4}}, [](const Traced& x) { return olmax::sum(x[0], {0, 2}, true); });
    CHECK_TRACED({{2, 3, 4}}, [](const Traced& x) { return olmax::mean(x[0], {1}); });
    CHECK_TRACED({{2, 3, 4}}, [](const Traced& x) { return olmax::sum(x[0]); });
    CHECK_TRACED({{2, 3, 4}}, [](const Traced& x) { return olmax::transpose(olmax::reshape(x[0], {6, 4}), {1, 0}); });
    CHECK_TRACED({{2, 5, 3}}, [](const Traced& x) { return olmax::slice(olmax::pad(x[0], 1, 2, 1, 0.5f), 1, 1, 6); });
    CHECK_TRACED({{3, 4}, {3, 4}}, [](const Traced& x) {
        const Tensor<float> s = olmax::nn::stack_leading<float>({x[0], x[1]});
        return olmax::nn::take_leading(s, 1) * olmax::nn::take_leading(s, 0);
    });
    CHECK_TRACED({{2, 3, 4}, {4}}, [](const Traced& x) { return olmax::scale_norm(x[0], x[1], 1e-3f); });
    CHECK_TRACED({{2, 3, 4}, {4}}, [](const Traced& x) { return olmax::rms_norm(x[0], x[1], 1e-5f); });
    CHECK_TRACED({{2, 6, 3}, {3, 3, 4}, {4}}, [](const Traced& x) { return olmax::causal_conv1d(x[0], x[1], x[2]); });
    // grouped: 2 groups of 2 input and 3 output channels; depthwise (a group per channel)
    CHECK_TRACED({{2, 5, 4}, {3, 2, 6}, {6}}, [](const Traced& x) { return olmax::causal_conv1d(x[0], x[1], x[2], 2); });
    CHECK_TRACED({{2, 5, 3}, {2, 1, 3}}, [](const Traced& x) { return olmax::causal_conv1d(x[0], x[1], 3); });
    const Tensor<std::int32_t> targets = Tensor<std::int32_t>::from({5}, {0, 3, 2, 3, 1});
    CHECK_TRACED({{5, 4}}, [&](const Traced& x) { return olmax::cross_entropy(x[0], targets, 0.1f); });
    CHECK_TRACED({{5, 3}, {3, 4}},
                 [&](const Traced& x) { return olmax::chunked_cross_entropy(x[0], x[1], targets, {.z_loss = 0.0, .chunk_tokens = 2}); });
    const Tensor<std::int32_t> ids = Tensor<std::int32_t>::from({2, 2}, {1, 0, 1, 3});
    CHECK_TRACED({{4, 3}}, [&](const Traced& x) { return olmax::embedding(x[0], ids); });
}

TEST_CASE("trace: grouped convolutions and batched products compute the eager ops' values", "[trace]") {
    // The finite-difference checks above hold for any consistent program; this pins the values: the
    // traced program, evaluated in double on the same inputs, against the eager op in float.
    olmax::Generator rng(11);
    auto same_values = [&](const std::vector<Shape>& shapes, const std::function<Tensor<float>(const Traced&)>& f) {
        Traced eager_in;
        for (const auto& s : shapes) eager_in.push_back(olmax::randn<float>(s, rng));
        const Tensor<float> eager = f(eager_in);
        trace::tracing t;
        Traced traced_in;
        std::vector<gx::host_value> values;
        for (std::size_t i = 0; i < shapes.size(); ++i) {
            traced_in.push_back(t.input<float>(shapes[i]));
            values.push_back({trace::var_of(traced_in.back()).type(), std::vector<double>(eager_in[i].begin(), eager_in[i].end())});
        }
        const auto out = gx::evaluate(t.graph(), values, {trace::var_of(f(traced_in))})[0];
        REQUIRE(out.data.size() == eager.size());
        double worst = 0;
        for (std::size_t e = 0; e < eager.size(); ++e) worst = olmax_test::worse(worst, std::abs(out.data[e] - double(eager.data()[e])));
        return worst;
    };
    CHECK(same_values({{2, 5, 4}, {3, 2, 6}, {6}}, [](const Traced& x) { return olmax::causal_conv1d(x[0], x[1], x[2], 2); }) < 1e-5);
    CHECK(same_values({{2, 5, 3}, {2, 1, 3}}, [](const Traced& x) { return olmax::causal_conv1d(x[0], x[1], 3); }) < 1e-5);
    CHECK(same_values({{2, 6, 4}, {3, 4, 5}}, [](const Traced& x) { return olmax::causal_conv1d(x[0], x[1]); }) < 1e-5);
    CHECK(same_values({{2, 3, 5, 4}, {2, 3, 4, 2}}, [](const Traced& x) { return olmax::matmul(x[0], x[1]); }) < 1e-5);
}

TEST_CASE("trace: a chunked loss with z-loss reports the plain loss and differentiates the full one, as the eager op", "[trace]") {
    // The eager op's value leaves the z-loss term out while its gradient includes it, so the traced
    // gradient must equal the gradient of cross_entropy(..., z_loss), not of its own value.
    const Tensor<std::int32_t> targets = Tensor<std::int32_t>::from({3}, {0, 2, 1});
    const auto full = check_traced({{3, 2}, {2, 3}}, [&](const Traced& x) { return olmax::cross_entropy(olmax::matmul(x[0], x[1]), targets, 0.5f); });
    CHECK(full.worst < tolerance);
    trace::tracing t;
    auto h = t.input<float>({3, 2}).set_requires_grad(true);
    auto w = t.input<float>({2, 3});
    Tensor<float> chunked = olmax::chunked_cross_entropy(h, w, targets, {.z_loss = 0.5, .chunk_tokens = 2});
    const Tensor<float> plain = olmax::cross_entropy(olmax::matmul(h, w), targets, 0.0f);
    Tensor<float> with_z = olmax::cross_entropy(olmax::matmul(h, w), targets, 0.5f);
    chunked.backward(/*retain_graph=*/true);  // with_z is on the same tape
    const gx::var dh_chunked = trace::var_of(h.grad());
    h.zero_grad();
    with_z.backward();
    const gx::var dh_full = trace::var_of(h.grad());
    const std::vector<gx::host_value> values{{gx::f32({3, 2}), {0.1, -0.4, 0.7, 0.2, -0.3, 0.5}}, {gx::f32({2, 3}), {0.3, -0.2, 0.9, -0.6, 0.4, 0.1}}};
    const auto r = gx::evaluate(t.graph(), values, {trace::var_of(chunked), trace::var_of(plain), dh_chunked, dh_full});
    CHECK(r[0].data[0] == Approx(r[1].data[0]).epsilon(1e-12));
    for (std::size_t e = 0; e < 6; ++e) CHECK(r[2].data[e] == Approx(r[3].data[e]).epsilon(1e-12));
}

TEST_CASE("trace: linear scans (forward, reverse, carried state, log gates) and Mamba's selective scan match finite differences", "[trace]") {
    for (bool reverse : {false, true})
        for (bool log_gates : {false, true}) {
            INFO("reverse " << reverse << ", log gates " << log_gates);
            CHECK_TRACED({{2, 5, 3}, {2, 5, 3}, {2, 3}}, [&](const Traced& x) {
                return olmax::scan::scan<olmax::scan::sequential_vectorized>(x[0], x[1], {.h0 = x[2], .reverse = reverse, .log_gates = log_gates});
            }, log_gates ? -1.0 : 0.2, log_gates ? -0.1 : 0.9);
        }
    Tensor<float> resets({2, 5});
    resets(0, 2) = 1;
    resets(1, 0) = 1;
    // The CPU's fused loops (T = 5: chunks of 4, the second padded) and a GPU's materialised states.
    for (const std::string target : {"cpu", "cuda"}) {
        INFO("selective scan traced for " << target);
        CHECK_TRACED({{2, 5, 3}, {2, 5, 3}, {3, 2}, {2, 5, 2}, {2, 5, 2}, {3}, {2, 3, 2}}, [&](const Traced& x) {
            const auto s = olmax::scan::selective_scan(x[0], x[1], x[2], x[3], x[4], x[5], {.h0 = x[6], .resets = resets});
            return s.y + olmax::reshape(olmax::sum(s.h_last, {2}), {2, 1, 3});
        }, 0.1, 0.9, {}, {}, target);
    }
}

TEST_CASE("trace: a stack of layers is one loop whose gradient (stored inputs, or rebuilt by a reversible block's inverse) matches finite differences",
          "[trace]") {
    olmax::nn::Config config;
    config.features = 4;
    config.depth = 3;
    config.norm_eps = 1e-3;
    using Block = olmax::models::ConvMixer::block<float>;  // reversible: dense conv 5, mixer 16
    for (int mode : {0, 1, 2}) {
        // the mixer's period at S = 32 is 2: depth 3 is one loop of 2 plus one layer; with 2 kept
        // layers depth 5 is a kept loop of 2, a loop of 2 rebuilding its inputs, and one layer
        INFO((mode == 0 ? "memory saving (inputs rebuilt)" : mode == 1 ? "not reversible (every layer kept)" : "memory saving, 2 of 5 layers kept"));
        config.reversible_backward = mode != 1;
        config.depth = mode == 2 ? 5 : 3;
        olmax::Generator rng(3);
        olmax::nn::Stack<Block> stack(config, rng);
        if (mode == 2) stack.keep_activations(2);
        std::vector<Tensor<float>> state;
        for (const auto& p : olmax::optim::parameters_of(stack)) state.push_back(p.tensor);
        // x [2 streams, batch 1, S 32, F 4]; 24 elements of it and of each parameter, evenly spread
        CHECK_TRACED({{2, 1, 32, 4}}, [&](const Traced& x) { return stack.forward(x[0]); }, -1.5, 1.5, state, {}, "", 24);
    }
}

namespace {

/// The module of sum(stack(x)^2) and x's gradient for a conv/mixer stack of 4 features (period 2
/// at S = 32), x [2 streams, batch 1, S 32, F 4], with `kept` layers keeping their activations.
std::string conv_mixer_stack_module(bool reversible, std::size_t depth, std::size_t kept) {
    olmax::nn::Config config;
    config.features = 4;
    config.norm_eps = 1e-3;
    config.reversible_backward = reversible;
    olmax::Generator rng(4);
    olmax::nn::Stack<olmax::models::ConvMixer::block<float>> stack(config, depth, rng);
    stack.keep_activations(kept);
    trace::tracing t;
    for (const auto& p : olmax::optim::parameters_of(stack)) t.bind_state(p.tensor);
    auto x = t.input<float>({2, 1, 32, 4}).set_requires_grad(true);
    Tensor<float> loss = olmax::sum(olmax::square(stack.forward(x)));
    loss.backward();
    return t.finish({loss, x.grad()}).module.text;
}

}  // namespace

TEST_CASE("trace: kept layers' backward reads what their forward loop stored instead of running the layers again", "[trace]") {
    // A reversible stack of depth 4 (two iterations of its period 2), every layer kept or none: the
    // kept program's reverse loop runs the backward's products only, the other's runs the layers'
    // forward products again (inside `reverse`) before them.
    const std::string rebuilt = conv_mixer_stack_module(true, 4, 0), kept = conv_mixer_stack_module(true, 4, 4);
    const std::size_t rebuilt_products = olmax_test::count_of(rebuilt, "stablehlo.dot_general");
    const std::size_t kept_products = olmax_test::count_of(kept, "stablehlo.dot_general");
    INFO("products: every layer rebuilt " << rebuilt_products << ", every layer kept " << kept_products);
    CHECK(kept_products * 4 == rebuilt_products * 3);  // forward F, backward 2F: 3F kept; reverse runs F again: 4F rebuilt
    CHECK(olmax_test::count_of(kept, "stablehlo.while") == 2);  // one forward loop, one reverse loop
}

TEST_CASE("trace: the checker catches a wrong rule", "[trace]") {
    const auto right = check_traced({{3}}, [](const Traced& x) { return olmax::tanh(x[0]); });
    CHECK(right.worst < tolerance);
    olmax::backend::trace::register_rule<olmax::op::tanh>([](std::span<const Tensor<float>> in, const olmax::op::tanh::attrs&) {
        return std::vector<Tensor<float>>{trace::primitives::logistic(in[0])};  // the wrong function: its own gradient is right
    });
    const auto value_only = check_traced({{3}}, [](const Traced& x) { return olmax::tanh(x[0]); });
    CHECK(value_only.worst < tolerance);  // a wrong value with a consistent gradient passes this check; test_op_rules compares values
    olmax::backend::trace::register_rule<olmax::op::tanh>([](std::span<const Tensor<float>> in, const olmax::op::tanh::attrs&) {
        const Tensor<float> y = trace::wrap(gx::tanh(trace::var_of(in[0])));  // the right value recorded with the wrong gradient (1)
        return std::vector<Tensor<float>>{trace::primitives::add(y, trace::primitives::sub(in[0], trace::wrap(trace::var_of(in[0]))))};
    });
    const auto wrong = check_traced({{3}}, [](const Traced& x) { return olmax::tanh(x[0]); });
    CHECK(wrong.worst > 1e-2);
    trace::detail::register_all();  // the real rules again
    CHECK(check_traced({{3}}, [](const Traced& x) { return olmax::tanh(x[0]); }).worst < tolerance);
}

TEST_CASE("trace: what cannot be traced fails at trace time with one line naming the op", "[trace]") {
    trace::tracing t;
    auto x = t.input<float>({2, 3});
    CHECK_THROWS_WITH(olmax_test::hardtanh(x), Catch::Contains("'my_hardtanh' has no lowering rule"));
    CHECK_THROWS_WITH(x.data(), Catch::Contains("traced tensor of shape [2, 3]"));
    CHECK_THROWS_AS(olmax::tanh(t.input<double>({2})), olmax::trace_error);
    {  // a kernel reached on the tracing device names the op that reached it
        olmax::backend::op_scope on("my_op", x);
        CHECK_THROWS_WITH(olmax::backend::current().parallel_for(1, 1, [](std::size_t, std::size_t) {}),
                          Catch::Contains("my_op ran a parallel loop on traced tensors"));
    }
    CHECK_THROWS_WITH(trace::tracing(), Catch::Contains("already running"));
}

TEST_CASE("trace: indices an op reads from a per-call input are checked before each run, as the eager op checks them", "[trace]") {
    trace::tracing t;
    auto ids = t.input<std::int32_t>({2, 4});
    auto targets = t.input<std::int32_t>({2, 4});
    auto rows = t.input<std::int32_t>({3});
    auto table = t.input<float>({6, 3});
    const Tensor<float> logits = olmax::reshape(olmax::embedding(table, ids), {8, 3});
    (void)olmax::embedding(table, ids);  // read twice, checked once
    const Tensor<float> loss = olmax::cross_entropy(logits, olmax::reshape(targets, {8}));
    const Tensor<float> picked = olmax::gather_rows(table, olmax::reshape(olmax::reshape(rows, {1, 3}), {3}));
    // A constant holding an id out of range is refused while tracing, naming the op.
    CHECK_THROWS_WITH(olmax::embedding(table, Tensor<std::int32_t>::from({2}, {1, 9})),
                      Catch::Contains("embedding: id 9 at position 1 of a constant of the traced program is not an integer in [0, 6)"));
    const trace::traced_program program = t.finish({loss, olmax::sum(picked)});
    REQUIRE(program.inputs.size() == 4);
    const auto& in = program.inputs;
    REQUIRE(in[0].indices.size() == 1);
    CHECK(in[0].indices[0].limit == 6);
    REQUIRE(in[1].indices.size() == 1);
    CHECK(in[1].indices[0].limit == 3);
    REQUIRE(in[2].indices.size() == 1);  // through the two reshapes
    CHECK(in[2].indices[0].op == "gather_rows");
    CHECK(in[3].indices.empty());

    const std::vector<float> good{0, 1, 2, 3, 4, 5, 0, 1};
    CHECK_NOTHROW(trace::check_call_input(in[0], good, 0));
    std::vector<float> bad = good;
    bad[3] = 6;
    CHECK_THROWS_WITH(trace::check_call_input(in[0], bad, 0),
                      Catch::Contains("embedding: id 6 at position 3 of the program's input 0 (checked before the run) is not an integer in [0, 6)"));
    bad[3] = -1;
    CHECK_THROWS_WITH(trace::check_call_input(in[0], bad, 0), Catch::Contains("embedding: id -1 at position 3"));
    bad[3] = 2.5f;
    CHECK_THROWS_WITH(trace::check_call_input(in[0], bad, 0), Catch::Contains("embedding: id 2.5 at position 3"));
    CHECK_THROWS_WITH(trace::check_call_input(in[1], good, 1), Catch::Contains("cross_entropy: target 3 at position 3 of the program's input 1"));
    CHECK_THROWS_WITH(trace::check_call_input(in[2], std::vector<float>{0, 6, 1}, 2), Catch::Contains("gather_rows: index 6 at position 1"));
    CHECK_THROWS_WITH(trace::check_call_input(in[0], std::vector<float>(7, 0.0f), 0), Catch::Contains("input 0 has 7 values for shape [2, 4]"));
    CHECK_NOTHROW(trace::check_call_input(in[3], std::vector<float>(18, 100.0f), 3));
}

TEST_CASE("trace: AdamW with bfloat16 moments refuses a traced step", "[trace]") {
    auto w = olmax::parameter(Tensor<float>({3}, 1.0f));
    olmax::optim::AdamWConfig c;
    c.moments = olmax::optim::MomentPrecision::bfloat16;
    olmax::optim::AdamW<float> opt({olmax::optim::make_parameter("w", olmax::nn::Role::weight, w)}, 0.01, c);
    trace::tracing t;
    t.bind_state(w);
    opt.for_each_moment([&](const auto& m) { t.bind_state(m); });
    olmax::sum(w * w).backward();
    CHECK_THROWS_WITH(opt.step(), Catch::Contains("bfloat16 moments"));
}

TEST_CASE("trace: a scan keeps its written tag's form where the device suits it, else takes the device's and says so once", "[trace]") {
    namespace sc = olmax::scan;
    // The module of one scan of [2, 64, 3] written with Strategy, traced for `target`, and the notices.
    auto traced = []<class Strategy>(const std::string& target, std::optional<trace::scan_form> forced = std::nullopt) {
        trace::tracing t;
        t.set_target(target);
        t.set_scan_form(forced);
        const Tensor<float> a = t.input<float>({2, 64, 3}), x = t.input<float>({2, 64, 3}), y = t.input<float>({2, 64, 3});
        const Tensor<float> h = sc::scan<Strategy>(a, x) + sc::scan<Strategy>(a, y);  // two scans: one notice
        auto program = t.finish({h});
        return std::pair{program.module.text, program.notices};
    };
    auto count = [](const std::string& text, const std::string& what) {
        std::size_t n = 0;
        for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
        return n;
    };
    // chunked_matmul<16> on the CPU: its 16 x 16 triangular matrices, one per (row, chunk), not the loop.
    auto [matmul, quiet] = traced.template operator()<sc::chunked_matmul<16>>("cpu");
    CHECK(matmul.find("tensor<6x4x16x16xf32>") != std::string::npos);
    CHECK(count(matmul, "\"stablehlo.while\"") == 0);
    CHECK(quiet.empty());
    // hillis_steele_chunked<8> on a GPU: one loop over the 8 steps of a chunk.
    auto [chunked, quiet2] = traced.template operator()<sc::hillis_steele_chunked<8>>("cuda");
    CHECK(count(chunked, "\"stablehlo.while\"") == 2);
    CHECK(chunked.find("dense<8> : tensor<i32>") != std::string::npos);
    CHECK(quiet2.empty());
    // The CPU's loop on the CPU plugin; on a GPU doubling instead, with one notice for both scans.
    auto [loop, quiet3] = traced.template operator()<sc::sequential_vectorized>("cpu");
    CHECK(count(loop, "\"stablehlo.while\"") == 2);
    CHECK(quiet3.empty());
    auto [doubling, said] = traced.template operator()<sc::sequential_vectorized>("cuda");
    CHECK(count(doubling, "\"stablehlo.while\"") == 0);
    REQUIRE(said.size() == 1);
    CHECK_THAT(said[0], Catch::Matchers::Contains("scan<sequential_vectorized> traced as hillis_steele for cuda"));
    // No StableHLO form computes blelloch's tree as written: the device's form, said.
    auto [tree, said2] = traced.template operator()<sc::blelloch>("cpu");
    CHECK(count(tree, "\"stablehlo.while\"") == 2);
    REQUIRE(said2.size() == 1);
    CHECK_THAT(said2[0], Catch::Matchers::Contains("scan<blelloch> traced as sequential for cpu: no StableHLO form computes it"));
    // A form set for the whole program wins over the tag, silently (a benchmark's comparison).
    auto [forced, quiet4] = traced.template operator()<sc::chunked_matmul<16>>("cpu", trace::scan_form::hillis_steele());
    CHECK(forced.find("x16x16xf32>") == std::string::npos);
    CHECK(quiet4.empty());
    // train_lm's --xla_scan_form names the tags.
    CHECK(trace::scan_form_named("hillis_steele_chunked") == trace::scan_form::hillis_steele_chunked());
    CHECK(trace::scan_form_named("chunked_matmul") == trace::scan_form::chunked_matmul<128>());
    CHECK_THROWS_WITH(trace::scan_form_named("blocked"), Catch::Matchers::Contains(
                          "unknown scan form 'blocked'; choose one of sequential, hillis_steele, hillis_steele_chunked, chunked_matmul"));
}

TEST_CASE("trace: Mamba's selective scan traced for the CPU never holds the [B, T, E, N] states, forward or backward", "[trace]") {
    // B 2, T 36 (chunks of 8: 5 checkpoints, the last chunk padded), E 3, N 4. A GPU's form
    // materialises the states (as [B, T, E N] for its linear scan); the CPU's fused loops keep one
    // [B, E, N] state, the [B, 5, E, N] checkpoints and one chunk's [B, 8, E, N] states.
    for (const std::string target : {"cpu", "cuda"}) {
        INFO("traced for " << target);
        trace::tracing t;
        t.set_target(target);
        std::vector<Tensor<float>> x;
        for (const Shape& s : std::vector<Shape>{{2, 36, 3}, {2, 36, 3}, {3, 4}, {2, 36, 4}, {2, 36, 4}})
            x.push_back(t.input<float>(s).set_requires_grad(true));
        const auto s = olmax::scan::selective_scan(x[0], x[1], x[2], x[3], x[4], Tensor<float>{});
        Tensor<float> loss = olmax::sum(olmax::square(s.y));
        loss.backward();
        const std::string text = t.finish({loss, x[0].grad(), x[1].grad(), x[2].grad(), x[3].grad(), x[4].grad()}).module.text;
        const bool materialised = text.find("tensor<2x36x3x4xf32>") != std::string::npos || text.find("tensor<2x36x12xf32>") != std::string::npos;
        CHECK(materialised == (target == "cuda"));
        if (target == "cpu") {
            CHECK(text.find("tensor<2x5x3x4xf32>") != std::string::npos);  // the checkpoints
            CHECK(text.find("tensor<2x8x3x4xf32>") != std::string::npos);  // one chunk's states
        }
    }
}

TEST_CASE("trace: a reversible stack's traced backward rebuilds each layer's input and stores nothing per layer", "[trace]") {
    // depth 5 of a block whose period at S = 32 is 2: two loop iterations of 2 layers, then one.
    // The loop storing its carries holds them as one [2, 2 streams, 1, 32, 4] buffer.
    for (bool reversible : {true, false}) {
        INFO((reversible ? "memory saving" : "inputs stored"));
        const std::string text = conv_mixer_stack_module(reversible, 5, 0);
        CHECK((text.find("tensor<2x2x1x32x4xf32>") != std::string::npos) == !reversible);
        CHECK(olmax_test::count_of(text, "stablehlo.while") == 2);  // the forward loop and the reverse loop, whatever the depth
    }
}

TEST_CASE("trace: an op without a rule inside a stack's layer names the op and the stack", "[trace]") {
    olmax::nn::Config config;
    config.features = 4;
    config.depth = 2;
    olmax::Generator rng(1);
    olmax::nn::Stack<olmax_test::HardTanh<float>> stack(config, rng);  // its op has no lowering rule
    trace::tracing t;
    auto x = t.input<float>({1, 3, 4});
    CHECK_THROWS_WITH(stack.forward(x), Catch::Contains("'my_hardtanh' has no lowering rule") && Catch::Contains("(in a layer of nn::Stack<"));
}

TEST_CASE("trace: softmax and log_softmax match finite differences", "[trace]") {
    CHECK_TRACED({{2, 3, 4}}, [](const Traced& x) { return olmax::softmax(x[0], -1); }, -3.0, 3.0);
    CHECK_TRACED({{2, 3, 4}}, [](const Traced& x) { return olmax::softmax(x[0], 1); }, -3.0, 3.0);
    CHECK_TRACED({{2, 3, 4}}, [](const Traced& x) { return olmax::log_softmax(x[0], -1); }, -3.0, 3.0);
}

namespace {

/// Largest |traced - eager| / max(1, |eager|) of sum(f(x) * w)'s value, f(x) and the gradients of x
/// and `state`: `f` run eagerly in float, and traced (state bound, x and w program inputs) and
/// evaluated in double.
double traced_against_eager(const std::function<Tensor<float>(const Tensor<float>&)>& f, const std::vector<Tensor<float>>& state,
                            const Shape& x_shape, std::uint32_t seed) {
    olmax::Generator rng(seed);
    const Tensor<float> x = olmax::randn<float>(x_shape, rng);
    std::vector<Tensor<float>> eager;  // y, then the gradients of state and x
    Tensor<float> w;
    {
        const Tensor<float> xp = olmax::parameter(x.clone());
        const Tensor<float> y = f(xp);
        w = olmax::randn<float>(y.shape(), rng);
        olmax::sum(olmax::mul(y, w)).backward();
        eager.push_back(y.detach());
        for (const auto& s : state) {
            eager.push_back(s.grad().clone());
            Tensor<float>(s).zero_grad();
        }
        eager.push_back(xp.grad());
    }
    std::vector<gx::host_value> values;
    for (const auto& s : state) values.push_back({gx::f32(gx::dims_t(s.shape().begin(), s.shape().end())), std::vector<double>(s.begin(), s.end())});
    trace::tracing t;
    for (const auto& s : state) t.bind_state(s);
    const Tensor<float> xt = t.input<float>(x_shape).set_requires_grad(true);
    const Tensor<float> y = f(xt);
    const Tensor<float> wt = t.input<float>(y.shape());
    olmax::sum(olmax::mul(y, wt)).backward();
    std::vector<gx::var> wanted{trace::var_of(y)};
    for (const auto& s : state) wanted.push_back(trace::var_of(s.grad()));
    wanted.push_back(trace::var_of(xt.grad()));
    values.push_back({trace::var_of(xt).type(), std::vector<double>(x.begin(), x.end())});
    values.push_back({trace::var_of(wt).type(), std::vector<double>(w.begin(), w.end())});
    const auto traced = gx::evaluate(t.graph(), values, wanted);
    double worst = 0;
    for (std::size_t k = 0; k < eager.size(); ++k) {
        REQUIRE(traced[k].data.size() == eager[k].size());
        for (std::size_t e = 0; e < eager[k].size(); ++e) {
            const double want = eager[k].data()[e];
            worst = std::max(worst, std::abs(traced[k].data[e] - want) / std::max(1.0, std::abs(want)));
        }
    }
    return worst;
}

}  // namespace

TEST_CASE("trace: gather_rows and scatter_rows (repeated rows, rows no index names) match finite differences", "[trace]") {
    const Tensor<std::int32_t> rows = Tensor<std::int32_t>::from({5}, {3, 0, 3, 1, 3});
    CHECK_TRACED({{4, 2, 3}}, [&](const Traced& x) { return olmax::gather_rows(x[0], rows); });
    CHECK_TRACED({{5, 3}}, [&](const Traced& x) { return olmax::scatter_rows(x[0], rows, 6); });
    // Indices that are values of the program (as nn::MoE's slot maps are), not host constants.
    CHECK_TRACED({{4, 3}}, [&](const Traced& x) {
        const Tensor<float> computed = olmax::trace::primitives::full({5}, 2.0);
        return olmax::gather_rows(x[0], olmax::backend::trace::as_type<std::int32_t>(computed));
    });
}

TEST_CASE("trace: nn::MoE's routing with capacity and its balance gradient equal the eager layer's, alone and in a reversible stack",
          "[trace][moe]") {
    olmax::nn::MoEConfig config;
    config.features = 4;
    config.experts = 3;
    config.capacity_factor = 0.75;  // C = ceil(0.75 k 8 / 3): some assignments dropped
    config.balance_coefficient = 0.3;
    for (std::size_t k : {1u, 2u}) {
        INFO("top-" << k);
        config.top_k = k;
        olmax::Generator rng(30 + k);
        olmax::nn::MoE<float> moe(config, rng);
        std::vector<Tensor<float>> state;
        for (const auto& p : olmax::optim::parameters_of(moe)) state.push_back(p.tensor);
        moe.clear_routing_stats();
        {
            olmax::autodiff::no_grad off;
            moe.forward(olmax::randn<float>({2, 8, 4}, rng));
        }
        CHECK(moe.routing_stats().dropped > 0);
        CHECK(traced_against_eager([&](const Tensor<float>& x) { return moe.forward(x); }, state, {2, 8, 4}, 40 + k) < 1e-5);
        // The block of train_lm --block=moe, two layers, memory saving: the balance gradient joins in
        // the reverse loop's re-run of each layer.
        config.depth = 2;
        config.norm_eps = 1e-3;
        olmax::nn::Stack<olmax::models::SwitchMoE::block<float>> stack(config, rng);
        std::vector<Tensor<float>> stack_state;
        for (const auto& p : olmax::optim::parameters_of(stack)) stack_state.push_back(p.tensor);
        CHECK(traced_against_eager([&](const Tensor<float>& x) { return stack.forward(x); }, stack_state, {2, 1, 16, 4}, 50 + k) < 1e-5);
    }
    // Exact gradients of the traced routing's program by finite differences (without the balance
    // term, which the finite differences of sum(y w) do not see; test_moe.cpp checks it eagerly).
    config.top_k = 1;
    config.balance_coefficient = 0;
    olmax::Generator rng(31);
    olmax::nn::MoE<float> plain(config, rng);
    std::vector<Tensor<float>> state;
    for (const auto& p : olmax::optim::parameters_of(plain)) state.push_back(p.tensor);
    CHECK_TRACED({{2, 8, 4}}, [&](const Traced& x) { return plain.forward(x[0]); }, -1.5, 1.5, state);
}
