#pragma once
// How a linear scan h_t = a_t h_{t-1} + x_t is lowered to StableHLO: a while loop over time,
// Hillis–Steele doubling, or chunked triangular matmuls (the matrix-unit form; scan.hpp has the
// lowerings).

#include <cstdint>
#include <string>

namespace olmax::xla::stablehlo {

struct scan_strategy {
    enum class kind { sequential, hillis_steele, chunked_matmul };
    kind strategy = kind::chunked_matmul;
    std::int64_t chunk = 128;  // chunked_matmul only: the width of the per-chunk triangular matrix

    static scan_strategy sequential() { return {kind::sequential, 0}; }
    static scan_strategy hillis_steele() { return {kind::hillis_steele, 0}; }
    template <std::int64_t Chunk = 128>
    static scan_strategy chunked_matmul() {
        static_assert(Chunk >= 1, "chunked_matmul: chunk must be positive");
        return {kind::chunked_matmul, Chunk};
    }
    std::string name() const {
        switch (strategy) {
            case kind::sequential: return "sequential";
            case kind::hillis_steele: return "hillis_steele";
            case kind::chunked_matmul: return "chunked_matmul" + std::to_string(chunk);
        }
        return "?";
    }
    friend bool operator==(const scan_strategy&, const scan_strategy&) = default;
};

}  // namespace olmax::xla::stablehlo
