#pragma once
// Module header: tensors, shapes, errors, memory statistics, random initialisation.
#include "olmax/core/error.hpp"
#include "olmax/core/memory.hpp"
#include "olmax/core/random.hpp"
#include "olmax/core/shape.hpp"
#include "olmax/core/tensor.hpp"
