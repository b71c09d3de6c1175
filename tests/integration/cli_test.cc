// The sbx client verbs end to end: a real daemon, the real `sbx` binary as a subprocess pointed at
// the daemon's data directory (it finds the port and the key there). After each test nothing of
// the daemon's boxes is left on the host.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "api/http/client.h"
#include "common/fd.h"
#include "common/fs.h"
#include "daemon_process.h"
#include "sbx_process.h"

extern char** environ;

namespace sbx::test {
namespace {

using nlohmann::json;

using Daemon = DaemonProcess;

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-cli-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    ASSERT_EQ(::chmod(tmpl, 0711), 0);
    dir_ = tmpl;
    ::setenv("SBX_CGROUP_PARENT", ("sbx-cli-test-" + std::to_string(::getpid())).c_str(), 1);
    // The verbs must find the daemon through the data directory, not the environment.
    ::unsetenv("SBX_URL");
    ::unsetenv("SBX_API_KEY");
    d_ = std::make_unique<Daemon>(dir_);
    d_->Start();
  }
  void TearDown() override {
    if (d_->port()) {
      auto list = Sbx({"ls", "--json", "--all", "--state", "running", "--state", "paused"});
      json j = json::parse(list.out, nullptr, false);
      if (j.is_object())
        for (const auto& s : j["sandboxes"]) Sbx({"kill", s["id"].get<std::string>()});
    }
    d_.reset();
    std::string mounts = *ReadFile("/proc/self/mountinfo");
    EXPECT_EQ(mounts.find(dir_), std::string::npos);
    EXPECT_EQ(::system(("test -z \"$(ls -A " + dir_ + "/run 2>/dev/null)\"").c_str()), 0)
        << "box directories left";
    ExpectNoCgroupsAndRemoveParent("sbx-cli-test-" + std::to_string(::getpid()));
    (void)RemoveTree(dir_);  // the test's scratch directory: a leftover in /tmp harms no result
  }

  // Runs `sbx --data-dir <dir> args...`.
  ProcessResult Sbx(std::vector<std::string> args, ProcessOptions opts = {}) {
    args.insert(args.begin(), {SBX_BIN, "--data-dir", dir_});
    return RunProcess(args, opts);
  }
  std::string Create(std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(), "create");
    auto r = Sbx(extra);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::string id = r.out.substr(0, r.out.find('\n'));
    EXPECT_EQ(id.size(), 20u) << r.out;
    return id;
  }
  json Api(const std::string& method, const std::string& target, const json& body = nullptr) {
    auto r = http::Request(http::Endpoint{"127.0.0.1", d_->port(), ""}, method, target,
                           {{"Authorization", "Bearer " + d_->key()}},
                           body.is_null() ? "" : body.dump());
    EXPECT_TRUE(r.ok());
    return r.ok() ? json::parse(r->body, nullptr, false) : json();
  }

  std::string dir_;
  std::unique_ptr<Daemon> d_;
};

