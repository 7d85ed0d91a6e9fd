// Scan strategy benchmark: every strategy x backend x direction on the same data, the machine's
// roofline (STREAM triad for the forward's 2 reads + 1 write, a 3-read/2-write kernel for the
// backward) measured in the same run, and PyTorch CPU peers (benchmarks/scan/torch_peers.py, run
// with /usr/bin/python3 and the same thread count) merged into the same report.
//
//   scan_strategies [--quick | --smoke] [--json PATH] [--threads N] [--no-peers] [--python PATH]
//                   [--peers-script PATH] [--filter TEXT]        (--help says what each does)
//
// Output: a legend, one table (olmax rows as they are measured, then the PyTorch peers), the notices
// that came up while measuring, and a closing summary: the fastest strategy for each shape and
// direction, with its fraction of the roofline.
//
// Timings are of the kernels on preallocated buffers (forward: run_forward; backward: the fused
// reverse scan writing dx and da), median of repeats after one warm-up run. Useful traffic:
// forward 3 values per element (read a, read x, write h), backward 5 (read dh, a, h; write dx, da);
// 4 bytes a value in float32 rows, 2 in the bfloat16 rows (float carries, same kernels).
#include <olmax/olmax.hpp>
#include <olmax/backend/bf16_matmul_kernels.hpp>
#include <olmax/scan/scan.hpp>
#if defined(OLMAX_BENCH_WITH_ONEDNN)
#include <olmax/backend/onednn_gemm.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <unistd.h>
#include <vector>

#include "../timing.hpp"

namespace sc = olmax::scan;
using olmax::Tensor;

namespace {

struct Row {
    std::string strategy, backend, direction;
    std::size_t B, T, C;
    std::string dtype = "float32";
    double seconds, gbps, roofline_gbps, roofline_fraction, gelem_per_s, max_rel_err;
};

/// A JSON number; non-finite values as Python's json module writes them (Infinity, NaN).
std::string json_number(double v) {
    if (std::isnan(v)) return "NaN";
    if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
    std::ostringstream o;
    o.precision(6);
    o << v;
    return o.str();
}

std::string json_row(const Row& r) {
    std::ostringstream o;
    o.precision(6);
    o << "{\"strategy\": \"" << r.strategy << "\", \"backend\": \"" << r.backend << "\", \"direction\": \"" << r.direction
      << "\", \"B\": " << r.B << ", \"T\": " << r.T << ", \"C\": " << r.C << ", \"dtype\": \"" << r.dtype << "\", \"seconds\": " << r.seconds
      << ", \"gbps\": " << r.gbps << ", \"roofline_gbps\": " << r.roofline_gbps << ", \"roofline_fraction\": " << r.roofline_fraction
      << ", \"gelem_per_s\": " << r.gelem_per_s << ", \"max_rel_err\": " << json_number(r.max_rel_err) << "}";
    return o.str();
}

/// A row label "chunked_matmul<128>[bf16][shared P=64]" as its strategy and its variant
/// ("bf16, shared P=64"): two columns, so that long labels keep the table aligned.
std::pair<std::string, std::string> split_label(const std::string& label) {
    const std::size_t bracket = label.find('[');
    if (bracket == std::string::npos) return {label, "-"};
    std::string variant;
    for (std::size_t i = bracket; i < label.size(); ++i) {
        if (label[i] == '[') continue;
        variant += label[i] == ']' ? (i + 1 < label.size() ? std::string(", ") : std::string()) : std::string(1, label[i]);
    }
    return {label.substr(0, bracket), variant};
}

constexpr const char* row_format = "%-26s %-26s %-10s %-3s %4zu %9zu %5zu %10.3e %7.2f %5.2f %7.3f %9.2e\n";

void print_header() {
    std::printf("%-26s %-26s %-10s %-3s %4s %9s %5s %10s %7s %5s %7s %9s\n", "strategy", "variant", "backend", "dir", "B", "T", "C", "seconds",
                "GB/s", "roof", "Gelem/s", "rel_err");
}

void print_row(const Row& r) {
    const auto [strategy, variant] = split_label(r.strategy);
    std::printf(row_format, strategy.c_str(), variant.c_str(), r.backend.c_str(), r.direction.c_str(), r.B, r.T, r.C, r.seconds, r.gbps,
                r.roofline_fraction, r.gelem_per_s, r.max_rel_err);
    std::fflush(stdout);
}

const char* const legend = R"(columns:
  strategy, variant  the scan algorithm (olmax/scan/strategies.hpp) and what differs from the plain fp32 run:
                     bf16 = bfloat16 storage with float carries; shared P=n = one gate per head of n channels
                     (gates [B, T, C/n]); gates=0.9999 = every gate that value (products near the denormal range);
                     onednn = bf16 products on oneDNN's kernels (the CPU's bf16 units)
  backend            the host kernels: cpu_openmp (all threads), cpu_serial (one); pytorch = a PyTorch CPU peer
  dir                fwd = h from (a, x); bwd = dx and da from (dh, a, h), the fused reverse scan
  B, T, C            batch, time steps, channels ([B, T, C], channels contiguous)
  seconds            median of the timed runs after one warm-up, kernels on preallocated buffers
  GB/s               useful traffic / seconds: fwd reads a, x and writes h (12 B per element in fp32),
                     bwd reads dh, a, h and writes dx, da (20 B); half that in bf16
  roof               GB/s as a fraction of this machine's roofline, measured in the same run: STREAM triad
                     (2 reads, 1 write) for fwd, a 3-read/2-write kernel for bwd; above 1 = the data fit in cache
  Gelem/s            elements (B T C) per nanosecond
  rel_err            max |result - fp64 reference| / max |reference| (bwd: the worse of dx and da)
)";

