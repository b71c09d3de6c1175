// Tests of the capability drop: the exact masks the kernel reports afterwards, a dropped
// capability refused and a kept one honoured. Every drop happens in a forked child.
#include "runtime/native/capabilities.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>

namespace sbx::runtime {
namespace {

constexpr int kSetupFailed = 250;

// Forks, runs body() in the child and returns its exit code (or 128 + signal).
int InChild(const std::function<int()>& body) {
  pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Drops capabilities with the default plan; in the child only.
int Drop() {
  const Result<CapabilityPlan>& plan = DefaultCapabilityPlan();
  if (!plan.ok()) return kSetupFailed;
  return DropCapabilities(*plan) == 0 ? 0 : kSetupFailed;
}

// The Cap* lines of /proc/self/status, as masks.
std::map<std::string, uint64_t> ReadCapabilityMasks() {
  std::ifstream in("/proc/self/status");
  std::map<std::string, uint64_t> masks;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Cap", 0) != 0) continue;
    const size_t colon = line.find(':');
    masks[line.substr(0, colon)] = std::stoull(line.substr(colon + 1), nullptr, 16);
  }
  return masks;
}

TEST(CapabilitiesTest, KeptSetIsDockersMinusNetRawMknodSysChroot) {
  // Docker's default bounding set is 0xa80425fb.
  constexpr uint64_t kDocker = 0xa80425fb;
  constexpr uint64_t kRemoved =
      (1ULL << CAP_NET_RAW) | (1ULL << CAP_MKNOD) | (1ULL << CAP_SYS_CHROOT);
  EXPECT_EQ(KeptCapabilities(), kDocker & ~kRemoved);
  EXPECT_EQ(KeptCapabilities(), 0xa00005fbULL);
}

TEST(CapabilitiesTest, PlanReadsTheKernelsLastCapability) {
  const Result<CapabilityPlan>& plan = DefaultCapabilityPlan();
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(&plan, &DefaultCapabilityPlan());
  std::ifstream in("/proc/sys/kernel/cap_last_cap");
  int last = -1;
  in >> last;
  EXPECT_EQ(plan->last_cap, last);
  EXPECT_EQ(plan->keep, KeptCapabilities());
}

TEST(CapabilitiesTest, DropLeavesExactlyTheKeptSet) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root";
  // The child writes its masks to a pipe: EXPECTs inside a forked child would be lost.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  int code = InChild([&] {
    close(fds[0]);
    if (Drop() != 0) return kSetupFailed;
    std::ostringstream out;
    for (const auto& [name, mask] : ReadCapabilityMasks()) out << name << " " << mask << "\n";
    const std::string text = out.str();
    return write(fds[1], text.data(), text.size()) == static_cast<ssize_t>(text.size()) ? 0 : 1;
  });
  close(fds[1]);
  ASSERT_EQ(code, 0);
  std::string text;
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) > 0;) text.append(buf, n);
  close(fds[0]);
  std::map<std::string, uint64_t> masks;
  std::istringstream in(text);
  std::string name;
  uint64_t mask;
  while (in >> name >> mask) masks[name] = mask;
  const uint64_t kept = KeptCapabilities();
  EXPECT_EQ(masks["CapBnd"], kept);
  EXPECT_EQ(masks["CapEff"], kept);
  EXPECT_EQ(masks["CapPrm"], kept);
  EXPECT_EQ(masks["CapInh"], 0u);
  ASSERT_EQ(masks.count("CapAmb"), 1u);
  EXPECT_EQ(masks["CapAmb"], 0u);
}

TEST(CapabilitiesTest, DroppedSysAdminIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root";
  // A private UTS namespace first, so the host's hostname is never touched even if the drop fails.
  int code = InChild([] {
    if (unshare(CLONE_NEWUTS) != 0) return kSetupFailed;
    if (sethostname("before", 6) != 0) return kSetupFailed;  // CAP_SYS_ADMIN still held here.
    if (Drop() != 0) return kSetupFailed;
    if (sethostname("after", 5) == 0) return 1;
    return errno == EPERM ? 0 : 2;
  });
  EXPECT_EQ(code, 0);
}

TEST(CapabilitiesTest, KeptChownWorks) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root";
  char path[] = "/tmp/sbx-caps-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  int code = InChild([&] {
    if (Drop() != 0) return kSetupFailed;
    return chown(path, 12345, 12345) == 0 ? 0 : errno;
  });
  EXPECT_EQ(code, 0);
  struct stat st;
  ASSERT_EQ(stat(path, &st), 0);
  EXPECT_EQ(st.st_uid, 12345u);
  EXPECT_EQ(st.st_gid, 12345u);
  unlink(path);
}

TEST(CapabilitiesTest, DroppedCapabilitiesDoNotReturnOnExec) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root";
  // Root regains its permitted set from the bounding set on exec; the drop must survive it.
  int code = InChild([] {
    if (Drop() != 0) return kSetupFailed;
    execl("/bin/sh", "sh", "-c", "grep -q '^CapEff:\t00000000a00005fb$' /proc/self/status",
          static_cast<char*>(nullptr));
    return 127;
  });
  EXPECT_EQ(code, 0);
}

}  // namespace
}  // namespace sbx::runtime
