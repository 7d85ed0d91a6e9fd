// train_lm and generate as a user runs them: every mistake the issue tracker saw (zero or negative
// intervals, absurd sizes, paths of the wrong kind, stray or damaged checkpoint files) and a fuzzed
// command line drawn from the flag table itself. The contract (olmax/config/program.hpp): never a
// signal; exit 0 on success, 2 for a usage error, 1 for any other failure (train_lm: 3 when
// training diverged), with one line "program: message" as the last line on stderr.
#include "harness.hpp"

#include <olmax/config/config.hpp>
#include <olmax/models/byte_lm.hpp>
#include <olmax/train/train_config.hpp>

#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace config = olmax::config;
using namespace olmax_program_test;

TEST_CASE("train_lm: intervals of zero or below, absurd sizes and malformed numbers are usage errors", "[programs]") {
    const Program train_lm = train_lm_program();
    TempDir dir;
    write_file(dir.path / "corpus.txt", fortune_corpus());
    const auto base = tiny_run(dir.path / "corpus.txt", dir.path / "run");
    // Each was a SIGFPE, a silent acceptance or a std::bad_alloc abort.
    expect_usage_error(train_lm, with(base, {"--eval_every=0"}), dir.path, "'eval_every'");
    expect_usage_error(train_lm, with(base, {"--checkpoint_every=0"}), dir.path, "'checkpoint_every'");
    expect_usage_error(train_lm, with(base, {"--log_every=-5"}), dir.path, "'log_every'");
    expect_usage_error(train_lm, with(base, {"--keep_checkpoints=-1"}), dir.path, "'keep_checkpoints'");
    expect_usage_error(train_lm, with(base, {"--batch=4611686018427387904"}), dir.path, "'batch'");
    expect_usage_error(train_lm, with(base, {"--batch=99999999999999999999"}), dir.path, "'batch'");
    expect_usage_error(train_lm, with(base, {"--features=65536", "--depth=4096"}), dir.path, "memory available");
    expect_usage_error(train_lm, with(base, {"--batch=65536", "--sequence=1048576"}), dir.path, "memory available");
    expect_usage_error(train_lm, with(base, {"--sequence=17"}), dir.path, "multiple of 16");
    expect_usage_error(train_lm, with(base, {"--lr=nan"}), dir.path, "'lr'");
    expect_usage_error(train_lm, with(base, {"--min_lr=1", "--lr=0.1"}), dir.path, "'min_lr'");
    expect_usage_error(train_lm, with(base, {"--no_such_flag=1"}), dir.path, "unknown key");
    expect_usage_error(train_lm, with(base, {"stray_argument"}), dir.path, "unexpected argument");
    expect_usage_error(train_lm, with(base, {"--steps"}), dir.path, "needs a value");
}

TEST_CASE("train_lm: paths of the wrong kind are usage errors, not filesystem exceptions", "[programs]") {
    const Program train_lm = train_lm_program();
    TempDir dir;
    write_file(dir.path / "corpus.txt", fortune_corpus());
    write_file(dir.path / "a_file", "x");
    const auto base = tiny_run(dir.path / "corpus.txt", dir.path / "run");
    expect_usage_error(train_lm, with(base, {"--checkpoint_dir=" + (dir.path / "a_file").string()}), dir.path, "is a file");
    expect_usage_error(train_lm, with(base, {"--checkpoint_dir=" + (dir.path / "a_file" / "run").string()}), dir.path, "which is a file");
    expect_usage_error(train_lm, with(base, {"--data=" + (dir.path / "missing.txt").string()}), dir.path, "does not exist");
    expect_usage_error(train_lm, with(base, {"--data=/dev/null"}), dir.path, "neither a file nor a folder");
    expect_usage_error(train_lm, with(base, {"--config=" + dir.path.string()}), dir.path, "is a folder");
    expect_usage_error(train_lm, with(base, {"--config="}), dir.path, "--config needs a file");
    expect_usage_error(train_lm, with(base, {"--config=" + (dir.path / "none.cfg").string()}), dir.path, "does not exist");
}

