#pragma once
// olmax: header-only tensors, reverse-mode autodiff and long-context sequence layers.
// Include this one header; the module headers below are also usable on their own.

#include "olmax/version.hpp"
#include "olmax/core/core.hpp"
#include "olmax/autodiff/autodiff.hpp"
#include "olmax/backend/backend.hpp"
#include "olmax/ops/ops.hpp"
#include "olmax/testing/gradient_check.hpp"
