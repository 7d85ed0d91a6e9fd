#pragma once
// Module header: grad mode (no_grad, enable_grad), the per-thread tape (record, tape_scope,
// backward; also defines Tensor<T>::backward), gradient buffers (GradientSink, private_gradients),
// custom backward passes (custom_op, Function<Op>), gradient-ready notifications during backward
// (gradient_ready_hook) and data parallelism over threads (data_parallel_backward).
#include "olmax/autodiff/custom_op.hpp"
#include "olmax/autodiff/data_parallel.hpp"
#include "olmax/autodiff/grad_mode.hpp"
#include "olmax/autodiff/gradient_hooks.hpp"
#include "olmax/autodiff/gradient_sink.hpp"
#include "olmax/autodiff/tape.hpp"
