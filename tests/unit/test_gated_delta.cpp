// scan::gated_delta_rule and nn::GatedDeltaNet: the chunked WY forward against the sequential
// recurrence, the chunked backward against the sequential adjoint (every input's gradient, h0's
// included), finite-difference gradients in double, causality, packed-sequence resets, carried
// state, bad shapes; the traced (chunked-GEMM, composed of ops) form evaluated in double against
// the eager op and layer.
#include "test_helpers.hpp"
#include "traced_constants.hpp"

#include "olmax/backend/bf16_matmul_kernels.hpp"
#include "olmax/nn/gated_deltanet.hpp"
#include "olmax/optim/parameters_of.hpp"
#include "olmax/scan/gated_delta.hpp"
#include "olmax/trace/trace.hpp"
#include "olmax/xla/graph/evaluate.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace gdn_sc = olmax::scan;
namespace gdn_nn = olmax::nn;
using GdnTensor = olmax::Tensor<double>;

/// The op's inputs: q, k [batch, T, H, K] (k rows of norm 1, as the layer feeds them), v
/// [batch, T, H, V], g in [-1, -0.01] (log decay), beta in [0.1, 0.9], h0, and resets (all zero).
struct GdnInputs {
    GdnTensor q, k, v, g, beta, h0, resets;
    std::vector<GdnTensor> differentiable() const { return {q, k, v, g, beta, h0}; }
};

GdnInputs gdn_make_inputs(std::size_t batch, std::size_t time, std::size_t heads, std::size_t K, std::size_t V, std::uint64_t seed) {
    olmax::Generator rng(seed);
    GdnInputs in;
    in.q = olmax::randn<double>({batch, time, heads, K}, rng);
    in.k = olmax::randn<double>({batch, time, heads, K}, rng);
    for (std::size_t row = 0; row < batch * time * heads; ++row) {
        double norm = 0;
        for (std::size_t i = 0; i < K; ++i) norm += in.k.data()[row * K + i] * in.k.data()[row * K + i];
        for (std::size_t i = 0; i < K; ++i) in.k.data()[row * K + i] /= std::sqrt(norm);
    }
    in.v = olmax::randn<double>({batch, time, heads, V}, rng);
    in.g = olmax_test::uniform({batch, time, heads}, rng, -1.0, -0.01);
    in.beta = olmax_test::uniform({batch, time, heads}, rng, 0.1, 0.9);
    in.h0 = olmax::randn<double>({batch, heads, K, V}, rng);
    in.resets = GdnTensor({batch, time});
    return in;
}

/// The recurrence written out step by step (the definition at the top of scan/gated_delta.hpp).
struct GdnReference {
    std::vector<double> o, state;
};

GdnReference gdn_reference(const GdnInputs& in, bool use_h0, bool use_resets, double scale) {
    const std::size_t nb = in.q.extent(0), nt = in.q.extent(1), nh = in.q.extent(2), K = in.q.extent(3), V = in.v.extent(3);
    GdnReference r;
    r.o.assign(nb * nt * nh * V, 0);
    r.state.assign(nb * nh * K * V, 0);
    for (std::size_t b = 0; b < nb; ++b)
        for (std::size_t h = 0; h < nh; ++h) {
            std::vector<double> S(K * V, 0), next(K * V);
            if (use_h0)
                for (std::size_t i = 0; i < K * V; ++i) S[i] = in.h0.data()[(b * nh + h) * K * V + i];
            for (std::size_t t = 0; t < nt; ++t) {
                if (use_resets && in.resets(b, t) != 0) std::fill(S.begin(), S.end(), 0.0);
                const double a = std::exp(in.g(b, t, h)), beta = in.beta(b, t, h);
                // S_t = a (I - beta k k^T) S_{t-1} + beta k v^T
                for (std::size_t i = 0; i < K; ++i)
                    for (std::size_t j = 0; j < V; ++j) {
                        double kks = 0;
                        for (std::size_t m = 0; m < K; ++m) kks += in.k(b, t, h, i) * in.k(b, t, h, m) * S[m * V + j];
                        next[i * V + j] = a * (S[i * V + j] - beta * kks) + beta * in.k(b, t, h, i) * in.v(b, t, h, j);
                    }
                S = next;
                for (std::size_t j = 0; j < V; ++j) {
                    double acc = 0;
                    for (std::size_t i = 0; i < K; ++i) acc += S[i * V + j] * in.q(b, t, h, i);
                    r.o[((b * nt + t) * nh + h) * V + j] = scale * acc;
                }
            }
            for (std::size_t i = 0; i < K * V; ++i) r.state[(b * nh + h) * K * V + i] = S[i];
        }
    return r;
}

double gdn_max_diff(const GdnTensor& a, const std::vector<double>& b) {
    REQUIRE(a.size() == b.size());
    double m = 0;
    for (std::size_t i = 0; i < b.size(); ++i) m = olmax_test::worse(m, std::abs(a.data()[i] - b[i]));
    return m;
}

/// o and the final state, flattened into one vector (for the gradient checker).
GdnTensor gdn_flat(const gdn_sc::GatedDeltaResult<double>& r) {
    return olmax::concat({olmax::reshape(r.o, {r.o.size()}), olmax::reshape(r.state, {r.state.size()})}, 0);
}

/// Every input's gradient of sum(o * do) + sum(state * dstate), from the op's backward.
struct GdnGrads {
    GdnTensor o, state;
    std::vector<GdnTensor> d;  // q, k, v, g, beta, h0
};

GdnGrads gdn_run(const GdnInputs& base, bool use_resets, long chunk, const GdnTensor& dout, const GdnTensor& dstate) {
    std::vector<GdnTensor> x;
    for (const auto& t : base.differentiable()) x.push_back(olmax::parameter(t.clone()));
    auto r = gdn_sc::gated_delta_rule(x[0], x[1], x[2], x[3], x[4], x[5], use_resets ? base.resets : GdnTensor(), {.chunk = chunk});
    olmax::add(olmax::sum(olmax::mul(r.o, dout)), olmax::sum(olmax::mul(r.state, dstate))).backward();
    GdnGrads out{r.o.detach(), r.state.detach(), {}};
    for (auto& t : x) out.d.push_back(t.grad());
    return out;
}

