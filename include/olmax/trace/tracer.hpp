#pragma once
// The tracer: while a `tracing` scope lives on a thread, tensors made there are values of one
// program (olmax/xla/graph/graph.hpp) instead of arrays of elements. Ops on them run their lowering
// rules (rules.hpp), the tape records the rules' primitives with their gradients (primitives.hpp),
// and so a model's ordinary forward, `backward()` and optimiser step, run once inside the scope,
// write the whole training step as one program (docs/xla.md, section 0, shows the calls).
//
// State is bound *in place*: every handle of a bound tensor (the layer's member, the optimiser's
// list) sees the traced value while the scope lives, and gets its host buffer back when it ends.
// An in-place update of state inside the trace (the optimiser's) becomes the program's new value
// of that state (`backend::trace::assign`).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/kernels.hpp"
#include "olmax/backend/registry.hpp"
#include "olmax/backend/trace_rules.hpp"
#include "olmax/xla/graph/emit.hpp"
#include "olmax/xla/graph/graph.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/core/traced.hpp"
#include "olmax/trace/scan_forms.hpp"

namespace olmax::trace {

namespace gx = olmax::xla::graph;

/// A tensor's value in the traced program.
struct traced_value final : olmax::detail::TracedValue {
    explicit traced_value(gx::var v) : var(v) {}
    gx::var var;
};

namespace detail {

/// The kernels of the tracing device: every primitive refuses, naming the op that called it (an op
/// that reached its kernels on traced tensors has no lowering rule).
class refusing_kernels final : public backend::Kernels {
public:
    std::string_view name() const override { return "trace"; }
    int num_threads() const override { return 1; }
    void parallel_for(std::size_t, std::size_t, backend::range_body) const override { refuse("a parallel loop"); }
    void gemm(bool, bool, std::size_t, std::size_t, std::size_t, float, const float*, std::size_t, const float*, std::size_t, float, float*,
              std::size_t) const override {
        refuse("a GEMM");
    }
    void gemm(bool, bool, std::size_t, std::size_t, std::size_t, double, const double*, std::size_t, const double*, std::size_t, double,
              double*, std::size_t) const override {
        refuse("a GEMM");
    }
    double sum(const float*, std::size_t) const override { refuse("a sum"); }
    double sum(const double*, std::size_t) const override { refuse("a sum"); }

private:
    [[noreturn]] static void refuse(std::string_view what) {
        const std::string_view op = memory::detail::allocation_label().op;
        throw trace_error(olmax::detail::concat("olmax: ", op.empty() ? std::string_view("code outside any op") : op, " ran ", what,
                                                " on traced tensors: that op needs a lowering rule (docs/xla.md)"));
    }
};

}  // namespace detail

/// The device traced tensors live on (registered once per process).
inline Device tracing_device() {
    static const Device device = backend::register_device("trace", std::make_shared<detail::refusing_kernels>());
    return device;
}

/// The value of traced tensor `t` in the program; throws when it has none yet (a tensor made by
/// `Tensor::uninitialized` that no rule wrote).
template <Scalar T>
const gx::var& var_of(const Tensor<T>& t) {
    check<trace_error>(t.traced(), "olmax: trace: a tensor that is not traced reached a traced op (shape ", to_string(t.shape()),
                       "); make it inside the trace or pass it as an input");
    const auto& symbol = olmax::detail::impl_of(t).symbol;
    const auto* value = dynamic_cast<const traced_value*>(symbol.get());
    check<trace_error>(value != nullptr, "olmax: trace: a traced tensor of shape ", to_string(t.shape()),
                       " was never given a value (an op wrote its elements instead of running its lowering rule)");
    return value->var;
}

/// The program's dims of a shape.
inline gx::dims_t dims_of(const Shape& shape) { return gx::dims_t(shape.begin(), shape.end()); }

/// A traced tensor of element type T holding `v` (not on the tape).
template <Scalar T = float>
Tensor<T> wrap(const gx::var& v) {
    return backend::trace::make_traced<T>(tracing_device(), Shape(v.dims().begin(), v.dims().end()), std::make_shared<traced_value>(v));
}

/// One tensor of the program's state: read from and written to its host buffer around runs.
struct state_slot {
    std::function<std::vector<float>()> read;                // the host tensor's values
    std::function<void(const std::vector<float>&)> write;    // into the host tensor
};

/// What an op reads from a per-call input as indices: integers in [0, limit) (tracing::require_indices).
struct index_bound {
    std::size_t limit = 0;
    std::string op, noun;  // the op and what it calls one index: "embedding", "id"
    friend bool operator==(const index_bound&, const index_bound&) = default;
};

/// Refuses `values` unless each is an integer in [0, b.limit), with the message of the eager op's
/// check: the op, the value and its position, then `where` (which input holds it).
inline void check_indices(std::span<const float> values, const index_bound& b, std::string_view where) {
    for (std::size_t i = 0; i < values.size(); ++i) {
        const float v = values[i];
        check<value_error>(v >= 0 && v < float(b.limit) && v == std::floor(v), b.op, ": ", b.noun, " ", v, " at position ", i, where,
                           " is not an integer in [0, ", b.limit, ")");
    }
}

/// One per-call input of a traced program: the caller's (`host` empty), or values the host computes
/// before each run.
struct call_input {
    Shape shape;
    std::function<std::vector<float>()> host;
    gx::var value{};                   // the program's input
    std::vector<index_bound> indices;  // what ops read from it as indices, checked before each run
};

/// Refuses a run's values of `in` (its per-call input `which`) of the wrong size, or holding an
/// index an op of the program would read out of range (compiled_program::run calls it).
inline void check_call_input(const call_input& in, std::span<const float> values, std::size_t which) {
    check<shape_error>(values.size() == numel(in.shape), "trace::compiled_program::run: input ", which, " has ", values.size(),
                       " values for shape ", to_string(in.shape));
    const std::string where = olmax::detail::concat(" of the program's input ", which, " (checked before the run)");
    for (const auto& b : in.indices) check_indices(values, b, where);
}

/// A traced program: its module and what a runner needs around it. Inputs are the state (in
/// `state` order), then the per-call inputs in the order they were made; results are the reported
/// values, then the state's next values.
struct traced_program {
    xla::stablehlo::emitted_module module;
    std::vector<state_slot> state;
    std::vector<call_input> inputs;
    std::vector<std::function<void()>> after_run;  // run after each run
    std::vector<Shape> reported;                   // the shapes of the reported values: the results, then the named ones
    std::vector<std::string> reported_names;       // the names of the reported values after the results (trace::report)
    std::vector<std::string> notices;              // what the trace changed from the code as written (tracing::notices)
};

/// The tracer active on this thread; throws when none is.
class tracing;
inline const tracing& active();

/// RAII: this thread traces while the scope lives (see the file comment). One at a time per thread.
class tracing final : public olmax::detail::Tracer {
public:
    tracing() : device_(tracing_device()), graph_(std::make_unique<gx::graph>()), graphs_{graph_.get()} {
        check<trace_error>(olmax::detail::active_tracer() == nullptr, "olmax: trace: a trace is already running on this thread");
        olmax::detail::active_tracer() = this;
        tape_ = std::make_unique<autodiff::tape_scope>();  // the trace's nodes stay off the caller's tape
    }
    ~tracing() override {
        tape_.reset();
        restore();
        olmax::detail::active_tracer() = nullptr;
    }
    tracing(const tracing&) = delete;
    tracing& operator=(const tracing&) = delete;

