#pragma once
// Module header: the tape, no_grad / tape_scope, custom backward passes (custom_op, Function<Op>).
#include "olmax/autodiff/tape.hpp"
