#include "test_helpers.hpp"

#include <sstream>
#include <type_traits>

#include <olmax/io/parameters.hpp>
#include <olmax/nn/nn.hpp>

namespace nn = olmax::nn;
using olmax::Tensor;
using olmax_test::max_abs_diff;

namespace {

nn::MoEConfig config(std::size_t features = 4) {
    nn::MoEConfig c;  // an nn::Config with the MoE layers' fields: builds every layer here
    c.features = features;
    c.hidden_features = 6;
    c.vocab = 7;
    c.experts = 3;
    c.seed = 5;
    return c;
}

/// Gradient check of a layer w.r.t. its input and every parameter: the checker's inputs are
/// [x, p0, p1, ...] and a copy of the layer is bound to them.
template <class L>
olmax::testing::GradientCheckResult check_layer(L layer, const Tensor<double>& x, const nn::LayerContext& ctx = {},
                                                const olmax::testing::GradientCheckOptions& opt = {}) {
    std::vector<Tensor<double>> inputs{x};
    for (auto& p : nn::parameters(layer)) inputs.push_back(p.tensor.detach().clone());
    auto f = [layer, ctx](const std::vector<Tensor<double>>& in) mutable {
        std::size_t i = 1;
        nn::ParameterVisitor<double> bind([&](const std::string&, Tensor<double>& t, nn::Role, nn::Sharing) { t = in[i++]; });
        layer.visit_parameters(bind);
        return layer.forward(in[0], ctx);
    };
    return olmax::testing::check_gradients(f, inputs, opt);
}

/// Perturbing time t of x [B, S, F] changes no output before t (and changes output t).
template <class L>
void check_causal(const L& layer, const Tensor<double>& x, const nn::LayerContext& ctx = {}) {
    const std::size_t batch = x.shape()[0], seq = x.shape()[1], features = x.shape()[2];
    const auto y = layer.forward(x, ctx);
    const std::size_t out_features = y.shape()[2];
    for (std::size_t t = 0; t < seq; ++t) {
        auto x2 = x.clone();
        for (std::size_t f = 0; f < features; ++f) x2(std::size_t{0}, t, f) += 0.5;
        const auto y2 = layer.forward(x2, ctx);
        for (std::size_t b = 0; b < batch; ++b)
            for (std::size_t u = 0; u < t; ++u)
                for (std::size_t f = 0; f < out_features; ++f) {
                    INFO("perturbed t=" << t << ", output u=" << u);
                    REQUIRE(y2(b, u, f) == y(b, u, f));
                }
    }
}

}  // namespace

TEST_CASE("layer contract holds for every layer", "[nn][contract]") {
    STATIC_REQUIRE(nn::Layer<nn::Linear<double>>);
    STATIC_REQUIRE(nn::Layer<nn::CausalConv<3, double>>);
    STATIC_REQUIRE(nn::Layer<nn::DenseConv<5>>);
    STATIC_REQUIRE(nn::Layer<nn::HierarchicalMixer<512>>);
    STATIC_REQUIRE(nn::Layer<nn::Sandwich<nn::HierarchicalMixer<512>>>);
    STATIC_REQUIRE(nn::Layer<nn::MoE<float>>);
    STATIC_REQUIRE(nn::Layer<nn::Mish<double>>);
    STATIC_REQUIRE(nn::Layer<nn::GELU<double>>);
    STATIC_REQUIRE(nn::Layer<nn::Stack<nn::Reversible<nn::Sandwich<nn::DenseConv<5>>, nn::Sandwich<nn::HierarchicalMixer<512>>>>>);
    STATIC_REQUIRE(nn::InvertibleLayer<nn::Reversible<nn::Sandwich<nn::DenseConv<5>>, nn::Sandwich<nn::HierarchicalMixer<512>>>>);
    STATIC_REQUIRE_FALSE(nn::InvertibleLayer<nn::DenseConv<5>>);
    STATIC_REQUIRE(nn::Layer<nn::Sequential<nn::Linear<float>, nn::LeakyReLU<float>, nn::Linear<float>>>);
}

