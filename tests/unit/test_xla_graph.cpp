// The traced-program IR of the XLA path (olmax/xla/graph): primitives evaluate as StableHLO
// defines them, bad programs fail while they are built naming the primitive, the emitter writes the
// ops named, the registry holds every primitive once, and every primitive's gradient rule matches
// central finite differences of its double-precision evaluation (tests/unit/test_trace.cpp checks
// the ops' rules built from them, through the tape); running modules on a real PJRT plugin is in
// tests/xla/.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <olmax/xla/graph/emit.hpp>
#include <olmax/xla/graph/evaluate.hpp>

namespace gx = olmax::xla::graph;
using gx::dims_t;
using gx::f32;
using gx::var;

namespace {

/// One application of a primitive for its gradient check: `apply` builds it on the graph's inputs
/// of `inputs` (values uniform in [lo, hi]) and returns the outputs of its node (the first
/// identifies it).
struct graph_gradient_case {
    std::string_view primitive;
    std::vector<gx::tensor_type> inputs;
    std::function<std::vector<var>(gx::graph&, const std::vector<var>&)> apply;
    double lo = -1.5, hi = 1.5;
};

std::vector<var> one_output(const var& y) { return {y}; }

std::vector<graph_gradient_case> graph_gradient_cases() {
    const gx::tensor_type m23 = f32({2, 3});
    using V = const std::vector<var>&;
    std::vector<graph_gradient_case> cases{
        {"add", {m23, m23}, [](gx::graph&, V x) { return one_output(x[0] + x[1]); }},
        {"subtract", {m23, m23}, [](gx::graph&, V x) { return one_output(x[0] - x[1]); }},
        {"multiply", {m23, m23}, [](gx::graph&, V x) { return one_output(x[0] * x[1]); }},
        {"divide", {m23, m23}, [](gx::graph&, V x) { return one_output(x[0] / x[1]); }, 0.5, 2.0},
        {"maximum", {m23, m23}, [](gx::graph&, V x) { return one_output(gx::maximum(x[0], x[1])); }},
        {"negate", {m23}, [](gx::graph&, V x) { return one_output(-x[0]); }},
        {"exponential", {m23}, [](gx::graph&, V x) { return one_output(gx::exp(x[0])); }},
        {"log", {m23}, [](gx::graph&, V x) { return one_output(gx::log(x[0])); }, 0.5, 2.0},
        {"log_plus_one", {m23}, [](gx::graph&, V x) { return one_output(gx::log1p(x[0])); }, -0.5, 2.0},
        {"tanh", {m23}, [](gx::graph&, V x) { return one_output(gx::tanh(x[0])); }},
        {"logistic", {m23}, [](gx::graph&, V x) { return one_output(gx::logistic(x[0])); }},
        {"sqrt", {m23}, [](gx::graph&, V x) { return one_output(gx::sqrt(x[0])); }, 0.5, 2.0},
        {"select", {m23, m23, m23, m23},
         [](gx::graph&, V x) { return one_output(gx::select(gx::compare(x[0], x[1], gx::compare_direction::GT), x[2], x[3])); }},
        {"broadcast_in_dim", {f32({3, 1})}, [](gx::graph&, V x) { return one_output(gx::broadcast_in_dim(x[0], {2, 3, 4}, {1, 2})); }},
        {"reshape", {m23}, [](gx::graph&, V x) { return one_output(gx::reshape(x[0], {3, 2})); }},
        {"transpose", {f32({2, 3, 4})}, [](gx::graph&, V x) { return one_output(gx::transpose(x[0], {2, 0, 1})); }},
        {"slice", {f32({4, 5})}, [](gx::graph&, V x) { return one_output(gx::slice(x[0], {1, 2}, {3, 5})); }},
        {"pad", {m23}, [](gx::graph&, V x) { return one_output(gx::pad(x[0], {1, 0}, {0, 2})); }},
        {"concatenate", {m23, f32({2, 1})}, [](gx::graph&, V x) { return one_output(gx::concatenate({x[0], x[1]}, 1)); }},
        {"reduce_sum", {f32({2, 3, 4})}, [](gx::graph&, V x) { return one_output(gx::sum(x[0], {0, 2})); }},
        {"reduce_max", {f32({2, 3, 4})}, [](gx::graph&, V x) { return one_output(gx::max(x[0], {1})); }},
        {"all_reduce_sum", {f32({3})}, [](gx::graph&, V x) { return one_output(gx::all_reduce_sum(x[0], 1)); }},
        {"gather_rows", {f32({4, 3})},
         [](gx::graph& g, V x) { return one_output(gx::gather_rows(x[0], gx::dense_constant(g, {2, 0, 2}, f32({3})))); }},
        {"scatter_add_rows", {f32({3, 2})},
         [](gx::graph& g, V x) { return one_output(gx::scatter_add_rows(x[0], gx::dense_constant(g, {1, 1, 3}, f32({3})), 4)); }},
        {"linear_scan", {f32({2, 5}), f32({2, 5})},
         [](gx::graph&, V x) { return one_output(gx::linear_scan(x[0], x[1], olmax::xla::stablehlo::scan_strategy::sequential())); }, 0.5, 1.0},
        {"linear_scan", {f32({1, 4, 2}), f32({1, 4, 2})},
         [](gx::graph&, V x) { return one_output(gx::linear_scan(x[0], x[1], olmax::xla::stablehlo::scan_strategy::sequential(), true)); }},
        {"matrix_scan", {f32({2, 4, 3, 3}), f32({2, 4, 3, 2})}, [](gx::graph&, V x) { return one_output(gx::matrix_scan(x[0], x[1])); }, -0.8, 0.8},
        {"matrix_scan", {f32({1, 3, 2, 2}), f32({1, 3, 2, 3})}, [](gx::graph&, V x) { return one_output(gx::matrix_scan(x[0], x[1], true)); }},
        {"selective_scan", {f32({1, 5, 2}), f32({1, 5, 2}), f32({2, 3}), f32({1, 5, 3}), f32({1, 5, 3}), f32({1, 2, 3})},
         [](gx::graph& g, V x) {  // u, delta, A, B, C, h0; keep resets at step 3
             const var keep = gx::dense_constant(g, {1, 1, 1, 0, 1}, f32({1, 5}));
             return gx::selective_scan(x[0], x[1], x[2], x[3], x[4], keep, x[5], 2);
         }},
    };
    for (std::int64_t lc : {0, 1})  // every contracting layout, and a batch of matrices
        for (std::int64_t rc : {0, 1})
            cases.push_back({"dot", {lc ? f32({2, 3}) : f32({3, 2}), rc ? f32({4, 3}) : f32({3, 4})},
                             [lc, rc](gx::graph&, V x) { return one_output(gx::dot(x[0], x[1], lc, rc)); }});
    cases.push_back({"dot", {f32({2, 3, 4}), f32({2, 4, 2})}, [](gx::graph&, V x) { return one_output(gx::matmul(x[0], x[1])); }});
    return cases;
}

/// The largest |rule - central difference| / max(1, |central difference|) over every element of
/// every input of `c` that is an operand of its node, for loss = sum over outputs of sum(y * w).
double graph_gradient_error(const graph_gradient_case& c, std::string& where) {
    gx::graph g;
    std::vector<var> x;
    for (const auto& t : c.inputs) x.push_back(g.input(t));
    const std::vector<var> y = c.apply(g, x);
    const gx::primitive_info& info = g.at(y[0].node()).kind.info();
    REQUIRE(info.name == c.primitive);
    const std::size_t differentiated = info.differentiated_outputs ? info.differentiated_outputs : y.size();
    std::vector<var> w;
    var loss;
    for (std::size_t k = 0; k < differentiated; ++k) {
        w.push_back(g.input(gx::tensor_type(y[k].type())));
        std::vector<std::int64_t> axes;
        for (std::size_t a = 0; a < y[k].type().rank(); ++a) axes.push_back(std::int64_t(a));
        const var term = axes.empty() ? y[k] * w[k] : gx::sum(y[k] * w[k], axes);
        loss = loss.defined() ? loss + term : term;
    }
    const std::vector<var> operands = g.at(y[0].node()).operands;
    const std::vector<var> dx = gx::gradient_of(y[0], w, std::vector<bool>(operands.size(), true));
    std::mt19937 rng(11);
    std::uniform_real_distribution<double> uniform(c.lo, c.hi);
    std::vector<gx::host_value> values;
    for (auto i : g.inputs()) {
        const auto& type = g.at(i).outputs[0];
        gx::host_value v{type, std::vector<double>(std::size_t(type.elements()))};
        for (auto& e : v.data) e = uniform(rng);
        values.push_back(v);
    }
    double worst = 0;
    const double h = 1e-6;
    for (std::size_t i = 0; i < operands.size(); ++i) {
        const auto at = std::find(x.begin(), x.end(), operands[i]);
        if (at == x.end()) continue;  // a constant or a predicate: no gradient to check
        REQUIRE(dx[i].defined());
        const std::size_t k = std::size_t(at - x.begin());
        const auto analytic = gx::evaluate(g, values, {dx[i]})[0].data;
        for (std::size_t e = 0; e < values[k].data.size(); ++e) {
            auto plus = values, minus = values;
            plus[k].data[e] += h;
            minus[k].data[e] -= h;
            const double fd = (gx::evaluate(g, plus, {loss})[0].data[0] - gx::evaluate(g, minus, {loss})[0].data[0]) / (2 * h);
            const double err = std::abs(analytic[e] - fd) / std::max(1.0, std::abs(fd));
            if (err > worst) {
                worst = err;
                where = std::string(c.primitive) + ": operand " + std::to_string(i) + " element " + std::to_string(e) + ": rule " +
                        std::to_string(analytic[e]) + ", finite difference " + std::to_string(fd);
            }
        }
    }
    return worst;
}

}  // namespace

