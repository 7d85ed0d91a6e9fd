#pragma once
// olmax: header-only tensors, reverse-mode autodiff and long-context sequence layers.
// Include this one header; each module header below is also usable on its own.

#include "olmax/version.hpp"

#include "olmax/core/core.hpp"          // Tensor, Device, Shape, errors, memory stats, random init
#include "olmax/autodiff/autodiff.hpp"  // tape, no_grad, custom backward (custom_op, Function<Op>)
#include "olmax/backend/backend.hpp"    // Kernels, devices' kernels, op dispatch, cpu_serial, cpu_openmp
#include "olmax/ops/ops.hpp"            // differentiable ops
#include "olmax/scan/scan.hpp"          // linear-recurrence scans and their strategies
#include "olmax/nn/nn.hpp"              // layers as template types, Reversible, Stack, Sequential
#include "olmax/optim/optim.hpp"        // AdamW, clipping, schedules
#include "olmax/data/data.hpp"          // byte tokenizer, corpus, packing loader, sampling
#include "olmax/io/io.hpp"              // checkpoints, .npy, progress
#include "olmax/config/config.hpp"      // typed key=value configuration
#include "olmax/testing/testing.hpp"   // check_gradients, check_layer_gradients
#include "olmax/distributed/distributed.hpp"  // Communicator, gradient allreduce across processes (Gloo: olmax/distributed/gloo.hpp)
#include "olmax/models/models.hpp"      // the main job's byte-level LM (ByteLM over a block recipe)
#include "olmax/train/train.hpp"        // train::Trainer: the training loop, its step strategies, checkpoints and resume
// Not included here, so that a program that never uses them does not compile them:
//   olmax/trace/trace.hpp   the tracer: a model's eager step as one StableHLO program (docs/xla.md)
//   olmax/xla/xla.hpp       the XLA module: the program IR and its primitives, the StableHLO emitter
//   olmax/xla/pjrt_runtime.hpp, olmax/trace/program.hpp, olmax/train/xla_trainer.hpp,
//   olmax/train/xla_step.hpp (need olmax::pjrt); olmax/train/launch.hpp (the step of a config's
//   device and its communicator: XlaStep with olmax::pjrt, Gloo with olmax::distributed)
