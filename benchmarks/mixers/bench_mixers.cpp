// olmax's sequence mixers, forward and forward + backward, at the shapes their PyTorch references
// (benchmarks/mixers/peer.py) run on: olmax::causal_attention, scan::gated_delta_rule and
// scan::ssd (Mamba-2), on float tensors: fp32 (variant "fp32") and, with --precision bf16, under
// the bf16 precision policy (variant "bf16": inside a backend::bf16_matmul_scope, where the ops'
// products round their operands to bfloat16 and sum in fp32, as PyTorch's bf16 autocast does).
// The bf16 rows name the form of those products ("bf16_gemm": "amx", AMX's tiles; "dot", the
// VDPBF16PS kernel; or "rounded", rounded float copies on the fp32 kernel): the CPU's fastest one,
// unless the environment variable OLMAX_BF16_GEMM_FORM=amx|dot|rounded picks one (to run, for
// instance, an AMD core's VDPBF16PS path on an Intel core that has AVX512-BF16).
//
// One timed run: fresh leaves (clones of fixed inputs, every input requiring grad; not timed), then
// out = op(inputs) [forward_ms stops here], loss = sum(out * dout) with a fixed random dout,
// loss.backward() [forward_backward_ms stops here]. Reported: medians over --runs runs after
// --warmups untimed ones. Threads: OpenMP's setting (OMP_NUM_THREADS).
//
// Memory rows (attention at T = 1k, 4k, 16k with B = 1, H = 2, Dh = 64; SSD at T = 16,384): one
// forward + backward; peak_tensor_bytes is the most olmax::memory counted (every tensor buffer:
// outputs, saved tensors, gradients, the ops' scratch tensors) above what was held before the
// forward (the inputs and dout); peak_rss_bytes is the rise of the process's resident set (VmHWM
// after, reset through /proc/self/clear_refs, minus VmRSS before; 0 when that cannot be read), the
// measure peer.py reports for PyTorch.
//
// Output: one JSON object per line, to stdout and to --json FILE when given.
// Usage: bench_mixers [--quick] [--runs N] [--warmups N] [--json FILE] [--no-memory] [--only attention|gated_delta|ssd]
//                     [--precision fp32|bf16|fp32,bf16]   (default fp32,bf16; the time rows)
#include <olmax/backend/bf16_matmul_kernels.hpp>
#include <olmax/backend/small_gemm_bf16.hpp>
#include <olmax/core/memory.hpp>
#include <olmax/core/random.hpp>
#include <olmax/ops/attention.hpp>
#include <olmax/ops/elementwise.hpp>
#include <olmax/ops/reduction.hpp>
#include <olmax/scan/gated_delta.hpp>
#include <olmax/scan/ssd.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "../timing.hpp"

using olmax::Tensor;
using F = float;

namespace {

struct Settings {
    std::size_t runs = 5, warmups = 1;
    bool quick = false, memory = true;
    std::string only, json_path;
    std::vector<std::string> precisions{"fp32", "bf16"};
};

std::string cpu_model() {
    std::ifstream in("/proc/cpuinfo");
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("model name", 0) == 0) {
            const auto colon = line.find(':');
            return colon == std::string::npos ? line : line.substr(line.find_first_not_of(' ', colon + 1));
        }
    }
    return "unknown";
}

/// A line "Key:   1234 kB" of /proc/self/status, in bytes (0 when absent).
std::size_t status_bytes(const std::string& key) {
    std::ifstream in("/proc/self/status");
    for (std::string line; std::getline(in, line);) {
        if (line.rfind(key + ":", 0) == 0) return std::strtoull(line.c_str() + key.size() + 1, nullptr, 10) * 1024;
    }
    return 0;
}

/// Resets VmHWM to the current resident set (Linux >= 4.0); false when refused.
bool reset_rss_peak() {
    std::ofstream out("/proc/self/clear_refs");
    out << "5";
    out.flush();
    return static_cast<bool>(out);
}

