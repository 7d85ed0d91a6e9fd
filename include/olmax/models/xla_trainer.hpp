#pragma once
// Training a model on a PJRT device with the whole step compiled once (docs/xla.md): the traced
// step of models/xla_training_step.hpp, run by xla::device_program with the parameters and AdamW's
// moments kept in device buffers. Per step only the batch and the three schedule values go to
// the device and only the loss and the gradient norm come back.
//
// The host model and optimiser stay the run's record: `download` copies the device state into
// them (parameters, moments as double, step counts), after which evaluation, sampling and
// checkpoints work exactly as for a CPU run, and a checkpoint written either way resumes either
// way (`upload` copies the host state to the device after a resume).
//
// Needs the PJRT runtime (the CMake target olmax::pjrt), so olmax.hpp does not include this header.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "olmax/backend/xla/device_program.hpp"
#include "olmax/backend/xla/graph/emit.hpp"
#include "olmax/data/loader.hpp"
#include "olmax/models/xla_training_step.hpp"
#include "olmax/optim/adam.hpp"

namespace olmax::models {

template <class Model>
class XlaTrainer {
public:
    using T = typename Model::value_type;
    static_assert(std::same_as<T, float>, "olmax::models::XlaTrainer: the device program computes in f32; train a float model");

    /// Compiles the step for batches of [batch, sequence] rows and uploads the host state. With
    /// `devices` D > 1 the step is data parallel over the client's first D devices by XLA's SPMD
    /// partitioner: the batch is split along its rows (each device takes batch / D), the state is
    /// replicated, and the partitioner all-reduces the gradients inside the program.
    XlaTrainer(Model& model, optim::AdamW<T>& optimizer, std::shared_ptr<xla::pjrt::client> client, std::size_t batch, std::size_t sequence,
               int devices = 1)
        : optimizer_(optimizer), parameters_(optimizer.parameters()), batch_(batch), sequence_(sequence) {
        check<value_error>(devices >= 1 && batch % std::size_t(devices) == 0, "models::XlaTrainer: batch ", batch, " does not split into ",
                           devices, " equal shares, one per device");
        const auto step = trace_training_step(model, parameters_, optimizer.config(), batch, sequence);
        auto module = xla::graph::emit(*step.graph, Model::name, step.results, step.state_count(),
                                       xla::graph::spmd_partitioning{std::size_t(devices), step.batch_inputs});
        program_ = std::make_unique<xla::device_program>(std::move(client), std::move(module), step.state_count());
        upload();
    }

    /// Copies the host's parameters and AdamW state to the device (after construction and resumes).
    void upload() {
        const auto state = optimizer_.export_state();
        const std::size_t n = parameters_.size();
        for (std::size_t i = 0; i < n; ++i) {
            const auto& p = parameters_[i].tensor;
            check<value_error>(state.slots[i].step == state.step, "models::XlaTrainer: parameter '", parameters_[i].name, "' took ",
                               state.slots[i].step, " of the optimiser's ", state.step,
                               " steps; the compiled step updates every parameter every step");
            program_->set_state(i, std::vector<float>(p.data(), p.data() + p.size()));
            program_->set_state(n + i, as_float(state.slots[i].first_moment));
            program_->set_state(2 * n + i, as_float(state.slots[i].second_moment));
        }
        steps_ = state.step;
    }

    /// Copies the device state into the host model and optimiser (before evaluating, sampling or
    /// writing a checkpoint).
    void download() {
        const std::size_t n = parameters_.size();
        optim::AdamState state{steps_, {}};
        for (std::size_t i = 0; i < n; ++i) {
            auto& p = parameters_[i].tensor;
            const auto values = program_->state(i);
            std::copy(values.begin(), values.end(), p.data());
            state.slots.push_back(optim::SlotState{parameters_[i].name, steps_, as_double(program_->state(n + i), p.shape()),
                                                   as_double(program_->state(2 * n + i), p.shape())});
        }
        optimizer_.import_state(state);
    }

    struct StepResult {
        double loss = 0;       ///< mean cross-entropy of the batch (without the z-loss term)
        double grad_norm = 0;  ///< global gradient norm before clipping
    };

    /// One training step on `batch` ([batch, sequence] rows): one execute, state updated on the device.
    StepResult step(const data::Batch& batch) {
        const Shape want{batch_, sequence_};
        check<shape_error>(batch.inputs.shape() == want && batch.targets.shape() == want, "models::XlaTrainer: the step was compiled for batches of ",
                           to_string(want), ", got inputs ", to_string(batch.inputs.shape()), " and targets ", to_string(batch.targets.shape()));
        const std::vector<float> ids(batch.inputs.begin(), batch.inputs.end()), targets(batch.targets.begin(), batch.targets.end());
        const std::vector<float> schedule = optim::lowered_adamw_schedule(optimizer_.config(), steps_ + 1);
        const auto reported = program_->run({ids.data(), targets.data(), schedule.data()});
        ++steps_;
        return {double(reported[0][0]), double(reported[1][0])};
    }

    /// Optimiser steps taken (the host's count at the last upload plus the steps run since).
    std::int64_t steps() const { return steps_; }
    const xla::device_program& program() const { return *program_; }

private:
    static std::vector<float> as_float(const Tensor<double>& t) { return std::vector<float>(t.begin(), t.end()); }
    static Tensor<double> as_double(const std::vector<float>& v, const Shape& shape) {
        auto t = Tensor<double>::uninitialized(shape);
        std::copy(v.begin(), v.end(), t.data());
        return t;
    }

    optim::AdamW<T>& optimizer_;
    std::vector<optim::Parameter<T>> parameters_;
    std::size_t batch_, sequence_;
    std::unique_ptr<xla::device_program> program_;
    std::int64_t steps_ = 0;
};

}  // namespace olmax::models
