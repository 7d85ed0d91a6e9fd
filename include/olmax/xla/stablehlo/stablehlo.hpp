#pragma once
// Module header of the StableHLO text emitter (olmax::xla::stablehlo): builds MLIR modules that a
// PJRT plugin compiles. Pure C++, no dependency; static shapes, f32 data, i32 indices. The ops'
// semantics are the StableHLO specification's (openxla.org/stablehlo/spec).

#include "olmax/xla/stablehlo/function_builder.hpp"
#include "olmax/xla/stablehlo/ir.hpp"
#include "olmax/xla/stablehlo/module.hpp"
#include "olmax/xla/stablehlo/scan.hpp"
#include "olmax/xla/stablehlo/scan_strategy.hpp"
#include "olmax/xla/stablehlo/selective_scan.hpp"
