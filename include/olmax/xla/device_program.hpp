#pragma once
// A whole traced program (xla::graph, e.g. one training step) compiled once for a PJRT client, with
// its state kept in device buffers between calls. Needs the PJRT runtime (target olmax::pjrt).
//
// The program's inputs are [state..., per-call inputs...], its outputs [reported values..., new
// state...] (the new state in the state inputs' order and types). `run` uploads only the per-call
// inputs, executes once, keeps the new state on the device in place of the old (donated state is
// written into the old buffers) and reads back only the reported values.
//
// Data parallelism inside one program, two ways:
// - SPMD (a module emitted with graph::spmd_partitioning, emit.hpp): `run` takes each per-call input
//   whole and cuts those the module splits along their first axis, device p getting share p.
// - Replicas (`replicas` = R > 1): one replica's program with explicit collectives
//   (graph::all_reduce_sum), compiled over the client's first R devices; `run` takes R shares of
//   each per-call input back to back along the first axis, replica r getting the r-th.
// Either way the state is replicated: `set_state` uploads it to every device, and the program keeps
// the copies equal. Reported values and `state` are read from device 0.

#include <algorithm>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "olmax/xla/pjrt_runtime.hpp"
#include "olmax/xla/stablehlo/module.hpp"

namespace olmax::xla {

class device_program {
public:
    /// `state_count` leading inputs are state; the last `state_count` outputs are its next value.
    device_program(std::shared_ptr<pjrt::client> client, stablehlo::emitted_module module, std::size_t state_count, int replicas = 1)
        : client_(std::move(client)), module_(std::move(module)), state_count_(state_count),
          devices_(std::size_t(std::max(replicas, 0)) * std::max<std::size_t>(module_.partitions, 1)) {
        check<value_error>(client_ != nullptr, "xla::device_program: no client");
        check<value_error>(replicas >= 1 && (replicas == 1 || module_.partitions <= 1), "xla::device_program: ", replicas,
                           " replicas of a module partitioned over ", module_.partitions, " devices; use one or the other");
        check<value_error>(devices_ >= 1 && devices_ <= client_->device_count(), "xla::device_program: ", devices_,
                           " devices asked for, the client has ", client_->device_count());
        check<value_error>(state_count_ <= module_.inputs.size() && state_count_ <= module_.outputs.size(), "xla::device_program: ",
                           state_count_, " state tensors for a module of ", module_.inputs.size(), " inputs and ", module_.outputs.size(),
                           " outputs");
        for (std::size_t i = 0; i < state_count_; ++i) {
            const auto& out = module_.outputs[module_.outputs.size() - state_count_ + i];
            check<shape_error>(out == module_.inputs[i], "xla::device_program: state ", i, " enters as ", module_.inputs[i].str(),
                               " but leaves as ", out.str());
            check<value_error>(!module_.is_split(i), "xla::device_program: state ", i, " is split over the devices; state is replicated");
        }
        check<value_error>(module_.donated <= state_count_, "xla::device_program: the module donates ", module_.donated,
                           " inputs, more than its ", state_count_, " state tensors");
        executable_ = on_device("compiling the program", [&] { return &client_->compile(module_, replicas); });  // once, here
        state_.resize(devices_);
        for (auto& copy : state_) copy.resize(state_count_);
    }

    const stablehlo::emitted_module& module() const { return module_; }
    /// What XLA planned for one run on one device (empty where the plugin does not say).
    const std::optional<pjrt::memory_plan>& memory() const { return executable_->memory; }
    std::size_t state_count() const { return state_count_; }
    std::size_t reported_count() const { return module_.outputs.size() - state_count_; }
    /// Devices one run uses (replicas, or SPMD partitions).
    std::size_t devices() const { return devices_; }

    /// Uploads state tensor `i` (dense row-major f32 of its declared type) to every replica.
    void set_state(std::size_t i, const std::vector<float>& values) {
        check<value_error>(i < state_count_, "xla::device_program: no state tensor ", i, " (", state_count_, " declared)");
        check<shape_error>(values.size() == std::size_t(module_.inputs[i].elements()), "xla::device_program: state ", i, " is ",
                           module_.inputs[i].str(), ", got ", values.size(), " values");
        on_device("uploading the state", [&] {
            for (std::size_t r = 0; r < devices_; ++r) state_[r][i] = client_->upload(values.data(), module_.inputs[i].dims, r);
        });
    }

