#include "network/resolver.h"

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/udp.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "network/cares_lookup.h"
#include "network/dns_message.h"

namespace sbx::network {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using asio::ip::udp;
using Bytes = std::vector<uint8_t>;
// Called exactly once per query, on the I/O thread; empty: no answer is sent.
using Reply = std::function<void(Bytes)>;

// Answers a TCP connection may owe at once before sbx stops reading from it.
constexpr size_t kMaxPendingPerConnection = 16;
// The longest name an audit event quotes (an escaped, invalid name can be ~4x its wire size).
constexpr size_t kMaxAuditedName = 255;

address Unmapped(const address& a) {
  if (a.is_v6() && a.to_v6().is_v4_mapped()) {
    return asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
  }
  return a;
}

Status BindError(const std::string& what, const boost::system::error_code& ec) {
  return Status::Error("dns resolver: " + what + ": " + ec.message(), ec.value());
}

// Why a name does not resolve, in the policy's words (as Policy::Decide's reasons).
std::string NameRefusal(const Policy& policy, bool valid_name) {
  if (!valid_name) return "not a valid host name";
  switch (policy.mode) {
    case Mode::kNone:
      return "the network policy is none";
    case Mode::kAllowlist:
      return "not in the allowlist";
    case Mode::kOpen:
      break;
  }
  return "denied by the policy";
}

// The Extended DNS Error of a refused name: the mode only, never the entries (a box may see its
// policy's entries through the proxy's refusal page, but DNS answers are easy to log and pass on).
dns::ExtendedError PolicyBlocked(const Policy& policy) {
  return {dns::kEdeBlocked, std::string("blocked by this sandbox's network policy (sbx; mode ") +
                                ModeName(policy.mode) + ")"};
}

}  // namespace

struct Resolver::Impl {
  struct BoxState {
    bool bucket_started = false;
    double tokens = 0;
    Clock::SteadyTime refilled;
    int inflight = 0;
    int tcp = 0;
    std::map<std::string, int64_t> denied;
    int64_t dropped = 0;
    int64_t limited = 0;
  };
  class Session;

  Impl(BoxRegistry& b, ResolverConfig c)
      : boxes(b),
        config(std::move(c)),
        clock(config.clock ? *config.clock : SystemClock()),
        work(asio::make_work_guard(ioc)),
        udp_socket(ioc),
        acceptor(ioc),
        accept_retry(ioc),
        udp_buffer(dns::kMaxMessage) {}

  Status Bind(const address& listen, uint16_t want);
  void ReceiveUdp();
  void Accept();
  void Admit(tcp::socket socket);
  void Handle(std::span<const uint8_t> msg, const address& from, bool over_udp, Reply reply);
  void Forward(const std::string& box_id, const dns::Query& query, bool over_udp, Reply reply);
  bool TakeToken(BoxState& st);
  void CountDenied(BoxState& st, const std::string& name);
  void Flush();
  void FlushLoop();
  void CloseAll();

  BoxRegistry& boxes;
  const ResolverConfig config;
  Clock& clock;
  // The I/O thread's; everything below it is touched only there (after Start), so needs no lock.
  asio::io_context ioc;
  asio::executor_work_guard<asio::io_context::executor_type> work;
  udp::socket udp_socket;
  tcp::acceptor acceptor;
  asio::steady_timer accept_retry;
  Bytes udp_buffer;
  udp::endpoint udp_from;
  uint16_t port = 0;
  std::map<std::string, BoxState> state;  // by box id
  std::set<std::shared_ptr<Session>> sessions;
  int tcp_total = 0;

  std::unique_ptr<CaresChannel> cares;
  std::unique_ptr<Clock::Waiter> waiter;
  std::thread io_thread;
  std::thread flush_thread;
  std::atomic<bool> stopping{false};
  std::once_flag stop_once;
};

