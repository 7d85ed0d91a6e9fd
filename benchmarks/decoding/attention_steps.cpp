// Decoding steps of nn::CausalSelfAttention over a KV cache of a given length: the time of one
// step (one new token per sequence, nn::AttentionCache carried) after a cache of `keys` steps.
// Per run: a fresh cache filled with `keys` steps in one call (not timed), then `steps` one-step
// calls, timed together; reported: the median over --runs runs of microseconds per step.
//
//     build/benchmarks/decoding/attention_steps [--keys 1024,4096] [--steps 256] [--runs 5]
//         [--batch 1] [--features 256] [--window 0] [--json FILE] [--quick]
//
// Threads: OpenMP's setting (OMP_NUM_THREADS). --features 256 is 4 heads of 64 (the layer's
// defaults); --window W > 0 is a sliding window (the cache then keeps O(W) keys: the keys held and
// the buffers' room after the last run are reported); --quick is a seconds-long smoke run.
#include <olmax/olmax.hpp>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../timing.hpp"

namespace {

/// A whole non-negative decimal number, or a one-line error and exit status 2 (std::stoul would
/// read "-1" as the largest value and throw, uncaught, on "abc").
std::size_t parse_count(const std::string& flag, const std::string& text) {
    std::size_t value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
        std::fprintf(stderr, "attention_steps: %s needs a non-negative whole number that fits in 64 bits, got '%s'\n", flag.c_str(), text.c_str());
        std::exit(2);
    }
    return value;
}

std::vector<std::size_t> parse_list(const std::string& flag, const std::string& text) {
    std::vector<std::size_t> values;
    std::stringstream in(text);
    for (std::string item; std::getline(in, item, ',');) values.push_back(parse_count(flag, item));
    if (values.empty()) parse_count(flag, text);  // "" is refused with the same message
    return values;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::size_t> key_counts{1024, 4096};
    std::size_t steps = 256, runs = 5, batch = 1, features = 256, window = 0;
    std::string json_path;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        const bool has_value = i + 1 < argc;
        if (a == "--keys" && has_value) key_counts = parse_list(a, argv[++i]);
        else if (a == "--steps" && has_value) steps = parse_count(a, argv[++i]);
        else if (a == "--runs" && has_value) runs = parse_count(a, argv[++i]);
        else if (a == "--batch" && has_value) batch = parse_count(a, argv[++i]);
        else if (a == "--features" && has_value) features = parse_count(a, argv[++i]);
        else if (a == "--window" && has_value) window = parse_count(a, argv[++i]);
        else if (a == "--json" && has_value) json_path = argv[++i];
        else if (a == "--quick") key_counts = {64}, steps = 8, runs = 1;
        else {
            std::fprintf(stderr, "attention_steps: unknown argument '%s' (see the top of attention_steps.cpp)\n", a.c_str());
            return 2;
        }
    }
    if (steps == 0 || runs == 0 || batch == 0 || features == 0 || std::find(key_counts.begin(), key_counts.end(), 0) != key_counts.end()) {
        std::fprintf(stderr, "attention_steps: --keys, --steps, --runs, --batch and --features must be positive\n");
        return 2;
    }
    std::ostringstream rows;
    try {  // the layer refuses sizes it cannot run (an odd head size for RoPE, buffers too large): one line, status 1
        olmax::Generator rng(1);
        olmax::autodiff::no_grad off;
        const olmax::nn::CausalSelfAttention<float> layer(olmax::nn::AttentionConfig{.features = features, .window = window}, rng);
        std::printf("%10s %8s %8s %14s %10s %10s\n", "keys", "batch", "window", "us per step", "held", "capacity");
        for (std::size_t keys : key_counts) {
            const auto prefix = olmax::randn<float>({batch, keys, features}, rng);
            const auto token = olmax::randn<float>({batch, 1, features}, rng);
            std::vector<double> per_step;
            std::size_t held = 0, capacity = 0;  // the last run's cache
            for (std::size_t r = 0; r < runs + 1; ++r) {  // the first run is not timed
                olmax::nn::AttentionCache<float> cache;
                layer.continue_sequence(prefix, cache);
                const auto start = std::chrono::steady_clock::now();
                for (std::size_t s = 0; s < steps; ++s) layer.continue_sequence(token, cache);
                if (r > 0) per_step.push_back(olmax_bench::seconds_since(start) / double(steps) * 1e6);
                held = cache.held(), capacity = cache.capacity();
            }
            const double us = olmax_bench::median(per_step);
            std::printf("%10zu %8zu %8zu %14.1f %10zu %10zu\n", keys, batch, window, us, held, capacity);
            rows << (rows.tellp() > 0 ? ",\n" : "") << "  {\"keys\": " << keys << ", \"steps\": " << steps << ", \"batch\": " << batch
                 << ", \"features\": " << features << ", \"window\": " << window << ", \"held_keys\": " << held << ", \"capacity\": " << capacity
                 << ", \"us_per_step\": " << us << ", \"runs\": " << runs << ", \"loadavg\": \"" << olmax_bench::load_average()
                 << "\"}";
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "attention_steps: %s\n", e.what());
        return 1;
    }
    if (!json_path.empty()) {
        std::ofstream out(json_path);
        out << "[\n" << rows.str() << "\n]\n";
        if (!out) {
            std::fprintf(stderr, "attention_steps: could not write %s\n", json_path.c_str());
            return 1;
        }
    }
}
