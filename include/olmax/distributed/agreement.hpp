#pragma once
// Agreement between the ranks before they train together. Every rank must build the same model
// (parameter names, shapes and element types), make the same collectives in the same order with
// the same sizes, and apply the same optimiser to the same data. Ranks started with different
// settings otherwise crash inside the transport (Gloo aborts a process that receives a longer
// message than the buffer it posted, on Gloo's own thread, where nothing can catch it) or, worse,
// train apart without a word.
//
// So before the first collective whose size depends on those settings, every rank declares what
// must agree, as a `Fingerprint` (named entries in order), and `check_agreement` compares them:
//
//     dist::Fingerprint mine;
//     mine.add("features", c.features).add("steps", c.steps).add_parameters(optimizer.parameters());
//     dist::check_agreement(comm, mine);   // on every rank; throws disagreement_error on every rank
//
// Every message it exchanges has a size all ranks know before it is sent, so a disagreement can
// never reach a collective of mismatched sizes: rank 0's hash, byte length and entry count (a
// 24-byte broadcast) and the number of ranks whose own differ (an allreduce of one double). That
// is all when they agree. When some rank differs: rank 0's entries (of the length just
// broadcast), each rank's first differing entry (an allreduce of one double per rank), and that
// entry of the lowest rank among those that differ first (its length, then its text). Then every
// rank throws the same one-line `disagreement_error`, e.g.
//
//     ranks disagree on 'features': rank 0 has 64, rank 1 has 32 (1 of 2 ranks differs from rank 0; every rank must ...)
//
// Each collective waits at most `timeout` (the communicator's default when none is given).

#include <algorithm>
#include <array>
#include <charconv>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "olmax/core/error.hpp"
#include "olmax/core/shape.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/distributed/communicator.hpp"

namespace olmax::distributed {

/// The ranks declared different fingerprints. The message, the same on every rank, names the
/// first entry that differs and the values of rank 0 and of the lowest rank that differs there.
class disagreement_error : public distributed_error {
public:
    using distributed_error::distributed_error;
};

/// What the ranks must agree on: named text entries in the order they were added. Names are
/// unique. Numbers are written exactly (doubles in their shortest round-trip form), so equal
/// text means equal values.
class Fingerprint {
public:
    struct Entry {
        std::string name, value;
        bool operator==(const Entry&) const = default;
    };

    Fingerprint& add(std::string_view name, std::string_view value) {
        check(!name.empty(), "Fingerprint::add: an entry needs a name");
        check(names_.insert(std::string(name)).second, "Fingerprint::add: the entry '", name, "' was added twice");
        entries_.push_back({std::string(name), std::string(value)});
        return *this;
    }
    Fingerprint& add(std::string_view name, const char* value) { return add(name, std::string_view(value)); }
    Fingerprint& add(std::string_view name, const std::string& value) { return add(name, std::string_view(value)); }
    Fingerprint& add(std::string_view name, bool value) { return add(name, std::string_view(value ? "true" : "false")); }
    template <class V>
        requires(std::is_arithmetic_v<V> && !std::is_same_v<V, bool>)
    Fingerprint& add(std::string_view name, V value) {
        std::array<char, 64> text;
        const auto [end, ec] = std::to_chars(text.data(), text.data() + text.size(), value);
        check(ec == std::errc(), "Fingerprint::add: cannot write the value of '", name, "'");
        return add(name, std::string_view(text.data(), std::size_t(end - text.data())));
    }

    /// One entry per parameter, "parameter NAME" = "float32 [2, 64, 64]", from any list of named
    /// parameters (`nn::parameters(model)`, `AdamW::parameters()`): elements with `name` and `tensor`.
    template <class Named>
        requires requires(const Named& p) {
            p.name;
            p.tensor.shape();
        }
    Fingerprint& add_parameters(const std::vector<Named>& named) {
        for (const auto& p : named) {
            using T = typename std::remove_cvref_t<decltype(p.tensor)>::value_type;
            add("parameter " + std::string(p.name), olmax::detail::concat(dtype_name<T>(), " ", olmax::to_string(p.tensor.shape())));
        }
        return *this;
    }

