#pragma once
#include <algorithm>
#include <atomic>
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "olmax/core/bfloat16.hpp"
#include "olmax/core/device.hpp"
#include "olmax/core/error.hpp"
#include "olmax/core/memory.hpp"
#include "olmax/core/shape.hpp"
#include "olmax/core/traced.hpp"
#include "olmax/detail/third_party.hpp"

namespace olmax {

/// Element types a tensor may hold: floating point (differentiable), integers (token ids, indices)
/// and `bfloat16` (storage for mixed precision: cast to float to compute, core/bfloat16.hpp).
template <class T>
concept Scalar = (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) || std::is_same_v<T, bfloat16>;

/// Element types olmax differentiates: `float` and `double`.
template <class T>
concept Real = std::is_same_v<T, float> || std::is_same_v<T, double>;

template <class T>
constexpr std::string_view dtype_name() {
    if constexpr (std::is_same_v<T, float>) return "float32";
    else if constexpr (std::is_same_v<T, double>) return "float64";
    else if constexpr (std::is_same_v<T, std::int32_t>) return "int32";
    else if constexpr (std::is_same_v<T, std::int64_t>) return "int64";
    else if constexpr (std::is_same_v<T, std::int8_t>) return "int8";
    else if constexpr (std::is_same_v<T, std::uint8_t>) return "uint8";
    else if constexpr (std::is_same_v<T, std::int16_t>) return "int16";
    else if constexpr (std::is_same_v<T, std::uint16_t>) return "uint16";
    else if constexpr (std::is_same_v<T, std::uint32_t>) return "uint32";
    else if constexpr (std::is_same_v<T, std::uint64_t>) return "uint64";
    else if constexpr (std::is_same_v<T, bfloat16>) return "bfloat16";
    else return "scalar";
}

/// Contiguous buffer behind a tensor: xtensor's uninitialised vector with olmax's aligned,
/// counted allocator.
template <class T>
using Storage = xt::uvector<T, memory::TrackedAllocator<T>>;

namespace detail {

/// Where the op that produced a tensor sits on an autodiff tape; `tape_id == 0` for tensors that
/// no recorded op produced (leaves and constants).
struct NodeHandle {
    std::uint64_t tape_id = 0;
    std::size_t index = 0;
};

template <class T>
struct TensorImpl {
    std::shared_ptr<Storage<T>> storage;
    Device device;           // where `storage` (and `grad`) live; views share it with their base
    std::size_t offset = 0;  // in elements; reshape shares storage
    Shape shape;
    bool requires_grad = false;
    bool retains_grad = false;             // non-leaf keeps its gradient after backward
    std::shared_ptr<Storage<T>> grad;      // same element count as the tensor, or null
    NodeHandle node;
    // How many Tensor handles point here. The tape's nodes point here too, but only to add
    // gradients: when the last handle goes while they still do, `storage` is let go (Tensor).
    std::atomic<std::size_t> handles{0};
    // Traced tensors (core/traced.hpp) hold no storage: `traced` is set for every tensor made on the
    // tracing device, `symbol` once a rule or a constant has given it a value, `grad_symbol` is its
    // gradient's value.
    bool traced = false;
    std::shared_ptr<const TracedValue> symbol;
    std::shared_ptr<const TracedValue> grad_symbol;

    T* data() { return storage ? storage->data() + offset : nullptr; }
    const T* data() const { return storage ? storage->data() + offset : nullptr; }
    bool is_leaf() const { return node.tape_id == 0; }
};

template <Scalar T>
struct TensorAccess;

}  // namespace detail

/// An owning, contiguous, row-major N-d tensor of `float`, `double`, integers or `bfloat16`.
///
/// `Tensor` is a handle: copies share the buffer (like `torch::Tensor`); `clone()` copies the data.
/// A tensor with `requires_grad()` takes part in reverse-mode autodiff: ops on it are recorded on
/// the calling thread's tape, and `backward()` adds gradients into `grad()` of every leaf that
/// requires grad (gradients accumulate; call `zero_grad()` between steps).
///
/// Every tensor is on a `Device` (olmax/core/device.hpp): the host CPU unless it was made under a
/// `device_scope` or moved with `to()`. Ops compute on the device of their inputs.
template <Scalar T>
class Tensor {
public:
    using value_type = T;

