// The matrix products of the main job's step on a PJRT plugin (one traced matmul per program, its
// operands and result resident on the device) against olmax's own fp32 GEMM on the host (oneDNN's),
// at the products of the small conv_mixer step: how much of the XLA CPU plugin's step time its
// GEMMs alone explain (issue 36's speed bound; benchmarks/RESULTS.md). A program's time includes
// one execute's fixed cost, as every step's does.
// Not built by CMake (a measurement, not a tool); from a build folder with the PJRT header:
//     g++ -std=gnu++20 -O3 -march=native -fopenmp -Iinclude -isystem /usr/include/eigen3 -isystem build/pjrt_include \
//         benchmarks/xla/dot_rate.cpp -ldnnl -ldl -o /tmp/dot_rate
//     OMP_NUM_THREADS=2 /tmp/dot_rate --plugin=<xla_cpu_pjrt.so> [--runs=N]
// Prints one JSON object: per product (m x k x n, A transposed or B transposed), the median
// milliseconds and GFLOP/s of each side.

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <olmax/backend/onednn_gemm.hpp>
#include <olmax/olmax.hpp>
#include <olmax/trace/program.hpp>
#include <olmax/trace/trace.hpp>

#include "flags.hpp"
#include "../timing.hpp"

namespace {

using olmax::Tensor;
namespace trace = olmax::trace;

struct Product {
    std::size_t m, k, n;
    bool trans_a, trans_b;
};

}  // namespace

int main(int argc, char** argv) try {
    const std::string plugin = olmax_bench::flag(argc, argv, "plugin", "");
    if (plugin.empty()) {
        std::fprintf(stderr, "usage: dot_rate --plugin=PATH [--runs=N]\n");
        return 2;
    }
    const std::size_t runs = olmax_bench::positive_flag(argc, argv, "runs", 15);
    auto client = std::make_shared<olmax::xla::pjrt::client>(olmax::xla::pjrt::plugin::load(plugin));
    // The small conv_mixer step's products (2048 tokens, 128 features, kernel 5, 256 hidden): the two
    // convolutions forward, the input and weight gradients' transposed forms, and two small ones.
    const Product products[] = {{2048, 640, 256, false, false},  {2048, 1280, 128, false, false}, {2048, 256, 640, false, true},
                                {640, 2048, 256, true, false},   {2048, 128, 128, false, false},  {2048, 128, 512, false, false}};
    std::printf("{\"platform\": \"%s\", \"onednn\": \"%s\", \"runs\": %zu, \"products\": [", client->platform_name().c_str(),
                olmax::backend::onednn::version().c_str(), runs);
    bool first = true;
    for (const Product& p : products) {
        olmax::Generator rng(1);
        const olmax::Shape a_shape = p.trans_a ? olmax::Shape{p.k, p.m} : olmax::Shape{p.m, p.k};
        const olmax::Shape b_shape = p.trans_b ? olmax::Shape{p.n, p.k} : olmax::Shape{p.k, p.n};
        Tensor<float> a = olmax::rand<float>(a_shape, rng, -1.f, 1.f), b = olmax::rand<float>(b_shape, rng, -1.f, 1.f);
        Tensor<float> c = olmax::zeros<float>({p.m, p.n});
        trace::traced_program program;
        {
            trace::tracing t;
            t.set_target(client->platform_name());
            t.bind_state(a);
            t.bind_state(b);
            t.bind_state(c);
            const Tensor<float> out = olmax::matmul(p.trans_a ? olmax::transpose(a, {1, 0}) : a, p.trans_b ? olmax::transpose(b, {1, 0}) : b);
            olmax::backend::trace::assign(c, out);
            program = t.finish({olmax::reshape(olmax::slice(olmax::slice(out, 0, 0, 1), 1, 0, 1), {1})});  // one element: each run waits
        }
        trace::compiled_program device(client, std::move(program));
        const double on_plugin = olmax_bench::median_seconds(runs, 2, [&] { device.run({}); });
        std::vector<float> host_c(p.m * p.n);
        const double on_host = olmax_bench::median_seconds(runs, 2, [&] {
            olmax::backend::onednn::gemm(p.trans_a, p.trans_b, p.m, p.n, p.k, 1.f, a.data(), p.trans_a ? p.m : p.k, b.data(),
                                         p.trans_b ? p.k : p.n, 0.f, host_c.data(), p.n);
        });
        const double flops = 2.0 * double(p.m) * double(p.n) * double(p.k);
        std::printf("%s{\"m\": %zu, \"k\": %zu, \"n\": %zu, \"trans_a\": %d, \"trans_b\": %d, \"plugin_ms\": %.4g, \"plugin_gflops\": %.4g, "
                    "\"olmax_onednn_ms\": %.4g, \"olmax_onednn_gflops\": %.4g}",
                    first ? "" : ", ", p.m, p.k, p.n, int(p.trans_a), int(p.trans_b), on_plugin * 1e3, flops / on_plugin / 1e9, on_host * 1e3,
                    flops / on_host / 1e9);
        first = false;
    }
    std::printf("]}\n");
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "dot_rate: %s\n", e.what());
    return 1;
}
