#pragma once
// Module header: the tape, no_grad / tape_scope, custom backward passes (custom_op, Function<Op>),
// private gradient buffers and data parallelism over threads (data_parallel_backward).
#include "olmax/autodiff/data_parallel.hpp"
#include "olmax/autodiff/tape.hpp"
