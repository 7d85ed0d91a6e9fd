#pragma once
// How a linear scan h_t = a_t h_{t-1} + x_t is lowered to StableHLO: a while loop over time,
// Hillis–Steele doubling, chunked triangular matmuls (the matrix-unit form), or blocks scanned side
// by side (a loop over the steps of a block, then the blocks' carries; scan.hpp has the lowerings).

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/core/error.hpp"

namespace olmax::xla::stablehlo {

struct scan_strategy {
    enum class kind { sequential, hillis_steele, chunked_matmul, blocked };
    kind strategy = kind::chunked_matmul;
    /// chunked_matmul: the width of the per-chunk triangular matrix; blocked: the steps per block
    /// (0: about sqrt(T), which balances the loop's iterations against the carries' work).
    std::int64_t chunk = 128;

    static scan_strategy sequential() { return {kind::sequential, 0}; }
    static scan_strategy hillis_steele() { return {kind::hillis_steele, 0}; }
    template <std::int64_t Chunk = 128>
    static scan_strategy chunked_matmul() {
        static_assert(Chunk >= 1, "chunked_matmul: chunk must be positive");
        return {kind::chunked_matmul, Chunk};
    }
    /// Time cut into blocks of `steps` (0: about sqrt(T)); one loop runs every block's steps side
    /// by side, so a scan of T steps takes `steps` iterations instead of T, each over T / steps times
    /// as much data; the blocks' carries then follow by doubling and one fix-up pass.
    static scan_strategy blocked(std::int64_t steps = 0) { return {kind::blocked, steps}; }
    /// Each form by the name train_lm's --xla_scan_form spells it, at its default size: sequential,
    /// hillis_steele, blocked (about sqrt(T) steps per block), chunked_matmul (128).
    static std::vector<std::pair<std::string, scan_strategy>> named_forms() {
        return {{"sequential", sequential()}, {"hillis_steele", hillis_steele()}, {"blocked", blocked()}, {"chunked_matmul", chunked_matmul<128>()}};
    }
    /// The form `name` selects (named_forms); value_error naming the choices for any other name.
    static scan_strategy from_name(std::string_view name) {
        std::string choices;
        for (const auto& [known, form] : named_forms()) {
            if (known == name) return form;
            choices += (choices.empty() ? "" : ", ") + known;
        }
        throw value_error(std::string("scan_strategy: unknown form '") + std::string(name) + "'; choose one of " + choices);
    }
    std::string name() const {
        switch (strategy) {
            case kind::sequential: return "sequential";
            case kind::hillis_steele: return "hillis_steele";
            case kind::chunked_matmul: return "chunked_matmul" + std::to_string(chunk);
            case kind::blocked: return chunk ? "blocked" + std::to_string(chunk) : "blocked";
        }
        return "?";
    }
    friend bool operator==(const scan_strategy&, const scan_strategy&) = default;
};

}  // namespace olmax::xla::stablehlo
