#pragma once
// Text-like byte batches for the XLA tests: a fixed pseudo-random walk over a small alphabet, so a
// model can learn something and its loss falls.

#include <cstddef>
#include <cstdint>

#include <olmax/olmax.hpp>

namespace olmax_test {

inline olmax::data::Batch text_batch(std::size_t rows, std::size_t sequence, std::uint32_t seed) {
    olmax::data::Batch b{olmax::Tensor<std::int32_t>({rows, sequence}), olmax::Tensor<std::int32_t>({rows, sequence}),
                         olmax::Tensor<float>({rows, sequence}, 1.0f), rows * sequence, 0};
    std::uint32_t state = seed;
    std::int32_t previous = 'a';
    for (std::size_t i = 0; i < rows * sequence; ++i) {
        state = state * 1664525u + 1013904223u;
        const std::int32_t next = 'a' + std::int32_t((std::uint32_t(previous) * 7u + (state >> 29)) % 12u);
        b.inputs.data()[i] = previous;
        b.targets.data()[i] = next;
        previous = next;
    }
    return b;
}

}  // namespace olmax_test
