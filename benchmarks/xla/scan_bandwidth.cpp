// The linear scan h_t = a_t h_{t-1} + x_t as a traced program on a PJRT plugin, in each of the
// forms a traced scan can take (a loop over time, log-depth doubling, chunked triangular matmuls,
// blocks scanned side by side), against the device's own streaming bandwidth measured the same way (y = x + 1).
// a, x and h stay on the device as the program's state, so a run moves only what the program
// touches; one element of h comes back so that each run waits for the scan.
//
//     bench_xla_scan_bandwidth --plugin=PATH [--rows=R] [--steps=T] [--runs=N]
//
// Prints one JSON object: per form, the median seconds of a run and the achieved bandwidth
// (3 x 4 bytes per element: a and x read, h written), or the error that stopped it (a form whose
// program does not fit the device's memory), and the copy bandwidth (2 x 4 bytes per element).

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <olmax/olmax.hpp>
#include <olmax/trace/program.hpp>
#include <olmax/trace/trace.hpp>

#include "flags.hpp"
#include "../timing.hpp"

namespace {

using olmax_bench::flag;
using olmax_bench::positive_flag;

using olmax::Tensor;
namespace trace = olmax::trace;
namespace gx = olmax::xla::graph;


/// Median seconds of `runs` runs of the program `body` over `state_tensors` state tensors of
/// [1, steps, rows] float32, traced with every scan in `form`; its result is written into the last
/// state tensor.
template <class Body>
double median_seconds(const std::shared_ptr<olmax::xla::pjrt::client>& client, const olmax::xla::stablehlo::scan_strategy& form,
                      std::size_t rows, std::size_t steps, std::size_t state_tensors, std::size_t runs, Body body) {
    std::vector<Tensor<float>> state;
    olmax::Generator rng(1);
    for (std::size_t i = 0; i < state_tensors; ++i) state.push_back(olmax::rand<float>({1, steps, rows}, rng, 0.5f, 0.99f));
    trace::traced_program program;
    {
        trace::tracing t;
        t.set_target(client->platform_name());
        t.set_scan_form(form);
        for (const auto& s : state) t.bind_state(s);
        const Tensor<float> out = body(state);
        olmax::backend::trace::assign(state.back(), out);
        program = t.finish({olmax::reshape(olmax::slice(olmax::slice(out, 1, 0, 1), 2, 0, 1), {1})});  // one element: each run waits for it
    }
    trace::compiled_program device(client, std::move(program));
    return olmax_bench::median_seconds(runs, 2, [&] { device.run({}); });
}

}  // namespace

int main(int argc, char** argv) try {
    const std::string plugin = flag(argc, argv, "plugin", "");
    if (plugin.empty()) {
        std::fprintf(stderr, "usage: bench_xla_scan_bandwidth --plugin=PATH [--rows=R] [--steps=T] [--runs=N]\n");
        return 2;
    }
    const std::size_t rows = positive_flag(argc, argv, "rows", 4096), steps = positive_flag(argc, argv, "steps", 1024),
                      runs = positive_flag(argc, argv, "runs", 10);
    auto client = std::make_shared<olmax::xla::pjrt::client>(olmax::xla::pjrt::plugin::load(plugin));
    const double elements = double(rows) * double(steps);
    namespace hlo = olmax::xla::stablehlo;
    const double copy = median_seconds(client, hlo::scan_strategy::sequential(), rows, steps, 2, runs,
                                       [](const std::vector<Tensor<float>>& s) { return s[0] + 1.0f; });
    std::printf("{\"platform\": \"%s\", \"rows\": %zu, \"steps\": %zu, \"copy\": {\"seconds\": %.6g, \"GB_per_s\": %.4g}",
                client->platform_name().c_str(), rows, steps, copy, 2 * 4 * elements / copy / 1e9);
    for (const auto& form : {hlo::scan_strategy::sequential(), hlo::scan_strategy::hillis_steele(), hlo::scan_strategy::chunked_matmul<128>(),
                             hlo::scan_strategy::hillis_steele_chunked()}) {
        try {
            const double s = median_seconds(client, form, rows, steps, 3, runs, [](const std::vector<Tensor<float>>& state) {
                return olmax::scan::scan<olmax::scan::sequential_vectorized>(state[0], state[1]);
            });
            std::printf(", \"%s\": {\"seconds\": %.6g, \"GB_per_s\": %.4g, \"of_copy\": %.3g}", form.name().c_str(), s, 3 * 4 * elements / s / 1e9,
                        copy / s * 3.0 / 2.0);
        } catch (const std::exception& e) {  // e.g. the chunked matmuls' [rows, T/128, 128, 128] out of the device's memory
            std::string message = e.what();
            std::replace(message.begin(), message.end(), '"', '\'');
            std::replace(message.begin(), message.end(), '\n', ' ');
            std::printf(", \"%s\": {\"error\": \"%s\"}", form.name().c_str(), message.c_str());
        }
    }
    std::printf("}\n");
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "bench_xla_scan_bandwidth: %s\n", e.what());
    return 1;
}
