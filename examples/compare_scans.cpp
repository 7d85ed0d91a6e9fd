// Every scan strategy on one problem: the same numbers (checked against the fp64 reference), the
// forward and the backward timed as a model would run them, the fastest named at the end.
//
//     build/examples/compare_scans                 # [4, 512, 64], seconds
//     build/examples/compare_scans 16 4096 1024    # [batch, time, channels] of your own
//
// Kernel-level figures against the memory roofline: benchmarks/scan (scan_strategies --help).
#include <olmax/olmax.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace scan = olmax::scan;
using olmax::Tensor;

namespace {

struct Timing {
    std::string strategy;
    double forward_ms = 0, backward_ms = 0, max_error = 0;
};

double milliseconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

/// Best of `repeats` runs of forward, then of backward, of strategy S; error against `reference`.
template <class S>
Timing measure(std::string label, const Tensor<float>& gates, const Tensor<float>& x, const Tensor<double>& reference, int repeats) {
    Timing t{std::move(label), 1e300, 1e300, 0};
    for (int r = 0; r < repeats; ++r) {
        auto leaf = olmax::parameter(x.clone());
        auto start = std::chrono::steady_clock::now();
        Tensor<float> h = scan::scan<S>(gates, leaf);
        t.forward_ms = std::min(t.forward_ms, milliseconds_since(start));
        start = std::chrono::steady_clock::now();
        h.backward(olmax::full<float>(h.shape(), 1.0f));
        t.backward_ms = std::min(t.backward_ms, milliseconds_since(start));
        for (std::size_t i = 0; i < h.size(); ++i)
            t.max_error = std::max(t.max_error, std::abs(double(h.data()[i]) - reference.data()[i]) / (1 + std::abs(reference.data()[i])));
    }
    return t;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 1 && argc != 4) {
        std::fprintf(stderr, "usage: compare_scans [batch time channels]\n");
        return 2;
    }
    const std::size_t B = argc == 4 ? std::strtoul(argv[1], nullptr, 10) : 4, T = argc == 4 ? std::strtoul(argv[2], nullptr, 10) : 512,
                      C = argc == 4 ? std::strtoul(argv[3], nullptr, 10) : 64;
    olmax::Generator rng(0);
    const auto gates = olmax::rand<float>({B, T, C}, rng, 0.9f, 1.0f);  // decays typical of a model's forget gates
    const auto x = olmax::randn<float>({B, T, C}, rng);
    const Tensor<double> reference = scan::scan<scan::sequential_fp64>(olmax::cast<double>(gates), olmax::cast<double>(x));

    const int repeats = 3;
    const std::vector<Timing> rows{measure<scan::sequential>("sequential", gates, x, reference, repeats),
                                   measure<scan::sequential_vectorized>("sequential_vectorized", gates, x, reference, repeats),
                                   measure<scan::two_pass>("two_pass", gates, x, reference, repeats),
                                   measure<scan::hillis_steele>("hillis_steele", gates, x, reference, repeats),
                                   measure<scan::hillis_steele_chunked<128>>("hillis_steele_chunked<128>", gates, x, reference, repeats),
                                   measure<scan::blelloch>("blelloch", gates, x, reference, repeats),
                                   measure<scan::chunked_matmul<128>>("chunked_matmul<128>", gates, x, reference, repeats),
                                   measure<scan::log_space>("log_space", gates, x, reference, repeats)};

    std::printf("scan h_t = a_t h_{t-1} + x_t on [%zu, %zu, %zu] floats, best of %d; error = max |h - h_fp64| / (1 + |h_fp64|)\n", B, T, C,
                repeats);
    std::printf("%-28s %12s %12s %10s\n", "strategy", "forward ms", "backward ms", "error");
    const Timing* fastest = &rows.front();
    bool accurate = true;
    for (const auto& r : rows) {
        std::printf("%-28s %12.3f %12.3f %10.1e\n", r.strategy.c_str(), r.forward_ms, r.backward_ms, r.max_error);
        if (r.forward_ms + r.backward_ms < fastest->forward_ms + fastest->backward_ms) fastest = &r;
        accurate = accurate && r.max_error < 1e-3;
    }
    std::printf("fastest forward + backward here: %s (%.3f ms)\n", fastest->strategy.c_str(), fastest->forward_ms + fastest->backward_ms);
    return accurate ? 0 : 1;
}
