// The firewall against real packets. Every test builds its own namespaces (names carry the pid,
// so tests run in parallel) and never touches the initial namespace's network:
//
//   box A (10.213.0.2/30, eth0) ---- hA 10.213.0.1/30 |
//   box B (10.213.0.6/30, eth0) ---- hB 10.213.0.5/30 | host: Firewall, resolver and proxy
//   upstream (eth0 198.19.0.2/24) -- hU 198.19.0.1/24 | stand-ins, a service on :8080
//   upstream's lo: 198.18.0.10 and 198.18.0.53 (UDP :5000 and :53, TCP :80)
//
// The host forwards (ip_forward=1, rp_filter off) from the start, so every "dropped" below is the
// firewall's doing, not the kernel's. "Dropped" is a bounded wait that is expected to run out.
#include "network/firewall.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/ip_icmp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "common/fd.h"

namespace sbx::network {
namespace {

constexpr uint16_t kDnsPort = 5353;
constexpr uint16_t kProxyPort = 15001;
constexpr int kSoOriginalDst = 80;  // <linux/netfilter_ipv4.h>, which clashes with <netinet/in.h>
constexpr int kArriveMs = 10000;    // generous: only a slow machine makes us wait this long
constexpr int kDropMs = 400;        // the expected outcome of a dropped packet

int Sh(const std::string& cmd) {
  int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}
std::string ShOut(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

// Runs `f` on a thread of its own that entered namespace `ns` (sockets made there stay there).
template <typename F>
auto InNetns(const std::string& ns, F&& f) {
  using R = std::invoke_result_t<F>;
  std::optional<R> out;
  std::thread th([&] {
    UniqueFd fd(open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd || setns(fd.get(), CLONE_NEWNET) != 0) return;
    out.emplace(f());
  });
  th.join();
  if (!out) {
    ADD_FAILURE() << "could not enter network namespace " << ns;
    std::abort();
  }
  return std::move(*out);
}

sockaddr_in Addr(const std::string& ip, uint16_t port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  inet_pton(AF_INET, ip.c_str(), &sa.sin_addr);
  return sa;
}
std::string Str(const sockaddr_in& sa) {
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof buf);
  return std::string(buf) + ":" + std::to_string(ntohs(sa.sin_port));
}

bool Readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, ms) == 1;
}

UniqueFd Listener(int type, const std::string& ip, uint16_t port) {
  UniqueFd fd(socket(AF_INET, type | SOCK_CLOEXEC, 0));
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa = Addr(ip, port);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) return UniqueFd();
  if (type == SOCK_STREAM && listen(fd.get(), 16) != 0) return UniqueFd();
  return fd;
}

// What reached a TCP listener within `ms`: the peer and the original destination.
struct Accepted {
  std::string peer, original_dst;
};
std::optional<Accepted> AcceptWithin(int lfd, int ms) {
  if (!Readable(lfd, ms)) return std::nullopt;
  sockaddr_in peer{};
  socklen_t len = sizeof peer;
  UniqueFd c(accept4(lfd, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC));
  if (!c) return std::nullopt;
  Accepted a{Str(peer), ""};
  sockaddr_in orig{};
  len = sizeof orig;
  if (getsockopt(c.get(), SOL_IP, kSoOriginalDst, &orig, &len) == 0) a.original_dst = Str(orig);
  return a;
}

struct Datagram {
  std::string peer, data;
};
std::optional<Datagram> RecvWithin(int fd, int ms) {
  if (!Readable(fd, ms)) return std::nullopt;
  char buf[512];
  sockaddr_in peer{};
  socklen_t len = sizeof peer;
  ssize_t n = recvfrom(fd, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&peer), &len);
  if (n < 0) return std::nullopt;
  return Datagram{Str(peer), std::string(buf, n)};
}

// Made in the namespace of the calling thread; used from any thread.
UniqueFd UdpSocket() { return UniqueFd(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)); }
bool SendTo(int fd, const std::string& ip, uint16_t port, const std::string& data) {
  sockaddr_in sa = Addr(ip, port);
  return sendto(fd, data.data(), data.size(), 0, reinterpret_cast<sockaddr*>(&sa), sizeof sa) ==
         static_cast<ssize_t>(data.size());
}

// A non-blocking connect from namespace `ns`; whether it completed within `ms`.
bool ConnectWithin(const std::string& ns, const std::string& ip, uint16_t port, int ms) {
  UniqueFd fd =
      InNetns(ns, [] { return UniqueFd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)); });
  fcntl(fd.get(), F_SETFL, O_NONBLOCK);
  sockaddr_in sa = Addr(ip, port);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) return true;
  if (errno != EINPROGRESS) return false;
  pollfd p{fd.get(), POLLOUT, 0};
  if (poll(&p, 1, ms) != 1) return false;
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
  return err == 0;
}

uint16_t Checksum(const void* data, size_t len) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t sum = 0;
  for (size_t i = 0; i + 1 < len; i += 2) sum += (p[i] << 8) | p[i + 1];
  if (len & 1) sum += p[len - 1] << 8;
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return htons(static_cast<uint16_t>(~sum));
}

