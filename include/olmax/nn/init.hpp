#pragma once
// Initialisers. Inside nn::Stack every layer is initialised on its own (its own draws from the
// generator), so stacked weights get a true orthogonal matrix per layer — not the original Olmax's
// Gaussian-with-orthogonal-std for stacked weights (techniques §0 #6).

#include <algorithm>
#include <cmath>

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

}  // namespace olmax::nn