TEST_CASE("train_lm: a new checkpoint folder under missing parents is created and a dry run touches nothing", "[programs]") {
    const Program train_lm = train_lm_program();
    TempDir dir;
    write_file(dir.path / "corpus.txt", fortune_corpus());
    const auto nested = dir.path / "a" / "b" / "run";
    const Outcome dry = run(train_lm, with(tiny_run(dir.path / "corpus.txt", nested), {"--dry_run=true"}), dir.path);
    check_contract(dry, train_lm);
    CHECK(dry.code == 0);
    CHECK_THAT(dry.out, Catch::Contains("dry run"));
    CHECK_FALSE(fs::exists(nested));
    const Outcome real = run(train_lm, tiny_run(dir.path / "corpus.txt", nested), dir.path);
    check_contract(real, train_lm);
    CHECK(real.code == 0);
    CHECK(fs::exists(nested / "ckpt-0000000002.olmax"));
}

TEST_CASE("checkpoint folder hygiene: stray names, interrupted saves, nothing valid left", "[programs]") {
    const Program train_lm = train_lm_program(), generate = generate_program();
    TempDir dir;
    write_file(dir.path / "corpus.txt", fortune_corpus());
    const fs::path run_dir = dir.path / "run";
    const auto base = tiny_run(dir.path / "corpus.txt", run_dir);
    REQUIRE(run(train_lm, base, dir.path).code == 0);

    // A name whose step does not fit in 64 bits (was std::stoll out of range: SIGABRT in both
    // programs) and a temporary file left by a save that was killed (its writer pid is gone).
    write_file(run_dir / "ckpt-99999999999999999999.olmax", "junk");
    write_file(run_dir / ".ckpt-0000000003.olmax.tmp-999999999-1", std::string(1000, 'x'));
    const Outcome resumed = run(train_lm, with(base, {"--steps=3"}), dir.path);
    check_contract(resumed, train_lm);
    CHECK(resumed.code == 0);
    CHECK_THAT(resumed.out, Catch::Contains("ckpt-99999999999999999999.olmax skipped"));
    CHECK_THAT(resumed.out, Catch::Contains("removed .ckpt-0000000003.olmax.tmp-999999999-1"));
    CHECK_THAT(resumed.out, Catch::Contains("resumed from"));
    CHECK_FALSE(fs::exists(run_dir / ".ckpt-0000000003.olmax.tmp-999999999-1"));

    const Outcome sampled = run(generate, {"--checkpoint_dir=" + run_dir.string(), "--sample_bytes=8"}, dir.path);
    check_contract(sampled, generate);
    CHECK(sampled.code == 0);
    CHECK_THAT(sampled.err, Catch::Contains("ckpt-99999999999999999999.olmax skipped"));

    // generate given a folder, a missing file, a damaged file as its checkpoint.
    expect_usage_error(generate, {run_dir.string()}, dir.path, "is a folder");
    expect_usage_error(generate, {(dir.path / "none.olmax").string()}, dir.path, "does not exist");
    write_file(dir.path / "damaged.olmax", "not a checkpoint");
    const Outcome damaged = run(generate, {(dir.path / "damaged.olmax").string()}, dir.path);
    check_contract(damaged, generate);
    CHECK(damaged.code == 1);

    // Every checkpoint damaged: both programs say why each file was rejected.
    for (const auto& entry : fs::directory_iterator(run_dir))
        if (entry.path().extension() == ".olmax" && entry.path().filename().string().size() == 21) write_file(entry.path(), "damaged");
    const Outcome none_valid = run(train_lm, with(base, {"--steps=4"}), dir.path);
    check_contract(none_valid, train_lm);
    CHECK(none_valid.code == 1);
    CHECK_THAT(none_valid.err, Catch::Contains("none of the 3 checkpoints") && Catch::Contains("ckpt-0000000003.olmax: ") &&
                                   Catch::Contains("ckpt-0000000001.olmax: ") && Catch::Contains("reading the magic"));
    CHECK(none_valid.err.find("--resume=true") == std::string::npos);
    const Outcome none_for_generate = run(generate, {"--checkpoint_dir=" + run_dir.string()}, dir.path);
    check_contract(none_for_generate, generate);
    CHECK(none_for_generate.code == 1);
    CHECK_THAT(none_for_generate.err, Catch::Contains("ckpt-0000000002.olmax: "));

    // A fresh run (resume off) refuses a folder that holds another run's checkpoints.
    const Outcome fresh = run(train_lm, with(base, {"--resume=false"}), dir.path);
    check_contract(fresh, train_lm);
    CHECK(fresh.code == 1);
    CHECK_THAT(fresh.err, Catch::Contains("--resume=true to continue"));
}