// An ICMP echo from namespace `ns` to `ip`; whether its reply came within `ms`.
bool PingWithin(const std::string& ns, const std::string& ip, int ms) {
  UniqueFd fd =
      InNetns(ns, [] { return UniqueFd(socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_ICMP)); });
  icmphdr h{};
  h.type = ICMP_ECHO;
  h.un.echo.id = htons(static_cast<uint16_t>(getpid()));
  h.un.echo.sequence = htons(1);
  h.checksum = Checksum(&h, sizeof h);
  sockaddr_in sa = Addr(ip, 0);
  if (sendto(fd.get(), &h, sizeof h, 0, reinterpret_cast<sockaddr*>(&sa), sizeof sa) < 0)
    return false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (true) {
    int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                    deadline - std::chrono::steady_clock::now())
                                    .count());
    if (left <= 0 || !Readable(fd.get(), left)) return false;
    char buf[256];
    ssize_t n = recv(fd.get(), buf, sizeof buf, 0);
    if (n < 20) continue;
    size_t ihl = static_cast<size_t>(buf[0] & 0x0f) * 4;
    if (static_cast<size_t>(n) < ihl + sizeof(icmphdr)) continue;
    icmphdr r;
    memcpy(&r, buf + ihl, sizeof r);
    if (r.type == ICMP_ECHOREPLY && r.un.echo.id == h.un.echo.id) return true;
  }
}

Policy UdpPolicy(const std::vector<std::string>& entries) {
  Policy p;
  p.mode = Mode::kAllowlist;
  for (const auto& e : entries) {
    auto r = ParseRule(e);
    EXPECT_TRUE(r.ok()) << e << ": " << r.status().message();
    if (r.ok()) p.allow.push_back(*r);
  }
  return p;
}

// Counters count the stray packets (IPv6 router solicitations...) of the boxes' kernels.
std::string WithoutCounters(const std::string& ruleset) {
  static const std::regex counter("counter packets [0-9]+ bytes [0-9]+");
  return std::regex_replace(ruleset, counter, "counter");
}

address Ip(const std::string& s) { return boost::asio::ip::make_address(s); }

// The namespaces and veths of one test, removed however the test ends.
class Topology {
 public:
  Topology() {
    std::string pid = std::to_string(getpid());
    host_ = "sbxfw" + pid + "h";
    a_ = "sbxfw" + pid + "a";
    b_ = "sbxfw" + pid + "b";
    up_ = "sbxfw" + pid + "u";
  }
  ~Topology() {
    for (const auto& ns : {host_, a_, b_, up_}) (void)Sh("ip netns del " + ns);
  }

  // Returns an empty string or what failed.
  std::string Build() {
    const std::vector<std::string> cmds = {
        "ip netns add " + host_,
        "ip netns add " + a_,
        "ip netns add " + b_,
        "ip netns add " + up_,
        // Before any interface exists, so every one of them inherits it.
        "ip netns exec " + host_ + " sysctl -qw net.ipv4.conf.all.rp_filter=0",
        "ip netns exec " + host_ + " sysctl -qw net.ipv4.conf.default.rp_filter=0",
        "ip netns exec " + host_ + " sysctl -qw net.ipv4.ip_forward=1",
        "ip -n " + host_ + " link set lo up",
        "ip -n " + host_ + " link add hA type veth peer name eth0 netns " + a_,
        "ip -n " + host_ + " link add hB type veth peer name eth0 netns " + b_,
        "ip -n " + host_ + " link add hU type veth peer name eth0 netns " + up_,
        "ip -n " + host_ + " addr add 10.213.0.1/30 dev hA",
        "ip -n " + host_ + " addr add 10.213.0.5/30 dev hB",
        "ip -n " + host_ + " addr add 198.19.0.1/24 dev hU",
        "ip -n " + host_ + " addr add fd00:5b::1/64 dev hA nodad",
        "ip -n " + host_ + " link set hA up",
        "ip -n " + host_ + " link set hB up",
        "ip -n " + host_ + " link set hU up",
        "ip -n " + host_ + " route add 198.18.0.0/16 via 198.19.0.2",
        "ip -n " + a_ + " link set lo up",
        "ip -n " + a_ + " addr add 10.213.0.2/30 dev eth0",
        "ip -n " + a_ + " addr add fd00:5b::2/64 dev eth0 nodad",
        "ip -n " + a_ + " link set eth0 up",
        "ip -n " + a_ + " route add default via 10.213.0.1",
        "ip -n " + b_ + " link set lo up",
        "ip -n " + b_ + " addr add 10.213.0.6/30 dev eth0",
        "ip -n " + b_ + " link set eth0 up",
        "ip -n " + b_ + " route add default via 10.213.0.5",
        "ip -n " + up_ + " link set lo up",
        "ip -n " + up_ + " addr add 198.19.0.2/24 dev eth0",
        "ip -n " + up_ + " addr add 198.18.0.10/32 dev lo",
        "ip -n " + up_ + " addr add 198.18.0.53/32 dev lo",
        "ip -n " + up_ + " link set eth0 up",
        "ip -n " + up_ + " route add default via 198.19.0.1",
        // The host's loopback seen from box A: 127.0.0.1 routed to its gateway, as an attacker
        // who owns the box could arrange (route_localnet lets it leave through eth0).
        "ip netns exec " + a_ + " sysctl -qw net.ipv4.conf.eth0.route_localnet=1",
        "ip -n " + a_ + " rule add pref 10 to 127.0.0.1/32 lookup 100",
        "ip -n " + a_ + " route add 127.0.0.1/32 via 10.213.0.1 dev eth0 table 100",
        "ip -n " + a_ + " rule del pref 0",
        "ip -n " + a_ + " rule add pref 1000 lookup local",
    };
    for (const auto& c : cmds)
      if (Sh(c) != 0) return c;
    return "";
  }

  const std::string& host() const { return host_; }
  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }
  const std::string& up() const { return up_; }
  std::string Nft(const std::string& args) const {
    return ShOut("ip netns exec " + host_ + " nft " + args + " 2>&1");
  }

 private:
  std::string host_, a_, b_, up_;
};

class FirewallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, nftables)";
    std::string failed = topo_.Build();
    ASSERT_EQ(failed, "") << "topology setup failed at: " << failed;
    InNetns(topo_.host(), [this] {
      dns_udp_ = Listener(SOCK_DGRAM, "0.0.0.0", kDnsPort);
      dns_tcp_ = Listener(SOCK_STREAM, "0.0.0.0", kDnsPort);
      proxy_ = Listener(SOCK_STREAM, "0.0.0.0", kProxyPort);
      service_ = Listener(SOCK_STREAM, "0.0.0.0", 8080);
      service_udp_ = Listener(SOCK_DGRAM, "0.0.0.0", 8080);
      return 0;
    });
    InNetns(topo_.up(), [this] {
      up_udp_ = Listener(SOCK_DGRAM, "198.18.0.10", 5000);  // replies from the address asked
      up_tcp_ = Listener(SOCK_STREAM, "0.0.0.0", 80);
      up_dns_ = Listener(SOCK_DGRAM, "0.0.0.0", 53);
      return 0;
    });
    InNetns(topo_.b(), [this] {
      b_udp_ = Listener(SOCK_DGRAM, "0.0.0.0", 7000);
      b_tcp_ = Listener(SOCK_STREAM, "0.0.0.0", 7000);
      return 0;
    });
    for (int fd : {dns_udp_.get(), dns_tcp_.get(), proxy_.get(), service_.get(), service_udp_.get(),
                   up_udp_.get(), up_tcp_.get(), up_dns_.get(), b_udp_.get(), b_tcp_.get()})
      ASSERT_GE(fd, 0) << "a listener failed";
  }

  FirewallConfig Config() const {
    FirewallConfig c;
    c.dns_port = kDnsPort;
    c.proxy_port = kProxyPort;
    return c;
  }
  std::unique_ptr<Firewall> Open(FirewallConfig c) {
    auto fw = InNetns(topo_.host(), [&] { return Firewall::Open(c); });
    EXPECT_TRUE(fw.ok()) << fw.status().message();
    return fw.ok() ? std::move(*fw) : nullptr;
  }
  Status AddBox(Firewall& fw, const std::string& id, const std::string& ifname,
                const std::string& ip, const Policy& p) {
    return InNetns(topo_.host(), [&] { return fw.AddBox(id, ifname, {Ip(ip)}, p); });
  }
  // Both boxes, with `a_policy` for box A.
  std::unique_ptr<Firewall> OpenWithBoxes(const Policy& a_policy = UdpPolicy({})) {
    auto fw = Open(Config());
    if (!fw) return nullptr;
    Status a = AddBox(*fw, "alpha", "hA", "10.213.0.2", a_policy);
    EXPECT_TRUE(a.ok()) << a.message();
    Status b = AddBox(*fw, "beta", "hB", "10.213.0.6", UdpPolicy({}));
    EXPECT_TRUE(b.ok()) << b.message();
    return fw;
  }

  // A datagram from box `ns` to ip:port; what `listener` got of it within `ms`.
  std::optional<Datagram> UdpFrom(const std::string& ns, int listener, const std::string& ip,
                                  uint16_t port, int ms) {
    UniqueFd fd = InNetns(ns, [] { return UdpSocket(); });
    EXPECT_TRUE(SendTo(fd.get(), ip, port, "probe"));
    return RecvWithin(listener, ms);
  }

  Topology topo_;
  UniqueFd dns_udp_, dns_tcp_, proxy_, service_, service_udp_;
  UniqueFd up_udp_, up_tcp_, up_dns_, b_udp_, b_tcp_;
};

TEST(DeniedRangesTest, OpenedRangesAreCutOut) {
  auto all = DeniedRanges(false, {});
  EXPECT_NE(std::find(all.begin(), all.end(), "10.0.0.0-10.255.255.255"), all.end());
  auto cut = DeniedRanges(false, {*ParseCidr("10.1.0.0/16")});
  EXPECT_NE(std::find(cut.begin(), cut.end(), "10.0.0.0-10.0.255.255"), cut.end());
  EXPECT_NE(std::find(cut.begin(), cut.end(), "10.2.0.0-10.255.255.255"), cut.end());
  for (const auto& r : cut) EXPECT_EQ(r.find("10.1."), std::string::npos) << r;
  auto whole = DeniedRanges(false, {*ParseCidr("10.0.0.0/8")});
  for (const auto& r : whole) EXPECT_NE(r.rfind("10.", 0), 0u) << r;
  auto v6 = DeniedRanges(true, {});
  EXPECT_FALSE(v6.empty());
  for (const auto& r : v6) EXPECT_NE(r.find(':'), std::string::npos) << r;
  // IPv4 ranges in their IPv6 spellings (NAT64, 6to4, v4-mapped) are denied too.
  for (const char* r : {"64:ff9b::a00:0-64:ff9b::aff:ffff", "::ffff:10.0.0.0-::ffff:10.255.255.255",
                        "2002:a00::-2002:aff:ffff:ffff:ffff:ffff:ffff:ffff"})
    EXPECT_NE(std::find(v6.begin(), v6.end(), r), v6.end()) << r;
  auto v6_cut = DeniedRanges(true, {*ParseCidr("10.0.0.0/8")});
  EXPECT_EQ(std::find(v6_cut.begin(), v6_cut.end(), "64:ff9b::a00:0-64:ff9b::aff:ffff"),
            v6_cut.end());
}

