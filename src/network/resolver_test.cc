// The resolver against a real upstream DNS server on loopback that counts every query it gets:
// a box is a socket bound to the box's 127.0.0.x address, registered in a BoxRegistry.
#include "network/resolver.h"

#include <ares.h>
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <condition_variable>
#include <random>

#include "network/dns_message.h"
#include "network/dns_test_server.h"

namespace sbx::network {
namespace {

using Bytes = std::vector<uint8_t>;
using testing::FakeUpstream;

constexpr const char* kUpstreamIp = "127.0.0.2";
constexpr const char* kResolverIp = "127.0.0.3";
constexpr const char* kBoxIp = "127.0.0.4";
constexpr const char* kStrangerIp = "127.0.0.5";

void Put16(Bytes& b, uint16_t v) {
  b.push_back(static_cast<uint8_t>(v >> 8));
  b.push_back(static_cast<uint8_t>(v));
}

Bytes MakeQuery(uint16_t id, const std::string& name, uint16_t type, uint16_t edns = 0) {
  Bytes b;
  Put16(b, id);
  Put16(b, 0x0100);
  Put16(b, 1);
  Put16(b, 0);
  Put16(b, 0);
  Put16(b, edns ? 1 : 0);
  size_t start = 0;
  while (start < name.size()) {
    size_t dot = std::min(name.find('.', start), name.size());
    b.push_back(static_cast<uint8_t>(dot - start));
    b.insert(b.end(), name.begin() + static_cast<long>(start),
             name.begin() + static_cast<long>(dot));
    start = dot + 1;
  }
  b.push_back(0);
  Put16(b, type);
  Put16(b, dns::kClassIn);
  if (edns) {
    b.push_back(0);
    Put16(b, dns::kTypeOpt);
    Put16(b, edns);
    Put16(b, 0);
    Put16(b, 0);
    Put16(b, 0);
  }
  return b;
}

uint16_t Id(const Bytes& m) { return static_cast<uint16_t>(m[0] << 8 | m[1]); }
int Rcode(const Bytes& m) { return m[3] & 0xf; }
int AnswerCount(const Bytes& m) { return m[6] << 8 | m[7]; }
bool Tc(const Bytes& m) { return (m[2] & 0x02) != 0; }

sockaddr_in Sockaddr(const std::string& ip, uint16_t port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  inet_pton(AF_INET, ip.c_str(), &sa.sin_addr);
  return sa;
}

// A box's UDP socket: bound to its address, talking to the resolver.
class UdpClient {
 public:
  UdpClient(const std::string& ip, uint16_t resolver_port) {
    fd_.reset(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_in me = Sockaddr(ip, 0);
    EXPECT_EQ(bind(fd_.get(), reinterpret_cast<sockaddr*>(&me), sizeof me), 0);
    sockaddr_in to = Sockaddr(kResolverIp, resolver_port);
    EXPECT_EQ(connect(fd_.get(), reinterpret_cast<sockaddr*>(&to), sizeof to), 0);
  }
  void Send(const Bytes& q) {
    ASSERT_EQ(send(fd_.get(), q.data(), q.size(), 0), ssize_t(q.size()));
  }
  // The next answer, or empty after `ms` of real time (a bound, not a sleep).
  Bytes Receive(int ms = 10'000) {
    pollfd p{fd_.get(), POLLIN, 0};
    if (poll(&p, 1, ms) != 1) return {};
    Bytes buf(65536);
    ssize_t n = recv(fd_.get(), buf.data(), buf.size(), 0);
    if (n < 0) return {};
    buf.resize(static_cast<size_t>(n));
    return buf;
  }
  Bytes Ask(const Bytes& q, int ms = 10'000) {
    Send(q);
    return Receive(ms);
  }

 private:
  UniqueFd fd_;
};

class TcpClient {
 public:
  TcpClient(const std::string& ip, uint16_t resolver_port) {
    fd_.reset(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in me = Sockaddr(ip, 0);
    EXPECT_EQ(bind(fd_.get(), reinterpret_cast<sockaddr*>(&me), sizeof me), 0);
    sockaddr_in to = Sockaddr(kResolverIp, resolver_port);
    EXPECT_EQ(connect(fd_.get(), reinterpret_cast<sockaddr*>(&to), sizeof to), 0);
    timeval tv{10, 0};
    setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  void Send(const Bytes& q) {
    Bytes framed{static_cast<uint8_t>(q.size() >> 8), static_cast<uint8_t>(q.size())};
    framed.insert(framed.end(), q.begin(), q.end());
    ASSERT_EQ(send(fd_.get(), framed.data(), framed.size(), MSG_NOSIGNAL), ssize_t(framed.size()));
  }
  Bytes Receive() {
    uint8_t len[2];
    if (recv(fd_.get(), len, 2, MSG_WAITALL) != 2) return {};
    Bytes m(static_cast<size_t>(len[0] << 8 | len[1]));
    if (recv(fd_.get(), m.data(), m.size(), MSG_WAITALL) != ssize_t(m.size())) return {};
    return m;
  }
  // True when the resolver closed the connection (within the 10 s receive timeout).
  bool ClosedByPeer() {
    char c;
    return recv(fd_.get(), &c, 1, 0) == 0;
  }

 private:
  UniqueFd fd_;
};

// Collects audit events; waits for them with a bound.
class Events {
 public:
  EventSink Sink() {
    return [this](NetEvent e) {
      std::lock_guard lock(mu_);
      events_.push_back(std::move(e));
      cv_.notify_all();
    };
  }
  bool WaitFor(size_t n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return events_.size() >= n; });
  }
  std::vector<NetEvent> Get() {
    std::lock_guard lock(mu_);
    return events_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<NetEvent> events_;
};

class ResolverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    upstream_.Set("allowed.test", {.a = {"198.18.0.1"}, .txt = {"hello from upstream"}});
    upstream_.Set("x.wild.test", {.a = {"198.18.0.2"}});
    upstream_.Set("later.test", {.a = {"198.18.0.3"}});
    std::vector<std::string> big;
    for (int i = 0; i < 10; i++) big.push_back(std::string(200, static_cast<char>('a' + i)));
    upstream_.Set("big.allowed.test", {.txt = big});
    PutBox(R"({"mode": "allowlist", "allow": ["allowed.test", "*.wild.test",
               "*.allowed.test"]})");
  }

