#pragma once
// Settings of the device step that a program checks before any work, without the PJRT runtime
// itself (xla_step.hpp needs it).

#include <cstdlib>
#include <filesystem>
#include <string>

#include "olmax/config/key_value.hpp"
#include "olmax/core/error.hpp"

namespace olmax::train {

/// The PJRT plugin a compiled step would load: `flag` (--xla_plugin) or else the environment
/// variable OLMAX_PJRT_PLUGIN; config_error when neither names an existing file.
inline std::string resolve_pjrt_plugin(const std::string& flag) {
    const char* env = std::getenv("OLMAX_PJRT_PLUGIN");
    const std::string plugin = !flag.empty() ? flag : env ? std::string(env) : std::string();
    check<config::config_error>(!plugin.empty(),
                                "config: --device=xla needs a PJRT plugin: --xla_plugin=PATH or the environment variable OLMAX_PJRT_PLUGIN "
                                "(this machine's CPU: the xla-cpu-pjrt wheel's xla_cpu_pjrt.so, which tools/setup_jax_venv.sh installs "
                                "in .venv; docs/xla.md names the TPU and NVIDIA plugins)");
    check<config::config_error>(std::filesystem::exists(plugin), "config: --device=xla: the PJRT plugin ", plugin, " does not exist");
    return plugin;
}

}  // namespace olmax::train
