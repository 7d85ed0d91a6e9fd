// Tensor construction, access, copies, casts, printing and random initialisation.
#include "test_helpers.hpp"

#include <Eigen/QR>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <sstream>

using olmax::Shape;
using olmax::Tensor;

TEST_CASE("construction: zeros, full, from, scalar, arange, uninitialized", "[tensor]") {
    Tensor<float> z({2, 3});
    CHECK(z.shape() == Shape{2, 3});
    CHECK(z.rank() == 2);
    CHECK(z.size() == 6);
    CHECK(std::all_of(z.begin(), z.end(), [](float v) { return v == 0; }));
    CHECK(olmax::full<double>({4}, 2.5)(3) == 2.5);
    CHECK(olmax::ones<double>({2, 2})(1, 1) == 1);
    CHECK(olmax::zeros_like(olmax::ones<float>({3})).shape() == Shape{3});
    CHECK(olmax::ones_like(Tensor<double>({1, 2}))(0, 1) == 1);

    auto f = Tensor<double>::from({2, 2}, {1, 2, 3, 4});
    CHECK(f(1, 0) == 3);
    CHECK_THROWS_AS(Tensor<double>::from({2, 2}, {1, 2, 3}), olmax::shape_error);
    const std::vector<float> values{1, 2, 3};
    CHECK(Tensor<float>::from({3}, std::span<const float>(values))(2) == 3);

    auto s = Tensor<double>::scalar(7);
    CHECK(s.rank() == 0);
    CHECK(s.size() == 1);
    CHECK(s.item() == 7);
    CHECK(s() == 7);

    auto r = olmax::arange<std::int64_t>(5);
    CHECK(r(4) == 4);
    CHECK(olmax::dtype_name<std::int64_t>() == "int64");
    CHECK(olmax::dtype_name<float>() == "float32");

    CHECK(Tensor<double>::uninitialized({3, 0}).empty());
    CHECK_FALSE(Tensor<double>().defined());
    CHECK_THROWS_AS(Tensor<double>().size(), olmax::value_error);
    CHECK(Tensor<double>().grad().defined() == false);
}

TEST_CASE("element access is bounds-checked in rank and extent; item needs one element", "[tensor][errors]") {
    auto t = Tensor<int>::from({2, 3}, {0, 1, 2, 3, 4, 5});
    CHECK(t(1, 2) == 5);
    t(0, 1) = 9;
    CHECK(t.data()[1] == 9);
    CHECK_THROWS_AS(t(2, 0), olmax::shape_error);
    CHECK_THROWS_AS(t(0, 3), olmax::shape_error);
    CHECK_THROWS_AS(t(0), olmax::shape_error);
    CHECK_THROWS_AS(t(0, 0, 0), olmax::shape_error);
    CHECK_THROWS_AS(t.item(), olmax::shape_error);
    CHECK(Tensor<int>::from({1, 1}, {4}).item() == 4);
    CHECK(t.extent(-1) == 3);
    CHECK_THROWS_AS(t.extent(2), olmax::shape_error);
    CHECK_THROWS_AS(Tensor<double>({0}).item(), olmax::shape_error);
}

TEST_CASE("copies: handles share, clone copies, detach shares data but leaves the graph", "[tensor][autodiff]") {
    auto a = Tensor<double>::from({2}, {1, 2});
    auto handle = a;
    handle(0) = 5;
    CHECK(a(0) == 5);
    auto c = a.clone();
    c(1) = 7;
    CHECK(a(1) == 2);

    auto w = olmax::parameter(Tensor<double>::from({2}, {1, 2}));
    auto y = olmax::scale(w, 2.0);
    CHECK(y.requires_grad());
    CHECK_FALSE(y.is_leaf());
    auto d = y.detach();
    CHECK_FALSE(d.requires_grad());
    CHECK(d.is_leaf());
    CHECK(d.data() == y.data());
    auto cl = y.clone();
    CHECK_FALSE(cl.requires_grad());
    CHECK(cl.data() != y.data());
    // parameter() of a non-leaf detaches it first.
    auto p = olmax::parameter(y);
    CHECK(p.is_leaf());
    CHECK(p.requires_grad());
    olmax::autodiff::clear_tape();
}

