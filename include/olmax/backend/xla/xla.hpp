#pragma once
// Module header of the XLA / PJRT backend: the backend type `olmax::backend::xla` (trait, capability
// query, fallback policy) and the StableHLO emitter. The PJRT runtime that loads a plugin and runs
// the modules is a separate header, olmax/backend/xla/pjrt_runtime.hpp: it needs the PJRT C API
// header (target olmax::pjrt, CMake option OLMAX_PJRT_INCLUDE_DIR). See docs/xla.md.
#include "olmax/backend/xla/backend.hpp"
#include "olmax/backend/xla/stablehlo/stablehlo.hpp"