// One TCP client: 2-byte length-prefixed messages (RFC 1035 4.2.2, RFC 7766), several per
// connection and pipelined, answered in the order answers come; closed after tcp_idle_ms without
// a query. Past kMaxPendingPerConnection answers owed or unwritten, reading pauses.
class Resolver::Impl::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Impl& impl, tcp::socket socket, address peer, std::string box_id)
      : impl_(impl),
        socket_(std::move(socket)),
        idle_(impl.ioc),
        peer_(std::move(peer)),
        box_id_(std::move(box_id)) {}

  void Start() {
    ArmIdle();
    MaybeRead();
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ec;
    socket_.close(ec);
    idle_.cancel();
    impl_.tcp_total--;
    if (!box_id_.empty()) {
      auto it = impl_.state.find(box_id_);
      if (it != impl_.state.end()) it->second.tcp--;
    }
    impl_.sessions.erase(shared_from_this());
  }

 private:
  void ArmIdle() {
    idle_.expires_after(std::chrono::milliseconds(impl_.config.tcp_idle_ms));
    idle_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (ec || self->closed_) return;
      self->Close();
    });
  }

  void MaybeRead() {
    // Answers not yet made and answers not yet written both count: a client that never reads
    // its answers stops being read from, and its memory stays bounded.
    if (closed_ || reading_ || pending_ + out_.size() >= kMaxPendingPerConnection) return;
    reading_ = true;
    asio::async_read(socket_, asio::buffer(length_),
                     [self = shared_from_this()](boost::system::error_code ec, size_t) {
                       if (ec || self->closed_) return self->Close();
                       size_t size = static_cast<size_t>(self->length_[0] << 8 | self->length_[1]);
                       self->message_.resize(size);
                       asio::async_read(self->socket_, asio::buffer(self->message_),
                                        [self](boost::system::error_code ec2, size_t) {
                                          self->reading_ = false;
                                          if (ec2 || self->closed_) return self->Close();
                                          self->OnMessage();
                                        });
                     });
  }

  void OnMessage() {
    ArmIdle();
    pending_++;
    std::weak_ptr<Session> weak = weak_from_this();
    impl_.Handle(message_, peer_, false, [weak](Bytes answer) {
      if (auto self = weak.lock()) self->Answered(std::move(answer));
    });
    MaybeRead();
  }

  void Answered(Bytes answer) {
    pending_--;
    if (!closed_ && !answer.empty() && answer.size() <= dns::kMaxMessage) {
      Bytes framed{static_cast<uint8_t>(answer.size() >> 8), static_cast<uint8_t>(answer.size())};
      framed.insert(framed.end(), answer.begin(), answer.end());
      out_.push_back(std::move(framed));
      Write();
    }
    MaybeRead();
  }

  void Write() {
    if (writing_ || out_.empty() || closed_) return;
    writing_ = true;
    asio::async_write(socket_, asio::buffer(out_.front()),
                      [self = shared_from_this()](boost::system::error_code ec, size_t) {
                        self->writing_ = false;
                        if (ec || self->closed_) return self->Close();
                        self->out_.pop_front();
                        self->Write();
                        self->MaybeRead();
                      });
  }

  Impl& impl_;
  tcp::socket socket_;
  asio::steady_timer idle_;
  address peer_;
  std::string box_id_;  // empty for an unknown source
  uint8_t length_[2] = {0, 0};
  Bytes message_;
  std::deque<Bytes> out_;  // at most kMaxPendingPerConnection answers
  bool reading_ = false;
  bool writing_ = false;
  bool closed_ = false;
  size_t pending_ = 0;
};

