#pragma once
// Document-packing loader. Every batch row is an endless byte stream
//     EOD doc_a EOD doc_b EOD doc_c EOD ...
// and consecutive batches continue each row's stream, so every document byte (and the EOD after
// each document) is a target exactly once per epoch. When a row's document ends, that row takes
// the next document from one shared, seeded-shuffled queue at once: no row pads while documents
// remain (packing was the single largest improvement in a published byte-level training diary that
// beat Pythia-70M). Rows see the byte that ended the previous batch as their first input, so no
// prediction is lost at batch boundaries.
//
// The loader's whole state is a `DataPosition` (text, stored in checkpoints): restoring it
// continues the exact same sequence of batches.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "olmax/core/core.hpp"
#include "olmax/data/shuffle.hpp"
#include "olmax/data/tokenizer.hpp"

namespace olmax::data {

using Documents = std::vector<std::vector<std::uint8_t>>;

/// FNV-1a 64 over the document lengths and bytes: identifies the corpus a position belongs to.
inline std::uint64_t fingerprint(const Documents& docs) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    auto eat = [&h](std::uint8_t byte) { h = (h ^ byte) * 0x100000001b3ull; };
    for (const auto& d : docs) {
        for (int shift = 0; shift < 64; shift += 8) eat(static_cast<std::uint8_t>(std::uint64_t(d.size()) >> shift));
        for (std::uint8_t b : d) eat(b);
    }
    return h;
}

struct LoaderConfig {
    std::size_t batch_size = 8;
    std::size_t sequence_length = 128;
    std::uint64_t seed = 0;
    bool shuffle = true;
    /// true: start a freshly shuffled epoch when the documents run out (training); false: one pass,
    /// rows pad (mask 0) only once no document is left (evaluation).
    bool repeat = true;
};

/// One step's tokens: next-byte prediction, targets[b][s] follows inputs[b][s].
struct Batch {
    Tensor<std::int32_t> inputs;   // [batch, sequence] (int32, as nn::Embedding takes)
    Tensor<std::int32_t> targets;  // [batch, sequence]
    Tensor<float> mask;            // [batch, sequence]: 1 for real targets, 0 for padding
    std::size_t real_targets = 0;
    std::uint64_t epoch = 0;  // the epoch of the document queue after this batch
};

/// Rows [begin, end) of `batch` (copies), e.g. one thread's shard in data-parallel training.
inline Batch batch_rows(const Batch& batch, std::size_t begin, std::size_t end) {
    check<shape_error>(batch.inputs.rank() == 2 && begin < end && end <= batch.inputs.shape()[0], "data::batch_rows: rows [", begin, ", ",
                       end, ") of a batch of shape ", to_string(batch.inputs.shape()));
    const std::size_t sequence = batch.inputs.shape()[1], offset = begin * sequence, count = (end - begin) * sequence;
    device_scope on(batch.inputs.device());  // the rows stay where the batch is
    Batch out;
    out.inputs = Tensor<std::int32_t>({end - begin, sequence});
    out.targets = Tensor<std::int32_t>({end - begin, sequence});
    out.mask = Tensor<float>({end - begin, sequence});
    std::copy_n(batch.inputs.data() + offset, count, out.inputs.data());
    std::copy_n(batch.targets.data() + offset, count, out.targets.data());
    std::copy_n(batch.mask.data() + offset, count, out.mask.data());
    for (std::size_t i = 0; i < count; ++i) out.real_targets += out.mask.data()[i] != 0.0f;
    out.epoch = batch.epoch;
    return out;
}

/// Everything needed to continue a loader exactly where it was.
struct DataPosition {
    struct Row {
        std::uint32_t last_byte = ByteTokenizer::end_of_document;
        std::int64_t document = -1;  // index into the documents, -1 before the first
        std::uint64_t offset = 0;    // next byte of document + EOD (== size + 1 when finished)
    };
    std::uint64_t seed = 0;
    std::uint64_t corpus_fingerprint = 0;
    std::size_t batch_size = 0, sequence_length = 0;
    std::uint64_t epoch = 0;   // epoch of the shared queue
    std::uint64_t cursor = 0;  // next queue slot within that epoch
    std::uint64_t batches = 0; // batches produced so far
    std::vector<Row> rows;

    std::string to_text() const {
        std::ostringstream out;
        out << "packed_loader_position 1\nseed " << seed << "\nfingerprint " << corpus_fingerprint << "\nbatch_size " << batch_size
            << "\nsequence_length " << sequence_length << "\nepoch " << epoch << "\ncursor " << cursor << "\nbatches " << batches
            << "\nrows " << rows.size() << "\n";
        for (const auto& r : rows) out << r.last_byte << ' ' << r.document << ' ' << r.offset << '\n';
        return out.str();
    }

    static DataPosition from_text(std::string_view text) {
        std::istringstream in{std::string(text)};
        DataPosition p;
        std::string key;
        int version = 0;
        std::size_t row_count = 0;
        auto expect = [&in, &key](std::string_view name, auto& value) {
            check(static_cast<bool>(in >> key >> value) && key == name, "DataPosition::from_text: expected '", name,
                  "' with a value, got '", key, "'");
        };
        expect("packed_loader_position", version);
        check(version == 1, "DataPosition::from_text: unsupported version ", version);
        expect("seed", p.seed);
        expect("fingerprint", p.corpus_fingerprint);
        expect("batch_size", p.batch_size);
        expect("sequence_length", p.sequence_length);
        expect("epoch", p.epoch);
        expect("cursor", p.cursor);
        expect("batches", p.batches);
        expect("rows", row_count);
        check(row_count == p.batch_size, "DataPosition::from_text: ", row_count, " rows for batch size ", p.batch_size);
        p.rows.resize(row_count);
        for (auto& r : p.rows)
            check(static_cast<bool>(in >> r.last_byte >> r.document >> r.offset) && r.last_byte < 256,
                  "DataPosition::from_text: malformed row");
        return p;
    }
};

