#pragma once
// Module header: typed key = value configuration (file + command-line flags, unknown keys are
// errors) and the training run's config.
#include "olmax/config/key_value.hpp"
#include "olmax/config/train_config.hpp"
#include "olmax/config/program.hpp"
