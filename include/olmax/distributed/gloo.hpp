#pragma once
// `GlooCommunicator`: the collectives of olmax/distributed/communicator.hpp between processes,
// over Gloo's TCP transport. Needs Gloo (Debian: libgloo-dev); link the CMake target
// olmax::distributed, which olmax defines only when Gloo is found.
//
// Rendezvous: every rank writes its TCP address into a store and reads the others'. Either a file
// store, a folder all ranks can reach (a local temporary folder for processes on one machine, a
// shared file system such as NFS across machines), or a TCP store on HOST:PORT that rank 0 hosts
// (olmax/distributed/tcp_store.hpp; Debian's Gloo, 0.5.0 git 2022-05-18, has none of its own).
// Its Redis store would need a Redis server and is not wrapped here. File store keys are never
// deleted, so every run needs a fresh folder or a fresh `prefix`: a rank that finds its own key
// from an earlier run refuses to start ("File already exists"). The TCP store lives in rank 0's
// memory: each run starts empty; rank 0 stops it once every rank has connected.
// `parse_rendezvous("file:DIR" or "tcp:HOST:PORT", rank, world_size)` builds the options from a
// command-line flag.
//
// Allreduce (deterministic for any world size N): the elements are cut into N contiguous
// segments; rank r owns segment r. Reduce-scatter: every rank sends segment p to its owner p
// directly, and each owner adds its N copies with `reduce_in_rank_order` (rank 0's first, then
// rank 1's, ...), then divides by N for the mean. Allgather: every owner sends its reduced segment
// to every other rank. Each rank sends and receives 2 (N - 1) / N of the message, as in a ring
// allreduce, but every element is summed in the same order whatever N or the segment it falls in
// (a ring sums each segment starting from a different rank), so the result equals a single process
// calling `reduce_in_rank_order` on the N inputs, bit for bit. The price: N - 1 messages per rank
// and phase instead of a ring's neighbour-only traffic (latency O(N) either way).
//
// Failures: every wait is bounded by the operation's deadline. A timeout, or a peer that closes
// its connection (exits, crashes), throws `distributed_error` naming the operation and the rank;
// the communicator then closes all its connections (so the other ranks fail at once rather than at
// their own timeout) and refuses every later collective. SIGPIPE is ignored process-wide (when it
// still has its default action): Gloo writes with writev, and a write to a dead peer would
// otherwise kill this process instead of raising the error.

#include <algorithm>
#include <chrono>
#include <csignal>
#include <signal.h>  // sigaction (POSIX)
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/context.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include "olmax/distributed/communicator.hpp"
#include "olmax/distributed/tcp_store.hpp"

namespace olmax::distributed {

struct GlooOptions {
    int rank = 0;
    int world_size = 1;
    /// The file store: a folder every rank can reach (created if missing). Fresh for every run.
    std::filesystem::path store_path;
    /// Or the TCP store: "HOST:PORT" ("10.0.0.1:29500"). Rank 0 listens there (host "0.0.0.0": on
    /// every interface; the other ranks then need rank 0's real address), every rank connects.
    /// Exactly one of `store_path` and `store_address` must be set.
    std::string store_address;
    /// Namespace of this job's keys inside the store (lets runs share a folder).
    std::string prefix = "olmax";
    /// Address this rank listens on, as peers reach it: "127.0.0.1" for processes on one machine,
    /// this machine's name or IP across machines. Ignored when `interface` is set.
    std::string hostname = "127.0.0.1";
    /// A network interface name ("eth0") to listen on instead of `hostname`.
    std::string interface;
    /// Rendezvous and every collective wait at most this long for the peers.
    Timeout timeout = std::chrono::seconds(30);