/// The gradients of sum(o * dout) + sum(state * dstate) by the sequential adjoint of the recurrence,
/// step by step from the last (derived from S_t = a (S_{t-1} - beta k x^T) + beta k v^T with x =
/// S_{t-1}^T k, independently of the op's chunked backward): dq, dk, dv, dg, dbeta, dh0.
std::vector<std::vector<double>> gdn_reference_grads(const GdnInputs& in, bool use_h0, bool use_resets, double scale, const GdnTensor& dout,
                                                     const GdnTensor& dstate) {
    const std::size_t nb = in.q.extent(0), nt = in.q.extent(1), nh = in.q.extent(2), K = in.q.extent(3), V = in.v.extent(3);
    std::vector<std::vector<double>> d{std::vector<double>(in.q.size()), std::vector<double>(in.k.size()), std::vector<double>(in.v.size()),
                                       std::vector<double>(in.g.size()), std::vector<double>(in.beta.size()), std::vector<double>(in.h0.size())};
    for (std::size_t b = 0; b < nb; ++b)
        for (std::size_t h = 0; h < nh; ++h) {
            // states[t + 1] = S_t, states[0] = S_{-1}
            std::vector<std::vector<double>> states(nt + 1, std::vector<double>(K * V, 0.0));
            if (use_h0)
                for (std::size_t i = 0; i < K * V; ++i) states[0][i] = in.h0.data()[(b * nh + h) * K * V + i];
            auto reset = [&](std::size_t t) { return use_resets && in.resets(b, t) != 0; };
            for (std::size_t t = 0; t < nt; ++t) {
                const std::vector<double> P = reset(t) ? std::vector<double>(K * V, 0.0) : states[t];
                const double a = std::exp(in.g(b, t, h)), beta = in.beta(b, t, h);
                for (std::size_t j = 0; j < V; ++j) {
                    double x = 0;
                    for (std::size_t m = 0; m < K; ++m) x += P[m * V + j] * in.k(b, t, h, m);
                    for (std::size_t i = 0; i < K; ++i)
                        states[t + 1][i * V + j] = a * P[i * V + j] + beta * in.k(b, t, h, i) * (in.v(b, t, h, j) - a * x);
                }
            }
            std::vector<double> G(K * V), x(V), y(V);
            for (std::size_t i = 0; i < K * V; ++i) G[i] = dstate.data()[(b * nh + h) * K * V + i];
            for (std::size_t t = nt; t-- > 0;) {
                const std::vector<double>& S = states[t + 1];
                const std::vector<double> P = reset(t) ? std::vector<double>(K * V, 0.0) : states[t];
                const double a = std::exp(in.g(b, t, h)), beta = in.beta(b, t, h);
                const std::size_t qk = ((b * nt + t) * nh + h) * K, vo = ((b * nt + t) * nh + h) * V, gi = (b * nt + t) * nh + h;
                const double* dot = dout.data() + vo;
                for (std::size_t i = 0; i < K; ++i) {  // dq = scale S do; G += scale q do^T
                    double acc = 0;
                    for (std::size_t j = 0; j < V; ++j) {
                        acc += S[i * V + j] * dot[j];
                        G[i * V + j] += scale * in.q(b, t, h, i) * dot[j];
                    }
                    d[0][qk + i] = scale * acc;
                }
                for (std::size_t j = 0; j < V; ++j) {  // y = G^T k, x = P^T k
                    y[j] = x[j] = 0;
                    for (std::size_t i = 0; i < K; ++i) {
                        y[j] += G[i * V + j] * in.k(b, t, h, i);
                        x[j] += P[i * V + j] * in.k(b, t, h, i);
                    }
                    d[2][vo + j] = beta * y[j];
                }
                double dbeta = 0, gp = 0, xy = 0;
                for (std::size_t j = 0; j < V; ++j) {
                    const double r = in.v(b, t, h, j) - a * x[j];  // x = 0 at a reset
                    dbeta += y[j] * r;
                    xy += x[j] * y[j];
                }
                d[4][gi] = dbeta;
                for (std::size_t i = 0; i < K; ++i) {  // dk = beta G r - a beta P y
                    double gr = 0, py = 0;
                    for (std::size_t j = 0; j < V; ++j) {
                        gr += G[i * V + j] * (in.v(b, t, h, j) - a * x[j]);
                        py += P[i * V + j] * y[j];
                        gp += G[i * V + j] * P[i * V + j];
                    }
                    d[1][qk + i] = beta * gr - a * beta * py;
                }
                d[3][gi] = reset(t) ? 0.0 : a * (gp - beta * xy);
                for (std::size_t i = 0; i < K; ++i)  // dS_{t-1} = a (G - beta k y^T), nothing across a reset
                    for (std::size_t j = 0; j < V; ++j) G[i * V + j] = reset(t) ? 0.0 : a * (G[i * V + j] - beta * in.k(b, t, h, i) * y[j]);
            }
            for (std::size_t i = 0; i < K * V; ++i) d[5][(b * nh + h) * K * V + i] = G[i];
        }
    return d;
}

}  // namespace

TEST_CASE("scan::gated_delta_rule: the chunked WY form equals the sequential recurrence", "[gated_delta]") {
    auto in = gdn_make_inputs(2, 23, 2, 4, 3, 1);
    in.resets(0, 5) = 1;
    in.resets(0, 6) = 1;   // two starts in a row: a one-step document
    in.resets(0, 16) = 1;  // on a chunk boundary for chunk 4 and 8
    in.resets(1, 0) = 1;   // h0 does not reach this row
    in.resets(1, 13) = 1;
    const double scale = 1 / std::sqrt(4.0);
    for (bool use_h0 : {false, true})
        for (bool use_resets : {false, true}) {
            const auto expected = gdn_reference(in, use_h0, use_resets, scale);
            for (long chunk : {1L, 3L, 4L, 7L, 8L, 23L, 64L}) {  // 23 % 3, 23 % 4, ... != 0: a short last chunk
                INFO("h0 " << use_h0 << ", resets " << use_resets << ", chunk " << chunk);
                const auto r = gdn_sc::gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, use_h0 ? in.h0 : GdnTensor(),
                                                        use_resets ? in.resets : GdnTensor(), {.chunk = chunk});
                CHECK(r.o.shape() == in.v.shape());
                CHECK(r.state.shape() == olmax::Shape{2, 2, 4, 3});
                CHECK(gdn_max_diff(r.o, expected.o) < 1e-12);
                CHECK(gdn_max_diff(r.state, expected.state) < 1e-12);
            }
        }
    // The resets matter here (the comparison above is not vacuous).
    CHECK(gdn_max_diff(gdn_sc::gated_delta_rule(in.q, in.k, in.v, in.g, in.beta).o, gdn_reference(in, false, true, scale).o) > 1e-3);
}

TEST_CASE("scan::gated_delta_rule: explicit scale, K != V, strong decay, default chunk over T > 64", "[gated_delta]") {
    auto in = gdn_make_inputs(1, 70, 1, 2, 5, 2);
    for (std::size_t t = 0; t < 70; ++t) in.g(0, t, 0) = t % 9 == 0 ? -30.0 : in.g(0, t, 0);  // e^gamma underflows towards 0 quickly
    const auto expected = gdn_reference(in, true, false, 0.3);
    const auto r = gdn_sc::gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, in.h0, {}, {.scale = 0.3});
    CHECK(gdn_max_diff(r.o, expected.o) < 1e-12);
    CHECK(gdn_max_diff(r.state, expected.state) < 1e-12);
}

TEST_CASE("scan::gated_delta_rule: gradients (double) of q, k, v, g, beta and h0, with resets", "[gated_delta][grad]") {
    auto in = gdn_make_inputs(2, 9, 2, 3, 2, 3);
    in.resets(0, 4) = 1;
    in.resets(1, 0) = 1;
    in.resets(1, 6) = 1;
    for (long chunk : {1L, 3L, 4L, 64L}) {
        auto f = [&](const std::vector<GdnTensor>& x) {
            return gdn_flat(gdn_sc::gated_delta_rule(x[0], x[1], x[2], x[3], x[4], x[5], in.resets, {.chunk = chunk}));
        };
        INFO("chunk " << chunk);
        olmax_test::check_gradients(f, in.differentiable());
    }
}

TEST_CASE("scan::gated_delta_rule: gradients (double) without h0 or resets, unnormalised k", "[gated_delta][grad]") {
    auto in = gdn_make_inputs(1, 11, 3, 2, 4, 4);
    olmax::Generator rng(40);
    in.k = olmax::randn<double>(in.k.shape(), rng, 0.0, 0.6);
    auto f = [&](const std::vector<GdnTensor>& x) {
        return gdn_flat(gdn_sc::gated_delta_rule(x[0], x[1], x[2], x[3], x[4], GdnTensor(), GdnTensor(), {.scale = 0.7, .chunk = 4}));
    };
    olmax_test::check_gradients(f, {in.q, in.k, in.v, in.g, in.beta});
}

