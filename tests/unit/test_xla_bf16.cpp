// The bf16 precision policy on the traced (XLA) path: a matmul traced inside a bf16 scope lowers to
// bf16 x bf16 -> f32 dot_generals (its forward and both gradient products), and the graph's
// double-precision reference of them gives the numbers of the eager CPU policy's GEMMs (operands
// rounded to bfloat16, f32 sums), which are not fp32's.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <olmax/olmax.hpp>
#include <olmax/trace/trace.hpp>
#include <olmax/xla/graph/evaluate.hpp>

namespace {

namespace bf16x_gx = olmax::xla::graph;
namespace bf16x_trace = olmax::trace;

std::vector<float> bf16x_values(std::size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = normal(rng);
    return v;
}

/// Largest |got - want| over the largest |want| (the products' scale).
double bf16x_relative(const std::vector<double>& got, const std::vector<float>& want) {
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
        diff = std::max(diff, std::abs(got[i] - double(want[i])));
        scale = std::max(scale, std::abs(double(want[i])));
    }
    return diff / scale;
}

/// The dot_general lines of a module's text.
std::vector<std::string> bf16x_dots(const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);)
        if (line.find("stablehlo.dot_general") != std::string::npos) out.push_back(line);
    return out;
}

/// How many converts to bf16 a module's text holds.
std::size_t bf16x_converts(const std::string& text) {
    std::size_t n = 0;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);)
        if (line.find("stablehlo.convert") != std::string::npos && line.ends_with("xbf16>")) ++n;
    return n;
}

struct bf16x_eager {
    std::vector<float> y, da, db;
};

/// y = a [M, K] x b [K, N] and the gradients of sum(y * r) on olmax's CPU, in a bf16 scope or not.
bf16x_eager bf16x_cpu(const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& r, std::size_t M, std::size_t K,
                      std::size_t N, bool bf16) {
    std::optional<olmax::backend::bf16_matmul_scope> scope;
    if (bf16) scope.emplace();
    auto ta = olmax::Tensor<float>::from({M, K}, std::span<const float>(a)).set_requires_grad(true);
    auto tb = olmax::Tensor<float>::from({K, N}, std::span<const float>(b)).set_requires_grad(true);
    const auto tr = olmax::Tensor<float>::from({M, N}, std::span<const float>(r));
    const auto y = olmax::matmul(ta, tb);
    olmax::sum(olmax::mul(y, tr)).backward();
    return {std::vector<float>(y.begin(), y.end()), std::vector<float>(ta.grad().begin(), ta.grad().end()),
            std::vector<float>(tb.grad().begin(), tb.grad().end())};
}

}  // namespace

TEST_CASE("xla bf16: a matmul traced in a bf16 scope lowers to bf16 dots and evaluates to the CPU policy's numbers", "[xla][bf16][trace]") {
    const std::size_t M = 5, K = 24, N = 7;
    const auto a = bf16x_values(M * K, 1), b = bf16x_values(K * N, 2), r = bf16x_values(M * N, 3);
    const auto cpu_bf16 = bf16x_cpu(a, b, r, M, K, N, true), cpu_fp32 = bf16x_cpu(a, b, r, M, K, N, false);

    for (const bool bf16 : {true, false}) {
        INFO("traced in a bf16 scope: " << bf16);
        std::optional<olmax::backend::bf16_matmul_scope> scope;
        if (bf16) scope.emplace();
        bf16x_trace::tracing t;
        scope.reset();  // the trace recorded the policy when it began
        CHECK(t.bf16_gemms() == bf16);
        auto ta = t.input<float>({M, K}).set_requires_grad(true);
        auto tb = t.input<float>({K, N}).set_requires_grad(true);
        const auto tr = t.input<float>({M, N});
        const auto y = olmax::matmul(ta, tb);
        olmax::sum(olmax::mul(y, tr)).backward();
        const std::vector<bf16x_gx::var> wanted{bf16x_trace::var_of(y), bf16x_trace::var_of(ta.grad()), bf16x_trace::var_of(tb.grad())};
        std::vector<bf16x_gx::host_value> in;
        for (const auto* v : {&a, &b, &r}) in.push_back({{}, std::vector<double>(v->begin(), v->end())});
        in[0].type = bf16x_gx::f32({std::int64_t(M), std::int64_t(K)});
        in[1].type = bf16x_gx::f32({std::int64_t(K), std::int64_t(N)});
        in[2].type = bf16x_gx::f32({std::int64_t(M), std::int64_t(N)});
        const auto ref = bf16x_gx::evaluate(t.graph(), in, wanted);

        const auto& want = bf16 ? cpu_bf16 : cpu_fp32;
        const auto& other = bf16 ? cpu_fp32 : cpu_bf16;
        // The same rounded operands, exact products; f32 sums (CPU) against double ones (the
        // reference): within K f32 roundings of the products' scale.
        CHECK(bf16x_relative(ref[0].data, want.y) < 1e-6);
        CHECK(bf16x_relative(ref[1].data, want.da) < 1e-6);
        CHECK(bf16x_relative(ref[2].data, want.db) < 1e-6);
        // and not the other precision's (bf16 operands move them by about 2^-9)
        CHECK(bf16x_relative(ref[0].data, other.y) > 1e-4);
        CHECK(bf16x_relative(ref[1].data, other.da) > 1e-4);
        CHECK(bf16x_relative(ref[2].data, other.db) > 1e-4);

        const auto program = t.finish({y, ta.grad(), tb.grad()});
        const auto dots = bf16x_dots(program.module.text);
        REQUIRE(dots.size() == 3);  // the forward product and its two gradient products
        for (const auto& line : dots) {
            INFO(line);
            if (bf16) {
                CHECK(line.find("xbf16>, tensor<") != std::string::npos);                 // bf16 operands
                CHECK(line.find("xbf16>) -> tensor<") != std::string::npos);              // ...
                CHECK(line.rfind("xf32>") > line.find(") -> tensor<"));                     // an f32 result
            } else {
                CHECK(line.find("bf16") == std::string::npos);
            }
        }
        const auto converts = bf16x_converts(program.module.text);
        CHECK(converts == (bf16 ? 6u : 0u));  // both operands of each of the three products
    }
}