TEST_CASE("issue example: Stack<Reversible<Sandwich<DenseConv<5>>, Sandwich<HierarchicalMixer<K>>>> runs and differentiates", "[nn][stack]") {
    using Block = nn::Reversible<nn::Sandwich<nn::DenseConv<5, double>>, nn::Sandwich<nn::HierarchicalMixer<4, double>>>;
    auto cfg = config(8);
    nn::Stack<Block> body(cfg, /*depth=*/6);
    olmax::Generator rng(1);
    auto x = olmax::parameter(olmax::randn<double>({2, 16, 8}, rng));
    auto y = body(nn::two_streams(x));
    CHECK(y.shape() == olmax::Shape{2, 2, 16, 8});
    y.backward(olmax::randn<double>(y.shape(), rng));
    REQUIRE(x.grad().defined());
    for (auto& p : nn::parameters(body)) CHECK(p.tensor.grad().defined());
    CHECK(olmax::autodiff::tape_size() == 0);
}

TEST_CASE("gradient checks: every layer w.r.t. input and parameters", "[nn][gradcheck]") {
    olmax::Generator rng(2);
    auto cfg = config();
    auto x = olmax::randn<double>({2, 8, 4}, rng);
    SECTION("Linear with bias") {
        auto c = cfg;
        c.bias = true;
        CHECK(check_layer(nn::Linear<double>(c, rng), x));
    }
    SECTION("CausalConv<3> with 2 groups and bias") { CHECK(check_layer(nn::CausalConv<3, double>(4, 6, rng, 2, true), x)); }
    SECTION("DenseConv<3>") { CHECK(check_layer(nn::DenseConv<3, double>(cfg, rng), x)); }
    SECTION("ScaleNorm") { CHECK(check_layer(nn::ScaleNorm<double>(cfg, rng), x)); }
    SECTION("RMSNorm") { CHECK(check_layer(nn::RMSNorm<double>(cfg, rng), x)); }
    SECTION("Sandwich<Linear>") { CHECK(check_layer(nn::Sandwich<nn::Linear<double>>(cfg, rng), x)); }
    SECTION("HierarchicalMixer<4>, local and strided modes") {
        nn::HierarchicalMixer<4, double> mixer(cfg, rng);
        CHECK(check_layer(mixer, x, {0, 2}));
        CHECK(check_layer(mixer, x, {1, 2}));
    }
    SECTION("MoE (away from routing ties)") {
        // The layer adds alpha * d balance to its own gradient, which the finite differences of its
        // output do not see: checked here without it, and with it in test_moe.cpp.
        auto c = cfg;
        c.balance_coefficient = 0;
        CHECK(check_layer(nn::MoE<double>(c, rng), x));
    }
    SECTION("MoE on its dense and its slot dispatch") {
        auto c = cfg;
        c.balance_coefficient = 0;
        for (const auto dispatch : {nn::MoEDispatch::dense, nn::MoEDispatch::slots}) {
            INFO((dispatch == nn::MoEDispatch::dense ? "dense" : "slots"));
            c.dispatch = dispatch;
            nn::MoE<double> moe(c, rng);
            REQUIRE(moe.dispatch() == dispatch);
            CHECK(check_layer(moe, x));
        }
    }
    SECTION("Stack of Reversible<TiedMoE, Linear>: one expert bank tied over depth") {
        auto c = cfg;
        c.balance_coefficient = 0;
        nn::Stack<nn::Reversible<nn::TiedMoE<double>, nn::Linear<double>>> stack(c, 3);
        CHECK(check_layer(stack, olmax::randn<double>({2, 2, 8, 4}, rng), {}, {.rtol = 1e-5, .atol = 1e-7}));
    }
    SECTION("Dropout in training: its mask is a function of the context's seed") {
        nn::LayerContext ctx;
        ctx.training = true;
        ctx.random_seed = 1234;
        nn::Dropout<double> dropout(0.4);
        const auto y = dropout.forward(x, ctx);
        std::size_t dropped = 0;
        for (std::size_t i = 0; i < y.size(); ++i) dropped += y.data()[i] == 0.0;
        CHECK(dropped > 0);  // the check below runs through a real mask
        CHECK(dropped < y.size());
        CHECK(check_layer(dropout, x, ctx));
    }
    SECTION("activations") {
        CHECK(check_layer(nn::LeakyReLU<double>(cfg, rng), x));
        CHECK(check_layer(nn::Mish<double>(cfg, rng), x));
        CHECK(check_layer(nn::GELU<double>(cfg, rng), x));
        CHECK(check_layer(nn::Elementwise<olmax::op::silu, double>(cfg, rng), x));  // any unary op key
        STATIC_REQUIRE(nn::Elementwise<olmax::op::silu, double>::name == "silu");
        CHECK(check_layer(nn::Elephant<double>(cfg, rng), x));
    }
    SECTION("Sequential<Linear, Mish, Linear>") { CHECK(check_layer(nn::Sequential<nn::Linear<double>, nn::Mish<double>, nn::Linear<double>>(cfg, rng), x)); }
    SECTION("Embedding and OutputHead") {
        nn::Embedding<double> emb(cfg, rng);
        auto ids = Tensor<std::int32_t>::from({2, 3}, {0, 6, 3, 3, 1, 2});
        auto table = nn::parameters(emb)[0].tensor.detach().clone();
        CHECK(olmax::testing::check_gradients([&](const std::vector<Tensor<double>>& in) { return olmax::embedding(in[0], ids); }, {table}));
        CHECK(emb(ids).shape() == olmax::Shape{2, 3, 4});

        nn::OutputHead<double> head(cfg, rng);
        auto targets = Tensor<std::int32_t>::from({2, 8}, {0, 1, 2, 3, 4, 5, 6, 0, 1, 1, 2, 2, 3, 3, 4, 4});
        auto w = nn::parameters(head)[0].tensor.detach().clone();
        auto c = cfg;
        c.z_loss = 0;
        c.loss_chunk_tokens = 5;
        nn::OutputHead<double> plain_head(c, rng);
        auto f = [&](const std::vector<Tensor<double>>& in) {
            nn::OutputHead<double> h = plain_head;
            nn::ParameterVisitor<double> bind([&](const std::string&, Tensor<double>& t, nn::Role, nn::Sharing) { t = in[1]; });
            h.visit_parameters(bind);
            return h.loss(in[0], targets);
        };
        CHECK(olmax::testing::check_gradients(f, {x, w}));
        // The chunked loss equals the loss of the full logits.
        auto full = olmax::cross_entropy(olmax::reshape(plain_head.logits(x), {16, 7}), Tensor<std::int32_t>::from({16}, targets.span()));
        CHECK(plain_head.loss(x, targets).item() == Approx(full.item()).epsilon(1e-12));
    }
}