    Device device() const override { return device_; }
    /// The graph values are made in now: the program's, or the body of a loop being traced.
    gx::graph& graph() const { return *graphs_.back(); }

    /// RAII: values made while it lives go into `body` (a loop's body, traced once; layer_loop.hpp).
    class body_scope {
    public:
        body_scope(const tracing& t, gx::graph& body) : t_(t) { t_.graphs_.push_back(&body); }
        ~body_scope() { t_.graphs_.pop_back(); }
        body_scope(const body_scope&) = delete;
        body_scope& operator=(const body_scope&) = delete;

    private:
        const tracing& t_;
    };

    std::shared_ptr<const olmax::detail::TracedValue> constant(const Shape& shape, double value) const override {
        return std::make_shared<traced_value>(gx::constant(graph(), value, gx::f32(dims_of(shape))));
    }
    std::shared_ptr<const olmax::detail::TracedValue> capture(std::vector<float> values, const Shape& shape) const override {
        return std::make_shared<traced_value>(gx::dense_constant(graph(), std::move(values), gx::f32(dims_of(shape))));
    }
    std::shared_ptr<const olmax::detail::TracedValue> add(const olmax::detail::TracedValue& a, const olmax::detail::TracedValue& b,
                                                          const Shape&) const override {
        return std::make_shared<traced_value>(as_traced(a).var + as_traced(b).var);
    }
    std::shared_ptr<const olmax::detail::TracedValue> host_values(std::size_t count, std::function<std::vector<float>()> compute) const override {
        check<trace_error>(graphs_.size() == 1, "olmax: trace: a per-call host value inside a loop body (make it before the loop)");
        const gx::var input = graph_->input(gx::f32({std::int64_t(count)}));
        inputs_.push_back({{count}, std::move(compute), input, {}});
        return std::make_shared<traced_value>(input);
    }
    void after_each_run(std::function<void()> f) const override { after_run_.push_back(std::move(f)); }
    void report(std::string_view name, const olmax::detail::TracedValue& value) const override {
        check<trace_error>(graphs_.size() == 1, "olmax: trace: a reported value inside a loop body");
        named_.emplace_back(std::string(name), as_traced(value).var);
    }

