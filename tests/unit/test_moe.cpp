// nn::MoE (sparse top-k dispatch) and its ops gather_rows / scatter_rows / grouped_matmul:
// gradients in double, sparse against dense, causality, capacity and drop counts on a hand-built
// routing, the balance loss's gradient (finite differences; both reversible modes), bad configurations and shapes.
#include "test_helpers.hpp"

#include <olmax/nn/nn.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace nn = olmax::nn;
using olmax::Tensor;
using olmax_test::max_abs_diff;

namespace {

nn::MoEConfig moe_config(std::size_t top_k, double capacity_factor, std::size_t experts = 3, std::size_t features = 4,
                      double balance_coefficient = 0.01) {
    nn::MoEConfig c;
    c.balance_coefficient = balance_coefficient;
    c.features = features;
    c.experts = experts;
    c.top_k = top_k;
    c.capacity_factor = capacity_factor;
    c.seed = 7;
    return c;
}

/// The layer's forward as a function of [x, router, experts] (a copy bound to the inputs).
auto bound_forward(nn::MoE<double> layer) {
    return [layer](const std::vector<Tensor<double>>& in) mutable {
        std::size_t i = 1;
        nn::ParameterVisitor<double> bind([&](const std::string&, Tensor<double>& t, nn::Role, nn::Sharing) { t = in[i++]; });
        layer.visit_parameters(bind);
        return layer.forward(in[0], {});
    };
}

std::vector<Tensor<double>> inputs_of(nn::MoE<double>& layer, const Tensor<double>& x) {
    std::vector<Tensor<double>> in{x};
    for (auto& p : nn::parameters(layer)) in.push_back(p.tensor.detach().clone());
    return in;
}

/// Forward with leaves [x, router, experts], backward of sum(y * r); the value and the gradients.
struct Run {
    Tensor<double> y;
    std::vector<Tensor<double>> grads;
};
Run run(const nn::MoE<double>& layer, const std::vector<Tensor<double>>& in, const Tensor<double>& r) {
    std::vector<Tensor<double>> leaves;
    for (const auto& t : in) leaves.push_back(olmax::parameter(t.clone()));
    auto f = bound_forward(layer);
    Run out;
    out.y = f(leaves);
    olmax::sum(olmax::mul(out.y, r)).backward();
    for (const auto& l : leaves) out.grads.push_back(l.grad());
    return out;
}

}  // namespace

TEST_CASE("gather_rows / scatter_rows: values, repeated rows accumulate, gradients", "[moe][ops]") {
    olmax::Generator rng(1);
    auto x = olmax::randn<double>({5, 3}, rng);
    auto rows = Tensor<std::int32_t>::from({4}, {4, 0, 4, 2});
    auto g = olmax::gather_rows(x, rows);
    REQUIRE(g.shape() == olmax::Shape{4, 3});
    for (std::size_t j = 0; j < 3; ++j) {
        CHECK(g(std::size_t{0}, j) == x(std::size_t{4}, j));
        CHECK(g(std::size_t{3}, j) == x(std::size_t{2}, j));
    }
    auto src = olmax::randn<double>({4, 3}, rng);
    auto s = olmax::scatter_rows(src, rows, 6);
    REQUIRE(s.shape() == olmax::Shape{6, 3});
    for (std::size_t j = 0; j < 3; ++j) {
        CHECK(s(std::size_t{4}, j) == src(std::size_t{0}, j) + src(std::size_t{2}, j));
        CHECK(s(std::size_t{1}, j) == 0.0);
        CHECK(s(std::size_t{5}, j) == 0.0);
    }
    olmax_test::check_gradients([&](const std::vector<Tensor<double>>& in) { return olmax::gather_rows(in[0], rows); }, {x});
    olmax_test::check_gradients([&](const std::vector<Tensor<double>>& in) { return olmax::scatter_rows(in[0], rows, 6); }, {src});
    CHECK_THROWS_AS(olmax::gather_rows(x, Tensor<std::int32_t>::from({2}, {0, 5})), olmax::value_error);
    CHECK_THROWS_AS(olmax::gather_rows(x, Tensor<std::int32_t>::from({1}, {-1})), olmax::value_error);
    CHECK_THROWS_AS(olmax::scatter_rows(src, Tensor<std::int32_t>::from({3}, {0, 1, 2}), 6), olmax::shape_error);
    CHECK_THROWS_AS(olmax::scatter_rows(src, rows, 4), olmax::value_error);  // index 4 not in [0, 4)
}