    /// An undefined tensor (no buffer); `defined()` is false.
    Tensor() = default;

    /// Copies are handles to the same tensor (buffer and gradient). When the last handle goes while
    /// the autodiff tape still refers to the tensor (it was an input of a recorded op, whose node
    /// keeps it to add its gradient), the buffer is freed right away: a backward closure that needs
    /// the values holds a handle of its own, so what no backward reads (a matmul's output that only
    /// an add or a slice consumed) is freed during the forward pass, as PyTorch frees it.
    Tensor(const Tensor& other) noexcept : impl_(other.impl_) { hold(); }
    Tensor(Tensor&& other) noexcept = default;
    Tensor& operator=(const Tensor& other) noexcept {
        Tensor copy(other);
        std::swap(impl_, copy.impl_);  // the old one is let go with `copy`
        return *this;
    }
    Tensor& operator=(Tensor&& other) noexcept {
        Tensor moved(std::move(other));
        std::swap(impl_, moved.impl_);
        return *this;
    }
    ~Tensor() { let_go(); }

    /// A zero-filled tensor of this shape.
    explicit Tensor(const Shape& shape) : Tensor(uninitialized(shape)) { fill(T{0}); }
    Tensor(const Shape& shape, T value) : Tensor(uninitialized(shape)) { fill(value); }

    /// A tensor whose elements are left uninitialised (to be overwritten by a kernel), on the
    /// current device. Throws `shape_error` when the element count overflows and `allocation_error`
    /// (naming the shape and the bytes) when the memory cannot be had.
    static Tensor uninitialized(const Shape& shape) {
        const std::size_t n = numel(shape);
        Tensor t = adopt(std::make_shared<detail::TensorImpl<T>>());
        t.impl_->device = current_device();
        if (detail::is_tracing_device(t.impl_->device)) {  // a value of the traced program, given by a rule or `fill`
            t.impl_->traced = true;
            t.impl_->shape = shape;
            return t;
        }
        try {
            t.impl_->storage = std::make_shared<Storage<T>>(n);
        } catch (const std::bad_alloc&) {
            throw allocation_error(detail::concat("cannot allocate a ", dtype_name<T>(), " tensor of shape ", to_string(shape), " (",
                                                  detail::human_bytes(double(n) * double(sizeof(T))), "): out of memory"));
        }
        t.impl_->shape = shape;
        return t;
    }

    /// A tensor of this shape holding `values` (row-major); the count must match.
    static Tensor from(const Shape& shape, std::span<const T> values) {
        check<shape_error>(values.size() == numel(shape), "Tensor::from: ", values.size(),
                           " values given for shape ", to_string(shape));
        Tensor t = uninitialized(shape);
        std::copy(values.begin(), values.end(), t.data());
        return t;
    }
    static Tensor from(const Shape& shape, std::initializer_list<T> values) {
        return from(shape, std::span<const T>(values.begin(), values.size()));
    }
    /// A rank-0 tensor.
    static Tensor scalar(T value) { return Tensor(Shape{}, value); }

    bool defined() const { return static_cast<bool>(impl_); }
    /// The device this tensor's elements live on.
    Device device() const { return impl().device; }
    const Shape& shape() const { return impl().shape; }
    std::size_t rank() const { return impl().shape.size(); }
    std::size_t size() const { return numel(impl().shape); }
    std::size_t extent(long axis) const { return shape()[normalize_axis(axis, rank(), "Tensor::extent")]; }
    bool empty() const { return size() == 0; }

    /// The elements. Throws `trace_error` on a traced tensor, which has none (core/traced.hpp).
    T* data() { return elements(); }
    const T* data() const { return elements(); }
    /// Whether this tensor is a value of a program being traced (core/traced.hpp): it has a shape
    /// and a device but no elements.
    bool traced() const { return defined() && impl_->traced; }
    T* begin() { return data(); }
    T* end() { return data() + size(); }
    const T* begin() const { return data(); }
    const T* end() const { return data() + size(); }
    std::span<T> span() { return {data(), size()}; }
    std::span<const T> span() const { return {data(), size()}; }

