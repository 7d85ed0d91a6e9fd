// The traced-program layer of the whole-step XLA path (olmax/backend/xla/graph): every primitive's
// gradient rule against central finite differences of the double-precision reference evaluation,
// the layer loop's gradient, shape errors at build time, and a module whose size does not grow with
// depth. Running the emitted modules on a real PJRT plugin is in tests/xla/test_whole_step.cpp.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <olmax/backend/xla/graph/emit.hpp>
#include <olmax/backend/xla/graph/evaluate.hpp>
#include <olmax/backend/xla/graph/gradients.hpp>
#include <olmax/backend/xla/graph/layer_ops.hpp>
#include <olmax/backend/xla/graph/residual_lm.hpp>

namespace gx = olmax::xla::graph;
using gx::dims_t;
using gx::f32;
using gx::var;

namespace {

struct program_check {
    double worst = 0;  // largest |analytic - finite difference| / max(1, |finite difference|)
    std::string where;
};

/// Builds loss = sum(f(inputs) * weights) on random inputs in [lo, hi], differentiates it with the
/// graph's rules and compares every input's gradient with central differences (h = 1e-6) of the
/// double-precision evaluation.
program_check check_program(const std::vector<gx::tensor_type>& types, const std::function<var(gx::graph&, const std::vector<var>&)>& f,
                            double lo = -1.5, double hi = 1.5, std::size_t differentiated = SIZE_MAX,
                            const std::function<std::vector<var>(const var&, const std::vector<var>&)>& rule = {},
                            const std::function<void(std::vector<gx::host_value>&)>& fill = {}) {
    gx::graph g;
    std::vector<var> in;
    for (const auto& t : types) in.push_back(g.input(t));
    const var y = f(g, in);
    const var w = g.input(y.type());
    dims_t all;
    for (std::size_t d = 0; d < y.type().rank(); ++d) all.push_back(std::int64_t(d));
    const var loss = all.empty() ? y * w : sum(y * w, all);
    differentiated = std::min(differentiated, in.size());
    const std::vector<var> wrt(in.begin(), in.begin() + std::ptrdiff_t(differentiated));
    const std::vector<var> grads = rule ? rule(loss, wrt) : gx::gradients(loss, wrt);

    std::mt19937 rng(7);
    std::uniform_real_distribution<double> uniform(lo, hi);
    std::vector<gx::host_value> values;
    for (const auto& t : types) {
        gx::host_value v{t, std::vector<double>(std::size_t(t.elements()))};
        for (auto& x : v.data) x = uniform(rng);
        values.push_back(v);
    }
    gx::host_value weights{y.type(), std::vector<double>(std::size_t(y.type().elements()))};
    for (auto& x : weights.data) x = uniform(rng);
    if (fill) fill(values);
    values.push_back(weights);

    std::vector<var> wanted{loss};
    wanted.insert(wanted.end(), grads.begin(), grads.end());
    const auto analytic = gx::evaluate(g, values, wanted);
    program_check result;
    const double h = 1e-6;
    for (std::size_t k = 0; k < differentiated; ++k)
        for (std::size_t e = 0; e < values[k].data.size(); ++e) {
            auto plus = values, minus = values;
            plus[k].data[e] += h;
            minus[k].data[e] -= h;
            const double fd = (gx::evaluate(g, plus, {loss})[0].data[0] - gx::evaluate(g, minus, {loss})[0].data[0]) / (2 * h);
            const double err = std::abs(analytic[1 + k].data[e] - fd) / std::max(1.0, std::abs(fd));
            if (err > result.worst) {
                result.worst = err;
                result.where = "input " + std::to_string(k) + " element " + std::to_string(e) + ": rule " +
                               std::to_string(analytic[1 + k].data[e]) + ", finite difference " + std::to_string(fd);
            }
        }
    return result;
}

constexpr double tolerance = 1e-6;  // double precision, h = 1e-6: truncation + rounding stay below 1e-7 here

#define CHECK_PROGRAM(...)                       \
    do {                                         \
        const auto r = check_program(__VA_ARGS__); \
        INFO(r.where);                           \
        CHECK(r.worst < tolerance);              \
    } while (0)

}  // namespace

