// One rank of a multi-process test of olmax/distributed over Gloo (run_ranks.sh starts the ranks):
//
//   test_distributed --case=NAME --rank=R --world=N --store=DIR [--timeout_ms=T] [--rendezvous=SPEC]
//   test_distributed --free_port      (prints a TCP port free on 127.0.0.1 now, for run_ranks.sh)
//
// --rendezvous=tcp:HOST:PORT (run_ranks.sh ... tcp) meets through the TCP store rank 0 hosts
// instead of the file store in DIR (parse_rendezvous reads the spec).
// Cases (cases.hpp, shared with the MPI test): collectives, train, overlap, overlap_peer_exit,
// overlap_abandon, agreement, peer_exit, peer_hang; and
//   rendezvous   run alone in a world of 2: the rendezvous must fail within timeout + 3 s.
//   tcp_store    one process, --rendezvous=tcp:127.0.0.1:PORT with PORT free: address and spec
//                parsing; a client with no server fails within its timeout; a server started after
//                its client; set/get/wait; waits and gets that time out; the port already taken;
//                malformed requests; a silent server; the server going away under a waiting client.
// Exit status 0 when every check of this rank passed; the first failed check is printed.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <olmax/distributed/gloo.hpp>

#include "cases.hpp"

using namespace olmax_distributed_test;

namespace {

// ---- tcp_store -------------------------------------------------------------------------------------

/// Runs `body`, which must throw `Error` whose message contains every one of `parts`, within
/// `limit_s` seconds (and, when given, not before `at_least_s`). Returns the message.
template <class Error>
std::string expect_throw(std::string_view what, const std::function<void()>& body, std::vector<std::string_view> parts, double limit_s = 5,
                         double at_least_s = 0) {
    const auto start = Clock::now();
    std::string message;
    try {
        body();
    } catch (const Error& e) {
        message = e.what();
    }
    const double took = seconds_since(start);
    expect(!message.empty(), what, ": did not throw the expected error");
    std::printf("%s: failed after %.2f s as expected: %s\n", std::string(what).c_str(), took, message.c_str());
    for (auto part : parts) expect(message.find(part) != std::string::npos, what, ": the error does not say '", part, "': ", message);
    expect(took < limit_s, what, ": took ", took, " s to fail, more than ", limit_s, " s");
    expect(took >= at_least_s, what, ": failed after ", took, " s, before its timeout of ", at_least_s, " s");
    return message;
}

/// A TCP port that nothing listens on at the moment (the OS picks it), on 127.0.0.1.
int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    expect(fd >= 0, "socket failed");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t length = sizeof addr;
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0;
    ::close(fd);
    expect(ok, "could not find a free port");
    return ntohs(addr.sin_port);
}

/// A raw connection to 127.0.0.1:port that sends `bytes` and reports whether the server answered
/// with an ERROR reply (status 2) and then closed the connection.
bool rejected_raw(int port, const std::string& bytes) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(std::uint16_t(port));
    bool rejected = false;
    if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
        ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == ssize_t(bytes.size())) {
        timeval limit{5, 0};
        ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
        std::string reply;
        char chunk[256];
        for (ssize_t n; (n = ::recv(fd, chunk, sizeof chunk, 0)) > 0;) reply.append(chunk, std::size_t(n));
        rejected = reply.size() >= 5 && reply[4] == 2;  // u32 length, then status ERROR; recv gave 0: closed
    }
    if (fd >= 0) ::close(fd);
    return rejected;
}