    /// An op reads `v` as indices into `limit` rows (embedding's ids, a loss's targets, a gather's
    /// rows). Its eager form refuses an index out of range, but a program cannot throw (XLA clamps a
    /// gather's index; a one-hot row of such an id is zeros), so the check moves to the host: where
    /// `v` is a per-call input or a view of one (reshape, transpose, broadcast, slice), every run
    /// checks that input's values first (compiled_program::run); a constant is checked now. Indices
    /// the program computes itself (a router's slots) are not checked.
    void require_indices(gx::var v, std::size_t limit, std::string_view op, std::string_view noun) const {
        const index_bound bound{limit, std::string(op), std::string(noun)};
        while (v.defined() && &v.owner() == graph_.get()) {
            const gx::node& n = v.owner().at(v.node());
            if (n.is<gx::prim::reshape>() || n.is<gx::prim::transpose>() || n.is<gx::prim::broadcast_in_dim>() || n.is<gx::prim::slice>() ||
                n.is<gx::prim::stop_gradient>()) {
                v = n.operands[0];
            } else if (n.is<gx::prim::constant>()) {
                const std::vector<float> values = n.values ? *n.values : std::vector<float>{float(n.scalar)};
                return check_indices(values, bound, " of a constant of the traced program");
            } else {
                for (auto& in : inputs_)
                    if (in.value == v && std::find(in.indices.begin(), in.indices.end(), bound) == in.indices.end()) in.indices.push_back(bound);
                return;
            }
        }
    }