TEST_CASE("xla graph: element-wise gradient rules match finite differences", "[xla_graph]") {
    CHECK_PROGRAM({f32({2, 3}), f32({2, 3})}, [](gx::graph&, const std::vector<var>& x) { return (x[0] + x[1]) * (x[0] - x[1]) * 1.5 - x[1]; });
    CHECK_PROGRAM({f32({2, 3}), f32({2, 3})}, [](gx::graph&, const std::vector<var>& x) { return x[0] / x[1]; }, 0.5, 2.0);
    CHECK_PROGRAM({f32({4}), f32({4})}, [](gx::graph&, const std::vector<var>& x) { return maximum(x[0], x[1]); });
    CHECK_PROGRAM({f32({5})}, [](gx::graph&, const std::vector<var>& x) { return -exp(x[0]) + tanh(x[0]) * logistic(x[0]); });
    CHECK_PROGRAM({f32({5})}, [](gx::graph&, const std::vector<var>& x) { return log(x[0]) + sqrt(x[0]); }, 0.5, 2.0);
    CHECK_PROGRAM({f32({6}), f32({6})}, [](gx::graph&, const std::vector<var>& x) {
        return select(compare(x[0], x[1], gx::compare_direction::LT), x[0] * x[0], x[1]);
    });
}

TEST_CASE("xla graph: stop_gradient passes values and blocks gradients", "[xla_graph]") {
    gx::graph g;
    const var x = g.input(f32({3}));
    const var loss = sum(x * stop_gradient(x), {0});  // d/dx = stop_gradient(x) = x, not 2x
    const auto r = gx::evaluate(g, {{f32({3}), {1.0, -2.0, 0.5}}}, {loss, gx::gradients(loss, {x})[0]});
    CHECK(r[0].data[0] == Approx(5.25));
    CHECK(r[1].data == std::vector<double>{1.0, -2.0, 0.5});
}

TEST_CASE("xla graph: dot, reductions and shape gradient rules match finite differences", "[xla_graph]") {
    for (std::int64_t ca : {0, 1})
        for (std::int64_t cb : {0, 1}) {
            INFO("contracting dimensions " << ca << ", " << cb);
            const auto a = ca == 1 ? f32({3, 4}) : f32({4, 3});
            const auto b = cb == 0 ? f32({4, 2}) : f32({2, 4});
            CHECK_PROGRAM({a, b}, [=](gx::graph&, const std::vector<var>& x) { return dot(x[0], x[1], ca, cb); });
        }
    CHECK_PROGRAM({f32({2, 3, 4})}, [](gx::graph&, const std::vector<var>& x) { return sum(x[0], {0, 2}); });
    CHECK_PROGRAM({f32({2, 3, 4})}, [](gx::graph&, const std::vector<var>& x) { return sum(x[0], {0, 1, 2}); });
    CHECK_PROGRAM({f32({3, 5})}, [](gx::graph&, const std::vector<var>& x) { return max(x[0], {1}); });
    CHECK_PROGRAM({f32({3})}, [](gx::graph&, const std::vector<var>& x) { return broadcast_in_dim(x[0], {2, 3}, {1}); });
    CHECK_PROGRAM({f32({1, 3})}, [](gx::graph&, const std::vector<var>& x) { return broadcast_in_dim(x[0], {4, 3}, {0, 1}); });
    CHECK_PROGRAM({f32({})}, [](gx::graph&, const std::vector<var>& x) { return broadcast_to(x[0], {2, 2}); });
    CHECK_PROGRAM({f32({2, 6})}, [](gx::graph&, const std::vector<var>& x) { return reshape(x[0], {3, 4}) * 2.0; });
    CHECK_PROGRAM({f32({2, 3, 4})}, [](gx::graph&, const std::vector<var>& x) { return transpose(x[0], {2, 0, 1}); });
    CHECK_PROGRAM({f32({3, 7})}, [](gx::graph&, const std::vector<var>& x) { return logsumexp_last(x[0] * 3.0); });
    CHECK_PROGRAM({f32({3, 5, 2})}, [](gx::graph&, const std::vector<var>& x) { return slice(x[0], {1, 2, 0}, {3, 5, 1}); });
    CHECK_PROGRAM({f32({2, 3})}, [](gx::graph&, const std::vector<var>& x) { return pad(x[0] * x[0], {1, 0}, {0, 2}); });
    CHECK_PROGRAM({f32({2, 1}), f32({2, 3}), f32({2, 2})}, [](gx::graph&, const std::vector<var>& x) {
        return gx::concatenate({x[0], x[1] * x[1], x[2]}, 1);
    });
    // floor: a step function (gradient zero); the values are kept away from its jumps
    CHECK_PROGRAM({f32({4})}, [](gx::graph&, const std::vector<var>& x) { return floor(x[0] * 0.0 + 2.5) * x[0]; });
    // softplus (max(x, 0) + log(1 + exp(-|x|))): smooth although its parts have kinks at 0
    CHECK_PROGRAM({f32({6})}, [](gx::graph&, const std::vector<var>& x) { return gx::softplus(x[0] * 3.0); });
    // cross-entropy: only the logits are differentiated (the targets are class ids)
    CHECK_PROGRAM({f32({4, 6}), f32({4})}, [](gx::graph&, const std::vector<var>& x) { return gx::cross_entropy(x[0], x[1]); }, -1.5, 1.5,
                  1, {}, [](std::vector<gx::host_value>& v) { v[1].data = {5, 0, 2, 2}; });
}