/// Median of `repeats` timed runs after one warm-up (fewer repeats for long runs).
double time_median(const std::function<void()>& f, int repeats) {
    const double first = olmax_bench::median_seconds(1, 0, f);  // the warm-up
    if (first > 2.0) repeats = 1;
    else if (first > 0.5) repeats = std::min(repeats, 3);
    return olmax_bench::median_seconds(std::size_t(repeats), 0, f);
}

/// Parallel first-touch buffer of n floats.
struct Buffer {
    Tensor<float> t;
    explicit Buffer(std::size_t n) : t(Tensor<float>::uninitialized({n})) {
        float* p = t.data();
#pragma omp parallel for schedule(static)
        for (std::size_t i = 0; i < n; ++i) p[i] = 1.0f;
    }
    float* data() { return t.data(); }
};

struct Roofline {
    double triad = 0, r3w2 = 0;
};

Roofline measure_roofline(std::size_t n) {
    Buffer a(n), b(n), c(n), d(n), e(n);
    float *pa = a.data(), *pb = b.data(), *pc = c.data(), *pd = d.data(), *pe = e.data();
    const float s = 0.5f;
    const double triad_s = time_median([&] {
#pragma omp parallel for simd schedule(static)
        for (std::size_t i = 0; i < n; ++i) pa[i] = pb[i] + s * pc[i];
    }, 10);
    const double r3w2_s = time_median([&] {
#pragma omp parallel for simd schedule(static)
        for (std::size_t i = 0; i < n; ++i) {
            const float x = pa[i], y = pb[i], z = pc[i];
            pd[i] = x + s * y;
            pe[i] = y * z;
        }
    }, 10);
    return {3.0 * 4 * double(n) / triad_s / 1e9, 5.0 * 4 * double(n) / r3w2_s / 1e9};
}

struct Problem {
    std::size_t B, T, C, H;  // H = gate channels (C for per-channel gates)
    float gate_value;        // < 0: uniform (0, 1) gates
    Tensor<float> a, x, dh, h_ref, dx_ref, da_ref;
};

Problem make_problem(std::size_t B, std::size_t T, std::size_t C, std::size_t H, float gate_value) {
    Problem p{B, T, C, H, gate_value, {}, {}, {}, {}, {}, {}};
    olmax::Generator rng(42);
    p.a = gate_value < 0 ? olmax::rand<float>({B, T, H}, rng) : Tensor<float>({B, T, H}, gate_value);
    p.x = olmax::rand<float>({B, T, C}, rng, -1.0f, 1.0f);
    p.dh = olmax::rand<float>({B, T, C}, rng, -1.0f, 1.0f);
    return p;
}

template <class S, class Bk>
void forward_kernel(const sc::detail::Geometry& g, const Problem& p, Tensor<float>& h, std::size_t chunk) {
    olmax::backend::host_kernels_scope on_kernels(olmax::backend::kernels<Bk>());
    sc::detail::run_forward<S>(g, sc::detail::ForwardArgs<float>{p.a.data(), p.x.data(), nullptr, h.data(), nullptr}, chunk);
}

