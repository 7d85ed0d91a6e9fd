// Allreduce bandwidth against message size (float32, sum) between the processes of one MPI job, for
// olmax's deterministic allreduce over MPI (MpiCommunicator) beside MPI's own MPI_Allreduce and,
// when built with Gloo (olmax::distributed), olmax's allreduce over Gloo beside Gloo's own ring
// allreduce, all four in the same processes and the same run. Prints JSON on stdout (rank 0).
//
//   mpirun -n 2 bench_allreduce_mpi [--min_bytes=N] [--max_bytes=N] [--budget_mb=N] [--repeats=N]
//
// (as root Open MPI's mpirun also wants --allow-run-as-root, with more ranks than cores
// --oversubscribe). The Gloo communicator meets its peers through a file store in a temporary
// folder that rank 0 creates and broadcasts over MPI, so all ranks must share a file system (one
// machine); its TCP connections use 127.0.0.1 unless --hostname=H.
//
// Per size, `repeats` rounds; in each round every algorithm in turn runs one warm-up call, then
// `iterations` calls between two barriers, timed on rank 0 (iterations = budget / size, 3 to 1000).
// Interleaving the algorithms spreads the load of a shared machine over all of them. Reported per
// algorithm: the median, minimum and maximum over the rounds of the seconds per call; algbw = bytes
// / median; busbw = algbw * 2 (N-1) / N, the bytes each rank sends per second (what a link carries
// in a bandwidth-optimal allreduce).

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <olmax/distributed/mpi.hpp>

#include "../timing.hpp"

#ifdef OLMAX_BENCH_WITH_GLOO
#include <gloo/allreduce.h>
#include <gloo/math.h>

#include <olmax/distributed/gloo.hpp>
#endif

namespace {

namespace dist = olmax::distributed;
using olmax_bench::median;

struct Args {
    std::size_t min_bytes = std::size_t(4) << 10, max_bytes = std::size_t(64) << 20, budget_mb = 256;
    int repeats = 5;
    std::string hostname = "127.0.0.1";
};

bool parse(int argc, char** argv, Args& a) {
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        auto value = [&](std::string_view key) -> const char* { return arg.substr(0, key.size()) == key ? argv[i] + key.size() : nullptr; };
        if (auto v = value("--min_bytes=")) a.min_bytes = std::strtoull(v, nullptr, 10);
        else if (auto v1 = value("--max_bytes=")) a.max_bytes = std::strtoull(v1, nullptr, 10);
        else if (auto v2 = value("--budget_mb=")) a.budget_mb = std::strtoull(v2, nullptr, 10);
        else if (auto v3 = value("--repeats=")) a.repeats = std::atoi(v3);
        else if (auto v4 = value("--hostname=")) a.hostname = v4;
        else {
            std::fprintf(stderr, "bench_allreduce_mpi: unknown argument %s\n", argv[i]);
            return false;
        }
    }
    if (a.min_bytes < 4 || a.max_bytes < a.min_bytes || a.repeats < 1) {
        std::fprintf(stderr, "bench_allreduce_mpi: need 4 <= --min_bytes <= --max_bytes and --repeats >= 1\n");
        return false;
    }
    return true;
}

struct Algorithm {
    const char* name;
    std::function<void(std::span<float>)> call;
    std::vector<double> seconds;  // per round, seconds per call
};