    /// OLMAX_RANK, OLMAX_WORLD_SIZE, OLMAX_STORE (folder), OLMAX_STORE_ADDRESS (HOST:PORT),
    /// OLMAX_PREFIX, OLMAX_HOSTNAME, OLMAX_INTERFACE and OLMAX_TIMEOUT_MS, each optional (missing:
    /// the defaults above); for launchers that pass the job's layout in the environment.
    static GlooOptions from_environment() {
        GlooOptions o;
        auto text = [](const char* name) -> const char* { return std::getenv(name); };
        auto integer = [&](const char* name, long long fallback) {
            const char* value = text(name);
            if (!value || !*value) return fallback;
            char* end = nullptr;
            const long long parsed = std::strtoll(value, &end, 10);
            check(*end == '\0', "GlooOptions::from_environment: ", name, "='", value, "' is not an integer");
            return parsed;
        };
        o.rank = int(integer("OLMAX_RANK", o.rank));
        o.world_size = int(integer("OLMAX_WORLD_SIZE", o.world_size));
        o.timeout = Timeout(integer("OLMAX_TIMEOUT_MS", o.timeout.count()));
        if (const char* v = text("OLMAX_STORE")) o.store_path = v;
        if (const char* v = text("OLMAX_STORE_ADDRESS")) o.store_address = v;
        if (const char* v = text("OLMAX_PREFIX")) o.prefix = v;
        if (const char* v = text("OLMAX_HOSTNAME")) o.hostname = v;
        if (const char* v = text("OLMAX_INTERFACE")) o.interface = v;
        return o;
    }
};

/// Options for `rank` of `world_size` from a rendezvous spec, as a --rendezvous flag gives it:
/// "file:DIR" (the file store in the folder DIR) or "tcp:HOST:PORT" (the TCP store that rank 0
/// hosts on HOST:PORT). The other fields come from `base` (timeout, hostname, prefix, ...); its
/// store_path and store_address are replaced. Throws value_error for any other spec or a bad
/// address.
inline GlooOptions parse_rendezvous(std::string_view spec, int rank, int world_size, GlooOptions base = {}) {
    base.rank = rank;
    base.world_size = world_size;
    base.store_path.clear();
    base.store_address.clear();
    if (spec.starts_with("file:")) {
        check(spec.size() > 5, "rendezvous '", spec, "': no folder after 'file:' (expected file:DIR or tcp:HOST:PORT)");
        base.store_path = std::string(spec.substr(5));
    } else if (spec.starts_with("tcp:")) {
        base.store_address = parse_store_address(spec.substr(4)).to_string();
    } else {
        throw value_error(olmax::detail::concat("rendezvous '", spec, "': expected file:DIR (a folder all ranks share) or tcp:HOST:PORT (",
                                                "rank 0 hosts a TCP store there)"));
    }
    return base;
}

namespace detail {

/// Gives every wait of the rendezvous our timeout: Gloo's FileStore::get waits its own default
/// (30 s) whatever the context's timeout is.
class BoundedStore final : public gloo::rendezvous::Store {
public:
    BoundedStore(gloo::rendezvous::Store& inner, Timeout timeout) : inner_(inner), timeout_(timeout) {}
    void set(const std::string& key, const std::vector<char>& data) override { inner_.set(key, data); }
    std::vector<char> get(const std::string& key) override {
        inner_.wait({key}, timeout_);
        return inner_.get(key);
    }
    void wait(const std::vector<std::string>& keys) override { inner_.wait(keys, timeout_); }
    void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
        inner_.wait(keys, std::min(timeout, timeout_));
    }

private:
    gloo::rendezvous::Store& inner_;
    Timeout timeout_;
};

/// Why a Gloo call failed, in words, from its message.
inline std::string_view gloo_failure_kind(std::string_view message) {
    const auto has = [&](std::string_view part) { return message.find(part) != std::string_view::npos; };
    if (has("TCP store ")) {  // olmax/distributed/tcp_store.hpp
        if (has("cannot listen")) return "rank 0 cannot host the TCP store";
        if (has("could not connect")) return "nobody serves the TCP store (rank 0 not started, exited, or a wrong address)";
        if (has("peer closed")) return "the TCP store's host, rank 0, closed the connection (exited, crashed or failed)";
        if (!has("Timed out")) return "the TCP store failed";
    }
    if (message.find("Timed out") != std::string_view::npos || message.find("Wait timeout") != std::string_view::npos ||
        message.find("Application timeout") != std::string_view::npos)
        return "a peer did not take part within the timeout (hung, dead or never started)";
    if (message.find("closed by peer") != std::string_view::npos || message.find("reset by peer") != std::string_view::npos ||
        message.find("Broken pipe") != std::string_view::npos || message.find("Connection refused") != std::string_view::npos)
        return "a peer closed its connection (exited, crashed or failed)";
    return "Gloo failed";
}

}  // namespace detail