TEST_CASE("cast converts element types", "[tensor]") {
    auto d = Tensor<double>::from({3}, {1.75, -2.5, 3});
    auto i = olmax::cast<std::int32_t>(d);
    CHECK(i(0) == 1);
    CHECK(i(1) == -2);
    auto f = olmax::cast<float>(d);
    CHECK(f(0) == 1.75f);
    CHECK(olmax::cast<double>(i)(2) == 3.0);
}

TEST_CASE("operator<< prints dtype, shape and values; large tensors are summarised", "[tensor]") {
    std::ostringstream out;
    out << Tensor<double>::from({2, 2}, {1, 2, 3, 4});
    CHECK(out.str() == "Tensor<float64>[2, 2] [[1, 2],\n [3, 4]]");
    out.str("");
    out << Tensor<float>::scalar(1.5f);
    CHECK(out.str() == "Tensor<float32>[] 1.5");
    out.str("");
    out << Tensor<std::int32_t>({0, 3});
    CHECK(out.str() == "Tensor<int32>[0, 3] []");
    out.str("");
    out << Tensor<double>();
    CHECK(out.str() == "Tensor(undefined)");
    out.str("");
    out << olmax::parameter(Tensor<double>::from({1}, {2}));
    CHECK(out.str() == "Tensor<float64>[1] requires_grad [2]");
    out.str("");
    out << olmax::arange<std::int64_t>(2000);
    CHECK(out.str() == "Tensor<int64>[2000] [0, 1, 2, ..., 1997, 1998, 1999]");
    out.str("");
    out << Tensor<std::int8_t>::from({2}, {65, 66});
    CHECK(out.str() == "Tensor<int8>[2] [65, 66]");
    out.str("");
    out << Tensor<double>({2, 1, 2});
    CHECK(out.str() == "Tensor<float64>[2, 1, 2] [[[0, 0]],\n\n [[0, 0]]]");
    out.str("");
    out << olmax::zeros<float>({100, 100});
    const std::string big = out.str();
    CHECK(big.find("...") != std::string::npos);
    CHECK(big.size() < 400);
}

TEST_CASE("random initialisation is reproducible by seed", "[tensor][random]") {
    olmax::Generator a(5), b(5), c(6);
    const auto x = olmax::randn<float>({64}, a), y = olmax::randn<float>({64}, b), z = olmax::randn<float>({64}, c);
    CHECK(olmax_test::max_abs_diff(x, y) == 0);
    CHECK(olmax_test::max_abs_diff(x, z) > 0);
    // Copying a generator replays its stream.
    olmax::Generator d(9);
    auto replay = d;
    CHECK(olmax_test::max_abs_diff(olmax::rand<double>({10}, d), olmax::rand<double>({10}, replay)) == 0);

    SECTION("moments of randn and rand") {
        olmax::Generator g(1);
        const auto n = olmax::randn<double>({20000}, g, 1.0, 2.0);
        const double mean = olmax::mean(n).item();
        const double var = olmax::mean(olmax::square(n - mean)).item();
        CHECK(mean == Approx(1.0).margin(0.05));
        CHECK(var == Approx(4.0).epsilon(0.05));
        const auto u = olmax::rand<double>({20000}, g, -1.0, 3.0);
        CHECK(*std::min_element(u.begin(), u.end()) >= -1.0);
        CHECK(*std::max_element(u.begin(), u.end()) < 3.0);
        CHECK(olmax::mean(u).item() == Approx(1.0).margin(0.05));
    }
    SECTION("below(n) is uniform on [0, n) and reproducible") {
        olmax::Generator g(2), h(2);
        std::vector<int> counts(7, 0);
        for (int i = 0; i < 7000; ++i) {
            const auto v = g.below(7);
            REQUIRE(v < 7);
            CHECK(v == h.below(7));
            ++counts[v];
        }
        for (int count : counts) CHECK(count == Approx(1000).margin(150));
        CHECK(g.below(1) == 0);
        CHECK_THROWS_AS(g.below(0), olmax::value_error);
    }
}

