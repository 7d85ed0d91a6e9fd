#pragma once
// Seeded permutations that are the same with every standard library: std::mt19937_64's output is
// fixed by the standard, but std::uniform_int_distribution and std::shuffle are not, so olmax draws
// bounded integers and shuffles itself.

#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace olmax::data {

/// SplitMix64 finaliser (Steele, Lea, Flood 2014): mixes (seed, stream) into an independent seed.
inline std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t stream) {
    std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * (stream + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/// Uniform integer in [0, n) by rejection (no modulo bias), n > 0.
inline std::uint64_t uniform_below(std::mt19937_64& engine, std::uint64_t n) {
    const std::uint64_t threshold = (0 - n) % n;  // 2^64 mod n
    for (;;) {
        const std::uint64_t r = engine();
        if (r >= threshold) return r % n;
    }
}

/// A permutation of 0..n-1 (Fisher-Yates) determined by `seed` alone.
inline std::vector<std::size_t> seeded_permutation(std::size_t n, std::uint64_t seed) {
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::mt19937_64 engine(seed);
    for (std::size_t i = n; i > 1; --i) std::swap(order[i - 1], order[uniform_below(engine, i)]);
    return order;
}

}  // namespace olmax::data
