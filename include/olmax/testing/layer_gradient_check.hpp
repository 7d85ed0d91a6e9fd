#pragma once
// Gradient check of a whole layer: its input and every parameter it visits, against central
// differences. What a user writing a layer runs in a test:
//
//     nn::Linear<double> layer(3, 2, rng);
//     auto result = olmax::testing::check_layer_gradients(layer, olmax::randn<double>({4, 3}, rng));
//     REQUIRE(result);   // printing `result` lists the entries that disagree, named
//
// Two backward passes on a copy of the layer (the caller's layer and its gradients are left alone):
//  1. values: every gradient buffer (input's and parameters') is pre-filled with random numbers
//     that are subtracted afterwards, and each entry is compared with the central difference of
//     L = sum(forward(x) * r) for a fixed random r. A wrong formula, a missing contribution, or a
//     backward that overwrites a gradient instead of adding to it fails here.
//  2. +inf pre-fill (dlib's test_layer fills parameter gradients with +inf the same way): every
//     gradient buffer starts at +inf and must still be +inf afterwards, since olmax adds gradients
//     (inf + g = inf). An entry that comes out finite was assigned by the backward (it overwrote
//     what was there), one that comes out NaN received a NaN or -inf. dlib's layers assign their
//     parameter gradients, so there the same pre-fill finds entries a backward forgot; here those
//     show up in pass 1, as a difference from the numeric derivative.
// Layers of `double` get the full check in fp64. Layers of `float` get the same two passes in
// float, with a larger step and looser tolerances (float_check_options): enough to catch wrong
// formulas, not rounding-level mistakes; instantiate the layer with `double` for those.

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "olmax/autodiff/gradient_sink.hpp"
#include "olmax/autodiff/tape.hpp"
#include "olmax/core/random.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/nn/contract.hpp"
#include "olmax/testing/gradient_check.hpp"