TEST_CASE("xla graph: the linear_scan primitive evaluates the recurrence and its adjoint matches finite differences", "[xla_graph]") {
    const auto chunked = olmax::xla::stablehlo::scan_strategy::chunked_matmul<4>();
    {
        gx::graph g;  // values: from the start, and from the end
        const var a = g.input(f32({2, 5})), x = g.input(f32({2, 5}));
        const std::vector<gx::host_value> in{{f32({2, 5}), {0.5, 0.5, 0.5, 0.5, 0.5, 1, 2, 0, 1, 1}}, {f32({2, 5}), {1, 1, 1, 1, 1, 1, 1, 1, 1, 1}}};
        const auto r = gx::evaluate(g, in, {gx::linear_scan_rows(a, x, chunked), gx::linear_scan_rows(a, x, chunked, true)});
        CHECK(r[0].data == std::vector<double>{1, 1.5, 1.75, 1.875, 1.9375, 1, 3, 1, 2, 3});
        CHECK(r[1].data == std::vector<double>{1.9375, 1.875, 1.75, 1.5, 1, 4, 3, 1, 2, 1});
    }
    // gates in [-1.2, 1.2] (negative and above one too), both directions, T = 1 and a longer row;
    // the result is squared so that the adjoint's own gradient path (delta times h) is exercised
    for (bool reverse : {false, true})
        for (std::int64_t steps : {1, 7}) {
            INFO((reverse ? "reverse" : "forward") << ", T = " << steps);
            CHECK_PROGRAM({f32({3, steps}), f32({3, steps})}, [=](gx::graph&, const std::vector<var>& x) {
                const var h = gx::linear_scan_rows(x[0], x[1], chunked, reverse);
                return h * h;
            }, -1.2, 1.2);
        }
    // the layer op: any axis, through transposes and reshapes
    CHECK_PROGRAM({f32({2, 5, 3}), f32({2, 5, 3})}, [](gx::graph&, const std::vector<var>& x) { return gx::linear_scan(x[0], x[1], 1); }, -1.2, 1.2);
    // the gradient of the gradient (a scan inside a differentiated layer loop body needs it)
    CHECK_PROGRAM({f32({2, 6}), f32({2, 6})}, [=](gx::graph&, const std::vector<var>& x) {
        const var h = gx::linear_scan_rows(x[0], x[1], chunked);
        return gx::gradients(sum(h * h * h, {0, 1}), {x[0]})[0];
    }, -1.0, 1.0);
}

