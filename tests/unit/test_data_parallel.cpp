// Data parallelism over threads: private gradient buffers and data_parallel_backward, on plain
// ops and on stacked reversible layers (whose backward writes parameter gradients by slice).
#include "test_helpers.hpp"

#include <olmax/nn/nn.hpp>

#include <stdexcept>

using olmax::Tensor;
namespace ad = olmax::autodiff;
namespace nn = olmax::nn;
using olmax_test::max_abs_diff;

namespace {

nn::Config stack_config(bool reversible) {
    nn::Config c;
    c.features = 4;
    c.hidden_features = 6;
    c.seed = 5;
    c.reversible_backward = reversible;
    return c;
}

using Block = nn::Reversible<nn::Sandwich<nn::DenseConv<3, double>>, nn::Sandwich<nn::Linear<double>>>;

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

}  // namespace

TEST_CASE("private_gradients: a scope collects a listed leaf's gradient; others and outer scopes are untouched", "[autodiff][data_parallel]") {
    auto w = olmax::parameter(Tensor<double>::from({2}, {1, 2}));
    auto v = olmax::parameter(Tensor<double>::from({2}, {3, 4}));
    olmax::sum(w * v).backward();  // w.grad = v, v.grad = w
    const std::vector<Tensor<double>> listed{w};
    {
        ad::private_gradients<double> outer(listed);
        {
            ad::private_gradients<double> inner(std::vector<Tensor<double>>{v});
            olmax::sum(w * w * v).backward();  // d/dw = 2 w v -> outer buffer, d/dv = w^2 -> inner buffer
            CHECK(inner.grad(v)(0) == 1);
            CHECK(inner.grad(v)(1) == 4);
            CHECK_FALSE(inner.grad(w).defined());
        }
        CHECK(outer.grad(w)(0) == 6);
        CHECK(outer.grad(w)(1) == 16);
    }
    // The tensors' own gradients only hold the first backward's.
    CHECK(w.grad()(0) == 3);
    CHECK(w.grad()(1) == 4);
    CHECK(v.grad()(0) == 1);
    CHECK(v.grad()(1) == 2);
    olmax::sum(w * v).backward();  // after the scopes, gradients go to the tensors again
    CHECK(w.grad()(1) == 8);
}

TEST_CASE("data_parallel_backward equals differentiating the shards one after another", "[autodiff][data_parallel][nn][stack]") {
    olmax_test::ForceThreading threads;  // 3 threads, every op eligible for threading (inside shards: serial)
    for (const bool reversible : {true, false}) {
        INFO("reversible backward " << reversible);
        nn::Stack<Block> stack(stack_config(reversible), 3);
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

TEST_CASE("data_parallel_backward rejects bad input and rethrows a shard's error", "[autodiff][data_parallel][errors]") {
    olmax_test::ForceThreading threads;
    auto w = olmax::parameter(Tensor<double>::from({2}, {1, 2}));
    const std::vector<Tensor<double>> params{w};
    auto good = [&](std::size_t) { return olmax::sum(w * w); };
    CHECK_THROWS_AS(ad::data_parallel_backward<double>(params, 0, good), olmax::value_error);
    CHECK_THROWS_AS(ad::data_parallel_backward<double>(std::vector<Tensor<double>>{Tensor<double>({2})}, 2, good), olmax::autodiff_error);
    CHECK_THROWS_AS(ad::data_parallel_backward<double>(params, 2, [&](std::size_t) { return w * w; }), olmax::shape_error);
    CHECK_THROWS_WITH(ad::data_parallel_backward<double>(params, 3,
                                                         [&](std::size_t s) -> Tensor<double> {
                                                             if (s == 2) throw std::runtime_error("shard two failed");
                                                             return olmax::sum(w * w);
                                                         }),
                      "shard two failed");
    // The thread that failed left no redirect behind: a plain backward reaches w again.
    w.zero_grad();
    olmax::sum(w * w).backward();
    CHECK(w.grad()(1) == 4);
}
