#pragma once
// Typed configuration: a plain struct with defaults, overridden from a `key = value` file and from
// `--key=value` command-line flags. The struct lists its keys once (`static fields()`, member
// pointers with a help line); an unknown or mistyped key, or a value that does not parse, is an
// error naming the key (the original Olmax silently ignored extra keys), and so is a number outside
// the key's declared range.
//
//     struct MyConfig {
//         std::int64_t steps = 100;
//         double lr = 1e-3;
//         static const auto& fields() {
//             static const std::vector<olmax::config::Field<MyConfig>> f{
//                 {"steps", &MyConfig::steps, "optimiser steps"}, {"lr", &MyConfig::lr, "peak learning rate"}};
//             return f;
//         }
//     };

#include <algorithm>
#include <charconv>
#include <concepts>
#include <cstdlib>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>
#include <variant>
#include <system_error>
#include <vector>

#include <unistd.h>  // access(): may this process read or write a path

#include "olmax/core/error.hpp"

namespace olmax::config {

/// A config key or value is wrong; the message names the key and where it came from.
class config_error : public value_error {
public:
    using value_error::value_error;
};

/// What a string field names on the file system (checked by `validate_fields`).
enum class PathKind {
    none,           // not a path
    input,          // an existing, readable file or folder; empty means the program's default
    input_file,     // an existing, readable regular file; empty means the program's default
    output_folder,  // a folder, created when missing: must not be a file nor lie under one
};

/// One key of a config struct: its member, help line and the values it accepts. The accepted
/// range of a number reads as a chain: `Field<C>{"batch", &C::batch, "rows per step"}.in(1, 1 << 20)`.
/// A field without a range accepts every value of its type; each number should have one (the
/// command-line fuzz test draws its boundary cases from these ranges).
template <class Struct>
struct Field {
    using Member = std::variant<std::int64_t Struct::*, double Struct::*, std::string Struct::*, bool Struct::*>;
    std::string key;
    Member member;
    std::string help;
    std::vector<std::string> choices = {};  // allowed values of a string field (empty = any)
    double lower = -std::numeric_limits<double>::infinity();  // numbers: accepted interval
    double upper = std::numeric_limits<double>::infinity();
    bool lower_open = false, upper_open = false;             // whether the bound itself is excluded
    PathKind path = PathKind::none;

    Field at_least(double v) const { return bounded(v, false, upper, upper_open); }
    Field greater_than(double v) const { return bounded(v, true, upper, upper_open); }
    Field at_most(double v) const { return bounded(lower, lower_open, v, false); }
    Field less_than(double v) const { return bounded(lower, lower_open, v, true); }
    Field in(double low, double high) const { return at_least(low).at_most(high); }
    Field names(PathKind kind) const {
        Field f = *this;
        f.path = kind;
        return f;
    }