TEST_CASE("xla graph: the layer loop's gradient (scan_layers) matches finite differences", "[xla_graph]") {
    // carry [2, 3]; per layer W [3, 3], b [3]; shared s [3]; the layer index enters the body too
    const auto body = gx::trace_layer(f32({2, 3}), {f32({3, 3}), f32({3})}, {f32({3})},
                                      [](gx::graph&, const var& h, const std::vector<var>& p, const std::vector<var>& s, const var& index) {
                                          const var pre = matmul(h, p[0]) + broadcast_in_dim(p[1], {2, 3}, {1});
                                          return h + broadcast_in_dim(s[0], {2, 3}, {1}) * tanh(pre) * broadcast_to(index + 1.0, {2, 3});
                                      });
    CHECK_PROGRAM({f32({2, 3}), f32({4, 3, 3}), f32({4, 3}), f32({3})},
                  [&](gx::graph&, const std::vector<var>& x) { return scan_layers(body, x[0], {x[1], x[2]}, {x[3]}); });
}

TEST_CASE("xla graph: all_reduce_sum lowers to one cross-replica sum and is the identity on one replica", "[xla_graph]") {
    CHECK_PROGRAM({f32({2, 3})}, [](gx::graph&, const std::vector<var>& x) { return all_reduce_sum(x[0] * x[0], 1); });
    gx::graph g;
    const var x = g.input(f32({4}));
    const var loss = sum(all_reduce_sum(x * x, 4), {0});
    const var grad = gx::gradients(loss, {x})[0];  // the gradient is all-reduced too
    const std::string text = gx::emit(g, "dp", {loss, grad}).text;
    CHECK(text.find("replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>") != std::string::npos);
    std::size_t reductions = 0;
    for (auto at = text.find("\"stablehlo.all_reduce\""); at != std::string::npos; at = text.find("\"stablehlo.all_reduce\"", at + 1)) ++reductions;
    CHECK(reductions == 2);
    CHECK_THROWS_WITH(gx::evaluate(g, {{f32({4}), {1, 2, 3, 4}}}, {loss}), Catch::Contains("one replica"));
    CHECK_THROWS_WITH(all_reduce_sum(x, 0), Catch::Contains("replicas must be positive"));
}

TEST_CASE("xla graph: the checker catches a wrong gradient rule", "[xla_graph]") {
    // tanh's derivative written as 1 - y (instead of 1 - y^2): the finite differences must disagree
    const auto wrong_rule = [](const var& loss, const std::vector<var>& wrt) {
        // loss = sum(tanh(x) * w) with w the last input: d loss / dx = w * (1 - tanh(x))  (wrong)
        const var w = loss.owner().input_vars().back();
        return std::vector<var>{w * (1.0 - tanh(wrt[0]))};
    };
    const auto r = check_program({f32({4})}, [](gx::graph&, const std::vector<var>& x) { return tanh(x[0]); }, -1.5, 1.5, SIZE_MAX, wrong_rule);
    CHECK(r.worst > 0.05);
}

TEST_CASE("xla graph: slice, pad, concatenate and floor evaluate as StableHLO defines them", "[xla_graph]") {
    gx::graph g;
    const var x = g.input(f32({2, 3}));
    const var pieces = gx::concatenate({slice(x, {0, 1}, {2, 3}), pad(slice(x, {1, 0}, {2, 1}), {1, 0}, {0, 0})}, 1);  // [2, 3]
    const var down = floor(x * 0.5);
    const auto r = gx::evaluate(g, {{f32({2, 3}), {1, 2, 3, 4, 5, 6}}}, {pieces, down});
    CHECK(r[0].data == std::vector<double>{2, 3, 0, 5, 6, 4});
    CHECK(r[1].data == std::vector<double>{0, 1, 1, 2, 2, 3});
    CHECK_THROWS_WITH(slice(x, {0, 2}, {2, 4}), Catch::Contains("slice: [2, 4) is out of range for dimension 1"));
    CHECK_THROWS_WITH(pad(x, {0, -1}, {0, 0}), Catch::Contains("pad: negative padding"));
    CHECK_THROWS_WITH(gx::concatenate({x, g.input(f32({3, 3}))}, 1), Catch::Contains("differ outside axis 1"));
    const std::string text = gx::emit(g, "pieces", {pieces, down}).text;
    for (const char* op : {"stablehlo.slice", "stablehlo.pad", "stablehlo.concatenate", "stablehlo.floor"}) {
        INFO(op);
        CHECK(text.find(op) != std::string::npos);
    }
}

