#pragma once
// Module header of the XLA path below the tracer: the traced program's IR (olmax/xla/graph/), the
// StableHLO emitter (olmax/xla/stablehlo/) and the compile options the runtime sends. The PJRT
// runtime (pjrt_runtime.hpp) and device_program.hpp need the PJRT C API header (target
// olmax::pjrt), so they are included on their own. See docs/xla.md.
#include "olmax/xla/compile_options.hpp"
#include "olmax/xla/graph/emit.hpp"
#include "olmax/xla/graph/evaluate.hpp"
#include "olmax/xla/graph/graph.hpp"
#include "olmax/xla/stablehlo/stablehlo.hpp"
