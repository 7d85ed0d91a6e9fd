#pragma once
#include <atomic>
#include <cstddef>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include <unistd.h>  // sysconf

#include "olmax/core/memory_profile.hpp"
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

/// Freed buffers of at least this many bytes go to a cache shared by all threads (see
/// `set_cache_limit`).
inline constexpr std::size_t cached_block_bytes = std::size_t(1) << 20;
/// Freed buffers from this size up to `cached_block_bytes` go back to a cache of the thread that
/// allocated them (smaller ones are glibc's cheap case: its per-thread bins, no page faults).
inline constexpr std::size_t thread_cached_block_bytes = std::size_t(16) << 10;
/// The most bytes one thread's cache keeps (less when `cache_limit()` is less).
inline constexpr std::size_t thread_cache_limit = std::size_t(64) << 20;

namespace detail {

/// Freed buffers by exact byte size, for the next allocation of that size. Why: a training step
/// allocates the same sizes every step, and glibc makes it pay the kernel for them again:
/// - blocks above its mmap threshold (at most 32 MiB) get a fresh mmap and are unmapped on free
///   (page faults and zeroing were 18% of a width-512 bf16 step's time, measured with perf);
/// - below it, freed memory at the top of the heap is given back once more than the trim
///   threshold is free, so a step whose peak is low (the update inside backward) faults its
///   128-512 KiB activations in again: 8% of a 64-wide step's samples in the kernel, against 2%.
/// Under AddressSanitizer nothing is cached, so a use after free is still reported.
class BlockCache {
public:
    explicit BlockCache(std::size_t limit) : limit_(limit) {}
    void* take(std::size_t bytes) {
        std::lock_guard lock(mutex_);
        auto it = blocks_.find(bytes);
        if (it == blocks_.end()) return nullptr;
        void* p = it->second;
        blocks_.erase(it);
        cached_ -= bytes;
        return p;
    }
    /// Keeps `p` if it fits under the limit; false: the caller frees it.
    bool keep(void* p, std::size_t bytes) noexcept {
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

    std::mutex mutex_;  // the owning thread's, except when another thread releases or lowers the limit
    std::unordered_multimap<std::size_t, void*> blocks_;
    std::size_t cached_ = 0;
    std::size_t limit_;
};

/// 1 GiB, or an eighth of the memory this process may use if that is less; 0 under
/// AddressSanitizer.
inline std::size_t default_cache_limit() {
#if defined(__SANITIZE_ADDRESS__)
    return 0;
#else
    const std::size_t gib = std::size_t(1) << 30, available = available_bytes();
    return available == 0 ? gib : std::min(gib, available / 8);
#endif
}

/// The shared cache of large blocks and every thread cache ever made. A thread cache outlives its
/// thread (it is idle until another thread takes it over) so that a block can always be handed
/// back to the cache named in its header. Never destroyed: tensors with static storage may be
/// freed after every other static is gone.
struct Caches {
    BlockCache shared{default_cache_limit()};  // large blocks (>= cached_block_bytes)
    std::mutex mutex;                          // guards the lists; held while thread caches' limits are set
    std::vector<BlockCache*> threads;          // in use by a live thread
    std::vector<BlockCache*> idle;             // their threads ended: limit 0, empty

