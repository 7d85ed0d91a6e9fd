#pragma once
// Module header of the StableHLO text emitter (olmax::xla::stablehlo): builds MLIR modules that a
// PJRT plugin compiles. Pure C++, no dependency; static shapes, f32 data, i32 indices. The op
// semantics are those of the StableHLO specification (openxla.org/stablehlo/spec); docs/xla.md
// says how the emitter, the traced program's IR (xla/graph/, whose primitives lower through it)
// and the PJRT runtime fit together.
//
//   ir.hpp (types, values), function_builder.hpp (ops, regions, printing), module.hpp (what the
//   runtime is handed: emitted_module), scan_strategy.hpp (a scan's four forms), scan.hpp (their
//   lowerings), selective_scan.hpp (Mamba's scan fused over time, and its gradient)

#include "olmax/xla/stablehlo/function_builder.hpp"
#include "olmax/xla/stablehlo/ir.hpp"
#include "olmax/xla/stablehlo/module.hpp"
#include "olmax/xla/stablehlo/scan.hpp"
#include "olmax/xla/stablehlo/scan_strategy.hpp"
#include "olmax/xla/stablehlo/selective_scan.hpp"
