// OomGuard against this machine's real v1 memory controller, on plain processes, where the box has
// no agent to ask: the guard must give the cgroup back to the kernel's OOM killer rather than leave
// it waiting, whether the OOM began before it watched (a box adopted after a restart) or after.
// The path where an agent kills the bomb runs in oci_runtime_test (AMemoryBombDiesAlone...), with a
// real gVisor box. Needs root and a v1 memory controller; skips saying why otherwise.
#include "runtime/oci/oom_guard.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "common/fd.h"
#include "common/fs.h"
#include "runtime/native/cgroup.h"
#include "runtime/native/cgroup_internal.h"

namespace sbx::runtime {
namespace {

using cgroup_internal::ReadKeyedUint;
using cgroup_internal::WriteKnob;

class OomGuardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to make cgroups";
    auto host = ProbeCgroupHost("sbx-oom-guard-test-" + std::to_string(::getpid()));
    if (!host.ok()) GTEST_SKIP() << "no usable cgroup hierarchy: " << host.status().message();
    if (host->version != CgroupVersion::kV1)
      GTEST_SKIP() << "the host's memory controller is v2, where the guard does not act";
    host_ = *host;
    Limits limits;
    limits.memory_bytes = 32 << 20;
    auto cg = Cgroup::Create(host_, "box", limits);
    ASSERT_TRUE(cg.ok()) << cg.status().message();
    cgroup_ = std::move(cg).value();
    for (const auto& [controller, dir] : host_.v1_dirs)
      if (controller == "memory") memcg_ = dir + "/box";
    char tmpl[] = "/tmp/sbx-oom-guard-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ASSERT_TRUE(WriteFile(dir_ + "/agent.log", "", 0600).ok());
  }
  void TearDown() override {
    if (cgroup_) {
      EXPECT_TRUE(cgroup_->Destroy().ok());
    }
    for (const auto& [controller, dir] : host_.v1_dirs) (void)::rmdir(dir.c_str());
    if (!dir_.empty()) (void)RemoveTree(dir_);
  }

  // A child in the cgroup that touches 64 MiB, a MiB at a time, once told to (`Go`).
  pid_t StartBomb() {
    int p[2];
    EXPECT_EQ(::pipe2(p, O_CLOEXEC), 0);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[1]);
      char b;
      if (::read(p[0], &b, 1) != 1) ::_exit(2);
      for (int i = 0; i < 64; ++i) {
        void* m = ::mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
                         0);
        if (m == MAP_FAILED) ::_exit(3);
        std::memset(m, 1, 1 << 20);
      }
      ::_exit(0);
    }
    ::close(p[0]);
    go_.reset(p[1]);
    EXPECT_TRUE(cgroup_->AddProcess(pid).ok());
    return pid;
  }
  void Go() { ASSERT_EQ(::write(go_.get(), "g", 1), 1); }

  // An eventfd the kernel signals when the cgroup is out of memory (as the guard's own).
  UniqueFd OomEvent() {
    UniqueFd ev(::eventfd(0, EFD_CLOEXEC));
    UniqueFd oc(::open((memcg_ + "/memory.oom_control").c_str(), O_RDONLY | O_CLOEXEC));
    EXPECT_TRUE(WriteKnob(memcg_ + "/cgroup.event_control",
                          std::to_string(ev.get()) + " " + std::to_string(oc.get()))
                    .ok());
    return ev;
  }

  // The child died of the kernel's SIGKILL, the kernel counted it, the guard did not, and the
  // box's log says why the kernel decided.
  void ExpectGivenBack(pid_t pid, OomGuard& guard) {
    int st = 0;
    ASSERT_EQ(::waitpid(pid, &st, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << "status " << st;
    EXPECT_EQ(*ReadKeyedUint(memcg_ + "/memory.oom_control", "oom_kill_disable"), 0u);
    EXPECT_EQ(*ReadKeyedUint(memcg_ + "/memory.oom_control", "oom_kill"), 1u);
    EXPECT_EQ(guard.Kills("box"), 0u);
    EXPECT_EQ(guard.Ooms("box"), 1u) << "the guard heard the OOM it gave back";
    auto log = ReadFile(dir_ + "/agent.log");
    ASSERT_TRUE(log.ok());
    EXPECT_NE(log->find("sbx: the box is out of memory and its agent could not be reached"),
              std::string::npos)
        << *log;
    EXPECT_NE(log->find("the host kernel's OOM killer decides from now on"), std::string::npos);
  }

  CgroupHost host_;
  std::unique_ptr<Cgroup> cgroup_;
  std::string memcg_, dir_;
  UniqueFd go_;
};

OomGuard::Options Quick() {
  OomGuard::Options o;
  o.agent_timeout = std::chrono::milliseconds(200);
  return o;
}

TEST_F(OomGuardTest, AnOomAfterWatchWithNoAgentGoesBackToTheKernel) {
  auto guard = OomGuard::Start(Quick());
  ASSERT_TRUE(guard.ok());
  ASSERT_TRUE((*guard)->Watch("box", memcg_, dir_ + "/no-agent.sock", dir_).ok());
  EXPECT_EQ(*ReadKeyedUint(memcg_ + "/memory.oom_control", "oom_kill_disable"), 1u);
  pid_t pid = StartBomb();
  Go();
  ExpectGivenBack(pid, **guard);
}

TEST_F(OomGuardTest, AnOomUnderWayWhenWatchedIsHandledAtOnce) {
  // Nobody watches, the kernel's killer is off (a daemon killed between two starts): the bomb
  // waits at the limit.
  ASSERT_TRUE(WriteKnob(memcg_ + "/memory.oom_control", "1").ok());
  UniqueFd oom = OomEvent();
  pid_t pid = StartBomb();
  Go();
  uint64_t n = 0;
  ASSERT_EQ(::eventfd_read(oom.get(), &n), 0);
  EXPECT_EQ(*ReadKeyedUint(memcg_ + "/memory.oom_control", "under_oom"), 1u);
  auto guard = OomGuard::Start(Quick());
  ASSERT_TRUE(guard.ok());
  ASSERT_TRUE((*guard)->Watch("box", memcg_, dir_ + "/no-agent.sock", dir_).ok());
  ExpectGivenBack(pid, **guard);
}

TEST_F(OomGuardTest, TheDestructorGivesWatchedBoxesBack) {
  {
    auto guard = OomGuard::Start(Quick());
    ASSERT_TRUE(guard.ok());
    ASSERT_TRUE((*guard)->Watch("box", memcg_, dir_ + "/no-agent.sock", dir_).ok());
    EXPECT_EQ(*ReadKeyedUint(memcg_ + "/memory.oom_control", "oom_kill_disable"), 1u);
  }
  EXPECT_EQ(*ReadKeyedUint(memcg_ + "/memory.oom_control", "oom_kill_disable"), 0u);
  EXPECT_EQ(*ReadFile(dir_ + "/agent.log"), "") << "nothing happened to say";
}

}  // namespace
}  // namespace sbx::runtime
