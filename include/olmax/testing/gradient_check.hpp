#pragma once
// Public finite-difference gradient checker for ops, layers and users' custom backward passes.

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "olmax/autodiff/tape.hpp"
#include "olmax/core/random.hpp"
#include "olmax/core/tensor.hpp"

namespace olmax::testing {

struct GradientCheckOptions {
    double eps = 1e-6;    ///< central-difference step
    double rtol = 1e-6;   ///< relative tolerance, against max(|analytic|, |numeric|)
    double atol = 1e-8;   ///< absolute tolerance
    std::uint64_t seed = 20240601;  ///< for the output projection and the gradient pre-fill
    std::vector<std::size_t> skip_inputs = {};  ///< inputs not to differentiate (e.g. at a kink on purpose)
    std::size_t max_reported = 5;  ///< mismatches listed in the report
};

struct GradientCheckResult {
    bool ok = true;
    double max_abs_error = 0;
    double max_rel_error = 0;
    std::size_t checked = 0;
    std::string report;
    explicit operator bool() const { return ok; }
};

namespace detail {

/// One entry's comparison: records its errors in `result` and says whether it is within
/// atol + rtol * max(|analytic|, |numeric|) (false for NaN too).
inline bool within_tolerance(GradientCheckResult& result, double analytic, double numeric, const GradientCheckOptions& opt) {
    const double err = std::abs(analytic - numeric);
    const double scale = std::max(std::abs(analytic), std::abs(numeric));
    result.max_abs_error = std::max(result.max_abs_error, err);
    if (scale > 0) result.max_rel_error = std::max(result.max_rel_error, err / scale);
    ++result.checked;
    return err <= opt.atol + opt.rtol * scale;
}

}  // namespace detail

inline std::ostream& operator<<(std::ostream& out, const GradientCheckResult& r) {
    return out << (r.ok ? "gradient check passed" : "gradient check FAILED") << " (" << r.checked
               << " entries, max abs err " << r.max_abs_error << ", max rel err " << r.max_rel_error << ")" << r.report;
}

/// Compares the backward pass of `f` with central differences, in double precision.
///
/// `f(inputs)` returns a tensor of any shape; the checker differentiates `L = sum(f(x) * r)` for a
/// fixed random `r`, so every output element contributes. Before backward, each input's gradient
/// buffer is pre-filled with random values that are subtracted afterwards: a backward that
/// overwrites a gradient instead of adding to it fails the check, as does a missing gradient.
/// An entry passes when |analytic - numeric| <= atol + rtol * max(|analytic|, |numeric|).
template <class F>
GradientCheckResult check_gradients(F&& f, const std::vector<Tensor<double>>& inputs, const GradientCheckOptions& opt = {}) {
    GradientCheckResult result;
    Generator rng(opt.seed);
    auto skipped = [&](std::size_t i) { return std::find(opt.skip_inputs.begin(), opt.skip_inputs.end(), i) != opt.skip_inputs.end(); };

    std::vector<Tensor<double>> x;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        x.push_back(inputs[i].clone());
        if (!skipped(i)) x.back().set_requires_grad(true);
    }
    Tensor<double> probe = [&] {
        autodiff::no_grad guard;
        return f(std::as_const(x));
    }();
    const Tensor<double> r = randn<double>(probe.shape(), rng);
    auto evaluate = [&](const std::vector<Tensor<double>>& args) {
        autodiff::no_grad guard;
        return f(args);
    };
    // (L(x + eps e_k) - L(x - eps e_k)) / 2 eps, differenced per output element before the
    // projection: outputs the perturbation does not change cancel exactly, so a large output
    // elsewhere (exp(30) next to exp(-8)) cannot swamp the difference in rounding.
    auto central_difference = [&](const std::vector<Tensor<double>>& plus, const std::vector<Tensor<double>>& minus) {
        const Tensor<double> yp = evaluate(plus), ym = evaluate(minus);
        double s = 0;
        for (std::size_t k = 0; k < yp.size(); ++k) s += (yp.data()[k] - ym.data()[k]) * r.data()[k];
        return s / (2 * opt.eps);
    };

    // Analytic gradients, on top of a random pre-fill.
    std::vector<Tensor<double>> prefill;
    for (std::size_t i = 0; i < x.size(); ++i) {
        prefill.push_back(randn<double>(x[i].shape(), rng));
        if (!skipped(i)) autodiff::accumulate_grad(olmax::detail::impl_of(x[i]), prefill[i], "check_gradients");
    }
    {
        autodiff::tape_scope scope;
        Tensor<double> y = f(std::as_const(x));
        if (y.requires_grad()) y.backward(r);
    }

    std::ostringstream report;
    std::size_t reported = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        if (skipped(i)) continue;
        const Tensor<double> g = x[i].grad();
        for (std::size_t k = 0; k < x[i].size(); ++k) {
            const double analytic = (g.defined() ? g.data()[k] : 0.0) - prefill[i].data()[k];
            std::vector<Tensor<double>> plus, minus;
            for (std::size_t j = 0; j < x.size(); ++j) {
                plus.push_back(inputs[j].clone());
                minus.push_back(inputs[j].clone());
            }
            plus[i].data()[k] += opt.eps;
            minus[i].data()[k] -= opt.eps;
            const double numeric = central_difference(plus, minus);
            if (!detail::within_tolerance(result, analytic, numeric, opt)) {
                result.ok = false;
                if (reported++ < opt.max_reported)
                    report << "\n  input " << i << " element " << k << ": analytic " << analytic << " vs numeric " << numeric;
            }
        }
    }
    result.report = report.str();
    return result;
}

}  // namespace olmax::testing
