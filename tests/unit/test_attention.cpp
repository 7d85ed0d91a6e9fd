// olmax::causal_attention (blocked, O(T) memory backward), olmax::rope and
// nn::CausalSelfAttention: the op against a materialised softmax reference (values and gradients,
// tiles that do and do not divide T, windows, grouped-query heads, resets), central-difference
// gradient checks in double, causality, packed documents, bad shapes.
#include "test_helpers.hpp"
#include "traced_constants.hpp"

#include "olmax/nn/attention.hpp"
#include "olmax/ops/attention.hpp"
#include "olmax/ops/masks.hpp"
#include "olmax/ops/rope.hpp"
#include "olmax/trace/trace.hpp"
#include "olmax/xla/graph/evaluate.hpp"

#include <cmath>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace nn = olmax::nn;
using olmax::Tensor;

namespace {

/// softmax(scale q k^T + mask) v built from ordinary ops (transpose, matmul, softmax), the T x T
/// scores materialised. The mask is written from the definition: key s is visible to query t when
/// s <= t, t - s < window (window > 0) and no document starts in (s, t].
Tensor<double> attn_reference(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v, double scale, std::size_t window,
                              const Tensor<double>& resets) {
    const std::size_t B = q.extent(0), T = q.extent(1), H = q.extent(2), Hkv = k.extent(2), group = H / Hkv;
    Tensor<double> qh = olmax::transpose(q, {0, 2, 1, 3});  // [B, H, T, Dh]
    Tensor<double> kh = olmax::transpose(k, {0, 2, 1, 3});  // [B, Hkv, T, Dh]
    Tensor<double> vh = olmax::transpose(v, {0, 2, 1, 3});
    if (group > 1) {
        std::vector<Tensor<double>> ks, vs;
        for (std::size_t h = 0; h < H; ++h) {
            ks.push_back(olmax::slice(kh, 1, h / group, h / group + 1));
            vs.push_back(olmax::slice(vh, 1, h / group, h / group + 1));
        }
        kh = olmax::concat(ks, 1);
        vh = olmax::concat(vs, 1);
    }
    Tensor<double> mask({B, 1, T, T});
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t t = 0; t < T; ++t)
            for (std::size_t s = 0; s < T; ++s) {
                bool visible = s <= t && (window == 0 || t - s < window);
                if (visible && resets.defined())
                    for (std::size_t u = s + 1; u <= t; ++u) visible = visible && resets(b, u) == 0;
                mask(b, 0, t, s) = visible ? 0.0 : -1e9;
            }
    const Tensor<double> scores = olmax::add(olmax::matmul(qh, olmax::transpose(kh, {0, 1, 3, 2})) * scale, mask);
    return olmax::transpose(olmax::matmul(olmax::softmax(scores, -1), vh), {0, 2, 1, 3});
}

struct AttnCase {
    std::size_t batch, time, heads, kv_heads, dim, window, query_tile, key_tile;
    bool resets;
};

struct AttnRun {
    Tensor<double> y, dq, dk, dv;
};

/// Output and gradients of sum(f(q, k, v) * r).
template <class F>
AttnRun attn_run(F&& f, const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v, const Tensor<double>& r) {
    auto qp = olmax::parameter(q.clone()), kp = olmax::parameter(k.clone()), vp = olmax::parameter(v.clone());
    Tensor<double> y = f(qp, kp, vp);
    olmax::sum(olmax::mul(y, r)).backward();
    return {y.detach(), qp.grad(), kp.grad(), vp.grad()};
}

Tensor<double> attn_resets(std::size_t batch, std::size_t time, std::initializer_list<std::pair<std::size_t, std::size_t>> starts) {
    Tensor<double> resets({batch, time});
    for (auto [b, t] : starts) resets(b, t) = 1;
    return resets;
}

template <class T>
std::vector<Tensor<T>> attn_parameters(nn::CausalSelfAttention<T>& layer) {
    std::vector<Tensor<T>> out;
    nn::ParameterVisitor<T> visit([&](const std::string&, Tensor<T>& t, nn::Role, nn::Sharing) { out.push_back(t.detach().clone()); });
    layer.visit_parameters(visit);
    return out;
}

template <class T>
void attn_bind_parameters(nn::CausalSelfAttention<T>& layer, const std::vector<Tensor<T>>& params) {
    std::size_t i = 0;
    nn::ParameterVisitor<T> visit([&](const std::string&, Tensor<T>& t, nn::Role, nn::Sharing) { t = params[i++]; });
    layer.visit_parameters(visit);
}

/// Traces y = f(inputs) on float inputs shaped as `values`, differentiates sum(y * r) with the tape,
/// and evaluates the program in double precision at `values` and `r`: {y, d/d input 0, ...}, as
/// tensors of the inputs' shapes (zeros for an input without a gradient, such as resets). With
/// `bf16_gemms` the trace's GEMMs round their operands to bfloat16 (the bf16 policy).
std::vector<Tensor<double>> attn_traced(const std::function<Tensor<float>(const std::vector<Tensor<float>>&)>& f,
                                        const std::vector<Tensor<double>>& values, const Tensor<double>& r, bool bf16_gemms = false) {
    namespace gx = olmax::xla::graph;
    olmax::trace::tracing t;
    t.set_bf16_gemms(bf16_gemms);
    std::vector<Tensor<float>> inputs;
    for (const auto& v : values) inputs.push_back(t.input<float>(v.shape()).set_requires_grad(true));
    const Tensor<float> y = f(inputs);
    REQUIRE(y.shape() == r.shape());
    const Tensor<float> w = t.input<float>(r.shape());
    olmax::sum(olmax::mul(y, w)).backward();
    std::vector<gx::var> wanted{olmax::trace::var_of(y)};
    std::vector<std::size_t> differentiated;  // inputs with a gradient (resets have none: zeros)
    for (std::size_t k = 0; k < inputs.size(); ++k)
        if (inputs[k].grad().defined()) {
            differentiated.push_back(k);
            wanted.push_back(olmax::trace::var_of(inputs[k].grad()));
        }
    const gx::graph& g = t.graph();
    std::vector<gx::host_value> host;
    std::size_t i = 0;
    for (auto in : g.inputs()) {
        const Tensor<double>& v = i < values.size() ? values[i] : r;
        ++i;
        host.push_back({g.at(in).outputs[0], std::vector<double>(v.begin(), v.end())});
    }
    REQUIRE(i == values.size() + 1);
    const auto results = gx::evaluate(g, host, wanted);
    std::vector<Tensor<double>> out{Tensor<double>(r.shape())};
    for (const auto& v : values) out.emplace_back(v.shape());
    for (std::size_t k = 0; k < results.size(); ++k) {
        Tensor<double>& o = out[k == 0 ? 0 : 1 + differentiated[k - 1]];
        REQUIRE(results[k].data.size() == o.size());
        std::copy(results[k].data.begin(), results[k].data.end(), o.begin());
    }
    return out;
}

nn::AttentionConfig attn_small_config() {
    return {.features = 8, .heads = 4, .kv_heads = 2, .head_dim = 4, .window = 0, .rope_base = 10000, .qk_norm = true, .query_tile = 3,
            .key_tile = 4};
}

}  // namespace

