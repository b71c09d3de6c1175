#include "agent/oom.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace sbx::agent {
namespace {

namespace fs = std::filesystem;

class FakeProc : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-oom-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { fs::remove_all(root_); }
  void Add(const std::string& name, const std::string& statm, const std::string& adj) {
    fs::create_directories(root_ + "/" + name);
    if (!statm.empty()) std::ofstream(root_ + "/" + name + "/statm") << statm;
    if (!adj.empty()) std::ofstream(root_ + "/" + name + "/oom_score_adj") << adj;
  }
  std::string root_;
};

TEST_F(FakeProc, ScansProcessesWithMemoryButNotItselfOrKernelThreads) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  Add("1", "900 300 10 1 0 50 0\n", "-1000\n");
  Add("7", "5000 2000 10 1 0 1900 0\n", "500\n");
  Add("9", "0 0 0 0 0 0 0\n", "0\n");  // a kernel thread
  Add("12", "", "");                   // exited while read
  Add("self", "1 1 1 1 0 1 0\n", "0\n");
  Add("42", "100 100 1 1 0 1 0\n", "0\n");  // the caller
  auto c = ScanOomCandidates(root_, 42);
  std::sort(c.begin(), c.end(), [](auto& a, auto& b) { return a.pid < b.pid; });
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].pid, 1);
  EXPECT_EQ(c[0].rss_bytes, 300 * page);
  EXPECT_EQ(c[0].oom_score_adj, -1000);
  EXPECT_EQ(c[1].pid, 7);
  EXPECT_EQ(c[1].rss_bytes, 2000 * page);
  EXPECT_EQ(c[1].oom_score_adj, 500);
}

TEST(OomVictim, TheLargestUnlessOomScoreAdjSaysOtherwise) {
  const uint64_t mib = 1 << 20;
  std::vector<OomCandidate> c = {{1, 8 * mib, -1000}, {10, 40 * mib, 0}, {11, 30 * mib, 0}};
  EXPECT_EQ(ChooseOomVictim(c, 64 * mib)->pid, 10);
  // +500 of a 64 MiB limit is 32 MiB more: 30 + 32 > 40.
  c[2].oom_score_adj = 500;
  EXPECT_EQ(ChooseOomVictim(c, 64 * mib)->pid, 11);
  // Without a limit, oom_score_adj only excludes -1000.
  EXPECT_EQ(ChooseOomVictim(c, 0)->pid, 10);
  // -1000 is never chosen, however large; ties go to the newest.
  c = {{1, 80 * mib, -1000}, {20, 4 * mib, 0}, {21, 4 * mib, 0}};
  EXPECT_EQ(ChooseOomVictim(c, 64 * mib)->pid, 21);
  // -999 still may be: at 1 point, the kernel's floor.
  c = {{1, 80 * mib, -1000}, {30, 4 * mib, -999}};
  EXPECT_EQ(ChooseOomVictim(c, 64 * mib)->pid, 30);
  EXPECT_FALSE(ChooseOomVictim({{1, 80 * mib, -1000}}, 64 * mib));
  EXPECT_FALSE(ChooseOomVictim({}, 64 * mib));
}

TEST(OomVictim, TheRealProcSeesAChildsResidentMemory) {
  int pfd[2];
  ASSERT_EQ(::pipe(pfd), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const size_t n = 32u << 20;
    char* p = static_cast<char*>(
        ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (p == MAP_FAILED) ::_exit(1);
    std::memset(p, 1, n);
    (void)!::write(pfd[1], "x", 1);
    ::pause();
    ::_exit(0);
  }
  ::close(pfd[1]);
  char b;
  ASSERT_EQ(::read(pfd[0], &b, 1), 1);
  ::close(pfd[0]);
  auto c = ScanOomCandidates("/proc", ::getpid());
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_TRUE(std::none_of(c.begin(), c.end(), [](auto& x) { return x.pid == ::getpid(); }));
  auto it = std::find_if(c.begin(), c.end(), [&](auto& x) { return x.pid == child; });
  ASSERT_NE(it, c.end());
  EXPECT_GE(it->rss_bytes, 32u << 20);
}

}  // namespace
}  // namespace sbx::agent
