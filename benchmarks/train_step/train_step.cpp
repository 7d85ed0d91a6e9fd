// One full training step (forward + backward + AdamW update with global-norm clipping) of the main
// job's byte-level model (olmax::models::ByteLM, the same code examples/train_lm runs) on random
// byte batches: median seconds over --repeats steps after warm-up, tokens/s, and peak memory.
//
//     build/benchmarks/train_step/train_step --batch=8 --sequence=64 --features=64 --depth=2 --threads=1
//     build/benchmarks/train_step/train_step --quick --json=/tmp/quick.json
//     build/benchmarks/train_step/train_step --precision=bf16 --memory_profile   (what the step's peak holds)
//     build/benchmarks/train_step/train_step --precision=bf16 --time_profile     (where the step's time goes, by op)
//
// Memory (the same method in torch_train_step.py; see benchmarks/RESULTS.md):
//   peak_rss_bytes  growth of the process's peak resident set over one steady-state step (after
//                   warm-up): freed heap pages are returned to the OS (malloc_trim), the peak is
//                   restarted from the current RSS (writing 5 to /proc/self/clear_refs, Linux >= 4.0),
//                   then VmHWM after the step minus VmRSS before it (/proc/self/status).
//   first_step_rss_bytes  VmHWM growth over the first step, from just after the model and optimiser
//                   are built (includes one-time costs: lazy library initialisation, first-touch pages).
//   footprint_rss_bytes  VmHWM at exit minus VmRSS before the model was built.
//                   (Linux counts RSS per thread in batches, so RSS figures are good to ~0.25 MiB.)
//   peak_bytes      olmax's counted tensor allocator (olmax::memory::stats) at its highest during the
//                   same steady-state step: parameters + gradients + AdamW moments + activations.
//   peak_step_bytes that peak minus the tensor bytes held just before the step (what the step adds).
// Flags: --key=value or --key value. Output: a table line on stdout and one JSON object (--json).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <malloc.h>  // malloc_trim (glibc)

#include <olmax/config/program.hpp>
#include <olmax/core/memory.hpp>
#include <olmax/core/memory_profile.hpp>
#include <olmax/core/time_profile.hpp>
#include <olmax/io/npy.hpp>
#include <olmax/models/models.hpp>
#include <olmax/train/precision.hpp>  // the GEMM kernels of --precision (oneDNN's with olmax::onednn), as train_lm's Trainer
#include <olmax/train/train_config.hpp>

#include "../timing.hpp"

namespace byte_lm {
using Model = olmax::models::ByteLM<>;  // the main job's model
using T = Model::value_type;
using Recipe = Model::recipe_type;
}  // namespace byte_lm

