#pragma once
// `TcpStore`: a key-value rendezvous store over TCP for Gloo (gloo::rendezvous::Store), for jobs
// whose machines share no folder. Debian's Gloo (git 2022-05-18) has a file store, a hash store
// and a Redis store but no TCP store (PyTorch's TCPStore is PyTorch's own), so olmax has this one.
//
// One process (rank 0 of the job) hosts the server on HOST:PORT: a background thread that keeps
// the keys in memory and serves any number of connections with poll(). Every rank, the host
// included, is a client that connects to HOST:PORT, retrying until its timeout (the server may
// start after the clients). Waits are done by the client: it asks CHECK every few milliseconds
// until the keys exist or the timeout expires. Every failure (nobody listening within the timeout,
// the port already taken, the server gone, a reply that is not this protocol's, a wait that
// expires) throws `distributed_error` naming the address and what failed; writes use MSG_NOSIGNAL,
// so a dead peer never raises SIGPIPE. The server thread stops and is joined when the store that
// hosts it is destroyed.
//
// The protocol (version 1), all integers big-endian: every message is a u32 body length and the
// body. Requests: u8 operation, then strings as u32 length + bytes:
//   'H' magic                  -> OK magic              (handshake: this is an olmax TCP store)
//   'S' key value              -> OK                    (set; replaces an existing value)
//   'G' key                    -> OK value | MISSING    (get, without waiting)
//   'C' u32 count, count keys  -> OK | MISSING          (check: OK when every key exists)
// Replies: u8 status (0 OK, 1 MISSING, 2 ERROR), then the payload (ERROR: a message). A request
// the server cannot parse gets an ERROR reply and the server closes that connection.

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <gloo/rendezvous/store.h>

#include "olmax/distributed/communicator.hpp"

namespace olmax::distributed {

/// Where a TCP store listens: "HOST:PORT" ("10.0.0.1:29500", "node7:29500", "[::1]:29500").
struct StoreAddress {
    std::string host;
    int port = 0;