template <class S, class Bk>
void backward_kernel(const sc::detail::Geometry& g, const Problem& p, const Tensor<float>& h, Tensor<float>& dx, Tensor<float>& da,
                     std::size_t chunk) {
    olmax::backend::host_kernels_scope on_kernels(olmax::backend::kernels<Bk>());
    sc::detail::run_backward<S>(
        g, sc::detail::BackwardArgs<float>{p.dh.data(), nullptr, p.a.data(), h.data(), nullptr, dx.data(), da.data(), nullptr}, chunk);
}

double normwise_error(const Tensor<float>& got, const Tensor<float>& ref) {
    double err = 0, scale = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        err = std::max(err, std::abs(double(got.data()[i]) - double(ref.data()[i])));
        scale = std::max(scale, std::abs(double(ref.data()[i])));
        if (std::isnan(got.data()[i])) err = INFINITY;
    }
    return scale > 0 ? err / scale : err;
}

/// The fp64-accumulated backward from a given saved h (the reference's own, or a rounded copy).
void compute_reference_backward(Problem& p, const Tensor<float>& h) {
    const auto g = sc::detail::make_geometry<float>("reference", p.a, p.x, {});
    p.dx_ref = Tensor<float>::uninitialized(p.x.shape());
    p.da_ref = Tensor<float>::uninitialized(p.x.shape());
    backward_kernel<sc::sequential_fp64, olmax::backend::cpu_openmp>(g, p, h, p.dx_ref, p.da_ref, 0);
}

void compute_reference(Problem& p) {
    const auto g = sc::detail::make_geometry<float>("reference", p.a, p.x, {});
    p.h_ref = Tensor<float>::uninitialized(p.x.shape());
    forward_kernel<sc::sequential_fp64, olmax::backend::cpu_openmp>(g, p, p.h_ref, 0);
    compute_reference_backward(p, p.h_ref);
}

/// A row's strategy label: the strategy with its chunk, sharing and a suffix.
template <class S>
std::string label(const Problem& p, const std::string& suffix) {
    std::ostringstream out;  // (ostringstream: GCC 12's -Wrestrict misfires on chained string +)
    out << S::name;
    if constexpr (requires { S::chunk; })
        if (!std::is_same_v<S, sc::log_space>) out << '<' << S::chunk << '>';
    if (p.H != p.C) out << "[shared P=" << p.C / p.H << ']';
    out << suffix;
    return out.str();
}

struct Bench {
    Roofline roof;
    int repeats;
    std::string filter;
    std::vector<Row> rows;

    template <class S, class Bk>
    void run(Problem& p, const std::string& label_suffix = "", bool backward = true) {
        const auto g = sc::detail::make_geometry<float>("bench", p.a, p.x, {});
        const std::size_t chunk = sc::detail::default_chunk<S>();
        const std::size_t n = p.B * p.T * p.C;
        const std::string name = label<S>(p, label_suffix);
        if (!filter.empty() && name.find(filter) == std::string::npos) return;
        auto h = Tensor<float>::uninitialized(p.x.shape());
        const double fs = time_median([&] { forward_kernel<S, Bk>(g, p, h, chunk); }, repeats);
        const double fwd_bytes = double(n) * 4 * 2 + double(p.B * p.T * p.H) * 4;
        Row f{name, std::string(Bk::name), "fwd", p.B, p.T, p.C, "float32", fs, fwd_bytes / fs / 1e9, roof.triad, 0, double(n) / fs / 1e9,
              normwise_error(h, p.h_ref)};
        f.roofline_fraction = f.gbps / roof.triad;
        print_row(f);
        rows.push_back(f);
        if (!backward) return;
        auto dx = Tensor<float>::uninitialized(p.x.shape()), da = Tensor<float>::uninitialized(p.x.shape());
        const double bs = time_median([&] { backward_kernel<S, Bk>(g, p, p.h_ref, dx, da, chunk); }, repeats);
        const double bwd_bytes = double(n) * 4 * 4 + double(p.B * p.T * p.H) * 4;
        Row b{name, std::string(Bk::name), "bwd", p.B, p.T, p.C, "float32", bs, bwd_bytes / bs / 1e9, roof.r3w2, 0, double(n) / bs / 1e9,
              std::max(normwise_error(dx, p.dx_ref), p.H == p.C ? normwise_error(da, p.da_ref) : 0.0)};
        b.roofline_fraction = b.gbps / roof.r3w2;
        print_row(b);
        rows.push_back(b);
    }

