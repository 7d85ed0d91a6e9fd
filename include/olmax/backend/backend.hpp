#pragma once
// Module header: the backend trait and the CPU backends.
#include "olmax/backend/concept.hpp"
#include "olmax/backend/cpu_openmp.hpp"
#include "olmax/backend/cpu_serial.hpp"
#include "olmax/backend/default.hpp"