TEST_CASE("models::ByteLM: the memory estimate counts the model's real parameters, for every block recipe", "[programs]") {
    for (const auto block : olmax::models::block_names) {
        olmax::models::with_recipe(block, [&]<class Recipe>() {
            for (auto [features, depth] : {std::pair{8, 1}, std::pair{16, 3}, std::pair{24, 2}, std::pair{40, 1}}) {
                olmax::train::TrainConfig c;
                c.block = std::string(block);
                c.features = features;
                c.depth = depth;
                c.sequence = 16;
                olmax::models::ByteLM<Recipe> model(c);
                double real = 0;
                for (const auto& p : model.parameters()) real += double(p.tensor.size());
                INFO("block " << block << ", features " << features << ", depth " << depth);
                CHECK(olmax::models::ByteLM<Recipe>::parameter_count(olmax::models::ByteLMConfig::from(c)) == real);
            }
        });
    }
    olmax::train::TrainConfig mismatched;
    mismatched.block = "mamba";
    CHECK_THROWS_AS(olmax::models::ByteLM<>(mismatched), config::config_error);
    CHECK_THROWS_AS(olmax::models::with_recipe("transformer", []<class Recipe>() {}), olmax::value_error);
    olmax::train::TrainConfig absurd;
    absurd.features = 1 << 16;
    absurd.depth = 1 << 12;
    CHECK_THROWS_AS(olmax::models::ByteLM<>::check_trainable(olmax::models::ByteLMConfig::from(absurd), 8, 64), config::config_error);
}