class GlooCommunicator final : public Communicator {
public:
    explicit GlooCommunicator(const GlooOptions& options)
        : rank_(options.rank), size_(options.world_size), timeout_(options.timeout) {
        check(size_ >= 1, "GlooCommunicator: world_size must be at least 1, got ", size_);
        check(rank_ >= 0 && rank_ < size_, "GlooCommunicator: rank ", rank_, " is not in [0, ", size_, ")");
        check(timeout_.count() > 0, "GlooCommunicator: the timeout must be positive, got ", timeout_.count(), " ms");
        const bool tcp = !options.store_address.empty();
        check(tcp != !options.store_path.empty(), "GlooCommunicator: ",
              tcp ? "both store_path and store_address are set; give one rendezvous, the file store folder or the TCP store HOST:PORT"
                  : "no rendezvous: set store_path (a folder shared by all ranks) or store_address (HOST:PORT of the TCP store rank 0 hosts)");
        const std::string what = describe("rendezvous");
        std::optional<StoreAddress> address;
        if (tcp) {
            address = parse_store_address(options.store_address);
        } else {
            std::error_code ec;
            std::filesystem::create_directories(options.store_path, ec);
            check<distributed_error>(std::filesystem::is_directory(options.store_path), what, ": the store folder ",
                                     options.store_path.string(), " does not exist and cannot be created",
                                     ec ? ": " + ec.message() : std::string());
        }
        const std::string through =
            tcp ? olmax::detail::concat("the TCP store ", address->to_string(), rank_ == 0 ? " (hosted by this rank)" : "")
                : "the file store " + options.store_path.string();
        struct sigaction previous {};
        if (sigaction(SIGPIPE, nullptr, &previous) == 0 && previous.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
        const auto start = std::chrono::steady_clock::now();
        try {
            gloo::transport::tcp::attr attr;
            if (options.interface.empty()) attr.hostname = options.hostname;
            else attr.iface = options.interface;
            device_ = gloo::transport::tcp::CreateDevice(attr);
            auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
            context->setTimeout(timeout_);
            std::unique_ptr<gloo::rendezvous::Store> base;
            if (tcp) base = std::make_unique<TcpStore>(*address, rank_ == 0, timeout_);
            else base = std::make_unique<gloo::rendezvous::FileStore>(options.store_path.string());
            gloo::rendezvous::PrefixStore prefixed(options.prefix, *base);
            detail::BoundedStore store(prefixed, timeout_);
            context->connectFullMesh(store, device_);
            if (tcp && size_ > 1) {
                // The TCP store dies with rank 0's `base`: rank 0 keeps it until every rank says it
                // has read all the addresses it needs.
                store.set(olmax::detail::concat("connected/", rank_), {});
                if (rank_ == 0) {
                    std::vector<std::string> keys;
                    for (int r = 1; r < size_; ++r) keys.push_back(olmax::detail::concat("connected/", r));
                    const auto left = timeout_ - std::chrono::duration_cast<Timeout>(std::chrono::steady_clock::now() - start);
                    store.wait(keys, std::max(left, Timeout(1)));
                }
            }
            context_ = std::move(context);
        } catch (const std::exception& e) {
            throw distributed_error(olmax::detail::concat(
                what, " through ", through, " (prefix '", options.prefix, "') failed after ",
                elapsed_ms(start), " ms (timeout ", timeout_.count(), " ms): ", detail::gloo_failure_kind(e.what()), ": ", e.what(),
                std::string_view(e.what()).find("already exists") != std::string_view::npos
                    ? " (keys of an earlier run: use a fresh store folder or prefix for every run)"
                    : ""));
        }
    }

    GlooCommunicator(const GlooCommunicator&) = delete;
    GlooCommunicator& operator=(const GlooCommunicator&) = delete;

    int rank() const override { return rank_; }
    int world_size() const override { return size_; }
    Timeout default_timeout() const override { return timeout_; }
    std::string_view backend_name() const override { return "gloo"; }

    /// Whether an earlier collective failed (every later one then throws at once).
    bool broken() const { return !failure_.empty(); }
    /// The Gloo context, for Gloo's own algorithms (benchmarks/distributed compares its ring).
    const std::shared_ptr<gloo::Context>& gloo_context() const { return context_; }

protected:
    void do_allreduce(std::span<float> data, Reduction op, Timeout timeout) override { allreduce_impl(data, op, timeout); }
    void do_allreduce(std::span<double> data, Reduction op, Timeout timeout) override { allreduce_impl(data, op, timeout); }

    void do_broadcast(std::span<std::byte> data, int root, Timeout timeout) override {
        run(olmax::detail::concat(describe("broadcast"), " of ", data.size(), " bytes from rank ", root), timeout, [&] {
            if (size_ == 1 || data.empty()) return;
            gloo::BroadcastOptions options(context_);
            options.setOutput(reinterpret_cast<char*>(data.data()), data.size());
            options.setRoot(root);
            options.setTimeout(timeout);
            gloo::broadcast(options);
        });
    }

    void do_barrier(Timeout timeout) override {
        run(describe("barrier"), timeout, [&] {
            if (size_ == 1) return;
            gloo::BarrierOptions options(context_);
            options.setTimeout(timeout);
            gloo::barrier(options);
        });
    }

private:
    using clock = std::chrono::steady_clock;

    static long long elapsed_ms(clock::time_point start) {
        return std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - start).count();
    }

