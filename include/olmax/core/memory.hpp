#pragma once
#include <atomic>
#include <cstddef>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <new>

#include <unistd.h>  // sysconf

#include "olmax/detail/third_party.hpp"

namespace olmax::memory {

/// Bytes of tensor storage that olmax holds right now and the most it has held since the last
/// `reset_peak()`. Counted by the allocator every tensor buffer (data and gradients) goes through,
/// so benchmarks and tests can measure activation memory without an external profiler.
struct Stats {
    std::size_t current_bytes = 0;
    std::size_t peak_bytes = 0;
    std::size_t allocations = 0;
};

namespace detail {
struct Counters {
    std::atomic<std::size_t> current{0};
    std::atomic<std::size_t> peak{0};
    std::atomic<std::size_t> allocations{0};
};
inline Counters& counters() {
    static Counters instance;
    return instance;
}
inline void on_allocate(std::size_t bytes) {
    auto& c = counters();
    const std::size_t now = c.current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    c.allocations.fetch_add(1, std::memory_order_relaxed);
    std::size_t peak = c.peak.load(std::memory_order_relaxed);
    while (now > peak && !c.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
}
inline void on_deallocate(std::size_t bytes) { counters().current.fetch_sub(bytes, std::memory_order_relaxed); }
}  // namespace detail

inline Stats stats() {
    auto& c = detail::counters();
    return {c.current.load(), c.peak.load(), c.allocations.load()};
}

/// Starts a new peak measurement from the current level.
inline void reset_peak() {
    auto& c = detail::counters();
    c.peak.store(c.current.load());
}

namespace detail {
inline std::size_t system_available_bytes() {
    if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
        char line[256];
        unsigned long long kib = 0;
        bool found = false;
        while (!found && std::fgets(line, sizeof line, f)) found = std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
        std::fclose(f);
        if (found) return static_cast<std::size_t>(kib) * 1024;
    }
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page);
#endif
    return 0;
}
}  // namespace detail

/// Memory this process may plan to use: what the operating system could give it now without
/// swapping (`MemAvailable` of /proc/meminfo on Linux, else the physical memory), capped by the
/// environment variable `OLMAX_MEMORY_LIMIT_MIB` when it holds a positive number (to share a
/// machine, or to keep tests small); 0 when nothing can be read. Programs check a model's estimated
/// footprint against it before allocating, so that an absurd size is a clear error instead of
/// `std::bad_alloc` or the kernel's OOM killer.
inline std::size_t available_bytes() {
    std::size_t bytes = detail::system_available_bytes();
    if (const char* limit = std::getenv("OLMAX_MEMORY_LIMIT_MIB")) {
        char* end = nullptr;
        const unsigned long long mib = std::strtoull(limit, &end, 10);
        if (end != limit && *end == '\0' && mib > 0 && mib < (1ull << 40)) {
            const std::size_t cap = static_cast<std::size_t>(mib) << 20;
            bytes = bytes == 0 ? cap : std::min(bytes, cap);
        }
    }
    return bytes;
}

/// Alignment of every tensor buffer: one cache line, enough for AVX-512 loads.
inline constexpr std::size_t alignment = 64;

/// Standard-conforming allocator for tensor storage: 64-byte aligned (xsimd's aligned_malloc)
/// and counted in `memory::stats()`.
template <class T>
struct TrackedAllocator {
    using value_type = T;
    TrackedAllocator() noexcept = default;
    template <class U>
    TrackedAllocator(const TrackedAllocator<U>&) noexcept {}

    T* allocate(std::size_t n) {
        if (n == 0) return nullptr;
        if (n > std::size_t(-1) / sizeof(T)) throw std::bad_array_new_length();  // n * sizeof(T) would wrap
        void* p = xsimd::aligned_malloc(n * sizeof(T), alignment);
        if (!p) throw std::bad_alloc();
        detail::on_allocate(n * sizeof(T));
        return static_cast<T*>(p);
    }
    void deallocate(T* p, std::size_t n) noexcept {
        if (!p) return;
        xsimd::aligned_free(p);
        detail::on_deallocate(n * sizeof(T));
    }
    template <class U>
    bool operator==(const TrackedAllocator<U>&) const noexcept { return true; }
};

}  // namespace olmax::memory
