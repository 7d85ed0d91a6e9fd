#pragma once
// Drawing the next token from a model's logits: temperature, top-k (keep the k most likely),
// top-p / nucleus (Holtzman et al. 2020: keep the smallest set whose probability reaches p).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "olmax/core/core.hpp"

namespace olmax::data {

struct SamplingConfig {
    double temperature = 1.0;  // 0 = greedy (argmax)
    std::size_t top_k = 0;     // 0 = no limit
    double top_p = 1.0;        // 1 = no limit

    void validate() const {
        check(temperature >= 0 && std::isfinite(temperature), "sample_token: temperature must be finite and >= 0, got ", temperature);
        check(top_p > 0 && top_p <= 1, "sample_token: top_p must be in (0, 1], got ", top_p);
    }
};

/// The probabilities sampling uses (after temperature, top-k and top-p), summing to 1.
template <class T>
std::vector<double> sampling_distribution(std::span<const T> logits, const SamplingConfig& config) {
    config.validate();
    check(!logits.empty(), "sample_token: empty logits");
    const std::size_t n = logits.size();
    std::vector<double> probs(n, 0.0);
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), std::size_t{0});
    // Descending by logit, ties by index, so results do not depend on the sort's stability.
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (std::size_t i = 0; i < n; ++i)
        check(std::isfinite(double(logits[i])), "sample_token: logit ", i, " is not finite");
    if (config.temperature == 0) {
        probs[order[0]] = 1.0;
        return probs;
    }
    std::size_t keep = config.top_k ? std::min(config.top_k, n) : n;
    const double top = double(logits[order[0]]);
    double total = 0;
    for (std::size_t r = 0; r < keep; ++r) total += (probs[order[r]] = std::exp((double(logits[order[r]]) - top) / config.temperature));
    if (config.top_p < 1) {
        double cumulative = 0;
        std::size_t r = 0;
        while (r < keep) {
            cumulative += probs[order[r]] / total;
            ++r;
            if (cumulative >= config.top_p) break;
        }
        for (std::size_t q = r; q < keep; ++q) probs[order[q]] = 0;
        keep = r;
        total = 0;
        for (std::size_t q = 0; q < keep; ++q) total += probs[order[q]];
    }
    for (double& p : probs) p /= total;
    return probs;
}

/// One token index drawn from `logits` with `rng`.
template <class T>
std::size_t sample_token(std::span<const T> logits, const SamplingConfig& config, Generator& rng) {
    const auto probs = sampling_distribution(logits, config);
    const double u = rng.uniform();
    double cumulative = 0;
    std::size_t last_nonzero = 0;
    for (std::size_t i = 0; i < probs.size(); ++i) {
        if (probs[i] == 0) continue;
        cumulative += probs[i];
        last_nonzero = i;
        if (u < cumulative) return i;
    }
    return last_nonzero;  // rounding left u above the final cumulative sum
}

}  // namespace olmax::data
