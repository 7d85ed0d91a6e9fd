#pragma once
// Held-out evaluation: the model's loss on the same held-out batches every time, shared by the
// ranks, and the context-free baseline it should beat.

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "olmax/data/loader.hpp"
#include "olmax/data/tokenizer.hpp"
#include "olmax/distributed/communicator.hpp"
#include "olmax/train/model.hpp"

namespace olmax::train {

struct EvaluationOptions {
    std::size_t batch = 8, sequence = 64;
    std::uint64_t seed = 0;
    std::int64_t batches = 16;  ///< held-out batches per evaluation
};

/// Held-out loss of `model`: the first `batches` batches of a fresh one-pass loader over
/// `held_out` (the same bytes every time), in nats per target over real targets only. The ranks
/// share the batches (rank r takes batches r, r + N, ...) and add their sums: a collective.
template <ScoresHeldOut Model>
double evaluate(const Model& model, const data::Documents& held_out, const EvaluationOptions& options, distributed::Communicator& comm) {
    data::PackedLoader loader(held_out, {options.batch, options.sequence, options.seed, false, false});
    std::array<double, 2> sums{0, 0};  // nll, count
    for (std::int64_t i = 0; i < options.batches; ++i) {
        auto batch = loader.next();
        if (!batch) break;
        if (i % comm.world_size() != comm.rank()) continue;
        const auto [nll, n] = model.masked_nll(*batch);
        sums[0] += nll;
        sums[1] += n;
    }
    comm.allreduce(std::span<double>(sums));
    return sums[1] > 0 ? sums[0] / sums[1] : std::nan("");
}

/// Cross-entropy of the held-out bytes under the training bytes' frequencies (add-one smoothed),
/// each document ended by the end-of-document token: what a model that ignores context achieves.
inline double unigram_baseline(const data::Documents& train, const data::Documents& held_out) {
    std::vector<double> counts(256, 1.0);
    double total = 256;
    for (const auto& d : train) {
        for (auto b : d) counts[b] += 1;
        counts[data::ByteTokenizer::end_of_document] += 1;
        total += double(d.size()) + 1;
    }
    double nll = 0, n = 0;
    for (const auto& d : held_out) {
        for (auto b : d) nll -= std::log(counts[b] / total);
        nll -= std::log(counts[data::ByteTokenizer::end_of_document] / total);
        n += double(d.size()) + 1;
    }
    return nll / n;
}

}  // namespace olmax::train
