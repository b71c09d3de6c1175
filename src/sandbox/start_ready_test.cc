// RunStartAndReady against a real sbx-agent process listening on a unix socket (outside any
// namespace, as session_test does): the start command keeps running after the create answers,
// the ready command is polled until it exits 0, and the errors name the command and its output.
// The ready loop's interval and timeout run on a FakeClock the test advances; nothing sleeps.
#include "sandbox/start_ready.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <future>
#include <sstream>

#include "common/fs.h"

namespace sbx::sandbox {
namespace {

using namespace std::chrono_literals;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class StartReadyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-start-ready-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    sock_ = dir_ + "/agent.sock";
    agent_ = ::fork();
    ASSERT_GE(agent_, 0);
    if (agent_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a test that dies leaves no agent behind
      ::execl(SBX_AGENT_BIN, "sbx-agent", "--listen", sock_.c_str(), nullptr);
      _exit(127);
    }
  }
  void TearDown() override {
    // The background start commands write their pid: they outlive the agent otherwise.
    for (const auto& f : {"start.pid"}) {
      std::string pid = Slurp(dir_ + "/" + f);
      if (!pid.empty()) ::kill(std::stoi(pid), SIGKILL);
    }
    ::kill(agent_, SIGKILL);
    ::waitpid(agent_, nullptr, 0);
    (void)RemoveTree(dir_);
  }
  StartReadySpec Spec(const std::string& start, const std::string& ready) {
    StartReadySpec s;
    s.start_cmd = start;
    s.ready_cmd = ready;
    s.defaults.workdir = dir_;
    s.env = {{"DIR", dir_}};
    return s;
  }
  std::string dir_, sock_;
  pid_t agent_ = -1;
};

TEST_F(StartReadyTest, TheStartCommandRunsOnAndTheReadyCommandIsPolledUntilItExitsZero) {
  FakeClock clock;
  // The start command makes the file the ready command waits for only once the ready command
  // has failed once (the `tried` mark), so the loop must poll at least twice.
  auto spec = Spec(
      "echo $$ > start.pid; while [ ! -f tried ]; do sleep 0.05; done; "
      "echo \"$PWD $DIR\" > ready; exec sleep 600",
      "[ -f ready ] || { touch tried; exit 1; }");
  auto done = std::async(std::launch::async, [&] { return RunStartAndReady(sock_, spec, clock); });
  uint64_t waits = 0;
  while (done.wait_for(0s) != std::future_status::ready) {
    if (clock.AwaitWaits(waits + 1, 100ms)) clock.Advance(spec.interval), ++waits;
  }
  Status s = done.get();
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_GE(waits, 1u);
  EXPECT_EQ(Slurp(dir_ + "/ready"), dir_ + " " + dir_ + "\n");  // the workdir and env
  std::string pid = Slurp(dir_ + "/start.pid");
  ASSERT_FALSE(pid.empty());
  EXPECT_EQ(::kill(std::stoi(pid), 0), 0) << "the start command stopped with the create";
}

TEST_F(StartReadyTest, AReadyCommandThatNeverSucceedsTimesOutNamingItAndItsOutput) {
  FakeClock clock;
  auto spec = Spec("", "echo not yet >&2; exit 3");
  spec.timeout = 5000ms;
  auto done = std::async(std::launch::async, [&] { return RunStartAndReady(sock_, spec, clock); });
  ASSERT_TRUE(clock.AwaitWaits(1));
  clock.Advance(spec.timeout);  // past the deadline: no further attempt
  Status s = done.get();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.err(), ETIMEDOUT);
  EXPECT_NE(s.message().find("ready command 'echo not yet >&2; exit 3' did not exit 0 within 5 s"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("exited with code 3"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("its last output: not yet"), std::string::npos) << s.message();
}

TEST_F(StartReadyTest, AStartCommandThatFailsEndsTheWaitWithItsOutput) {
  FakeClock clock;
  auto spec = Spec("echo cannot bind port 8080; exit 7", "exit 1");
  auto done = std::async(std::launch::async, [&] { return RunStartAndReady(sock_, spec, clock); });
  uint64_t waits = 0;
  while (done.wait_for(0s) != std::future_status::ready) {
    if (clock.AwaitWaits(waits + 1, 100ms)) clock.Advance(spec.interval), ++waits;
  }
  Status s = done.get();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.err(), ECANCELED);
  EXPECT_NE(s.message().find("start command 'echo cannot bind port 8080; exit 7' exited with "
                             "code 7 before the template was ready; its last output: cannot "
                             "bind port 8080"),
            std::string::npos)
      << s.message();
}

TEST_F(StartReadyTest, NoCommandsIsReadyAtOnceAndABadUserIsRefused) {
  FakeClock clock;
  EXPECT_TRUE(RunStartAndReady(sock_, Spec("", ""), clock).ok());
  auto spec = Spec("true", "true");
  spec.defaults.user = "no-such-user-here";
  Status s = RunStartAndReady(sock_, spec, clock);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("start command 'true'"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace sbx::sandbox
