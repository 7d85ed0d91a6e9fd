#pragma once
// olmax::trace: a model's ordinary forward, backward and optimiser step traced into one program.
// program.hpp (compiled and run on a PJRT device) needs the PJRT runtime and is included on its own.
// Not part of olmax/olmax.hpp: a program that never traces does not compile the tracer.

#include "olmax/trace/layer_loop.hpp"
#include "olmax/trace/primitives.hpp"
#include "olmax/trace/rules.hpp"
#include "olmax/trace/scan_forms.hpp"
#include "olmax/trace/tracer.hpp"
