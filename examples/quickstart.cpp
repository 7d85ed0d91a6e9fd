#include <olmax/olmax.hpp>

#include <cstdio>

int main() {
    olmax::Generator rng(42);  // seeded: the same numbers on every machine
    auto x = olmax::randn<float>({64, 256}, rng);
    auto w = olmax::parameter(olmax::randn<float>({256, 256}, rng, 0.0f, 0.0625f));  // requires grad

    auto y = olmax::matmul(x, w);                  // recorded on this thread's tape
    auto loss = olmax::mean(olmax::square(y));
    loss.backward();                               // adds d loss / d w into w.grad(), frees the tape
    std::printf("loss %.4f, |dloss/dw[0,0]| %.6f\n", loss.item(), std::abs(w.grad()(0, 0)));

    // A custom backward pass: a forward value plus a closure that adds into the input gradients.
    auto cube = olmax::autodiff::custom_op("cube", olmax::map([](float v) { return v * v * v; }, w.detach()), {w},
        [w](const olmax::Tensor<float>& dy, olmax::autodiff::GradientSink<float>& grads) {
            grads.add(0, 3.0f * w.detach() * w.detach() * dy);
        });
    w.zero_grad();
    olmax::sum(cube).backward();                   // w.grad() == 3 w^2

    // Ops run on the device of their inputs; the host computes on cpu_openmp by default and on the
    // cpu_serial reference inside this scope.
    olmax::backend::host_kernels_scope serial(olmax::backend::kernels<olmax::backend::cpu_serial>());
    auto y_serial = olmax::matmul(x, w.detach());
    std::printf("grad check %s, serial matmul %zux%zu\n",
                std::abs(w.grad()(0, 0) - 3.0f * w(0, 0) * w(0, 0)) < 1e-6f ? "ok" : "FAILED",
                y_serial.extent(0), y_serial.extent(1));
    return w.grad().defined() ? 0 : 1;
}