    /// The same kernels on bfloat16 storage (float carries): half the bytes per element. The
    /// roofline is the fp32 triad / 3R2W in bytes, so the fraction compares bytes moved; the
    /// error is against the fp64 scan of the bf16-rounded inputs.
    template <class S, class Bk>
    /// `product`: run inside a bf16_matmul_scope with that bf16 GEMM (oneDNN's), so the matrix-unit
    /// form of chunked_matmul (gates shared by heads) multiplies on the CPU's bf16 units.
    void run_bf16(const Problem& p, const std::string& label_suffix = "", bool backward = true,
                  olmax::backend::Bf16MatmulKernels::Bf16Gemm product = {}) {
        using olmax::bfloat16;
        const std::string name = label<S>(p, "[bf16]" + label_suffix);
        if (!filter.empty() && name.find(filter) == std::string::npos) return;
        const Tensor<bfloat16> a = olmax::cast<bfloat16>(p.a), x = olmax::cast<bfloat16>(p.x), dh = olmax::cast<bfloat16>(p.dh);
        Problem wide{p.B, p.T, p.C, p.H, p.gate_value, olmax::cast<float>(a), olmax::cast<float>(x), olmax::cast<float>(dh), {}, {}, {}};
        compute_reference(wide);
        const auto g = sc::detail::make_geometry<bfloat16>("bench", a, x, {});
        const std::size_t chunk = sc::detail::default_chunk<S>();
        const std::size_t n = p.B * p.T * p.C;
        olmax::backend::host_kernels_scope on_kernels(olmax::backend::kernels<Bk>());
        std::optional<olmax::backend::bf16_matmul_scope> policy;
        if (product) policy.emplace(product);
        auto h = Tensor<bfloat16>::uninitialized(x.shape());
        const double fs = time_median([&] {
            sc::detail::run_forward<S>(g, sc::detail::ForwardArgs<bfloat16>{a.data(), x.data(), nullptr, h.data(), nullptr}, chunk);
        }, repeats);
        const double fwd_bytes = double(n) * 2 * 2 + double(p.B * p.T * p.H) * 2;
        Row f{name, std::string(Bk::name), "fwd", p.B, p.T, p.C, "bfloat16", fs, fwd_bytes / fs / 1e9, roof.triad, 0, double(n) / fs / 1e9,
              normwise_error(olmax::cast<float>(h), wide.h_ref)};
        f.roofline_fraction = f.gbps / roof.triad;
        print_row(f);
        rows.push_back(f);
        if (!backward) return;
        const Tensor<bfloat16> h_saved = olmax::cast<bfloat16>(wide.h_ref);
        compute_reference_backward(wide, olmax::cast<float>(h_saved));
        auto dx = Tensor<bfloat16>::uninitialized(x.shape()), da = Tensor<bfloat16>::uninitialized(x.shape());
        const double bs = time_median([&] {
            sc::detail::run_backward<S>(g, sc::detail::BackwardArgs<bfloat16>{dh.data(), nullptr, a.data(), h_saved.data(), nullptr, dx.data(),
                                                                              da.data(), nullptr}, chunk);
        }, repeats);
        const double bwd_bytes = double(n) * 2 * 4 + double(p.B * p.T * p.H) * 2;
        Row b{name, std::string(Bk::name), "bwd", p.B, p.T, p.C, "bfloat16", bs, bwd_bytes / bs / 1e9, roof.r3w2, 0, double(n) / bs / 1e9,
              std::max(normwise_error(olmax::cast<float>(dx), wide.dx_ref), normwise_error(olmax::cast<float>(da), wide.da_ref))};
        b.roofline_fraction = b.gbps / roof.r3w2;
        print_row(b);
        rows.push_back(b);
    }
};

