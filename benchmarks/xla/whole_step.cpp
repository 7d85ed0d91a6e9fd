// XLA compile time, module size and step time of the whole traced training step (forward, gradient
// through the layer loop, AdamW: olmax/backend/xla/graph/residual_lm.hpp) against depth, on a PJRT
// plugin. Usage:
//   bench_xla_whole_step [--plugin PATH] [--depths 4,16,64,256] [--repeats 3] [--steps 5]
//                        [--features 64] [--tokens 512] [--json OUT.json]
// The plugin comes from --plugin or $OLMAX_PJRT_PLUGIN (the xla-cpu-pjrt wheel's CPU plugin by
// default in run.sh). Every compile is a fresh one (a new cache key); figures are medians.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <new>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <olmax/backend/xla/device_program.hpp>
#include <olmax/backend/xla/graph/emit.hpp>
#include <olmax/backend/xla/graph/residual_lm.hpp>

namespace gx = olmax::xla::graph;

namespace {

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// A positive integer flag value, or an error naming the flag.
std::int64_t positive(const std::string& flag, const std::string& text) {
    std::size_t used = 0;
    long long v = 0;
    try {
        v = std::stoll(text, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used == 0 || used != text.size() || v < 1) throw std::runtime_error(flag + " takes a positive integer, got '" + text + "'");
    return v;
}

std::vector<std::int64_t> parse_list(const std::string& flag, const std::string& text) {
    std::vector<std::int64_t> out;
    std::stringstream in(text);
    for (std::string item; std::getline(in, item, ',');) out.push_back(positive(flag, item));
    if (out.empty()) throw std::runtime_error(flag + " takes a comma-separated list of positive integers, got '" + text + "'");
    return out;
}

}  // namespace

int main(int argc, char** argv) try {
    std::string plugin_path, json_path;
    std::vector<std::int64_t> depths{4, 16, 64, 256};
    int repeats = 3, steps = 5;
    gx::residual_lm_shape shape{256, 64, 4, 512};
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) throw std::runtime_error("missing value after " + a);
            return argv[++i];
        };
        if (a == "--plugin") plugin_path = next();
        else if (a == "--depths") depths = parse_list(a, next());
        else if (a == "--repeats") repeats = int(std::min<std::int64_t>(positive(a, next()), 1000));
        else if (a == "--steps") steps = int(std::min<std::int64_t>(positive(a, next()), 1000000));
        else if (a == "--features") shape.features = positive(a, next());
        else if (a == "--tokens") shape.tokens = positive(a, next());
        else if (a == "--json") json_path = next();
        else throw std::runtime_error("unknown argument " + a + " (see the usage at the top of whole_step.cpp)");
    }
    auto client = std::make_shared<olmax::xla::pjrt::client>(olmax::xla::pjrt::plugin::load(plugin_path));
    std::ostringstream json;
    json << "{\n  \"benchmark\": \"xla_whole_step\",\n  \"platform\": \"" << client->platform_name() << "\",\n  \"vocab\": " << shape.vocab
         << ", \"features\": " << shape.features << ", \"tokens\": " << shape.tokens << ",\n  \"rows\": [\n";
    std::printf("%6s %12s %10s %12s %12s\n", "depth", "module_B", "trace_ms", "compile_s", "step_ms");
    for (std::size_t d = 0; d < depths.size(); ++d) {
        shape.depth = depths[d];
        const auto t0 = std::chrono::steady_clock::now();
        const auto step = gx::trace_residual_lm_step(shape, {});
        const auto module = gx::emit(*step.g, "residual_lm_step", step.results);
        const double trace_s = seconds_since(t0);
        std::vector<double> compile_s;
        for (int r = 0; r < repeats; ++r) {
            const auto c0 = std::chrono::steady_clock::now();
            client->compile(module.key + ".repeat" + std::to_string(r) + ".depth" + std::to_string(shape.depth), module.text);
            compile_s.push_back(seconds_since(c0));
        }
        olmax::xla::device_program program(client, module, step.state_count());
        std::mt19937 rng(3);
        std::normal_distribution<float> normal(0.0f, 0.3f / std::sqrt(float(shape.features)));
        for (std::size_t i = 0; i < step.state_count(); ++i) {
            std::vector<float> v(std::size_t(module.inputs[i].elements()), 0.0f);
            if (step.state_names[i] == "stack/scale") std::fill(v.begin(), v.end(), 0.05f);
            else if (i >= 1 && i <= 5) for (auto& x : v) x = normal(rng);
            program.set_state(i, v);
        }
        std::vector<float> ids(std::size_t(shape.tokens)), targets(ids.size());
        for (std::size_t n = 0; n < ids.size(); ++n) {
            ids[n] = float(n * 31 % std::size_t(shape.vocab));
            targets[n] = float((n * 31 + 1) % std::size_t(shape.vocab));
        }
        program.run({ids.data(), targets.data()});  // warm-up
        std::vector<double> step_s;
        float loss = 0;
        for (int s = 0; s < steps; ++s) {
            const auto s0 = std::chrono::steady_clock::now();
            loss = program.run({ids.data(), targets.data()})[0][0];
            step_s.push_back(seconds_since(s0));
        }
        std::printf("%6lld %12zu %10.1f %12.3f %12.2f   (loss %.4f)\n", (long long)shape.depth, module.text.size(), trace_s * 1e3,
                    median(compile_s), median(step_s) * 1e3, double(loss));
        json << "    {\"depth\": " << shape.depth << ", \"module_bytes\": " << module.text.size() << ", \"trace_emit_s\": " << trace_s
             << ", \"compile_s_median\": " << median(compile_s) << ", \"compile_s\": [";
        for (std::size_t r = 0; r < compile_s.size(); ++r) json << (r ? ", " : "") << compile_s[r];
        json << "], \"step_s_median\": " << median(step_s) << ", \"final_loss\": " << loss << "}" << (d + 1 < depths.size() ? "," : "") << "\n";
    }
    json << "  ]\n}\n";
    if (!json_path.empty()) std::ofstream(json_path) << json.str();
    return 0;
} catch (const std::bad_alloc&) {
    std::fprintf(stderr, "bench_xla_whole_step: out of memory: reduce --tokens, --features or --depths\n");
    return 1;
} catch (const std::exception& e) {
    std::fprintf(stderr, "bench_xla_whole_step: %s\n", e.what());
    return 1;
}
