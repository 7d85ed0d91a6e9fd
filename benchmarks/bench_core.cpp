// Core throughput of olmax against what the machine and Eigen can do, measured in one run:
//  * matmul: olmax::matmul (autodiff off) vs raw Eigen GEMM (Eigen::Map + noalias product) on the same
//    buffers and the same OpenMP thread count; counter FLOP/s (2 m n k per product).
//  * a fused 4-op element-wise chain out = ((a + b) * c - a) * 0.5 over 3 inputs, vs the STREAM triad
//    a = b + s c (McCalpin, "STREAM: Sustainable Memory Bandwidth in High Performance Computers") on the
//    same buffers; counter bytes_per_second counts the bytes the kernel must read and write, the STREAM
//    convention (16 B/element for the chain, 12 B/element for the triad; write-allocate traffic not counted).
//  * gate chains forward and backward (taped, gradients of both inputs from dy): QRNN's fo-pooling input
//    (1 - hard_sigmoid(f)) tanh(z) and Mamba's gated output y silu(z), as one olmax::pointwise op
//    against the same chain op by op; counter items_per_second = elements per second.
//  * AdamW's step (optim::AdamW::step) over float parameters with float64, float32 and bfloat16
//    moments; counter bytes_per_second counts what the step must stream per parameter (the
//    gradient-norm pass reads the gradient, then the update reads parameter, gradient and both
//    moments and writes parameter and moments: 48, 32 and 24 bytes), comparable with the triad's.
//
// Reproduce (see benchmarks/RESULTS.md):
//   build/benchmarks/bench_core --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//       --benchmark_out=bench_core.json --benchmark_out_format=json
// `--olmax_quick` shrinks every size (a smoke test that the benchmarks run, not a measurement).
#include <benchmark/benchmark.h>

#include <olmax/olmax.hpp>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

