// The surprises a new user met (issue 38): each bad input gets a message that names the cause and
// the fix, and the APIs sit where users look for them.
#include "test_helpers.hpp"

namespace nn = olmax::nn;
namespace optim = olmax::optim;
using olmax::Tensor;

TEST_CASE("a negative size is named as one, even beside a zero extent", "[errors]") {
    const long n = -1;
    CHECK_THROWS_WITH(olmax::zeros<float>({static_cast<std::size_t>(n), 3}),
                      Catch::Contains("extent 0 is -1 converted to an unsigned size; sizes must be >= 0"));
    CHECK_THROWS_WITH(olmax::zeros<float>({2, 0, static_cast<std::size_t>(-5L)}), Catch::Contains("extent 2 is -5"));
    CHECK_THROWS_AS(olmax::zeros<float>({static_cast<std::size_t>(n), 0}), olmax::shape_error);
    CHECK(olmax::zeros<float>({3, 0}).size() == 0);  // a genuinely empty tensor is still fine
}

TEST_CASE("a second backward through a freed graph says retain_graph first", "[errors][autodiff]") {
    auto w = olmax::parameter(olmax::full<float>({3}, 2.0f));
    auto loss = olmax::sum(olmax::square(w));
    loss.backward();
    try {
        loss.backward();
        FAIL("the second backward did not throw");
    } catch (const olmax::autodiff_error& e) {
        const std::string message = e.what();
        INFO(message);
        const auto hint = message.find("retain_graph");
        CHECK(hint != std::string::npos);
        CHECK(hint < message.find("another tape"));
    }
    auto y = olmax::square(w);
    olmax::sum(y).backward();
    CHECK_THROWS_WITH(olmax::sum(y * 2.0f).backward(), Catch::Contains("call that earlier backward(/*retain_graph=*/true)"));
}

TEST_CASE("gates given per channel are refused with the expansion that works", "[errors][scan]") {
    olmax::Generator rng(0);
    const auto x = olmax::randn<float>({2, 5, 4}, rng);
    const auto per_channel = olmax::parameter(olmax::full<float>({4}, 0.9f));
    using S = olmax::scan::sequential;
    CHECK_THROWS_WITH(olmax::scan::scan<S>(per_channel, x), Catch::Contains("gates + olmax::zeros_like(x)"));
    CHECK_THROWS_WITH(olmax::scan::scan<S>(olmax::full<float>({1, 1, 4}, 0.9f), x), Catch::Contains("expand them to x's shape first"));
    // A channel count that fits nothing gets no expansion advice.
    CHECK_THROWS_WITH(olmax::scan::scan<S>(olmax::full<float>({2, 5, 3}, 0.9f), x), !Catch::Contains("expand"));

    // The advice works, and the gradient reaches the per-channel gates.
    const auto h = olmax::scan::scan<S>(per_channel + olmax::zeros_like(x), x);
    const auto expected = olmax::scan::scan<S>(olmax::full<float>(x.shape(), 0.9f), x);
    CHECK(olmax_test::max_abs_diff(h.detach(), expected) == 0.0);
    olmax::sum(h).backward();
    REQUIRE(per_channel.grad().defined());
    CHECK(per_channel.grad().shape() == olmax::Shape{4});
}

TEST_CASE("nn::Config has no silent width or depth", "[errors][nn]") {
    olmax::Generator rng(1);
    const nn::Config unset;
    CHECK(unset.features == 0);
    CHECK_THROWS_WITH(nn::Linear<float>(unset, rng), Catch::Contains("nn::Linear: nn::Config::features is 0 (not set)"));
    CHECK_THROWS_WITH((nn::Sandwich<nn::QRNN<>>(unset, rng)), Catch::Contains("nn::Config::features is 0"));
    CHECK_THROWS_WITH(nn::Embedding<float>(unset, rng), Catch::Contains("nn::Embedding: nn::Config::features is 0"));
    CHECK_THROWS_WITH(nn::Stack<nn::Linear<float>>(nn::Config{.features = 4}, rng), Catch::Contains("depth must be at least 1, got 0"));
    CHECK(nn::Stack<nn::Linear<float>>(nn::Config{.features = 4, .depth = 3}, rng).depth() == 3);
}

TEST_CASE("AdamW takes the learning rate as its second argument, once", "[errors][optim]") {
    olmax::Generator rng(2);
    nn::Linear<double> layer(2, 2, rng);
    optim::AdamW<double> constant(optim::parameters_of(layer), 0.05);
    CHECK(constant.next_lr() == 0.05);
    optim::AdamW<double> with_rest(optim::parameters_of(layer), 0.05, {.weight_decay = 0.1});
    CHECK(with_rest.config().weight_decay == 0.1);
    CHECK(with_rest.config().schedule.peak_lr == 0.05);
    CHECK(optim::AdamW<double>(optim::parameters_of(layer), {}).next_lr() == optim::LrSchedule{}.peak_lr);  // {} is still the default config
    CHECK_THROWS_WITH(optim::AdamW<double>(optim::parameters_of(layer), 0.05, {.schedule = {.peak_lr = 0.2}}),
                      Catch::Contains("the learning rate is given twice, lr=0.05 and config.schedule.peak_lr=0.2"));
}

TEST_CASE("nn::parameters and optim::parameters_of walk the same tensors in the same order", "[nn][optim]") {
    using Block = nn::Reversible<nn::Sandwich<nn::Linear<double>>, nn::Sandwich<nn::Linear<double>>>;
    olmax::Generator rng(3);
    nn::Stack<Block> stack(nn::Config{.features = 3}, 2, rng);
    const auto listed = nn::parameters(stack);
    const auto for_optimiser = optim::parameters_of(stack);
    REQUIRE(listed.size() == for_optimiser.size());
    for (std::size_t i = 0; i < listed.size(); ++i) {
        CHECK(listed[i].tensor.data() == for_optimiser[i].tensor.data());
        CHECK(listed[i].name == "stack/" + for_optimiser[i].name);  // nn::parameters prefixes the layer's own name
        CHECK(listed[i].role == for_optimiser[i].role);
    }
}
