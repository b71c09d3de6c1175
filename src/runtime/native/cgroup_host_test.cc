// The cgroup drivers against this machine's real hierarchy: limits reach the kernel, a process
// joins every hierarchy, freezing stops it, the memory limit OOM-kills, KillAll and Destroy leave
// nothing behind. Needs root; skips (with the reason) otherwise. Boxes go under
// "sbx-test-<pid>" below the test's own cgroups, removed at the end.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>

#include "common/fd.h"
#include "runtime/native/cgroup.h"
#include "runtime/native/cgroup_internal.h"

namespace sbx::runtime {
namespace {

namespace fs = std::filesystem;

// A forked child that obeys one-byte commands on a pipe: 'e' echoes 'e' back, 'm' allocates and
// touches 64 MiB, 'f' forks a grandchild that sleeps. Only async-signal-safe calls after fork.
class Child {
 public:
  Child() {
    int cmd[2], reply[2];
    if (::pipe2(cmd, O_CLOEXEC) != 0 || ::pipe2(reply, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(cmd[1]);
      ::close(reply[0]);
      Serve(cmd[0], reply[1]);
    }
    ::close(cmd[0]);
    ::close(reply[1]);
    cmd_.reset(cmd[1]);
    reply_.reset(reply[0]);
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  pid_t pid() const { return pid_; }
  bool Send(char c) { return ::write(cmd_.get(), &c, 1) == 1; }
  // Whether an echo arrives within `ms`.
  bool Echoes(int ms) {
    if (!Send('e')) return false;
    struct pollfd p = {reply_.get(), POLLIN, 0};
    if (::poll(&p, 1, ms) != 1) return false;
    char c = 0;
    return ::read(reply_.get(), &c, 1) == 1 && c == 'e';
  }
  // The wait status once the child is gone.
  int Wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
    return status;
  }

 private:
  [[noreturn]] static void Serve(int cmd, int reply) {
    char c;
    while (::read(cmd, &c, 1) == 1) {
      if (c == 'e') {
        (void)!::write(reply, &c, 1);
      } else if (c == 'm') {
        const size_t size = 64 << 20;
        void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) ::_exit(3);
        std::memset(p, 1, size);
        ::_exit(0);  // survived: the limit did not hold
      } else if (c == 'f') {
        if (::fork() == 0) {
          for (;;) ::pause();
        }
      }
    }
    ::_exit(0);
  }

  pid_t pid_ = -1;
  bool reaped_ = false;
  UniqueFd cmd_;
  UniqueFd reply_;
};

bool Listed(const std::string& procs_file, pid_t pid) {
  Result<std::vector<pid_t>> pids = cgroup_internal::ReadProcs(procs_file);
  return pids.ok() && std::find(pids->begin(), pids->end(), pid) != pids->end();
}

class HostCgroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to make cgroups";
    parent_ = "sbx-test-" + std::to_string(::getpid());
    auto host = ProbeCgroupHost(parent_);
    if (!host.ok()) GTEST_SKIP() << "no usable cgroup hierarchy: " << host.status().message();
    host_ = *host;
  }
  void TearDown() override {
    if (cgroup_) (void)cgroup_->Destroy();
    // The shared parent directories: Create makes them and leaves them for the next box.
    std::vector<std::string> parents;
    if (host_.version == CgroupVersion::kV2) parents.push_back(host_.v2_dir);
    for (const auto& [controller, dir] : host_.v1_dirs) parents.push_back(dir);
    for (const std::string& dir : parents) ::rmdir(dir.c_str());
  }

  std::string parent_;
  CgroupHost host_;
  std::unique_ptr<Cgroup> cgroup_;
};

