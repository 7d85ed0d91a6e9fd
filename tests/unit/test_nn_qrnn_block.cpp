#include "test_helpers.hpp"

#include <olmax/nn/nn.hpp>

namespace nn = olmax::nn;
using olmax::Tensor;
using olmax_test::max_abs_diff;

TEST_CASE("QRNNBlock in a reversible Stack: same gradients as plain, causal, gradient-checked", "[nn][qrnn][reversible]") {
    using Block = nn::Reversible<nn::QRNNBlock<olmax::scan::sequential_vectorized, double>, nn::Sandwich<nn::DenseConv<3, double>>>;
    STATIC_REQUIRE(nn::InvertibleLayer<Block>);
    nn::Config cfg;
    cfg.features = 4;
    cfg.hidden_features = 6;
    cfg.seed = 3;
    auto plain_cfg = cfg;
    plain_cfg.reversible_backward = false;
    nn::Stack<Block> rev(cfg, 3), plain(plain_cfg, 3);
    olmax::Generator rng(4);
    auto x = olmax::randn<double>({2, 2, 9, 4}, rng), dy = olmax::randn<double>({2, 2, 9, 4}, rng);
    auto xr = olmax::parameter(x.clone()), xp = olmax::parameter(x.clone());
    rev(xr).backward(dy);
    plain(xp).backward(dy);
    CHECK(max_abs_diff(xr.grad(), xp.grad()) < 1e-10);
    auto pr = nn::parameters(rev), pp = nn::parameters(plain);
    REQUIRE(pr.size() == pp.size());
    for (std::size_t i = 0; i < pr.size(); ++i) CHECK(max_abs_diff(pr[i].tensor.grad(), pp[i].tensor.grad()) < 1e-10);
    CHECK(pr[1].name == "stack/*/qrnn/weight");

    // Causal: a change at time t leaves every output before t unchanged.
    auto y = rev(x);
    auto x2 = x.clone();
    for (std::size_t s = 0; s < 2; ++s)
        for (std::size_t f = 0; f < 4; ++f) x2(s, std::size_t{1}, std::size_t{5}, f) += 1.0;
    auto y2 = rev(x2);
    for (std::size_t s = 0; s < 2; ++s)
        for (std::size_t b = 0; b < 2; ++b)
            for (std::size_t t = 0; t < 5; ++t)
                for (std::size_t f = 0; f < 4; ++f) CHECK(y2(s, b, t, f) == y(s, b, t, f));

    nn::QRNNBlock<olmax::scan::sequential_vectorized, double> block(cfg, rng);
    auto small = olmax::randn<double>({1, 6, 4}, rng);
    CHECK(olmax::testing::check_gradients([&](const std::vector<Tensor<double>>& in) { return block.forward(in[0], {}); }, {small}));
}

