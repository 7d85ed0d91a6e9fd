#pragma once
// Devices: where a tensor's elements live and whose kernels compute on them.
//
// A `Device` is a small value (an index into the process's device table) carried by every tensor.
// Device 0 is the host CPU; backends add more at run time (`backend::register_device`, e.g. a PJRT
// device or the conformance suite's counting device). Ops run on the device of their inputs and
// refuse inputs on two different devices (`device_error`, naming both); tensors an op creates land
// on the *current* device, which each op sets to its inputs' device while it runs (`device_scope`),
// and which is the host everywhere else. Core only knows names and the current device; which
// kernels serve a device is the backend layer's business (olmax/backend/registry.hpp).

#include <cstdint>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "olmax/core/error.hpp"

namespace olmax {

/// Two inputs of one op are on different devices, or a device index names no device.
class device_error : public error {
public:
    using error::error;
};

namespace detail {

/// The names of the process's devices, by index (never shrinks: a Device stays printable).
struct device_table {
    std::mutex mutex;
    std::vector<std::string> names{"cpu"};
};
inline device_table& devices() {
    static device_table table;
    return table;
}

/// This thread's current device index (0: host).
inline std::uint32_t& current_device_index() {
    thread_local std::uint32_t index = 0;
    return index;
}

}  // namespace detail

/// Where a tensor lives. Equality compares identity (the table index).
class Device {
public:
    /// The host CPU (the default device).
    constexpr Device() = default;
    static constexpr Device host() { return Device(); }

    /// The device with this table index; throws `device_error` when there is none.
    static Device from_index(std::uint32_t index) {
        auto& table = detail::devices();
        std::lock_guard<std::mutex> lock(table.mutex);
        check<device_error>(index < table.names.size(), "olmax: no device with index ", index, " (", table.names.size(),
                            " devices are registered)");
        return Device(index);
    }

    constexpr std::uint32_t index() const { return index_; }
    constexpr bool is_host() const { return index_ == 0; }
    /// The name given at registration ("cpu" for the host).
    std::string name() const {
        auto& table = detail::devices();
        std::lock_guard<std::mutex> lock(table.mutex);
        return index_ < table.names.size() ? table.names[index_] : "device#" + std::to_string(index_);
    }

    friend constexpr bool operator==(Device, Device) = default;

private:
    constexpr explicit Device(std::uint32_t index) : index_(index) {}
    friend Device add_device_name(std::string name);
    friend Device current_device();
    std::uint32_t index_ = 0;
};

inline std::ostream& operator<<(std::ostream& out, Device device) { return out << device.name(); }

/// Adds a name to the device table and returns its new device. Backends call this through
/// `backend::register_device`, which also binds the device's kernels; on its own it makes a device
/// that no op can compute on.
inline Device add_device_name(std::string name) {
    auto& table = detail::devices();
    std::lock_guard<std::mutex> lock(table.mutex);
    table.names.push_back(std::move(name));
    return Device(static_cast<std::uint32_t>(table.names.size() - 1));
}

/// The device new tensors are made on by this thread (the host unless a `device_scope` says otherwise).
inline Device current_device() { return Device(detail::current_device_index()); }  // valid: only guards set it

/// RAII: tensors made on this thread while it lives are made on `device` (`Tensor(shape)`,
/// `zeros`, layers' parameters, ...), and ops with no tensor inputs run there. Ops set one
/// themselves for the device of their inputs. Guards nest; each restores the previous device.
class device_scope {
public:
    explicit device_scope(Device device) : previous_(detail::current_device_index()) { detail::current_device_index() = device.index(); }
    ~device_scope() { detail::current_device_index() = previous_; }
    device_scope(const device_scope&) = delete;
    device_scope& operator=(const device_scope&) = delete;

private:
    std::uint32_t previous_;
};

}  // namespace olmax