TEST_CASE("xla graph: the registry holds each primitive once, in order, with its parts", "[xla_graph]") {
    std::set<std::string_view> names;
    for (std::size_t i = 0; i < gx::primitive_table.size(); ++i) {
        const gx::primitive_info& p = *gx::primitive_table[i];
        INFO(p.name);
        CHECK(p.index == i);
        CHECK(names.insert(p.name).second);
        CHECK(p.emit != nullptr);
        CHECK(p.evaluate != nullptr);
        CHECK(gx::find_primitive(p.name) == &p);
    }
    CHECK(gx::find_primitive("no_such_primitive") == nullptr);
    gx::graph g;
    const var x = g.input(f32({2}));
    CHECK(g.at(gx::exp(x).node()).is<gx::prim::exponential>());
    CHECK(gx::op_name(g.at(gx::sum(x, {0}).node()).kind) == "reduce_sum");
    CHECK(gx::find_primitive("scan_layers")->gradient_in_tracer);
    CHECK(gx::find_primitive("floor")->gradient == nullptr);
    CHECK_THROWS_WITH(gx::gradient_of(gx::floor(x), {x}, {true}), Catch::Contains("floor has no gradient rule"));
}

TEST_CASE("xla graph: every primitive's gradient rule matches finite differences of its evaluation", "[xla_graph]") {
    const auto cases = graph_gradient_cases();
    std::set<std::string_view> checked;
    for (const auto& c : cases) {
        std::string where;
        const double worst = graph_gradient_error(c, where);
        INFO(where);
        CHECK(worst < 1e-6);
        checked.insert(c.primitive);
    }
    for (const gx::primitive_info* p : gx::primitive_table) {  // a new primitive with a rule needs a case above
        INFO(p->name);
        CHECK((p->gradient == nullptr || checked.count(p->name) == 1));
    }
}

