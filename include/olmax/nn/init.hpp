#pragma once
// Initialisers. Inside nn::Stack every layer is initialised on its own (its own draws from the
// generator), so stacked weights get a true orthogonal matrix per layer — not the original Olmax's
// Gaussian-with-orthogonal-std for stacked weights (techniques §0 #6).

#include <algorithm>
#include <cmath>

#include "olmax/core/random.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/detail/third_party.hpp"

namespace olmax::nn {

/// (Semi-)orthogonal over the last two axes, independently per leading index: QR of a Gaussian
/// with the signs of R's diagonal folded into Q (Mezzadri 2007), the same draws as
/// olmax::orthogonal. (Kept here because olmax::orthogonal currently trips -Wint-in-bool-context.)
template <Real T>
Tensor<T> orthogonal_init(const Shape& shape, Generator& rng, T gain = T{1}) {
    check<shape_error>(shape.size() >= 2, "nn::orthogonal_init: needs a shape of rank >= 2, got ", to_string(shape));
    const std::size_t rows = shape[shape.size() - 2], cols = shape[shape.size() - 1];
    auto out = Tensor<T>::uninitialized(shape);
    const std::size_t matrix = rows * cols;
    const std::size_t count = matrix == 0 ? 0 : out.size() / matrix;
    const std::size_t big = std::max(rows, cols), small = std::min(rows, cols);
    using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic>;
    for (std::size_t m = 0; m < count; ++m) {
        Mat g(static_cast<Eigen::Index>(big), static_cast<Eigen::Index>(small));
        for (Eigen::Index j = 0; j < g.cols(); ++j)
            for (Eigen::Index i = 0; i < g.rows(); ++i) g(i, j) = rng.normal();
        Eigen::HouseholderQR<Mat> qr(g);
        Mat q = qr.householderQ() * Mat::Identity(g.rows(), g.cols());
        const Mat r = qr.matrixQR();
        for (Eigen::Index j = 0; j < q.cols(); ++j)
            if (r(j, j) < 0) q.col(j) *= -1.0;
        T* dst = out.data() + m * matrix;
        for (std::size_t i = 0; i < rows; ++i)
            for (std::size_t j = 0; j < cols; ++j)
                dst[i * cols + j] = gain * T(rows >= cols ? q(Eigen::Index(i), Eigen::Index(j)) : q(Eigen::Index(j), Eigen::Index(i)));
    }
    return out;
}

/// Normal(0, (gain / sqrt(fan_in))^2): keeps the output variance of a linear map near the input's.
template <Real T>
Tensor<T> fan_in_normal(const Shape& shape, std::size_t fan_in, Generator& rng, T gain = T{1}) {
    check<value_error>(fan_in > 0, "nn::fan_in_normal: fan_in must be positive for shape ", to_string(shape));
    return randn<T>(shape, rng, T{0}, gain / T(std::sqrt(double(fan_in))));
}

}  // namespace olmax::nn
