// Boost 1.74 headers use std::exchange without including <utility>.
// clang-format off
#include <utility>
// clang-format on

// Threat row 47: `sbx serve` and `sbx run` killed with SIGKILL at random moments of creating
// boxes. After every trial: no process of the data directory's is left (the creator's
// un-exec'd clones above all, which used to survive as host root holding serve.lock), the next
// start succeeds, and once it has reconciled no box cgroup, mount, loop device or box directory
// is left on the host.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "api/http/client.h"
#include "common/fd.h"
#include "common/fs.h"
#include "daemon_process.h"
#include "sbx_process.h"

extern char** environ;

namespace sbx::test {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

std::string Text(const std::string& path) {
  auto t = ReadFile(path, 1 << 20);
  return t.ok() ? *t : "";
}

std::string Link(const std::string& path) {
  char buf[4096];
  ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

class KillTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-kill-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    ASSERT_EQ(::chmod(tmpl, 0711), 0);  // the boxes' root must be able to reach its layers
    dir_ = tmpl;
    parent_ = "sbx-kill-test-" + std::to_string(::getpid()) + "-" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ::setenv("SBX_CGROUP_PARENT", parent_.c_str(), 1);
    char real[PATH_MAX];
    ASSERT_NE(::realpath(SBX_BIN, real), nullptr);
    bin_ = real;
  }
  void TearDown() override {
    ExpectClean("teardown");
    ExpectNoCgroupsAndRemoveParent(parent_);
    (void)RemoveTree(dir_);  // the test's scratch directory: a leftover in /tmp harms no result
  }

  // Processes of this test's: clones of the sbx binary working on our data directory (the
  // creator's children before their exec), or anything in one of our boxes' cgroups.
  std::vector<std::string> Leftovers(bool count_clones, bool count_boxes) {
    std::vector<std::string> found;
    DIR* d = ::opendir("/proc");
    if (d == nullptr) return {"opendir /proc"};
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
      std::string base = std::string("/proc/") + e->d_name;
      std::string cmd = Text(base + "/cmdline");
      for (char& c : cmd) c = c == '\0' ? ' ' : c;
      bool ours = count_clones && Link(base + "/exe") == bin_ && cmd.find(dir_) != npos;
      ours = ours || Link(base + "/cwd").rfind(dir_, 0) == 0;
      if (count_boxes) ours = ours || Text(base + "/cgroup").find("/" + parent_ + "/") != npos;
      // A zombie that its parent (this test, or the host's init) has yet to reap holds nothing.
      std::string stat = Text(base + "/stat");
      size_t paren = stat.rfind(')');
      if (paren != npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z') ours = false;
      if (ours) {
        std::string status = Text(base + "/status");
        std::smatch m;
        std::string what = cmd;
        for (const char* f : {"State", "PPid", "NSpid", "SigCgt", "SigBlk", "CapEff"}) {
          if (std::regex_search(status, m, std::regex(std::string("\n") + f + ":\\s*([^\n]*)")))
            what += std::string(" ") + f + "=" + m[1].str();
        }
        what += " wchan=" + Text(base + "/wchan");
        found.push_back(std::string(e->d_name) + " " + what);
      }
    }
    ::closedir(d);
    return found;
  }

