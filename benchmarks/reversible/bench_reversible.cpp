// Reversible blocks vs the same blocks with every activation on the tape: peak memory of one
// training step (forward + backward) against depth, and time per step.
//
// Block = Reversible<Sandwich<DenseConv<5>>, Sandwich<HierarchicalMixer<16>>> (float), run through
// nn::Stack at depth 4, 16, 64, 256. "reversible" uses the memory-free backward (the whole stack is
// one custom op that rebuilds each layer's input from its output); "plain" is the same Stack with
// Config::reversible_backward = false (same weights, same maths, all activations recorded).
//
// Memory: olmax::memory counts every tensor buffer. Before the step we note the bytes held
// (parameters, input, output gradient) and reset the peak; activation peak = step peak - that
// baseline - the parameter gradients the step leaves behind (as many bytes as the parameters), so
// parameters and their gradients are excluded.
//
// Usage: bench_reversible [--quick] [--out FILE]   (JSON to stdout, and to FILE when given)
#include <olmax/nn/nn.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "../timing.hpp"

namespace nn = olmax::nn;
using olmax::Tensor;
using Block = nn::Reversible<nn::Sandwich<nn::DenseConv<5, float>>, nn::Sandwich<nn::HierarchicalMixer<16, float>>>;

struct Sizes {
    std::size_t batch = 2, sequence = 256, features = 32;
    std::vector<std::size_t> depths{4, 16, 64, 256};
    std::vector<std::size_t> timing_depths{16, 64};
    int timing_repeats = 9;
};

struct MemoryResult {
    std::size_t parameter_bytes = 0, baseline_bytes = 0, peak_bytes = 0, activation_peak_bytes = 0;
};

nn::Config make_config(const Sizes& s, bool reversible) {
    nn::Config c;
    c.features = s.features;
    c.seed = 1;
    c.reversible_backward = reversible;
    return c;
}

std::size_t parameter_bytes(nn::Stack<Block>& stack) {
    std::size_t n = 0;
    for (auto& p : nn::parameters(stack)) n += p.tensor.size() * sizeof(float);
    return n;
}

double step(nn::Stack<Block>& stack, const Tensor<float>& x_value, const Tensor<float>& dy) {
    auto x = olmax::parameter(x_value.clone());
    const auto t0 = std::chrono::steady_clock::now();
    auto y = stack(x);
    y.backward(dy);
    return olmax_bench::seconds_since(t0);
}

MemoryResult measure_memory(const Sizes& s, std::size_t depth, bool reversible) {
    nn::Stack<Block> stack(make_config(s, reversible), depth);
    olmax::Generator rng(2);
    auto x = olmax::randn<float>({2, s.batch, s.sequence, s.features}, rng);
    auto dy = olmax::randn<float>({2, s.batch, s.sequence, s.features}, rng);
    MemoryResult r;
    r.parameter_bytes = parameter_bytes(stack);
    r.baseline_bytes = olmax::memory::stats().current_bytes;
    olmax::memory::reset_peak();
    step(stack, x, dy);
    r.peak_bytes = olmax::memory::stats().peak_bytes;
    r.activation_peak_bytes = r.peak_bytes - r.baseline_bytes - r.parameter_bytes;
    return r;
}

/// Median step time of the reversible and the plain stack, alternating the two runs so that load
/// changes on a shared machine hit both alike.
std::pair<double, double> median_step_seconds(const Sizes& s, std::size_t depth) {
    nn::Stack<Block> rev(make_config(s, true), depth), plain(make_config(s, false), depth);
    olmax::Generator rng(3);
    auto x = olmax::randn<float>({2, s.batch, s.sequence, s.features}, rng);
    auto dy = olmax::randn<float>({2, s.batch, s.sequence, s.features}, rng);
    step(rev, x, dy);  // warm-up
    step(plain, x, dy);
    std::vector<double> rev_times, plain_times;
    for (int i = 0; i < s.timing_repeats; ++i) {
        nn::zero_grad(rev);
        nn::zero_grad(plain);
        rev_times.push_back(step(rev, x, dy));
        plain_times.push_back(step(plain, x, dy));
    }
    return {olmax_bench::median(rev_times), olmax_bench::median(plain_times)};
}

int main(int argc, char** argv) {
    Sizes s;
    std::string out_path;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--quick") == 0) {
            s.sequence = 32;
            s.features = 8;
            s.depths = {4, 16};
            s.timing_depths = {4};
            s.timing_repeats = 1;
        } else if (std::strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
            out_path = argv[++i];
        }
    }
    std::ostringstream json;
    json << "{\n  \"block\": \"Reversible<Sandwich<DenseConv<5>>, Sandwich<HierarchicalMixer<16>>>, float\",\n"
         << "  \"batch\": " << s.batch << ", \"sequence\": " << s.sequence << ", \"features\": " << s.features << ",\n"
         << "  \"threads\": " << olmax::backend::default_backend::num_threads() << ",\n  \"memory\": [\n";
    std::size_t rev_first = 0, plain_first = 0, rev_last = 0, plain_last = 0;
    for (std::size_t i = 0; i < s.depths.size(); ++i) {
        const std::size_t depth = s.depths[i];
        const auto rev = measure_memory(s, depth, true);
        const auto plain = measure_memory(s, depth, false);
        if (i == 0) rev_first = rev.activation_peak_bytes, plain_first = plain.activation_peak_bytes;
        rev_last = rev.activation_peak_bytes, plain_last = plain.activation_peak_bytes;
        json << "    {\"depth\": " << depth << ", \"parameter_bytes\": " << rev.parameter_bytes
             << ", \"reversible\": {\"peak_bytes\": " << rev.peak_bytes << ", \"activation_peak_bytes\": " << rev.activation_peak_bytes
             << "}, \"plain\": {\"peak_bytes\": " << plain.peak_bytes << ", \"activation_peak_bytes\": " << plain.activation_peak_bytes
             << "}}" << (i + 1 < s.depths.size() ? "," : "") << "\n";
    }
    json << "  ],\n  \"activation_ratio_deepest_vs_shallowest\": {\"reversible\": " << double(rev_last) / double(rev_first)
         << ", \"plain\": " << double(plain_last) / double(plain_first) << "},\n  \"time\": [\n";
    for (std::size_t i = 0; i < s.timing_depths.size(); ++i) {
        const std::size_t depth = s.timing_depths[i];
        const auto [rev, plain] = median_step_seconds(s, depth);
        json << "    {\"depth\": " << depth << ", \"reversible_seconds\": " << rev << ", \"plain_seconds\": " << plain
             << ", \"ratio\": " << rev / plain << "}" << (i + 1 < s.timing_depths.size() ? "," : "") << "\n";
    }
    json << "  ]\n}\n";
    std::cout << json.str();
    if (!out_path.empty()) std::ofstream(out_path) << json.str();
    return 0;
}