class PackedLoader {
public:
    PackedLoader(Documents documents, LoaderConfig config) : docs_(std::move(documents)), config_(config) {
        check(config_.batch_size > 0 && config_.sequence_length > 0, "PackedLoader: batch_size and sequence_length must be positive, got ",
              config_.batch_size, " and ", config_.sequence_length);
        check(!docs_.empty(), "PackedLoader: no documents");
        position_.seed = config_.seed;
        position_.corpus_fingerprint = fingerprint(docs_);
        position_.batch_size = config_.batch_size;
        position_.sequence_length = config_.sequence_length;
        position_.rows.resize(config_.batch_size);
        order_ = epoch_order(0);
    }

    const LoaderConfig& config() const { return config_; }
    const Documents& documents() const { return docs_; }
    std::uint64_t epoch() const { return position_.epoch; }
    /// Documents of the current epoch not yet handed to a row.
    std::size_t documents_remaining() const { return docs_.size() - position_.cursor; }
    /// One pass only: no document left and every row finished its last one.
    bool exhausted() const {
        if (config_.repeat || documents_remaining() > 0) return false;
        for (const auto& r : position_.rows)
            if (r.document >= 0 && r.offset < docs_[std::size_t(r.document)].size() + 1) return false;
        return true;
    }

    /// The next batch, or nullopt once a one-pass loader is exhausted.
    std::optional<Batch> next() {
        if (exhausted()) return std::nullopt;
        const std::size_t B = config_.batch_size, S = config_.sequence_length;
        Batch batch{Tensor<std::int32_t>::uninitialized({B, S}), Tensor<std::int32_t>::uninitialized({B, S}),
                    Tensor<float>::uninitialized({B, S}), 0, 0};
        for (std::size_t b = 0; b < B; ++b) {
            auto& row = position_.rows[b];
            std::int32_t* in = batch.inputs.data() + b * S;
            std::int32_t* tg = batch.targets.data() + b * S;
            float* mk = batch.mask.data() + b * S;
            std::uint32_t previous = row.last_byte;
            for (std::size_t s = 0; s < S; ++s) {
                in[s] = std::int32_t(previous);
                const int byte = next_byte(row);
                if (byte < 0) {  // nothing left anywhere: pad
                    tg[s] = ByteTokenizer::end_of_document;
                    mk[s] = 0.0f;
                    previous = ByteTokenizer::end_of_document;
                } else {
                    tg[s] = byte;
                    mk[s] = 1.0f;
                    ++batch.real_targets;
                    previous = std::uint32_t(byte);
                }
            }
            row.last_byte = previous;
        }
        ++position_.batches;
        batch.epoch = position_.epoch;
        return batch;
    }

    const DataPosition& position() const { return position_; }

    /// Continues from a saved position; it must come from a loader over the same documents with
    /// the same seed, batch size and sequence length.
    void restore(const DataPosition& p) {
        check(p.corpus_fingerprint == position_.corpus_fingerprint, "PackedLoader::restore: the position belongs to a different corpus");
        check(p.seed == config_.seed && p.batch_size == config_.batch_size && p.sequence_length == config_.sequence_length,
              "PackedLoader::restore: position has seed ", p.seed, ", batch ", p.batch_size, ", sequence ", p.sequence_length,
              "; loader has seed ", config_.seed, ", batch ", config_.batch_size, ", sequence ", config_.sequence_length);
        check(p.cursor <= docs_.size() && p.rows.size() == config_.batch_size, "PackedLoader::restore: inconsistent position");
        for (const auto& r : p.rows)
            check(r.document < std::int64_t(docs_.size()) && (r.document < 0 || r.offset <= docs_[std::size_t(r.document)].size() + 1),
                  "PackedLoader::restore: row refers to document ", r.document, " offset ", r.offset, " outside the corpus");
        position_ = p;
        order_ = epoch_order(position_.epoch);
    }

private:
    std::vector<std::size_t> epoch_order(std::uint64_t epoch) const {
        if (!config_.shuffle) return identity();
        return seeded_permutation(docs_.size(), mix_seed(config_.seed, epoch));
    }
    std::vector<std::size_t> identity() const {
        std::vector<std::size_t> order(docs_.size());
        for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
        return order;
    }

    /// The next byte of this row's stream, taking a new document when needed; -1 when none is left.
    int next_byte(DataPosition::Row& row) {
        if (row.document < 0 || row.offset >= docs_[std::size_t(row.document)].size() + 1) {
            if (position_.cursor == docs_.size()) {
                if (!config_.repeat) return -1;
                ++position_.epoch;
                position_.cursor = 0;
                order_ = epoch_order(position_.epoch);
            }
            row.document = std::int64_t(order_[position_.cursor++]);
            row.offset = 0;
        }
        const auto& doc = docs_[std::size_t(row.document)];
        const std::uint64_t i = row.offset++;
        return i < doc.size() ? doc[i] : ByteTokenizer::end_of_document;
    }

    Documents docs_;
    LoaderConfig config_;
    DataPosition position_;
    std::vector<std::size_t> order_;
};

}  // namespace olmax::data