Status Resolver::Impl::Bind(const address& listen, uint16_t want) {
  boost::system::error_code ec;
  // With port 0 the UDP socket picks the port and TCP takes the same one; another process may
  // hold that TCP port, so a few ports are tried.
  for (int attempt = 0; attempt < 16; attempt++) {
    udp_socket.close(ec);
    acceptor.close(ec);
    udp::endpoint uep(listen, want);
    // An IPv6 wildcard takes IPv4 as well (boxes with --ipv6 ask over both).
    const bool dual = listen.is_v6() && listen.is_unspecified();
    udp_socket.open(uep.protocol(), ec);
    if (!ec && dual) udp_socket.set_option(asio::ip::v6_only(false), ec);
    if (!ec) udp_socket.bind(uep, ec);
    if (ec) return BindError("bind udp " + listen.to_string() + ":" + std::to_string(want), ec);
    uint16_t bound = udp_socket.local_endpoint(ec).port();
    if (ec) return BindError("udp local endpoint", ec);
    tcp::endpoint tep(listen, bound);
    acceptor.open(tep.protocol(), ec);
    if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec && dual) acceptor.set_option(asio::ip::v6_only(false), ec);
    if (!ec) acceptor.bind(tep, ec);
    if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec == boost::system::errc::address_in_use && want == 0) continue;
    if (ec) return BindError("listen tcp " + listen.to_string() + ":" + std::to_string(bound), ec);
    udp_socket.non_blocking(true, ec);  // a full send buffer drops an answer, never blocks
    if (ec) return BindError("udp non-blocking", ec);
    port = bound;
    return Status();
  }
  return Status::Error("dns resolver: no port free for both UDP and TCP", EADDRINUSE);
}

void Resolver::Impl::ReceiveUdp() {
  udp_socket.async_receive_from(
      asio::buffer(udp_buffer), udp_from, [this](boost::system::error_code ec, size_t n) {
        if (stopping || !udp_socket.is_open() || ec == asio::error::operation_aborted) return;
        if (!ec) {
          udp::endpoint to = udp_from;
          Handle({udp_buffer.data(), n}, to.address(), true, [this, to](Bytes answer) {
            if (answer.empty() || stopping) return;
            boost::system::error_code send_ec;
            // Dropped when the socket buffer is full: the client retries, as over any UDP.
            udp_socket.send_to(asio::buffer(answer), to, 0, send_ec);
          });
        }
        // Other errors (an ICMP error from an earlier answer's destination) do not end the loop.
        ReceiveUdp();
      });
}

void Resolver::Impl::Accept() {
  acceptor.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
    if (stopping || ec == asio::error::operation_aborted) return;
    if (ec) {
      // Out of descriptors or memory: accepting again at once would spin; wait a little.
      accept_retry.expires_after(std::chrono::milliseconds(100));
      accept_retry.async_wait([this](boost::system::error_code tec) {
        if (!tec && !stopping) Accept();
      });
      return;
    }
    Admit(std::move(socket));
    Accept();
  });
}

void Resolver::Impl::Admit(tcp::socket socket) {
  boost::system::error_code ec;
  address peer = Unmapped(socket.remote_endpoint(ec).address());
  if (ec) return;
  std::shared_ptr<const BoxNet> box = boxes.ByAddress(peer);
  std::string id = box ? box->id : std::string();
  if (tcp_total >= config.max_tcp_connections) return;  // the socket closes here
  if (box) {
    BoxState& st = state[id];
    if (st.tcp >= config.max_tcp_per_box) return;
    st.tcp++;
  }
  tcp_total++;
  auto session = std::make_shared<Session>(*this, std::move(socket), peer, id);
  sessions.insert(session);
  session->Start();
}

bool Resolver::Impl::TakeToken(BoxState& st) {
  Clock::SteadyTime now = clock.Steady();
  if (!st.bucket_started) {
    st.bucket_started = true;
    st.tokens = config.burst;
    st.refilled = now;
  }
  double elapsed = std::chrono::duration<double>(now - st.refilled).count();
  st.tokens = std::min(config.burst, st.tokens + std::max(0.0, elapsed) * config.queries_per_s);
  st.refilled = now;
  if (st.tokens < 1) return false;
  st.tokens -= 1;
  return true;
}

void Resolver::Impl::CountDenied(BoxState& st, const std::string& full) {
  // ASCII whatever the box sent (ReadName escapes odd bytes), so the event's JSON is valid.
  std::string name = full.substr(0, kMaxAuditedName);
  auto it = st.denied.find(name);
  if (it != st.denied.end()) {
    it->second++;
  } else if (st.denied.size() < config.max_names_per_event) {
    st.denied.emplace(std::move(name), 1);
  } else {
    st.dropped++;
  }
}

