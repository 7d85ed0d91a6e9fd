#pragma once
// A model's whole training step (forward, gradients, AdamW) as ONE traced program, the form the
// whole-step XLA path compiles once and runs with its state on the device (models/xla_trainer.hpp,
// docs/xla.md). The model lowers itself (its `lower_loss`, built from its layers' lowering rules,
// nn/lowering.hpp); the gradient is the graph's reverse mode; the update is optim::AdamW's,
// lowered (optim/lowered_adamw.hpp).
//
// Program inputs:  [parameters..., first moments..., second moments..., ids [B, S], targets [B, S],
//                   schedule [3]]   (ids and targets as f32 byte values; the schedule from
//                   optim::lowered_adamw_schedule)
// Program outputs: [loss, gradient norm, parameters'..., first moments'..., second moments'...]
// Parameters are in the optimiser's order (the model's parameter walk).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "olmax/backend/xla/graph/gradients.hpp"
#include "olmax/backend/xla/graph/graph.hpp"
#include "olmax/backend/xla/graph/lowering.hpp"
#include "olmax/optim/lowered_adamw.hpp"
#include "olmax/optim/param.hpp"

namespace olmax::models {

/// A model the whole step can be traced for: its loss has a lowering (e.g. models::ByteLM).
template <class M>
concept LowerableModel = requires(const M& model, const xla::graph::lowering& at, const xla::graph::var& x) {
    { model.lower_loss(at, x, x) } -> std::same_as<std::pair<xla::graph::var, xla::graph::var>>;
};

struct TracedTrainingStep {
    std::unique_ptr<xla::graph::graph> graph = std::make_unique<xla::graph::graph>();
    std::vector<xla::graph::var> results;
    /// The inputs ids and targets: what SPMD data parallelism splits over the devices.
    std::vector<xla::graph::var> batch_inputs;
    std::size_t parameter_count = 0;
    /// Leading outputs that are reported (loss, gradient norm), not state.
    static constexpr std::size_t reported = 2;
    std::size_t state_count() const { return 3 * parameter_count; }
};

/// Traces `model`'s training step for batches of [batch, sequence]. For data parallelism over
/// devices either emit it for XLA's SPMD partitioner with `batch_inputs` split (what XlaTrainer
/// does: the program stays the global one), or trace it with `replicas` R > 1 for a replicated
/// program (xla::device_program with R replicas): each replica then takes its own [batch, sequence]
/// rows, and the loss and the gradients are averaged over the replicas inside the program, so every
/// replica applies the same update to its copy of the state.
template <class Model, Real T>
TracedTrainingStep trace_training_step(const Model& model, const std::vector<optim::Parameter<T>>& parameters, const optim::AdamWConfig& config,
                                       std::size_t batch, std::size_t sequence, std::int64_t replicas = 1) {
    static_assert(LowerableModel<Model>, "olmax::models::trace_training_step: the model has no lowered loss (a member lower_loss(lowering, ids, targets))");
    namespace gx = xla::graph;
    check<value_error>(batch > 0 && sequence > 0 && replicas >= 1, "models::trace_training_step: batch ", batch, ", sequence ", sequence,
                       " and replicas ", replicas, " must be positive");
    TracedTrainingStep step;
    gx::graph& g = *step.graph;
    std::vector<gx::var> params, m, v;
    auto names = std::make_shared<gx::lowering::parameter_map>();
    for (const auto& p : parameters) {
        params.push_back(g.input(gx::f32(gx::dims_t(p.tensor.shape().begin(), p.tensor.shape().end()))));
        check<value_error>(names->emplace(p.name, params.back()).second, "models::trace_training_step: parameter '", p.name, "' appears twice");
    }
    for (const auto& p : params) m.push_back(g.input(p.type()));
    for (const auto& p : params) v.push_back(g.input(p.type()));
    const gx::dims_t rows{std::int64_t(batch), std::int64_t(sequence)};
    const gx::var ids = g.input(gx::f32(rows)), targets = g.input(gx::f32(rows)), schedule = g.input(gx::f32({3}));

    const auto [local_loss, objective] = model.lower_loss(gx::lowering(names), ids, targets);
    std::vector<gx::var> grads = gx::gradients(objective, params);
    gx::var loss = local_loss;
    if (replicas > 1) {  // equal shares: the mean of the replicas' means is the global batch's mean
        loss = gx::all_reduce_sum(local_loss, replicas) / double(replicas);
        for (auto& grad : grads) grad = gx::all_reduce_sum(grad, replicas) / double(replicas);
    }
    const auto update = optim::lower_adamw_step(parameters, config, params, grads, m, v, schedule);
    step.results = {loss, update.grad_norm};
    step.results.insert(step.results.end(), update.parameters.begin(), update.parameters.end());
    step.results.insert(step.results.end(), update.first_moments.begin(), update.first_moments.end());
    step.results.insert(step.results.end(), update.second_moments.begin(), update.second_moments.end());
    step.batch_inputs = {ids, targets};
    step.parameter_count = parameters.size();
    return step;
}

}  // namespace olmax::models
