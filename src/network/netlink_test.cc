// CreateBoxLink, DeleteLink and ListLinks for real, in network namespaces the test makes: a
// "host" namespace where the link is created, and a child process in a namespace of its own as
// the box. Nothing here touches the machine's own namespace.
#include "network/netlink.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "network/test_netns.h"

namespace sbx::network {
namespace {

using testing::Eventually;
using testing::NetnsChild;
using testing::RunInNetns;
using testing::ShInNetns;
using testing::TestNetns;

LinkPlan Plan(int slot = 3) {
  LinkPlan p;
  p.host_ifname = "sbx" + std::to_string(slot);
  p.host_ip = boost::asio::ip::make_address("10.213.0." + std::to_string(4 * slot + 1));
  p.box_ip = boost::asio::ip::make_address("10.213.0." + std::to_string(4 * slot + 2));
  return p;
}

// `ip`:`port` as a socket address of its family; *len gets its size.
sockaddr_storage Sockaddr(const address& ip, uint16_t port, socklen_t* len) {
  sockaddr_storage ss{};
  if (ip.is_v4()) {
    auto* sa = reinterpret_cast<sockaddr_in*>(&ss);
    sa->sin_family = AF_INET;
    sa->sin_port = htons(port);
    sa->sin_addr.s_addr = htonl(ip.to_v4().to_uint());
    *len = sizeof(sockaddr_in);
  } else {
    auto* sa = reinterpret_cast<sockaddr_in6*>(&ss);
    sa->sin6_family = AF_INET6;
    sa->sin6_port = htons(port);
    auto bytes = ip.to_v6().to_bytes();
    std::copy(bytes.begin(), bytes.end(), sa->sin6_addr.s6_addr);
    *len = sizeof(sockaddr_in6);
  }
  return ss;
}

// A TCP listener on ip (any port) made in the namespace of the calling thread.
UniqueFd Listen(const address& ip, uint16_t* port) {
  UniqueFd fd(::socket(ip.is_v4() ? AF_INET : AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  socklen_t len = 0;
  sockaddr_storage sa = Sockaddr(ip, 0, &len);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0) return UniqueFd();
  if (::listen(fd.get(), 4) != 0) return UniqueFd();
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&sa), &len);
  *port = ntohs(ip.is_v4() ? reinterpret_cast<sockaddr_in*>(&sa)->sin_port
                           : reinterpret_cast<sockaddr_in6*>(&sa)->sin6_port);
  return fd;
}

UniqueFd TcpSocket(int family) {
  UniqueFd fd(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  timeval tv{30, 0};  // a hang would otherwise be the test's timeout, with no message
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// A connection from a socket made in `from_ns` to a listener made in `to_ns`, and a byte each way.
void ExpectTcp(int from_ns, int to_ns, const address& to_ip) {
  uint16_t port = 0;
  UniqueFd listener = RunInNetns(to_ns, [&] { return Listen(to_ip, &port); });
  ASSERT_TRUE(listener.valid()) << "listen on " << to_ip.to_string();
  const int family = to_ip.is_v4() ? AF_INET : AF_INET6;
  UniqueFd client = RunInNetns(from_ns, [family] { return TcpSocket(family); });
  socklen_t len = 0;
  sockaddr_storage sa = Sockaddr(to_ip, port, &len);
  ASSERT_EQ(::connect(client.get(), reinterpret_cast<sockaddr*>(&sa), len), 0)
      << "connect to " << to_ip.to_string() << ": " << std::strerror(errno);
  UniqueFd server(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(server.valid());
  char c = 'x';
  ASSERT_EQ(::write(client.get(), &c, 1), 1);
  ASSERT_EQ(::read(server.get(), &c, 1), 1);
  ASSERT_EQ(::write(server.get(), "y", 1), 1);
  ASSERT_EQ(::read(client.get(), &c, 1), 1);
  EXPECT_EQ(c, 'y');
}

std::vector<std::string> Links(const TestNetns& ns, std::string_view prefix) {
  auto links = ns.Run([&] { return ListLinks(prefix); });
  EXPECT_TRUE(links.ok()) << links.status().message();
  return links.ok() ? *links : std::vector<std::string>{};
}

std::string ShIn(int netns, const std::string& cmd) { return ShInNetns(netns, cmd); }

// The addresses of `dev` as `ip -j` shows them: "inet 10.213.0.2/30", "inet6 fe80::.../64".
std::vector<std::string> Addresses(int netns, const std::string& dev) {
  std::vector<std::string> out;
  std::string text = ShIn(netns, "ip -j addr show dev " + dev + " 2>/dev/null");
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_array() || j.empty()) return {"<no such link>"};
  for (const auto& a : j[0].value("addr_info", nlohmann::json::array()))
    out.push_back(a.value("family", "") + " " + a.value("local", "") + "/" +
                  std::to_string(a.value("prefixlen", -1)));
  return out;
}

bool IsUp(int netns, const std::string& dev) {
  auto j = nlohmann::json::parse(ShIn(netns, "ip -j link show dev " + dev), nullptr, false);
  if (!j.is_array() || j.empty()) return false;
  for (const auto& f : j[0].value("flags", nlohmann::json::array()))
    if (f == "UP") return true;
  return false;
}

class NetlinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto ns = TestNetns::Make();
    ASSERT_TRUE(ns.ok()) << ns.status().message();
    host_.emplace(std::move(ns).value());
    auto child = NetnsChild::Start();
    ASSERT_TRUE(child.ok()) << child.status().message();
    box_.emplace(std::move(child).value());
    box_ns_ = box_->OpenNetns();
    ASSERT_TRUE(box_ns_.valid());
  }
  std::optional<TestNetns> host_;
  std::optional<NetnsChild> box_;
  UniqueFd box_ns_;
};

TEST_F(NetlinkTest, ABoxLinkCarriesTcpBothWaysWithThePlannedNamesAndAddresses) {
  LinkPlan plan = Plan(3);
  bool stayed = false;
  Status st = host_->Run([&] {
    Status s = CreateBoxLink(plan, box_->pid());
    // The calling thread is still in its own namespace: the box's was joined by another thread.
    struct stat here {
    }, host{};
    stayed = ::stat("/proc/thread-self/ns/net", &here) == 0 && ::fstat(host_->fd(), &host) == 0 &&
             here.st_ino == host.st_ino;
    return s;
  });
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(stayed);

  EXPECT_EQ(Links(*host_, "sbx"), std::vector<std::string>{"sbx3"});
  EXPECT_EQ(Addresses(host_->fd(), "sbx3"), std::vector<std::string>{"inet 10.213.0.13/30"});
  EXPECT_EQ(Addresses(box_ns_.get(), "eth0"), std::vector<std::string>{"inet 10.213.0.14/30"});
  EXPECT_TRUE(IsUp(host_->fd(), "sbx3"));
  EXPECT_TRUE(IsUp(box_ns_.get(), "eth0"));
  EXPECT_TRUE(IsUp(box_ns_.get(), "lo"));
  auto route =
      nlohmann::json::parse(ShIn(box_ns_.get(), "ip -j route show default"), nullptr, false);
  ASSERT_TRUE(route.is_array() && route.size() == 1) << route.dump();
  EXPECT_EQ(route[0].value("gateway", ""), "10.213.0.13");
  EXPECT_EQ(route[0].value("dev", ""), "eth0");
  // IPv6 is off in the box; the box's lo has no ::1 and no end has any IPv6 address.
  EXPECT_EQ(ShIn(box_ns_.get(), "cat /proc/sys/net/ipv6/conf/all/disable_ipv6"), "1\n");
  EXPECT_EQ(ShIn(box_ns_.get(), "ip -j -6 addr show"), "[]\n");
  EXPECT_EQ(host_->Sh("ip -j -6 addr show dev sbx3"), "[]\n");

  ExpectTcp(box_ns_.get(), host_->fd(), plan.host_ip);
  ExpectTcp(host_->fd(), box_ns_.get(), plan.box_ip);

  ASSERT_TRUE(host_->Run([] { return DeleteLink("sbx3"); }).ok());
  EXPECT_TRUE(Links(*host_, "sbx").empty());
  EXPECT_EQ(Addresses(box_ns_.get(), "eth0"), std::vector<std::string>{"<no such link>"});
  // Deleting what is gone is success.
  EXPECT_TRUE(host_->Run([] { return DeleteLink("sbx3"); }).ok());
}

TEST_F(NetlinkTest, WithIpv6TheBoxKeepsIpv6ButNeitherEndGetsAnAddress) {
  LinkPlan plan = Plan(1);
  plan.ipv6 = true;
  Status st = host_->Run([&] { return CreateBoxLink(plan, box_->pid()); });
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(ShIn(box_ns_.get(), "cat /proc/sys/net/ipv6/conf/eth0/disable_ipv6"), "0\n");
  EXPECT_EQ(ShIn(box_ns_.get(), "ip -j -6 addr show dev eth0"), "[]\n");
  EXPECT_EQ(host_->Sh("ip -j -6 addr show dev sbx1"), "[]\n");
}

TEST_F(NetlinkTest, WithIpv6AddressesEachEndGetsItsOwnAndTheBoxARouteAndNothingElse) {
  LinkPlan plan = Plan(2);
  plan.ipv6 = true;
  plan.host_ip6 = boost::asio::ip::make_address("fd73:6278::9");
  plan.box_ip6 = boost::asio::ip::make_address("fd73:6278::a");
  plan.prefix6 = 126;
  Status st = host_->Run([&] { return CreateBoxLink(plan, box_->pid()); });
  ASSERT_TRUE(st.ok()) << st.message();
  // No link-local address on either end, and no tentative (DAD) state to wait for.
  EXPECT_EQ(Addresses(host_->fd(), "sbx2"),
            (std::vector<std::string>{"inet 10.213.0.9/30", "inet6 fd73:6278::9/126"}));
  EXPECT_EQ(Addresses(box_ns_.get(), "eth0"),
            (std::vector<std::string>{"inet 10.213.0.10/30", "inet6 fd73:6278::a/126"}));
  EXPECT_EQ(ShIn(box_ns_.get(), "ip -6 addr show tentative"), "");
  auto route =
      nlohmann::json::parse(ShIn(box_ns_.get(), "ip -j -6 route show default"), nullptr, false);
  ASSERT_TRUE(route.is_array() && route.size() == 1) << route.dump();
  EXPECT_EQ(route[0].value("gateway", ""), "fd73:6278::9");
  EXPECT_EQ(host_->Sh("cat /proc/sys/net/ipv6/conf/sbx2/accept_ra"), "0\n");
  ExpectTcp(box_ns_.get(), host_->fd(), plan.host_ip6);
  ExpectTcp(host_->fd(), box_ns_.get(), plan.box_ip6);
}

TEST_F(NetlinkTest, BadIpv6PlansAreRefusedAndMakeNothing) {
  LinkPlan plan = Plan(2);
  plan.ipv6 = true;
  plan.host_ip6 = boost::asio::ip::make_address("fd73:6278::9");
  plan.box_ip6 = boost::asio::ip::make_address("fd73:6278::19");  // another /126
  Status st = host_->Run([&] { return CreateBoxLink(plan, box_->pid()); });
  EXPECT_EQ(st.err(), EINVAL) << st.message();
  plan.box_ip6 = boost::asio::ip::address_v6();  // one end only
  EXPECT_EQ(host_->Run([&] { return CreateBoxLink(plan, box_->pid()); }).err(), EINVAL);
  plan.box_ip6 = boost::asio::ip::make_address("::ffff:10.0.0.1");
  EXPECT_EQ(host_->Run([&] { return CreateBoxLink(plan, box_->pid()); }).err(), EINVAL);
  EXPECT_TRUE(Links(*host_, "sbx").empty());
}

TEST_F(NetlinkTest, TheBoxsNamespaceDyingRemovesTheHostEnd) {
  ASSERT_TRUE(host_->Run([&] { return CreateBoxLink(Plan(5), box_->pid()); }).ok());
  ASSERT_EQ(Links(*host_, "sbx"), std::vector<std::string>{"sbx5"});
  box_ns_.reset();
  box_->Kill();
  EXPECT_TRUE(Eventually([&] { return Links(*host_, "sbx").empty(); }));
}

TEST_F(NetlinkTest, ADeadPidLeavesNothing) {
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(pid, nullptr, 0), pid);
  Status st = host_->Run([&] { return CreateBoxLink(Plan(2), pid); });
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.err(), ENOENT) << st.message();
  EXPECT_NE(st.message().find("sbx2"), std::string::npos) << st.message();
  EXPECT_TRUE(Links(*host_, "sbx").empty());
}

