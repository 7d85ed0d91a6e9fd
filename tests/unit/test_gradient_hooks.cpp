// gradient_ready_hook: when and in what order leaves' gradients are reported final during backward,
// nested passes, nesting of hooks, and data_parallel_backward's shards under a hook.
#include "test_helpers.hpp"

#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

using olmax::Tensor;
namespace ad = olmax::autodiff;

namespace {
using olmax_test::same_bits;

/// What a hook saw: the leaf indices in firing order and each leaf's gradient at that moment.
struct Seen {
    std::vector<std::size_t> order;
    std::map<std::size_t, Tensor<double>> grads;
    std::mutex mutex;  // data_parallel_backward may call from a worker thread (never two at once)
    ad::gradient_ready_hook<double>::Callback record(const std::vector<Tensor<double>>& leaves) {
        return [this, leaves](std::size_t i) {
            std::lock_guard lock(mutex);
            order.push_back(i);
            const Tensor<double> g = leaves[i].grad();
            grads[i] = g.defined() ? g.clone() : Tensor<double>();
        };
    }
};

}  // namespace

TEST_CASE("gradient_ready_hook: leaves fire once each, when their earliest-recorded user has run", "[autodiff][gradient_hooks]") {
    auto a = olmax::parameter(Tensor<double>::from({3}, {0.5, -1.25, 2.0}));
    auto b = olmax::parameter(Tensor<double>::from({3}, {1.5, 0.75, -0.5}));
    auto c = olmax::parameter(Tensor<double>::from({3}, {-2.0, 1.0, 0.25}));
    auto d = olmax::parameter(Tensor<double>::from({3}, {9.0, 9.0, 9.0}));  // listed, never used
    const auto x = Tensor<double>::from({3}, {1.0, 2.0, 3.0});
    const std::vector<Tensor<double>> leaves{a, b, c, d};
    Seen seen;
    {
        ad::gradient_ready_hook<double> hook(leaves, seen.record(leaves));
        // a is used by the first node and by a late one; b by two late ones; c by one in between.
        auto h1 = a * x;                 // node 0: a
        auto h2 = h1 * c;                // node 1: c
        auto h3 = h2 * b;                // node 2: b
        auto late = a * b;               // node 3: a, b (gives a and b a partial gradient early in the pass)
        auto loss = olmax::sum(h3 + late * late);
        loss.backward();
    }
    // d reaches no node (final before the pass), then b (node 2), c (node 1), a (node 0).
    REQUIRE(seen.order == std::vector<std::size_t>{3, 1, 2, 0});
    CHECK_FALSE(seen.grads[3].defined());
    for (std::size_t i : {0, 1, 2}) CHECK(same_bits(seen.grads[i], leaves[i].grad()));  // nothing added after the report
    // The values themselves: dL/da = x c b + 2 a b^2, so a's report came after node 0's share.
    for (std::size_t k = 0; k < 3; ++k) {
        const double ak = a(k), bk = b(k), ck = c(k), xk = x(k);
        CHECK(seen.grads[0](k) == Approx(xk * ck * bk + 2 * ak * bk * bk));
        CHECK(seen.grads[1](k) == Approx(ak * xk * ck + 2 * ak * ak * bk));
    }
    // The hook is gone: another pass reports nothing.
    olmax::sum(a * b).backward();
    CHECK(seen.order.size() == 4);
}

TEST_CASE("gradient_ready_hook: a pass per backward; a leaf root; nested hooks", "[autodiff][gradient_hooks]") {
    auto w = olmax::parameter(Tensor<double>::from({2}, {1, 2}));
    auto v = olmax::parameter(Tensor<double>::from({2}, {3, 4}));
    const std::vector<Tensor<double>> leaves{w, v};
    Seen outer_seen, inner_seen;
    ad::gradient_ready_hook<double> outer(leaves, outer_seen.record(leaves));
    olmax::sum(w * v).backward();  // one node with both: ties in index order
    CHECK(outer_seen.order == std::vector<std::size_t>{0, 1});
    {
        ad::gradient_ready_hook<double> inner(leaves, inner_seen.record(leaves));
        CHECK(ad::gradient_ready_hook<double>::active() == &inner);
        olmax::sum(olmax::exp(v) * w).backward();  // node 0: exp(v); node 1: mul(., w) -> w first
        CHECK(inner_seen.order == std::vector<std::size_t>{0, 1});
    }
    CHECK(outer_seen.order.size() == 2);  // the inner hook took those reports
    CHECK(ad::gradient_ready_hook<double>::active() == &outer);
    // backward on a leaf: no node runs, every leaf is final at once
    w.backward(Tensor<double>::from({2}, {1, 1}));
    CHECK(outer_seen.order == std::vector<std::size_t>{0, 1, 0, 1});
}