namespace {

/// One fuzzed value of one flag and whether the flag table accepts it.
struct Case {
    std::string key, value;
    bool in_range;  // false: the program must answer with a usage error (exit 2)
};

std::string number_text(double v, bool integer) {
    if (integer) {
        if (v >= 9.2e18) return "9223372036854775807";
        if (v <= -9.2e18) return "-9223372036854775808";
        return std::to_string(static_cast<long long>(v));
    }
    std::ostringstream s;
    s.precision(17);
    s << v;
    return s.str();
}

/// Boundary, malformed and seeded random values for every key of the flag table: a new flag is
/// covered without editing this test.
std::vector<Case> fuzz_cases(const fs::path& dir, std::uint64_t seed) {
    std::vector<Case> cases;
    std::mt19937_64 rng(seed);
    for (const auto& f : olmax::train::TrainConfig::fields()) {
        const bool integer = std::holds_alternative<std::int64_t olmax::train::TrainConfig::*>(f.member);
        if (f.is_number()) {
            auto add = [&](double v) {
                const std::string text = number_text(v, integer);
                const double parsed = integer ? double(std::stoll(text)) : std::stod(text);
                cases.push_back({f.key, text, f.accepts(parsed)});
            };
            for (double v : {0.0, 1.0, -1.0, 0.5, 1e300, -1e300}) add(v);
            if (integer) {
                cases.push_back({f.key, "9223372036854775807", f.accepts(9223372036854775807.0)});
                cases.push_back({f.key, "99999999999999999999", false});  // beyond 64 bits
                cases.push_back({f.key, "1.5", false});
            } else {
                for (const char* bad : {"nan", "inf", "-inf", "1e400"}) cases.push_back({f.key, bad, false});
            }
            const double step = integer ? 1.0 : 1e-9;
            if (std::isfinite(f.lower)) add(f.lower), add(f.lower - std::max(step, std::abs(f.lower) * 1e-6));
            if (std::isfinite(f.upper)) add(f.upper), add(f.upper + std::max(step, std::abs(f.upper) * 1e-6));
            // Two random values inside the range, log-uniform in magnitude (sizes spread over decades).
            const double low = std::isfinite(f.lower) ? f.lower : -1e6, high = std::isfinite(f.upper) ? f.upper : 1e6;
            for (int i = 0; i < 2; ++i) {
                const double u = std::uniform_real_distribution<double>(0, 1)(rng);
                double v = low >= 0 ? std::exp(std::log1p(low) + u * (std::log1p(high) - std::log1p(low))) - 1 : low + u * (high - low);
                v = std::clamp(v, low, high);
                if (integer) v = std::round(v);
                if (f.accepts(v)) add(v);
            }
            for (const char* bad : {"", "abc", "12abc", "0x10"}) cases.push_back({f.key, bad, false});
        } else if (std::holds_alternative<bool olmax::train::TrainConfig::*>(f.member)) {
            for (const char* good : {"true", "false", "1", "0", "yes", "off"}) cases.push_back({f.key, good, true});
            for (const char* bad : {"", "maybe", "2", "truee"}) cases.push_back({f.key, bad, false});
        } else if (!f.choices.empty()) {
            for (const auto& c : f.choices) cases.push_back({f.key, c, true});
            for (const char* bad : {"", "bogus", "MATRICES"}) cases.push_back({f.key, bad, false});
        } else if (f.path == config::PathKind::input || f.path == config::PathKind::input_file) {
            cases.push_back({f.key, (dir / "corpus.txt").string(), true});
            if (f.path == config::PathKind::input) cases.push_back({f.key, (dir / "corpus_folder").string(), true});
            cases.push_back({f.key, (dir / "missing").string(), false});
            cases.push_back({f.key, (dir / "corpus.txt" / "below_a_file").string(), false});
            cases.push_back({f.key, "/dev/null", false});
        } else if (f.path == config::PathKind::output_folder) {
            cases.push_back({f.key, (dir / "new" / "nested" / "run").string(), true});
            cases.push_back({f.key, "", false});
            cases.push_back({f.key, (dir / "corpus.txt").string(), false});
            cases.push_back({f.key, (dir / "corpus.txt" / "run").string(), false});
        } else {  // free text
            for (std::string text : {std::string(), std::string(5000, 'a'), std::string("\xff\xfe\x01 \n\t%"), std::string("--steps=1")})
                cases.push_back({f.key, text, true});
        }
    }
    return cases;
}

}  // namespace