TEST_CASE("grouped_matmul: each row block times its own matrix, empty groups, gradients", "[moe][ops]") {
    olmax::Generator rng(2);
    auto x = olmax::randn<double>({7, 3}, rng), w = olmax::randn<double>({4, 3, 5}, rng);
    const std::vector<std::size_t> offsets{0, 2, 2, 6, 7};  // group 1 empty
    auto y = olmax::grouped_matmul(x, w, offsets);
    REQUIRE(y.shape() == olmax::Shape{7, 5});
    for (std::size_t g = 0; g < 4; ++g)
        for (std::size_t m = offsets[g]; m < offsets[g + 1]; ++m)
            for (std::size_t n = 0; n < 5; ++n) {
                double want = 0;
                for (std::size_t k = 0; k < 3; ++k) want += x(m, k) * w(g, k, n);
                CHECK(y(m, n) == Approx(want).epsilon(1e-13));
            }
    olmax_test::check_gradients([&](const std::vector<Tensor<double>>& in) { return olmax::grouped_matmul(in[0], in[1], offsets); }, {x, w});
    CHECK_THROWS_AS(olmax::grouped_matmul(x, w, std::vector<std::size_t>{0, 2, 7}), olmax::shape_error);
    CHECK_THROWS_AS(olmax::grouped_matmul(x, w, std::vector<std::size_t>{0, 3, 2, 6, 7}), olmax::value_error);
    CHECK_THROWS_AS(olmax::grouped_matmul(x, w, std::vector<std::size_t>{0, 2, 2, 6, 6}), olmax::value_error);
    CHECK_THROWS_AS(olmax::grouped_matmul(x, olmax::randn<double>({4, 2, 5}, rng), offsets), olmax::shape_error);
}

TEST_CASE("MoE: finite-difference gradients in x, router and experts, top-1 and top-2, with drops", "[moe][gradcheck]") {
    for (std::size_t k : {1u, 2u}) {
        INFO("top-" << k);
        olmax::Generator rng(10 + k);
        nn::MoE<double> moe(moe_config(k, 0.5, 3, 4, 0.0), rng);  // the balance's own gradient: the next test
        CHECK(moe.capacity(8) == (k == 1 ? 2u : 3u));  // ceil(0.5 k 8 / 3)
        auto x = olmax::randn<double>({2, 8, 4}, rng);
        moe.clear_routing_stats();
        {
            olmax::autodiff::no_grad guard;
            moe.forward(x);
        }
        const auto stats = moe.routing_stats();
        CHECK(stats.assignments == 16 * k);
        CHECK(stats.dropped > 0);  // some assignments over capacity: their gradient path is cut
        CHECK(stats.dropped < stats.assignments);
        auto result = olmax::testing::check_gradients(bound_forward(moe), inputs_of(moe, x));
        CHECK(result);
        INFO(result);
    }
}

