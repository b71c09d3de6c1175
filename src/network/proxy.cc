// The egress proxy (proxy.h). One coroutine per connection, all on one strand: accept, find the
// box, peek, decide, connect, then two pumps (one per direction) that splice(2) through a pipe
// each, paced by the box's token buckets.
// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include "network/proxy.h"

#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cstring>
#include <future>
#include <map>

#include "common/fd.h"
#include "network/sni.h"

// linux/netfilter_ipv4.h and ip6_tables.h clash with the libc headers; the values are ABI.
#ifndef SO_ORIGINAL_DST
#define SO_ORIGINAL_DST 80
#endif
#ifndef IP6T_SO_ORIGINAL_DST
#define IP6T_SO_ORIGINAL_DST 80
#endif

namespace sbx::network {
namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using boost::system::error_code;
using Strand = net::strand<net::any_io_executor>;
using Clock = std::chrono::steady_clock;

constexpr int64_t kChunk = 64 << 10;    // one splice: a default pipe's capacity
constexpr size_t kMaxDrain = 64 << 10;  // what a refused HTTP client may still send us
// A refused TLS client gets one handshake, bounded in bytes and time, then the 403.
constexpr size_t kMaxRefusalHandshake = 64 << 10;
constexpr auto kRefusalTimeout = std::chrono::seconds(5);

struct SslCtxFree {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
struct SslFree {
  void operator()(SSL* s) const { SSL_free(s); }
};

address Unmap(const address& a) {
  if (a.is_v6() && a.to_v6().is_v4_mapped())
    return net::ip::make_address_v4(net::ip::v4_mapped, a.to_v6());
  return a;
}

std::string Endpoint(const address& a, uint16_t port) {
  return a.is_v6() ? "[" + a.to_string() + "]:" + std::to_string(port)
                   : a.to_string() + ":" + std::to_string(port);
}

// One connection: the box's socket, the upstream's, and the timers its waits use. Close() ends
// every pending operation (Stop, or the other direction failing).
struct Conn {
  explicit Conn(const Strand& s) : client(s), upstream(s), timer(s), up_timer(s), down_timer(s) {}
  tcp::socket client, upstream;
  net::steady_timer timer, up_timer, down_timer;
  bool closed = false;
  bool expired = false;  // `timer` reached its deadline during the current wait
  void Close() {
    closed = true;
    error_code ignored;
    client.close(ignored);
    upstream.close(ignored);
    timer.cancel();
    up_timer.cancel();
    down_timer.cancel();
  }
};

struct BoxState {
  int open = 0;
  // The box's budget, shared with the interceptor's sessions of its connections (bandwidth.h).
  std::shared_ptr<BoxBandwidth> bandwidth;
};

}  // namespace

// Everything here is touched only on `strand` (which is why nothing is GUARDED_BY a mutex).
struct EgressProxy::State {
  State(Strand s, BoxRegistry& b, ProxyConfig c)
      : strand(std::move(s)), acceptor(strand), boxes(b), config(std::move(c)) {}
  Strand strand;
  tcp::acceptor acceptor;
  BoxRegistry& boxes;
  ProxyConfig config;
  bool stopped = false;
  uint64_t next_id = 0;
  std::map<uint64_t, std::weak_ptr<Conn>> conns;
  std::map<std::string, BoxState> box_state;
  std::vector<address> host_addresses;
  std::optional<Clock::time_point> host_addresses_at;
  std::unique_ptr<SSL_CTX, SslCtxFree> refusal_tls;  // with config.ca: refused TLS clients' server

  void Emit(const std::string& type, const std::string& box, nlohmann::json detail) {
    if (config.on_event) config.on_event(NetEvent{type, box, std::move(detail)});
  }

  void CloseAll() {
    if (stopped) return;
    stopped = true;
    error_code ignored;
    acceptor.close(ignored);
    for (auto& [id, weak] : conns)
      if (std::shared_ptr<Conn> c = weak.lock()) c->Close();
  }