    bool is_number() const {
        return std::holds_alternative<std::int64_t Struct::*>(member) || std::holds_alternative<double Struct::*>(member);
    }
    bool accepts(double v) const {
        return (lower_open ? v > lower : v >= lower) && (upper_open ? v < upper : v <= upper);
    }
    /// "[1, 1048576]", "(0, 1)", ">= 0", or "" when any value goes.
    std::string range_text() const;

private:
    Field bounded(double low, bool low_open, double high, bool high_open) const {
        Field f = *this;
        f.lower = low, f.lower_open = low_open, f.upper = high, f.upper_open = high_open;
        return f;
    }
};

namespace detail {

inline std::string_view trim(std::string_view s) {
    const auto first = s.find_first_not_of(" \t\r");
    if (first == std::string_view::npos) return {};
    return s.substr(first, s.find_last_not_of(" \t\r") - first + 1);
}

inline std::size_t edit_distance(std::string_view a, std::string_view b) {
    std::vector<std::size_t> row(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
        std::size_t diagonal = row[0];
        row[0] = i;
        for (std::size_t j = 1; j <= b.size(); ++j) {
            const std::size_t up = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
            diagonal = up;
        }
    }
    return row[b.size()];
}

inline std::string format_double(double v) {
    std::ostringstream out;
    out << std::setprecision(std::numeric_limits<double>::max_digits10) << v;
    // Shortest text that reads back exactly.
    for (int digits = 1; digits <= std::numeric_limits<double>::max_digits10; ++digits) {
        std::ostringstream shorter;
        shorter << std::setprecision(digits) << v;
        if (std::strtod(shorter.str().c_str(), nullptr) == v) return shorter.str();
    }
    return out.str();
}

/// A bound as text: integers without a fraction, other values shortest round-trip.
inline std::string format_bound(double v) {
    if (std::abs(v) < 9.007199254740992e15 && v == std::floor(v)) return std::to_string(static_cast<long long>(v));
    return format_double(v);
}

/// Strings with surrounding spaces, '#', quotes or line breaks are written in double quotes with
/// backslash escapes, so `to_text` output reads back exactly.
inline std::string quote_if_needed(const std::string& s) {
    const bool plain = !s.empty() && s.find_first_of("#\"\n\r\\") == std::string::npos && trim(s).size() == s.size();
    if (plain) return s;
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\', out += c;
        else if (c == '\n') out += "\\n";
        else if (c == '\r') out += "\\r";
        else out += c;
    }
    return out + "\"";
}

template <class Fail>
std::string unquote(std::string_view quoted, Fail&& fail) {
    std::string out;
    for (std::size_t i = 1; i + 1 < quoted.size(); ++i) {
        char c = quoted[i];
        if (c == '\\') {
            if (i + 2 >= quoted.size()) fail("a properly escaped quoted string");
            c = quoted[++i];
            c = c == 'n' ? '\n' : c == 'r' ? '\r' : c;
        } else if (c == '"') {
            fail("a properly escaped quoted string");
        }
        out += c;
    }
    return out;
}

/// The text of a line before an unquoted '#'.
inline std::string_view strip_comment(std::string_view line) {
    bool quoted = false;
    for (std::size_t i = 0; i < line.size(); ++i) {
        if (line[i] == '\\' && quoted) ++i;
        else if (line[i] == '"') quoted = !quoted;
        else if (line[i] == '#' && !quoted) return line.substr(0, i);
    }
    return line;
}

}  // namespace detail

template <class Struct>
std::string Field<Struct>::range_text() const {
    const bool has_lower = std::isfinite(lower), has_upper = std::isfinite(upper);
    if (has_lower && has_upper)
        return (lower_open ? "(" : "[") + detail::format_bound(lower) + ", " + detail::format_bound(upper) + (upper_open ? ")" : "]");
    if (has_lower) return (lower_open ? "> " : ">= ") + detail::format_bound(lower);
    if (has_upper) return (upper_open ? "< " : "<= ") + detail::format_bound(upper);
    return "";
}

/// The fields of `Section`, a public base class of `Struct`, as fields of `Struct`: keys, help,
/// ranges and choices unchanged. A program's config composes the sections its modules own (each a
/// struct with its own `fields()`) by deriving from them and listing their fields in its own:
///
///     struct RunConfig : LoopSection, ModelSection {
///         static const auto& fields() {
///             static const auto f = config::concat_fields(config::section_fields<RunConfig, LoopSection>(),
///                                                         config::section_fields<RunConfig, ModelSection>());
///             return f;
///         }
///     };
template <class Struct, class Section>
    requires std::derived_from<Struct, Section>
std::vector<Field<Struct>> section_fields() {
    std::vector<Field<Struct>> out;
    for (const Field<Section>& f : Section::fields()) {
        // A pointer to a member of the base is a pointer to the same member of the derived struct.
        auto member = std::visit([](auto m) { return typename Field<Struct>::Member(m); }, f.member);
        out.push_back(Field<Struct>{f.key, member, f.help, f.choices, f.lower, f.upper, f.lower_open, f.upper_open, f.path});
    }
    return out;
}

/// The lists one after the other (a composed config's fields, in the order it presents them).
template <class Struct, class... More>
std::vector<Field<Struct>> concat_fields(std::vector<Field<Struct>> first, const More&... more) {
    (first.insert(first.end(), more.begin(), more.end()), ...);
    return first;
}

