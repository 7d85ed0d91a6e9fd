// cpu_openmp's thread pool (backend/detail/thread_pool.hpp): coverage, nesting, errors, fixed
// chunking, one thread, and a pool whose workers never start. No timing assertions.
#include "test_helpers.hpp"

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using olmax::backend::cpu_openmp;
namespace bd = olmax::backend::detail;

namespace {

/// The (begin, end) pieces one parallel_for call hands to its body, sorted.
std::vector<std::pair<std::size_t, std::size_t>> pieces_of(std::size_t n) {
    std::mutex m;
    std::vector<std::pair<std::size_t, std::size_t>> pieces;
    cpu_openmp::parallel_for(n, 1, [&](std::size_t b, std::size_t e) {
        std::lock_guard<std::mutex> lock(m);
        pieces.emplace_back(b, e);
    });
    std::sort(pieces.begin(), pieces.end());
    return pieces;
}

}  // namespace

TEST_CASE("thread_pool: parallel_for visits every index exactly once", "[backend][thread_pool]") {
    olmax_test::ForceThreading threads;  // 3 threads, threshold 1
    for (std::size_t n : {1u, 2u, 3u, 5u, 12u, 13u, 100u, 1001u}) {
        std::vector<std::atomic<int>> visits(n);
        for (int run = 0; run < 20; ++run)
            cpu_openmp::parallel_for(n, 1, [&](std::size_t b, std::size_t e) {
                for (std::size_t i = b; i < e; ++i) visits[i].fetch_add(1, std::memory_order_relaxed);
            });
        for (std::size_t i = 0; i < n; ++i) {
            INFO("n = " << n << ", index " << i);
            CHECK(visits[i].load() == 20);
        }
    }
}

TEST_CASE("thread_pool: chunk boundaries depend only on n and the thread count", "[backend][thread_pool]") {
    olmax_test::ForceThreading threads;
    for (std::size_t n : {2u, 7u, 12u, 13u, 1000u}) {
        const auto first = pieces_of(n);
        const std::size_t chunks = std::min<std::size_t>(n, 3 * cpu_openmp::chunks_per_thread);
        REQUIRE(first.size() == chunks);
        for (std::size_t c = 0; c < chunks; ++c) {
            CHECK(first[c].first == bd::chunk_begin(n, chunks, c));
            CHECK(first[c].second == bd::chunk_begin(n, chunks, c + 1));
        }
        CHECK(first.back().second == n);
        for (int run = 0; run < 50; ++run) CHECK(pieces_of(n) == first);
    }
    // The parallel sum adds its chunks' partial sums in chunk order: bit-identical on every run.
    olmax::Generator rng(7);
    const auto x = olmax::randn<float>({100003}, rng);
    const double reference = cpu_openmp::sum(x.data(), x.size());
    for (int run = 0; run < 50; ++run) CHECK(cpu_openmp::sum(x.data(), x.size()) == reference);
    CHECK(reference == Approx(olmax::backend::cpu_serial::sum(x.data(), x.size())).epsilon(1e-12));
}

TEST_CASE("thread_pool: chunk sizes differ by at most one and cover [0, n)", "[backend][thread_pool]") {
    for (std::size_t n : {1u, 5u, 64u, 1000003u})
        for (std::size_t chunks : {1u, 2u, 3u, 8u}) {
            if (chunks > n) continue;
            CHECK(bd::chunk_begin(n, chunks, 0) == 0);
            CHECK(bd::chunk_begin(n, chunks, chunks) == n);
            for (std::size_t c = 0; c < chunks; ++c) {
                const std::size_t size = bd::chunk_begin(n, chunks, c + 1) - bd::chunk_begin(n, chunks, c);
                CHECK((size == n / chunks || size == n / chunks + 1));
            }
        }
    // No n * c product: a huge n does not overflow.
    const std::size_t huge = std::size_t(-1) / 2;
    CHECK(bd::chunk_begin(huge, 8, 8) == huge);
}

TEST_CASE("thread_pool: nested loops run serially on the calling thread", "[backend][thread_pool]") {
    olmax_test::ForceThreading threads;
    std::atomic<int> bad{0}, inner_calls{0};
    cpu_openmp::parallel_for(12, 1, [&](std::size_t, std::size_t) {
        const auto me = std::this_thread::get_id();
        if (cpu_openmp::num_threads() != 3) ++bad;  // a chunk still sees the loop's thread count
        cpu_openmp::parallel_for(50, 1000000, [&](std::size_t b, std::size_t e) {
            ++inner_calls;
            if (b != 0 || e != 50 || std::this_thread::get_id() != me) ++bad;
        });
#if defined(_OPENMP)
        if (omp_get_max_threads() != 1) ++bad;  // OpenMP (Eigen's GEMM) capped to one thread inside
#endif
    });
    CHECK(bad.load() == 0);
    CHECK(inner_calls.load() == 12);
#if defined(_OPENMP)
    CHECK(omp_get_max_threads() == 3);  // the caller's setting is back after the loop
#endif
    CHECK(bd::this_thread_region().threads == 0);
}