TEST_CASE("xla graph: bad programs fail while they are built, naming the primitive", "[xla_graph]") {
    gx::graph g, other;
    const var a = g.input(f32({2, 3})), b = g.input(f32({3, 2}));
    CHECK_THROWS_WITH(a + b, Catch::Contains("add") && Catch::Contains("tensor<2x3xf32>"));
    CHECK_THROWS_WITH(matmul(a, a), Catch::Contains("dot") && Catch::Contains("contracting sizes differ"));
    CHECK_THROWS_WITH(sum(a, {2}), Catch::Contains("reduce_sum") && Catch::Contains("axis 2"));
    CHECK_THROWS_WITH(reshape(a, {4}), Catch::Contains("reshape") && Catch::Contains("changes the size"));
    CHECK_THROWS_WITH(transpose(a, {0, 0}), Catch::Contains("transpose"));
    CHECK_THROWS_WITH(broadcast_in_dim(a, {3, 3}, {0, 1}), Catch::Contains("broadcast_in_dim"));
    CHECK_THROWS_WITH(a + other.input(f32({2, 3})), Catch::Contains("another graph"));
    CHECK_THROWS_WITH(gx::gradients(a, {a}), Catch::Contains("non-scalar"));
    CHECK_THROWS_WITH(gx::evaluate(g, {}, {a}), Catch::Contains("0 inputs"));
    CHECK_THROWS_AS(var().type(), gx::graph_error);

    // the gradient loop has no gradient rule of its own: second derivatives through it are refused by name
    const auto body = gx::trace_layer(f32({2}), {f32({2})}, {}, [](gx::graph&, const var& h, const std::vector<var>& p, const std::vector<var>&,
                                                                  const var&) { return tanh(h * p[0]); });
    gx::graph h;
    const var x = h.input(f32({2})), w = h.input(f32({3, 2}));
    const var loss = sum(scan_layers(body, x, {w}, {}), {0});
    const var gw = gx::gradients(loss, {w})[0];
    CHECK_THROWS_WITH(gx::gradients(sum(gw, {0, 1}), {w}), Catch::Contains("no gradient rule for scan_layers_backward"));
    CHECK_THROWS_WITH(scan_layers(body, x, {h.input(f32({3, 4}))}, {}), Catch::Contains("stacked parameter 0"));
}

TEST_CASE("xla graph: the whole step's module does not grow with depth", "[xla_graph]") {
    auto module_of = [](std::int64_t depth) {
        gx::residual_lm_shape shape;
        shape.depth = depth;
        const auto step = gx::trace_residual_lm_step(shape, {});
        return gx::emit(*step.g, "residual_lm_step", step.results);
    };
    const auto shallow = module_of(4), deep = module_of(256);
    auto count = [](const std::string& text, const std::string& what) {
        std::size_t n = 0;
        for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
        return n;
    };
    INFO("depth 4: " << shallow.text.size() << " bytes, depth 256: " << deep.text.size() << " bytes");
    // the depth appears only in the stacked parameters' types: "4x" -> "256x", two bytes each time
    CHECK(double(deep.text.size()) < 1.02 * double(shallow.text.size()));
    CHECK(count(deep.text, "\"stablehlo.while\"") == 2);  // the layers forward, and their gradient
    CHECK(count(deep.text, "\"stablehlo.dot_general\"") == count(shallow.text, "\"stablehlo.dot_general\""));
    CHECK(shallow.inputs.size() == 16 + 2);
    CHECK(shallow.outputs.size() == 1 + 16);
}
