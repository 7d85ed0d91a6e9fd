#pragma once
// Module header of the XLA / PJRT backend: the static backend `olmax::backend::xla` (PJRT GEMM and
// sum, fallback policy), the `xla_device()` that ops reach it on, and the StableHLO emitter. The
// PJRT runtime that loads a plugin and runs the modules is a separate header,
// olmax/xla/pjrt_runtime.hpp: it needs the PJRT C API header (target olmax::pjrt; CMake
// finds the xla-cpu-pjrt wheel's or takes OLMAX_PJRT_INCLUDE_DIR), and so is device_program.hpp,
// which runs a traced whole step with its state on the device. See docs/xla.md.
#include "olmax/xla/backend.hpp"
#include "olmax/xla/graph/emit.hpp"
#include "olmax/xla/graph/evaluate.hpp"
#include "olmax/xla/graph/graph.hpp"
#include "olmax/xla/stablehlo/stablehlo.hpp"