    const std::vector<Entry>& entries() const { return entries_; }
    std::size_t size() const { return entries_.size(); }

    /// The entries as bytes: for each, its name's and value's lengths in decimal, each followed by
    /// ':' and the text ("8:features2:64"). `parse` reads it back.
    std::string serialize() const {
        std::string out;
        for (const auto& e : entries_)
            for (const std::string* text : {&e.name, &e.value}) out.append(std::to_string(text->size())).append(1, ':').append(*text);
        return out;
    }
    static Fingerprint parse(std::string_view bytes) {
        Fingerprint f;
        auto next = [&]() {
            const auto colon = bytes.find(':');
            std::size_t length = 0;
            const bool number = colon != std::string_view::npos && colon > 0 &&
                                std::from_chars(bytes.data(), bytes.data() + colon, length).ptr == bytes.data() + colon;
            check<distributed_error>(number && length <= bytes.size() - colon - 1, "Fingerprint::parse: malformed fingerprint bytes");
            std::string text(bytes.substr(colon + 1, length));
            bytes.remove_prefix(colon + 1 + length);
            return text;
        };
        while (!bytes.empty()) {
            std::string name = next();
            check<distributed_error>(!bytes.empty(), "Fingerprint::parse: malformed fingerprint bytes (an entry without a value)");
            f.add(name, next());
        }
        return f;
    }

