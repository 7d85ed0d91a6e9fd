#pragma once
// Training checkpoints: parameters + optimiser state + step + resolved config text + data position,
// in one archive (olmax/io/archive.hpp: format version, CRC-32, atomic replacement). Loading checks
// every name, shape and type before changing anything, so a rejected file leaves the model and
// optimiser as they were. `CheckpointDirectory` keeps the last few checkpoints and loads the newest
// one that is valid, so a damaged newest file falls back to the previous good one.
//
// io does not include optim (they are siblings; docs/ARCHITECTURE.md, "Layers"): a checkpoint takes
// the optimiser through `CheckpointOptimizer`, a concept over named parameters and a `StateDict`
// (core/state_dict.hpp) that optim::AdamW models. Archive entries: "param/<name>" per parameter,
// "optim/<entry>" per state entry in the optimiser's order (AdamW: "optim/step", then
// "optim/<name>/step", "optim/<name>/first_moment", "optim/<name>/second_moment"), and the
// "olmax/..." and "train/..." entries below.

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <ranges>
#include <regex>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <signal.h>  // kill(pid, 0): does the writer of a temporary file still run
#include <unistd.h>

#include "olmax/core/core.hpp"
#include "olmax/io/archive.hpp"

namespace olmax::io {

namespace detail {
/// The element type of `p.tensor`.
template <class P>
using named_tensor_value_t = typename std::remove_cvref_t<decltype(std::declval<const P&>().tensor)>::value_type;
}  // namespace detail

/// A trainable tensor with its name: members `name` (a string) and `tensor` (Tensor<float> or
/// Tensor<double>), as optim::Parameter and nn::NamedParameter have. Checkpoints store it as
/// "param/<name>".
template <class P>
concept NamedTensor = requires(const P& p) {
    { p.name } -> std::convertible_to<std::string>;
    requires Real<detail::named_tensor_value_t<P>>;
    requires std::same_as<std::remove_cvref_t<decltype(p.tensor)>, Tensor<detail::named_tensor_value_t<P>>>;
};

/// A range of named tensors (a std::vector<optim::Parameter<T>>, a model's parameters()).
template <class R>
concept NamedTensorRange = std::ranges::forward_range<const R> && NamedTensor<std::ranges::range_value_t<const R>>;

/// What a checkpoint needs from an optimiser: its parameters with their names, and its own state
/// as a StateDict it can export and load back. `load_state_dict` must check everything before it
/// changes anything (restore_checkpoint relies on it for its all-or-nothing promise).
template <class O>
concept CheckpointOptimizer = requires(const O& optimizer, O& target, const StateDict& state) {
    typename O::value_type;
    requires Real<typename O::value_type>;
    { optimizer.parameters() } -> NamedTensorRange;
    requires std::same_as<detail::named_tensor_value_t<std::ranges::range_value_t<decltype(optimizer.parameters())>>,
                          typename O::value_type>;
    { optimizer.state_dict() } -> std::same_as<StateDict>;
    target.load_state_dict(state);
};

/// What a checkpoint holds besides parameters and optimiser state.
struct TrainingState {
    std::int64_t step = 0;
    std::string config_text = {};    // the resolved config (key = value lines)
    std::string data_position = {};  // data::DataPosition::to_text()
    std::string note = {};           // free text (metrics, ...)
};

template <CheckpointOptimizer O>
Archive make_checkpoint(const O& optimizer, const TrainingState& state) {
    using T = typename O::value_type;
    Archive a;
    a.put_text("olmax/kind", "training_checkpoint");
    a.put_text("olmax/param_dtype", std::string(dtype_name<T>()));
    a.put_int("train/step", state.step);
    a.put_text("train/config", state.config_text);
    a.put_text("train/data_position", state.data_position);
    a.put_text("train/note", state.note);
    for (const auto& p : optimizer.parameters()) a.put("param/" + std::string(p.name), p.tensor);
    for (const auto& entry : optimizer.state_dict()) {
        const std::string key = "optim/" + entry.name;
        std::visit(
            [&]<class V>(const V& value) {
                if constexpr (std::is_same_v<V, std::int64_t>) a.put_int(key, value);
                else a.put(key, value);
            },
            entry.value);
    }
    return a;
}

namespace detail {

/// Reads and checks every parameter of `params` from the archive without changing them: present,
/// of the model's element type and shape. `who` names the caller in errors.
template <NamedTensorRange R>
auto read_parameters(const Archive& a, const R& params, std::string_view who) {
    using T = named_tensor_value_t<std::ranges::range_value_t<const R>>;
    std::vector<Tensor<T>> loaded;
    for (const auto& p : params) {
        const std::string name(p.name), key = "param/" + name;
        check(a.contains(key), who, ": checkpoint has no parameter '", name, "'");
        const Archive::Entry& e = a.entry(key);
        check(e.kind == kind_of<T>(), who, ": parameter '", name, "' is stored as ", kind_name(e.kind), ", the model uses ",
              dtype_name<T>());
        check<shape_error>(e.shape == p.tensor.shape(), who, ": parameter '", name, "' has shape ", olmax::to_string(e.shape),
                           " in the checkpoint, ", olmax::to_string(p.tensor.shape()), " in the model");
        loaded.push_back(a.get<T>(key));
    }
    return loaded;
}

/// Copies values read by read_parameters into the parameters (in place; cannot fail).
template <NamedTensorRange R, Real T>
void assign_parameters(const R& params, const std::vector<Tensor<T>>& loaded) {
    std::size_t i = 0;
    for (const auto& p : params) {
        Tensor<T> target = p.tensor;  // a handle: writes go to the caller's parameter
        std::copy(loaded[i].begin(), loaded[i].end(), target.begin());
        ++i;
    }
}

/// Reads the optimiser state stored under `prefix`, entry by entry as `like` (the optimiser's
/// current state) names them, checking each entry's presence, type and shape; changes nothing.
inline StateDict read_state(const Archive& a, const std::string& prefix, const StateDict& like, std::string_view who) {
    StateDict loaded;
    for (const auto& entry : like) {
        const std::string key = prefix + entry.name;
        check(a.contains(key), who, ": checkpoint has no optimiser state '", key, "' (saved for another model or optimiser?)");
        const Archive::Entry& stored = a.entry(key);
        std::visit(
            [&]<class V>(const V& current) {
                if constexpr (std::is_same_v<V, std::int64_t>) {
                    check(stored.kind == EntryKind::int64 && stored.shape.empty(), who, ": optimiser state '", key,
                          "' is not an int64 scalar");
                    loaded.add(entry.name, a.integer(key));
                } else {
                    using U = typename V::value_type;
                    check(stored.kind == kind_of<U>(), who, ": optimiser state '", key, "' is stored as ", kind_name(stored.kind),
                          ", expected ", dtype_name<U>());
                    check<shape_error>(stored.shape == current.shape(), who, ": optimiser state '", key, "' has shape ",
                                       olmax::to_string(stored.shape), " in the checkpoint, ", olmax::to_string(current.shape()),
                                       " in the optimiser");
                    loaded.add(entry.name, a.get<U>(key));
                }
            },
            entry.value);
    }
    return loaded;
}

}  // namespace detail

/// Copies the archive's parameters into `params` (in place) after checking all of them.
template <NamedTensorRange R>
void restore_parameters(const Archive& a, const R& params) {
    detail::assign_parameters(params, detail::read_parameters(a, params, "restore_parameters"));
}

/// Restores parameters and optimiser state; returns the step, config and data position. Throws
/// (changing nothing) when the archive does not fit this model: everything is read and checked
/// first, then the optimiser loads its state (which checks before changing), and only then are the
/// parameters overwritten, a copy that cannot fail.
template <CheckpointOptimizer O>
TrainingState restore_checkpoint(const Archive& a, O& optimizer) {
    constexpr std::string_view who = "restore_checkpoint";
    check(a.contains("olmax/kind") && a.text("olmax/kind") == "training_checkpoint", "restore_checkpoint: not a training checkpoint");
    const StateDict optimizer_state = detail::read_state(a, "optim/", optimizer.state_dict(), who);
    const auto parameters = detail::read_parameters(a, optimizer.parameters(), who);
    TrainingState state;
    state.step = a.integer("train/step");
    state.config_text = a.text("train/config");
    state.data_position = a.text("train/data_position");
    state.note = a.text("train/note");
    optimizer.load_state_dict(optimizer_state);
    detail::assign_parameters(optimizer.parameters(), parameters);
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

    using Listing = std::vector<std::pair<std::int64_t, std::filesystem::path>>;

    /// The newest checkpoint that loads cleanly, or nullopt when there is none; `rejected`
    /// (when given) receives one line per file that did not load, naming it and the reason.
    std::optional<Loaded> load_latest(std::vector<std::string>* rejected_out = nullptr) const { return load_latest(list(), rejected_out); }

    /// The same among `files`, a `list()` the caller already made (no second walk of the folder).
    std::optional<Loaded> load_latest(const Listing& files, std::vector<std::string>* rejected_out = nullptr) const {
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