    /// "HOST:PORT" again (IPv6 hosts in brackets).
    std::string to_string() const {
        return host.find(':') != std::string::npos ? olmax::detail::concat('[', host, "]:", port) : olmax::detail::concat(host, ':', port);
    }
};

/// Parses "HOST:PORT": HOST non-empty (a name, an IPv4 address, or an IPv6 address in brackets),
/// PORT a decimal number in 1..65535. Throws value_error saying what is wrong.
inline StoreAddress parse_store_address(std::string_view text) {
    const auto fail = [&](std::string_view why) {
        throw value_error(olmax::detail::concat("TCP store address '", text, "': ", why, " (expected HOST:PORT, e.g. 10.0.0.1:29500)"));
    };
    StoreAddress a;
    std::string_view port;
    if (!text.empty() && text.front() == '[') {
        const auto close = text.find(']');
        if (close == std::string_view::npos) fail("an IPv6 host opened with '[' is not closed with ']'");
        a.host = std::string(text.substr(1, close - 1));
        if (close + 1 >= text.size() || text[close + 1] != ':') fail("no ':PORT' after the bracketed host");
        port = text.substr(close + 2);
    } else {
        const auto colon = text.rfind(':');
        if (colon == std::string_view::npos) fail("no ':PORT'");
        a.host = std::string(text.substr(0, colon));
        if (a.host.find(':') != std::string::npos) fail("an IPv6 host must be written in brackets, [::1]:29500");
        port = text.substr(colon + 1);
    }
    if (a.host.empty()) fail("the host is empty");
    if (port.empty()) fail("the port is empty");
    long value = 0;
    for (char c : port) {
        if (c < '0' || c > '9') fail("the port is not a decimal number");
        value = value * 10 + (c - '0');
        if (value > 65535) break;
    }
    if (value < 1 || value > 65535) fail("the port must be in 1..65535");
    a.port = int(value);
    return a;
}

namespace detail {

// ---- sockets and the wire format ----------------------------------------------------------------

/// Closes a file descriptor once.
class Fd {
public:
    Fd() = default;
    explicit Fd(int fd) : fd_(fd) {}
    Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
    Fd& operator=(Fd&& other) noexcept {
        if (this != &other) reset(std::exchange(other.fd_, -1));
        return *this;
    }
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    ~Fd() { reset(); }
    int get() const { return fd_; }
    explicit operator bool() const { return fd_ >= 0; }
    void reset(int fd = -1) {
        if (fd_ >= 0) ::close(fd_);
        fd_ = fd;
    }

private:
    int fd_ = -1;
};

inline std::string errno_text(int code) { return std::strerror(code); }

/// getaddrinfo for HOST:PORT (TCP); throws distributed_error naming the address.
inline std::unique_ptr<addrinfo, void (*)(addrinfo*)> resolve_store_address(const StoreAddress& address, bool passive) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    addrinfo* found = nullptr;
    const std::string port = std::to_string(address.port);
    const int rc = ::getaddrinfo(address.host.c_str(), port.c_str(), &hints, &found);
    check<distributed_error>(rc == 0 && found, "TCP store ", address.to_string(), ": cannot resolve the host '", address.host,
                             "': ", rc == 0 ? "no address" : ::gai_strerror(rc));
    return {found, ::freeaddrinfo};
}

inline void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

inline constexpr std::string_view tcp_store_magic = "olmax-tcp-store/1";
/// Largest message either side accepts (keys and values of a rendezvous are a few KiB).
inline constexpr std::uint32_t tcp_store_max_message = 64u << 20;

enum TcpStoreStatus : std::uint8_t { store_ok = 0, store_missing = 1, store_error = 2 };

inline void put_u32(std::string& out, std::uint32_t v) {
    const char bytes[4] = {char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
    out.append(bytes, 4);
}
inline void put_string(std::string& out, std::string_view s) {
    put_u32(out, std::uint32_t(s.size()));
    out.append(s);
}
inline std::uint32_t get_u32(const char* p) {
    return std::uint32_t(std::uint8_t(p[0])) << 24 | std::uint32_t(std::uint8_t(p[1])) << 16 | std::uint32_t(std::uint8_t(p[2])) << 8 |
           std::uint32_t(std::uint8_t(p[3]));
}
/// A message: its body with the length in front.
inline std::string frame(const std::string& body) {
    std::string out;
    put_u32(out, std::uint32_t(body.size()));
    return out + body;
}

/// Reads a message body field by field; every read checks the bounds (`ok` turns false).
struct Reader {
    std::string_view rest;
    bool ok = true;
    std::uint8_t byte() {
        if (rest.empty()) return ok = false, 0;
        const auto b = std::uint8_t(rest.front());
        rest.remove_prefix(1);
        return b;
    }
    std::uint32_t u32() {
        if (rest.size() < 4) return ok = false, 0;
        const auto v = get_u32(rest.data());
        rest.remove_prefix(4);
        return v;
    }
    std::string_view string() {
        const std::uint32_t n = u32();
        if (!ok || rest.size() < n) return ok = false, std::string_view();
        const auto s = rest.substr(0, n);
        rest.remove_prefix(n);
        return s;
    }
};

// ---- the server -----------------------------------------------------------------------------------

/// The keys of one TCP store, served by a background thread (poll over the listening socket, every
/// connection and a wake-up pipe). Destroying it stops and joins the thread and closes every socket.
class TcpStoreServer {
public:
    explicit TcpStoreServer(const StoreAddress& address) : address_(address) {
        const auto where = address_.to_string();
        auto list = resolve_store_address(address_, true);
        std::string why = "no usable address";
        for (const addrinfo* ai = list.get(); ai; ai = ai->ai_next) {
            Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
            if (!fd) {
                why = "socket: " + errno_text(errno);
                continue;
            }
            const int one = 1;
            ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
                why = "bind: " + errno_text(errno);
                continue;
            }
            if (::listen(fd.get(), 512) != 0) {
                why = "listen: " + errno_text(errno);
                continue;
            }
            listener_ = std::move(fd);
            break;
        }
        check<distributed_error>(bool(listener_), "TCP store ", where, ": rank 0 cannot listen there: ", why,
                                 why.find("in use") != std::string::npos ? " (another job or an earlier run holds the port; pick another)" : "");
        set_nonblocking(listener_.get());
        int pipe_fds[2];
        check<distributed_error>(::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) == 0, "TCP store ", where, ": pipe: ", errno_text(errno));
        wake_read_.reset(pipe_fds[0]);
        wake_write_.reset(pipe_fds[1]);
        thread_ = std::thread([this] { serve(); });
    }

