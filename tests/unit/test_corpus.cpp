// Corpus formats: plain text (one long document, split by position), folders with symbolic link
// loops, fortune files with LF or CRLF line ends, JSON Lines (escapes, surrogate pairs, bad lines
// counted), binary and odd files skipped with a record, the size limit.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include <olmax/data/data.hpp>

#include "test_helpers.hpp"

namespace {
using olmax_test::TempDir;

namespace data = olmax::data;
namespace fs = std::filesystem;

void write(const fs::path& p, const std::string& bytes) {
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << bytes;
}

std::string text(const std::vector<std::uint8_t>& d) { return std::string(d.begin(), d.end()); }

std::vector<std::string> texts(const data::Corpus& corpus) {
    std::vector<std::string> out;
    for (const auto& d : corpus.documents) out.push_back(text(d));
    return out;
}

std::string reason_for(const data::Corpus& corpus, const fs::path& p) {
    for (const auto& s : corpus.skipped)
        if (s.path == p.string()) return s.reason;
    return "";
}

std::string message_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const olmax::value_error& e) {
        return e.what();
    }
    return "(no value_error)";
}

bool contains(const std::string& haystack, const std::string& needle) { return haystack.find(needle) != std::string::npos; }

std::string book(std::size_t lines) {
    std::string s;
    for (std::size_t i = 0; i < lines; ++i) s += "Line " + std::to_string(i) + " of a long story, told plainly.\n";
    return s;
}

}  // namespace

TEST_CASE("corpus: a plain text file is one document, cut by position into train and held-out", "[data][corpus]") {
    TempDir dir("book");
    const std::string story = book(200);
    write(dir.path / "book.txt", story);
    const auto corpus = data::read_corpus(dir.path / "book.txt");
    REQUIRE(corpus.documents.size() == 1);
    CHECK(corpus.files == std::vector<std::string>{(dir.path / "book.txt").string()});
    CHECK(corpus.skipped.empty());
    CHECK(corpus.notices.empty());
    const std::string doc = text(corpus.documents[0]);
    CHECK(doc == story.substr(0, story.size() - 1));  // the trailing newline is trimmed

    const auto split = data::split_documents(corpus, 0.1, 7);
    REQUIRE(split.train.size() == 1);
    REQUIRE(split.held_out.size() == 1);
    CHECK(split.by_position);
    const std::string train = text(split.train[0]), held = text(split.held_out[0]);
    CHECK(train + held == doc);                       // the end of the document is held out, in order
    CHECK(train.back() == '\n');                      // ... starting at a line start
    CHECK(held.starts_with("Line "));
    const double wanted = 0.1 * double(doc.size());
    CHECK(double(held.size()) >= wanted);             // moved back to the line start: at most doubled
    CHECK(double(held.size()) <= 2 * wanted + 1);
    // Deterministic and the seed does not matter for a position split.
    CHECK(data::split_documents(corpus, 0.1, 99).held_out == split.held_out);
}