TEST_CASE("causality: every time-mixing layer", "[nn][causal]") {
    olmax::Generator rng(3);
    auto cfg = config();
    auto x = olmax::randn<double>({2, 16, 4}, rng);
    check_causal(nn::CausalConv<3, double>(cfg, rng), x);
    check_causal(nn::DenseConv<5, double>(cfg, rng), x);
    nn::HierarchicalMixer<4, double> mixer(cfg, rng);
    for (std::size_t layer = 0; layer < 3; ++layer) check_causal(mixer, x, {layer, 3});
    check_causal(nn::Sandwich<nn::HierarchicalMixer<4, double>>(cfg, rng), x, {1, 2});
    check_causal(nn::MoE<double>(cfg, rng), x);
    check_causal(nn::Sequential<nn::DenseConv<3, double>, nn::HierarchicalMixer<4, double>>(cfg, rng), x);
}

TEST_CASE("HierarchicalMixer modes: local then strided, by layer index", "[nn][mixer]") {
    using M = nn::HierarchicalMixer<512>;
    CHECK(M::levels(4096) == 2);
    CHECK(M::stride(4096, 0) == 1);
    CHECK(M::stride(4096, 1) == 8);  // the original's stride S/K
    CHECK(M::stride(4096, 2) == 1);
    using M4 = nn::HierarchicalMixer<4>;
    CHECK(M4::levels(64) == 3);
    CHECK(M4::stride(64, 1) == 4);
    CHECK(M4::stride(64, 2) == 16);
}

