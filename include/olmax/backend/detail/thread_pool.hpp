#pragma once
// A small fork-join pool for cpu_openmp that degrades gracefully when the cores are shared.
//
// Why not an OpenMP `parallel` region: a region ends in a barrier, and its pieces are fixed per
// thread. When another process holds a core, a descheduled worker keeps the caller waiting for a
// whole scheduler time slice while also holding half of the work; and libgomp's idle workers spin
// for up to GOMP_SPINCOUNT between regions, taking CPU time the caller needs (OMP_WAIT_POLICY and
// GOMP_SPINCOUNT are read once, when libgomp is loaded, so a header-only library cannot change them).
// Measured on the shared 2-core VM: the 2-thread training step ran 3x slower than 1 thread under
// load (benchmarks/RESULTS.md, "Threads under contention").
//
// Here the caller publishes a job of `chunks` work items and then takes chunks itself from an
// atomic counter, like every worker. A worker that wakes late finds nothing left; the caller waits
// only for chunks a worker has already claimed and not yet finished. Idle workers spin for a short,
// bounded time (so back-to-back loops do not pay a wake-up) and then sleep on a futex
// (std::atomic::wait), so they take no CPU from anyone between bursts of work.
//
// Which chunk runs on which thread depends on timing; what each chunk covers does not (the caller
// picks the chunk count), so results stay bit-identical for a given chunking.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#if defined(_OPENMP)
#include <omp.h>
#endif

namespace olmax::backend::detail {

/// One pause of a spin loop (tells the core, and a hypervisor, that this thread only waits).
inline void spin_pause() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#else
    std::this_thread::yield();
#endif
}

/// First index of chunk `c` when [0, n) is cut into `chunks` contiguous pieces whose sizes differ
/// by at most one (no n * c product, so no overflow for any n).
inline std::size_t chunk_begin(std::size_t n, std::size_t chunks, std::size_t c) {
    return c * (n / chunks) + std::min(c, n % chunks);
}

/// Per-thread parallel state: `threads` is the thread count of the loop this thread is running a
/// chunk of (0 outside any loop). Nested loops run serially while it is set.
struct region_state {
    int threads = 0;
};
inline region_state& this_thread_region() {
    thread_local region_state state;
    return state;
}

/// Marks the calling thread as inside a parallel loop of `threads` threads for the guard's lifetime
/// and caps OpenMP (Eigen's GEMM, any `omp parallel` in user code) to one thread on it.
class region_guard {
public:
    explicit region_guard(int threads) : previous_(this_thread_region().threads) {
        this_thread_region().threads = threads;
#if defined(_OPENMP)
        omp_previous_ = omp_get_max_threads();
        if (omp_previous_ != 1) omp_set_num_threads(1);
#endif
    }
    ~region_guard() {
        this_thread_region().threads = previous_;
#if defined(_OPENMP)
        if (omp_previous_ != 1) omp_set_num_threads(omp_previous_);
#endif
    }
    region_guard(const region_guard&) = delete;
    region_guard& operator=(const region_guard&) = delete;

private:
    int previous_;
    int omp_previous_ = 1;
};

class thread_pool {
public:
    /// The process-wide pool (workers are started on first use, up to the largest count asked for).
    inline static thread_pool& shared() {
        static thread_pool pool;
        return pool;
    }

    /// How long an idle worker, or a caller waiting for a claimed chunk, spins before it sleeps.
    /// Default 50 us, or OLMAX_SPIN_US from the environment at first use (read once).
    static std::chrono::nanoseconds spin_time() { return std::chrono::nanoseconds(spin_ns_ref().load(std::memory_order_relaxed)); }
    static void set_spin_time(std::chrono::nanoseconds t) { spin_ns_ref().store(t.count(), std::memory_order_relaxed); }

