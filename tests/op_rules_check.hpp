#pragma once
// The eager-traced check of one registered op rule (PyTorch's OpInfo idea, olmax's registry): for
// each sample its key gives (backend::trace::op_entry::samples), the op runs eagerly in double on
// the sample's values, and the same call runs on traced float32 tensors (the op's traced branch,
// its lowering rule) inside a program that also holds the tape's gradients. Both are reduced to
// one scalar loss = sum_k sum(output_k * W_k) with fixed random weights W_k, differentiated by the
// eager tape and by the traced program's tape; the program's outputs and gradients are then
// evaluated by `evaluate` (tests/unit/test_op_rules.cpp: the graph's double-precision reference
// evaluation; tests/xla/test_op_rules_plugin.cpp: the real XLA CPU plugin) and compared with the
// eager ones. Every sample runs once per traced target ("cpu", "cuda", "tpu"), whose rules may
// take other forms (a scan: a loop, log-depth doubling, chunked products).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <olmax/olmax.hpp>
#include <olmax/trace/trace.hpp>
#include <olmax/xla/graph/evaluate.hpp>

namespace olmax_test {

/// Evaluates `results` of a traced program's graph on its inputs' values (one per graph input, in
/// order); returns each result's values, row-major.
using op_rule_evaluator = std::function<std::vector<std::vector<double>>(const olmax::xla::graph::graph&, const std::vector<olmax::xla::graph::var>&,
                                                                         const std::vector<olmax::xla::graph::host_value>&)>;

/// What the check found for one op: one line per disagreement (empty: the op passes).
struct op_rule_report {
    std::size_t samples = 0;  // samples run (each on every target)
    double worst = 0;         // the largest error seen, values and gradients
    std::vector<std::string> failures;
};

/// The failures of a check, one per line (for INFO).
inline std::string failure_lines(const std::vector<std::string>& failures) {
    std::string out;
    for (const auto& f : failures) out += f + "\n";
    return out;
}

/// The graph's double-precision reference evaluation (xla/graph/evaluate.hpp).
inline std::vector<std::vector<double>> op_rule_reference(const olmax::xla::graph::graph& g, const std::vector<olmax::xla::graph::var>& results,
                                                          const std::vector<olmax::xla::graph::host_value>& inputs) {
    std::vector<std::vector<double>> out;
    for (auto& v : olmax::xla::graph::evaluate(g, inputs, results)) out.push_back(std::move(v.data));
    return out;
}

/// Checks every sample of `entry` on every target: outputs and the gradients of the inputs that
/// take one, |traced - eager| <= tolerance * (1 + |eager|) elementwise.
inline op_rule_report check_op_rule(const olmax::backend::trace::op_entry& entry, const op_rule_evaluator& evaluate, double tolerance,
                                    const std::vector<std::string>& targets = {"cpu", "cuda", "tpu"}, std::uint64_t seed = 55) {
    namespace gx = olmax::xla::graph;
    namespace tr = olmax::trace;
    namespace p = olmax::trace::primitives;
    using olmax::Shape;
    using olmax::Tensor;
    op_rule_report report;
    auto fail = [&](const std::string& what) { report.failures.push_back(std::string(entry.name) + ": " + what); };
    if (!entry.samples) {
        fail("the op has a rule but no samples: its key needs `samples(Generator&)` and `eager<T>(inputs, attrs)`");
        return report;
    }
    olmax::Generator rng(seed);
    const std::vector<olmax::backend::trace::bound_sample> samples = entry.samples(rng);
    if (samples.empty()) fail("its key's samples() gave none");
    for (std::size_t si = 0; si < samples.size(); ++si) {
        const auto& s = samples[si];
        std::ostringstream where;
        where << "sample " << si << " (inputs";
        for (const auto& x : s.inputs) where << ' ' << (x.defined() ? olmax::to_string(x.shape()) : std::string("none"));
        where << ')';
        auto wants_grad = [&](std::size_t i) { return s.inputs[i].defined() && std::find(s.constant.begin(), s.constant.end(), i) == s.constant.end(); };
        bool any_grad = false;
        for (std::size_t i = 0; i < s.inputs.size(); ++i) any_grad = any_grad || wants_grad(i);

        // The eager reference, in double on the sample's (float) values.
        std::vector<Tensor<double>> xd;
        for (std::size_t i = 0; i < s.inputs.size(); ++i) {
            if (!s.inputs[i].defined()) {
                xd.emplace_back();
                continue;
            }
            Tensor<double> t(s.inputs[i].shape());
            for (std::size_t e = 0; e < t.size(); ++e) t.data()[e] = double(s.inputs[i].data()[e]);
            if (wants_grad(i)) t.set_requires_grad(true);
            xd.push_back(t);
        }
        const std::vector<Tensor<double>> yd = s.eager(xd);
        olmax::Generator wrng(seed + si);
        std::vector<Tensor<float>> weights;
        for (const auto& y : yd) weights.push_back(olmax::rand<float>(y.shape(), wrng, -1.0f, 1.0f));
        std::vector<std::vector<double>> expected;
        std::vector<std::string> labels;
        for (const auto& y : yd) {
            labels.push_back("output " + std::to_string(expected.size()));
            expected.emplace_back(y.begin(), y.end());
        }
        if (any_grad) {
            Tensor<double> loss;
            for (std::size_t k = 0; k < yd.size(); ++k) {
                Tensor<double> w(weights[k].shape());
                for (std::size_t e = 0; e < w.size(); ++e) w.data()[e] = double(weights[k].data()[e]);
                const Tensor<double> term = olmax::sum(olmax::mul(yd[k], w));
                loss = loss.defined() ? olmax::add(loss, term) : term;
            }
            if (loss.requires_grad()) loss.backward();
            for (std::size_t i = 0; i < xd.size(); ++i) {
                if (!wants_grad(i)) continue;
                const Tensor<double> g = xd[i].grad();
                labels.push_back("the gradient of input " + std::to_string(i));
                expected.push_back(g.defined() ? std::vector<double>(g.begin(), g.end()) : std::vector<double>(xd[i].size(), 0.0));
            }
        }

        for (const std::string& target : targets) {
            const std::string at = where.str() + ", traced for '" + target + "'";
            std::vector<std::vector<double>> got;
            try {
                tr::tracing t;
                t.set_target(target);
                std::vector<Tensor<float>> xt;
                std::vector<gx::host_value> values;
                for (std::size_t i = 0; i < s.inputs.size(); ++i) {
                    if (!s.inputs[i].defined()) {
                        xt.emplace_back();
                        continue;
                    }
                    Tensor<float> x = t.input<float>(s.inputs[i].shape());
                    if (wants_grad(i)) x.set_requires_grad(true);
                    values.push_back({tr::var_of(x).type(), std::vector<double>(s.inputs[i].begin(), s.inputs[i].end())});
                    xt.push_back(x);
                }
                const std::vector<Tensor<float>> yt = s.traced(xt);
                if (yt.size() != yd.size()) {
                    fail(at + ": the traced op gave " + std::to_string(yt.size()) + " outputs, the eager one " + std::to_string(yd.size()));
                    continue;
                }
                std::vector<gx::var> results;
                bool shapes_agree = true;
                for (std::size_t k = 0; k < yt.size(); ++k) {
                    if (yt[k].shape() != yd[k].shape()) {
                        fail(at + ": output " + std::to_string(k) + " is " + olmax::to_string(yt[k].shape()) + " traced, " +
                             olmax::to_string(yd[k].shape()) + " eager");
                        shapes_agree = false;
                    }
                    results.push_back(tr::var_of(yt[k]));
                }
                if (!shapes_agree) continue;
                if (any_grad) {
                    Tensor<float> loss;
                    for (std::size_t k = 0; k < yt.size(); ++k) {
                        const Tensor<float> w = olmax::backend::trace::as_float(weights[k]);  // a constant of the program
                        std::vector<std::int64_t> all;
                        for (std::size_t a = 0; a < yt[k].rank(); ++a) all.push_back(std::int64_t(a));
                        const Tensor<float> term = p::sum(p::mul(yt[k], w), all, false);
                        loss = loss.defined() ? p::add(loss, term) : term;
                    }
                    if (loss.requires_grad()) loss.backward();
                    for (std::size_t i = 0; i < xt.size(); ++i) {
                        if (!wants_grad(i)) continue;
                        const Tensor<float> g = xt[i].grad();
                        results.push_back(g.defined() ? tr::var_of(g) : gx::constant(t.graph(), 0.0, tr::var_of(xt[i]).type()));
                    }
                }
                got = evaluate(t.graph(), results, values);
            } catch (const std::exception& e) {
                fail(at + ": threw " + e.what());
                continue;
            }
            if (got.size() != expected.size()) {
                fail(at + ": " + std::to_string(got.size()) + " results evaluated, expected " + std::to_string(expected.size()));
                continue;
            }
            for (std::size_t r = 0; r < expected.size(); ++r) {
                const std::string& what = labels[r];
                if (got[r].size() != expected[r].size()) {
                    fail(at + ": " + what + " has " + std::to_string(got[r].size()) + " values, expected " + std::to_string(expected[r].size()));
                    continue;
                }
                double worst = 0;
                std::size_t worst_at = 0;
                for (std::size_t e = 0; e < got[r].size(); ++e) {
                    const double err = std::abs(got[r][e] - expected[r][e]) / (1.0 + std::abs(expected[r][e]));
                    if (!(err <= worst)) worst = err, worst_at = e;  // NaN counts as worst
                }
                report.worst = std::max(report.worst, std::isnan(worst) ? INFINITY : worst);
                if (!(worst <= tolerance)) {
                    std::ostringstream line;
                    line << at << ": " << what << " differs: element " << worst_at << " is " << got[r][worst_at] << " traced, "
                         << expected[r][worst_at] << " eager (error " << worst << " > " << tolerance << ")";
                    fail(line.str());
                }
            }
        }
        ++report.samples;
    }
    return report;
}

/// `f` (eager ops on float tensors) on `inputs` that hold special values (NaN, infinities), run
/// eagerly and traced: its outputs and the gradients of sum_k sum(output_k * W_k) (W_k = 1, 2, 3,
/// ... over each output's elements) with respect to every input, the traced ones evaluated by
/// `evaluate`, rounded to f32 as the program holds them. Returns one line per element that
/// differs: NaN must meet NaN, an infinity the same infinity, a number the eager one within
/// `tolerance` relative (at least 1 in the denominator).
/// `expect_case` checks the eager outputs are the case the caller means (empty: they are).
template <class F>
std::vector<std::string> check_special_values(const op_rule_evaluator& evaluate, const std::vector<olmax::Tensor<float>>& inputs, F f,
                                              const std::vector<std::string>& names, double tolerance,
                                              const std::function<std::string(const std::vector<olmax::Tensor<float>>&)>& expect_case = {}) {
    namespace gx = olmax::xla::graph;
    namespace tr = olmax::trace;
    using olmax::Tensor;
    auto run = [&](std::vector<Tensor<float>> xs) {
        for (auto& x : xs) x.set_requires_grad(true);
        std::vector<Tensor<float>> out = f(xs);
        Tensor<float> loss;
        for (const auto& y : out) {
            Tensor<float> w(y.shape());
            for (std::size_t e = 0; e < w.size(); ++e) w.data()[e] = float(e + 1);
            const Tensor<float> term = olmax::sum(olmax::mul(y, w));
            loss = loss.defined() ? olmax::add(loss, term) : term;
        }
        loss.backward();
        for (const auto& x : xs) out.push_back(x.grad());
        return out;
    };
    std::vector<Tensor<float>> copies;
    for (const auto& x : inputs) copies.push_back(x.clone());
    const std::vector<Tensor<float>> expected = run(copies);
    std::vector<std::string> failures;
    if (expect_case) {
        const std::string wrong = expect_case(expected);
        if (!wrong.empty()) failures.push_back("the eager ops are not the case meant: " + wrong);
    }
    tr::tracing t;
    std::vector<Tensor<float>> traced_in;
    std::vector<gx::host_value> values;
    for (const auto& x : inputs) {
        traced_in.push_back(t.input<float>(x.shape()));
        values.push_back(gx::host_value{tr::var_of(traced_in.back()).type(), std::vector<double>(x.begin(), x.end())});
    }
    const std::vector<Tensor<float>> traced = run(traced_in);
    std::vector<gx::var> results;
    for (const auto& r : traced) results.push_back(tr::var_of(r));
    const auto got = evaluate(t.graph(), results, values);
    for (std::size_t k = 0; k < expected.size(); ++k) {
        const std::string name = k < names.size() ? names[k] : "result " + std::to_string(k);
        if (got.at(k).size() != expected[k].size()) {
            failures.push_back(name + ": " + std::to_string(got[k].size()) + " elements, expected " + std::to_string(expected[k].size()));
            continue;
        }
        for (std::size_t e = 0; e < expected[k].size(); ++e) {
            // the traced value as the f32 program holds it (the reference evaluates in double, so
            // 1e-30 ^ -1.5 is a number there and -inf in f32)
            const double want = double(expected[k].data()[e]), have = double(static_cast<float>(got[k][e]));
            const bool same = std::isnan(want)   ? std::isnan(have)
                              : std::isinf(want) ? have == want
                                                 : std::abs(have - want) <= tolerance * std::max(1.0, std::abs(want));
            if (!same) {
                std::ostringstream line;
                line << name << " element " << e << ": eager " << want << ", traced " << have;
                failures.push_back(line.str());
            }
        }
    }
    return failures;
}

/// max over an axis and element-wise maximum and minimum on inputs with NaN and a tie
/// (check_special_values, exact): NaN propagates, and the gradient goes to the first NaN of a max's
/// row and to a NaN operand of maximum and minimum (`a` when both are, and at the tie), as in the
/// eager ops.
inline std::vector<std::string> check_nan_max(const op_rule_evaluator& evaluate) {
    using olmax::Tensor;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<Tensor<float>> inputs{Tensor<float>::from({2, 4}, {1, nan, 7, nan, 3, 5, 2, 4}), Tensor<float>::from({5}, {1, nan, 3, nan, 2}),
                                            Tensor<float>::from({5}, {nan, 2, -1, nan, 2})};
    return check_special_values(
        evaluate, inputs,
        [](const std::vector<Tensor<float>>& x) {
            return std::vector<Tensor<float>>{olmax::max(x[0], 1), olmax::maximum(x[1], x[2]), olmax::minimum(x[1], x[2])};
        },
        {"max(x, 1)", "maximum(a, b)", "minimum(a, b)", "dx", "da", "db"}, 0.0,
        [](const std::vector<Tensor<float>>& y) { return std::isnan(y[0].data()[0]) && y[0].data()[1] == 5.0f ? "" : "max(x, 1) is not [NaN, 5]"; });
}

/// softmax, log_softmax and logsumexp of lines with -inf entries (check_special_values, within
/// 1e-6): a line that is all -inf (every entry masked) gives 0 / -inf / -inf with no gradient, as
/// the eager ops; one with some -inf entries gives those 0 / -inf and its own values elsewhere.
inline std::vector<std::string> check_masked_softmax(const op_rule_evaluator& evaluate) {
    using olmax::Tensor;
    const float inf = std::numeric_limits<float>::infinity();
    const std::vector<Tensor<float>> inputs{Tensor<float>::from({3, 3}, {-inf, -inf, -inf, 1, -inf, 2, 0.5f, 1, 2}),
                                            Tensor<float>::from({2, 3}, {-inf, 0.25f, -inf, -inf, -inf, -inf})};
    return check_special_values(
        evaluate, inputs,
        [](const std::vector<Tensor<float>>& x) {
            return std::vector<Tensor<float>>{olmax::softmax(x[0], 1), olmax::log_softmax(x[0], 1), olmax::softmax(x[1], 0),
                                              olmax::log_softmax(x[1], 0), olmax::logsumexp(x[0], 1)};
        },
        {"softmax(x, 1)", "log_softmax(x, 1)", "softmax(z, 0)", "log_softmax(z, 0)", "logsumexp(x, 1)", "dx", "dz"}, 1e-6,
        [](const std::vector<Tensor<float>>& y) {
            return y[0].data()[0] == 0.0f && y[4].data()[0] == -std::numeric_limits<float>::infinity() && y[5].data()[0] == 0.0f
                       ? ""
                       : "an all -inf line is not 0 / -inf / no gradient";
        });
}

/// cross_entropy, plain and with the z-loss, of logits with masked (-inf) entries
/// (check_special_values, within 1e-6):
/// - entries that are not the target: a finite loss and gradient, as the eager op, where picking
///   the target's logit as logits * one_hot would make -inf * 0 = NaN;
/// - a row that is all -inf: a NaN loss (-inf - -inf) and the gradient -onehot(target) / N in that
///   row (its lse has none), as the eager op, where exp(x - max) would make every gradient NaN.
inline std::vector<std::string> check_masked_cross_entropy(const op_rule_evaluator& evaluate) {
    using olmax::Tensor;
    const float inf = std::numeric_limits<float>::infinity();
    const Tensor<float> logits = Tensor<float>::from({3, 4}, {0.5f, -inf, 1.0f, 2.0f, 0.1f, 0.2f, 0.3f, 0.4f, -inf, 3.0f, -inf, 1.0f});
    const Tensor<std::int32_t> targets = Tensor<std::int32_t>::from({3}, {2, 1, 3});
    const auto both = [&](const Tensor<std::int32_t>& t) {
        return [&t](const std::vector<Tensor<float>>& x) {
            return std::vector<Tensor<float>>{olmax::cross_entropy(x[0], t), olmax::cross_entropy(x[0], t, 1e-3f)};
        };
    };
    std::vector<std::string> failures = check_special_values(
        evaluate, {logits}, both(targets), {"cross_entropy", "cross_entropy(z_loss)", "dlogits"}, 1e-6,
        [](const std::vector<Tensor<float>>& y) { return std::isfinite(y[0].item()) && std::isfinite(y[1].item()) ? "" : "the eager loss is not finite"; });
    const Tensor<float> row_masked = Tensor<float>::from({2, 3}, {0.5f, -1.0f, 2.0f, -inf, -inf, -inf});
    const Tensor<std::int32_t> row_targets = Tensor<std::int32_t>::from({2}, {0, 2});
    for (const auto& line : check_special_values(
             evaluate, {row_masked}, both(row_targets), {"cross_entropy", "cross_entropy(z_loss)", "dlogits"}, 1e-6,
             [](const std::vector<Tensor<float>>& y) {
                 const float* d = y[2].data();
                 return std::isnan(y[0].item()) && d[3] == 0.0f && d[4] == 0.0f && d[5] < 0.0f && std::isfinite(d[0]) ? ""
                        : "the eager loss is not NaN with a finite gradient, -onehot / N in the masked row";
             }))
        failures.push_back("a row of -inf: " + line);
    return failures;
}

/// The element-wise ops whose eager and traced forms both come from one rule of math::rules
/// (check_special_values, within 1e-5 relative) at the points where a second definition would
/// drift: 0 and -0 (a ReLU's gradient there is 0), the kinks of hard_sigmoid (+-3), tiny and
/// large values (where elephant's |x|^d underflows or overflows), +-inf and NaN.
inline std::vector<std::string> check_math_rules_special(const op_rule_evaluator& evaluate) {
    using olmax::Tensor;
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    const Tensor<float> x = Tensor<float>::from({13}, {0.0f, -0.0f, 1e-30f, -1, 1, 0.5f, -3, 3, 20, -20, inf, -inf, nan});
    using F = Tensor<float> (*)(const Tensor<float>&);
    const std::vector<std::pair<std::string, F>> ops{
        {"exp", [](const Tensor<float>& v) { return olmax::exp(v); }},           {"log", [](const Tensor<float>& v) { return olmax::log(v); }},
        {"sqrt", [](const Tensor<float>& v) { return olmax::sqrt(v); }},         {"square", [](const Tensor<float>& v) { return olmax::square(v); }},
        {"tanh", [](const Tensor<float>& v) { return olmax::tanh(v); }},         {"sigmoid", [](const Tensor<float>& v) { return olmax::sigmoid(v); }},
        {"hard_sigmoid", [](const Tensor<float>& v) { return olmax::hard_sigmoid(v); }},
        {"relu", [](const Tensor<float>& v) { return olmax::relu(v); }},         {"softplus", [](const Tensor<float>& v) { return olmax::softplus(v); }},
        {"silu", [](const Tensor<float>& v) { return olmax::silu(v); }},         {"rsqrt", [](const Tensor<float>& v) { return olmax::rsqrt(v); }},
        {"abs", [](const Tensor<float>& v) { return olmax::abs(v); }},           {"mish", [](const Tensor<float>& v) { return olmax::mish(v); }},
        {"gelu", [](const Tensor<float>& v) { return olmax::gelu(v); }},
        {"clamp(-1, 3)", [](const Tensor<float>& v) { return olmax::clamp(v, -1.0f, 3.0f); }},
        {"leaky_relu(0.1)", [](const Tensor<float>& v) { return olmax::leaky_relu(v, 0.1f); }},
        {"elephant", [](const Tensor<float>& v) { return olmax::elephant(v); }},
        {"elephant(a=1.5, d=0.5)", [](const Tensor<float>& v) { return olmax::elephant(v, 1.5f, 0.5f); }},
    };
    std::vector<std::string> failures;
    for (const auto& [name, f] : ops)
        for (const auto& line : check_special_values(
                 evaluate, {x}, [f = f](const std::vector<Tensor<float>>& in) { return std::vector<Tensor<float>>{f(in[0])}; }, {name, "d" + name}, 1e-5))
            failures.push_back(name + ": " + line);
    return failures;
}

}  // namespace olmax_test
