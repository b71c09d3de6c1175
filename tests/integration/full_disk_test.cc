// Boost 1.74 headers use std::exchange without including <utility>.
// clang-format off
#include <utility>
// clang-format on

// sbx serve on a full disk: the daemon's data directory is a small ext4 filesystem on a loop
// device the test makes and fills to the last block. The daemon must say so (/healthz 503 with
// the reason), keep answering, refuse creates cleanly (507, nothing left behind), keep every
// audit event it could not write (counted in /metrics, written in order once space is back),
// and report healthy again when the space is freed.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "api/http/client.h"
#include "common/encoding.h"
#include "common/fd.h"
#include "common/fs.h"
#include "daemon_process.h"
#include "sbx_process.h"
#include "store/store.h"

extern char** environ;

namespace sbx::test {
namespace {

using nlohmann::json;

// Runs a program to completion; its exit status (-1 when it could not be started).
int Spawn(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid;
  if (::posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A small ext4 filesystem (no journal, no reserved blocks: every block is the daemon's to fill)
// in an image file, mounted on `dir` through a loop device that detaches itself when unmounted.
// The destructor unmounts (lazily if something still holds it) and removes the image, however
// the test ended.
class LoopFs {
 public:
  LoopFs(std::string image, std::string dir, int64_t bytes)
      : image_(std::move(image)), dir_(std::move(dir)) {
    UniqueFd fd(::open(image_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!fd || ::ftruncate(fd.get(), bytes) != 0) {
      ADD_FAILURE() << "image " << image_ << ": " << std::strerror(errno);
      return;
    }
    fd.reset();
    if (Spawn({"mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", image_}) != 0) {
      ADD_FAILURE() << "mkfs.ext4 " << image_;
      return;
    }
    ::mkdir(dir_.c_str(), 0711);
    mounted_ = Spawn({"mount", "-o", "loop,nosuid,nodev", image_, dir_}) == 0;
    EXPECT_TRUE(mounted_) << "mount -o loop " << image_ << " " << dir_;
    if (mounted_) ::chmod(dir_.c_str(), 0711);
  }
  ~LoopFs() {
    if (mounted_ && Spawn({"umount", dir_}) != 0) {
      ADD_FAILURE() << "umount " << dir_ << " failed (still in use?): detaching it lazily";
      Spawn({"umount", "-l", dir_});
    }
    ::unlink(image_.c_str());
  }
  LoopFs(const LoopFs&) = delete;
  LoopFs& operator=(const LoopFs&) = delete;

  bool mounted() const { return mounted_; }
  // Writes a file until not one byte is left.
  void Fill() {
    UniqueFd fd(::open(filler().c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    ASSERT_TRUE(fd) << std::strerror(errno);
    std::string chunk(1 << 16, 'x');
    while (::write(fd.get(), chunk.data(), chunk.size()) > 0) {
    }
    while (::write(fd.get(), chunk.data(), 1) > 0) {
    }
    ASSERT_EQ(errno, ENOSPC) << std::strerror(errno);
    ::fsync(fd.get());
    filled_ = true;
  }
  void Free() {
    if (!filled_) return;
    ASSERT_EQ(::unlink(filler().c_str()), 0) << std::strerror(errno);
    UniqueFd root(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ::syncfs(root.get());
    filled_ = false;
  }

 private:
  std::string filler() const { return dir_ + "/filler"; }
  std::string image_;
  std::string dir_;
  bool mounted_ = false;
  bool filled_ = false;
};

// Polls `done` until it holds or `limit` passes; whether it held.
bool Eventually(const std::function<bool()>& done,
                std::chrono::seconds limit = std::chrono::seconds(30)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

class FullDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-full-disk-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    ASSERT_EQ(::chmod(tmpl, 0711), 0);
    dir_ = tmpl;
    data_ = dir_ + "/data";
    fs_ = std::make_unique<LoopFs>(dir_ + "/disk.img", data_, int64_t{32} << 20);
    ASSERT_TRUE(fs_->mounted());
    parent_ = "sbx-full-disk-test-" + std::to_string(::getpid());
    ::setenv("SBX_CGROUP_PARENT", parent_.c_str(), 1);
    d_ = std::make_unique<DaemonProcess>(data_);
    d_->Start();
  }
  void TearDown() override {
    if (fs_) fs_->Free();
    if (d_) {
      EXPECT_TRUE(d_->Alive()) << "the daemon died during the test: " << d_->log();
      if (!d_->Alive()) d_->Start();
      if (d_->port()) {
        json list = Json("GET", "/v1/sandboxes?state=running&state=paused&state=creating");
        for (const auto& s : list["sandboxes"])
          Call("DELETE", "/v1/sandboxes/" + s["id"].get<std::string>());
      }
      d_.reset();
    }
    std::string mounts = *ReadFile("/proc/self/mountinfo");
    EXPECT_EQ(mounts.find(data_ + "/"), std::string::npos) << "mounts left in the data dir";
    EXPECT_EQ(::system(("test -z \"$(ls -A " + data_ + "/run/boxes 2>/dev/null)\"").c_str()), 0)
        << "box directories left";
    fs_.reset();  // unmounts
    ExpectNoCgroupsAndRemoveParent(parent_);
    (void)RemoveTree(dir_);
  }

  http::Response Call(const std::string& method, const std::string& target,
                      const std::string& body = "",
                      std::chrono::seconds timeout = std::chrono::seconds(60)) {
    http::ClientHeaders headers = {{"Authorization", "Bearer " + d_->key()},
                                   {"Content-Type", "application/json"}};
    auto r = http::Request(http::Endpoint{"127.0.0.1", d_->port(), ""}, method, target, headers,
                           body, timeout);
    return r.ok() ? *r : http::Response{};  // status 0: no answer in time
  }
  json Json(const std::string& method, const std::string& target, const json& body = nullptr,
            int want = 200) {
    auto r = Call(method, target, body.is_null() ? "" : body.dump());
    EXPECT_EQ(r.status, want) << method << " " << target << ": " << r.body;
    return json::parse(r.body.empty() ? "null" : r.body, nullptr, false);
  }
  std::string Create() {
    json s = Json("POST", "/v1/sandboxes", json::object(), 201);
    return s.is_object() ? s.value("id", "") : "";
  }
  // Runs `argv` in sandbox `id`: its stdout and exit code, or status 0 when there was no
  // answer within `timeout`.
  struct Run {
    int status = 0;
    std::string out;
    int64_t exit_code = -999;
  };
  Run Exec(const std::string& id, std::vector<std::string> argv,
           std::chrono::seconds timeout = std::chrono::seconds(60)) {
    Run run;
    auto r =
        Call("POST", "/v1/sandboxes/" + id + "/commands", json{{"argv", argv}}.dump(), timeout);
    run.status = r.status;
    std::istringstream lines(r.body);
    std::string line;
    while (std::getline(lines, line)) {
      json e = json::parse(line, nullptr, false);
      if (e.is_discarded()) continue;
      if (e.value("type", "") == "stdout")
        run.out += Base64Decode(e["data"].get<std::string>()).value();
      if (e.value("type", "") == "exit") run.exit_code = e["exit_code"];
    }
    return run;
  }
  std::pair<int, json> Health() {
    auto h = http::Request("127.0.0.1", d_->port(), "GET", "/healthz");
    if (!h.ok()) return {0, nullptr};
    return {h->status, json::parse(h->body, nullptr, false)};
  }
  // A sample of /metrics (-1 when it is missing).
  int64_t Metric(const std::string& name) {
    std::string text = Call("GET", "/metrics").body;
    std::istringstream lines(text);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind(name + " ", 0) == 0) return std::stoll(line.substr(name.size() + 1));
    }
    return -1;
  }
  size_t BoxDirs() {
    size_t n = 0;
    if (DIR* d = ::opendir((data_ + "/run/boxes").c_str())) {
      while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
      ::closedir(d);
    }
    return n;
  }

  std::string dir_, data_, parent_;
  std::unique_ptr<LoopFs> fs_;
  std::unique_ptr<DaemonProcess> d_;
};

TEST_F(FullDiskTest, AFullDiskIsReportedNothingIsHalfMadeAndNoAuditEventIsLost) {
  EXPECT_EQ(Health().first, 200);
  std::string id = Create();
  ASSERT_FALSE(id.empty());
  size_t boxes = BoxDirs();
  ASSERT_EQ(Json("GET", "/v1/sandboxes")["sandboxes"].size(), 1u);
  EXPECT_EQ(Metric("sbx_store_writable"), 1);
  EXPECT_EQ(Metric("sbx_audit_queued"), 0);

  fs_->Fill();
  int64_t filled_at = store::NowMs();

  // A create is refused with 507 and leaves no record, box directory or cgroup behind.
  auto refused = Call("POST", "/v1/sandboxes", "{}");
  EXPECT_EQ(refused.status, 507) << refused.body;
  EXPECT_EQ(Json("GET", "/v1/sandboxes")["sandboxes"].size(), 1u);
  EXPECT_EQ(BoxDirs(), boxes);

  // /healthz says what is wrong.
  auto [code, body] = Health();
  EXPECT_EQ(code, 503) << body;
  EXPECT_EQ(body.value("status", ""), "unhealthy") << body;
  EXPECT_NE(body.value("error", "").find("store cannot write: No space left on device"),
            std::string::npos)
      << body;

  // The daemon keeps answering: reads, and commands in a running sandbox, whose audit events
  // the store cannot take: they are queued and counted, not lost.
  EXPECT_EQ(Json("GET", "/v1/sandboxes/" + id).value("state", ""), "running");
  auto run = Exec(id, {"echo", "still here"});
  EXPECT_EQ(run.status, 200);
  EXPECT_EQ(run.out, "still here\n");
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_TRUE(Eventually([&] { return Metric("sbx_audit_queued") >= 2; }))
      << "command.start and command.exit were not queued: " << Call("GET", "/metrics").body;
  EXPECT_GE(Metric("sbx_audit_queued_total"), 2);
  EXPECT_EQ(Metric("sbx_audit_dropped_total"), 0);
  EXPECT_EQ(Metric("sbx_store_writable"), 0);
  EXPECT_EQ(Health().first, 503);
  EXPECT_TRUE(d_->Alive());

  // Space back: healthy again, and the queued events are in the log, in order, with the time
  // they happened.
  fs_->Free();
  int64_t freed_at = store::NowMs();
  EXPECT_TRUE(Eventually([&] { return Health().first == 200; })) << Health().second;
  EXPECT_TRUE(Eventually([&] { return Metric("sbx_audit_queued") == 0; }));
  EXPECT_EQ(Metric("sbx_store_writable"), 1);
  EXPECT_EQ(Metric("sbx_audit_dropped_total"), 0);
  json audit = Json("GET", "/v1/audit?sandbox=" + id);
  std::vector<std::string> types;
  int64_t last_seq = 0;
  for (const auto& e : audit["events"]) {
    types.push_back(e["type"]);
    EXPECT_GT(e["seq"].get<int64_t>(), last_seq);
    last_seq = e["seq"];
    if (e["type"] != "sandbox.create") {
      EXPECT_GE(e["time_ms"].get<int64_t>(), filled_at) << e;
      EXPECT_LE(e["time_ms"].get<int64_t>(), freed_at) << e;
    }
  }
  EXPECT_EQ(types, (std::vector<std::string>{"sandbox.create", "command.start", "command.exit"}))
      << audit;

  // And creates work again.
  EXPECT_FALSE(Create().empty());
}

// What kill and pause leave on a full disk: the record and the host must agree whatever the
// answer was. Before the manager ordered host actions and record writes (see manager.h), a kill
// destroyed the box and then failed to record it (a `running` record with no box), and a pause
// froze the box and then failed to record it (a `running` record whose commands hung).
TEST_F(FullDiskTest, KillAndPauseOnAFullDiskLeaveRecordsThatMatchTheHost) {
  std::string killed = Create();
  std::string paused = Create();
  ASSERT_FALSE(killed.empty());
  ASSERT_FALSE(paused.empty());
  fs_->Fill();

  // Kill: done and recorded as ended (never left `running`), or refused with the box intact.
  auto kill = Call("DELETE", "/v1/sandboxes/" + killed);
  std::string state = Json("GET", "/v1/sandboxes/" + killed).value("state", "");
  if (kill.status / 100 == 2) {
    EXPECT_NE(state, "running") << "killed, but its record says running";
  } else {
    EXPECT_EQ(state, "running") << kill.status << " " << kill.body;
    auto run = Exec(killed, {"true"}, std::chrono::seconds(10));
    EXPECT_EQ(run.exit_code, 0) << "the kill was refused (" << kill.status << " " << kill.body
                                << ") but the box does not answer";
  }

  // Pause: done and recorded as paused, or refused with the box still running.
  auto pause = Call("POST", "/v1/sandboxes/" + paused + "/pause");
  state = Json("GET", "/v1/sandboxes/" + paused).value("state", "");
  if (pause.status / 100 == 2) {
    EXPECT_EQ(state, "paused");
  } else {
    EXPECT_EQ(state, "running") << pause.status << " " << pause.body;
    auto run = Exec(paused, {"true"}, std::chrono::seconds(10));
    EXPECT_EQ(run.exit_code, 0) << "the pause was refused (" << pause.status << " " << pause.body
                                << ") but the box does not answer (frozen?)";
  }

  // Space back: a kill that was done is recorded as killed.
  fs_->Free();
  if (kill.status / 100 == 2) {
    EXPECT_TRUE(Eventually(
        [&] { return Json("GET", "/v1/sandboxes/" + killed).value("state", "") == "killed"; }));
  }
}

}  // namespace
}  // namespace sbx::test