    /// Runs chunk(c) for every c in [0, chunks), each exactly once, on the calling thread and up to
    /// `threads - 1` workers, and returns when all have finished. Every chunk runs with
    /// this_thread_region().threads == threads. If chunks throw, the exception of the lowest-numbered
    /// failing chunk is rethrown here (chunks above it may be skipped).
    template <class F>
    void run(std::size_t chunks, int threads, F& chunk) {
        if (chunks == 0) return;
        // One job at a time: a second thread that wants the pool (user threads each calling olmax)
        // runs its loop alone rather than waiting for the pool.
        std::unique_lock<std::mutex> busy(run_mutex_, std::try_to_lock);
        if (chunks == 1 || threads < 2 || !busy.owns_lock() || chunks > 0xffffffffu) {
            run_alone(chunks, threads, chunk);
            return;
        }
        // Backed off (see below): the caller runs every chunk itself, the same chunks.
        const auto start = clock::now();
        if (start < solo_until_) {
            run_alone(chunks, threads, chunk);
            return;
        }
        ensure_workers(std::size_t(threads) - 1);

        job_.invoke = [](void* f, std::size_t c) { (*static_cast<F*>(f))(c); };
        job_.body = &chunk;
        job_.chunks = chunks;
        job_.threads = threads;
        job_.first_failed.store(chunks, std::memory_order_relaxed);
        job_.error = nullptr;
        helpers_wanted_.store(std::size_t(threads) - 1, std::memory_order_relaxed);
        pending_.store(std::uint32_t(chunks), std::memory_order_relaxed);
        const std::uint32_t gen = generation_.load(std::memory_order_relaxed) + 1;
        // Publish: the ticket's release store makes the job's fields visible to whoever claims a chunk.
        ticket_.store((std::uint64_t(gen) << 32) | std::uint64_t(chunks), std::memory_order_release);
        generation_.store(gen, std::memory_order_release);
        generation_.notify_all();  // a futex wake only when some worker sleeps

        const std::size_t mine = work();
        const auto worked = clock::now();
        wait_pending();
        const auto end = clock::now();
        // Adaptive back-off. A worker that keeps the caller waiting far longer than the caller's
        // own chunks took was descheduled holding a chunk (another process has its core): with
        // threads spread over busy cores every loop would pay that. The caller then runs the next
        // loops alone for a while (1 ms, doubling while it keeps happening, at most 64 ms) and
        // tries the workers again. Only who runs a chunk changes, never the chunks: results stay
        // bit-identical. The bar is high (4 chunk times and 1 ms, about a scheduler time slice):
        // chunks of one loop may differ in cost, and a sleeping worker may wake late on a VM; with
        // a bar of 2 chunk times and 0.2 ms the idle machine backed off and lost its speed-up on
        // two_pass (measured).
        if (mine > 0) {
            const auto per_chunk = (worked - start) / std::int64_t(mine);
            if (end - worked > std::max<clock::duration>(4 * per_chunk, std::chrono::milliseconds(1))) {
                backoff_ = std::min<clock::duration>(backoff_ * 2 + std::chrono::milliseconds(1), std::chrono::milliseconds(64));
                solo_until_ = end + backoff_;
            } else {
                backoff_ = clock::duration::zero();
            }
        }
        if (job_.error) std::rethrow_exception(job_.error);
    }

    ~thread_pool() {
        stopping_.store(true, std::memory_order_relaxed);
        generation_.fetch_add(1, std::memory_order_release);
        generation_.notify_all();
        for (auto& t : workers_) t.join();
    }

    /// `worker_limit`: at most this many workers are ever started (tests use 0: the caller then
    /// runs every chunk, as when all workers are descheduled).
    explicit thread_pool(std::size_t worker_limit = std::size_t(-1)) : worker_limit_(worker_limit) {}
    thread_pool(const thread_pool&) = delete;
    thread_pool& operator=(const thread_pool&) = delete;

    /// Workers started so far (for tests).
    std::size_t worker_count() {
        std::lock_guard<std::mutex> lock(start_mutex_);
        return workers_.size();
    }

private:
    using clock = std::chrono::steady_clock;
    struct job {
        void (*invoke)(void*, std::size_t) = nullptr;
        void* body = nullptr;
        std::size_t chunks = 0;
        int threads = 1;
        std::atomic<std::size_t> first_failed{0};  // lowest chunk that threw (chunks: none)
        std::mutex error_mutex;
        std::exception_ptr error;
    };

    template <class F>
    static void run_alone(std::size_t chunks, int threads, F& chunk) {
        region_guard region(threads);
        for (std::size_t c = 0; c < chunks; ++c) chunk(c);
    }

    static std::atomic<std::int64_t>& spin_ns_ref() {
        static std::atomic<std::int64_t> value{[] {
            const char* env = std::getenv("OLMAX_SPIN_US");
            return env ? std::int64_t(std::strtoll(env, nullptr, 10)) * 1000 : std::int64_t(50000);
        }()};
        return value;
    }

    /// Spins until pred() holds or the spin time has passed; returns pred().
    template <class Pred>
    static bool spin_until(Pred pred) {
        const auto limit = spin_time();
        if (limit.count() <= 0) return pred();
        const auto start = std::chrono::steady_clock::now();
        for (;;) {
            for (int i = 0; i < 64; ++i) {
                if (pred()) return true;
                spin_pause();
            }
            if (std::chrono::steady_clock::now() - start >= limit) return pred();
        }
    }

