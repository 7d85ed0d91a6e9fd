#pragma once
// A step strategy: how one optimiser step is computed (on the host with gradient accumulation
// and exchanges between ranks, host_step.hpp, or compiled for a PJRT device, xla_step.hpp). The
// Trainer holds one behind this interface, so its loop is the same for every strategy and a
// program without the PJRT runtime compiles the loop without the device step.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "olmax/data/loader.hpp"
#include "olmax/distributed/communicator.hpp"
#include "olmax/optim/adam.hpp"

namespace olmax::train {

/// What a strategy works on, handed over once the Trainer has resumed and every rank holds rank
/// 0's parameters.
template <class Model>
struct StepContext {
    Model& model;
    optim::AdamW<typename Model::value_type>& optimizer;
    distributed::Communicator& comm;
};

/// This rank's result of `StepStrategy::compute`.
struct StepLoss {
    double loss = 0;                     ///< the mean loss of this rank's rows
    std::optional<double> grad_norm;     ///< the global gradient norm, where the strategy has it
    double exchange_seconds = 0;         ///< time spent exchanging gradients that compute did not hide
};

template <class Model>
class StepStrategy {
public:
    virtual ~StepStrategy() = default;
    /// Called once before the first step (and before a dry run ends); returns a line to report or "".
    virtual std::string prepare(StepContext<Model> context) = 0;
    /// Batches drawn per optimiser step (gradient accumulation).
    virtual std::int64_t micro_batches() const { return 1; }
    /// The step's forward and backward on `micro_batches()` batches from `next_batch` (whole global
    /// batches: a strategy across ranks takes its own rows), gradients exchanged between the ranks.
    virtual StepLoss compute(const std::function<data::Batch()>& next_batch) = 0;
    /// Applies the update once the Trainer found the loss finite, and clears the gradients.
    virtual void update() = 0;
    /// Brings the host model and optimiser up to date (before an evaluation or a checkpoint).
    virtual void synchronize_host() {}
    /// Appended to the message of a diverged step (e.g. where the state lives).
    virtual std::string divergence_note() const { return {}; }
    /// A line about the run for the final summary, or "".
    virtual std::string summary() const { return {}; }
};

}  // namespace olmax::train