TEST_CASE("fuzzed command line: every flag with boundary, malformed and random values", "[programs][fuzz]") {
    const Program train_lm = train_lm_program(), generate = generate_program();
    TempDir dir;
    write_file(dir.path / "corpus.txt", fortune_corpus());
    fs::create_directories(dir.path / "corpus_folder" / "sub");
    write_file(dir.path / "corpus_folder" / "sub" / "a.txt", fortune_corpus());
    const auto cases = fuzz_cases(dir.path, 20261123);
    REQUIRE(cases.size() > 300);

    // train_lm with --dry_run (flags, data, model, checkpoint checked; no training), the fuzzed flag
    // last so it wins. In-range values must never be refused as usage errors of their own key.
    std::size_t accepted = 0;
    for (std::size_t i = 0; i < cases.size(); ++i) {
        const Case& c = cases[i];
        const auto base = tiny_run(dir.path / "corpus.txt", dir.path / ("run" + std::to_string(i)));
        const Outcome o = run(train_lm, with(base, {"--dry_run=true", "--" + c.key + "=" + c.value}), dir.path);
        INFO("case " << i << ": --" << c.key << "='" << c.value << "' (" << (c.in_range ? "in range" : "out of range") << ")");
        check_contract(o, train_lm);
        INFO(o.describe());
        if (!c.in_range) {
            CHECK(o.code == 2);
        } else if (o.code == 2) {
            // Only a check beyond the table (memory, sequence % 16, min_lr <= lr, rank < world_size,
            // a rendezvous for world_size > 1, a PJRT plugin for --device=xla) may refuse it.
            CHECK((o.err.find("memory") != std::string::npos || o.err.find("multiple of") != std::string::npos ||
                   o.err.find("min_lr") != std::string::npos || o.err.find("world_size") != std::string::npos ||
                   o.err.find("--device=xla") != std::string::npos));
        }
        accepted += o.code == 0;
    }
    CHECK(accepted > cases.size() / 4);  // about a third of the cases are in range

    // Real two-step runs with each in-range value that keeps the run small: every numeric key at
    // its lower bound, small upper bounds, and every bool, choice and path case.
    std::size_t trained = 0;
    for (std::size_t i = 0; i < cases.size(); ++i) {
        const Case& c = cases[i];
        const auto& field = config::find_field<olmax::train::TrainConfig>(c.key, "test");
        if (!c.in_range || c.key == "dry_run") continue;
        if (field.is_number()) {
            const double v = std::stod(c.value);
            const bool small_bound = (v == field.lower) || (v == field.upper && field.upper <= 64);
            if (!small_bound) continue;
        }
        const auto base = tiny_run(dir.path / "corpus.txt", dir.path / ("real" + std::to_string(i)));
        const Outcome o = run(train_lm, with(base, {"--" + c.key + "=" + c.value}), dir.path);
        INFO("real run " << i << ": --" << c.key << "='" << c.value << "'");
        check_contract(o, train_lm, /*diverging_allowed=*/true);
        trained += o.code == 0;
    }
    CHECK(trained > 20);

    // generate from one checkpoint with every out-of-range value (usage error) and every lower bound.
    const fs::path run_dir = dir.path / "for_generate";
    REQUIRE(run(train_lm, tiny_run(dir.path / "corpus.txt", run_dir), dir.path).code == 0);
    for (const Case& c : cases) {
        const auto& field = config::find_field<olmax::train::TrainConfig>(c.key, "test");
        const bool lower_bound = c.in_range && field.is_number() && std::stod(c.value) == field.lower;
        if (c.in_range && !lower_bound) continue;
        const Outcome o = run(generate, {"--checkpoint_dir=" + run_dir.string(), "--sample_bytes=4", "--" + c.key + "=" + c.value}, dir.path);
        INFO("generate --" << c.key << "='" << c.value << "'");
        check_contract(o, generate);
        if (!c.in_range) CHECK(o.code == 2);
    }
}