TEST_CASE("MoE: the gradient is that of sum(y r) + alpha * balance, by finite differences of the logged balance", "[moe][gradcheck]") {
    for (std::size_t k : {1u, 2u}) {
        INFO("top-" << k);
        const double alpha = 0.3;
        olmax::Generator rng(20 + k);
        nn::MoE<double> moe(moe_config(k, 0.75, 3, 4, alpha), rng);
        const auto x = olmax::randn<double>({2, 6, 4}, rng), r = olmax::randn<double>({2, 6, 4}, rng);
        auto in = inputs_of(moe, x);
        // The objective as a value: the task term plus alpha times the balance routing_stats() logged.
        auto objective = [&](const std::vector<Tensor<double>>& at) {
            olmax::autodiff::no_grad off;
            moe.clear_routing_stats();
            const double task = olmax::sum(olmax::mul(bound_forward(moe)(at), r)).item();
            return task + alpha * moe.routing_stats().mean_balance();
        };
        const Run analytic = run(moe, in, r);  // backward of sum(y r) alone: the layer adds the balance
        double worst = 0;
        for (std::size_t i = 0; i < in.size(); ++i) {
            for (std::size_t e = 0; e < in[i].size(); ++e) {
                const double h = 1e-6, keep = in[i].data()[e];
                in[i].data()[e] = keep + h;
                const double up = objective(in);
                in[i].data()[e] = keep - h;
                const double down = objective(in);
                in[i].data()[e] = keep;
                const double numeric = (up - down) / (2 * h), exact = analytic.grads[i].data()[e];
                worst = std::max(worst, std::abs(numeric - exact) / (1e-6 + std::abs(numeric)));
            }
        }
        CHECK(worst < 1e-5);  // relative, central differences in double
        // Without the coefficient the gradients differ: the balance term is really there.
        nn::MoE<double> plain(moe_config(k, 0.75, 3, 4, 0.0), rng);
        const Run without = run(plain, in, r);
        CHECK(max_abs_diff(without.grads[1], analytic.grads[1]) > 1e-3);
    }
}

TEST_CASE("MoE: sparse and slot dispatch equal the dense reference, values and gradients", "[moe]") {
    for (std::size_t k : {1u, 2u}) {
        for (double factor : {0.5, 1.25, 4.0}) {
            INFO("top-" << k << ", capacity factor " << factor);
            olmax::Generator rng(20 + k);
            nn::MoE<double> sparse(moe_config(k, factor, 4, 6), rng);
            nn::MoE<double> dense = sparse, slots = sparse;
            dense.set_dispatch(nn::MoEDispatch::dense);
            slots.set_dispatch(nn::MoEDispatch::slots);
            CHECK(sparse.dispatch() == nn::MoEDispatch::sparse);
            auto x = olmax::randn<double>({3, 10, 6}, rng), r = olmax::randn<double>({3, 10, 6}, rng);
            const auto in = inputs_of(sparse, x);
            const Run a = run(sparse, in, r);
            for (const nn::MoE<double>* other : {&dense, &slots}) {
                INFO((other == &dense ? "dense" : "slots"));
                const Run b = run(*other, in, r);
                CHECK(max_abs_diff(a.y, b.y) < 1e-13);
                for (std::size_t i = 0; i < in.size(); ++i) {
                    INFO("gradient of input " << i);
                    REQUIRE(b.grads[i].defined());
                    CHECK(max_abs_diff(a.grads[i], b.grads[i]) < 1e-12);
                }
            }
        }
    }
    // The same through MoEConfig::dispatch (same seed, same parameters).
    auto c = moe_config(2, 1.0);
    olmax::Generator r1(5), r2(5), data(6);
    nn::MoE<double> a(c, r1);
    c.dispatch = nn::MoEDispatch::dense;
    nn::MoE<double> b(c, r2);
    CHECK(b.dispatch() == nn::MoEDispatch::dense);
    auto x = olmax::randn<double>({2, 9, 4}, data);
    olmax::autodiff::no_grad guard;
    CHECK(max_abs_diff(a.forward(x), b.forward(x)) < 1e-13);
}