  // The host's own addresses, for the "never the host" rule: refreshed when stale, since
  // interfaces come and go (every box's veth adds one).
  bool IsHostAddress(const address& raw) {
    auto now = Clock::now();
    if (!host_addresses_at ||
        now - *host_addresses_at > std::chrono::milliseconds(config.host_addresses_refresh_ms)) {
      ifaddrs* list = nullptr;
      if (getifaddrs(&list) == 0) {
        host_addresses.clear();
        for (ifaddrs* i = list; i; i = i->ifa_next) {
          if (!i->ifa_addr) continue;
          if (i->ifa_addr->sa_family == AF_INET) {
            auto* in = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
            host_addresses.push_back(net::ip::address_v4(ntohl(in->sin_addr.s_addr)));
          } else if (i->ifa_addr->sa_family == AF_INET6) {
            auto* in6 = reinterpret_cast<sockaddr_in6*>(i->ifa_addr);
            net::ip::address_v6::bytes_type b;
            std::copy(in6->sin6_addr.s6_addr, in6->sin6_addr.s6_addr + 16, b.begin());
            host_addresses.push_back(net::ip::address_v6(b));
          }
        }
        freeifaddrs(list);
        host_addresses_at = now;
      } else {
        spdlog::warn("egress proxy: getifaddrs: {}", std::strerror(errno));
      }
    }
    address a = Unmap(raw);
    return std::find(host_addresses.begin(), host_addresses.end(), a) != host_addresses.end();
  }
};

namespace {

using State = EgressProxy::State;

// One of box `box`'s open connections has ended (on the strand).
void ReleaseOpen(State& st, const std::string& box) {
  auto it = st.box_state.find(box);
  if (it != st.box_state.end() && --it->second.open == 0 && !st.boxes.ById(box))
    st.box_state.erase(it);
}

// An intercepted connection's place in its box's count: the interceptor keeps it while it serves
// the connection, and its end gives the place back on the proxy's strand (the interceptor's
// sessions run on strands of their own).
struct OpenHold {
  std::weak_ptr<State> st;
  std::string box;
  ~OpenHold() {
    if (std::shared_ptr<State> s = st.lock())
      net::post(s->strand, [s, b = std::move(box)] { ReleaseOpen(*s, b); });
  }
};

Result<tcp::endpoint> OriginalDst(tcp::socket& s) {
  int fd = s.native_handle();
  error_code ec;
  tcp::endpoint local = s.local_endpoint(ec);
  if (ec) return Status::Error("getsockname: " + ec.message(), ec.value());
  if (local.address().is_v4() || Unmap(local.address()).is_v4()) {
    sockaddr_in in{};
    socklen_t len = sizeof in;
    if (getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, &in, &len) != 0)
      return Status::Errno("getsockopt SO_ORIGINAL_DST");
    return tcp::endpoint(net::ip::address_v4(ntohl(in.sin_addr.s_addr)), ntohs(in.sin_port));
  }
  sockaddr_in6 in6{};
  socklen_t len = sizeof in6;
  if (getsockopt(fd, SOL_IPV6, IP6T_SO_ORIGINAL_DST, &in6, &len) != 0)
    return Status::Errno("getsockopt IP6T_SO_ORIGINAL_DST");
  net::ip::address_v6::bytes_type b;
  std::copy(in6.sin6_addr.s6_addr, in6.sin6_addr.s6_addr + 16, b.begin());
  return tcp::endpoint(net::ip::address_v6(b), ntohs(in6.sin6_port));
}

// Arms c->timer to cancel `s` at `deadline`; c->expired says afterwards whether it did.
void ArmDeadline(const std::shared_ptr<Conn>& c, tcp::socket& s, Clock::time_point deadline) {
  c->expired = false;
  c->timer.expires_at(deadline);
  c->timer.async_wait([c, &s](error_code ec) {
    if (ec) return;
    c->expired = true;
    error_code ignored;
    s.cancel(ignored);
  });
}

// The box's address and entry; the registry entry is fixed for the connection's life.
struct Attempt {
  std::shared_ptr<const BoxNet> box;
  std::shared_ptr<BoxBandwidth> bandwidth;  // the box's budget, held for the connection's life
  tcp::endpoint dst;
  std::optional<std::string> name;
  bool http = false;
  bool tls = false;
};

// After a refusal's answer: a half-close, then a short bounded drain, so that closing with
// unread bytes does not reset the connection before the client reads the answer.
net::awaitable<void> ShutdownAndDrain(const std::shared_ptr<Conn>& c) {
  error_code ec;
  c->client.shutdown(tcp::socket::shutdown_send, ec);
  std::vector<char> sink(4096);
  size_t drained = 0;
  while (!ec && !c->closed && !c->expired && drained < kMaxDrain) {
    drained += co_await c->client.async_read_some(net::buffer(sink),
                                                  net::redirect_error(net::use_awaitable, ec));
  }
}

// Sends what OpenSSL wrote into `out` to the client; false when the client is gone.
net::awaitable<bool> FlushTls(const std::shared_ptr<Conn>& c, BIO* out) {
  char* data = nullptr;
  long n = BIO_get_mem_data(out, &data);
  if (n <= 0) co_return true;
  std::string bytes(data, static_cast<size_t>(n));
  (void)BIO_reset(out);
  error_code ec;
  co_await net::async_write(c->client, net::buffer(bytes),
                            net::redirect_error(net::use_awaitable, ec));
  co_return !ec && !c->closed && !c->expired;
}

// A refused TLS client: the handshake is finished here with a leaf for the name it asked for (the
// address without one) under sbx's CA, which the box trusts, and `response` is the only record
// sent inside, then close_notify. Nothing goes upstream. Memory BIOs, so that the ClientHello
// already peeked is fed first; the whole exchange is bounded by kRefusalTimeout and
// kMaxRefusalHandshake. A client that does not trust the CA (or speaks no HTTP) just sees the
// connection end.
net::awaitable<void> RefuseTls(const std::shared_ptr<State>& st, const std::shared_ptr<Conn>& c,
                               const Attempt& a, const std::string& peeked,
                               const std::string& response) {
  std::string host = a.name ? *a.name : Unmap(a.dst.address()).to_string();
  // From the refusals' own cache: names a box is refused never evict the leaves of hosts it may
  // reach (ca.h).
  Result<std::shared_ptr<const Leaf>> leaf = st->config.ca->LeafFor(host, LeafUse::kRefusal);
  if (!leaf.ok()) co_return;
  std::unique_ptr<SSL, SslFree> ssl(SSL_new(st->refusal_tls.get()));
  if (!ssl) co_return;
  BIO* in = BIO_new(BIO_s_mem());
  BIO* out = BIO_new(BIO_s_mem());
  if (!in || !out) {
    BIO_free(in);
    BIO_free(out);
    co_return;
  }
  SSL_set_bio(ssl.get(), in, out);  // the SSL owns both from here
  if (SSL_use_certificate(ssl.get(), (*leaf)->cert) != 1 ||
      SSL_use_PrivateKey(ssl.get(), (*leaf)->key) != 1) {
    ERR_clear_error();
    co_return;
  }
  SSL_set_accept_state(ssl.get());
  BIO_write(in, peeked.data(), static_cast<int>(peeked.size()));
  ArmDeadline(c, c->client, Clock::now() + kRefusalTimeout);
  size_t got = peeked.size();
  std::vector<char> buf(16 << 10);
  error_code ec;
  bool done = false;
  while (!c->closed && !c->expired) {
    int r = SSL_do_handshake(ssl.get());
    bool flushed = co_await FlushTls(c, out);
    if (!flushed) break;
    if (r == 1) {
      done = true;
      break;
    }
    if (SSL_get_error(ssl.get(), r) != SSL_ERROR_WANT_READ || got >= kMaxRefusalHandshake) break;
    size_t n = co_await c->client.async_read_some(net::buffer(buf),
                                                  net::redirect_error(net::use_awaitable, ec));
    if (ec || n == 0) break;
    got += n;
    BIO_write(in, buf.data(), static_cast<int>(n));
  }
  if (done && SSL_write(ssl.get(), response.data(), static_cast<int>(response.size())) > 0) {
    (void)SSL_shutdown(ssl.get());
    bool flushed = co_await FlushTls(c, out);
    if (flushed) co_await ShutdownAndDrain(c);
  }
  ERR_clear_error();
  c->timer.cancel();
}

// Refuses: audit, the 403 naming the policy (plain HTTP; TLS with SNI inside a handshake the
// proxy finishes itself, when it has a CA), close. `peeked`: the client's first bytes.
net::awaitable<void> Refuse(const std::shared_ptr<State>& st, const std::shared_ptr<Conn>& c,
                            const Attempt& a, const std::string& reason,
                            const std::string& peeked) {
  std::string dst = Endpoint(Unmap(a.dst.address()), a.dst.port());
  nlohmann::json detail = {{"dst", dst}, {"name", a.name.value_or("")}, {"reason", reason}};
  st->Emit("net.connect_denied", a.box->id, std::move(detail));
  std::string destination = a.name ? *a.name + ":" + std::to_string(a.dst.port()) : dst;
  // Before any answer: the command that sees the connection fail may exit at once, and its
  // caller is told from this record.
  if (st->config.refusals)
    st->config.refusals->Add(a.box->id, RefusalKind::kConnect, destination, reason);
  spdlog::debug("egress proxy: box {} to {} ({}) refused: {}", a.box->id, dst, a.name.value_or("-"),
                reason);
  std::string hint = a.box->refusal_hint.empty() ? st->config.change_hint : a.box->refusal_hint;
  for (size_t at = hint.find("{id}"); at != std::string::npos; at = hint.find("{id}", at))
    hint.replace(at, 4, a.box->id);
  if (a.http && !c->closed) {
    std::string response = RefusalResponse(a.box->policy, destination, reason, hint);
    error_code ec;
    ArmDeadline(c, c->client, Clock::now() + std::chrono::seconds(2));
    co_await net::async_write(c->client, net::buffer(response),
                              net::redirect_error(net::use_awaitable, ec));
    if (!ec && !c->closed) co_await ShutdownAndDrain(c);
    c->timer.cancel();
  } else if (a.tls && a.name && st->refusal_tls && !c->closed) {
    // Only a client that asked for a name (SNI) gets the page: one that dialled a raw address
    // sees the connection closed, as on E2B, whose SDK tests (and agents' code) take a failing
    // `curl https://IP` as "not reachable".
    std::string response = RefusalResponse(a.box->policy, destination, reason, hint);
    co_await RefuseTls(st, c, a, peeked, response);
  }
  c->Close();
}

net::awaitable<Result<std::vector<address>>> Resolve(const std::shared_ptr<State>& st,
                                                     const std::shared_ptr<Conn>& c,
                                                     const std::string& name) {
  if (!st->config.lookup) co_return Status::Error("resolve " + name + ": no resolver", ENOSYS);
  struct Slot {
    std::optional<Result<std::vector<address>>> result;
    bool abandoned = false;
  };
  auto slot = std::make_shared<Slot>();
  c->timer.expires_after(std::chrono::milliseconds(st->config.connect_timeout_ms));
  Strand strand = st->strand;
  st->config.lookup->Resolve(name, [slot, c, strand](Result<std::vector<address>> r) {
    net::post(strand, [slot, c, r = std::move(r)]() mutable {
      if (slot->abandoned) return;  // timed out: the timer is someone else's now
      slot->result = std::move(r);
      c->timer.cancel();
    });
  });
  error_code ec;
  co_await c->timer.async_wait(net::redirect_error(net::use_awaitable, ec));
  slot->abandoned = true;
  if (!slot->result) co_return Status::Error("resolve " + name + ": timed out", ETIMEDOUT);
  co_return std::move(*slot->result);
}

// One direction: `from` to `to` through a pipe, until EOF (passed on as a half-close) or an
// error (which ends both directions). Counts the bytes written to `to`.
net::awaitable<void> Pump(const std::shared_ptr<Conn>& c, bool up, BoxBandwidth& bandwidth,
                          uint64_t* count) {
  tcp::socket& from = up ? c->client : c->upstream;
  tcp::socket& to = up ? c->upstream : c->client;
  net::steady_timer& pace = up ? c->up_timer : c->down_timer;
  int fds[2];
  bool splicing = pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0;
  UniqueFd pipe_r(splicing ? fds[0] : -1), pipe_w(splicing ? fds[1] : -1);
  std::vector<char> buf;  // the read/write fallback's, only when splice cannot
  if (!splicing) buf.resize(kChunk);
  error_code ec;
  bool failed = false;
  while (!c->closed) {
    // All of kChunk when the box is unlimited; else what its budget grants now, or a wait.
    int64_t want = bandwidth.Take(up, kChunk);
    while (want == 0 && !c->closed) {
      pace.expires_after(bandwidth.Wait(up, kChunk));
      co_await pace.async_wait(net::redirect_error(net::use_awaitable, ec));
      want = bandwidth.Take(up, kChunk);
    }
    auto give_back = [&](int64_t unused) {
      if (unused > 0) bandwidth.Give(up, unused);
    };
    if (c->closed) {
      give_back(want);
      break;
    }
    ssize_t n = splicing ? splice(from.native_handle(), nullptr, pipe_w.get(), nullptr,
                                  static_cast<size_t>(want), SPLICE_F_MOVE | SPLICE_F_NONBLOCK)
                         : ::recv(from.native_handle(), buf.data(), static_cast<size_t>(want), 0);
    if (n < 0) {
      int err = errno;
      give_back(want);
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        co_await from.async_wait(tcp::socket::wait_read,
                                 net::redirect_error(net::use_awaitable, ec));
        if (ec) {
          failed = true;
          break;
        }
        continue;
      }
      if (splicing && err == EINVAL) {  // a socket splice does not take: copy instead
        splicing = false;
        buf.resize(kChunk);
        continue;
      }
      failed = true;
      break;
    }
    give_back(want - n);
    if (n == 0) {  // EOF: pass the half-close on; the other direction goes on
      to.shutdown(tcp::socket::shutdown_send, ec);
      break;
    }
    size_t left = static_cast<size_t>(n), off = 0;
    while (left > 0 && !c->closed) {
      ssize_t w = splicing ? splice(pipe_r.get(), nullptr, to.native_handle(), nullptr, left,
                                    SPLICE_F_MOVE | SPLICE_F_NONBLOCK)
                           : ::send(to.native_handle(), buf.data() + off, left, MSG_NOSIGNAL);
      if (w > 0) {
        left -= static_cast<size_t>(w);
        off += static_cast<size_t>(w);
        *count += static_cast<uint64_t>(w);
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        co_await to.async_wait(tcp::socket::wait_write,
                               net::redirect_error(net::use_awaitable, ec));
        if (!ec) continue;
      }
      failed = true;
      break;
    }
    if (failed) break;
  }
  if (failed) c->Close();
}

