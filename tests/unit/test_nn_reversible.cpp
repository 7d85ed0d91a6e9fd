#include "test_helpers.hpp"

#include <olmax/nn/nn.hpp>

namespace nn = olmax::nn;
namespace ad = olmax::autodiff;
using olmax::Tensor;
using olmax_test::max_abs_diff;

namespace {

nn::Config small_config(bool reversible = true) {
    nn::Config c;
    c.features = 4;
    c.hidden_features = 6;
    c.seed = 11;
    c.reversible_backward = reversible;
    return c;
}

using DenseF = nn::Sandwich<nn::DenseConv<3, double>>;
using LinearG = nn::Sandwich<nn::Linear<double>>;
using Block = nn::Reversible<DenseF, LinearG>;

/// Loss-free probe: backward with a fixed random output gradient; returns the input gradient.
template <class Net>
Tensor<double> input_grad(const Net& net, const Tensor<double>& x_value, const Tensor<double>& dy) {
    auto x = olmax::parameter(x_value.clone());
    auto y = net.forward(x, {});
    y.backward(dy);
    return x.grad();
}

/// Every trainable tensor of a stack (the stacked [depth, ...] tensors).
std::vector<Tensor<double>> tensors_of(nn::Stack<Block>& stack) {
    std::vector<Tensor<double>> out;
    for (auto& p : nn::parameters(stack)) out.push_back(p.tensor);
    return out;
}

/// Rows [begin, end) of a [B, ...] tensor (a copy).
Tensor<double> rows(const Tensor<double>& x, std::size_t begin, std::size_t end) {
    olmax::Shape shape = x.shape();
    const std::size_t row = x.size() / shape[0];
    shape[0] = end - begin;
    Tensor<double> out(shape);
    std::copy(x.data() + begin * row, x.data() + end * row, out.data());
    return out;
}

std::vector<Tensor<double>> grads_of(const std::vector<Tensor<double>>& params) {
    std::vector<Tensor<double>> out;
    for (const auto& p : params) out.push_back(p.grad().defined() ? p.grad().clone() : Tensor<double>());
    return out;
}

void zero(std::vector<Tensor<double>>& params) {
    for (auto& p : params) p.zero_grad();
}

/// A memory-saving block against the same block (same seed) with every activation recorded: equal
/// outputs, the inverse rebuilding the input (1e-12), equal input and parameter gradients (1e-10)
/// and an empty tape afterwards. Returns the number of parameters compared.
template <class B>
std::size_t check_memory_free_backward() {
    olmax::Generator data(2);
    auto x = olmax::randn<double>({2, 2, 5, 4}, data);
    auto dy = olmax::randn<double>({2, 2, 5, 4}, data);
    olmax::Generator r1(5), r2(5);
    B rev(small_config(true), r1), plain(small_config(false), r2);
    REQUIRE(rev.memory_saving());
    REQUIRE_FALSE(plain.memory_saving());
    auto y_rev = rev.forward(x, {}), y_plain = plain.forward(x, {});
    CHECK(max_abs_diff(y_rev, y_plain) == 0);
    CHECK(max_abs_diff(rev.inverse(y_rev, {}), x) < 1e-12);

    auto gx_rev = input_grad(rev, x, dy), gx_plain = input_grad(plain, x, dy);
    CHECK(max_abs_diff(gx_rev, gx_plain) < 1e-10);
    auto p_rev = nn::parameters(rev), p_plain = nn::parameters(plain);
    REQUIRE(p_rev.size() == p_plain.size());
    for (std::size_t i = 0; i < p_rev.size(); ++i) {
        INFO(p_rev[i].name);
        REQUIRE(p_rev[i].tensor.grad().defined());
        CHECK(max_abs_diff(p_rev[i].tensor.grad(), p_plain[i].tensor.grad()) < 1e-10);
    }
    CHECK(olmax::autodiff::tape_size() == 0);
    return p_rev.size();
}

}  // namespace


TEST_CASE("Reversible: inverse rebuilds the input to 1e-12", "[nn][reversible]") {
    olmax::Generator rng(1);
    auto cfg = small_config();
    Block block(cfg, rng);
    auto x = olmax::randn<double>({2, 2, 5, 4}, rng);
    auto y = block.forward(x, {});
    CHECK(max_abs_diff(block.inverse(y, {}), x) < 1e-12);

    nn::Reversible<DenseF, LinearG, nn::MomentumCoupling> momentum(cfg, rng);
    CHECK(max_abs_diff(momentum.inverse(momentum.forward(x, {}), {}), x) < 1e-12);
    nn::RevSwap<DenseF> swap(cfg, rng);
    auto ys = swap.forward(x, {});
    CHECK(max_abs_diff(olmax::nn::take_leading(ys, 0), olmax::nn::take_leading(x, 1)) == 0);
    CHECK(max_abs_diff(swap.inverse(ys, {}), x) < 1e-12);
}

