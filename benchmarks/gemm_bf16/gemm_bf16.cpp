// GEMM throughput, fp32 and bf16 inputs (fp32 output and accumulation), in GFLOP/s (counter
// "GFLOP", a rate: 2 m n k per product), at square sizes, at the shapes of a model layer ([B*S, F] x [F, 4F])
// and at chunked_matmul<128>'s in-chunk product ([128, 128] decay matrix x [128, 64] inputs of a head):
//   eigen_fp32        olmax::matmul on float tensors (the library's GEMM: Eigen blocks on its pool)
//   kernels_fp32      backend::current().gemm into a preallocated C (what the scan's chunks call: no
//                     tensor allocation or tape, which matter at chunk sizes)
//   portable_bf16     olmax::backend::matmul_bf16 (bf16 widened to fp32, then the same Eigen GEMM)
//   onednn_fp32       olmax::backend::onednn::gemm (oneDNN's fp32 matmul primitive)
//   onednn_bf16       the oneDNN bf16 matmul primitive itself; only where the CPU has bf16 units
//   onednn_bf16_api   olmax::backend::onednn::gemm_bf16: the primitive above, or on CPUs without
//                     bf16 units the fp32 fallback (widen, then oneDNN fp32)
//   small_fp32        backend::small_gemm on the calling thread (the mixers' per-chunk products)
//   small_bf16_*      backend::small_gemm_bf16 on float operands in each of its forms: rounded
//                     (float copies, fp32 kernel), dot (VDPBF16PS), amx (AMX's tiles); a form the
//                     CPU lacks is skipped. Only at the chunk shapes (128x128x64 and 64x64x64).
// Each row's label names the oneDNN implementation ("gemm:jit", "brg:avx512_core_amx").
// Threads: OMP_NUM_THREADS (both olmax's pool and oneDNN follow it).
//
// Reproduce (see docs/BF16.md):
//   OMP_NUM_THREADS=2 build/benchmarks/gemm_bf16/bench_gemm_bf16 --benchmark_min_time=0.5
//       --benchmark_out=gemm_bf16.json --benchmark_out_format=json
// `--olmax_quick` runs 64^3 only (a smoke test that the benchmark runs, not a measurement).
#include <benchmark/benchmark.h>

#include <olmax/backend/bf16_gemm.hpp>
#include <olmax/backend/small_gemm_bf16.hpp>
#include <olmax/olmax.hpp>
#if defined(OLMAX_BENCH_WITH_ONEDNN)
#include <olmax/backend/onednn_gemm.hpp>
#endif

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

using olmax::bfloat16;
using olmax::Tensor;
namespace backend = olmax::backend;

struct Shape3 {
    std::size_t m, n, k;
    std::string name() const { return std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n); }
};

struct Operands {
    Tensor<float> a, b;
    Tensor<bfloat16> a16, b16;
    explicit Operands(const Shape3& s) {
        olmax::Generator rng(1);
        a = olmax::randn<float>({s.m, s.k}, rng);
        b = olmax::randn<float>({s.k, s.n}, rng);
        a16 = olmax::cast<bfloat16>(a);
        b16 = olmax::cast<bfloat16>(b);
    }
};

void report(benchmark::State& state, const Shape3& s) {
    state.counters["GFLOP"] = benchmark::Counter(2e-9 * double(s.m) * double(s.n) * double(s.k) * double(state.iterations()),
                                                   benchmark::Counter::kIsRate);
}

enum class Path { eigen_fp32, kernels_fp32, portable_bf16, onednn_fp32, onednn_bf16, onednn_bf16_api, small_fp32, small_bf16_rounded, small_bf16_dot, small_bf16_amx };