// Writes the bytes peeked from the client, then relays both ways until both directions are done.
net::awaitable<void> Relay(const std::shared_ptr<State>& st, const std::shared_ptr<Conn>& c,
                           const Attempt& a, const std::string& peeked, const tcp::endpoint& to) {
  auto start = Clock::now();
  uint64_t sent = 0, received = 0;
  error_code ec;
  c->client.non_blocking(true, ec);
  if (!ec) c->upstream.non_blocking(true, ec);
  if (!ec && !peeked.empty())
    co_await net::async_write(c->upstream, net::buffer(peeked),
                              net::redirect_error(net::use_awaitable, ec));
  if (!ec && !c->closed) {
    sent = peeked.size();
    // The upstream-to-box pump runs beside this coroutine; `timer` wakes this one when it ends.
    bool down_done = false;
    net::co_spawn(st->strand, Pump(c, /*up=*/false, *a.bandwidth, &received),
                  [c, &down_done](std::exception_ptr) {
                    down_done = true;
                    c->timer.cancel();
                  });
    co_await Pump(c, /*up=*/true, *a.bandwidth, &sent);
    while (!down_done) {
      c->timer.expires_at(Clock::time_point::max());
      co_await c->timer.async_wait(net::redirect_error(net::use_awaitable, ec));
    }
  }
  c->Close();
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  nlohmann::json detail = {{"dst", Endpoint(to.address(), to.port())},
                           {"name", a.name.value_or("")},
                           {"sent", sent},
                           {"received", received},
                           {"ms", ms}};
  if (Unmap(a.dst.address()) != to.address())
    detail["requested"] = Endpoint(Unmap(a.dst.address()), a.dst.port());
  st->Emit("net.connect", a.box->id, std::move(detail));
}