TEST_F(FirewallTest, TcpGoesToTheProxyWithItsOriginalDestination) {
  auto fw = OpenWithBoxes();
  ASSERT_TRUE(fw);
  ASSERT_TRUE(ConnectWithin(topo_.a(), "198.18.0.10", 80, kArriveMs));
  auto got = AcceptWithin(proxy_.get(), kArriveMs);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->original_dst, "198.18.0.10:80");
  EXPECT_EQ(got->peer.substr(0, got->peer.find(':')), "10.213.0.2");
  EXPECT_FALSE(AcceptWithin(up_tcp_.get(), kDropMs)) << "TCP went around the proxy";
}

TEST_F(FirewallTest, DnsOverUdpAndTcpGoesToTheResolver) {
  auto fw = OpenWithBoxes();
  ASSERT_TRUE(fw);
  auto got = UdpFrom(topo_.a(), dns_udp_.get(), "198.18.0.53", 53, kArriveMs);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->peer.substr(0, got->peer.find(':')), "10.213.0.2");
  EXPECT_FALSE(RecvWithin(up_dns_.get(), kDropMs)) << "DNS reached the upstream";
  ASSERT_TRUE(ConnectWithin(topo_.a(), "198.18.0.53", 53, kArriveMs));
  EXPECT_TRUE(AcceptWithin(dns_tcp_.get(), kArriveMs));
}

TEST_F(FirewallTest, UdpOnlyWithAnExplicitRuleAndMasqueraded) {
  auto fw = OpenWithBoxes();
  ASSERT_TRUE(fw);
  UniqueFd sock = InNetns(topo_.a(), [] { return UdpSocket(); });
  ASSERT_TRUE(SendTo(sock.get(), "198.18.0.10", 5000, "no rule"));
  EXPECT_FALSE(RecvWithin(up_udp_.get(), kDropMs)) << "UDP without a rule went out";

  Status up = InNetns(
      topo_.host(), [&] { return fw->UpdateBox("alpha", UdpPolicy({"198.18.0.0/15:5000/udp"})); });
  ASSERT_TRUE(up.ok()) << up.message();
  ASSERT_TRUE(SendTo(sock.get(), "198.18.0.10", 5000, "rule"));
  auto got = RecvWithin(up_udp_.get(), kArriveMs);
  ASSERT_TRUE(got) << "UDP with a rule did not arrive";
  EXPECT_EQ(got->data, "rule");
  EXPECT_EQ(got->peer.substr(0, got->peer.find(':')), "198.19.0.1") << "not masqueraded";
  // The reply comes back to the box (conntrack undoes the masquerade).
  ASSERT_TRUE(SendTo(up_udp_.get(), got->peer.substr(0, got->peer.find(':')),
                     static_cast<uint16_t>(std::stoi(got->peer.substr(got->peer.find(':') + 1))),
                     "reply"));
  auto reply = RecvWithin(sock.get(), kArriveMs);
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->data, "reply");
  // Another port of the same range is still not allowed.
  ASSERT_TRUE(SendTo(sock.get(), "198.18.0.10", 5001, "other port"));
  EXPECT_FALSE(RecvWithin(up_udp_.get(), kDropMs));

  // The rule removed: the same flow (an established conntrack entry) is dropped again.
  up = InNetns(topo_.host(), [&] { return fw->UpdateBox("alpha", UdpPolicy({})); });
  ASSERT_TRUE(up.ok()) << up.message();
  ASSERT_TRUE(SendTo(sock.get(), "198.18.0.10", 5000, "rule gone"));
  EXPECT_FALSE(RecvWithin(up_udp_.get(), kDropMs)) << "UDP went out after its rule was removed";
  // And its replies stop at once: UpdateBox deleted the flow from conntrack, so a late reply
  // is no `established` packet any more (without that it would pass for 30 s).
  ASSERT_TRUE(SendTo(up_udp_.get(), got->peer.substr(0, got->peer.find(':')),
                     static_cast<uint16_t>(std::stoi(got->peer.substr(got->peer.find(':') + 1))),
                     "late reply"));
  EXPECT_FALSE(RecvWithin(sock.get(), kDropMs)) << "a reply of a removed flow reached the box";
}

// The conntrack half alone: the box's UDP flows the policy refuses are deleted, the others (and
// other sources' flows) stay.
TEST_F(FirewallTest, FlushDeletesOnlyTheBoxsRefusedUdpFlows) {
  auto fw = OpenWithBoxes(UdpPolicy({"198.18.0.0/15:5000/udp"}));
  ASSERT_TRUE(fw);
  UniqueFd sock = InNetns(topo_.a(), [] { return UdpSocket(); });
  ASSERT_TRUE(SendTo(sock.get(), "198.18.0.10", 5000, "flow"));
  ASSERT_TRUE(RecvWithin(up_udp_.get(), kArriveMs));
  auto box = boost::asio::ip::make_address("10.213.0.2");
  auto kept = InNetns(topo_.host(), [&] {
    return FlushDisallowedUdpFlows({box}, UdpPolicy({"198.18.0.10/32:5000/udp"}), {});
  });
  ASSERT_TRUE(kept.ok()) << kept.status().message();
  EXPECT_EQ(*kept, 0) << "an allowed flow was deleted";
  auto other = InNetns(topo_.host(), [&] {
    return FlushDisallowedUdpFlows({boost::asio::ip::make_address("10.213.0.6")}, UdpPolicy({}),
                                   {});
  });
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(*other, 0) << "another box's flow was deleted";
  auto gone =
      InNetns(topo_.host(), [&] { return FlushDisallowedUdpFlows({box}, UdpPolicy({}), {}); });
  ASSERT_TRUE(gone.ok()) << gone.status().message();
  EXPECT_EQ(*gone, 1);
}

