#pragma once
// Training a model on a PJRT device with the whole step compiled once (docs/xla.md): the model's
// own eager training step (loss, backward, optim::AdamW::step) traced once (olmax/trace/) and run
// by trace::compiled_program with the parameters and AdamW's moments kept in device buffers. Per
// step only the batch and the three schedule values go to the device and only the loss and the
// gradient norm come back.
//
// The host model and optimiser stay the run's record: `download` copies the device state into
// them (parameters, moments), the optimiser's step counts advance with every run, so evaluation,
// sampling and checkpoints work exactly as for a CPU run, and a checkpoint written either way
// resumes either way (`upload` copies the host state to the device after a resume).
//
// Needs the PJRT runtime (the CMake target olmax::pjrt), so olmax.hpp does not include this header.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "olmax/data/loader.hpp"
#include "olmax/optim/adam.hpp"
#include "olmax/trace/native_calls.hpp"
#include "olmax/trace/program.hpp"
#include "olmax/trace/trace.hpp"

namespace olmax::train {

template <class Model>
class XlaTrainer {
public:
    using T = typename Model::value_type;
    static_assert(std::same_as<T, float>, "olmax::train::XlaTrainer: the device program computes in f32; train a float model");

    /// Traces `model`'s step (loss of a [batch, sequence] batch, backward, `optimizer.step()`) and
    /// compiles it; uploads the host state. With `devices` D > 1 the step is data parallel over the
    /// client's first D devices by XLA's SPMD partitioner: the batch is split along its rows (each
    /// device takes batch / D), the state is replicated, and the partitioner all-reduces the
    /// gradients inside the program.
    XlaTrainer(Model& model, optim::AdamW<T>& optimizer, std::shared_ptr<xla::pjrt::client> client, std::size_t batch, std::size_t sequence,
               int devices = 1, std::optional<trace::scan_form> scan_form = std::nullopt)
        : optimizer_(optimizer), batch_(batch), sequence_(sequence) {
        trace::traced_program traced = trace_step(model, optimizer, *client, batch, sequence, devices, scan_form);
        program_ = std::make_unique<trace::compiled_program>(std::move(client), std::move(traced));
        grad_norm_ = program_->reported_index("grad_norm");
    }

    /// The step as XlaTrainer compiles it, traced once from the model's own eager code: the loss of
    /// a [batch, sequence] batch, backward and `optimizer.step()`, with the parameters and moments as
    /// the program's state. With olmax's own CPU kernels (native calls) where `client`'s plugin runs
    /// them, and not across devices: XLA's SPMD partitioner cannot split a custom call. Every linear
    /// scan takes `scan_form`, or its tag's form or the device's (tracing::scan_form_for). Public for benchmarks
    /// that compile the same program (benchmarks/xla/whole_step.cpp).
    static trace::traced_program trace_step(Model& model, optim::AdamW<T>& optimizer, const xla::pjrt::client& client, std::size_t batch,
                                            std::size_t sequence, int devices = 1,
                                            std::optional<trace::scan_form> scan_form = std::nullopt) {
        check<value_error>(devices >= 1 && batch % std::size_t(devices) == 0, "train::XlaTrainer: batch ", batch, " does not split into ",
                           devices, " equal shares, one per device");
        trace::tracing t;
        t.set_target(client.platform_name());
        t.set_scan_form(scan_form);
        t.set_native_calls(devices == 1 && trace::enable_native_calls(client));
        for (const auto& p : optimizer.parameters()) t.bind_state(p.tensor);
        optimizer.for_each_moment([&](const auto& m) { t.bind_state(m); });
        const data::Batch rows{t.input<std::int32_t>({batch, sequence}), t.input<std::int32_t>({batch, sequence}), Tensor<float>(),
                               batch * sequence, 0};
        Tensor<T> loss = model.loss(rows);
        loss.backward();
        optimizer.step();
        optimizer.zero_grad();
        return t.finish({loss}, Model::name, std::size_t(devices));
    }

    /// Copies the host's parameters and AdamW moments to the device (after a resume).
    void upload() { program_->upload(); }
    /// Copies the device state into the host model and optimiser (before evaluating, sampling or
    /// writing a checkpoint).
    void download() { program_->download(); }

    struct StepResult {
        double loss = 0;       ///< mean cross-entropy of the batch (without the z-loss term)
        double grad_norm = 0;  ///< global gradient norm before clipping
    };

    /// One training step on `batch` ([batch, sequence] rows): one execute, state updated on the device.
    StepResult step(const data::Batch& batch) {
        const Shape want{batch_, sequence_};
        check<shape_error>(batch.inputs.shape() == want && batch.targets.shape() == want, "train::XlaTrainer: the step was compiled for batches of ",
                           to_string(want), ", got inputs ", to_string(batch.inputs.shape()), " and targets ", to_string(batch.targets.shape()));
        const auto reported = program_->run({trace::input_values(batch.inputs), trace::input_values(batch.targets)});
        return {double(reported[0][0]), double(reported[grad_norm_][0])};
    }

    /// Optimiser steps taken (the host optimiser's count, which each run advances).
    std::int64_t steps() const { return optimizer_.step_count(); }
    const xla::stablehlo::emitted_module& module() const { return program_->module(); }
    /// What the trace changed from the model's code as written (a scan's form: tracing::notices).
    const std::vector<std::string>& notices() const { return program_->program().notices; }
    /// What XLA planned for one step on one device (empty where the plugin does not say).
    const std::optional<xla::pjrt::memory_plan>& memory() const { return program_->memory(); }
    std::size_t devices() const { return program_->devices(); }

private:
    optim::AdamW<T>& optimizer_;
    std::size_t batch_, sequence_;
    std::unique_ptr<trace::compiled_program> program_;
    std::size_t grad_norm_ = 0;
};

}  // namespace olmax::train
