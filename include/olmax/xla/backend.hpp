#pragma once
// olmax::backend::xla — the TPU / PJRT primitives, and the `xla_device()` that ops reach them on.
//
// Tensors moved to `xla_device()` (`t.to(backend::xla_device())`) stay in host memory; ops on them
// run on `kernels<xla>()`, whose primitives reach the PJRT device through a `device_dispatcher`
// that the PJRT runtime (olmax/xla/pjrt_runtime.hpp, built only when the PJRT C API header
// is available) attaches at run time. Primitives with a StableHLO lowering (float GEMM, float sum)
// run on the attached device, with a host round trip per call; everything else -- the C++ loop
// bodies of element-wise and shape ops (`parallel_for`), double precision (not native on TPU), or
// any primitive while no device is attached -- runs on the host (`cpu_serial`) after a one-time
// notice per primitive, or throws `xla_fallback_error` in strict mode.

#include <cstddef>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "olmax/backend/concept.hpp"
#include "olmax/backend/cpu_serial.hpp"
#include "olmax/backend/kernels.hpp"
#include "olmax/backend/registry.hpp"
#include "olmax/core/error.hpp"

namespace olmax::backend {

/// An op was asked to run on the xla backend in strict mode but has no device lowering.
class xla_fallback_error : public error {
public:
    using error::error;
};

/// What the PJRT runtime implements to run the backend's primitives on a device (row-major GEMM
/// semantics identical to `cpu_serial::gemm`; `sum` accumulates in f32 on the device).
class xla_device_dispatcher {
public:
    virtual ~xla_device_dispatcher() = default;
    virtual std::string_view platform() const = 0;
    virtual void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda,
                      const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) = 0;
    virtual double sum(const float* x, std::size_t n) = 0;
};

struct xla {
    static constexpr std::string_view name = "xla";

    // ---- device attachment and fallback policy ------------------------------------------------
    /// Routes lowered primitives to `dispatcher` (null detaches: everything runs on the CPU).
    static void attach(std::shared_ptr<xla_device_dispatcher> dispatcher) {
        std::lock_guard<std::mutex> lock(state().mutex);
        state().dispatcher = std::move(dispatcher);
    }
    static void detach() { attach(nullptr); }
    static std::shared_ptr<xla_device_dispatcher> dispatcher() {
        std::lock_guard<std::mutex> lock(state().mutex);
        return state().dispatcher;
    }
    /// Strict mode: a primitive without a device lowering throws xla_fallback_error instead of
    /// running on the CPU reference.
    static void set_strict(bool strict) {
        std::lock_guard<std::mutex> lock(state().mutex);
        state().strict = strict;
    }
    static bool strict() {
        std::lock_guard<std::mutex> lock(state().mutex);
        return state().strict;
    }
    /// Where fallback notices go (default: one line on stderr). Tests capture them here.
    static void set_notice_sink(std::function<void(std::string_view)> sink) {
        std::lock_guard<std::mutex> lock(state().mutex);
        state().sink = std::move(sink);
    }
    /// Forgets which notices were already printed (each primitive notifies once per process).
    static void reset_notices() {
        std::lock_guard<std::mutex> lock(state().mutex);
        state().noticed.clear();
    }

    /// Records that `what` runs on the CPU reference: throws in strict mode, else notifies once.
    static void fallback(std::string_view what, std::string_view why) {
        std::function<void(std::string_view)> sink;
        std::string message;
        {
            std::lock_guard<std::mutex> lock(state().mutex);
            message = "olmax: backend xla runs " + std::string(what) + " on the CPU reference (" + std::string(why) + ")";
            if (state().strict) throw xla_fallback_error(message + "; strict mode is on");
            if (!state().noticed.insert(std::string(what)).second) return;
            sink = state().sink;
        }
        if (sink) sink(message);
        else std::fprintf(stderr, "%s; this notice is shown once\n", message.c_str());
    }

    // ---- the primitives (the static backend concept, concept.hpp) ---------------------------------
    static int num_threads() { return 1; }

