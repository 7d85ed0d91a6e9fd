#pragma once
// Traced tensors: what core knows of tracing (olmax/trace/ does the tracing itself). While a thread
// traces a program (olmax/trace/tracer.hpp), the tensors of that program hold no elements: each
// holds a *symbol*, an opaque value of the tracer naming one SSA value of the program being built.
// They live on the tracer's device, so every op that receives one runs its lowering rule instead of
// its kernels (backend/trace_rules.hpp), and the tape records the rule's ops like any others.
// Core's part is small: the symbol's type, the interface through which core and autodiff reach the
// active tracer (constants for `fill`, the sum of two gradients), and the error that code reading
// the elements of a traced tensor gets.

#include <cstddef>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "olmax/core/device.hpp"
#include "olmax/core/error.hpp"
#include "olmax/core/shape.hpp"

namespace olmax {

/// A program cannot be traced: an op without a lowering rule, code that reads the elements of a
/// traced tensor, a traced tensor used outside its trace. The message names the op.
class trace_error : public error {
public:
    using error::error;
};

namespace detail {

/// One value of a program being traced; the tracer derives its own (a node of its graph).
struct TracedValue {
    virtual ~TracedValue() = default;
};

/// What core and autodiff need of the tracer that is active on this thread.
class Tracer {
public:
    virtual ~Tracer() = default;
    /// The device traced tensors live on.
    virtual Device device() const = 0;
    /// A constant of `shape` whose every element is `value`.
    virtual std::shared_ptr<const TracedValue> constant(const Shape& shape, double value) const = 0;
    /// A constant holding a host tensor's `values` (row-major, as float32): a host tensor that an op
    /// of the traced program reads (a layer's fixed mask).
    virtual std::shared_ptr<const TracedValue> capture(std::vector<float> values, const Shape& shape) const = 0;
    /// a + b, both of `shape` (two gradients of one tensor).
    virtual std::shared_ptr<const TracedValue> add(const TracedValue& a, const TracedValue& b, const Shape& shape) const = 0;
    /// A per-call input of `count` values that the host computes before each run of the program
    /// (an optimiser's scheduled learning rate for the step about to run).
    virtual std::shared_ptr<const TracedValue> host_values(std::size_t count, std::function<std::vector<float>()> compute) const = 0;
    /// `f` runs on the host after each run of the program (an optimiser's step counter advancing).
    virtual void after_each_run(std::function<void()> f) const = 0;
    /// `value` (a scalar) is reported by each run under `name` (an optimiser's gradient norm).
    virtual void report(std::string_view name, const TracedValue& value) const = 0;
};

/// The tracer of this thread (null: none; set by olmax/trace's `tracing` scope).
inline const Tracer*& active_tracer() {
    thread_local const Tracer* tracer = nullptr;
    return tracer;
}

/// Whether tensors made on `device` by this thread are traced.
inline bool is_tracing_device(Device device) {
    const Tracer* tracer = active_tracer();
    return tracer != nullptr && tracer->device() == device;
}

}  // namespace detail

}  // namespace olmax