/// The field with this key (dashes read as underscores; a key the struct lists in an optional
/// `static renamed_keys()`, pairs {old, new}, read as its new name, so checkpoints written before a
/// rename still load), or an error suggesting the closest key.
template <class Struct>
const Field<Struct>& find_field(std::string_view key, std::string_view source) {
    std::string normal(key);
    for (char& c : normal)
        if (c == '-') c = '_';
    if constexpr (requires { Struct::renamed_keys(); })
        for (const auto& [old_key, new_key] : Struct::renamed_keys())
            if (normal == old_key) normal = std::string(new_key);
    const Field<Struct>* best = nullptr;
    std::size_t best_distance = std::numeric_limits<std::size_t>::max();
    for (const auto& f : Struct::fields()) {
        if (f.key == normal) return f;
        const std::size_t d = detail::edit_distance(f.key, normal);
        if (d < best_distance) best_distance = d, best = &f;
    }
    std::string hint;
    if (best && best_distance <= std::max<std::size_t>(2, normal.size() / 3)) hint = " (did you mean '" + best->key + "'?)";
    throw config_error(olmax::detail::concat("config: unknown key '", key, "' in ", source, hint));
}

namespace detail {
template <class Struct>
std::string range_or_int64(const Field<Struct>& field) {
    const std::string range = field.range_text();
    return range.empty() ? "[-9223372036854775808, 9223372036854775807]" : range;
}
}  // namespace detail

/// Why `text` does not name what `kind` asks for, or "" when it does: what the `--key=PATH` flags
/// of a config check, for programs that take a path elsewhere (a positional argument). Never
/// throws: every file-system query takes an error code (a path under a file, a loop of links, a
/// missing permission are answers, not exceptions).
inline std::string path_problem(const std::string& text, PathKind kind) {
    namespace fs = std::filesystem;
    std::error_code ec;
    switch (kind) {
        case PathKind::none: return "";
        case PathKind::input:
        case PathKind::input_file: {
            if (text.empty()) return "";
            const fs::file_status status = fs::status(text, ec);
            if (!fs::exists(status)) {
                // ENOTDIR: a part of the path is a file, so nothing exists below it.
                const bool missing = !ec || ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory;
                return missing ? "does not exist" : "cannot be reached (" + ec.message() + ")";
            }
            if (kind == PathKind::input_file && fs::is_directory(status)) return "is a folder, expected a file";
            if (!fs::is_regular_file(status) && !(kind == PathKind::input && fs::is_directory(status)))
                return kind == PathKind::input ? "is neither a file nor a folder" : "is not a regular file";
            if (::access(text.c_str(), R_OK) != 0) return "is not readable";
            return "";
        }
        case PathKind::output_folder: {
            if (text.empty()) return "is empty, expected a folder";
            // The first part of the path that exists must be a folder we may write in.
            const fs::path path(text);
            for (fs::path at = path;; at = at.parent_path()) {
                const fs::path probe = at.empty() ? fs::path(".") : at;
                const fs::file_status status = fs::status(probe, ec);
                if (fs::exists(status)) {
                    if (!fs::is_directory(status))
                        return at == path ? "is a file, expected a folder" : "lies under " + probe.string() + ", which is a file, not a folder";
                    if (::access(probe.c_str(), W_OK | X_OK) != 0) return at == path ? "is not writable" : "cannot be created in " + probe.string() + " (not writable)";
                    return "";
                }
                if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory)
                    return "cannot be reached (" + ec.message() + ")";
                if (at.empty() || at == at.parent_path()) return "cannot be created";
            }
        }
    }
    return "";
}

