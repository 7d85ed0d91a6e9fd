#pragma once
// What a program's config asks of this process before any work, made here rather than by each
// program: the step strategy of `device` and the group of processes of `world_size`. They follow
// what the program links (the CMake targets define the macros for the code that links them):
//
//   device=cpu      train::HostStep
//   device=xla      train::XlaStep with olmax::pjrt (OLMAX_HAS_PJRT); without it a config_error
//   world_size=1    distributed::LocalCommunicator
//   world_size>1    distributed::GlooCommunicator with olmax::distributed (OLMAX_HAS_GLOO), met at
//                   `rendezvous`; without it a config_error
//
// train::launch does both for a train::TrainConfig, after setting the OpenMP threads (the model's
// activation budget counts them). The precision's GEMM kernels are the Trainer's own
// (TrainerOptions::precision, olmax/train/precision.hpp).
//
// Not in olmax/train/train.hpp nor the umbrella: with those targets it includes xla_step.hpp (the
// PJRT runtime) and olmax/distributed/gloo.hpp.
//
//     auto launched = train::launch<Model>(config);   // threads, step strategy, communicator
//     train::Trainer trainer(model, optimizer, *launched.comm, ..., train::trainer_options(config),
//                            std::move(launched.step), observer);

#include <cstddef>
#include <cstdint>
#include <memory>

#include "olmax/config/key_value.hpp"
#include "olmax/distributed/communicator.hpp"
#include "olmax/train/device.hpp"
#include "olmax/train/host_step.hpp"
#include "olmax/train/model.hpp"
#include "olmax/train/precision.hpp"
#include "olmax/train/processes.hpp"
#include "olmax/train/step.hpp"
#include "olmax/train/train_config.hpp"
#if defined(OLMAX_HAS_PJRT)  // the target olmax::pjrt
#include "olmax/train/xla_step.hpp"
#endif
#if defined(OLMAX_HAS_GLOO)  // the target olmax::distributed
#include "olmax/distributed/gloo.hpp"
#endif

namespace olmax::train {

/// Whether this program can compile its steps for a PJRT device (links olmax::pjrt) and train
/// across processes (links olmax::distributed).
#if defined(OLMAX_HAS_PJRT)
inline constexpr bool links_pjrt = true;
#else
inline constexpr bool links_pjrt = false;
#endif
#if defined(OLMAX_HAS_GLOO)
inline constexpr bool links_gloo = true;
#else
inline constexpr bool links_gloo = false;
#endif

/// The step strategy of `device.device` for a global batch of `batch` rows of `sequence` targets.
/// Made before any work, so that its refusals (no PJRT runtime, no plugin) come first.
template <TrainableModel Model>
std::unique_ptr<StepStrategy<Model>> make_step_strategy(const DeviceConfig& device, const HostStepOptions& host, std::size_t batch,
                                                        std::size_t sequence) {
    if (device.device == "cpu") return std::make_unique<HostStep<Model>>(host);
    check<config::config_error>(device.device == "xla", "config: key 'device' must be cpu or xla, got '", device.device, "'");
#if defined(OLMAX_HAS_PJRT)
    return std::make_unique<XlaStep<Model>>(
        XlaStepOptions{resolve_pjrt_plugin(device.xla_plugin), batch, sequence, int(device.xla_devices), device.xla_scan_form,
                       device.precision});
#else
    (void)batch, (void)sequence;
    throw config::config_error("config: --device=xla needs a program built with the PJRT runtime (the CMake target olmax::pjrt; CMake "
                               "found no PJRT header: run tools/setup_jax_venv.sh or set OLMAX_PJRT_INCLUDE_DIR, then rebuild)");
#endif
}

/// The group of processes this one trains in: itself alone (world_size 1), or the ranks met at
/// `rendezvous` over Gloo (the address this rank listens on from OLMAX_HOSTNAME / OLMAX_INTERFACE).
inline std::unique_ptr<distributed::Communicator> connect_processes(const ProcessConfig& p) {
    const auto timeout = distributed::Timeout(std::int64_t(p.collective_timeout_s * 1000));
    if (p.world_size == 1) return std::make_unique<distributed::LocalCommunicator>(timeout);
#if defined(OLMAX_HAS_GLOO)
    auto options = distributed::parse_rendezvous(p.rendezvous, int(p.rank), int(p.world_size), distributed::GlooOptions::from_environment());
    options.timeout = timeout;
    return std::make_unique<distributed::GlooCommunicator>(options);
#else
    throw config::config_error("config: --world_size > 1 needs a program built with Gloo (the CMake target olmax::distributed; Debian: "
                               "libgloo-dev; CMake did not find it)");
#endif
}

/// What train::launch made: the step strategy for the Trainer and the communicator it runs over.
template <TrainableModel Model>
struct Launched {
    std::unique_ptr<StepStrategy<Model>> step;
    std::unique_ptr<distributed::Communicator> comm;
};

/// The main job's start (a validated TrainConfig): the OpenMP threads set (`threads`), the step
/// strategy of `device` made, then the processes connected (a collective when world_size > 1).
template <TrainableModel Model>
Launched<Model> launch(const TrainConfig& c) {
    set_threads(c.threads);
    Launched<Model> launched;
    launched.step = make_step_strategy<Model>(c, c, std::size_t(c.batch), std::size_t(c.sequence));
    launched.comm = connect_processes(c);
    return launched;
}

}  // namespace olmax::train
