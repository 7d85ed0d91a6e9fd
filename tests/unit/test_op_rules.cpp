// Every op's traced form equals its eager form, checked from the registry (PyTorch's OpInfo idea,
// on olmax's own registry of typed op keys): one test walks backend::trace::rules(), the rules an
// op's traced branch finds by its key, and for each registered op runs every sample its key gives
// (several shapes, broadcasts where the op broadcasts, each attribute form) eagerly in double and
// traced for three targets, comparing outputs and gradients (tests/op_rules_check.hpp says how).
// A new op with a rule is covered without a test of its own; a registered op without samples fails.
//
// Tolerances: the eager op runs in double on the samples' float32 values and the traced program
// is evaluated by the graph's double-precision reference evaluation (xla/graph/evaluate.hpp), so
// the two agree up to double rounding and the order of sums: every output and gradient element
// within 1e-9 * (1 + |eager|) (measured: at most 2.4e-16). tests/xla/test_op_rules_plugin.cpp
// runs the same check on the real XLA CPU plugin in float32 (1e-4).
//
// Every op that has a traced branch has a rule, as a compile-time property rather than a test
// over the sources: an op names its rule by a key type (`on.run<op::slice>(...)`), so a
// misspelt key does not compile; every key of olmax derives from op::registered<K>, which does not
// compile unless K is an entry of the registry op::all (ops/op_keys.hpp); and trace/rules.hpp,
// which registers the rule of every entry, does not compile when an entry has no `lower` overload
// (the static_asserts below state the same of every entry). Keys outside op::all (the toy ops of
// op_rules_toy.hpp, an op of yours such as unruled_op.hpp's) find their rule at trace time, and
// one without a rule fails there naming the op (and the layer, inside a stack).
//
// The toy ops of op_rules_toy.hpp (one with its own primitive) are docs/ARCHITECTURE.md's worked
// examples, verbatim (checked by tests/docs/check_doc_excerpts.py): they register themselves like
// any op, so the generic test checks them too.

#include <catch2/catch.hpp>

#include <cmath>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <olmax/olmax.hpp>
#include <olmax/trace/trace.hpp>
#include <olmax/xla/graph/emit.hpp>

#include "op_rules_check.hpp"
#include "op_rules_toy.hpp"
#include "test_helpers.hpp"
#include "unruled_op.hpp"

namespace {

using olmax::Tensor;
namespace bt = olmax::backend::trace;

constexpr double oprules_tolerance = 1e-9;  // double rounding and the order of sums (see the top)

olmax_test::op_rule_report oprules_check(const bt::op_entry& entry) {
    return olmax_test::check_op_rule(entry, olmax_test::op_rule_reference, oprules_tolerance);
}

/// The entry of key K in `registry`.
template <class K>
bt::op_entry oprules_entry(const bt::rule_registry& registry) {
    const auto e = registry.find(std::type_index(typeid(K)));
    REQUIRE(e.has_value());
    return *e;
}

template <class K>
constexpr bool oprules_complete = olmax::trace::detail::lowered<K> && bt::detail::has_samples<K>;

template <class... K>
constexpr bool oprules_all_complete(olmax::op::key_list<K...>) {
    return (oprules_complete<K> && ...);
}

template <class... K>
void oprules_each_registered(olmax::op::key_list<K...>, std::vector<std::string>& missing) {
    auto one = [&](std::string_view name, bool ok) {
        if (!ok) missing.emplace_back(name);
    };
    (one(K::name, bt::has_rule<K>() && static_cast<bool>(oprules_entry<K>(bt::rules()).samples)), ...);
}

/// A key without samples, for the check's own test.
struct oprules_unsampled_key {
    static constexpr std::string_view name = "unsampled";
    struct attrs {};
};

}  // namespace

TEST_CASE("op rules: every registered op's traced value and gradient equal its eager ones", "[op_rules]") {
    const std::vector<bt::op_entry> entries = bt::rules().entries();
    REQUIRE(entries.size() >= olmax::op::all::size + 2);  // olmax's and the two toy ops above
    double worst = 0;
    std::size_t samples = 0;
    for (const bt::op_entry& entry : entries) {
        INFO("op " << entry.name);
        const auto report = oprules_check(entry);
        INFO(olmax_test::failure_lines(report.failures));
        CHECK(report.failures.empty());
        CHECK(report.samples >= 1);
        worst = std::max(worst, report.worst);
        samples += report.samples;
    }
    INFO(entries.size() << " ops, " << samples << " samples, each traced for 3 targets; the largest error " << worst);
    CHECK(worst <= oprules_tolerance);
}

