#pragma once
// How an op runs on traced tensors (core/traced.hpp): it returns its lowering rule's value instead of
// running kernels. The op names its rule by a typed KEY, a struct holding the op's name and typed
// attributes (olmax's: `olmax::op::*`, listed in ops/op_keys.hpp), and its two forms part in
// `op_scope::run<Key>` (backend/dispatch.hpp); a misspelt key or a wrong attribute does not compile.
// The rules live in olmax/trace/ (above every op) and are registered when it is included, so a
// program that never traces includes none of the tracer; an op without a registered rule fails at
// trace time with a `trace_error` naming it. Each registry entry also carries its key's samples and
// eager form, from which tests/unit/test_op_rules.cpp checks every op's traced value and gradient.
// The whole recipe: docs/ARCHITECTURE.md, "Adding an op".

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeindex>
#include <utility>
#include <vector>

#include "olmax/core/random.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/core/traced.hpp"

namespace olmax::backend::trace {

/// A traced tensor of element type T on `device` naming the program's value `symbol`.
template <Scalar T>
Tensor<T> make_traced(Device device, Shape shape, std::shared_ptr<const olmax::detail::TracedValue> symbol) {
    auto impl = std::make_shared<olmax::detail::TensorImpl<T>>();
    impl->device = device;
    impl->shape = std::move(shape);
    impl->traced = true;
    impl->symbol = std::move(symbol);
    return olmax::detail::TensorAccess<T>::from_impl(std::move(impl));
}

/// A host tensor's elements as float32, row-major: how a program takes every value.
template <Scalar T>
std::vector<float> float_values(const Tensor<T>& t) {
    std::vector<float> out(t.size());
    const T* p = t.data();
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = float(p[i]);
    return out;
}

namespace detail {

/// A traced tensor of element type To naming `t`'s value (the program holds every value as float32).
template <Scalar To, Scalar From>
Tensor<To> retyped(const Tensor<From>& t) {
    const auto& from = olmax::detail::impl_of(t);
    return make_traced<To>(from.device, from.shape, from.symbol);
}

/// The tracer of this thread; trace_error naming `what` when no program is being traced.
inline const olmax::detail::Tracer& tracer_for(std::string_view what) {
    const olmax::detail::Tracer* tracer = olmax::detail::active_tracer();
    check<trace_error>(tracer != nullptr, "olmax: ", what, " outside a trace");
    return *tracer;
}

}  // namespace detail

/// The same traced value seen as a float32 tensor (token ids, targets, masks: the program holds
/// them as float32); a float tensor is returned as it is.
template <Scalar T>
Tensor<float> as_float(const Tensor<T>& t) {
    if (t.defined() && !t.traced()) {  // a host tensor read by the program: captured as a constant
        const olmax::detail::Tracer& tracer = detail::tracer_for("trace::as_float");
        return make_traced<float>(tracer.device(), t.shape(), tracer.capture(float_values(t), t.shape()));
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

/// `t` as a value of the program being traced: a host tensor becomes a constant of the program of
/// its own element type, a traced or undefined one is returned as it is. Outside a trace it is `t`
/// itself, so a composition of ops (an op's traced form) also runs eagerly, op by op.
template <Real T>
Tensor<T> in_program(const Tensor<T>& t) {
    if (!t.defined() || t.traced() || !olmax::detail::active_tracer()) return t;
    return as_type<T>(as_float(t));
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
    const olmax::detail::Tracer& tracer = detail::tracer_for("trace::host_values");
    return make_traced<float>(tracer.device(), {count}, tracer.host_values(count, std::move(compute)));
}

/// Makes each run of the program being traced report the scalar `value` under `name`.
inline void report(std::string_view name, const Tensor<float>& value) {
    const olmax::detail::Tracer* tracer = olmax::detail::active_tracer();
    check<trace_error>(tracer != nullptr && value.traced() && value.size() == 1, "olmax: trace::report takes a traced scalar inside a trace");
    tracer->report(name, *olmax::detail::impl_of(value).symbol);
}

/// Runs `f` on the host after each run of the program being traced.
inline void after_each_run(std::function<void()> f) {
    detail::tracer_for("trace::after_each_run").after_each_run(std::move(f));
}

/// Layers applied one after another inside a traced program, as ONE loop over their stacked
/// parameters (nn::Stack under tracing; docs/xla.md, "Depth is a loop"). `body` runs layer
/// `position` (its index modulo `period`: each iteration runs `period` layers) on its input, its
/// slices of the per-layer parameters and the shared ones. With `reverse` (a reversible layer's own
/// memory-free backward), backward rebuilds each layer's input from its output instead of storing it.
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

/// Integer indices (token ids, row numbers) from a tensor holding them as values: the same traced
/// value seen as int32, or a host copy converted: what a key's eager form passes to an op taking them.
template <Real T>
Tensor<std::int32_t> as_indices(const Tensor<T>& t) {
    if (t.traced()) return as_type<std::int32_t>(as_float(t));
    Tensor<std::int32_t> out(t.shape());
    for (std::size_t i = 0; i < t.size(); ++i) out.data()[i] = std::int32_t(t.data()[i]);
    return out;
}

// ---- typed keys and the registry of rules -------------------------------------------------------

/// A lowering rule's operands and results: float32 traced tensors (an optional operand left out is
/// an undefined tensor; integer inputs arrive as float32 values of the same symbol, `as_float`).
using traced_inputs = std::span<const Tensor<float>>;
using traced_outputs = std::vector<Tensor<float>>;

/// The key of an op's lowering rule: a struct holding the op's `name` (for messages) and its typed
/// attributes `attrs`, the op's non-tensor arguments (`struct attrs {};` for none).
template <class K>
concept op_key = requires {
    { K::name } -> std::convertible_to<std::string_view>;
    typename K::attrs;
} && std::is_default_constructible_v<typename K::attrs> && std::is_copy_constructible_v<typename K::attrs>;

/// A rule of the op keyed by K: its results from its traced operands and its attributes.
template <op_key K>
using rule_of = std::function<traced_outputs(traced_inputs, const typename K::attrs&)>;

/// One sample of an op's inputs, for the check that its traced form equals its eager form
/// (tests/unit/test_op_rules.cpp): host float32 tensors (undefined: an optional input left out), the
/// attributes, and the inputs that take no gradient (ids, row indices, masks).
template <class Attrs>
struct sample {
    std::vector<Tensor<float>> inputs;
    Attrs attrs{};
    std::vector<std::size_t> constant{};
};

/// A sample with its op bound to it, whatever the op's key: what the registry hands the check.
struct bound_sample {
    std::vector<Tensor<float>> inputs;
    std::vector<std::size_t> constant;
    /// The op on host tensors in double precision (the reference), and the same call on traced
    /// float32 tensors (the op's traced branch: its rule).
    std::function<std::vector<Tensor<double>>(std::span<const Tensor<double>>)> eager;
    std::function<std::vector<Tensor<float>>(std::span<const Tensor<float>>)> traced;
};

/// A registered op: its name, its rule (attributes type-erased) and its samples bound to its eager
/// form (empty when its key declares none).
struct op_entry {
    std::string_view name;
    std::function<traced_outputs(traced_inputs, const void* attrs)> lower;
    std::function<std::vector<bound_sample>(Generator&)> samples;
};

namespace detail {

template <class T, class R>
std::vector<Tensor<T>> as_outputs(R&& r) {
    if constexpr (std::is_same_v<std::remove_cvref_t<R>, Tensor<T>>) return {std::forward<R>(r)};
    else return std::vector<Tensor<T>>(r.begin(), r.end());
}

/// Whether key K declares samples and an eager form: `static std::vector<sample<attrs>>
/// samples(Generator&)` and `template <Real T> static R eager(std::span<const Tensor<T>>, const
/// attrs&)`, R a tensor or a list of them (the op's outputs).
template <class K>
concept has_samples = requires(Generator& rng, std::span<const Tensor<double>> d, std::span<const Tensor<float>> f, const typename K::attrs& a) {
    { K::samples(rng) } -> std::convertible_to<std::vector<sample<typename K::attrs>>>;
    as_outputs<double>(K::template eager<double>(d, a));
    as_outputs<float>(K::template eager<float>(f, a));
};

}  // namespace detail

/// Rules by key. The process's registry is `rules()`; a test may hold its own and make this
/// thread's traced ops use it (`registry_scope`).
class rule_registry {
public:
    /// Sets the rule of K (a later registration replaces an earlier one), with K's samples bound to
    /// its eager form when K declares them (detail::has_samples).
    template <op_key K>
    void add(rule_of<K> rule) {
        using attrs = typename K::attrs;
        op_entry e;
        e.name = K::name;
        e.lower = [rule = std::move(rule)](traced_inputs in, const void* a) { return rule(in, *static_cast<const attrs*>(a)); };
        if constexpr (detail::has_samples<K>)
            e.samples = [](Generator& rng) {
                std::vector<bound_sample> out;
                for (auto& s : K::samples(rng))
                    out.push_back({std::move(s.inputs), std::move(s.constant),
                                   [a = s.attrs](std::span<const Tensor<double>> in) { return detail::as_outputs<double>(K::template eager<double>(in, a)); },
                                   [a = s.attrs](std::span<const Tensor<float>> in) { return detail::as_outputs<float>(K::template eager<float>(in, a)); }});
                return out;
            };
        std::lock_guard lock(mutex_);
        entries_.insert_or_assign(std::type_index(typeid(K)), std::move(e));
    }
    /// The entry of key `key`.
    std::optional<op_entry> find(std::type_index key) const {
        std::lock_guard lock(mutex_);
        const auto it = entries_.find(key);
        return it == entries_.end() ? std::nullopt : std::optional<op_entry>(it->second);
    }
    /// Every entry, by name.
    std::vector<op_entry> entries() const {
        std::lock_guard lock(mutex_);
        std::vector<op_entry> out;
        for (const auto& [key, e] : entries_) out.push_back(e);
        std::sort(out.begin(), out.end(), [](const op_entry& a, const op_entry& b) { return a.name < b.name; });
        return out;
    }

private:
    mutable std::mutex mutex_;
    std::map<std::type_index, op_entry> entries_;
};

/// The process's rules: olmax/trace/ registers olmax's ops' rules here when it is included.
inline rule_registry& rules() {
    static rule_registry registry;
    return registry;
}

namespace detail {
inline const rule_registry*& local_rules() {
    thread_local const rule_registry* registry = nullptr;
    return registry;
}
inline const rule_registry& active_rules() { return local_rules() ? *local_rules() : rules(); }
[[noreturn]] inline void no_rule(std::string_view op) {
    throw trace_error(olmax::detail::concat("olmax: the op '", op,
                                            "' has no lowering rule, so it cannot run inside a traced program (docs/xla.md lists "
                                            "the ops that have one)"));
}
}  // namespace detail

/// RAII: while it lives, this thread's traced ops find their rules in `registry` only (a test's
/// registry holding a rule of its own).
class registry_scope {
public:
    explicit registry_scope(const rule_registry& registry) : previous_(std::exchange(detail::local_rules(), &registry)) {}
    ~registry_scope() { detail::local_rules() = previous_; }
    registry_scope(const registry_scope&) = delete;
    registry_scope& operator=(const registry_scope&) = delete;

private:
    const rule_registry* previous_;
};

/// Sets the rule of the op keyed by K in the process's registry (olmax/trace/rules.hpp does for
/// olmax's ops; an op of yours registers its own the same way).
template <op_key K>
void register_rule(rule_of<K> rule) {
    rules().add<K>(std::move(rule));
}

/// Whether the op keyed by K has a rule where this thread's traced ops look.
template <op_key K>
bool has_rule() {
    return detail::active_rules().find(std::type_index(typeid(K))).has_value();
}

/// Runs the rule of the op keyed by K on traced `inputs`; throws `trace_error` naming the op when it
/// has none.
template <op_key K>
traced_outputs call(traced_inputs inputs, const typename K::attrs& attrs = {}) {
    const auto e = detail::active_rules().find(std::type_index(typeid(K)));
    if (!e) detail::no_rule(K::name);
    return e->lower(inputs, &attrs);
}

/// An operand of an op's lowering rule: a tensor of any element type, handed to the rule as the
/// float32 traced value `as_float` makes of it (undefined stays undefined). It only refers to the
/// tensor: an op builds its operands in the expression that runs the rule (`op_scope::run`).
class operand {
public:
    template <Scalar S>
    operand(const Tensor<S>& t) : tensor_(&t), lower_([](const void* p) {  // NOLINT: implicit, so that {a, b} lists operands
          const auto& t = *static_cast<const Tensor<S>*>(p);
          return t.defined() ? as_float(t) : Tensor<float>();
      }) {}
    Tensor<float> value() const { return lower_(tensor_); }

private:
    const void* tensor_;
    Tensor<float> (*lower_)(const void*);
};

/// The operands of an op's lowering rule: a braced list of tensors (`{x, w}`), or a list of
/// tensors of one type (stack_leading's parts). Nothing is converted until the rule runs.
class operands {
public:
    operands(std::initializer_list<operand> list) : list_(list) {}
    template <Scalar S>
    operands(const std::vector<Tensor<S>>& tensors)
        : tensors_(&tensors), lower_tensors_([](const void* p) {
              std::vector<Tensor<float>> out;
              for (const auto& t : *static_cast<const std::vector<Tensor<S>>*>(p)) out.push_back(operand(t).value());
              return out;
          }) {}
    std::vector<Tensor<float>> values() const {
        if (tensors_) return lower_tensors_(tensors_);
        std::vector<Tensor<float>> out;
        out.reserve(list_.size());
        for (const auto& o : list_) out.push_back(o.value());
        return out;
    }

private:
    std::initializer_list<operand> list_{};
    const void* tensors_ = nullptr;
    std::vector<Tensor<float>> (*lower_tensors_)(const void*) = nullptr;
};

namespace detail {
template <class R>
struct integer_tensor : std::false_type {};
template <std::integral S>
struct integer_tensor<Tensor<S>> : std::true_type {
    using element = S;
};
}  // namespace detail

/// The results of the rule of the op keyed by K on `operands`, as the op returns them. R is the op's
/// result type: a tensor, a list of tensors, a struct of two (a scan's h and h_last), or an integer
/// tensor (a reshape of token ids: the rule's float32 value seen as integers). Throws `trace_error`
/// naming the op when it has no rule, its rule gives another number of values, or the op runs in
/// another precision than float32.
template <class R, op_key K>
R results(const operands& operands, const typename K::attrs& attrs) {
    auto lowered = [&](std::size_t expected) {  // expected 0: any number of values
        traced_outputs out = call<K>(operands.values(), attrs);
        check<trace_error>(expected == 0 || out.size() == expected, "olmax: the rule of '", K::name, "' returned ", out.size(),
                           " values, expected ", expected);
        return out;
    };
    if constexpr (std::is_same_v<R, Tensor<float>>) {
        return std::move(lowered(1).front());
    } else if constexpr (std::is_same_v<R, std::vector<Tensor<float>>>) {
        return lowered(0);
    } else if constexpr (detail::integer_tensor<R>::value) {
        return as_type<typename detail::integer_tensor<R>::element>(lowered(1).front());
    } else if constexpr (requires(Tensor<float> t) { R{t, t}; }) {
        auto out = lowered(2);
        return R{std::move(out[0]), std::move(out[1])};
    } else {
        throw trace_error(olmax::detail::concat("olmax: ", K::name, ": traced programs compute in float32; trace a float model"));
    }
}

}  // namespace olmax::backend::trace
