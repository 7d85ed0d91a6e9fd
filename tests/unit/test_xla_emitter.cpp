// Fast tests of the StableHLO emitter on the modules programs emit, the traced program's (golden
// text, SSA structure, HIGHEST precision on every dot, the scan forms' step counts, shapes, errors),
// and of the compile options the runtime sends. Numerical checks of emitted modules against a real
// XLA are in tests/xla (label xla).

#include <cctype>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <olmax/xla/graph/evaluate.hpp>
#include <olmax/xla/xla.hpp>

#include "test_helpers.hpp"

namespace shlo = olmax::xla::stablehlo;
namespace gx = olmax::xla::graph;
using Catch::Matchers::Contains;
using olmax_test::count_of;

namespace {

/// The SSA names on a line, in order: `%12`, `%arg0`, `%b7` (a `#i` result suffix is dropped).
std::vector<std::string> ssa_names(const std::string& line) {
    std::vector<std::string> names;
    for (std::size_t at = line.find('%'); at != std::string::npos; at = line.find('%', at + 1)) {
        std::size_t end = at + 1;
        while (end < line.size() && std::isalnum(static_cast<unsigned char>(line[end]))) ++end;
        if (end > at + 1) names.push_back(line.substr(at, end - at));
    }
    return names;
}

/// Every SSA value is defined once and before its first use (results `%N` / `%N:k`, arguments,
/// block arguments), and @main's return types match the module's declared outputs.
void check_ssa(const shlo::emitted_module& m) {
    INFO(m.key);
    std::set<std::string> defined;
    std::istringstream lines(m.text);
    std::string line;
    std::getline(lines, line);  // module @name {
    std::getline(lines, line);  // func.func public @main(%arg0: ..., ...)
    for (const auto& name : ssa_names(line)) CHECK(defined.insert(name).second);
    CHECK(defined.size() == m.inputs.size());
    while (std::getline(lines, line)) {
        const auto names = ssa_names(line);
        if (names.empty()) continue;
        if (line.find("^bb0(") != std::string::npos) {  // block arguments
            for (const auto& name : names) CHECK(defined.insert(name).second);
            continue;
        }
        const std::size_t first = line.find_first_not_of(' ');
        const bool defines = line.compare(first, 1, "%") == 0;  // "%N = ..." or "%N:k = ..."
        for (std::size_t i = defines ? 1 : 0; i < names.size(); ++i) {
            INFO(line);
            CHECK(defined.count(names[i]) == 1);
        }
        if (defines) CHECK(defined.insert(names[0]).second);
    }
    std::string outputs;
    for (std::size_t i = 0; i < m.outputs.size(); ++i) outputs += (i ? ", " : "") + m.outputs[i].str();
    CHECK_THAT(m.text, Contains("-> (" + outputs + ") {"));
    CHECK_THAT(m.text, Contains("\"func.return\"("));
}

std::vector<shlo::scan_strategy> all_strategies() {
    return {shlo::scan_strategy::sequential(), shlo::scan_strategy::hillis_steele(), shlo::scan_strategy::chunked_matmul<128>(),
            shlo::scan_strategy::hillis_steele_chunked()};
}

/// The module of one linear scan over [rows, steps] (from the end with `reverse`).
shlo::emitted_module emitted_scan(const shlo::scan_strategy& strategy, std::int64_t rows, std::int64_t steps, bool reverse = false) {
    gx::graph g;
    const gx::var a = g.input(gx::f32({rows, steps})), x = g.input(gx::f32({rows, steps}));
    return gx::emit(g, "scan_" + strategy.name() + (reverse ? "_reverse" : ""), {gx::linear_scan(a, x, strategy, reverse)});
}

}  // namespace

TEST_CASE("xla emitter: golden text of an element-wise module (generic op form)", "[xla]") {
    gx::graph g;
    const gx::var a = g.input(gx::f32({2, 3})), b = g.input(gx::f32({2, 3}));
    const auto m = gx::emit(g, "binary", {a + b});
    CHECK(m.key.rfind("binary.", 0) == 0);
    CHECK(m.text ==
          "module @binary {\n"
          "  func.func public @main(%arg0: tensor<2x3xf32>, %arg1: tensor<2x3xf32>) -> (tensor<2x3xf32>) {\n"
          "    %0 = \"stablehlo.add\"(%arg0, %arg1) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>\n"
          "    \"func.return\"(%0) : (tensor<2x3xf32>) -> ()\n"
          "  }\n"
          "}\n");
}