TEMPLATE_TEST_CASE("Reversible: memory-free backward equals the plain backward to 1e-10", "[nn][reversible]", nn::AdditiveCoupling,
                   nn::MomentumCoupling) {
    // dense: norm_in, conv0, mid norm, conv1, norm_out; linear: norm_in, weight, norm_out
    REQUIRE(check_memory_free_backward<nn::Reversible<DenseF, LinearG, TestType>>() == 8);
}

TEST_CASE("Reversible: gradient check of the memory-free backward", "[nn][reversible][gradcheck]") {
    olmax::Generator rng(3);
    Block block(small_config(), rng);
    auto x = olmax::randn<double>({2, 1, 4, 4}, rng);
    auto result = olmax::testing::check_gradients([&](const std::vector<Tensor<double>>& in) { return block.forward(in[0], {}); }, {x});
    CHECK(result);
    INFO(result);
}

TEST_CASE("ReversibleChain: inverse, memory-free backward equal to the plain one, for odd and even lengths", "[nn][reversible]") {
    // DenseF has 5 parameters, LinearG 3. Three functions end with the streams swapped, four in their order.
    CHECK(check_memory_free_backward<nn::ReversibleChain<DenseF, LinearG, DenseF>>() == 13);
    CHECK(check_memory_free_backward<nn::ReversibleChain<DenseF, LinearG, LinearG, DenseF>>() == 16);
}

TEST_CASE("Reversible couplings: finite-difference gradients of the input and every parameter in double", "[nn][reversible][gradcheck]") {
    olmax::Generator rng(13);
    const auto x = olmax::randn<double>({2, 1, 4, 4}, rng);
    auto check = [&](const auto& block) {
        REQUIRE(block.memory_saving());  // the custom, memory-free backward is the one checked
        const auto result = olmax::testing::check_layer_gradients(block, x);
        INFO(result);
        CHECK(result.ok);
    };
    SECTION("Reversible (parameters too)") { check(Block(small_config(), rng)); }
    SECTION("Reversible with MomentumCoupling") { check(nn::Reversible<DenseF, LinearG, nn::MomentumCoupling>(small_config(), rng)); }
    SECTION("RevSwap") { check(nn::RevSwap<DenseF>(small_config(), rng)); }
    SECTION("ReversibleChain of three") { check(nn::ReversibleChain<DenseF, LinearG, DenseF>(small_config(), rng)); }
    SECTION("ReversibleChain of four") { check(nn::ReversibleChain<LinearG, DenseF, LinearG, DenseF>(small_config(), rng)); }
}

TEST_CASE("Stack of reversible blocks: equal gradients, O(1) recompute, names", "[nn][stack][reversible]") {
    const std::size_t depth = 5;
    olmax::Generator data(4);
    auto x = olmax::randn<double>({2, 2, 6, 4}, data);
    auto dy = olmax::randn<double>({2, 2, 6, 4}, data);
    nn::Stack<Block> rev(small_config(true), depth), plain(small_config(false), depth);
    CHECK(max_abs_diff(rev.forward(x), plain.forward(x)) < 1e-13);
    CHECK(max_abs_diff(rev.inverse(rev.forward(x)), x) < 1e-12);

    auto gx_rev = input_grad(rev, x, dy), gx_plain = input_grad(plain, x, dy);
    CHECK(max_abs_diff(gx_rev, gx_plain) < 1e-10);
    auto p_rev = nn::parameters(rev), p_plain = nn::parameters(plain);
    REQUIRE(p_rev.size() == 8);
    for (std::size_t i = 0; i < p_rev.size(); ++i) {
        INFO(p_rev[i].name);
        CHECK(p_rev[i].tensor.shape()[0] == depth);
        REQUIRE(p_rev[i].tensor.grad().defined());
        CHECK(max_abs_diff(p_rev[i].tensor.grad(), p_plain[i].tensor.grad()) < 1e-10);
    }
    CHECK(p_rev[1].name == "stack/*/dense/conv0/weight");
    CHECK(p_rev[1].role == nn::Role::weight);
    CHECK(p_rev[0].role == nn::Role::norm_scale);
    auto per_layer = rev.layer_parameters();
    REQUIRE(per_layer.size() == 8 * depth);
    CHECK(per_layer[3 * 8 + 1].name == "stack/3/dense/conv0/weight");
    // Per-layer init differs between layers (each layer draws its own weights).
    CHECK(max_abs_diff(per_layer[1].tensor, per_layer[8 + 1].tensor) > 0.01);
    CHECK(olmax::autodiff::tape_size() == 0);
}