net::awaitable<void> Handle(std::shared_ptr<State> st, std::shared_ptr<Conn> c) {
  const uint64_t id = st->next_id++;
  st->conns[id] = c;
  std::string counted_box;  // whose open count this connection holds
  struct Done {
    State* st;
    uint64_t id;
    std::string* box;
    std::shared_ptr<Conn> c;
    ~Done() {
      c->Close();
      st->conns.erase(id);
      if (!box->empty()) ReleaseOpen(*st, *box);
    }
  } done{st.get(), id, &counted_box, c};

  error_code ec;
  // Every co_await below takes named values only: GCC 12 destroys some temporaries of a
  // co_await's full-expression twice (a string made in the call's argument list).
  std::string reason;
  std::string peeked;  // the client's first bytes (empty until the peek)
  tcp::endpoint peer = c->client.remote_endpoint(ec);
  if (ec) co_return;
  Attempt a;
  a.box = st->boxes.ByAddress(peer.address());
  if (!a.box) {
    spdlog::debug("egress proxy: connection from {}, which is no box's: closed",
                  peer.address().to_string());
    co_return;
  }
  Result<tcp::endpoint> dst = OriginalDst(c->client);
  if (!dst.ok()) {
    spdlog::debug("egress proxy: box {}: {}", a.box->id, dst.status().message());
    a.dst = c->client.local_endpoint(ec);
    reason = "no original destination (not a redirected connection)";
    co_await Refuse(st, c, a, reason, peeked);
    co_return;
  }
  a.dst = tcp::endpoint(Unmap(dst->address()), dst->port());

  BoxState& bs = st->box_state[a.box->id];
  if (bs.open >= a.box->max_connections) {
    reason = "too many connections";
    co_await Refuse(st, c, a, reason, peeked);
    co_return;
  }
  ++bs.open;
  counted_box = a.box->id;
  // The box's current limit paces all of its connections, relayed here or intercepted (a new
  // entry's limit applies from its first connection on, to those under way too).
  if (!bs.bandwidth)
    bs.bandwidth = std::make_shared<BoxBandwidth>(a.box->egress_bytes_per_s);
  else
    bs.bandwidth->SetRate(a.box->egress_bytes_per_s);
  a.bandwidth = bs.bandwidth;

  // Peek: until the first bytes say what they are, kMaxPeek, or the peek timeout (a protocol
  // where the server speaks first: decided by address alone).
  Sniffed sniffed;
  const auto peek_deadline = Clock::now() + std::chrono::milliseconds(st->config.peek_timeout_ms);
  for (;;) {
    sniffed = Sniff(peeked);
    if (sniffed.kind != Sniffed::Kind::kNeedMore) break;
    if (peeked.size() >= kMaxPeek) {
      sniffed = {Sniffed::Kind::kMalformed, std::nullopt, "first bytes longer than 16 KiB"};
      break;
    }
    size_t had = peeked.size();
    peeked.resize(kMaxPeek);
    ArmDeadline(c, c->client, peek_deadline);
    size_t n = co_await c->client.async_read_some(net::buffer(peeked.data() + had, kMaxPeek - had),
                                                  net::redirect_error(net::use_awaitable, ec));
    peeked.resize(had + n);
    c->timer.cancel();
    if (c->closed) co_return;
    if (c->expired) {
      // The deadline passed (perhaps just after bytes came in): what is there decides.
      sniffed = Sniff(peeked);
      if (sniffed.kind == Sniffed::Kind::kNeedMore)
        sniffed = {Sniffed::Kind::kOther, std::nullopt, {}};
      break;
    }
    if (ec) co_return;  // gone before saying anything we could decide on
  }
  a.http = sniffed.kind == Sniffed::Kind::kHttp ||
           (sniffed.kind == Sniffed::Kind::kMalformed && !peeked.empty() && peeked[0] != 0x16);
  a.tls = sniffed.kind == Sniffed::Kind::kTls;
  if (sniffed.kind == Sniffed::Kind::kMalformed) {
    reason = sniffed.error;
    co_await Refuse(st, c, a, reason, peeked);
    co_return;
  }
  if (sniffed.name) {
    a.name = NormalizeName(*sniffed.name);
    if (!a.name) {
      reason = a.tls ? "the SNI is not a valid host name" : "the Host is not a valid host name";
      co_await Refuse(st, c, a, reason, peeked);
      co_return;
    }
  }

  const Policy& policy = a.box->policy;
  const uint16_t port = a.dst.port();
  const std::vector<Cidr>& opened = st->config.opened_ranges;
  if (st->IsHostAddress(a.dst.address())) {
    reason = "the host's own address";
    co_await Refuse(st, c, a, reason, peeked);
    co_return;
  }
  // Boxes are in private ranges, but an operator's --allow-range may have opened them.
  if (st->boxes.ByAddress(a.dst.address())) {
    reason = "another box's address";
    co_await Refuse(st, c, a, reason, peeked);
    co_return;
  }
  std::vector<address> targets;
  if (a.name && (policy.AllowsName(*a.name, port) || policy.mode == Mode::kOpen)) {
    // Never the box's choice of address: the name's own addresses, as the host resolves them.
    Result<std::vector<address>> resolved = co_await Resolve(st, c, *a.name);
    if (c->closed) co_return;
    if (!resolved.ok()) {
      reason = "cannot resolve " + *a.name + ": " + resolved.status().message();
      co_await Refuse(st, c, a, reason, peeked);
      co_return;
    }
    std::string refusal;
    for (const address& raw : *resolved) {
      address ip = Unmap(raw);
      if (st->IsHostAddress(ip) || st->boxes.ByAddress(ip)) {
        if (refusal.empty()) refusal = "resolves to the host's own address or a box's";
        continue;
      }
      Policy::Decision d = policy.Decide(a.name, ip, port, Proto::kTcp, opened);
      if (d.allowed) {
        targets.push_back(ip);
      } else if (refusal.empty()) {
        std::optional<Cidr> range = AlwaysDeniedRange(ip, opened);
        refusal = range ? "resolves into " + range->ToString()
                        : "resolves to " + ip.to_string() + ", refused: " + d.reason;
      }
    }
    if (targets.empty()) {
      reason = refusal.empty() ? "resolves to no address" : refusal;
      co_await Refuse(st, c, a, reason, peeked);
      co_return;
    }
    auto same = std::find(targets.begin(), targets.end(), a.dst.address());
    if (same != targets.end()) std::rotate(targets.begin(), same, same + 1);
  } else {
    Policy::Decision d = policy.Decide(a.name, a.dst.address(), port, Proto::kTcp, opened);
    if (!d.allowed) {
      reason = d.reason;
      co_await Refuse(st, c, a, reason, peeked);
      co_return;
    }
    targets.push_back(a.dst.address());
  }

  // Connect to the first target that answers, within the connect timeout.
  tcp::endpoint to;
  bool connected = false;
  std::string connect_error;
  const auto connect_deadline =
      Clock::now() + std::chrono::milliseconds(st->config.connect_timeout_ms);
  for (const address& ip : targets) {
    to = tcp::endpoint(ip, port);
    ArmDeadline(c, c->upstream, connect_deadline);
    co_await c->upstream.async_connect(to, net::redirect_error(net::use_awaitable, ec));
    c->timer.cancel();
    if (c->closed) co_return;
    if (!ec) {
      // The relay forwards what it reads as soon as it has it (the peeked ClientHello apart from
      // the rest, many small TLS records through the interceptor): Nagle would hold each small
      // write for the peer's delayed ACK, about 40 ms.
      c->upstream.set_option(tcp::no_delay(true), ec);
      ec.clear();
      connected = true;
      break;
    }
    connect_error = c->expired ? "timed out" : ec.message();
    error_code ignored;
    c->upstream.close(ignored);
    if (c->expired) break;
  }
  if (!connected) {
    nlohmann::json detail = {{"dst", Endpoint(to.address(), to.port())},
                             {"name", a.name.value_or("")},
                             {"error", "connect: " + connect_error},
                             {"sent", 0},
                             {"received", 0},
                             {"ms", 0}};
    st->Emit("net.connect", a.box->id, std::move(detail));
    if (a.http) {
      std::string body = "sbx: cannot connect to " + Endpoint(to.address(), to.port()) + ": " +
                         connect_error + "\n";
      std::string response =
          "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\n"
          "Content-Length: " +
          std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
      ArmDeadline(c, c->client, Clock::now() + std::chrono::seconds(2));
      co_await net::async_write(c->client, net::buffer(response),
                                net::redirect_error(net::use_awaitable, ec));
      c->timer.cancel();
    }
    co_return;
  }

  Interceptor* interceptor = st->config.interceptor;
  if (interceptor && interceptor->Wants(*a.box, a.name.value_or(""))) {
    // The interceptor owns the pair from here on (and audits it); the connection counts against
    // the box's cap until the interceptor lets go of its hold.
    auto hold = std::make_shared<OpenHold>();
    hold->st = st;
    hold->box = std::exchange(counted_box, std::string());
    interceptor->Serve(std::move(c->client), std::move(peeked), std::move(c->upstream),
                       a.name.value_or(""), a.tls, a.box, a.bandwidth, std::move(hold));
    co_return;
  }
  co_await Relay(st, c, a, peeked, to);
}

