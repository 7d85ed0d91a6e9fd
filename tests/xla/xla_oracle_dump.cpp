// Writes the StableHLO modules olmax's programs are made of, their inputs and independent CPU
// reference outputs into a folder, for tests/xla/run_xla_oracle.py to execute on a real XLA (jax's
// CPU backend) and for olmax_pjrt_oracle to run through olmax's own PJRT runtime, and compare.
// Usage: xla_oracle_dump <output folder>
//
// Every module comes from the one path programs take: the traced program's graph (olmax/xla/graph,
// emitted by graph::emit), its gradients recorded on the tape by the tracer (olmax/trace) where a
// case is a backward pass. Folder layout: manifest.txt (one block per case), <case>.mlir,
// <case>.in<i>.bin, <case>.out<i>.bin (raw little-endian float32, row-major). Expected outputs come
// from olmax's cpu_serial backend (GEMM) and a sequential double-precision scan written here
// (independent of include/olmax/scan and of the graph's own reference evaluation).
// compile_options.bin holds olmax's serialized CompileOptionsProto (what PJRT_Client_Compile gets).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "olmax/backend/cpu_serial.hpp"
#include "olmax/olmax.hpp"
#include "olmax/trace/trace.hpp"
#include "olmax/xla/xla.hpp"

namespace shlo = olmax::xla::stablehlo;
namespace gx = olmax::xla::graph;
namespace trace = olmax::trace;
namespace p = olmax::trace::primitives;
using olmax::backend::cpu_serial;
using Tf = olmax::Tensor<float>;