namespace {

struct Options {
    std::int64_t batch = 8, sequence = 64, features = 64, depth = 2, threads = 1;
    int repeats = 20, warmup = 3;
    double max_seconds = 60;  // stop repeating once the timed steps took this long (at least 3 steps)
    std::string json;
    std::string dump;  // folder: parameters, one batch, its loss and gradients as .npy (torch_train_step.py --check)
    bool profile = false;
    std::int64_t parallel_threshold = -1;  // -1: the backend's default
    std::int64_t block_cache_mib = -1;     // -1: olmax::memory's default
    bool data_parallel = true;             // TrainConfig::data_parallel (rows split over threads)
    std::string precision = "fp32";        // bf16: the steps run inside backend::bf16_matmul_scope (as train_lm --precision=bf16)
    std::string fp32_gemm = "onednn";      // fp32 GEMMs: oneDNN's where built with it (as train_lm), or the backend's own (eigen)
    std::int64_t kept_layers = 0;          // nn::Stack::keep_activations: leading layers not recomputed in the backward
    bool update_in_backward = false;       // AdamW::step_during_backward (TrainConfig::update_in_backward)
    double max_grad_norm = -1;             // -1: the main job's default
    std::string adam_moments;              // "": the main job's default (TrainConfig::adam_moments)
    bool memory_profile = false;           // also print olmax::memory::profile_peak of one more step
    bool time_profile = false;             // also print olmax::profile_time of one more step
};

[[noreturn]] void usage(const std::string& why) {
    std::cerr << "train_step: " << why
              << "\nusage: train_step [--batch N] [--sequence N] [--features N] [--depth N] [--threads N] [--repeats N]"
                 " [--warmup N] [--max_seconds S] [--json PATH] [--quick] [--profile] [--dump DIR]\n"
                 "       [--parallel_threshold WORK]  (olmax::backend::cpu_openmp's serial/parallel cut-off; diagnosis only)\n"
                 "       [--block_cache_mib N]  (olmax::memory::set_cache_limit: freed large buffers kept for reuse; 0 = off; diagnosis only)\n"
                 "       [--data_parallel 0|1]  (1, the default as in train_lm: with threads > 1 each thread runs a shard of the batch)\n"
                 "       [--precision fp32|bf16]  (bf16: every float GEMM as bf16 x bf16 -> fp32, on oneDNN's bf16 kernels where built\n"
                 "                                 with olmax::onednn and the CPU has bf16 units, as train_lm --precision=bf16)\n"
                 "       [--fp32_gemm onednn|eigen]  (fp32 GEMMs: oneDNN's, the default as in train_lm where built with olmax::onednn,\n"
                 "                                    or the backend's own Eigen ones)\n"
                 "       [--kept_layers N]  (recompute as a budget: the first N reversible layers keep their activations)\n"
                 "       [--max_grad_norm X]  (global-norm clip; default the main job's, 0 = off)\n"
                 "       [--adam_moments fp64|fp32|bf16]  (AdamW's moment type; default the main job's)\n"
                 "       [--update_in_backward 0|1]  (1: AdamW applied inside backward as each gradient is final, as train_lm\n"
                 "                                    --update_in_backward; with clipping (max_grad_norm > 0) backward runs twice)\n"
                 "       [--memory_profile]  (after the timed steps, one more step under olmax::memory::profile_peak: its\n"
                 "                            peak's tensor buffers by the op that made them)\n"
                 "       [--time_profile]  (after the timed steps, one more step under olmax::profile_time: its time by op)\n";
    std::exit(1);
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i], value;
        if (arg.rfind("--", 0) != 0) usage("unexpected argument '" + arg + "'");
        arg = arg.substr(2);
        if (arg == "memory_profile") {
            o.memory_profile = true;
            continue;
        }
        if (arg == "time_profile") {
            o.time_profile = true;
            continue;
        }
        if (arg == "profile") {  // per-layer timings instead of the step benchmark
            o.profile = true;
            continue;
        }
        if (arg == "quick") {  // seconds-long smoke run (CTest)
            o.batch = 2, o.sequence = 32, o.features = 16, o.depth = 2, o.repeats = 2, o.warmup = 1;
            continue;
        }
        if (const auto eq = arg.find('='); eq != std::string::npos) {
            value = arg.substr(eq + 1);
            arg = arg.substr(0, eq);
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            usage("flag --" + arg + " needs a value");
        }
        auto number = [&]() -> std::int64_t {
            std::size_t used = 0;
            long long v = 0;
            try {
                v = std::stoll(value, &used);
            } catch (const std::exception&) {
                used = 0;
            }
            if (used != value.size() || v < 0) usage("flag --" + arg + " needs a non-negative integer, got '" + value + "'");
            return v;
        };
        if (arg == "batch") o.batch = number();
        else if (arg == "sequence") o.sequence = number();
        else if (arg == "features") o.features = number();
        else if (arg == "depth") o.depth = number();
        else if (arg == "threads") o.threads = number();
        else if (arg == "repeats") o.repeats = int(number());
        else if (arg == "warmup") o.warmup = int(number());
        else if (arg == "json") o.json = value;
        else if (arg == "dump") o.dump = value;
        else if (arg == "max_seconds") o.max_seconds = double(number());
        else if (arg == "parallel_threshold") o.parallel_threshold = number();
        else if (arg == "block_cache_mib") o.block_cache_mib = number();
        else if (arg == "data_parallel") o.data_parallel = number() != 0;
        else if (arg == "kept_layers") o.kept_layers = number();
        else if (arg == "update_in_backward") o.update_in_backward = number() != 0;
        else if (arg == "max_grad_norm") {
            try {
                o.max_grad_norm = std::stod(value);
            } catch (const std::exception&) {
                usage("--max_grad_norm needs a number, got '" + value + "'");
            }
            if (!(o.max_grad_norm >= 0)) usage("--max_grad_norm must be >= 0, got '" + value + "'");
        }
        else if (arg == "adam_moments") o.adam_moments = value;  // its choices are checked with the main job's keys (TrainConfig::validate)
        else if (arg == "fp32_gemm") {
            if (value != "onednn" && value != "eigen") usage("--fp32_gemm takes onednn or eigen, got '" + value + "'");
            o.fp32_gemm = value;
        }
        else if (arg == "precision") {
            if (value != "fp32" && value != "bf16") usage("--precision takes fp32 or bf16, got '" + value + "'");
            o.precision = value;
        }
        else usage("unknown flag --" + arg);
    }
    if (o.repeats < 1) usage("--repeats must be at least 1");
    return o;
}

