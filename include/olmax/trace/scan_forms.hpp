#pragma once
// The traced forms of olmax::scan's strategy tags (scan_form_of). A scan written `scan::scan<Tag>`
// keeps its tag's form when traced where a StableHLO form computes what the tag names and suits the
// target device: the sequential tags' loop over time (sequential_fp64 in f32) only on the CPU plugin,
// since elsewhere its T steps run one after another; two_pass, blelloch and log_space have none.
// Otherwise the program uses the device's form (tracing::device_scan_form) and the tracer records a
// notice naming both (tracing::notices; the XLA step prints them once). docs/xla.md, "Scans".

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/core/error.hpp"
#include "olmax/scan/strategies.hpp"
#include "olmax/xla/stablehlo/scan_strategy.hpp"

namespace olmax::trace {

using scan_form = xla::stablehlo::scan_strategy;

/// The form of the tag named `strategy` (Tag::name) with chunk `chunk` (the chunk the eager scan
/// would use), or nullopt for a tag no StableHLO form computes.
inline std::optional<scan_form> scan_form_of(std::string_view strategy, std::size_t chunk) {
    if (strategy == scan::sequential::name || strategy == scan::sequential_vectorized::name || strategy == scan::sequential_fp64::name)
        return scan_form::sequential();
    if (strategy == scan::hillis_steele::name) return scan_form::hillis_steele();
    if (strategy == scan::hillis_steele_chunked<>::name) return scan_form::hillis_steele_chunked(std::int64_t(chunk));
    if (strategy == scan::chunked_matmul<>::name) return scan_form{scan_form::kind::chunked_matmul, std::int64_t(chunk)};
    return std::nullopt;
}

/// Every form by its tag's name, at the size train_lm's --xla_scan_form gives it: sequential,
/// hillis_steele, hillis_steele_chunked (about sqrt(T) steps per chunk), chunked_matmul (128).
inline std::vector<std::pair<std::string, scan_form>> named_scan_forms() {
    return {{std::string(scan::sequential::name), scan_form::sequential()},
            {std::string(scan::hillis_steele::name), scan_form::hillis_steele()},
            {std::string(scan::hillis_steele_chunked<>::name), scan_form::hillis_steele_chunked()},
            {std::string(scan::chunked_matmul<>::name), scan_form::chunked_matmul<128>()}};
}

/// The form `name` selects (named_scan_forms); value_error naming the choices for any other name.
inline scan_form scan_form_named(std::string_view name) {
    std::string choices;
    for (const auto& [known, form] : named_scan_forms()) {
        if (known == name) return form;
        choices += (choices.empty() ? "" : ", ") + known;
    }
    throw value_error(std::string("olmax: trace: unknown scan form '") + std::string(name) + "'; choose one of " + choices);
}

}  // namespace olmax::trace
