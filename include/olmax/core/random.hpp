#pragma once
// Seeded, reproducible random initialisation. The same seed gives the same tensors on every
// platform: olmax draws with its own transforms over std::mt19937_64 (whose output the standard
// fixes), not with std::normal_distribution (whose algorithm is implementation-defined).

#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <vector>

#include "olmax/core/tensor.hpp"

namespace olmax {

/// A seeded random stream. Copy it to replay the same numbers (reversible blocks do).
class Generator {
public:
    explicit Generator(std::uint64_t seed = 0) : engine_(seed) {}
    /// Uniform in [0, 1) with 53 random bits.
    double uniform() { return double(engine_() >> 11) * 0x1.0p-53; }
    /// Standard normal (Box-Muller; both values are used).
    double normal() {
        if (has_spare_) {
            has_spare_ = false;
            return spare_;
        }
        double u1 = 0;
        while (u1 <= 0) u1 = uniform();
        const double u2 = uniform();
        const double r = std::sqrt(-2.0 * std::log(u1));
        spare_ = r * std::sin(2.0 * std::numbers::pi * u2);
        has_spare_ = true;
        return r * std::cos(2.0 * std::numbers::pi * u2);
    }
    std::uint64_t next_u64() { return engine_(); }
    /// Uniform integer in [0, n). Rejection sampling on the raw 64-bit output (draws below
    /// 2^64 mod n are redrawn, leaving a multiple of n equally likely values), not
    /// std::uniform_int_distribution, whose algorithm differs between standard libraries.
    std::uint64_t below(std::uint64_t n) {
        check(n > 0, "Generator::below: n must be positive");
        const std::uint64_t reject_below = (0 - n) % n;  // 2^64 mod n
        std::uint64_t draw = engine_();
        while (draw < reject_below) draw = engine_();
        return draw % n;
    }

private:
    std::mt19937_64 engine_;
    double spare_ = 0;
    bool has_spare_ = false;
};

/// Normal(mean, std^2) samples.
template <Real T>
Tensor<T> randn(const Shape& shape, Generator& rng, T mean = T{0}, T std = T{1}) {
    auto t = Tensor<T>::uninitialized(shape);
    for (T& v : t) v = mean + std * T(rng.normal());
    return t;
}

/// Uniform samples in [low, high).
template <Real T>
Tensor<T> rand(const Shape& shape, Generator& rng, T low = T{0}, T high = T{1}) {
    auto t = Tensor<T>::uninitialized(shape);
    for (T& v : t) v = low + (high - low) * T(rng.uniform());
    return t;
}

/// A (semi-)orthogonal matrix over the last two axes, independently for every leading index
/// (stacked per-layer weights get a real orthogonal matrix each): the Q of a Gaussian matrix's QR
/// decomposition whose R has a positive diagonal, which is Haar-distributed (Mezzadri 2007). Rows
/// are orthonormal when rows <= cols, columns otherwise. `gain` scales the result.
///
/// Q comes from block Gram-Schmidt in double with every orthogonalisation done twice ("twice is
/// enough": Giraud, Langou, Rozloznik 2005; Barlow, Smoktunowicz 2013 for blocks: orthogonal to
/// rounding for any numerically full-rank matrix, which a Gaussian one is). R's diagonal is then
/// positive by construction, so Q equals Householder QR's with R's signs folded in, to rounding
/// (tests/unit/test_tensor.cpp compares them). Plain loops
/// instead of Eigen's Householder QR, which took a fifth of a small program's compile time (the
/// quickstart at -O2: 31-33 -> 25 s on 2 vCPUs), for 1.1-1.8x its run time (2048 x 512: 0.28 against
/// 0.25 s; 4096 x 1024: 2.4 against 1.8 s).
template <Real T>
Tensor<T> orthogonal(const Shape& shape, Generator& rng, T gain = T{1}) {
    check<shape_error>(shape.size() >= 2, "orthogonal: needs a shape of rank >= 2, got ", to_string(shape));
    const std::size_t rows = shape[shape.size() - 2], cols = shape[shape.size() - 1];
    auto out = Tensor<T>::uninitialized(shape);
    const std::size_t count = rows * cols != 0 ? out.size() / (rows * cols) : 0;
    const std::size_t big = std::max(rows, cols), small = std::min(rows, cols);
    // Columns in blocks of 16: each block is first orthogonalised against all finished columns
    // (classical Gram-Schmidt, all products first, twice), so a finished column is read once per
    // block rather than once per column (4096 x 1024 in double does not fit a cache), then within
    // itself (modified Gram-Schmidt, twice) and normalised.
    constexpr std::size_t block = 16;
    std::vector<double> q(big * small);  // the big x small Gaussian, column by column, then its Q in place
    std::vector<double> projections;
    const auto dot = [big](const double* x, const double* y) {
        double acc = 0;
#pragma omp simd reduction(+ : acc)
        for (std::size_t i = 0; i < big; ++i) acc += x[i] * y[i];
        return acc;
    };
    const auto subtract = [big](double* x, double scale, const double* y) {
#pragma omp simd
        for (std::size_t i = 0; i < big; ++i) x[i] -= scale * y[i];
    };
    for (std::size_t m = 0; m < count; ++m) {
        for (std::size_t j = 0; j < small; ++j)
            for (std::size_t i = 0; i < big; ++i) q[j * big + i] = rng.normal();  // this draw order fixes the values per seed
        for (std::size_t first = 0; first < small; first += block) {
            const std::size_t width = std::min(block, small - first);
            double* columns = q.data() + first * big;
            for (int pass = 0; pass < 2; ++pass) {
                projections.resize(first * width);  // every entry is written below
                for (std::size_t p = 0; p < first; ++p)
                    for (std::size_t c = 0; c < width; ++c) projections[p * width + c] = dot(q.data() + p * big, columns + c * big);
                for (std::size_t p = 0; p < first; ++p)
                    for (std::size_t c = 0; c < width; ++c) subtract(columns + c * big, projections[p * width + c], q.data() + p * big);
            }
            for (std::size_t c = 0; c < width; ++c) {
                double* column = columns + c * big;
                for (int pass = 0; pass < 2; ++pass)
                    for (std::size_t p = 0; p < c; ++p) subtract(column, dot(columns + p * big, column), columns + p * big);
                const double norm = std::sqrt(dot(column, column));
                for (std::size_t i = 0; i < big; ++i) column[i] /= norm;
            }
        }
        T* dst = out.data() + m * rows * cols;
        for (std::size_t i = 0; i < rows; ++i)
            for (std::size_t j = 0; j < cols; ++j) dst[i * cols + j] = gain * T(rows >= cols ? q[j * big + i] : q[i * big + j]);
    }
    return out;
}

}  // namespace olmax