TEST_F(FirewallTest, ForwardingIsTurnedOnByTheFirstUdpRule) {
  ASSERT_EQ(Sh("ip netns exec " + topo_.host() + " sysctl -qw net.ipv4.ip_forward=0"), 0);
  auto fw = OpenWithBoxes();
  ASSERT_TRUE(fw);
  auto forward = [&] {
    return ShOut("ip netns exec " + topo_.host() + " cat /proc/sys/net/ipv4/ip_forward");
  };
  EXPECT_EQ(forward(), "0\n") << "no box has a UDP rule yet";
  Status up = InNetns(
      topo_.host(), [&] { return fw->UpdateBox("alpha", UdpPolicy({"198.18.0.0/15:5000/udp"})); });
  ASSERT_TRUE(up.ok()) << up.message();
  EXPECT_EQ(forward(), "1\n");
  auto got = UdpFrom(topo_.a(), up_udp_.get(), "198.18.0.10", 5000, kArriveMs);
  EXPECT_TRUE(got);
}

TEST_F(FirewallTest, SpoofedSourceIsDropped) {
  auto fw = OpenWithBoxes();
  ASSERT_TRUE(fw);
  // Box A claims box B's address (IP_TRANSPARENT lets root in the box send from any address).
  UniqueFd fd = InNetns(topo_.a(), [] {
    UniqueFd s = UdpSocket();
    int one = 1;
    setsockopt(s.get(), SOL_IP, IP_TRANSPARENT, &one, sizeof one);
    sockaddr_in me = Addr("10.213.0.6", 0);
    if (bind(s.get(), reinterpret_cast<sockaddr*>(&me), sizeof me) != 0) s.reset();
    return s;
  });
  ASSERT_TRUE(fd);
  ASSERT_TRUE(SendTo(fd.get(), "198.18.0.53", 53, "spoofed"));
  EXPECT_FALSE(RecvWithin(dns_udp_.get(), kDropMs)) << "a spoofed query reached the resolver";
  // It was the anti-spoofing rule that dropped it.
  std::string chain = topo_.Nft("list chain inet sbx prerouting");
  EXPECT_TRUE(std::regex_search(chain, std::regex("ip saddr != @src4 counter packets [1-9]")))
      << chain;
}

TEST_F(FirewallTest, TheHostsOwnPortsAreRefused) {
  auto fw = OpenWithBoxes();
  ASSERT_TRUE(fw);
  // TCP to the gateway's other ports and to the host's loopback lands on the proxy (which refuses
  // them by policy), never on the service.
  for (const char* dst : {"10.213.0.1", "127.0.0.1", "198.19.0.1"}) {
    EXPECT_TRUE(ConnectWithin(topo_.a(), dst, 8080, kArriveMs)) << dst;
    auto got = AcceptWithin(proxy_.get(), kArriveMs);
    ASSERT_TRUE(got) << dst;
    EXPECT_EQ(got->original_dst, std::string(dst) + ":8080");
    EXPECT_FALSE(AcceptWithin(service_.get(), kDropMs)) << "reached the host's service at " << dst;
  }
  // UDP to them is dropped outright.
  EXPECT_FALSE(UdpFrom(topo_.a(), service_udp_.get(), "10.213.0.1", 8080, kDropMs));
  EXPECT_FALSE(UdpFrom(topo_.a(), service_udp_.get(), "127.0.0.1", 8080, kDropMs));
  // The resolver's port is reachable only through the redirection of port 53.
  EXPECT_FALSE(UdpFrom(topo_.a(), dns_udp_.get(), "10.213.0.1", kDnsPort, kDropMs));
}