TEST_CASE("xla graph: the linear_scan primitive evaluates the recurrence from the start and from the end", "[xla_graph]") {
    for (const auto& strategy : {olmax::xla::stablehlo::scan_strategy::chunked_matmul<4>(), olmax::xla::stablehlo::scan_strategy::sequential()}) {
        gx::graph g;
        const var a = g.input(f32({2, 5})), x = g.input(f32({2, 5}));
        const std::vector<gx::host_value> in{{f32({2, 5}), {0.5, 0.5, 0.5, 0.5, 0.5, 1, 2, 0, 1, 1}}, {f32({2, 5}), {1, 1, 1, 1, 1, 1, 1, 1, 1, 1}}};
        const auto r = gx::evaluate(g, in, {gx::linear_scan(a, x, strategy), gx::linear_scan(a, x, strategy, true)});
        CHECK(r[0].data == std::vector<double>{1, 1.5, 1.75, 1.875, 1.9375, 1, 3, 1, 2, 3});
        CHECK(r[1].data == std::vector<double>{1.9375, 1.875, 1.75, 1.5, 1, 4, 3, 1, 2, 1});
        // Time along axis 1 of [1, 5, 2]: the same two rows, interleaved.
        gx::graph g3;
        const var a3 = g3.input(f32({1, 5, 2})), x3 = g3.input(f32({1, 5, 2}));
        const std::vector<gx::host_value> in3{{f32({1, 5, 2}), {0.5, 1, 0.5, 2, 0.5, 0, 0.5, 1, 0.5, 1}}, {f32({1, 5, 2}), std::vector<double>(10, 1.0)}};
        const auto r3 = gx::evaluate(g3, in3, {gx::linear_scan(a3, x3, strategy), gx::linear_scan(a3, x3, strategy, true)});
        CHECK(r3[0].data == std::vector<double>{1, 1, 1.5, 3, 1.75, 1, 1.875, 2, 1.9375, 3});
        CHECK(r3[1].data == std::vector<double>{1.9375, 4, 1.875, 3, 1.75, 1, 1.5, 2, 1, 1});
    }
}