/// Checks every field against its declared range and path kind (values set in code, or defaults,
/// never went through `set_value`); the first problem is a `config_error` naming the key.
template <class Struct>
void validate_fields(const Struct& config) {
    for (const auto& f : Struct::fields()) {
        std::visit(
            [&](auto member) {
                using V = std::remove_cvref_t<decltype(config.*member)>;
                if constexpr (std::is_same_v<V, std::int64_t> || std::is_same_v<V, double>) {
                    const double v = double(config.*member);
                    if (!std::isfinite(v) || !f.accepts(v))
                        throw config_error(olmax::detail::concat("config: key '", f.key, "' must be in ", f.range_text(), ", got ", config.*member));
                } else if constexpr (std::is_same_v<V, std::string>) {
                    const std::string problem = path_problem(config.*member, f.path);
                    if (!problem.empty())
                        throw config_error(olmax::detail::concat("config: key '", f.key, "': '", config.*member, "' ", problem));
                    if (!f.choices.empty() && std::find(f.choices.begin(), f.choices.end(), config.*member) == f.choices.end())
                        throw config_error(olmax::detail::concat("config: key '", f.key, "' has the unknown value '", config.*member, "'"));
                }
            },
            f.member);
    }
}

/// Sets one key from its text value and returns its field; errors name the key, the source and the
/// expected type.
template <class Struct>
const Field<Struct>& set_value(Struct& config, std::string_view key, std::string_view value, std::string_view source) {
    const Field<Struct>& field = find_field<Struct>(key, source);
    value = detail::trim(value);
    auto fail = [&](std::string_view expected) {
        throw config_error(olmax::detail::concat("config: key '", field.key, "' in ", source, " expects ", expected, ", got '", value, "'"));
    };
    std::visit(
        [&](auto member) {
            using V = std::remove_cvref_t<decltype(config.*member)>;
            if constexpr (std::is_same_v<V, std::int64_t>) {
                std::int64_t v = 0;
                const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
                if (ec != std::errc() || end != value.data() + value.size() || value.empty())
                    fail(ec == std::errc::result_out_of_range ? "an integer in " + detail::range_or_int64(field) : std::string("an integer"));
                if (!field.accepts(double(v))) fail("an integer in " + field.range_text());
                config.*member = v;
            } else if constexpr (std::is_same_v<V, double>) {
                const std::string text(value);
                char* end = nullptr;
                const double v = text.empty() ? 0.0 : std::strtod(text.c_str(), &end);
                // Decimal notation only: strtod also reads hexadecimal ("0x10" = 16) and "infinity".
                const bool decimal = text.find_first_not_of("0123456789+-.eE") == std::string::npos;
                if (text.empty() || !decimal || end != text.c_str() + text.size() || !std::isfinite(v)) fail("a finite number");
                if (!field.accepts(v)) fail("a number in " + field.range_text());
                config.*member = v;
            } else if constexpr (std::is_same_v<V, bool>) {
                if (value == "true" || value == "1" || value == "yes" || value == "on") config.*member = true;
                else if (value == "false" || value == "0" || value == "no" || value == "off") config.*member = false;
                else fail("true or false");
            } else {
                std::string text(value);
                if (text.size() >= 2 && text.front() == '"' && text.back() == '"') text = detail::unquote(value, fail);
                if (!field.choices.empty()) {
                    bool ok = false;
                    std::string list;
                    for (const auto& c : field.choices) ok |= (c == text), list += (list.empty() ? "" : ", ") + c;
                    if (!ok) fail("one of " + list);
                }
                config.*member = std::move(text);
            }
        },
        field.member);
    return field;
}

/// Reads `key = value` lines; '#' starts a comment; blank lines are skipped.
template <class Struct>
void load_file(Struct& config, const std::filesystem::path& path) {
    const std::string problem = path_problem(path.string(), PathKind::input_file);
    if (!problem.empty() || path.empty())
        throw config_error(olmax::detail::concat("config: config file '", path.string(), "' ", path.empty() ? "is empty, expected a file" : problem));
    std::ifstream in(path);
    if (!in.good()) throw config_error(olmax::detail::concat("config: cannot open config file ", path.string()));
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
        const std::string_view content = detail::trim(detail::strip_comment(line));
        if (content.empty()) continue;
        const std::string source = olmax::detail::concat(path.string(), ":", number);
        const auto eq = content.find('=');
        if (eq == std::string_view::npos)
            throw config_error(olmax::detail::concat("config: ", source, ": expected 'key = value', got '", content, "'"));
        set_value(config, detail::trim(content.substr(0, eq)), content.substr(eq + 1), source);
    }
}

