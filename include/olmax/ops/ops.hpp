#pragma once
// Module header: every differentiable op.
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/pointwise.hpp"
#include "olmax/ops/linalg.hpp"
#include "olmax/ops/reduction.hpp"
#include "olmax/ops/shape.hpp"
#include "olmax/ops/embedding.hpp"
#include "olmax/ops/conv.hpp"
#include "olmax/ops/norm.hpp"
#include "olmax/ops/loss.hpp"
#include "olmax/ops/gather.hpp"
#include "olmax/ops/grouped_matmul.hpp"
