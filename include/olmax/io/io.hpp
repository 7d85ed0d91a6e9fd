#pragma once
// Module header: archives (format version, CRC-32, atomic writes), training checkpoints,
// NumPy .npy tensors, progress bar and metrics log.
#include "olmax/io/archive.hpp"
#include "olmax/io/checkpoint.hpp"
#include "olmax/io/npy.hpp"
#include "olmax/io/parameters.hpp"
#include "olmax/io/progress.hpp"
