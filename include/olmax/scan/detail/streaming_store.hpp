#pragma once
// Streaming (non-temporal) stores for the scans' large outputs. An ordinary store first reads the
// line it writes (read-for-ownership), so a scan writing h reads 16 bytes per fp32 element where it
// needs 12, and the lines it writes evict its inputs from the caches. A streaming store writes
// whole lines to memory without reading them. Measured on a 2-vCPU Intel Xeon (family 6 model 207,
// 2 threads, fp32 [B, T, 1024], 2026-11-30; benchmarks/RESULTS.md, "Streaming stores for large
// scan outputs"): the forward scan 1.35-3.2x faster from 1 MiB per array up, the backward 1.25-1.8x.
// The output is then not in the cache. That costs when the next op would have found it there: a
// scan followed by a read of h was 0.50-1.09x at 256 KiB and 0.84-1.24x at 16 MiB, but
// 1.27-1.38x at 4 MiB and 1.36-1.75x from 64 MiB. So outputs below streaming_store_threshold
// (4 MiB) keep ordinary stores.

#include <atomic>
#include <cstddef>
#include <cstdint>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace olmax::scan::detail {

/// Output bytes from which a scan writes with streaming stores (tests set it to 0 to cover the path).
inline std::atomic<std::size_t>& streaming_store_threshold() {
    static std::atomic<std::size_t> bytes{std::size_t(4) << 20};
    return bytes;
}

inline bool streams_output(std::size_t bytes) { return bytes >= streaming_store_threshold().load(std::memory_order_relaxed); }

/// dst[0, n) = src[0, n), the full vectors at aligned addresses of dst with streaming stores, the
/// rest (its unaligned head and tail) with ordinary ones. Without SSE2 it is a plain copy.
inline void stream_copy(float* dst, const float* src, std::size_t n) {
    std::size_t i = 0;
#if defined(__AVX512F__)
    constexpr std::size_t lanes = 16;
#elif defined(__AVX__)
    constexpr std::size_t lanes = 8;
#elif defined(__SSE2__)
    constexpr std::size_t lanes = 4;
#endif
#if defined(__SSE2__)
    for (; i < n && reinterpret_cast<std::uintptr_t>(dst + i) % (lanes * sizeof(float)) != 0; ++i) dst[i] = src[i];
    for (; i + lanes <= n; i += lanes) {
#if defined(__AVX512F__)
        _mm512_stream_ps(dst + i, _mm512_loadu_ps(src + i));
#elif defined(__AVX__)
        _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
#else
        _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
#endif
    }
#endif
    for (; i < n; ++i) dst[i] = src[i];
}

/// Orders this thread's streaming stores before its later stores (they are weakly ordered): called
/// at the end of a task, before another thread may read what it wrote.
inline void streaming_stores_done() {
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

}  // namespace olmax::scan::detail