void Resolver::Impl::Handle(std::span<const uint8_t> msg, const address& from, bool over_udp,
                            Reply reply) {
  dns::Parsed parsed = dns::ParseQuery(msg);
  if (parsed.outcome == dns::Parsed::Outcome::kDrop) return reply({});
  const dns::Query& query = parsed.query;
  // Looked up per query, so a replaced policy applies to the very next one.
  std::shared_ptr<const BoxNet> box = boxes.ByAddress(Unmapped(from));
  if (!box) return reply(dns::BuildAnswer(query, dns::Rcode::kRefused));
  BoxState& st = state[box->id];
  if (!TakeToken(st)) {
    st.limited++;
    return reply(dns::BuildAnswer(query, dns::Rcode::kRefused));
  }
  if (parsed.outcome == dns::Parsed::Outcome::kAnswer) {
    return reply(dns::BuildAnswer(query, parsed.rcode));
  }
  const dns::Question& q = *query.question;
  if (!box->policy.NameMayResolve(q.name)) {
    std::optional<std::string> normal = NormalizeName(q.name);
    CountDenied(st, normal ? *normal : q.name);
    // Recorded before the answer goes: the command that gets it may exit at once.
    if (config.refusals)
      config.refusals->Add(box->id, RefusalKind::kDns,
                           (normal ? *normal : q.name).substr(0, kMaxAuditedName),
                           NameRefusal(box->policy, normal.has_value()));
    const dns::ExtendedError ede = PolicyBlocked(box->policy);
    return reply(dns::BuildAnswer(query, dns::Rcode::kNxDomain, &ede));
  }
  if (q.type == dns::kTypeAxfr || q.type == dns::kTypeIxfr) {
    return reply(dns::BuildAnswer(query, dns::Rcode::kRefused));
  }
  if (q.type == dns::kTypeAaaa && !config.ipv6) {
    return reply(dns::BuildAnswer(query, dns::Rcode::kNoError));
  }
  if (st.inflight >= config.max_inflight_per_box) {
    st.limited++;
    return reply(dns::BuildAnswer(query, dns::Rcode::kRefused));
  }
  Forward(box->id, query, over_udp, std::move(reply));
}

namespace {

struct Upstream {
  std::function<void(int status, Bytes answer)> done;
};

void OnUpstreamAnswer(void* arg, int status, int /*timeouts*/, unsigned char* abuf, int alen) {
  std::unique_ptr<Upstream> up(static_cast<Upstream*>(arg));
  Bytes answer;
  if (status == ARES_SUCCESS && abuf && alen > 0) answer.assign(abuf, abuf + alen);
  up->done(status, std::move(answer));
}

}  // namespace

void Resolver::Impl::Forward(const std::string& box_id, const dns::Query& query, bool over_udp,
                             Reply reply) {
  state[box_id].inflight++;
  // c-ares gives the upstream query an ID of its own and checks the answer's ID and question.
  Bytes wire = dns::BuildUpstreamQuery(query, 0);
  auto up = std::make_unique<Upstream>();
  up->done = [this, box_id, query, over_udp, reply](int status, Bytes answer) {
    // On the c-ares thread: back to the I/O thread, which owns the state and the sockets.
    asio::post(
        ioc, [this, box_id, query, over_udp, reply, status, answer = std::move(answer)]() mutable {
          auto it = state.find(box_id);
          if (it != state.end()) it->second.inflight--;
          if (stopping) return reply({});
          if (status != ARES_SUCCESS || answer.size() < dns::kHeaderSize) {
            return reply(dns::BuildAnswer(query, dns::Rcode::kServFail));
          }
          (void)dns::SetId(answer, query.id);  // true: the size is checked above
          if (over_udp) answer = dns::FitAnswer(query, std::move(answer), query.MaxUdpAnswer());
          reply(std::move(answer));
        });
  };
  Upstream* raw = up.get();
  bool posted = cares->Post([raw, wire = std::move(wire)](ares_channel channel) {
    ares_send(channel, wire.data(), static_cast<int>(wire.size()), OnUpstreamAnswer, raw);
  });
  if (posted) {
    (void)up.release();  // OnUpstreamAnswer owns it now
  } else {
    state[box_id].inflight--;  // stopping
    reply({});
  }
}