TEST_CASE("train_lm --update_in_backward logs the separate step's losses, with the default global-norm clipping", "[programs]") {
    const Program train_lm = train_lm_program();
    TempDir dir;
    write_file(dir.path / "corpus.txt", fortune_corpus());
    // Every training loss and held-out loss of 30 steps (metrics.csv). With clipping, backward runs
    // twice per step and the norm is summed per layer slice, so the updates may differ from the
    // separate step's by the clip factor's last bits: the logged losses are compared at 1e-5.
    auto losses = [&](const std::string& name, std::initializer_list<std::string> flags) {
        auto args = with(tiny_run(dir.path / "corpus.txt", dir.path / name), {"--steps=30", "--depth=2", "--checkpoint_every=30"});
        args.insert(args.end(), flags);
        const Outcome o = run(train_lm, args, dir.path);
        check_contract(o, train_lm);
        REQUIRE(o.code == 0);
        std::istringstream csv(read_file(dir.path / name / "metrics.csv"));
        std::string line;
        std::getline(csv, line);  // step,tokens,split,loss,bits_per_byte
        std::vector<double> values;
        while (std::getline(csv, line)) values.push_back(std::stod(line.substr(line.find(',', line.find(',', line.find(',') + 1) + 1) + 1)));
        return values;
    };
    const std::vector<double> separate = losses("separate", {});
    const std::vector<double> inside = losses("inside", {"--update_in_backward=true"});
    const std::vector<double> unclipped = losses("unclipped", {"--update_in_backward=true", "--max_grad_norm=0"});
    REQUIRE(separate.size() >= 60);  // a training row per step and a held-out row per evaluation
    REQUIRE(inside.size() == separate.size());
    double worst = 0, clip_effect = 0;
    for (std::size_t i = 0; i < separate.size(); ++i) {
        worst = std::max(worst, std::abs(inside[i] - separate[i]));
        clip_effect = std::max(clip_effect, std::abs(unclipped[i] - separate[i]));
    }
    CHECK(worst <= 1e-5);
    CHECK(clip_effect > 1e-3);  // the clipping is on in these runs and changes the losses
    expect_usage_error(train_lm, with(tiny_run(dir.path / "corpus.txt", dir.path / "accumulated"),
                                      {"--update_in_backward=true", "--grad_accumulation=2"}),
                       dir.path, "grad_accumulation=1");
}

TEST_CASE("train_lm trains on a plain text file, a folder with a link loop, CRLF fortunes and JSON Lines", "[programs]") {
    const Program train_lm = train_lm_program();
    TempDir dir;
    std::string book;
    for (int i = 0; i < 300; ++i) book += "Line " + std::to_string(i) + " of a long book without any separators.\n";
    write_file(dir.path / "book.txt", book);
    std::string crlf;
    for (char ch : fortune_corpus()) crlf += ch == '\n' ? std::string("\r\n") : std::string(1, ch);
    write_file(dir.path / "crlf.txt", crlf);
    std::string jsonl;
    for (int i = 0; i < 40; ++i) jsonl += "{\"id\": " + std::to_string(i) + ", \"text\": \"document " + std::to_string(i) + " says \\\"hi\\\"\\nbye\"}\n";
    jsonl += "not json\n";
    write_file(dir.path / "dump.jsonl", jsonl);
    fs::create_directories(dir.path / "tree" / "sub");
    write_file(dir.path / "tree" / "sub" / "a.txt", book);
    write_file(dir.path / "tree" / "blob.bin", std::string("\0\1\2\3binary", 10));
    fs::create_directory_symlink(dir.path / "tree", dir.path / "tree" / "sub" / "loop");
    for (const std::string data : {"book.txt", "crlf.txt", "dump.jsonl", "tree"}) {
        const Outcome o = run(train_lm, tiny_run(dir.path / data, dir.path / ("run_" + data)), dir.path);
        INFO(data);
        check_contract(o, train_lm);
        CHECK(o.code == 0);
        CHECK_THAT(o.out, Catch::Contains("held-out loss"));
        if (data == "book.txt") CHECK_THAT(o.out, Catch::Contains("of the single document"));
        if (data == "dump.jsonl") CHECK_THAT(o.out, Catch::Contains("data: ") && Catch::Contains("skipped 1 of 41"));
        if (data == "tree") CHECK_THAT(o.out, Catch::Contains("blob.bin") && Catch::Contains("loop"));
    }
}