    /// The device the program is traced for, as its PJRT plugin names its platform ("cpu", "cuda",
    /// "tpu"; empty: unknown). Rules whose best form depends on the device read it (device_scan_form).
    void set_target(std::string platform) { target_ = std::move(platform); }
    const std::string& target() const { return target_; }
    /// Whether the program may call olmax's own CPU kernels (custom calls the XLA CPU plugin runs once
    /// trace::enable_native_calls(client) registered them). Off by default: it then runs on any plugin.
    void set_native_calls(bool on) { native_calls_ = on; }
    bool native_calls() const { return native_calls_; }
    /// Whether the program's GEMMs (matmul, contract_axis, the convolution's, the output head's) round
    /// their operands to bfloat16 and sum in f32, forward and backward, as the bf16 policy's do
    /// (docs/BF16.md). By default what the host kernels did when the trace began
    /// (Kernels::float_gemms_in_bf16); the program records it, since it is compiled once.
    void set_bf16_gemms(bool on) { bf16_gemms_ = on; }
    bool bf16_gemms() const { return bf16_gemms_; }
    /// The form every linear scan of the program takes instead of its tag's or the target's (to
    /// compare forms on one device; std::nullopt: none). Mamba's selective scan follows it too: fused
    /// over time when it is sequential, else a linear scan of its materialised states.
    void set_scan_form(std::optional<scan_form> form) { scan_form_ = form; }
    /// The target device's form of a linear scan: the set_scan_form one when given, else a loop
    /// over time on the CPU, chunked triangular matmuls on a TPU, log-depth doubling elsewhere.
    scan_form device_scan_form() const {
        if (scan_form_) return *scan_form_;
        if (target_ == "tpu") return scan_form::chunked_matmul<128>();
        if (on_cpu()) return scan_form::sequential();
        return scan_form::hillis_steele();
    }
    /// The form of a scan written with the strategy tag `strategy` (empty: none) and chunk `chunk`:
    /// the set_scan_form one when given; else the tag's own (scan_forms.hpp) where it suits the target
    /// (a loop over time only on the CPU); else the device's, with a notice naming both.
    scan_form scan_form_for(std::string_view strategy, std::size_t chunk) const {
        const scan_form device = device_scan_form();
        if (scan_form_ || strategy.empty()) return device;
        const std::optional<scan_form> own = scan_form_of(strategy, chunk);
        if (own && (own->strategy != scan_form::kind::sequential || on_cpu())) return *own;
        note(olmax::detail::concat("scan<", strategy, "> traced as ", device.name(), " for ", target_.empty() ? "the CPU" : target_, ": ",
                                   own ? "its loop over time would run the T steps one after another on the device"
                                       : "no StableHLO form computes it as written"));
        return device;
    }
    /// What the trace changed from the code as written (a scan's form), each said once: a runner
    /// prints them (train::XlaStep); traced_program::notices keeps them.
    const std::vector<std::string>& notices() const { return notices_; }
    void note(std::string text) const {
        for (const auto& n : notices_)
            if (n == text) return;
        notices_.push_back(std::move(text));
    }

    /// Makes `t` (a host tensor of any element type; the program holds it as float32) part of the
    /// program's state, in place (see the file comment). All state is bound before the first input.
    template <Scalar T>
    void bind_state(const Tensor<T>& t) {
        check<trace_error>(inputs_.empty(), "olmax: trace: bind every state tensor before making the first input");
        check<trace_error>(t.defined() && !t.traced(), "olmax: trace: bind_state takes a host tensor");
        auto impl = olmax::detail::impl_ptr_of(t);
        for (const auto& b : bound_)
            check<trace_error>(b.impl != impl.get(), "olmax: trace: a tensor is bound as state twice");
        const gx::var input = graph_->input(gx::f32(dims_of(t.shape())));
        state_slot slot;
        // Handles, not the implementation: a handle keeps the host buffer alive after the caller's
        // own handles go (core/tensor.hpp frees a buffer that only non-handles still reach).
        slot.read = [host = t] { return backend::trace::float_values(host); };
        slot.write = [host = t](const std::vector<float>& values) mutable {
            T* p = host.data();
            for (std::size_t i = 0; i < values.size(); ++i) p[i] = static_cast<T>(values[i]);
        };
        state_.push_back(std::move(slot));
        // Swap the host fields out for the traced value; `restore` puts them back.
        auto storage = std::move(impl->storage);
        auto grad = std::move(impl->grad);
        const Device host = impl->device;
        impl->device = device_;
        impl->traced = true;
        impl->symbol = std::make_shared<traced_value>(input);
        impl->grad_symbol.reset();
        bound entry;
        entry.impl = impl.get();
        entry.undo = [impl, storage = std::move(storage), grad = std::move(grad), host] {
            impl->storage = storage;
            impl->grad = grad;
            impl->device = host;
            impl->traced = false;
            impl->symbol.reset();
            impl->grad_symbol.reset();
        };
        entry.final_value = [impl]() -> gx::var {
            const auto* value = dynamic_cast<const traced_value*>(impl->symbol.get());
            check<trace_error>(value != nullptr, "olmax: trace: a state tensor lost its value");
            return value->var;
        };
        bound_.push_back(std::move(entry));
    }

