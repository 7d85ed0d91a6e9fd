#pragma once
// Module header: tensors and the devices they live on, the bfloat16 storage type, shapes, errors,
// memory statistics and peak profiles, random initialisation, state dictionaries (named state that
// optimisers export and checkpoints store), the process's stop request (SIGINT / SIGTERM).
#include "olmax/core/bfloat16.hpp"
#include "olmax/core/device.hpp"
#include "olmax/core/error.hpp"
#include "olmax/core/memory.hpp"
#include "olmax/core/memory_profile.hpp"
#include "olmax/core/time_profile.hpp"
#include "olmax/core/random.hpp"
#include "olmax/core/shape.hpp"
#include "olmax/core/state_dict.hpp"
#include "olmax/core/stop.hpp"
#include "olmax/core/tensor.hpp"
