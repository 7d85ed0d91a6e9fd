#pragma once
// How an op runs on traced tensors: one lowering rule per op, found by the op's name.
//
// An op whose inputs are traced (core/traced.hpp; `op_scope::traced()`) returns what its rule
// returns instead of running kernels:
//
//     template <Real T> Tensor<T> tanh(const Tensor<T>& x) {
//         backend::op_scope on("tanh", x);
//         if (on.traced()) return backend::trace::call1<T>("tanh", {x});
//         ...   // the kernels
//
// The rules themselves live in olmax/trace/ (above every op), which registers them when it is
// included: a program that never traces includes none of the tracer. A rule builds the op's value
// in the tracer's primitives and records the primitives' backward on the tape, so the op's
// gradient traces too; an op without a rule fails at trace time with a `trace_error` naming it.

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/core/tensor.hpp"
#include "olmax/core/traced.hpp"

namespace olmax::backend::trace {

/// An op's non-tensor arguments (axes, sizes, scalars), in the order its rule documents.
struct attributes {
    std::vector<std::int64_t> ints{};
    std::vector<double> reals{};
};

/// A lowering rule: the op's outputs from its traced inputs. Traced programs compute in float32;
/// integer inputs (token ids) arrive as float32 values of the same symbol (`as_float`).
using rule = std::function<std::vector<Tensor<float>>(std::span<const Tensor<float>> inputs, const attributes& attrs)>;

namespace detail {

struct rule_table {
    std::mutex mutex;
    std::map<std::string, rule, std::less<>> rules;
};
inline rule_table& rules() {
    static rule_table table;
    return table;
}

/// A traced tensor of element type To naming `t`'s value (the program holds every value as float32).
template <Scalar To, Scalar From>
Tensor<To> retyped(const Tensor<From>& t) {
    const auto& from = olmax::detail::impl_of(t);
    auto impl = std::make_shared<olmax::detail::TensorImpl<To>>();
    impl->device = from.device;
    impl->shape = from.shape;
    impl->traced = true;
    impl->symbol = from.symbol;
    return olmax::detail::TensorAccess<To>::from_impl(std::move(impl));
}

}  // namespace detail

/// Sets the rule of op `op` (a later registration replaces an earlier one).
inline void register_rule(std::string_view op, rule r) {
    auto& table = detail::rules();
    std::lock_guard lock(table.mutex);
    table.rules.insert_or_assign(std::string(op), std::move(r));
}

/// Whether op `op` has a rule.
inline bool has_rule(std::string_view op) {
    auto& table = detail::rules();
    std::lock_guard lock(table.mutex);
    return table.rules.find(op) != table.rules.end();
}

/// The same traced value seen as a float32 tensor (token ids, targets, masks: the program holds
/// them as float32); a float tensor is returned as it is.
template <Scalar T>
Tensor<float> as_float(const Tensor<T>& t) {
    if (t.defined() && !t.traced()) {  // a host tensor read by the program: captured as a constant
        const olmax::detail::Tracer* tracer = olmax::detail::active_tracer();
        check<trace_error>(tracer != nullptr, "olmax: trace::as_float outside a trace");
        std::vector<float> values(t.size());
        const T* p = t.data();
        for (std::size_t i = 0; i < values.size(); ++i) values[i] = float(p[i]);
        auto impl = std::make_shared<olmax::detail::TensorImpl<float>>();
        impl->device = tracer->device();
        impl->shape = t.shape();
        impl->traced = true;
        impl->symbol = tracer->capture(std::move(values), t.shape());
        return olmax::detail::TensorAccess<float>::from_impl(std::move(impl));
    }
    if constexpr (std::is_same_v<T, float>) return t;
    else return detail::retyped<float>(t);
}

/// The same traced value seen as a tensor of element type `To` (token ids the program holds as
/// float32 values, after a reshape).
template <Scalar To>
Tensor<To> as_type(const Tensor<float>& t) {
    check<trace_error>(t.traced(), "olmax: trace::as_type of a tensor that is not traced");
    return detail::retyped<To>(t);
}

/// Makes `dst` (a traced tensor) name `value` from here on: an in-place update inside a traced
/// program (an optimiser writing its parameters and moments) becomes the program's new value.
template <Scalar T>
void assign(Tensor<T>& dst, const Tensor<float>& value) {
    check<trace_error>(dst.traced() && value.traced() && dst.shape() == value.shape(),
                       "olmax: trace::assign needs two traced tensors of one shape, got ", to_string(dst.shape()), " and ",
                       to_string(value.shape()));
    olmax::detail::impl_of(dst).symbol = olmax::detail::impl_of(value).symbol;
}

/// A [count] float32 input of the program being traced whose values `compute` gives on the host
/// before each run (a schedule's learning rate for the step about to run).
inline Tensor<float> host_values(std::size_t count, std::function<std::vector<float>()> compute) {
    const olmax::detail::Tracer* tracer = olmax::detail::active_tracer();
    check<trace_error>(tracer != nullptr, "olmax: trace::host_values outside a trace");
    auto impl = std::make_shared<olmax::detail::TensorImpl<float>>();
    impl->device = tracer->device();
    impl->shape = {count};
    impl->traced = true;
    impl->symbol = tracer->host_values(count, std::move(compute));
    return olmax::detail::TensorAccess<float>::from_impl(std::move(impl));
}

/// Makes each run of the program being traced report the scalar `value` under `name`.
inline void report(std::string_view name, const Tensor<float>& value) {
    const olmax::detail::Tracer* tracer = olmax::detail::active_tracer();
    check<trace_error>(tracer != nullptr && value.traced() && value.size() == 1, "olmax: trace::report takes a traced scalar inside a trace");
    tracer->report(name, *olmax::detail::impl_of(value).symbol);
}

/// Runs `f` on the host after each run of the program being traced.
inline void after_each_run(std::function<void()> f) {
    const olmax::detail::Tracer* tracer = olmax::detail::active_tracer();
    check<trace_error>(tracer != nullptr, "olmax: trace::after_each_run outside a trace");
    tracer->after_each_run(std::move(f));
}

/// Layers applied one after another inside a traced program, as ONE loop over their stacked
/// parameters (nn::Stack under tracing), so the program does not grow with depth. The layer's
/// behaviour may depend on its index only modulo `period` (each loop iteration runs `period`
/// layers); `body` runs layer `position` (its index modulo `period`) on traced tensors: its input,
/// its slices of the per-layer parameters and the shared ones. With `reverse` (a reversible layer's
/// own memory-free backward), backward rebuilds each layer's input from its output instead of the
/// loop storing them.
struct layer_loop {
    using layer_fn = std::function<Tensor<float>(const Tensor<float>& input, std::span<const Tensor<float>> layer,
                                                 std::span<const Tensor<float>> shared, std::size_t position)>;
    /// From a layer's output and the gradient of its output: its input and the gradient of its
    /// input, adding the parameters' gradients into `layer` and `shared` (nn::Reversible::reverse).
    using reverse_fn = std::function<std::pair<Tensor<float>, Tensor<float>>(const Tensor<float>& output, const Tensor<float>& output_grad,
                                                                             std::span<const Tensor<float>> layer,
                                                                             std::span<const Tensor<float>> shared, std::size_t position)>;
    std::string name;                    // for messages, e.g. the block's name
    Tensor<float> input;
    std::vector<Tensor<float>> stacked;  // [depth, ...] per-layer parameters
    std::vector<Tensor<float>> shared;   // used by every layer
    std::size_t depth = 1, period = 1;
    layer_fn body;
    reverse_fn reverse;                  // empty: not reversible (the loop stores each layer's input)
    /// Leading layers whose activations the forward stores, so the backward does not run them again
    /// (nn::Stack::keep_activations; a stack that is not reversible keeps all, as its tape does).
    std::size_t kept = 0;
};

namespace detail {
inline std::function<Tensor<float>(const layer_loop&)>& loop_rule() {
    static std::function<Tensor<float>(const layer_loop&)> rule;
    return rule;
}
}  // namespace detail

/// Sets how layer loops lower (olmax/trace/ does, when included).
inline void register_loop_rule(std::function<Tensor<float>(const layer_loop&)> rule) { detail::loop_rule() = std::move(rule); }

/// The output of `loop`'s layers inside the program being traced.
inline Tensor<float> loop_layers(const layer_loop& loop) {
    check<trace_error>(static_cast<bool>(detail::loop_rule()), "olmax: ", loop.name, ": a stack of layers has no lowering rule (include olmax/trace/trace.hpp)");
    return detail::loop_rule()(loop);
}

/// Runs the rule of op `op` on traced `inputs`; throws `trace_error` naming the op when it has
/// none, or when the op runs in another precision than float32.
template <Real T>
std::vector<Tensor<T>> call(std::string_view op, std::span<const Tensor<float>> inputs, const attributes& attrs = {}) {
    if constexpr (!std::is_same_v<T, float>) {
        throw trace_error(olmax::detail::concat("olmax: ", op, ": traced programs compute in float32; trace a float model"));
    } else {
        rule r;
        {
            auto& table = detail::rules();
            std::lock_guard lock(table.mutex);
            const auto it = table.rules.find(op);
            if (it == table.rules.end())
                throw trace_error(olmax::detail::concat("olmax: the op '", op,
                                                        "' has no lowering rule, so it cannot run inside a traced program (docs/xla.md lists "
                                                        "the ops that have one)"));
            r = it->second;
        }
        return r(inputs, attrs);
    }
}

/// The one output of a single-output op's rule, for ops on inputs of their own element type.
template <Real T>
Tensor<T> call1(std::string_view op, std::initializer_list<Tensor<T>> inputs, const attributes& attrs = {}) {
    if constexpr (!std::is_same_v<T, float>) {
        return call<T>(op, {}, attrs).front();  // throws: float32 only
    } else {
        std::vector<Tensor<float>> in;
        for (const auto& t : inputs) in.push_back(t.defined() ? as_float(t) : t);  // host inputs become constants
        auto out = call<T>(op, in, attrs);
        check<trace_error>(out.size() == 1, "olmax: the rule of '", op, "' returned ", out.size(), " values, expected 1");
        return std::move(out.front());
    }
}

}  // namespace olmax::backend::trace
