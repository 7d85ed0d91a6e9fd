#pragma once
// What the host CPU offers for bf16 matrix products, read from cpuid and the OS's enabled register
// state (xgetbv): AVX512-BF16 (vdpbf16ps: Intel Cooper Lake and later, AMD Zen 4 and later) and AMX
// (tile registers with a bf16 tile product: Intel Sapphire Rapids and later). Non-x86 hosts report
// neither. Used to say which bf16 GEMM path runs and why; the GEMMs themselves are chosen by the
// library that runs them (olmax/backend/onednn_gemm.hpp asks oneDNN).

#include <cstdint>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace olmax::backend {

struct CpuBf16Features {
    bool avx512_bf16 = false;  // cpuid.(7,1):EAX[5], with AVX-512 state enabled by the OS
    bool amx_bf16 = false;     // cpuid.(7,0):EDX[22] and AMX-TILE EDX[24], with tile state enabled by the OS
    // VDPBF16PS issues as often as a 512-bit FMA, so does twice its multiply-adds: AMD's cores (Zen 4
    // and 5; the vendor, cpuid.0, "AuthenticAMD"). Measured on an Intel Xeon (Emerald Rapids), it did
    // fewer multiply-adds a second than fp32 FMA (backend/small_gemm_bf16.hpp).
    bool dot_at_fma_rate = false;

    bool any() const { return avx512_bf16 || amx_bf16; }
    /// "avx512_bf16 amx_bf16", or "none".
    std::string to_string() const {
        std::string s;
        if (avx512_bf16) s += "avx512_bf16";
        if (amx_bf16) s += s.empty() ? "amx_bf16" : " amx_bf16";
        return s.empty() ? "none" : s;
    }
};

/// The host's bf16 features (read once).
inline CpuBf16Features cpu_bf16_features() {
    static const CpuBf16Features features = [] {
        CpuBf16Features f;
#if defined(__x86_64__) || defined(__i386__)
        unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
        if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & (1u << 27))) return f;  // OSXSAVE: xgetbv usable
        std::uint32_t xcr0_lo = 0, xcr0_hi = 0;
        __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
        const std::uint64_t xcr0 = (std::uint64_t(xcr0_hi) << 32) | xcr0_lo;
        const bool avx512_state = (xcr0 & 0xE6) == 0xE6;               // SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM
        const bool tile_state = (xcr0 & (3ull << 17)) == (3ull << 17);  // XTILECFG, XTILEDATA
        unsigned max_leaf = 0;
        __cpuid(0, max_leaf, ebx, ecx, edx);
        const bool amd = ebx == 0x68747541u && edx == 0x69746E65u && ecx == 0x444D4163u;  // "Auth" "enti" "cAMD"
        if (max_leaf < 7) return f;
        __cpuid_count(7, 0, eax, ebx, ecx, edx);
        const bool avx512f = ebx & (1u << 16);
        f.amx_bf16 = tile_state && (edx & (1u << 22)) && (edx & (1u << 24));
        const unsigned max_subleaf = eax;
        if (max_subleaf >= 1) {
            __cpuid_count(7, 1, eax, ebx, ecx, edx);
            f.avx512_bf16 = avx512_state && avx512f && (eax & (1u << 5));
            f.dot_at_fma_rate = f.avx512_bf16 && amd;
        }
#endif
        return f;
    }();
    return features;
}

}  // namespace olmax::backend