TEST_CASE("xla graph: the matrix_scan primitive evaluates h_t = M_t h_{t-1} + X_t from the start and from the end", "[xla_graph]") {
    gx::graph g;
    const var m = g.input(f32({1, 3, 2, 2})), x = g.input(f32({1, 3, 2, 1}));
    // M_0 = M_1 = the swap [[0, 1], [1, 0]], M_2 = 2 I; every X_t = (1, 0)
    const std::vector<gx::host_value> in{{f32({1, 3, 2, 2}), {0, 1, 1, 0, 0, 1, 1, 0, 2, 0, 0, 2}}, {f32({1, 3, 2, 1}), {1, 0, 1, 0, 1, 0}}};
    const auto r = gx::evaluate(g, in, {gx::matrix_scan(m, x), gx::matrix_scan(m, x, true)});
    CHECK(r[0].data == std::vector<double>{1, 0, 1, 1, 3, 2});  // (1, 0), swap + (1, 0), 2 (1, 1) + (1, 0)
    CHECK(r[1].data == std::vector<double>{2, 1, 1, 1, 1, 0});  // from the end: (1, 0), swap + (1, 0), swap (1, 1) + (1, 0)
    CHECK_THROWS_WITH(gx::matrix_scan(g.input(f32({1, 3, 2, 3})), x), Catch::Contains("matrix_scan takes gates [B, n, K, K]") &&
                                                                          Catch::Contains("tensor<1x3x2x3xf32>"));
    CHECK_THROWS_WITH(gx::matrix_scan(m, g.input(f32({1, 4, 2, 1}))), Catch::Contains("matrix_scan takes gates"));
}