TEST_CASE("MoE: causal along time, with capacity drops, top-1 and top-2", "[moe][causal]") {
    for (std::size_t k : {1u, 2u}) {
        INFO("top-" << k);
        olmax::Generator rng(30 + k);
        nn::MoE<double> moe(moe_config(k, 0.6), rng);
        auto x = olmax::randn<double>({2, 12, 4}, rng);
        olmax::autodiff::no_grad guard;
        const auto y = moe.forward(x);
        for (std::size_t t = 0; t < 12; ++t) {
            auto x2 = x.clone();
            for (std::size_t f = 0; f < 4; ++f) x2(std::size_t{0}, t, f) += 3.0;  // large: changes routing too
            const auto y2 = moe.forward(x2);
            for (std::size_t u = 0; u < t; ++u)
                for (std::size_t f = 0; f < 4; ++f) {
                    INFO("perturbed t=" << t << ", output u=" << u);
                    REQUIRE(y2(std::size_t{0}, u, f) == y(std::size_t{0}, u, f));
                }
            for (std::size_t u = 0; u < 12; ++u)  // the other sequence is untouched
                for (std::size_t f = 0; f < 4; ++f) REQUIRE(y2(std::size_t{1}, u, f) == y(std::size_t{1}, u, f));
        }
    }
}

TEST_CASE("MoE: capacity and drop counts on a hand-built routing", "[moe]") {
    // F = E = 2, router 10 I: token [1, 0] picks expert 0 first, [0, 1] expert 1. Experts: identity
    // and 2 I, so a kept assignment's output is p_e * c_e * x (x >= 0: leaky_relu is the identity).
    auto build = [](std::size_t k, double factor) {
        auto c = moe_config(k, factor, 2, 2);
        olmax::Generator rng(1);
        nn::MoE<double> moe(c, rng);
        auto params = nn::parameters(moe);
        auto router = params[0].tensor.detach(), experts = params[1].tensor.detach();
        router.fill(0.0);
        experts.fill(0.0);
        for (std::size_t i = 0; i < 2; ++i) {
            router(i, i) = 10;
            experts(std::size_t{0}, i, i) = 1;
            experts(std::size_t{1}, i, i) = 2;
        }
        return moe;
    };
    // Sequence 0: six tokens for expert 0 then two for expert 1; sequence 1: alternating.
    Tensor<double> x({2, 8, 2});
    for (std::size_t t = 0; t < 8; ++t) {
        x(std::size_t{0}, t, t < 6 ? 0 : 1) = 1;
        x(std::size_t{1}, t, t % 2) = 1;
    }
    const double p_hi = 1 / (1 + std::exp(-10.0)), p_lo = 1 - p_hi;
    olmax::autodiff::no_grad guard;
    SECTION("top-1, C = ceil(1 * 1 * 8 / 2) = 4") {
        auto moe = build(1, 1.0);
        CHECK(moe.capacity(8) == 4);
        auto y = moe.forward(x);
        for (std::size_t t = 0; t < 8; ++t) {
            INFO("t=" << t);
            const bool kept = t < 4 || t >= 6;  // tokens 4 and 5 overflow expert 0
            const double want0 = kept ? p_hi * (t < 6 ? 1.0 : 2.0) : 0.0;
            CHECK(y(std::size_t{0}, t, t < 6 ? 0 : 1) == Approx(want0).epsilon(1e-14));
            CHECK(y(std::size_t{1}, t, t % 2) == Approx(p_hi * (t % 2 ? 2.0 : 1.0)).epsilon(1e-14));
        }
        auto s = moe.routing_stats();
        CHECK(s.forwards == 1);
        CHECK(s.tokens == 16);
        CHECK(s.assignments == 16);
        CHECK(s.dropped == 2);
        CHECK(s.assigned_per_expert == std::vector<std::uint64_t>{10, 6});
        CHECK(s.dropped_per_expert == std::vector<std::uint64_t>{2, 0});
        CHECK(s.drop_rate() == Approx(2.0 / 16));
        // balance = E sum_e f_e P_e with f = (10, 6) / 16 and P_e the mean probabilities.
        const double P0 = (10 * p_hi + 6 * p_lo) / 16, P1 = 1 - P0;
        CHECK(s.mean_balance() == Approx(2 * (10.0 / 16 * P0 + 6.0 / 16 * P1)).epsilon(1e-12));
        moe.clear_routing_stats();
        CHECK(moe.routing_stats().assignments == 0);
        CHECK(moe.routing_stats().assigned_per_expert == std::vector<std::uint64_t>{0, 0});
    }
    SECTION("top-2, C = ceil(0.5 * 2 * 8 / 2) = 4: both experts per token, first come first served") {
        auto moe = build(2, 0.5);
        CHECK(moe.capacity(8) == 4);
        auto y = moe.forward(x);
        // Every token picks both experts; each expert keeps the first four tokens of a sequence.
        for (std::size_t b = 0; b < 2; ++b)
            for (std::size_t t = 0; t < 8; ++t)
                for (std::size_t f = 0; f < 2; ++f) {
                    INFO("b=" << b << " t=" << t << " f=" << f);
                    const double xv = x(b, t, f);
                    double want = 0;
                    if (t < 4) {
                        const bool first = x(b, t, 0) == 1;  // expert 0 is this token's first choice
                        want = xv * ((first ? p_hi : p_lo) * 1.0 + (first ? p_lo : p_hi) * 2.0);
                    }
                    CHECK(y(b, t, f) == Approx(want).margin(1e-14));
                }
        auto s = moe.routing_stats();
        CHECK(s.assignments == 32);
        CHECK(s.dropped == 16);
        CHECK(s.assigned_per_expert == std::vector<std::uint64_t>{16, 16});
        CHECK(s.dropped_per_expert == std::vector<std::uint64_t>{8, 8});
    }
}