std::string escape(const std::string& s) {
    std::string r;
    for (char c : s) {
        if (c == '"' || c == '\\') r += '\\';
        r += c;
    }
    return r;
}

int threads() {
#if defined(_OPENMP)
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/// An op under test: fixed host inputs and dout, and the function from fresh leaves to its output.
struct Case {
    std::string op, shape;  // shape: a JSON object's text
    std::vector<Tensor<F>> inputs;
    Tensor<F> dout;
    std::function<Tensor<F>(const std::vector<Tensor<F>>&)> forward;
};

std::vector<Tensor<F>> leaves(const Case& c) {
    std::vector<Tensor<F>> x;
    for (const auto& t : c.inputs) x.push_back(olmax::parameter(t.clone()));
    return x;
}

struct Times {
    double forward = 0, total = 0;
};

/// One run: seconds to the end of the forward and to the end of the backward.
Times run_once(const Case& c) {
    const auto x = leaves(c);
    const auto t0 = std::chrono::steady_clock::now();
    const Tensor<F> out = c.forward(x);
    const double fwd = olmax_bench::seconds_since(t0);
    olmax::sum(olmax::mul(out, c.dout)).backward();
    return {fwd, olmax_bench::seconds_since(t0)};
}

class Output {
public:
    explicit Output(const std::string& path) {
        if (!path.empty()) file_.open(path);
    }
    void line(const std::string& s) {
        std::cout << s << std::endl;
        if (file_.is_open()) file_ << s << std::endl;
    }

private:
    std::ofstream file_;
};

std::string common_fields(const Case& c, const std::string& variant = "fp32") {
    std::ostringstream o;
    o << "\"impl\": \"olmax\", \"variant\": \"" << variant << "\", \"op\": \"" << c.op << "\", \"shape\": " << c.shape << ", \"threads\": " << threads()
      << ", \"cpu\": \"" << escape(cpu_model()) << "\"";
    return o.str();
}

void time_case(const Case& c, const Settings& s, Output& out, const std::string& precision) {
    std::optional<olmax::backend::bf16_matmul_scope> policy;
    if (precision == "bf16") policy.emplace();
    for (std::size_t w = 0; w < s.warmups; ++w) run_once(c);
    std::vector<double> fwd, total;
    for (std::size_t r = 0; r < s.runs; ++r) {
        const Times t = run_once(c);
        fwd.push_back(t.forward);
        total.push_back(t.total);
    }
    std::ostringstream o;
    o << "{\"kind\": \"time\", " << common_fields(c, precision) << ", \"runs\": " << s.runs << ", \"warmups\": " << s.warmups
      << (precision == "bf16" ? ", \"bf16_gemm\": \"" + std::string(olmax::backend::small_gemm_bf16_fastest_form()) + "\"" : std::string())
      << ", \"forward_ms\": " << 1e3 * olmax_bench::median(fwd) << ", \"forward_backward_ms\": " << 1e3 * olmax_bench::median(total)
      << ", \"loadavg\": \"" << olmax_bench::load_average() << "\"}";
    out.line(o.str());
}

void time_case(const Case& c, const Settings& s, Output& out) {
    for (const std::string& precision : s.precisions) time_case(c, s, out, precision);
}

void memory_case(const Case& c, Output& out) {
    olmax::memory::release_cached();  // so that the resident set grows with what this run allocates
    auto x = leaves(c);
    const std::size_t tensors_before = olmax::memory::stats().current_bytes;
    const bool rss_ok = reset_rss_peak();
    const std::size_t rss_before = status_bytes("VmRSS");
    olmax::memory::reset_peak();
    const auto t0 = std::chrono::steady_clock::now();
    {
        const Tensor<F> y = c.forward(x);
        olmax::sum(olmax::mul(y, c.dout)).backward();
    }
    const double seconds = olmax_bench::seconds_since(t0);
    const std::size_t tensor_peak = olmax::memory::stats().peak_bytes - tensors_before;
    const std::size_t rss_peak = status_bytes("VmHWM");
    std::size_t input_bytes = 0;
    for (const auto& t : c.inputs) input_bytes += t.size() * sizeof(F);
    std::ostringstream o;
    o << "{\"kind\": \"memory\", " << common_fields(c) << ", \"peak_tensor_bytes\": " << tensor_peak
      << ", \"peak_rss_bytes\": " << (rss_ok && rss_peak > rss_before ? rss_peak - rss_before : 0) << ", \"input_bytes\": " << input_bytes
      << ", \"seconds\": " << seconds << ", \"loadavg\": \"" << olmax_bench::load_average() << "\"}";
    out.line(o.str());
}

// ---- the cases ----

Case attention(std::size_t batch, std::size_t time, std::size_t heads, std::size_t dim) {
    olmax::Generator rng(1);
    Case c;
    c.op = "causal_attention";
    c.shape = "{\"B\": " + std::to_string(batch) + ", \"T\": " + std::to_string(time) + ", \"H\": " + std::to_string(heads) +
              ", \"Dh\": " + std::to_string(dim) + "}";
    for (int i = 0; i < 3; ++i) c.inputs.push_back(olmax::randn<F>({batch, time, heads, dim}, rng));
    c.dout = olmax::randn<F>({batch, time, heads, dim}, rng);
    c.forward = [](const std::vector<Tensor<F>>& x) { return olmax::causal_attention(x[0], x[1], x[2]); };
    return c;
}

/// q, k L2-normalised per head (as Gated DeltaNet feeds them; with |k| > sqrt 2 the rule diverges),
/// g = log decay in [-0.1, -0.01], beta in [0.1, 0.9].
Case gated_delta(std::size_t batch, std::size_t time, std::size_t heads, std::size_t dk, std::size_t dv, long chunk) {
    olmax::Generator rng(2);
    Case c;
    c.op = "gated_delta_rule";
    c.shape = "{\"B\": " + std::to_string(batch) + ", \"T\": " + std::to_string(time) + ", \"H\": " + std::to_string(heads) +
              ", \"K\": " + std::to_string(dk) + ", \"V\": " + std::to_string(dv) + ", \"chunk\": " + std::to_string(chunk) + "}";
    auto unit_rows = [&](Tensor<F> t) {
        const std::size_t rows = t.size() / dk;
        F* p = t.data();
        for (std::size_t r = 0; r < rows; ++r) {
            double n2 = 0;
            for (std::size_t i = 0; i < dk; ++i) n2 += double(p[r * dk + i]) * p[r * dk + i];
            const F inv = F(1 / std::sqrt(n2 + 1e-12));
            for (std::size_t i = 0; i < dk; ++i) p[r * dk + i] *= inv;
        }
        return t;
    };
    c.inputs.push_back(unit_rows(olmax::randn<F>({batch, time, heads, dk}, rng)));
    c.inputs.push_back(unit_rows(olmax::randn<F>({batch, time, heads, dk}, rng)));
    c.inputs.push_back(olmax::randn<F>({batch, time, heads, dv}, rng));
    c.inputs.push_back(olmax::rand<F>({batch, time, heads}, rng, F(-0.1), F(-0.01)));
    c.inputs.push_back(olmax::rand<F>({batch, time, heads}, rng, F(0.1), F(0.9)));
    c.dout = olmax::randn<F>({batch, time, heads, dv}, rng);
    c.forward = [chunk](const std::vector<Tensor<F>>& x) {
        return olmax::scan::gated_delta_rule(x[0], x[1], x[2], x[3], x[4], Tensor<F>(), Tensor<F>(), {.chunk = chunk}).o;
    };
    return c;
}

/// Mamba-2's initialisation ranges: dt in [0.001, 0.1], A in [-16, -1]; D in [0.5, 1.5].
Case ssd(std::size_t batch, std::size_t time, std::size_t heads, std::size_t p, std::size_t n, std::size_t groups, long chunk) {
    olmax::Generator rng(3);
    Case c;
    c.op = "ssd";
    c.shape = "{\"B\": " + std::to_string(batch) + ", \"T\": " + std::to_string(time) + ", \"H\": " + std::to_string(heads) +
              ", \"P\": " + std::to_string(p) + ", \"N\": " + std::to_string(n) + ", \"G\": " + std::to_string(groups) +
              ", \"chunk\": " + std::to_string(chunk) + "}";
    c.inputs.push_back(olmax::randn<F>({batch, time, heads, p}, rng));
    c.inputs.push_back(olmax::rand<F>({batch, time, heads}, rng, F(0.001), F(0.1)));
    c.inputs.push_back(olmax::rand<F>({heads}, rng, F(-16), F(-1)));
    c.inputs.push_back(olmax::randn<F>({batch, time, groups, n}, rng));
    c.inputs.push_back(olmax::randn<F>({batch, time, groups, n}, rng));
    c.inputs.push_back(olmax::rand<F>({heads}, rng, F(0.5), F(1.5)));
    c.dout = olmax::randn<F>({batch, time, heads, p}, rng);
    c.forward = [chunk](const std::vector<Tensor<F>>& x) {
        return olmax::scan::ssd(x[0], x[1], x[2], x[3], x[4], x[5], {.chunk = chunk}).y;
    };
    return c;
}

}  // namespace

