#pragma once
// Module header: finite-difference gradient checks for users' tests (ops, custom backward passes,
// whole layers).
#include "olmax/testing/gradient_check.hpp"
#include "olmax/testing/layer_gradient_check.hpp"