TEST_CASE("thread_pool: an exception from the body reaches the caller and the pool still works", "[backend][thread_pool][errors]") {
    olmax_test::ForceThreading threads;
    CHECK_THROWS_WITH(cpu_openmp::parallel_for(100, 1,
                                               [&](std::size_t b, std::size_t e) {
                                                   if (b <= 57 && 57 < e) throw std::runtime_error("index 57 failed");
                                               }),
                      "index 57 failed");
    // Every chunk throws: the lowest-numbered chunk's error wins, whatever ran first.
    for (int run = 0; run < 20; ++run)
        CHECK_THROWS_WITH(cpu_openmp::parallel_for(100, 1, [&](std::size_t b, std::size_t) { throw std::runtime_error(std::to_string(b)); }),
                          "0");
    CHECK(bd::this_thread_region().threads == 0);
    std::atomic<std::size_t> total{0};
    cpu_openmp::parallel_for(100, 1, [&](std::size_t b, std::size_t e) { total += e - b; });
    CHECK(total.load() == 100);
}

TEST_CASE("thread_pool: an exception thrown on a worker thread reaches the caller, with its type and message", "[backend][thread_pool][errors]") {
    bd::thread_pool pool;  // its own workers, no back-off history
    const auto me = std::this_thread::get_id();
    std::atomic<bool> worker_threw{false};
    auto chunk = [&](std::size_t) {
        if (std::this_thread::get_id() != me) {
            worker_threw = true;
            throw olmax::value_error("a kernel failed on a pool thread");
        }
        // The caller's chunks wait until a worker has taken one (at most 5 s: a machine whose workers
        // never run fails the check below instead of hanging).
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (!worker_threw && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(std::chrono::microseconds(100));
    };
    std::string message;
    try {
        pool.run(64, 2, chunk);
    } catch (const olmax::value_error& e) {
        message = e.what();
    }
    CHECK(worker_threw);
    CHECK(message == "a kernel failed on a pool thread");
    CHECK(bd::this_thread_region().threads == 0);
    std::atomic<std::size_t> visits{0};
    auto count = [&](std::size_t) { ++visits; };
    pool.run(64, 2, count);  // the pool still works
    CHECK(visits.load() == 64);
}

TEST_CASE("thread_pool: one thread runs the whole range in one call on the caller", "[backend][thread_pool]") {
    olmax_test::ForceThreading force;
    olmax::backend::detail::omp_thread_cap one(1);
    REQUIRE(cpu_openmp::num_threads() == 1);
    std::vector<std::pair<std::size_t, std::size_t>> calls;
    const auto me = std::this_thread::get_id();
    bool same_thread = true;
    cpu_openmp::parallel_for(1000, 1000, [&](std::size_t b, std::size_t e) {
        calls.emplace_back(b, e);
        same_thread = same_thread && std::this_thread::get_id() == me;
    });
    CHECK(calls == std::vector<std::pair<std::size_t, std::size_t>>{{0, 1000}});
    CHECK(same_thread);
}

TEST_CASE("thread_pool: the caller runs every chunk when no worker ever starts", "[backend][thread_pool]") {
    bd::thread_pool pool(0);  // workers never start: as if all were descheduled
    std::vector<int> visits(17, 0);
    const auto me = std::this_thread::get_id();
    bool same_thread = true;
    auto chunk = [&](std::size_t c) {
        ++visits[c];
        same_thread = same_thread && std::this_thread::get_id() == me && bd::this_thread_region().threads == 4;
    };
    pool.run(17, 4, chunk);
    CHECK(pool.worker_count() == 0);
    CHECK(same_thread);
    CHECK(visits == std::vector<int>(17, 1));
    CHECK(bd::this_thread_region().threads == 0);
}

TEST_CASE("thread_pool: a second thread using the pool meanwhile runs its loop alone", "[backend][thread_pool]") {
    olmax_test::ForceThreading threads;
    std::atomic<std::size_t> total{0};
    std::thread other([&] {
        olmax::backend::detail::omp_thread_cap three(3);  // the ICV is per thread
        for (int i = 0; i < 200; ++i) cpu_openmp::parallel_for(64, 1, [&](std::size_t b, std::size_t e) { total += e - b; });
    });
    for (int i = 0; i < 200; ++i) cpu_openmp::parallel_for(64, 1, [&](std::size_t b, std::size_t e) { total += e - b; });
    other.join();
    CHECK(total.load() == 2 * 200 * 64);
}

TEST_CASE("thread_pool: GEMM cut into row or column blocks matches one serial GEMM", "[backend][thread_pool]") {
    olmax_test::ForceThreading threads;
    olmax::Generator rng(11);
    // (m, n, k): more rows than columns (row blocks), more columns (column blocks), too small to cut.
    for (auto [m, n, k] : {std::tuple{200u, 130u, 70u}, std::tuple{130u, 300u, 50u}, std::tuple{40u, 30u, 20u}})
        for (bool ta : {false, true})
            for (bool tb : {false, true}) {
                const auto a = olmax::randn<double>({ta ? k : m, ta ? m : k}, rng);
                const auto b = olmax::randn<double>({tb ? n : k, tb ? k : n}, rng);
                auto c = olmax::randn<double>({m, n}, rng);
                auto expect = c.clone();
                olmax::backend::cpu_serial::gemm(ta, tb, m, n, k, 0.5, a.data(), a.extent(1), b.data(), b.extent(1), 2.0, expect.data(), n);
                cpu_openmp::gemm(ta, tb, m, n, k, 0.5, a.data(), a.extent(1), b.data(), b.extent(1), 2.0, c.data(), n);
                double worst = 0;
                for (std::size_t i = 0; i < c.size(); ++i) worst = std::max(worst, std::abs(c.data()[i] - expect.data()[i]));
                INFO("m " << m << " n " << n << " k " << k << " ta " << ta << " tb " << tb);
                CHECK(worst < 1e-12);
            }
}