TEST_F(FirewallTest, ResolverAndProxyPortsAreRefusedFromOtherInterfaces) {
  auto fw = OpenWithBoxes();
  ASSERT_TRUE(fw);
  // The upstream stands in for the LAN here.
  EXPECT_FALSE(ConnectWithin(topo_.up(), "198.19.0.1", kProxyPort, kDropMs));
  EXPECT_FALSE(AcceptWithin(proxy_.get(), 0));
  EXPECT_FALSE(UdpFrom(topo_.up(), dns_udp_.get(), "198.19.0.1", kDnsPort, kDropMs));
  EXPECT_FALSE(ConnectWithin(topo_.up(), "198.19.0.1", kDnsPort, kDropMs));
  // The host's other services are not the firewall's business.
  EXPECT_TRUE(ConnectWithin(topo_.up(), "198.19.0.1", 8080, kArriveMs));
  // The host's own processes reach those ports over loopback: a table left for a dead daemon's
  // boxes must not blackhole the next program that binds one of its ports.
  EXPECT_TRUE(ConnectWithin(topo_.host(), "127.0.0.1", kProxyPort, kArriveMs));
  EXPECT_TRUE(AcceptWithin(proxy_.get(), kArriveMs));
  EXPECT_TRUE(UdpFrom(topo_.host(), dns_udp_.get(), "198.19.0.1", kDnsPort, kArriveMs));
  // Never from a box's address: a host process cannot pose as box A to the resolver.
  UniqueFd spoof = InNetns(topo_.host(), [] { return UdpSocket(); });
  int on = 1;
  ASSERT_EQ(setsockopt(spoof.get(), SOL_IP, IP_TRANSPARENT, &on, sizeof on), 0);
  sockaddr_in a = Addr("10.213.0.2", 0);
  ASSERT_EQ(bind(spoof.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_TRUE(SendTo(spoof.get(), "127.0.0.1", kDnsPort, "probe"));
  auto got = RecvWithin(dns_udp_.get(), kArriveMs);
  EXPECT_TRUE(!got || got->peer.rfind("10.213.0.2:", 0) != 0) << got->peer;
}

TEST_F(FirewallTest, ABoxCannotReachAnotherBox) {
  // Even a UDP rule naming the other box's range does not open it (always denied).
  auto fw = OpenWithBoxes(UdpPolicy({"10.213.0.0/16:7000/udp"}));
  ASSERT_TRUE(fw);
  EXPECT_FALSE(UdpFrom(topo_.a(), b_udp_.get(), "10.213.0.6", 7000, kDropMs));
  EXPECT_TRUE(ConnectWithin(topo_.a(), "10.213.0.6", 7000, kArriveMs));  // the proxy's, in fact
  auto got = AcceptWithin(proxy_.get(), kArriveMs);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->original_dst, "10.213.0.6:7000");
  EXPECT_FALSE(AcceptWithin(b_tcp_.get(), kDropMs));
  EXPECT_FALSE(PingWithin(topo_.a(), "10.213.0.6", kDropMs));
  // Nor from the upstream (the LAN) toward a box.
  EXPECT_FALSE(ConnectWithin(topo_.up(), "10.213.0.6", 7000, kDropMs));
  // The host itself still reaches a box's ports (the ingress relay does).
  EXPECT_TRUE(ConnectWithin(topo_.host(), "10.213.0.6", 7000, kArriveMs));
  EXPECT_TRUE(AcceptWithin(b_tcp_.get(), kArriveMs));
}

TEST_F(FirewallTest, PingReachesTheGatewayOnly) {
  auto fw = OpenWithBoxes();
  ASSERT_TRUE(fw);
  EXPECT_TRUE(PingWithin(topo_.a(), "10.213.0.1", kArriveMs));
  EXPECT_FALSE(PingWithin(topo_.a(), "10.213.0.5", kDropMs)) << "another box's gateway";
  EXPECT_FALSE(PingWithin(topo_.a(), "198.19.0.1", kDropMs)) << "another host address";
  EXPECT_FALSE(PingWithin(topo_.a(), "198.18.0.10", kDropMs)) << "forwarded";
}

TEST_F(FirewallTest, IPv6IsRefused) {
  auto fw = OpenWithBoxes();
  ASSERT_TRUE(fw);
  UniqueFd l6 = InNetns(topo_.host(), [] {
    UniqueFd fd(socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    int one = 1;  // beside the IPv4 listener on the same port
    setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    sockaddr_in6 sa{};
    sa.sin6_family = AF_INET6;
    sa.sin6_port = htons(kDnsPort);
    if (bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) fd.reset();
    return fd;
  });
  ASSERT_TRUE(l6);
  UniqueFd s6 =
      InNetns(topo_.a(), [] { return UniqueFd(socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0)); });
  for (uint16_t port : {uint16_t{53}, kDnsPort}) {
    sockaddr_in6 to{};
    to.sin6_family = AF_INET6;
    to.sin6_port = htons(port);
    inet_pton(AF_INET6, "fd00:5b::1", &to.sin6_addr);
    (void)sendto(s6.get(), "v6", 2, 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
  }
  EXPECT_FALSE(Readable(l6.get(), kDropMs)) << "IPv6 from a box reached the host";
  std::string chain = topo_.Nft("list chain inet sbx prerouting");
  EXPECT_EQ(chain.find("meta nfproto ipv6 counter packets 0 "), std::string::npos)
      << "nothing was dropped as IPv6: " << chain;
}

// With --ipv6 the same rules hold in inet form: neighbour discovery works, TCP goes to the proxy,
// port 53 to the resolver, a spoofed source is dropped and nothing is forwarded.
TEST_F(FirewallTest, WithIPv6EnabledTheSameRulesHold) {
  ASSERT_EQ(Sh("ip -n " + topo_.a() + " -6 route add default via fd00:5b::1"), 0);
  FirewallConfig c = Config();
  c.ipv6 = true;
  auto fw = Open(c);
  ASSERT_TRUE(fw);
  Status add = InNetns(topo_.host(), [&] {
    return fw->AddBox("alpha", "hA", {Ip("10.213.0.2"), Ip("fd00:5b::2")}, UdpPolicy({}));
  });
  ASSERT_TRUE(add.ok()) << add.message();
  auto listen6 = [&](int type, uint16_t port) {
    return InNetns(topo_.host(), [&] {
      UniqueFd fd(socket(AF_INET6, type | SOCK_CLOEXEC, 0));
      int one = 1;
      setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
      sockaddr_in6 sa{};
      sa.sin6_family = AF_INET6;
      sa.sin6_port = htons(port);
      if (bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
          (type == SOCK_STREAM && listen(fd.get(), 4) != 0))
        fd.reset();
      return fd;
    });
  };
  UniqueFd proxy6 = listen6(SOCK_STREAM, kProxyPort), dns6 = listen6(SOCK_DGRAM, kDnsPort);
  ASSERT_TRUE(proxy6 && dns6);
  auto to6 = [](const char* ip, uint16_t port) {
    sockaddr_in6 sa{};
    sa.sin6_family = AF_INET6;
    sa.sin6_port = htons(port);
    inet_pton(AF_INET6, ip, &sa.sin6_addr);
    return sa;
  };

  UniqueFd tcp =
      InNetns(topo_.a(), [] { return UniqueFd(socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0)); });
  fcntl(tcp.get(), F_SETFL, O_NONBLOCK);
  sockaddr_in6 web = to6("2001:db8::10", 80);
  (void)connect(tcp.get(), reinterpret_cast<sockaddr*>(&web), sizeof web);
  ASSERT_TRUE(Readable(proxy6.get(), kArriveMs)) << "IPv6 TCP did not reach the proxy";
  UniqueFd conn(accept4(proxy6.get(), nullptr, nullptr, SOCK_CLOEXEC));
  sockaddr_in6 orig{};
  socklen_t len = sizeof orig;
  ASSERT_EQ(getsockopt(conn.get(), SOL_IPV6, kSoOriginalDst, &orig, &len), 0);
  char buf[INET6_ADDRSTRLEN] = {};
  inet_ntop(AF_INET6, &orig.sin6_addr, buf, sizeof buf);
  EXPECT_EQ(std::string(buf) + " " + std::to_string(ntohs(orig.sin6_port)), "2001:db8::10 80");

  UniqueFd udp =
      InNetns(topo_.a(), [] { return UniqueFd(socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0)); });
  sockaddr_in6 dns = to6("2001:db8::53", 53);
  ASSERT_EQ(sendto(udp.get(), "q", 1, 0, reinterpret_cast<sockaddr*>(&dns), sizeof dns), 1);
  EXPECT_TRUE(Readable(dns6.get(), kArriveMs)) << "IPv6 DNS did not reach the resolver";
  char drain[64];
  (void)recv(dns6.get(), drain, sizeof drain, 0);

  UniqueFd spoof = InNetns(topo_.a(), [] {
    UniqueFd s(socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    int one = 1;
    setsockopt(s.get(), SOL_IPV6, IPV6_TRANSPARENT, &one, sizeof one);
    sockaddr_in6 me{};
    me.sin6_family = AF_INET6;
    inet_pton(AF_INET6, "fd00:5b::99", &me.sin6_addr);
    if (bind(s.get(), reinterpret_cast<sockaddr*>(&me), sizeof me) != 0) s.reset();
    return s;
  });
  ASSERT_TRUE(spoof);
  ASSERT_EQ(sendto(spoof.get(), "q", 1, 0, reinterpret_cast<sockaddr*>(&dns), sizeof dns), 1);
  EXPECT_FALSE(Readable(dns6.get(), kDropMs)) << "a spoofed IPv6 query reached the resolver";
}

// With box_ifname_prefix, an interface that looks like a box's but has no box passes nothing:
// no window between a veth's creation and AddBox, or between RemoveBox and the veth's removal.
TEST_F(FirewallTest, AnInterfaceWithoutABoxPassesNothing) {
  // Without a firewall this namespace forwards box A's UDP (so the drop below is the firewall's).
  ASSERT_TRUE(UdpFrom(topo_.a(), up_udp_.get(), "198.18.0.10", 5000, kArriveMs));
  FirewallConfig c = Config();
  c.box_ifname_prefix = "h";  // hA, hB (hU, the upstream's, is not a box's in real life)
  ASSERT_EQ(Sh("ip -n " + topo_.host() + " link set hU name uU"), 0);
  auto fw = Open(c);
  ASSERT_TRUE(fw);
  Status b = AddBox(*fw, "beta", "hB", "10.213.0.6", UdpPolicy({"198.18.0.0/15:5000/udp"}));
  ASSERT_TRUE(b.ok()) << b.message();
  EXPECT_FALSE(UdpFrom(topo_.a(), up_udp_.get(), "198.18.0.10", 5000, kDropMs));
  EXPECT_FALSE(ConnectWithin(topo_.a(), "198.18.0.10", 80, kDropMs));
  EXPECT_FALSE(AcceptWithin(proxy_.get(), 0));
  EXPECT_FALSE(ConnectWithin(topo_.up(), "10.213.0.2", 22, kDropMs));
  // The box that is known works.
  EXPECT_TRUE(UdpFrom(topo_.b(), up_udp_.get(), "198.18.0.10", 5000, kArriveMs));
}

TEST_F(FirewallTest, BroadcastFromABoxIsDropped) {
  auto fw = OpenWithBoxes();
  ASSERT_TRUE(fw);
  UniqueFd fd = InNetns(topo_.a(), [] {
    UniqueFd s = UdpSocket();
    int one = 1;
    setsockopt(s.get(), SOL_SOCKET, SO_BROADCAST, &one, sizeof one);
    return s;
  });
  // The /30's broadcast address: the host would deliver it to its socket on :8080.
  ASSERT_TRUE(SendTo(fd.get(), "10.213.0.3", 8080, "bcast"));
  ASSERT_TRUE(SendTo(fd.get(), "255.255.255.255", 8080, "bcast"));
  EXPECT_FALSE(RecvWithin(service_udp_.get(), kDropMs));
}

TEST_F(FirewallTest, RemoveBoxLeavesNothingAndTheOtherBoxWorks) {
  auto fw = OpenWithBoxes(UdpPolicy({"198.18.0.0/15:5000/udp"}));
  ASSERT_TRUE(fw);
  Status rm = InNetns(topo_.host(), [&] { return fw->RemoveBox("alpha"); });
  ASSERT_TRUE(rm.ok()) << rm.message();
  std::string table = topo_.Nft("list table inet sbx");
  EXPECT_EQ(table.find("alpha"), std::string::npos) << table;
  EXPECT_EQ(table.find("\"hA\""), std::string::npos) << table;
  EXPECT_EQ(table.find("10.213.0.2"), std::string::npos) << table;
  EXPECT_EQ(table.find("5000"), std::string::npos) << table;
  EXPECT_NE(table.find("beta"), std::string::npos) << table;
  rm = InNetns(topo_.host(), [&] { return fw->RemoveBox("alpha"); });
  EXPECT_TRUE(rm.ok()) << "not idempotent: " << rm.message();
  auto boxes = InNetns(topo_.host(), [&] { return fw->Boxes(); });
  ASSERT_TRUE(boxes.ok());
  EXPECT_EQ(*boxes, std::vector<std::string>{"beta"});

  ASSERT_TRUE(ConnectWithin(topo_.b(), "198.18.0.10", 80, kArriveMs));
  auto got = AcceptWithin(proxy_.get(), kArriveMs);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->peer.substr(0, got->peer.find(':')), "10.213.0.6");
  EXPECT_TRUE(UdpFrom(topo_.b(), dns_udp_.get(), "198.18.0.53", 53, kArriveMs));
}

