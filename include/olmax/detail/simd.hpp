#pragma once
// xsimd's SIMD types and functions (xsimd::batch, xsimd::fma, xsimd::sqrt), for the explicitly
// vectorised loops that GCC does not vectorise on its own (AdamW's update: std::sqrt sets errno).
// Apart from detail/third_party.hpp (which includes only xsimd's allocator), the one place olmax
// includes xsimd, so that its version and layout concern one file; kept out of third_party.hpp so
// that code without such loops does not parse it.

#include <xsimd/xsimd.hpp>