TEST_CASE("bad configurations throw naming the layer and the sizes", "[nn][errors]") {
    olmax::Generator rng(4);
    auto cfg = config();
    nn::HierarchicalMixer<4, double> mixer(cfg, rng);
    auto x = olmax::randn<double>({1, 10, 4}, rng);
    CHECK_THROWS_WITH(mixer.forward(x, {}), Catch::Contains("HierarchicalMixer<4>") && Catch::Contains("10"));
    CHECK_THROWS_AS(mixer.forward(x, {}), olmax::shape_error);
    auto wide = olmax::randn<double>({1, 8, 5}, rng);
    CHECK_THROWS_WITH((nn::DenseConv<3, double>(cfg, rng).forward(wide, {})), Catch::Contains("CausalConv<3>") && Catch::Contains("5"));
    CHECK_THROWS_WITH(nn::Linear<double>(cfg, rng).forward(wide, {}), Catch::Contains("Linear") && Catch::Contains("[1, 8, 5]"));
    CHECK_THROWS_WITH((nn::CausalConv<3, double>(4, 6, rng, 4)), Catch::Contains("CausalConv<3>") && Catch::Contains("4 groups"));
    // Channel mismatch between layers of a Sequential: Linear 4 -> 4 then a 4-feature mixer fed 5.
    nn::Sequential<nn::Linear<double>, nn::HierarchicalMixer<4, double>> seq(cfg, rng);
    CHECK_THROWS_WITH(seq.forward(wide, {}), Catch::Contains("Linear"));
    auto c = cfg;
    c.momentum_beta = 0;
    CHECK_THROWS_WITH((nn::Reversible<nn::Linear<double>, nn::Linear<double>, nn::MomentumCoupling>(c, rng)), Catch::Contains("momentum_beta"));
    CHECK_THROWS_AS((nn::Stack<nn::Linear<double>>(cfg, 0)), olmax::value_error);
    nn::Reversible<nn::Linear<double>, nn::Linear<double>> block(cfg, rng);
    CHECK_THROWS_WITH(block.forward(x, {}), Catch::Contains("two-stream state"));
}

TEST_CASE("parameters: deterministic names, roles, save/load round trip", "[nn][parameters]") {
    auto cfg = config();
    using Block = nn::Reversible<nn::Sandwich<nn::DenseConv<3, double>>, nn::Sandwich<nn::HierarchicalMixer<4, double>>>;
    nn::Stack<Block> a(cfg, 3), b(cfg, 3);
    auto pa = nn::parameters(a);
    std::vector<std::string> names;
    for (auto& p : pa) names.push_back(p.name);
    CHECK(names == std::vector<std::string>{"stack/*/dense/norm_in/scale", "stack/*/dense/conv0/weight", "stack/*/dense/norm/scale",
                                            "stack/*/dense/conv1/weight", "stack/*/dense/norm_out/scale", "stack/*/mixer/norm_in/scale",
                                            "stack/*/mixer/w0", "stack/*/mixer/w1", "stack/*/mixer/norm/scale", "stack/*/mixer/norm_out/scale"});
    // Weight decay by role, never by name: exactly the 4 matrices.
    CHECK(nn::parameters_with_role(a, nn::Role::weight).size() == 4);
    CHECK(nn::parameters_with_role(a, nn::Role::norm_scale).size() == 6);

    // Same seed, same parameters; a different seed, different ones; save/load copies them.
    CHECK(max_abs_diff(pa[1].tensor, nn::parameters(b)[1].tensor) == 0);
    auto other = cfg;
    other.seed = 99;
    nn::Stack<Block> c(other, 3);
    CHECK(max_abs_diff(nn::parameters(c)[1].tensor, pa[1].tensor) > 0.01);
    std::stringstream file;
    olmax::io::save_parameters(a, file);
    olmax::io::load_parameters(c, file);
    for (std::size_t i = 0; i < pa.size(); ++i) CHECK(max_abs_diff(nn::parameters(c)[i].tensor, pa[i].tensor) == 0);
    nn::Stack<Block> deeper(cfg, 4);
    std::stringstream again;
    olmax::io::save_parameters(a, again);
    CHECK_THROWS_WITH(olmax::io::load_parameters(deeper, again), Catch::Contains("stack/*/dense/norm_in/scale") && Catch::Contains("[3, 4]"));

    nn::Sequential<nn::Linear<double>, nn::Mish<double>, nn::Linear<double>> seq(cfg, *std::make_unique<olmax::Generator>(1));
    auto ps = nn::parameters(seq);
    REQUIRE(ps.size() == 2);
    CHECK(ps[0].name == "sequential/0/linear/weight");
    CHECK(ps[1].name == "sequential/2/linear/weight");
}

TEST_CASE("initialisers: stacked weights are orthogonal per layer; fan-in normal", "[nn][init]") {
    auto cfg = config(8);
    nn::Stack<nn::Linear<double>> stack(cfg, 5);
    for (auto& p : stack.layer_parameters()) {
        auto w = p.tensor;  // [8, 8]
        for (std::size_t i = 0; i < 8; ++i)
            for (std::size_t j = 0; j < 8; ++j) {
                double dot = 0;
                for (std::size_t k = 0; k < 8; ++k) dot += w(k, i) * w(k, j);
                CHECK(dot == Approx(i == j ? 1.0 : 0.0).margin(1e-12));
            }
    }
    olmax::Generator rng(9);
    auto n = nn::fan_in_normal<double>({400, 100}, 100, rng);
    double sq = 0;
    for (double v : n) sq += v * v;
    CHECK(std::sqrt(sq / double(n.size())) == Approx(0.1).epsilon(0.03));
}