TEST_CASE("corpus: position split rules for one document (short, one line, UTF-8, tiny, empty)", "[data][corpus]") {
    auto one = [](const std::string& s) {
        data::Corpus c;
        c.documents.push_back(data::ByteTokenizer::encode(s));
        return c;
    };
    SECTION("two lines: the held-out part is at least the whole last line") {
        const auto split = data::split_documents(one("first line here\nend"), 0.05, 1);
        CHECK(text(split.train[0]) == "first line here\n");
        CHECK(text(split.held_out[0]) == "end");
    }
    SECTION("one line without newlines: cut at the byte position, never inside a UTF-8 character") {
        std::string s;
        for (int i = 0; i < 10; ++i) s += "\xC3\xA9";  // 20 bytes of 2-byte characters
        for (double f : {0.05, 0.15, 0.25, 0.45, 0.55}) {
            const auto split = data::split_documents(one(s), f, 1);
            const std::string train = text(split.train[0]), held = text(split.held_out[0]);
            CHECK(train + held == s);
            CHECK(!train.empty());
            CHECK(!held.empty());
            CHECK(train.size() % 2 == 0);  // whole characters on both sides
        }
    }
    SECTION("a far-away newline is not used: the cut stays near the requested fraction") {
        const std::string s = "a\n" + std::string(1000, 'x');
        const auto split = data::split_documents(one(s), 0.1, 1);
        CHECK(text(split.held_out[0]).size() == 100);
    }
    SECTION("two bytes split into one and one; one byte cannot be split; fraction 0 holds out nothing") {
        const auto split = data::split_documents(one("ab"), 0.1, 1);
        CHECK(text(split.train[0]) == "a");
        CHECK(text(split.held_out[0]) == "b");
        const std::string why = message_of([&] { data::split_documents(one("a"), 0.1, 1); });
        CHECK(contains(why, "single document of 1 byte"));
        const auto none = data::split_documents(one("a"), 0.0, 1);
        CHECK(none.train.size() == 1);
        CHECK(none.held_out.empty());
        CHECK(!none.by_position);
    }
    SECTION("an empty corpus is an error, two documents split by whole documents") {
        CHECK_THROWS_AS(data::split_documents(data::Corpus{}, 0.1, 1), olmax::value_error);
        data::Corpus two = one("first");
        two.documents.push_back(data::ByteTokenizer::encode("second"));
        const auto split = data::split_documents(two, 0.1, 1);
        CHECK(!split.by_position);
        CHECK(split.train.size() == 1);
        CHECK(split.held_out.size() == 1);
    }
}

TEST_CASE("corpus: a 1-byte corpus file reads but is a clear error to split; an empty one is an error to read", "[data][corpus]") {
    TempDir dir("tiny");
    write(dir.path / "one.txt", "x");
    write(dir.path / "empty.txt", "\n\n");
    const auto corpus = data::read_corpus(dir.path / "one.txt");
    REQUIRE(corpus.documents.size() == 1);
    CHECK_THROWS_AS(data::split_documents(corpus, 0.1, 1), olmax::value_error);
    CHECK(contains(message_of([&] { data::read_corpus(dir.path / "empty.txt"); }), "no text documents"));
}

TEST_CASE("corpus: folders are read recursively in sorted order; symlink loops and duplicates are read once", "[data][corpus]") {
    TempDir dir("tree");
    const auto& root = dir.path;
    write(root / "a.txt", "alpha\n");
    write(root / "sub" / "b.txt", "beta\n");
    write(root / "sub" / "deeper" / "c.txt", "gamma\n");
    write(root / ".hidden.txt", "not read\n");
    fs::create_directory_symlink(root, root / "sub" / "deeper" / "up");  // a loop back to the root
    fs::create_directory_symlink(root / "sub", root / "link");           // a second way into sub/
    fs::create_symlink(root / "a.txt", root / "z.txt");                  // a second name for a.txt
    fs::create_symlink(root / "missing.txt", root / "broken.txt");
    fs::create_symlink(root / "loop2", root / "loop1");  // file links to each other: ELOOP
    fs::create_symlink(root / "loop1", root / "loop2");

    const auto corpus = data::read_corpus(root);
    CHECK(texts(corpus) == std::vector<std::string>{"alpha", "beta", "gamma"});
    // "link" sorts before "sub", so sub/'s files are reached (and named) through it.
    CHECK(corpus.files == std::vector<std::string>{(root / "a.txt").string(), (root / "link" / "b.txt").string(),
                                                   (root / "link" / "deeper" / "c.txt").string()});
    CHECK(reason_for(corpus, root / "link" / "deeper" / "up") == "symbolic link loop (links to an enclosing folder)");
    CHECK(reason_for(corpus, root / "sub") == "folder already read through another link");
    CHECK(reason_for(corpus, root / "z.txt") == "already read through another link");
    CHECK(reason_for(corpus, root / ".hidden.txt") == "hidden (name starts with \".\")");
    CHECK(reason_for(corpus, root / "broken.txt") == "broken symbolic link");
    CHECK(contains(reason_for(corpus, root / "loop1"), "cannot inspect"));
    CHECK(reason_for(corpus, root / "loop2") == reason_for(corpus, root / "loop1"));
    CHECK(corpus.report().size() == corpus.skipped.size() - 1);  // the two ELOOP links share a line
    CHECK_THROWS_AS(data::read_corpus(root / "loop1"), olmax::value_error);

    // Reading through the looping link itself is the same tree.
    const auto again = data::read_corpus(root / "sub" / "deeper" / "up");
    CHECK(texts(again) == texts(corpus));
}