    TcpStoreServer(const TcpStoreServer&) = delete;
    TcpStoreServer& operator=(const TcpStoreServer&) = delete;

    ~TcpStoreServer() {
        stop_.store(true);
        const char byte = 1;
        [[maybe_unused]] const auto written = ::write(wake_write_.get(), &byte, 1);
        ::shutdown(listener_.get(), SHUT_RDWR);
        if (thread_.joinable()) thread_.join();
    }

    const StoreAddress& address() const { return address_; }

private:
    struct Connection {
        Fd fd;
        std::string in, out;
        bool closing = false;  // close once `out` is sent (after an ERROR reply)
    };

    void serve() noexcept {
        try {
            serve_until_stopped();
        } catch (...) {  // out of memory: the connections close, so every client fails with "peer closed"
        }
    }

    void serve_until_stopped() {
        std::vector<std::unique_ptr<Connection>> connections;
        std::vector<pollfd> fds;
        while (!stop_.load()) {
            fds.clear();
            fds.push_back({wake_read_.get(), POLLIN, 0});
            fds.push_back({listener_.get(), POLLIN, 0});
            for (const auto& c : connections)
                fds.push_back({c->fd.get(), short((c->closing ? 0 : POLLIN) | (c->out.empty() ? 0 : POLLOUT)), 0});
            if (::poll(fds.data(), nfds_t(fds.size()), -1) < 0) {
                if (errno == EINTR) continue;
                return;  // cannot happen with valid descriptors; the clients then fail with "peer closed"
            }
            if (stop_.load() || (fds[0].revents & POLLIN)) return;
            if (fds[1].revents & POLLIN) accept_all(connections);
            for (std::size_t i = 2; i < fds.size(); ++i) {
                auto& c = *connections[i - 2];
                if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) receive(c);
                if (c.fd && !c.out.empty()) transmit(c);
                if (c.fd && c.closing && c.out.empty()) c.fd.reset();
            }
            std::erase_if(connections, [](const auto& c) { return !c->fd; });
        }
    }

    void accept_all(std::vector<std::unique_ptr<Connection>>& connections) {
        for (;;) {
            const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) return;  // EAGAIN, or a connection that died before we took it
            const int one = 1;
            ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            auto c = std::make_unique<Connection>();
            c->fd.reset(fd);
            connections.push_back(std::move(c));
        }
    }

    void receive(Connection& c) {
        char chunk[65536];
        for (;;) {
            const ssize_t n = ::recv(c.fd.get(), chunk, sizeof chunk, 0);
            if (n > 0) {
                c.in.append(chunk, std::size_t(n));
                continue;
            }
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
            if (n < 0 && errno == EINTR) continue;
            c.fd.reset();  // the client closed (or reset) its connection
            return;
        }
        std::size_t used = 0;
        while (!c.closing && c.in.size() - used >= 4) {
            const std::uint32_t length = get_u32(c.in.data() + used);
            if (length > tcp_store_max_message) {
                reply_error(c, olmax::detail::concat("a message of ", length, " bytes is larger than the limit"));
                break;
            }
            if (c.in.size() - used - 4 < length) break;
            handle(c, std::string_view(c.in).substr(used + 4, length));
            used += 4 + std::size_t(length);
        }
        c.in.erase(0, used);
    }

    void transmit(Connection& c) {
        while (!c.out.empty()) {
            const ssize_t n = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL);
            if (n > 0) {
                c.out.erase(0, std::size_t(n));
                continue;
            }
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            if (n < 0 && errno == EINTR) continue;
            c.fd.reset();
            return;
        }
    }

    void reply_error(Connection& c, std::string_view why) {
        std::string body(1, char(store_error));
        body += why;
        c.out += frame(body);
        c.closing = true;
        c.in.clear();
    }

    void handle(Connection& c, std::string_view body) {
        Reader r{body};
        const std::uint8_t op = r.byte();
        std::string reply;
        if (op == 'H') {
            const auto magic = r.string();
            if (!r.ok || magic != tcp_store_magic) return reply_error(c, "not an olmax TCP store client (wrong handshake)");
            reply.push_back(char(store_ok));
            put_string(reply, tcp_store_magic);
        } else if (op == 'S') {
            const auto key = r.string();
            const auto value = r.string();
            if (!r.ok) return reply_error(c, "malformed SET");
            keys_[std::string(key)] = std::string(value);
            reply.push_back(char(store_ok));
        } else if (op == 'G') {
            const auto key = r.string();
            if (!r.ok) return reply_error(c, "malformed GET");
            const auto it = keys_.find(std::string(key));
            if (it == keys_.end()) {
                reply.push_back(char(store_missing));
            } else {
                reply.push_back(char(store_ok));
                put_string(reply, it->second);
            }
        } else if (op == 'C') {
            const std::uint32_t count = r.u32();
            bool all = true;
            for (std::uint32_t i = 0; r.ok && i < count; ++i) all = keys_.count(std::string(r.string())) && all;
            if (!r.ok) return reply_error(c, "malformed CHECK");
            reply.push_back(char(all ? store_ok : store_missing));
        } else {
            return reply_error(c, olmax::detail::concat("unknown operation ", int(op)));
        }
        if (!r.rest.empty()) return reply_error(c, "trailing bytes after a request");
        c.out += frame(reply);
    }

    StoreAddress address_;
    Fd listener_, wake_read_, wake_write_;
    std::map<std::string, std::string, std::less<>> keys_;  // only the server thread touches it
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

}  // namespace detail