namespace olmax::testing {

/// Defaults for float layers: central differences with a step near the cube root of float's
/// epsilon, compared with tolerances that a correct float backward meets on unit-scale inputs.
inline GradientCheckOptions float_check_options() {
    GradientCheckOptions opt;
    opt.eps = 5e-3;
    opt.rtol = 2e-2;
    opt.atol = 2e-3;
    return opt;
}

namespace detail {

/// The tensors the check differentiates: [input, parameters in visiting order], with their names.
template <Real T>
struct Subjects {
    std::vector<std::string> names;
    std::vector<Tensor<T>> values;
};

/// Points the copy `layer`'s parameter handles at values[1..] (rebinding, as nn::Stack does).
template <class L, Real T>
void bind(L& layer, const std::vector<Tensor<T>>& values) {
    std::size_t i = 1;
    nn::ParameterVisitor<T> visit([&](const std::string& name, Tensor<T>& t, nn::Role, nn::Sharing) {
        check<value_error>(i < values.size() && t.shape() == values[i].shape(), "check_layer_gradients: parameter '", name,
                           "' was not visited in the same place with the same shape on every walk (visit_parameters must be deterministic)");
        t = values[i++];
    });
    visit.child(L::name, layer);
}

template <Real T>
std::vector<Tensor<T>> clones(const std::vector<Tensor<T>>& values) {
    std::vector<Tensor<T>> out;
    for (const auto& v : values) out.push_back(v.clone());
    return out;
}

}  // namespace detail

/// Checks the backward pass of `layer` at `input` for the input and every parameter (see the top of
/// this file). `ctx` is passed to every forward call (e.g. `training = false` to switch dropout off:
/// the check needs a deterministic forward). The report names the input or the parameter
/// ("parameter 'linear/weight' element 3: ...").
template <class L>
    requires nn::Layer<L>
GradientCheckResult check_layer_gradients(const L& layer, const Tensor<typename L::value_type>& input,
                                          const GradientCheckOptions& opt = std::is_same_v<typename L::value_type, float>
                                                                                ? float_check_options()
                                                                                : GradientCheckOptions{},
                                          const nn::LayerContext& ctx = {}) {
    using T = typename L::value_type;
    check<value_error>(input.defined(), "check_layer_gradients: the input is an undefined tensor");
    L copy = layer;  // rebinding its handles below leaves the caller's layer as it was
    detail::Subjects<T> subjects{{"input"}, {input.detach().clone()}};
    nn::ParameterVisitor<T> collect([&](const std::string& name, Tensor<T>& t, nn::Role, nn::Sharing) {
        subjects.names.push_back("parameter '" + name + "'");
        subjects.values.push_back(t.detach().clone());
    });
    collect.child(L::name, copy);
    const std::size_t n = subjects.values.size();

    Generator rng(opt.seed);
    auto forward = [&](const std::vector<Tensor<T>>& values) {
        detail::bind(copy, values);
        return copy.forward(values[0], ctx);
    };
    const Tensor<T> probe = [&] {
        autodiff::no_grad guard;
        return forward(subjects.values);
    }();
    const Tensor<T> r = randn<T>(probe.shape(), rng);

    // One backward pass of L = sum(forward(x) * r) on leaves whose gradients start at `prefill`.
    auto backward = [&](const std::vector<Tensor<T>>& prefill) {
        std::vector<Tensor<T>> leaves = detail::clones(subjects.values);
        for (std::size_t i = 0; i < n; ++i) {
            leaves[i].set_requires_grad(true);
            autodiff::accumulate_grad(olmax::detail::impl_of(leaves[i]), prefill[i].clone(), "check_layer_gradients");
        }
        autodiff::tape_scope scope;
        Tensor<T> y = forward(leaves);
        check<value_error>(y.shape() == r.shape(), "check_layer_gradients: the layer's output shape changed between calls, ",
                           to_string(r.shape()), " then ", to_string(y.shape()));
        if (y.requires_grad()) y.backward(r);
        std::vector<Tensor<T>> grads;
        for (std::size_t i = 0; i < n; ++i) grads.push_back(leaves[i].grad());
        return grads;
    };

    GradientCheckResult result;
    std::ostringstream report;
    std::size_t reported = 0;
    auto fail = [&](const std::string& what) {
        result.ok = false;
        if (reported++ < opt.max_reported) report << "\n  " << what;
    };

    // Pass 1: values against central differences (the random pre-fill is subtracted again).
    std::vector<Tensor<T>> prefill;
    for (std::size_t i = 0; i < n; ++i) prefill.push_back(randn<T>(subjects.values[i].shape(), rng));
    const std::vector<Tensor<T>> grads = backward(prefill);
    auto projected = [&](const std::vector<Tensor<T>>& values) {
        autodiff::no_grad guard;
        const Tensor<T> y = forward(values);
        double s = 0;
        for (std::size_t k = 0; k < y.size(); ++k) s += double(y.data()[k]) * double(r.data()[k]);
        return s;
    };
    for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t k = 0; k < subjects.values[i].size(); ++k) {
            const double analytic = double(grads[i].data()[k]) - double(prefill[i].data()[k]);
            std::vector<Tensor<T>> plus = detail::clones(subjects.values), minus = detail::clones(subjects.values);
            plus[i].data()[k] += T(opt.eps);
            minus[i].data()[k] -= T(opt.eps);
            // The step actually taken (x + eps rounds in float).
            const double step = double(plus[i].data()[k]) - double(minus[i].data()[k]);
            const double numeric = (projected(plus) - projected(minus)) / step;
            if (!detail::within_tolerance(result, analytic, numeric, opt)) {
                std::ostringstream line;
                line << subjects.names[i] << " element " << k << ": analytic " << analytic << " vs numeric " << numeric;
                fail(line.str());
            }
        }
    }

    // Pass 2: +inf pre-fill; adding keeps +inf, so anything else was assigned or was not finite.
    std::vector<Tensor<T>> infinite;
    for (std::size_t i = 0; i < n; ++i) infinite.push_back(full<T>(subjects.values[i].shape(), std::numeric_limits<T>::infinity()));
    const std::vector<Tensor<T>> after = backward(infinite);
    for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t k = 0; k < after[i].size(); ++k) {
            const T g = after[i].data()[k];
            if (g == std::numeric_limits<T>::infinity()) continue;
            std::ostringstream line;
            line << subjects.names[i] << " element " << k << ": gradient pre-filled with +inf came out " << g
                 << (std::isnan(g) ? " (the backward added a NaN or -inf)" : " (the backward assigned it instead of adding into it)");
            fail(line.str());
        }
    }
    result.report = report.str();
    return result;
}

}  // namespace olmax::testing