  // Waits (bounded) for the processes the kill must take with it to be gone.
  void ExpectNoLeftovers(const std::string& trial, bool count_clones, bool count_boxes) {
    auto deadline = Clock::now() + std::chrono::seconds(10);
    std::vector<std::string> left;
    while (!(left = Leftovers(count_clones, count_boxes)).empty() && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    for (const auto& p : left) ADD_FAILURE() << trial << ": process left: " << p;
  }

  // What a reconciled data directory must not have: box directories (under their own name or
  // the temporary one a creator killed before its rename left: the next start reaps both at
  // once), mounts, loop devices, cgroups.
  void ExpectClean(const std::string& trial) {
    if (DIR* d = ::opendir((dir_ + "/run").c_str())) {
      while (dirent* e = ::readdir(d)) {
        std::string n = e->d_name;
        if (n == "." || n == "..") continue;
        ADD_FAILURE() << trial << ": box directory left: " << n;
      }
      ::closedir(d);
    }
    EXPECT_EQ(Text("/proc/self/mountinfo").find(dir_), npos) << trial << ": mount left";
    if (DIR* d = ::opendir("/sys/block")) {
      while (dirent* e = ::readdir(d)) {
        std::string n = e->d_name;
        if (n.rfind("loop", 0) != 0) continue;
        EXPECT_NE(Text("/sys/block/" + n + "/loop/backing_file").rfind(dir_, 0), 0u)
            << trial << ": loop device left: " << n;
      }
      ::closedir(d);
    }
    for (const auto& parent : CgroupParentDirs(parent_)) {
      if (DIR* d = ::opendir(parent.c_str())) {
        while (dirent* e = ::readdir(d)) {
          if (e->d_type == DT_DIR && e->d_name[0] != '.')
            ADD_FAILURE() << trial << ": cgroup left: " << parent << "/" << e->d_name;
        }
        ::closedir(d);
      }
    }
  }

  pid_t Spawn(const std::vector<std::string>& args) {
    std::vector<std::string> a = args;
    std::vector<char*> argv;
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid = -1;
    int rc = ::posix_spawn(&pid, a[0].c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    EXPECT_EQ(rc, 0);
    return rc == 0 ? pid : -1;
  }

  static constexpr size_t npos = std::string::npos;
  std::string dir_, parent_, bin_;
  std::mt19937 rng_{std::random_device{}()};
};

// One phase of `sbx run --timings`, in microseconds.
long long Phase(const std::string& timings, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(timings, m, std::regex(" " + name + "=([0-9]+)"))) return 0;
  return std::stoll(m[1]);
}

TEST_F(KillTest, RunKilledAtRandomMomentsOfCreation) {
  // Where the box is being made: from the end of the template phase (the clone follows at once)
  // to the agent's exec, measured here. The delays cover that window with margin both sides.
  std::vector<std::string> run = {bin_, "--data-dir", dir_, "run"};
  auto probe = run;
  probe.insert(probe.end(), {"--timings", "--", "true"});
  long long before = 0, window = 0;
  for (int i = 0; i < 3; ++i) {
    auto r = RunProcess(probe);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    long long b = Phase(r.err, "open") + Phase(r.err, "template");
    long long w = Phase(r.err, "prepare") + Phase(r.err, "cgroup") + Phase(r.err, "clone") +
                  Phase(r.err, "child");
    before = i == 0 ? b : std::min(before, b);
    window = std::max(window, w);
  }
  std::uniform_int_distribution<long long> delay_us(before / 2, before + 2 * window + 5000);
  std::printf("run: kill delays %lld..%lld us (setup window %lld us after %lld us)\n",
              delay_us.min(), delay_us.max(), window, before);

  auto start = Clock::now();
  int trials = 0;
  auto check = run;
  check.insert(check.end(), {"--", "true"});
  for (; trials < 170 && Clock::now() - start < std::chrono::seconds(50); ++trials) {
    std::string trial = "run trial " + std::to_string(trials);
    auto cmd = run;
    cmd.insert(cmd.end(), {"--", "sleep", "100"});
    pid_t pid = Spawn(cmd);
    ASSERT_GT(pid, 0);
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng_)));
    ::kill(pid, SIGKILL);
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    ExpectNoLeftovers(trial, /*count_clones=*/true, /*count_boxes=*/true);
    // The next start succeeds (and reaps what the killed one left).
    auto r = RunProcess(check);
    ASSERT_EQ(r.exit_code, 0) << trial << ": next run: " << r.err;
    ExpectClean(trial);
    if (HasFailure()) break;
  }
  std::printf("run: %d trials in %.1f s\n", trials,
              std::chrono::duration<double>(Clock::now() - start).count());
  EXPECT_GE(trials, 100);
}

TEST_F(KillTest, ServeKilledDuringParallelCreates) {
  DaemonProcess d(dir_);
  d.Start();
  ASSERT_NE(d.port(), 0);
  // The daemon's boxes take about as long each as `sbx run`'s; 20 at once on 2 cores take
  // several times that. Kill anywhere from before the first clone to after the last exec.
  std::uniform_int_distribution<int> delay_ms(0, 400);
  auto start = Clock::now();
  int trials = 0, created = 0;
  for (; trials < 60 && Clock::now() - start < std::chrono::seconds(40); ++trials) {
    std::string trial = "serve trial " + std::to_string(trials);
    const uint16_t port = d.port();
    const std::string key = d.key();
    std::vector<std::thread> clients;
    std::atomic<int> ok{0};
    for (int i = 0; i < 20; ++i) {
      clients.emplace_back([&, port, key] {
        auto r =
            http::Request("127.0.0.1", port, "POST", "/v1/sandboxes",
                          {{"Authorization", "Bearer " + key}}, "{}", std::chrono::seconds(20));
        if (r.ok() && r->status == 201) ++ok;
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng_)));
    d.Stop(SIGKILL);
    for (auto& c : clients) c.join();
    created += ok;
    // The daemon's boxes outlive it by design; its un-exec'd clones must not.
    ExpectNoLeftovers(trial, /*count_clones=*/true, /*count_boxes=*/false);
    d.Start();
    ASSERT_NE(d.port(), 0) << trial << ": restart failed: " << d.log();
    auto h = http::Request("127.0.0.1", d.port(), "GET", "/healthz");
    ASSERT_TRUE(h.ok() && h->status == 200) << trial << ": /healthz";
    // What the restart kept running is deleted (waiting for each box's removal, which a kill
    // otherwise finishes after its answer); then nothing of any box may be left.
    auto list = http::Request("127.0.0.1", d.port(), "GET", "/v1/sandboxes?state=running",
                              {{"Authorization", "Bearer " + d.key()}});
    ASSERT_TRUE(list.ok() && list->status == 200) << trial;
    const json listed = json::parse(list->body);
    for (const auto& s : listed["sandboxes"]) {
      auto del = http::Request("127.0.0.1", d.port(), "DELETE",
                               "/v1/sandboxes/" + s["id"].get<std::string>() + "?wait=true",
                               {{"Authorization", "Bearer " + d.key()}});
      EXPECT_TRUE(del.ok() && del->status / 100 == 2) << trial << ": delete " << s["id"];
    }
    // (The restarted daemon itself is a process of the data directory's: clones not counted.)
    ExpectNoLeftovers(trial, /*count_clones=*/false, /*count_boxes=*/true);
    ExpectClean(trial);
    if (HasFailure()) {
      std::printf("%s\n", d.log().c_str());
      break;
    }
  }
  d.Stop();
  std::printf("serve: %d trials (%d sandboxes created before the kill) in %.1f s\n", trials,
              created, std::chrono::duration<double>(Clock::now() - start).count());
  EXPECT_GE(trials, 30);
}

}  // namespace
}  // namespace sbx::test
