// Writes the exact training / held-out split that examples/train_lm uses, and the held-out batches
// its evaluation reads, so that a peer in another framework (nanogpt_baseline.py) trains on the
// same bytes and is scored on the same predictions. It calls the very functions train_lm calls
// (data::read_corpus, data::split_documents, data::PackedLoader with shuffle and repeat off), with
// train_lm's defaults for every key unless given:
//
//     dump_split --out=DIR [--data=PATH] [--held_out_fraction=0.05] [--seed=0] [--batch=8] [--sequence=64]
//
// DIR/train.bin     the training documents as one byte stream: EOD doc EOD doc ... EOD (EOD = byte 4,
//                   data::ByteTokenizer::end_of_document), the stream PackedLoader cuts rows from
// DIR/held_out.bin  the held-out documents, the same way
// DIR/eval_inputs.bin, eval_targets.bin, eval_mask.bin
//                   uint8 [rows, sequence]: every batch of train_lm's evaluation loader over the
//                   whole held-out part (batch after batch, row after row); mask 1 = a real target
// DIR/split.json    counts, FNV-1a fingerprints (data::fingerprint) of both parts, the settings
//
// train_lm evaluates `--eval_batches` batches of this stream (all of them when eval_batches is at
// least `eval_batches` in split.json): mean nats per real target.
#include <olmax/olmax.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace data = olmax::data;

namespace {

void write_stream(const std::filesystem::path& path, const data::Documents& docs) {
    std::ofstream out(path, std::ios::binary);
    const char eod = char(data::ByteTokenizer::end_of_document);
    out.put(eod);
    for (const auto& d : docs) {
        out.write(reinterpret_cast<const char*>(d.data()), std::streamsize(d.size()));
        out.put(eod);
    }
    olmax::check(out.good(), "cannot write ", path.string());
}

std::size_t bytes_of(const data::Documents& docs) {
    std::size_t n = 0;
    for (const auto& d : docs) n += d.size();
    return n;
}

std::string json_string(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
    }
    return out + "\"";
}

int run(int argc, char** argv) {
    std::string out_dir, data_path;
    double held_out_fraction = 0.05;  // olmax::train::TrainConfig's defaults
    std::uint64_t seed = 0;
    std::size_t batch = 8, sequence = 64;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        const auto eq = arg.find('=');
        olmax::check<olmax::config::config_error>(arg.starts_with("--") && eq != std::string::npos, "expected --key=value, got '", arg, "'");
        const std::string key = arg.substr(2, eq - 2), value = arg.substr(eq + 1);
        if (key == "out") out_dir = value;
        else if (key == "data") data_path = value;
        else if (key == "held_out_fraction") held_out_fraction = std::stod(value);
        else if (key == "seed") seed = std::stoull(value);
        else if (key == "batch") batch = std::stoul(value);
        else if (key == "sequence") sequence = std::stoul(value);
        else throw olmax::config::config_error("unknown key '" + key + "' (keys: out, data, held_out_fraction, seed, batch, sequence)");
    }
    olmax::check<olmax::config::config_error>(!out_dir.empty(), "--out=DIR is required");
    const std::filesystem::path path = data_path.empty() ? data::default_corpus_path() : std::filesystem::path(data_path);
    const auto corpus = data::read_corpus(path);
    const auto split = data::split_documents(corpus, held_out_fraction, seed);
    std::filesystem::create_directories(out_dir);
    const std::filesystem::path dir(out_dir);
    write_stream(dir / "train.bin", split.train);
    write_stream(dir / "held_out.bin", split.held_out);

    // train_lm's evaluate(): PackedLoader(held_out, {batch, sequence, seed, shuffle=false, repeat=false}).
    data::PackedLoader loader(split.held_out, {batch, sequence, seed, false, false});
    std::ofstream inputs(dir / "eval_inputs.bin", std::ios::binary), targets(dir / "eval_targets.bin", std::ios::binary),
        mask(dir / "eval_mask.bin", std::ios::binary);
    std::size_t batches = 0, real_targets = 0;
    std::vector<char> row(batch * sequence);
    while (auto b = loader.next()) {
        ++batches;
        real_targets += b->real_targets;
        for (std::size_t i = 0; i < row.size(); ++i) row[i] = char(b->inputs.data()[i]);
        inputs.write(row.data(), std::streamsize(row.size()));
        for (std::size_t i = 0; i < row.size(); ++i) row[i] = char(b->targets.data()[i]);
        targets.write(row.data(), std::streamsize(row.size()));
        for (std::size_t i = 0; i < row.size(); ++i) row[i] = char(b->mask.data()[i] != 0.0f);
        mask.write(row.data(), std::streamsize(row.size()));
    }
    olmax::check(inputs.good() && targets.good() && mask.good(), "cannot write the evaluation batches into ", out_dir);

    std::ofstream json(dir / "split.json");
    json << "{\n  \"corpus\": " << json_string(path.string()) << ",\n  \"files\": " << corpus.files.size()
         << ",\n  \"documents\": " << corpus.documents.size() << ",\n  \"corpus_bytes\": " << corpus.total_bytes()
         << ",\n  \"held_out_fraction\": " << held_out_fraction << ",\n  \"seed\": " << seed
         << ",\n  \"by_position\": " << (split.by_position ? "true" : "false") << ",\n  \"train_documents\": " << split.train.size()
         << ",\n  \"train_bytes\": " << bytes_of(split.train) << ",\n  \"train_fingerprint\": \"" << std::hex
         << data::fingerprint(split.train) << std::dec << "\",\n  \"held_out_documents\": " << split.held_out.size()
         << ",\n  \"held_out_bytes\": " << bytes_of(split.held_out) << ",\n  \"held_out_fingerprint\": \"" << std::hex
         << data::fingerprint(split.held_out) << std::dec << "\",\n  \"eval_batch\": " << batch << ",\n  \"eval_sequence\": " << sequence
         << ",\n  \"eval_batches\": " << batches << ",\n  \"eval_real_targets\": " << real_targets << "\n}\n";
    olmax::check(json.good(), "cannot write ", (dir / "split.json").string());
    std::cout << "dump_split: " << path.string() << ": " << corpus.documents.size() << " documents, " << corpus.total_bytes()
              << " bytes; held out " << split.held_out.size() << " documents (" << bytes_of(split.held_out) << " bytes), "
              << batches << " evaluation batches of " << batch << " x " << sequence << ", " << real_targets << " real targets -> "
              << out_dir << "\n";
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return olmax::config::run_program("dump_split", run, argc, argv); }
