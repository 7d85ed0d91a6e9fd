#include "test_helpers.hpp"

using olmax::Tensor;

TEST_CASE("quickstart: matmul, mean of squares, backward fills w.grad", "[autodiff]") {
    olmax::Generator rng(7);
    auto x = olmax::randn<double>({4, 8}, rng);
    auto w = olmax::parameter(olmax::randn<double>({8, 3}, rng));
    auto loss = olmax::mean(olmax::square(olmax::matmul(x, w)));
    loss.backward();
    REQUIRE(w.grad().defined());
    // d/dw mean((xw)^2) = 2/(N) x^T (x w)
    auto y = olmax::matmul(x, w.detach());
    for (std::size_t i = 0; i < 8; ++i)
        for (std::size_t j = 0; j < 3; ++j) {
            double expect = 0;
            for (std::size_t r = 0; r < 4; ++r) expect += 2.0 / 12.0 * x(r, i) * y(r, j);
            CHECK(w.grad()(i, j) == Approx(expect).epsilon(1e-12));
        }
    CHECK(olmax::autodiff::tape_size() == 0);
}

TEST_CASE("gradient checker passes a composite and catches an overwriting backward", "[autodiff][gradcheck]") {
    olmax::Generator rng(3);
    std::vector<Tensor<double>> in{olmax::randn<double>({3, 4}, rng), olmax::randn<double>({4, 5}, rng), olmax::randn<double>({5}, rng)};
    auto good = olmax::testing::check_gradients(
        [](const std::vector<Tensor<double>>& v) { return olmax::tanh(olmax::matmul(v[0], v[1]) + v[2]); }, in);
    CHECK(good);

    // A custom op whose backward is right in value but assigns instead of accumulating.
    auto overwrite = [](const std::vector<Tensor<double>>& v) {
        const Tensor<double>& x = v[0];
        auto value = olmax::square(x.detach());
        return olmax::autodiff::custom_op("bad_square", value, {x}, [x](const Tensor<double>& dy, olmax::autodiff::GradientSink<double>&) {
            auto& impl = olmax::detail::impl_of(x);  // the library's internal access, to break the contract on purpose
            auto g = olmax::map([](double a, double d) { return 2 * a * d; }, x.detach(), dy);
            impl.grad = std::make_shared<olmax::Storage<double>>(g.size());
            std::copy(g.begin(), g.end(), impl.grad->data());
        });
    };
    auto bad = olmax::testing::check_gradients(overwrite, {olmax::randn<double>({6}, rng)});
    CHECK_FALSE(bad);
}
