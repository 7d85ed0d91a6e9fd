#pragma once
// Training checkpoints: parameters + optimiser state + step + resolved config text + data position,
// in one archive (olmax/io/archive.hpp: format version, CRC-32, atomic replacement). Loading checks
// every name, shape and type before changing anything, so a rejected file leaves the model and
// optimiser as they were. `CheckpointDirectory` keeps the last few checkpoints and loads the newest
// one that is valid, so a damaged newest file falls back to the previous good one.

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <signal.h>  // kill(pid, 0): does the writer of a temporary file still run
#include <unistd.h>

#include "olmax/io/archive.hpp"
#include "olmax/optim/adam.hpp"

namespace olmax::io {

/// What a checkpoint holds besides parameters and optimiser moments.
struct TrainingState {
    std::int64_t step = 0;
    std::string config_text;    // the resolved config (key = value lines)
    std::string data_position;  // data::DataPosition::to_text()
    std::string note;           // free text (metrics, ...)
};

template <Real T>
Archive make_checkpoint(const optim::AdamW<T>& optimizer, const TrainingState& state) {
    Archive a;
    a.put_text("olmax/kind", "training_checkpoint");
    a.put_text("olmax/param_dtype", std::string(dtype_name<T>()));
    a.put_int("train/step", state.step);
    a.put_text("train/config", state.config_text);
    a.put_text("train/data_position", state.data_position);
    a.put_text("train/note", state.note);
    for (const auto& p : optimizer.parameters()) a.put("param/" + p.name, p.tensor);
    const auto opt = optimizer.export_state();
    a.put_int("optim/step", opt.step);
    for (const auto& s : opt.slots) {
        a.put_int("optim/" + s.name + "/step", s.step);
        a.put("optim/" + s.name + "/first_moment", s.first_moment);
        a.put("optim/" + s.name + "/second_moment", s.second_moment);
    }
    return a;
}

/// Copies the archive's parameters into `params` (in place) after checking all of them.
template <Real T>
void restore_parameters(const Archive& a, const std::vector<optim::Parameter<T>>& params) {
    std::vector<Tensor<T>> loaded;
    for (const auto& p : params) {
        const std::string key = "param/" + p.name;
        check(a.contains(key), "restore_parameters: checkpoint has no parameter '", p.name, "'");
        check(a.entry(key).kind == detail::kind_of<T>(), "restore_parameters: parameter '", p.name, "' is stored as ",
              detail::kind_name(a.entry(key).kind), ", the model uses ", dtype_name<T>());
        Tensor<T> t = a.get<T>(key);
        check<shape_error>(t.shape() == p.tensor.shape(), "restore_parameters: parameter '", p.name, "' has shape ",
                           olmax::to_string(t.shape()), " in the checkpoint, ", olmax::to_string(p.tensor.shape()), " in the model");
        loaded.push_back(std::move(t));
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
        Tensor<T> target = params[i].tensor;
        std::copy(loaded[i].begin(), loaded[i].end(), target.begin());
    }
}

/// Restores parameters and optimiser state; returns the step, config and data position. Throws
/// (changing nothing) when the archive does not fit this model.
template <Real T>
TrainingState restore_checkpoint(const Archive& a, optim::AdamW<T>& optimizer) {
    check(a.contains("olmax/kind") && a.text("olmax/kind") == "training_checkpoint", "restore_checkpoint: not a training checkpoint");
    optim::AdamState opt;
    opt.step = a.integer("optim/step");
    for (const auto& p : optimizer.parameters()) {
        const std::string prefix = "optim/" + p.name + "/";
        check(a.contains(prefix + "step"), "restore_checkpoint: no optimiser state for parameter '", p.name, "'");
        opt.slots.push_back(optim::SlotState{p.name, a.integer(prefix + "step"), a.get<double>(prefix + "first_moment"),
                                             a.get<double>(prefix + "second_moment")});
    }
    // Validate everything first: import_state checks the state, a dry run checks the parameters.
    {
        optim::AdamW<T> probe(optimizer.parameters(), optimizer.config());
        probe.import_state(opt);
    }
    for (const auto& p : optimizer.parameters()) {
        const std::string key = "param/" + p.name;
        check(a.contains(key), "restore_checkpoint: checkpoint has no parameter '", p.name, "'");
        check(a.entry(key).kind == detail::kind_of<T>() && a.entry(key).shape == p.tensor.shape(),
              "restore_checkpoint: parameter '", p.name, "' has type ", detail::kind_name(a.entry(key).kind), " shape ",
              olmax::to_string(a.entry(key).shape), " in the checkpoint, ", dtype_name<T>(), " ", olmax::to_string(p.tensor.shape()),
              " in the model");
    }
    restore_parameters(a, optimizer.parameters());
    optimizer.import_state(opt);
    TrainingState state;
    state.step = a.integer("train/step");
    state.config_text = a.text("train/config");
    state.data_position = a.text("train/data_position");
    state.note = a.text("train/note");
    return state;
}

/// A folder of checkpoints named `ckpt-<step>.olmax`, keeping the newest `keep` of them.
class CheckpointDirectory {
public:
    explicit CheckpointDirectory(std::filesystem::path dir, std::size_t keep = 3) : dir_(std::move(dir)), keep_(keep) {
        check(keep_ >= 1, "CheckpointDirectory: keep must be at least 1");
    }

