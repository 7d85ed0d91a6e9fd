// Mamba's selective scan, forward and backward, as a traced program on a PJRT plugin in both of its
// traced forms, against olmax's own CPU op in the same process:
//   fused         the form traced for CPUs: loops over time keeping one [B, E, N] state and chunk
//                 checkpoints (xla/stablehlo/selective_scan.hpp);
//   native_call   the form traced for the XLA CPU plugin with olmax's native calls registered
//                 (trace/native_calls.hpp): custom calls of olmax's own CPU kernels (skipped, -1,
//                 on a plugin that cannot register them);
//   gpu_form      the form traced for GPUs (forced here by tracing for "cuda"), run on the same
//                 plugin: the [B, T, E, N] gates and drive materialised, one log-depth doubling
//                 scan, the states contracted with C (not the form a CPU would pick: a reference
//                 for what materialising costs);
//   eager         scan::selective_scan on olmax's CPU backend (OMP_NUM_THREADS threads).
// The loss is sum(y^2); a run computes it and the gradients of u, delta, A, B and C (with
// --backward=0 the loss only; the eager op then still keeps its checkpoints, its inputs requiring grad).
//
//     bench_xla_selective_scan --plugin=PATH [--batch=16] [--steps=128] [--channels=256] [--states=16] [--runs=7] [--backward=1]
//
// Prints one JSON object: the median milliseconds of each, the ratios to eager, and the process's
// peak resident MiB after each XLA form has run (fused first, so its figure is its own).

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <sys/resource.h>

#include <olmax/olmax.hpp>
#include <olmax/trace/native_calls.hpp>
#include <olmax/trace/program.hpp>
#include <olmax/trace/trace.hpp>

#include "flags.hpp"
#include "../timing.hpp"

namespace {

using olmax_bench::flag;
using olmax_bench::positive_flag;

using olmax::Tensor;
namespace trace = olmax::trace;
using Inputs = std::vector<Tensor<float>>;


Tensor<float> loss_of(const Inputs& x) {
    const auto s = olmax::scan::selective_scan(x[0], x[1], x[2], x[3], x[4]);
    return olmax::sum(olmax::square(s.y));
}

double median_ms(std::size_t runs, const std::function<void()>& run) { return 1e3 * olmax_bench::median_seconds(runs, 1, run); }

double peak_mib() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return double(usage.ru_maxrss) / 1024.0;
}

}  // namespace

int main(int argc, char** argv) try {
    const std::string plugin = flag(argc, argv, "plugin", "");
    if (plugin.empty()) {
        std::fprintf(stderr, "usage: bench_xla_selective_scan --plugin=PATH [--batch=B] [--steps=T] [--channels=E] [--states=N] [--runs=R] [--backward=0|1]\n");
        return 2;
    }
    const std::size_t B = positive_flag(argc, argv, "batch", 16), T = positive_flag(argc, argv, "steps", 128),
                      E = positive_flag(argc, argv, "channels", 256), N = positive_flag(argc, argv, "states", 16),
                      runs = positive_flag(argc, argv, "runs", 7);
    const bool backward = flag(argc, argv, "backward", "1") != "0";
    olmax::Generator rng(1);
    const Inputs inputs{olmax::randn<float>({B, T, E}, rng), olmax::rand<float>({B, T, E}, rng, 0.01f, 0.2f),
                        olmax::rand<float>({E, N}, rng, -1.5f, -0.2f), olmax::randn<float>({B, T, N}, rng), olmax::randn<float>({B, T, N}, rng)};

    const double eager = median_ms(runs, [&] {
        Inputs leaves;
        for (const auto& x : inputs) leaves.push_back(olmax::parameter(x.clone()));
        Tensor<float> loss = loss_of(leaves);
        if (backward) loss.backward();
    });

    auto client = std::make_shared<olmax::xla::pjrt::client>(olmax::xla::pjrt::plugin::load(plugin));
    std::vector<std::vector<float>> values;
    for (const auto& x : inputs) values.push_back(trace::input_values(x));
    auto traced_ms = [&](const std::string& target, double& mib, bool native_calls = false) {
        trace::traced_program program;
        {
            trace::tracing t;
            t.set_target(target);
            t.set_native_calls(native_calls);
            Inputs traced;
            for (const auto& x : inputs) traced.push_back(t.input<float>(x.shape()).set_requires_grad(true));
            Tensor<float> loss = loss_of(traced);
            Inputs results{loss};
            if (backward) {
                loss.backward();
                for (const auto& x : traced) results.push_back(x.grad());
            }
            program = t.finish(results);
        }
        trace::compiled_program device(client, std::move(program));
        const double ms = median_ms(runs, [&] { device.run(values); });
        mib = peak_mib();
        return ms;
    };
    double fused_mib = 0, native_call_mib = 0, gpu_form_mib = 0;
    const double fused = traced_ms("cpu", fused_mib);
    const double native_call = trace::enable_native_calls(*client) ? traced_ms("cpu", native_call_mib, true) : -1.0;
    const double gpu_form = traced_ms("cuda", gpu_form_mib);
    std::printf("{\"platform\": \"%s\", \"backward\": %s, \"batch\": %zu, \"steps\": %zu, \"channels\": %zu, \"states\": %zu, \"eager_ms\": %.4g, "
                "\"fused_ms\": %.4g, \"native_call_ms\": %.4g, \"gpu_form_ms\": %.4g, \"fused_over_eager\": %.3g, \"native_call_over_eager\": %.3g, "
                "\"gpu_form_over_eager\": %.3g, \"peak_mib_after_fused\": %.0f, \"peak_mib_after_native_call\": %.0f, \"peak_mib_after_gpu_form\": %.0f}\n",
                client->platform_name().c_str(), backward ? "true" : "false", B, T, E, N, eager, fused, native_call, gpu_form, fused / eager,
                native_call / eager, gpu_form / eager, fused_mib, native_call_mib, gpu_form_mib);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "bench_xla_selective_scan: %s\n", e.what());
    return 1;
}
