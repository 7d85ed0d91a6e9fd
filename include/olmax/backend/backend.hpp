#pragma once
// Module header: devices' kernels and how ops reach them (dispatch.hpp), the static backend
// concept and the CPU backends, the portable bf16 GEMM and the CPU's bf16 features. (The oneDNN
// GEMM, olmax/backend/onednn_gemm.hpp, needs the optional target olmax::onednn and is not here.)
#include "olmax/backend/bf16_gemm.hpp"
#include "olmax/backend/bf16_matmul_kernels.hpp"
#include "olmax/backend/float_gemm_kernels.hpp"
#include "olmax/backend/concept.hpp"
#include "olmax/backend/cpu_openmp.hpp"
#include "olmax/backend/cpu_features.hpp"
#include "olmax/backend/cpu_serial.hpp"
#include "olmax/backend/default.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/backend/kernels.hpp"
#include "olmax/backend/registry.hpp"
#include "olmax/backend/small_gemm.hpp"