namespace {

using vec = std::vector<double>;

struct tensor {
    shlo::dims_t dims;
    vec data;
};

struct oracle_case {
    std::string name;
    std::string expect = "match";  // match | mismatch | compile_error
    std::string text;
    std::vector<tensor> inputs, outputs;
};

std::mt19937_64 rng(20260722);

vec uniform(std::size_t n, double lo, double hi) {
    std::uniform_real_distribution<double> d(lo, hi);
    vec v(n);
    for (auto& x : v) x = static_cast<float>(d(rng));  // exactly representable in f32
    return v;
}

std::size_t count(const shlo::dims_t& dims) {
    std::size_t n = 1;
    for (auto d : dims) n *= static_cast<std::size_t>(d);
    return n;
}

// ---- references -------------------------------------------------------------------------------

/// h_t = a_t h_{t-1} + x_t per row of [rows, T], from h0.
vec scan_reference(const vec& a, const vec& x, const vec& h0, std::size_t rows, std::size_t steps) {
    vec h(a.size());
    for (std::size_t r = 0; r < rows; ++r) {
        double state = h0[r];
        for (std::size_t t = 0; t < steps; ++t) h[r * steps + t] = state = a[r * steps + t] * state + x[r * steps + t];
    }
    return h;
}

/// delta_t = g_t + a_{t+1} delta_{t+1}; dx = delta; da_t = delta_t h_{t-1}; dh0 = a_0 delta_0.
void scan_backward_reference(const vec& a, const vec& h, const vec& h0, const vec& g, std::size_t rows, std::size_t steps, vec& dx, vec& da,
                             vec& dh0) {
    dx.assign(a.size(), 0);
    da.assign(a.size(), 0);
    dh0.assign(rows, 0);
    for (std::size_t r = 0; r < rows; ++r) {
        double delta = 0;
        for (std::size_t t = steps; t-- > 0;) {
            const double next_gate = t + 1 < steps ? a[r * steps + t + 1] : 0.0;
            delta = g[r * steps + t] + next_gate * delta;
            dx[r * steps + t] = delta;
            da[r * steps + t] = delta * (t == 0 ? h0[r] : h[r * steps + t - 1]);
        }
        dh0[r] = a[r * steps] * dx[r * steps];
    }
}

/// Row-major C[m,n] = op(A) op(B) through olmax's reference backend.
vec gemm(const vec& a, const vec& b, std::size_t m, std::size_t k, std::size_t n, bool ta = false, bool tb = false) {
    vec c(m * n);
    cpu_serial::gemm(ta, tb, m, n, k, 1.0, a.data(), ta ? m : k, b.data(), tb ? k : n, 0.0, c.data(), n);
    return c;
}

// ---- cases ------------------------------------------------------------------------------------

std::vector<shlo::scan_strategy> strategies() {
    return {shlo::scan_strategy::sequential(), shlo::scan_strategy::hillis_steele(), shlo::scan_strategy::chunked_matmul<128>()};
}

/// A module of one graph whose inputs have `dims` and whose results `f` makes.
template <class F>
std::string graph_module(const std::string& name, const std::vector<shlo::dims_t>& dims, F f) {
    gx::graph g;
    std::vector<gx::var> in;
    for (const auto& d : dims) in.push_back(g.input(gx::f32(d)));
    return gx::emit(g, name, f(in)).text;
}

/// The module of a traced program: per-call inputs of `shapes` (differentiable), results `f` makes
/// of them (it may run backward() on the tape).
template <class F>
std::string traced_module(const std::string& name, const std::vector<olmax::Shape>& shapes, F f) {
    trace::tracing t;
    std::vector<Tf> in;
    for (const auto& s : shapes) in.push_back(t.input<float>(s).set_requires_grad(true));
    return t.finish(f(in), name).module.text;
}

/// h0 [R] folded into the first step, as the ops' lowering rule does: x_0 + a_0 h0.
Tf with_initial_state(const Tf& a, const Tf& x, const Tf& h0) {
    const std::size_t rows = x.shape()[0], steps = x.shape()[1];
    const Tf start = p::pad(p::reshape(h0, {rows, 1}), {0, 0}, {0, std::int64_t(steps) - 1});
    return p::add(x, p::mul(a, start));
}

void add_scan_cases(std::vector<oracle_case>& cases) {
    const std::size_t rows = 3;
    for (std::size_t steps : {std::size_t{1}, std::size_t{129}, std::size_t{4096}}) {
        const std::size_t n = rows * steps;
        const vec a = uniform(n, 0.5, 1.0), x = uniform(n, -1, 1), h0 = uniform(rows, -1, 1), g = uniform(n, -1, 1);
        const vec h = scan_reference(a, x, h0, rows, steps);
        vec dx, da, dh0;
        scan_backward_reference(a, h, h0, g, rows, steps, dx, da, dh0);
        const shlo::dims_t rt{std::int64_t(rows), std::int64_t(steps)}, r{std::int64_t(rows)};
        const olmax::Shape srt{rows, steps}, sr{rows};
        const std::string size = std::to_string(rows) + "x" + std::to_string(steps);
        for (const auto& s : strategies()) {
            const std::string forward = traced_module("scan_forward", {srt, srt, sr}, [&](const std::vector<Tf>& in) {
                return std::vector<Tf>{p::linear_scan(in[0], with_initial_state(in[0], in[1], in[2]), s, false)};
            });
            cases.push_back({"scan_forward." + s.name() + "." + size, "match", forward, {{rt, a}, {rt, x}, {r, h0}}, {{rt, h}}});
            // The gradient the tape records for the scan (its primitive's rule: the adjoint scan run
            // the other way) and for the fold of h0.
            const std::string backward = traced_module("scan_backward", {srt, srt, sr, srt}, [&](const std::vector<Tf>& in) {
                p::linear_scan(in[0], with_initial_state(in[0], in[1], in[2]), s, false).backward(in[3]);
                return std::vector<Tf>{in[1].grad(), in[0].grad(), in[2].grad()};
            });
            cases.push_back({"scan_backward." + s.name() + "." + size, "match", backward, {{rt, a}, {rt, x}, {r, h0}, {rt, g}},
                             {{rt, dx}, {rt, da}, {r, dh0}}});
        }
    }
}

void add_matmul_cases(std::vector<oracle_case>& cases) {
    const std::size_t m = 33, k = 70, n = 129;
    const vec a = uniform(m * k, -1, 1), b = uniform(k * n, -1, 1), dc = uniform(m * n, -1, 1);
    const auto iM = std::int64_t(m), iK = std::int64_t(k), iN = std::int64_t(n);
    const std::string size = std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
    const std::string plain = graph_module("matmul", {{iM, iK}, {iK, iN}}, [](const std::vector<gx::var>& in) {
        return std::vector<gx::var>{gx::dot(in[0], in[1], 1, 0)};
    });
    cases.push_back({"matmul.NN." + size, "match", plain, {{{iM, iK}, a}, {{iK, iN}, b}}, {{{iM, iN}, gemm(a, b, m, k, n)}}});
    // Transposed operands: the same numbers read as [K,M] and [N,K].
    const std::string tt = graph_module("matmul", {{iK, iM}, {iN, iK}}, [](const std::vector<gx::var>& in) {
        return std::vector<gx::var>{gx::dot(in[0], in[1], 0, 1)};
    });
    cases.push_back({"matmul.TT." + size, "match", tt, {{{iK, iM}, a}, {{iN, iK}, b}}, {{{iM, iN}, gemm(a, b, m, k, n, true, true)}}});
    // The gradients the tape records for a product (the dot's rule: two more products).
    const std::string back = traced_module("matmul_backward", {{m, k}, {k, n}, {m, n}}, [](const std::vector<Tf>& in) {
        p::matmul(in[0], in[1]).backward(in[2]);
        return std::vector<Tf>{in[0].grad(), in[1].grad()};
    });
    cases.push_back({"matmul_backward." + size, "match", back, {{{iM, iK}, a}, {{iK, iN}, b}, {{iM, iN}, dc}},
                     {{{iM, iK}, gemm(dc, b, m, n, k, false, true)}, {{iK, iN}, gemm(a, dc, k, m, n, true, false)}}});
    const std::size_t batch = 3, bm = 17, bk = 40, bn = 9;
    const vec ba = uniform(batch * bm * bk, -1, 1), bb = uniform(batch * bk * bn, -1, 1);
    vec bc;
    for (std::size_t i = 0; i < batch; ++i) {
        const vec ai(ba.begin() + long(i * bm * bk), ba.begin() + long((i + 1) * bm * bk));
        const vec bi(bb.begin() + long(i * bk * bn), bb.begin() + long((i + 1) * bk * bn));
        const vec ci = gemm(ai, bi, bm, bk, bn);
        bc.insert(bc.end(), ci.begin(), ci.end());
    }
    const std::string bmm = graph_module("batched_matmul", {{3, 17, 40}, {3, 40, 9}}, [](const std::vector<gx::var>& in) {
        return std::vector<gx::var>{gx::matmul(in[0], in[1])};
    });
    cases.push_back({"batched_matmul.3x17x40x9", "match", bmm, {{{3, 17, 40}, ba}, {{3, 40, 9}, bb}}, {{{3, 17, 9}, bc}}});
}

void add_elementwise_and_reduction_cases(std::vector<oracle_case>& cases) {
    const shlo::dims_t dims{8, 130};
    const vec x = uniform(count(dims), -2, 2), y = uniform(count(dims), -2, 2);
    auto map1 = [&](double (*f)(double)) {
        vec r(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) r[i] = f(x[i]);
        return r;
    };
    using vars = std::vector<gx::var>;
    const std::string exp_m = graph_module("unary", {dims}, [](const vars& in) { return vars{gx::exp(in[0])}; });
    cases.push_back({"unary.exponential.8x130", "match", exp_m, {{dims, x}}, {{dims, map1([](double v) { return std::exp(v); })}}});
    const std::string tanh_m = graph_module("unary", {dims}, [](const vars& in) { return vars{gx::tanh(in[0])}; });
    cases.push_back({"unary.tanh.8x130", "match", tanh_m, {{dims, x}}, {{dims, map1([](double v) { return std::tanh(v); })}}});
    vec prod(x.size()), mx(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) prod[i] = x[i] * y[i], mx[i] = std::max(x[i], y[i]);
    const std::string mul_m = graph_module("binary", {dims, dims}, [](const vars& in) { return vars{in[0] * in[1]}; });
    cases.push_back({"binary.multiply.8x130", "match", mul_m, {{dims, x}, {dims, y}}, {{dims, prod}}});
    const std::string max_m = graph_module("binary", {dims, dims}, [](const vars& in) { return vars{gx::maximum(in[0], in[1])}; });
    cases.push_back({"binary.maximum.8x130", "match", max_m, {{dims, x}, {dims, y}}, {{dims, mx}}});

    vec row_sum(8, 0.0), col_max(130, -1e300);
    for (std::size_t r = 0; r < 8; ++r)
        for (std::size_t c = 0; c < 130; ++c) {
            const double v = x[r * 130 + c];
            row_sum[r] += v;
            col_max[c] = std::max(col_max[c], v);
        }
    const double total = cpu_serial::sum(x.data(), x.size());
    const std::string sum_rows = graph_module("reduce", {dims}, [](const vars& in) { return vars{gx::sum(in[0], {1})}; });
    cases.push_back({"reduce_sum.8x130.axes1", "match", sum_rows, {{dims, x}}, {{{8}, row_sum}}});
    const std::string max_cols = graph_module("reduce", {dims}, [](const vars& in) { return vars{gx::max(in[0], {0})}; });
    cases.push_back({"reduce_max.8x130.axes0", "match", max_cols, {{dims, x}}, {{{130}, col_max}}});
    const std::string sum_all = graph_module("reduce", {dims}, [](const vars& in) { return vars{gx::sum(in[0], {0, 1})}; });
    cases.push_back({"reduce_sum.8x130.axes0x1", "match", sum_all, {{dims, x}}, {{{}, {total}}}});
}

/// Cases the oracle must reject: a plausible bug (the chunk matrix loses its diagonal) and text XLA
/// cannot parse. The test passes only if both are caught.
void add_negative_cases(std::vector<oracle_case>& cases) {
    const std::size_t rows = 2, steps = 300;
    const vec a = uniform(rows * steps, 0.5, 1.0), x = uniform(rows * steps, -1, 1), h0 = uniform(rows, -1, 1);
    const vec h = scan_reference(a, x, h0, rows, steps);
    std::string wrong = traced_module("scan_forward", {{rows, steps}, {rows, steps}, {rows}}, [](const std::vector<Tf>& in) {
        return std::vector<Tf>{p::linear_scan(in[0], with_initial_state(in[0], in[1], in[2]), shlo::scan_strategy::chunked_matmul<128>(), false)};
    });
    const std::string good = "comparison_direction GE", bad = "comparison_direction GT";
    const auto at = wrong.find(good);
    if (at == std::string::npos) throw std::runtime_error("negative case: the chunked scan no longer has its GE mask");
    wrong.replace(at, good.size(), bad);
    const shlo::dims_t rt{2, 300}, r{2};
    cases.push_back({"wrong_module.chunk_mask_without_diagonal", "mismatch", wrong, {{rt, a}, {rt, x}, {r, h0}}, {{rt, h}}});

    std::string malformed = graph_module("matmul", {{4, 5}, {5, 6}}, [](const std::vector<gx::var>& in) {
        return std::vector<gx::var>{gx::matmul(in[0], in[1])};
    });
    const std::string from = "tensor<5x6xf32>) -> tensor<4x6xf32>";  // the dot's operand types: claim a wrong result
    const auto pos = malformed.find(from);
    if (pos == std::string::npos) throw std::runtime_error("negative case: matmul text changed shape");
    malformed.replace(pos, from.size(), "tensor<5x6xf32>) -> tensor<4x7xf32>");
    cases.push_back({"malformed_module.dot_result_type", "compile_error", malformed, {{{4, 5}, uniform(20, -1, 1)}, {{5, 6}, uniform(30, -1, 1)}},
                     {{{4, 6}, vec(24, 0.0)}}});
}

void write_floats(const std::filesystem::path& path, const vec& values) {
    std::vector<float> f(values.begin(), values.end());
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(f.data()), static_cast<std::streamsize>(f.size() * sizeof(float)));
    if (!out) throw std::runtime_error("cannot write " + path.string());
}

