// Data: byte tokenizer, corpus reading and splitting, the document-packing loader (no empty rows
// while documents remain, every byte exactly once per epoch, determinism, resume), sampling.
#include <filesystem>
#include <fstream>
#include <map>

#include <olmax/data/data.hpp>

#include "test_helpers.hpp"

namespace {
using olmax_test::temp_dir;

namespace data = olmax::data;
constexpr std::int64_t EOD = data::ByteTokenizer::end_of_document;

data::Documents make_documents(std::size_t count, std::uint64_t seed) {
    // Lengths 0..40 including an empty document; bytes avoid the EOD value.
    std::mt19937_64 engine(seed);
    data::Documents docs;
    for (std::size_t d = 0; d < count; ++d) {
        std::vector<std::uint8_t> doc(d == 3 ? 0 : 1 + engine() % 40);
        for (auto& b : doc) b = std::uint8_t('a' + engine() % 26);
        docs.push_back(doc);
    }
    return docs;
}

/// Cuts each row's target stream at EOD into documents (the stream starts right after an EOD).
std::vector<std::vector<std::uint8_t>> documents_from_targets(const std::vector<std::vector<std::int64_t>>& rows) {
    std::vector<std::vector<std::uint8_t>> out;
    for (const auto& row : rows) {
        std::vector<std::uint8_t> current;
        for (std::int64_t t : row) {
            if (t == EOD) {
                out.push_back(current);
                current.clear();
            } else {
                current.push_back(std::uint8_t(t));
            }
        }
        REQUIRE(current.empty());  // a one-pass loader finishes every document
    }
    return out;
}

}  // namespace

TEST_CASE("data: byte tokenizer round trip and EOD handling", "[data]") {
    const std::string text = "h\xc3\xa9llo\x04world";
    const auto tokens = data::ByteTokenizer::encode(text);
    CHECK(tokens.size() == text.size() - 1);  // the stray EOD byte is dropped
    CHECK(data::ByteTokenizer::decode(tokens) == "h\xc3\xa9lloworld");
    std::vector<std::int64_t> with_eod{'a', EOD, 'b'};
    CHECK(data::ByteTokenizer::decode(with_eod, "|") == "a|b");
    CHECK(data::ByteTokenizer::vocab_size == 256);
}

TEST_CASE("data: packing loses or duplicates no byte within an epoch and never pads while documents remain", "[data]") {
    const auto docs = make_documents(57, 7);
    for (std::size_t batch : {1, 3, 8}) {
        for (std::size_t seq : {1, 5, 16}) {
            INFO("batch " << batch << " sequence " << seq);
            data::PackedLoader loader(docs, {.batch_size = batch, .sequence_length = seq, .seed = 11, .shuffle = true, .repeat = false});
            std::vector<std::vector<std::int64_t>> streams(batch);
            std::size_t steps = 0;
            while (auto b = loader.next()) {
                ++steps;
                REQUIRE(b->inputs.shape() == olmax::Shape{batch, seq});
                bool padded = false;
                for (std::size_t r = 0; r < batch; ++r) {
                    for (std::size_t s = 0; s < seq; ++s) {
                        if (b->mask(r, s) == 1.0f) {
                            REQUIRE_FALSE((s > 0 && b->mask(r, s - 1) == 0.0f));  // padding only at a row's end
                            streams[r].push_back(b->targets(r, s));
                        } else {
                            padded = true;
                        }
                        // inputs are the targets shifted by one within the row
                        if (s > 0) REQUIRE(b->inputs(r, s) == b->targets(r, s - 1));
                    }
                }
                if (padded) REQUIRE(loader.documents_remaining() == 0);
                REQUIRE(b->real_targets > 0);
            }
            CHECK(loader.exhausted());
            auto got = documents_from_targets(streams);
            auto want = docs;
            std::sort(got.begin(), got.end());
            std::sort(want.begin(), want.end());
            CHECK(got == want);  // every document exactly once, byte for byte
            std::size_t total = docs.size();
            for (const auto& d : docs) total += d.size();
            CHECK(steps <= (total + batch * seq - 1) / (batch * seq) + 40 / seq + 1);  // bounded tail
        }
    }
}

TEST_CASE("data: consecutive batches continue each row (first input = last target)", "[data]") {
    data::PackedLoader loader(make_documents(20, 3), {.batch_size = 4, .sequence_length = 7, .seed = 5});
    auto a = *loader.next();
    auto b = *loader.next();
    for (std::size_t r = 0; r < 4; ++r) CHECK(b.inputs(r, 0) == a.targets(r, 6));
    data::PackedLoader fresh(make_documents(20, 3), {.batch_size = 4, .sequence_length = 7, .seed = 5});
    auto first = *fresh.next();
    for (std::size_t r = 0; r < 4; ++r) CHECK(first.inputs(r, 0) == EOD);  // streams start after an EOD
}

TEST_CASE("data: repeating loader reshuffles per epoch, deterministic by seed", "[data]") {
    const auto docs = make_documents(10, 1);
    auto run = [&](std::uint64_t seed) {
        data::PackedLoader loader(docs, {.batch_size = 2, .sequence_length = 9, .seed = seed});
        std::vector<std::int64_t> all;
        for (int i = 0; i < 60; ++i) {
            auto b = *loader.next();
            CHECK(b.real_targets == 18);  // a repeating loader never pads
            all.insert(all.end(), b.targets.begin(), b.targets.end());
        }
        CHECK(loader.epoch() >= 2);
        return all;
    };
    CHECK(run(1) == run(1));
    CHECK(run(1) != run(2));
    CHECK(data::seeded_permutation(5, 9) == data::seeded_permutation(5, 9));
}