    /// Element access by multi-index (bounds-checked in rank and extent).
    template <std::integral... I>
    T& operator()(I... index) { return data()[flat_index({static_cast<std::size_t>(index)...})]; }
    template <std::integral... I>
    const T& operator()(I... index) const { return data()[flat_index({static_cast<std::size_t>(index)...})]; }

    /// The value of a one-element tensor.
    T item() const {
        check<shape_error>(size() == 1, "Tensor::item: tensor of shape ", to_string(shape()),
                           " has ", size(), " elements, expected exactly 1");
        return data()[0];
    }

    void fill(T value) {
        if (impl().traced) {  // a constant of the traced program
            const detail::Tracer* tracer = detail::active_tracer();
            check<trace_error>(tracer != nullptr && tracer->device() == impl_->device, "olmax: fill on a traced tensor outside its trace");
            impl_->symbol = tracer->constant(impl_->shape, double(float(value)));
            return;
        }
        std::fill(begin(), end(), value);
    }

    /// A non-owning xtensor view of the data, for xtensor algorithms, I/O and printing. It is valid
    /// while this tensor (or a copy of the handle) lives.
    auto xt() { return xt::adapt(data(), size(), xt::no_ownership(), std::vector<std::size_t>(shape().begin(), shape().end())); }
    auto xt() const { return xt::adapt(data(), size(), xt::no_ownership(), std::vector<std::size_t>(shape().begin(), shape().end())); }

    /// A deep copy on the same device that does not require grad and is not on the tape.
    Tensor clone() const { return to(device()); }

    /// A deep copy on `device` (not on the tape; call `set_requires_grad` on the copy of a
    /// parameter). Every registered device keeps its elements in host memory today, so the copy is
    /// a memcpy; a device with its own memory copies through its backend.
    Tensor to(Device device) const {
        device_scope guard(device);
        Tensor t = uninitialized(shape());
        std::copy(begin(), end(), t.data());
        return t;
    }

    /// The same buffer, cut from the autodiff graph.
    Tensor detach() const {
        Tensor t = adopt(std::make_shared<detail::TensorImpl<T>>());
        t.impl_->storage = impl().storage;
        t.impl_->device = impl().device;
        t.impl_->offset = impl().offset;
        t.impl_->shape = impl().shape;
        t.impl_->traced = impl_->traced;
        t.impl_->symbol = impl_->symbol;
        return t;
    }

    // ---- autodiff ------------------------------------------------------------------------------
    // The gradient bookkeeping below is plain data on the tensor. The reverse pass is not: the two
    // `backward` overloads are declared here and defined in olmax/autodiff/tape.hpp, because core
    // sits below autodiff and must not include it (docs/ARCHITECTURE.md, "Layers"). Code that calls
    // `backward()` includes olmax/autodiff/autodiff.hpp (olmax/olmax.hpp does).
    bool requires_grad() const { return defined() && impl_->requires_grad; }
    /// Marks a leaf tensor as a parameter whose gradient `backward()` computes.
    Tensor& set_requires_grad(bool value = true) {
        static_assert(Real<T>, "olmax: only float and double tensors can require grad");
        check<autodiff_error>(impl().is_leaf(), "set_requires_grad: only leaf tensors (not results of recorded ops) can change requires_grad");
        impl_->requires_grad = value;
        return *this;
    }
    bool is_leaf() const { return impl().is_leaf(); }
    /// Keep the gradient of this intermediate (non-leaf) tensor after backward().
    Tensor& retain_grad() { impl().retains_grad = true; return *this; }

    /// The accumulated gradient, sharing its buffer; undefined when no gradient has reached it.
    Tensor grad() const {
        if (!defined() || (!impl_->grad && !impl_->grad_symbol)) return Tensor();
        Tensor g = adopt(std::make_shared<detail::TensorImpl<T>>());
        g.impl_->traced = impl_->traced;
        g.impl_->symbol = impl_->grad_symbol;
        g.impl_->storage = impl_->grad;
        g.impl_->device = impl_->device;
        g.impl_->shape = impl_->shape;
        return g;
    }
    /// Drops the gradient (the next backward starts from zero).
    void zero_grad() {
        if (!defined()) return;
        impl_->grad.reset();
        impl_->grad_symbol.reset();
    }

