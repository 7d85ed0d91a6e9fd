#pragma once
// Settings of the device step that a program checks before any work, without the PJRT runtime
// itself (xla_step.hpp needs it).

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>
#include <cstdint>

#include "olmax/config/key_value.hpp"
#include "olmax/core/error.hpp"
#include "olmax/trace/scan_forms.hpp"

namespace olmax::train {

/// The keys of a program's config that say where the steps run and at which precision.
struct DeviceConfig {
    std::string device = "cpu";
    std::string xla_plugin;  // empty: $OLMAX_PJRT_PLUGIN
    std::int64_t xla_devices = 1;
    std::string xla_scan_form = "auto";  // auto: each scan's tag form where it suits the device, else the device's (trace::tracing::scan_form_for)
    std::string precision = "fp32";  // fp32 | bf16 (olmax::backend::bf16_matmul_scope; on xla the traced GEMMs bf16 x bf16 -> f32)

    static const std::vector<config::Field<DeviceConfig>>& fields() {
        using C = DeviceConfig;
        using config::Field;
        static const std::vector<Field<C>> f{
            Field<C>{"device", &C::device,
                     "where the training steps run: cpu (olmax's kernels) or xla (forward, backward and AdamW compiled once as one "
                     "StableHLO program for a PJRT plugin, state kept on the device)",
                     {"cpu", "xla"}},
            Field<C>{"xla_plugin", &C::xla_plugin, "PJRT plugin (.so) for --device=xla; empty: the environment variable OLMAX_PJRT_PLUGIN"},
            Field<C>{"xla_devices", &C::xla_devices,
                     "--device=xla: data parallelism over the plugin's first N devices (XLA's SPMD partitioner splits the batch, each "
                     "device taking batch / xla_devices rows; the gradients are all-reduced inside the step)"}
                .in(1, 1 << 16),
            Field<C>{"xla_scan_form", &C::xla_scan_form,
                     "--device=xla: the form of every linear scan in the compiled step: auto (each scan's strategy tag's form where it "
                     "suits the device, else the device's: a loop over time on the CPU, chunked triangular matmuls on a TPU, doubling "
                     "elsewhere), or one of sequential, hillis_steele, hillis_steele_chunked (about sqrt(T) steps a chunk), chunked_matmul (128). QRNN's pooling takes it; so does Mamba's selective scan, fused over time when the form is "
                     "sequential and else one linear scan of its materialised states (docs/xla.md)",
                     scan_form_choices()},
            Field<C>{"precision", &C::precision,
                     "fp32, or bf16: every float GEMM (forward and backward) computes as bf16 matrix units do, operands rounded to "
                     "bfloat16 and fp32 sums (on oneDNN's bf16 kernels when built with it and the CPU has bf16 units; on --device=xla the compiled step's dot_generals "
                     "take bf16 operands and give f32); "
                     "parameters, optimiser state, norms, softmax, losses and scans stay fp32 (docs/BF16.md)",
                     {"fp32", "bf16"}},
        };
        return f;
    }

    /// xla_scan_form's values: auto, then every form by its scan tag's name (trace::named_scan_forms).
    static std::vector<std::string> scan_form_choices() {
        std::vector<std::string> choices{"auto"};
        for (const auto& named : trace::named_scan_forms()) choices.push_back(named.first);
        return choices;
    }

    void validate() const {
        config::validate_fields(*this);
    }
};

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