// ---- the client (the Gloo store) ------------------------------------------------------------------

/// A Gloo rendezvous store over TCP. With `host` true this object also runs the server on the
/// address (rank 0: it must outlive every other rank's use of the store). `timeout` bounds the
/// connection attempts (retried until then: the server may start later), every request, and the
/// waits that pass no timeout of their own.
class TcpStore final : public gloo::rendezvous::Store {
public:
    using clock = std::chrono::steady_clock;

    TcpStore(const StoreAddress& address, bool host, Timeout timeout) : address_(address), timeout_(timeout) {
        check(timeout_.count() > 0, "TcpStore: the timeout must be positive, got ", timeout_.count(), " ms");
        check(address_.port >= 1 && address_.port <= 65535, "TcpStore: port ", address_.port, " is not in 1..65535");
        check(!address_.host.empty(), "TcpStore: the host is empty");
        if (host) server_ = std::make_unique<detail::TcpStoreServer>(address_);
        connect(clock::now() + timeout_);
    }
    TcpStore(std::string_view address, bool host, Timeout timeout) : TcpStore(parse_store_address(address), host, timeout) {}

    const StoreAddress& address() const { return address_; }
    /// Whether this object runs the server.
    bool hosts() const { return server_ != nullptr; }

    void set(const std::string& key, const std::vector<char>& data) override {
        std::string body(1, 'S');
        detail::put_string(body, key);
        detail::put_string(body, std::string_view(data.data(), data.size()));
        const auto reply = request(body, "set '" + key + "'", clock::now() + timeout_);
        expect_ok(reply, "set '" + key + "'", true);
    }