TEST_CASE("scan::gated_delta_rule: gradients do not depend on the chunk size", "[gated_delta]") {
    auto in = gdn_make_inputs(2, 30, 2, 5, 4, 5);
    in.resets(0, 11) = 1;
    in.resets(1, 20) = 1;
    olmax::Generator rng(50);
    const auto dout = olmax::randn<double>(in.v.shape(), rng);
    const auto dstate = olmax::randn<double>(in.h0.shape(), rng);
    const auto one = gdn_run(in, true, 1, dout, dstate);
    for (long chunk : {4L, 7L, 30L}) {
        INFO("chunk " << chunk);
        const auto other = gdn_run(in, true, chunk, dout, dstate);
        CHECK(olmax_test::max_abs_diff(one.o, other.o) < 1e-12);
        for (std::size_t i = 0; i < 6; ++i) {
            INFO("input " << i);
            CHECK(olmax_test::max_abs_diff(one.d[i], other.d[i]) < 1e-11);
        }
    }
    // h0 gets no gradient through a row that starts with a document (and some elsewhere).
    in.resets(1, 0) = 1;
    const auto cut = gdn_run(in, true, 8, dout, dstate);
    double row1 = 0, row0 = 0;
    for (std::size_t i = 0; i < 2 * 5 * 4; ++i) {
        row0 += std::abs(cut.d[5].data()[i]);
        row1 += std::abs(cut.d[5].data()[2 * 5 * 4 + i]);
    }
    CHECK(row0 > 0);
    CHECK(row1 == 0);
}

TEST_CASE("scan::gated_delta_rule: causal, changing step t changes no output before t", "[gated_delta]") {
    const auto in = gdn_make_inputs(1, 17, 2, 3, 3, 6);
    const std::size_t t = 9;
    const auto base = gdn_sc::gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, in.h0, {}, {.chunk = 6});
    for (int which = 0; which < 5; ++which) {
        auto changed = in;
        GdnTensor* target[] = {&changed.q, &changed.k, &changed.v, &changed.g, &changed.beta};
        *target[which] = target[which]->clone();
        const std::size_t per_step = target[which]->size() / 17;
        for (std::size_t i = 0; i < per_step; ++i) target[which]->data()[t * per_step + i] += which == 3 ? -0.5 : which == 4 ? 0.05 : 0.5;
        const auto r = gdn_sc::gated_delta_rule(changed.q, changed.k, changed.v, changed.g, changed.beta, in.h0, {}, {.chunk = 6});
        INFO("input " << which);
        CHECK(olmax_test::max_abs_diff(olmax::slice(r.o, 1, 0, t), olmax::slice(base.o, 1, 0, t)) < 1e-14);
        CHECK(olmax_test::max_abs_diff(olmax::slice(r.o, 1, t, 17), olmax::slice(base.o, 1, t, 17)) > 1e-6);
    }
}

TEST_CASE("scan::gated_delta_rule: a packed row with resets equals its documents run alone", "[gated_delta]") {
    const auto in = gdn_make_inputs(1, 19, 2, 4, 3, 7);
    GdnTensor resets({1, 19});
    resets(0, 7) = 1;
    resets(0, 8) = 1;
    const auto packed = gdn_sc::gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, in.h0, resets, {.chunk = 5});
    auto part = [&](std::size_t begin, std::size_t end, const GdnTensor& h0) {
        auto cut = [&](const GdnTensor& t) { return olmax::slice(t, 1, begin, end); };
        return gdn_sc::gated_delta_rule(cut(in.q), cut(in.k), cut(in.v), cut(in.g), cut(in.beta), h0, {}, {.chunk = 5});
    };
    const auto first = part(0, 7, in.h0), second = part(7, 8, {}), third = part(8, 19, {});
    CHECK(olmax_test::max_abs_diff(packed.o, olmax::concat({first.o, second.o, third.o}, 1)) < 1e-13);
    CHECK(olmax_test::max_abs_diff(packed.state, third.state) < 1e-13);
}

TEST_CASE("scan::gated_delta_rule: two calls with the state carried equal one call", "[gated_delta]") {
    auto in = gdn_make_inputs(2, 21, 2, 3, 4, 8);
    in.resets(1, 12) = 1;
    const auto whole = gdn_sc::gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, in.h0, in.resets, {.chunk = 4});
    auto part = [&](std::size_t begin, std::size_t end, const GdnTensor& h0) {
        auto cut = [&](const GdnTensor& t) { return olmax::slice(t, 1, begin, end); };
        return gdn_sc::gated_delta_rule(cut(in.q), cut(in.k), cut(in.v), cut(in.g), cut(in.beta), h0, cut(in.resets), {.chunk = 4});
    };
    const auto a = part(0, 10, in.h0);
    const auto b = part(10, 21, a.state);
    CHECK(olmax_test::max_abs_diff(whole.o, olmax::concat({a.o, b.o}, 1)) < 1e-13);
    CHECK(olmax_test::max_abs_diff(whole.state, b.state) < 1e-13);
}

TEST_CASE("scan::gated_delta_rule: float agrees with double", "[gated_delta]") {
    auto in = gdn_make_inputs(2, 40, 2, 8, 8, 9);
    in.resets(0, 17) = 1;
    auto to_float = [](const GdnTensor& t) {
        olmax::Tensor<float> f(t.shape());
        for (std::size_t i = 0; i < t.size(); ++i) f.data()[i] = float(t.data()[i]);
        return f;
    };
    const auto d = gdn_sc::gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, in.h0, in.resets, {.chunk = 16});
    auto q = olmax::parameter(to_float(in.q));
    const auto f = gdn_sc::gated_delta_rule(q, to_float(in.k), to_float(in.v), to_float(in.g), to_float(in.beta), to_float(in.h0),
                                            to_float(in.resets), {.chunk = 16});
    double worst = 0;
    for (std::size_t i = 0; i < d.o.size(); ++i) worst = olmax_test::worse(worst, std::abs(double(f.o.data()[i]) - d.o.data()[i]));
    CHECK(worst < 1e-4);
    olmax::sum(olmax::square(f.o)).backward();
    REQUIRE(q.grad().defined());
    for (float v : q.grad()) REQUIRE(std::isfinite(v));
}

TEST_CASE("scan::gated_delta_rule: under the bf16 policy its float products round their operands, as every float GEMM does",
          "[gated_delta][bf16]") {
    auto in = gdn_make_inputs(2, 40, 2, 8, 8, 19);
    in.resets(0, 17) = 1;
    const auto d = gdn_sc::gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, in.h0, in.resets, {.chunk = 16});
    auto run = [&](bool bf16) {
        std::optional<olmax::backend::bf16_matmul_scope> policy;
        if (bf16) policy.emplace();
        auto f = [](const GdnTensor& t) { return olmax::cast<float>(t); };
        auto q = olmax::parameter(f(in.q)), v = olmax::parameter(f(in.v));
        const auto r = gdn_sc::gated_delta_rule(q, f(in.k), v, f(in.g), f(in.beta), f(in.h0), f(in.resets), {.chunk = 16});
        olmax::sum(olmax::square(r.o)).backward();
        return std::vector<GdnTensor>{olmax::cast<double>(r.o.detach()), olmax::cast<double>(q.grad()), olmax::cast<double>(v.grad())};
    };
    const auto fp32 = run(false), bf16 = run(true);
    CHECK(olmax_test::max_abs_diff(fp32[0], d.o) < 1e-4);
    CHECK(olmax_test::max_abs_diff(bf16[0], d.o) < 3e-2);  // bf16 operands: ~3 significant digits
    for (std::size_t i = 0; i < 3; ++i) {
        INFO("output " << i << " (o, dq, dv)");
        CHECK(olmax_test::max_abs_diff(bf16[i], fp32[i]) > 1e-5);  // the policy did apply
        CHECK(olmax_test::max_abs_diff(bf16[i], fp32[i]) < 0.1);
    }
}

