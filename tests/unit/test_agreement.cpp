// Ranks agree before they train together (distributed/agreement.hpp): the fingerprint's entries,
// bytes and hash; check_agreement over worlds of 1, 2 and 3 in-process ranks, where every rank
// must get the same one-line error naming the first entry that differs, and no collective may
// differ in size between the ranks (Gloo aborts the process on that). The same over Gloo between
// processes: tests/distributed (case agreement) and train_lm (tests/programs/test_stop_and_faults.cpp).
#include "test_helpers.hpp"

#include "in_process_world.hpp"

#include <olmax/distributed/agreement.hpp>

#include <string>
#include <vector>

namespace dist = olmax::distributed;
using olmax_test::InProcessWorld;

namespace {

/// What each rank of a world of `fingerprints.size()` gets from check_agreement: "" when it
/// returned, else its error message; asserts that the ranks never made mismatched collectives.
std::vector<std::string> agreement_outcomes(const std::vector<dist::Fingerprint>& fingerprints, int* collectives = nullptr) {
    InProcessWorld world(int(fingerprints.size()));
    const auto errors = world.run([&](dist::Communicator& comm) { dist::check_agreement(comm, fingerprints[std::size_t(comm.rank())]); });
    CHECK_FALSE(world.mismatched());
    if (collectives) *collectives = world.collectives();
    std::vector<std::string> messages;
    for (const auto& e : errors) {
        std::string message;
        if (e) {
            try {
                std::rethrow_exception(e);
            } catch (const dist::disagreement_error& d) {
                message = d.what();
            } catch (const std::exception& other) {
                message = std::string("unexpected error: ") + other.what();
            }
        }
        messages.push_back(message);
    }
    return messages;
}

dist::Fingerprint base() {
    dist::Fingerprint f;
    f.add("--block", "conv_mixer").add("--features", std::int64_t(64)).add("--lr", 3e-3).add("--overlap_allreduce", true);
    return f;
}

}  // namespace

TEST_CASE("Fingerprint: entries in order, exact numbers, bytes that read back, a hash of the bytes", "[distributed][agreement]") {
    dist::Fingerprint f = base();
    f.add("note", "a:b\n7:c");
    REQUIRE(f.size() == 5);
    CHECK(f.entries()[1].value == "64");
    CHECK(f.entries()[2].value == "0.003");
    CHECK(std::stod(f.entries()[2].value) == 3e-3);  // shortest text that reads back to the same double
    CHECK(f.entries()[3].value == "true");
    dist::Fingerprint g;
    g.add("x", 0.1 + 0.2);
    CHECK(std::stod(g.entries()[0].value) == 0.1 + 0.2);  // not "0.3"
    const dist::Fingerprint back = dist::Fingerprint::parse(f.serialize());
    CHECK(back.entries() == f.entries());
    CHECK(back.hash() == f.hash());
    dist::Fingerprint other = base();
    other.add("note", "a:b\n7:d");
    CHECK(other.hash() != f.hash());
    CHECK_THROWS_WITH(f.add("--features", std::int64_t(1)), Catch::Contains("'--features' was added twice"));
    CHECK_THROWS_AS(f.add("", "x"), olmax::value_error);
    for (const std::string bad : {"3:ab", "x:ab", "2:ab", "2:ab9:c", ":"}) {
        INFO(bad);
        CHECK_THROWS_AS(dist::Fingerprint::parse(bad), dist::distributed_error);
    }

    struct Named {
        std::string name;
        olmax::Tensor<float> tensor;
    };
    dist::Fingerprint p;
    p.add_parameters(std::vector<Named>{{"head.w", olmax::zeros<float>({4, 3})}, {"head.b", olmax::zeros<float>({3})}});
    REQUIRE(p.size() == 2);
    CHECK(p.entries()[0].name == "parameter head.w");
    CHECK(p.entries()[0].value == "float32 [4, 3]");
}

TEST_CASE("the in-process world refuses collectives whose sizes differ between ranks, as the checks below rely on", "[distributed][agreement]") {
    InProcessWorld world(2);
    const auto errors = world.run([&](dist::Communicator& comm) {
        std::vector<char> own(comm.rank() == 0 ? 24 : 40);  // what a check that sent each rank's own bytes would do
        comm.broadcast(std::span<char>(own), 0);
    });
    CHECK(world.mismatched());
    for (const auto& e : errors) {
        REQUIRE(e);
        CHECK_THROWS_AS(std::rethrow_exception(e), InProcessWorld::mismatch);
    }
}