TEST_CASE("op rules: every entry of op::all has its rule, samples and eager form, at compile time and in the registry", "[op_rules]") {
    // Compile time: trace/rules.hpp's register_all would not compile otherwise; stated again here.
    static_assert(oprules_all_complete(olmax::op::all{}), "an entry of op::all lacks its rule, samples or eager form");
    // Run time: the registry the ops' traced branches read holds each of them, with its samples.
    std::vector<std::string> missing;
    oprules_each_registered(olmax::op::all{}, missing);
    INFO(olmax_test::failure_lines(missing));
    CHECK(missing.empty());
    // The toy ops of docs/ARCHITECTURE.md registered themselves the same way.
    CHECK(bt::has_rule<toy_ops::softcap_key>());
    CHECK(bt::has_rule<toy_ops::cube_key>());
}

TEST_CASE("op rules: the check reports a planted wrong rule, a wrong gradient and an op without samples", "[op_rules]") {
    namespace p = olmax::trace::primitives;
    // A registry of the test's own, which the toy op's traced branch reads while `scope` lives.
    bt::rule_registry local;
    bt::registry_scope scope(local);

    local.add<toy_ops::cube_key>([](bt::traced_inputs in, const toy_ops::cube_key::attrs&) {
        return olmax::trace::primitives::apply(toy_ops::cube_primitive::make(olmax::trace::var_of(in[0])), {in[0]});
    });
    CHECK(oprules_check(oprules_entry<toy_ops::cube_key>(local)).failures.empty());  // the right rule passes here too

    local.add<toy_ops::cube_key>([](bt::traced_inputs in, const toy_ops::cube_key::attrs&) {
        return bt::traced_outputs{p::mul(in[0], in[0])};  // planted: x^2 instead of x^3
    });
    const auto wrong_value = oprules_check(oprules_entry<toy_ops::cube_key>(local));
    INFO(olmax_test::failure_lines(wrong_value.failures));
    CHECK(!wrong_value.failures.empty());
    CHECK_THAT(olmax_test::failure_lines(wrong_value.failures), Catch::Contains("toy_cube: sample 0") && Catch::Contains("output 0 differs"));

    local.add<toy_ops::cube_key>([](bt::traced_inputs in, const toy_ops::cube_key::attrs&) {
        // planted: the right value, recorded with the gradient of the identity
        const Tensor<float> y = olmax::trace::wrap(toy_ops::cube_primitive::make(olmax::trace::var_of(in[0])));
        return bt::traced_outputs{p::add(y, p::sub(in[0], olmax::trace::wrap(olmax::trace::var_of(in[0]))))};
    });
    const auto wrong_gradient = oprules_check(oprules_entry<toy_ops::cube_key>(local));
    const std::string lines = olmax_test::failure_lines(wrong_gradient.failures);
    INFO(lines);
    CHECK(lines.find("output 0 differs") == std::string::npos);
    CHECK_THAT(lines, Catch::Contains("the gradient of input 0 differs"));

    local.add<oprules_unsampled_key>([](bt::traced_inputs in, const oprules_unsampled_key::attrs&) { return bt::traced_outputs{in[0]}; });
    CHECK_THAT(olmax_test::failure_lines(oprules_check(oprules_entry<oprules_unsampled_key>(local)).failures),
               Catch::Contains("unsampled: the op has a rule but no samples"));
}

TEST_CASE("op rules: an op whose key has no rule fails at trace time naming the op", "[op_rules]") {
    olmax::trace::tracing t;
    const Tensor<float> x = t.input<float>({2, 3});
    CHECK_THROWS_WITH(olmax_test::hardtanh(x), Catch::Contains("the op 'my_hardtanh' has no lowering rule"));  // a key outside op::all
    bt::rule_registry empty;
    bt::registry_scope scope(empty);  // no rule where this thread looks: olmax's ops fail the same way
    CHECK_THROWS_WITH(olmax::tanh(x), Catch::Contains("the op 'tanh' has no lowering rule"));
    CHECK_THROWS_WITH(toy_ops::softcap(x, 2.0), Catch::Contains("the op 'toy_softcap' has no lowering rule"));
}

TEST_CASE("op rules: the toy primitive lowers to StableHLO", "[op_rules]") {
    olmax::trace::tracing t;
    const Tensor<float> x = t.input<float>({3});
    const Tensor<float> y = toy_ops::cube(x);
    const std::string text = olmax::xla::graph::emit(t.graph(), "toy", {olmax::trace::var_of(y)}).text;
    CHECK(olmax_test::count_of(text, "stablehlo.multiply") == 2);
}