TEST_CASE("causal_attention: matches the materialised softmax reference, values and gradients, to 1e-12", "[attention]") {
    const AttnCase cases[] = {
        {2, 13, 4, 4, 8, 0, 4, 5, false},      // tiles that do not divide T
        {2, 12, 4, 4, 8, 0, 4, 6, false},      // tiles that divide T
        {1, 13, 2, 2, 5, 0, 64, 128, false},   // default tiles: one tile each way
        {2, 11, 3, 3, 4, 0, 1, 1, false},      // one query and one key per tile
        {2, 17, 4, 2, 6, 5, 4, 3, false},      // window, GQA
        {2, 17, 4, 1, 6, 0, 5, 4, true},       // multi-query with resets
        {2, 19, 6, 3, 4, 4, 3, 2, true},       // window, GQA and resets together
        {1, 40, 2, 1, 8, 9, 16, 8, true},      // longer, a window shorter than a query tile
        {1, 40, 2, 2, 8, 0, 7, 64, true},      // key tile larger than T
        {2, 10, 2, 1, 4, 1, 3, 2, true},       // window 1: each query sees itself only
        {1, 10, 2, 2, 4, 25, 4, 4, false},     // a window longer than T changes nothing
        {2, 1, 2, 2, 4, 0, 64, 128, false},    // T = 1
    };
    for (const AttnCase& c : cases) {
        INFO("batch " << c.batch << " T " << c.time << " heads " << c.heads << "/" << c.kv_heads << " dim " << c.dim << " window " << c.window
                      << " tiles " << c.query_tile << "x" << c.key_tile << " resets " << c.resets);
        olmax::Generator rng(100 + c.time + c.heads);
        const auto q = olmax::randn<double>({c.batch, c.time, c.heads, c.dim}, rng);
        const auto k = olmax::randn<double>({c.batch, c.time, c.kv_heads, c.dim}, rng);
        const auto v = olmax::randn<double>({c.batch, c.time, c.kv_heads, c.dim}, rng);
        const auto r = olmax::randn<double>(q.shape(), rng);
        Tensor<double> resets;
        if (c.resets) {
            resets = Tensor<double>({c.batch, c.time});
            resets(0, 0) = 1;  // a start at 0 changes nothing
            resets(0, c.time / 3) = 1;
            resets(0, c.time / 3 + 1) = 1;  // a one-token document
            resets(c.batch - 1, c.time - 2) = 1;
        }
        const double scale = 0.7 / std::sqrt(double(c.dim));
        const AttnRun blocked = attn_run(
            [&](const Tensor<double>& a, const Tensor<double>& b, const Tensor<double>& d) {
                return olmax::causal_attention(a, b, d,
                                               {.scale = scale, .window = c.window, .resets = resets, .query_tile = c.query_tile, .key_tile = c.key_tile});
            },
            q, k, v, r);
        const AttnRun naive = attn_run(
            [&](const Tensor<double>& a, const Tensor<double>& b, const Tensor<double>& d) { return attn_reference(a, b, d, scale, c.window, resets); },
            q, k, v, r);
        REQUIRE(blocked.y.shape() == q.shape());
        REQUIRE(blocked.dk.shape() == k.shape());
        CHECK(olmax_test::max_abs_diff(blocked.y, naive.y) < 1e-12);
        CHECK(olmax_test::max_abs_diff(blocked.dq, naive.dq) < 1e-12);
        CHECK(olmax_test::max_abs_diff(blocked.dk, naive.dk) < 1e-12);
        CHECK(olmax_test::max_abs_diff(blocked.dv, naive.dv) < 1e-12);
    }
}

TEST_CASE("causal_attention: tiles of several register blocks, head dims off the SIMD width, in double and float", "[attention]") {
    // The tile products run on register blocks of a few rows by a few SIMD vectors, skip the steps
    // above the diagonal and the keys before every row's window or document; here tiles span many
    // blocks, T is a multiple of neither tile and the head dims leave partial vectors (padded).
    const AttnCase cases[] = {
        {1, 150, 4, 2, 20, 37, 24, 40, true},   // window, GQA, resets
        {2, 131, 2, 2, 16, 0, 32, 48, false},   // query tile shorter than the key tile
        {1, 97, 3, 1, 9, 0, 13, 64, true},      // multi-query, odd sizes
        {1, 120, 2, 2, 12, 0, 40, 16, true},    // query tile longer than the key tile
        {1, 200, 2, 1, 33, 50, 64, 128, false}, // default tiles, a window shorter than a key tile
        {1, 130, 2, 2, 64, 0, 64, 128, true},   // head dim 64
    };
    for (const AttnCase& c : cases) {
        INFO("batch " << c.batch << " T " << c.time << " heads " << c.heads << "/" << c.kv_heads << " dim " << c.dim << " window " << c.window
                      << " tiles " << c.query_tile << "x" << c.key_tile << " resets " << c.resets);
        olmax::Generator rng(300 + c.time + c.dim);
        const auto q = olmax::randn<double>({c.batch, c.time, c.heads, c.dim}, rng);
        const auto k = olmax::randn<double>({c.batch, c.time, c.kv_heads, c.dim}, rng);
        const auto v = olmax::randn<double>({c.batch, c.time, c.kv_heads, c.dim}, rng);
        const auto r = olmax::randn<double>(q.shape(), rng);
        Tensor<double> resets;
        if (c.resets) resets = attn_resets(c.batch, c.time, {{0, c.time / 4}, {0, c.time / 2 + 3}, {c.batch - 1, c.time - 20}});
        const double scale = 0.9 / std::sqrt(double(c.dim));
        const AttnRun naive = attn_run(
            [&](const Tensor<double>& a, const Tensor<double>& b, const Tensor<double>& d) { return attn_reference(a, b, d, scale, c.window, resets); },
            q, k, v, r);
        const AttnRun blocked = attn_run(
            [&](const Tensor<double>& a, const Tensor<double>& b, const Tensor<double>& d) {
                return olmax::causal_attention(a, b, d,
                                               {.scale = scale, .window = c.window, .resets = resets, .query_tile = c.query_tile, .key_tile = c.key_tile});
            },
            q, k, v, r);
        CHECK(olmax_test::max_abs_diff(blocked.y, naive.y) < 1e-12);
        CHECK(olmax_test::max_abs_diff(blocked.dq, naive.dq) < 1e-12);
        CHECK(olmax_test::max_abs_diff(blocked.dk, naive.dk) < 1e-12);
        CHECK(olmax_test::max_abs_diff(blocked.dv, naive.dv) < 1e-12);
        if (&c == &cases[0]) {  // the threads' chunks start inside a head here: the same bits on one thread
            olmax::backend::host_kernels_scope serial(olmax::backend::kernels<olmax::backend::cpu_serial>());
            const AttnRun one_thread = attn_run(
                [&](const Tensor<double>& a, const Tensor<double>& b, const Tensor<double>& d) {
                    return olmax::causal_attention(
                        a, b, d, {.scale = scale, .window = c.window, .resets = resets, .query_tile = c.query_tile, .key_tile = c.key_tile});
                },
                q, k, v, r);
            CHECK(olmax_test::same_bits(blocked.y, one_thread.y));
            CHECK(olmax_test::same_bits(blocked.dq, one_thread.dq));
            CHECK(olmax_test::same_bits(blocked.dk, one_thread.dk));
            CHECK(olmax_test::same_bits(blocked.dv, one_thread.dv));
        }
        // float: the same blocks on twice the lanes
        auto qf = olmax::parameter(olmax::cast<float>(q)), kf = olmax::parameter(olmax::cast<float>(k)), vf = olmax::parameter(olmax::cast<float>(v));
        const Tensor<float> resets_f = c.resets ? olmax::cast<float>(resets) : Tensor<float>();
        const Tensor<float> yf = olmax::causal_attention(
            qf, kf, vf, {.scale = scale, .window = c.window, .resets = resets_f, .query_tile = c.query_tile, .key_tile = c.key_tile});
        olmax::sum(olmax::mul(yf, olmax::cast<float>(r))).backward();
        CHECK(olmax_test::max_abs_diff(olmax::cast<double>(yf.detach()), naive.y) < 2e-5);
        CHECK(olmax_test::max_abs_diff(olmax::cast<double>(qf.grad()), naive.dq) < 1e-4);
        CHECK(olmax_test::max_abs_diff(olmax::cast<double>(kf.grad()), naive.dk) < 1e-4);
        CHECK(olmax_test::max_abs_diff(olmax::cast<double>(vf.grad()), naive.dv) < 1e-4);
    }
}