TEST_CASE("xla emitter: infinities and NaN are written as their f32 bits in hex; a max reduction starts from -inf", "[xla]") {
    // "-inf" is no MLIR literal; before, reduce_max started from the lowest finite float, so on
    // the device a line of -inf (a fully masked row) reduced to -3.4e38 instead of -inf.
    gx::graph g;
    const gx::var x = g.input(gx::f32({2, 3}));
    const auto m = gx::emit(g, "special", {gx::max(x, {1}), gx::constant(g, std::numeric_limits<double>::infinity(), gx::f32({2})),
                                           gx::constant(g, std::numeric_limits<double>::quiet_NaN(), gx::f32({2}))});
    CHECK_THAT(m.text, Contains("dense<0xFF800000> : tensor<f32>"));
    CHECK_THAT(m.text, Contains("dense<0x7F800000> : tensor<2xf32>"));
    CHECK_THAT(m.text, Contains("dense<0x7FC00000> : tensor<2xf32>"));
    CHECK(m.text.find("inf") == std::string::npos);
    CHECK(m.text.find("nan") == std::string::npos);
    CHECK(m.text.find("e+38") == std::string::npos);
    const auto out = gx::evaluate(g, {gx::host_value{x.type(), {-INFINITY, -INFINITY, -INFINITY, 1, -INFINITY, 2}}}, {gx::max(x, {1})});
    CHECK(out[0].data == std::vector<double>{-INFINITY, 2});
}

TEST_CASE("xla emitter: golden text of a matmul with HIGHEST precision", "[xla]") {
    gx::graph g;
    const gx::var a = g.input(gx::f32({4, 5})), b = g.input(gx::f32({6, 5}));
    const auto m = gx::emit(g, "matmul", {gx::dot(a, b, 1, 1)});
    CHECK(m.inputs[1] == shlo::f32({6, 5}));
    CHECK_THAT(m.text, Contains("%0 = \"stablehlo.dot_general\"(%arg0, %arg1) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [], "
                                "rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]>, "
                                "precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]} : "
                                "(tensor<4x5xf32>, tensor<6x5xf32>) -> tensor<4x6xf32>"));
}

TEST_CASE("xla emitter: every module is well formed and every dot is HIGHEST precision", "[xla]") {
    std::vector<shlo::emitted_module> modules;
    {
        gx::graph g;
        const gx::var a = g.input(gx::f32({3, 4})), b = g.input(gx::f32({4, 5})), dc = g.input(gx::f32({3, 5}));
        const gx::var c = gx::matmul(a, b);
        const auto d = gx::gradient_of(c, {dc}, {true, true});  // the dot's gradient rule: two more dots
        modules.push_back(gx::emit(g, "matmul_and_gradient", {c, d[0], d[1]}));
    }
    {
        gx::graph g;
        const gx::var a = g.input(gx::f32({2, 3, 4})), b = g.input(gx::f32({2, 4, 5}));
        modules.push_back(gx::emit(g, "batched_matmul", {gx::matmul(a, b)}));
    }
    {
        gx::graph g;
        const gx::var x = g.input(gx::f32({7})), y = g.input(gx::f32({3, 4}));
        modules.push_back(gx::emit(g, "unary_and_reduce", {gx::exp(x), gx::max(y, {1})}));
    }
    for (const auto& s : all_strategies())
        for (std::int64_t steps : {1, 129, 300}) {
            modules.push_back(emitted_scan(s, 2, steps));
            gx::graph g;  // the scan with its adjoint (its gradient rule: the scan the other way)
            const gx::var a = g.input(gx::f32({2, steps})), x = g.input(gx::f32({2, steps})), dh = g.input(gx::f32({2, steps}));
            const gx::var h = gx::linear_scan(a, x, s);
            const auto d = gx::gradient_of(h, {dh}, {true, true});
            modules.push_back(gx::emit(g, "scan_adjoint_" + s.name() + "_" + std::to_string(steps), {h, d[0], d[1]}));
        }
    std::set<std::string> keys;
    for (const auto& m : modules) {
        check_ssa(m);
        CHECK(keys.insert(m.key).second);
        CHECK(count_of(m.text, "precision HIGHEST") == 2 * count_of(m.text, "\"stablehlo.dot_general\""));
        CHECK(count_of(m.text, "f64") == 0);
        CHECK(m.text.rfind("module @", 0) == 0);
        CHECK_THAT(m.text, Contains("func.func public @main("));
    }
}

