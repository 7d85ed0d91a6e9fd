// Compile-time probe: 64 distinct layer types, nested (Sandwich<Sandwich<...<DenseConv<5>>>>, 64
// levels, the dlib-style composition) or flat (Sequential<CausalConv<1>, ..., CausalConv<64>>), or
// one layer as the baseline. compile_time.sh substitutes @NET@ with Nest<63>::type, Flat or Nest<0>::type.
#include <olmax/nn/nn.hpp>

#include <utility>

namespace nn = olmax::nn;

template <std::size_t N>
struct Nest {
    using type = nn::Sandwich<typename Nest<N - 1>::type>;
};
template <>
struct Nest<0> {
    using type = nn::DenseConv<5>;
};

template <std::size_t... I>
auto make_flat(std::index_sequence<I...>) -> nn::Sequential<nn::CausalConv<I + 1>...>;
using Flat = decltype(make_flat(std::make_index_sequence<64>{}));

template <class Net>
bool train_step(const nn::Config& config) {
    olmax::Generator rng(1);
    Net net(config, rng);
    auto x = olmax::parameter(olmax::randn<float>({1, 16, 8}, rng));
    auto y = net.forward(x, {});
    y.backward(olmax::ones_like(y));
    return x.grad().defined();
}

int main() {
    nn::Config config;
    config.features = 8;
    return train_step<@NET@>(config) ? 0 : 1;
}