TEST_CASE("check_agreement: agreeing ranks pass with two small collectives; a world of one exchanges nothing", "[distributed][agreement]") {
    dist::LocalCommunicator local;
    dist::check_agreement(local, base());
    for (int ranks : {2, 3}) {
        int collectives = -1;
        const auto outcomes = agreement_outcomes(std::vector<dist::Fingerprint>(std::size_t(ranks), base()), &collectives);
        for (const auto& o : outcomes) CHECK(o.empty());
        CHECK(collectives == 2);  // rank 0's summary (24 bytes) and the count of ranks that differ (one double)
    }
}

TEST_CASE("check_agreement: every rank gets the same line naming the first entry that differs and both values", "[distributed][agreement]") {
    SECTION("a value differs on rank 1 of 2") {
        dist::Fingerprint narrow;
        narrow.add("--block", "conv_mixer").add("--features", std::int64_t(32)).add("--lr", 1e-3).add("--overlap_allreduce", true);
        const auto outcomes = agreement_outcomes({base(), narrow});
        CHECK(outcomes[0] == outcomes[1]);
        CHECK(outcomes[0] ==
              "ranks disagree on '--features': rank 0 has 64, rank 1 has 32 (1 of 2 ranks differs from rank 0; every rank must run the same "
              "program with the same settings)");
    }
    SECTION("ranks 1 and 2 of 3 differ in different places: the earlier entry, at the lower rank") {
        dist::Fingerprint late = base(), early;
        late.add("--steps", std::int64_t(10));
        early.add("--block", "qrnn").add("--features", std::int64_t(64)).add("--lr", 3e-3).add("--overlap_allreduce", true);
        dist::Fingerprint reference = base();
        reference.add("--steps", std::int64_t(20));
        const auto outcomes = agreement_outcomes({reference, late, early});
        CHECK(outcomes[0] == outcomes[1]);
        CHECK(outcomes[1] == outcomes[2]);
        CHECK_THAT(outcomes[0], Catch::StartsWith("ranks disagree on '--block': rank 0 has conv_mixer, rank 2 has qrnn (2 of 3 ranks differ"));
    }
    SECTION("a rank declares more entries, of many more bytes: no collective sizes differ") {
        dist::Fingerprint longer = base();
        for (int i = 0; i < 200; ++i) longer.add("parameter layer" + std::to_string(i), "float32 [64, 64]");
        const auto outcomes = agreement_outcomes({base(), longer});
        CHECK(outcomes[0] == outcomes[1]);
        CHECK_THAT(outcomes[0], Catch::StartsWith("ranks disagree on 'parameter layer0': rank 1 has float32 [64, 64], rank 0 has no such entry "
                                                  "(it declares 4 entries, rank 1 204)"));
        const auto reversed = agreement_outcomes({longer, base()});
        CHECK_THAT(reversed[1], Catch::StartsWith("ranks disagree on 'parameter layer0': rank 0 has float32 [64, 64], rank 1 has no such entry "
                                                  "(it declares 4 entries, rank 0 204)"));
    }
    SECTION("the entries differ in name: both names and values, on one line") {
        dist::Fingerprint a, b;
        a.add("parameter head.w", "float32 [4]").add("x", "multi\nline");
        b.add("parameter head.weight", "float32 [4]").add("x", "multi\nline");
        const auto outcomes = agreement_outcomes({a, b});
        CHECK(outcomes[0] == outcomes[1]);
        CHECK_THAT(outcomes[0], Catch::StartsWith("ranks disagree at entry 1 of what must agree: rank 0 has 'parameter head.w' = float32 [4], "
                                                  "rank 1 has 'parameter head.weight' = float32 [4]"));
        dist::Fingerprint c;
        c.add("parameter head.w", "float32 [4]").add("x", "multi\nlines");
        const auto newline = agreement_outcomes({a, c});
        CHECK(newline[0].find('\n') == std::string::npos);
        CHECK_THAT(newline[0], Catch::Contains("rank 0 has multi\\nline, rank 1 has multi\\nlines"));
    }
}

TEST_CASE("check_agreement: a rank that never joins is a distributed_error at the timeout, not a hang", "[distributed][agreement]") {
    InProcessWorld world(2);
    const auto errors = world.run([&](dist::Communicator& comm) {
        if (comm.rank() == 0) dist::check_agreement(comm, base(), std::chrono::milliseconds(200));
    });
    REQUIRE(errors[0]);
    CHECK_THROWS_AS(std::rethrow_exception(errors[0]), dist::distributed_error);
    CHECK_FALSE(errors[1]);
}