    /// FNV-1a (64 bits) of `serialize()`.
    std::uint64_t hash() const {
        std::uint64_t h = 14695981039346656037ull;
        for (const unsigned char byte : serialize()) {
            h ^= byte;
            h *= 1099511628211ull;
        }
        return h;
    }

private:
    std::vector<Entry> entries_;
    std::unordered_set<std::string> names_;
};

namespace detail {

/// `text` on one line and of bounded length, for a message.
inline std::string printable(std::string_view text, std::size_t limit = 160) {
    std::string out;
    for (const char c : text.substr(0, limit)) {
        if (c == '\n') out += "\\n";
        else if (c == '\r') out += "\\r";
        else if (c == '\t') out += "\\t";
        else if (static_cast<unsigned char>(c) < 0x20) out += '?';
        else out += c;
    }
    if (text.size() > limit) out += "...";
    return out.empty() ? std::string("''") : out;
}

/// Index of the first entry where `a` and `b` differ (an entry one has and the other lacks
/// counts), or none.
inline std::optional<std::size_t> first_difference(const Fingerprint& a, const Fingerprint& b) {
    const std::size_t common = std::min(a.size(), b.size());
    for (std::size_t i = 0; i < common; ++i)
        if (!(a.entries()[i] == b.entries()[i])) return i;
    if (a.size() != b.size()) return common;
    return std::nullopt;
}

/// The one line every rank throws: the first differing entry, rank 0's and rank `other`'s side.
inline std::string disagreement_message(const Fingerprint& reference, std::size_t index, int other,
                                        const std::optional<Fingerprint::Entry>& theirs, std::size_t their_size, int differing, int world) {
    const Fingerprint::Entry* ours = index < reference.size() ? &reference.entries()[index] : nullptr;
    std::string what;
    if (ours && theirs && ours->name == theirs->name) {
        what = olmax::detail::concat("ranks disagree on '", printable(ours->name), "': rank 0 has ", printable(ours->value), ", rank ", other,
                                     " has ", printable(theirs->value));
    } else if (ours && theirs) {
        what = olmax::detail::concat("ranks disagree at entry ", index + 1, " of what must agree: rank 0 has '", printable(ours->name),
                                     "' = ", printable(ours->value), ", rank ", other, " has '", printable(theirs->name), "' = ",
                                     printable(theirs->value));
    } else if (ours) {
        what = olmax::detail::concat("ranks disagree on '", printable(ours->name), "': rank 0 has ", printable(ours->value), ", rank ", other,
                                     " has no such entry (it declares ", their_size, " entries, rank 0 ", reference.size(), ")");
    } else if (theirs) {
        what = olmax::detail::concat("ranks disagree on '", printable(theirs->name), "': rank ", other, " has ", printable(theirs->value),
                                     ", rank 0 has no such entry (it declares ", reference.size(), " entries, rank ", other, " ",
                                     their_size, ")");
    } else {
        what = "ranks disagree: their fingerprints hash differently but list the same entries";
    }
    return olmax::detail::concat(what, " (", differing, " of ", world, world == 1 ? " rank" : " ranks", differing == 1 ? " differs" : " differ",
                                 " from rank 0; every rank must run the same program with the same settings)");
}

}  // namespace detail

/// Compares `mine` with every other rank's fingerprint (see the top of this header). Returns when
/// all are equal; otherwise throws `disagreement_error`, the same message on every rank. Every rank
/// must call it at the same point, before the first collective whose sizes depend on what it
/// checks. A failure of the collectives themselves is a `distributed_error` as usual.
inline void check_agreement(Communicator& comm, const Fingerprint& mine, std::optional<Timeout> timeout = {}) {
    const int world = comm.world_size(), rank = comm.rank();
    if (world == 1) return;
    const std::string bytes = mine.serialize();
    const std::array<std::uint64_t, 3> own{mine.hash(), bytes.size(), mine.size()};
    // 1. Rank 0's summary, and how many ranks differ from it: fixed sizes.
    std::array<std::uint64_t, 3> summary = own;
    comm.broadcast(std::span<std::uint64_t>(summary), 0, timeout);
    double differing = summary == own ? 0.0 : 1.0;
    comm.allreduce(std::span<double>(&differing, 1), Reduction::sum, timeout);
    if (differing == 0) return;

    // 2. Rank 0's entries (of the length everyone now knows), and each rank's first difference.
    std::string reference_bytes = rank == 0 ? bytes : std::string(std::size_t(summary[1]), '\0');
    comm.broadcast(std::span<char>(reference_bytes), 0, timeout);
    const Fingerprint reference = rank == 0 ? mine : Fingerprint::parse(reference_bytes);
    std::vector<double> first(std::size_t(world), 0.0);  // entry index + 1 where a rank first differs, 0: it agrees
    if (const auto i = detail::first_difference(reference, mine)) first[std::size_t(rank)] = double(*i + 1);
    comm.allreduce(std::span<double>(first), Reduction::sum, timeout);
    int other = -1;
    for (int r = 0; r < world; ++r)
        if (first[std::size_t(r)] > 0 && (other < 0 || first[std::size_t(r)] < first[std::size_t(other)])) other = r;
    if (other < 0)  // only the hashes differ (cannot happen for equal entries): nothing to point at
        throw disagreement_error(detail::disagreement_message(reference, reference.size(), 0, std::nullopt, 0, int(differing), world));
    const std::size_t index = std::size_t(first[std::size_t(other)]) - 1;

    // 3. That rank's entry there (its length first), so that every rank can print both sides.
    std::string theirs_bytes;
    std::array<std::uint64_t, 3> theirs_summary{0, 0, mine.size()};  // entry bytes, has the entry, entry count
    if (rank == other && index < mine.size()) {
        Fingerprint one;
        one.add(mine.entries()[index].name, mine.entries()[index].value);
        theirs_bytes = one.serialize();
        theirs_summary = {theirs_bytes.size(), 1, mine.size()};
    }
    comm.broadcast(std::span<std::uint64_t>(theirs_summary), other, timeout);
    theirs_bytes.resize(std::size_t(theirs_summary[0]));
    comm.broadcast(std::span<char>(theirs_bytes), other, timeout);
    std::optional<Fingerprint::Entry> theirs;
    if (theirs_summary[1] != 0) theirs = Fingerprint::parse(theirs_bytes).entries().at(0);
    throw disagreement_error(
        detail::disagreement_message(reference, index, other, theirs, std::size_t(theirs_summary[2]), int(differing), world));
}

}  // namespace olmax::distributed