    /// A host loop (tensors live in host memory): C++ loop bodies have no StableHLO lowering. The
    /// body's own primitives (a GEMM inside a loop) dispatch as usual.
    template <class F>
    static void parallel_for(std::size_t n, std::size_t work_per_item, F&& body) {
        fallback("loops", "C++ loop bodies (element-wise, shape and scan kernels) have no StableHLO lowering");
        cpu_serial::parallel_for(n, work_per_item, std::forward<F>(body));
    }

    template <class T>
    static void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a, std::size_t lda, const T* b,
                     std::size_t ldb, T beta, T* c, std::size_t ldc) {
        if constexpr (std::is_same_v<T, float>) {
            if (auto device = dispatcher()) {
                device->gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
                return;
            }
            fallback("gemm<float>", "no PJRT device attached");
        } else {
            fallback("gemm<double>", "f64 is not lowered: TPUs have no native f64");
        }
        cpu_serial::gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }

    template <class T>
    static double sum(const T* x, std::size_t n) {
        if constexpr (std::is_same_v<T, float>) {
            if (auto device = dispatcher()) return device->sum(x, n);
            fallback("sum<float>", "no PJRT device attached");
        } else {
            fallback("sum<double>", "f64 is not lowered: TPUs have no native f64");
        }
        return cpu_serial::sum(x, n);
    }

private:
    struct shared_state {
        std::mutex mutex;
        std::shared_ptr<xla_device_dispatcher> dispatcher;
        bool strict = false;
        std::function<void(std::string_view)> sink;
        std::set<std::string> noticed;
    };
    static shared_state& state() {
        static shared_state s;
        return s;
    }
};

static_assert(Backend<xla>);

/// The device whose tensors compute on `kernels<xla>()` (registered on first use, named "xla").
inline Device xla_device() {
    static const Device device = register_device("xla", std::shared_ptr<const Kernels>(&kernels<xla>(), [](const Kernels*) {}));
    return device;
}

}  // namespace olmax::backend

namespace olmax::xla {

/// Serialized `xla.CompileOptionsProto` passed to PJRT_Client_Compile (an empty blob parses as 0
/// replicas / 0 partitions and libtpu rejects it). Field 3 executable_build_options { device_ordinal
/// (1) = -1 as a 10-byte varint, num_replicas (4) = 1, num_partitions (5) = 1 }: the same 17 bytes as
/// the JAX / gopjrt / pjrt-rs default (tags: (field << 3) | wire type; xla/pjrt/proto/compile_options.proto).
inline constexpr unsigned char compile_options_bytes[] = {0x1A, 0x0F, 0x08, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
                                                          0xFF, 0xFF, 0xFF, 0x01, 0x20, 0x01, 0x28, 0x01};

/// The options for a program over several devices (each count 1 to 127: one varint byte):
/// `replicas` > 1 runs one program per device with cross-replica collectives inside it (num_replicas,
/// field 4); `partitions` > 1 lets XLA's SPMD partitioner split one global program over that many
/// devices by its `mhlo.sharding` annotations (num_partitions, field 5, and use_spmd_partitioning,
/// field 6 = true; the client picks its default device assignment).
inline std::string compile_options_for(int replicas, int partitions = 1) {
    check<value_error>(replicas >= 1 && replicas <= 127, "xla: replicas must be 1 to 127, got ", replicas);
    check<value_error>(partitions >= 1 && partitions <= 127, "xla: partitions must be 1 to 127, got ", partitions);
    std::string bytes(reinterpret_cast<const char*>(compile_options_bytes), sizeof compile_options_bytes);
    bytes[14] = static_cast<char>(replicas);    // the value after num_replicas' tag 0x20
    bytes[16] = static_cast<char>(partitions);  // the value after num_partitions' tag 0x28
    if (partitions > 1) {
        bytes += '\x30';  // use_spmd_partitioning (6, varint) = true
        bytes += '\x01';
        bytes[1] = static_cast<char>(bytes[1] + 2);  // executable_build_options grew by those 2 bytes
    }
    return bytes;
}

/// The environment variable naming the PJRT plugin shared object (libtpu.so, xla_cuda_plugin.so).
inline constexpr const char* plugin_env_var = "OLMAX_PJRT_PLUGIN";

}  // namespace olmax::xla