TEST_CASE("scan::gated_delta_rule: bad shapes and sizes throw errors naming the op", "[gated_delta]") {
    const auto in = gdn_make_inputs(2, 5, 2, 3, 4, 10);
    using Catch::Matchers::Contains;
    auto call = [&](const GdnTensor& q, const GdnTensor& k, const GdnTensor& v, const GdnTensor& g, const GdnTensor& beta,
                    const GdnTensor& h0 = {}, const GdnTensor& resets = {}, gdn_sc::GatedDeltaOptions opt = {}) {
        return gdn_sc::gated_delta_rule(q, k, v, g, beta, h0, resets, opt);
    };
    REQUIRE_THROWS_AS(call(olmax::reshape(in.q, {10, 2, 3}), in.k, in.v, in.g, in.beta), olmax::shape_error);
    CHECK_THROWS_WITH(call(olmax::reshape(in.q, {10, 2, 3}), in.k, in.v, in.g, in.beta),
                      Contains("scan::gated_delta_rule") && Contains("[10, 2, 3]"));
    REQUIRE_THROWS_AS(call(in.q, GdnTensor({2, 5, 2, 4}), in.v, in.g, in.beta), olmax::shape_error);
    CHECK_THROWS_WITH(call(in.q, GdnTensor({2, 5, 2, 4}), in.v, in.g, in.beta), Contains("gated_delta_rule: k of shape [2, 5, 2, 4]"));
    REQUIRE_THROWS_AS(call(in.q, in.k, GdnTensor({2, 5, 3, 4}), in.g, in.beta), olmax::shape_error);
    CHECK_THROWS_WITH(call(in.q, in.k, GdnTensor({2, 5, 3, 4}), in.g, in.beta), Contains("gated_delta_rule: v of shape [2, 5, 3, 4]"));
    CHECK_THROWS_AS(call(in.q, in.k, GdnTensor({2, 5, 2}), in.g, in.beta), olmax::shape_error);
    CHECK_THROWS_WITH(call(in.q, in.k, in.v, GdnTensor({2, 5}), in.beta), Contains("gated_delta_rule: g of shape [2, 5]"));
    CHECK_THROWS_WITH(call(in.q, in.k, in.v, in.g, GdnTensor({2, 4, 2})), Contains("gated_delta_rule: beta of shape [2, 4, 2]"));
    CHECK_THROWS_WITH(call(in.q, in.k, in.v, in.g, in.beta, GdnTensor({2, 2, 4, 3})),
                      Contains("gated_delta_rule: h0 of shape [2, 2, 4, 3]") && Contains("[2, 2, 3, 4]"));
    CHECK_THROWS_WITH(call(in.q, in.k, in.v, in.g, in.beta, {}, GdnTensor({2, 6})), Contains("gated_delta_rule: resets of shape [2, 6]"));
    REQUIRE_THROWS_AS(call(in.q, in.k, in.v, in.g, in.beta, {}, {}, {.chunk = 0}), olmax::value_error);
    CHECK_THROWS_WITH(call(in.q, in.k, in.v, in.g, in.beta, {}, {}, {.chunk = 0}), Contains("gated_delta_rule: chunk size must be >= 1"));
    CHECK_THROWS_AS(call(in.q, in.k, in.v, in.g, in.beta, {}, {}, {.scale = std::nan("")}), olmax::value_error);
    CHECK_THROWS_WITH(call(GdnTensor({2, 0, 2, 3}), GdnTensor({2, 0, 2, 3}), GdnTensor({2, 0, 2, 4}), GdnTensor({2, 0, 2}),
                           GdnTensor({2, 0, 2})),
                      Contains("gated_delta_rule: the sequence is empty"));
    CHECK_THROWS_AS(call(GdnTensor({2, 5, 2, 0}), GdnTensor({2, 5, 2, 0}), in.v, in.g, in.beta), olmax::value_error);
    CHECK_THROWS_AS(call(in.q, in.k, GdnTensor({2, 5, 2, 0}), in.g, in.beta), olmax::value_error);
    CHECK_THROWS_WITH(call(GdnTensor(), in.k, in.v, in.g, in.beta), Contains("gated_delta_rule: q, k, v, g and beta must be defined"));
}

TEST_CASE("scan::gated_delta_rule: the serial host kernels give the same bits as the default (threaded) ones", "[gated_delta]") {
    auto in = gdn_make_inputs(2, 40, 3, 8, 8, 11);  // 6 (batch, head) tasks, above the threading threshold
    in.resets(1, 21) = 1;
    olmax::Generator rng(110);
    const auto dout = olmax::randn<double>(in.v.shape(), rng);
    const auto dstate = olmax::randn<double>(in.h0.shape(), rng);
    const auto threaded = gdn_run(in, true, 16, dout, dstate);
    olmax::backend::host_kernels_scope serial(olmax::backend::kernels<olmax::backend::cpu_serial>());
    const auto one_thread = gdn_run(in, true, 16, dout, dstate);
    CHECK(olmax_test::same_bits(threaded.o, one_thread.o));
    CHECK(olmax_test::same_bits(threaded.state, one_thread.state));
    for (std::size_t i = 0; i < 6; ++i) {
        INFO("input " << i);
        CHECK(olmax_test::same_bits(threaded.d[i], one_thread.d[i]));
    }
}