    /// Reverse pass from this one-element tensor (seed 1) through the calling thread's tape
    /// (defined in olmax/autodiff/tape.hpp).
    void backward(bool retain_graph = false);
    /// Reverse pass with an explicit output gradient of this tensor's shape (defined in
    /// olmax/autodiff/tape.hpp).
    void backward(const Tensor& grad_output, bool retain_graph = false);

private:
    friend struct detail::TensorAccess<T>;
    detail::TensorImpl<T>& impl() const {
        check<value_error>(static_cast<bool>(impl_), "olmax: operation on an undefined tensor");
        return *impl_;
    }
    static Tensor adopt(std::shared_ptr<detail::TensorImpl<T>> impl) noexcept {
        Tensor t;
        t.impl_ = std::move(impl);
        t.hold();
        return t;
    }
    void hold() noexcept {
        if (impl_) impl_->handles.fetch_add(1, std::memory_order_relaxed);
    }
    /// Drops this handle; the last one lets go of the buffer when others (the tape's nodes) still
    /// keep the implementation, for its gradient. Nothing reads the values through them.
    void let_go() noexcept {
        if (impl_ && impl_->handles.fetch_sub(1, std::memory_order_acq_rel) == 1 && impl_.use_count() > 1) impl_->storage.reset();
    }

    T* elements() const {
        detail::TensorImpl<T>& i = impl();
        if (i.traced) [[unlikely]] throw_traced();
        return i.data();
    }
    /// Reading the elements of a traced tensor: the op that does it has no lowering rule.
    [[noreturn]] void throw_traced() const {
        const std::string_view op = memory::detail::allocation_label().op;
        throw trace_error(detail::concat("olmax: ", op.empty() ? std::string_view("code outside any op") : op,
                                         " read the elements of a traced tensor of shape ", to_string(shape()),
                                         ": a traced program has no values until it runs; that op needs a lowering rule (docs/xla.md)"));
    }

    std::size_t flat_index(std::initializer_list<std::size_t> index) const {
        const Shape& s = shape();
        check<shape_error>(index.size() == s.size(), "Tensor: ", index.size(), " indices for a tensor of rank ", s.size());
        std::size_t flat = 0, axis = 0;
        for (std::size_t i : index) {
            if (i >= s[axis])  // not check(): the message (and its to_string) is built only on failure
                throw shape_error(detail::concat("Tensor: index ", i, " out of range for axis ", axis, " of shape ", to_string(s)));
            flat = flat * s[axis++] + i;
        }
        return flat;
    }

