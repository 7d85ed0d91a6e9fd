#pragma once
// Held-out evaluation: the model's loss on the same held-out batches every time, shared by the
// ranks, and the context-free baseline it should beat.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <span>
#include <vector>

#include "olmax/backend/dispatch.hpp"
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
/// share the batches (rank r takes batches r, r + N, ...), and a rank's batches run at the same time
/// on the host kernels' threads, one thread each (`masked_nll` must allow that, as a forward does).
/// Each batch's sums have a slot of their own, added in batch order: the result is the same bits for
/// any number of ranks and threads. A collective.
template <ScoresHeldOut Model>
double evaluate(const Model& model, const data::Documents& held_out, const EvaluationOptions& options, distributed::Communicator& comm) {
    data::PackedLoader loader(held_out, {options.batch, options.sequence, options.seed, false, false});
    std::vector<data::Batch> mine;
    std::vector<std::size_t> slots;
    std::int64_t drawn = 0;
    for (; drawn < options.batches; ++drawn) {
        auto batch = loader.next();
        if (!batch) break;
        if (drawn % comm.world_size() != comm.rank()) continue;
        mine.push_back(std::move(*batch));
        slots.push_back(std::size_t(drawn));
    }
    std::vector<double> sums(2 * std::size_t(drawn), 0.0);  // nll, count per batch
    std::vector<std::exception_ptr> errors(mine.size());
    // Work per item: large enough that the backend always splits the batches over its threads.
    backend::current().parallel_for(mine.size(), std::numeric_limits<std::size_t>::max() / std::max<std::size_t>(mine.size(), 1),
                                    [&](std::size_t begin, std::size_t end) {
                                        for (std::size_t i = begin; i < end; ++i) try {
                                                const auto [nll, n] = model.masked_nll(mine[i]);
                                                sums[2 * slots[i]] = nll, sums[2 * slots[i] + 1] = n;
                                            } catch (...) {
                                                errors[i] = std::current_exception();
                                            }
                                    });
    for (const auto& e : errors)
        if (e) std::rethrow_exception(e);
    comm.allreduce(std::span<double>(sums));  // one rank's value and zeros per slot: exact
    double nll = 0, count = 0;
    for (std::size_t i = 0; i < sums.size(); i += 2) nll += sums[i], count += sums[i + 1];
    return count > 0 ? nll / count : std::nan("");
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