namespace {

using GdnFloat = olmax::Tensor<float>;

/// Traces outs = f(inputs) on float inputs shaped as `values` (the first `differentiable` of them
/// requiring gradients, the rest, e.g. resets, plain program inputs), differentiates
/// sum_i sum(outs[i] * weights[i]) with the tape, and evaluates the program in double precision
/// (the graph's reference evaluation, no plugin) at `values` and `weights`: the outputs, then the
/// gradients of the differentiable inputs, as tensors of their shapes.
std::vector<GdnTensor> gdn_traced(const std::function<std::vector<GdnFloat>(const std::vector<GdnFloat>&)>& f,
                                  const std::vector<GdnTensor>& values, std::size_t differentiable, const std::vector<GdnTensor>& weights) {
    namespace gx = olmax::xla::graph;
    olmax::trace::tracing t;
    std::vector<GdnFloat> inputs;
    for (std::size_t i = 0; i < values.size(); ++i) {
        inputs.push_back(t.input<float>(values[i].shape()));
        if (i < differentiable) inputs.back().set_requires_grad(true);
    }
    const std::vector<GdnFloat> outs = f(inputs);
    REQUIRE(outs.size() == weights.size());
    GdnFloat loss;
    for (std::size_t i = 0; i < outs.size(); ++i) {
        REQUIRE(outs[i].shape() == weights[i].shape());
        const GdnFloat term = olmax::sum(olmax::mul(outs[i], t.input<float>(weights[i].shape())));
        loss = loss.defined() ? olmax::add(loss, term) : term;
    }
    loss.backward();
    std::vector<gx::var> wanted;
    std::vector<olmax::Shape> shapes;
    for (const auto& y : outs) {
        wanted.push_back(olmax::trace::var_of(y));
        shapes.push_back(y.shape());
    }
    for (std::size_t i = 0; i < differentiable; ++i) {
        REQUIRE(inputs[i].grad().defined());
        wanted.push_back(olmax::trace::var_of(inputs[i].grad()));
        shapes.push_back(inputs[i].shape());
    }
    const gx::graph& g = t.graph();
    std::vector<gx::host_value> host;
    std::size_t i = 0;
    for (auto in : g.inputs()) {
        REQUIRE(i < values.size() + weights.size());
        const GdnTensor& v = i < values.size() ? values[i] : weights[i - values.size()];
        ++i;
        host.push_back({g.at(in).outputs[0], std::vector<double>(v.begin(), v.end())});
    }
    REQUIRE(i == values.size() + weights.size());
    const auto results = gx::evaluate(g, host, wanted);
    std::vector<GdnTensor> out;
    for (std::size_t r = 0; r < results.size(); ++r) {
        GdnTensor o(shapes[r]);
        REQUIRE(results[r].data.size() == o.size());
        std::copy(results[r].data.begin(), results[r].data.end(), o.begin());
        out.push_back(o);
    }
    return out;
}

/// The eager op in double: o, state and the gradients of sum(o * dout) + sum(state * dstate) w.r.t.
/// q, k, v, g, beta (and h0 when `use_h0`).
GdnGrads gdn_eager(const GdnInputs& base, bool use_h0, bool use_resets, long chunk, const GdnTensor& dout, const GdnTensor& dstate) {
    std::vector<GdnTensor> x;
    for (const auto& t : base.differentiable()) x.push_back(olmax::parameter(t.clone()));
    if (!use_h0) x.pop_back();
    auto r = gdn_sc::gated_delta_rule(x[0], x[1], x[2], x[3], x[4], use_h0 ? x[5] : GdnTensor(), use_resets ? base.resets : GdnTensor(),
                                      {.chunk = chunk});
    olmax::add(olmax::sum(olmax::mul(r.o, dout)), olmax::sum(olmax::mul(r.state, dstate))).backward();
    GdnGrads out{r.o.detach(), r.state.detach(), {}};
    for (auto& t : x) out.d.push_back(t.grad());
    return out;
}

/// The traced op (resets: none, a host constant, or a traced program input) against the eager op,
/// values and every gradient, all in double.
void gdn_check_traced(const GdnInputs& in, bool use_h0, int resets_mode, long chunk, double tolerance) {
    olmax::Generator rng(70);
    const auto dout = olmax::randn<double>(in.v.shape(), rng), dstate = olmax::randn<double>(in.h0.shape(), rng);
    const auto eager = gdn_eager(in, use_h0, resets_mode != 0, chunk, dout, dstate);
    std::vector<GdnTensor> values{in.q, in.k, in.v, in.g, in.beta};
    if (use_h0) values.push_back(in.h0);
    const std::size_t differentiable = values.size();
    if (resets_mode == 2) values.push_back(in.resets);
    const GdnFloat host_resets = olmax::cast<float>(in.resets);
    const auto traced = gdn_traced(
        [&](const std::vector<GdnFloat>& x) {
            const GdnFloat resets = resets_mode == 0 ? GdnFloat() : resets_mode == 1 ? host_resets : x.back();
            const auto r = gdn_sc::gated_delta_rule(x[0], x[1], x[2], x[3], x[4], use_h0 ? x[5] : GdnFloat(), resets, {.chunk = chunk});
            return std::vector<GdnFloat>{r.o, r.state};
        },
        values, differentiable, {dout, dstate});
    REQUIRE(traced.size() == 2 + differentiable);
    CHECK(olmax_test::max_abs_diff(traced[0], eager.o) < tolerance);
    CHECK(olmax_test::max_abs_diff(traced[1], eager.state) < tolerance);
    for (std::size_t i = 0; i < differentiable; ++i) {
        INFO("gradient of input " << i << " (q, k, v, g, beta, h0)");
        CHECK(olmax_test::max_abs_diff(traced[2 + i], eager.d[i]) < tolerance);
    }
}

}  // namespace

TEST_CASE("scan::gated_delta_rule: the chunked backward equals the sequential adjoint (double, every input, resets, h0)",
          "[gated_delta][grad]") {
    // Chunks longer than the WY block (wy_block steps) run as several blocks, the state entering
    // the later ones recomputed in the backward; T % chunk != 0; resets on and next to block and
    // chunk boundaries. The second shape has K, V above one vector of lanes with ragged ends.
    struct Case {
        std::size_t batch, time, heads, K, V;
    };
    for (const Case& c : {Case{2, 77, 2, 5, 3}, Case{1, 70, 1, 18, 35}}) {
        auto in = gdn_make_inputs(c.batch, c.time, c.heads, c.K, c.V, 120 + c.K);
        for (std::size_t t : {5, 6, 15, 16, 31, 32, 40, 64, 65}) in.resets(0, t) = 1;
        if (c.batch > 1) {
            in.resets(1, 0) = 1;  // h0 does not reach this row
            in.resets(1, 50) = 1;
        }
        olmax::Generator rng(121);
        const auto dout = olmax::randn<double>(in.v.shape(), rng), dstate = olmax::randn<double>(in.h0.shape(), rng);
        const double scale = 1 / std::sqrt(double(c.K));
        for (bool use_h0 : {false, true})
            for (bool use_resets : {false, true}) {
                const auto expected = gdn_reference_grads(in, use_h0, use_resets, scale, dout, dstate);
                const auto values = gdn_reference(in, use_h0, use_resets, scale);
                for (long chunk : {1L, 5L, 16L, 17L, 32L, 33L, 64L, 200L}) {
                    INFO("K " << c.K << ", h0 " << use_h0 << ", resets " << use_resets << ", chunk " << chunk);
                    const auto got = gdn_eager(in, use_h0, use_resets, chunk, dout, dstate);
                    CHECK(gdn_max_diff(got.o, values.o) < 1e-12);
                    CHECK(gdn_max_diff(got.state, values.state) < 1e-12);
                    for (std::size_t i = 0; i < (use_h0 ? 6u : 5u); ++i) {
                        INFO("gradient of input " << i << " (q, k, v, g, beta, h0)");
                        CHECK(gdn_max_diff(got.d[i], expected[i]) < 1e-12);
                    }
                }
            }
    }
}

TEST_CASE("scan::gated_delta_rule: gradients (double) with chunks of several WY blocks and resets at block boundaries",
          "[gated_delta][grad]") {
    auto in = gdn_make_inputs(1, 75, 1, 3, 2, 130);  // chunk 64: several blocks, then a chunk of 11
    in.resets(0, 16) = 1;
    in.resets(0, 32) = 1;
    in.resets(0, 40) = 1;
    in.resets(0, 70) = 1;
    auto f = [&](const std::vector<GdnTensor>& x) {
        return gdn_flat(gdn_sc::gated_delta_rule(x[0], x[1], x[2], x[3], x[4], x[5], in.resets, {.chunk = 64}));
    };
    olmax_test::check_gradients(f, in.differentiable());
    auto g = [&](const std::vector<GdnTensor>& x) {
        return gdn_flat(gdn_sc::gated_delta_rule(x[0], x[1], x[2], x[3], x[4], x[5], GdnTensor(), {.chunk = 48}));
    };
    olmax_test::check_gradients(g, in.differentiable());
}