std::string dims_text(const shlo::dims_t& dims) {
    std::string s;
    for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
    return s.empty() ? "-" : s;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::cerr << "usage: xla_oracle_dump <output folder>\n";
        return 2;
    }
    try {
        const std::filesystem::path dir = argv[1];
        std::filesystem::create_directories(dir);
        std::vector<oracle_case> cases;
        add_scan_cases(cases);
        add_matmul_cases(cases);
        add_elementwise_and_reduction_cases(cases);
        add_negative_cases(cases);
        {  // the compile-options bytes the PJRT runtime sends; the runner compiles every case with them
            std::ofstream options(dir / "compile_options.bin", std::ios::binary);
            options.write(reinterpret_cast<const char*>(olmax::xla::compile_options_bytes), sizeof olmax::xla::compile_options_bytes);
        }
        std::ofstream manifest(dir / "manifest.txt");
        for (const auto& c : cases) {
            manifest << "case " << c.name << " " << c.expect << "\n";
            std::ofstream(dir / (c.name + ".mlir")) << c.text;
            for (std::size_t i = 0; i < c.inputs.size(); ++i) {
                const std::string file = c.name + ".in" + std::to_string(i) + ".bin";
                if (c.inputs[i].data.size() != count(c.inputs[i].dims)) throw std::runtime_error(c.name + ": input size mismatch");
                write_floats(dir / file, c.inputs[i].data);
                manifest << "in " << file << " " << dims_text(c.inputs[i].dims) << "\n";
            }
            for (std::size_t i = 0; i < c.outputs.size(); ++i) {
                const std::string file = c.name + ".out" + std::to_string(i) + ".bin";
                if (c.outputs[i].data.size() != count(c.outputs[i].dims)) throw std::runtime_error(c.name + ": output size mismatch");
                write_floats(dir / file, c.outputs[i].data);
                manifest << "out " << file << " " << dims_text(c.outputs[i].dims) << "\n";
            }
        }
        std::cout << "wrote " << cases.size() << " cases to " << dir << "\n";
    } catch (const std::exception& e) {
        std::cerr << "xla_oracle_dump: " << e.what() << "\n";
        return 1;
    }
    return 0;
}