/// Eigen's GEMM rate on the in-chunk sizes of the shared-gate matmul: [Q x Q] x [Q x P].
double eigen_gemm_gflops(std::size_t Q, std::size_t P, std::size_t reps) {
    Tensor<float> L({Q, Q}, 0.5f), X({Q, P}, 1.0f), H({Q, P});
    const double s = time_median([&] {
        for (std::size_t r = 0; r < reps; ++r)
            olmax::backend::cpu_serial::gemm(false, false, Q, P, Q, 1.0f, L.data(), Q, X.data(), P, 0.0f, H.data(), P);
    }, 5);
    return 2.0 * double(Q * Q * P) * double(reps) / s / 1e9;
}

}  // namespace

namespace {

const char* const usage = R"(usage: scan_strategies [--quick | --smoke] [--json PATH] [--threads N] [--no-peers] [--python PATH]
                       [--peers-script PATH] [--filter TEXT]

Times every scan strategy of olmax::scan (h_t = a_t h_{t-1} + x_t) forward and backward on a few shapes
(channel-rich 2^26 elements, one long row of 2^24 steps, a short in-cache one, gates shared by heads),
against this machine's memory roofline measured in the same run and PyTorch CPU peers, then names the
fastest strategy per shape. A full run takes minutes, --quick under one, --smoke seconds.

  --quick              fewer shapes and repeats (the figures in benchmarks/RESULTS.md)
  --smoke              tiny shapes, no peers: checks that everything runs (CI)
  --json PATH          also write every row as JSON (benchmarks/scan_strategies_plot.py plots it)
  --threads N          OpenMP threads (default: OMP_NUM_THREADS or all cores)
  --no-peers           skip the PyTorch peers (benchmarks/scan/torch_peers.py)
  --python PATH        the Python that runs the peers (default /usr/bin/python3, with torch)
  --peers-script PATH  where torch_peers.py is (default: next to this source file)
  --filter TEXT        only the olmax rows whose label (strategy[variant]) contains TEXT
  --help               this text and the legend of the table's columns
)";

/// A number field of a flat JSON object line (`"key": 1.5`), or NaN.
double json_number_field(const std::string& line, const std::string& key) {
    const std::size_t at = line.find("\"" + key + "\":");
    if (at == std::string::npos) return std::nan("");
    const std::string rest = line.substr(at + key.size() + 3);
    if (rest.find("Infinity") == 1 || rest.find("Infinity") == 0) return rest.find('-') < 2 ? -INFINITY : INFINITY;
    return std::strtod(rest.c_str(), nullptr);
}

/// A string field of a flat JSON object line (`"key": "text"`), or "".
std::string json_string_field(const std::string& line, const std::string& key) {
    const std::size_t at = line.find("\"" + key + "\": \"");
    if (at == std::string::npos) return "";
    const std::size_t start = at + key.size() + 5, end = line.find('"', start);
    return line.substr(start, end - start);
}

/// A peer row as torch_peers.py writes it (one JSON object per line).
Row peer_row(const std::string& line) {
    Row r{json_string_field(line, "strategy"), json_string_field(line, "backend"), json_string_field(line, "direction"),
          std::size_t(json_number_field(line, "B")), std::size_t(json_number_field(line, "T")), std::size_t(json_number_field(line, "C")),
          json_string_field(line, "dtype"), json_number_field(line, "seconds"), json_number_field(line, "gbps"),
          json_number_field(line, "roofline_gbps"), json_number_field(line, "roofline_fraction"), json_number_field(line, "gelem_per_s"),
          json_number_field(line, "max_rel_err")};
    return r;
}

/// The problem a row measured: its shape, direction, storage and the variant tags that change the
/// input (gates=..., shared P=...), not those that only change how it is computed (bf16 products, onednn).
std::string problem_of(const Row& r) {
    std::string tags;
    for (std::size_t open = r.strategy.find('['); open != std::string::npos; open = r.strategy.find('[', open + 1)) {
        const std::string tag = r.strategy.substr(open + 1, r.strategy.find(']', open) - open - 1);
        if (tag != "bf16" && tag != "onednn") tags += ", " + tag;
    }
    std::ostringstream out;
    out << "[" << r.B << ", " << r.T << ", " << r.C << "]" << tags << " " << r.dtype << " " << r.direction;
    return out.str();
}

/// "chunked_matmul<128> onednn / cpu_openmp": a row's strategy, the tags that say how it computed
/// (the problem names the others), and its backend.
std::string contender(const Row& r) {
    std::string out = split_label(r.strategy).first;
    if (r.strategy.find("[onednn]") != std::string::npos) out += " onednn";
    return out + " / " + r.backend;
}