/// A "VmHWM:" / "VmRSS:" line of /proc/self/status in bytes (0 where /proc is missing).
std::size_t proc_status_bytes(const std::string& key) {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind(key + ":", 0) == 0) {
            std::istringstream fields(line.substr(key.size() + 1));
            std::size_t kib = 0;
            fields >> kib;
            return kib * 1024;
        }
    return 0;
}

/// Gives freed heap pages and olmax's cached tensor buffers back to the OS and restarts VmHWM from
/// the current RSS; false where the kernel does not support resetting the peak (then steady-state
/// RSS peaks are not measured).
bool restart_peak_rss() {
    olmax::memory::release_cached();
    malloc_trim(0);
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
    clear.flush();
    return bool(clear);
}

olmax::data::Batch random_batch(std::size_t batch, std::size_t sequence, std::mt19937_64& rng) {
    olmax::data::Batch b;
    b.inputs = olmax::Tensor<std::int32_t>({batch, sequence});
    b.targets = olmax::Tensor<std::int32_t>({batch, sequence});
    b.mask = olmax::Tensor<float>({batch, sequence}, 1.0f);
    std::uniform_int_distribution<int> byte(0, 255);
    for (std::size_t i = 0; i < batch * sequence; ++i) {
        b.inputs.data()[i] = byte(rng);
        b.targets.data()[i] = byte(rng);
    }
    b.real_targets = batch * sequence;
    return b;
}

/// Median milliseconds of `repeats` calls of f after one warm-up call.
double median_ms(int repeats, const std::function<void()>& f) { return 1e3 * olmax_bench::median_seconds(std::size_t(repeats), 1, f); }

/// Where a step's time goes: each part of the model alone, forward only (no tape) and forward +
/// backward, on [batch, sequence, features] inputs (torch_train_step.py --profile prints the same rows).
void profile(const Options& o, const olmax::train::TrainConfig& c, byte_lm::Model& model, const olmax::data::Batch& batch) {
    using olmax::Tensor;
    using T = byte_lm::T;
    olmax::nn::Config n;  // one block's parts alone, at the model's width
    n.features = std::size_t(c.features);
    n.depth = std::size_t(c.depth);
    olmax::Generator rng(7);
    const olmax::nn::DenseConv<byte_lm::Recipe::conv_kernel, T> dense(n, rng);
    const olmax::nn::HierarchicalMixer<byte_lm::Recipe::mixer_chunk, T> mixer(n, rng);
    const Tensor<T> x = olmax::randn<T>({std::size_t(o.batch), std::size_t(o.sequence), std::size_t(o.features)}, rng);
    const Tensor<T> seed = olmax::ones_like(x);
    auto forward_only = [&](auto&& f) {
        return median_ms(o.repeats, [&] {
            olmax::autodiff::no_grad guard;
            f(x);
        });
    };
    auto forward_backward = [&](auto&& f) {  // a leaf input, as the reversible recompute does
        return median_ms(o.repeats, [&] {
            olmax::autodiff::tape_scope tape;
            Tensor<T> leaf = x.detach();
            leaf.set_requires_grad(true);
            f(leaf).backward(seed);
        });
    };
    auto row = [](const char* what, double fwd, double both) {
        std::printf("  %-34s forward %8.3f ms   forward+backward %8.3f ms\n", what, fwd, both);
    };
    std::printf("olmax profile B=%lld S=%lld F=%lld depth=%lld threads=%lld (median of %d)\n", static_cast<long long>(o.batch),
                static_cast<long long>(o.sequence), static_cast<long long>(o.features), static_cast<long long>(o.depth),
                static_cast<long long>(o.threads), o.repeats);
    row("DenseConv<5> F->2F->F", forward_only([&](const Tensor<T>& v) { return dense.forward(v); }),
        forward_backward([&](const Tensor<T>& v) { return dense.forward(v); }));
    olmax::nn::LayerContext layer0;
    row("HierarchicalMixer<16> layer 0", forward_only([&](const Tensor<T>& v) { return mixer.forward(v, layer0); }),
        forward_backward([&](const Tensor<T>& v) { return mixer.forward(v, layer0); }));
    const Tensor<T> state = olmax::nn::two_streams(x);
    const double stack_fwd = median_ms(o.repeats, [&] {
        olmax::autodiff::no_grad guard;
        model.stack.forward(state);
    });
    const double stack_both = median_ms(o.repeats, [&] {
        olmax::autodiff::tape_scope tape;
        Tensor<T> leaf = state.detach();
        leaf.set_requires_grad(true);
        model.stack.forward(leaf).backward(olmax::ones_like(state));
    });
    row("Stack of depth Reversible blocks", stack_fwd, stack_both);
    const double head_fwd = median_ms(o.repeats, [&] {
        olmax::autodiff::no_grad guard;
        model.head.loss(x, batch.targets);
    });
    const double head_both = median_ms(o.repeats, [&] {
        olmax::autodiff::tape_scope tape;
        Tensor<T> leaf = x.detach();
        leaf.set_requires_grad(true);
        model.head.loss(leaf, batch.targets).backward();
    });
    row("OutputHead: norm + W_out + loss", head_fwd, head_both);
    for (auto& p : model.parameters()) p.tensor.zero_grad();
}