TEST_CASE("Stack of reversible blocks: a retained graph runs its reverse walk twice with the same gradients",
          "[nn][stack][reversible]") {
    // The walk takes the saved output over on the closure's last run only; with retain_graph the
    // output must still be there for the second run.
    olmax::Generator data(5);
    auto x_value = olmax::randn<double>({2, 2, 6, 4}, data);
    auto dy = olmax::randn<double>({2, 2, 6, 4}, data);
    nn::Stack<Block> stack(small_config(true), 3);
    auto params = tensors_of(stack);
    auto x = olmax::parameter(x_value.clone());
    auto y = stack.forward(x, {});
    y.backward(dy, /*retain_graph=*/true);
    const auto once_x = x.grad().clone();
    const auto once = grads_of(params);
    y.backward(dy);
    CHECK(max_abs_diff(x.grad(), olmax::scale(once_x, 2.0)) < 1e-12);
    const auto twice = grads_of(params);
    for (std::size_t i = 0; i < params.size(); ++i) CHECK(max_abs_diff(twice[i], olmax::scale(once[i], 2.0)) < 1e-12);
    CHECK(olmax::autodiff::tape_size() == 0);
}

TEST_CASE("Stack: a whole stacked model is causal along time", "[nn][stack][causal]") {
    nn::Stack<Block> body(small_config(true), 4);
    olmax::Generator data(6);
    auto x = olmax::randn<double>({2, 1, 8, 4}, data);
    auto y = body.forward(x);
    for (std::size_t t = 0; t < 8; ++t) {
        auto x2 = x.clone();
        for (std::size_t s = 0; s < 2; ++s)
            for (std::size_t f = 0; f < 4; ++f) x2(s, std::size_t{0}, t, f) += 1.0;
        auto y2 = body.forward(x2);
        for (std::size_t s = 0; s < 2; ++s)
            for (std::size_t u = 0; u < 8; ++u) {
                double diff = 0;
                for (std::size_t f = 0; f < 4; ++f) diff = std::max(diff, std::abs(y2(s, std::size_t{0}, u, f) - y(s, std::size_t{0}, u, f)));
                if (u < t) CHECK(diff == 0);
                if (u == t) CHECK(diff > 0);
            }
    }
}

TEST_CASE("Reversible with dropout: the recompute replays the same masks", "[nn][reversible][dropout]") {
    using DropF = nn::Sequential<nn::DenseConv<3, double>, nn::Dropout<double>>;
    using DropG = nn::Sequential<nn::Linear<double>, nn::Dropout<double>>;
    using B = nn::Reversible<DropF, DropG>;
    auto rev_cfg = small_config(true), plain_cfg = small_config(false);
    rev_cfg.dropout = plain_cfg.dropout = 0.3;
    nn::Stack<B> rev(rev_cfg, 4), plain(plain_cfg, 4);
    olmax::Generator data(7);
    auto x = olmax::randn<double>({2, 2, 6, 4}, data), dy = olmax::randn<double>({2, 2, 6, 4}, data);
    nn::LayerContext step;
    step.random_seed = 1234;
    auto y = rev.forward(x, step);
    CHECK(max_abs_diff(y, plain.forward(x, step)) == 0);
    CHECK(max_abs_diff(rev.inverse(y, step), x) < 1e-12);
    nn::LayerContext other = step;
    other.random_seed = 99;
    CHECK(max_abs_diff(rev.forward(x, other), y) > 1e-3);  // another step, other masks
    nn::LayerContext eval = step;
    eval.training = false;
    CHECK(max_abs_diff(rev.forward(x, eval), y) > 1e-3);

    auto xr = olmax::parameter(x.clone()), xp = olmax::parameter(x.clone());
    rev.forward(xr, step).backward(dy);
    plain.forward(xp, step).backward(dy);
    CHECK(max_abs_diff(xr.grad(), xp.grad()) < 1e-10);
    auto pr = nn::parameters(rev), pp = nn::parameters(plain);
    for (std::size_t i = 0; i < pr.size(); ++i) CHECK(max_abs_diff(pr[i].tensor.grad(), pp[i].tensor.grad()) < 1e-10);
    CHECK_THROWS_WITH(nn::Dropout<double>(1.0), Catch::Contains("Dropout"));
}

