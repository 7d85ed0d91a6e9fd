#pragma once
// How a run computes on the host: the GEMM kernels of its precision (train::PrecisionScope) and its
// OpenMP threads (train::set_threads). train::Trainer applies both from its TrainerOptions
// (`precision`, `threads`); a program that sizes its model by the thread count before it makes the
// Trainer sets the threads first (train::launch, olmax/train/launch.hpp, does).
//
// The kernels follow what the program links, not what it says: with the CMake target olmax::onednn
// (which defines OLMAX_HAS_ONEDNN for the code that links it)
//   bf16  every float GEMM on oneDNN's bf16 product (on the CPU's bf16 units where it has them)
//   fp32  oneDNN's fp32 GEMM (1.3-1.5x as fast as Eigen's on AVX-512 CPUs; benchmarks/RESULTS.md)
// and without it the portable ones: bf16 the portable product (fp32 compute; it says so once), fp32
// the backend's own GEMM. docs/BF16.md.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "olmax/backend/bf16_matmul_kernels.hpp"
#include "olmax/backend/float_gemm_kernels.hpp"
#include "olmax/core/error.hpp"
#if defined(OLMAX_HAS_ONEDNN)  // the target olmax::onednn: its GEMMs
#include "olmax/backend/onednn_gemm.hpp"
#endif
#if defined(_OPENMP)
#include <omp.h>
#endif

namespace olmax::train {

/// Whether this program computes its GEMMs through oneDNN (it links olmax::onednn).
#if defined(OLMAX_HAS_ONEDNN)
inline constexpr bool links_onednn = true;
#else
inline constexpr bool links_onednn = false;
#endif

/// The calling thread's GEMM kernels for a precision, "fp32" or "bf16", while it lives (and those of
/// the parallel loops the thread starts): see the header's comment. Nests; not movable.
class PrecisionScope {
public:
    /// `onednn_fp32_gemm` false keeps the backend's own fp32 GEMM even where oneDNN's is linked.
    explicit PrecisionScope(std::string_view precision, bool onednn_fp32_gemm = true) {
        check<value_error>(precision == "fp32" || precision == "bf16", "train::PrecisionScope: precision must be fp32 or bf16, got '",
                           precision, "'");
#if defined(OLMAX_HAS_ONEDNN)
        namespace onednn = backend::onednn;
        if (precision == "bf16") {
            bf16_.emplace(onednn::gemm_bf16, onednn::gemm_batched_bf16);
            bf16_gemm_ = onednn::bf16_gemm_description();
            note_ = "precision bf16: GEMMs on " + bf16_gemm_;
        } else if (onednn_fp32_gemm) {
            fp32_.emplace(onednn::gemm, "onednn");
            fp32_gemm_ = "onednn " + onednn::version();
        }
#else
        (void)onednn_fp32_gemm;
        if (precision == "bf16") bf16_.emplace(), bf16_gemm_ = "portable (fp32 compute)";  // the product says so once, itself
#endif
    }
    PrecisionScope(const PrecisionScope&) = delete;
    PrecisionScope& operator=(const PrecisionScope&) = delete;

    /// The bf16 product, for reports: "onednn 2.6.3 avx512_core_bf16", "portable (fp32 compute)"; "" at fp32.
    const std::string& bf16_gemm() const { return bf16_gemm_; }
    /// The fp32 GEMM when not the backend's own: "onednn 2.6.3"; "" otherwise (and at bf16).
    const std::string& fp32_gemm() const { return fp32_gemm_; }
    /// The line a program reports when the run starts ("precision bf16: GEMMs on ..."), or "".
    const std::string& note() const { return note_; }

private:
    std::optional<backend::bf16_matmul_scope> bf16_;
    std::optional<backend::float_gemm_scope> fp32_;
    std::string bf16_gemm_, fp32_gemm_, note_;
};

/// The OpenMP threads of the parallel loops the calling thread starts from now on: `threads` > 0
/// sets them, 0 leaves OpenMP's own (OMP_NUM_THREADS, else every core). Results are deterministic
/// for a given count.
inline void set_threads(std::int64_t threads) {
    check<value_error>(threads >= 0 && threads <= (1 << 20), "train::set_threads: threads must be 0 (OpenMP's own) or positive, got ",
                       threads);
#if defined(_OPENMP)
    if (threads > 0) omp_set_num_threads(int(threads));
#endif
}

}  // namespace olmax::train
