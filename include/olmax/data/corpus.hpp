#pragma once
// Reading a text corpus: `--data PATH` takes a file or a folder, and anything ordinary must train.
//
// What is read
// - A folder is read recursively in sorted path order, so the corpus is the same on every machine.
//   Symbolic links are followed; a file or folder reached a second time (a link to something already
//   read, or a link back to an enclosing folder, which would otherwise recurse forever) is read
//   once. Names starting with "." (.git, .DS_Store) are left out: they are tooling, not text.
// - Binary files (a NUL byte or over 5% control characters in the first 8 KiB; UTF-16) are
//   skipped. Every file or folder not read is recorded with the reason in `Corpus::skipped`, and
//   remarks about files that were read go to `Corpus::notices`; `Corpus::report()` turns both into
//   lines for the program to print, so nothing is dropped silently.
// - Each text file is cut into documents (`DocumentSplit`), automatically by its form:
//   * JSON Lines: a `.jsonl`/`.ndjson` file, or one whose first non-empty line and at least half of
//     its non-empty lines start with "{": one document per line, the line's top-level "text"
//     string. Lines that are not JSON objects or lack a "text" string are skipped and counted in a
//     notice; a `.jsonl` file in which no line works is an error naming its first problem (a file
//     only detected by content is then read as plain text, with a notice).
//   * fortune(6) files: documents separated by lines holding only "%".
//   * anything else: the whole file is one document (a book).
// - CRLF line ends become LF in every format (and a leading UTF-8 byte-order mark is dropped), so
//   the same text with Windows line ends gives the same documents.
// - The corpus is capped (default 4 GiB, `max_bytes`): it is held in memory, and a clear error beats
//   std::bad_alloc or the OOM killer.
//
// The default corpus is the Debian package `fortunes` (about 2.4 MB of quotations and jokes in
// /usr/share/games/fortunes, one document per fortune): real text, present without network once
// the package is installed.

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <new>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "olmax/core/core.hpp"
#include "olmax/data/detail/json_text.hpp"
#include "olmax/data/shuffle.hpp"
#include "olmax/data/tokenizer.hpp"

namespace olmax::data {

/// How a file is cut into documents.
enum class DocumentSplit {
    automatic,      // json_lines, percent_lines or whole_file by the file's form (see the top of this file)
    whole_file,     // one document per file
    percent_lines,  // fortune(6) format: documents separated by lines holding only "%"
    blank_lines,    // paragraphs separated by one or more empty lines
    json_lines,     // one JSON object per line, its "text" string is the document
};

/// A file or folder that was not read, and why.
struct SkippedFile {
    std::string path;
    std::string reason;  // one fixed phrase per kind of reason, so that report() can group them
};

/// Documents as token (byte) sequences, plus where they came from.
struct Corpus {
    std::vector<std::vector<std::uint8_t>> documents;
    std::vector<std::string> files;     // files read, in order
    std::vector<SkippedFile> skipped;   // files and folders left out (binary, unreadable, duplicate links, ...)
    std::vector<std::string> notices;   // remarks on files that were read (JSON Lines lines skipped, ...)

    std::size_t total_bytes() const {
        std::size_t n = 0;
        for (const auto& d : documents) n += d.size();
        return n;
    }