TEST_CASE("MoE: the balance loss reaches the same gradients with and without reversible memory saving", "[moe][reversible]") {
    using Block = nn::Reversible<nn::MoE<double>, nn::Sandwich<nn::MoE<double>>>;
    for (std::size_t k : {1u, 2u}) {
        INFO("top-" << k);
        auto make = [k](bool memory_saving, double coefficient) {
            auto c = moe_config(k, 0.75, 3, 4);
            c.reversible_backward = memory_saving;
            c.balance_coefficient = coefficient;
            return nn::Stack<Block>(c, 3);
        };
        olmax::Generator data(40);
        auto x = olmax::randn<double>({2, 2, 8, 4}, data), r = olmax::randn<double>({2, 2, 8, 4}, data);
        // The training loop's code, the same in both modes: the layers add their balance themselves.
        auto step = [&](nn::Stack<Block>& stack) {
            auto xp = olmax::parameter(x.clone());
            const auto& f = stack.block().function<0>();
            f.clear_routing_stats();
            olmax::sum(olmax::mul(stack.forward(xp), r)).backward();
            CHECK(f.routing_stats().forwards == 3);  // one per layer; the recompute is not counted
            std::vector<Tensor<double>> grads{xp.grad()};
            for (auto& p : nn::parameters(stack)) grads.push_back(p.tensor.grad());
            return grads;
        };
        auto saving = make(true, 0.5), taped = make(false, 0.5), off = make(true, 0.0);
        const auto gs = step(saving), gt = step(taped), g0 = step(off);
        REQUIRE(gs.size() == gt.size());
        double balance_effect = 0;
        for (std::size_t i = 0; i < gs.size(); ++i) {
            INFO("gradient " << i);
            REQUIRE(gs[i].defined());
            REQUIRE(gt[i].defined());
            CHECK(max_abs_diff(gs[i], gt[i]) < 1e-10);
            balance_effect = std::max(balance_effect, max_abs_diff(gs[i], g0[i]));
        }
        CHECK(balance_effect > 1e-4);  // the balance term really is in the gradient
        CHECK(olmax::autodiff::tape_size() == 0);
        CHECK(saving.block().function<0>().routing_stats().mean_balance() > 0);  // logged too
    }
}