void case_tcp_store(const dist::GlooOptions& options) {
    using dist::Timeout;
    const auto address = dist::parse_store_address(options.store_address);
    const std::string where = address.to_string();

    // Parsing: addresses and rendezvous specs.
    const auto a = dist::parse_store_address("10.0.0.1:29500");
    expect(a.host == "10.0.0.1" && a.port == 29500, "parse_store_address(10.0.0.1:29500)");
    const auto v6 = dist::parse_store_address("[::1]:1");
    expect(v6.host == "::1" && v6.port == 1 && v6.to_string() == "[::1]:1", "parse_store_address([::1]:1)");
    for (std::string_view bad : {"", "host", "host:", ":29500", "host:0", "host:65536", "host:12x", "host:-1", "::1:29500", "[::1]29500", "[::1"})
        expect_throw<olmax::value_error>(olmax::detail::concat("parse_store_address('", bad, "')"), [&] { dist::parse_store_address(bad); },
                                         {"TCP store address", "HOST:PORT"});
    const auto tcp = dist::parse_rendezvous("tcp:node7:29500", 2, 4);
    expect(tcp.store_address == "node7:29500" && tcp.store_path.empty() && tcp.rank == 2 && tcp.world_size == 4, "parse_rendezvous(tcp:...)");
    dist::GlooOptions base;
    base.timeout = Timeout(1234);
    base.store_address = "stale:1";
    const auto file = dist::parse_rendezvous("file:/shared/run1", 0, 2, base);
    expect(file.store_path == "/shared/run1" && file.store_address.empty() && file.timeout == Timeout(1234), "parse_rendezvous(file:...)");
    for (std::string_view bad : {"", "tcp:", "tcp:host", "tcp:host:0", "file:", "redis:host:6379", "/some/folder"})
        expect_throw<olmax::value_error>(olmax::detail::concat("parse_rendezvous('", bad, "')"), [&] { dist::parse_rendezvous(bad, 0, 2); },
                                         {"'"});
    {
        auto both = options;
        both.store_path = "/tmp/unused";
        expect_throw<olmax::value_error>("GlooCommunicator with both stores", [&] { dist::GlooCommunicator c(both); }, {"both"});
        auto neither = options;
        neither.store_address.clear();
        neither.store_path.clear();
        expect_throw<olmax::value_error>("GlooCommunicator with no store", [&] { dist::GlooCommunicator c(neither); }, {"no rendezvous"});
        auto port = options;
        port.store_address = "127.0.0.1:70000";
        expect_throw<olmax::value_error>("GlooCommunicator with port 70000", [&] { dist::GlooCommunicator c(port); }, {"1..65535"});
    }

    // Nobody listens: a client gives up after its timeout, a rank 1 rendezvous too.
    expect_throw<dist::distributed_error>("client without a server", [&] { dist::TcpStore client(address, false, Timeout(1000)); },
                                          {where, "could not connect", "refused"}, 3, 0.95);
    {
        auto rank1 = options;
        rank1.rank = 1;
        rank1.world_size = 2;
        rank1.timeout = Timeout(1000);
        expect_throw<dist::distributed_error>("rank 1's rendezvous without rank 0", [&] { dist::GlooCommunicator c(rank1); },
                                              {"rendezvous (rank 1 of 2, gloo)", where, "nobody serves the TCP store"}, 3, 0.95);
    }

    // The server starts after its client: the client keeps trying.
    std::optional<dist::TcpStore> early;
    std::string early_failure;
    std::thread connecting([&] {
        try {
            early.emplace(address, false, Timeout(5000));
        } catch (const std::exception& e) {
            early_failure = e.what();
        }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto host = std::make_unique<dist::TcpStore>(address, true, Timeout(5000));
    connecting.join();
    expect(early_failure.empty() && early.has_value(), "a client started before the server did not connect: ", early_failure);
    expect(host->hosts() && !early->hosts(), "hosts()");

    // Keys: set on one client, seen by the other; values of any bytes; replaced by a second set.
    const std::vector<char> value{'a', '\0', 'b', char(0xff)};
    host->set("k1", value);
    expect(early->get("k1") == value, "get of a key set by another client");
    expect(early->check_keys({"k1"}) && !early->check_keys({"k1", "k2"}), "check_keys");
    early->set("k1", {'x'});
    expect(host->get("k1") == std::vector<char>{'x'}, "a second set does not replace the value");
    std::vector<char> big(1 << 20);
    for (std::size_t i = 0; i < big.size(); ++i) big[i] = char(i * 7);
    early->set("big", big);
    expect(host->get("big") == big, "a 1 MiB value");
    std::thread later([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        host->set("k2", {});
    });
    early->wait({"k1", "k2"}, Timeout(5000));
    later.join();
    expect(early->get("k2").empty(), "an empty value");

    // Waits and gets for keys nobody sets end at their timeout.
    expect_throw<dist::distributed_error>("wait for a missing key", [&] { early->wait({"k1", "never"}, Timeout(500)); },
                                          {where, "Timed out", "'never'"}, 2, 0.45);
    {
        dist::TcpStore quick(address, false, Timeout(500));
        expect_throw<dist::distributed_error>("get of a missing key", [&] { quick.get("never"); }, {where, "Timed out", "'never'"}, 2, 0.45);
    }

    // The port already taken: a second host fails at once.
    expect_throw<dist::distributed_error>("a second server on the same port", [&] { dist::TcpStore second(address, true, Timeout(1000)); },
                                          {where, "cannot listen", "in use"}, 1);

    // Malformed requests get an ERROR reply and a closed connection; the server goes on serving.
    auto framed = [](std::string body) {
        const auto n = std::uint32_t(body.size());
        return std::string{char(n >> 24), char(n >> 16), char(n >> 8), char(n)} + body;
    };
    expect(rejected_raw(address.port, std::string("\xff\xff\xff\xff", 4)), "an oversized message was not rejected");
    expect(rejected_raw(address.port, framed("Z")), "an unknown operation was not rejected");
    expect(rejected_raw(address.port, framed(std::string("S\0\0\0\x09k", 6))), "a truncated SET was not rejected");
    expect(rejected_raw(address.port, framed(std::string("H\0\0\0\3abc", 8))), "a wrong handshake was not rejected");
    expect(host->get("k1") == std::vector<char>{'x'} && early->check_keys({"k1", "k2", "big"}), "the server stopped serving after bad requests");

    // A server that accepts but never answers (not an olmax store): the handshake times out.
    {
        const int port = free_port();
        const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        addr.sin_port = htons(std::uint16_t(port));
        expect(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 && ::listen(fd, 4) == 0, "a silent listener");
        const dist::StoreAddress silent{"127.0.0.1", port};
        expect_throw<dist::distributed_error>("a server that never answers", [&] { dist::TcpStore c(silent, false, Timeout(500)); },
                                              {silent.to_string(), "handshake", "Timed out"}, 2, 0.45);
        ::close(fd);
    }

    // The server goes away while a client waits: the client fails at once, not at its timeout.
    std::string waiting_failure;
    std::thread waiting([&] {
        try {
            early->wait({"never"}, Timeout(20000));
        } catch (const dist::distributed_error& e) {
            waiting_failure = e.what();
        }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto stopped = Clock::now();
    host.reset();  // joins the server thread
    waiting.join();
    std::printf("a wait while the server stopped: failed after %.2f s: %s\n", seconds_since(stopped), waiting_failure.c_str());
    expect(!waiting_failure.empty() && waiting_failure.find(where) != std::string::npos, "a wait on a stopped server did not fail");
    expect(waiting_failure.find("peer closed") != std::string::npos || waiting_failure.find("could not") != std::string::npos ||
               waiting_failure.find("lost") != std::string::npos,
           "the error does not say that the server went away: ", waiting_failure);
    expect(seconds_since(stopped) < 3, "a client waited ", seconds_since(stopped), " s on a stopped server");
    expect_throw<dist::distributed_error>("a request after the connection broke", [&] { early->set("k3", {}); }, {where}, 1);
    std::printf("tcp_store: all checks passed\n");
}

struct Args {
    std::string name, store, rendezvous;
    int rank = -1, world = 0;
    long timeout_ms = 20000;
};

Args parse(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        auto value = [&](std::string_view key) -> const char* {
            return arg.substr(0, key.size()) == key ? argv[i] + key.size() : nullptr;
        };
        if (auto v = value("--case=")) a.name = v;
        else if (auto v2 = value("--rank=")) a.rank = std::atoi(v2);
        else if (auto v3 = value("--world=")) a.world = std::atoi(v3);
        else if (auto v4 = value("--store=")) a.store = v4;
        else if (auto v5 = value("--timeout_ms=")) a.timeout_ms = std::atol(v5);
        else if (auto v6 = value("--rendezvous=")) a.rendezvous = v6;
        else throw std::invalid_argument("unknown argument " + std::string(arg));
    }
    if (a.name.empty() || a.rank < 0 || a.world < 1 || (a.store.empty() && a.rendezvous.empty()))
        throw std::invalid_argument(
            "usage: test_distributed --case=NAME --rank=R --world=N --store=DIR [--timeout_ms=T] [--rendezvous=SPEC] | --free_port");
    return a;
}

}  // namespace

int main(int argc, char** argv) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    try {
        if (argc == 2 && std::string_view(argv[1]) == "--free_port") return std::printf("%d\n", free_port()) > 0 ? 0 : 1;
        const Args args = parse(argc, argv);
        dist::GlooOptions options;
        options.rank = args.rank;
        options.world_size = args.world;
        options.store_path = args.store;
        options.timeout = dist::Timeout(args.timeout_ms);
        if (!args.rendezvous.empty()) options = dist::parse_rendezvous(args.rendezvous, args.rank, args.world, options);

        if (args.name == "tcp_store") {
            expect(!options.store_address.empty(), "the tcp_store case needs --rendezvous=tcp:127.0.0.1:PORT");
            case_tcp_store(options);
            return 0;
        }

        if (args.name == "rendezvous") {
            const double limit = double(args.timeout_ms) / 1000 + 3;
            const auto start = Clock::now();
            std::string message;
            try {
                dist::GlooCommunicator comm(options);
            } catch (const dist::distributed_error& e) {
                message = e.what();
            }
            const double took = seconds_since(start);
            std::printf("rendezvous without peers failed after %.2f s: %s\n", took, message.c_str());
            expect(!message.empty(), "the rendezvous succeeded without the other rank");
            expect(took < limit, "the rendezvous took ", took, " s to fail, more than ", limit, " s");
            expect(message.find("rendezvous") != std::string::npos, "the error does not name the rendezvous");
            std::printf("rank %d: all checks passed\n", args.rank);
            return 0;
        }

        const auto start = Clock::now();
        dist::GlooCommunicator comm(options);
        std::printf("rank %d of %d: connected in %.2f s\n", comm.rank(), comm.world_size(), seconds_since(start));
        if (args.name == "collectives") case_collectives(comm);
        else if (args.name == "train") case_train(comm);
        else if (args.name == "overlap") case_overlap(comm);
        else if (args.name == "overlap_peer_exit") case_overlap_peer_exit(comm);
        else if (args.name == "overlap_abandon") case_overlap_abandon(comm);
        else if (args.name == "agreement") case_agreement(comm);
        else if (args.name == "peer_exit") case_peer_exit(comm);
        else if (args.name == "peer_hang") case_peer_hang(comm);
        else throw std::invalid_argument("unknown case " + args.name);
        std::printf("rank %d: all checks passed\n", args.rank);
        return 0;
    } catch (const Failure& f) {
        std::fprintf(stderr, "FAILED: %s\n", f.what());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "FAILED with an exception: %s\n", e.what());
        return 1;
    }
}