TEST_F(HostCgroupTest, V1LifecycleOnThisHost) {
  if (host_.version != CgroupVersion::kV1) GTEST_SKIP() << "the host offers cgroup v2";
  Limits limits;
  limits.memory_bytes = 32 << 20;
  limits.pids = 16;
  limits.cpus = 0.5;
  auto cg = Cgroup::Create(host_, "box", limits);
  ASSERT_TRUE(cg.ok()) << cg.status().message();
  cgroup_ = std::move(cg).value();
  const std::vector<std::string> dirs = cgroup_->Paths();
  ASSERT_GE(dirs.size(), 4u);

  // The limits reached the kernel.
  std::string mem, cpu, pids, freezer;
  for (const auto& [controller, dir] : host_.v1_dirs) {
    std::string box = dir + "/box";
    if (controller == "memory") mem = box;
    if (controller == "cpu") cpu = box;
    if (controller == "pids") pids = box;
    if (controller == "freezer") freezer = box;
  }
  EXPECT_EQ(*ReadFile(mem + "/memory.limit_in_bytes"), "33554432\n");
  if (fs::exists(mem + "/memory.memsw.limit_in_bytes")) {
    EXPECT_EQ(*ReadFile(mem + "/memory.memsw.limit_in_bytes"), "33554432\n");
  }
  EXPECT_EQ(*ReadFile(cpu + "/cpu.cfs_quota_us"), "50000\n");
  EXPECT_EQ(*ReadFile(cpu + "/cpu.cfs_period_us"), "100000\n");
  EXPECT_EQ(*ReadFile(pids + "/pids.max"), "16\n");

  Child child;
  ASSERT_GT(child.pid(), 0);
  ASSERT_TRUE(cgroup_->AddProcess(child.pid()).ok());
  for (const std::string& dir : dirs)
    EXPECT_TRUE(Listed(dir + "/cgroup.procs", child.pid())) << dir;
  ASSERT_TRUE(child.Echoes(5000));

  ASSERT_TRUE(cgroup_->Freeze().ok());
  EXPECT_EQ(*ReadFile(freezer + "/freezer.state"), "FROZEN\n");
  EXPECT_FALSE(child.Echoes(300)) << "a frozen child answered";
  ASSERT_TRUE(cgroup_->Thaw().ok());
  EXPECT_EQ(*ReadFile(freezer + "/freezer.state"), "THAWED\n");
  // Thawed, the child answers the request it got while frozen (and Echoes() reads that reply).
  EXPECT_TRUE(child.Echoes(5000));

  auto stats = cgroup_->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  EXPECT_GE(stats->pids_current, 1u);
  EXPECT_GT(stats->memory_peak, 0u);
  EXPECT_GE(stats->memory_peak, stats->memory_current);
  EXPECT_EQ(stats->oom_kills, 0u);

  // Over the memory limit: the kernel's OOM killer takes the allocating process.
  Child hog;
  ASSERT_GT(hog.pid(), 0);
  ASSERT_TRUE(cgroup_->AddProcess(hog.pid()).ok());
  ASSERT_TRUE(hog.Send('m'));
  int hog_status = hog.Wait();
  ASSERT_TRUE(WIFSIGNALED(hog_status)) << "hog exited with " << WEXITSTATUS(hog_status);
  EXPECT_EQ(WTERMSIG(hog_status), SIGKILL);
  stats = cgroup_->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  EXPECT_GE(stats->oom_kills, 1u);

  // KillAll takes the child and the grandchild it forked.
  ASSERT_TRUE(child.Send('f'));
  for (int i = 0; i < 500 && cgroup_internal::ReadProcs(pids + "/cgroup.procs")->size() < 2; ++i) {
    ::usleep(10000);
  }
  EXPECT_EQ(cgroup_internal::ReadProcs(pids + "/cgroup.procs")->size(), 2u);
  ASSERT_TRUE(cgroup_->KillAll().ok());
  int status = child.Wait();
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  for (const std::string& dir : dirs) {
    EXPECT_TRUE(cgroup_internal::ReadProcs(dir + "/cgroup.procs")->empty()) << dir;
  }

  ASSERT_TRUE(cgroup_->Destroy().ok());
  for (const std::string& dir : dirs) EXPECT_FALSE(fs::exists(dir)) << dir;
  for (const auto& [controller, dir] : host_.v1_dirs) EXPECT_TRUE(fs::exists(dir)) << dir;
  EXPECT_TRUE(cgroup_->Destroy().ok());
  EXPECT_TRUE(Cgroup::Open(host_, "box")->Destroy().ok());
}