/// Reads `key = value` text (as `to_text` writes it, e.g. from a checkpoint).
template <class Struct>
void load_text(Struct& config, std::string_view text, std::string_view source = "config text") {
    std::istringstream in{std::string(text)};
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
        const std::string_view content = detail::trim(detail::strip_comment(line));
        if (content.empty()) continue;
        const auto eq = content.find('=');
        const std::string where = olmax::detail::concat(source, ":", number);
        if (eq == std::string_view::npos) throw config_error(olmax::detail::concat("config: ", where, ": expected 'key = value'"));
        set_value(config, detail::trim(content.substr(0, eq)), content.substr(eq + 1), where);
    }
}

/// The resolved config as `key = value` lines (readable back by load_file / load_text).
template <class Struct>
std::string to_text(const Struct& config) {
    std::ostringstream out;
    for (const auto& f : Struct::fields()) {
        out << f.key << " = ";
        std::visit(
            [&](auto member) {
                using V = std::remove_cvref_t<decltype(config.*member)>;
                if constexpr (std::is_same_v<V, double>) out << detail::format_double(config.*member);
                else if constexpr (std::is_same_v<V, bool>) out << (config.*member ? "true" : "false");
                else if constexpr (std::is_same_v<V, std::string>) out << detail::quote_if_needed(config.*member);
                else out << config.*member;
            },
            f.member);
        out << '\n';
    }
    return out.str();
}

/// One line per key: name, default value, help.
template <class Struct>
std::string help_text(const Struct& defaults = Struct{}) {
    std::ostringstream out;
    std::istringstream values(to_text(defaults));
    std::string line;
    for (const auto& f : Struct::fields()) {
        std::getline(values, line);
        out << "  --" << std::left << std::setw(34) << (f.key + "=" + line.substr(f.key.size() + 3)) << ' ' << f.help;
        if (const std::string range = f.range_text(); !range.empty()) out << " " << range;
        if (!f.choices.empty()) {
            out << " (";
            for (std::size_t i = 0; i < f.choices.size(); ++i) out << (i ? "|" : "") << f.choices[i];
            out << ')';
        }
        out << '\n';
    }
    return out.str();
}

struct CommandLine {
    bool help = false;                      // --help or -h was given
    std::vector<std::string> positional;    // arguments that are not flags
    std::string config_file;                // --config=PATH, if any
    std::vector<std::string> keys;          // keys set by flags (dashes read as underscores), in order
};

/// Applies `--config=FILE` first (wherever it appears), then every `--key=value` / `--key value`
/// flag in order; a bare `--key` sets a bool key to true.
template <class Struct>
CommandLine parse_command_line(Struct& config, int argc, const char* const* argv) {
    CommandLine cl;
    std::vector<std::pair<std::string, std::string>> flags;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--help" || arg == "-h") {
            cl.help = true;
            continue;
        }
        if (!arg.starts_with("--")) {
            cl.positional.emplace_back(arg);
            continue;
        }
        const std::string_view body = arg.substr(2);
        const auto eq = body.find('=');
        std::string key(body.substr(0, eq)), value;
        if (eq != std::string_view::npos) {
            value = std::string(body.substr(eq + 1));
        } else if (key != "config" && std::holds_alternative<bool Struct::*>(find_field<Struct>(key, "the command line").member)) {
            value = "true";
        } else {
            if (i + 1 >= argc) throw config_error(olmax::detail::concat("config: flag --", key, " needs a value"));
            value = argv[++i];
        }
        if (key == "config") {
            if (value.empty()) throw config_error("config: flag --config needs a file name");
            cl.config_file = value;
        }
        else flags.emplace_back(std::move(key), std::move(value));
    }
    if (!cl.config_file.empty()) load_file(config, cl.config_file);
    for (const auto& [key, value] : flags) cl.keys.push_back(set_value(config, key, value, "the command line (--" + key + ")").key);
    return cl;
}

}  // namespace olmax::config