    /// Runs one collective: refuses when broken, turns any failure into distributed_error, and on
    /// failure closes every connection so that the peers fail now rather than at their timeout.
    template <class Body>
    void run(const std::string& what, Timeout timeout, Body&& body) {
        check<distributed_error>(failure_.empty(), what, ": the communicator is unusable since an earlier collective failed: ", failure_);
        const auto start = clock::now();
        try {
            body();
        } catch (const std::exception& e) {
            failure_ = olmax::detail::concat(what, " failed after ", elapsed_ms(start), " ms (timeout ", timeout.count(), " ms): ",
                                             detail::gloo_failure_kind(e.what()), ": ", e.what());
            try {
                context_->closeConnections();
            } catch (...) {  // already failing; the error below is the one to report
            }
            throw distributed_error(failure_);
        }
    }

    /// Waits for `count` completions of one kind on `buffer`, each bounded by `deadline`.
    static void wait_for(gloo::transport::UnboundBuffer& buffer, bool sends, int count, clock::time_point deadline) {
        for (int i = 0; i < count; ++i) {
            const auto left = std::max(Timeout(1), std::chrono::duration_cast<Timeout>(deadline - clock::now()));
            const bool done = sends ? buffer.waitSend(nullptr, left) : buffer.waitRecv(nullptr, left);
            if (!done) throw gloo::IoException(olmax::detail::concat("a ", sends ? "send" : "receive", " was aborted"));
        }
    }

    template <Real T>
    void allreduce_impl(std::span<T> data, Reduction op, Timeout timeout) {
        const std::string what = olmax::detail::concat(describe("allreduce"), " ", to_string(op), " of ", data.size(), " ", dtype_name<T>());
        run(what, timeout, [&] {
            if (size_ == 1 || data.empty()) return;  // a world of one: the sum is the input, the mean divides by 1
            const auto deadline = clock::now() + timeout;
            const std::size_t n = data.size();
            const int world = size_, me = rank_;
            auto begin_of = [&](int r) { return n / world * r + std::min<std::size_t>(r, n % world); };
            auto length_of = [&](int r) { return begin_of(r + 1) - begin_of(r); };
            const std::size_t mine = length_of(me);
            // Received copies of this rank's segment, one row per peer in rank order (this rank skipped).
            auto& scratch = scratch_for<T>();
            if (scratch.size() < std::size_t(world - 1) * mine) scratch.resize(std::size_t(world - 1) * mine);
            auto row = [&](int peer) { return std::size_t(peer < me ? peer : peer - 1) * mine; };

            auto buffer = context_->createUnboundBuffer(data.data(), n * sizeof(T));
            auto received = mine ? context_->createUnboundBuffer(scratch.data(), std::size_t(world - 1) * mine * sizeof(T)) : nullptr;
            // Both phases' slots are taken up front, so every rank draws the same two.
            const auto scatter_slot = context_->nextSlot(), gather_slot = context_->nextSlot();

            int sends = 0, receives = 0;
            for (int k = 1; k < world; ++k) {  // staggered so that no rank is everyone's first peer
                const int to = (me + k) % world, from = (me - k + world) % world;
                if (length_of(to)) buffer->send(to, scatter_slot, begin_of(to) * sizeof(T), length_of(to) * sizeof(T)), ++sends;
                if (mine) received->recv(from, scatter_slot, row(from) * sizeof(T), mine * sizeof(T)), ++receives;
            }
            if (received) wait_for(*received, false, receives, deadline);
            wait_for(*buffer, true, sends, deadline);  // before phase 2 overwrites what was sent

            if (mine) {
                std::vector<std::span<const T>> parts(world);
                for (int r = 0; r < world; ++r)
                    parts[r] = r == me ? std::span<const T>(data.data() + begin_of(me), mine) : std::span<const T>(scratch.data() + row(r), mine);
                reduce_in_rank_order<T>(parts, data.subspan(begin_of(me), mine), op);
            }

            sends = receives = 0;
            for (int k = 1; k < world; ++k) {
                const int to = (me + k) % world, from = (me - k + world) % world;
                if (mine) buffer->send(to, gather_slot, begin_of(me) * sizeof(T), mine * sizeof(T)), ++sends;
                if (length_of(from)) buffer->recv(from, gather_slot, begin_of(from) * sizeof(T), length_of(from) * sizeof(T)), ++receives;
            }
            wait_for(*buffer, false, receives, deadline);
            wait_for(*buffer, true, sends, deadline);
        });
    }

    template <Real T>
    std::vector<T>& scratch_for() {
        if constexpr (std::is_same_v<T, float>) return scratch_float_;
        else return scratch_double_;
    }

    int rank_;
    int size_;
    Timeout timeout_;
    std::shared_ptr<gloo::transport::Device> device_;
    std::shared_ptr<gloo::Context> context_;
    std::string failure_;  // empty while usable
    std::vector<float> scratch_float_;
    std::vector<double> scratch_double_;
};

}  // namespace olmax::distributed
