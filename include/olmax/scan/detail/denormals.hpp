#pragma once
// Flush-to-zero / denormals-are-zero for the duration of a scan kernel.
//
// Long products of gates close to 1 (0.9999^n) walk into the denormal range, where every x86
// multiply takes a microcode assist, 10-25x slower (a 67M-element pass: 2.32 s with denormals,
// 0.092 s with FTZ/DAZ). A product can even get stuck there: 7e-43 * 0.9995 rounds back to 7e-43,
// so every later step pays the assist. Contributions that small are negligible, so kernels flush
// them. The MXCSR register is per thread: every
// OpenMP worker body creates its own guard, and the caller's mode is restored on exit.

#if defined(__SSE2__) || defined(_M_X64)
#include <xmmintrin.h>
#endif

namespace olmax::scan::detail {

class denormal_guard {
public:
#if defined(__SSE2__) || defined(_M_X64)
    denormal_guard() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | flush_bits); }
    ~denormal_guard() { _mm_setcsr(saved_); }
#else
    denormal_guard() = default;
#endif
    denormal_guard(const denormal_guard&) = delete;
    denormal_guard& operator=(const denormal_guard&) = delete;

private:
#if defined(__SSE2__) || defined(_M_X64)
    static constexpr unsigned flush_bits = 0x8040u;  // FTZ (bit 15) | DAZ (bit 6)
    unsigned saved_;
#endif
};

}  // namespace olmax::scan::detail