namespace {

using olmax::Tensor;

struct Sizes {
    std::size_t gemm = 1024;        // m = n = k
    std::size_t stream = 1u << 25;  // elements per array (>= 2^25, far beyond the last-level cache)
    std::size_t gates = 1u << 20;   // elements per gate input: [16, 256, 256] of a small model's activations
    std::size_t adam = 1u << 24;    // parameters of one AdamW step (16 M: 0.4-0.8 GiB streamed, beyond the cache)
};

Tensor<float> filled(const olmax::Shape& shape, std::uint64_t seed) {
    olmax::Generator rng(seed);
    return olmax::rand<float>(shape, rng, -1.0f, 1.0f);
}

void add_gemm_counters(benchmark::State& state, std::size_t n) {
    state.counters["FLOP/s"] = benchmark::Counter(2.0 * double(n) * double(n) * double(n), benchmark::Counter::kIsIterationInvariantRate);
    state.counters["threads"] = olmax::backend::cpu_openmp::num_threads();
}

void bm_olmax_matmul(benchmark::State& state, std::size_t n) {
    const auto a = filled({n, n}, 1), b = filled({n, n}, 2);
    olmax::autodiff::no_grad no_tape;
    for (auto _ : state) {
        auto c = olmax::matmul(a, b);
        benchmark::DoNotOptimize(c.data());
        benchmark::ClobberMemory();
    }
    add_gemm_counters(state, n);
}

void bm_eigen_gemm(benchmark::State& state, std::size_t n) {
    const auto a = filled({n, n}, 1), b = filled({n, n}, 2);
    auto c = Tensor<float>::uninitialized({n, n});
    using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    const Eigen::Index en = Eigen::Index(n);
    Eigen::Map<const Mat> A(a.data(), en, en), B(b.data(), en, en);
    Eigen::Map<Mat> C(c.data(), en, en);
    for (auto _ : state) {
        C.noalias() = A * B;
        benchmark::DoNotOptimize(c.data());
        benchmark::ClobberMemory();
    }
    add_gemm_counters(state, n);
}

/// The chain: 4 arithmetic ops on 3 inputs, one pass over memory.
constexpr auto chain = [](float a, float b, float c) { return ((a + b) * c - a) * 0.5f; };

struct StreamBuffers {
    Tensor<float> a, b, c, out;
    explicit StreamBuffers(std::size_t n) : a(filled({n}, 3)), b(filled({n}, 4)), c(filled({n}, 5)), out(filled({n}, 6)) {}
};

void set_bandwidth(benchmark::State& state, std::size_t n, std::size_t arrays) {
    state.counters["bytes_per_second"] =
        benchmark::Counter(double(n * arrays * sizeof(float)), benchmark::Counter::kIsIterationInvariantRate);
    state.counters["threads"] = olmax::backend::cpu_openmp::num_threads();
}

/// The public op: olmax::map allocates its result tensor on every call, as user code would.
void bm_olmax_map_chain(benchmark::State& state, const StreamBuffers* buf) {
    for (auto _ : state) {
        auto out = olmax::map(chain, buf->a, buf->b, buf->c);
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    set_bandwidth(state, buf->a.size(), 4);
}

/// The same fused kernel through olmax::map_into, writing into a preallocated tensor.
void bm_olmax_map_chain_into(benchmark::State& state, StreamBuffers* buf) {
    for (auto _ : state) {
        olmax::map_into(buf->out, chain, buf->a, buf->b, buf->c);
        benchmark::DoNotOptimize(buf->out.data());
        benchmark::ClobberMemory();
    }
    set_bandwidth(state, buf->a.size(), 4);
}

/// STREAM triad out = b + s c with the same OpenMP threads and static partition.
void bm_stream_triad(benchmark::State& state, StreamBuffers* buf) {
    const std::size_t n = buf->a.size();
    float* out = buf->out.data();
    const float *b = buf->b.data(), *c = buf->c.data();
    const float s = 3.0f;
    for (auto _ : state) {
#pragma omp parallel for simd schedule(static)
        for (std::size_t i = 0; i < n; ++i) out[i] = b[i] + s * c[i];
        benchmark::DoNotOptimize(out);
        benchmark::ClobberMemory();
    }
    set_bandwidth(state, n, 3);
}

/// The two gate chains of olmax's layers, written once (olmax::math), run fused or op by op.
constexpr auto qrnn_input = [](auto f, auto z) { return (1 - olmax::math::hard_sigmoid(f)) * olmax::math::tanh(z); };
constexpr auto gated_output = [](auto y, auto z) { return y * olmax::math::silu(z); };

struct GateBuffers {
    Tensor<float> a, b, dy;
    explicit GateBuffers(std::size_t n) : a(filled({n}, 7)), b(filled({n}, 8)), dy(filled({n}, 9)) {
        a.set_requires_grad(true);
        b.set_requires_grad(true);
    }
};

/// y = chain(a, b), then backward from dy into both inputs' gradients (zeroed each time).
template <class Chain>
void bm_gate_chain(benchmark::State& state, GateBuffers* buf, Chain chain, bool fused) {
    for (auto _ : state) {
        buf->a.zero_grad();
        buf->b.zero_grad();
        Tensor<float> y = fused ? olmax::pointwise("chain", chain, buf->a, buf->b) : chain(buf->a, buf->b);
        y.backward(buf->dy);
        benchmark::DoNotOptimize(buf->a.grad().data());
        benchmark::ClobberMemory();
    }
    state.SetItemsProcessed(std::int64_t(state.iterations()) * std::int64_t(buf->a.size()));
    state.counters["threads"] = olmax::backend::cpu_openmp::num_threads();
}

/// One AdamW step over `n` float parameters whose gradients stay set, moments of type `moments`.
void bm_adamw_step(benchmark::State& state, std::size_t n, olmax::optim::MomentPrecision moments, double bytes_per_parameter) {
    auto w = olmax::parameter(filled({n}, 10));
    w.backward(filled({n}, 11));
    olmax::optim::AdamWConfig config;
    config.moments = moments;
    config.weight_decay = 0.01;
    olmax::optim::AdamW<float> opt({olmax::optim::make_parameter("w", olmax::nn::Role::weight, w)}, 1e-4, config);
    for (auto _ : state) {
        opt.step();
        benchmark::DoNotOptimize(w.data());
        benchmark::ClobberMemory();
    }
    state.counters["bytes_per_second"] = benchmark::Counter(double(n) * bytes_per_parameter, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["threads"] = olmax::backend::cpu_openmp::num_threads();
}

}  // namespace

int main(int argc, char** argv) {
    Sizes sizes;
    std::vector<char*> args;
    for (int i = 0; i < argc; ++i) {
        if (std::strcmp(argv[i], "--olmax_quick") == 0) sizes = {64, 1u << 16, 1u << 12, 1u << 12};
        else args.push_back(argv[i]);
    }
    int count = int(args.size());
    benchmark::Initialize(&count, args.data());
    if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 1;

    StreamBuffers buffers(sizes.stream);
    const std::string g = std::to_string(sizes.gemm), s = std::to_string(sizes.stream);
    benchmark::RegisterBenchmark(("matmul/olmax/" + g).c_str(), bm_olmax_matmul, sizes.gemm)->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark(("matmul/eigen/" + g).c_str(), bm_eigen_gemm, sizes.gemm)->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark(("stream/triad/" + s).c_str(), bm_stream_triad, &buffers)->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark(("stream/olmax_map_chain/" + s).c_str(), bm_olmax_map_chain, &buffers)->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark(("stream/olmax_map_chain_into/" + s).c_str(), bm_olmax_map_chain_into, &buffers)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    GateBuffers gates(sizes.gates);
    const std::string e = std::to_string(sizes.gates);
    for (const bool fused : {true, false}) {
        const std::string how = fused ? "pointwise/" : "op_by_op/";
        benchmark::RegisterBenchmark(("gates/qrnn_input/" + how + e).c_str(), bm_gate_chain<decltype(qrnn_input)>, &gates, qrnn_input, fused)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
        benchmark::RegisterBenchmark(("gates/gated_output/" + how + e).c_str(), bm_gate_chain<decltype(gated_output)>, &gates, gated_output, fused)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
    }
    const std::string a = std::to_string(sizes.adam);
    using olmax::optim::MomentPrecision;
    for (const auto& [name, moments, bytes] : {std::tuple{"fp64", MomentPrecision::float64, 48.0}, std::tuple{"fp32", MomentPrecision::float32, 32.0},
                                               std::tuple{"bf16", MomentPrecision::bfloat16, 24.0}})
        benchmark::RegisterBenchmark(("adamw/" + std::string(name) + "/" + a).c_str(), bm_adamw_step, sizes.adam, moments, bytes)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
