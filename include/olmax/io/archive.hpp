#pragma once
// A small binary container of named tensors and texts with a format version and a CRC-32, and
// crash-safe file replacement. File layout (all integers little-endian):
//     "OLMAXCKP"  u32 format_version  u64 payload_bytes  u32 crc32(payload)  payload
//     payload = u64 entry_count, then per entry:
//               u32 name_bytes, name, u8 kind, u32 rank, u64 extent[rank], u64 data_bytes, data
// Element data is stored little-endian whatever the machine, so files move between machines.
// Kinds: 1 float32, 2 float64, 3 int64, 4 text, 5 bfloat16 (its 16 bits; added within format
// version 1: older readers refuse such an entry as an unknown kind, files without one are unchanged).

#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <algorithm>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "olmax/core/core.hpp"

namespace olmax::io {

/// A file is not a valid olmax archive: wrong magic or version, truncated, or checksum mismatch.
class format_error : public value_error {
public:
    using value_error::value_error;
};

inline constexpr std::uint32_t archive_format_version = 1;
inline constexpr std::string_view archive_magic = "OLMAXCKP";

/// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320, as zlib's crc32 and PNG use).
inline std::uint32_t crc32(std::string_view bytes, std::uint32_t crc = 0) {
    static const auto table = [] {
        std::array<std::uint32_t, 256> t{};
        for (std::uint32_t i = 0; i < 256; ++i) {
            std::uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            t[i] = c;
        }
        return t;
    }();
    crc = ~crc;
    for (char ch : bytes) crc = table[(crc ^ static_cast<std::uint8_t>(ch)) & 0xFFu] ^ (crc >> 8);
    return ~crc;
}

enum class EntryKind : std::uint8_t { float32 = 1, float64 = 2, int64 = 3, text = 4, bfloat16 = 5 };

namespace detail {

template <class T>
constexpr EntryKind kind_of() {
    if constexpr (std::is_same_v<T, float>) return EntryKind::float32;
    else if constexpr (std::is_same_v<T, double>) return EntryKind::float64;
    else if constexpr (std::is_same_v<T, bfloat16>) return EntryKind::bfloat16;
    else {
        static_assert(std::is_same_v<T, std::int64_t>, "olmax::io::Archive stores float, double, bfloat16 and int64 tensors");
        return EntryKind::int64;
    }
}

inline std::string_view kind_name(EntryKind kind) {
    switch (kind) {
        case EntryKind::float32: return "float32";
        case EntryKind::float64: return "float64";
        case EntryKind::int64: return "int64";
        case EntryKind::text: return "text";
        case EntryKind::bfloat16: return "bfloat16";
    }
    return "unknown";
}

inline void put_uint(std::string& out, std::uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFFu));
}

/// Reads little-endian fields from a byte range, throwing `format_error` past its end.
class Reader {
public:
    Reader(std::string_view bytes, std::string_view source) : bytes_(bytes), source_(source) {}
    std::uint64_t uint(int count) {
        need(std::size_t(count), "an integer");
        std::uint64_t v = 0;
        for (int i = 0; i < count; ++i) v |= std::uint64_t(static_cast<std::uint8_t>(bytes_[pos_ + std::size_t(i)])) << (8 * i);
        pos_ += std::size_t(count);
        return v;
    }
    std::string_view take(std::uint64_t count, std::string_view what) {
        need(count, what);
        auto out = bytes_.substr(pos_, std::size_t(count));
        pos_ += std::size_t(count);
        return out;
    }
    bool done() const { return pos_ == bytes_.size(); }

private:
    void need(std::uint64_t count, std::string_view what) {
        if (count > bytes_.size() - pos_)
            throw format_error(olmax::detail::concat("olmax archive ", source_, ": truncated while reading ", what, " at byte ", pos_));
    }
    std::string_view bytes_;
    std::string_view source_;
    std::size_t pos_ = 0;
};

}  // namespace detail

/// Named tensors (float32, float64, bfloat16, int64) and texts, in insertion order.
class Archive {
public:
    struct Entry {
        EntryKind kind = EntryKind::text;
        Shape shape;
        std::string data;  // little-endian elements, or the text
    };

