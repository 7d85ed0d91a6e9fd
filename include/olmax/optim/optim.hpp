#pragma once
// Module header: parameters with roles, Adam/AdamW, gradient clipping (global norm, unit-wise AGC),
// learning-rate schedule.
#include "olmax/optim/adam.hpp"
#include "olmax/optim/clipping.hpp"
#include "olmax/optim/param.hpp"
#include "olmax/optim/parameters_of.hpp"
#include "olmax/optim/schedule.hpp"