TEST_CASE("corpus: fortune files with LF and CRLF line ends give the same documents", "[data][corpus]") {
    TempDir dir("fortune");
    const std::string lf = "A first fortune\nover two lines.\n%\nSecond.\n%\n\n  Third, indented.\n%\n";
    std::string crlf;
    for (char c : lf) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
    write(dir.path / "lf", lf);
    write(dir.path / "crlf", crlf);
    write(dir.path / "bom-crlf", "\xEF\xBB\xBF" + crlf);
    const auto a = data::read_corpus(dir.path / "lf");
    const auto b = data::read_corpus(dir.path / "crlf");
    const auto c = data::read_corpus(dir.path / "bom-crlf");
    CHECK(texts(a) == std::vector<std::string>{"A first fortune\nover two lines.", "Second.", "  Third, indented."});
    CHECK(texts(b) == texts(a));
    CHECK(texts(c) == texts(a));
    // A CRLF book (one document) keeps no "\r" either.
    write(dir.path / "book.txt", "One\r\nTwo\r\n\r\nThree\r\n");
    CHECK(texts(data::read_corpus(dir.path / "book.txt")) == std::vector<std::string>{"One\nTwo\n\nThree"});
}

TEST_CASE("corpus: JSON Lines text fields with escapes and surrogate pairs", "[data][corpus]") {
    TempDir dir("jsonl");
    write(dir.path / "data.jsonl",
          "{\"text\": \"plain\"}\n"
          "\n"
          "{\"id\": 1, \"text\": \"q\\\" b\\\\ s\\/ \\b\\f\\n\\r\\t end\"}\r\n"
          "  {\"meta\": {\"tags\": [1, -2.5e-3, true, false, null, \"x\", {}], \"n\": 0}, \"text\": \"after nested\"}  \n"
          "{\"text\": \"\\u00e9\\u4E2D\\ud83d\\ude00 \\u0041\"}\n"
          "{\"text\": \"lone \\ud800 high, lone \\udc00 low, \\ud83d\\u0041 mixed\"}\n"
          "{\"text\": \"first\", \"text\": \"last wins\"}\n"
          "{\"te\\u0078t\": \"escaped key\"}\n"
          "{\"text\": \"windows\\r\\nline\"}\n"
          "{\"text\": \"raw \xC3\xA9 bytes\"}\n");
    const auto corpus = data::read_corpus(dir.path / "data.jsonl");
    CHECK(corpus.notices.empty());
    CHECK(texts(corpus) == std::vector<std::string>{
                               "plain",
                               "q\" b\\ s/ \b\f\n\r\t end",
                               "after nested",
                               "\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80 A",
                               "lone \xEF\xBF\xBD high, lone \xEF\xBF\xBD low, \xEF\xBF\xBD" "A mixed",
                               "last wins",
                               "escaped key",
                               "windows\nline",
                               "raw \xC3\xA9 bytes",
                           });
    // The same lines in a file without the extension are recognised by their content.
    fs::copy_file(dir.path / "data.jsonl", dir.path / "data.txt");
    CHECK(texts(data::read_corpus(dir.path / "data.txt")) == texts(corpus));
    // ... unless another format is asked for.
    CHECK(data::read_corpus(dir.path / "data.txt", data::DocumentSplit::whole_file).documents.size() == 1);
}

