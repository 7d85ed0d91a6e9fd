// Writes olmax's emitted StableHLO modules, their inputs and the CPU reference outputs into a folder,
// for tests/xla/run_xla_oracle.py to execute on a real XLA (jax's CPU backend) and compare.
// Usage: xla_oracle_dump <output folder>
//
// Folder layout: manifest.txt (one block per case), <case>.mlir, <case>.in<i>.bin, <case>.out<i>.bin
// (raw little-endian float32, row-major). Expected outputs come from olmax's cpu_serial backend
// (GEMM) and a sequential double-precision scan written here (independent of include/olmax/scan).
// compile_options.bin holds olmax's serialized CompileOptionsProto (what PJRT_Client_Compile gets).

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "olmax/backend/cpu_serial.hpp"
#include "olmax/xla/xla.hpp"

namespace shlo = olmax::xla::stablehlo;
using olmax::backend::cpu_serial;

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

double hard_sigmoid(double v) { return std::clamp((v + 3.0) / 6.0, 0.0, 1.0); }

// ---- cases ------------------------------------------------------------------------------------

std::vector<shlo::scan_strategy> strategies() {
    return {shlo::scan_strategy::sequential(), shlo::scan_strategy::hillis_steele(), shlo::scan_strategy::chunked_matmul<128>()};
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
        for (const auto& s : strategies()) {
            const auto fwd = shlo::scan_forward(s, rows, steps);
            cases.push_back({fwd.key, "match", fwd.text, {{rt, a}, {rt, x}, {r, h0}}, {{rt, h}}});
            const auto bwd = shlo::scan_backward(s, rows, steps);
            cases.push_back({bwd.key, "match", bwd.text, {{rt, a}, {rt, h}, {r, h0}, {rt, g}}, {{rt, dx}, {rt, da}, {r, dh0}}});
        }
    }
}

