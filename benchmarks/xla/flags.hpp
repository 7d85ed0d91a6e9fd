#pragma once
// Command-line flags of the XLA benchmarks: a `--name=value` lookup, and positive integers whose
// error names the flag (never a bare "stoul", never a wrapped negative).

#include <cstddef>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>

namespace olmax_bench {

/// The value of `--name=value` among the arguments, or `fallback`.
inline std::string flag(int argc, char** argv, std::string_view name, std::string fallback) {
    const std::string prefix = "--" + std::string(name) + "=";
    for (int i = 1; i < argc; ++i)
        if (std::string_view(argv[i]).starts_with(prefix)) return std::string(argv[i] + prefix.size());
    return fallback;
}

/// `text` as a positive integer, or an error naming `flag`.
inline std::int64_t positive(const std::string& flag, const std::string& text) {
    std::size_t used = 0;
    long long v = 0;
    try {
        v = std::stoll(text, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used == 0 || used != text.size() || v < 1) throw std::runtime_error(flag + " takes a positive integer, got '" + text + "'");
    return v;
}

/// The positive integer of `--name=value`, or `fallback`.
inline std::size_t positive_flag(int argc, char** argv, std::string_view name, std::int64_t fallback) {
    return std::size_t(positive("--" + std::string(name), flag(argc, argv, name, std::to_string(fallback))));
}

}  // namespace olmax_bench