TEST_CASE("gradient_ready_hook: passes nested in a node (recompute) report nothing; the outer node finishes the leaf",
          "[autodiff][gradient_hooks]") {
    // Like a reversible block: the node recomputes f(x) = w * x on its own tape and backpropagates
    // there, which adds into w directly; w is an input of the node so that it records.
    auto w = olmax::parameter(Tensor<double>::from({2}, {1.5, -2}));
    auto u = olmax::parameter(Tensor<double>::from({2}, {0.5, 0.25}));
    const auto x = Tensor<double>::from({2}, {3, 5});
    const std::vector<Tensor<double>> leaves{w, u};
    Seen seen;
    int reports_inside_node = -1;
    {
        ad::gradient_ready_hook<double> hook(leaves, seen.record(leaves));
        Tensor<double> value;
        {
            ad::no_grad off;
            value = w * x;
        }
        auto y = ad::custom_op<double>("recompute", value, {x, w}, [&](const Tensor<double>& dy, ad::GradientSink<double>&) {
            ad::tape_scope local;
            ad::enable_grad on;
            auto f = w * x;
            f.backward(dy);  // a nested pass: must not report w
            reports_inside_node = int(seen.order.size());
        });
        olmax::sum(y * u).backward();
    }
    CHECK(reports_inside_node == 1);  // during the node: u (final after the later mul node), not w
    REQUIRE(seen.order == std::vector<std::size_t>{1, 0});
    CHECK(same_bits(seen.grads[0], w.grad()));
    CHECK(w.grad()(0) == Approx(3 * 0.5));
    CHECK(w.grad()(1) == Approx(5 * 0.25));
}

TEST_CASE("gradient_ready_hook rejects bad input", "[autodiff][gradient_hooks][errors]") {
    auto w = olmax::parameter(Tensor<double>::from({2}, {1, 2}));
    auto noop = [](std::size_t) {};
    CHECK_THROWS_AS(ad::gradient_ready_hook<double>(std::vector<Tensor<double>>{w, w}, noop), olmax::value_error);
    CHECK_THROWS_AS(ad::gradient_ready_hook<double>(std::vector<Tensor<double>>{w * w}, noop), olmax::autodiff_error);
    CHECK_THROWS_AS(ad::gradient_ready_hook<double>(std::vector<Tensor<double>>{Tensor<double>()}, noop), olmax::autodiff_error);
    CHECK_THROWS_AS(ad::gradient_ready_hook<double>(std::vector<Tensor<double>>{w}, nullptr), olmax::value_error);
    CHECK(ad::gradient_ready_hook<double>::active() == nullptr);
    // A callback that throws stops the pass like a failing node would; the hook is unregistered after.
    {
        ad::gradient_ready_hook<double> hook(std::vector<Tensor<double>>{w}, [](std::size_t) { throw std::runtime_error("reducer failed"); });
        CHECK_THROWS_WITH(olmax::sum(w * w).backward(), "reducer failed");
    }
    CHECK(ad::gradient_ready_hook<double>::active() == nullptr);
}

TEST_CASE("data_parallel_backward under a gradient_ready_hook: each parameter once, final, bit-identical to no hook",
          "[autodiff][gradient_hooks][data_parallel]") {
    olmax_test::ForceThreading threads;
    olmax::Generator rng(11);
    auto w1 = olmax::parameter(olmax::randn<double>({4, 6}, rng));
    auto w2 = olmax::parameter(olmax::randn<double>({6, 3}, rng));
    auto unused = olmax::parameter(olmax::randn<double>({5}, rng));
    auto other = olmax::parameter(olmax::randn<double>({2}, rng));  // hooked, but not a parameter of the call
    const auto data = olmax::randn<double>({5, 4}, rng);
    const std::vector<Tensor<double>> params{w1, w2, unused};
    auto shard_loss = [&](std::size_t s) {  // w1 first used, so final last
        const auto rows = olmax::slice(data, 0, s, s + 1);
        return olmax::sum(olmax::square(olmax::matmul(olmax::tanh(olmax::matmul(rows, w1)), w2)));
    };
    for (std::size_t shards : {1, 2, 5}) {
        for (auto p : params) p.zero_grad();
        ad::data_parallel_backward<double>(params, shards, shard_loss);
        std::vector<Tensor<double>> plain;
        for (const auto& p : params) plain.push_back(p.grad().defined() ? p.grad().clone() : Tensor<double>());
        for (auto p : params) p.zero_grad();
        const std::vector<Tensor<double>> hooked{other, w2, unused, w1};
        Seen seen;
        {
            ad::gradient_ready_hook<double> hook(hooked, seen.record(hooked));
            ad::data_parallel_backward<double>(params, shards, shard_loss);
        }
        INFO("shards " << shards);
        REQUIRE(seen.order.size() == 4);
        CHECK(seen.order.front() == 0);  // not among the parameters: reported at once
        std::vector<std::size_t> sorted = seen.order;
        std::sort(sorted.begin(), sorted.end());
        CHECK(sorted == std::vector<std::size_t>{0, 1, 2, 3});
        CHECK(same_bits(seen.grads[3], w1.grad()));  // reported with the shards already summed
        CHECK(same_bits(seen.grads[1], w2.grad()));
        CHECK_FALSE(seen.grads[2].defined());
        CHECK(same_bits(w1.grad(), plain[0]));
        CHECK(same_bits(w2.grad(), plain[1]));
        CHECK_FALSE(unused.grad().defined());
    }
}

