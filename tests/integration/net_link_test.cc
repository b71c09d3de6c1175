// A real box with a link (issue 12 item 1): NativeRuntime creates it from a thread inside a
// network namespace the test made (so the host end of its veth lives there, never on the
// machine's own interfaces), BoxSpec::at_sync_point gives it a slot's link, and the box's files
// are bound in. Inside, through its agent, a command reaches a TCP listener on the host end and
// reads its resolv.conf; after Destroy no link is left.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <thread>

#include "common/fd.h"
#include "common/fs.h"
#include "network/box_files.h"
#include "network/netlink.h"
#include "network/slots.h"
#include "network/test_netns.h"
#include "protocol/client.h"
#include "runtime/native/native_runtime.h"
#include "sandbox/net_slot_pool.h"
#include "storage/template.h"
#include "store/store.h"

namespace sbx::runtime {
namespace {

using network::testing::Eventually;
using network::testing::TestNetns;
using protocol::Tag;
using protocol::Type;

struct Ran {
  std::string out;
  int64_t code = -1;
};
Ran RunIn(const Box& box, const std::vector<std::string>& argv, int timeout_ms = 30000) {
  Ran ran;
  auto conn = protocol::AgentConnection::Connect(box.agent_socket);
  if (!conn.ok()) return ran;
  protocol::Writer w;
  for (const auto& a : argv) w.Str(Tag::kArgv, a);
  w.Str(Tag::kEnv, "PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin");
  if (!conn->Call(Type::kSpawn, w).ok()) return ran;
  for (;;) {
    auto f = conn->Receive(timeout_ms);
    if (!f.ok()) return ran;
    if (f->type() == Type::kOutput) ran.out += f->fields.Str(Tag::kData);
    if (f->type() == Type::kExit) {
      ran.code = f->fields.Int(Tag::kExitCode);
      return ran;
    }
  }
}

class NetLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-net-link-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    ASSERT_EQ(::chmod(tmpl, 0711), 0);
    dir_ = tmpl;
    NativeConfig cfg;
    cfg.run_dir = dir_ + "/run";
    cfg.agent_path = SBX_AGENT_BIN;
    cfg.cgroup_parent = "sbx-net-link-test-" + std::to_string(::getpid());
    auto rt = NativeRuntime::Open(cfg);
    ASSERT_TRUE(rt.ok()) << rt.status().message();
    rt_ = std::move(rt).value();
    auto st = store::Store::Open(dir_ + "/sbx.db");
    ASSERT_TRUE(st.ok()) << st.status().message();
    store_ = std::move(st).value();
    storage::TemplateStore ts;
    ts.dir = dir_ + "/templates";
    auto t = storage::ResolveTemplate(ts, *store_, "host", "");
    ASSERT_TRUE(t.ok()) << t.status().message();
    tmpl_ = *t;
    subnet_ = network::Cidr{boost::asio::ip::make_address("10.213.0.0"), 16};
    auto pool = sandbox::StoreNetSlotPool::Make(*store_, subnet_);
    ASSERT_TRUE(pool.ok()) << pool.status().message();
    pool_ = std::move(pool).value();
    auto ns = TestNetns::Make();
    ASSERT_TRUE(ns.ok()) << ns.status().message();
    host_.emplace(std::move(ns).value());
  }

  void TearDown() override {
    if (host_) {
      auto links = host_->Run([] { return network::ListLinks("sbx"); });
      EXPECT_TRUE(links.ok() && links->empty()) << "links left in the test's namespace";
    }
    auto mounts = ReadFile("/proc/self/mountinfo");
    ASSERT_TRUE(mounts.ok());
    EXPECT_EQ(mounts->find(dir_), std::string::npos);
    for (const auto& [controller, parent] : rt_->cgroup_host().v1_dirs) ::rmdir(parent.c_str());
    if (!rt_->cgroup_host().v2_dir.empty()) ::rmdir(rt_->cgroup_host().v2_dir.c_str());
    (void)RemoveTree(dir_);
  }

  BoxSpec Spec() {
    BoxSpec spec;
    spec.id = RandomId();
    spec.layers = tmpl_.layers;
    spec.binds = tmpl_.binds;
    spec.limits.memory_bytes = 256 << 20;
    spec.limits.pids = 64;
    return spec;
  }
  void BindFiles(BoxSpec& spec, const network::BoxFiles& files) {
    for (const auto& [host, inside] : files) spec.binds.push_back({host, inside, true, {}});
  }
  std::vector<std::string> Links() {
    auto links = host_->Run([] { return network::ListLinks("sbx"); });
    return links.ok() ? *links : std::vector<std::string>{"<" + links.status().message() + ">"};
  }

  std::string dir_;
  std::unique_ptr<NativeRuntime> rt_;
  std::unique_ptr<store::Store> store_;
  storage::Template tmpl_;
  network::Cidr subnet_;
  std::unique_ptr<sandbox::StoreNetSlotPool> pool_;
  std::optional<TestNetns> host_;
};