TEST_CASE("train_lm --time_budget_s=20: the ETA keeps to the budget, no nan before the first evaluation", "[programs]") {
    const Program train_lm = train_lm_program();
    TempDir dir;
    write_file(dir.path / "corpus.txt", fortune_corpus());
    // Far more steps than 20 s allow, so the budget ends the run; one evaluation (at the end) and
    // one checkpoint, so the progress lines before it have no held-out loss yet.
    const double budget = 20;
    const Outcome o = run(train_lm,
                          with(tiny_run(dir.path / "corpus.txt", dir.path / "budget"),
                               {"--steps=10000000", "--time_budget_s=20", "--eval_every=10000000", "--checkpoint_every=10000000", "--log_every=200"}),
                          dir.path, 240);
    check_contract(o, train_lm);
    INFO(o.describe());
    REQUIRE(o.code == 0);
    CHECK_THAT(o.out, Catch::Contains("time budget of 20 s reached"));
    CHECK_THAT(o.out, Catch::Contains("s of training steps"));
    CHECK_THAT(o.out, Catch::Contains("wall time"));
    // "mm:ss"-style durations back to seconds: "12s", "3m05s", "1h02m".
    auto seconds_of = [](const std::string& d) {
        double total = 0, number = 0;
        for (char ch : d) {
            if (std::isdigit(static_cast<unsigned char>(ch))) number = number * 10 + (ch - '0');
            else total += number * (ch == 'h' ? 3600 : ch == 'm' ? 60 : 1), number = 0;
        }
        return total;
    };
    std::istringstream lines(o.out);
    std::string line;
    int progress_lines = 0;
    bool evaluated = false;
    while (std::getline(lines, line)) {
        if (line.find("held-out loss") != std::string::npos) evaluated = true;
        if (line.rfind("step ", 0) != 0 || line.find("ETA") == std::string::npos) continue;
        ++progress_lines;
        INFO(line);
        const auto field = [&](const std::string& key) {
            const auto at = line.find(key);
            REQUIRE(at != std::string::npos);
            const auto begin = at + key.size(), end = line.find(' ', begin);
            return line.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
        };
        const double elapsed = seconds_of(field("elapsed ")), eta = seconds_of(field("ETA "));
        // The budget counts the steps only and the bar's elapsed time starts with the loop, so what
        // is left of the budget is at least budget - elapsed; the ETA may exceed that by the
        // durations' rounding (1 s) and the time between steps (a metrics row each, under a tenth
        // of the time even under the sanitizers). Counted by the steps alone it would be hours.
        CHECK(eta <= budget - elapsed + 1 + 0.1 * elapsed);
        if (!evaluated) {
            CHECK(line.find("nan") == std::string::npos);
            CHECK_THAT(line, Catch::Contains("eval -"));
        }
    }
    CHECK(progress_lines >= 3);
}

TEST_CASE("train_lm: a checkpoint folder of another --block is refused before anything says it resumed", "[programs]") {
    const Program train_lm = train_lm_program();
    TempDir dir;
    write_file(dir.path / "corpus.txt", fortune_corpus());
    const Outcome first = run(train_lm, with(tiny_run(dir.path / "corpus.txt", dir.path / "ckpt"), {"--block=qrnn"}), dir.path);
    check_contract(first, train_lm);
    REQUIRE(first.code == 0);
    const Outcome other = run(train_lm, with(tiny_run(dir.path / "corpus.txt", dir.path / "ckpt"), {"--block=conv_mixer", "--resume=true"}), dir.path);
    check_contract(other, train_lm);
    INFO(other.describe());
    CHECK(other.code == 2);
    CHECK_THAT(other.last_error_line(), Catch::Contains("--block=qrnn"));
    CHECK(other.out.find("resumed") == std::string::npos);
    // The same folder with the same block resumes, and says so.
    const Outcome same = run(train_lm, with(tiny_run(dir.path / "corpus.txt", dir.path / "ckpt"), {"--block=qrnn", "--resume=true", "--steps=3"}), dir.path);
    check_contract(same, train_lm);
    CHECK(same.code == 0);
    CHECK_THAT(same.out, Catch::Contains("resumed from"));
}

