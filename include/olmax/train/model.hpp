#pragma once
// What olmax::train::Trainer asks of a model, as concepts with names: a model that misses one is
// refused with the concept it misses (e.g. "train::ScoresHeldOut<MyModel> evaluated to false")
// instead of an error deep inside the loop.

#include <concepts>
#include <cstddef>
#include <utility>
#include <vector>

#include "olmax/data/loader.hpp"
#include "olmax/optim/param.hpp"

namespace olmax::train {

/// Element type `value_type` and named parameters for the optimiser (`parameters()`).
template <class M>
concept HasParameters = requires(M& model) {
    typename M::value_type;
    { model.parameters() } -> std::same_as<std::vector<optim::Parameter<typename M::value_type>>>;
};

/// `accumulate_gradients(batch, shards, scale)`: forward and backward of the training loss on a
/// batch (rows split over `shards` threads), gradients times `scale` added to the parameters;
/// returns the batch's mean loss.
template <class M>
concept AccumulatesGradients = requires(M& model, const data::Batch& batch, std::size_t shards, double scale) {
    { model.accumulate_gradients(batch, shards, scale) } -> std::convertible_to<double>;
};

/// `masked_nll(batch)`: the sum of -log p(target) over the real targets of a batch and their count,
/// without recording (held-out evaluation).
template <class M>
concept ScoresHeldOut = requires(const M& model, const data::Batch& batch) {
    { model.masked_nll(batch) } -> std::convertible_to<std::pair<double, double>>;
};

/// A model the Trainer can train (models::ByteLM is one; tests/unit/test_trainer.cpp has a tiny one).
template <class M>
concept TrainableModel = HasParameters<M> && AccumulatesGradients<M> && ScoresHeldOut<M>;

}  // namespace olmax::train