    /// Claims the next chunk of the current job; false when none is left. The generation in the
    /// ticket's high half makes a claim fail if the job changed since the ticket was read.
    bool claim(std::size_t& c) {
        std::uint64_t t = ticket_.load(std::memory_order_acquire);
        for (;;) {
            const std::uint64_t remaining = t & 0xffffffffu;
            if (remaining == 0) return false;
            if (ticket_.compare_exchange_weak(t, t - 1, std::memory_order_acquire, std::memory_order_acquire)) {
                // The job cannot change before this chunk is finished, so its fields are stable.
                c = job_.chunks - std::size_t(remaining);
                return true;
            }
        }
    }

    /// Runs chunks until none is left (caller and workers alike); returns how many it ran. After a
    /// chunk throws, chunks numbered above it are skipped; lower ones still run, so the error
    /// rethrown is always that of the lowest-numbered failing chunk, the one a serial loop would
    /// stop at.
    std::size_t work() {
        std::size_t c, ran = 0;
        while (claim(c)) {
            ++ran;
            if (c < job_.first_failed.load(std::memory_order_relaxed)) {
                try {
                    region_guard region(job_.threads);
                    job_.invoke(job_.body, c);
                } catch (...) {
                    std::lock_guard<std::mutex> lock(job_.error_mutex);
                    if (c < job_.first_failed.load(std::memory_order_relaxed)) {
                        job_.error = std::current_exception();
                        job_.first_failed.store(c, std::memory_order_relaxed);
                    }
                }
            }
            // After the last decrement the caller may return and publish the next job: touch
            // nothing of this one afterwards.
            if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_all();
        }
        return ran;
    }

    /// Caller: waits for chunks still running on workers (short spin, then sleep).
    void wait_pending() {
        if (spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; })) return;
        for (std::uint32_t p; (p = pending_.load(std::memory_order_acquire)) != 0;) pending_.wait(p, std::memory_order_acquire);
    }

    void ensure_workers(std::size_t wanted) {
        wanted = std::min(wanted, worker_limit_);
        if (started_.load(std::memory_order_acquire) >= wanted) return;  // the common case: no lock
        std::lock_guard<std::mutex> lock(start_mutex_);
        // A new worker starts from the generation before the job about to be published, so that it
        // helps with that job even when it first runs after the publication (else a pool's first
        // loop would run on the caller alone).
        const std::uint32_t before = generation_.load(std::memory_order_acquire);
        while (workers_.size() < wanted) {
            const std::size_t index = workers_.size();
            workers_.emplace_back([this, index, before] { worker_loop(index, before); });
        }
        started_.store(workers_.size(), std::memory_order_release);
    }

    void worker_loop(std::size_t index, std::uint32_t seen) {
        // Code inside a chunk that asks OpenMP for threads (Eigen's GEMM) gets one: no nested teams.
#if defined(_OPENMP)
        omp_set_num_threads(1);
#endif
        for (;;) {
            // Checked before every wait (the acquire loads of generation_ make an earlier stopping_
            // store visible).
            if (stopping_.load(std::memory_order_acquire)) return;
            if (!spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; }))
                for (std::uint32_t g; (g = generation_.load(std::memory_order_acquire)) == seen;) generation_.wait(g, std::memory_order_acquire);
            seen = generation_.load(std::memory_order_acquire);
            if (stopping_.load(std::memory_order_relaxed)) return;
            // A worker beyond the job's thread count stays out (a hint: if it is stale, a claim is
            // still safe, only one thread more than asked may help).
            if (index < helpers_wanted_.load(std::memory_order_relaxed)) (void)work();
        }
    }

    job job_;
    std::atomic<std::uint64_t> ticket_{0};    // generation << 32 | chunks not yet claimed
    std::atomic<std::uint32_t> pending_{0};   // chunks not yet finished
    std::atomic<std::uint32_t> generation_{0};
    std::atomic<std::size_t> helpers_wanted_{0};
    std::atomic<bool> stopping_{false};
    std::size_t worker_limit_;
    clock::time_point solo_until_{};   // back-off: until then the caller runs loops alone (under run_mutex_)
    clock::duration backoff_{};
    std::atomic<std::size_t> started_{0};
    std::mutex run_mutex_, start_mutex_;
    std::vector<std::thread> workers_;
};

}  // namespace olmax::backend::detail
