#pragma once
namespace olmax {
inline constexpr int version_major = 0;
inline constexpr int version_minor = 1;
inline constexpr int version_patch = 0;
inline constexpr const char* version_string = "0.1.0";
}  // namespace olmax
