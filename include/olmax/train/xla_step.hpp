#pragma once
// The step compiled once for a PJRT device (docs/xla.md): train::XlaTrainer traces the model's
// own eager step (loss, backward, AdamW) and runs it with the parameters and moments resident on
// the device; per step only the batch goes there and the loss and gradient norm come back. The
// host model and optimiser are brought up to date before evaluations and checkpoints, so a
// checkpoint written by either strategy resumes with either. At precision bf16 the step is traced
// inside the precision's PrecisionScope, so its GEMMs (forward and backward) compute with operands
// rounded to bfloat16 and f32 sums, as the CPU step's do (trace::tracing::bf16_gemms, docs/BF16.md).
//
// Needs the PJRT runtime (CMake target olmax::pjrt): olmax/olmax.hpp and olmax/train/train.hpp do
// not include this header. One process (data parallelism is over the plugin's devices instead).

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "olmax/core/error.hpp"
#include "olmax/train/xla_trainer.hpp"
#include "olmax/train/precision.hpp"
#include "olmax/train/step.hpp"
#include "olmax/xla/pjrt_runtime.hpp"

namespace olmax::train {

struct XlaStepOptions {
    std::string plugin;      ///< the PJRT plugin (.so); empty: the environment variable OLMAX_PJRT_PLUGIN
    std::size_t batch = 8, sequence = 64;  ///< the shape the step is compiled for
    int devices = 1;         ///< data parallel over the plugin's first N devices (XLA's SPMD partitioner)
    std::string scan_form = "auto";  ///< every linear scan's form (trace::scan_form_named); auto: the tags' or the device's
    std::string precision = "fp32";  ///< fp32, or bf16: the step's GEMMs bf16 x bf16 -> f32 (docs/BF16.md)
};

template <class Model>
class XlaStep final : public StepStrategy<Model> {
public:
    explicit XlaStep(XlaStepOptions options) : options_(std::move(options)) {}

    /// Loads the plugin, traces and compiles the step and uploads the host state (after a resume).
    std::string prepare(StepContext<Model> context) override {
        check<value_error>(context.comm.world_size() == 1, "train::XlaStep: the compiled step runs in one process, got ",
                           context.comm.world_size(), " (data parallelism is over the plugin's devices)");
        namespace pjrt = olmax::xla::pjrt;
        const auto& plugin = pjrt::plugin::load(options_.plugin);
        auto client = std::make_shared<pjrt::client>(plugin);
        const std::size_t device_count = client->device_count();
        const auto started = std::chrono::steady_clock::now();
        std::optional<trace::scan_form> scan_form;
        if (options_.scan_form != "auto") scan_form = trace::scan_form_named(options_.scan_form);
        {
            const PrecisionScope precision(options_.precision, false);  // the trace records the policy (tracing::bf16_gemms)
            trainer_ = std::make_unique<XlaTrainer<Model>>(context.model, context.optimizer, std::move(client), options_.batch,
                                                                   options_.sequence, options_.devices, scan_form);
        }
        char line[400];
        std::snprintf(line, sizeof line, "device xla: %s, %zu device(s), step compiled in %.2f s (%zu bytes of StableHLO), data parallel over %d",
                      plugin.path().c_str(), device_count,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), trainer_->module().text.size(),
                      options_.devices);
        std::string said = line;
        if (const auto& plan = trainer_->memory()) {  // XLA's own plan: the plugin's runtime and compiler are not in it
            std::snprintf(line, sizeof line, "; step memory planned by XLA %.1f MiB per device (arguments %.1f, outputs not aliased %.1f, temporaries %.1f)",
                          double(plan->total()) / 1048576.0, double(plan->arguments) / 1048576.0, double(plan->outputs - plan->aliased) / 1048576.0,
                          double(plan->temporaries) / 1048576.0);
            said += line;
        }
        if (options_.precision == "bf16")
            said += "\nprecision bf16 (device xla): every GEMM of the compiled step, forward and backward, on bf16 operands with f32 "
                    "results (stablehlo.convert to bf16, dot_general bf16 x bf16 -> f32); parameters, moments, norms, softmax, losses "
                    "and scans in f32";
        for (const auto& notice : trainer_->notices()) said += "\n" + notice;
        return said;
    }

    /// One execute: forward, gradients and the update on the device.
    StepLoss compute(const std::function<data::Batch()>& next_batch) override {
        check(trainer_ != nullptr, "train::XlaStep: compute before prepare");
        const auto result = trainer_->step(next_batch());
        return {result.loss, result.grad_norm, 0.0};
    }
    void update() override {}  // done by compute, on the device
    void synchronize_host() override {
        if (trainer_) trainer_->download();
    }
    std::string divergence_note() const override { return "(on the device: its state is not kept)"; }

private:
    XlaStepOptions options_;
    std::unique_ptr<XlaTrainer<Model>> trainer_;
};

}  // namespace olmax::train