TEST_CASE("orthogonal: Q^T Q = I for square, wide, tall and stacked shapes", "[tensor][random]") {
    olmax::Generator rng(8);
    for (const Shape& shape : {Shape{6, 6}, Shape{3, 7}, Shape{7, 3}, Shape{4, 5, 5}, Shape{2, 3, 4, 6}}) {
        INFO(olmax::to_string(shape));
        const auto q = olmax::orthogonal<double>(shape, rng, 2.0);
        REQUIRE(q.shape() == shape);
        const std::size_t rows = shape[shape.size() - 2], cols = shape.back(), small = std::min(rows, cols);
        const std::size_t count = q.size() / (rows * cols);
        for (std::size_t m = 0; m < count; ++m) {
            const double* base = q.data() + m * rows * cols;
            // Gram matrix of the orthonormal side (rows when wide, columns when tall) = gain^2 I.
            for (std::size_t i = 0; i < small; ++i)
                for (std::size_t j = 0; j < small; ++j) {
                    double dot = 0;
                    for (std::size_t k = 0; k < std::max(rows, cols); ++k)
                        dot += rows <= cols ? base[i * cols + k] * base[j * cols + k] : base[k * cols + i] * base[k * cols + j];
                    CHECK(dot == Approx(i == j ? 4.0 : 0.0).margin(1e-12));
                }
        }
        if (count > 1) {  // stacked matrices are independent draws
            double diff = 0;
            for (std::size_t i = 0; i < rows * cols; ++i) diff += std::abs(q.data()[i] - q.data()[rows * cols + i]);
            CHECK(diff > 1e-3);
        }
    }
    olmax::Generator a(3), b(3);
    CHECK(olmax_test::max_abs_diff(olmax::orthogonal<float>({5, 5}, a), olmax::orthogonal<float>({5, 5}, b)) == 0);
    CHECK_THROWS_AS(olmax::orthogonal<double>({5}, rng), olmax::shape_error);
    CHECK(olmax::orthogonal<double>({0, 4}, rng).empty());
}

TEST_CASE("orthogonal: equals the Q of Householder QR with R's signs folded in (the Haar sample of Mezzadri 2007)", "[tensor][random]") {
    // The oracle draws the same Gaussian (column by column, as olmax::orthogonal does) and takes
    // Eigen's Householder QR, flipping each column of Q whose R diagonal entry is negative.
    for (const Shape& shape : {Shape{1, 1}, Shape{6, 6}, Shape{9, 4}, Shape{4, 9}, Shape{3, 64, 16}, Shape{128, 128}}) {
        INFO(olmax::to_string(shape));
        olmax::Generator rng(21), oracle_rng(21);
        const auto q = olmax::orthogonal<double>(shape, rng, 1.5);
        const std::size_t rows = shape[shape.size() - 2], cols = shape.back();
        const std::size_t big = std::max(rows, cols), small = std::min(rows, cols), count = q.size() / (rows * cols);
        double worst = 0;
        for (std::size_t m = 0; m < count; ++m) {
            Eigen::MatrixXd g(static_cast<Eigen::Index>(big), static_cast<Eigen::Index>(small));
            for (Eigen::Index j = 0; j < g.cols(); ++j)
                for (Eigen::Index i = 0; i < g.rows(); ++i) g(i, j) = oracle_rng.normal();
            const Eigen::HouseholderQR<Eigen::MatrixXd> qr(g);
            Eigen::MatrixXd expected = qr.householderQ() * Eigen::MatrixXd::Identity(g.rows(), g.cols());
            for (Eigen::Index j = 0; j < expected.cols(); ++j)
                if (qr.matrixQR()(j, j) < 0) expected.col(j) *= -1.0;
            for (std::size_t i = 0; i < rows; ++i)
                for (std::size_t j = 0; j < cols; ++j) {
                    const double want = 1.5 * (rows >= cols ? expected(Eigen::Index(i), Eigen::Index(j)) : expected(Eigen::Index(j), Eigen::Index(i)));
                    worst = olmax_test::worse(worst, std::abs(q.data()[m * rows * cols + i * cols + j] - want));
                }
        }
        CHECK(worst < 1e-12);
    }
}

