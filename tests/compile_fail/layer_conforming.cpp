// Control for the compile-fail tests: the same shape of program with a conforming layer compiles,
// so a failure of the other tests comes from the contract check, not from the harness.
#include <olmax/nn/nn.hpp>

struct WithForward {
    using value_type = float;
    using config_type = olmax::nn::Config;
    static constexpr std::string_view name = "with_forward";
    WithForward(const olmax::nn::Config&, olmax::Generator&) {}
    olmax::Tensor<float> forward(const olmax::Tensor<float>& x, const olmax::nn::LayerContext&) const { return x; }
    void visit_parameters(olmax::nn::ParameterVisitor<float>&) {}
};

int main() {
    olmax::nn::Stack<WithForward> stack(olmax::nn::Config{}, 4);
    return stack.depth() == 4 ? 0 : 1;
}
