// Must NOT compile: a reversible block over a type that is not a layer at all.
#include <olmax/nn/nn.hpp>

struct NotALayer {};

int main() {
    olmax::Generator rng(0);
    olmax::nn::Reversible<NotALayer, olmax::nn::Linear<float>> block(olmax::nn::Config{}, rng);
    return 0;
}