TEST_CASE("xla emitter: Hillis-Steele scan unrolls ceil(log2 T) steps", "[xla]") {
    for (auto [steps, expected] : std::vector<std::pair<std::int64_t, std::size_t>>{{1, 0}, {2, 1}, {129, 8}, {4096, 12}}) {
        INFO("T = " << steps);
        const auto m = emitted_scan(shlo::scan_strategy::hillis_steele(), 2, steps);
        CHECK(count_of(m.text, "\"stablehlo.add\"") == expected);  // each step adds one shifted, gated term
        CHECK(count_of(m.text, "\"stablehlo.while\"") == 0);
    }
}

TEST_CASE("xla emitter: sequential scan is one stablehlo.while over T steps", "[xla]") {
    const auto m = emitted_scan(shlo::scan_strategy::sequential(), 3, 50);
    CHECK(count_of(m.text, "\"stablehlo.while\"") == 1);
    CHECK(count_of(m.text, "\"stablehlo.return\"") == 2);  // cond and body regions
    CHECK_THAT(m.text, Contains("dense<50> : tensor<i32>"));
    CHECK_THAT(m.text, Contains("comparison_direction LT"));
    CHECK(count_of(m.text, "\"stablehlo.dynamic_update_slice\"") == 1);
}

TEST_CASE("xla emitter: the hillis_steele_chunked scan loops over the steps of one chunk, then doubles over the chunks", "[xla]") {
    // T = 50: chunks of 8 steps (auto: the smallest L with L^2 >= T), 7 blocks, time padded to 56.
    const auto m = emitted_scan(shlo::scan_strategy::hillis_steele_chunked(), 3, 50);
    CHECK(count_of(m.text, "\"stablehlo.while\"") == 1);
    CHECK_THAT(m.text, Contains("dense<8> : tensor<i32>"));
    CHECK(count_of(m.text, "\"stablehlo.dynamic_update_slice\"") == 2);  // h_local and the gates' running product
    CHECK(count_of(m.text, "\"stablehlo.dot_general\"") == 0);
    CHECK(shlo::scan_strategy::hillis_steele_chunked(16).name() == "hillis_steele_chunked16");
    // One chunk (L >= T): no carries to combine, so no doubling after the loop, and no padding.
    const auto one = emitted_scan(shlo::scan_strategy::hillis_steele_chunked(64), 3, 50);
    CHECK_THAT(one.text, Contains("dense<50> : tensor<i32>"));
    CHECK(count_of(one.text, "\"stablehlo.pad\"") == 0);
}

TEST_CASE("xla emitter: a negative hillis_steele_chunked chunk is refused", "[xla]") {
    CHECK_THROWS_AS(emitted_scan(shlo::scan_strategy::hillis_steele_chunked(-1), 2, 8), olmax::value_error);
}

