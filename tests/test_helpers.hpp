#pragma once
// Shared helpers for olmax's tests.
#include <catch2/catch.hpp>

#include <olmax/olmax.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace olmax_test {

/// tests/data: the reference files the tests read (next to this header).
inline std::filesystem::path test_data_dir() { return std::filesystem::path(__FILE__).parent_path() / "data"; }

/// An empty folder under the system's temp folder, named after `name` and this process; left in place.
inline std::filesystem::path temp_dir(const std::string& name) {
    auto dir = std::filesystem::temp_directory_path() / ("olmax-test-" + name + "-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    return dir;
}

/// An empty folder under the system's temp folder, unique to this object, removed with everything in
/// it (read-only parts included) when the object goes.
struct TempDir {
    std::filesystem::path path;
    explicit TempDir(const std::string& name) {
        static std::atomic<int> counter{0};
        const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
        path = std::filesystem::temp_directory_path() / ("olmax-test-" + name + "-" + std::to_string(::getpid()) + "-" +
                                                         std::to_string(counter++) + "-" + std::to_string(stamp));
        std::filesystem::remove_all(path);
        std::filesystem::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::permissions(path, std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
        std::filesystem::remove_all(path, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
};

/// Both defined, of one shape, and equal bit for bit.
template <class T>
bool same_bits(const olmax::Tensor<T>& a, const olmax::Tensor<T>& b) {
    return a.defined() && b.defined() && a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// Runs `olmax::testing::check_gradients` and CHECKs it, printing the checker's report on failure.
template <class F>
void check_gradients(F&& f, const std::vector<olmax::Tensor<double>>& inputs, const olmax::testing::GradientCheckOptions& options = {}) {
    const auto result = olmax::testing::check_gradients(std::forward<F>(f), inputs, options);
    INFO(result);
    CHECK(result.ok);
    CHECK(result.checked > 0);
}

/// Normal samples moved at least `margin` away from every point in `kinks` (where the op's
/// derivative jumps): central differences straddling a kink compare against neither one-sided
/// derivative, so gradient tests sample smooth neighbourhoods only.
template <class T = double>
olmax::Tensor<T> randn_away_from(const olmax::Shape& shape, olmax::Generator& rng, std::initializer_list<double> kinks,
                                 double margin = 0.1, double scale = 1.0) {
    auto t = olmax::randn<T>(shape, rng, T{0}, T(scale));
    for (T& v : t)
        for (double kink : kinks)
            if (std::abs(double(v) - kink) < margin) v = T(kink + (double(v) >= kink ? margin : -margin));
    return t;
}

/// Uniform samples in [low, high), for ops defined on part of the real line (log, sqrt, division).
template <class T = double>
olmax::Tensor<T> uniform(const olmax::Shape& shape, olmax::Generator& rng, double low, double high) {
    return olmax::rand<T>(shape, rng, T(low), T(high));
}

/// How many times `needle` occurs in `text` (e.g. an op's name in a traced module's text).
inline std::size_t count_of(const std::string& text, const std::string& needle) {
    std::size_t n = 0;
    for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
    return n;
}

/// The larger of `worst` and `difference`, where a NaN wins and stays: std::max would drop it (a NaN
/// compares false), and a NaN output would then pass a `worst < tolerance` check.
inline double worse(double worst, double difference) { return std::isnan(worst) || difference <= worst ? worst : difference; }

/// Largest |a - b| over two tensors of equal shape (REQUIREs the shapes match); NaN if any
/// difference is NaN.
template <class T>
double max_abs_diff(const olmax::Tensor<T>& a, const olmax::Tensor<T>& b) {
    REQUIRE(a.shape() == b.shape());
    double m = 0;
    for (std::size_t i = 0; i < a.size(); ++i) m = worse(m, std::abs(double(a.data()[i]) - double(b.data()[i])));
    return m;
}

/// A static backend with exactly the concept's minimum surface (olmax/backend/concept.hpp), served
/// through `kernels<stub_backend>()` like any other.
struct stub_backend {
    static constexpr std::string_view name = "stub";
    static int num_threads() { return 1; }
    template <class F>
    static void parallel_for(std::size_t n, std::size_t w, F&& body) { olmax::backend::cpu_serial::parallel_for(n, w, body); }
    template <class T>
    static void gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a, std::size_t lda, const T* b,
                     std::size_t ldb, T beta, T* c, std::size_t ldc) {
        olmax::backend::cpu_serial::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
    template <class T>
    static double sum(const T* x, std::size_t n) { return olmax::backend::cpu_serial::sum(x, n); }
};

/// Kernels that count each primitive call and delegate to `inner`: a device built on them shows
/// which work reached it (and, with the host's kernels refusing, that nothing went elsewhere).
class counting_kernels final : public olmax::backend::Kernels {
public:
    explicit counting_kernels(const olmax::backend::Kernels& inner) : inner_(inner) {}
    std::string_view name() const override { return "counting"; }
    int num_threads() const override { return inner_.num_threads(); }
    void parallel_for(std::size_t n, std::size_t w, olmax::backend::range_body body) const override {
        ++loops;
        inner_.parallel_for(n, w, body);
    }
    void gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda, const float* b,
              std::size_t ldb, float beta, float* c, std::size_t ldc) const override {
        ++gemms;
        inner_.gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
    void gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, double alpha, const double* a, std::size_t lda, const double* b,
              std::size_t ldb, double beta, double* c, std::size_t ldc) const override {
        ++gemms;
        inner_.gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
    double sum(const float* x, std::size_t n) const override {
        ++sums;
        return inner_.sum(x, n);
    }
    double sum(const double* x, std::size_t n) const override {
        ++sums;
        return inner_.sum(x, n);
    }
    std::size_t calls() const { return loops + gemms + sums; }

    mutable std::atomic<std::size_t> loops{0}, gemms{0}, sums{0};

private:
    const olmax::backend::Kernels& inner_;
};

/// Host kernels that throw on every primitive: installed with `host_kernels_scope`, any work that
/// reaches the host instead of the tensors' own device fails loudly, naming the primitive.
class refusing_kernels final : public olmax::backend::Kernels {
public:
    std::string_view name() const override { return "refusing"; }
    int num_threads() const override { return 1; }
    void parallel_for(std::size_t, std::size_t, olmax::backend::range_body) const override { refuse("parallel_for"); }
    void gemm(bool, bool, std::size_t, std::size_t, std::size_t, float, const float*, std::size_t, const float*, std::size_t, float, float*,
              std::size_t) const override {
        refuse("gemm<float>");
    }
    void gemm(bool, bool, std::size_t, std::size_t, std::size_t, double, const double*, std::size_t, const double*, std::size_t, double,
              double*, std::size_t) const override {
        refuse("gemm<double>");
    }
    double sum(const float*, std::size_t) const override { refuse("sum<float>"); }
    double sum(const double*, std::size_t) const override { refuse("sum<double>"); }

private:
    [[noreturn]] static void refuse(const char* what) {
        throw std::logic_error(std::string("refusing_kernels: ") + what + " ran on the host, not on the tensors' device");
    }
};

/// The counting device of this test process (registered once), with its kernels.
struct counting_device {
    olmax::Device device;
    std::shared_ptr<counting_kernels> kernels;
};
inline const counting_device& counting() {
    static const counting_device d = [] {
        auto k = std::make_shared<counting_kernels>(olmax::backend::kernels<olmax::backend::cpu_serial>());
        return counting_device{olmax::backend::register_device("counting", k), k};
    }();
    return d;
}

/// Forces cpu_openmp to thread even tiny loops, with an odd thread count (uneven pieces), for the
/// guard's lifetime; restores both settings even if a check throws.
class ForceThreading {
public:
    ForceThreading() { olmax::backend::cpu_openmp::set_parallel_threshold(1); }
    ~ForceThreading() { olmax::backend::cpu_openmp::set_parallel_threshold(threshold_); }
    ForceThreading(const ForceThreading&) = delete;
    ForceThreading& operator=(const ForceThreading&) = delete;

private:
    std::size_t threshold_ = olmax::backend::cpu_openmp::parallel_threshold();
    olmax::backend::detail::omp_thread_cap threads_{3};  // saves and restores the thread count
};

}  // namespace olmax_test

namespace olmax_test {

/// Runs `f()` with the host computing on static backend `B`'s kernels (e.g. the cpu_serial
/// reference), returning its result.
template <class B, class F>
auto with_kernels(F&& f) {
    olmax::backend::host_kernels_scope scope(olmax::backend::kernels<B>());
    return f();
}

/// A few short repeated sentences (16 documents of bytes): data for the loaders and training loops
/// of fast tests.
inline olmax::data::Documents tiny_corpus() {
    olmax::data::Documents docs;
    const char* texts[] = {"the cat sat on the mat. ", "the dog sat on the log. ", "a cat and a dog. ", "the mat and the log. "};
    for (int rep = 0; rep < 4; ++rep)
        for (const char* t : texts) docs.push_back(olmax::data::ByteTokenizer::encode(t));
    return docs;
}

}  // namespace olmax_test