TEST_CASE("data: position save/restore continues the same batches", "[data]") {
    const auto docs = make_documents(30, 2);
    const data::LoaderConfig cfg{.batch_size = 3, .sequence_length = 11, .seed = 4};
    data::PackedLoader straight(docs, cfg);
    for (int i = 0; i < 25; ++i) straight.next();
    const std::string saved = straight.position().to_text();
    std::vector<std::int64_t> expected;
    for (int i = 0; i < 30; ++i) {
        auto b = *straight.next();
        expected.insert(expected.end(), b.targets.begin(), b.targets.end());
    }
    data::PackedLoader resumed(docs, cfg);
    resumed.restore(data::DataPosition::from_text(saved));
    std::vector<std::int64_t> got;
    for (int i = 0; i < 30; ++i) {
        auto b = *resumed.next();
        got.insert(got.end(), b.targets.begin(), b.targets.end());
    }
    CHECK(got == expected);

    data::PackedLoader other_corpus(make_documents(30, 99), cfg);
    CHECK_THROWS_AS(other_corpus.restore(data::DataPosition::from_text(saved)), olmax::value_error);
    data::PackedLoader other_seed(docs, {.batch_size = 3, .sequence_length = 11, .seed = 5});
    CHECK_THROWS_AS(other_seed.restore(data::DataPosition::from_text(saved)), olmax::value_error);
    CHECK_THROWS_AS(data::DataPosition::from_text("packed_loader_position 1\nseed x"), olmax::value_error);
}

TEST_CASE("data: corpus from a file or folder, fortune format, held-out split by documents", "[data]") {
    const auto dir = temp_dir("corpus");
    std::ofstream(dir / "b.txt") << "first fortune\n%\nsecond\none\n%\nthird\n";
    std::filesystem::create_directories(dir / "sub");
    std::ofstream(dir / "sub" / "a.txt") << "plain document\n\nwith a blank line\n";
    std::ofstream(dir / "index.dat", std::ios::binary) << std::string("\0\1\2binary", 9);
    std::filesystem::create_symlink(dir / "b.txt", dir / "c.txt");  // read once

    const auto corpus = data::read_corpus(dir);
    REQUIRE(corpus.documents.size() == 4);
    CHECK(corpus.files.size() == 2);
    auto text = [](const std::vector<std::uint8_t>& d) { return std::string(d.begin(), d.end()); };
    CHECK(text(corpus.documents[0]) == "first fortune");
    CHECK(text(corpus.documents[1]) == "second\none");
    CHECK(text(corpus.documents[2]) == "third");
    CHECK(text(corpus.documents[3]) == "plain document\n\nwith a blank line");

    const auto paragraphs = data::read_corpus(dir / "sub" / "a.txt", data::DocumentSplit::blank_lines);
    CHECK(paragraphs.documents.size() == 2);

    const auto split = data::split_documents(corpus, 0.25, 1);
    CHECK(split.held_out.size() == 1);
    CHECK(split.train.size() == 3);
    CHECK(data::split_documents(corpus, 0.25, 1).held_out == split.held_out);

    CHECK_THROWS_AS(data::read_corpus(dir / "missing"), olmax::value_error);
    CHECK_THROWS_AS(data::split_documents(corpus, 1.0, 1), olmax::value_error);
    std::filesystem::remove_all(dir);
}

TEST_CASE("data: the default corpus (Debian fortunes) is found and is real text", "[data]") {
    if (!std::filesystem::is_directory("/usr/share/games/fortunes")) {
        CHECK_THROWS_AS(data::default_corpus_path(), olmax::value_error);
        return;
    }
    const auto corpus = data::read_corpus(data::default_corpus_path());
    CHECK(corpus.documents.size() > 1000);
    CHECK(corpus.total_bytes() > 1'000'000);
}

TEST_CASE("data: sampling with temperature, top-k and top-p", "[data]") {
    const std::vector<double> logits{std::log(0.5), std::log(0.3), std::log(0.15), std::log(0.05)};
    const std::span<const double> l(logits);
    auto p = data::sampling_distribution(l, {});
    CHECK(p[0] == Approx(0.5));
    CHECK(p[3] == Approx(0.05));
    p = data::sampling_distribution(l, {.temperature = 1.0, .top_k = 2});
    CHECK(p[0] == Approx(0.625));
    CHECK(p[2] == 0.0);
    p = data::sampling_distribution(l, {.temperature = 1.0, .top_k = 0, .top_p = 0.75});  // 0.5 + 0.3 reaches 0.75
    CHECK(p[0] == Approx(0.5 / 0.8));
    CHECK(p[2] == 0.0);
    p = data::sampling_distribution(l, {.temperature = 0.0});
    CHECK(p[0] == 1.0);
    p = data::sampling_distribution(l, {.temperature = 0.5});  // squares the probabilities
    CHECK(p[1] / p[0] == Approx(0.36));

    olmax::Generator rng(3);
    std::vector<int> counts(4, 0);
    for (int i = 0; i < 20000; ++i) ++counts[data::sample_token(l, {}, rng)];
    CHECK(counts[0] / 20000.0 == Approx(0.5).margin(0.02));
    CHECK(counts[3] / 20000.0 == Approx(0.05).margin(0.01));
    CHECK_THROWS_AS(data::sampling_distribution(l, {.temperature = 1.0, .top_k = 0, .top_p = 0.0}), olmax::value_error);
}