TEST_CASE("Stack memory: reversible activation peak does not grow with depth, plain does", "[nn][stack][memory]") {
    auto peak = [](std::size_t depth, bool reversible) {
        nn::Stack<Block> stack(small_config(reversible), depth);
        olmax::Generator data(8);
        auto x = olmax::parameter(olmax::randn<double>({2, 2, 16, 4}, data));
        auto dy = olmax::randn<double>({2, 2, 16, 4}, data);
        std::size_t param_bytes = 0;
        for (auto& p : nn::parameters(stack)) param_bytes += p.tensor.size() * sizeof(double);
        const std::size_t before = olmax::memory::stats().current_bytes;
        olmax::memory::reset_peak();
        stack.forward(x).backward(dy);
        return olmax::memory::stats().peak_bytes - before - param_bytes;
    };
    const auto rev2 = peak(2, true), rev16 = peak(16, true);
    const auto plain2 = peak(2, false), plain16 = peak(16, false);
    CHECK(double(rev16) <= 1.1 * double(rev2));
    CHECK(double(plain16) > 4.0 * double(plain2));
    CHECK(rev16 < plain16);
}

TEST_CASE("Stack: recompute as a budget keeps k layers' activations, same gradients, memory within the budget",
          "[nn][stack][reversible][memory]") {
    const std::size_t depth = 6;
    olmax::Generator data(9);
    const auto x = olmax::randn<double>({2, 2, 16, 4}, data);
    const auto dy = olmax::randn<double>({2, 2, 16, 4}, data);
    nn::Stack<Block> plain(small_config(false), depth);
    const auto gx_plain = input_grad(plain, x, dy);
    const auto p_plain = nn::parameters(plain);

    nn::Stack<Block> rev(small_config(true), depth);
    const std::size_t per_layer = rev.activation_bytes_per_layer(x);
    CHECK(per_layer > 0);
    CHECK(olmax::autodiff::tape_size() == 0);  // the probe's tape is gone
    std::vector<std::size_t> peaks;
    for (std::size_t kept : {std::size_t(0), std::size_t(2), std::size_t(4), depth}) {
        INFO(kept << " layers kept");
        rev.keep_activations(kept);
        CHECK(rev.kept_activations() == kept);
        auto p_rev = nn::parameters(rev);
        for (auto& p : p_rev) p.tensor.zero_grad();
        auto leaf = olmax::parameter(x.clone());
        const std::size_t before = olmax::memory::stats().current_bytes;
        olmax::memory::reset_peak();
        auto y = rev.forward(leaf);
        CHECK(max_abs_diff(y, plain.forward(x)) < 1e-13);
        y.backward(dy);
        peaks.push_back(olmax::memory::stats().peak_bytes - before);
        CHECK(max_abs_diff(leaf.grad(), gx_plain) < 1e-10);  // kept or rebuilt, the same gradients
        for (std::size_t i = 0; i < p_rev.size(); ++i) {
            INFO(p_rev[i].name);
            CHECK(max_abs_diff(p_rev[i].tensor.grad(), p_plain[i].tensor.grad()) < 1e-10);
        }
        CHECK(olmax::autodiff::tape_size() == 0);
    }
    // Memory grows with what is kept, by at most the probe's bytes per kept layer (the rebuilt
    // layers' working memory, one layer's recompute, is gone when every layer is kept).
    INFO("peaks " << peaks[0] << ", " << peaks[1] << ", " << peaks[2] << ", " << peaks[3] << "; per layer " << per_layer);
    CHECK(peaks[1] > peaks[0]);
    CHECK(peaks[2] > peaks[1]);
    CHECK(double(peaks[2] - peaks[0]) <= 4.0 * double(per_layer) * 1.05);
    CHECK(double(peaks[3] - peaks[0]) <= 6.0 * double(per_layer) * 1.05);
    // A byte budget picks floor(budget / per-layer bytes) layers, at most the depth.
    CHECK(rev.fit_activations(3 * per_layer + per_layer / 2, x) == 3);
    CHECK(rev.fit_activations(0, x) == 0);
    CHECK(rev.fit_activations(100 * per_layer, x) == depth);
    // Without a tape (evaluation) nothing is kept.
    rev.keep_activations(depth);
    {
        olmax::autodiff::no_grad guard;
        CHECK(max_abs_diff(rev.forward(x), plain.forward(x)) < 1e-13);
    }
    CHECK(olmax::autodiff::tape_size() == 0);
}