/// For each problem (in the order first measured): the fastest olmax row, its roofline fraction, and
/// how it compares with the runner-up and with the fastest PyTorch peer.
void print_summary(const std::vector<Row>& rows) {
    std::vector<std::string> order;
    for (const Row& r : rows)
        if (std::find(order.begin(), order.end(), problem_of(r)) == order.end()) order.push_back(problem_of(r));
    std::printf("\nFastest per shape (olmax; roof = fraction of this run's roofline for that direction):\n");
    std::printf("%-44s %-40s %10s %5s  %s\n", "shape, storage, dir", "fastest strategy / backend", "seconds", "roof", "then");
    for (const std::string& problem : order) {
        const Row *best = nullptr, *second = nullptr, *peer = nullptr;
        for (const Row& r : rows) {
            if (problem_of(r) != problem || !(r.seconds > 0)) continue;
            if (r.backend == "pytorch") {
                if (!peer || r.seconds < peer->seconds) peer = &r;
            } else if (r.strategy.rfind("sequential_fp64", 0) != 0) {  // the reference is not a contender
                if (!best || r.seconds < best->seconds) second = best, best = &r;
                else if (!second || r.seconds < second->seconds) second = &r;
            }
        }
        if (!best) continue;
        std::ostringstream then;
        then.precision(2);
        then << std::fixed;
        if (second) then << "next " << contender(*second) << " " << second->seconds / best->seconds << "x slower";
        if (peer) then << (second ? "; " : "") << "best PyTorch " << peer->strategy << " " << peer->seconds / best->seconds << "x slower";
        std::printf("%-44s %-40s %10.3e %5.2f  %s\n", problem.c_str(), contender(*best).c_str(), best->seconds, best->roofline_fraction,
                    then.str().c_str());
    }
}

}  // namespace

int main(int argc, char** argv) {
    bool quick = false, smoke = false, peers = true;
    std::string json_path, filter, python = "/usr/bin/python3";
    std::filesystem::path script = std::filesystem::path(__FILE__).parent_path() / "torch_peers.py";
    int threads = 0;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--help" || arg == "-h") {
            std::printf("%s\n%s", usage, legend);
            return 0;
        }
        if (arg == "--quick") quick = true;
        else if (arg == "--smoke") smoke = quick = true, peers = false;
        else if (arg == "--no-peers") peers = false;
        else if (arg == "--json" && i + 1 < argc) json_path = argv[++i];
        else if (arg == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
        else if (arg == "--python" && i + 1 < argc) python = argv[++i];
        else if (arg == "--peers-script" && i + 1 < argc) script = argv[++i];
        else if (arg == "--filter" && i + 1 < argc) filter = argv[++i];
        else {
            std::fprintf(stderr, "scan_strategies: unknown or incomplete argument '%s'\n%s", arg.c_str(), usage);
            return 2;
        }
    }
#if defined(_OPENMP)
    if (threads > 0) omp_set_num_threads(threads);
    threads = omp_get_max_threads();
#else
    threads = 1;