    /// Lines for the user: each notice, then the skipped paths grouped by reason with up to
    /// `examples` paths named per group (the default corpus alone has 43 binary index files).
    std::vector<std::string> report(std::size_t examples = 3) const {
        std::vector<std::string> lines(notices);
        std::vector<std::string> order;
        std::map<std::string, std::vector<std::string>> by_reason;
        for (const auto& s : skipped) {
            auto& paths = by_reason[s.reason];
            if (paths.empty()) order.push_back(s.reason);
            paths.push_back(s.path);
        }
        for (const auto& reason : order) {
            const auto& paths = by_reason[reason];
            std::string line = paths.size() == 1 ? "skipped " + paths[0] + ": " + reason
                                                 : "skipped " + std::to_string(paths.size()) + " paths, " + reason + ": ";
            if (paths.size() > 1) {
                for (std::size_t i = 0; i < paths.size() && i < examples; ++i) line += (i ? ", " : "") + paths[i];
                if (paths.size() > examples) line += " and " + std::to_string(paths.size() - examples) + " more";
            }
            lines.push_back(std::move(line));
        }
        return lines;
    }
};

/// The most bytes read_corpus reads by default: the corpus is held in memory (and copied once more
/// by split_documents), so a larger one is refused with a message instead of exhausting memory.
inline constexpr std::uintmax_t default_max_corpus_bytes = std::uintmax_t(4) << 30;

/// Where the default corpus lives (Debian package `fortunes`).
inline std::filesystem::path default_corpus_path() {
    const std::filesystem::path path = "/usr/share/games/fortunes";
    std::error_code ec;
    check(std::filesystem::is_directory(path, ec), "default corpus: ", path.string(),
          " not found; install it with `apt-get install fortunes` (Debian/Ubuntu) or pass --data=PATH to a text file or folder");
    return path;
}

namespace detail {

namespace fs = std::filesystem;

/// How many leading bytes decide whether a file is text.
inline constexpr std::size_t sniff_bytes = 8192;

/// Why `prefix` (a file's first bytes) is not text, or "" when it is. NUL bytes mark binary files
/// (fortune's .dat indexes, images, archives); compressed data has few NULs but about 10% bytes
/// below 0x20 other than tab/newline/CR/FF/VT/ESC, where text has almost none.
inline std::string binary_reason(std::string_view prefix) {
    if (prefix.starts_with("\xFF\xFE") || prefix.starts_with("\xFE\xFF")) return "UTF-16 text (convert it to UTF-8)";
    if (prefix.find('\0') != std::string_view::npos) return "binary (NUL bytes)";
    std::size_t control = 0;
    for (const char ch : prefix) {
        const auto c = static_cast<unsigned char>(ch);
        if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v' && c != 0x1B) || c == 0x7F) ++control;
    }
    if (control * 20 > prefix.size()) return "binary (control characters)";
    return "";
}

/// CRLF -> LF in place (a lone CR stays): documents must not end lines with "\r".
inline void normalize_newlines(std::string& text) {
    if (text.find("\r\n") == std::string::npos) return;
    std::size_t out = 0;
    for (std::size_t i = 0; i < text.size(); ++i)
        if (!(text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n')) text[out++] = text[i];
    text.resize(out);
}

inline void add_document(Corpus& corpus, std::string_view text) {
    // Trim surrounding blank lines; an empty document would only add a lone separator.
    const auto first = text.find_first_not_of("\r\n");
    if (first == std::string_view::npos) return;
    const auto last = text.find_last_not_of("\r\n");
    auto tokens = ByteTokenizer::encode(text.substr(first, last - first + 1));
    if (!tokens.empty()) corpus.documents.push_back(std::move(tokens));
}

inline bool has_percent_line(std::string_view content) {
    return content == "%" || content.starts_with("%\n") || content.find("\n%\n") != std::string_view::npos ||
           content.ends_with("\n%");
}

/// Calls f(line_number, line) for every line (without its "\n"); line numbers start at 1.
template <class F>
void for_each_line(std::string_view content, F&& f) {
    std::size_t pos = 0, number = 1;
    while (pos < content.size()) {
        const std::size_t end = std::min(content.find('\n', pos), content.size());
        f(number++, content.substr(pos, end - pos));
        pos = end + 1;
    }
}

inline std::string_view trim_spaces(std::string_view s) {
    const auto first = s.find_first_not_of(" \t\r\f\v");
    if (first == std::string_view::npos) return {};
    return s.substr(first, s.find_last_not_of(" \t\r\f\v") - first + 1);
}

inline bool has_json_lines_extension(const fs::path& file) {
    std::string ext = file.extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return char(c >= 'A' && c <= 'Z' ? c + 32 : c); });
    return ext == ".jsonl" || ext == ".ndjson";
}

/// JSON Lines by content: the first non-empty line and at least half of them start with "{"
/// (a few broken lines must be counted as skipped, not turn the file into plain text).
inline bool looks_like_json_lines(std::string_view content) {
    std::size_t lines = 0, objects = 0;
    bool first_is_object = false;
    for_each_line(content, [&](std::size_t, std::string_view line) {
        line = trim_spaces(line);
        if (line.empty()) return;
        if (lines == 0) first_is_object = line.front() == '{';
        ++lines;
        if (line.front() == '{') ++objects;
    });
    return first_is_object && objects * 2 >= lines;
}

/// One document per line's "text". Returns false (adding nothing) when no line works and the form
/// was only guessed from the content; throws when the file was declared JSON Lines.
inline bool read_json_lines(Corpus& corpus, const fs::path& file, std::string_view content, bool declared) {
    std::size_t lines = 0, usable = 0;
    std::string first_problem;
    Corpus staged;
    for_each_line(content, [&](std::size_t number, std::string_view line) {
        if (trim_spaces(line).empty()) return;  // blank lines separate nothing and lose nothing
        ++lines;
        auto field = json_text_field(line);
        if (field.status != JsonTextField::Status::ok) {
            if (first_problem.empty()) first_problem = "line " + std::to_string(number) + ": " + field.problem;
            return;
        }
        ++usable;
        normalize_newlines(field.text);
        add_document(staged, field.text);  // an empty "text" adds nothing, like an empty file
    });
    if (usable == 0 && lines > 0) {
        check(!declared, "read_corpus: ", file.string(), ": no line is a JSON object with a \"text\" string (", first_problem, ")");
        corpus.notices.push_back(file.string() + ": looks like JSON Lines but no line is a JSON object with a \"text\" string (" +
                                 first_problem + "); read as plain text");
        return false;
    }
    if (usable < lines)
        corpus.notices.push_back(file.string() + ": skipped " + std::to_string(lines - usable) + " of " + std::to_string(lines) +
                                 " JSON Lines lines without a \"text\" string (first: " + first_problem + ")");
    for (auto& d : staged.documents) corpus.documents.push_back(std::move(d));
    return true;
}

/// Cuts one file's (normalised) text into documents.
inline void split_into(Corpus& corpus, std::string_view content, DocumentSplit split) {
    if (split == DocumentSplit::automatic) split = has_percent_line(content) ? DocumentSplit::percent_lines : DocumentSplit::whole_file;
    if (split == DocumentSplit::whole_file) {
        add_document(corpus, content);
        return;
    }
    std::size_t start = 0, pos = 0;
    while (pos <= content.size()) {
        const std::size_t end = std::min(content.find('\n', pos), content.size());
        const std::string_view line = content.substr(pos, end - pos);
        const bool separator = split == DocumentSplit::percent_lines ? (line == "%" || line == "%\r")
                                                                     : line.find_first_not_of(" \t\r") == std::string_view::npos;
        if (separator) {
            add_document(corpus, content.substr(start, pos - start));
            start = std::min(end + 1, content.size());
        }
        if (end == content.size()) break;
        pos = end + 1;
    }
    add_document(corpus, content.substr(start));
}

/// Normalises a file's text and cuts it into documents by `split` (automatic: by its form).
inline void add_file(Corpus& corpus, const fs::path& file, std::string& content, DocumentSplit split) {
    if (content.starts_with("\xEF\xBB\xBF")) content.erase(0, 3);  // UTF-8 byte-order mark
    normalize_newlines(content);
    const bool declared = split == DocumentSplit::json_lines || (split == DocumentSplit::automatic && has_json_lines_extension(file));
    if (declared || (split == DocumentSplit::automatic && looks_like_json_lines(content))) {
        if (read_json_lines(corpus, file, content, declared)) return;
    }
    split_into(corpus, content, split == DocumentSplit::json_lines ? DocumentSplit::automatic : split);
}

inline std::string errno_text(int error) {
    return error ? std::generic_category().message(error) : std::string("unknown error");
}

/// Reads a text file into `content`, or records why not and returns false. `budget` is what is
/// left of the corpus size limit.
inline bool read_text_file(Corpus& corpus, const fs::path& file, std::uintmax_t& budget, std::uintmax_t limit, std::string& content) {
    errno = 0;
    std::ifstream in(file, std::ios::binary);
    if (!in) {
        corpus.skipped.push_back({file.string(), "cannot open (" + errno_text(errno) + ")"});
        return false;
    }
    // Look at the start before reading the rest: a folder may hold large binaries.
    content.assign(sniff_bytes, '\0');
    in.read(content.data(), std::streamsize(sniff_bytes));
    content.resize(std::size_t(in.gcount()));
    if (in.bad()) {
        corpus.skipped.push_back({file.string(), "read error"});
        return false;
    }
    if (auto why = binary_reason(content); !why.empty()) {
        corpus.skipped.push_back({file.string(), why});
        return false;
    }
    auto too_large = [&](std::uintmax_t size) {
        return olmax::detail::concat("read_corpus: the corpus would exceed its limit of ", limit, " bytes at ", file.string(), " (", size,
                              " bytes); read a smaller file or folder, or raise max_bytes");
    };
    std::error_code ec;
    const std::uintmax_t size = fs::file_size(file, ec);
    if (!ec && size > budget) throw value_error(too_large(size));
    try {
        if (!ec) content.reserve(std::size_t(size));
        char buffer[1 << 16];
        while (in) {
            in.read(buffer, sizeof buffer);
            content.append(buffer, std::size_t(in.gcount()));
            if (content.size() > budget) throw value_error(too_large(content.size()));  // grew while read, or size unknown
        }
    } catch (const std::bad_alloc&) {
        throw value_error(olmax::detail::concat("read_corpus: out of memory reading ", file.string(), " (", ec ? 0 : size, " bytes)"));
    }
    if (in.bad()) {
        corpus.skipped.push_back({file.string(), "read error"});
        return false;
    }
    budget -= content.size();
    return true;
}

/// Whether `inner` is `outer` or lies inside it (both canonical).
inline bool is_within(const fs::path& inner, const fs::path& outer) {
    auto i = inner.begin();
    for (auto o = outer.begin(); o != outer.end(); ++o, ++i)
        if (i == inner.end() || *i != *o) return false;
    return true;
}

struct FoundFile {
    fs::path path;       // as reached from the root (what is reported)
    fs::path canonical;  // what identifies the file when links reach it twice
};

/// Every regular file under `root`, through symbolic links, each folder entered once (a set of
/// canonical folders: a link back up is a loop, a second link to a folder a duplicate). Walks
/// with an explicit stack and error_code overloads only, so odd trees give records, not throws.
inline std::vector<FoundFile> list_files(Corpus& corpus, const fs::path& root) {
    std::error_code ec;
    fs::path root_canonical = fs::canonical(root, ec);
    check(!ec, "read_corpus: cannot resolve ", root.string(), ": ", ec.message());
    std::set<fs::path> entered{root_canonical};
    std::vector<std::pair<fs::path, fs::path>> stack{{root, root_canonical}};
    std::vector<FoundFile> files;
    while (!stack.empty()) {
        const auto [dir, dir_canonical] = std::move(stack.back());
        stack.pop_back();
        fs::directory_iterator it(dir, ec);
        if (ec) {
            check(dir != root, "read_corpus: cannot read the folder ", root.string(), ": ", ec.message());
            corpus.skipped.push_back({dir.string(), "cannot read folder (" + ec.message() + ")"});
            continue;
        }
        std::vector<fs::path> entries;
        for (; !ec && it != fs::directory_iterator(); it.increment(ec)) entries.push_back(it->path());
        if (ec) corpus.skipped.push_back({dir.string(), "folder listed only in part (" + ec.message() + ")"});
        std::sort(entries.begin(), entries.end());
        std::vector<std::pair<fs::path, fs::path>> subfolders;
        for (const auto& entry : entries) {
            if (entry.filename().string().starts_with(".")) {
                corpus.skipped.push_back({entry.string(), "hidden (name starts with \".\")"});
                continue;
            }
            const fs::file_status status = fs::status(entry, ec);  // follows links
            if (status.type() == fs::file_type::not_found) {
                corpus.skipped.push_back({entry.string(), "broken symbolic link"});
                continue;
            }
            if (ec) {
                corpus.skipped.push_back({entry.string(), "cannot inspect (" + ec.message() + ")"});
                continue;
            }
            if (status.type() != fs::file_type::directory && status.type() != fs::file_type::regular) {
                corpus.skipped.push_back({entry.string(), "not a regular file (device, pipe or socket)"});
                continue;
            }
            fs::path canonical = fs::canonical(entry, ec);
            if (ec) {
                corpus.skipped.push_back({entry.string(), "cannot resolve (" + ec.message() + ")"});
                continue;
            }
            if (status.type() == fs::file_type::regular) {
                files.push_back({entry, std::move(canonical)});
            } else if (entered.insert(canonical).second) {
                subfolders.emplace_back(entry, std::move(canonical));
            } else {
                corpus.skipped.push_back({entry.string(), is_within(dir_canonical, canonical)
                                                              ? "symbolic link loop (links to an enclosing folder)"
                                                              : "folder already read through another link"});
            }
        }
        for (auto s = subfolders.rbegin(); s != subfolders.rend(); ++s) stack.push_back(std::move(*s));
    }
    std::sort(files.begin(), files.end(), [](const FoundFile& a, const FoundFile& b) { return a.path < b.path; });
    return files;
}

}  // namespace detail

/// Reads a file, or every text file under a folder (see the top of this file for the formats and
/// for what is skipped). At most `max_bytes` of text are read; more is an error.
inline Corpus read_corpus(const std::filesystem::path& path, DocumentSplit split = DocumentSplit::automatic,
                          std::uintmax_t max_bytes = default_max_corpus_bytes) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::file_status status = fs::status(path, ec);
    check(status.type() != fs::file_type::not_found, "read_corpus: ", path.string(), " does not exist");
    check(!ec, "read_corpus: cannot access ", path.string(), ": ", ec.message());
    Corpus corpus;
    std::vector<detail::FoundFile> files;
    if (status.type() == fs::file_type::directory) {
        files = detail::list_files(corpus, path);
    } else {
        check(status.type() == fs::file_type::regular, "read_corpus: ", path.string(), " is neither a regular file nor a folder");
        fs::path canonical = fs::canonical(path, ec);
        files.push_back({path, ec ? path : canonical});
    }
    std::set<fs::path> seen;
    std::uintmax_t budget = max_bytes;
    std::string content;
    for (const auto& file : files) {
        if (!seen.insert(file.canonical).second) {
            corpus.skipped.push_back({file.path.string(), "already read through another link"});
            continue;
        }
        if (!detail::read_text_file(corpus, file.path, budget, max_bytes, content)) continue;
        corpus.files.push_back(file.path.string());
        detail::add_file(corpus, file.path, content, split);
    }
    if (corpus.documents.empty()) {
        std::string why;
        for (const auto& line : corpus.report()) why += "; " + line;
        throw value_error("read_corpus: no text documents found in " + path.string() + why);
    }
    return corpus;
}