  void PutBox(const std::string& policy_json) {
    auto policy = Policy::FromJson(policy_json);
    ASSERT_TRUE(policy.ok()) << policy.status().message();
    auto box = std::make_shared<BoxNet>();
    box->id = "box1";
    box->box_ip = boost::asio::ip::make_address(kBoxIp);
    box->host_ip = boost::asio::ip::make_address(kResolverIp);
    box->policy = *policy;
    registry_.Put(box);
  }

  void StartResolver(ResolverConfig config = {}) {
    if (config.upstream.empty()) config.upstream = {upstream_.address()};
    config.on_event = events_.Sink();
    if (!config.clock) config.clock = &clock_;
    auto r = Resolver::Start(boost::asio::ip::make_address(kResolverIp), 0, registry_, config);
    ASSERT_TRUE(r.ok()) << r.status().message();
    resolver_ = std::move(*r);
    ASSERT_NE(resolver_->port(), 0);
  }

  FakeUpstream upstream_{kUpstreamIp};
  BoxRegistry registry_;
  FakeClock clock_;
  Events events_;
  std::unique_ptr<Resolver> resolver_;
};

TEST_F(ResolverTest, AllowedNameIsAnsweredFromUpstream) {
  StartResolver();
  UdpClient box(kBoxIp, resolver_->port());
  Bytes a = box.Ask(MakeQuery(0x4321, "Allowed.Test", dns::kTypeA));
  ASSERT_GE(a.size(), dns::kHeaderSize);
  EXPECT_EQ(Id(a), 0x4321);
  EXPECT_EQ(Rcode(a), 0);
  ares_addrttl addrs[4];
  int n = 4;
  ASSERT_EQ(ares_parse_a_reply(a.data(), static_cast<int>(a.size()), nullptr, addrs, &n),
            ARES_SUCCESS);
  ASSERT_EQ(n, 1);
  char text[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &addrs[0].ipaddr, text, sizeof text);
  EXPECT_STREQ(text, "198.18.0.1");

  Bytes w = box.Ask(MakeQuery(2, "x.wild.test", dns::kTypeA));
  ASSERT_FALSE(w.empty());
  EXPECT_EQ(AnswerCount(w), 1);

  Bytes t = box.Ask(MakeQuery(3, "allowed.test", dns::kTypeTxt, 1232));
  ASSERT_FALSE(t.empty());
  ares_txt_reply* txt = nullptr;
  ASSERT_EQ(ares_parse_txt_reply(t.data(), static_cast<int>(t.size()), &txt), ARES_SUCCESS);
  ASSERT_NE(txt, nullptr);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(txt->txt), txt->length), "hello from upstream");
  ares_free_data(txt);
  EXPECT_EQ(upstream_.queries(), 3);
}