TEST_CASE("causal_attention: under the bf16 policy its float products round their operands, as every float GEMM does", "[attention][bf16]") {
    olmax::Generator rng(12);
    const std::size_t T = 70, H = 4, Hkv = 2, Dh = 16;
    const auto q = olmax::randn<double>({1, T, H, Dh}, rng), k = olmax::randn<double>({1, T, Hkv, Dh}, rng), v = olmax::randn<double>({1, T, Hkv, Dh}, rng);
    const auto r = olmax::randn<double>(q.shape(), rng);
    const auto resets = attn_resets(1, T, {{0, 30}});
    const double scale = 1 / std::sqrt(double(Dh));
    const AttnRun naive = attn_run(
        [&](const Tensor<double>& a, const Tensor<double>& b, const Tensor<double>& d) { return attn_reference(a, b, d, scale, 25, resets); }, q, k, v, r);
    auto run = [&](bool bf16) {
        std::optional<olmax::backend::bf16_matmul_scope> policy;
        if (bf16) policy.emplace();
        auto qf = olmax::parameter(olmax::cast<float>(q)), kf = olmax::parameter(olmax::cast<float>(k)), vf = olmax::parameter(olmax::cast<float>(v));
        const Tensor<float> y = olmax::causal_attention(qf, kf, vf, {.window = 25, .resets = olmax::cast<float>(resets), .query_tile = 16, .key_tile = 24});
        olmax::sum(olmax::mul(y, olmax::cast<float>(r))).backward();
        return std::vector<Tensor<double>>{olmax::cast<double>(y.detach()), olmax::cast<double>(qf.grad()), olmax::cast<double>(kf.grad()),
                                           olmax::cast<double>(vf.grad())};
    };
    const auto fp32 = run(false), bf16 = run(true);
    const std::vector<const Tensor<double>*> reference{&naive.y, &naive.dq, &naive.dk, &naive.dv};
    for (std::size_t i = 0; i < 4; ++i) {
        INFO("output " << i << " (y, dq, dk, dv)");
        CHECK(olmax_test::max_abs_diff(fp32[i], *reference[i]) < 1e-4);
        CHECK(olmax_test::max_abs_diff(bf16[i], *reference[i]) < 0.1);   // bf16 operands: ~3 significant digits
        CHECK(olmax_test::max_abs_diff(bf16[i], fp32[i]) > 1e-4);        // and the policy did apply
    }
}

TEST_CASE("causal_attention: large scores (scale 40) stay finite and match the reference", "[attention]") {
    olmax::Generator rng(8);
    const auto q = olmax::randn<double>({1, 21, 2, 4}, rng), k = olmax::randn<double>({1, 21, 2, 4}, rng), v = olmax::randn<double>({1, 21, 2, 4}, rng);
    const auto r = olmax::randn<double>(q.shape(), rng);
    const AttnRun blocked = attn_run(
        [&](const Tensor<double>& a, const Tensor<double>& b, const Tensor<double>& c) {
            return olmax::causal_attention(a, b, c, {.scale = 40.0, .query_tile = 4, .key_tile = 3});
        },
        q, k, v, r);
    const AttnRun naive = attn_run([&](const Tensor<double>& a, const Tensor<double>& b, const Tensor<double>& c) { return attn_reference(a, b, c, 40.0, 0, {}); },
                                   q, k, v, r);
    CHECK(olmax_test::max_abs_diff(blocked.y, naive.y) < 1e-11);
    CHECK(olmax_test::max_abs_diff(blocked.dq, naive.dq) < 1e-9);  // gradients scale with 40
    CHECK(olmax_test::max_abs_diff(blocked.dk, naive.dk) < 1e-9);
    CHECK(olmax_test::max_abs_diff(blocked.dv, naive.dv) < 1e-11);
}

TEST_CASE("causal_attention: the default scale is 1 / sqrt(head_dim)", "[attention]") {
    olmax::Generator rng(7);
    const auto q = olmax::randn<double>({1, 9, 2, 6}, rng), k = olmax::randn<double>({1, 9, 2, 6}, rng), v = olmax::randn<double>({1, 9, 2, 6}, rng);
    CHECK(olmax_test::max_abs_diff(olmax::causal_attention(q, k, v), attn_reference(q, k, v, 1 / std::sqrt(6.0), 0, {})) < 1e-12);
    CHECK(olmax_test::max_abs_diff(olmax::causal_attention(q, k, v), attn_reference(q, k, v, 1.0, 0, {})) > 1e-6);
}

TEST_CASE("causal_attention: gradients (double) of q, k and v against central differences", "[attention][grad]") {
    olmax::Generator rng(21);
    const auto q = olmax::randn<double>({2, 7, 4, 4}, rng);
    const auto k = olmax::randn<double>({2, 7, 2, 4}, rng);
    const auto v = olmax::randn<double>({2, 7, 2, 4}, rng);
    const auto resets = attn_resets(2, 7, {{0, 3}, {1, 5}});
    for (std::size_t window : {std::size_t{0}, std::size_t{3}}) {
        INFO("window " << window);
        auto f = [&](const std::vector<Tensor<double>>& x) {
            return olmax::causal_attention(x[0], x[1], x[2], {.window = window, .resets = resets, .query_tile = 3, .key_tile = 2});
        };
        olmax_test::check_gradients(f, {q, k, v});
    }
    auto plain = [](const std::vector<Tensor<double>>& x) { return olmax::causal_attention(x[0], x[1], x[2], {.scale = 1.3}); };
    olmax_test::check_gradients(plain, {q, k, v});
}