// A container is built from the most derived of its parts' configs; unrelated ones have none.
struct UnrelatedLayerConfig : nn::Config {
    int extra = 0;
};
struct UnrelatedConfigLayer : nn::Linear<double> {
    using config_type = UnrelatedLayerConfig;
    using nn::Linear<double>::Linear;
};
static_assert(std::is_same_v<nn::shared_config_t<nn::RMSNorm<double>, nn::MoE<double>, nn::Linear<double>>, nn::MoEConfig>);
static_assert(std::is_same_v<nn::Sequential<nn::RMSNorm<double>, nn::MoE<double>>::config_type, nn::MoEConfig>);
static_assert(std::is_same_v<nn::shared_config_t<nn::Linear<double>, UnrelatedConfigLayer>, UnrelatedLayerConfig>);
static_assert(std::is_void_v<nn::shared_config_t<nn::MoE<double>, UnrelatedConfigLayer>>);

TEST_CASE("tied parameters: one expert bank shared by every layer of a Stack", "[nn][stack][moe]") {
    auto cfg = config();
    using Block = nn::Reversible<nn::TiedMoE<double>, nn::Linear<double>>;
    nn::Stack<Block> rev(cfg, 4);
    auto c = cfg;
    c.reversible_backward = false;
    nn::Stack<Block> plain(c, 4);
    auto params = nn::parameters(rev);
    REQUIRE(params.size() == 3);
    CHECK(params[1].name == "stack/tied_moe/experts");
    CHECK(params[1].sharing == nn::Sharing::tied);
    CHECK(params[1].tensor.shape() == olmax::Shape{3, 4, 4});
    CHECK(params[0].tensor.shape() == olmax::Shape{4, 4, 3});
    olmax::Generator rng(8);
    auto x = olmax::randn<double>({2, 2, 8, 4}, rng), dy = olmax::randn<double>({2, 2, 8, 4}, rng);
    // The same loop code in both modes: the MoE adds its balance gradient itself (in memory-saving
    // mode from inside the recompute).
    for (auto* stack : {&rev, &plain}) olmax::sum(olmax::mul(stack->forward(olmax::parameter(x.clone())), dy)).backward();
    auto pp = nn::parameters(plain);
    for (std::size_t i = 0; i < params.size(); ++i) CHECK(max_abs_diff(params[i].tensor.grad(), pp[i].tensor.grad()) < 1e-10);
}

TEST_CASE("MoE: capacity drops overflow tokens and the load-balancing loss is differentiable", "[nn][moe]") {
    auto cfg = config();
    cfg.experts = 2;
    cfg.capacity_factor = 0.5;  // C = ceil(0.5 * 8 / 2) = 2 tokens per expert per sequence
    olmax::Generator rng(12);
    nn::MoE<double> moe(cfg, rng);
    CHECK(moe.capacity(8) == 2);
    auto x = olmax::randn<double>({1, 8, 4}, rng);
    auto y = moe.forward(x, {});
    std::size_t zero_rows = 0;
    for (std::size_t t = 0; t < 8; ++t) {
        double n = 0;
        for (std::size_t f = 0; f < 4; ++f) n += std::abs(y(std::size_t{0}, t, f));
        zero_rows += n == 0;
    }
    CHECK(zero_rows >= 4);  // at most 2 + 2 tokens kept
    // The balance (logged) lies in (0, E]: E * sum_e f_e P_e <= E * max_e P_e <= E; its gradient
    // reaches the router even where y's does not (the gradient of 0 * y is 0 in y's path).
    moe.clear_routing_stats();
    auto params = nn::parameters(moe);
    olmax::sum(olmax::mul(moe.forward(olmax::parameter(x.clone()), {}), olmax::zeros_like(y))).backward();
    CHECK(moe.routing_stats().mean_balance() > 0);
    CHECK(moe.routing_stats().mean_balance() <= 2.0 + 1e-12);
    REQUIRE(params[0].tensor.grad().defined());
    double router_grad = 0;
    for (std::size_t i = 0; i < params[0].tensor.size(); ++i) router_grad += std::abs(params[0].tensor.grad().data()[i]);
    CHECK(router_grad > 0);
}