TEST_CASE("corpus: bad JSON Lines lines are skipped and counted; a file with no usable line is an error", "[data][corpus]") {
    TempDir dir("badjsonl");
    write(dir.path / "mixed.jsonl",
          "{\"text\": \"good one\"}\n"
          "{\"text\": 5}\n"
          "{\"title\": \"no text\"}\n"
          "not json at all\n"
          "{\"text\": \"unterminated\n"
          "{\"text\": \"ok\"} trailing\n"
          "{\"text\": \"bad \\x escape\"}\n"
          "{\"text\": \"raw\ttab\"}\n"
          "[\"an array\"]\n"
          "{\"text\": \"good two\", \"n\": 01}\n"
          "{\"text\": \"good three\"}\n");
    const auto corpus = data::read_corpus(dir.path / "mixed.jsonl");
    CHECK(texts(corpus) == std::vector<std::string>{"good one", "good three"});
    REQUIRE(corpus.notices.size() == 1);
    CHECK(contains(corpus.notices[0], "mixed.jsonl: skipped 9 of 11"));
    CHECK(contains(corpus.notices[0], "line 2: \"text\" is not a string"));
    CHECK(corpus.report() == corpus.notices);

    write(dir.path / "none.jsonl", "{\"title\": \"x\"}\n{\"text\": null}\n");
    const std::string why = message_of([&] { data::read_corpus(dir.path / "none.jsonl"); });
    CHECK(contains(why, "none.jsonl"));
    CHECK(contains(why, "line 1: no \"text\" field"));

    write(dir.path / "broken.jsonl", "{\"text\": \"a\",}\n");
    CHECK(contains(message_of([&] { data::read_corpus(dir.path / "broken.jsonl"); }), "line 1: expected a member name in double quotes at column 14"));

    // Without the extension, JSON without "text" is read as plain text, with a notice saying so.
    write(dir.path / "config.json", "{\"name\": \"olmax\", \"version\": 1}\n");
    const auto plain = data::read_corpus(dir.path / "config.json");
    CHECK(texts(plain) == std::vector<std::string>{"{\"name\": \"olmax\", \"version\": 1}"});
    REQUIRE(plain.notices.size() == 1);
    CHECK(contains(plain.notices[0], "read as plain text"));
}

TEST_CASE("corpus: the JSON line parser rejects malformed values without crashing", "[data][corpus]") {
    using Status = data::detail::JsonTextField::Status;
    auto status = [](const std::string& line) { return data::detail::json_text_field(line).status; };
    CHECK(status("{\"text\": \"x\", \"v\": [0, -0, 1.5, 2e10, -3E-2, 4.0e+1]}") == Status::ok);
    for (const char* bad : {"{\"v\": 01}", "{\"v\": -}", "{\"v\": 1.}", "{\"v\": 1e}", "{\"v\": .5}", "{\"v\": tru}", "{\"v\": nul}",
                            "{\"v\": [1,]}", "{\"v\" 1}", "{'text': 'x'}", "{\"text\": \"\\u12G4\"}", "{\"text\": \"\\u12\"}", "{", "",
                            "{\"text\": \"x\"}}", "{\"text\": \"x\"} {}"})
        CHECK(status(bad) == Status::invalid);
    CHECK(status("{\"other\": \"x\"}") == Status::no_text_field);
    CHECK(status("{\"text\": [\"x\"]}") == Status::text_not_string);
    CHECK(status("{\"nested\": {\"text\": \"x\"}}") == Status::no_text_field);  // only the top-level field counts
    // Deep nesting is refused, not recursed into.
    const std::string deep = "{\"v\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
    const auto field = data::detail::json_text_field(deep);
    CHECK(field.status == Status::invalid);
    CHECK(contains(field.problem, "nested too deeply"));
}