void Resolver::Impl::Flush() {
  for (auto it = state.begin(); it != state.end();) {
    BoxState& st = it->second;
    if (!st.denied.empty() || st.dropped > 0 || st.limited > 0) {
      NetEvent event{"net.dns_denied", it->first, nlohmann::json::object()};
      nlohmann::json names = nlohmann::json::object();
      for (const auto& [name, count] : st.denied) names[name] = count;
      event.detail["names"] = std::move(names);
      event.detail["dropped"] = st.dropped;
      if (st.limited > 0) event.detail["limited"] = st.limited;
      st.denied.clear();
      st.dropped = 0;
      st.limited = 0;
      if (config.on_event) config.on_event(std::move(event));
    }
    // A removed box's state goes once nothing of it is left; a live box keeps its bucket.
    if (st.inflight == 0 && st.tcp == 0 && !boxes.ById(it->first)) {
      it = state.erase(it);
    } else {
      ++it;
    }
  }
}

void Resolver::Impl::FlushLoop() {
  auto period = std::chrono::milliseconds(std::max<int64_t>(1, config.audit_period_ms));
  Clock::SteadyTime next = clock.Steady() + period;
  // Deadlines on a fixed schedule from the start, so a FakeClock advanced before this thread
  // first waits still flushes.
  while (!waiter->WaitUntil(next)) {
    asio::post(ioc, [this] { Flush(); });
    Clock::SteadyTime now = clock.Steady();
    while (next <= now) next += period;
  }
}

void Resolver::Impl::CloseAll() {
  boost::system::error_code ec;
  udp_socket.close(ec);
  acceptor.close(ec);
  accept_retry.cancel();
  auto open = sessions;  // Close() erases from `sessions`
  for (const auto& session : open) session->Close();
}

Result<std::unique_ptr<Resolver>> Resolver::Start(const address& listen, uint16_t port,
                                                  BoxRegistry& boxes, ResolverConfig config) {
  auto impl = std::make_unique<Impl>(boxes, std::move(config));
  Impl& s = *impl;
  SBX_RETURN_IF_ERROR(s.Bind(listen, port));
  CaresOptions options;
  options.servers = s.config.upstream;
  options.timeout_ms = s.config.upstream_timeout_ms;
  options.tries = s.config.upstream_tries;
  auto cares = CaresChannel::Start(options);
  if (!cares.ok()) return cares.status().Wrap("dns resolver");
  s.cares = std::move(*cares);
  s.waiter = s.clock.NewWaiter();
  asio::post(s.ioc, [&s] {
    s.ReceiveUdp();
    s.Accept();
  });
  s.io_thread = std::thread([&s] { s.ioc.run(); });
  s.flush_thread = std::thread([&s] { s.FlushLoop(); });
  return std::unique_ptr<Resolver>(new Resolver(std::move(impl)));
}

Resolver::Resolver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Resolver::~Resolver() { Stop(); }

uint16_t Resolver::port() const { return impl_->port; }

void Resolver::Stop() {
  Impl& s = *impl_;
  std::call_once(s.stop_once, [&s] {
    s.stopping = true;
    asio::post(s.ioc, [&s] { s.CloseAll(); });
    // Queries in flight end now; their answers are posted to the I/O thread, which drops them.
    s.cares->Stop();
    s.waiter->Wake();
    s.flush_thread.join();
    // Posted after everything above, so the last flush counts every query handled.
    asio::post(s.ioc, [&s] {
      s.Flush();
      s.ioc.stop();
    });
    s.io_thread.join();
  });
}

}  // namespace sbx::network