void bm_gemm(benchmark::State& state, Shape3 s, Path path, std::string label) {
    const Operands x(s);
    if (!label.empty()) state.SetLabel(label);
    auto c = Tensor<float>::uninitialized({s.m, s.n});
    auto product = [&] {
        switch (path) {
            case Path::eigen_fp32: c = olmax::matmul(x.a, x.b); break;
            case Path::kernels_fp32: backend::current().gemm(false, false, s.m, s.n, s.k, 1.0f, x.a.data(), s.k, x.b.data(), s.n, 0.0f, c.data(), s.n); break;
            case Path::portable_bf16: c = backend::matmul_bf16(x.a16, x.b16); break;
            case Path::small_fp32: backend::small_gemm(false, false, s.m, s.n, s.k, 1.0f, x.a.data(), s.k, x.b.data(), s.n, 0.0f, c.data(), s.n); break;
            case Path::small_bf16_rounded:
            case Path::small_bf16_dot:
            case Path::small_bf16_amx: {
                const backend::Bf16GemmForm form = path == Path::small_bf16_amx   ? backend::Bf16GemmForm::amx
                                                   : path == Path::small_bf16_dot ? backend::Bf16GemmForm::dot
                                                                                  : backend::Bf16GemmForm::rounded;
                backend::small_gemm_bf16(false, false, s.m, s.n, s.k, 1.0f, x.a.data(), s.k, x.b.data(), s.n, 0.0f, c.data(), s.n, {}, form);
                break;
            }
#if defined(OLMAX_BENCH_WITH_ONEDNN)
            case Path::onednn_fp32:
                backend::onednn::gemm(false, false, s.m, s.n, s.k, 1.0f, x.a.data(), s.k, x.b.data(), s.n, 0.0f, c.data(), s.n);
                break;
            case Path::onednn_bf16:
            case Path::onednn_bf16_api:
                backend::onednn::gemm_bf16(false, false, s.m, s.n, s.k, 1.0f, x.a16.data(), s.k, x.b16.data(), s.n, 0.0f, c.data(), s.n);
                break;
#endif
            default: return false;
        }
        return true;
    };
    // One untimed product first: oneDNN generates its kernels on the first run of a primitive.
    if (!product()) {
        state.SkipWithError("not built with oneDNN");
        return;
    }
    for (auto _ : state) {
        product();
        benchmark::DoNotOptimize(c.data());
        benchmark::ClobberMemory();
    }
    report(state, s);
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<Shape3> shapes = {{512, 512, 512},   {1024, 1024, 1024}, {2048, 2048, 2048},
                                  {4096, 4096, 4096}, {2048, 2048, 512},  {2048, 512, 2048},
                                  {128, 64, 128},   // m x n x k: chunked_matmul<128>'s chunk of a 64-channel head
                                  {64, 64, 64}};    // an SSD chunk of 64 steps, head dim and state 64
    std::vector<char*> args;
    for (int i = 0; i < argc; ++i) {
        if (std::strcmp(argv[i], "--olmax_quick") == 0) shapes = {{64, 64, 64}};
        else args.push_back(argv[i]);
    }
    int count = int(args.size());
    benchmark::Initialize(&count, args.data());
    if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 1;
    backend::set_bf16_notice_sink([](std::string_view message) { std::fprintf(stderr, "%.*s\n", int(message.size()), message.data()); });
    benchmark::AddCustomContext("cpu_bf16_features", backend::cpu_bf16_features().to_string());
#if defined(OLMAX_BENCH_WITH_ONEDNN)
    const auto& support = backend::onednn::bf16_support();
    benchmark::AddCustomContext("onednn_isa", support.isa);
    benchmark::AddCustomContext("onednn_bf16_accelerated", support.accelerated ? "yes" : "no");
#endif
    for (const Shape3& s : shapes) {
        auto add = [&](const char* label, Path path, std::string impl) {
            benchmark::RegisterBenchmark(("gemm/" + s.name() + "/" + label).c_str(), bm_gemm, s, path, std::move(impl))
                ->Unit(benchmark::kMillisecond)
                ->UseRealTime();
        };
        add("eigen_fp32", Path::eigen_fp32, "");
        add("kernels_fp32", Path::kernels_fp32, "");
        add("portable_bf16", Path::portable_bf16, "");
        if (s.m <= 128 && s.n <= 128 && s.k <= 128) {
            namespace d = backend::small_gemm_bf16_detail;
            add("small_fp32", Path::small_fp32, "");
            add("small_bf16_rounded", Path::small_bf16_rounded, "");
            if (d::runnable(backend::Bf16GemmForm::dot) == backend::Bf16GemmForm::dot) add("small_bf16_dot", Path::small_bf16_dot, "");
            if (d::runnable(backend::Bf16GemmForm::amx) == backend::Bf16GemmForm::amx) add("small_bf16_amx", Path::small_bf16_amx, "");
        }
#if defined(OLMAX_BENCH_WITH_ONEDNN)
        add("onednn_fp32", Path::onednn_fp32, backend::onednn::implementation(false, false, false, s.m, s.n, s.k));
        const std::string bf16_impl = backend::onednn::implementation(true, false, false, s.m, s.n, s.k);
        if (support.accelerated && !bf16_impl.empty()) add("onednn_bf16", Path::onednn_bf16, bf16_impl);
        else std::fprintf(stderr, "gemm/%s/onednn_bf16: skipped, oneDNN has no bf16 matmul on this CPU (ISA %s)\n", s.name().c_str(),
                          support.isa.c_str());
        add("onednn_bf16_api", Path::onednn_bf16_api, bf16_impl.empty() || !support.accelerated ? "fp32 fallback" : bf16_impl);
#endif
    }
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