TEST_CASE("data_parallel_backward equals differentiating the shards one after another", "[autodiff][data_parallel][nn][stack]") {
    olmax_test::ForceThreading threads;  // 3 threads, every op eligible for threading (inside shards: serial)
    for (const bool reversible : {true, false}) {
        INFO("reversible backward " << reversible);
        nn::Stack<Block> stack(small_config(reversible), 3);
        auto params = tensors_of(stack);
        olmax::Generator rng(17);
        const auto x = olmax::randn<double>({5, 7, 4}, rng);  // [batch, time, features]
        const auto target = olmax::randn<double>({5, 7, 4}, rng);
        auto model = [&](const Tensor<double>& input) { return nn::merge_streams(stack.forward(nn::two_streams(input))); };
        const std::size_t shards = 4;
        auto shard_loss = [&](std::size_t s) {
            const std::size_t begin = x.shape()[0] * s / shards, end = x.shape()[0] * (s + 1) / shards;
            const auto y = model(rows(x, begin, end));
            return olmax::sum(olmax::square(y - rows(target, begin, end))) * (1.0 / double(x.size()));
        };

        std::vector<double> sequential_losses;
        for (std::size_t s = 0; s < shards; ++s) {
            ad::tape_scope tape;
            auto loss = shard_loss(s);
            sequential_losses.push_back(loss.item());
            loss.backward();
        }
        const auto sequential = grads_of(params);
        zero(params);

        const auto losses = ad::data_parallel_backward<double>(params, shards, shard_loss);
        const auto parallel = grads_of(params);
        REQUIRE(losses.size() == shards);
        for (std::size_t s = 0; s < shards; ++s) CHECK(losses[s] == Approx(sequential_losses[s]).epsilon(1e-14));
        REQUIRE(parallel.size() == sequential.size());
        for (std::size_t i = 0; i < params.size(); ++i) {
            REQUIRE(parallel[i].defined());
            CHECK(max_abs_diff(parallel[i], sequential[i]) < 1e-14);
        }

        // Deterministic: a second run gives the same bits; on top of existing gradients it adds.
        zero(params);
        ad::data_parallel_backward<double>(params, shards, shard_loss);
        for (std::size_t i = 0; i < params.size(); ++i) CHECK(max_abs_diff(params[i].grad(), parallel[i]) == 0);
        ad::data_parallel_backward<double>(params, shards, shard_loss);
        for (std::size_t i = 0; i < params.size(); ++i) CHECK(max_abs_diff(params[i].grad(), 2.0 * parallel[i]) < 1e-14);

        // One shard is plain backward.
        zero(params);
        ad::data_parallel_backward<double>(params, 1, [&](std::size_t) { return olmax::sum(olmax::square(model(x) - target)) * (1.0 / double(x.size())); });
        for (std::size_t i = 0; i < params.size(); ++i) CHECK(max_abs_diff(params[i].grad(), parallel[i]) < 1e-14);
    }
}

TEST_CASE("Reversible and Stack: a batch of 2 passed instead of nn::two_streams(x) is refused with a hint", "[nn][reversible][errors]") {
    olmax::Generator rng(5);
    const nn::Config config = small_config();
    const Block block(config, rng);
    nn::Stack<Block> stack(config, 2, rng);
    // [2, 6, 4]: a batch of two sequences, read as two streams of shape [6, 4] (DenseConv wants [B, T, F]).
    const auto batch_of_two = olmax::randn<double>({2, 6, 4}, rng);
    for (const std::string where : {"Reversible", "Stack"}) {
        INFO(where);
        try {
            where == "Stack" ? stack.forward(batch_of_two) : block.forward(batch_of_two);
            FAIL("no error");
        } catch (const olmax::shape_error& e) {
            const std::string what = e.what();
            CHECK_THAT(what, Catch::Contains("if it is a batch of 2, pass nn::two_streams(x) instead"));
            CHECK_THAT(what, Catch::Contains(": its input [2, 6, 4] is read as two streams of shape [6, 4]"));
            CHECK(what.find("two_streams") == what.rfind("two_streams"));  // one hint, also from a block inside a stack
            CHECK(what.find('\n') == std::string::npos);
        }
    }
    // The right input passes.
    CHECK(stack.forward(nn::two_streams(olmax::randn<double>({2, 6, 4}, rng))).shape() == olmax::Shape{2, 2, 6, 4});
}
