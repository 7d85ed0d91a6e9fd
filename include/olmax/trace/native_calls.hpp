#pragma once
// olmax's own CPU kernels inside a traced program on the XLA CPU plugin, where Mamba's selective scan
// would be a loop over time of a handful of separate XLA kernels per step. Through the plugin's typed
// FFI (xla/ffi.hpp) the op's rule emits a custom call instead, and the plugin runs the very kernels
// the eager op runs (scan::selective_scan_forward / _backward) on its own buffers, with no copy.
// Turned on by `t.set_native_calls(trace::enable_native_calls(*client))`. A program traced with them
// compiles only on a plugin where they are registered; one traced without (the default) runs
// anywhere. The graph keeps the op's meaning either way, so xla/graph's reference evaluator and the
// loop form stay the oracle of the kernels' form.

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "olmax/scan/selective_scan.hpp"
#include "olmax/xla/ffi.hpp"
#include "olmax/xla/pjrt_runtime.hpp"
#include "olmax/xla/stablehlo/selective_scan.hpp"

namespace olmax::trace {

namespace detail {

/// The sizes of a selective-scan call from u [B, T, E] (operand 0), A [E, N] (operand 2) and its
/// "chunk" attribute, with every other operand's shape checked against them.
inline scan::SelectiveScanSizes selective_scan_sizes(const xla::ffi::call& c, std::size_t state_operand) {
    const std::int64_t B = c.operand_dim(0, 0), T = c.operand_dim(0, 1), E = c.operand_dim(0, 2), N = c.operand_dim(2, 1);
    c.expect(true, 1, {B, T, E});
    c.expect(true, 2, {E, N});
    c.expect(true, 3, {B, T, N});
    c.expect(true, 4, {B, T, N});
    c.expect(true, 5, {B, T});
    c.expect(true, state_operand, {B, E, N});
    const std::int64_t chunk = c.i64("chunk");
    check<value_error>(chunk >= 1 && chunk <= T, "olmax native call: selective scan chunk ", chunk, " for T = ", T);
    return {std::size_t(B), std::size_t(T), std::size_t(E), std::size_t(N), std::size_t(chunk)};
}

/// The graph's keep [B, T] (1 carries the state, 0 where a document starts) as the kernels' resets
/// (nonzero: a document starts). The kernels drop the state wherever keep is not 1.
inline std::vector<float> resets_of(const float* keep, std::size_t n) {
    std::vector<float> resets(n);
    for (std::size_t i = 0; i < n; ++i) resets[i] = keep[i] != 1.0f ? 1.0f : 0.0f;
    return resets;
}

/// graph::selective_scan: (u, delta, A, Bm, C, keep, h0) -> (y, h_last, checkpoints).
inline xla::ffi::error* selective_scan_handler(xla::ffi::call_frame* frame) {
    return xla::ffi::handle(frame, xla::stablehlo::native_call::selective_scan, [](const xla::ffi::call& c) {
        const scan::SelectiveScanSizes s = selective_scan_sizes(c, 6);
        const std::size_t chunks = (s.time + s.chunk - 1) / s.chunk;
        c.expect(false, 0, {std::int64_t(s.batch), std::int64_t(s.time), std::int64_t(s.channels)});
        c.expect(false, 1, {std::int64_t(s.batch), std::int64_t(s.channels), std::int64_t(s.state)});
        c.expect(false, 2, {std::int64_t(s.batch), std::int64_t(chunks), std::int64_t(s.channels), std::int64_t(s.state)});
        const std::vector<float> resets = resets_of(c.operand(5, 2), s.batch * s.time);
        const scan::SelectiveScanBuffers<float> in{c.operand(0, 3), c.operand(1, 3), c.operand(2, 2), c.operand(3, 3),
                                                   c.operand(4, 3), nullptr,         c.operand(6, 3), resets.data()};
        scan::selective_scan_forward(s, in, c.result(0, 3), c.result(1, 3), c.result(2, 4));
    });
}

/// graph::selective_scan_backward: (u, delta, A, Bm, C, keep, checkpoints, gy, gh) ->
/// (du, ddelta, dA, dB, dC, dh0).
inline xla::ffi::error* selective_scan_backward_handler(xla::ffi::call_frame* frame) {
    return xla::ffi::handle(frame, xla::stablehlo::native_call::selective_scan_backward, [](const xla::ffi::call& c) {
        const scan::SelectiveScanSizes s = selective_scan_sizes(c, 8);
        const auto B = std::int64_t(s.batch), T = std::int64_t(s.time), E = std::int64_t(s.channels), N = std::int64_t(s.state);
        c.expect(true, 6, {B, (T + std::int64_t(s.chunk) - 1) / std::int64_t(s.chunk), E, N});
        c.expect(true, 7, {B, T, E});
        for (std::size_t r : {0, 1}) c.expect(false, r, {B, T, E});
        c.expect(false, 2, {E, N});
        for (std::size_t r : {3, 4}) c.expect(false, r, {B, T, N});
        c.expect(false, 5, {B, E, N});
        const std::vector<float> resets = resets_of(c.operand(5, 2), s.batch * s.time);
        const scan::SelectiveScanBuffers<float> in{c.operand(0, 3), c.operand(1, 3), c.operand(2, 2), c.operand(3, 3),
                                                   c.operand(4, 3), nullptr,         nullptr,         resets.data()};
        scan::selective_scan_backward(s, in, c.operand(7, 3), c.operand(8, 3), c.operand(6, 4),
                                      scan::SelectiveScanGradients<float>{c.result(0, 3), c.result(1, 3), c.result(2, 2), c.result(3, 3),
                                                                          c.result(4, 3), nullptr, c.result(5, 3)});
    });
}

}  // namespace detail

/// Registers olmax's native calls with `client`'s plugin (once per plugin and process) when it runs
/// programs on the CPU ("cpu" platform) and can register FFI handlers; returns whether programs
/// for this client may call them (tracing::set_native_calls). False for other devices, and for a
/// plugin without the FFI extension or with an older registration call: the rules then emit their
/// StableHLO forms.
inline bool enable_native_calls(const xla::pjrt::client& client) {
    if (client.platform_name() != "cpu") return false;
    static std::mutex mutex;
    static std::map<const xla::pjrt::plugin*, bool> registered;
    std::lock_guard<std::mutex> lock(mutex);
    const xla::pjrt::plugin& p = client.owner();
    auto it = registered.find(&p);
    if (it != registered.end()) return it->second;
    const bool ok = p.register_ffi_handler(xla::stablehlo::native_call::selective_scan, "host",
                                           reinterpret_cast<void*>(&detail::selective_scan_handler))
                        .empty() &&
                    p.register_ffi_handler(xla::stablehlo::native_call::selective_scan_backward, "host",
                                           reinterpret_cast<void*>(&detail::selective_scan_backward_handler))
                        .empty();
    registered.emplace(&p, ok);
    return ok;
}

}  // namespace olmax::trace