TEST_F(NetlinkTest, ANameClashLeavesTheOtherLinkAloneAndMakesNothing) {
  ASSERT_EQ(host_->Sh("ip link add sbx4 type veth peer name other4 && echo ok"), "ok\n");
  Status st = host_->Run([&] { return CreateBoxLink(Plan(4), box_->pid()); });
  EXPECT_EQ(st.err(), EEXIST) << st.message();
  EXPECT_EQ(Links(*host_, "sbx"), std::vector<std::string>{"sbx4"});
  EXPECT_EQ(Links(*host_, "other4"), std::vector<std::string>{"other4"});
  EXPECT_EQ(Addresses(box_ns_.get(), "eth0"), std::vector<std::string>{"<no such link>"});
}

TEST_F(NetlinkTest, AFailureAfterTheVethExistsRemovesBothEnds) {
  // The box already has a default route: adding sbx's fails once the pair is made.
  ASSERT_EQ(ShIn(box_ns_.get(), "ip route add blackhole default && echo ok"), "ok\n");
  Status st = host_->Run([&] { return CreateBoxLink(Plan(6), box_->pid()); });
  EXPECT_EQ(st.err(), EEXIST) << st.message();
  EXPECT_NE(st.message().find("default route"), std::string::npos) << st.message();
  EXPECT_TRUE(Links(*host_, "sbx").empty());
  EXPECT_EQ(Addresses(box_ns_.get(), "eth0"), std::vector<std::string>{"<no such link>"});
}

