#pragma once
// Module header of the XLA path below the tracer: the traced program's IR (olmax/xla/graph/: its
// primitives, the lowering to one StableHLO module, the double-precision reference evaluation),
// the StableHLO emitter (olmax/xla/stablehlo/) and the compile options the runtime sends. The PJRT
// runtime that loads a plugin and runs the modules is a separate header,
// olmax/xla/pjrt_runtime.hpp: it needs the PJRT C API header (target olmax::pjrt; CMake finds the
// xla-cpu-pjrt wheel's or takes OLMAX_PJRT_INCLUDE_DIR), and so is device_program.hpp, which runs
// a traced whole step with its state on the device. See docs/xla.md.
#include "olmax/xla/compile_options.hpp"
#include "olmax/xla/graph/emit.hpp"
#include "olmax/xla/graph/evaluate.hpp"
#include "olmax/xla/graph/graph.hpp"
#include "olmax/xla/stablehlo/stablehlo.hpp"
