#pragma once
// Initialisers. Inside nn::Stack every layer is initialised on its own (its own draws from the
// generator), so stacked weights get a true orthogonal matrix per layer — not the original Olmax's
// Gaussian-with-orthogonal-std for stacked weights (techniques §0 #6).

#include <algorithm>
#include <cmath>
#include <string_view>

#include "olmax/core/random.hpp"
#include "olmax/core/tensor.hpp"

namespace olmax::nn {

/// (Semi-)orthogonal over the last two axes, independently per leading index (olmax::orthogonal:
/// the Q of a Gaussian matrix's QR decomposition with R's diagonal positive, Mezzadri 2007).
template <Real T>
Tensor<T> orthogonal_init(const Shape& shape, Generator& rng, T gain = T{1}) {
    return orthogonal<T>(shape, rng, gain);
}

/// Normal(0, (gain / sqrt(fan_in))^2): keeps the output variance of a linear map near the input's.
template <Real T>
Tensor<T> fan_in_normal(const Shape& shape, std::size_t fan_in, Generator& rng, T gain = T{1}) {
    check<value_error>(fan_in > 0, "nn::fan_in_normal: fan_in must be positive for shape ", to_string(shape));
    return randn<T>(shape, rng, T{0}, gain / T(std::sqrt(double(fan_in))));
}

/// A step-size bias for softplus(. + bias) (Mamba's dt_bias, also Mamba-2's and Gated DeltaNet's):
/// softplus^-1(dt) with dt log-uniform in [dt_min, dt_max] and at least dt_floor, so that the
/// initial step sizes spread over two decades (Gu & Dao 2023, Section 3.6). One draw per element,
/// in order; checks 0 < dt_min <= dt_max and dt_floor > 0, naming `layer`.
template <Real T>
Tensor<T> step_size_bias(const Shape& shape, double dt_min, double dt_max, double dt_floor, Generator& rng, std::string_view layer) {
    check<value_error>(dt_min > 0 && dt_min <= dt_max && dt_floor > 0, layer, ": need 0 < dt_min (", dt_min, ") <= dt_max (", dt_max,
                       ") and dt_floor (", dt_floor, ") > 0");
    Tensor<T> bias(shape);
    const double log_min = std::log(dt_min), log_max = std::log(dt_max);
    for (T& v : bias) {
        const double dt = std::max(std::exp(log_min + (log_max - log_min) * rng.uniform()), dt_floor);
        v = T(dt + std::log(-std::expm1(-dt)));  // softplus^-1(dt) = log(exp(dt) - 1)
    }
    return bias;
}

/// log(a) with a uniform in [a_min, a_max]: the log decay rates A_log of Mamba-2 and Gated DeltaNet
/// (A = -exp(A_log)). One draw per element, in order; checks 0 < a_min <= a_max, naming `layer`.
template <Real T>
Tensor<T> log_uniform_rates(const Shape& shape, double a_min, double a_max, Generator& rng, std::string_view layer) {
    check<value_error>(a_min > 0 && a_min <= a_max, layer, ": need 0 < A_min (", a_min, ") <= A_max (", a_max, ")");
    Tensor<T> rates(shape);
    for (T& v : rates) v = T(std::log(a_min + (a_max - a_min) * rng.uniform()));
    return rates;
}

}  // namespace olmax::nn
