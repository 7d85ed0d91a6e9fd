// Compile-time probe: nn::Stack<Block> at depth @DEPTH@ (compile_time.sh substitutes the number).
// Depth is a runtime value, so depth 4 and depth 256 instantiate exactly the same code.
#include <olmax/nn/nn.hpp>

using Block = olmax::nn::Reversible<olmax::nn::Sandwich<olmax::nn::DenseConv<5>>, olmax::nn::Sandwich<olmax::nn::HierarchicalMixer<16>>>;

int main() {
    olmax::nn::Config config;
    config.features = 8;
    olmax::nn::Stack<Block> body(config, /*depth=*/@DEPTH@);
    olmax::Generator rng(1);
    auto x = olmax::parameter(olmax::randn<float>({2, 1, 16, 8}, rng));
    auto y = body(x);
    y.backward(olmax::ones_like(y));
    return x.grad().defined() ? 0 : 1;
}
