#pragma once
// A traced program (what `tracing::finish` returns) compiled once for a PJRT device and run with its
// state kept there. Each `run` uploads the caller's inputs and the values the host computes per call
// (a learning rate), executes once, runs the after-run hooks and returns the reported values; the
// state stays on the device until `download` writes it into the host tensors it was traced from.

#include <cstddef>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/xla/device_program.hpp"
#include "olmax/trace/tracer.hpp"

namespace olmax::trace {

/// A caller's per-call input as the program takes it (float32 values, row-major).
template <Scalar T>
std::vector<float> input_values(const Tensor<T>& t) {
    return backend::trace::float_values(t);
}

class compiled_program {
public:
    /// Compiles `program` for `client`'s first device and uploads the state from the host tensors.
    compiled_program(std::shared_ptr<xla::pjrt::client> client, traced_program program)
        : program_(std::move(program)),
          device_(std::make_unique<xla::device_program>(std::move(client), program_.module, program_.state.size())) {
        upload();
    }

    /// Copies the host tensors' values into the device state (after a checkpoint was loaded).
    void upload() {
        for (std::size_t i = 0; i < program_.state.size(); ++i) device_->set_state(i, program_.state[i].read());
    }
    /// Copies the device state into the host tensors the program was traced from.
    void download() {
        for (std::size_t i = 0; i < program_.state.size(); ++i) program_.state[i].write(device_->state(i));
    }

    /// One run: `inputs` are the caller's per-call inputs in the order they were made. Each is checked
    /// first (check_call_input: its size, and any index an op reads from it), so a refused run
    /// leaves the device state as it was.
    std::vector<std::vector<float>> run(const std::vector<std::vector<float>>& inputs) {
        std::vector<std::vector<float>> host;
        std::vector<const float*> pointers;
        std::size_t next = 0;
        host.reserve(program_.inputs.size());
        for (std::size_t i = 0; i < program_.inputs.size(); ++i) {
            const call_input& in = program_.inputs[i];
            if (in.host) {
                host.push_back(in.host());
            } else {
                check<value_error>(next < inputs.size(), "trace::compiled_program::run: the program takes more per-call inputs than the ",
                                   inputs.size(), " given");
            }
            const std::vector<float>& values = in.host ? host.back() : inputs[next++];
            check_call_input(in, values, i);
            pointers.push_back(values.data());
        }
        check<value_error>(next == inputs.size(), "trace::compiled_program::run: ", inputs.size(), " inputs given, the program takes ", next);
        auto reported = device_->run(pointers);
        for (const auto& f : program_.after_run) f();
        return reported;
    }

    const traced_program& program() const { return program_; }
    const xla::stablehlo::emitted_module& module() const { return program_.module; }
    /// What XLA planned for one run (empty where the plugin does not say).
    const std::optional<xla::pjrt::memory_plan>& memory() const { return device_->memory(); }
    /// Devices one run uses (SPMD partitions).
    std::size_t devices() const { return device_->devices(); }
    /// Where `run`'s result holds the value reported under `name` (trace::report).
    std::size_t reported_index(std::string_view name) const {
        for (std::size_t i = 0; i < program_.reported_names.size(); ++i)
            if (program_.reported_names[i] == name) return program_.reported.size() - program_.reported_names.size() + i;
        throw value_error(olmax::detail::concat("trace::compiled_program: the program reports no value named '", name, "'"));
    }

private:
    traced_program program_;
    std::unique_ptr<xla::device_program> device_;
};

}  // namespace olmax::trace
