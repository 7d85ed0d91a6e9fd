#pragma once
// The training loop in the library: train::Trainer over a train::TrainableModel, with a step
// strategy (train::HostStep here; train::XlaStep in olmax/train/xla_step.hpp, which needs the PJRT
// runtime and is not included here), evaluation, checkpoints and resume, reporting to an Observer;
// the run's precision and threads (PrecisionScope, applied by the Trainer); the config sections the
// modules own and the main job's composition of them (TrainConfig). olmax/train/launch.hpp (the step
// strategy and communicator a config asks for) is not included either: with olmax::pjrt or
// olmax::distributed linked it includes their runtimes.

#include "olmax/train/agreement.hpp"
#include "olmax/train/device.hpp"
#include "olmax/train/evaluation.hpp"
#include "olmax/train/host_step.hpp"
#include "olmax/train/model.hpp"
#include "olmax/train/observer.hpp"
#include "olmax/train/optimizer.hpp"
#include "olmax/train/precision.hpp"
#include "olmax/train/processes.hpp"
#include "olmax/train/step.hpp"
#include "olmax/train/text_data.hpp"
#include "olmax/train/train_config.hpp"
#include "olmax/train/trainer.hpp"
