#pragma once
// Module header: typed key = value configuration (file + command-line flags, unknown keys are
// errors); the main job's config composes sections in olmax/train/train_config.hpp.
#include "olmax/config/key_value.hpp"
#include "olmax/config/program.hpp"
