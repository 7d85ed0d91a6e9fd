#pragma once
#include <atomic>
#include <cstddef>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>

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

/// Buffers of at least this many bytes are kept for reuse when freed (see `set_cache_limit`).
inline constexpr std::size_t cached_block_bytes = std::size_t(1) << 20;

namespace detail {

/// Freed large buffers, by exact byte size, for the next allocation of that size. Why: glibc
/// serves blocks above its mmap threshold (at most 32 MiB) with a fresh mmap and unmaps them on
/// free, so a training step that allocates the same large activations every step pays the
/// kernel's page faults and zeroing for every one of them again (18% of a width-512 bf16 step's
/// time, measured with perf). Steps allocate the same sizes each time, so exact sizes reuse well.
/// Under AddressSanitizer nothing is cached, so a use after free is still reported.
class BlockCache {
public:
    void* take(std::size_t bytes) {
        if (bytes < cached_block_bytes) return nullptr;
        std::lock_guard lock(mutex_);
        auto it = blocks_.find(bytes);
        if (it == blocks_.end()) return nullptr;
        void* p = it->second;
        blocks_.erase(it);
        cached_ -= bytes;
        return p;
    }
    /// Keeps `p` if it is large and fits under the limit; false: the caller frees it.
    bool keep(void* p, std::size_t bytes) noexcept {
        if (bytes < cached_block_bytes) return false;
        std::lock_guard lock(mutex_);
        if (cached_ + bytes > limit_) return false;
        try {
            blocks_.emplace(bytes, p);
        } catch (...) {  // no memory for the map's node: free the buffer instead
            return false;
        }
        cached_ += bytes;
        return true;
    }
    void set_limit(std::size_t bytes) {
        std::lock_guard lock(mutex_);
        limit_ = bytes;
        trim_locked();
    }
    void release() {
        std::lock_guard lock(mutex_);
        const std::size_t limit = limit_;
        limit_ = 0;
        trim_locked();
        limit_ = limit;
    }
    std::size_t cached() {
        std::lock_guard lock(mutex_);
        return cached_;
    }
    std::size_t limit() {
        std::lock_guard lock(mutex_);
        return limit_;
    }
private:
    void trim_locked() {
        for (auto it = blocks_.begin(); it != blocks_.end() && cached_ > limit_;) {
            xsimd::aligned_free(it->second);
            cached_ -= it->first;
            it = blocks_.erase(it);
        }
    }

    std::mutex mutex_;
    std::unordered_multimap<std::size_t, void*> blocks_;
    std::size_t cached_ = 0;
    std::size_t limit_ = default_limit();

    /// 1 GiB, or an eighth of the memory this process may use if that is less; 0 under
    /// AddressSanitizer.
    static std::size_t default_limit() {
#if defined(__SANITIZE_ADDRESS__)
        return 0;
#else
        const std::size_t gib = std::size_t(1) << 30, available = available_bytes();
        return available == 0 ? gib : std::min(gib, available / 8);
#endif
    }
};

/// Never destroyed: tensors with static storage may be freed after every other static is gone.
inline BlockCache& block_cache() {
    static BlockCache* cache = new BlockCache;
    return *cache;
}

}  // namespace detail

/// The most bytes of freed large tensor buffers (>= `cached_block_bytes`) kept for reuse; 0 turns
/// the cache off. Default 1 GiB, or an eighth of `available_bytes()` if less (0 under
/// AddressSanitizer). Lowering it frees what is above it. An allocation that fails frees the
/// cache and tries once more.
/// Cached bytes are not in `stats()` (they hold no tensor) but are in the process's resident set.
inline void set_cache_limit(std::size_t bytes) { detail::block_cache().set_limit(bytes); }
inline std::size_t cache_limit() { return detail::block_cache().limit(); }
/// Bytes held by the cache now.
inline std::size_t cached_bytes() { return detail::block_cache().cached(); }
/// Frees every cached buffer (e.g. before measuring the resident set); the limit stays.
inline void release_cached() { detail::block_cache().release(); }

/// Standard-conforming allocator for tensor storage: 64-byte aligned (xsimd's aligned_malloc),
/// large buffers reused through the block cache, and counted in `memory::stats()`.
template <class T>
struct TrackedAllocator {
    using value_type = T;
    TrackedAllocator() noexcept = default;
    template <class U>
    TrackedAllocator(const TrackedAllocator<U>&) noexcept {}

    T* allocate(std::size_t n) {
        if (n == 0) return nullptr;
        if (n > std::size_t(-1) / sizeof(T)) throw std::bad_array_new_length();  // n * sizeof(T) would wrap
        void* p = detail::block_cache().take(n * sizeof(T));
        if (!p) p = xsimd::aligned_malloc(n * sizeof(T), alignment);
        if (!p && detail::block_cache().cached() > 0) {  // the cached buffers may be what is missing
            detail::block_cache().release();
            p = xsimd::aligned_malloc(n * sizeof(T), alignment);
        }
        if (!p) throw std::bad_alloc();
        detail::on_allocate(n * sizeof(T));
        return static_cast<T*>(p);
    }
    void deallocate(T* p, std::size_t n) noexcept {
        if (!p) return;
        if (!detail::block_cache().keep(p, n * sizeof(T))) xsimd::aligned_free(p);
        detail::on_deallocate(n * sizeof(T));
    }
    template <class U>
    bool operator==(const TrackedAllocator<U>&) const noexcept { return true; }
};

}  // namespace olmax::memory