TEST_CASE("scan::gated_delta_rule traced: the chunked-GEMM program gives the eager op's values and gradients to 1e-12",
          "[gated_delta][trace]") {
    // K = 4: the default scale 1/2 is exact in float, so the double evaluation has nothing rounded to float.
    for (std::size_t time : {std::size_t{16}, std::size_t{13}, std::size_t{6}})
        for (long chunk : {4L, 8L})
            for (bool use_h0 : {true, false}) {
                INFO("T " << time << ", chunk " << chunk << (use_h0 ? ", h0" : ", no h0"));
                const auto in = gdn_make_inputs(2, time, 2, 4, 3, 60 + time);
                gdn_check_traced(in, use_h0, 0, chunk, 1e-12);
            }
}

TEST_CASE("scan::gated_delta_rule traced: the chunk-to-chunk recurrence is one loop, so the program does not grow with T",
          "[gated_delta][trace]") {
    // 4 and 16 chunks of 8, forward and backward: as many nodes and constant numbers either way,
    // the recurrence one matrix_scan each way (unrolled, the chunks' products grew with T / chunk;
    // the block inverse's starting identity was a host tensor of T ones).
    namespace gx = olmax::xla::graph;
    std::vector<std::size_t> nodes, numbers;
    for (std::size_t time : {std::size_t{32}, std::size_t{128}}) {
        olmax::trace::tracing t;
        std::vector<GdnFloat> x;
        for (const olmax::Shape& s : {olmax::Shape{1, time, 2, 4}, olmax::Shape{1, time, 2, 4}, olmax::Shape{1, time, 2, 3}, olmax::Shape{1, time, 2},
                                      olmax::Shape{1, time, 2}, olmax::Shape{1, 2, 4, 3}})
            x.push_back(t.input<float>(s).set_requires_grad(true));
        const auto r = gdn_sc::gated_delta_rule(x[0], x[1], x[2], x[3], x[4], x[5], GdnFloat(), {.chunk = 8});
        olmax::add(olmax::sum(r.o), olmax::sum(r.state)).backward();
        std::size_t scans = 0;
        for (const auto& n : t.graph().nodes()) scans += n.is<gx::prim::matrix_scan>();
        CHECK(scans == 2);
        nodes.push_back(t.graph().nodes().size());
        numbers.push_back(olmax_test::constant_numbers(t.graph()));
    }
    CHECK(nodes[0] == nodes[1]);
    CHECK(numbers[0] == numbers[1]);
}

TEST_CASE("scan::gated_delta_rule traced: resets, as a host constant and as a program input, to 1e-12", "[gated_delta][trace]") {
    auto in = gdn_make_inputs(2, 19, 2, 4, 3, 80);
    in.resets(0, 5) = 1;
    in.resets(0, 6) = 1;   // two starts in a row: a one-step document
    in.resets(0, 8) = 1;   // on a chunk boundary for chunk 4 and 8
    in.resets(0, 11) = 1;  // the last step of a chunk of 4
    in.resets(1, 0) = 1;   // h0 does not reach this row
    in.resets(1, 13) = 1;
    for (long chunk : {4L, 8L})
        for (int mode : {1, 2})
            for (bool use_h0 : {true, false}) {
                INFO("chunk " << chunk << (mode == 1 ? ", host resets" : ", traced resets") << (use_h0 ? ", h0" : ", no h0"));
                gdn_check_traced(in, use_h0, mode, chunk, 1e-12);
            }
}

TEST_CASE("scan::gated_delta_rule traced: unnormalised k, strong decay, chunk 1 and a chunk longer than T", "[gated_delta][trace]") {
    auto in = gdn_make_inputs(1, 11, 3, 4, 2, 90);
    olmax::Generator rng(91);
    in.k = olmax::randn<double>(in.k.shape(), rng, 0.0, 0.6);
    for (std::size_t t = 0; t < 11; ++t) in.g(0, t, 1) = t % 4 == 0 ? -30.0 : in.g(0, t, 1);  // e^gamma underflows towards 0
    for (long chunk : {1L, 3L, 8L, 64L}) {
        INFO("chunk " << chunk);
        gdn_check_traced(in, true, 0, chunk, 1e-12);
    }
}

namespace {

gdn_nn::GatedDeltaNetConfig gdn_small_config() {
    gdn_nn::GatedDeltaNetConfig c;
    c.features = 5;
    c.heads = 2;
    c.head_dim = 3;
    c.conv_kernel = 3;
    c.chunk = 3;
    return c;
}

std::vector<GdnTensor> gdn_parameters(gdn_nn::GatedDeltaNet<double>& layer) {
    std::vector<GdnTensor> out;
    gdn_nn::ParameterVisitor<double> visit([&](const std::string&, GdnTensor& t, gdn_nn::Role, gdn_nn::Sharing) { out.push_back(t.detach().clone()); });
    layer.visit_parameters(visit);
    return out;
}

void gdn_bind(gdn_nn::GatedDeltaNet<double>& layer, const std::vector<GdnTensor>& params) {
    std::size_t i = 0;
    gdn_nn::ParameterVisitor<double> visit([&](const std::string&, GdnTensor& t, gdn_nn::Role, gdn_nn::Sharing) { t = params[i++]; });
    layer.visit_parameters(visit);
}

GdnTensor gdn_flat_layer(const gdn_nn::GatedDeltaNetOutput<double>& out) {
    return olmax::concat({olmax::reshape(out.y, {out.y.size()}), olmax::reshape(out.state.delta, {out.state.delta.size()}),
                          olmax::reshape(out.state.conv, {out.state.conv.size()})},
                         0);
}

}  // namespace

TEST_CASE("nn::GatedDeltaNet: layer contract, parameters and sizes", "[gated_delta]") {
    static_assert(gdn_nn::assert_layer<gdn_nn::GatedDeltaNet<float>>());
    static_assert(gdn_nn::assert_layer<gdn_nn::GatedDeltaNet<double>>());
    gdn_nn::Config config;
    config.features = 16;  // below 64: one head of 16
    gdn_nn::Module<gdn_nn::GatedDeltaNet<double>> module(config);
    const auto params = module.parameters();
    REQUIRE(params.size() == 7);
    const std::size_t D = 16, H = 1, d = 16, E = 16;
    CHECK(params[0].name == "gated_deltanet/in_proj/weight");
    CHECK(params[0].tensor.shape() == olmax::Shape{D, 4 * E + 2 * H});
    CHECK(params[1].tensor.shape() == olmax::Shape{4, 3 * E});
    CHECK(params[2].tensor.shape() == olmax::Shape{3 * E});
    CHECK(params[3].name == "gated_deltanet/A_log");
    CHECK(params[3].role == gdn_nn::Role::other);
    CHECK(params[4].name == "gated_deltanet/dt_bias");
    CHECK(params[5].tensor.shape() == olmax::Shape{d});
    CHECK(params[5].role == gdn_nn::Role::norm_scale);
    CHECK(params[6].tensor.shape() == olmax::Shape{E, D});
    const double A = std::exp(params[3].tensor(0));
    CHECK(A >= 1);
    CHECK(A <= 16);
    const double dt = std::log1p(std::exp(params[4].tensor(0)));
    CHECK(dt >= 1e-3 * (1 - 1e-9));
    CHECK(dt <= 1e-1 * (1 + 1e-9));
    olmax::Generator rng(1);
    const auto x = olmax::randn<double>({2, 5, 16}, rng);
    CHECK(module(x).shape() == x.shape());

    gdn_nn::GatedDeltaNetConfig wide;
    wide.features = 256;
    CHECK(wide.head_size() == 64);
    CHECK(wide.head_count() == 4);
}