TEST_CASE("backends: a reversible stack gives the same values and gradients on cpu_serial and cpu_openmp", "[nn][conformance]") {
    using olmax::backend::cpu_openmp;
    using olmax::backend::cpu_serial;
    using Block = nn::Reversible<nn::Sandwich<nn::DenseConv<3, double>>, nn::Sandwich<nn::HierarchicalMixer<4, double>>>;
    auto cfg = config();
    nn::Stack<Block> serial(cfg, 3);
    nn::Stack<Block> parallel(cfg, 3);
    olmax::Generator rng(21);
    auto x = olmax::randn<double>({2, 2, 16, 4}, rng), dy = olmax::randn<double>({2, 2, 16, 4}, rng);
    auto xs = olmax::parameter(x.clone()), xp = olmax::parameter(x.clone());
    Tensor<double> ys, yp;
    olmax_test::with_kernels<cpu_serial>([&] {
        ys = serial(xs);
        ys.backward(dy);  // one graph at a time: backward frees the whole tape
        return 0;
    });
    olmax_test::ForceThreading force;  // the small shapes would otherwise stay on one thread
    olmax_test::with_kernels<cpu_openmp>([&] {
        yp = parallel(xp);
        yp.backward(dy);
        return 0;
    });
    CHECK(max_abs_diff(ys, yp) < 1e-12);
    CHECK(max_abs_diff(xs.grad(), xp.grad()) < 1e-12);
    auto ps = nn::parameters(serial), pp = nn::parameters(parallel);
    for (std::size_t i = 0; i < ps.size(); ++i) CHECK(max_abs_diff(ps[i].tensor.grad(), pp[i].tensor.grad()) < 1e-12);
}

TEST_CASE("Module wrapper: call, parameters, zero_grad; io::save_parameters round trip", "[nn][module]") {
    auto cfg = config();
    nn::Module<nn::Sandwich<nn::DenseConv<3, double>>> a(cfg), b(cfg, olmax::Generator(77));
    olmax::Generator rng(31);
    auto x = olmax::randn<double>({1, 5, 4}, rng);
    auto y = a(x);
    CHECK(y.shape() == olmax::Shape{1, 5, 4});
    REQUIRE(a.parameters().size() == 5);
    CHECK(a.parameters()[1].name == "dense/conv0/weight");
    olmax::sum(y).backward();
    CHECK(a.parameters()[1].tensor.grad().defined());
    a.zero_grad();
    CHECK_FALSE(a.parameters()[1].tensor.grad().defined());
    CHECK(max_abs_diff(a(x), b(x)) > 1e-6);
    std::stringstream file;
    olmax::io::save_parameters(a.layer(), file);
    olmax::io::load_parameters(b.layer(), file);
    CHECK(max_abs_diff(a(x), b(x)) == 0);
    // One file format: a parameter file is an archive (the checkpoint format) of "param/<name>" entries.
    file.seekg(0);
    const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    const auto archive = olmax::io::Archive::deserialize(bytes);
    CHECK(archive.text("olmax/kind") == "parameters");
    CHECK(max_abs_diff(archive.get<double>("param/dense/conv0/weight"), a.parameters()[1].tensor) == 0);
    auto damaged = bytes;
    damaged[damaged.size() / 2] ^= 0x40;
    CHECK_THROWS_AS(olmax::io::Archive::deserialize(damaged), olmax::io::format_error);
}

TEST_CASE("nn::parameters and olmax::optim::parameters_of walk the same tensors in the same order", "[nn][optim]") {
    using Block = nn::Reversible<nn::Sandwich<nn::Linear<double>>, nn::Sandwich<nn::Linear<double>>>;
    olmax::Generator rng(3);
    nn::Stack<Block> stack(nn::Config{.features = 3}, 2, rng);
    const auto listed = nn::parameters(stack);
    const auto for_optimiser = olmax::optim::parameters_of(stack);
    REQUIRE(listed.size() == for_optimiser.size());
    for (std::size_t i = 0; i < listed.size(); ++i) {
        CHECK(listed[i].tensor.data() == for_optimiser[i].tensor.data());
        CHECK(listed[i].name == "stack/" + for_optimiser[i].name);  // nn::parameters prefixes the layer's own name
        CHECK(listed[i].role == for_optimiser[i].role);
    }
}