TEST_CASE("memory::stats counts tensor storage", "[tensor][memory]") {
    const auto before = olmax::memory::stats();
    {
        Tensor<double> t({1024});
        const auto during = olmax::memory::stats();
        CHECK(during.current_bytes >= before.current_bytes + 1024 * sizeof(double));
        CHECK(during.allocations > before.allocations);
        CHECK(reinterpret_cast<std::uintptr_t>(t.data()) % olmax::memory::alignment == 0);
    }
    CHECK(olmax::memory::stats().current_bytes == before.current_bytes);
}

TEST_CASE("memory: large freed buffers are reused from the block cache, within its limit", "[tensor][memory]") {
    const std::size_t saved_limit = olmax::memory::cache_limit();
    olmax::memory::set_cache_limit(std::size_t(64) << 20);
    olmax::memory::release_cached();
    const std::size_t n = olmax::memory::cached_block_bytes / sizeof(float) * 2;  // 2 MiB of floats
    const float* first = nullptr;
    {
        Tensor<float> t = Tensor<float>::uninitialized({n});
        first = t.data();
    }
    CHECK(olmax::memory::cached_bytes() == n * sizeof(float));
    {
        Tensor<float> t({n});  // same size: the cached buffer, and still zero-filled as asked
        CHECK(t.data() == first);
        CHECK(olmax::memory::cached_bytes() == 0);
        CHECK(std::all_of(t.data(), t.data() + n, [](float v) { return v == 0.0f; }));
        CHECK(reinterpret_cast<std::uintptr_t>(t.data()) % olmax::memory::alignment == 0);
        Tensor<float> other = Tensor<float>::uninitialized({n + 16});  // another size: a new buffer
        CHECK(other.data() != first);
    }
    CHECK(olmax::memory::cached_bytes() == (2 * n + 16) * sizeof(float));
    {
        Tensor<float> small({1000});  // below cached_block_bytes: never cached
    }
    CHECK(olmax::memory::cached_bytes() == (2 * n + 16) * sizeof(float));
    olmax::memory::set_cache_limit(n * sizeof(float));  // lowering the limit frees what is above it
    CHECK(olmax::memory::cached_bytes() <= n * sizeof(float));
    olmax::memory::release_cached();
    CHECK(olmax::memory::cached_bytes() == 0);
    olmax::memory::set_cache_limit(0);  // off: nothing kept
    { Tensor<float> t = Tensor<float>::uninitialized({n}); }
    CHECK(olmax::memory::cached_bytes() == 0);
    olmax::memory::set_cache_limit(saved_limit);
}