void add_matmul_cases(std::vector<oracle_case>& cases) {
    const std::size_t m = 33, k = 70, n = 129;
    const vec a = uniform(m * k, -1, 1), b = uniform(k * n, -1, 1), dc = uniform(m * n, -1, 1);
    const auto iM = std::int64_t(m), iK = std::int64_t(k), iN = std::int64_t(n);
    auto plain = shlo::matmul(iM, iK, iN);
    cases.push_back({plain.key, "match", plain.text, {{{iM, iK}, a}, {{iK, iN}, b}}, {{{iM, iN}, gemm(a, b, m, k, n)}}});
    // Transposed operands: the same numbers read as [K,M] and [N,K].
    auto tt = shlo::matmul(iM, iK, iN, true, true);
    cases.push_back({tt.key, "match", tt.text, {{{iK, iM}, a}, {{iN, iK}, b}}, {{{iM, iN}, gemm(a, b, m, k, n, true, true)}}});
    auto back = shlo::matmul_backward(iM, iK, iN);
    cases.push_back({back.key, "match", back.text, {{{iM, iK}, a}, {{iK, iN}, b}, {{iM, iN}, dc}},
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
    auto bmm = shlo::batched_matmul(3, 17, 40, 9);
    cases.push_back({bmm.key, "match", bmm.text, {{{3, 17, 40}, ba}, {{3, 40, 9}, bb}}, {{{3, 17, 9}, bc}}});
}

void add_elementwise_and_reduction_cases(std::vector<oracle_case>& cases) {
    const shlo::dims_t dims{8, 130};
    const vec x = uniform(count(dims), -2, 2), y = uniform(count(dims), -2, 2);
    auto map1 = [&](double (*f)(double)) {
        vec r(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) r[i] = f(x[i]);
        return r;
    };
    auto exp_m = shlo::elementwise_unary("exponential", dims);
    cases.push_back({exp_m.key, "match", exp_m.text, {{dims, x}}, {{dims, map1([](double v) { return std::exp(v); })}}});
    auto tanh_m = shlo::elementwise_unary("tanh", dims);
    cases.push_back({tanh_m.key, "match", tanh_m.text, {{dims, x}}, {{dims, map1([](double v) { return std::tanh(v); })}}});
    vec prod(x.size()), mx(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) prod[i] = x[i] * y[i], mx[i] = std::max(x[i], y[i]);
    auto mul_m = shlo::elementwise_binary("multiply", dims);
    cases.push_back({mul_m.key, "match", mul_m.text, {{dims, x}, {dims, y}}, {{dims, prod}}});
    auto max_m = shlo::elementwise_binary("maximum", dims);
    cases.push_back({max_m.key, "match", max_m.text, {{dims, x}, {dims, y}}, {{dims, mx}}});

    vec row_sum(8, 0.0), col_max(130, -1e300);
    double total = 0;
    for (std::size_t r = 0; r < 8; ++r)
        for (std::size_t c = 0; c < 130; ++c) {
            const double v = x[r * 130 + c];
            row_sum[r] += v;
            col_max[c] = std::max(col_max[c], v);
            total += v;
        }
    total = cpu_serial::sum(x.data(), x.size());
    auto sum_rows = shlo::reduce(shlo::reduction_kind::sum, dims, {1});
    cases.push_back({sum_rows.key, "match", sum_rows.text, {{dims, x}}, {{{8}, row_sum}}});
    auto max_cols = shlo::reduce(shlo::reduction_kind::max, dims, {0});
    cases.push_back({max_cols.key, "match", max_cols.text, {{dims, x}}, {{{130}, col_max}}});
    auto sum_all = shlo::reduce(shlo::reduction_kind::sum, dims, {0, 1});
    cases.push_back({sum_all.key, "match", sum_all.text, {{dims, x}}, {{{}, {total}}}});
}

void add_qrnn_cases(std::vector<oracle_case>& cases) {
    const std::size_t features = 16, hidden = 8;
    for (std::size_t steps : {std::size_t{1}, std::size_t{129}}) {
        const vec u = uniform(steps * features, -1, 1), w = uniform(features * 2 * hidden, -1.5, 1.5), dh = uniform(steps * hidden, -1, 1);
        // Forward in [H, T] rows layout: z = u W, x = z[:, :H], a = z[:, H:], f = hard_sigmoid(a).
        const vec z = gemm(u, w, steps, features, 2 * hidden);
        vec x(hidden * steps), a(hidden * steps), f(hidden * steps), g(hidden * steps);
        for (std::size_t t = 0; t < steps; ++t)
            for (std::size_t j = 0; j < hidden; ++j) {
                x[j * steps + t] = z[t * 2 * hidden + j];
                a[j * steps + t] = z[t * 2 * hidden + hidden + j];
                f[j * steps + t] = hard_sigmoid(a[j * steps + t]);
                g[j * steps + t] = dh[t * hidden + j];
            }
        const vec zeros(hidden, 0.0);
        const vec h = scan_reference(f, x, zeros, hidden, steps);
        vec dx, df, dh0;
        scan_backward_reference(f, h, zeros, g, hidden, steps, dx, df, dh0);
        vec h_tm(steps * hidden), dz(steps * 2 * hidden);
        for (std::size_t t = 0; t < steps; ++t)
            for (std::size_t j = 0; j < hidden; ++j) {
                h_tm[t * hidden + j] = h[j * steps + t];
                const double pre = a[j * steps + t];
                dz[t * 2 * hidden + j] = dx[j * steps + t];
                dz[t * 2 * hidden + hidden + j] = (pre > -3.0 && pre < 3.0) ? df[j * steps + t] / 6.0 : 0.0;
            }
        const vec du = gemm(dz, w, steps, 2 * hidden, features, false, true);
        const vec dw = gemm(u, dz, features, steps, 2 * hidden, true, false);
        const auto iT = std::int64_t(steps), iF = std::int64_t(features), iH = std::int64_t(hidden);
        for (const auto& s : strategies()) {
            auto fwd = shlo::qrnn_block_forward(s, iT, iF, iH);
            cases.push_back({fwd.key, "match", fwd.text, {{{iT, iF}, u}, {{iF, 2 * iH}, w}}, {{{iT, iH}, h_tm}}});
            auto bwd = shlo::qrnn_block_backward(s, iT, iF, iH);
            cases.push_back({bwd.key, "match", bwd.text, {{{iT, iF}, u}, {{iF, 2 * iH}, w}, {{iT, iH}, dh}},
                             {{{iT, iF}, du}, {{iF, 2 * iH}, dw}}});
        }
    }
}

/// Cases the oracle must reject: a plausible bug (the chunk matrix loses its diagonal) and text XLA
/// cannot parse. The test passes only if both are caught.
void add_negative_cases(std::vector<oracle_case>& cases) {
    const std::size_t rows = 2, steps = 300;
    const vec a = uniform(rows * steps, 0.5, 1.0), x = uniform(rows * steps, -1, 1), h0 = uniform(rows, -1, 1);
    const vec h = scan_reference(a, x, h0, rows, steps);
    auto module = shlo::scan_forward(shlo::scan_strategy::chunked_matmul<128>(), rows, steps);
    const std::string good = "comparison_direction GE", bad = "comparison_direction GT";
    const auto at = module.text.find(good);
    if (at == std::string::npos) throw std::runtime_error("negative case: the chunked scan no longer has its GE mask");
    std::string wrong = module.text;
    wrong.replace(at, good.size(), bad);
    const shlo::dims_t rt{2, 300}, r{2};
    cases.push_back({"wrong_module.chunk_mask_without_diagonal", "mismatch", wrong, {{rt, a}, {rt, x}, {r, h0}}, {{rt, h}}});

    auto mm = shlo::matmul(4, 5, 6);
    std::string malformed = mm.text;
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
        add_qrnn_cases(cases);
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
