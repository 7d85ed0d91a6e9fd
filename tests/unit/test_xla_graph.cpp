// The traced-program IR of the XLA path (olmax/xla/graph): primitives evaluate as StableHLO
// defines them, bad programs fail while they are built naming the primitive, and the emitter writes
// the ops named. The primitives' gradients are the tracer's (tests/unit/test_trace.cpp checks them
// against finite differences); running modules on a real PJRT plugin is in tests/xla/.

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <olmax/xla/graph/emit.hpp>
#include <olmax/xla/graph/evaluate.hpp>

namespace gx = olmax::xla::graph;
using gx::dims_t;
using gx::f32;
using gx::var;

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

TEST_CASE("xla graph: a dense constant (a host tensor a traced op reads) evaluates and emits its exact values", "[xla_graph]") {
    gx::graph g;
    const var c = gx::dense_constant(g, {1.0f, -2.5f, 0.1f, 3.0f}, f32({2, 2}));
    const auto r = gx::evaluate(g, {}, {c * 2.0});
    CHECK(r[0].data == std::vector<double>{2.0, -5.0, double(0.1f) * 2, 6.0});
    const std::string text = gx::emit(g, "constant", {c}).text;
    CHECK(text.find("dense<\"0x0000803F000020C0CDCCCC3D00004040\"> : tensor<2x2xf32>") != std::string::npos);  // little-endian float bytes
    CHECK_THROWS_WITH(gx::dense_constant(g, {1.0f}, f32({2})), Catch::Contains("1 values for tensor<2xf32>"));
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
