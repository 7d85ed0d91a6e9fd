#pragma once
// Module header of the StableHLO text emitter (olmax::xla::stablehlo): builds MLIR modules that a
// PJRT plugin compiles. Pure C++, no dependency; static shapes, f32 data, i32 indices. The op
// semantics are those of the StableHLO specification (openxla.org/stablehlo/spec); docs/xla.md
// says how the emitter, the backend and the PJRT runtime fit together.
//
// Two layers:
//   IR builder      ir.hpp (types, values), function_builder.hpp (ops, regions, printing)
//   module library  module.hpp (emitted_module with a cache key naming the op and the shapes,
//                   module_cache), scan.hpp (scan_forward, scan_backward and the scan lowerings),
//                   selective_scan.hpp (Mamba's scan fused over time), qrnn.hpp, matmul.hpp,
//                   elementwise.hpp, reduction.hpp

#include "olmax/xla/stablehlo/elementwise.hpp"
#include "olmax/xla/stablehlo/function_builder.hpp"
#include "olmax/xla/stablehlo/ir.hpp"
#include "olmax/xla/stablehlo/matmul.hpp"
#include "olmax/xla/stablehlo/module.hpp"
#include "olmax/xla/stablehlo/qrnn.hpp"
#include "olmax/xla/stablehlo/reduction.hpp"
#include "olmax/xla/stablehlo/scan.hpp"
#include "olmax/xla/stablehlo/selective_scan.hpp"