net::awaitable<void> AcceptLoop(std::shared_ptr<State> st) {
  net::steady_timer backoff(st->strand);
  for (;;) {
    auto c = std::make_shared<Conn>(st->strand);
    error_code ec;
    co_await st->acceptor.async_accept(c->client, net::redirect_error(net::use_awaitable, ec));
    if (st->stopped || !st->acceptor.is_open()) co_return;
    if (ec) {
      // EMFILE and the like: the listener stays, and tries again shortly.
      spdlog::warn("egress proxy: accept: {}", ec.message());
      backoff.expires_after(std::chrono::milliseconds(100));
      co_await backoff.async_wait(net::redirect_error(net::use_awaitable, ec));
      continue;
    }
    error_code ignored;
    c->client.set_option(tcp::no_delay(true), ignored);  // as for the upstream side
    net::co_spawn(st->strand, Handle(st, c), [](std::exception_ptr e) {
      if (!e) return;
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        spdlog::error("egress proxy: connection: {}", x.what());
      }
    });
  }
}

// Runs `fn` on the strand and waits for it (inline when already there).
template <typename Fn>
auto OnStrand(const std::shared_ptr<State>& st, Fn fn) {
  std::promise<decltype(fn())> result;
  auto future = result.get_future();
  net::dispatch(st->strand, [&] {
    if constexpr (std::is_void_v<decltype(fn())>) {
      fn();
      result.set_value();
    } else {
      result.set_value(fn());
    }
  });
  return future.get();
}

}  // namespace

