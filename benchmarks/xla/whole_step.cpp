// XLA compile time, module size and step time of the main job's whole training step (ByteLM's own
// eager forward, backward and AdamW step, traced once as train::XlaTrainer traces it, native calls
// included where the plugin runs them) against depth, for each block, on a PJRT plugin. Usage:
//   bench_xla_whole_step [--plugin PATH] [--blocks conv_mixer,qrnn,mamba,moe] [--depths 4,16,64]
//                        [--repeats 3] [--steps 5] [--features 64] [--batch 8] [--sequence 64] [--json OUT.json]
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
#include <sstream>
#include <string>
#include <vector>

#include <olmax/olmax.hpp>
#include <olmax/train/xla_trainer.hpp>
#include <olmax/trace/program.hpp>

#include "../timing.hpp"
#include "flags.hpp"

namespace {

using olmax_bench::median;
using olmax_bench::positive;
using olmax_bench::seconds_since;

std::vector<std::int64_t> parse_list(const std::string& flag, const std::string& text) {
    std::vector<std::int64_t> out;
    std::stringstream in(text);
    for (std::string item; std::getline(in, item, ',');) out.push_back(positive(flag, item));
    if (out.empty()) throw std::runtime_error(flag + " takes a comma-separated list of positive integers, got '" + text + "'");
    return out;
}

std::vector<std::string> parse_names(const std::string& text) {
    std::vector<std::string> out;
    std::stringstream in(text);
    for (std::string item; std::getline(in, item, ',');) out.push_back(item);
    return out;
}

struct sizes {
    std::size_t features = 64, batch = 8, sequence = 64;
};

/// One block's row at one depth: the traced step's module size, trace time, XLA compile times and
/// step time.
template <class Recipe>
std::string measure(const std::shared_ptr<olmax::xla::pjrt::client>& client, const sizes& z, std::size_t depth, int repeats, int steps) {
    using Model = olmax::models::ByteLM<Recipe, float>;
    Model model(olmax::models::ByteLMConfig{z.features, depth, 1});
    olmax::optim::AdamWConfig adam;
    adam.schedule.peak_lr = 1e-3;
    olmax::optim::AdamW<float> opt(model.parameters(), adam);
    const auto t0 = std::chrono::steady_clock::now();
    olmax::trace::traced_program traced = olmax::train::XlaTrainer<Model>::trace_step(model, opt, *client, z.batch, z.sequence);
    const double trace_s = seconds_since(t0);
    std::vector<double> compile_s;
    for (int r = 0; r < repeats; ++r) {
        const auto c0 = std::chrono::steady_clock::now();
        client->compile(traced.module.key + ".repeat" + std::to_string(r), traced.module.text);
        compile_s.push_back(seconds_since(c0));
    }
    const std::size_t module_bytes = traced.module.text.size();
    olmax::trace::compiled_program program(client, std::move(traced));
    std::vector<float> ids(z.batch * z.sequence), targets(ids.size());
    for (std::size_t n = 0; n < ids.size(); ++n) {
        ids[n] = float(n * 31 % 256);
        targets[n] = float((n * 31 + 1) % 256);
    }
    program.run({ids, targets});  // warm-up
    std::vector<double> step_s;
    float loss = 0;
    for (int s = 0; s < steps; ++s) {
        const auto s0 = std::chrono::steady_clock::now();
        loss = program.run({ids, targets})[0][0];
        step_s.push_back(seconds_since(s0));
    }
    std::printf("%-11s %6zu %12zu %10.1f %12.3f %12.2f   (loss %.4f)\n", std::string(Recipe::key).c_str(), depth, module_bytes, trace_s * 1e3,
                median(compile_s), median(step_s) * 1e3, double(loss));
    std::ostringstream json;
    json << "{\"block\": \"" << Recipe::key << "\", \"depth\": " << depth << ", \"module_bytes\": " << module_bytes << ", \"trace_s\": " << trace_s
         << ", \"compile_s_median\": " << median(compile_s) << ", \"compile_s\": [";
    for (std::size_t r = 0; r < compile_s.size(); ++r) json << (r ? ", " : "") << compile_s[r];
    json << "], \"step_s_median\": " << median(step_s) << ", \"final_loss\": " << loss << "}";
    return json.str();
}

}  // namespace


int main(int argc, char** argv) try {
    std::string plugin_path, json_path;
    std::vector<std::int64_t> depths{4, 16, 64};
    std::vector<std::string> blocks{"conv_mixer", "qrnn", "mamba", "moe"};
    int repeats = 3, steps = 5;
    sizes z;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) throw std::runtime_error("missing value after " + a);
            return argv[++i];
        };
        if (a == "--plugin") plugin_path = next();
        else if (a == "--depths") depths = parse_list(a, next());
        else if (a == "--blocks") blocks = parse_names(next());
        else if (a == "--repeats") repeats = int(std::min<std::int64_t>(positive(a, next()), 1000));
        else if (a == "--steps") steps = int(std::min<std::int64_t>(positive(a, next()), 1000000));
        else if (a == "--features") z.features = std::size_t(positive(a, next()));
        else if (a == "--batch") z.batch = std::size_t(positive(a, next()));
        else if (a == "--sequence") z.sequence = std::size_t(positive(a, next()));
        else if (a == "--json") json_path = next();
        else throw std::runtime_error("unknown argument " + a + " (see the usage at the top of whole_step.cpp)");
    }
    if (plugin_path.empty())
        if (const char* env = std::getenv("OLMAX_PJRT_PLUGIN")) plugin_path = env;
    auto client = std::make_shared<olmax::xla::pjrt::client>(olmax::xla::pjrt::plugin::load(plugin_path));
    std::ostringstream json;
    json << "{\n  \"benchmark\": \"xla_whole_step\",\n  \"model\": \"ByteLM\",\n  \"platform\": \"" << client->platform_name()
         << "\",\n  \"features\": " << z.features << ", \"batch\": " << z.batch << ", \"sequence\": " << z.sequence << ",\n  \"rows\": [\n";
    std::printf("%-11s %6s %12s %10s %12s %12s\n", "block", "depth", "module_B", "trace_ms", "compile_s", "step_ms");
    bool first = true;
    for (const auto& block : blocks)
        for (const auto depth : depths) {
            const std::string row = olmax::models::with_recipe(
                block, [&]<class Recipe>() { return measure<Recipe>(client, z, std::size_t(depth), repeats, steps); });
            json << (first ? "" : ",\n") << "    " << row;
            first = false;
        }
    json << "\n  ]\n}\n";
    if (!json_path.empty()) std::ofstream(json_path) << json.str();
    return 0;
} catch (const std::bad_alloc&) {
    std::fprintf(stderr, "bench_xla_whole_step: out of memory: reduce --batch, --sequence, --features or --depths\n");
    return 1;
} catch (const std::exception& e) {
    std::fprintf(stderr, "bench_xla_whole_step: %s\n", e.what());
    return 1;
}
