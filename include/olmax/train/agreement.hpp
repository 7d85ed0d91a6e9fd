#pragma once
// What the ranks of a run check before their first collective whose size depends on the model or
// the settings, and how rank 0's checkpoint reaches the others.

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "olmax/data/loader.hpp"
#include "olmax/distributed/agreement.hpp"
#include "olmax/io/archive.hpp"
#include "olmax/version.hpp"

namespace olmax::train {

/// Rank 0 runs `load` (reading the checkpoint folder) and hands the checkpoint it returns (if any)
/// to the other ranks, so only rank 0 needs the folder. A failure on rank 0 reaches the others as
/// an error instead of a timeout. A collective: every rank calls it.
inline std::optional<io::Archive> share_checkpoint(distributed::Communicator& comm, const std::function<std::optional<io::Archive>()>& load) {
    if (comm.world_size() == 1) return load();
    std::int64_t size = -1;
    std::optional<io::Archive> archive;
    std::string bytes;
    if (comm.rank() == 0) {
        try {
            archive = load();
            if (archive) bytes = archive->serialize();
            size = std::int64_t(bytes.size());
        } catch (...) {
            comm.broadcast(std::span<std::int64_t>(&size, 1));
            throw;
        }
    }
    comm.broadcast(std::span<std::int64_t>(&size, 1));
    check<distributed::distributed_error>(size >= 0, "rank 0 could not prepare the checkpoint folder (its error is in its output)");
    if (size == 0) return std::nullopt;
    bytes.resize(std::size_t(size));
    comm.broadcast(std::span<char>(bytes.data(), bytes.size()));
    if (comm.rank() != 0) archive = io::Archive::deserialize(bytes, "rank 0's checkpoint");
    return archive;
}

/// "N documents, B bytes, FNV-1a H": the training bytes by content (each rank may read them from
/// another path).
inline std::string documents_digest(const data::Documents& documents) {
    std::uint64_t hash = 14695981039346656037ull, bytes = 0;  // FNV-1a over the documents, each ended by a 0xff
    for (const auto& d : documents) {
        for (const std::uint8_t b : d) hash = (hash ^ b) * 1099511628211ull;
        hash = (hash ^ 0xffu) * 1099511628211ull;
        bytes += d.size();
    }
    char text[96];
    std::snprintf(text, sizeof text, "%zu documents, %" PRIu64 " bytes, FNV-1a %016" PRIx64, documents.size(), bytes, hash);
    return text;
}

/// What the ranks must agree on: the olmax version, every `key = value` line of `config_text`
/// whose key is not in `rank_local_keys` (as "--key"), each rank's share of the batch, the training
/// bytes' digest, every parameter's name, element type and shape, and the resumed step.
template <class Named>
distributed::Fingerprint run_fingerprint(std::string_view config_text, const std::vector<std::string>& rank_local_keys,
                                         std::int64_t rows_per_rank, std::string_view documents_digest,
                                         const std::vector<Named>& parameters, std::int64_t resumed_step) {
    distributed::Fingerprint f;
    f.add("olmax version", version_string);
    std::istringstream lines{std::string(config_text)};
    for (std::string line; std::getline(lines, line);) {
        const auto eq = line.find(" = ");
        if (eq == std::string::npos) continue;
        const std::string key = line.substr(0, eq);
        if (std::find(rank_local_keys.begin(), rank_local_keys.end(), key) != rank_local_keys.end()) continue;
        f.add("--" + key, line.substr(eq + 3));
    }
    f.add("rows per rank", rows_per_rank);
    f.add("training documents", documents_digest);
    f.add_parameters(parameters);
    f.add("resumed from step", resumed_step);
    return f;
}

}  // namespace olmax::train
