// olmax::testing::check_layer_gradients: passes correct layers (plain, composite, float), and fails,
// naming the parameter, on layers whose backward is wrong or assigns where it must add.
#include "test_helpers.hpp"

#include <olmax/testing/layer_gradient_check.hpp>

namespace nn = olmax::nn;
using olmax::Tensor;

namespace {

enum class Bug { none, wrong_factor, assigns };

/// y = x * scale (one scale per feature), with a hand-written backward that can carry a bug:
/// `wrong_factor` doubles the scale's gradient; `assigns` wipes the gradient the scale already
/// holds before adding its own (an assignment where olmax adds).
template <olmax::Real T, Bug bug>
class Scale {
public:
    using value_type = T;
    using config_type = nn::Config;
    static constexpr std::string_view name = "scale";

    Scale(const nn::Config& config, olmax::Generator& rng) : scale_(olmax::parameter(olmax::randn<T>({config.features}, rng))) {}

    Tensor<T> forward(const Tensor<T>& x, const nn::LayerContext& = {}) const {
        const Tensor<T> w = scale_;
        return olmax::autodiff::custom_op("scale", olmax::mul(x.detach(), w.detach()), {x, w},
                                          [x = x.detach(), w](const Tensor<T>& dy, olmax::autodiff::GradientSink<T>& grads) {
                                              grads.add(0, olmax::mul(dy, w.detach()));
                                              Tensor<T> dw = olmax::sum(olmax::mul(dy, x), {0});
                                              if constexpr (bug == Bug::wrong_factor) dw = dw * T(2);
                                              if constexpr (bug == Bug::assigns) {
                                                  Tensor<T> held = w.grad();
                                                  if (held.defined()) std::fill(held.data(), held.data() + held.size(), T(0));
                                              }
                                              grads.add(1, dw);
                                          });
    }
    void visit_parameters(nn::ParameterVisitor<T>& visit) { visit("weight", scale_, nn::Role::weight); }

private:
    Tensor<T> scale_;
};

nn::Config layer_config(std::size_t features) {
    nn::Config c;
    c.features = features;
    return c;
}

}  // namespace

TEST_CASE("check_layer_gradients passes a correct layer and checks its input and every parameter", "[testing][layer]") {
    olmax::Generator rng(1);
    nn::Linear<double> layer(3, 2, rng, /*with_bias=*/true);
    const auto result = olmax::testing::check_layer_gradients(layer, olmax::randn<double>({4, 3}, rng));
    INFO(result);
    CHECK(result.ok);
    CHECK(result.checked == 4 * 3 + 3 * 2 + 2);  // input, weight, bias
}

TEST_CASE("check_layer_gradients passes a reversible stack (custom backward, stacked parameters)", "[testing][layer]") {
    using Block = nn::Reversible<nn::Sandwich<nn::Linear<double>>, nn::Sandwich<nn::Linear<double>>>;
    olmax::Generator rng(2);
    nn::Stack<Block> stack(layer_config(3), /*depth=*/2, rng);
    const auto result = olmax::testing::check_layer_gradients(stack, olmax::randn<double>({2, 2, 3}, rng), {.rtol = 1e-5, .atol = 1e-7});
    INFO(result);
    CHECK(result.ok);
}

TEST_CASE("check_layer_gradients catches a wrong backward and names the parameter", "[testing][layer]") {
    olmax::Generator rng(3);
    const Tensor<double> x = olmax::randn<double>({4, 3}, rng);
    Scale<double, Bug::none> right(layer_config(3), rng);
    CHECK(olmax::testing::check_layer_gradients(right, x).ok);

    Scale<double, Bug::wrong_factor> wrong(layer_config(3), rng);
    const auto result = olmax::testing::check_layer_gradients(wrong, x);
    INFO(result);
    CHECK_FALSE(result.ok);
    CHECK_THAT(result.report, Catch::Contains("parameter 'scale/weight' element 0: analytic"));
    CHECK_THAT(result.report, !Catch::Contains("input element"));  // the input's gradient is right
}

TEST_CASE("check_layer_gradients' +inf pre-fill catches a backward that assigns instead of adding", "[testing][layer]") {
    olmax::Generator rng(4);
    Scale<double, Bug::assigns> layer(layer_config(3), rng);
    const auto result = olmax::testing::check_layer_gradients(layer, olmax::randn<double>({4, 3}, rng));
    INFO(result);
    CHECK_FALSE(result.ok);
    CHECK_THAT(result.report, Catch::Contains("parameter 'scale/weight' element 0: gradient pre-filled with +inf came out"));
    CHECK_THAT(result.report, Catch::Contains("assigned it instead of adding"));
}

TEST_CASE("check_layer_gradients checks float layers with float tolerances", "[testing][layer]") {
    olmax::Generator rng(5);
    const Tensor<float> x = olmax::randn<float>({4, 3}, rng);
    nn::Linear<float> linear(3, 5, rng, true);
    const auto ok = olmax::testing::check_layer_gradients(linear, x);
    INFO(ok);
    CHECK(ok.ok);
    Scale<float, Bug::wrong_factor> wrong(layer_config(3), rng);
    CHECK_FALSE(olmax::testing::check_layer_gradients(wrong, x).ok);
}

TEST_CASE("check_layer_gradients leaves the caller's layer and its gradients alone", "[testing][layer]") {
    olmax::Generator rng(6);
    nn::Linear<double> layer(2, 2, rng);
    const Tensor<double> weight = nn::parameters(layer)[0].tensor;
    const Tensor<double> before = weight.detach().clone();
    CHECK(olmax::testing::check_layer_gradients(layer, olmax::randn<double>({3, 2}, rng)).ok);
    CHECK(nn::parameters(layer)[0].tensor.data() == weight.data());  // still the same tensor
    CHECK(olmax_test::max_abs_diff(weight.detach(), before) == 0.0);
    CHECK_FALSE(weight.grad().defined());
}