TEST_F(ResolverTest, RandomSubdomainsOfADeniedNameNeverReachUpstream) {
  ResolverConfig config;
  config.burst = 5000;  // this test is about the policy, not the rate
  StartResolver(config);
  UdpClient box(kBoxIp, resolver_->port());
  std::mt19937 rng(42);
  const char* hex = "0123456789abcdef";
  for (int i = 0; i < 1000; i++) {
    std::string label;
    for (int j = 0; j < 40; j++) label.push_back(hex[rng() % 16]);
    uint16_t type = i % 2 ? dns::kTypeTxt : dns::kTypeA;
    Bytes a = box.Ask(MakeQuery(static_cast<uint16_t>(i), label + ".exfil.test", type));
    ASSERT_FALSE(a.empty()) << i;
    ASSERT_EQ(Id(a), i);
    ASSERT_EQ(Rcode(a), 3) << i;  // NXDOMAIN
  }
  // Names under no rule at all, and the bare parent of a wildcard, also stay home.
  EXPECT_EQ(Rcode(box.Ask(MakeQuery(7, "wild.test", dns::kTypeA))), 3);
  EXPECT_EQ(Rcode(box.Ask(MakeQuery(8, "4.3.2.1.in-addr.arpa", dns::kTypePtr))), 3);
  EXPECT_EQ(upstream_.queries(), 0);
}