TEST_CASE("corpus: binary, UTF-16 and non-regular files are skipped with a record", "[data][corpus]") {
    TempDir dir("binary");
    write(dir.path / "text.txt", "Readable text.\n");
    write(dir.path / "index.dat", std::string("\0\0\0\2\0\0\1\0binary", 14));
    std::string controls;
    for (int i = 0; i < 400; ++i) controls += char(i % 256 == 0 ? 1 : i % 256);  // bytes 1..255, no NUL
    write(dir.path / "blob.bin", controls);
    write(dir.path / "utf16.txt", std::string("\xFF\xFEh\0i\0", 6));
    write(dir.path / "escapes.txt", "\x1B[1mbold\x1B[0m and a\ttab\f\n");  // terminal text is text
    REQUIRE(::mkfifo((dir.path / "pipe").c_str(), 0600) == 0);            // reading it would block

    const auto corpus = data::read_corpus(dir.path);
    CHECK(texts(corpus) == std::vector<std::string>{"\x1B[1mbold\x1B[0m and a\ttab\f", "Readable text."});
    CHECK(reason_for(corpus, dir.path / "index.dat") == "binary (NUL bytes)");
    CHECK(reason_for(corpus, dir.path / "blob.bin") == "binary (control characters)");
    CHECK(reason_for(corpus, dir.path / "utf16.txt") == "UTF-16 text (convert it to UTF-8)");
    CHECK(reason_for(corpus, dir.path / "pipe") == "not a regular file (device, pipe or socket)");
    bool reported = false;
    for (const auto& line : corpus.report()) reported = reported || (contains(line, "index.dat") && contains(line, "binary (NUL bytes)"));
    CHECK(reported);

    // Given on its own, a binary file or a pipe is an error that says why.
    CHECK(contains(message_of([&] { data::read_corpus(dir.path / "index.dat"); }), "binary (NUL bytes)"));
    CHECK(contains(message_of([&] { data::read_corpus(dir.path / "pipe"); }), "neither a regular file nor a folder"));
    CHECK(contains(message_of([&] { data::read_corpus(dir.path / "missing"); }), "does not exist"));
}

TEST_CASE("corpus: many binary files are reported as one grouped line", "[data][corpus]") {
    TempDir dir("grouped");
    write(dir.path / "a.txt", "text\n");
    for (int i = 0; i < 6; ++i) write(dir.path / olmax::detail::concat("f", i, ".dat"), std::string("\0x", 2));
    const auto corpus = data::read_corpus(dir.path);
    CHECK(corpus.skipped.size() == 6);
    const auto lines = corpus.report(2);
    REQUIRE(lines.size() == 1);
    CHECK(contains(lines[0], "skipped 6 paths, binary (NUL bytes): "));
    CHECK(contains(lines[0], "f0.dat, "));
    CHECK(contains(lines[0], " and 4 more"));
}

TEST_CASE("corpus: unreadable files and folders are recorded, never thrown as filesystem errors", "[data][corpus]") {
    TempDir dir("perms");
    write(dir.path / "ok.txt", "fine\n");
    write(dir.path / "secret.txt", "hidden by permissions\n");
    write(dir.path / "closed" / "inner.txt", "inside\n");
    fs::permissions(dir.path / "secret.txt", fs::perms::none);
    fs::permissions(dir.path / "closed", fs::perms::none);
    const bool enforced = !std::ifstream(dir.path / "secret.txt").good();  // root reads everything
    data::Corpus corpus;
    REQUIRE_NOTHROW(corpus = data::read_corpus(dir.path));
    if (enforced) {
        CHECK(texts(corpus) == std::vector<std::string>{"fine"});
        CHECK(contains(reason_for(corpus, dir.path / "secret.txt"), "cannot open (Permission denied)"));
        CHECK(contains(reason_for(corpus, dir.path / "closed"), "cannot read folder"));
        CHECK_THROWS_AS(data::read_corpus(dir.path / "secret.txt"), olmax::value_error);
    } else {
        CHECK(corpus.documents.size() == 3);
    }
    fs::permissions(dir.path / "closed", fs::perms::owner_all);
}

TEST_CASE("corpus: a corpus over the size limit is a clear error", "[data][corpus]") {
    TempDir dir("limit");
    write(dir.path / "a.txt", std::string(100, 'a'));
    write(dir.path / "b.txt", std::string(100, 'b'));
    CHECK(data::read_corpus(dir.path, data::DocumentSplit::automatic, 200).documents.size() == 2);
    const std::string why = message_of([&] { data::read_corpus(dir.path, data::DocumentSplit::automatic, 150); });
    CHECK(contains(why, "limit of 150 bytes"));
    CHECK(contains(why, "b.txt"));
}