/// Writes the initial parameters, one batch, its loss (value without the z-loss term) and the
/// parameter gradients into `folder`, so torch_train_step.py --check can verify that the PyTorch
/// model computes the same function. File names: the parameter name with '/' -> "__", '*' dropped.
void dump(const std::filesystem::path& folder, byte_lm::Model& model, const olmax::data::Batch& batch) {
    std::filesystem::create_directories(folder);
    auto file = [&](std::string name, const char* suffix) {
        std::string out;
        for (char ch : name)
            if (ch == '/') out += "__";
            else if (ch != '*') out += ch;
        while (out.find("____") != std::string::npos) out.replace(out.find("____"), 4, "__");
        return folder / (out + suffix);
    };
    auto params = model.parameters();
    for (const auto& p : params) olmax::io::save_npy(file(p.name, ".npy"), p.tensor);
    olmax::io::save_npy(folder / "inputs.npy", batch.inputs);
    olmax::io::save_npy(folder / "targets.npy", batch.targets);
    olmax::autodiff::tape_scope tape;
    auto loss = model.loss(batch);
    loss.backward();
    std::ofstream(folder / "loss.txt") << std::setprecision(9) << double(loss.item()) << "\n";
    for (const auto& p : params) olmax::io::save_npy(file(p.name, ".grad.npy"), p.tensor.grad());
    for (auto& p : params) p.tensor.zero_grad();
}

