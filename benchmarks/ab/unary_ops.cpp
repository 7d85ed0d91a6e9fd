// A/B of olmax's element-wise unary ops across two checkouts: tanh, sigmoid, exp and softplus, each
// forward + backward (taped, dy given) on 2^20 floats, median of 15, ms. Compiled once against each
// checkout's include/ and run alternately (issue 37: the ops on SIMD batches):
//
//     git worktree add /tmp/olmax-old 6759a6c
//     for v in old new; do inc=include; [ $v = old ] && inc=/tmp/olmax-old/include
//       g++ -std=c++20 -O3 -march=native -fopenmp -I$inc -isystem /usr/include/eigen3 benchmarks/ab/unary_ops.cpp -o /tmp/unary_$v
//     done
//     for r in 1 2 3; do for v in old new; do OMP_NUM_THREADS=1 /tmp/unary_$v; done; done
#include <olmax/olmax.hpp>
#include <cstdio>

#include "../timing.hpp"
using olmax::Tensor;
double time_it(const std::function<void()>& f) { return 1e3 * olmax_bench::median_seconds(15, 0, f); }
int main() {
    olmax::Generator rng(1);
    auto x = olmax::randn<float>({1 << 20}, rng).set_requires_grad(true);
    const auto dy = olmax::randn<float>({1 << 20}, rng);
    auto run = [&](auto op) { return time_it([&] { x.zero_grad(); op(x).backward(dy); }); };
    std::printf("tanh %.3f sigmoid %.3f exp %.3f softplus %.3f\n", run([](auto& v) { return olmax::tanh(v); }), run([](auto& v) { return olmax::sigmoid(v); }),
                run([](auto& v) { return olmax::exp(v); }), run([](auto& v) { return olmax::softplus(v); }));
}
