#pragma once
// What the PJRT runtime tells a plugin besides a module: the serialized compile options (replicas,
// partitions) and the environment variable naming the plugin. Plain bytes, no PJRT header needed
// (the oracle tests write them out for jax to parse).

#include <string>

#include "olmax/core/error.hpp"

namespace olmax::xla {

/// Serialized `xla.CompileOptionsProto` passed to PJRT_Client_Compile (an empty blob parses as 0
/// replicas / 0 partitions and libtpu rejects it). Field 3 executable_build_options { device_ordinal
/// (1) = -1 as a 10-byte varint, num_replicas (4) = 1, num_partitions (5) = 1 }: the same 17 bytes as
/// the JAX / gopjrt / pjrt-rs default (tags: (field << 3) | wire type; xla/pjrt/proto/compile_options.proto).
inline constexpr unsigned char compile_options_bytes[] = {0x1A, 0x0F, 0x08, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
                                                          0xFF, 0xFF, 0xFF, 0x01, 0x20, 0x01, 0x28, 0x01};

/// The options for a program over several devices (each count 1 to 127: one varint byte):
/// `replicas` > 1 runs one program per device with cross-replica collectives inside it (num_replicas,
/// field 4); `partitions` > 1 lets XLA's SPMD partitioner split one global program over that many
/// devices by its `mhlo.sharding` annotations (num_partitions, field 5, and use_spmd_partitioning,
/// field 6 = true; the client picks its default device assignment).
inline std::string compile_options_for(int replicas, int partitions = 1) {
    check<value_error>(replicas >= 1 && replicas <= 127, "xla: replicas must be 1 to 127, got ", replicas);
    check<value_error>(partitions >= 1 && partitions <= 127, "xla: partitions must be 1 to 127, got ", partitions);
    std::string bytes(reinterpret_cast<const char*>(compile_options_bytes), sizeof compile_options_bytes);
    bytes[14] = static_cast<char>(replicas);    // the value after num_replicas' tag 0x20
    bytes[16] = static_cast<char>(partitions);  // the value after num_partitions' tag 0x28
    if (partitions > 1) {
        bytes += '\x30';  // use_spmd_partitioning (6, varint) = true
        bytes += '\x01';
        bytes[1] = static_cast<char>(bytes[1] + 2);  // executable_build_options grew by those 2 bytes
    }
    return bytes;
}

/// The environment variable naming the PJRT plugin shared object (libtpu.so, xla_cuda_plugin.so).
inline constexpr const char* plugin_env_var = "OLMAX_PJRT_PLUGIN";

}  // namespace olmax::xla