TEST_CASE("memory: mid-sized freed buffers go back to the cache of the thread that allocated them", "[tensor][memory]") {
    const std::size_t saved_limit = olmax::memory::cache_limit();
    olmax::memory::set_cache_limit(std::size_t(64) << 20);
    olmax::memory::release_cached();
    const std::size_t n = olmax::memory::thread_cached_block_bytes / sizeof(float) * 2;  // 32 KiB of floats
    const std::size_t bytes = n * sizeof(float);
    const float* first = nullptr;
    {
        Tensor<float> t = Tensor<float>::uninitialized({n});
        first = t.data();
        CHECK(reinterpret_cast<std::uintptr_t>(t.data()) % olmax::memory::alignment == 0);
    }
    CHECK(olmax::memory::cached_bytes() == bytes);
    {
        Tensor<float> t({n});  // the same buffer again, zero-filled as asked
        CHECK(t.data() == first);
        CHECK(olmax::memory::cached_bytes() == 0);
        CHECK(std::all_of(t.data(), t.data() + n, [](float v) { return v == 0.0f; }));
        // Freed on another thread: still back to this thread's cache, so reused here.
        std::thread([dropped = std::move(t)]() mutable { dropped = Tensor<float>(); }).join();
    }
    CHECK(olmax::memory::cached_bytes() == bytes);
    {
        Tensor<float> t = Tensor<float>::uninitialized({n});
        CHECK(t.data() == first);
    }
    olmax::memory::release_cached();
    CHECK(olmax::memory::cached_bytes() == 0);

    // A buffer another thread allocated goes back to that thread's cache; release_cached reaches it
    // while the thread lives, and the thread's end frees what its cache holds.
    std::mutex mutex;
    std::condition_variable changed;
    int stage = 0;  // 1: the worker's buffer is here; 2: main dropped it; 3: main released; 4: worker cached one more
    Tensor<float> from_worker;
    auto wait_for = [&](int s) {
        std::unique_lock lock(mutex);
        changed.wait(lock, [&] { return stage >= s; });
    };
    auto advance = [&](int s) {
        {
            std::lock_guard lock(mutex);
            stage = s;
        }
        changed.notify_all();
    };
    std::thread worker([&] {
        from_worker = Tensor<float>::uninitialized({n});
        advance(1);
        wait_for(3);
        { Tensor<float> mine = Tensor<float>::uninitialized({n + 16}); }  // cached by this thread
        advance(4);
        wait_for(5);
    });
    wait_for(1);
    from_worker = Tensor<float>();
    CHECK(olmax::memory::cached_bytes() == bytes);  // in the worker's cache
    advance(2);
    olmax::memory::release_cached();
    CHECK(olmax::memory::cached_bytes() == 0);
    advance(3);
    wait_for(4);
    CHECK(olmax::memory::cached_bytes() == (n + 16) * sizeof(float));
    advance(5);
    worker.join();
    CHECK(olmax::memory::cached_bytes() == 0);  // the worker ended: its cache was emptied

    olmax::memory::set_cache_limit(0);  // off: nothing kept
    { Tensor<float> t = Tensor<float>::uninitialized({n}); }
    CHECK(olmax::memory::cached_bytes() == 0);
    olmax::memory::set_cache_limit(saved_limit);
}

TEST_CASE("shapes whose element count overflows, and buffers that cannot be had, are olmax errors", "[tensor][errors]") {
    constexpr std::size_t two_pow_62 = std::size_t{1} << 62;
    // 2^62 * 4 wraps to 0 in 64 bits: must be refused, not turned into an empty buffer.
    CHECK_THROWS_AS(olmax::numel({two_pow_62, 4}), olmax::shape_error);
    CHECK_THROWS_AS(Tensor<float>::uninitialized({two_pow_62, 4}), olmax::shape_error);
    CHECK_THROWS_AS(olmax::zeros<float>({std::size_t{1} << 33, std::size_t{1} << 31}), olmax::shape_error);
    CHECK_THROWS_WITH(olmax::zeros<float>({std::size_t{1} << 33, std::size_t{1} << 31}),
                      Catch::Contains("[8589934592, 2147483648]") && Catch::Contains("64 bits"));
    // A zero extent still makes an empty tensor, however large the others.
    CHECK(olmax::numel({two_pow_62, 4, 0}) == 0);
    CHECK(olmax::numel({}) == 1);
    // The count fits, the bytes do not (2^62 floats = 2^64 bytes), or no machine has them (2^50 floats).
    CHECK_THROWS_AS(Tensor<float>::uninitialized({two_pow_62}), olmax::allocation_error);
    CHECK_THROWS_WITH(olmax::zeros<float>({std::size_t{1} << 25, std::size_t{1} << 25}),
                      Catch::Contains("[33554432, 33554432]") && Catch::Contains("4 PiB") && Catch::Contains("out of memory"));
    const auto before = olmax::memory::stats().current_bytes;
    CHECK_THROWS_AS(Tensor<double>(olmax::Shape{std::size_t{1} << 47}), olmax::allocation_error);
    CHECK(olmax::memory::stats().current_bytes == before);  // nothing half-allocated is counted
    CHECK(olmax::detail::human_bytes(512) == "512 B");
    CHECK(olmax::detail::human_bytes(1.5 * 1024 * 1024 * 1024) == "1.5 GiB");
}