int main(int argc, char** argv) {
    Settings s;
    const char* usage =
        "usage: bench_mixers [--quick] [--runs N] [--warmups N] [--json FILE] [--no-memory] [--only attention|gated_delta|ssd] "
        "[--precision fp32|bf16|fp32,bf16]";
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        const bool has_value = i + 1 < argc;
        if (a == "--quick") {
            s.quick = true;
            s.runs = 1;
            s.warmups = 0;
        } else if (a == "--runs" && has_value) {
            s.runs = std::strtoul(argv[++i], nullptr, 10);
        } else if (a == "--warmups" && has_value) {
            s.warmups = std::strtoul(argv[++i], nullptr, 10);
        } else if (a == "--json" && has_value) {
            s.json_path = argv[++i];
        } else if (a == "--no-memory") {
            s.memory = false;
        } else if (a == "--only" && has_value) {
            s.only = argv[++i];
        } else if (a == "--precision" && has_value) {
            const std::string v = argv[++i];
            if (v == "fp32" || v == "bf16") s.precisions = {v};
            else if (v == "fp32,bf16") s.precisions = {"fp32", "bf16"};
            else {
                std::cerr << "bench_mixers: --precision takes fp32, bf16 or fp32,bf16, not '" << v << "'\n";
                return 2;
            }
        } else {
            std::cerr << "bench_mixers: unknown argument '" << a << "' (" << usage << ")\n";
            return 2;
        }
    }
    try {
        (void)olmax::backend::small_gemm_bf16_fastest_form();  // a wrong OLMAX_BF16_GEMM_FORM is refused here, before any run
    } catch (const olmax::value_error& e) {
        std::cerr << "bench_mixers: " << e.what() << "\n";
        return 2;
    }
    auto wanted = [&](const std::string& op) { return s.only.empty() || s.only == op; };
    Output out(s.json_path);
    const std::size_t scale = s.quick ? 16 : 1;  // --quick: T / 16, a smoke run

    if (s.memory) {
        if (wanted("attention"))
            for (std::size_t t : {1024, 4096, 16384}) memory_case(attention(1, t / scale, 2, 64), out);
        if (wanted("ssd")) memory_case(ssd(1, 16384 / scale, 8, 64, 64, 1, 64), out);
    }
    if (wanted("attention"))
        for (std::size_t t : {1024, 2048, 4096}) time_case(attention(1, t / scale, 8, 64), s, out);
    if (wanted("gated_delta"))
        for (std::size_t d : {64, 128}) time_case(gated_delta(1, 2048 / scale, 8, d, d, 64), s, out);
    if (wanted("ssd")) time_case(ssd(1, 2048 / scale, 8, 64, 64, 1, 64), s, out);
    return 0;
}