TEST_CASE("xla graph: a dense constant (a host tensor a traced op reads) evaluates and emits its exact values", "[xla_graph]") {
    gx::graph g;
    const var c = gx::dense_constant(g, {1.0f, -2.5f, 0.1f, 3.0f}, f32({2, 2}));
    const auto r = gx::evaluate(g, {}, {c * 2.0});
    CHECK(r[0].data == std::vector<double>{2.0, -5.0, double(0.1f) * 2, 6.0});
    const std::string text = gx::emit(g, "constant", {c}).text;
    CHECK(text.find("dense<\"0x0000803F000020C0CDCCCC3D00004040\"> : tensor<2x2xf32>") != std::string::npos);  // little-endian float bytes
    CHECK_THROWS_WITH(gx::dense_constant(g, {1.0f}, f32({2})), Catch::Contains("1 values for tensor<2xf32>"));
    // equal finite values are one splat (a host tensor of ones is one number of program text, not
    // one per element); -0.0 is not 0.0, and NaN stays in the hex form
    gx::graph h;
    const var ones = gx::dense_constant(h, std::vector<float>(1000, 1.5f), f32({10, 100}));
    CHECK_FALSE(h.at(ones.node()).values);
    CHECK(gx::evaluate(h, {}, {ones})[0].data == std::vector<double>(1000, 1.5));
    const std::string splat = gx::emit(h, "splat", {ones}).text;
    CHECK(splat.find("dense<1.500000000e+00> : tensor<10x100xf32>") != std::string::npos);
    CHECK(splat.size() < 1000);
    CHECK(h.at(gx::dense_constant(h, {0.0f, -0.0f}, f32({2})).node()).values);
    CHECK(h.at(gx::dense_constant(h, {std::nanf(""), std::nanf("")}, f32({2})).node()).values);
}

TEST_CASE("xla graph: all_reduce_sum lowers to one cross-replica sum and is the identity on one replica", "[xla_graph]") {
    gx::graph g;
    const var x = g.input(f32({4}));
    const var loss = sum(all_reduce_sum(x * x, 4), {0});
    const std::string text = gx::emit(g, "dp", {loss}).text;
    CHECK(text.find("replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>") != std::string::npos);
    CHECK_THROWS_WITH(gx::evaluate(g, {{f32({4}), {1, 2, 3, 4}}}, {loss}), Catch::Contains("one replica"));
    CHECK_THROWS_WITH(all_reduce_sum(x, 0), Catch::Contains("replicas must be positive"));
    gx::graph one;
    const var y = one.input(f32({2}));
    CHECK(gx::evaluate(one, {{f32({2}), {1.5, -2}}}, {all_reduce_sum(y, 1)})[0].data == std::vector<double>{1.5, -2});
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

TEST_CASE("xla graph: maximum and reduce_max give NaN where an operand is NaN, in either position", "[xla_graph]") {
    // stablehlo.maximum is IEEE 754's maximum, which propagates NaN, and so do the eager ops; the
    // evaluation once used std::max, which returns its first operand when the second is NaN.
    const double nan = std::numeric_limits<double>::quiet_NaN();
    gx::graph g;
    const var a = g.input(f32({4})), b = g.input(f32({4})), x = g.input(f32({2, 3}));
    const auto r = gx::evaluate(g, {{f32({4}), {1, nan, 3, nan}}, {f32({4}), {nan, 2, -1, nan}}, {f32({2, 3}), {1, nan, 2, 5, 4, 3}}},
                                {gx::maximum(a, b), gx::max(x, {1}), gx::max(x, {0})});
    CHECK(std::isnan(r[0].data[0]));
    CHECK(std::isnan(r[0].data[1]));
    CHECK(r[0].data[2] == 3);
    CHECK(std::isnan(r[0].data[3]));
    CHECK(std::isnan(r[1].data[0]));  // NaN after a larger value: not dropped
    CHECK(r[1].data[1] == 5);
    CHECK(r[2].data[0] == 5);
    CHECK(std::isnan(r[2].data[1]));  // NaN first, then 4
    CHECK(r[2].data[2] == 3);
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
    CHECK_THROWS_WITH(gx::evaluate(g, {}, {a}), Catch::Contains("0 inputs"));
    CHECK_THROWS_AS(var().type(), gx::graph_error);

    // a layer loop's parameters must be stacked along the depth axis of the body's
    const auto body = gx::trace_layer(f32({2}), {f32({2})}, {}, [](gx::graph&, const var& h, const std::vector<var>& p, const std::vector<var>&,
                                                                  const var&) { return tanh(h * p[0]); });
    gx::graph h;
    const var x = h.input(f32({2}));
    CHECK_THROWS_WITH(scan_layers(body, x, {h.input(f32({3, 4}))}, {}), Catch::Contains("stacked parameter 0"));
}