// A name the policy refuses: NXDOMAIN carrying an Extended DNS Error (RFC 8914, "Blocked") that
// names sbx's policy and its mode, never its entries, when the query had EDNS (and then an OPT in
// the answer); a plain NXDOMAIN without; recorded for the command's caller either way.
TEST_F(ResolverTest, ARefusedNameIsBlockedWithAnExtendedErrorOnlyUnderEdns) {
  RefusalLog log(clock_);
  log.Open("box1");
  ResolverConfig config;
  config.refusals = &log;
  StartResolver(config);
  UdpClient box(kBoxIp, resolver_->port());
  Bytes with = box.Ask(MakeQuery(1, "Files.Example", dns::kTypeA, 1232));
  ASSERT_GE(with.size(), dns::kHeaderSize);
  EXPECT_EQ(Rcode(with), 3);
  EXPECT_EQ(with[10] << 8 | with[11], 1);  // ARCOUNT: the OPT record
  std::optional<dns::ExtendedError> ede = dns::ReadExtendedError(with);
  ASSERT_TRUE(ede.has_value());
  EXPECT_EQ(ede->info_code, dns::kEdeBlocked);
  EXPECT_EQ(ede->extra_text, "blocked by this sandbox's network policy (sbx; mode allowlist)");
  EXPECT_EQ(ede->extra_text.find("allowed.test"), std::string::npos);

  Bytes without = box.Ask(MakeQuery(2, "files.example", dns::kTypeA));
  ASSERT_GE(without.size(), dns::kHeaderSize);
  EXPECT_EQ(Rcode(without), 3);
  EXPECT_EQ(without[10] << 8 | without[11], 0);  // no OPT without one in the query
  EXPECT_FALSE(dns::ReadExtendedError(without).has_value());

  // An allowed name's answer has no EDE of sbx's.
  Bytes ok = box.Ask(MakeQuery(3, "allowed.test", dns::kTypeA, 1232));
  EXPECT_EQ(Rcode(ok), 0);
  EXPECT_FALSE(dns::ReadExtendedError(ok).has_value());
  EXPECT_EQ(upstream_.queries(), 1);

  BoxRefusals r = log.Since("box1", 0);
  ASSERT_EQ(r.refused.size(), 1u);
  EXPECT_EQ(r.refused[0].kind, RefusalKind::kDns);
  EXPECT_EQ(r.refused[0].target, "files.example");
  EXPECT_EQ(r.refused[0].reason, "not in the allowlist");
  EXPECT_EQ(r.refused[0].count, 2);

  // Open mode with a deny entry says so.
  PutBox(R"({"mode": "open", "deny": ["evil.test"]})");
  Bytes denied = box.Ask(MakeQuery(4, "evil.test", dns::kTypeA, 1232));
  EXPECT_EQ(Rcode(denied), 3);
  ede = dns::ReadExtendedError(denied);
  ASSERT_TRUE(ede.has_value());
  EXPECT_EQ(ede->extra_text, "blocked by this sandbox's network policy (sbx; mode open)");
  r = log.Since("box1", 0);
  ASSERT_EQ(r.refused.size(), 2u);
  EXPECT_EQ(r.refused[1].reason, "denied by the policy");
}

TEST_F(ResolverTest, UnknownSourceIsRefusedAndNotForwarded) {
  StartResolver();
  UdpClient stranger(kStrangerIp, resolver_->port());
  Bytes a = stranger.Ask(MakeQuery(9, "allowed.test", dns::kTypeA));
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(Rcode(a), 5);
  TcpClient tcp(kStrangerIp, resolver_->port());
  tcp.Send(MakeQuery(10, "allowed.test", dns::kTypeA));
  Bytes t = tcp.Receive();
  ASSERT_FALSE(t.empty());
  EXPECT_EQ(Rcode(t), 5);
  EXPECT_EQ(upstream_.queries(), 0);
}

TEST_F(ResolverTest, AaaaWithIpv6OffIsNodata) {
  StartResolver();
  UdpClient box(kBoxIp, resolver_->port());
  Bytes a = box.Ask(MakeQuery(11, "allowed.test", dns::kTypeAaaa));
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(Rcode(a), 0);
  EXPECT_EQ(AnswerCount(a), 0);
  // A denied name stays NXDOMAIN whatever the type.
  EXPECT_EQ(Rcode(box.Ask(MakeQuery(12, "denied.test", dns::kTypeAaaa))), 3);
  EXPECT_EQ(upstream_.queries(), 0);
}

TEST_F(ResolverTest, AaaaWithIpv6OnIsForwarded) {
  upstream_.Set("v6.allowed.test", {.aaaa = {"2001:db8::7"}});
  ResolverConfig config;
  config.ipv6 = true;
  StartResolver(config);
  UdpClient box(kBoxIp, resolver_->port());
  Bytes a = box.Ask(MakeQuery(13, "v6.allowed.test", dns::kTypeAaaa));
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(Rcode(a), 0);
  EXPECT_EQ(AnswerCount(a), 1);
  // An allowed name upstream does not know: upstream's own NXDOMAIN, relayed.
  Bytes n = box.Ask(MakeQuery(14, "unknown.wild.test", dns::kTypeA));
  ASSERT_FALSE(n.empty());
  EXPECT_EQ(Id(n), 14);
  EXPECT_EQ(Rcode(n), 3);
  EXPECT_EQ(upstream_.queries(), 2);
}

