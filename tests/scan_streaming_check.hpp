#pragma once
// Large fp32 [B, T, C] scans write h (and the backward dx, da) with streaming stores, copied from
// the kernel's state rows (olmax/scan/detail/streaming_store.hpp). Checked in the baseline unit
// tests (SSE2's stores) and in tests/native (the machine's widest).

#include <cstddef>
#include <limits>
#include <utility>

#include "olmax/scan/scan.hpp"
#include "test_helpers.hpp"

namespace olmax_test {

/// sequential_vectorized with every output streamed equals it with none, bit for bit, forward and
/// backward, whatever the rows' alignment (37 and 1029 channels), in both directions, with log gates.
inline void check_streaming_stores_bitwise() {
    namespace sc = olmax::scan;
    using olmax::Shape;
    using olmax::Tensor;
    auto& threshold = sc::detail::streaming_store_threshold();
    const std::size_t saved = threshold.load();
    olmax::Generator rng(12);
    for (const Shape& shape : {Shape{2, 300, 37}, Shape{3, 20, 1029}})
        for (const bool reverse : {false, true})
            for (const bool log_gates : {false, true}) {
                const Tensor<float> gates = log_gates ? uniform<float>(shape, rng, -1, 0) : uniform<float>(shape, rng, 0, 1);
                const Tensor<float> x = uniform<float>(shape, rng, -1, 1), dh = uniform<float>(shape, rng, -1, 1);
                const Tensor<float> h0 = uniform<float>({shape[0], shape[2]}, rng, -1, 1);
                const sc::ScanOptions<float> opt{.h0 = h0, .reverse = reverse, .log_gates = log_gates};
                auto run = [&](std::size_t bytes) {
                    threshold = bytes;
                    return with_kernels<olmax::backend::cpu_openmp>([&] {
                        const Tensor<float> h = sc::scan<sc::sequential_vectorized>(gates, x, opt);
                        return std::pair(h, sc::scan_backward<sc::sequential_vectorized>(gates, h, dh, opt));
                    });
                };
                const auto ordinary = run(std::numeric_limits<std::size_t>::max());
                const auto streamed = run(0);
                threshold = saved;
                INFO(olmax::to_string(shape) << " reverse=" << reverse << " log_gates=" << log_gates);
                CHECK(max_abs_diff(streamed.first, ordinary.first) == 0.0);
                CHECK(max_abs_diff(streamed.second.x, ordinary.second.x) == 0.0);
                CHECK(max_abs_diff(streamed.second.gates, ordinary.second.gates) == 0.0);
                CHECK(max_abs_diff(streamed.second.h0, ordinary.second.h0) == 0.0);
            }
}

}  // namespace olmax_test
