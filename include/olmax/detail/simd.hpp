#pragma once
// xsimd's SIMD types and functions (xsimd::batch, xsimd::fma, xsimd::sqrt), for the explicitly
// vectorised loops that GCC does not vectorise on its own (AdamW's update: std::sqrt sets errno).
// Apart from detail/third_party.hpp (which includes only xsimd's allocator), the one place olmax
// includes xsimd, so that its version and layout concern one file; kept out of third_party.hpp so
// that code without such loops does not parse it.

// GCC 12's AVX-512 intrinsics read a deliberately undefined register (`_mm512_undefined_*`) and
// report it as (maybe) uninitialised wherever xsimd's functions inline them (GCC bug 105593, fixed
// in GCC 13). GCC judges an inlined warning by the pragmas in force at each call site of the
// inlining chain, and xsimd's call sites are in the headers included here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <xsimd/xsimd.hpp>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
