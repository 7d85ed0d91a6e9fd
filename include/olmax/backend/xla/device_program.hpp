#pragma once
// A whole traced program (xla::graph, e.g. one training step: forward, gradients and optimiser
// update) compiled once for a PJRT client, with its state kept in device buffers between calls.
//
// The program's inputs are [state..., per-call inputs...] and its outputs [reported values...,
// new state...] with the new state in the same order and types as the state inputs. `run` uploads
// only the per-call inputs (the data batch), executes once, keeps the new state on the device in
// place of the old and reads back only the reported values (the loss). Needs the PJRT runtime
// (pjrt_runtime.hpp, target olmax::pjrt).

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "olmax/backend/xla/pjrt_runtime.hpp"
#include "olmax/backend/xla/stablehlo/module.hpp"

namespace olmax::xla {

class device_program {
public:
    /// `state_count` leading inputs are state; the last `state_count` outputs are its next value.
    device_program(std::shared_ptr<pjrt::client> client, stablehlo::emitted_module module, std::size_t state_count)
        : client_(std::move(client)), module_(std::move(module)), state_count_(state_count) {
        check<value_error>(client_ != nullptr, "xla::device_program: no client");
        check<value_error>(state_count_ <= module_.inputs.size() && state_count_ <= module_.outputs.size(), "xla::device_program: ",
                           state_count_, " state tensors for a module of ", module_.inputs.size(), " inputs and ", module_.outputs.size(),
                           " outputs");
        for (std::size_t i = 0; i < state_count_; ++i) {
            const auto& out = module_.outputs[module_.outputs.size() - state_count_ + i];
            check<shape_error>(out == module_.inputs[i], "xla::device_program: state ", i, " enters as ", module_.inputs[i].str(),
                               " but leaves as ", out.str());
        }
        executable_ = &client_->compile(module_);  // compiled once, here: errors surface at construction
        state_.resize(state_count_);
    }

    const stablehlo::emitted_module& module() const { return module_; }
    std::size_t state_count() const { return state_count_; }
    std::size_t reported_count() const { return module_.outputs.size() - state_count_; }

    /// Uploads state tensor `i` (dense row-major f32 of its declared type).
    void set_state(std::size_t i, const std::vector<float>& values) {
        check<value_error>(i < state_count_, "xla::device_program: no state tensor ", i, " (", state_count_, " declared)");
        check<shape_error>(values.size() == std::size_t(module_.inputs[i].elements()), "xla::device_program: state ", i, " is ",
                           module_.inputs[i].str(), ", got ", values.size(), " values");
        state_[i] = client_->upload(values.data(), module_.inputs[i].dims);
    }

    /// Reads state tensor `i` back to the host.
    std::vector<float> state(std::size_t i) {
        check<value_error>(i < state_count_ && state_[i].get() != nullptr, "xla::device_program: state tensor ", i, " is not set");
        std::vector<float> out(std::size_t(module_.inputs[i].elements()));
        client_->download(state_[i], out.data(), out.size());
        return out;
    }

    /// One execution: the per-call inputs uploaded, the state updated on the device, the reported
    /// values returned.
    std::vector<std::vector<float>> run(const std::vector<const float*>& inputs) {
        const std::size_t per_call = module_.inputs.size() - state_count_;
        check<value_error>(inputs.size() == per_call, "xla::device_program: ", module_.key, " takes ", per_call, " per-call inputs, got ",
                           inputs.size());
        for (std::size_t i = 0; i < state_count_; ++i)
            check<value_error>(state_[i].get() != nullptr, "xla::device_program: state tensor ", i, " was never set (set_state)");
        std::vector<pjrt::device_buffer> uploaded;
        for (std::size_t i = 0; i < per_call; ++i) uploaded.push_back(client_->upload(inputs[i], module_.inputs[state_count_ + i].dims));
        std::vector<const pjrt::device_buffer*> arguments;
        for (const auto& s : state_) arguments.push_back(&s);
        for (const auto& u : uploaded) arguments.push_back(&u);
        std::vector<pjrt::device_buffer> outputs = client_->execute(*executable_, arguments);
        std::vector<std::vector<float>> reported;
        for (std::size_t i = 0; i < reported_count(); ++i) {
            reported.emplace_back(std::size_t(module_.outputs[i].elements()));
            client_->download(outputs[i], reported.back().data(), reported.back().size());
        }
        for (std::size_t i = 0; i < state_count_; ++i) state_[i] = std::move(outputs[reported_count() + i]);
        return reported;
    }

private:
    std::shared_ptr<pjrt::client> client_;
    stablehlo::emitted_module module_;
    std::size_t state_count_;
    const pjrt::executable* executable_ = nullptr;
    std::vector<pjrt::device_buffer> state_;
};

}  // namespace olmax::xla