    template <Scalar T>
    void put(const std::string& name, const Tensor<T>& tensor) {
        constexpr EntryKind kind = detail::kind_of<T>();
        Entry e{kind, tensor.shape(), {}};
        e.data.reserve(tensor.size() * sizeof(T));
        for (T v : tensor) {
            if constexpr (std::is_same_v<T, float>) detail::put_uint(e.data, std::bit_cast<std::uint32_t>(v), 4);
            else if constexpr (std::is_same_v<T, bfloat16>) detail::put_uint(e.data, v.bits(), 2);
            else detail::put_uint(e.data, std::bit_cast<std::uint64_t>(v), 8);
        }
        insert(name, std::move(e));
    }
    void put_text(const std::string& name, std::string text) { insert(name, Entry{EntryKind::text, {}, std::move(text)}); }
    void put_int(const std::string& name, std::int64_t value) { put(name, Tensor<std::int64_t>::scalar(value)); }

    bool contains(const std::string& name) const { return index_.count(name) != 0; }
    const std::vector<std::string>& names() const { return order_; }
    const Entry& entry(const std::string& name) const {
        auto it = index_.find(name);
        check(it != index_.end(), "olmax archive: no entry '", name, "'");
        return entries_[it->second];
    }

    template <Scalar T>
    Tensor<T> get(const std::string& name) const {
        const Entry& e = entry(name);
        constexpr EntryKind kind = detail::kind_of<T>();
        check(e.kind == kind, "olmax archive: entry '", name, "' holds ", detail::kind_name(e.kind), ", not ", detail::kind_name(kind));
        auto t = Tensor<T>::uninitialized(e.shape);
        check<format_error>(e.data.size() == t.size() * sizeof(T), "olmax archive: entry '", name, "' has ", e.data.size(),
                            " data bytes for shape ", olmax::to_string(e.shape));
        detail::Reader r(e.data, name);
        for (T& v : t) {
            if constexpr (std::is_same_v<T, float>) v = std::bit_cast<float>(static_cast<std::uint32_t>(r.uint(4)));
            else if constexpr (std::is_same_v<T, bfloat16>) v = bfloat16::from_bits(static_cast<std::uint16_t>(r.uint(2)));
            else v = std::bit_cast<T>(r.uint(8));
        }
        return t;
    }
    const std::string& text(const std::string& name) const {
        const Entry& e = entry(name);
        check(e.kind == EntryKind::text, "olmax archive: entry '", name, "' is ", detail::kind_name(e.kind), ", not text");
        return e.data;
    }
    std::int64_t integer(const std::string& name) const { return get<std::int64_t>(name).item(); }

    std::string serialize() const {
        std::string payload;
        detail::put_uint(payload, order_.size(), 8);
        for (const auto& name : order_) {
            const Entry& e = entries_[index_.at(name)];
            detail::put_uint(payload, name.size(), 4);
            payload += name;
            detail::put_uint(payload, static_cast<std::uint8_t>(e.kind), 1);
            detail::put_uint(payload, e.shape.size(), 4);
            for (std::size_t d : e.shape) detail::put_uint(payload, d, 8);
            detail::put_uint(payload, e.data.size(), 8);
            payload += e.data;
        }
        std::string out(archive_magic);
        detail::put_uint(out, archive_format_version, 4);
        detail::put_uint(out, payload.size(), 8);
        detail::put_uint(out, crc32(payload), 4);
        return out + payload;
    }

    /// Parses bytes made by `serialize`; `source` names the file in error messages.
    static Archive deserialize(std::string_view bytes, std::string_view source = "(memory)") {
        detail::Reader header(bytes, source);
        if (header.take(archive_magic.size(), "the magic") != archive_magic)
            throw format_error(olmax::detail::concat("olmax archive ", source, ": not an olmax checkpoint (bad magic)"));
        const auto version = header.uint(4);
        if (version != archive_format_version)
            throw format_error(olmax::detail::concat("olmax archive ", source, ": format version ", version, ", this build reads version ",
                                                     archive_format_version));
        const auto payload_bytes = header.uint(8);
        const auto expected_crc = static_cast<std::uint32_t>(header.uint(4));
        const std::string_view payload = header.take(payload_bytes, "the payload");
        if (!header.done())
            throw format_error(olmax::detail::concat("olmax archive ", source, ": ", bytes.size() - 24 - payload_bytes,
                                                     " unexpected bytes after the payload"));
        if (crc32(payload) != expected_crc)
            throw format_error(olmax::detail::concat("olmax archive ", source, ": checksum mismatch (file is corrupt)"));
        detail::Reader r(payload, source);
        Archive archive;
        const auto count = r.uint(8);
        for (std::uint64_t i = 0; i < count; ++i) {
            const std::string name(r.take(r.uint(4), "an entry name"));
            Entry e;
            const auto kind = r.uint(1);
            if (kind < 1 || kind > 5) throw format_error(olmax::detail::concat("olmax archive ", source, ": entry '", name, "' has unknown kind ", kind));
            e.kind = static_cast<EntryKind>(kind);
            const auto rank = r.uint(4);
            if (rank > 16) throw format_error(olmax::detail::concat("olmax archive ", source, ": entry '", name, "' has rank ", rank));
            for (std::uint64_t d = 0; d < rank; ++d) e.shape.push_back(std::size_t(r.uint(8)));
            e.data = std::string(r.take(r.uint(8), "entry data"));
            if (archive.contains(name)) throw format_error(olmax::detail::concat("olmax archive ", source, ": entry '", name, "' appears twice"));
            archive.insert(name, std::move(e));
        }
        if (!r.done()) throw format_error(olmax::detail::concat("olmax archive ", source, ": trailing bytes in the payload"));
        return archive;
    }

private:
    void insert(const std::string& name, Entry e) {
        check(!name.empty(), "olmax archive: empty entry name");
        auto it = index_.find(name);
        if (it != index_.end()) {
            entries_[it->second] = std::move(e);
            return;
        }
        index_[name] = entries_.size();
        entries_.push_back(std::move(e));
        order_.push_back(name);
    }

