#pragma once
// Module header: devices' kernels and how ops reach them (dispatch.hpp), the static backend
// concept and the CPU backends.
#include "olmax/backend/concept.hpp"
#include "olmax/backend/cpu_openmp.hpp"
#include "olmax/backend/cpu_serial.hpp"
#include "olmax/backend/default.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/backend/kernels.hpp"
#include "olmax/backend/registry.hpp"