TEST_CASE("causal_attention: causal, inputs after t change no output or input gradient before t", "[attention]") {
    olmax::Generator rng(31);
    const std::size_t T = 23, cut = 9;
    const auto q = olmax::randn<double>({2, T, 2, 4}, rng), k = olmax::randn<double>({2, T, 1, 4}, rng), v = olmax::randn<double>({2, T, 1, 4}, rng);
    auto q2 = q.clone(), k2 = k.clone(), v2 = v.clone();
    for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t t = cut; t < T; ++t)
            for (std::size_t i = 0; i < 4; ++i) {
                for (std::size_t h = 0; h < 2; ++h) q2(b, t, h, i) += 1.5;
                k2(b, t, 0, i) -= 2.0;
                v2(b, t, 0, i) *= 3.0;
            }
    const olmax::AttentionOptions<double> opt{.query_tile = 5, .key_tile = 4};
    const auto y = olmax::causal_attention(q, k, v, opt), y2 = olmax::causal_attention(q2, k2, v2, opt);
    CHECK(olmax_test::max_abs_diff(olmax::slice(y, 1, 0, cut), olmax::slice(y2, 1, 0, cut)) == 0.0);
    CHECK(olmax_test::max_abs_diff(olmax::slice(y, 1, cut, T), olmax::slice(y2, 1, cut, T)) > 1e-3);  // not vacuous
    // A loss on the outputs before `cut` sends no gradient to any input at or after it.
    auto r = olmax::randn<double>(q.shape(), rng);
    for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t t = cut; t < T; ++t)
            for (std::size_t h = 0; h < 2; ++h)
                for (std::size_t i = 0; i < 4; ++i) r(b, t, h, i) = 0;
    const AttnRun g = attn_run([&](const Tensor<double>& a, const Tensor<double>& b, const Tensor<double>& d) { return olmax::causal_attention(a, b, d, opt); },
                               q, k, v, r);
    for (const Tensor<double>* grad : {&g.dq, &g.dk, &g.dv}) {
        CHECK(olmax_test::max_abs_diff(olmax::slice(*grad, 1, cut, T), Tensor<double>(olmax::slice(*grad, 1, cut, T).shape())) == 0.0);
        CHECK(olmax_test::max_abs_diff(olmax::slice(*grad, 1, 0, cut), Tensor<double>(olmax::slice(*grad, 1, 0, cut).shape())) > 1e-6);
    }
}

TEST_CASE("causal_attention: a packed row with resets equals the documents run alone", "[attention]") {
    olmax::Generator rng(41);
    const std::size_t T = 17, first = 6, second = 11;
    const auto q = olmax::randn<double>({1, T, 2, 4}, rng), k = olmax::randn<double>({1, T, 2, 4}, rng), v = olmax::randn<double>({1, T, 2, 4}, rng);
    const auto resets = attn_resets(1, T, {{0, first}, {0, second}});
    const olmax::AttentionOptions<double> tiles{.query_tile = 4, .key_tile = 3};
    auto packed_opt = tiles;
    packed_opt.resets = resets;
    const auto packed = olmax::causal_attention(q, k, v, packed_opt);
    std::vector<Tensor<double>> alone;
    for (auto [lo, hi] : {std::pair<std::size_t, std::size_t>{0, first}, {first, second}, {second, T}})
        alone.push_back(olmax::causal_attention(olmax::slice(q, 1, lo, hi), olmax::slice(k, 1, lo, hi), olmax::slice(v, 1, lo, hi), tiles));
    CHECK(olmax_test::max_abs_diff(packed, olmax::concat(alone, 1)) < 1e-14);
    CHECK(olmax_test::max_abs_diff(olmax::slice(olmax::causal_attention(q, k, v, tiles), 1, first, T), olmax::slice(packed, 1, first, T)) > 1e-6);
}

TEST_CASE("causal_attention: float agrees with double, and the serial kernels give the same bits", "[attention]") {
    olmax::Generator rng(51);
    const auto q = olmax::randn<double>({2, 30, 4, 8}, rng), k = olmax::randn<double>({2, 30, 2, 8}, rng), v = olmax::randn<double>({2, 30, 2, 8}, rng);
    const auto r = olmax::randn<double>(q.shape(), rng);
    const olmax::AttentionOptions<double> opt{.window = 12, .query_tile = 8, .key_tile = 5};
    const auto yf = olmax::causal_attention(olmax::cast<float>(q), olmax::cast<float>(k), olmax::cast<float>(v),
                                            {.window = 12, .query_tile = 8, .key_tile = 5});
    auto op = [&](const Tensor<double>& a, const Tensor<double>& b, const Tensor<double>& d) { return olmax::causal_attention(a, b, d, opt); };
    const AttnRun parallel = attn_run(op, q, k, v, r);
    CHECK(olmax_test::max_abs_diff(olmax::cast<double>(yf), parallel.y) < 1e-5);
    olmax::backend::host_kernels_scope serial(olmax::backend::kernels<olmax::backend::cpu_serial>());
    const AttnRun one_thread = attn_run(op, q, k, v, r);
    CHECK(olmax_test::same_bits(parallel.y, one_thread.y));
    CHECK(olmax_test::same_bits(parallel.dq, one_thread.dq));
    CHECK(olmax_test::same_bits(parallel.dk, one_thread.dk));
    CHECK(olmax_test::same_bits(parallel.dv, one_thread.dv));
}

TEST_CASE("causal_attention: bad shapes and options throw, naming the op", "[attention]") {
    using Catch::Matchers::Contains;
    olmax::Generator rng(61);
    const auto q = olmax::randn<double>({2, 5, 4, 3}, rng), k = olmax::randn<double>({2, 5, 2, 3}, rng), v = olmax::randn<double>({2, 5, 2, 3}, rng);
    auto call = [&](const Tensor<double>& a, const Tensor<double>& b, const Tensor<double>& c, const olmax::AttentionOptions<double>& o = {}) {
        return olmax::causal_attention(a, b, c, o);
    };
    CHECK_NOTHROW(call(q, k, v));
    REQUIRE_THROWS_AS(call(olmax::reshape(q, {10, 4, 3}), k, v), olmax::shape_error);
    CHECK_THROWS_WITH(call(olmax::reshape(q, {10, 4, 3}), k, v), Contains("causal_attention") && Contains("[10, 4, 3]"));
    REQUIRE_THROWS_AS(call(q, Tensor<double>({2, 5, 3, 3}), Tensor<double>({2, 5, 3, 3})), olmax::shape_error);  // 3 does not divide 4
    CHECK_THROWS_WITH(call(q, Tensor<double>({2, 5, 3, 3}), Tensor<double>({2, 5, 3, 3})), Contains("causal_attention") && Contains("kv_heads"));
    CHECK_THROWS_AS(call(q, Tensor<double>({2, 4, 2, 3}), Tensor<double>({2, 4, 2, 3})), olmax::shape_error);  // fewer keys than queries
    CHECK_THROWS_WITH(call(q, Tensor<double>({2, 4, 2, 3}), Tensor<double>({2, 4, 2, 3})), Contains("at least q's 5 steps"));
    CHECK_THROWS_AS(call(q, Tensor<double>({2, 5, 2, 4}), Tensor<double>({2, 5, 2, 4})), olmax::shape_error);  // head_dim
    CHECK_THROWS_AS(call(q, Tensor<double>({1, 5, 2, 3}), Tensor<double>({1, 5, 2, 3})), olmax::shape_error);  // batch
    CHECK_THROWS_WITH(call(q, k, Tensor<double>({2, 5, 1, 3})), Contains("causal_attention: v of shape [2, 5, 1, 3]"));
    REQUIRE_THROWS_AS(call(q, k, v, {.resets = Tensor<double>({2, 4})}), olmax::shape_error);
    CHECK_THROWS_WITH(call(q, k, v, {.resets = Tensor<double>({2, 4})}), Contains("causal_attention: resets of shape [2, 4]"));
    REQUIRE_THROWS_AS(call(q, k, v, {.query_tile = 0}), olmax::value_error);
    CHECK_THROWS_WITH(call(q, k, v, {.key_tile = 0}), Contains("causal_attention") && Contains("key_tile"));
    CHECK_THROWS_WITH(call(q, k, v, {.scale = 0.0}), Contains("causal_attention") && Contains("scale"));
    CHECK_THROWS_AS(call(Tensor<double>({2, 0, 4, 3}), Tensor<double>({2, 0, 2, 3}), Tensor<double>({2, 0, 2, 3})), olmax::value_error);
    CHECK_THROWS_WITH(call(Tensor<double>(), k, v), Contains("causal_attention"));
}