TEST_F(FirewallTest, OpenIsIdempotentAndAdoptsTheBoxes) {
  auto fw = OpenWithBoxes(UdpPolicy({"198.18.0.0/15:5000/udp"}));
  ASSERT_TRUE(fw);
  auto before = InNetns(topo_.host(), [&] { return fw->Ruleset(); });
  ASSERT_TRUE(before.ok()) << before.status().message();
  fw.reset();  // a daemon restart: the table stays
  auto again = Open(Config());
  ASSERT_TRUE(again);
  auto after = InNetns(topo_.host(), [&] { return again->Ruleset(); });
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(WithoutCounters(*before), WithoutCounters(*after));
  auto boxes = InNetns(topo_.host(), [&] { return again->Boxes(); });
  ASSERT_TRUE(boxes.ok());
  EXPECT_EQ(*boxes, (std::vector<std::string>{"alpha", "beta"}));
  // The adopted boxes are still enforced, and AddBox again replaces rather than duplicates.
  auto got = UdpFrom(topo_.a(), up_udp_.get(), "198.18.0.10", 5000, kArriveMs);
  EXPECT_TRUE(got);
  Status re = AddBox(*again, "alpha", "hA", "10.213.0.2", UdpPolicy({"198.18.0.0/15:5000/udp"}));
  ASSERT_TRUE(re.ok()) << re.message();
  auto third = InNetns(topo_.host(), [&] { return again->Ruleset(); });
  ASSERT_TRUE(third.ok());
  size_t n = 0;
  for (size_t p = third->find("\"hA\""); p != std::string::npos; p = third->find("\"hA\"", p + 1))
    ++n;
  EXPECT_EQ(n, 3u) << "hA once in ifaces, src4 and box_chains: " << *third;
  std::printf("%s", third->c_str());  // the ruleset, for the docs
}