    std::vector<Entry> entries_;
    std::map<std::string, std::size_t> index_;
    std::vector<std::string> order_;
};

namespace detail {

inline void throw_errno(std::string_view what, const std::filesystem::path& path) {
    throw value_error(olmax::detail::concat(what, " ", path.string(), ": ", std::strerror(errno)));
}

inline void fsync_directory(const std::filesystem::path& dir) {
    const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd < 0) throw_errno("fsync: cannot open folder", dir);
    const int rc = ::fsync(fd);
    ::close(fd);
    if (rc != 0) throw_errno("fsync: cannot sync folder", dir);
}

}  // namespace detail

/// Replaces `path` with `bytes` so that a crash at any moment leaves either the old file or the
/// new one, never a mix: write a temporary file in the same folder, fsync it, rename it over
/// `path` (atomic on POSIX), fsync the folder. `simulate_crash_after_bytes` (tests only) stops
/// after that many bytes and throws, leaving the temporary file behind as a real crash would.
inline void write_file_atomically(const std::filesystem::path& path, std::string_view bytes,
                                  std::size_t simulate_crash_after_bytes = std::numeric_limits<std::size_t>::max()) {
    namespace fs = std::filesystem;
    const fs::path dir = path.parent_path();
    static std::atomic<std::uint64_t> counter{0};
    const fs::path temp = dir / olmax::detail::concat(".", path.filename().string(), ".tmp-", ::getpid(), "-", ++counter);
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) detail::throw_errno("write_file_atomically: cannot create", temp);
    std::size_t written = 0;
    const std::size_t limit = std::min(bytes.size(), simulate_crash_after_bytes);
    while (written < limit) {
        const ssize_t n = ::write(fd, bytes.data() + written, limit - written);
        if (n < 0) {
            if (errno == EINTR) continue;
            const int saved = errno;
            ::close(fd);
            ::unlink(temp.c_str());
            errno = saved;
            detail::throw_errno("write_file_atomically: cannot write", temp);
        }
        written += std::size_t(n);
    }
    if (written < bytes.size()) {
        ::close(fd);
        throw value_error(olmax::detail::concat("write_file_atomically: simulated crash after ", written, " of ", bytes.size(),
                                                " bytes of ", path.string()));
    }
    if (::fsync(fd) != 0) {
        ::close(fd);
        ::unlink(temp.c_str());
        detail::throw_errno("write_file_atomically: cannot fsync", temp);
    }
    ::close(fd);
    if (::rename(temp.c_str(), path.c_str()) != 0) {
        ::unlink(temp.c_str());
        detail::throw_errno("write_file_atomically: cannot rename onto", path);
    }
    detail::fsync_directory(dir);
}

inline void save_archive(const std::filesystem::path& path, const Archive& archive) { write_file_atomically(path, archive.serialize()); }

inline Archive load_archive(const std::filesystem::path& path) {
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    check(std::filesystem::exists(status), "load_archive: ", path.string(), " does not exist");
    check(std::filesystem::is_regular_file(status), "load_archive: ", path.string(),
          std::filesystem::is_directory(status) ? " is a folder, expected a checkpoint file" : " is not a regular file");
    std::ifstream in(path, std::ios::binary);
    check(in.good(), "load_archive: cannot open ", path.string());
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return Archive::deserialize(bytes, path.string());
}

}  // namespace olmax::io
