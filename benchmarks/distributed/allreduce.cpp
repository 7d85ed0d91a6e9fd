// Allreduce bandwidth against message size (4 KiB .. 64 MiB of float32) between processes, for
// olmax's deterministic allreduce (GlooCommunicator: direct reduce-scatter in rank order, then
// allgather) and Gloo's own ring allreduce on the same connections. Prints JSON on stdout.
//
//   bench_allreduce [--world=2] [--max_bytes=N] [--min_bytes=N] [--budget_mb=N]
//       starts `world` ranks of itself on this machine (127.0.0.1, a temporary file store);
//   bench_allreduce --rank=R --world=N --store=DIR [--hostname=H] ...
//       runs one rank (one machine each: the same --store on a shared file system, each rank's
//       own --hostname).
//
// Per size and algorithm: one warm-up call, then `iterations` calls between two barriers, timed on
// rank 0 (iterations = budget / size, 3 to 1000). algbw = bytes / time; busbw = algbw * 2 (N-1) / N,
// the bytes each rank sends per second (what a link carries in a bandwidth-optimal allreduce).

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/math.h>

#include <olmax/distributed/gloo.hpp>

extern char** environ;

namespace {

namespace dist = olmax::distributed;

struct Args {
    int rank = -1, world = 2;
    std::string store, hostname = "127.0.0.1";
    std::size_t min_bytes = std::size_t(4) << 10, max_bytes = std::size_t(64) << 20, budget_mb = 256;
};

Args parse(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        auto value = [&](std::string_view key) -> const char* { return arg.substr(0, key.size()) == key ? argv[i] + key.size() : nullptr; };
        if (auto v = value("--rank=")) a.rank = std::atoi(v);
        else if (auto v1 = value("--world=")) a.world = std::atoi(v1);
        else if (auto v2 = value("--store=")) a.store = v2;
        else if (auto v3 = value("--hostname=")) a.hostname = v3;
        else if (auto v4 = value("--min_bytes=")) a.min_bytes = std::strtoull(v4, nullptr, 10);
        else if (auto v5 = value("--max_bytes=")) a.max_bytes = std::strtoull(v5, nullptr, 10);
        else if (auto v6 = value("--budget_mb=")) a.budget_mb = std::strtoull(v6, nullptr, 10);
        else {
            std::fprintf(stderr, "bench_allreduce: unknown argument %s\n", argv[i]);
            std::exit(2);
        }
    }
    if (a.world < 1 || a.min_bytes < 4 || a.max_bytes < a.min_bytes) {
        std::fprintf(stderr, "bench_allreduce: need --world >= 1 and 4 <= --min_bytes <= --max_bytes\n");
        std::exit(2);
    }
    return a;
}

/// Starts `world` ranks of this program and waits for them; rank 0's stdout is ours.
int launch(const Args& a, char** argv) {
    char pattern[] = "/tmp/olmax-bench-allreduce-XXXXXX";
    if (!mkdtemp(pattern)) {
        std::perror("bench_allreduce: mkdtemp");
        return 1;
    }
    const std::string store = std::string(pattern) + "/store";
    std::vector<pid_t> pids;
    for (int r = 0; r < a.world; ++r) {
        std::vector<std::string> args{argv[0], "--rank=" + std::to_string(r), "--world=" + std::to_string(a.world), "--store=" + store,
                                      "--min_bytes=" + std::to_string(a.min_bytes), "--max_bytes=" + std::to_string(a.max_bytes),
                                      "--budget_mb=" + std::to_string(a.budget_mb)};
        std::vector<char*> raw;
        for (auto& s : args) raw.push_back(s.data());
        raw.push_back(nullptr);
        pid_t pid = 0;
        if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, raw.data(), environ) != 0) {
            std::perror("bench_allreduce: posix_spawn");
            return 1;
        }
        pids.push_back(pid);
    }
    int failed = 0;
    for (pid_t pid : pids) {
        int status = 0;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
    }
    std::error_code ec;
    std::filesystem::remove_all(pattern, ec);
    if (failed) std::fprintf(stderr, "bench_allreduce: %d rank(s) failed\n", failed);
    return failed ? 1 : 0;
}

/// Seconds per call of `op` (after one warm-up), measured between barriers.
double time_per_call(dist::Communicator& comm, int iterations, const std::function<void()>& op) {
    op();
    comm.barrier();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) op();
    comm.barrier();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iterations;
}

int run_rank(const Args& a) {
    dist::GlooOptions options;
    options.rank = a.rank;
    options.world_size = a.world;
    options.store_path = a.store;
    options.hostname = a.hostname;
    options.timeout = std::chrono::seconds(120);
    dist::GlooCommunicator comm(options);
    const int N = comm.world_size();

    std::vector<float> data(a.max_bytes / sizeof(float));
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = float(i % 1000) * 1e-3f;
    std::string json = "{\n  \"benchmark\": \"allreduce float32\",\n  \"world_size\": " + std::to_string(N) +
                       ",\n  \"hardware_concurrency\": " + std::to_string(std::thread::hardware_concurrency()) + ",\n  \"results\": [";
    bool first = true;
    for (std::size_t bytes = a.min_bytes; bytes <= a.max_bytes; bytes *= 4) {
        const std::size_t n = bytes / sizeof(float);
        const int iterations = int(std::clamp<std::size_t>((a.budget_mb << 20) / bytes, 3, 1000));
        std::span<float> message(data.data(), n);
        const double olmax_s = time_per_call(comm, iterations, [&] { comm.allreduce(message, dist::Reduction::mean); });
        const double ring_s = time_per_call(comm, iterations, [&] {
            gloo::AllreduceOptions ring(comm.gloo_context());
            ring.setOutput(message.data(), n);
            ring.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
            ring.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&gloo::sum<float>));
            gloo::allreduce(ring);
        });
        for (auto [name, s] : {std::pair<const char*, double>{"olmax_rank_order", olmax_s}, {"gloo_ring_sum", ring_s}}) {
            const double algbw = double(bytes) / s / 1e9;
            char line[400];
            std::snprintf(line, sizeof line,
                          "%s\n    {\"algorithm\": \"%s\", \"bytes\": %zu, \"iterations\": %d, \"seconds_per_call\": %.6e, "
                          "\"algbw_GBps\": %.4f, \"busbw_GBps\": %.4f}",
                          first ? "" : ",", name, bytes, iterations, s, algbw, algbw * 2.0 * (N - 1) / N);
            json += line;
            first = false;
        }
    }
    json += "\n  ]\n}\n";
    if (comm.rank() == 0) std::fputs(json.c_str(), stdout);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Args a = parse(argc, argv);
        if (a.rank < 0) return launch(a, argv);
        if (a.store.empty()) {
            std::fprintf(stderr, "bench_allreduce: --rank needs --store\n");
            return 2;
        }
        return run_rank(a);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_allreduce: %s\n", e.what());
        return 1;
    }
}