int run(const Args& a) {
    dist::MpiOptions options;
    options.timeout = std::chrono::seconds(120);
    dist::MpiCommunicator mpi(options);
    const int N = mpi.world_size();
    std::vector<Algorithm> algorithms;
    algorithms.push_back({"olmax_rank_order_mpi", [&](std::span<float> m) { mpi.allreduce(m, dist::Reduction::sum); }, {}});
    algorithms.push_back({"mpi_allreduce_sum", [&](std::span<float> m) {
                              const int code = MPI_Allreduce(MPI_IN_PLACE, m.data(), int(m.size()), MPI_FLOAT, MPI_SUM, mpi.mpi_comm());
                              if (code != MPI_SUCCESS) throw dist::distributed_error("MPI_Allreduce failed: " + dist::detail::mpi_error_string(code));
                          },
                          {}});

#ifdef OLMAX_BENCH_WITH_GLOO
    // The Gloo rendezvous folder: made by rank 0, its name broadcast over MPI.
    std::vector<char> folder(256, '\0');
    if (mpi.rank() == 0) {
        std::string pattern = (std::filesystem::temp_directory_path() / "olmax-bench-allreduce-mpi-XXXXXX").string();
        if (pattern.size() >= folder.size() || !mkdtemp(pattern.data())) throw dist::distributed_error("cannot make a temporary folder");
        std::copy(pattern.begin(), pattern.end(), folder.begin());
    }
    mpi.broadcast(std::span<char>(folder), 0);
    const std::filesystem::path store = std::filesystem::path(folder.data());
    dist::GlooOptions gloo_options;
    gloo_options.rank = mpi.rank();
    gloo_options.world_size = N;
    gloo_options.store_path = store / "store";
    gloo_options.hostname = a.hostname;
    gloo_options.timeout = std::chrono::seconds(120);
    dist::GlooCommunicator gloo(gloo_options);
    mpi.barrier();
    if (mpi.rank() == 0) {
        std::error_code ec;
        std::filesystem::remove_all(store, ec);
    }
    algorithms.push_back({"olmax_rank_order_gloo", [&](std::span<float> m) { gloo.allreduce(m, dist::Reduction::sum); }, {}});
    algorithms.push_back({"gloo_ring_sum", [&](std::span<float> m) {
                              gloo::AllreduceOptions ring(gloo.gloo_context());
                              ring.setOutput(m.data(), m.size());
                              ring.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
                              ring.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&gloo::sum<float>));
                              gloo::allreduce(ring);
                          },
                          {}});
#endif

    std::vector<float> data(a.max_bytes / sizeof(float));
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = float(i % 1000) * 1e-3f;
    std::string json = "{\n  \"benchmark\": \"allreduce float32 sum\",\n  \"world_size\": " + std::to_string(N) +
                       ",\n  \"hardware_concurrency\": " + std::to_string(std::thread::hardware_concurrency()) +
                       ",\n  \"repeats\": " + std::to_string(a.repeats) + ",\n  \"results\": [";
    bool first = true;
    for (std::size_t bytes = a.min_bytes; bytes <= a.max_bytes; bytes *= 4) {
        const std::size_t n = bytes / sizeof(float);
        const int iterations = int(std::clamp<std::size_t>((a.budget_mb << 20) / bytes, 3, 1000));
        std::span<float> message(data.data(), n);
        for (auto& algorithm : algorithms) algorithm.seconds.clear();
        for (int round = 0; round < a.repeats; ++round)
            for (auto& algorithm : algorithms) {
                // Sums double the values each call; restart from finite ones (not timed).
                std::fill(message.begin(), message.end(), 1e-3f);
                algorithm.call(message);
                mpi.barrier();
                const auto start = std::chrono::steady_clock::now();
                for (int i = 0; i < iterations; ++i) algorithm.call(message);
                mpi.barrier();
                algorithm.seconds.push_back(olmax_bench::seconds_since(start) / iterations);
            }
        for (const auto& algorithm : algorithms) {
            const double s = median(algorithm.seconds);
            const auto [lo, hi] = std::minmax_element(algorithm.seconds.begin(), algorithm.seconds.end());
            const double algbw = double(bytes) / s / 1e9;
            char line[512];
            std::snprintf(line, sizeof line,
                          "%s\n    {\"algorithm\": \"%s\", \"bytes\": %zu, \"iterations\": %d, \"seconds_per_call_median\": %.6e, "
                          "\"seconds_per_call_min\": %.6e, \"seconds_per_call_max\": %.6e, \"algbw_GBps\": %.4f, \"busbw_GBps\": %.4f}",
                          first ? "" : ",", algorithm.name, bytes, iterations, s, *lo, *hi, algbw, algbw * 2.0 * (N - 1) / N);
            json += line;
            first = false;
        }
    }
    json += "\n  ]\n}\n";
    if (mpi.rank() == 0) std::fputs(json.c_str(), stdout);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Args a;
    if (!parse(argc, argv, a)) return 2;
    try {
        return run(a);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_allreduce_mpi: %s\n", e.what());
        return 1;
    }
}
