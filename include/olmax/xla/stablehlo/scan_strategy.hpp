#pragma once
// How a linear scan h_t = a_t h_{t-1} + x_t is lowered to StableHLO. The forms carry the names of
// the strategy tags of olmax/scan/strategies.hpp that compute the same thing (trace/scan_forms.hpp
// maps a tag to its form): a while loop over time (sequential), log-depth doubling (hillis_steele),
// blocks scanned side by side with doubling over their carries (hillis_steele_chunked), chunked
// triangular matmuls for a matrix unit (chunked_matmul). scan.hpp has the lowerings.

#include <cstdint>
#include <string>

namespace olmax::xla::stablehlo {

struct scan_strategy {
    enum class kind { sequential, hillis_steele, chunked_matmul, hillis_steele_chunked };
    kind strategy = kind::chunked_matmul;
    /// chunked_matmul: the width of the per-chunk triangular matrix; hillis_steele_chunked: the
    /// steps per chunk (0: about sqrt(T), which balances the loop's iterations against the carries').
    std::int64_t chunk = 128;

    static scan_strategy sequential() { return {kind::sequential, 0}; }
    static scan_strategy hillis_steele() { return {kind::hillis_steele, 0}; }
    template <std::int64_t Chunk = 128>
    static scan_strategy chunked_matmul() {
        static_assert(Chunk >= 1, "chunked_matmul: chunk must be positive");
        return {kind::chunked_matmul, Chunk};
    }
    /// Time cut into chunks of `steps` (0: about sqrt(T)) scanned side by side: `steps` iterations
    /// instead of T, each over T / steps times the data; then doubling over the carries and a fix-up.
    static scan_strategy hillis_steele_chunked(std::int64_t steps = 0) { return {kind::hillis_steele_chunked, steps}; }
    /// The form's tag name and its chunk, as one identifier (module names use it): chunked_matmul128.
    std::string name() const {
        switch (strategy) {
            case kind::sequential: return "sequential";
            case kind::hillis_steele: return "hillis_steele";
            case kind::chunked_matmul: return "chunked_matmul" + std::to_string(chunk);
            case kind::hillis_steele_chunked: return chunk ? "hillis_steele_chunked" + std::to_string(chunk) : "hillis_steele_chunked";
        }
        return "?";
    }
    friend bool operator==(const scan_strategy&, const scan_strategy&) = default;
};

}  // namespace olmax::xla::stablehlo
