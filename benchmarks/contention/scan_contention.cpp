// Scan kernels for the contention benchmark (run.sh): a few scan shapes, each forward and backward
// on preallocated buffers, median of --repeats runs after one warm-up, in one short process (the
// full scan_strategies program computes fp64 references and a roofline first, tens of seconds per
// run, too long for 5 repetitions x 2 thread counts x 3 load levels).
//
//   scan_contention [--threads N] [--repeats N] [--json PATH]
//
// Rows (the kernels scan_strategies times, same calls):
//   two_pass              [1, 2^24, 1]     the time-parallel scan on one long row (many short loops)
//   two_pass              [1, 4096, 256]   tiny loops: almost all fork-join cost
//   sequential_vectorized [16, 4096, 1024] the bandwidth-bound channel scan (a few long loops)
#include <olmax/olmax.hpp>
#include <olmax/scan/scan.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "../timing.hpp"

namespace sc = olmax::scan;
using olmax::Tensor;

namespace {

/// One warm-up (first touch, the pool's start), then the median of `repeats` runs.
double time_median(const std::function<void()>& f, int repeats) { return olmax_bench::median_seconds(std::size_t(repeats), 1, f); }

struct Result {
    std::string name, direction;
    std::size_t B, T, C;
    double seconds;
};

/// n values in [lo, hi) from a hash of the index (fast to make: 2^26-element inputs in a fraction
/// of a second, the same on every run).
Tensor<float> fill(std::size_t B, std::size_t T, std::size_t C, std::uint64_t seed, float lo, float hi) {
    auto t = Tensor<float>::uninitialized({B, T, C});
    float* p = t.data();
    const std::size_t n = t.size();
    for (std::size_t i = 0; i < n; ++i) {
        std::uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull + seed;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        p[i] = lo + (hi - lo) * float(double(z >> 40) / double(1ull << 24));
    }
    return t;
}

template <class S>
void run_shape(std::size_t B, std::size_t T, std::size_t C, int repeats, std::vector<Result>& out) {
    olmax::backend::host_kernels_scope on_kernels(olmax::backend::kernels<olmax::backend::cpu_openmp>());
    const auto a = fill(B, T, C, 1, 0.0f, 1.0f), x = fill(B, T, C, 2, -1.0f, 1.0f), dh = fill(B, T, C, 3, -1.0f, 1.0f);
    auto h = Tensor<float>::uninitialized(x.shape()), dx = Tensor<float>::uninitialized(x.shape()),
         da = Tensor<float>::uninitialized(x.shape());
    const auto g = sc::detail::make_geometry<float>("bench", a, x, {});
    const std::size_t chunk = sc::detail::default_chunk<S>();
    const double fs = time_median(
        [&] { sc::detail::run_forward<S>(g, sc::detail::ForwardArgs<float>{a.data(), x.data(), nullptr, h.data(), nullptr}, chunk); },
        repeats);
    out.push_back({std::string(S::name), "fwd", B, T, C, fs});
    const double bs = time_median(
        [&] {
            sc::detail::run_backward<S>(
                g, sc::detail::BackwardArgs<float>{dh.data(), nullptr, a.data(), h.data(), nullptr, dx.data(), da.data(), nullptr}, chunk);
        },
        repeats);
    out.push_back({std::string(S::name), "bwd", B, T, C, bs});
}

}  // namespace

int main(int argc, char** argv) {
    int threads = 0, repeats = 5;
    std::string json;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
        else if (arg == "--repeats" && i + 1 < argc) repeats = std::max(1, std::atoi(argv[++i]));
        else if (arg == "--json" && i + 1 < argc) json = argv[++i];
        else {
            std::fprintf(stderr, "usage: %s [--threads N] [--repeats N] [--json PATH]\n", argv[0]);
            return 2;
        }
    }
#if defined(_OPENMP)
    if (threads > 0) omp_set_num_threads(threads);
#endif
    threads = olmax::backend::cpu_openmp::num_threads();
    std::vector<Result> rows;
    run_shape<sc::two_pass>(1, std::size_t(1) << 24, 1, repeats, rows);
    run_shape<sc::two_pass>(1, 4096, 256, repeats, rows);
    run_shape<sc::sequential_vectorized>(16, 4096, 1024, repeats, rows);
    std::ostringstream o;
    o << "{\"threads\": " << threads << ", \"repeats\": " << repeats << ", \"rows\": [";
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const auto& r = rows[i];
        std::printf("%-22s %s [%zu, %zu, %zu] threads %d: %.5f s\n", r.name.c_str(), r.direction.c_str(), r.B, r.T, r.C, threads, r.seconds);
        o << (i ? ", " : "") << "{\"strategy\": \"" << r.name << "\", \"direction\": \"" << r.direction << "\", \"B\": " << r.B
          << ", \"T\": " << r.T << ", \"C\": " << r.C << ", \"seconds\": " << r.seconds << "}";
    }
    o << "]}";
    if (!json.empty()) {
        std::ofstream f(json);
        f << o.str() << "\n";
        if (!f) {
            std::fprintf(stderr, "cannot write %s\n", json.c_str());
            return 1;
        }
    }
    return 0;
}