    std::shared_ptr<detail::TensorImpl<T>> impl_;
};

namespace detail {

/// The library's own access to a tensor's shared implementation (autodiff's gradient buffers and
/// graph handles, views that share storage). Not part of the public API: user code works through
/// `Tensor`'s members.
template <Scalar T>
struct TensorAccess {
    static TensorImpl<T>& impl(const Tensor<T>& t) { return t.impl(); }
    static const std::shared_ptr<TensorImpl<T>>& impl_ptr(const Tensor<T>& t) { return t.impl_; }
    static Tensor<T> from_impl(std::shared_ptr<TensorImpl<T>> impl) { return Tensor<T>::adopt(std::move(impl)); }
    /// A tensor of `shape` over `base`'s buffer starting `offset` elements after `base`'s first,
    /// on `base`'s device, not on the tape.
    static Tensor<T> alias(const Tensor<T>& base, std::size_t offset, const Shape& shape) {
        auto impl = std::make_shared<TensorImpl<T>>();
        impl->storage = base.impl().storage;
        impl->device = base.impl().device;
        impl->offset = base.impl().offset + offset;
        impl->shape = shape;
        impl->traced = base.impl().traced;  // a view of a traced tensor has no elements either
        return from_impl(std::move(impl));
    }
};

template <Scalar T>
TensorImpl<T>& impl_of(const Tensor<T>& t) { return TensorAccess<T>::impl(t); }
template <Scalar T>
const std::shared_ptr<TensorImpl<T>>& impl_ptr_of(const Tensor<T>& t) { return TensorAccess<T>::impl_ptr(t); }

}  // namespace detail

template <Scalar T>
Tensor<T> zeros(const Shape& shape) { return Tensor<T>(shape); }
template <Scalar T>
Tensor<T> ones(const Shape& shape) { return Tensor<T>(shape, T{1}); }
template <Scalar T>
Tensor<T> full(const Shape& shape, T value) { return Tensor<T>(shape, value); }
template <Scalar T>
Tensor<T> zeros_like(const Tensor<T>& t) {
    device_scope on(t.device());
    return Tensor<T>(t.shape());
}
template <Scalar T>
Tensor<T> ones_like(const Tensor<T>& t) {
    device_scope on(t.device());
    return Tensor<T>(t.shape(), T{1});
}

/// A tensor with `0, 1, ..., n-1` (handy for token ids and tests).
template <Scalar T>
Tensor<T> arange(std::size_t n) {
    auto t = Tensor<T>::uninitialized({n});
    for (std::size_t i = 0; i < n; ++i) t.data()[i] = static_cast<T>(i);
    return t;
}

/// Marks a tensor as a trainable leaf: `auto w = olmax::parameter(olmax::randn<float>({256, 256}, rng));`
template <Real T>
Tensor<T> parameter(Tensor<T> t) {
    if (!t.is_leaf()) t = t.detach();
    t.set_requires_grad(true);
    return t;
}

namespace detail {

/// NumPy-style nested brackets; axes longer than 2 * `edge` show their first and last `edge`
/// entries around "..." once the tensor has more than `summarize_above` elements.
template <Scalar T>
void print_block(std::ostream& out, const T* data, const Shape& shape, const Shape& strides, std::size_t axis, bool summarize,
                 std::size_t indent) {
    constexpr std::size_t edge = 3;
    auto value = [&](const T& v) -> std::ostream& {
        if constexpr (sizeof(T) == 1) return out << int(v);  // int8/uint8 as numbers, not characters
        else return out << v;
    };
    if (axis == shape.size()) {
        value(*data);
        return;
    }
    const std::size_t n = shape[axis];
    auto separator = [&] {
        if (axis + 1 == shape.size()) out << ", ";
        else out << ',' << std::string(shape.size() - axis - 1, '\n') << std::string(indent + 1, ' ');
    };
    out << '[';
    for (std::size_t i = 0; i < n; ++i) {
        if (summarize && n > 2 * edge && i == edge) {
            separator();
            out << "...";
            i = n - edge;
        }
        if (i > 0) separator();
        print_block(out, data + i * strides[axis], shape, strides, axis + 1, summarize, indent + 1);
    }
    out << ']';
}

}  // namespace detail

/// Prints dtype, shape and values (NumPy-style, summarised above 1000 elements), e.g.
/// `Tensor<float32>[2, 2] [[1, 2],\n [3, 4]]`; the stream's precision and flags apply.
template <Scalar T>
std::ostream& operator<<(std::ostream& out, const Tensor<T>& t) {
    if (!t.defined()) return out << "Tensor(undefined)";
    out << "Tensor<" << dtype_name<T>() << ">" << to_string(t.shape());
    if (!t.device().is_host()) out << " on " << t.device();
    if (t.requires_grad()) out << " requires_grad";
    if (t.traced()) return out << " traced";
    out << ' ';
    if (t.empty()) return out << "[]";
    detail::print_block(out, t.data(), t.shape(), row_major_strides(t.shape()), 0, t.size() > 1000, 0);
    return out;
}

/// Element-wise copy into a tensor of another element type on the same device (not differentiable).
/// Into bfloat16 it rounds to nearest even (once, also from double); out of it, it goes through
/// float, which holds every bfloat16 exactly.
template <Scalar To, Scalar From>
Tensor<To> cast(const Tensor<From>& t) {
    device_scope on(t.device());
    auto out = Tensor<To>::uninitialized(t.shape());
    if constexpr (std::is_same_v<To, bfloat16> && std::is_same_v<From, float>) to_bfloat16(t.data(), out.data(), t.size());
    else if constexpr (std::is_same_v<To, float> && std::is_same_v<From, bfloat16>) to_float(t.data(), out.data(), t.size());
    else if constexpr (std::is_same_v<From, bfloat16>)
        std::transform(t.begin(), t.end(), out.begin(), [](From v) { return static_cast<To>(float(v)); });
    else std::transform(t.begin(), t.end(), out.begin(), [](From v) { return static_cast<To>(v); });
    return out;
}

}  // namespace olmax
