#pragma once
// olmax::backend::xla — the TPU / PJRT backend in the backend trait.
//
// Tensors stay in host memory; the device is reached through a `device_dispatcher` that the PJRT
// runtime (olmax/backend/xla/pjrt_runtime.hpp, built only when the PJRT C API header is available)
// attaches at run time. Primitives with a StableHLO lowering (float GEMM, float sum) run on the
// attached device; everything else — element-wise lambdas passed to `map`, double precision (not
// native on TPU), or any op while no device is attached — runs on the CPU reference (`cpu_serial`)
// after a one-time notice per primitive, or throws `xla_fallback_error` in strict mode.

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
#include "olmax/core/error.hpp"

namespace olmax::backend {

/// An op was asked to run on the xla backend in strict mode but has no device lowering.
class xla_fallback_error : public error {
public:
    using error::error;
};

/// What the PJRT runtime implements to run the trait's primitives on a device (row-major GEMM
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

    /// Optional ops whose trait primitives dispatch to the device (float GEMM, float sum).
    /// Element-wise ops reach the trait as arbitrary lambdas (`map`), which cannot be lowered.
    template <class Op>
    static constexpr bool supports = std::is_same_v<Op, op::matmul> || std::is_same_v<Op, op::reduction>;

    /// Capability query: op families the StableHLO emitter lowers (olmax/backend/xla/stablehlo/:
    /// matmul / batched matmul, element-wise, reductions, linear scans and the QRNN block, forward
    /// and backward). Those reached through `supports` above run on the device automatically; the
    /// rest run through the PJRT runtime's module API (`olmax::xla::pjrt::client::run`).
    template <class Op>
    static constexpr bool lowers = std::is_same_v<Op, op::matmul> || std::is_same_v<Op, op::elementwise> ||
                                   std::is_same_v<Op, op::reduction> || std::is_same_v<Op, op::linear_scan>;

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

    // ---- the trait's primitives -------------------------------------------------------------------
    static void* allocate(std::size_t bytes) { return cpu_serial::allocate(bytes); }
    static void deallocate(void* p, std::size_t bytes) { cpu_serial::deallocate(p, bytes); }
    static int num_threads() { return 1; }

    /// Host loop (tensors live in host memory); the body's own primitives dispatch as usual.
    template <class F>
    static void parallel_for(std::size_t n, std::size_t work_per_item, F&& body) {
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

    template <class T, class F, class... In>
    static void map(std::size_t n, T* out, F f, const In*... in) {
        fallback("map", "element-wise C++ lambdas have no StableHLO lowering");
        cpu_serial::map(n, out, f, in...);
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

}  // namespace olmax::backend

namespace olmax::xla {

/// Serialized `xla.CompileOptionsProto` passed to PJRT_Client_Compile (an empty blob parses as 0
/// replicas / 0 partitions and libtpu rejects it). Field 3 executable_build_options { device_ordinal
/// (1) = -1 as a 10-byte varint, num_replicas (4) = 1, num_partitions (5) = 1 }: the same 17 bytes as
/// the JAX / gopjrt / pjrt-rs default (tags: (field << 3) | wire type; xla/pjrt/proto/compile_options.proto).
inline constexpr unsigned char compile_options_bytes[] = {0x1A, 0x0F, 0x08, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
                                                          0xFF, 0xFF, 0xFF, 0x01, 0x20, 0x01, 0x28, 0x01};

/// The environment variable naming the PJRT plugin shared object (libtpu.so, xla_cuda_plugin.so).
inline constexpr const char* plugin_env_var = "OLMAX_PJRT_PLUGIN";

}  // namespace olmax::xla
