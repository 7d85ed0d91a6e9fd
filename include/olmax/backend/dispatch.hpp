#pragma once
// How an op reaches its device: `op_scope` at the op's entry checks that its tensor inputs share
// one device and makes it the thread's current device for the op's lifetime; everything inside
// (allocations, `backend::current()`, `backend::map`, nested ops) then runs there.
//
//     template <Real T> Tensor<T> my_op(const Tensor<T>& a, const Tensor<T>& b) {
//         backend::op_scope on("my_op", a, b);               // device_error if a and b disagree
//         auto out = Tensor<T>::uninitialized(a.shape());     // on that device
//         backend::map(out.size(), out.data(), f, a.data(), b.data());
//         ...
//
// On traced inputs (core/traced.hpp) an op returns its lowering rule's value instead of running
// kernels: `op_scope::run` picks one of the two, so the op's body never asks which.
//
// The dispatch path, end to end: tensor -> Device (core) -> Kernels of that device (registry.hpp)
// -> the static backend behind them (cpu_openmp / cpu_serial / a registered device's own).

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include "olmax/backend/cpu_serial.hpp"
#include "olmax/backend/kernels.hpp"
#include "olmax/backend/registry.hpp"
#include "olmax/backend/trace_rules.hpp"
#include "olmax/core/device.hpp"
#include "olmax/core/memory_profile.hpp"
#include "olmax/core/tensor.hpp"

namespace olmax::backend {

namespace detail {

/// Folds one input into the common device; `first`/`first_at` remember the first defined input.
class device_fold {
public:
    explicit device_fold(std::string_view op) : op_(op) {}
    template <Scalar T>
    void add(const Tensor<T>& t) {
        if (t.defined()) add(t.device());
        ++position_;
    }
    template <Scalar T>
    void add(std::span<const Tensor<T>> ts) {
        for (const auto& t : ts) add(t);
    }
    template <Scalar T>
    void add(const std::vector<Tensor<T>>& ts) { add(std::span<const Tensor<T>>(ts)); }
    Device result() const { return found_ ? device_ : current_device(); }

private:
    void add(Device d) {
        if (!found_) {
            found_ = true;
            device_ = d;
            first_at_ = position_;
        } else if (d != device_ && olmax::detail::is_tracing_device(d) && device_.is_host()) {
            device_ = d;  // a host tensor read by a traced op: the rule captures it as a constant
        } else if (d != device_ && !(olmax::detail::is_tracing_device(device_) && d.is_host())) {
            throw device_error(olmax::detail::concat(op_, ": inputs are on different devices: input ", first_at_, " on ", device_.name(),
                                                     ", input ", position_, " on ", d.name(),
                                                     "; move one with .to(device) (ops never copy between devices on their own)"));
        }
    }
    std::string_view op_;
    Device device_;
    bool found_ = false;
    std::size_t position_ = 0, first_at_ = 0;
};

}  // namespace detail

/// The one device all defined `inputs` are on (tensors, or vectors/spans of tensors, counted in
/// order for the message); the current device when none is defined. Throws `device_error` naming
/// both devices and input positions when two differ.
template <class... Inputs>
Device common_device(std::string_view op, const Inputs&... inputs) {
    detail::device_fold fold(op);
    (fold.add(inputs), ...);
    return fold.result();
}

/// RAII at an op's entry: the op runs on its inputs' common device (see the file comment).
class op_scope {
public:
    template <class... Inputs>
    explicit op_scope(std::string_view op, const Inputs&... inputs) : device_(common_device(op, inputs...)), scope_(device_), label_(op) {}
    op_scope(const op_scope&) = delete;
    op_scope& operator=(const op_scope&) = delete;

    /// The op's result, the one place where its traced and eager forms part: on traced inputs
    /// (core/traced.hpp) the lowering rule of its key K (backend/trace_rules.hpp) on `operands` and
    /// `attrs`; else `kernel()`, the op's own kernels. Checks before it hold for both forms.
    template <trace::op_key K, class Kernel>
    std::invoke_result_t<Kernel&> run(const trace::operands& operands, const typename K::attrs& attrs, Kernel&& kernel) const {
        if (traced()) return trace::results<std::invoke_result_t<Kernel&>, K>(operands, attrs);
        return kernel();
    }

    /// The result of an op whose traced form is a composition of other ops, each with its own rule
    /// (a fused kernel's unfused definition): `composition()` on traced inputs, else `kernel()`.
    template <class Composition, class Kernel>
    std::invoke_result_t<Kernel&> run_composed(Composition&& composition, Kernel&& kernel) const {
        if (traced()) return composition();
        return kernel();
    }

private:
    /// Whether the op runs on traced tensors (core/traced.hpp).
    bool traced() const { return olmax::detail::is_tracing_device(device_); }

    Device device_;
    device_scope scope_;
    memory::op_label_scope label_;  // names the op's buffers in memory::profile_peak
};

/// out[i] = f(in[i]...) for i in [0, n) on the current device's kernels: chunks of the index range
/// go to `parallel_for`, each a vectorisable loop compiled here.
template <class T, class F, class... In>
void map(std::size_t n, T* out, F f, const In*... in) {
    current().parallel_for(n, 1, [&](std::size_t begin, std::size_t end) { cpu_serial::map(end - begin, out + begin, f, (in + begin)...); });
}

}  // namespace olmax::backend