int run(int argc, char** argv) {
    const Options o = parse(argc, argv);
    const std::size_t rss_at_start = proc_status_bytes("VmRSS");
    olmax::train::TrainConfig c;  // the main job's defaults (lr, betas, weight decay, clipping, ...)
    c.batch = o.batch, c.sequence = o.sequence, c.features = o.features, c.depth = o.depth, c.threads = o.threads;
    c.data_parallel = o.data_parallel;
    if (o.max_grad_norm >= 0) c.max_grad_norm = o.max_grad_norm;
    if (!o.adam_moments.empty()) c.adam_moments = o.adam_moments;
    c.update_in_backward = o.update_in_backward;
    c.validate();
    olmax::train::set_threads(c.threads);
    if (o.parallel_threshold >= 0) olmax::backend::cpu_openmp::set_parallel_threshold(std::size_t(o.parallel_threshold));
    if (o.block_cache_mib >= 0) olmax::memory::set_cache_limit(std::size_t(o.block_cache_mib) << 20);
    byte_lm::Model model(c);
    model.stack.keep_activations(std::size_t(o.kept_layers));
    olmax::optim::AdamW<byte_lm::T> opt(model.parameters(), olmax::train::optimizer_config(c));
    std::size_t params = 0;
    for (const auto& p : opt.parameters()) params += p.tensor.size();

    std::mt19937_64 rng(1234);
    std::vector<olmax::data::Batch> batches;
    for (int i = 0; i < 4; ++i) batches.push_back(random_batch(std::size_t(o.batch), std::size_t(o.sequence), rng));

    // Each step also records its phases (forward incl. loss; backward incl. freeing the tape;
    // optimiser incl. clipping and zero_grad) to show where the time goes. With data-parallel
    // shards the threads' forwards and backwards overlap: the whole of it is counted as backward.
    const std::size_t shards = olmax::train::shards_for(c);
    using clock = std::chrono::steady_clock;
    if (!o.dump.empty()) {
        dump(o.dump, model, batches[0]);
        std::printf("train_step: wrote parameters, a batch, its loss and gradients to %s\n", o.dump.c_str());
        return 0;
    }
    if (o.profile) {
        profile(o, c, model, batches[0]);
        return 0;
    }

    // The precision policy for every step below: the library's, as train_lm's (olmax/train/precision.hpp).
    const olmax::train::PrecisionScope precision(o.precision, o.fp32_gemm == "onednn");
    const std::string bf16_gemm = precision.bf16_gemm().empty() ? "none" : precision.bf16_gemm();
    const std::string fp32_gemm = precision.fp32_gemm().empty() ? "eigen" : precision.fp32_gemm();

    double last_loss = 0;
    std::vector<double> forward_s, backward_s, optimizer_s;
    auto step = [&](const olmax::data::Batch& batch) {
        const auto t0 = clock::now();
        auto t1 = t0;
        auto backward = [&] {  // with clipping step_during_backward runs it twice: forward_s then holds the first run too
            if (shards > 1) {
                last_loss = model.accumulate_gradients(batch, shards, 1.0);
            } else {
                olmax::autodiff::tape_scope tape;
                auto loss = model.loss(batch);
                last_loss = double(loss.item());
                t1 = clock::now();
                loss.backward();
            }
        };
        if (c.update_in_backward) opt.step_during_backward(backward);  // the optimiser's time is in backward's
        else backward();
        const auto t2 = clock::now();
        if (!c.update_in_backward) opt.step();
        opt.zero_grad();
        const auto t3 = clock::now();
        forward_s.push_back(std::chrono::duration<double>(t1 - t0).count());
        backward_s.push_back(std::chrono::duration<double>(t2 - t1).count());
        optimizer_s.push_back(std::chrono::duration<double>(t3 - t2).count());
    };

    // First step: peak RSS growth from the built model (comparable to PyTorch's first step, which
    // also allocates its lazy optimiser state).
    const std::size_t hwm_before_first = proc_status_bytes("VmHWM");
    step(batches[0]);
    const std::size_t first_step_rss = proc_status_bytes("VmHWM") - hwm_before_first;
    for (int i = 1; i < o.warmup; ++i) step(batches[std::size_t(i) % batches.size()]);

    // Resident and counted tensor memory of one steady-state step.
    const bool rss_restarted = restart_peak_rss();
    const std::size_t rss_before = proc_status_bytes("VmRSS");
    const std::size_t held_before = olmax::memory::stats().current_bytes;
    olmax::memory::reset_peak();
    step(batches[1]);
    const std::size_t peak_bytes = olmax::memory::stats().peak_bytes;
    const std::size_t peak_rss = rss_restarted ? proc_status_bytes("VmHWM") - rss_before : 0;

    forward_s.clear(), backward_s.clear(), optimizer_s.clear();
    std::vector<double> seconds;
    double timed = 0;
    for (int r = 0; r < o.repeats && (r < 3 || timed < o.max_seconds); ++r) {
        const auto& batch = batches[std::size_t(r) % batches.size()];
        const auto t0 = clock::now();
        step(batch);
        seconds.push_back(olmax_bench::seconds_since(t0));
        timed += seconds.back();
    }
    const int repeats = int(seconds.size());
    std::sort(seconds.begin(), seconds.end());  // seconds_min and seconds_max below are its ends
    const double median = olmax_bench::median(seconds);
    const double tokens_per_s = double(o.batch * o.sequence) / median;
    const std::size_t footprint_rss = proc_status_bytes("VmHWM") - rss_at_start;

    std::ostringstream json;
    const std::string framework = std::string(o.precision == "bf16" ? "olmax-bf16" : o.fp32_gemm == "eigen" ? "olmax-eigen" : "olmax") +
                                  (model.stack.kept_activations() > 0 ? "-kept" + std::to_string(model.stack.kept_activations()) : "") +
                                  (c.update_in_backward ? (c.max_grad_norm > 0 ? "-fused-clip" : "-fused") : "") +
                                  (c.adam_moments == "fp64" ? "-adam64" : c.adam_moments == "bf16" ? "-adam16" : "");
    json << "{\"framework\": \"" << framework << "\", \"precision\": \"" << o.precision
         << "\", \"bf16_gemm\": \"" << bf16_gemm << "\", \"fp32_gemm\": \"" << (o.precision == "fp32" ? fp32_gemm : "none") << "\", \"kept_layers\": " << model.stack.kept_activations()
         << ", \"update_in_backward\": " << (c.update_in_backward ? "true" : "false") << ", \"max_grad_norm\": " << c.max_grad_norm << ", \"adam_moments\": \"" << c.adam_moments << "\"" << ", \"batch\": " << o.batch << ", \"sequence\": " << o.sequence << ", \"features\": " << o.features
         << ", \"depth\": " << o.depth << ", \"threads\": " << o.threads << ", \"shards\": " << shards << ", \"repeats\": " << repeats
         << ", \"parallel_threshold\": " << olmax::backend::cpu_openmp::parallel_threshold()
         << ", \"block_cache_bytes\": " << olmax::memory::cache_limit()
         << ", \"seconds_median\": " << median << ", \"seconds_min\": " << seconds.front() << ", \"seconds_max\": " << seconds.back()
         << ", \"forward_s\": " << olmax_bench::median(forward_s) << ", \"backward_s\": " << olmax_bench::median(backward_s)
         << ", \"optimizer_s\": " << olmax_bench::median(optimizer_s) << ", \"tokens_per_s\": " << tokens_per_s << ", \"peak_bytes\": " << peak_bytes
         << ", \"peak_step_bytes\": " << (peak_bytes - held_before)
         << ", \"peak_rss_bytes\": " << (rss_restarted ? std::to_string(peak_rss) : "null")
         << ", \"first_step_rss_bytes\": " << first_step_rss
         << ", \"footprint_rss_bytes\": " << footprint_rss << ", \"params\": " << params << ", \"last_loss\": " << last_loss << "}";
    std::printf("%s  B=%lld S=%lld F=%lld depth=%lld threads=%lld shards=%zu params=%zu: %.3f ms/step (median of %d), %.0f tokens/s "
                "(forward %.2f, backward %.2f, optimiser %.2f ms), tensor peak %.2f MiB (+%.2f MiB in the step), "
                "peak RSS growth of a step %.2f MiB (first step %.2f MiB), footprint %.2f MiB\n",
                o.precision == "bf16" ? ("olmax-bf16 (" + bf16_gemm + ")").c_str() : "olmax", static_cast<long long>(o.batch), static_cast<long long>(o.sequence), static_cast<long long>(o.features),
                static_cast<long long>(o.depth), static_cast<long long>(o.threads), shards, params, median * 1e3, repeats, tokens_per_s,
                olmax_bench::median(forward_s) * 1e3, olmax_bench::median(backward_s) * 1e3, olmax_bench::median(optimizer_s) * 1e3,
                double(peak_bytes) / 1048576.0, double(peak_bytes - held_before) / 1048576.0,
                double(peak_rss) / 1048576.0, double(first_step_rss) / 1048576.0,
                double(footprint_rss) / 1048576.0);
    if (o.memory_profile) {
        const auto profile = olmax::memory::profile_peak([&] { step(batches[0]); });
        std::printf("tensor buffers made by one step, live at its peak, by the op that made them:\n%s", profile.table().c_str());
    }
    if (o.time_profile) {
        const auto profile = olmax::profile_time([&] { step(batches[0]); });
        std::printf("one step's time by op (self time; ops inside a backward node are listed with it):\n%s", profile.table().c_str());
    }
    if (!o.json.empty()) {
        std::ofstream out(o.json);
        out << json.str() << "\n";
        if (!out) usage("cannot write " + o.json);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return olmax::config::run_program("train_step", run, argc, argv); }
