// nn::MoE forward + backward against the number of experts E at fixed active parameters: top-1
// routing and fixed features F, so each token meets one F x F expert whatever E (the total
// parameters E F^2 grow). Sparse dispatch (gather -> one GEMM per expert on its routed rows ->
// scatter) should stay flat in E; the dense form (every expert on every token, masked) grows
// linearly. One step: y = moe(x), loss = sum(y * r) (the layer adds its balance loss's
// gradient), backward into x, router and experts. Counters: tokens per second and the fraction of
// assignments dropped by capacity.
//
// Reproduce (see docs/MOE.md):
//   build/benchmarks/moe/bench_moe --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//       --benchmark_out=bench_moe.json --benchmark_out_format=json
// `--olmax_quick` shrinks every size (a smoke test that the benchmark runs, not a measurement).
#include <benchmark/benchmark.h>

#include <olmax/olmax.hpp>

#include <cstring>
#include <string>
#include <vector>

namespace {

using T = float;
namespace nn = olmax::nn;

struct Sizes {
    std::size_t batch = 8, sequence = 256, features = 128;
    std::vector<std::size_t> experts{2, 4, 8, 16, 32};
};

void bm_moe(benchmark::State& state, Sizes s, std::size_t experts, nn::MoEDispatch dispatch) {
    nn::MoEConfig c;
    c.features = s.features;
    c.experts = experts;
    c.top_k = 1;
    c.capacity_factor = 1.25;
    c.dispatch = dispatch;
    olmax::Generator rng(1);
    nn::MoE<T> moe(c, rng);
    const auto x_value = olmax::randn<T>({s.batch, s.sequence, s.features}, rng);
    const auto r = olmax::randn<T>({s.batch, s.sequence, s.features}, rng);
    auto params = nn::parameters(moe);
    moe.clear_routing_stats();
    for (auto _ : state) {
        auto x = olmax::parameter(x_value);
        olmax::sum(olmax::mul(moe.forward(x), r)).backward();
        for (auto& p : params) p.tensor.zero_grad();
        benchmark::DoNotOptimize(x.grad().data());
    }
    const double tokens = double(s.batch * s.sequence);
    state.counters["tokens_per_s"] = benchmark::Counter(tokens * double(state.iterations()), benchmark::Counter::kIsRate);
    state.counters["drop_rate"] = moe.routing_stats().drop_rate();
    state.counters["experts"] = double(experts);
}

}  // namespace

int main(int argc, char** argv) {
    Sizes sizes;
    std::vector<char*> args;
    for (int i = 0; i < argc; ++i) {
        if (std::strcmp(argv[i], "--olmax_quick") == 0) sizes = {2, 32, 16, {2, 4, 8}};
        else args.push_back(argv[i]);
    }
    int count = int(args.size());
    benchmark::Initialize(&count, args.data());
    if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 1;
    const std::string shape = "B" + std::to_string(sizes.batch) + "xS" + std::to_string(sizes.sequence) + "xF" + std::to_string(sizes.features);
    for (auto [label, dispatch] : {std::pair{"sparse", nn::MoEDispatch::sparse}, std::pair{"dense", nn::MoEDispatch::dense}})
        for (std::size_t e : sizes.experts)
            benchmark::RegisterBenchmark(("moe_fwd_bwd/" + std::string(label) + "/" + shape + "/experts:" + std::to_string(e)).c_str(), bm_moe,
                                         sizes, e, dispatch)
                ->Unit(benchmark::kMillisecond)
                ->UseRealTime();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
