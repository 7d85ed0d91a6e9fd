// tests/unit/test_op_rules.cpp's generic check on the real OpenXLA CPU plugin: every registered op
// rule (olmax's and the toy ops of docs/ARCHITECTURE.md, whose primitive lowers itself), each
// sample its key gives, traced for the CPU and compiled and run by the plugin, outputs and
// gradients against the eager op in double. Tolerance: float32 on the plugin, sums in XLA's order:
// every element within 1e-4 * (1 + |eager|) (measured: at most 2.3e-7). And max and maximum on NaN
// inputs: the plugin's NaN values and gradients where the eager ops have them (with XLA's
// fast min/max off).

#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include <olmax/xla/graph/emit.hpp>
#include <olmax/xla/pjrt_runtime.hpp>

#include "op_rules_check.hpp"
#include "op_rules_toy.hpp"
#include "xla/cpu_plugin.hpp"

namespace {

/// An evaluator that compiles the program for the plugin and runs it (counting runs in `runs`).
olmax_test::op_rule_evaluator plugin_evaluator(std::shared_ptr<olmax::xla::pjrt::client> client, std::size_t* runs = nullptr) {
    namespace gx = olmax::xla::graph;
    return [client, runs](const gx::graph& g, const std::vector<gx::var>& results, const std::vector<gx::host_value>& inputs) {
        std::vector<std::vector<float>> values;
        std::vector<const float*> pointers;
        for (const auto& in : inputs) values.emplace_back(in.data.begin(), in.data.end());
        for (const auto& v : values) pointers.push_back(v.data());
        std::vector<std::vector<double>> out;
        for (const auto& r : client->run(gx::emit(g, "op_rule", results), pointers)) out.emplace_back(r.begin(), r.end());
        if (runs) ++*runs;
        return out;
    };
}

}  // namespace

TEST_CASE("op rules: every registered op's program on the CPU plugin gives its eager values and gradients", "[cpu_plugin][op_rules]") {
    namespace gx = olmax::xla::graph;
    std::size_t runs = 0;
    const olmax_test::op_rule_evaluator on_plugin = plugin_evaluator(olmax_test::cpu_client(), &runs);
    const auto entries = olmax::backend::trace::rules().entries();
    REQUIRE(entries.size() >= olmax::op::all::size + 2);
    double worst = 0;
    for (const auto& entry : entries) {
        INFO("op " << entry.name);
        const auto report = olmax_test::check_op_rule(entry, on_plugin, 1e-4, {"cpu"});
        INFO(olmax_test::failure_lines(report.failures));
        CHECK(report.failures.empty());
        worst = std::max(worst, report.worst);
    }
    INFO(entries.size() << " ops, " << runs << " programs run on the plugin; the largest error " << worst);
    CHECK(worst <= 1e-4);
}

// XLA:CPU drops a NaN that is maximum's second operand unless xla_cpu_enable_fast_min_max is off
// (docs/xla.md, section 3): CTest runs this case alone, as xla.pjrt_cpu_plugin_nan, with
// XLA_FLAGS=--xla_cpu_enable_fast_min_max=false (XLA reads the flags once per process).
TEST_CASE("op rules: max, maximum and minimum with NaN inputs and a tie on the CPU plugin give the eager ops' values and gradients", "[cpu_plugin][fast_min_max_off]") {
    const auto failures = olmax_test::check_nan_max(plugin_evaluator(olmax_test::cpu_client()));
    INFO(olmax_test::failure_lines(failures));
    CHECK(failures.empty());
}

TEST_CASE("op rules: softmax, log_softmax and logsumexp of lines masked with -inf on the CPU plugin give the eager ops' values and gradients", "[cpu_plugin]") {
    const auto failures = olmax_test::check_masked_softmax(plugin_evaluator(olmax_test::cpu_client()));
    INFO(olmax_test::failure_lines(failures));
    CHECK(failures.empty());
}

TEST_CASE("op rules: cross_entropy of logits with masked (-inf) entries on the CPU plugin gives the eager op's loss and gradient", "[cpu_plugin]") {
    const auto failures = olmax_test::check_masked_cross_entropy(plugin_evaluator(olmax_test::cpu_client()));
    INFO(olmax_test::failure_lines(failures));
    CHECK(failures.empty());
}

TEST_CASE("op rules: the element-wise ops of math::rules on the CPU plugin match the eager ops at 0, -0, their kinks, +-inf and NaN", "[cpu_plugin]") {
    const auto failures = olmax_test::check_math_rules_special(plugin_evaluator(olmax_test::cpu_client()));
    INFO(olmax_test::failure_lines(failures));
    CHECK(failures.empty());
}