TEST_F(NetLinkTest, ABoxReachesTheHostEndAndSeesSbxsResolverAndNoLinkOutlivesIt) {
  BoxSpec spec = Spec();
  auto slot = pool_->Acquire(spec.id);
  ASSERT_TRUE(slot.ok()) << slot.status().message();
  auto plan = network::SlotLinkPlan(subnet_, *slot);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  auto files = network::WriteBoxNetFiles(dir_ + "/net-" + spec.id, plan->host_ip, plan->box_ip,
                                         spec.hostname);
  ASSERT_TRUE(files.ok()) << files.status().message();
  BindFiles(spec, *files);
  spec.at_sync_point = [&](pid_t init_pid) { return network::CreateBoxLink(*plan, init_pid); };

  // A listener on the host end, in the test's namespace, answering one line.
  UniqueFd listener = host_->Run([&] {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    // The address appears only with the link, at the box's creation.
    int one = 1;
    ::setsockopt(fd.get(), IPPROTO_IP, IP_FREEBIND, &one, sizeof one);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(plan->host_ip.to_v4().to_uint());
    sa.sin_port = htons(8080);
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
        ::listen(fd.get(), 4) != 0)
      fd.reset();
    return fd;
  });
  ASSERT_TRUE(listener.valid());
  std::thread server([&] {
    UniqueFd c(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!c) return;
    char buf[16];
    if (::read(c.get(), buf, sizeof buf) > 0) (void)WriteAll(c.get(), "pong from the host end\n");
  });

  // The veth is made in the namespace of the thread that creates the box.
  auto box = host_->Run([&] { return rt_->Create(spec); });
  if (!box.ok()) {
    ::shutdown(listener.get(), SHUT_RDWR);
    server.join();
    FAIL() << box.status().message();
  }
  EXPECT_EQ(Links(), std::vector<std::string>{plan->host_ifname});

  Ran tcp = RunIn(*box, {"python3", "-c",
                         "import socket\n"
                         "s = socket.create_connection(('" +
                             plan->host_ip.to_string() +
                             "', 8080), 20)\n"
                             "s.sendall(b'ping')\n"
                             "print(s.recv(100).decode(), end='')\n"});
  ::shutdown(listener.get(), SHUT_RDWR);  // unblocks the server if the box never connected
  server.join();
  EXPECT_EQ(tcp.code, 0) << tcp.out;
  EXPECT_EQ(tcp.out, "pong from the host end\n");

  Ran resolv = RunIn(*box, {"cat", "/etc/resolv.conf"});
  EXPECT_EQ(resolv.code, 0);
  EXPECT_NE(resolv.out.find("nameserver " + plan->host_ip.to_string() + "\n"), std::string::npos)
      << resolv.out;
  Ran hosts = RunIn(*box, {"cat", "/etc/hosts"});
  EXPECT_NE(hosts.out.find(plan->box_ip.to_string() + "\tsbx\n"), std::string::npos) << hosts.out;
  Ran addr = RunIn(*box, {"ip", "-o", "-4", "addr", "show", "dev", "eth0"});
  EXPECT_NE(addr.out.find("inet " + plan->box_ip.to_string() + "/30"), std::string::npos)
      << addr.out;
  // Read-only: the box cannot point its resolver elsewhere.
  Ran write = RunIn(*box, {"sh", "-c", "echo nameserver 198.18.0.1 > /etc/resolv.conf"});
  EXPECT_NE(write.code, 0);

  ASSERT_TRUE(rt_->Destroy(*box).ok());
  // The box's namespace dies with its last process; its veth, host end included, goes with it.
  EXPECT_TRUE(Eventually([&] { return Links().empty(); })) << "veth left after Destroy";
  ASSERT_TRUE(pool_->Release(spec.id).ok());
}

TEST_F(NetLinkTest, ABoxWithoutNetworkingIsToldWhyInItsResolvConf) {
  BoxSpec spec = Spec();
  auto files = network::WriteNoNetworkFiles(dir_ + "/net-" + spec.id);
  ASSERT_TRUE(files.ok()) << files.status().message();
  BindFiles(spec, *files);
  auto box = rt_->Create(spec);
  ASSERT_TRUE(box.ok()) << box.status().message();
  Ran resolv = RunIn(*box, {"cat", "/etc/resolv.conf"});
  EXPECT_NE(resolv.out.find("this sandbox has no network"), std::string::npos) << resolv.out;
  EXPECT_EQ(resolv.out.find("nameserver"), std::string::npos) << resolv.out;
  Ran links = RunIn(*box, {"ip", "-o", "link"});
  EXPECT_EQ(links.out.find("eth0"), std::string::npos) << links.out;
  ASSERT_TRUE(rt_->Destroy(*box).ok());
}

TEST_F(NetLinkTest, AFailingLinkFailsTheCreateAndLeavesNothing) {
  BoxSpec spec = Spec();
  auto plan = network::SlotLinkPlan(subnet_, 9);
  ASSERT_TRUE(plan.ok());
  // The host end's name is taken in the creator's namespace.
  ASSERT_EQ(host_->Sh("ip link add sbx9 type veth peer name other9 && echo ok"), "ok\n");
  spec.at_sync_point = [&](pid_t init_pid) { return network::CreateBoxLink(*plan, init_pid); };
  auto box = host_->Run([&] { return rt_->Create(spec); });
  EXPECT_FALSE(box.ok());
  EXPECT_NE(box.status().message().find("sbx9"), std::string::npos) << box.status().message();
  // Only the test's own pair is there; the runtime left no box (TearDown checks mounts).
  EXPECT_EQ(Links(), std::vector<std::string>{"sbx9"});
  ASSERT_TRUE(host_->Run([] { return network::DeleteLink("sbx9"); }).ok());
}

}  // namespace
}  // namespace sbx::runtime
