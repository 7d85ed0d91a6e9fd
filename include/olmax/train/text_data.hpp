#pragma once
// The text a run trains and evaluates on: a corpus read from a file or folder, split into
// training and held-out documents, with the lines a program prints about it.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "olmax/config/key_value.hpp"
#include "olmax/core/error.hpp"
#include "olmax/data/corpus.hpp"
#include "olmax/train/evaluation.hpp"

namespace olmax::train {

/// The data keys of a program's config: the text trained on, the held-out share, the seed of the
/// split, the data order and the initialisation, and the global batch.
struct DataConfig {
    std::string data;  // file or folder; empty = the default corpus (Debian package fortunes)
    double held_out_fraction = 0.05;
    std::int64_t seed = 0;
    std::int64_t batch = 8;
    std::int64_t sequence = 64;

    static const std::vector<config::Field<DataConfig>>& fields() {
        using C = DataConfig;
        using config::Field;
        static const std::vector<Field<C>> f{
            Field<C>{"data", &C::data, "text file or folder to train on (empty: the Debian `fortunes` corpus)"}.names(config::PathKind::input),
            Field<C>{"held_out_fraction", &C::held_out_fraction, "fraction of documents (of bytes, for one document) held out for evaluation"}
                .greater_than(0).at_most(0.5),
            Field<C>{"seed", &C::seed, "seed for initialisation, data order and sampling"}.at_least(0),
            Field<C>{"batch", &C::batch, "rows per step (each row is a packed stream of documents)"}.in(1, 1 << 16),
            Field<C>{"sequence", &C::sequence, "bytes per row per step (a multiple of 16 for the conv_mixer and moe blocks)"}.in(16, 1 << 20),
        };
        return f;
    }
};

struct TextData {
    data::Documents train, held_out;
    double unigram_baseline = 0;      ///< nats per byte on the held-out bytes (train::unigram_baseline)
    std::vector<std::string> report;  ///< what was read, skipped and held out, and the baseline
};

/// Reads `path` (empty: data::default_corpus_path()) and holds out `held_out_fraction` of it by the
/// seeded split of data::split_documents; refuses text too small to give both parts.
inline TextData read_text_data(const std::filesystem::path& path_or_empty, double held_out_fraction, std::uint64_t seed) {
    const std::filesystem::path path = path_or_empty.empty() ? data::default_corpus_path() : path_or_empty;
    const auto corpus = data::read_corpus(path);
    auto split = data::split_documents(corpus, held_out_fraction, seed);
    check(!split.held_out.empty() && !split.train.empty(), "cannot split ", path.string(), " into training and held-out text (",
          corpus.documents.size(), " documents, ", corpus.total_bytes(), " bytes)");
    TextData t;
    for (const auto& line : corpus.report()) t.report.push_back("data: " + line);
    std::size_t held_bytes = 0;
    for (const auto& d : split.held_out) held_bytes += d.size();
    t.report.push_back(olmax::detail::concat("corpus ", path.string(), ": ", corpus.files.size(), " files, ", corpus.documents.size(),
                                             " documents, ", corpus.total_bytes(), " bytes; held out ",
                                             split.by_position ? std::string("the last ") : std::to_string(split.held_out.size()) + " documents (",
                                             held_bytes, split.by_position ? " bytes of the single document" : " bytes)"));
    t.unigram_baseline = unigram_baseline(split.train, split.held_out);
    char line[128];
    std::snprintf(line, sizeof line, "unigram baseline on held-out bytes: %.4f nats/byte (%.3f bits/byte)", t.unigram_baseline,
                  t.unigram_baseline / std::log(2.0));
    t.report.push_back(line);
    t.train = std::move(split.train);
    t.held_out = std::move(split.held_out);
    return t;
}

}  // namespace olmax::train