    /// A per-call input of `shape` (token ids and targets as float32 values: exact below 2^24).
    template <Scalar T>
    Tensor<T> input(const Shape& shape) {
        check<trace_error>(graphs_.size() == 1, "olmax: trace: a program input inside a loop body");
        const gx::var value = graph_->input(gx::f32(dims_of(shape)));
        inputs_.push_back({shape, nullptr, value, {}});
        return wrap<T>(value);
    }

    /// Ends the trace: the module reports `results` (traced values of the program), then the named
    /// reported values (trace::report), then each state tensor's final value, and the bound tensors
    /// get their host buffers back. With `devices` > 1 the caller's inputs are split along their first
    /// axis over the devices, the rest replicated (graph::spmd_partitioning, emit.hpp).
    traced_program finish(const std::vector<Tensor<float>>& results, std::string_view name = "olmax_step", std::size_t devices = 1) {
        check<trace_error>(!finished_, "olmax: trace: finish called twice");
        finished_ = true;
        std::vector<gx::var> outputs;
        traced_program program;
        for (const auto& r : results) {
            outputs.push_back(var_of(r));
            program.reported.push_back(r.shape());
        }
        for (const auto& [reported_name, value] : named_) {
            outputs.push_back(value);
            program.reported.push_back(Shape(value.dims().begin(), value.dims().end()));
            program.reported_names.push_back(reported_name);
        }
        for (const auto& b : bound_) outputs.push_back(b.final_value());
        gx::spmd_partitioning spmd{devices, {}};
        for (const auto& in : inputs_)
            if (!in.host) spmd.split_inputs.push_back(in.value);
        program.module = gx::emit(*graph_, name, outputs, bound_.size(), spmd);
        program.state = std::move(state_);
        program.inputs = std::move(inputs_);
        program.after_run = std::move(after_run_);
        program.notices = notices_;
        tape_.reset();
        restore();
        return program;
    }

private:
    struct bound {
        const void* impl = nullptr;              // which tensor (a second binding is refused)
        std::function<gx::var()> final_value;    // its value when the trace ends
        std::function<void()> undo;              // gives it its host fields back
    };

    static const traced_value& as_traced(const olmax::detail::TracedValue& v) {
        const auto* t = dynamic_cast<const traced_value*>(&v);
        check<trace_error>(t != nullptr, "olmax: trace: a value of another tracer");
        return *t;
    }

    void restore() {
        for (auto it = bound_.rbegin(); it != bound_.rend(); ++it)
            if (it->undo) std::exchange(it->undo, nullptr)();
    }

    Device device_;
    std::unique_ptr<gx::graph> graph_;
    mutable std::vector<gx::graph*> graphs_;  // graph_, then the loop bodies being traced
    std::unique_ptr<autodiff::tape_scope> tape_;
    std::vector<state_slot> state_;
    std::vector<bound> bound_;
    mutable std::vector<call_input> inputs_;
    mutable std::vector<std::pair<std::string, gx::var>> named_;
    mutable std::vector<std::function<void()>> after_run_;
    bool finished_ = false;
    std::string target_;
    bool native_calls_ = false;
    bool bf16_gemms_ = backend::host_kernels().float_gemms_in_bf16();
    std::optional<scan_form> scan_form_;
    mutable std::vector<std::string> notices_;

    bool on_cpu() const { return target_ == "cpu" || target_.empty(); }
};

inline const tracing& active() {
    const auto* t = dynamic_cast<const tracing*>(olmax::detail::active_tracer());
    check<trace_error>(t != nullptr, "olmax: trace: no trace is running on this thread");
    return *t;
}

}  // namespace olmax::trace