TEST_CASE("nn::GatedDeltaNet: check_layer_gradients (double), input and every parameter", "[gated_delta][grad]") {
    olmax::Generator rng(21);
    gdn_nn::GatedDeltaNet<double> layer(gdn_small_config(), rng);
    const auto result = olmax::testing::check_layer_gradients(layer, olmax::randn<double>({2, 7, 5}, rng));
    INFO(result);
    CHECK(result.ok);
    CHECK(result.checked > 0);
}

TEST_CASE("nn::GatedDeltaNet: gradients (double) with resets and through the carried state", "[gated_delta][grad]") {
    olmax::Generator rng(22);
    gdn_nn::GatedDeltaNet<double> layer(gdn_small_config(), rng);
    const auto params = gdn_parameters(layer);
    const GdnTensor x = olmax::randn<double>({2, 6, 5}, rng);
    const GdnTensor delta = olmax::randn<double>({2, 2, 3, 3}, rng, 0.0, 0.5), conv = olmax::randn<double>({2, 2, 18}, rng);
    GdnTensor resets({2, 6});
    resets(0, 2) = 1;
    resets(1, 4) = 1;
    auto f = [&](const std::vector<GdnTensor>& in) {
        gdn_bind(layer, std::vector<GdnTensor>(in.begin() + 3, in.end()));
        return gdn_flat_layer(layer.forward_with_state(in[0], {in[1], in[2]}, resets));
    };
    std::vector<GdnTensor> inputs{x, delta, conv};
    inputs.insert(inputs.end(), params.begin(), params.end());
    olmax_test::check_gradients(f, inputs);
}

TEST_CASE("nn::GatedDeltaNet: a packed pair with a reset equals the two sequences run alone", "[gated_delta]") {
    olmax::Generator rng(23);
    gdn_nn::GatedDeltaNet<double> layer(gdn_small_config(), rng);
    const std::size_t first = 4, total = 11;
    const GdnTensor x = olmax::randn<double>({1, total, 5}, rng);
    GdnTensor resets({1, total});
    resets(0, first) = 1;
    const auto packed = layer.forward(x, resets);
    const auto one = layer.forward(olmax::slice(x, 1, 0, first));
    const auto two = layer.forward(olmax::slice(x, 1, first, total));
    CHECK(olmax_test::max_abs_diff(packed, olmax::concat({one, two}, 1)) < 1e-13);
    CHECK(olmax_test::max_abs_diff(olmax::slice(layer.forward(x), 1, first, total), two) > 1e-6);  // the reset matters
}

TEST_CASE("nn::GatedDeltaNet: running in pieces with the carried state equals one call", "[gated_delta]") {
    olmax::Generator rng(24);
    gdn_nn::GatedDeltaNet<double> layer(gdn_small_config(), rng);
    const std::size_t total = 13;
    const GdnTensor x = olmax::randn<double>({2, total, 5}, rng);
    GdnTensor resets({2, total});
    resets(0, 5) = 1;  // within conv_kernel - 1 of the first piece's end: the carried conv inputs must stop there
    resets(1, 7) = 1;
    const auto whole = layer.forward_with_state(x, {}, resets);
    gdn_nn::GatedDeltaNetState<double> state;
    std::vector<GdnTensor> pieces;
    for (auto [begin, end] : {std::pair<std::size_t, std::size_t>{0, 6}, {6, 7}, {7, 13}}) {
        const auto out = layer.forward_with_state(olmax::slice(x, 1, begin, end), state, olmax::slice(resets, 1, begin, end));
        pieces.push_back(out.y);
        state = out.state;
    }
    CHECK(olmax_test::max_abs_diff(olmax::concat(pieces, 1), whole.y) < 1e-13);
    CHECK(olmax_test::max_abs_diff(state.delta, whole.state.delta) < 1e-13);
    CHECK(olmax_test::max_abs_diff(state.conv, whole.state.conv) < 1e-13);
}

TEST_CASE("nn::GatedDeltaNet: causal, and float trains", "[gated_delta]") {
    olmax::Generator rng(25);
    gdn_nn::GatedDeltaNet<double> layer(gdn_small_config(), rng);
    const GdnTensor x = olmax::randn<double>({1, 9, 5}, rng);
    GdnTensor changed = x.clone();
    for (std::size_t f = 0; f < 5; ++f) changed(0, 6, f) += 1.0;
    const auto a = layer.forward(x), b = layer.forward(changed);
    CHECK(olmax_test::max_abs_diff(olmax::slice(a, 1, 0, 6), olmax::slice(b, 1, 0, 6)) < 1e-14);
    CHECK(olmax_test::max_abs_diff(olmax::slice(a, 1, 6, 9), olmax::slice(b, 1, 6, 9)) > 1e-6);

    gdn_nn::GatedDeltaNetConfig config;
    config.features = 8;
    config.heads = 2;
    config.head_dim = 4;
    config.chunk = 16;
    olmax::Generator rng_f(26);
    gdn_nn::GatedDeltaNet<float> layer_f(config, rng_f);
    auto xf = olmax::parameter(olmax::randn<float>({2, 37, 8}, rng_f));
    olmax::sum(olmax::square(layer_f.forward(xf))).backward();
    REQUIRE(xf.grad().defined());
    for (float v : xf.grad()) REQUIRE(std::isfinite(v));
}

TEST_CASE("nn::GatedDeltaNet: bad sizes and inputs throw errors naming the layer", "[gated_delta]") {
    using Catch::Matchers::Contains;
    olmax::Generator rng(27);
    auto config = gdn_small_config();
    config.conv_kernel = 0;
    REQUIRE_THROWS_AS(gdn_nn::GatedDeltaNet<double>(config, rng), olmax::value_error);
    CHECK_THROWS_WITH(gdn_nn::GatedDeltaNet<double>(config, rng), Contains("nn::GatedDeltaNet"));
    config = gdn_small_config();
    config.dt_min = 0;
    CHECK_THROWS_AS(gdn_nn::GatedDeltaNet<double>(config, rng), olmax::value_error);
    CHECK_THROWS_WITH(gdn_nn::GatedDeltaNet<double>(gdn_nn::Config{}, rng), Contains("nn::GatedDeltaNet") && Contains("features"));
    gdn_nn::GatedDeltaNet<double> layer(gdn_small_config(), rng);
    REQUIRE_THROWS_AS(layer.forward(GdnTensor({1, 4, 6})), olmax::shape_error);
    CHECK_THROWS_WITH(layer.forward(GdnTensor({1, 4, 6})), Contains("nn::GatedDeltaNet: expected input [batch, T, 5]"));
    CHECK_THROWS_AS(layer.forward(GdnTensor({4, 5})), olmax::shape_error);
    CHECK_THROWS_AS(layer.forward(GdnTensor({1, 0, 5})), olmax::value_error);
    CHECK_THROWS_AS(layer.forward(GdnTensor({0, 4, 5})), olmax::value_error);
    CHECK_THROWS_WITH(layer.forward(GdnTensor({2, 4, 5}), GdnTensor({2, 5})), Contains("nn::GatedDeltaNet: resets of shape [2, 5]"));
    CHECK_THROWS_WITH(layer.forward_with_state(GdnTensor({2, 4, 5}), {GdnTensor({2, 2, 3, 4}), {}}),
                      Contains("nn::GatedDeltaNet: carried delta-rule state of shape [2, 2, 3, 4]"));
    CHECK_THROWS_WITH(layer.forward_with_state(GdnTensor({2, 4, 5}), {{}, GdnTensor({2, 3, 18})}),
                      Contains("nn::GatedDeltaNet: carried conv state of shape [2, 3, 18]"));
}