TEST_F(ResolverTest, TcpCarriesSeveralQueriesPerConnection) {
  StartResolver();
  TcpClient box(kBoxIp, resolver_->port());
  box.Send(MakeQuery(21, "allowed.test", dns::kTypeA));
  box.Send(MakeQuery(22, "denied.test", dns::kTypeA));
  std::map<uint16_t, Bytes> answers;
  for (int i = 0; i < 2; i++) {
    Bytes m = box.Receive();
    ASSERT_FALSE(m.empty());
    answers[Id(m)] = m;
  }
  EXPECT_EQ(Rcode(answers[21]), 0);
  EXPECT_EQ(AnswerCount(answers[21]), 1);
  EXPECT_EQ(Rcode(answers[22]), 3);
  box.Send(MakeQuery(23, "x.wild.test", dns::kTypeA));
  Bytes third = box.Receive();
  ASSERT_FALSE(third.empty());
  EXPECT_EQ(Id(third), 23);
  EXPECT_EQ(upstream_.queries(), 2);
}

TEST_F(ResolverTest, PipelinedTcpQueriesPastTheReadPauseAreAllAnswered) {
  StartResolver();
  TcpClient box(kBoxIp, resolver_->port());
  // 45 at once: more than a connection may owe (16), so reading pauses and resumes.
  for (int i = 0; i < 45; i++) {
    box.Send(MakeQuery(static_cast<uint16_t>(100 + i), i % 9 ? "no.test" : "allowed.test", 1));
  }
  std::set<uint16_t> ids;
  for (int i = 0; i < 45; i++) {
    Bytes m = box.Receive();
    ASSERT_FALSE(m.empty()) << i;
    ids.insert(Id(m));
  }
  EXPECT_EQ(ids.size(), 45u);
  EXPECT_EQ(upstream_.queries(), 5);
}

TEST_F(ResolverTest, MalformedQueriesGetFormerrOrNothing) {
  StartResolver();
  UdpClient box(kBoxIp, resolver_->port());
  Bytes two = MakeQuery(31, "allowed.test", dns::kTypeA);
  two[5] = 2;  // two questions announced
  Bytes a = box.Ask(two);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(Id(a), 31);
  EXPECT_EQ(Rcode(a), 1);
  Bytes loop{0, 32, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1};
  EXPECT_EQ(Rcode(box.Ask(loop)), 1);
  // Garbage: a runt and a "response" are dropped; random bytes never crash it.
  box.Send(Bytes{1, 2, 3});
  std::mt19937 rng(7);
  for (int i = 0; i < 200; i++) {
    Bytes junk(12 + rng() % 300);
    for (auto& byte : junk) byte = static_cast<uint8_t>(rng());
    junk[2] |= 0x80;  // QR: dropped without an answer
    box.Send(junk);
  }
  // Still serving, and the junk reached nobody.
  Bytes ok = box.Ask(MakeQuery(33, "allowed.test", dns::kTypeA));
  ASSERT_FALSE(ok.empty());
  EXPECT_EQ(Id(ok), 33);
  EXPECT_EQ(Rcode(ok), 0);
  EXPECT_EQ(upstream_.queries(), 1);
}

TEST_F(ResolverTest, SilentUpstreamIsServfailWithinTheTimeout) {
  upstream_.SetSilent(true);
  ResolverConfig config;
  config.upstream_timeout_ms = 200;
  config.upstream_tries = 1;
  StartResolver(config);
  UdpClient box(kBoxIp, resolver_->port());
  auto start = std::chrono::steady_clock::now();
  Bytes a = box.Ask(MakeQuery(41, "allowed.test", dns::kTypeA));
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(Id(a), 41);
  EXPECT_EQ(Rcode(a), 2);  // SERVFAIL
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_GE(upstream_.queries(), 1);
}