#endif
    // Notices the library shows once (the portable bf16 product, ...) go after the table, not into it.
    std::vector<std::string> notices;
    olmax::backend::set_bf16_notice_sink([&notices](std::string_view message) { notices.emplace_back(message); });

    const auto start = std::chrono::steady_clock::now();
    Bench bench;
    bench.repeats = smoke ? 2 : quick ? 5 : 10;
    bench.filter = filter;
    bench.roof = measure_roofline(std::size_t(1) << (smoke ? 20 : 25));
    std::printf("scan strategies: h_t = a_t h_{t-1} + x_t, %d threads; roofline of this run: STREAM triad (2R1W) %.2f GB/s, "
                "3R2W %.2f GB/s (fp32 arrays of 2^%d, median of 10)%s\n\n%s\n",
                threads, bench.roof.triad, bench.roof.r3w2, smoke ? 20 : 25,
                smoke ? "\n--smoke: tiny shapes that fit in cache; the figures only show that everything runs" : "", legend);
    print_header();
    using omp = olmax::backend::cpu_openmp;
    using ser = olmax::backend::cpu_serial;

    // 4. (also the smoke run) every strategy on one shape: hillis_steele_chunked vs hillis_steele, the matmul forms.
    auto all_strategies = [&](Problem& p, bool serial_too) {
        bench.run<sc::sequential, omp>(p);
        bench.run<sc::sequential_fp64, omp>(p);
        bench.run<sc::sequential_vectorized, omp>(p);
        bench.run<sc::two_pass, omp>(p);
        bench.run<sc::hillis_steele, omp>(p);
        bench.run<sc::hillis_steele_chunked<128>, omp>(p);
        bench.run<sc::blelloch, omp>(p);
        bench.run<sc::chunked_matmul<128>, omp>(p);
        bench.run<sc::log_space, omp>(p);
        bench.run_bf16<sc::sequential_vectorized, omp>(p);
        bench.run_bf16<sc::two_pass, omp>(p);
        bench.run_bf16<sc::chunked_matmul<128>, omp>(p);
        if (serial_too) {
            bench.run<sc::sequential_vectorized, ser>(p);
            bench.run<sc::hillis_steele, ser>(p);
            bench.run<sc::hillis_steele_chunked<128>, ser>(p);
        }
    };
    double gemm_rate = 0, shared_rate = 0;
    if (smoke) {
        Problem p = make_problem(1, 512, 32, 32, -1);
        compute_reference(p);
        all_strategies(p, true);
        Problem shared = make_problem(2, 256, 64, 4, -1);
        compute_reference(shared);
        bench.run<sc::chunked_matmul<128>, omp>(shared, "", false);
        bench.run<sc::sequential_vectorized, omp>(shared, "", false);
        bench.run_bf16<sc::chunked_matmul<128>, omp>(shared, "", false);
    } else {
        // 1. Channel-rich, B*T*C = 2^26: the bandwidth targets.
        {
            Problem p = make_problem(16, 4096, 1024, 1024, -1);
            compute_reference(p);
            bench.run<sc::sequential_vectorized, omp>(p);
            bench.run<sc::two_pass, omp>(p, "", !quick);
            bench.run_bf16<sc::sequential_vectorized, omp>(p);
            bench.run_bf16<sc::two_pass, omp>(p, "", !quick);
            if (!quick) {
                bench.run<sc::sequential, omp>(p);
                bench.run<sc::sequential_vectorized, ser>(p);
                bench.run<sc::hillis_steele_chunked<128>, omp>(p);
                bench.run<sc::blelloch, omp>(p);
            }
        }
        // 2. Gates near 1 (products reach the denormal range): must run as fast as random gates.
        {
            Problem p = make_problem(16, 4096, 1024, 1024, 0.9999f);
            compute_reference(p);
            bench.run<sc::sequential_vectorized, omp>(p, "[gates=0.9999]");
            if (!quick) bench.run<sc::two_pass, omp>(p, "[gates=0.9999]", false);
        }
        // 3. One long row: the time-parallel strategy.
        {
            Problem p = make_problem(1, std::size_t(1) << 24, 1, 1, -1);
            compute_reference(p);
            bench.run<sc::two_pass, omp>(p);
            bench.run<sc::two_pass, ser>(p);
            bench.run<sc::sequential_vectorized, omp>(p);
            bench.run_bf16<sc::two_pass, omp>(p);
        }
        // 4. T = 4096, C = 256: every strategy.
        {
            Problem p = make_problem(1, 4096, 256, 256, -1);
            compute_reference(p);
            all_strategies(p, true);
        }
        // 5. Shared gates (one gate per head of 64 channels): the GEMM form vs the per-channel scans.
        {
            Problem p = make_problem(4, 4096, 1024, 16, -1);
            compute_reference(p);
            const std::size_t before = bench.rows.size();
            bench.run<sc::chunked_matmul<128>, omp>(p, "", false);
            if (bench.rows.size() > before)  // (not filtered out)
                shared_rate = 2.0 * 128 * double(p.B * p.T * p.C) / bench.rows.back().seconds / 1e9;  // in-chunk GEMM flops: 2 Q per element
            bench.run<sc::sequential_vectorized, omp>(p, "", false);
            bench.run<sc::two_pass, omp>(p, "", false);
            // The matrix-unit form in bf16 storage: decay matrices rounded to bf16, one bf16 x bf16 ->
            // fp32 GEMM per head and chunk; the portable product (fp32 compute), and oneDNN's on the
            // CPU's bf16 units where built with it.
            bench.run_bf16<sc::chunked_matmul<128>, omp>(p, "", false);
#if defined(OLMAX_BENCH_WITH_ONEDNN)
            if (olmax::backend::onednn::bf16_support().accelerated)
                bench.run_bf16<sc::chunked_matmul<128>, omp>(p, "[onednn]", false, olmax::backend::onednn::gemm_bf16);
#endif
            gemm_rate = eigen_gemm_gflops(128, 64, 2000) * threads;  // independent GEMMs, one per thread
        }
        if (!quick) {
            for (std::size_t T : {std::size_t(256), std::size_t(65536), std::size_t(1) << 20})
                for (std::size_t C : {std::size_t(1), std::size_t(64), std::size_t(4096)})
                    for (std::size_t B : {std::size_t(1), std::size_t(16)}) {
                        if (B * T * C > (std::size_t(1) << 26) || B * T * C < 4096) continue;
                        Problem p = make_problem(B, T, C, C, -1);
                        compute_reference(p);
                        bench.run<sc::sequential_vectorized, omp>(p);
                        bench.run<sc::two_pass, omp>(p);
                        if (B * T * C <= (std::size_t(1) << 22)) {
                            bench.run<sc::hillis_steele, omp>(p);
                            bench.run<sc::hillis_steele_chunked<128>, omp>(p);
                            bench.run<sc::blelloch, omp>(p);
                            bench.run<sc::chunked_matmul<128>, omp>(p);
                        }
                    }
        }
    }
    if (shared_rate > 0) {
        std::ostringstream note;
        note.precision(2);
        note << std::fixed << "shared-gate chunked_matmul<128>, P=64: " << shared_rate
             << " GFLOP/s (in-chunk GEMM flops / whole-scan time) vs Eigen GEMM [128x128]x[128x64] x " << threads << " threads "
             << gemm_rate << " GFLOP/s: fraction " << shared_rate / gemm_rate;
        notices.push_back(note.str());
    }

    // PyTorch peers, same shapes and threads: their rows join the table; their progress lines and
    // errors go to a log named among the notices.
    std::vector<std::string> peer_lines;
    if (peers) {
        std::ostringstream base;
        base << "/tmp/olmax_scan_torch_peers_" << ::getpid();
        const std::string out = base.str() + ".jsonl", log = base.str() + ".log";
        std::ostringstream cmd;
        cmd << python << " " << script << " --threads " << threads << " --triad " << bench.roof.triad << " --r3w2 " << bench.roof.r3w2
            << " --out " << out << (quick ? " --quick" : "") << " > " << log << " 2>&1";
        std::fflush(stdout);
        const int rc = std::system(cmd.str().c_str());
        if (rc != 0) notices.push_back("PyTorch peers failed (exit " + std::to_string(rc) + "; their output: " + log + "): " + cmd.str());
        else std::filesystem::remove(log);
        std::ifstream in(out);
        for (std::string line; std::getline(in, line);)
            if (!line.empty()) {
                peer_lines.push_back(line);
                bench.rows.push_back(peer_row(line));
                print_row(bench.rows.back());
            }
        std::filesystem::remove(out);
    }

    if (!notices.empty()) {
        std::printf("\nNotices:\n");
        for (const auto& notice : notices) std::printf("  %s\n", notice.c_str());
    }
    print_summary(bench.rows);

    if (!json_path.empty()) {
        std::ofstream out(json_path);
        out << "{\n  \"threads\": " << threads << ",\n  \"triad_gbps\": " << bench.roof.triad << ",\n  \"r3w2_gbps\": " << bench.roof.r3w2
            << ",\n  \"shared_gemm_fraction\": " << (gemm_rate > 0 ? shared_rate / gemm_rate : 0.0) << ",\n  \"rows\": [\n";
        bool first = true;
        for (const Row& r : bench.rows)
            if (r.backend != "pytorch") out << (first ? "" : ",\n") << "    " << json_row(r), first = false;
        for (const auto& line : peer_lines) out << (first ? "" : ",\n") << "    " << line, first = false;
        out << "\n  ]\n}\n";
        std::printf("\nwrote %s\n", json_path.c_str());
    }
    std::printf("total %.1f s\n", olmax_bench::seconds_since(start));
    return 0;
}