TEST_CASE("causal_attention: queries of the last steps over all the keys (decoding) give those rows of the whole call", "[attention]") {
    olmax::Generator rng(67);
    const std::size_t B = 2, T = 11, H = 4, Hkv = 2, Dh = 5;
    const auto q = olmax::randn<double>({B, T, H, Dh}, rng), k = olmax::randn<double>({B, T, Hkv, Dh}, rng), v = olmax::randn<double>({B, T, Hkv, Dh}, rng);
    const auto resets = attn_resets(B, T, {{0, 4}, {1, 7}, {1, 9}});
    olmax::autodiff::no_grad off;
    for (std::size_t window : {std::size_t{0}, std::size_t{4}})
        for (bool with_resets : {false, true})
            for (std::size_t tile : {std::size_t{3}, std::size_t{64}}) {
                INFO("window " << window << ", resets " << with_resets << ", tiles " << tile);
                const olmax::AttentionOptions<double> opt{.window = window, .resets = with_resets ? resets : Tensor<double>(), .query_tile = tile,
                                                          .key_tile = tile + 1};
                const auto whole = olmax::causal_attention(q, k, v, opt);
                for (std::size_t last : {std::size_t{1}, std::size_t{2}, std::size_t{5}, T}) {
                    INFO("last " << last << " queries");
                    const auto rows = olmax::causal_attention(olmax::slice(q, 1, T - last, T), k, v, opt);
                    REQUIRE(rows.shape() == olmax::Shape{B, last, H, Dh});
                    CHECK(olmax_test::max_abs_diff(rows, olmax::slice(whole, 1, T - last, T)) < 1e-12);
                }
            }
    // float: the same rows to float rounding
    const auto qf = olmax::cast<float>(q), kf = olmax::cast<float>(k), vf = olmax::cast<float>(v);
    CHECK(olmax_test::max_abs_diff(olmax::causal_attention(olmax::slice(qf, 1, T - 2, T), kf, vf),
                                   olmax::slice(olmax::causal_attention(qf, kf, vf), 1, T - 2, T)) < 1e-5);
}

TEST_CASE("causal_attention: options.keys reads the first keys of buffers with room to spare (a KV cache), as the keys alone", "[attention]") {
    using Catch::Matchers::Contains;
    olmax::Generator rng(69);
    const std::size_t B = 2, T = 9, room = 14, H = 4, Hkv = 2, Dh = 5;
    const auto q = olmax::randn<double>({B, T, H, Dh}, rng);
    // k and v in buffers of `room` steps: the first T are the keys, the rest must never be read (NaN)
    auto kb = olmax::randn<double>({B, room, Hkv, Dh}, rng), vb = olmax::randn<double>({B, room, Hkv, Dh}, rng);
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t i = T * Hkv * Dh; i < room * Hkv * Dh; ++i)
            kb.data()[b * room * Hkv * Dh + i] = vb.data()[b * room * Hkv * Dh + i] = std::nan("");
    const auto k = olmax::slice(kb, 1, 0, T), v = olmax::slice(vb, 1, 0, T);
    const auto resets = attn_resets(B, T, {{1, 5}});
    olmax::autodiff::no_grad off;
    for (std::size_t window : {std::size_t{0}, std::size_t{3}})
        for (std::size_t last : {std::size_t{1}, std::size_t{4}, T}) {
            INFO("window " << window << ", last " << last << " queries");
            olmax::AttentionOptions<double> opt{.window = window, .resets = resets, .query_tile = 2, .key_tile = 3};
            const auto expected = olmax::causal_attention(olmax::slice(q, 1, T - last, T), k, v, opt);
            opt.keys = T;
            const auto rows = olmax::causal_attention(olmax::slice(q, 1, T - last, T), kb, vb, opt);
            REQUIRE(rows.shape() == olmax::Shape{B, last, H, Dh});
            CHECK(olmax_test::max_abs_diff(rows, expected) < 1e-14);
        }
    // keys beyond the buffers, or fewer than the queries, are refused
    CHECK_THROWS_WITH(olmax::causal_attention(q, kb, vb, {.keys = room + 1}), Contains("causal_attention") && Contains("keys = 15"));
    CHECK_THROWS_AS(olmax::causal_attention(q, kb, vb, {.keys = T - 1}), olmax::shape_error);
    // inference only, like fewer queries than keys: refused where a gradient would be recorded
    olmax::autodiff::enable_grad on;
    const auto qp = olmax::parameter(q.clone());
    CHECK_THROWS_WITH(olmax::causal_attention(qp, kb, vb, {.keys = T}), Contains("causal_attention") && Contains("no_grad"));
}

TEST_CASE("causal_attention: fewer queries than keys is refused where a gradient would be recorded, and when traced", "[attention]") {
    using Catch::Matchers::Contains;
    olmax::Generator rng(68);
    const auto q = olmax::parameter(olmax::randn<double>({1, 2, 2, 4}, rng)), k = olmax::randn<double>({1, 6, 2, 4}, rng),
               v = olmax::randn<double>({1, 6, 2, 4}, rng);
    REQUIRE_THROWS_AS(olmax::causal_attention(q, k, v), olmax::value_error);
    CHECK_THROWS_WITH(olmax::causal_attention(q, k, v), Contains("causal_attention") && Contains("no_grad"));
    {
        olmax::autodiff::no_grad off;
        CHECK_NOTHROW(olmax::causal_attention(q, k, v));
    }
    olmax::trace::tracing t;
    const auto tq = t.input<float>({1, 2, 2, 4}), tk = t.input<float>({1, 6, 2, 4}), tv = t.input<float>({1, 6, 2, 4});
    REQUIRE_THROWS_AS(olmax::causal_attention(tq, tk, tv), olmax::trace_error);
    CHECK_THROWS_WITH(olmax::causal_attention(tq, tk, tv), Contains("no traced form"));
}

TEST_CASE("rope: rotates pairs (i, i + Dh/2) by position times base^(-2i/Dh), positions restarting at resets", "[attention][rope]") {
    olmax::Generator rng(71);
    const std::size_t B = 2, T = 9, H = 3, Dh = 6, offset = 5;
    const auto x = olmax::randn<double>({B, T, H, Dh}, rng);
    const auto resets = attn_resets(B, T, {{1, 4}});
    const auto y = olmax::rope(x, {.base = 500.0, .offset = offset, .resets = resets});
    double worst = 0;
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t t = 0; t < T; ++t) {
            const double p = b == 1 && t >= 4 ? double(t - 4) : double(offset + t);
            for (std::size_t h = 0; h < H; ++h)
                for (std::size_t i = 0; i < Dh / 2; ++i) {
                    const double angle = p / std::pow(500.0, 2.0 * double(i) / double(Dh));
                    const double a = x(b, t, h, i), c = x(b, t, h, i + Dh / 2);
                    worst = olmax_test::worse(worst, std::abs(y(b, t, h, i) - (a * std::cos(angle) - c * std::sin(angle))));
                    worst = olmax_test::worse(worst, std::abs(y(b, t, h, i + Dh / 2) - (c * std::cos(angle) + a * std::sin(angle))));
                }
        }
    CHECK(worst < 1e-14);
    // Position 0 is the identity.
    CHECK(olmax_test::max_abs_diff(olmax::slice(olmax::rope(x), 1, 0, 1), olmax::slice(x, 1, 0, 1)) == 0.0);
}