    /// Waits (up to the store's timeout) for the key, then returns its value.
    std::vector<char> get(const std::string& key) override {
        const auto deadline = clock::now() + timeout_;
        wait_until({key}, deadline, timeout_);
        std::string body(1, 'G');
        detail::put_string(body, key);
        const auto reply = request(body, "get '" + key + "'", deadline);
        expect_ok(reply, "get '" + key + "'", false);
        detail::Reader r{std::string_view(reply).substr(1)};
        const auto value = r.string();
        check<distributed_error>(r.ok && r.rest.empty(), where(), ": get '", key, "': bad message (a malformed value)");
        return std::vector<char>(value.begin(), value.end());
    }

    void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
    void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
        wait_until(keys, clock::now() + timeout, timeout);
    }

    /// Whether every key exists now (no waiting).
    bool check_keys(const std::vector<std::string>& keys) {
        std::string body(1, 'C');
        detail::put_u32(body, std::uint32_t(keys.size()));
        for (const auto& k : keys) detail::put_string(body, k);
        const auto reply = request(body, "check", clock::now() + timeout_);
        check<distributed_error>(reply.size() == 1 && (reply[0] == char(detail::store_ok) || reply[0] == char(detail::store_missing)),
                                 where(), ": check: bad message (", describe_reply(reply), ")");
        return reply[0] == char(detail::store_ok);
    }