// A slot reused while a stale box's chain is still there: the new box takes the interface over,
// and removing the stale box later leaves the new one whole.
TEST_F(FirewallTest, ANewBoxTakesOverAStaleBoxsInterface) {
  auto fw = OpenWithBoxes();
  ASSERT_TRUE(fw);
  Status g = AddBox(*fw, "gamma", "hA", "10.213.0.2", UdpPolicy({"198.18.0.0/15:5000/udp"}));
  ASSERT_TRUE(g.ok()) << g.message();
  auto boxes = InNetns(topo_.host(), [&] { return fw->Boxes(); });
  ASSERT_TRUE(boxes.ok());
  EXPECT_EQ(*boxes, (std::vector<std::string>{"alpha", "beta", "gamma"}));
  Status rm = InNetns(topo_.host(), [&] { return fw->RemoveBox("alpha"); });
  ASSERT_TRUE(rm.ok()) << rm.message();
  std::string table = topo_.Nft("list table inet sbx");
  EXPECT_NE(table.find("\"hA\" : jump box-gamma"), std::string::npos) << table;
  EXPECT_NE(table.find("\"hA\" . 10.213.0.2"), std::string::npos) << table;
  // gamma's policy is the one in force on hA, masquerade included.
  auto got = UdpFrom(topo_.a(), up_udp_.get(), "198.18.0.10", 5000, kArriveMs);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->peer.substr(0, got->peer.find(':')), "198.19.0.1");
}

TEST_F(FirewallTest, BadInputIsRefused) {
  auto fw = Open(Config());
  ASSERT_TRUE(fw);
  auto add = [&](const std::string& id, const std::string& ifname) {
    return InNetns(topo_.host(), [&] { return fw->AddBox(id, ifname, {Ip("10.213.0.2")}, {}); });
  };
  EXPECT_EQ(add("a; flush ruleset", "hA").err(), EINVAL);
  EXPECT_EQ(add("Box", "hA").err(), EINVAL);
  EXPECT_EQ(add("alpha", "h\"A").err(), EINVAL);
  EXPECT_EQ(add("alpha", "averyveryverylongname").err(), EINVAL);
  Status update = InNetns(topo_.host(), [&] { return fw->UpdateBox("nobox", {}); });
  EXPECT_EQ(update.err(), ENOENT) << update.message();
  // From a thread in another namespace (box A's): refused, nothing done there.
  Status other = InNetns(topo_.a(), [&] { return fw->RemoveBox("alpha"); });
  EXPECT_EQ(other.err(), EXDEV);
  FirewallConfig bad = Config();
  bad.table = "x y";
  EXPECT_FALSE(InNetns(topo_.host(), [&] { return Firewall::Open(bad); }).ok());
  bad = Config();
  bad.box_ifname_prefix = "sbx\" accept";
  EXPECT_FALSE(InNetns(topo_.host(), [&] { return Firewall::Open(bad); }).ok());
}

}  // namespace
}  // namespace sbx::network
