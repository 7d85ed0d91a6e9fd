#pragma once
// Custom backward passes, two ways on the same tape:
//  * `custom_op`: a forward value computed however the caller likes, plus a closure that receives
//    the output gradient and adds into the input gradients (`GradientSink::add`);
//  * `Function<Op>`: the LibTorch `autograd::Function` shape, static `forward` / `backward` with a
//    `Context` carrying saved tensors and options between them.
// Both record one node on the current tape (tape.hpp), so they nest, mix with built-in ops and
// follow the same grad-mode and lifetime rules. The scans, reversible blocks and stacks are built
// on them.

#include <any>
#include <concepts>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "olmax/autodiff/grad_mode.hpp"
#include "olmax/autodiff/gradient_sink.hpp"
#include "olmax/autodiff/tape.hpp"
#include "olmax/core/tensor.hpp"

namespace olmax::autodiff {

/// Lambda-level custom backward: returns `value` recorded as the result of `inputs`; `backward`
/// is called as `backward(grad_output, grads)` and must `grads.add(i, ...)` for each input.
///
///     auto y = olmax::autodiff::custom_op("cube", cube_values, {x},
///         [x](const Tensor<double>& dy, GradientSink<double>& g) { g.add(0, 3 * x * x * dy); });
template <Real T, class F>
    requires std::invocable<F&, const Tensor<T>&, GradientSink<T>&>
Tensor<T> custom_op(std::string_view name, Tensor<T> value, std::initializer_list<Tensor<T>> inputs, F&& backward) {
    std::vector<Tensor<T>> in(inputs);
    if (!should_record(std::span<const Tensor<T>>(in))) return value;
    if (!value.is_leaf() || value.requires_grad()) value = value.detach();
    record<T>(name, in, std::span<Tensor<T>>(&value, 1),
              [fn = std::forward<F>(backward)](std::span<const Tensor<T>> g, GradientSink<T>& sink) mutable { fn(g[0], sink); });
    return value;
}

/// Multi-output form: `backward(std::span<const Tensor<T>> grad_outputs, grads)`. `slices` names
/// inputs the backward adds into only in part (InputSlice, tape.hpp).
template <Real T, class F>
    requires std::invocable<F&, std::span<const Tensor<T>>, GradientSink<T>&>
std::vector<Tensor<T>> custom_op(std::string_view name, std::vector<Tensor<T>> values, std::vector<Tensor<T>> inputs, F&& backward,
                                 std::vector<InputSlice> slices = {}) {
    if (!should_record(std::span<const Tensor<T>>(inputs))) return values;
    for (auto& v : values)
        if (!v.is_leaf() || v.requires_grad()) v = v.detach();
    record<T>(name, inputs, values, BackwardFn<T>(std::forward<F>(backward)), std::move(slices));
    return values;
}

template <class Derived>
struct Function;

/// Everything a class-level custom op (`Function<Op>`) keeps between forward and backward.
template <Real T>
class Context {
public:
    /// Tensors the backward needs (inputs, outputs or anything computed in forward).
    template <class... Ts>
    void save_for_backward(const Ts&... tensors) { (saved_.push_back(tensors), ...); }
    const std::vector<Tensor<T>>& saved_tensors() const { return saved_; }
    /// Whether input `i` (counting tensor arguments of `forward`, in order) needs a gradient.
    bool needs_input_grad(std::size_t i) const { return i < needs_.size() && needs_[i]; }
    /// Non-tensor state (sizes, options) by name.
    std::map<std::string, std::any, std::less<>> saved_data;

private:
    template <class Derived>
    friend struct Function;
    std::vector<bool> needs_;  // set by Function::apply
    std::vector<Tensor<T>> saved_;
};

namespace detail {
template <class A>
struct tensor_arg : std::false_type {};
template <Real T>
struct tensor_arg<Tensor<T>> : std::true_type {
    using scalar = T;
};
template <class... Args>
struct first_real;
// Dispatch on a bool (not std::conditional_t, which would name `tensor_arg<A>::scalar` even for a
// non-tensor argument such as a `double` option and fail to compile).
template <bool IsTensor, class A, class... Rest>
struct first_real_step {
    using type = typename tensor_arg<std::remove_cvref_t<A>>::scalar;
};
template <class A, class... Rest>
struct first_real_step<false, A, Rest...> {
    using type = typename first_real<Rest...>::type;
};
template <class A, class... Rest>
struct first_real<A, Rest...> : first_real_step<tensor_arg<std::remove_cvref_t<A>>::value, A, Rest...> {};
template <>
struct first_real<> {
    using type = void;
};
}  // namespace detail

/// Class-level custom backward (the LibTorch `autograd::Function` shape):
///
///     struct Cube : olmax::autodiff::Function<Cube> {
///         template <class T> static Tensor<T> forward(Context<T>& ctx, const Tensor<T>& x) {
///             ctx.save_for_backward(x); return x * x * x; }
///         template <class T> static std::vector<Tensor<T>> backward(Context<T>& ctx, std::vector<Tensor<T>> dy) {
///             const auto& x = ctx.saved_tensors()[0]; return {3 * x * x * dy[0]}; }
///     };
///     auto y = Cube::apply(x);
///
/// `forward` runs with recording off and returns a `Tensor<T>` or a `std::vector<Tensor<T>>`;
/// `backward` returns one gradient per tensor argument of `forward` (undefined = none).
template <class Derived>
struct Function {
    template <class... Args>
    static auto apply(Args&&... args) {
        using T = typename detail::first_real<Args...>::type;
        static_assert(!std::is_void_v<T>, "olmax::autodiff::Function::apply needs at least one Tensor<float> or Tensor<double> argument");
        std::vector<Tensor<T>> inputs;
        auto collect = [&](const auto& a) {
            if constexpr (detail::tensor_arg<std::remove_cvref_t<decltype(a)>>::value) inputs.push_back(a);
        };
        (collect(args), ...);
        auto ctx = std::make_shared<Context<T>>();
        for (const auto& t : inputs) ctx->needs_.push_back(t.defined() && t.requires_grad());
        const bool rec = should_record(std::span<const Tensor<T>>(inputs));
        auto result = [&] {
            no_grad guard;
            return Derived::forward(*ctx, std::forward<Args>(args)...);
        }();
        using Result = decltype(result);
        static_assert(std::is_same_v<Result, Tensor<T>> || std::is_same_v<Result, std::vector<Tensor<T>>>,
                      "olmax::autodiff::Function: forward must return Tensor<T> or std::vector<Tensor<T>>");
        if (!rec) return result;
        std::vector<Tensor<T>> outs;
        if constexpr (std::is_same_v<Result, Tensor<T>>) outs.push_back(result);
        else outs = result;
        for (auto& o : outs)
            if (!o.is_leaf() || o.requires_grad()) o = o.detach();
        const std::size_t n_inputs = inputs.size();
        record<T>(typeid(Derived).name(), inputs, outs,
                  [ctx, n_inputs](std::span<const Tensor<T>> g, GradientSink<T>& sink) {
                      std::vector<Tensor<T>> grads_in = Derived::backward(*ctx, std::vector<Tensor<T>>(g.begin(), g.end()));
                      if (grads_in.size() != n_inputs)
                          throw autodiff_error(olmax::detail::concat(typeid(Derived).name(), "::backward returned ", grads_in.size(),
                                                                     " gradients for ", n_inputs, " tensor inputs"));
                      for (std::size_t i = 0; i < n_inputs; ++i)
                          if (grads_in[i].defined()) sink.add(i, grads_in[i]);
                  });
        if constexpr (std::is_same_v<Result, Tensor<T>>) return outs[0];
        else return outs;
    }
};

}  // namespace olmax::autodiff
