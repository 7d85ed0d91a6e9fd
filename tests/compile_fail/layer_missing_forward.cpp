// Must NOT compile: a layer type without forward() used in nn::Stack. The build must fail with the
// layer-contract static_assert text (checked by the CTest test nn_compile_fail_missing_forward).
#include <olmax/nn/nn.hpp>

struct NoForward {
    using value_type = float;
    using config_type = olmax::nn::Config;
    static constexpr std::string_view name = "no_forward";
    NoForward(const olmax::nn::Config&, olmax::Generator&) {}
    void visit_parameters(olmax::nn::ParameterVisitor<float>&) {}
};

int main() {
    olmax::nn::Stack<NoForward> stack(olmax::nn::Config{}, 4);
    return 0;
}