TEST_CASE("rope: scores depend on relative positions only, so an offset leaves attention unchanged", "[attention][rope]") {
    olmax::Generator rng(72);
    const auto q = olmax::randn<double>({1, 12, 2, 8}, rng), k = olmax::randn<double>({1, 12, 2, 8}, rng), v = olmax::randn<double>({1, 12, 2, 8}, rng);
    auto attend = [&](std::size_t offset) {
        return olmax::causal_attention(olmax::rope(q, {.offset = offset}), olmax::rope(k, {.offset = offset}), v, {.query_tile = 5, .key_tile = 3});
    };
    CHECK(olmax_test::max_abs_diff(attend(0), attend(37)) < 1e-12);
    CHECK(olmax_test::max_abs_diff(attend(0), olmax::causal_attention(q, k, v)) > 1e-6);  // the rotation matters
}

TEST_CASE("rope: gradients (double) against central differences, with offset and resets", "[attention][rope][grad]") {
    olmax::Generator rng(73);
    const auto x = olmax::randn<double>({2, 6, 3, 4}, rng);
    const auto resets = attn_resets(2, 6, {{0, 2}, {1, 5}});
    auto f = [&](const std::vector<Tensor<double>>& in) { return olmax::rope(in[0], {.base = 100.0, .offset = 3, .resets = resets}); };
    olmax_test::check_gradients(f, {x});
}

TEST_CASE("rope: bad shapes and options throw, naming the op", "[attention][rope]") {
    using Catch::Matchers::Contains;
    REQUIRE_THROWS_AS(olmax::rope(Tensor<double>({2, 3, 2, 5})), olmax::shape_error);
    CHECK_THROWS_WITH(olmax::rope(Tensor<double>({2, 3, 2, 5})), Contains("rope") && Contains("even"));
    CHECK_THROWS_WITH(olmax::rope(Tensor<double>({2, 3, 4})), Contains("rope") && Contains("[2, 3, 4]"));
    CHECK_THROWS_AS(olmax::rope(Tensor<double>({2, 3, 2, 4}), {.base = 0.0}), olmax::value_error);
    CHECK_THROWS_WITH(olmax::rope(Tensor<double>({2, 3, 2, 4}), {.resets = Tensor<double>({3, 2})}), Contains("rope: resets of shape [3, 2]"));
    CHECK_THROWS_AS(olmax::rope(Tensor<double>({2, 0, 2, 4})), olmax::value_error);
}

TEST_CASE("nn::CausalSelfAttention: layer contract, parameters and sizes", "[attention]") {
    static_assert(nn::assert_layer<nn::CausalSelfAttention<float>>());
    static_assert(nn::assert_layer<nn::CausalSelfAttention<double>>());
    nn::Config config;
    config.features = 128;
    nn::Module<nn::CausalSelfAttention<double>> module(config);  // 2 heads of 64
    const auto params = module.parameters();
    REQUIRE(params.size() == 2);
    CHECK(params[0].name == "causal_self_attention/qkv/weight");
    CHECK(params[0].tensor.shape() == olmax::Shape{128, 3 * 128});
    CHECK(params[1].name == "causal_self_attention/out_proj/weight");
    CHECK(params[1].tensor.shape() == olmax::Shape{128, 128});
    olmax::Generator rng(81);
    const auto x = olmax::randn<double>({2, 5, 128}, rng);
    CHECK(module(x).shape() == x.shape());

    nn::CausalSelfAttention<double> gqa(attn_small_config(), rng);  // 4 query heads, 2 kv heads of 4, qk-norm
    const auto p = attn_parameters(gqa);
    REQUIRE(p.size() == 4);
    CHECK(p[0].shape() == olmax::Shape{8, (4 + 2 * 2) * 4});
    CHECK(p[1].shape() == olmax::Shape{4});
    CHECK(p[3].shape() == olmax::Shape{16, 8});
}

TEST_CASE("nn::CausalSelfAttention: gradients (double) of input and every parameter", "[attention][grad]") {
    olmax::Generator rng(82);
    for (bool qk_norm : {false, true}) {
        INFO("qk_norm " << qk_norm);
        auto config = attn_small_config();
        config.qk_norm = qk_norm;
        config.window = qk_norm ? 4 : 0;
        const nn::CausalSelfAttention<double> layer(config, rng);
        const auto result = olmax::testing::check_layer_gradients(layer, olmax::randn<double>({2, 7, 8}, rng));
        INFO(result);
        CHECK(result.ok);
        CHECK(result.checked > 0);
    }
}

TEST_CASE("nn::CausalSelfAttention: gradients (double) with resets", "[attention][grad]") {
    olmax::Generator rng(83);
    nn::CausalSelfAttention<double> layer(attn_small_config(), rng);
    const auto params = attn_parameters(layer);
    const auto resets = attn_resets(2, 6, {{0, 2}, {1, 4}});
    auto f = [&](const std::vector<Tensor<double>>& in) {
        attn_bind_parameters(layer, std::vector<Tensor<double>>(in.begin() + 1, in.end()));
        return layer.forward(in[0], resets);
    };
    std::vector<Tensor<double>> inputs{olmax::randn<double>({2, 6, 8}, rng)};
    inputs.insert(inputs.end(), params.begin(), params.end());
    olmax_test::check_gradients(f, inputs);
}

TEST_CASE("nn::CausalSelfAttention: a packed pair with a reset equals the two sequences run alone, and causal", "[attention]") {
    olmax::Generator rng(84);
    nn::CausalSelfAttention<double> layer(attn_small_config(), rng);
    const std::size_t first = 5, total = 13;
    const auto x = olmax::randn<double>({1, total, 8}, rng);
    const auto packed = layer.forward(x, attn_resets(1, total, {{0, first}}));
    const auto one = layer.forward(olmax::slice(x, 1, 0, first));
    const auto two = layer.forward(olmax::slice(x, 1, first, total));
    CHECK(olmax_test::max_abs_diff(packed, olmax::concat({one, two}, 1)) < 1e-13);
    CHECK(olmax_test::max_abs_diff(olmax::slice(layer.forward(x), 1, first, total), two) > 1e-6);
    // Causal: changing the steps from 7 on changes no output before 7.
    auto x2 = x.clone();
    for (std::size_t t = 7; t < total; ++t)
        for (std::size_t i = 0; i < 8; ++i) x2(0, t, i) += 1.0;
    CHECK(olmax_test::max_abs_diff(olmax::slice(layer.forward(x), 1, 0, 7), olmax::slice(layer.forward(x2), 1, 0, 7)) == 0.0);
    // The same layer in float agrees.
    nn::CausalSelfAttention<float> layer_f(attn_small_config(), rng);
    std::vector<Tensor<float>> params_f;
    for (const auto& p : attn_parameters(layer)) params_f.push_back(olmax::cast<float>(p));
    attn_bind_parameters(layer_f, params_f);
    CHECK(olmax_test::max_abs_diff(olmax::cast<double>(layer_f.forward(olmax::cast<float>(x))), layer.forward(x)) < 1e-4);
}