TEST_CASE("xla emitter: chunked_matmul<128> uses a per-chunk 128x128 triangular matrix on the matrix unit", "[xla]") {
    const auto m = emitted_scan(shlo::scan_strategy::chunked_matmul<128>(), 3, 4096);
    CHECK(m.key.rfind("scan_chunked_matmul128.", 0) == 0);
    CHECK_THAT(m.text, Contains("tensor<3x32x128x128xf32>"));  // one matrix per (row, chunk)
    CHECK_THAT(m.text, Contains("\"stablehlo.iota\"() {iota_dimension = 0 : i64} : () -> tensor<128x128xi32>"));
    CHECK_THAT(m.text, Contains("lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], "
                                "rhs_contracting_dimensions = [2]"));
    CHECK(count_of(m.text, "\"stablehlo.dot_general\"") == 1);
    CHECK(count_of(m.text, "\"stablehlo.exponential\"") == 0);  // no exp(log-gate) differences: log 0 = -inf
    CHECK(count_of(m.text, "\"stablehlo.divide\"") == 0);       // no P_i / P_j: underflow
    // A ragged T is padded to whole chunks and cropped back.
    const auto ragged = emitted_scan(shlo::scan_strategy::chunked_matmul<128>(), 3, 129);
    CHECK_THAT(ragged.text, Contains("tensor<3x2x128x128xf32>"));
    CHECK_THAT(ragged.text, Contains("-> tensor<3x129xf32>"));
    const auto small = emitted_scan(shlo::scan_strategy::chunked_matmul<8>(), 1, 64);
    CHECK_THAT(small.text, Contains("tensor<1x8x8x8xf32>"));
}

TEST_CASE("xla emitter: a scan from the end, and a scan's adjoint, are scans of time-reversed rows", "[xla]") {
    const auto m = emitted_scan(shlo::scan_strategy::hillis_steele(), 2, 16, true);
    CHECK(m.outputs.size() == 1);
    CHECK(count_of(m.text, "\"stablehlo.reverse\"") == 3);  // gates and x in, h out
    gx::graph g;
    const gx::var a = g.input(gx::f32({2, 16})), x = g.input(gx::f32({2, 16})), dh = g.input(gx::f32({2, 16}));
    const auto d = gx::gradient_of(gx::linear_scan(a, x, shlo::scan_strategy::hillis_steele()), {dh}, {true, true});
    const auto adjoint = gx::emit(g, "adjoint", {d[0], d[1]});
    CHECK(count_of(adjoint.text, "\"stablehlo.reverse\"") == 3);
    CHECK(adjoint.outputs == std::vector<shlo::tensor_type>{shlo::f32({2, 16}), shlo::f32({2, 16})});
}

TEST_CASE("xla emitter: bad shapes and sizes throw naming the op", "[xla]") {
    shlo::function_builder b({shlo::f32({2, 3}), shlo::f32({4, 5})});
    CHECK_THROWS_WITH(b.dot_general(b.arg(0), b.arg(1), {}, {}, {1}, {0}), Contains("stablehlo.dot_general") && Contains("2x3"));
    CHECK_THROWS_AS(b.add(b.arg(0), b.arg(1)), olmax::shape_error);
    CHECK_THROWS_AS(b.reshape(b.arg(0), {7}), olmax::shape_error);
    CHECK_THROWS_AS(b.slice(b.arg(0), {0, 0}, {3, 3}), olmax::shape_error);
    CHECK_THROWS_AS(b.broadcast_in_dim(b.arg(0), {2, 4}, {0, 1}), olmax::shape_error);
    gx::graph g;
    const gx::var row = g.input(gx::f32({8}));
    CHECK_THROWS_WITH(gx::linear_scan(row, row, shlo::scan_strategy::hillis_steele()), Contains("linear_scan takes [B, T, ...]") && Contains("tensor<8xf32>"));
}

TEST_CASE("xla: compile-options bytes encode 1 replica x 1 partition, device_ordinal -1", "[xla]") {
    const auto& bytes = olmax::xla::compile_options_bytes;
    REQUIRE(sizeof bytes == 17);
    CHECK(bytes[0] == ((3 << 3) | 2));  // field 3 executable_build_options, length-delimited
    CHECK(bytes[1] == sizeof bytes - 2);
    CHECK(bytes[2] == ((1 << 3) | 0));  // device_ordinal varint: -1 as ten bytes
    for (int i = 3; i < 12; ++i) CHECK(bytes[i] == 0xFF);
    CHECK(bytes[12] == 0x01);
    CHECK((bytes[13] == ((4 << 3) | 0) && bytes[14] == 1));  // num_replicas = 1
    CHECK((bytes[15] == ((5 << 3) | 0) && bytes[16] == 1));  // num_partitions = 1
}