private:
    std::string where() const { return "TCP store " + address_.to_string(); }

    static long long ms_since(clock::time_point start) {
        return std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - start).count();
    }

    void wait_until(const std::vector<std::string>& keys, clock::time_point deadline, Timeout timeout) {
        auto pause = std::chrono::milliseconds(1);
        for (;;) {
            if (check_keys(keys)) return;
            if (clock::now() >= deadline) {
                std::string names;
                for (const auto& k : keys) names += (names.empty() ? "'" : ", '") + k + "'";
                throw distributed_error(olmax::detail::concat(where(), ": Timed out after ", timeout.count(), " ms waiting for ", names,
                                                              " (a rank that never started, died or is still on its way)"));
            }
            std::this_thread::sleep_for(std::min<clock::duration>(pause, deadline - clock::now()));
            pause = std::min(pause * 2, std::chrono::milliseconds(20));
        }
    }

    /// Connects to the server, retrying until `deadline`, then checks the handshake.
    void connect(clock::time_point deadline) {
        const auto start = clock::now();
        std::string why;
        for (;;) {
            if (try_connect(deadline, why)) break;
            if (clock::now() >= deadline)
                throw distributed_error(olmax::detail::concat(where(), ": could not connect within ", timeout_.count(), " ms (",
                                                              ms_since(start), " ms of attempts): ", why,
                                                              " (is rank 0 running and listening on that address?)"));
            std::this_thread::sleep_for(std::min<clock::duration>(std::chrono::milliseconds(50), deadline - clock::now()));
        }
        std::string body(1, 'H');
        detail::put_string(body, detail::tcp_store_magic);
        const auto reply = request(body, "handshake", clock::now() + timeout_);
        detail::Reader r{std::string_view(reply)};
        const bool ok = r.byte() == detail::store_ok && r.string() == detail::tcp_store_magic && r.ok && r.rest.empty();
        check<distributed_error>(ok, where(), ": handshake: bad message (", describe_reply(reply), "): is an olmax TCP store listening there?");
    }

    bool try_connect(clock::time_point deadline, std::string& why) {
        auto list = detail::resolve_store_address(address_, false);
        for (const addrinfo* ai = list.get(); ai; ai = ai->ai_next) {
            detail::Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
            if (!fd) {
                why = "socket: " + detail::errno_text(errno);
                continue;
            }
            int rc = ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
            if (rc != 0 && errno == EINPROGRESS) {
                pollfd p{fd.get(), POLLOUT, 0};
                const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
                rc = ::poll(&p, 1, int(std::clamp<long long>(left, 1, 1000)));
                if (rc == 0) {
                    why = "connection attempt timed out";
                    continue;
                }
                int error = 0;
                socklen_t length = sizeof error;
                ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length);
                if (rc < 0) error = errno;
                if (error != 0) {
                    why = "connect: " + detail::errno_text(error);
                    continue;
                }
                rc = 0;
            } else if (rc != 0) {
                why = "connect: " + detail::errno_text(errno);
                continue;
            }
            const int one = 1;
            ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            socket_ = std::move(fd);
            return true;
        }
        return false;
    }

    /// Sends one request and returns the reply's body; every failure throws distributed_error.
    std::string request(const std::string& body, const std::string& what, clock::time_point deadline) {
        check<distributed_error>(bool(socket_), where(), ": ", what, ": the connection was lost by an earlier failure");
        try {
            send_all(detail::frame(body), deadline);
            char header[4];
            receive_exactly(header, 4, deadline);
            const std::uint32_t length = detail::get_u32(header);
            check<distributed_error>(length <= detail::tcp_store_max_message, "bad message (a reply of ", length, " bytes)");
            std::string reply(length, '\0');
            receive_exactly(reply.data(), length, deadline);
            check<distributed_error>(!reply.empty(), "bad message (an empty reply)");
            if (reply[0] == char(detail::store_error)) {
                socket_.reset();  // the server closes the connection after an ERROR
                throw distributed_error("the server refused the request: " + reply.substr(1));
            }
            return reply;
        } catch (const distributed_error& e) {
            socket_.reset();  // the stream is out of step now
            throw distributed_error(olmax::detail::concat(where(), ": ", what, ": ", e.what()));
        }
    }

    void wait_for(short events, clock::time_point deadline, const char* what) {
        for (;;) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
            check<distributed_error>(left > 0, "Timed out ", what, " (timeout ", timeout_.count(), " ms; the server is alive but does not answer)");
            pollfd p{socket_.get(), events, 0};
            const int rc = ::poll(&p, 1, int(std::min<long long>(left, 1000)));
            if (rc > 0) return;
            check<distributed_error>(rc == 0 || errno == EINTR, "poll: ", detail::errno_text(errno));
        }
    }

    void send_all(const std::string& data, clock::time_point deadline) {
        std::size_t sent = 0;
        while (sent < data.size()) {
            const ssize_t n = ::send(socket_.get(), data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
            if (n > 0) {
                sent += std::size_t(n);
            } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                wait_for(POLLOUT, deadline, "sending");
            } else if (n < 0 && errno != EINTR) {
                const int code = errno;
                throw distributed_error(olmax::detail::concat(code == EPIPE || code == ECONNRESET ? "peer closed the connection (rank 0 exited?): " : "send: ",
                                                              detail::errno_text(code)));
            }
        }
    }

    void receive_exactly(char* out, std::size_t size, clock::time_point deadline) {
        std::size_t got = 0;
        while (got < size) {
            const ssize_t n = ::recv(socket_.get(), out + got, size - got, 0);
            if (n > 0) {
                got += std::size_t(n);
            } else if (n == 0) {
                throw distributed_error("peer closed the connection (rank 0 exited or is not an olmax TCP store)");
            } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                wait_for(POLLIN, deadline, "waiting for the reply");
            } else if (errno != EINTR) {
                const int code = errno;
                throw distributed_error(olmax::detail::concat(code == ECONNRESET ? "peer closed the connection (rank 0 exited?): " : "recv: ",
                                                              detail::errno_text(code)));
            }
        }
    }

    /// The reply must be OK (and, when `bare`, carry nothing else).
    void expect_ok(const std::string& reply, const std::string& what, bool bare) const {
        check<distributed_error>(!reply.empty() && reply[0] == char(detail::store_ok) && (!bare || reply.size() == 1), where(), ": ", what,
                                 ": bad message (", describe_reply(reply), ")");
    }

    static std::string describe_reply(const std::string& reply) {
        if (reply.empty()) return "an empty reply";
        return olmax::detail::concat("status ", int(std::uint8_t(reply[0])), ", ", reply.size(), " bytes");
    }

    StoreAddress address_;
    Timeout timeout_;
    std::unique_ptr<detail::TcpStoreServer> server_;  // rank 0 only; destroyed after socket_ (declared before)
    detail::Fd socket_;
};

}  // namespace olmax::distributed