    /// A thread cache keeps at most `thread_cache_limit`, and no more than the shared cache.
    std::size_t thread_limit() { return std::min(shared.limit(), thread_cache_limit); }
};
inline Caches& caches() {
    static Caches* instance = new Caches;
    return *instance;
}

/// Holds a thread's cache of mid-sized blocks while the thread lives; when it ends the cache's
/// blocks are freed and its limit set to 0, so blocks freed into it afterwards go to glibc.
class ThreadBlockCache {
public:
    explicit ThreadBlockCache(bool& ended) noexcept : ended_(ended) {
        Caches& all = caches();
        std::lock_guard lock(all.mutex);
        try {
            all.threads.reserve(all.threads.size() + 1);
            if (all.idle.empty()) {
                cache_ = new BlockCache(0);
            } else {
                cache_ = all.idle.back();
                all.idle.pop_back();
            }
            all.threads.push_back(cache_);
        } catch (...) {  // no memory: this thread caches nothing
            return;
        }
        cache_->set_limit(all.thread_limit());
    }
    ~ThreadBlockCache() {
        ended_ = true;
        if (!cache_) return;
        Caches& all = caches();
        std::lock_guard lock(all.mutex);
        cache_->set_limit(0);  // frees its blocks
        std::erase(all.threads, cache_);
        try {
            all.idle.push_back(cache_);
        } catch (...) {  // not listed for reuse: it stays allocated (blocks may still name it), holding nothing
        }
    }
    ThreadBlockCache(const ThreadBlockCache&) = delete;
    ThreadBlockCache& operator=(const ThreadBlockCache&) = delete;
    BlockCache* cache() const { return cache_; }

private:
    bool& ended_;
    BlockCache* cache_ = nullptr;
};

/// The calling thread's cache of mid-sized blocks; null while the thread is ending (its
/// thread_local objects being destroyed) or when it could not get one.
inline BlockCache* this_thread_cache() {
    thread_local bool ended = false;  // trivially destructible: still readable while the thread ends
    if (ended) return nullptr;
    thread_local ThreadBlockCache mine(ended);
    return mine.cache();
}

/// A mid-sized block starts with a header of `alignment` bytes naming the cache of the thread that
/// allocated it (or null); the tensor's data follows. A block goes back to that cache whichever
/// thread frees it, as glibc returns a chunk to the arena it came from: the freeing thread (say,
/// the one that drops a shard's tape) may never allocate that size, and a cache of its own would
/// only grow.
inline BlockCache*& block_owner(void* block) { return *static_cast<BlockCache**>(block); }

inline void* allocate_block(std::size_t bytes) {
    if (bytes >= cached_block_bytes) {
        if (void* p = caches().shared.take(bytes)) return p;
        return xsimd::aligned_malloc(bytes, alignment);
    }
    if (bytes < thread_cached_block_bytes) return xsimd::aligned_malloc(bytes, alignment);
    BlockCache* mine = this_thread_cache();
    void* block = mine ? mine->take(bytes) : nullptr;
    if (!block) block = xsimd::aligned_malloc(bytes + alignment, alignment);
    if (!block) return nullptr;
    block_owner(block) = mine;
    return static_cast<std::byte*>(block) + alignment;
}

inline void free_block(void* p, std::size_t bytes) noexcept {
    if (bytes >= cached_block_bytes) {
        if (!caches().shared.keep(p, bytes)) xsimd::aligned_free(p);
        return;
    }
    if (bytes < thread_cached_block_bytes) return xsimd::aligned_free(p);
    void* block = static_cast<std::byte*>(p) - alignment;
    BlockCache* owner = block_owner(block);
    if (!owner || !owner->keep(block, bytes)) xsimd::aligned_free(block);
}

}  // namespace detail

/// The most bytes of freed tensor buffers kept for reuse by the cache of large buffers (>=
/// `cached_block_bytes`, shared by all threads). Mid-sized buffers (`thread_cached_block_bytes` up
/// to `cached_block_bytes`) go back to a cache of the thread that allocated them, whichever thread
/// frees them; each thread's keeps at most `thread_cache_limit` and at most this. 0 turns them all
/// off. Default 1 GiB, or an eighth of `available_bytes()` if less (0 under AddressSanitizer).
/// Lowering it frees what is above it. An allocation that fails frees the caches and tries once
/// more.
/// Cached bytes are not in `stats()` (they hold no tensor) but are in the process's resident set.
inline void set_cache_limit(std::size_t bytes) {
    detail::Caches& all = detail::caches();
    all.shared.set_limit(bytes);
    std::lock_guard lock(all.mutex);
    const std::size_t per_thread = all.thread_limit();
    for (detail::BlockCache* cache : all.threads) cache->set_limit(per_thread);
}
inline std::size_t cache_limit() { return detail::caches().shared.limit(); }
/// Bytes held by the caches now (the shared one and every thread's).
inline std::size_t cached_bytes() {
    detail::Caches& all = detail::caches();
    std::size_t bytes = all.shared.cached();
    std::lock_guard lock(all.mutex);
    for (detail::BlockCache* cache : all.threads) bytes += cache->cached();
    return bytes;
}
/// Frees every cached buffer, every thread's too (e.g. before measuring the resident set); the
/// limits stay.
inline void release_cached() {
    detail::Caches& all = detail::caches();
    all.shared.release();
    std::lock_guard lock(all.mutex);
    for (detail::BlockCache* cache : all.threads) cache->release();
}

/// Standard-conforming allocator for tensor storage: 64-byte aligned (xsimd's aligned_malloc),
/// freed buffers reused through the block caches, and counted in `memory::stats()`.
template <class T>
struct TrackedAllocator {
    using value_type = T;
    TrackedAllocator() noexcept = default;
    template <class U>
    TrackedAllocator(const TrackedAllocator<U>&) noexcept {}

    T* allocate(std::size_t n) {
        if (n == 0) return nullptr;
        if (n > std::size_t(-1) / sizeof(T)) throw std::bad_array_new_length();  // n * sizeof(T) would wrap
        void* p = detail::allocate_block(n * sizeof(T));
        if (!p && cached_bytes() > 0) {  // the cached buffers may be what is missing
            release_cached();
            p = detail::allocate_block(n * sizeof(T));
        }
        if (!p) throw std::bad_alloc();
        detail::on_allocate(n * sizeof(T));
        detail::on_labelled_allocate(p, n * sizeof(T));
        return static_cast<T*>(p);
    }
    void deallocate(T* p, std::size_t n) noexcept {
        if (!p) return;
        detail::on_labelled_deallocate(p);
        detail::free_block(p, n * sizeof(T));
        detail::on_deallocate(n * sizeof(T));
    }
    template <class U>
    bool operator==(const TrackedAllocator<U>&) const noexcept { return true; }
};

}  // namespace olmax::memory
