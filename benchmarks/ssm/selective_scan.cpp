// Mamba's selective scan: the fused, chunk-checkpointed op (scan::selective_scan) against the
// materialised form a user would write with olmax's other ops, forward + backward, time and peak
// memory against sequence length T.
//
// Materialised: abar = exp(delta A) and (delta u) B as [B, T, E, N] tensors, h from the scan
// engine (scan::scan<sequential_vectorized> over E N channels), y = sum_n C h + D u; every
// [B, T, E, N] intermediate stays on the tape. Fused: states live in a per-task buffer, only the
// chunk-boundary states [B, T/64, E, N] are kept, the backward recomputes each chunk.
//
// Memory: olmax::memory counts every tensor buffer (and the fused op's scratch, which uses the same
// allocator). Peak = the most held during forward + backward over what was held before (inputs),
// so it includes the input gradients both forms produce (5 [B, T, *] tensors).
//
// Usage: selective_scan [--quick] [--out FILE]   (JSON to stdout, and to FILE when given)
#include <olmax/nn/selective_ssm.hpp>
#include <olmax/ops/reduction.hpp>
#include <olmax/scan/scan.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "../timing.hpp"

namespace sc = olmax::scan;
using olmax_bench::median;
using olmax::Tensor;
using T = float;

namespace {

struct Sizes {
    std::size_t batch = 1, channels = 64, state = 16;
    std::vector<std::size_t> times{256, 1024, 4096, 16384};
    int repeats = 5;
};

struct Inputs {
    Tensor<T> u, delta, A, B, C, D;
};

Inputs make_inputs(const Sizes& s, std::size_t time) {
    olmax::Generator rng(1);
    Inputs in;
    in.u = olmax::randn<T>({s.batch, time, s.channels}, rng);
    in.delta = olmax::rand<T>({s.batch, time, s.channels}, rng, T(0.001), T(0.1));
    in.A = olmax::rand<T>({s.channels, s.state}, rng, T(-16), T(-1));
    in.B = olmax::randn<T>({s.batch, time, s.state}, rng);
    in.C = olmax::randn<T>({s.batch, time, s.state}, rng);
    in.D = olmax::rand<T>({s.channels}, rng, T(0.5), T(1.5));
    return in;
}

/// y of the fused op.
Tensor<T> fused(const std::vector<Tensor<T>>& x) { return sc::selective_scan(x[0], x[1], x[2], x[3], x[4], x[5]).y; }

/// y of the materialised composition of ops.
Tensor<T> materialised(const std::vector<Tensor<T>>& x) {
    const std::size_t nb = x[0].extent(0), nt = x[0].extent(1), ne = x[0].extent(2), ns = x[2].extent(1);
    using olmax::reshape;
    const Tensor<T> abar = olmax::exp(olmax::mul(reshape(x[1], {nb, nt, ne, 1}), x[2]));                            // [B, T, E, N]
    const Tensor<T> bx = olmax::mul(reshape(olmax::mul(x[1], x[0]), {nb, nt, ne, 1}), reshape(x[3], {nb, nt, 1, ns}));  // [B, T, E, N]
    const Tensor<T> h = sc::scan<sc::sequential_vectorized>(reshape(abar, {nb, nt, ne * ns}), reshape(bx, {nb, nt, ne * ns}));
    const Tensor<T> y = olmax::sum(olmax::mul(reshape(h, {nb, nt, ne, ns}), reshape(x[4], {nb, nt, 1, ns})), {-1});
    return olmax::add(y, olmax::mul(x[0], x[5]));
}

struct Measurement {
    double seconds = 0;
    std::size_t peak_bytes = 0;
};

template <class F>
Measurement step(F&& f, const Inputs& in, const Tensor<T>& dy, Tensor<T>* y_out = nullptr) {
    std::vector<Tensor<T>> x;
    for (const auto* t : {&in.u, &in.delta, &in.A, &in.B, &in.C, &in.D}) x.push_back(olmax::parameter(t->clone()));
    const std::size_t baseline = olmax::memory::stats().current_bytes;
    olmax::memory::reset_peak();
    const auto t0 = std::chrono::steady_clock::now();
    Tensor<T> y = f(x);
    y.backward(dy);
    Measurement m{olmax_bench::seconds_since(t0), olmax::memory::stats().peak_bytes - baseline};
    if (y_out) *y_out = y.detach();
    return m;
}

}  // namespace

int main(int argc, char** argv) {
    Sizes s;
    std::string out_path;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--quick") == 0) {
            s.channels = 8;
            s.times = {64, 128};
            s.repeats = 1;
        } else if (std::strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
            out_path = argv[++i];
        } else {
            std::cerr << "selective_scan: unknown argument '" << argv[i] << "' (usage: selective_scan [--quick] [--out FILE])\n";
            return 2;
        }
    }
    int threads = 1;
#if defined(_OPENMP)
    threads = omp_get_max_threads();
#endif
    std::ostringstream json;
    json << "{\n  \"op\": \"scan::selective_scan (fused, chunk 64) vs materialised ops, forward + backward, float\",\n"
         << "  \"batch\": " << s.batch << ", \"E\": " << s.channels << ", \"N\": " << s.state << ", \"threads\": " << threads
         << ", \"repeats\": " << s.repeats << ",\n  \"results\": [\n";
    for (std::size_t i = 0; i < s.times.size(); ++i) {
        const std::size_t time = s.times[i];
        const Inputs in = make_inputs(s, time);
        olmax::Generator rng(2);
        const Tensor<T> dy = olmax::randn<T>({s.batch, time, s.channels}, rng);
        Tensor<T> y_fused, y_mat;
        const Measurement mem_fused = step(fused, in, dy, &y_fused);  // also the warm-up
        const Measurement mem_mat = step(materialised, in, dy, &y_mat);
        double diff = 0, scale = 0;
        for (std::size_t k = 0; k < y_fused.size(); ++k) {
            diff = std::max(diff, double(std::abs(y_fused.data()[k] - y_mat.data()[k])));
            scale = std::max(scale, double(std::abs(y_mat.data()[k])));
        }
        std::vector<double> t_fused, t_mat;
        for (int r = 0; r < s.repeats; ++r) {  // alternate, so load changes on a shared machine hit both alike
            t_fused.push_back(step(fused, in, dy).seconds);
            t_mat.push_back(step(materialised, in, dy).seconds);
        }
        const double f = median(t_fused), m = median(t_mat);
        json << "    {\"T\": " << time << ", \"fused\": {\"seconds\": " << f << ", \"peak_bytes\": " << mem_fused.peak_bytes
             << "}, \"materialised\": {\"seconds\": " << m << ", \"peak_bytes\": " << mem_mat.peak_bytes << "}, \"time_ratio\": " << m / f
             << ", \"memory_ratio\": " << double(mem_mat.peak_bytes) / double(mem_fused.peak_bytes)
             << ", \"y_max_rel_diff\": " << diff / std::max(scale, 1e-30) << "}" << (i + 1 < s.times.size() ? "," : "") << "\n";
    }
    json << "  ]\n}\n";
    std::cout << json.str();
    if (!out_path.empty()) std::ofstream(out_path) << json.str();
    return 0;
}
