// Boost 1.74 headers use std::exchange without including <utility>.
// clang-format off
#include <utility>
// clang-format on

// sbx serve end to end: a real daemon process driven over HTTP. Covers the REST API, its error
// answers, a client that goes away mid-stream, a daemon killed with SIGKILL and restarted, and
// concurrency; after each test nothing of the daemon's boxes is left on the host.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "api/http/client.h"
#include "common/fd.h"
#include "common/fs.h"
#include "daemon_process.h"
#include "sbx_process.h"
#include "store/store.h"

extern char** environ;

namespace sbx::test {
namespace {

using nlohmann::json;

std::string Unbase64(const std::string& in) {
  std::string out(in.size(), '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(in.data()),
                          static_cast<int>(in.size()));
  if (n < 0) return "";
  size_t pad = 0;
  if (!in.empty() && in.back() == '=') ++pad;
  if (in.size() > 1 && in[in.size() - 2] == '=') ++pad;
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

// The stdout bytes of an NDJSON command stream, decoded.
std::string StdoutOf(const std::string& ndjson) {
  std::string text;
  std::istringstream lines(ndjson);
  std::string line;
  while (std::getline(lines, line)) {
    json e = json::parse(line, nullptr, false);
    if (!e.is_discarded() && e.value("type", "") == "stdout") text += Unbase64(e["data"]);
  }
  return text;
}

class Daemon : public DaemonProcess {
 public:
  using DaemonProcess::DaemonProcess;

  http::Response Call(const std::string& method, const std::string& target,
                      const std::string& body = "", http::ClientHeaders headers = {}) {
    if (headers.empty() || headers[0].first != "Authorization")
      headers.insert(headers.begin(), {"Authorization", "Bearer " + key()});
    auto r = http::Request(http::Endpoint{"127.0.0.1", port(), ""}, method, target, headers, body,
                           std::chrono::seconds(60));
    EXPECT_TRUE(r.ok()) << method << " " << target << ": " << r.status().message();
    return r.ok() ? *r : http::Response{};
  }
  json Json(const std::string& method, const std::string& target, const json& body = nullptr,
            int want = 200) {
    auto r = Call(method, target, body.is_null() ? "" : body.dump(),
                  {{"Content-Type", "application/json"}});
    EXPECT_EQ(r.status, want) << method << " " << target << ": " << r.body;
    return json::parse(r.body.empty() ? "null" : r.body, nullptr, false);
  }
  // Runs a command to completion through the NDJSON stream.
  struct Run {
    std::string out, err;
    int64_t exit_code = -999;
    int64_t pid = 0;
  };
  Run Exec(const std::string& id, const json& cmd) {
    Run run;
    auto r = Call("POST", "/v1/sandboxes/" + id + "/commands", cmd.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    std::istringstream lines(r.body);
    std::string line;
    while (std::getline(lines, line)) {
      json e = json::parse(line, nullptr, false);
      if (e.is_discarded()) continue;
      std::string t = e.value("type", "");
      if (t == "stdout") run.out += Unbase64(e["data"]);
      if (t == "stderr") run.err += Unbase64(e["data"]);
      if (t == "start") run.pid = e["pid"];
      if (t == "exit") run.exit_code = e["exit_code"];
    }
    return run;
  }
};

class ServeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-serve-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    ASSERT_EQ(::chmod(tmpl, 0711), 0);
    dir_ = tmpl;
    ::setenv("SBX_CGROUP_PARENT", ("sbx-serve-test-" + std::to_string(::getpid())).c_str(), 1);
    d_ = std::make_unique<Daemon>(dir_);
    d_->Start();
  }
  void TearDown() override {
    // Kill what is left through the API, stop the daemon, then check the host. A daemon that
    // died during the test is started again first: it adopts the boxes, which can then be killed.
    EXPECT_TRUE(d_->Alive()) << "the daemon died during the test: "
                             << *ReadFile(dir_ + "/serve.log");
    if (!d_->Alive()) d_->Start();
    if (d_->port()) {
      json list = d_->Json("GET", "/v1/sandboxes?state=running&state=paused");
      for (const auto& s : list["sandboxes"])
        d_->Call("DELETE", "/v1/sandboxes/" + s["id"].get<std::string>());
    }
    d_.reset();
    std::string mounts = *ReadFile("/proc/self/mountinfo");
    EXPECT_EQ(mounts.find(dir_), std::string::npos);
    auto run = dir_ + "/run";
    EXPECT_EQ(::system(("test -z \"$(ls -A " + run + " 2>/dev/null)\"").c_str()), 0)
        << "box directories left";
    ExpectNoCgroupsAndRemoveParent("sbx-serve-test-" + std::to_string(::getpid()));
    RemoveTree(dir_);
  }
  std::string Create(const json& body = json::object()) {
    json s = d_->Json("POST", "/v1/sandboxes", body, 201);
    return s.value("id", "");
  }
  std::string dir_;
  std::unique_ptr<Daemon> d_;
};

TEST_F(ServeTest, HealthAndAuth) {
  auto h = http::Request("127.0.0.1", d_->port(), "GET", "/healthz");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->status, 200);
  auto none = http::Request("127.0.0.1", d_->port(), "GET", "/v1/sandboxes");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->status, 401);
  auto wrong = d_->Call("GET", "/v1/sandboxes", "", {{"Authorization", "Bearer sbx_wrong"}});
  EXPECT_EQ(wrong.status, 401);
  EXPECT_NE(wrong.body.find("\"error\""), std::string::npos) << wrong.body;
  // The key is in a 0600 file.
  struct stat st;
  ASSERT_EQ(::stat((dir_ + "/api-key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(ServeTest, SandboxLifecycle) {
  json body = {{"metadata", {{"team", "a"}, {"run", "1"}}},
               {"env", {{"GREETING", "hi"}}},
               {"timeout", 120},
               {"limits", {{"memory_bytes", 256 << 20}, {"pids", 128}, {"cpus", 1}}}};
  std::string id = Create(body);
  ASSERT_FALSE(id.empty());
  json got = d_->Json("GET", "/v1/sandboxes/" + id);
  EXPECT_EQ(got["state"], "running");
  EXPECT_EQ(got["metadata"]["team"], "a");
  EXPECT_EQ(got["limits"]["memory_bytes"], 256 << 20);
  EXPECT_TRUE(got.contains("stats"));
  json list = d_->Json("GET", "/v1/sandboxes?metadata.team=a");
  ASSERT_EQ(list["sandboxes"].size(), 1u);
  EXPECT_EQ(d_->Json("GET", "/v1/sandboxes?metadata.team=b")["sandboxes"].size(), 0u);

  // Wrong types are a 400, not a crash or a 500.
  EXPECT_EQ(d_->Call("POST", "/v1/sandboxes/" + id + "/commands",
                     R"({"argv":["true"],"background":"yes"})")
                .status,
            400);
  EXPECT_EQ(d_->Call("POST", "/v1/sandboxes/" + id + "/commands",
                     R"({"argv":["true"],"pty":{"rows":"x"}})")
                .status,
            400);
  EXPECT_EQ(d_->Call("POST", "/v1/sandboxes/" + id + "/commands", R"({"argv":[]})").status, 400);
  EXPECT_EQ(d_->Call("POST", "/v1/sandboxes/" + id + "/commands", R"({"argv":["no-such-program"]})")
                .status,
            404);
  // The command's env wins over the sandbox's, with one value per variable.
  auto env = d_->Exec(id, {{"command", "env | grep -c '^GREETING='; echo $GREETING"},
                           {"env", {{"GREETING", "cmd"}}}});
  EXPECT_EQ(env.out, "1\ncmd\n");
  EXPECT_FALSE(got["created_at"].get<std::string>().empty());
  auto run = d_->Exec(id, {{"command", "echo $GREETING; echo oops >&2; exit 3"}});
  EXPECT_EQ(run.out, "hi\n");
  EXPECT_EQ(run.err, "oops\n");
  EXPECT_EQ(run.exit_code, 3);

  EXPECT_EQ(d_->Json("POST", "/v1/sandboxes/" + id + "/pause")["state"], "paused");
  d_->Json("POST", "/v1/sandboxes/" + id + "/pause", nullptr, 409);
  EXPECT_EQ(d_->Json("POST", "/v1/sandboxes/" + id + "/resume")["state"], "running");
  EXPECT_EQ(d_->Exec(id, {{"argv", {"true"}}}).exit_code, 0);

  EXPECT_EQ(d_->Call("DELETE", "/v1/sandboxes/" + id).status, 204);
  EXPECT_EQ(d_->Json("GET", "/v1/sandboxes/" + id)["state"], "killed");
  EXPECT_EQ(d_->Call("DELETE", "/v1/sandboxes/" + id).status, 404);
}

TEST_F(ServeTest, BadInputGetsAClear4xx) {
  EXPECT_EQ(d_->Call("POST", "/v1/sandboxes", "{not json").status, 400);
  EXPECT_EQ(d_->Call("POST", "/v1/sandboxes", R"({"limits":{"memory_bytes":-1}})").status, 400);
  EXPECT_EQ(d_->Call("POST", "/v1/sandboxes", R"({"bogus":1})").status, 400);
  EXPECT_EQ(d_->Call("POST", "/v1/sandboxes", R"({"template":"nope"})").status, 400);
  EXPECT_EQ(d_->Call("POST", "/v1/sandboxes", R"({"on_timeout":"explode"})").status, 400);
  EXPECT_EQ(d_->Call("POST", "/v1/sandboxes", R"({"timeout":"soon"})").status, 400);
  EXPECT_EQ(d_->Call("GET", "/v1/sandboxes/doesnotexist").status, 404);
  EXPECT_EQ(d_->Call("GET", "/v1/nothing-here").status, 404);
  EXPECT_EQ(d_->Call("PATCH", "/v1/sandboxes").status, 405);
  EXPECT_EQ(d_->Call("POST", "/v1/sandboxes", std::string(2 << 20, 'x')).status, 413);
  // Nothing half-created.
  EXPECT_EQ(d_->Json("GET", "/v1/sandboxes")["sandboxes"].size(), 0u);
}

TEST_F(ServeTest, IdempotencyKeyReturnsTheSameSandbox) {
  json body = {{"timeout", 60}};
  auto a = d_->Call("POST", "/v1/sandboxes", body.dump(), {{"Idempotency-Key", "k1"}});
  auto b = d_->Call("POST", "/v1/sandboxes", body.dump(), {{"Idempotency-Key", "k1"}});
  ASSERT_EQ(a.status, 201);
  ASSERT_EQ(b.status, 201);
  EXPECT_EQ(json::parse(a.body)["id"], json::parse(b.body)["id"]);
  auto c =
      d_->Call("POST", "/v1/sandboxes", json{{"timeout", 61}}.dump(), {{"Idempotency-Key", "k1"}});
  EXPECT_EQ(c.status, 409);
}

TEST_F(ServeTest, BackgroundCommandStdinSignalAndReattach) {
  std::string id = Create();
  json bg = d_->Json(
      "POST", "/v1/sandboxes/" + id + "/commands",
      {{"argv", {"sh", "-c", "cat; echo done"}}, {"stdin", true}, {"background", true}}, 201);
  int64_t pid = bg["pid"];
  ASSERT_GT(pid, 0);
  EXPECT_EQ(d_->Call("POST", "/v1/sandboxes/" + id + "/commands/" + std::to_string(pid) + "/stdin",
                     "hello\n")
                .status,
            204);
  EXPECT_EQ(
      d_->Call("POST", "/v1/sandboxes/" + id + "/commands/" + std::to_string(pid) + "/stdin/close")
          .status,
      204);
  auto out =
      d_->Call("GET", "/v1/sandboxes/" + id + "/commands/" + std::to_string(pid) + "/output");
  EXPECT_NE(out.body.find("\"exit\""), std::string::npos) << out.body;
  EXPECT_EQ(StdoutOf(out.body), "hello\ndone\n");
  // From an offset: only the tail.
  auto tail = d_->Call("GET", "/v1/sandboxes/" + id + "/commands/" + std::to_string(pid) +
                                  "/output?stdout_offset=6");
  EXPECT_EQ(StdoutOf(tail.body), "done\n") << tail.body;

  json sleeper = d_->Json("POST", "/v1/sandboxes/" + id + "/commands",
                          {{"argv", {"sleep", "100"}}, {"background", true}}, 201);
  std::string sp = std::to_string(sleeper["pid"].get<int64_t>());
  json procs = d_->Json("GET", "/v1/sandboxes/" + id + "/commands");
  bool running = false;
  for (const auto& p : procs["commands"])
    running |= p["pid"] == sleeper["pid"] && p["running"] == true;
  EXPECT_TRUE(running) << procs.dump();
  EXPECT_EQ(d_->Call("POST", "/v1/sandboxes/" + id + "/commands/" + sp + "/signal",
                     R"({"signal":"SIGTERM"})")
                .status,
            204);
  auto ended = d_->Call("GET", "/v1/sandboxes/" + id + "/commands/" + sp + "/output");
  EXPECT_NE(ended.body.find("\"signal\":15"), std::string::npos) << ended.body;
}

TEST_F(ServeTest, Files) {
  std::string id = Create();
  std::string big(3 << 20, 'z');
  auto put =
      d_->Call("PUT", "/v1/sandboxes/" + id + "/files?path=/home/user/a/b.txt&mode=0640", big);
  ASSERT_EQ(put.status, 200) << put.body;
  EXPECT_EQ(json::parse(put.body)["size"], big.size());
  auto get = d_->Call("GET", "/v1/sandboxes/" + id + "/files?path=/home/user/a/b.txt");
  EXPECT_EQ(get.status, 200);
  EXPECT_EQ(get.body == big, true);
  json st = d_->Json("GET", "/v1/sandboxes/" + id + "/files/stat?path=/home/user/a/b.txt");
  EXPECT_EQ(st["mode"], 0640);
  EXPECT_EQ(st["type"], "file");
  d_->Json("POST", "/v1/sandboxes/" + id + "/files/mkdir", {{"path", "/tmp/x/y"}});
  d_->Json("POST", "/v1/sandboxes/" + id + "/files/move",
           {{"from", "/home/user/a/b.txt"}, {"to", "/tmp/x/y/c.txt"}});
  json ls = d_->Json("GET", "/v1/sandboxes/" + id + "/files/list?path=/tmp/x&depth=2");
  ASSERT_EQ(ls["entries"].size(), 2u) << ls.dump();
  EXPECT_EQ(d_->Call("DELETE", "/v1/sandboxes/" + id + "/files?path=/tmp/x&recursive=true").status,
            204);
  EXPECT_EQ(d_->Call("GET", "/v1/sandboxes/" + id + "/files/stat?path=/tmp/x").status, 404);
  EXPECT_EQ(d_->Call("GET", "/v1/sandboxes/" + id + "/files?path=/etc/../../nope").status, 404);
  EXPECT_EQ(d_->Call("GET", "/v1/sandboxes/" + id + "/files").status, 400);
  // Audited.
  json audit = d_->Json("GET", "/v1/audit?sandbox=" + id + "&type=file.write");
  EXPECT_EQ(audit["events"].size(), 1u) << audit.dump();
}

TEST_F(ServeTest, UploadCutShortKeepsTheOldFileAndLeavesNoTemporaryFile) {
  std::string id = Create();
  ASSERT_EQ(d_->Call("PUT", "/v1/sandboxes/" + id + "/files?path=/tmp/u.txt", "old").status, 200);
  {
    // A client announces 1 MB, sends 1000 bytes and goes away.
    namespace asio = boost::asio;
    asio::io_context io;
    asio::ip::tcp::socket s(io);
    s.connect({asio::ip::make_address("127.0.0.1"), d_->port()});
    std::string req = "PUT /v1/sandboxes/" + id +
                      "/files?path=/tmp/u.txt HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                      d_->key() + "\r\nContent-Length: 1000000\r\n\r\n" + std::string(1000, 'n');
    asio::write(s, asio::buffer(req));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  // The sandbox's agent connection stays open (it is shared), so only WRITE_ABORT removes the
  // temporary file, and promptly.
  std::string names;
  for (int i = 0; i < 50; ++i) {
    json ls = d_->Json("GET", "/v1/sandboxes/" + id + "/files/list?path=/tmp");
    names.clear();
    for (const auto& e : ls["entries"]) names += e["name"].get<std::string>() + " ";
    if (names.find(".sbx-") == std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(names.find(".sbx-"), std::string::npos) << names;
  EXPECT_EQ(d_->Call("GET", "/v1/sandboxes/" + id + "/files?path=/tmp/u.txt").body, "old");
}

TEST_F(ServeTest, APortIsReachableWithTheTrafficToken) {
  json s = d_->Json("POST", "/v1/sandboxes", json::object(), 201);
  std::string id = s["id"], token = s["traffic_token"];
  ASSERT_EQ(token.size(), 64u);
  d_->Json("PUT", "/v1/sandboxes/" + id + "/files?path=/srv/hello.txt", nullptr, 200);
  d_->Json("POST", "/v1/sandboxes/" + id + "/commands",
           {{"argv", {"python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", "-d", "/srv"}},
            {"background", true}},
           201);
  http::ClientHeaders to = {{"E2b-Sandbox-Id", id}, {"E2b-Sandbox-Port", "8000"}};
  http::ClientHeaders with = to;
  with.emplace_back("E2B-Traffic-Access-Token", token);
  int status = 0;
  for (int i = 0; i < 100 && status != 200; ++i) {
    auto r = http::Request("127.0.0.1", d_->port(), "GET", "/hello.txt", with);
    ASSERT_TRUE(r.ok()) << r.status().message();
    status = r->status;
    if (status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(status, 200);
  auto without = http::Request("127.0.0.1", d_->port(), "GET", "/hello.txt", to);
  ASSERT_TRUE(without.ok());
  EXPECT_EQ(without->status, 403);
  // The same token from a second GET, and for another sandbox it is different.
  json again = d_->Json("GET", "/v1/sandboxes/" + id);
  EXPECT_EQ(again["traffic_token"], token);
  EXPECT_EQ(again["public_ports"], false);
  EXPECT_NE(d_->Json("POST", "/v1/sandboxes", json::object(), 201)["traffic_token"], token);
  // Public ports are asked for at create, and only with a boolean.
  EXPECT_EQ(d_->Json("POST", "/v1/sandboxes", {{"public_ports", true}}, 201)["public_ports"], true);
  EXPECT_EQ(d_->Call("POST", "/v1/sandboxes", json{{"public_ports", "yes"}}.dump()).status, 400);
}

TEST_F(ServeTest, TimeoutKillsAndSettingItResets) {
  std::string id = Create({{"timeout", 1}});
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  EXPECT_EQ(d_->Json("GET", "/v1/sandboxes/" + id)["state"], "killed");
  std::string p = Create({{"timeout", 1}, {"on_timeout", "pause"}});
  std::string keep = Create({{"timeout", 1}});
  d_->Json("POST", "/v1/sandboxes/" + keep + "/timeout", {{"timeout", 60}});
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  EXPECT_EQ(d_->Json("GET", "/v1/sandboxes/" + p)["state"], "paused");
  EXPECT_EQ(d_->Json("GET", "/v1/sandboxes/" + keep)["state"], "running");
}

TEST_F(ServeTest, ClientGoneMidStreamLeavesTheProcessRunning) {
  std::string id = Create();
  // Read only the first bytes of a long-running command's stream, then hang up.
  bool got = false;
  auto r = http::RequestStream(
      http::Endpoint{"127.0.0.1", d_->port(), ""}, "POST", "/v1/sandboxes/" + id + "/commands",
      {{"Authorization", "Bearer " + d_->key()}},
      json{{"command", "for i in $(seq 1 30); do echo line$i; sleep 0.1; done"}}.dump(),
      std::chrono::seconds(10), [&](std::string_view) {
        got = true;
        return false;  // stop reading: the connection closes
      });
  EXPECT_TRUE(got);
  (void)r;
  json procs = d_->Json("GET", "/v1/sandboxes/" + id + "/commands");
  ASSERT_EQ(procs["commands"].size(), 1u);
  int64_t pid = procs["commands"][0]["pid"];
  auto rest =
      d_->Call("GET", "/v1/sandboxes/" + id + "/commands/" + std::to_string(pid) + "/output");
  EXPECT_NE(rest.body.find("\"exit_code\":0"), std::string::npos) << rest.body;
  EXPECT_NE(StdoutOf(rest.body).find("line30\n"), std::string::npos);
}

TEST_F(ServeTest, DaemonKilledAndRestartedKeepsSandboxes) {
  std::string id = Create({{"timeout", 300}});
  json bg = d_->Json("POST", "/v1/sandboxes/" + id + "/commands",
                     {{"command", "sleep 1; echo written-while-down"}, {"background", true}}, 201);
  d_->Json("PUT", "/v1/sandboxes/" + id + "/files?path=/tmp/keep", nullptr, 200);
  d_->Stop(SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  d_->Start();
  json got = d_->Json("GET", "/v1/sandboxes/" + id);
  EXPECT_EQ(got["state"], "running");
  auto out = d_->Call("GET", "/v1/sandboxes/" + id + "/commands/" +
                                 std::to_string(bg["pid"].get<int64_t>()) + "/output");
  EXPECT_EQ(StdoutOf(out.body), "written-while-down\n") << out.body;
  EXPECT_EQ(d_->Exec(id, {{"argv", {"ls", "/tmp/keep"}}}).exit_code, 0);
}

TEST_F(ServeTest, TwoHundredConcurrentRequests) {
  std::string id = Create();
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 20; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10; ++i) {
        auto r =
            http::Request(http::Endpoint{"127.0.0.1", d_->port(), ""}, "GET", "/v1/sandboxes/" + id,
                          {{"Authorization", "Bearer " + d_->key()}}, "", std::chrono::seconds(30));
        if (r.ok() && r->status == 200) ++ok;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 200);
}

TEST_F(ServeTest, MetricsAndAudit) {
  std::string id = Create();
  d_->Exec(id, {{"argv", {"true"}}});
  auto m = http::Request("127.0.0.1", d_->port(), "GET", "/metrics");
  ASSERT_TRUE(m.ok());
  EXPECT_NE(m->body.find("sbx_sandboxes{state=\"running\"} 1"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("sbx_sandbox_creations_total 1"), std::string::npos);
  EXPECT_NE(m->body.find("sbx_create_seconds_bucket"), std::string::npos);
  EXPECT_NE(m->body.find("sbx_sandbox_memory_bytes{sandbox=\"" + id + "\"}"), std::string::npos);
  json audit = d_->Json("GET", "/v1/audit?sandbox=" + id);
  std::set<std::string> types;
  for (const auto& e : audit["events"]) types.insert(e["type"]);
  EXPECT_TRUE(types.count("sandbox.create"));
  EXPECT_TRUE(types.count("command.start"));
  EXPECT_TRUE(types.count("command.exit"));
}

TEST_F(ServeTest, OneDaemonPerDataDirAndRunBoxesAreLeftAlone) {
  // A second daemon on the same data directory refuses to start (and touches nothing).
  std::string id = Create();
  auto second = RunProcess({SBX_BIN, "--data-dir", dir_, "serve", "--listen", "127.0.0.1:0"});
  EXPECT_EQ(second.exit_code, 125);
  EXPECT_NE(second.err.find("another sbx serve"), std::string::npos) << second.err;
  EXPECT_EQ(d_->Json("GET", "/v1/sandboxes/" + id)["state"], "running");
  // A one-shot `sbx run` in the same data directory keeps its box while the daemon restarts.
  ProcessOptions o;
  o.timeout_ms = 30000;
  std::thread run([&] {
    auto r = RunProcess(
        {SBX_BIN, "--data-dir", dir_, "run", "--", "sh", "-c", "sleep 2; echo survived"}, o);
    EXPECT_EQ(r.out, "survived\n") << r.err;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  d_->Stop(SIGTERM);
  d_->Start();
  run.join();
  EXPECT_EQ(d_->Json("GET", "/v1/sandboxes/" + id)["state"], "running");
}

TEST_F(ServeTest, DirectoriesAsTarStreams) {
  std::string id = Create();
  std::string src = dir_ + "/tree";
  ASSERT_EQ(::system(("mkdir -p " + src + "/sub && printf one > " + src +
                      "/a.txt && head -c 300000 /dev/urandom > " + src + "/sub/b.bin && tar -C " +
                      src + " -cf " + dir_ + "/up.tar .")
                         .c_str()),
            0);
  auto up = d_->Call("PUT", "/v1/sandboxes/" + id + "/files/archive?path=/home/user/tree",
                     *ReadFile(dir_ + "/up.tar"));
  ASSERT_EQ(up.status, 204) << up.body;
  EXPECT_EQ(d_->Call("GET", "/v1/sandboxes/" + id + "/files?path=/home/user/tree/a.txt").body,
            "one");
  auto down = d_->Call("GET", "/v1/sandboxes/" + id + "/files/archive?path=/home/user/tree");
  ASSERT_EQ(down.status, 200);
  ASSERT_TRUE(WriteFile(dir_ + "/down.tar", down.body).ok());
  std::string out = dir_ + "/out";
  ASSERT_EQ(::system(("mkdir -p " + out + " && tar -C " + out + " -xf " + dir_ +
                      "/down.tar && cmp " + src + "/sub/b.bin " + out + "/sub/b.bin")
                         .c_str()),
            0);
  EXPECT_EQ(d_->Call("GET", "/v1/sandboxes/" + id + "/files/archive?path=/no/such/dir").status,
            404);
  // An archive that tries to climb out of its target directory is refused by tar (and could only
  // ever reach the box's own files).
  ASSERT_EQ(::system(("python3 -c \"import tarfile,io\nt=tarfile.open('" + dir_ +
                      "/evil.tar','w')\ni=tarfile.TarInfo('../"
                      "escaped')\ni.size=3\nt.addfile(i,io.BytesIO(b'bad'))\nt.close()\"")
                         .c_str()),
            0);
  auto evil = d_->Call("PUT", "/v1/sandboxes/" + id + "/files/archive?path=/tmp/target",
                       *ReadFile(dir_ + "/evil.tar"));
  EXPECT_EQ(evil.status, 400) << evil.body;
  EXPECT_EQ(d_->Call("GET", "/v1/sandboxes/" + id + "/files/stat?path=/tmp/escaped").status, 404);
}

TEST_F(ServeTest, WatchStreamsEvents) {
  std::string id = Create();
  d_->Json("POST", "/v1/sandboxes/" + id + "/files/mkdir", {{"path", "/tmp/w"}});
  std::string events;
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    d_->Call("PUT", "/v1/sandboxes/" + id + "/files?path=/tmp/w/new.txt", "x");
    d_->Call("DELETE", "/v1/sandboxes/" + id + "/files?path=/tmp/w/new.txt");
  });
  auto r = http::RequestStream(http::Endpoint{"127.0.0.1", d_->port(), ""}, "GET",
                               "/v1/sandboxes/" + id + "/files/watch?path=/tmp/w",
                               {{"Authorization", "Bearer " + d_->key()}}, "",
                               std::chrono::seconds(10), [&](std::string_view chunk) {
                                 events += chunk;
                                 return events.find("\"remove\"") == std::string::npos;
                               });
  writer.join();
  EXPECT_NE(events.find("\"create\""), std::string::npos) << events;
  EXPECT_NE(events.find("\"remove\""), std::string::npos) << events;
}

TEST_F(ServeTest, PtyOverWebSocket) {
  std::string id = Create();
  namespace beast = boost::beast;
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket sock(io);
  sock.connect({boost::asio::ip::make_address("127.0.0.1"), d_->port()});
  beast::websocket::stream<boost::asio::ip::tcp::socket> ws(std::move(sock));
  ws.set_option(beast::websocket::stream_base::decorator([&](beast::websocket::request_type& req) {
    req.set(beast::http::field::authorization, "Bearer " + d_->key());
  }));
  ws.handshake("127.0.0.1", "/v1/sandboxes/" + id + "/pty?command=/bin/sh&rows=30&cols=100");
  ws.binary(true);
  ws.write(boost::asio::buffer(std::string("stty size; tty; exit 5\n")));
  std::string screen;
  json exit_event;
  for (;;) {
    beast::flat_buffer buf;
    beast::error_code ec;
    ws.read(buf, ec);
    if (ec) break;
    std::string msg = beast::buffers_to_string(buf.data());
    if (ws.got_text()) {
      json e = json::parse(msg, nullptr, false);
      if (e.value("type", "") == "exit") exit_event = e;
    } else {
      screen += msg;
    }
  }
  EXPECT_NE(screen.find("30 100"), std::string::npos) << screen;
  EXPECT_NE(screen.find("/dev/pts/"), std::string::npos) << screen;
  EXPECT_EQ(exit_event.value("exit_code", -1), 5) << exit_event.dump();
}

TEST_F(ServeTest, QuotasAnswer429WithRetryAfter) {
  auto st = store::Store::Open(dir_ + "/sbx.db");
  ASSERT_TRUE(st.ok()) << st.status().message();
  auto key = (*st)->CreateApiKey("limited", 1, 0);
  ASSERT_TRUE(key.ok());
  auto rate = (*st)->CreateApiKey("slow", 0, 0.2);
  ASSERT_TRUE(rate.ok());
  http::ClientHeaders limited = {{"Authorization", "Bearer " + key->secret}};
  auto first = d_->Call("POST", "/v1/sandboxes", "{}", limited);
  ASSERT_EQ(first.status, 201) << first.body;
  auto second = d_->Call("POST", "/v1/sandboxes", "{}", limited);
  EXPECT_EQ(second.status, 429) << second.body;
  EXPECT_FALSE(second.Header("Retry-After").empty());
  // Another tenant's sandbox does not exist for this key.
  std::string other = Create();
  EXPECT_EQ(d_->Call("GET", "/v1/sandboxes/" + other, "", limited).status, 404);
  EXPECT_EQ(d_->Call("DELETE", "/v1/sandboxes/" + json::parse(first.body)["id"].get<std::string>(),
                     "", limited)
                .status,
            204);

  http::ClientHeaders slow = {{"Authorization", "Bearer " + rate->secret}};
  auto a = d_->Call("POST", "/v1/sandboxes", "{}", slow);
  auto b = d_->Call("POST", "/v1/sandboxes", "{}", slow);
  EXPECT_EQ(a.status, 201);
  EXPECT_EQ(b.status, 429);
  EXPECT_GE(std::atoi(std::string(b.Header("Retry-After")).c_str()), 1);
  if (a.status == 201)
    d_->Call("DELETE", "/v1/sandboxes/" + json::parse(a.body)["id"].get<std::string>(), "", slow);
}

// Issue 9: each request with a bad key stored an audit row with its whole path (3000 of them grew
// the database by 42 MB). Now both facades share one aggregated record per address and window.
TEST_F(ServeTest, BadKeyFloodCostsTheStoreAFewRows) {
  std::string long_path =
      "/v1/sandboxes/" + std::string(3000, 'p') + "?q=" + std::string(3000, 'q');
  for (int i = 0; i < 3000; ++i) {
    http::ClientHeaders h;
    std::string target;
    if (i % 3 == 0) {  // E2B control plane
      h = {{"X-API-Key", "e2b_wrong" + std::to_string(i)}};
      target = "/sandboxes";
    } else {
      h = {{"Authorization", "Bearer sbx_wrong" + std::to_string(i)}};
      target = i % 3 == 1 ? long_path : "/v1/sandboxes";
    }
    auto r = http::Request(http::Endpoint{"127.0.0.1", d_->port(), ""}, "GET", target, h, "",
                           std::chrono::seconds(10));
    ASSERT_TRUE(r.ok()) << r.status().message();
    ASSERT_EQ(r->status, 401) << r->body;
  }
  d_->Stop();  // a clean stop writes the pending count
  {
    auto st = store::Store::Open(dir_ + "/" + store::kDbFileName);
    ASSERT_TRUE(st.ok()) << st.status().message();
    store::AuditQuery q;
    q.type = "auth.denied";
    q.limit = 10000;
    auto events = (*st)->QueryAudit(q);
    ASSERT_TRUE(events.ok());
    EXPECT_EQ(events->size(), 2u);
    int64_t count = 0;
    for (const auto& e : *events) {
      count += e.detail.value("count", int64_t{0});
      EXPECT_EQ(e.detail.value("remote", ""), "127.0.0.1");
      EXPECT_LE(e.detail.value("path", "").size(), 256u);
    }
    EXPECT_EQ(count, 3000);
  }
  struct stat db {};
  ASSERT_EQ(::stat((dir_ + "/" + store::kDbFileName).c_str(), &db), 0);
  EXPECT_LT(db.st_size, 1 << 20);  // the whole file, schema included
  d_->Start();
}

}  // namespace
}  // namespace sbx::test
