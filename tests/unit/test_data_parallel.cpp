// Data parallelism over threads: private gradient buffers and data_parallel_backward's errors (its
// equality with shard-by-shard differentiation on reversible stacks is in test_nn_reversible.cpp).
#include "test_helpers.hpp"

#include <stdexcept>

using olmax::Tensor;
namespace ad = olmax::autodiff;

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