TEST_CASE("nn::CausalSelfAttention: bad sizes and inputs throw, naming the layer", "[attention]") {
    using Catch::Matchers::Contains;
    olmax::Generator rng(85);
    CHECK_THROWS_WITH(nn::CausalSelfAttention<double>(nn::AttentionConfig{.features = 10, .heads = 3}, rng),
                      Contains("nn::CausalSelfAttention") && Contains("3 heads do not divide 10"));
    REQUIRE_THROWS_AS(nn::CausalSelfAttention<double>(nn::AttentionConfig{.features = 8, .heads = 4, .kv_heads = 3}, rng), olmax::value_error);
    CHECK_THROWS_WITH(nn::CausalSelfAttention<double>(nn::AttentionConfig{.features = 8, .heads = 4, .kv_heads = 3}, rng),
                      Contains("nn::CausalSelfAttention") && Contains("kv_heads"));
    CHECK_THROWS_WITH(nn::CausalSelfAttention<double>(nn::AttentionConfig{.features = 6, .heads = 2}, rng),
                      Contains("nn::CausalSelfAttention") && Contains("even head_dim"));
    CHECK_NOTHROW(nn::CausalSelfAttention<double>(nn::AttentionConfig{.features = 6, .heads = 2, .rope_base = 0}, rng));
    CHECK_THROWS_WITH(nn::CausalSelfAttention<double>(nn::Config{}, rng), Contains("nn::CausalSelfAttention") && Contains("features"));
    const nn::CausalSelfAttention<double> layer(attn_small_config(), rng);
    REQUIRE_THROWS_AS(layer.forward(Tensor<double>({2, 5, 7})), olmax::shape_error);
    CHECK_THROWS_WITH(layer.forward(Tensor<double>({2, 5, 7})), Contains("nn::CausalSelfAttention") && Contains("[2, 5, 7]"));
    CHECK_THROWS_WITH(layer.forward(Tensor<double>({2, 5, 8}), Tensor<double>({2, 4})), Contains("nn::CausalSelfAttention: resets of shape [2, 4]"));
    CHECK_THROWS_AS(layer.forward(Tensor<double>({2, 0, 8})), olmax::value_error);
}

TEST_CASE("masks: triangles, document ids, the earlier-document indicator and zero counts, on host tensors", "[attention][masks]") {
    using olmax::masks::Triangle;
    auto values = [](const olmax::Tensor<double>& t) { return std::vector<double>(t.data(), t.data() + t.size()); };
    const auto upper = olmax::masks::triangle<double>(3, Triangle::upper), lower = olmax::masks::triangle<double>(3, Triangle::lower),
               strict = olmax::masks::triangle<double>(3, Triangle::strictly_lower);
    CHECK(values(upper) == std::vector<double>{1, 1, 1, 0, 1, 1, 0, 0, 1});
    CHECK(values(lower) == std::vector<double>{1, 0, 0, 1, 1, 0, 1, 1, 1});
    CHECK(values(strict) == std::vector<double>{0, 0, 0, 1, 0, 0, 1, 1, 0});
    // Row 0: documents start at 0 and 2; row 1: no start until 3.
    const auto resets = olmax::Tensor<double>::from({2, 4}, {1, 0, 1, 0, 0, 0, 0, 1});
    const auto ids = olmax::masks::document_ids(resets);
    CHECK(values(ids) == std::vector<double>{1, 1, 2, 2, 0, 0, 0, 1});
    const auto earlier = olmax::masks::earlier_document(ids);  // [b, t, s]: s in an earlier document than t
    CHECK(earlier.shape() == olmax::Shape{2, 4, 4});
    CHECK(values(earlier) == std::vector<double>{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0,  //
                                                     0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0});
    const auto counts = olmax::Tensor<double>::from({5}, {0, 1, 2, 3, 0});
    CHECK(values(olmax::masks::is_zero_count(counts)) == std::vector<double>{1, 0, 0, 0, 1});
    CHECK(values(olmax::masks::at_most_one(counts)) == std::vector<double>{0, 1, 1, 1, 0});
}

TEST_CASE("causal_attention and rope traced: the materialised program gives the eager op's values and gradients", "[attention][trace]") {
    olmax::Generator rng(91);
    const std::size_t B = 2, T = 9, H = 4, Hkv = 2, Dh = 4;
    const auto q = olmax::randn<double>({B, T, H, Dh}, rng), k = olmax::randn<double>({B, T, Hkv, Dh}, rng), v = olmax::randn<double>({B, T, Hkv, Dh}, rng);
    const auto r = olmax::randn<double>(q.shape(), rng);
    const auto resets = attn_resets(B, T, {{0, 3}, {0, 4}, {1, 6}});
    for (std::size_t window : {std::size_t{0}, std::size_t{3}}) {
        INFO("window " << window);
        // scale 0.5 is exact in float, so the double evaluation has nothing rounded to float
        const olmax::AttentionOptions<double> eager_opt{.scale = 0.5, .window = window, .resets = resets, .query_tile = 4, .key_tile = 3};
        const AttnRun eager = attn_run([&](const Tensor<double>& a, const Tensor<double>& b, const Tensor<double>& c) { return olmax::causal_attention(a, b, c, eager_opt); },
                                       q, k, v, r);
        // host resets (constants of the program) and traced resets (a program input), the mask built by ops from either
        const auto host = attn_traced(
            [&](const std::vector<Tensor<float>>& in) {
                return olmax::causal_attention(in[0], in[1], in[2], {.scale = 0.5, .window = window, .resets = olmax::cast<float>(resets)});
            },
            {q, k, v}, r);
        const auto traced = attn_traced(
            [&](const std::vector<Tensor<float>>& in) {
                return olmax::causal_attention(in[0], in[1], in[2], {.scale = 0.5, .window = window, .resets = in[3]});
            },
            {q, k, v, resets}, r);
        for (const auto* run : {&host, &traced}) {
            CHECK(olmax_test::max_abs_diff((*run)[0], eager.y) < 1e-12);
            CHECK(olmax_test::max_abs_diff((*run)[1], eager.dq) < 1e-12);
            CHECK(olmax_test::max_abs_diff((*run)[2], eager.dk) < 1e-12);
            CHECK(olmax_test::max_abs_diff((*run)[3], eager.dv) < 1e-12);
        }
    }
    // rope: its cosines and sines are float constants of the program, so float-level agreement.
    const olmax::RopeOptions<double> rope_opt{.offset = 2, .resets = resets};
    auto x = olmax::parameter(q.clone());
    const auto y = olmax::rope(x, rope_opt);
    olmax::sum(olmax::mul(y, r)).backward();
    const auto traced_rope = attn_traced(
        [&](const std::vector<Tensor<float>>& in) { return olmax::rope(in[0], {.offset = 2, .resets = olmax::cast<float>(resets)}); }, {q}, r);
    CHECK(olmax_test::max_abs_diff(traced_rope[0], y.detach()) < 1e-6);
    CHECK(olmax_test::max_abs_diff(traced_rope[1], x.grad()) < 1e-6);
    // traced resets: the program computes the positions (row 0 restarts at 3 and 4, row 1 runs from
    // the offset until 6) and gathers their cosines and sines
    const auto traced_resets_rope = attn_traced(
        [&](const std::vector<Tensor<float>>& in) { return olmax::rope(in[0], {.offset = 2, .resets = in[1]}); }, {q, resets}, r);
    CHECK(olmax_test::max_abs_diff(traced_resets_rope[0], y.detach()) < 1e-6);
    CHECK(olmax_test::max_abs_diff(traced_resets_rope[1], x.grad()) < 1e-6);
}