TEST_CASE("generate --decode: stepwise where the block carries its state, window otherwise, said on stderr", "[programs]") {
    const Program train_lm = train_lm_program(), generate = generate_program();
    TempDir dir;
    write_file(dir.path / "corpus.txt", fortune_corpus());
    const std::vector<std::pair<std::string, std::string>> blocks{{"hybrid", "stepwise"}, {"conv_mixer", "window"}};
    for (const auto& [block, stepwise_as] : blocks) {
        const fs::path run_dir = dir.path / block;
        REQUIRE(run(train_lm, with(tiny_run(dir.path / "corpus.txt", run_dir), {"--block=" + block}), dir.path).code == 0);
        for (const std::string decode : {"stepwise", "window"}) {
            const Outcome o = run(generate, {"--checkpoint_dir=" + run_dir.string(), "--sample_bytes=40", "--decode=" + decode}, dir.path);
            INFO(block << " --decode=" << decode << "\n" << o.describe());
            check_contract(o, generate);
            CHECK(o.code == 0);
            const std::string said = decode == "stepwise" ? stepwise_as : "window";
            CHECK_THAT(o.err, Catch::Matches("(.|\n)*generate: [0-9]+ bytes in [0-9.e+-]+ s \\([0-9.e+-]+ bytes/s, decode " + said +
                                             ", window 16\\)\n(.|\n)*"));
        }
    }
    expect_usage_error(generate, {"--checkpoint_dir=" + (dir.path / "hybrid").string(), "--decode=cached"}, dir.path, "decode");
}

TEST_CASE("generate --score: a text's and the held-out part's bits per byte on one line of stdout", "[programs]") {
    const Program train_lm = train_lm_program(), generate = generate_program();
    TempDir dir;
    write_file(dir.path / "corpus.txt", fortune_corpus());
    write_file(dir.path / "two.txt", "the cat sat\n%\non a mat\n");  // two documents of 11 and 8 bytes
    const fs::path run_dir = dir.path / "hybrid";
    REQUIRE(run(train_lm, with(tiny_run(dir.path / "corpus.txt", run_dir), {"--block=hybrid"}), dir.path).code == 0);
    const auto bits_of = [](const std::string& out) {
        const auto at = out.find(": ", out.find("score: ") + 7);
        return std::stod(out.substr(at + 2));
    };
    double stepwise = 0;
    for (const std::string decode : {"stepwise", "window"}) {
        const Outcome o = run(generate, {"--checkpoint_dir=" + run_dir.string(), "--score=" + (dir.path / "two.txt").string(), "--decode=" + decode},
                              dir.path);
        INFO(decode << "\n" << o.describe());
        check_contract(o, generate);
        REQUIRE(o.code == 0);
        // each byte and each document's end: 11 + 8 + 2 predictions
        CHECK_THAT(o.out, Catch::Matches("score: .*two.txt: [0-9.e+-]+ bits/byte \\([0-9.e+-]+ nats/byte\\), 21 predictions in 2 documents, "
                                         "decode " + decode + ", window 16, [0-9.e+-]+ s\n"));
        const double bits = bits_of(o.out);
        CHECK(bits > 0);
        CHECK(bits < 16);  // an untrained model spends about 8 bits on a byte
        if (decode == "stepwise") stepwise = bits;
        else CHECK(bits != stepwise);  // the two read different contexts
    }
    // the checkpoint's own held-out documents, from its --data
    const Outcome held = run(generate, {"--checkpoint_dir=" + run_dir.string(), "--score=held_out"}, dir.path);
    INFO(held.describe());
    check_contract(held, generate);
    CHECK(held.code == 0);
    CHECK_THAT(held.out, Catch::Matches("score: held_out: [0-9.e+-]+ bits/byte (.|\n)*decode stepwise, window 16, (.|\n)*"));
    CHECK_THAT(held.err, Catch::Contains("held out"));
    expect_usage_error(generate, {"--checkpoint_dir=" + run_dir.string(), "--score=" + (dir.path / "missing.txt").string()}, dir.path,
                       "'score'");
}