TEST_F(ResolverTest, AReplacedPolicyAppliesToTheNextQuery) {
  StartResolver();
  UdpClient box(kBoxIp, resolver_->port());
  EXPECT_EQ(Rcode(box.Ask(MakeQuery(51, "later.test", dns::kTypeA))), 3);
  EXPECT_EQ(upstream_.queries(), 0);
  PutBox(R"({"mode": "allowlist", "allow": ["later.test"]})");
  Bytes a = box.Ask(MakeQuery(52, "later.test", dns::kTypeA));
  EXPECT_EQ(Rcode(a), 0);
  EXPECT_EQ(AnswerCount(a), 1);
  EXPECT_EQ(Rcode(box.Ask(MakeQuery(53, "allowed.test", dns::kTypeA))), 3);
  EXPECT_EQ(upstream_.queries(), 1);
  PutBox(R"({"mode": "open", "deny": ["allowed.test"]})");
  EXPECT_EQ(Rcode(box.Ask(MakeQuery(54, "allowed.test", dns::kTypeA))), 3);
  EXPECT_EQ(Rcode(box.Ask(MakeQuery(55, "x.wild.test", dns::kTypeA))), 0);
  registry_.Remove("box1");
  EXPECT_EQ(Rcode(box.Ask(MakeQuery(56, "x.wild.test", dns::kTypeA))), 5);
  EXPECT_EQ(upstream_.queries(), 2);
}

TEST_F(ResolverTest, DeniedQueriesAreAuditedOncePerPeriod) {
  ResolverConfig config;
  config.audit_period_ms = 10'000;
  config.max_names_per_event = 64;
  StartResolver(config);
  UdpClient box(kBoxIp, resolver_->port());
  for (int i = 0; i < 3; i++) {
    EXPECT_EQ(Rcode(box.Ask(MakeQuery(60, "A.Exfil.test", dns::kTypeTxt))), 3);
  }
  for (int i = 0; i < 70; i++) {
    EXPECT_EQ(Rcode(box.Ask(MakeQuery(61, "n" + std::to_string(i) + ".exfil.test", dns::kTypeA))),
              3);
  }
  EXPECT_TRUE(events_.Get().empty());  // nothing before the period ends
  clock_.Advance(std::chrono::milliseconds(10'000));
  ASSERT_TRUE(events_.WaitFor(1));
  NetEvent e = events_.Get()[0];
  EXPECT_EQ(e.type, "net.dns_denied");
  EXPECT_EQ(e.box_id, "box1");
  ASSERT_TRUE(e.detail["names"].is_object());
  EXPECT_EQ(e.detail["names"].size(), 64u);
  EXPECT_EQ(e.detail["names"]["a.exfil.test"], 3);
  EXPECT_EQ(e.detail["dropped"], 7);  // 71 distinct names, 64 listed
  EXPECT_FALSE(e.detail.contains("limited"));

  // The next period's one denial comes out at Stop, in an event of its own.
  EXPECT_EQ(Rcode(box.Ask(MakeQuery(62, "again.exfil.test", dns::kTypeA))), 3);
  resolver_->Stop();
  auto all = events_.Get();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[1].detail["names"], nlohmann::json({{"again.exfil.test", 1}}));
  EXPECT_EQ(all[1].detail["dropped"], 0);
}

TEST_F(ResolverTest, OddBytesInADeniedNameAreAuditedEscaped) {
  StartResolver();
  UdpClient box(kBoxIp, resolver_->port());
  Bytes q = MakeQuery(65, "ab.allowed.test", dns::kTypeA);
  q[13] =
      0xff;  // one label "\255\046": not a DNS name, so never forwarded even under *.allowed.test
  q[14] = '.';
  EXPECT_EQ(Rcode(box.Ask(q)), 3);
  resolver_->Stop();
  auto all = events_.Get();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].detail["names"], nlohmann::json({{"\\255\\046.allowed.test", 1}}));
  EXPECT_NO_THROW((void)all[0].detail.dump());
  EXPECT_EQ(upstream_.queries(), 0);
}