TEST_F(CliTest, Help) {
  auto r = Sbx({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* verb :
       {"run", "serve", "create", "ls", "inspect", "exec", "cp", "kill", "pause", "resume",
        "timeout", "logs", "ps", "audit", "key", "secret", "template", "build"})
    EXPECT_NE(r.out.find(verb), std::string::npos) << verb;
  // A command line naming run builds only run's flags (main.cc): its help is whole all the same.
  r = Sbx({"-v", "run", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* flag : {"--memory", "--disk", "--volume", "--net", "--timings"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag << "\n" << r.out;
  r = Sbx({"exec", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--interactive"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--url"), std::string::npos) << r.out;
}

// `sbx pool`: set, ls (the refill fills it in the background: polled), a create taking its box,
// rm (its boxes destroyed: polled until none is left, so the teardown finds the host clean).
TEST_F(CliTest, PoolSetListAndRemove) {
  auto set = Sbx({"pool", "set", "host", "1"});
  ASSERT_EQ(set.exit_code, 0) << set.err;
  EXPECT_NE(set.out.find("host: 1"), std::string::npos) << set.out;
  EXPECT_NE(Sbx({"pool", "set", "nope", "1"}).exit_code, 0);
  auto ready = [&] { return Api("GET", "/v1/pools")["pools"][0].value("ready", 0); };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (ready() != 1 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // polling a background fill
  auto ls = Sbx({"pool", "ls"});
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  EXPECT_NE(ls.out.find("TEMPLATE"), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find("host"), std::string::npos) << ls.out;
  std::string id = Create();
  EXPECT_EQ(Api("GET", "/v1/pools")["pools"][0]["claims"], 1);
  EXPECT_EQ(Sbx({"pool", "rm", "host"}).exit_code, 0);
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!Api("GET", "/v1/pools")["pools"].empty() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // polling a background removal
  EXPECT_TRUE(Api("GET", "/v1/pools")["pools"].empty());
  EXPECT_NE(Sbx({"pool", "rm", "host"}).exit_code, 0);
  EXPECT_EQ(Sbx({"kill", id}).exit_code, 0);
}

TEST_F(CliTest, CreateListInspectKill) {
  std::string id = Create({"--metadata", "team=cli", "--memory", "256M", "--timeout", "10m"});
  auto ls = Sbx({"ls"});
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  EXPECT_EQ(ls.out.rfind("ID", 0), 0u) << ls.out;
  EXPECT_NE(ls.out.find("METADATA"), std::string::npos);
  EXPECT_NE(ls.out.find(id), std::string::npos);
  EXPECT_NE(ls.out.find("team=cli"), std::string::npos);

  ls = Sbx({"ls", "--json", "--metadata", "team=cli"});
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  json j = json::parse(ls.out);
  ASSERT_EQ(j["sandboxes"].size(), 1u);
  EXPECT_EQ(j["sandboxes"][0]["id"], id);
  EXPECT_EQ(json::parse(Sbx({"ls", "--json", "--metadata", "team=other"}).out)["sandboxes"].size(),
            0u);

  auto in = Sbx({"inspect", id});
  ASSERT_EQ(in.exit_code, 0) << in.err;
  j = json::parse(in.out);
  EXPECT_EQ(j["state"], "running");
  EXPECT_EQ(j["limits"]["memory_bytes"], 256 << 20);
  EXPECT_EQ(j["timeout"], 600.0);

  auto k = Sbx({"kill", id});
  EXPECT_EQ(k.exit_code, 0) << k.err;
  ls = Sbx({"ls", "--state", "running"});
  EXPECT_EQ(ls.out.find(id), std::string::npos) << ls.out;
  auto again = Sbx({"inspect", "nosuchsandbox"});
  EXPECT_EQ(again.exit_code, 125);
  EXPECT_EQ(again.err.rfind("sbx: ", 0), 0u) << again.err;
}

TEST_F(CliTest, Exec) {
  std::string id = Create();
  auto r = Sbx({"exec", id, "--", "echo", "hi"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "hi\n");

  r = Sbx({"exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 7"});
  EXPECT_EQ(r.exit_code, 7);
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");

  r = Sbx({"exec", id, "--", "sh", "-c", "kill -9 $$"});
  EXPECT_EQ(r.exit_code, 128 + 9);

  r = Sbx({"exec", "-e", "A=b c", "-w", "/tmp", id, "--", "sh", "-c", "echo \"$A\"; pwd"});
  EXPECT_EQ(r.out, "b c\n/tmp\n") << r.err;

  // Byte-exact: every byte value through stdout.
  r = Sbx({"exec", id, "--", "sh", "-c", "printf '\\000\\001\\377\\n\\r'"});
  EXPECT_EQ(r.out, std::string("\0\1\377\n\r", 5));

  ProcessOptions in;
  in.stdin_data = "a\nb\n";
  r = Sbx({"exec", "-i", id, "--", "sort", "-r"}, in);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "b\na\n");

  // -t without a host terminal (stdin is a pipe here).
  r = Sbx({"exec", "-t", id, "--", "tty"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("/dev/pts/", 0), 0u) << r.out;
  r = Sbx({"exec", "-t", id, "--", "sh", "-c", "exit 3"});
  EXPECT_EQ(r.exit_code, 3) << r.err;

  r = Sbx({"exec", "nosuchsandbox", "--", "true"});
  EXPECT_EQ(r.exit_code, 125);
  EXPECT_NE(r.err.find("sbx: "), std::string::npos);
}

TEST_F(CliTest, ExecCtrlCSignalsTheCommand) {
  std::string id = Create();
  ProcessOptions o;
  o.signal_after_ms = 1500;
  o.signal = SIGINT;
  auto r =
      Sbx({"exec", id, "--", "sh", "-c", "trap 'echo got INT; exit 5' INT; sleep 30 & wait"}, o);
  EXPECT_EQ(r.exit_code, 5) << r.err;
  EXPECT_EQ(r.out, "got INT\n");
}

TEST_F(CliTest, Copy) {
  std::string id = Create();
  std::string data;
  for (int i = 0; i < 5 * 1024 * 1024; ++i)
    data.push_back(static_cast<char>((i * 7 + i / 256) & 0xff));
  ASSERT_TRUE(WriteFile(dir_ + "/in.bin", data).ok());
  auto r = Sbx({"cp", dir_ + "/in.bin", id + ":/tmp/in.bin"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Sbx({"exec", id, "--", "stat", "-c", "%s", "/tmp/in.bin"}).out,
            std::to_string(data.size()) + "\n");
  r = Sbx({"cp", id + ":/tmp/in.bin", dir_ + "/out.bin"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto back = ReadFile(dir_ + "/out.bin", 64 << 20);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(*back == data) << "size " << back->size();

  r = Sbx({"cp", id + ":/tmp/missing", dir_ + "/x"});
  EXPECT_EQ(r.exit_code, 125);
  EXPECT_NE(r.err.find("missing"), std::string::npos) << r.err;
  EXPECT_NE(::access((dir_ + "/x").c_str(), F_OK), 0);
  r = Sbx({"cp", dir_ + "/missing", id + ":/tmp/x"});
  EXPECT_EQ(r.exit_code, 125);
  EXPECT_NE(r.err.find("No such file"), std::string::npos) << r.err;

  // Directories, through the tar endpoints.
  ASSERT_TRUE(MakeDirs(dir_ + "/tree/sub").ok());
  ASSERT_TRUE(WriteFile(dir_ + "/tree/a.txt", "one\n").ok());
  ASSERT_TRUE(WriteFile(dir_ + "/tree/sub/b.txt", "two\n").ok());
  ASSERT_EQ(::symlink("/etc/passwd", (dir_ + "/tree/link").c_str()), 0);
  r = Sbx({"cp", dir_ + "/tree", id + ":/tmp/"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Sbx({"exec", id, "--", "cat", "/tmp/tree/a.txt", "/tmp/tree/sub/b.txt"}).out,
            "one\ntwo\n");
  EXPECT_EQ(Sbx({"exec", id, "--", "readlink", "/tmp/tree/link"}).out, "/etc/passwd\n");
  r = Sbx({"cp", id + ":/tmp/tree", dir_ + "/back"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(*ReadFile(dir_ + "/back/sub/b.txt"), "two\n");
  char target[64] = {};
  ASSERT_GT(::readlink((dir_ + "/back/link").c_str(), target, sizeof target - 1), 0);
  EXPECT_STREQ(target, "/etc/passwd");
}

TEST_F(CliTest, PauseResumeTimeout) {
  std::string id = Create();
  auto r = Sbx({"pause", id});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(Sbx({"inspect", id}).out)["state"], "paused");
  r = Sbx({"resume", id});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(Sbx({"inspect", id}).out)["state"], "running");
  r = Sbx({"timeout", id, "1h"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("in "), std::string::npos) << r.out;
  json j = json::parse(Sbx({"inspect", id}).out);
  EXPECT_EQ(j["timeout"], 3600.0);
  r = Sbx({"timeout", id, "soon"});
  EXPECT_EQ(r.exit_code, 125);
}

TEST_F(CliTest, LogsAndPs) {
  std::string id = Create();
  json started = Api(
      "POST", "/v1/sandboxes/" + id + "/commands",
      {{"argv", {"sh", "-c", "echo one; sleep 1; echo two >&2; exit 4"}}, {"background", true}});
  ASSERT_TRUE(started.contains("pid")) << started;
  std::string pid = std::to_string(started["pid"].get<int64_t>());
  auto r = Sbx({"logs", id, pid});
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_EQ(r.out, "one\n");
  EXPECT_EQ(r.err, "two\n");
  r = Sbx({"attach", "--stdout-offset", "2", id, pid});
  EXPECT_EQ(r.out, "e\n");
  r = Sbx({"ps", id});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("exited 4"), std::string::npos) << r.out;
  r = Sbx({"logs", id, "99999"});
  EXPECT_EQ(r.exit_code, 125);
}

TEST_F(CliTest, Audit) {
  std::string id = Create();
  auto r = Sbx({"audit", "--sandbox", id});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("SEQ"), std::string::npos);
  EXPECT_NE(r.out.find("sandbox.create"), std::string::npos) << r.out;
  r = Sbx({"audit", "--json", "--type", "sandbox.create", "--since", "10m"});
  json j = json::parse(r.out);
  ASSERT_FALSE(j["events"].empty());
  EXPECT_EQ(j["events"][0]["sandbox_id"], id);
  r = Sbx({"audit", "--since", "2999-01-01T00:00:00Z"});
  EXPECT_EQ(r.out.find("sandbox.create"), std::string::npos);
}

// Secrets through the daemon: the value from stdin or a file (never argv), never in any answer
// of the CLI or the API, a key's secrets invisible to another key.
TEST_F(CliTest, SecretsRoundTripWithoutTheirValues) {
  const std::string value = "sk-cli-REAL-value-4242424242";
  ProcessOptions in;
  in.stdin_data = value + "\n";
  auto r = Sbx({"secret", "add", "openai", "--host", "api.openai.com", "--host", "*.openai.com",
                "--header", "Authorization", "--format", "Bearer {}"},
               in);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "openai\n");
  ASSERT_TRUE(WriteFile(dir_ + "/value", value + "2\n", 0600).ok());
  r = Sbx({"secret", "add", "other", "--host", "example.com", "--value-file", dir_ + "/value",
           "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string answers = r.out + r.err;
  r = Sbx({"secret", "add", "openai", "--host", "api.openai.com"}, in);
  EXPECT_NE(r.exit_code, 0);  // taken: --replace replaces
  answers += r.out + r.err;
  r = Sbx({"secret", "add", "openai", "--host", "api.openai.com", "--host", "*.openai.com",
           "--header", "Authorization", "--format", "Bearer {}", "--replace", "--json"},
          in);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["version"], 2);
  answers += r.out + r.err;
  auto ls = Sbx({"secret", "ls"});
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  EXPECT_NE(ls.out.find("openai"), std::string::npos);
  EXPECT_NE(ls.out.find("*.openai.com"), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find("Authorization: Bearer {}"), std::string::npos) << ls.out;
  answers += ls.out;
  ls = Sbx({"secret", "ls", "--json"});
  json j = json::parse(ls.out);
  ASSERT_EQ(j["secrets"].size(), 2u);
  answers += ls.out;
  for (const char* target : {"/v1/secrets", "/v1/secrets/openai"})
    answers += Api("GET", target).dump();
  // Another key sees none of them.
  auto k = Sbx({"key", "create", "--name", "tenant"});
  ASSERT_EQ(k.exit_code, 0) << k.err;
  std::string other = k.out.substr(0, k.out.find('\n'));
  ls = Sbx({"secret", "ls", "--json", "--api-key", other});
  EXPECT_TRUE(json::parse(ls.out)["secrets"].empty()) << ls.out;
  r = Sbx({"secret", "rm", "openai", "--api-key", other});
  EXPECT_NE(r.exit_code, 0);
  answers += r.out + r.err;
  // Bad input is refused without echoing the value.
  ProcessOptions bad;
  bad.stdin_data = "a\r\nb-" + value;
  r = Sbx({"secret", "add", "bad", "--host", "x.test"}, bad);
  EXPECT_NE(r.exit_code, 0);
  answers += r.out + r.err;
  EXPECT_NE(Sbx({"secret", "add", "nohost"}, in).exit_code, 0);
  EXPECT_EQ(answers.find(value), std::string::npos) << answers;
  r = Sbx({"secret", "rm", "openai"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ls = Sbx({"secret", "ls", "--json"});
  EXPECT_EQ(json::parse(ls.out)["secrets"].size(), 1u);
  // The audit trail names the secrets, never their values.
  std::string audit = Sbx({"audit", "--json", "--type", "secret.put"}).out;
  EXPECT_NE(audit.find("openai"), std::string::npos) << audit;
  EXPECT_EQ(audit.find(value), std::string::npos);
  EXPECT_EQ(d_->log().find(value), std::string::npos);
}

TEST_F(CliTest, KeysAndConnectionErrors) {
  auto r = Sbx({"key", "create", "--name", "ci", "--max-sandboxes", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string secret = r.out.substr(0, r.out.find('\n'));
  ASSERT_EQ(secret.rfind("e2b_", 0), 0u) << r.out;
  r = Sbx({"ls", "--api-key", secret});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto keys = Sbx({"key", "ls", "--json"});
  json j = json::parse(keys.out);
  std::string key_id;
  for (const auto& k : j["keys"])
    if (k["name"] == "ci") key_id = k["id"];
  ASSERT_FALSE(key_id.empty()) << keys.out;
  EXPECT_NE(Sbx({"key", "ls"}).out.find("ci"), std::string::npos);
  for (const auto& k : j["keys"]) EXPECT_EQ(k["operator"], k["name"] == "default") << k;
  // Revoking a key kills its live sandboxes (the daemon does, on its next scan) and says so.
  r = Sbx({"create", "--api-key", secret});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string sandbox = r.out.substr(0, r.out.find('\n'));
  r = Sbx({"key", "revoke", key_id});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("revoked " + key_id + "; killed 1 live sandbox\n"), std::string::npos)
      << r.out << r.err;
  r = Sbx({"inspect", sandbox});  // the daemon's first key is an operator key
  EXPECT_EQ(json::parse(r.out)["state"], "killed") << r.out << r.err;
  r = Sbx({"key", "create", "--name", "ops", "--operator", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["operator"], true);
  r = Sbx({"ls"}, ProcessOptions{.env = {"SBX_API_KEY=" + secret}});
  EXPECT_EQ(r.exit_code, 125);
  EXPECT_NE(r.err.find("unknown or revoked API key"), std::string::npos) << r.err;

  r = Sbx({"ls", "--url", "http://127.0.0.1:1"});
  EXPECT_EQ(r.exit_code, 125);
  EXPECT_NE(r.err.find("cannot reach the sbx daemon at http://127.0.0.1:1"), std::string::npos)
      << r.err;
  r = Sbx({"ls", "--url", "ftp://x"});
  EXPECT_EQ(r.exit_code, 125);
  EXPECT_NE(r.err.find("--url"), std::string::npos) << r.err;
}

// ---- CLI habits (issue 11): what a new user tries ----

TEST_F(CliTest, ExecDetachedPrintsThePidAndLogsFollowsIt) {
  std::string id = Create();
  auto r = Sbx({"exec", "-d", id, "--", "sh", "-c", "echo one; sleep 1; echo two >&2; exit 6"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string pid = r.out.substr(0, r.out.find('\n'));
  ASSERT_FALSE(pid.empty());
  EXPECT_EQ(pid.find_first_not_of("0123456789"), std::string::npos) << r.out;
  EXPECT_EQ(r.out, pid + "\n");
  // logs follows it to the end and exits with its status.
  r = Sbx({"logs", id, pid});
  EXPECT_EQ(r.exit_code, 6) << r.err;
  EXPECT_EQ(r.out, "one\n");
  EXPECT_EQ(r.err, "two\n");
  r = Sbx({"exec", "-d", "-i", id, "--", "cat"});
  EXPECT_EQ(r.exit_code, 125);
  EXPECT_NE(r.err.find("-d does not go with -i or -t"), std::string::npos) << r.err;
}

TEST_F(CliTest, ExitCodesLikeDocker) {
  std::string id = Create();
  auto r = Sbx({"exec", id, "--", "no-such-command"});
  EXPECT_EQ(r.exit_code, 127) << r.err;
  EXPECT_NE(r.err.find("No such file or directory"), std::string::npos) << r.err;
  r = Sbx({"exec", "-i", id, "--", "/no/such/path"});
  EXPECT_EQ(r.exit_code, 127) << r.err;
  r = Sbx({"exec", id, "--", "/etc/passwd"});  // not executable
  EXPECT_EQ(r.exit_code, 126) << r.err;
  EXPECT_NE(r.err.find("Permission denied"), std::string::npos) << r.err;
  r = Sbx({"exec", "-d", id, "--", "/etc/passwd"});
  EXPECT_EQ(r.exit_code, 126) << r.err;
  r = Sbx({"exec", "-w", "/no/such/dir", id, "--", "true"});
  EXPECT_EQ(r.exit_code, 126) << r.err;
  r = Sbx({"exec", "nosuchsandbox", "--", "no-such-command"});
  EXPECT_EQ(r.exit_code, 125) << r.err;  // sbx's own failure stays 125
  // With -t the shell runs the command (127 is its own); what cannot start at all is told over
  // the terminal socket and maps as without -t.
  r = Sbx({"exec", "-t", id, "--", "no-such-command"});
  EXPECT_EQ(r.exit_code, 127) << r.err;
  r = Sbx({"exec", "-t", "-w", "/no/such/dir", id, "--", "true"});
  EXPECT_EQ(r.exit_code, 126) << r.err;
  EXPECT_NE(r.err.find("/no/such/dir"), std::string::npos) << r.err;
  r = Sbx({"exec", "-t", "-u", "nosuchuser", id, "--", "true"});
  EXPECT_EQ(r.exit_code, 126) << r.err;
  EXPECT_NE(r.err.find("nosuchuser"), std::string::npos) << r.err;

  r = Sbx({"run", "--", "no-such-command"});
  EXPECT_EQ(r.exit_code, 127) << r.err;
  EXPECT_NE(r.err.find("no-such-command: No such file or directory"), std::string::npos) << r.err;
  r = Sbx({"run", "--", "/etc/passwd"});
  EXPECT_EQ(r.exit_code, 126) << r.err;
}

TEST_F(CliTest, ExecSaysWhenTheCommandWasKilledForMemory) {
  std::string id = Create({"--memory", "32M"});
  // Touches every page, so the memory is really used.
  auto r = Sbx({"exec", id, "--", "python3", "-c", "b = bytearray(256 << 20)"});
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.err;
  EXPECT_NE(r.err.find("out of memory: the sandbox hit its memory limit of 32 MiB"),
            std::string::npos)
      << r.err;
  // Another SIGKILL is not called an OOM kill.
  r = Sbx({"exec", id, "--", "sh", "-c", "kill -9 $$"});
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
  EXPECT_EQ(r.err.find("out of memory"), std::string::npos) << r.err;
}

TEST_F(CliTest, LsShowsLiveSandboxesUnlessAll) {
  std::string live = Create(), paused = Create(), killed = Create();
  ASSERT_EQ(Sbx({"pause", paused}).exit_code, 0);
  ASSERT_EQ(Sbx({"kill", killed}).exit_code, 0);
  auto ls = Sbx({"ls"});
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  EXPECT_NE(ls.out.find(live), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find(paused), std::string::npos) << ls.out;
  EXPECT_EQ(ls.out.find(killed), std::string::npos) << ls.out;
  ls = Sbx({"ls", "--all"});
  EXPECT_NE(ls.out.find(killed), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find(live), std::string::npos) << ls.out;
  ls = Sbx({"ls", "--state", "killed"});
  EXPECT_NE(ls.out.find(killed), std::string::npos) << ls.out;
  EXPECT_EQ(ls.out.find(live), std::string::npos) << ls.out;
  // --limit is one page, and says there is more.
  ls = Sbx({"ls", "--all", "--limit", "1", "--json"});
  EXPECT_EQ(json::parse(ls.out)["sandboxes"].size(), 1u);
  EXPECT_NE(ls.err.find("more sandboxes"), std::string::npos) << ls.err;
}

TEST_F(CliTest, AuditIsNewestFirstAndPages) {
  std::string id = Create();
  for (int i = 0; i < 3; ++i) ASSERT_EQ(Sbx({"exec", id, "--", "true"}).exit_code, 0);
  auto all = Sbx({"audit", "--json", "--sandbox", id});
  ASSERT_EQ(all.exit_code, 0) << all.err;
  json events = json::parse(all.out)["events"];
  ASSERT_GE(events.size(), 7u);  // create, then start and exit three times
  for (size_t i = 1; i < events.size(); ++i)
    EXPECT_GT(events[i - 1]["seq"], events[i]["seq"]) << "not newest first";
  EXPECT_EQ(events.back()["type"], "sandbox.create");
  EXPECT_EQ(all.err, "");

  // Pages of 2, each pointing at the next, give the same events.
  std::vector<int64_t> paged;
  std::string before;
  for (int page = 0; page < 20; ++page) {
    std::vector<std::string> args = {"audit", "--json", "--sandbox", id, "--limit", "2"};
    if (!before.empty()) args.insert(args.end(), {"--before", before});
    auto r = Sbx(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    json page_events = json::parse(r.out)["events"];
    for (const auto& e : page_events) paged.push_back(e["seq"]);
    auto at = r.err.find("--before ");
    if (at == std::string::npos) break;
    before = r.err.substr(at + 9, r.err.find('\n', at) - at - 9);
  }
  std::vector<int64_t> want;
  for (const auto& e : events) want.push_back(e["seq"]);
  EXPECT_EQ(paged, want);

  json bad = Api("GET", "/v1/audit?order=sideways");
  EXPECT_NE(bad.dump().find("order: asc or desc"), std::string::npos) << bad;
}

TEST_F(CliTest, CopyDirectoryAsTarThroughStdio) {
  std::string id = Create();
  ASSERT_EQ(Sbx({"exec", id, "--", "sh", "-c",
                 "mkdir -p /tmp/t/sub && echo a > /tmp/t/a && "
                 "echo b > /tmp/t/sub/b"})
                .exit_code,
            0);
  // To stdout: a tar of the directory, for a host tar to read.
  std::string tar = dir_ + "/out.tar";
  auto r = RunProcess(
      {"/bin/sh", "-c",
       std::string(SBX_BIN) + " --data-dir " + dir_ + " cp " + id + ":/tmp/t - > " + tar});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = RunProcess({"/bin/tar", "-tf", tar});
  EXPECT_NE(r.out.find("./sub/b"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("./a"), std::string::npos) << r.out;
  // A missing directory is an error, with nothing on stdout.
  r = Sbx({"cp", id + ":/tmp/none", "-"});
  EXPECT_EQ(r.exit_code, 125);
  EXPECT_EQ(r.out, "");
  // From stdin: unpacked into an existing directory.
  ASSERT_EQ(Sbx({"exec", id, "--", "mkdir", "/tmp/in"}).exit_code, 0);
  r = RunProcess(
      {"/bin/sh", "-c",
       std::string(SBX_BIN) + " --data-dir " + dir_ + " cp - " + id + ":/tmp/in < " + tar});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Sbx({"exec", id, "--", "cat", "/tmp/in/a", "/tmp/in/sub/b"}).out, "a\nb\n");
  ProcessOptions in;
  in.stdin_data = "not a tar";
  r = Sbx({"cp", "-", id + ":/tmp/nowhere"}, in);
  EXPECT_EQ(r.exit_code, 125);
  EXPECT_NE(r.err.find("no such directory"), std::string::npos) << r.err;
}

TEST_F(CliTest, CopyToAMissingDirectoryWithASlashIsAnError) {
  std::string id = Create();
  ASSERT_TRUE(WriteFile(dir_ + "/f.txt", "f\n").ok());
  auto r = Sbx({"cp", dir_ + "/f.txt", id + ":/tmp/missing/dir/"});
  EXPECT_EQ(r.exit_code, 125);
  EXPECT_NE(r.err.find(id + ":/tmp/missing/dir/: no such directory"), std::string::npos) << r.err;
  EXPECT_NE(Sbx({"exec", id, "--", "test", "-e", "/tmp/missing"}).exit_code, 0)
      << "nothing may be written";
  r = Sbx({"cp", dir_ + "/f.txt", id + ":/etc/hostname/"});
  EXPECT_EQ(r.exit_code, 125);
  EXPECT_NE(r.err.find("not a directory"), std::string::npos) << r.err;
  // Without the slash the name is the file's new name, parents made, as before.
  r = Sbx({"cp", dir_ + "/f.txt", id + ":/tmp/made/g.txt"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Sbx({"exec", id, "--", "cat", "/tmp/made/g.txt"}).out, "f\n");
}

TEST_F(CliTest, CopiesIntoHomeBelongToItsUser) {
  std::string id = Create();
  ASSERT_EQ(Sbx({"exec", id, "--", "stat", "-c", "%U", "/home/user"}).out, "user\n");
  ASSERT_TRUE(WriteFile(dir_ + "/f.txt", "f\n").ok());
  ASSERT_TRUE(MakeDirs(dir_ + "/tree/sub").ok());
  ASSERT_TRUE(WriteFile(dir_ + "/tree/sub/b.txt", "b\n").ok());
  ASSERT_EQ(Sbx({"cp", dir_ + "/f.txt", id + ":/home/user/"}).exit_code, 0);
  ASSERT_EQ(Sbx({"cp", dir_ + "/f.txt", id + ":/home/user/new/deeper/f.txt"}).exit_code, 0);
  ASSERT_EQ(Sbx({"cp", dir_ + "/tree", id + ":/home/user"}).exit_code, 0);
  ASSERT_EQ(Sbx({"cp", dir_ + "/tree", id + ":/home/user/renamed"}).exit_code, 0);
  ASSERT_EQ(Sbx({"cp", dir_ + "/f.txt", id + ":/tmp/"}).exit_code, 0);
  auto r = Sbx({"exec", id, "--", "stat", "-c", "%U:%G %n", "/home/user/f.txt", "/home/user/new",
                "/home/user/new/deeper/f.txt", "/home/user/tree", "/home/user/tree/sub/b.txt",
                "/home/user/renamed/sub/b.txt", "/tmp/f.txt"});
  EXPECT_EQ(r.out,
            "user:user /home/user/f.txt\n"
            "user:user /home/user/new\n"
            "user:user /home/user/new/deeper/f.txt\n"
            "user:user /home/user/tree\n"
            "user:user /home/user/tree/sub/b.txt\n"
            "user:user /home/user/renamed/sub/b.txt\n"
            "root:root /tmp/f.txt\n")
      << r.err;
}

TEST_F(CliTest, ServeBannerCommandWorksWithItsDataDir) {
  std::string log = d_->log();
  auto at = log.find("try:  ");
  ASSERT_NE(at, std::string::npos) << log;
  std::string line = log.substr(at + 6, log.find('\n', at) - at - 6);
  std::string command = line.substr(0, line.find("   "));  // before the explanation
  EXPECT_EQ(command, "sbx --data-dir " + dir_ + " create") << line;
  // Copy-pasted into a shell (with this build's sbx), it creates a sandbox.
  command.replace(0, 3, SBX_BIN);
  auto r = RunProcess({"/bin/sh", "-c", command});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.size(), 21u) << r.out;
}

TEST_F(CliTest, RetriesAfterTooManyRequests) {
  // One create per 4 s: the second is refused even when the first takes long on a busy machine.
  auto k = Sbx({"key", "create", "--name", "slow", "--rate", "0.25"});
  ASSERT_EQ(k.exit_code, 0) << k.err;
  std::string secret = k.out.substr(0, k.out.find('\n'));
  // The second create is answered 429 with Retry-After (up to 4 s); the CLI waits and tries
  // again, saying so once.
  auto first = Sbx({"create", "--api-key", secret});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  auto second = Sbx({"create", "--api-key", secret});
  EXPECT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(second.out.size(), 21u) << second.out;
  size_t told = second.err.find("(HTTP 429); retrying in ");
  EXPECT_NE(told, std::string::npos) << second.err;
  if (told != std::string::npos) {
    EXPECT_EQ(second.err.find("HTTP 429", told + 2), std::string::npos) << second.err;
  }
  EXPECT_EQ(json::parse(Sbx({"ls", "--json", "--api-key", secret}).out)["sandboxes"].size(), 2u);
}

TEST_F(CliTest, MessagesReadAsSentences) {
  std::string id = Create();
  ASSERT_EQ(Sbx({"pause", id}).exit_code, 0);
  auto r = Sbx({"exec", id, "--", "true"});
  EXPECT_EQ(r.exit_code, 125);
  EXPECT_EQ(r.err, "sbx: sandbox " + id + " is paused; resume it first\n");
  r = Sbx({"pause", id});
  EXPECT_EQ(r.err, "sbx: sandbox " + id + " is already paused\n");
  ASSERT_EQ(Sbx({"resume", id}).exit_code, 0);
  r = Sbx({"resume", id});
  EXPECT_EQ(r.err, "sbx: sandbox " + id + " is not paused; there is nothing to resume\n");
  ASSERT_EQ(Sbx({"kill", id}).exit_code, 0);
  r = Sbx({"exec", id, "--", "true"});
  EXPECT_EQ(r.err, "sbx: sandbox " + id + " has ended (killed)\n");
  // The API keeps the errno's status and its text.
  json j = Api("POST", "/v1/sandboxes/" + id + "/commands", {{"argv", {"true"}}});
  EXPECT_EQ(j["error"]["code"], "not_found") << j;
}

TEST_F(CliTest, RunVolumesAreBindMounts) {
  std::string vol = dir_ + "/vol", ro = dir_ + "/ro";
  ASSERT_TRUE(MakeDirs(vol).ok());
  ASSERT_TRUE(MakeDirs(ro).ok());
  // The box's root is an unprivileged id on the host: a writable volume is written where others
  // may write.
  ASSERT_EQ(::chmod(vol.c_str(), 0777), 0);
  ASSERT_TRUE(WriteFile(vol + "/script.py", "print('hello from', __file__)\n").ok());
  ASSERT_TRUE(WriteFile(ro + "/data.txt", "read me\n").ok());
  auto r = Sbx({"run", "--volume", vol + ":/work", "--volume", ro + ":/data/in:ro", "-w", "/work",
                "--", "sh", "-c",
                "python3 script.py && cat /data/in/data.txt && echo out > /work/new.txt && "
                "touch /data/in/x 2>&1 | grep -c 'Read-only file system'"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "hello from /work/script.py\nread me\n1\n") << r.err;
  EXPECT_EQ(*ReadFile(vol + "/new.txt"), "out\n");
  EXPECT_NE(::access((ro + "/x").c_str(), F_OK), 0);

  for (const std::string& bad : {std::string("rel:/work"), vol + ":work", vol + ":/a/../b",
                                 vol + ":/work:rx", vol + "/../vol:/work", dir_ + "/none:/work"}) {
    r = Sbx({"run", "--volume", bad, "--", "true"});
    EXPECT_EQ(r.exit_code, 125) << bad;
    EXPECT_NE(r.err.find("--volume " + bad + ": "), std::string::npos) << r.err;
  }
}

// A relative --data-dir (or $SBX_DATA_DIR) names the directory from where sbx was started: `sbx
// run` reaches the box's files through /proc/<pid>/root followed by it, so it is made absolute.
TEST_F(CliTest, RunTakesARelativeDataDir) {
  const std::string parent = dir_.substr(0, dir_.rfind('/'));
  const std::string name = dir_.substr(dir_.rfind('/') + 1);
  auto r = RunProcess({"/bin/sh", "-c",
                       "cd " + parent + " && " + SBX_BIN + " --data-dir ./" + name +
                           "/ run -- sh -c 'echo in the box' && cd " + dir_ +
                           " && SBX_DATA_DIR=. " + SBX_BIN + " run -- echo again"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "in the box\nagain\n") << r.err;
  r = RunProcess({SBX_BIN, "--data-dir", "", "run", "--", "true"});
  EXPECT_EQ(r.exit_code, 125) << r.err;
  EXPECT_NE(r.err.find("--data-dir: '' is not a directory path"), std::string::npos) << r.err;
}

// The network verbs on a daemon without networking (issue 12): the policy is shown in ls, inspect
// and `sbx net`; a policy with a network is refused saying how to turn it on.
TEST_F(CliTest, NetAndPortUrl) {
  std::string id = Create({"--net", "none"});
  auto ls = Sbx({"ls"});
  EXPECT_NE(ls.out.find("NETWORK"), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find("none"), std::string::npos) << ls.out;
  auto inspect = Sbx({"inspect", id});
  EXPECT_EQ(json::parse(inspect.out)["network"]["mode"], "none");
  auto show = Sbx({"net", id});
  EXPECT_EQ(show.exit_code, 0) << show.err;
  EXPECT_EQ(show.out, "none\n");
  auto off = Sbx({"create", "--net", "allow=pypi.org,*.npmjs.org"});
  EXPECT_NE(off.exit_code, 0);
  EXPECT_NE(off.err.find("networking is not enabled on this daemon"), std::string::npos) << off.err;
  auto put = Sbx({"net", id, "open"});
  EXPECT_NE(put.exit_code, 0);
  EXPECT_NE(put.err.find("networking is not enabled"), std::string::npos) << put.err;
  auto bad = Sbx({"net", id, "allow=bad name!"});
  EXPECT_NE(bad.err.find("bad name!"), std::string::npos) << bad.err;
  // Flag shapes are checked before anything is sent.
  for (std::vector<std::string> args : {std::vector<std::string>{"--net", "none", "--net", "open"},
                                        {"--net", "deny=1.2.3.4"},
                                        {"--net", "none", "--net", "allow=x.org"},
                                        {"--net", "sideways"}}) {
    args.insert(args.begin(), "create");
    auto r = Sbx(args);
    EXPECT_NE(r.exit_code, 0) << args[2];
    EXPECT_NE(r.err.find("--net"), std::string::npos) << r.err;
  }
  EXPECT_EQ(Sbx({"net", id, "none"}).out, "none\n");
  auto json_out = Sbx({"net", id, "--json"});
  EXPECT_EQ(json::parse(json_out.out)["mode"], "none");

  // port-url: a URL to the port route that works without a key.
  auto url = Sbx({"port-url", id, "8000", "--ttl", "10m"});
  ASSERT_EQ(url.exit_code, 0) << url.err;
  std::string u = url.out.substr(0, url.out.find('\n'));
  std::string prefix = "http://127.0.0.1:" + std::to_string(d_->port()) + "/v1/sandboxes/" + id +
                       "/ports/8000/?sbx_expires=";
  EXPECT_EQ(u.rfind(prefix, 0), 0u) << u;
  auto r = http::Request("127.0.0.1", d_->port(), "GET", u.substr(u.find("/v1/")), {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 502) << r->body;  // let in; nothing listens on 8000
  EXPECT_NE(Sbx({"port-url", id, "8000", "--ttl", "soon"}).exit_code, 0);
  EXPECT_NE(Sbx({"port-url", id, "70000"}).exit_code, 0);
}

TEST_F(CliTest, ServeNetworkFlagsAreChecked) {
  for (std::vector<std::string> flags : {std::vector<std::string>{"--box-subnet", "10.213.0.0/33"},
                                         {"--box-subnet", "fd00::/64"},
                                         {"--upstream-dns", "198.18.0.53"},
                                         {"--upstream-dns", "nameserver:53"},
                                         {"--upstream-ca", dir_ + "/no-such-ca.pem"},
                                         {"--allow-range", "8.8.8.0/24"},
                                         {"--network", "maybe"}}) {
    // Its own data directory: the test's daemon holds the test's.
    std::vector<std::string> args = {SBX_BIN, "--data-dir", dir_ + "/other",
                                     "serve", "--listen",   "127.0.0.1:0"};
    args.insert(args.end(), flags.begin(), flags.end());
    ProcessOptions o;
    o.timeout_ms = 60000;
    auto r = RunProcess(args, o);
    EXPECT_NE(r.exit_code, 0) << flags[0] << " " << flags[1];
    EXPECT_NE(r.err.find(flags[0]), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace sbx::test