TEST_CASE("nn::GatedDeltaNet: works inside nn::Stack (stacked parameters)", "[gated_delta]") {
    gdn_nn::Config config;
    config.features = 4;
    config.depth = 2;
    olmax::Generator rng(28);
    gdn_nn::Stack<gdn_nn::GatedDeltaNet<double>> stack(config, rng);
    auto x = olmax::parameter(olmax::randn<double>({2, 5, 4}, rng));
    const auto y = stack.forward(x);
    CHECK(y.shape() == x.shape());
    olmax::sum(olmax::square(y)).backward();
    REQUIRE(x.grad().defined());
    std::size_t with_grad = 0;
    for (const auto& p : gdn_nn::parameters(stack)) with_grad += p.tensor.grad().defined();
    CHECK(with_grad == 7);
}

TEST_CASE("nn::GatedDeltaNet traced: the program gives the eager layer's values and gradients (input, every parameter) to 1e-12",
          "[gated_delta][trace]") {
    gdn_nn::GatedDeltaNetConfig config;
    config.features = 6;
    config.heads = 2;
    config.head_dim = 4;  // the delta rule's scale 1/2 is exact in float
    config.conv_kernel = 3;
    config.chunk = 4;
    config.norm_eps = std::ldexp(1.0, -20);  // epsilons exact in float too
    config.l2_eps = std::ldexp(1.0, -20);
    olmax::Generator rng(95);
    gdn_nn::GatedDeltaNet<float> layer_f(config, rng);
    gdn_nn::GatedDeltaNet<double> layer(config, rng);
    // The parameters are program inputs, as in a training step (a host parameter would be a float
    // constant, and the parts of the chain that read only parameters, exp(A_log), would be computed
    // on the host in float); the double layer gets the float layer's values, exactly.
    std::vector<GdnTensor> params;
    gdn_nn::ParameterVisitor<float> read([&](const std::string&, GdnFloat& t, gdn_nn::Role, gdn_nn::Sharing) { params.push_back(olmax::cast<double>(t)); });
    layer_f.visit_parameters(read);
    const auto x = olmax::randn<double>({2, 10, 6}, rng), r = olmax::randn<double>({2, 10, 6}, rng);
    GdnTensor resets({2, 10});
    resets(0, 3) = 1;
    resets(0, 4) = 1;
    resets(1, 0) = 1;
    resets(1, 8) = 1;
    for (bool use_resets : {false, true}) {
        INFO((use_resets ? "resets (a program input)" : "no resets"));
        std::vector<GdnTensor> eager_params;
        for (const auto& p : params) eager_params.push_back(olmax::parameter(p.clone()));
        gdn_bind(layer, eager_params);
        auto xp = olmax::parameter(x.clone());
        const auto y = use_resets ? layer.forward(xp, resets) : layer.forward(xp);
        olmax::sum(olmax::mul(y, r)).backward();
        std::vector<GdnTensor> values{x};
        values.insert(values.end(), params.begin(), params.end());
        const std::size_t differentiable = values.size();
        if (use_resets) values.push_back(resets);
        const auto traced = gdn_traced(
            [&](const std::vector<GdnFloat>& in) {
                std::size_t i = 1;
                gdn_nn::ParameterVisitor<float> bind([&](const std::string&, GdnFloat& t, gdn_nn::Role, gdn_nn::Sharing) { t = in[i++]; });
                layer_f.visit_parameters(bind);
                return std::vector<GdnFloat>{use_resets ? layer_f.forward(in[0], in.back()) : layer_f.forward(in[0])};
            },
            values, differentiable, {r});
        REQUIRE(traced.size() == 1 + differentiable);
        CHECK(olmax_test::max_abs_diff(traced[0], y.detach()) < 1e-12);
        CHECK(olmax_test::max_abs_diff(traced[1], xp.grad()) < 1e-12);
        for (std::size_t i = 0; i < params.size(); ++i) {
            INFO("parameter " << i);
            REQUIRE(eager_params[i].grad().defined());
            CHECK(olmax_test::max_abs_diff(traced[2 + i], eager_params[i].grad()) < 1e-12);
        }
    }
}

TEST_CASE("nn::GatedDeltaNet traced inside nn::Stack (one layer loop): the program gives the eager float stack's values and input gradient",
          "[gated_delta][trace]") {
    namespace gx = olmax::xla::graph;
    gdn_nn::Config config;
    config.features = 8;  // one head of 8, chunk 64: T = 70 is two chunks, the second padded
    config.depth = 3;
    olmax::Generator rng(29);
    gdn_nn::Stack<gdn_nn::GatedDeltaNet<float>> stack(config, rng);
    const auto x = olmax::randn<float>({2, 70, 8}, rng), r = olmax::randn<float>({2, 70, 8}, rng);
    auto xp = olmax::parameter(x.clone());
    const auto y = stack.forward(xp);
    olmax::sum(olmax::mul(y, r)).backward();
    // The parameters are the program's state (bound before the trace reads them), then x and r.
    std::vector<std::vector<double>> values;
    std::vector<GdnFloat> state;
    for (const auto& p : olmax::optim::parameters_of(stack)) {
        state.push_back(p.tensor);
        values.emplace_back(p.tensor.begin(), p.tensor.end());
    }
    values.emplace_back(x.begin(), x.end());
    values.emplace_back(r.begin(), r.end());
    olmax::trace::tracing t;
    for (const auto& s : state) t.bind_state(s);
    auto xi = t.input<float>(x.shape()).set_requires_grad(true);
    const GdnFloat yt = stack.forward(xi);
    olmax::sum(olmax::mul(yt, t.input<float>(r.shape()))).backward();
    const gx::graph& g = t.graph();
    REQUIRE(g.inputs().size() == values.size());
    std::vector<gx::host_value> host;
    std::size_t i = 0;
    for (auto in : g.inputs()) host.push_back({g.at(in).outputs[0], values[i++]});
    const auto results = gx::evaluate(g, host, {olmax::trace::var_of(yt), olmax::trace::var_of(xi.grad())});
    double dy = 0, dx = 0, y_max = 0, dx_max = 0;
    for (std::size_t k = 0; k < y.size(); ++k) {
        dy = olmax_test::worse(dy, std::abs(results[0].data[k] - double(y.data()[k])));
        dx = olmax_test::worse(dx, std::abs(results[1].data[k] - double(xp.grad().data()[k])));
        y_max = std::max(y_max, std::abs(double(y.data()[k])));
        dx_max = std::max(dx_max, std::abs(double(xp.grad().data()[k])));
    }
    // eager float against the program in double: float rounding, relative to the largest entry
    CHECK(dy < 1e-5 * y_max);
    CHECK(dx < 1e-5 * dx_max);
}
