#include "sbx_process.h"

#include <fcntl.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace sbx::test {
namespace {

// What a failed test leaves (a box still running, even frozen) is reported, killed and removed.
TEST(SbxProcessTest, ALeakedCgroupIsReportedAndItsFrozenProcessesKilled) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (cgroups)";
  const std::string parent = "sbx-process-test-" + std::to_string(::getpid());
  const auto dirs = CgroupParentDirs(parent);
  ASSERT_FALSE(dirs.empty());
  int ready[2];
  ASSERT_EQ(::pipe2(ready, O_CLOEXEC), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    char go;
    if (::read(ready[0], &go, 1) != 1) ::_exit(1);
    ::execl("/bin/sleep", "sleep", "1000", nullptr);
    ::_exit(127);
  }
  ::close(ready[0]);
  bool frozen = false;
  for (const auto& d : dirs) {
    ASSERT_EQ(::mkdir(d.c_str(), 0755), 0) << d;
    ASSERT_EQ(::mkdir((d + "/box").c_str(), 0755), 0) << d;
    std::ofstream(d + "/box/cgroup.procs") << pid;
    if (::access((d + "/box/freezer.state").c_str(), F_OK) == 0) {
      std::ofstream(d + "/box/freezer.state") << "FROZEN";
      frozen = true;
    }
  }
  ASSERT_EQ(::write(ready[1], "x", 1), 1);
  ::close(ready[1]);

  ::testing::TestPartResultArray reported;
  {
    ::testing::ScopedFakeTestPartResultReporter catcher(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &reported);
    ExpectNoCgroupsAndRemoveParent(parent);
  }
  EXPECT_EQ(reported.size(), static_cast<int>(dirs.size()));  // one per hierarchy
  for (int i = 0; i < reported.size(); ++i)
    EXPECT_NE(std::string(reported.GetTestPartResult(i).message()).find("leaked cgroup"),
              std::string::npos);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "frozen: " << frozen;
  for (const auto& d : dirs) EXPECT_NE(::access(d.c_str(), F_OK), 0) << d << " is left";
}

}  // namespace
}  // namespace sbx::test
