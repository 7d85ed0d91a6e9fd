#pragma once
// Reading a text corpus: `--data PATH` takes a file or a folder (read recursively, in sorted path
// order so the corpus is the same on every machine). The default corpus is the Debian package
// `fortunes` (about 2.4 MB of quotations and jokes in /usr/share/games/fortunes, one document per
// fortune, separated by lines holding a single "%"): real text, present without network once
// the package is installed.

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "olmax/core/core.hpp"
#include "olmax/data/shuffle.hpp"
#include "olmax/data/tokenizer.hpp"

namespace olmax::data {

/// How a file is cut into documents.
enum class DocumentSplit {
    automatic,    // percent_lines when the file has a line that is exactly "%", else whole_file
    whole_file,   // one document per file
    percent_lines,  // fortune(6) format: documents separated by lines holding only "%"
    blank_lines,  // paragraphs separated by one or more empty lines
};

/// Documents as token (byte) sequences, plus where they came from.
struct Corpus {
    std::vector<std::vector<std::uint8_t>> documents;
    std::vector<std::string> files;  // files read, in order
    std::size_t total_bytes() const {
        std::size_t n = 0;
        for (const auto& d : documents) n += d.size();
        return n;
    }
};

/// Where the default corpus lives (Debian package `fortunes`).
inline std::filesystem::path default_corpus_path() {
    const std::filesystem::path path = "/usr/share/games/fortunes";
    check(std::filesystem::is_directory(path), "default corpus: ", path.string(),
          " not found; install it with `apt-get install fortunes` (Debian/Ubuntu) or pass --data=PATH to a text file or folder");
    return path;
}

namespace detail {

inline std::string read_whole_file(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    check(in.good(), "read_corpus: cannot open ", path.string());
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// Text files only: NUL bytes in the first 4 KiB mark binary files (fortune's .dat indexes).
inline bool looks_like_text(std::string_view content) {
    return content.substr(0, 4096).find('\0') == std::string_view::npos;
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
    return content.starts_with("%\n") || content.find("\n%\n") != std::string_view::npos;
}

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
        const bool separator = split == DocumentSplit::percent_lines ? (line == "%" || line == "%\r") : line.find_first_not_of(" \t\r") == std::string_view::npos;
        if (separator) {
            add_document(corpus, content.substr(start, pos - start));
            start = std::min(end + 1, content.size());
        }
        if (end == content.size()) break;
        pos = end + 1;
    }
    add_document(corpus, content.substr(start));
}

}  // namespace detail

/// Reads a file, or every text file under a folder (sorted, symlinked duplicates read once).
inline Corpus read_corpus(const std::filesystem::path& path, DocumentSplit split = DocumentSplit::automatic) {
    namespace fs = std::filesystem;
    check(fs::exists(path), "read_corpus: ", path.string(), " does not exist");
    std::vector<fs::path> files;
    if (fs::is_directory(path)) {
        for (const auto& entry : fs::recursive_directory_iterator(path, fs::directory_options::follow_directory_symlink))
            if (entry.is_regular_file()) files.push_back(entry.path());
        std::sort(files.begin(), files.end());
    } else {
        files.push_back(path);
    }
    Corpus corpus;
    std::set<fs::path> seen;
    for (const auto& file : files) {
        if (!seen.insert(fs::canonical(file)).second) continue;
        const std::string content = detail::read_whole_file(file);
        if (!detail::looks_like_text(content)) continue;
        corpus.files.push_back(file.string());
        detail::split_into(corpus, content, split);
    }
    check(!corpus.documents.empty(), "read_corpus: no text documents found in ", path.string());
    return corpus;
}

/// Documents cut into a training and a held-out part, by whole documents.
struct CorpusSplit {
    std::vector<std::vector<std::uint8_t>> train;
    std::vector<std::vector<std::uint8_t>> held_out;
};

/// Sends a seeded random `held_out_fraction` of the documents (at least one, when there are two or
/// more) to the held-out part. The same seed and corpus always give the same split.
inline CorpusSplit split_documents(const Corpus& corpus, double held_out_fraction, std::uint64_t seed) {
    check(held_out_fraction >= 0 && held_out_fraction < 1, "split_documents: held_out_fraction must be in [0, 1), got ",
          held_out_fraction);
    const std::size_t n = corpus.documents.size();
    std::size_t held = static_cast<std::size_t>(held_out_fraction * double(n) + 0.5);
    if (held_out_fraction > 0 && n >= 2) held = std::clamp<std::size_t>(held, 1, n - 1);
    const auto order = seeded_permutation(n, mix_seed(seed, 0x5E11));
    std::vector<bool> is_held(n, false);
    for (std::size_t i = 0; i < held; ++i) is_held[order[i]] = true;
    CorpusSplit split;
    for (std::size_t i = 0; i < n; ++i) (is_held[i] ? split.held_out : split.train).push_back(corpus.documents[i]);
    return split;
}

}  // namespace olmax::data