TEST_F(NetlinkTest, AProcessInOurOwnNamespaceAndBadPlansAreRefused) {
  // The calling thread's own id: its /proc entry shows the namespace it is in.
  Status st =
      host_->Run([&] { return CreateBoxLink(Plan(1), static_cast<pid_t>(::syscall(SYS_gettid))); });
  EXPECT_EQ(st.err(), EINVAL) << st.message();
  auto refused = [&](LinkPlan bad) {
    Status s = host_->Run([&] { return CreateBoxLink(bad, box_->pid()); });
    return s.err() == EINVAL;
  };
  LinkPlan bad = Plan(1);
  bad.host_ifname = "../../x";
  EXPECT_TRUE(refused(bad));
  bad.host_ifname = "sbx0123456789abcdef";
  EXPECT_TRUE(refused(bad));
  bad.host_ifname = "eth0";
  EXPECT_TRUE(refused(bad));
  bad = Plan(1);
  bad.box_ip = boost::asio::ip::make_address("10.9.0.2");
  EXPECT_TRUE(refused(bad));
  bad.box_ip = boost::asio::ip::make_address("fd00::2");
  EXPECT_TRUE(refused(bad));
  bad = Plan(1);
  bad.prefix = 31;
  EXPECT_TRUE(refused(bad));
  EXPECT_TRUE(Links(*host_, "sbx").empty());
}

TEST(BoxLinkName, IsSbxAndDigits) {
  EXPECT_TRUE(IsBoxLinkName("sbx0"));
  EXPECT_TRUE(IsBoxLinkName("sbx16383"));
  EXPECT_FALSE(IsBoxLinkName("sbx"));
  EXPECT_FALSE(IsBoxLinkName("sbx-1"));
  EXPECT_FALSE(IsBoxLinkName("sbxa"));
  EXPECT_FALSE(IsBoxLinkName("eth0"));
}

}  // namespace
}  // namespace sbx::network