TEST_CASE("causal_attention and rope traced: no [T, T] constant in the program, the masks are computed in it", "[attention][trace]") {
    // A [T, T] constant is T^2 numbers of program text: 16.7 M at T = 4096. The causal and window
    // mask, the document ids and the positions within documents are made from O(T) constants.
    const std::size_t B = 2, T = 64, H = 2, Dh = 4;
    auto largest_constant = [&](bool traced_resets) {
        olmax::trace::tracing t;
        const auto q = t.input<float>({B, T, H, Dh}).set_requires_grad(true), k = t.input<float>({B, T, H, Dh}).set_requires_grad(true);
        const auto v = t.input<float>({B, T, H, Dh}).set_requires_grad(true);
        const Tensor<float> resets = traced_resets ? t.input<float>({B, T}) : olmax::cast<float>(attn_resets(B, T, {{0, 5}, {1, 40}}));
        const auto y = olmax::causal_attention(olmax::rope(q, {.resets = resets}), olmax::rope(k, {.resets = resets}), v,
                                               {.window = 16, .resets = resets});
        olmax::sum(y).backward();
        return olmax_test::largest_constant(t.graph());
    };
    for (const bool traced_resets : {false, true}) {
        INFO((traced_resets ? "traced resets" : "host resets"));
        const std::size_t largest = largest_constant(traced_resets);
        CHECK(largest > 0);  // RoPE's cosine table, at least
        CHECK(largest < T * T);
    }
}

TEST_CASE("rope traced: the cosines and sines come from O(sqrt(T)) constants, and nothing is rounded to bf16", "[attention][trace]") {
    // Captured whole, the tables would be [T, Dh] each (with resets [2T, Dh]): 0.5 M numbers of
    // program text a call at T = 4096, Dh = 64. Now the largest constant is the positions, [1, T].
    const std::size_t B = 2, T = 4096, Dh = 64;
    for (const bool traced_resets : {false, true})
        for (const std::size_t offset : {std::size_t{0}, std::size_t{7}}) {
            INFO((traced_resets ? "traced resets" : "no resets") << ", offset " << offset);
            olmax::trace::tracing t;
            const auto x = t.input<float>({B, T, 1, Dh}).set_requires_grad(true);
            const Tensor<float> resets = traced_resets ? t.input<float>({B, T}) : Tensor<float>();
            olmax::sum(olmax::rope(x, {.offset = offset, .resets = resets})).backward();
            const std::size_t largest = olmax_test::largest_constant(t.graph());
            CHECK(largest > 0);
            CHECK(largest <= T);
        }
    // The rotation is element-wise, so the bf16 policy (which rounds GEMM operands) leaves it as
    // exact as the eager kernel: within float rounding of the tables, at T not a multiple of the
    // table's block and with resets, host and traced.
    olmax::Generator rng(93);
    const std::size_t nb = 2, nt = 37;
    const auto x = olmax::randn<double>({nb, nt, 2, 8}, rng), r = olmax::randn<double>({nb, nt, 2, 8}, rng);
    const auto resets = attn_resets(nb, nt, {{0, 5}, {0, 30}, {1, 20}});
    for (const bool with_resets : {false, true}) {
        INFO((with_resets ? "resets" : "no resets"));
        auto xp = olmax::parameter(x.clone());
        const auto y = olmax::rope(xp, {.offset = 3, .resets = with_resets ? resets : Tensor<double>()});
        olmax::sum(olmax::mul(y, r)).backward();
        const auto traced = attn_traced(
            [&](const std::vector<Tensor<float>>& in) {
                return olmax::rope(in[0], {.offset = 3, .resets = with_resets ? olmax::cast<float>(resets) : Tensor<float>()});
            },
            {x}, r, /*bf16_gemms=*/true);
        CHECK(olmax_test::max_abs_diff(traced[0], y.detach()) < 1e-6);
        CHECK(olmax_test::max_abs_diff(traced[1], xp.grad()) < 1e-6);
    }
}

TEST_CASE("nn::CausalSelfAttention traced: the program gives the eager layer's values and input gradient", "[attention][trace]") {
    olmax::Generator rng(92);
    auto config = attn_small_config();
    config.window = 5;
    nn::CausalSelfAttention<float> layer_f(config, rng);
    nn::CausalSelfAttention<double> layer(config, rng);
    std::vector<Tensor<double>> params;
    for (const auto& p : attn_parameters(layer_f)) params.push_back(olmax::cast<double>(p));  // the float values, exactly
    attn_bind_parameters(layer, params);
    const auto x = olmax::randn<double>({2, 8, 8}, rng), r = olmax::randn<double>({2, 8, 8}, rng);
    auto xp = olmax::parameter(x.clone());
    const auto y = layer.forward(xp);
    olmax::sum(olmax::mul(y, r)).backward();
    const auto traced = attn_traced([&](const std::vector<Tensor<float>>& in) { return layer_f.forward(in[0]); }, {x}, r);
    CHECK(olmax_test::max_abs_diff(traced[0], y.detach()) < 1e-6);  // RoPE's cosines and sines are float constants
    CHECK(olmax_test::max_abs_diff(traced[1], xp.grad()) < 1e-6);
}

TEST_CASE("causal_attention: forward and backward hold O(T) tensor memory, never the T x T scores", "[attention][memory]") {
    // One head of 4: q, k, v, out and their gradients are 8 T doubles each row, the scores T^2.
    auto peak = [](std::size_t T) {
        olmax::Generator rng(93);
        auto q = olmax::parameter(olmax::randn<double>({1, T, 1, 4}, rng)), k = olmax::parameter(olmax::randn<double>({1, T, 1, 4}, rng)),
             v = olmax::parameter(olmax::randn<double>({1, T, 1, 4}, rng));
        const auto dy = olmax::randn<double>({1, T, 1, 4}, rng);
        const std::size_t before = olmax::memory::stats().current_bytes;
        olmax::memory::reset_peak();
        olmax::causal_attention(q, k, v, {.query_tile = 16, .key_tile = 16}).backward(dy);
        return olmax::memory::stats().peak_bytes - before;
    };
    const std::size_t small = peak(100), large = peak(400);
    INFO("peak bytes at T = 100: " << small << ", at T = 400: " << large);
    CHECK(large < 400 * 400 * sizeof(double) / 4);  // far below the 400 x 400 scores
    CHECK(double(large) < 5.0 * double(small));     // linear in T (4x), not quadratic (16x)
}

TEST_CASE("nn::CausalSelfAttention: inside nn::Stack (stacked parameters), gradients against central differences", "[attention][grad]") {
    nn::Config config;
    config.features = 4;  // one head of 4
    config.seed = 5;
    const nn::Stack<nn::CausalSelfAttention<double>> stack(config, 2);
    olmax::Generator rng(94);
    const auto result = olmax::testing::check_layer_gradients(stack, olmax::randn<double>({2, 5, 4}, rng));
    INFO(result);
    CHECK(result.ok);
    CHECK(result.checked > 0);
}
