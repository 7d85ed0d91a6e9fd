// Streaming stores in the scans (olmax/scan/detail/streaming_store.hpp): the fp32 [B, T, C]
// sequential_vectorized scan with its outputs written by ordinary stores against streaming
// stores, at sizes from 256 KiB to 256 MiB per array, alternating in one run:
//   fwd          h = scan(a, x)
//   fwd + read   h = scan(a, x), then olmax::sum(h): the next op reads h, which ordinary stores
//                may have left in the cache and streaming stores do not
//   bwd          dx, da = scan_backward(a, h, dh)
// Median of the repeats; the ratio ordinary / streaming (> 1: streaming faster). The library
// streams from its threshold (4 MiB of output) up; this program sets the threshold to 0 or to
// "never" to time both sides at every size.
//
//   cmake --build build --target scan_streaming_stores
//   build/benchmarks/scan/scan_streaming_stores [--threads N] [--repeats N] [--reverse] [--json PATH]
// (--reverse: reverse scans, whose time walks down in memory)
#include <olmax/olmax.hpp>
#include <olmax/scan/scan.hpp>

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace sc = olmax::scan;
using olmax::Tensor;

namespace {

double median_seconds(int repeats, const std::function<void()>& f) {
    f();  // warm-up: the allocator's buffers, the pages
    std::vector<double> s;
    for (int r = 0; r < repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        f();
        s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    int threads = 2, repeats = 9;
    bool reverse = false;
    std::string json;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "scan_streaming_stores: %s needs a value\n", arg.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (arg == "--threads") threads = std::atoi(value().c_str());
        else if (arg == "--repeats") repeats = std::atoi(value().c_str());
        else if (arg == "--json") json = value();
        else if (arg == "--reverse") reverse = true;
        else {
            std::printf("usage: scan_streaming_stores [--threads N] [--repeats N] [--reverse] [--json PATH]\n");
            return arg == "--help" ? 0 : 2;
        }
    }
    if (threads < 1 || repeats < 1) {
        std::fprintf(stderr, "scan_streaming_stores: --threads and --repeats must be >= 1\n");
        return 2;
    }
    omp_set_num_threads(threads);
    auto& threshold = sc::detail::streaming_store_threshold();
    const std::size_t C = 1024;
    struct Row {
        std::size_t B, T;
        double fwd[2], read[2], bwd[2];  // [ordinary, streaming]
    };
    std::vector<Row> rows;
    const sc::ScanOptions<float> options{.reverse = reverse};
    std::printf("fp32 [B, T, %zu] sequential_vectorized%s, %d threads, median of %d; ordinary / streaming seconds\n", C,
                reverse ? ", reverse" : "", threads, repeats);
    std::printf("%5s %6s %10s | %9s %9s %5s | %9s %9s %5s | %9s %9s %5s\n", "B", "T", "KiB/array", "fwd", "stream", "x", "fwd+read",
                "stream", "x", "bwd", "stream", "x");
    olmax::Generator rng(1);
    for (const auto& [B, T] : std::vector<std::pair<std::size_t, std::size_t>>{{1, 64}, {1, 256}, {1, 1024}, {4, 1024}, {16, 1024}, {16, 4096}}) {
        const Tensor<float> a = olmax::rand<float>({B, T, C}, rng), x = olmax::rand<float>({B, T, C}, rng), dh = olmax::rand<float>({B, T, C}, rng);
        Row row{B, T, {}, {}, {}};
        double sink = 0;
        for (int side = 0; side < 2; ++side) {
            threshold = side == 0 ? std::numeric_limits<std::size_t>::max() : 0;
            const Tensor<float> h = sc::scan<sc::sequential_vectorized>(a, x, options);
            row.fwd[side] = median_seconds(repeats, [&] { sink += double(sc::scan<sc::sequential_vectorized>(a, x, options).data()[0]); });
            row.read[side] = median_seconds(repeats, [&] { sink += double(olmax::sum(sc::scan<sc::sequential_vectorized>(a, x, options)).item()); });
            row.bwd[side] = median_seconds(repeats, [&] { sink += double(sc::scan_backward<sc::sequential_vectorized>(a, h, dh, options).x.data()[0]); });
        }
        threshold = std::size_t(4) << 20;
        std::printf("%5zu %6zu %10zu | %9.3e %9.3e %5.2f | %9.3e %9.3e %5.2f | %9.3e %9.3e %5.2f%s\n", B, T, B * T * C * 4 / 1024, row.fwd[0],
                    row.fwd[1], row.fwd[0] / row.fwd[1], row.read[0], row.read[1], row.read[0] / row.read[1], row.bwd[0], row.bwd[1],
                    row.bwd[0] / row.bwd[1], "");
        rows.push_back(row);
        volatile double keep = sink;  // the results are used
        (void)keep;
    }
    if (!json.empty()) {
        std::ofstream out(json);
        out << "{\"threads\": " << threads << ", \"reverse\": " << (reverse ? "true" : "false") << ", \"repeats\": " << repeats << ", \"channels\": " << C << ", \"rows\": [";
        for (std::size_t i = 0; i < rows.size(); ++i) {
            const Row& r = rows[i];
            out << (i ? ", " : "") << "{\"B\": " << r.B << ", \"T\": " << r.T << ", \"bytes_per_array\": " << r.B * r.T * C * 4
                << ", \"fwd_ordinary_s\": " << r.fwd[0] << ", \"fwd_streaming_s\": " << r.fwd[1] << ", \"fwd_read_ordinary_s\": " << r.read[0]
                << ", \"fwd_read_streaming_s\": " << r.read[1] << ", \"bwd_ordinary_s\": " << r.bwd[0] << ", \"bwd_streaming_s\": " << r.bwd[1] << "}";
        }
        out << "]}\n";
        if (!out) {
            std::fprintf(stderr, "scan_streaming_stores: could not write %s\n", json.c_str());
            return 1;
        }
    }
}