/// Documents cut into a training and a held-out part.
struct CorpusSplit {
    std::vector<std::vector<std::uint8_t>> train;
    std::vector<std::vector<std::uint8_t>> held_out;
    bool by_position = false;  // true: one document was cut in two (train is its start, held_out its end)
};

/// Two or more documents: sends a seeded random `held_out_fraction` of the documents (at least one,
/// at most all but one) to the held-out part; the same seed and corpus always give the same split.
///
/// One document (a book): it is cut by position. The held-out part is its last
/// round(fraction x bytes) bytes (at least 1, at most all but 1), with the cut moved to the start of
/// a line so that the held-out part is whole lines, when a line start is near enough: back to the
/// start of the line holding the cut if that at most doubles the held-out part; else forward to the
/// next line start if that keeps at least half of it; else, when the cut is in the last line, back
/// to that line's start if the line is at most half the document (at least one full line is held
/// out). Failing all three the cut stays at the byte position, moved back out of a UTF-8 character.
/// Both parts are never empty. A one-byte document cannot be cut: error. A fraction of 0 holds out
/// nothing. An empty corpus is an error.
inline CorpusSplit split_documents(const Corpus& corpus, double held_out_fraction, std::uint64_t seed) {
    check(held_out_fraction >= 0 && held_out_fraction < 1, "split_documents: held_out_fraction must be in [0, 1), got ",
          held_out_fraction);
    const std::size_t n = corpus.documents.size();
    check(n > 0, "split_documents: the corpus has no documents");
    CorpusSplit split;
    if (n == 1 && held_out_fraction > 0) {
        const auto& doc = corpus.documents[0];
        const std::size_t size = doc.size();
        check(size >= 2, "split_documents: the corpus is a single document of ", size,
              " byte(s); it cannot be cut into a training and a held-out part");
        const std::size_t held = std::clamp<std::size_t>(static_cast<std::size_t>(held_out_fraction * double(size) + 0.5), 1, size - 1);
        const std::size_t target = size - held;  // first held-out byte; 1 <= target <= size - 1
        std::size_t cut = target;
        std::size_t back = target;  // the start of the line holding doc[target]
        while (back > 0 && doc[back - 1] != '\n') --back;
        std::size_t forward = target + 1;  // the next line start after target that leaves a held-out byte
        while (forward < size && doc[forward - 1] != '\n') ++forward;
        if (back >= 1 && target - back <= held) {
            cut = back;
        } else if (forward <= size - 1 && forward - target <= held / 2) {
            cut = forward;
        } else if (back >= 1 && forward > size - 1 && size - back <= size / 2) {
            cut = back;  // the cut is in the last line: hold out that whole line, if it is at most half
        } else {
            while (cut > 1 && (doc[cut] & 0xC0) == 0x80) --cut;  // not inside a UTF-8 sequence
        }
        split.train.emplace_back(doc.begin(), doc.begin() + std::ptrdiff_t(cut));
        split.held_out.emplace_back(doc.begin() + std::ptrdiff_t(cut), doc.end());
        split.by_position = true;
        return split;
    }
    std::size_t held = static_cast<std::size_t>(held_out_fraction * double(n) + 0.5);
    if (held_out_fraction > 0 && n >= 2) held = std::clamp<std::size_t>(held, 1, n - 1);
    const auto order = seeded_permutation(n, mix_seed(seed, 0x5E11));
    std::vector<bool> is_held(n, false);
    for (std::size_t i = 0; i < held; ++i) is_held[order[i]] = true;
    for (std::size_t i = 0; i < n; ++i) (is_held[i] ? split.held_out : split.train).push_back(corpus.documents[i]);
    return split;
}

}  // namespace olmax::data