TEST_CASE("offer_final_slice: a slice is taken only when no other node of the pass adds into it", "[autodiff][gradient_hooks]") {
    // P [3, 2]; take_leading nodes add into one row each and offer it. Taken rows never reach P's
    // gradient; declined ones are added there as usual.
    auto run = [](auto&& build) {
        auto p = olmax::parameter(Tensor<double>::from({3, 2}, {1, 2, 3, 4, 5, 6}));
        std::map<std::size_t, std::vector<double>> taken;  // offset -> gradient
        std::vector<std::size_t> ready;
        {
            ad::gradient_ready_hook<double> hook(
                std::vector<Tensor<double>>{p}, [&](std::size_t i) { ready.push_back(i); },
                [&](std::size_t, std::size_t offset, const Tensor<double>& g) {
                    taken[offset] = std::vector<double>(g.data(), g.data() + g.size());
                    return true;
                });
            olmax::sum(build(p)).backward();
        }
        CHECK(ready == std::vector<std::size_t>{0});
        return std::make_pair(taken, p.grad().defined() ? std::vector<double>(p.grad().data(), p.grad().data() + 6) : std::vector<double>{});
    };
    namespace nn = olmax::nn;
    SECTION("disjoint rows: both taken, nothing stored") {
        const auto [taken, stored] = run([](const Tensor<double>& p) { return nn::take_leading(p, 0) * 2.0 + nn::take_leading(p, 2) * 3.0; });
        CHECK(taken.size() == 2);
        CHECK(taken.at(0) == std::vector<double>{2, 2});
        CHECK(taken.at(4) == std::vector<double>{3, 3});
        CHECK(stored.empty());
    }
    SECTION("the same row twice: neither is final alone, both are stored") {
        const auto [taken, stored] = run([](const Tensor<double>& p) { return nn::take_leading(p, 1) * 2.0 + nn::take_leading(p, 1) * 3.0; });
        CHECK(taken.empty());
        CHECK(stored == std::vector<double>{0, 0, 5, 5, 0, 0});
    }
    SECTION("a node adding anywhere in P: no row is final") {
        const auto [taken, stored] = run([](const Tensor<double>& p) { return olmax::sum(nn::take_leading(p, 0) * 2.0) + olmax::sum(p * 1.0); });
        CHECK(taken.empty());
        CHECK(stored == std::vector<double>{3, 3, 1, 1, 1, 1});
    }
}

TEST_CASE("offer_final_slice: offers from a pass nested in a node are declined", "[autodiff][gradient_hooks]") {
    // A node whose backward differentiates a recompute that reads the hooked leaf itself, taking its
    // row 0 twice: the nested take_leading nodes are not the observed pass's nodes, so the hook must
    // not take their rows (each holds only part of the row's gradient).
    auto p = olmax::parameter(Tensor<double>::from({2, 2}, {1, 2, 3, 4}));
    std::size_t taken = 0;
    {
        ad::gradient_ready_hook<double> hook(
            std::vector<Tensor<double>>{p}, [](std::size_t) {},
            [&](std::size_t, std::size_t, const Tensor<double>&) {
                ++taken;
                return true;
            });
        auto y = ad::custom_op<double>("recompute", {olmax::Tensor<double>::from({1}, {0.0})}, {p},
                                       [&](std::span<const Tensor<double>>, ad::GradientSink<double>&) {
                                           ad::enable_grad recording;  // backward closures run under no_grad
                                           ad::tape_scope nested;
                                           olmax::sum(olmax::nn::take_leading(p, 0) * 2.0 + olmax::nn::take_leading(p, 0) * 3.0).backward();
                                       })[0];
        olmax::sum(y).backward();
    }
    CHECK(taken == 0);
    REQUIRE(p.grad().defined());
    CHECK(std::vector<double>(p.grad().data(), p.grad().data() + 4) == std::vector<double>{5, 5, 0, 0});
}