TEST_F(ResolverTest, RateAndInflightCapsRefuse) {
  ResolverConfig config;
  config.burst = 3;
  config.queries_per_s = 1;
  StartResolver(config);
  UdpClient box(kBoxIp, resolver_->port());
  for (int i = 0; i < 3; i++) EXPECT_EQ(Rcode(box.Ask(MakeQuery(70, "denied.test", 1))), 3);
  EXPECT_EQ(Rcode(box.Ask(MakeQuery(71, "allowed.test", 1))), 5);  // past the burst
  EXPECT_EQ(upstream_.queries(), 0);
  clock_.Advance(std::chrono::milliseconds(1000));  // one token back
  EXPECT_EQ(Rcode(box.Ask(MakeQuery(72, "allowed.test", 1))), 0);
  EXPECT_EQ(Rcode(box.Ask(MakeQuery(73, "allowed.test", 1))), 5);
  resolver_->Stop();
  ASSERT_EQ(events_.Get().size(), 1u);
  EXPECT_EQ(events_.Get()[0].detail["limited"], 2);
}

TEST_F(ResolverTest, InflightCapRefuses) {
  upstream_.SetSilent(true);
  ResolverConfig config;
  config.max_inflight_per_box = 2;
  config.upstream_timeout_ms = 60'000;
  StartResolver(config);
  UdpClient box(kBoxIp, resolver_->port());
  box.Send(MakeQuery(80, "allowed.test", 1));
  box.Send(MakeQuery(81, "allowed.test", 1));
  Bytes third = box.Ask(MakeQuery(82, "allowed.test", 1));
  ASSERT_FALSE(third.empty());
  EXPECT_EQ(Id(third), 82);
  EXPECT_EQ(Rcode(third), 5);
  resolver_->Stop();  // ends the two in flight without waiting a minute
}

TEST_F(ResolverTest, LongAnswersAreTruncatedOverUdpAndWholeOverTcp) {
  StartResolver();
  UdpClient box(kBoxIp, resolver_->port());
  Bytes a = box.Ask(MakeQuery(91, "big.allowed.test", dns::kTypeTxt));
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(Id(a), 91);
  EXPECT_TRUE(Tc(a));
  EXPECT_LE(a.size(), 512u);
  EXPECT_EQ(AnswerCount(a), 0);
  Bytes e = box.Ask(MakeQuery(92, "big.allowed.test", dns::kTypeTxt, 4096));
  ASSERT_FALSE(e.empty());
  EXPECT_TRUE(Tc(e));
  EXPECT_LE(e.size(), dns::kMaxUdpSize);

  TcpClient tcp(kBoxIp, resolver_->port());
  tcp.Send(MakeQuery(93, "big.allowed.test", dns::kTypeTxt));
  Bytes whole = tcp.Receive();
  ASSERT_FALSE(whole.empty());
  EXPECT_FALSE(Tc(whole));
  EXPECT_EQ(AnswerCount(whole), 10);
  ares_txt_reply* txt = nullptr;
  ASSERT_EQ(ares_parse_txt_reply(whole.data(), static_cast<int>(whole.size()), &txt), ARES_SUCCESS);
  int count = 0;
  for (ares_txt_reply* t = txt; t; t = t->next) count++;
  ares_free_data(txt);
  EXPECT_EQ(count, 10);
  EXPECT_GE(upstream_.tcp_queries(), 1);  // c-ares retried upstream over TCP on its TC
}

TEST_F(ResolverTest, IdleTcpConnectionsAreClosed) {
  ResolverConfig config;
  config.tcp_idle_ms = 100;
  StartResolver(config);
  TcpClient box(kBoxIp, resolver_->port());
  EXPECT_TRUE(box.ClosedByPeer());
}

}  // namespace
}  // namespace sbx::network