TEST_CASE("MoE: counters gather every thread; each thread's backward gets its own balance gradient", "[moe]") {
    olmax::Generator rng(50);
    nn::MoE<double> moe(moe_config(1, 1.25), rng);
    const auto x = olmax::randn<double>({1, 6, 4}, rng);
    auto grad_of_router = [&] {
        auto y = moe.forward(x);
        olmax::sum(y).backward();
        auto router = nn::parameters(moe)[0].tensor;
        auto g = router.grad().clone();
        router.zero_grad();
        return g;
    };
    const auto mine = grad_of_router();
    Tensor<double> other;
    std::thread worker([&] { other = grad_of_router(); });
    worker.join();
    CHECK(max_abs_diff(mine, other) == 0.0);
    CHECK(moe.routing_stats().forwards == 2);
    CHECK(olmax::autodiff::tape_size() == 0);
}

TEST_CASE("MoE: bad configurations and shapes throw clear errors", "[moe]") {
    olmax::Generator rng(60);
    auto bad = [&](auto edit) {
        auto c = moe_config(1, 1.0);
        edit(c);
        return [c, &rng] { nn::MoE<double> m(c, rng); };
    };
    CHECK_THROWS_AS(bad([](nn::MoEConfig& c) { c.top_k = 0; })(), olmax::value_error);
    CHECK_THROWS_WITH(bad([](nn::MoEConfig& c) { c.top_k = 4; })(), Catch::Contains("top_k must be in [1, experts = 3]"));
    CHECK_THROWS_AS(bad([](nn::MoEConfig& c) { c.capacity_factor = 0; })(), olmax::value_error);
    CHECK_THROWS_AS(bad([](nn::MoEConfig& c) { c.experts = 0; })(), olmax::value_error);
    CHECK_THROWS_AS(bad([](nn::MoEConfig& c) { c.balance_coefficient = -1; })(), olmax::value_error);
    CHECK_THROWS_AS(bad([](nn::MoEConfig& c) { c.dispatch = nn::MoEDispatch(7); })(), olmax::value_error);
    nn::MoE<double> moe(moe_config(2, 1.0), rng);
    CHECK_THROWS_AS(moe.forward(olmax::randn<double>({2, 5, 3}, rng)), olmax::shape_error);
    CHECK_THROWS_AS(moe.forward(olmax::randn<double>({10, 4}, rng)), olmax::shape_error);
    CHECK_THROWS_AS(moe.forward(Tensor<double>()), olmax::shape_error);
    CHECK_THROWS_AS(moe.forward(Tensor<double>({2, 0, 4})), olmax::value_error);
    CHECK_THROWS_AS(moe.set_dispatch(nn::MoEDispatch(9)), olmax::value_error);
}

TEST_CASE("MoE: runs on its tensors' device, values and gradients equal to the host's", "[moe][device]") {
    const auto& counting = olmax_test::counting();
    olmax::Generator rng(70);
    nn::MoE<double> moe(moe_config(2, 0.75), rng);
    auto x = olmax::randn<double>({2, 8, 4}, rng), r = olmax::randn<double>({2, 8, 4}, rng);
    const auto in = inputs_of(moe, x);
    const Run host = run(moe, in, r);
    for (auto dispatch : {nn::MoEDispatch::sparse, nn::MoEDispatch::dense, nn::MoEDispatch::slots}) {
        INFO("dispatch " << int(dispatch));
        nn::MoE<double> layer = moe;
        layer.set_dispatch(dispatch);
        std::vector<Tensor<double>> moved;
        for (const auto& t : in) moved.push_back(t.to(counting.device));
        const std::size_t gemms = counting.kernels->gemms.load();
        Run dev;
        {
            static const olmax_test::refusing_kernels refusing;
            olmax::backend::host_kernels_scope no_host(refusing);
            dev = run(layer, moved, r.to(counting.device));
        }
        CHECK(counting.kernels->gemms.load() > gemms);
        CHECK(dev.y.device() == counting.device);
        CHECK(max_abs_diff(dev.y.to(olmax::Device::host()), host.y) < 1e-13);
        for (std::size_t i = 0; i < in.size(); ++i) {
            REQUIRE(dev.grads[i].defined());
            CHECK(dev.grads[i].device() == counting.device);
            CHECK(max_abs_diff(dev.grads[i].to(olmax::Device::host()), host.grads[i]) < 1e-12);
        }
    }
}
