#pragma once
// Which `Kernels` serve which device: the host's (chosen per process or per scope) and those of
// devices that backends register at run time.
//
//     backend::set_host_kernels(backend::kernels<backend::cpu_serial>());   // whole process
//     { backend::host_kernels_scope serial(backend::kernels<backend::cpu_serial>()); ... }  // this thread, this scope
//     Device dev = backend::register_device("my_accelerator", my_kernels);   // tensors .to(dev) compute there
//
// The host's default kernels are `cpu_openmp` (olmax/backend/default.hpp names the choice).

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "olmax/backend/default.hpp"
#include "olmax/backend/kernels.hpp"
#include "olmax/core/device.hpp"
#include "olmax/core/error.hpp"

namespace olmax::backend {

/// Most devices one process may register (the host included); a fixed table keeps the lookup that
/// every primitive makes lock-free.
inline constexpr std::size_t max_devices = 64;

namespace detail {

struct kernel_table {
    std::array<std::atomic<const Kernels*>, max_devices> by_device{};  // index 0 unused: the host's are chosen below
    std::atomic<const Kernels*> host_default{&kernels<default_backend>()};
    std::mutex mutex;                                     // serialises registration
    std::vector<std::shared_ptr<const Kernels>> owned;   // keeps registered kernels alive for the process
};
inline kernel_table& table() {
    static kernel_table t;
    return t;
}

}  // namespace detail

/// The kernels the host computes with on this thread: the innermost `host_kernels_scope`, else the
/// process default (`set_host_kernels`, initially `cpu_openmp`).
inline const Kernels& host_kernels() {
    if (const Kernels* k = detail::host_kernels_override()) return *k;
    return *detail::table().host_default.load(std::memory_order_acquire);
}

/// Sets the process-wide default kernels of the host (e.g. `kernels<cpu_serial>()`); threads that
/// hold a `host_kernels_scope` keep theirs. `k` must live for the rest of the process
/// (`kernels<B>()` does).
inline void set_host_kernels(const Kernels& k) { detail::table().host_default.store(&k, std::memory_order_release); }

/// RAII: this thread's host computations use `k` while the scope lives (parallel loops carry the
/// choice to the threads that run their chunks). Scopes nest.
class host_kernels_scope {
public:
    explicit host_kernels_scope(const Kernels& k) : previous_(detail::host_kernels_override()) { detail::host_kernels_override() = &k; }
    ~host_kernels_scope() { detail::host_kernels_override() = previous_; }
    host_kernels_scope(const host_kernels_scope&) = delete;
    host_kernels_scope& operator=(const host_kernels_scope&) = delete;

private:
    const Kernels* previous_;
};

/// Registers a device computed on by `k` and returns it. Its tensors live in host memory (every
/// device today keeps them there; `Tensor::data()` is valid on each). Throws `device_error` when
/// `max_devices` are registered or `k` is null.
inline Device register_device(std::string name, std::shared_ptr<const Kernels> k) {
    check<device_error>(k != nullptr, "backend::register_device: no kernels given for device '", name, "'");
    auto& t = detail::table();
    std::lock_guard<std::mutex> lock(t.mutex);
    // Reserve the index first: the name table and the kernel table must agree on it.
    const Device device = add_device_name(std::move(name));
    if (device.index() >= max_devices)
        throw device_error(olmax::detail::concat("backend::register_device: at most ", max_devices, " devices per process"));
    t.by_device[device.index()].store(k.get(), std::memory_order_release);
    t.owned.push_back(std::move(k));
    return device;
}

/// The kernels that compute on `device`.
inline const Kernels& kernels_for(Device device) {
    if (device.is_host()) return host_kernels();
    const Kernels* k = device.index() < max_devices ? detail::table().by_device[device.index()].load(std::memory_order_acquire) : nullptr;
    if (k == nullptr)
        throw device_error(olmax::detail::concat("olmax: device '", device.name(), "' has no kernels (it was not made by backend::register_device)"));
    return *k;
}

/// The kernels of this thread's current device: what an op computes with while it runs (ops set
/// the current device to their inputs' device, see dispatch.hpp).
inline const Kernels& current() { return kernels_for(current_device()); }

}  // namespace olmax::backend