std::string RefusalResponse(const Policy& policy, const std::string& destination,
                            const std::string& reason, const std::string& hint) {
  std::string summary = PolicySummary(policy);
  std::string body = "sbx: egress to " + destination +
                     " denied by this sandbox's network policy (" + summary + "): " + reason + "." +
                     (hint.empty() ? "" : " " + hint) + "\n";
  // The reason phrase says it too: pip shows only the status line ("403 Client Error: ...").
  std::string mode = policy.mode == Mode::kOpen        ? "open"
                     : policy.mode == Mode::kAllowlist ? "allowlist"
                                                       : "none";
  return "HTTP/1.1 403 Forbidden by this sandbox's network policy (mode " + mode +
         ")\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

Result<std::unique_ptr<EgressProxy>> EgressProxy::Start(net::any_io_executor ex,
                                                        tcp::endpoint listen, BoxRegistry& boxes,
                                                        ProxyConfig config) {
  auto st = std::make_shared<State>(net::make_strand(ex), boxes, std::move(config));
  if (st->config.ca) {
    st->refusal_tls.reset(SSL_CTX_new(TLS_server_method()));
    if (!st->refusal_tls) return Status::Error("egress proxy: SSL_CTX_new", ENOMEM);
    SSL_CTX_set_min_proto_version(st->refusal_tls.get(), TLS1_2_VERSION);
    SSL_CTX_set_options(st->refusal_tls.get(), SSL_OP_NO_RENEGOTIATION);
    // One answer, then close: no session tickets (and no ALPN: clients fall back to HTTP/1.1).
    SSL_CTX_set_num_tickets(st->refusal_tls.get(), 0);
    SSL_CTX_set_session_cache_mode(st->refusal_tls.get(), SSL_SESS_CACHE_OFF);
  }
  error_code ec;
  std::string where = "egress proxy: listen on " + Endpoint(listen.address(), listen.port());
  st->acceptor.open(listen.protocol(), ec);
  if (!ec) st->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec && listen.address().is_v6() && listen.address().is_unspecified())
    st->acceptor.set_option(net::ip::v6_only(false), ec);
  if (!ec) st->acceptor.bind(listen, ec);
  if (!ec) st->acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return Status::Error(where + ": " + ec.message(), ec.value());
  uint16_t port = st->acceptor.local_endpoint(ec).port();
  if (ec) return Status::Error(where + ": " + ec.message(), ec.value());
  net::co_spawn(st->strand, AcceptLoop(st), net::detached);
  return std::unique_ptr<EgressProxy>(new EgressProxy(std::move(st), port));
}

EgressProxy::~EgressProxy() { Stop(); }

void EgressProxy::Stop() {
  if (stopped_.exchange(true)) return;
  OnStrand(state_, [st = state_.get()] { st->CloseAll(); });
}

int EgressProxy::OpenConnections(const std::string& box_id) {
  return OnStrand(state_, [st = state_.get(), &box_id] {
    auto it = st->box_state.find(box_id);
    return it == st->box_state.end() ? 0 : it->second.open;
  });
}

uint64_t EgressProxy::LimitedBytes(const std::string& box_id) {
  return OnStrand(state_, [st = state_.get(), &box_id]() -> uint64_t {
    auto it = st->box_state.find(box_id);
    if (it == st->box_state.end()) return 0;
    return it->second.bandwidth ? it->second.bandwidth->granted() : 0;
  });
}

}  // namespace sbx::network
