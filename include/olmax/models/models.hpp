#pragma once
// Complete models built from olmax's layers, ready to train (the main job's byte-level LM).

#include "olmax/models/byte_lm.hpp"
#include "olmax/models/recipes.hpp"