    const std::filesystem::path& path() const { return dir_; }

    std::filesystem::path file_for(std::int64_t step) const {
        char name[64];
        std::snprintf(name, sizeof name, "ckpt-%010lld.olmax", static_cast<long long>(step));
        return dir_ / name;
    }

    /// Checkpoint files, oldest step first. Other names are ignored; a name that looks like a
    /// checkpoint but whose step does not parse (e.g. does not fit in 64 bits) is skipped, with a
    /// line in `*notices` when given. A path that exists but is not a folder is an error.
    std::vector<std::pair<std::int64_t, std::filesystem::path>> list(std::vector<std::string>* notices = nullptr) const {
        namespace fs = std::filesystem;
        std::vector<std::pair<std::int64_t, std::filesystem::path>> out;
        std::error_code ec;
        const auto status = fs::status(dir_, ec);
        if (!fs::exists(status)) return out;
        check(fs::is_directory(status), "checkpoint folder ", dir_.string(), " is not a folder");
        static const std::regex pattern(R"(ckpt-(\d+)\.olmax)");
        fs::directory_iterator it(dir_, ec);
        check(!ec, "cannot list the checkpoint folder ", dir_.string(), ": ", ec.message());
        for (; it != fs::directory_iterator(); it.increment(ec)) {
            std::smatch m;
            const std::string name = it->path().filename().string();
            if (!std::regex_match(name, m, pattern)) continue;
            std::int64_t step = 0;
            const std::string digits = m[1].str();
            const auto [end, parse] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
            std::error_code kind_ec;
            if (!it->is_regular_file(kind_ec)) {
                if (notices) notices->push_back(name + " skipped: not a regular file");
            } else if (parse != std::errc() || end != digits.data() + digits.size()) {
                if (notices) notices->push_back(name + " skipped: its step number does not fit in 64 bits");
            } else {
                out.emplace_back(step, it->path());
            }
        }
        check(!ec, "cannot list the checkpoint folder ", dir_.string(), ": ", ec.message());
        std::sort(out.begin(), out.end());
        return out;
    }

    /// Removes the temporary files that saves interrupted by a crash or kill left behind
    /// (`.<name>.tmp-<pid>-<n>`, see write_file_atomically), except those of a process that still
    /// runs (a save in progress). Returns the names removed.
    std::vector<std::string> remove_stale_temporaries() const {
        namespace fs = std::filesystem;
        std::vector<std::string> removed;
        std::error_code ec;
        if (!fs::is_directory(dir_, ec)) return removed;
        static const std::regex pattern(R"(\.ckpt-\d+\.olmax\.tmp-(\d+)-\d+)");
        for (fs::directory_iterator it(dir_, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
            std::smatch m;
            const std::string name = it->path().filename().string();
            if (!std::regex_match(name, m, pattern)) continue;
            long pid = 0;
            const std::string pid_text = m[1].str();
            std::from_chars(pid_text.data(), pid_text.data() + pid_text.size(), pid);
            const bool writer_alive = pid > 0 && pid != long(::getpid()) && (::kill(pid_t(pid), 0) == 0 || errno == EPERM);
            std::error_code remove_ec;
            if (!writer_alive && fs::remove(it->path(), remove_ec)) removed.push_back(name);
        }
        return removed;
    }

    /// Writes atomically, then removes the oldest files beyond `keep` (never the one just written).
    std::filesystem::path save(const Archive& archive, std::int64_t step) {
        std::filesystem::create_directories(dir_);
        const auto path = file_for(step);
        save_archive(path, archive);
        auto files = list();
        while (files.size() > keep_) {
            if (files.front().second != path) std::filesystem::remove(files.front().second);
            files.erase(files.begin());
        }
        return path;
    }

    struct Loaded {
        std::filesystem::path path;
        Archive archive;
        std::vector<std::string> rejected;  // newer files that failed to load, with the reason
    };

    /// The newest checkpoint that loads cleanly, or nullopt when there is none; `rejected`
    /// (when given) receives one line per file that did not load, naming it and the reason.
    std::optional<Loaded> load_latest(std::vector<std::string>* rejected_out = nullptr) const {
        auto files = list();
        std::vector<std::string> rejected;
        for (auto it = files.rbegin(); it != files.rend(); ++it) {
            try {
                return Loaded{it->second, load_archive(it->second), rejected};
            } catch (const std::exception& e) {  // a damaged file is a reason to fall back, never to stop
                rejected.push_back(it->second.filename().string() + ": " + e.what());
            }
        }
        if (rejected_out) *rejected_out = std::move(rejected);
        return std::nullopt;
    }

private:
    std::filesystem::path dir_;
    std::size_t keep_;
};

}  // namespace olmax::io