TEST_F(HostCgroupTest, DestroyKillsAFrozenBox) {
  Limits limits;
  limits.memory_bytes = 32 << 20;
  auto cg = Cgroup::Create(host_, "frozen", limits);
  ASSERT_TRUE(cg.ok()) << cg.status().message();
  cgroup_ = std::move(cg).value();
  Child child;
  ASSERT_TRUE(cgroup_->AddProcess(child.pid()).ok());
  ASSERT_TRUE(cgroup_->Freeze().ok());
  ASSERT_TRUE(Cgroup::Open(host_, "frozen")->Destroy().ok());
  int status = child.Wait();
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  for (const std::string& dir : cgroup_->Paths()) EXPECT_FALSE(fs::exists(dir)) << dir;
}

TEST_F(HostCgroupTest, KernelRejectionNamesFileAndValueAndCleansUp) {
  if (host_.version != CgroupVersion::kV1) GTEST_SKIP() << "the host offers cgroup v2";
  // An operator capped the shared parent at half a CPU; the kernel refuses a child quota above it.
  std::string cpu_parent;
  for (const auto& [controller, dir] : host_.v1_dirs) {
    if (controller == "cpu") cpu_parent = dir;
  }
  ASSERT_TRUE(cgroup_internal::MakeDirs(cpu_parent, {}).ok());
  ASSERT_TRUE(cgroup_internal::WriteKnob(cpu_parent + "/cpu.cfs_quota_us", "50000").ok());
  Limits limits;
  limits.cpus = 1;
  auto cg = Cgroup::Create(host_, "rejected", limits);
  if (cg.ok()) cgroup_ = std::move(cg).value();
  ASSERT_FALSE(cg.ok());
  EXPECT_NE(cg.status().message().find("write '100000' to " + cpu_parent +
                                       "/rejected/cpu.cfs_quota_us: Invalid argument"),
            std::string::npos)
      << cg.status().message();
  for (const auto& [controller, dir] : host_.v1_dirs) EXPECT_FALSE(fs::exists(dir + "/rejected"));
}

TEST_F(HostCgroupTest, V2LifecycleOnThisHost) {
  if (host_.version != CgroupVersion::kV2) {
    GTEST_SKIP() << "the unified hierarchy on this host has no memory/cpu/pids controllers "
                    "(hybrid mode), so the probe picked v1";
  }
  Limits limits;
  limits.memory_bytes = 32 << 20;
  limits.pids = 16;
  limits.cpus = 0.5;
  auto cg = Cgroup::Create(host_, "box", limits);
  ASSERT_TRUE(cg.ok()) << cg.status().message();
  cgroup_ = std::move(cg).value();
  const std::string dir = cgroup_->Paths().front();
  EXPECT_EQ(*ReadFile(dir + "/memory.max"), "33554432\n");
  EXPECT_EQ(*ReadFile(dir + "/cpu.max"), "50000 100000\n");
  EXPECT_GE(cgroup_->DirFd(), 0);
  Child child;
  ASSERT_TRUE(cgroup_->AddProcess(child.pid()).ok());
  EXPECT_TRUE(Listed(dir + "/cgroup.procs", child.pid()));
  ASSERT_TRUE(cgroup_->Freeze().ok());
  EXPECT_FALSE(child.Echoes(300));
  ASSERT_TRUE(cgroup_->Thaw().ok());
  EXPECT_TRUE(child.Echoes(5000));
  Child hog;
  ASSERT_TRUE(cgroup_->AddProcess(hog.pid()).ok());
  ASSERT_TRUE(hog.Send('m'));
  int hog_status = hog.Wait();
  ASSERT_TRUE(WIFSIGNALED(hog_status));
  auto stats = cgroup_->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  EXPECT_GE(stats->oom_kills, 1u);
  EXPECT_GE(stats->pids_current, 1u);
  ASSERT_TRUE(cgroup_->KillAll().ok());
  int status = child.Wait();
  ASSERT_TRUE(WIFSIGNALED(status));
  ASSERT_TRUE(cgroup_->Destroy().ok());
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_TRUE(cgroup_->Destroy().ok());
}

}  // namespace
}  // namespace sbx::runtime
