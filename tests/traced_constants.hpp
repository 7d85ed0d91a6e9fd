#pragma once
// What the constants of a traced program hold, for the tests that keep masks over a whole sequence
// out of them (a [T, T] constant is T^2 numbers of program text).
#include <algorithm>
#include <cstddef>

#include <olmax/xla/graph/graph.hpp>

namespace olmax_test {

/// The most elements any constant of a traced program holds (0 when none holds its own values).
inline std::size_t largest_constant(const olmax::xla::graph::graph& g) {
    std::size_t largest = 0;
    for (const auto& n : g.nodes())
        if (n.is<olmax::xla::graph::prim::constant>() && n.values) largest = std::max(largest, n.values->size());
    return largest;
}

/// How many numbers the constants of a traced program hold in all (a splat holds none).
inline std::size_t constant_numbers(const olmax::xla::graph::graph& g) {
    std::size_t total = 0;
    for (const auto& n : g.nodes())
        if (n.is<olmax::xla::graph::prim::constant>() && n.values) total += n.values->size();
    return total;
}

}  // namespace olmax_test