    /// Reads state tensor `i` back to the host (from device `replica`).
    std::vector<float> state(std::size_t i, std::size_t replica = 0) {
        check<value_error>(replica < devices_ && i < state_count_ && state_[replica][i].get() != nullptr, "xla::device_program: state tensor ",
                           i, " of replica ", replica, " is not set");
        std::vector<float> out(std::size_t(module_.inputs[i].elements()));
        client_->download(state_[replica][i], out.data(), out.size());
        return out;
    }

    /// One execution: the per-call inputs uploaded (SPMD: whole; with R replicas, R shares back to
    /// back each), the state updated on the device, the reported values (of device 0) returned.
    std::vector<std::vector<float>> run(const std::vector<const float*>& inputs) {
        const std::size_t per_call = module_.inputs.size() - state_count_;
        check<value_error>(inputs.size() == per_call, "xla::device_program: ", module_.key, " takes ", per_call, " per-call inputs, got ",
                           inputs.size());
        for (std::size_t i = 0; i < state_count_; ++i)
            check<value_error>(state_[0][i].get() != nullptr, "xla::device_program: state tensor ", i,
                               " was never set, or a failed step consumed it (set_state)");
        return on_device("running a step", [&] {
            std::vector<std::vector<pjrt::device_buffer>> uploaded(devices_);
            std::vector<std::vector<const pjrt::device_buffer*>> arguments(devices_);
            for (std::size_t r = 0; r < devices_; ++r) {
                for (std::size_t i = 0; i < per_call; ++i) {
                    const std::size_t input = state_count_ + i;
                    const auto type = module_.local_input(input);
                    // a replica's share, a partition's share of a split input, or a replicated input whole
                    const bool whole = module_.partitions > 1 && !module_.is_split(input);
                    const std::size_t offset = whole ? 0 : r * std::size_t(type.elements());
                    uploaded[r].push_back(client_->upload(inputs[i] + offset, type.dims, r));
                }
                for (const auto& s : state_[r]) arguments[r].push_back(&s);
                for (const auto& u : uploaded[r]) arguments[r].push_back(&u);
            }
            std::vector<std::vector<pjrt::device_buffer>> outputs;
            try {
                outputs = client_->execute_replicated(*executable_, arguments);
            } catch (...) {
                // Donated state may already be consumed: drop it, so the next call says so instead of
                // handing the device a deleted buffer.
                for (auto& copy : state_)
                    for (std::size_t i = 0; i < module_.donated; ++i) copy[i] = pjrt::device_buffer();
                throw;
            }
            std::vector<std::vector<float>> reported;
            for (std::size_t i = 0; i < reported_count(); ++i) {
                reported.emplace_back(std::size_t(module_.outputs[i].elements()));
                client_->download(outputs[0][i], reported.back().data(), reported.back().size());
            }
            for (std::size_t r = 0; r < devices_; ++r)
                for (std::size_t i = 0; i < state_count_; ++i) state_[r][i] = std::move(outputs[r][reported_count() + i]);
            return reported;
        });
    }

    /// Bytes of state one device holds (the parameters and optimiser moments of a training step).
    std::size_t state_bytes() const {
        std::size_t bytes = 0;
        for (std::size_t i = 0; i < state_count_; ++i) bytes += std::size_t(module_.inputs[i].elements()) * 4;
        return bytes;
    }

private:
    /// Runs `f`; the device's allocator failing (RESOURCE_EXHAUSTED) becomes an error that says what
    /// ran out, how much state the program keeps there and what to change, with the plugin's message.
    template <class F>
    std::invoke_result_t<F&> on_device(const char* doing, F&& f) {
        try {
            return f();
        } catch (const pjrt::pjrt_error& e) {
            if (e.code() != PJRT_Error_Code_RESOURCE_EXHAUSTED) throw;
            throw pjrt::pjrt_error(olmax::detail::concat("xla::device_program: the device ran out of memory while ", doing, " (the program keeps ",
                                                         olmax::detail::human_bytes(double(state_bytes())), " of state on each of its ", devices_,
                                                         " device(s), plus its activations): use a smaller model or batch, or more devices. "
                                                         "The plugin said: ", e.what()),
                                   e.code());
        }
    }

    std::shared_ptr<pjrt::client> client_;
    stablehlo::emitted_module module_;
    std::size_t state_count_;
    std::size_t devices_;
    const pjrt::executable* executable_ = nullptr;
    std::vector<std::vector<pjrt::device_buffer>> state_;  // [replica][state tensor]
};

}  // namespace olmax::xla
