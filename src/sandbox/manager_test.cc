// Manager against an in-memory Runtime (FakeRuntime below) and a FakeClock, with a real SQLite
// store. Every interleaving is forced with gates (a runtime call that blocks until the test lets
// it go) and the manager's on_transition_wait hook (a call that found the sandbox busy), so the
// tests never sleep and never depend on the machine's speed. Issue 10, finding 2 and deliver 6.
#include "sandbox/manager.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <thread>

#include "common/fs.h"
#include "protocol/wire.h"

namespace sbx::sandbox {
namespace {

using namespace std::chrono_literals;
namespace asio = boost::asio;

// A one-shot rendezvous: the runtime call that reaches it reports it was entered and waits until
// the test opens it.
class Gate {
 public:
  void Pass(const std::string& id) {
    std::unique_lock<std::mutex> l(mu_);
    id_ = id;
    entered_ = true;
    cv_.notify_all();
    cv_.wait(l, [&] { return open_; });
  }
  // The id of the box whose call entered (bounded wait: a broken manager fails, not hangs).
  std::string AwaitEntered() {
    std::unique_lock<std::mutex> l(mu_);
    EXPECT_TRUE(cv_.wait_for(l, 30s, [&] { return entered_; })) << "gate never reached";
    return id_;
  }
  void Open() {
    std::lock_guard<std::mutex> g(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool entered_ = false, open_ = false;
  std::string id_;
};

// A latch for the manager's on_transition_wait hook: who waited, for which sandbox.
class Waited {
 public:
  void Note(const std::string& id, const char* op) {
    std::lock_guard<std::mutex> g(mu_);
    seen_.push_back(id + " " + op);
    cv_.notify_all();
  }
  void Await(const std::string& what) {
    std::unique_lock<std::mutex> l(mu_);
    EXPECT_TRUE(cv_.wait_for(
        l, 30s, [&] { return std::find(seen_.begin(), seen_.end(), what) != seen_.end(); }))
        << "nobody waited: " << what;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> seen_;
};

// In-memory boxes. Gates, when set, stop the next call of their kind; fail_* make calls fail.
class FakeRuntime : public runtime::Runtime {
 public:
  struct FakeBox {
    bool frozen = false;
    bool stopped = false;  // its processes killed, its files not yet removed (split_stop)
    std::optional<std::string> exited;
  };

  std::string agent_socket = "/nonexistent";
  std::shared_ptr<Gate> create_gate, freeze_gate, destroy_gate;
  // Called on every Create before the box exists (after create_gate).
  std::function<void(const std::string&)> on_create;
  Status fail_thaw, fail_destroy;
  Status fail_create;      // what Create fails with, when set
  bool adoptable = false;  // Adopt finds the boxes this fake made (a daemon restart)
  // Stop kills without removing, as the native runtime's does (otherwise Stop is Destroy).
  bool split_stop = false;
  std::set<std::string> runtimes = {"native"};  // what CanCreate accepts
  runtime::BoxSpec last_spec;
  size_t max_layers = SIZE_MAX;  // MaxLayers

  size_t MaxLayers(const runtime::Box&) override { return max_layers; }

  Result<runtime::Box> Create(const runtime::BoxSpec& spec) override {
    if (auto g = Take(create_gate)) g->Pass(spec.id);
    if (on_create) on_create(spec.id);
    if (!fail_create.ok()) return fail_create;
    // As the real runtime: the hook runs with the box's pid, and its failure fails the create.
    if (spec.at_sync_point) SBX_RETURN_IF_ERROR(spec.at_sync_point(4242));
    std::lock_guard<std::mutex> l(mu_);
    last_spec = spec;
    boxes_[spec.id] = FakeBox{};
    runtime::Box b;
    b.id = spec.id;
    b.init_pid = 4242;
    b.agent_socket = agent_socket;
    b.dir = "/fake/" + spec.id;
    return b;
  }
  Status Freeze(const runtime::Box& box) override {
    if (auto g = Take(freeze_gate)) g->Pass(box.id);
    std::lock_guard<std::mutex> l(mu_);
    auto it = boxes_.find(box.id);
    if (it == boxes_.end()) return Status::Error("freeze " + box.id + ": no box", ESRCH);
    it->second.frozen = true;
    return {};
  }
  Status Thaw(const runtime::Box& box) override {
    std::lock_guard<std::mutex> l(mu_);
    if (!fail_thaw.ok()) return fail_thaw;
    auto it = boxes_.find(box.id);
    if (it == boxes_.end()) return Status::Error("thaw " + box.id + ": no box", ESRCH);
    it->second.frozen = false;
    return {};
  }
  Result<runtime::BoxStats> Stats(const runtime::Box&) override {
    std::lock_guard<std::mutex> l(mu_);
    return stats_;
  }
  void SetStats(const runtime::BoxStats& s) {
    std::lock_guard<std::mutex> l(mu_);
    stats_ = s;
  }
  Result<UniqueFd> OpenSocket(const runtime::Box& box, int, int) override {
    return Status::Error("socket " + box.id + ": not in the fake", ENOTSUP);
  }
  std::optional<std::string> AgentExit(const runtime::Box& box) override {
    std::lock_guard<std::mutex> l(mu_);
    auto it = boxes_.find(box.id);
    return it == boxes_.end() ? std::nullopt : it->second.exited;
  }
  Status Destroy(const runtime::Box& box) override {
    if (auto g = Take(destroy_gate)) g->Pass(box.id);
    std::lock_guard<std::mutex> l(mu_);
    boxes_.erase(box.id);
    return fail_destroy;
  }
  Status CanCreate(const std::string& name) const override {
    if (runtimes.count(name.empty() ? "native" : name)) return {};
    return runtime::Runtime::CanCreate(name);
  }
  Status Stop(const runtime::Box& box) override {
    if (!split_stop) return Destroy(box);
    std::lock_guard<std::mutex> l(mu_);
    if (auto it = boxes_.find(box.id); it != boxes_.end()) it->second.stopped = true;
    return {};
  }
  Status SetLimits(const runtime::Box& box, const runtime::Limits& l) override {
    std::lock_guard<std::mutex> lk(mu_);
    if (!boxes_.count(box.id)) return Status::Error("set limits " + box.id + ": no box", ESRCH);
    limits_[box.id] = l;
    return {};
  }
  // The limits SetLimits last wrote to box `id` (nullopt: never).
  std::optional<runtime::Limits> LimitsSet(const std::string& id) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = limits_.find(id);
    if (it == limits_.end()) return std::nullopt;
    return it->second;
  }
  Result<int> ReapOrphans(const std::string&) override { return 0; }
  Result<runtime::Box> Adopt(const std::string& id) override {
    if (adoptable) {
      std::lock_guard<std::mutex> l(mu_);
      if (boxes_.count(id)) return runtime::Box{id, 4242, agent_socket, "/fake/" + id};
    }
    return Status::Error("adopt " + id + ": not in the fake", ESRCH);
  }
  Result<std::vector<std::string>> ListBoxes() override {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<std::string> ids;
    for (const auto& [id, b] : boxes_) ids.push_back(id);
    return ids;
  }

  std::optional<FakeBox> Box(const std::string& id) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = boxes_.find(id);
    if (it == boxes_.end()) return std::nullopt;
    return it->second;
  }
  size_t size() {
    std::lock_guard<std::mutex> l(mu_);
    return boxes_.size();
  }
  void SetExited(const std::string& id, std::string how) {
    std::lock_guard<std::mutex> l(mu_);
    boxes_[id].exited = std::move(how);
  }

 private:
  std::shared_ptr<Gate> Take(std::shared_ptr<Gate>& g) {
    std::lock_guard<std::mutex> l(mu_);
    return std::exchange(g, nullptr);
  }
  runtime::BoxStats stats_;
  std::mutex mu_;
  std::map<std::string, FakeBox> boxes_;
  std::map<std::string, runtime::Limits> limits_;
};

class ManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-manager-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    OpenStore(dir_ + "/sbx.db");
  }
  void TearDown() override {
    manager_.reset();
    store_.reset();
    if (!mount_.empty()) ::umount2(mount_.c_str(), MNT_DETACH);
    (void)RemoveTree(dir_);  // a leftover test directory fails nothing
  }

  void OpenStore(const std::string& path) {
    manager_.reset();
    store_.reset();
    auto st = store::Store::Open(path, clock_);
    ASSERT_TRUE(st.ok()) << st.status().message();
    store_ = std::move(*st);
    auto k = store_->CreateApiKey("tenant", 0, 0);
    ASSERT_TRUE(k.ok()) << k.status().message();
    key_ = k->record;
  }

  Manager& M() {
    if (!manager_) {
      ManagerConfig c;
      c.clock = &clock_;
      c.pools = pools_;
      c.on_transition_wait = [this](const std::string& id, const char* op) {
        waited_.Note(id, op);
      };
      storage::TemplateStore ts;
      ts.dir = dir_ + "/templates";
      manager_ = std::make_unique<Manager>(c, rt_, ts, *store_);
    }
    return *manager_;
  }

  std::string Create(int64_t timeout_ms = 60000, const std::string& on_timeout = "kill") {
    CreateRequest r;
    r.timeout_ms = timeout_ms;
    r.on_timeout = on_timeout;
    auto rec = M().Create(key_, r);
    EXPECT_TRUE(rec.ok()) << rec.status().message();
    return rec.ok() ? rec->id : "";
  }
  // The record as the store has it (not the manager's view).
  store::SandboxRecord Stored(const std::string& id) {
    auto r = store_->GetSandbox(id);
    EXPECT_TRUE(r.ok() && *r);
    return r.ok() && *r ? **r : store::SandboxRecord{};
  }
  std::string State(const std::string& id) {
    auto r = M().Get(key_, id);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? r->state : "";
  }

  std::string dir_, mount_;
  FakeClock clock_;
  FakeRuntime rt_;
  Waited waited_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<Manager> manager_;
  store::ApiKeyRecord key_;
  std::vector<PoolSpec> pools_;  // the config's pools
};

// ---- What reaches clients (issue 11: no error message anywhere contains a host path) ----

TEST_F(ManagerTest, RuntimeFailuresReachClientsWithoutHostPaths) {
  const std::string host = "/var/lib/sbx/run/";
  rt_.fail_create = Status::Error("box setup: mount overlay on " + host + "x/fs/rootfs", EINVAL);
  CreateRequest r;
  auto failed = M().Create(key_, r);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().err(), EINVAL);
  EXPECT_EQ(failed.status().message(), "box setup: mount overlay on [host path]: Invalid argument");
  auto page = M().List(key_, {});
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->items.size(), 1u);
  EXPECT_EQ(page->items[0].error.find(host), std::string::npos) << page->items[0].error;
  rt_.fail_create = {};

  std::string id = Create();
  rt_.fail_thaw = Status::Error("write /sys/fs/cgroup/sbx/" + id + "/cgroup.freeze", EBUSY);
  ASSERT_TRUE(M().Pause(key_, id).ok());
  Status resumed = M().Resume(key_, id);
  EXPECT_EQ(resumed.err(), EBUSY);
  EXPECT_EQ(resumed.message().find("/sys/fs"), std::string::npos) << resumed.message();
  rt_.fail_thaw = {};

  rt_.fail_destroy = Status::Error("remove " + host + id + ": Directory not empty", ENOTEMPTY);
  Status killed = M().Kill(key_, id);
  EXPECT_EQ(killed.err(), ENOTEMPTY);
  EXPECT_EQ(killed.message().find(host), std::string::npos) << killed.message();
  EXPECT_EQ(Stored(id).error.find(host), std::string::npos) << Stored(id).error;
}

// ---- TTL on the fake clock (was ServeTest.TimeoutKillsAndSettingItResets, 2 x 2.5 s asleep) ----

// A box whose agent died with the cgroup's OOM killer at work (gVisor: the Sentry goes with the
// process over the limit) is failed saying so, not only how the agent ended.
TEST_F(ManagerTest, AnAgentKilledWithTheMemoryLimitFailsItsSandboxSayingSo) {
  CreateRequest r;
  r.limits.memory_bytes = 64 << 20;
  auto made = M().Create(key_, r);
  ASSERT_TRUE(made.ok()) << made.status().message();
  runtime::BoxStats st;
  st.oom_kills = 2;
  rt_.SetStats(st);
  rt_.SetExited(made->id, "the agent exited: killed by signal 9");
  M().ExpireDue();
  auto rec = store_->GetSandbox(made->id);
  ASSERT_TRUE(rec.ok() && rec->has_value());
  EXPECT_EQ((*rec)->state, store::kStateFailed);
  EXPECT_EQ((*rec)->error,
            "out of memory: the box hit its memory limit of 64 MiB; the agent exited: killed by "
            "signal 9");
}

TEST_F(ManagerTest, TimeoutKillsOrPausesAndSettingItResets) {
  std::string killed = Create(1000);
  std::string paused = Create(1000, "pause");
  std::string kept = Create(1000);
  ASSERT_TRUE(M().SetTimeout(key_, kept, 60000).ok());
  clock_.Advance(999ms);
  M().ExpireDue();
  EXPECT_EQ(State(killed), "running");
  clock_.Advance(1ms);  // the deadline itself
  M().ExpireDue();
  EXPECT_EQ(State(killed), "killed");
  EXPECT_FALSE(rt_.Box(killed));
  EXPECT_EQ(State(paused), "paused");
  EXPECT_TRUE(rt_.Box(paused)->frozen);
  EXPECT_EQ(Stored(paused).expires_at, 0);  // a paused sandbox has no deadline
  EXPECT_EQ(State(kept), "running");
  EXPECT_EQ(Stored(kept).expires_at, clock_.NowMs() - 1000 + 60000);
  // Resuming restarts the full timeout from now.
  ASSERT_TRUE(M().Resume(key_, paused).ok());
  EXPECT_EQ(Stored(paused).expires_at, clock_.NowMs() + 1000);
  EXPECT_FALSE(rt_.Box(paused)->frozen);
  // The store stamps times from the same clock.
  EXPECT_EQ(Stored(killed).ended_at, clock_.NowMs());
  EXPECT_EQ(Stored(killed).updated_at, clock_.NowMs());
}

// A timeout's pause without memory that fails (here the fake runtime cannot copy a writable
// layer; for real, a box whose files do not fit in the template cache) pauses the sandbox with
// its memory: it neither runs on past its timeout nor is frozen and copied again on every scan.
TEST_F(ManagerTest, ATimeoutPauseToDiskThatFailsPausesWithMemory) {
  CreateRequest r;
  r.timeout_ms = 1000;
  r.on_timeout = "pause";
  r.pause_memory = false;
  auto rec = M().Create(key_, r);
  ASSERT_TRUE(rec.ok()) << rec.status().message();
  clock_.Advance(1000ms);
  M().ExpireDue();
  EXPECT_EQ(State(rec->id), "paused");
  ASSERT_TRUE(rt_.Box(rec->id));
  EXPECT_TRUE(rt_.Box(rec->id)->frozen);
  EXPECT_FALSE(Stored(rec->id).on_disk);
  EXPECT_EQ(Stored(rec->id).expires_at, 0);
}

// A timeout's pause without memory is made off the TTL thread: while its copy runs (here held at
// the freeze), the loop's scans go on, another sandbox's timeout kills it on time, and the
// pausing one is passed by rather than waited for; Stop lets the pause finish.
TEST_F(ManagerTest, ATimeoutsPauseToDiskDoesNotHoldUpTheTtlLoop) {
  CreateRequest r;
  r.timeout_ms = 1000;
  r.on_timeout = "pause";
  r.pause_memory = false;
  auto slow = M().Create(key_, r);
  ASSERT_TRUE(slow.ok()) << slow.status().message();
  std::string quick = Create(1000);
  auto gate = rt_.freeze_gate = std::make_shared<Gate>();
  uint64_t waits = clock_.waits();
  M().StartTtlLoop(500ms);
  ASSERT_TRUE(clock_.AwaitWaits(waits + 1));
  clock_.Advance(1000ms);
  EXPECT_EQ(gate->AwaitEntered(), slow->id);  // the worker is freezing it for the copy
  ASSERT_TRUE(clock_.AwaitWaits(waits + 2));  // and the scan that queued it is over
  EXPECT_EQ(State(quick), "killed");
  clock_.Advance(500ms);
  ASSERT_TRUE(clock_.AwaitWaits(waits + 3));  // another scan, past the busy sandbox
  EXPECT_EQ(State(slow->id), "running");
  gate->Open();
  M().Stop();
  // The fake runtime copies no layer: the pause fell back to one with memory.
  EXPECT_EQ(State(slow->id), "paused");
}

// A sandbox whose layers are as many as its runtime stacks takes no other (a pause without memory
// or a snapshot would add one): refused before anything is frozen or copied, so that what it
// holds can always be started again.
TEST_F(ManagerTest, ASandboxAtItsRuntimesMostLayersIsNeitherSnapshottedNorPausedToDisk) {
  std::string id = Create();
  rt_.max_layers = Stored(id).layers.size();
  ASSERT_GT(rt_.max_layers, 0u);
  Status paused = M().Pause(key_, id, /*keep_memory=*/false);
  EXPECT_EQ(paused.err(), E2BIG) << paused.message();
  EXPECT_NE(paused.message().find("stacks at most"), std::string::npos) << paused.message();
  EXPECT_EQ(M().Snapshot(key_, id, "").status().err(), E2BIG);
  EXPECT_EQ(State(id), "running");
  EXPECT_FALSE(rt_.Box(id)->frozen);
  // With its memory it pauses.
  EXPECT_TRUE(M().Pause(key_, id).ok());
}

TEST_F(ManagerTest, TheTtlLoopRunsOnTheClock) {
  std::string id = Create(1000);
  uint64_t waits = clock_.waits();
  M().StartTtlLoop(500ms);
  ASSERT_TRUE(clock_.AwaitWaits(waits + 1));  // the loop waits for its first period
  clock_.Advance(500ms);
  ASSERT_TRUE(clock_.AwaitWaits(waits + 2));  // a scan ran, the loop waits again
  EXPECT_EQ(State(id), "running");
  clock_.Advance(500ms);
  ASSERT_TRUE(clock_.AwaitWaits(waits + 3));
  EXPECT_EQ(State(id), "killed");
  M().Stop();  // wakes the waiting loop at once, with no time passing
}

// E2B's getMetrics window: the TTL loop samples every 5 s of the clock; the history of a sandbox
// goes when it ends.
TEST_F(ManagerTest, TheTtlLoopSamplesMetricsEveryFiveSeconds) {
  std::string id = Create(600000);
  runtime::BoxStats st;
  st.memory_current = 1 << 20;
  st.disk_used = 4096;
  st.disk_total = 1 << 30;
  rt_.SetStats(st);
  const int64_t t0 = clock_.NowMs();
  uint64_t waits = clock_.waits();
  M().StartTtlLoop(500ms);
  ASSERT_TRUE(clock_.AwaitWaits(waits + 1));  // sampled at once, then waits
  auto all = M().Metrics(key_, id, 0, INT64_MAX);
  ASSERT_TRUE(all.ok()) << all.status().message();
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].time_ms, t0);
  EXPECT_EQ((*all)[0].stats.disk_used, 4096u);
  st.cpu_usage_ns = 2'500'000'000;  // half of one CPU over the next 5 s
  rt_.SetStats(st);
  for (int i = 1; i <= 9; ++i) {
    clock_.Advance(500ms);
    ASSERT_TRUE(clock_.AwaitWaits(waits + 1 + i));
  }
  EXPECT_EQ(M().Metrics(key_, id, 0, INT64_MAX)->size(), 1u);  // 4.5 s: no new sample yet
  clock_.Advance(500ms);
  ASSERT_TRUE(clock_.AwaitWaits(waits + 11));
  all = M().Metrics(key_, id, 0, INT64_MAX);
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[1].time_ms, t0 + 5000);
  EXPECT_DOUBLE_EQ((*all)[1].cpu_used_pct, 50.0);
  // The window is inclusive at both ends.
  auto later = M().Metrics(key_, id, t0 + 1, t0 + 5000);
  ASSERT_EQ(later->size(), 1u);
  EXPECT_EQ((*later)[0].time_ms, t0 + 5000);
  EXPECT_TRUE(M().Metrics(key_, id, t0 + 5001, INT64_MAX)->empty());
  M().Stop();
  ASSERT_TRUE(M().Kill(key_, id).ok());
  auto ended = M().Metrics(key_, id, 0, INT64_MAX);
  ASSERT_TRUE(ended.ok());
  EXPECT_TRUE(ended->empty());
}

TEST_F(ManagerTest, ConnectResumesOrExtendsButNeverShortens) {
  std::string id = Create(10000);
  // Running: a shorter timeout leaves the expiry alone, a longer one extends it.
  auto c = M().Connect(key_, id, 5000);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_FALSE(c->resumed);
  EXPECT_EQ(c->record.expires_at, clock_.NowMs() + 10000);
  EXPECT_EQ(Stored(id).expires_at, clock_.NowMs() + 10000);
  clock_.Advance(8000ms);
  c = M().Connect(key_, id, 5000);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(Stored(id).expires_at, clock_.NowMs() + 5000);
  // Paused: resumed, with the connect's timeout from now.
  ASSERT_TRUE(M().Pause(key_, id).ok());
  clock_.Advance(60000ms);
  c = M().Connect(key_, id, 3000);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->resumed);
  EXPECT_EQ(c->record.state, "running");
  EXPECT_EQ(Stored(id).state, "running");
  EXPECT_EQ(Stored(id).expires_at, clock_.NowMs() + 3000);
  EXPECT_FALSE(rt_.Box(id)->frozen);
  EXPECT_EQ(M().Connect(key_, id, 0).status().err(), EINVAL);
  ASSERT_TRUE(M().Kill(key_, id).ok());
  EXPECT_EQ(M().Connect(key_, id, 3000).status().err(), ENOENT);
}

// E2B's refresh: the expiry moves later or not at all, and a plain SetTimeout still shortens.
TEST_F(ManagerTest, AnExtendOnlyTimeoutNeverShortens) {
  std::string id = Create(10000);
  auto r = M().SetTimeout(key_, id, 5000, /*extend_only=*/true);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(Stored(id).expires_at, clock_.NowMs() + 10000);
  EXPECT_EQ(Stored(id).timeout_ms, 10000);
  clock_.Advance(8000ms);
  ASSERT_TRUE(M().SetTimeout(key_, id, 5000, /*extend_only=*/true).ok());
  EXPECT_EQ(Stored(id).expires_at, clock_.NowMs() + 5000);
  ASSERT_TRUE(M().SetTimeout(key_, id, 2000).ok());
  EXPECT_EQ(Stored(id).expires_at, clock_.NowMs() + 2000);
  EXPECT_EQ(M().SetTimeout(key_, id, 0, /*extend_only=*/true).status().err(), EINVAL);
}

// ---- interleavings (finding 2) ----

// A pause whose freeze is in progress when the TTL fires: the scan passes the busy sandbox by,
// and the pause ends it paused with its box.
TEST_F(ManagerTest, PauseRacingTheTtlKillEndsPausedWithItsBox) {
  std::string id = Create(1000);
  auto gate = rt_.freeze_gate = std::make_shared<Gate>();
  auto pause = std::async(std::launch::async, [&] { return M().Pause(key_, id); });
  gate->AwaitEntered();
  clock_.Advance(5000ms);
  auto scan = std::async(std::launch::async, [&] { M().ExpireDue(); });
  waited_.Await(id + " ttl");
  gate->Open();
  EXPECT_TRUE(pause.get().ok());
  scan.get();
  EXPECT_EQ(Stored(id).state, "paused");
  ASSERT_TRUE(rt_.Box(id));  // a paused record always has its box
  EXPECT_TRUE(rt_.Box(id)->frozen);
}

// The TTL kill destroying the box when a pause comes: the pause waits, then finds it killed.
TEST_F(ManagerTest, TtlKillRacingAPauseEndsKilledWithNoBox) {
  std::string id = Create(1000);
  clock_.Advance(5000ms);
  auto gate = rt_.destroy_gate = std::make_shared<Gate>();
  auto scan = std::async(std::launch::async, [&] { M().ExpireDue(); });
  gate->AwaitEntered();
  auto pause = std::async(std::launch::async, [&] { return M().Pause(key_, id); });
  waited_.Await(id + " pause");
  gate->Open();
  scan.get();
  Status s = pause.get();
  EXPECT_EQ(s.err(), EBUSY) << s.message();
  EXPECT_EQ(Stored(id).state, "killed");
  EXPECT_FALSE(rt_.Box(id));
}

// A kill arriving while the box is being made waits for it, then kills what creation made: the
// record never says running over a destroyed box.
TEST_F(ManagerTest, KillDuringCreateKillsTheMadeBox) {
  auto gate = rt_.create_gate = std::make_shared<Gate>();
  auto create = std::async(std::launch::async, [&] { return M().Create(key_, CreateRequest{}); });
  std::string id = gate->AwaitEntered();
  EXPECT_EQ(Stored(id).state, "creating");
  auto kill = std::async(std::launch::async, [&] { return M().Kill(key_, id); });
  waited_.Await(id + " kill");
  gate->Open();
  auto made = create.get();
  ASSERT_TRUE(made.ok()) << made.status().message();
  Status killed = kill.get();
  EXPECT_TRUE(killed.ok()) << killed.message();
  EXPECT_EQ(Stored(id).state, "killed");
  EXPECT_FALSE(rt_.Box(id));
}

// A resume thawing when a kill comes: the kill waits, then destroys the running box.
TEST_F(ManagerTest, KillRacingAResumeEndsKilled) {
  std::string id = Create();
  ASSERT_TRUE(M().Pause(key_, id).ok());
  auto gate = rt_.destroy_gate = std::make_shared<Gate>();
  auto kill = std::async(std::launch::async, [&] { return M().Kill(key_, id); });
  gate->AwaitEntered();
  auto resume = std::async(std::launch::async, [&] { return M().Resume(key_, id); });
  waited_.Await(id + " resume");
  gate->Open();
  EXPECT_TRUE(kill.get().ok());
  EXPECT_EQ(resume.get().err(), EBUSY);
  EXPECT_EQ(Stored(id).state, "killed");
  EXPECT_FALSE(rt_.Box(id));
}

// A kill answers once the box's processes are dead; its removal follows on the cleanup worker,
// and AwaitCleanup is the event a caller that needs it gone waits for. Stop finishes it.
TEST_F(ManagerTest, KillAnswersBeforeTheBoxIsRemoved) {
  rt_.split_stop = true;
  std::string id = Create();
  auto gate = rt_.destroy_gate = std::make_shared<Gate>();
  ASSERT_TRUE(M().Kill(key_, id).ok());
  EXPECT_EQ(Stored(id).state, "killed");
  EXPECT_EQ(gate->AwaitEntered(), id);
  ASSERT_TRUE(rt_.Box(id));
  EXPECT_TRUE(rt_.Box(id)->stopped);
  EXPECT_EQ(M().PendingCleanups(), std::vector<std::string>{id});
  EXPECT_FALSE(M().AwaitCleanup(id, 0ms));
  EXPECT_FALSE(M().AwaitCleanups(0ms));
  EXPECT_TRUE(M().AwaitCleanup("another", 0ms));
  gate->Open();
  EXPECT_TRUE(M().AwaitCleanup(id, 30s));
  EXPECT_FALSE(rt_.Box(id));
  EXPECT_TRUE(M().PendingCleanups().empty());

  // Stop runs what is still queued before it returns.
  std::string next = Create();
  gate = rt_.destroy_gate = std::make_shared<Gate>();
  ASSERT_TRUE(M().Kill(key_, next).ok());
  gate->AwaitEntered();
  auto stopped = std::async(std::launch::async, [&] { M().Stop(); });
  gate->Open();
  stopped.get();
  EXPECT_FALSE(rt_.Box(next));
}

// The runtime is the template's unless the key may choose another (operator keys, or keys whose
// record names it), and only one this host has: never another in its place.
TEST_F(ManagerTest, ARuntimeIsTheTemplatesUnlessTheKeyMayChooseAndTheHostHasIt) {
  rt_.runtimes = {"native", "gvisor"};
  CreateRequest r;
  r.runtime = "gvisor";
  auto denied = M().Create(key_, r);
  EXPECT_EQ(denied.status().err(), EPERM) << denied.status().message();
  EXPECT_NE(denied.status().message().find("--runtime"), std::string::npos);
  EXPECT_EQ(rt_.size(), 0u);
  ASSERT_TRUE(store_->SetApiKeyRuntimes(key_.id, {"gvisor", "vm"}).ok());
  key_ = **store_->GetApiKey(key_.id);
  auto made = M().Create(key_, r);
  ASSERT_TRUE(made.ok()) << made.status().message();
  EXPECT_EQ(made->runtime, "gvisor");
  EXPECT_EQ(rt_.last_spec.runtime, "gvisor");
  EXPECT_EQ(Stored(made->id).runtime, "gvisor");
  r.runtime = "vm";  // allowed to the key, known to sbx, missing here
  auto vm = M().Create(key_, r);
  EXPECT_EQ(vm.status().err(), EINVAL);
  EXPECT_NE(vm.status().message().find("runtime vm is not available here"), std::string::npos)
      << vm.status().message();
  r.runtime = "docker";
  EXPECT_EQ(M().Create(key_, r).status().err(), EINVAL);
  r.runtime = "";
  auto plain = M().Create(key_, r);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->runtime, "native");
  EXPECT_EQ(rt_.size(), 2u);
}

// Creates that all passed the early quota count (none of them was inserted yet) are decided by
// the insert, which counts and inserts in one transaction: at most the quota get through.
TEST_F(ManagerTest, ConcurrentCreatesAtTheQuotaNeverExceedIt) {
  constexpr int kQuota = 2, kCreates = 6;
  auto k = store_->CreateApiKey("quota", kQuota, 0);
  ASSERT_TRUE(k.ok());
  store::ApiKeyRecord key = k->record;
  Create();  // builds the host template once, before the race
  std::mutex mu;
  std::condition_variable cv;
  int counted = 0;  // creates past the early count, waiting to insert
  manager_.reset();
  ManagerConfig c;
  c.clock = &clock_;
  c.on_create_insert = [&](const std::string&) {
    std::unique_lock<std::mutex> l(mu);
    ++counted;
    cv.notify_all();
    EXPECT_TRUE(cv.wait_for(l, 30s, [&] { return counted == kCreates; }));
  };
  storage::TemplateStore ts;
  ts.dir = dir_ + "/templates";
  manager_ = std::make_unique<Manager>(c, rt_, ts, *store_);
  std::vector<std::future<Result<store::SandboxRecord>>> creates;
  for (int i = 0; i < kCreates; ++i)
    creates.push_back(std::async(std::launch::async, [&] { return M().Create(key, {}); }));
  int ok = 0;
  for (auto& f : creates) {
    auto r = f.get();
    if (r.ok()) {
      ++ok;
    } else {
      EXPECT_EQ(r.status().err(), EAGAIN) << r.status().message();
    }
  }
  EXPECT_EQ(ok, kQuota);
  EXPECT_EQ(rt_.size(), static_cast<size_t>(kQuota) + 1);
  auto live = store_->CountSandboxes(key.id, {"creating", "running", "paused"});
  ASSERT_TRUE(live.ok());
  EXPECT_EQ(*live, kQuota);
  // The refused ones left no pin of a template layer behind.
  auto orphans = store_->DropOrphanPins();
  ASSERT_TRUE(orphans.ok());
  EXPECT_EQ(*orphans, 0);
}

// A retried create is answered from its idempotency record before any check of the host, which
// the first create may itself have filled.
TEST_F(ManagerTest, ARetriedCreateGetsItsSandboxEvenWhenTheHostIsFull) {
  CreateRequest r;
  r.idempotency_key = "once";
  r.request_hash = "h";
  auto first = M().Create(key_, r);
  ASSERT_TRUE(first.ok()) << first.status().message();
  ManagerConfig full;
  full.clock = &clock_;
  full.data_dir = dir_;
  full.default_limits.disk_bytes = int64_t{1} << 30;
  full.disk_reserve_bytes = int64_t{1} << 62;  // nothing fits
  storage::TemplateStore ts;
  ts.dir = dir_ + "/templates";
  Manager other(full, rt_, ts, *store_);
  auto again = other.Create(key_, r);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->id, first->id);
  r.idempotency_key = "new";
  Status full_disk = other.Create(key_, r).status();
  EXPECT_EQ(full_disk.err(), ENOSPC);
  EXPECT_EQ(full_disk.message().find(dir_), std::string::npos) << full_disk.message();
}

// ---- single-flight Channel ----

// A fake agent: counts the connections it accepts and answers each HELLO.
class FakeAgent {
 public:
  explicit FakeAgent(std::string path) : path_(std::move(path)) {
    lfd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path_.c_str(), sizeof a.sun_path - 1);
    EXPECT_EQ(::bind(lfd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(lfd_, 64), 0);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeAgent() {
    ::shutdown(lfd_, SHUT_RDWR);
    thread_.join();
    ::close(lfd_);
    for (int fd : fds_) ::close(fd);
  }
  int accepted() const { return accepted_.load(); }

 private:
  void Serve() {
    for (;;) {
      int fd = ::accept4(lfd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      ++accepted_;
      fds_.push_back(fd);
      char head[protocol::kHeaderSize];
      protocol::Header h;
      if (::recv(fd, head, sizeof head, MSG_WAITALL) != static_cast<ssize_t>(sizeof head) ||
          !protocol::DecodeHeader(head, &h))
        continue;
      std::string payload(h.len, '\0');
      if (h.len > 0) (void)::recv(fd, payload.data(), h.len, MSG_WAITALL);
      std::string hello =
          protocol::EncodeFrame(protocol::Type::kHello, h.id,
                                protocol::Writer()
                                    .Int(protocol::Tag::kVersion, protocol::kProtocolVersion)
                                    .Str(protocol::Tag::kAgentVersion, "fake"));
      (void)!::write(fd, hello.data(), hello.size());
    }
  }
  std::string path_;
  int lfd_ = -1;
  std::atomic<int> accepted_{0};
  std::vector<int> fds_;  // only touched by the serving thread until it is joined
  std::thread thread_;
};

// Runs `io` until `done()` (bounded: a broken manager fails the test, not hangs it).
template <typename Pred>
void RunUntil(asio::io_context& io, Pred done) {
  auto deadline = std::chrono::steady_clock::now() + 30s;
  io.restart();
  while (!done() && std::chrono::steady_clock::now() < deadline) io.run_one_until(deadline);
}

TEST_F(ManagerTest, ConcurrentChannelCallsMakeOneConnection) {
  FakeAgent agent(dir_ + "/agent.sock");
  rt_.agent_socket = dir_ + "/agent.sock";
  std::string id = Create();
  // One thread: every caller runs until it waits, before any connect can finish.
  asio::io_context io;
  constexpr int kCallers = 16;
  std::vector<std::shared_ptr<AgentChannel>> got(kCallers);
  int done = 0;
  for (int i = 0; i < kCallers; ++i) {
    asio::co_spawn(
        io,
        [&, i]() -> asio::awaitable<void> {
          auto ch = co_await M().Channel(key_, id);
          EXPECT_TRUE(ch.ok()) << ch.status().message();
          if (ch.ok()) got[i] = *ch;
          ++done;
        },
        asio::detached);
  }
  RunUntil(io, [&] { return done == kCallers; });
  ASSERT_EQ(done, kCallers);
  for (const auto& ch : got) EXPECT_EQ(ch, got[0]);
  EXPECT_EQ(agent.accepted(), 1);
  // Once the connection is closed, the next caller makes one new one.
  got[0]->Close();
  std::shared_ptr<AgentChannel> next;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        auto ch = co_await M().Channel(key_, id);
        EXPECT_TRUE(ch.ok()) << ch.status().message();
        if (ch.ok()) next = *ch;
      },
      asio::detached);
  RunUntil(io, [&] { return next != nullptr; });
  ASSERT_TRUE(next);
  EXPECT_NE(next, got[0]);
  EXPECT_EQ(agent.accepted(), 2);
  next->Close();
  got.clear();
  next.reset();
  manager_.reset();  // its channels run on `io`: gone before it is
}

// ---- a store whose writes really fail (a full filesystem) ----

class FullDiskTest : public ManagerTest {
 protected:
  void SetUp() override {
    ManagerTest::SetUp();
    // A private mount namespace for this thread (and the threads it starts), so the small
    // tmpfs holding the store is nobody else's business and vanishes with the test.
    ASSERT_EQ(::unshare(CLONE_NEWNS), 0) << std::strerror(errno);
    ASSERT_EQ(::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr), 0);
    mount_ = dir_ + "/small";
    ASSERT_EQ(::mkdir(mount_.c_str(), 0700), 0);
    ASSERT_EQ(::mount("tmpfs", mount_.c_str(), "tmpfs", 0, "size=2m,mode=0700"), 0)
        << std::strerror(errno);
    OpenStore(mount_ + "/sbx.db");
  }

  // Fills the filesystem to the last byte.
  void Fill() {
    FILE* f = std::fopen((mount_ + "/filler").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::string chunk(4096, 'x');
    while (std::fwrite(chunk.data(), 1, chunk.size(), f) == chunk.size()) {
    }
    std::fclose(f);  // tmpfs hands out whole pages: no byte is left for a new WAL frame
  }
  void Free() { ::unlink((mount_ + "/filler").c_str()); }
};

TEST_F(FullDiskTest, AKillWhoseRecordCannotBeWrittenIsNeverLeftRunning) {
  std::string id = Create();
  Fill();
  Status killed = M().Kill(key_, id);
  EXPECT_TRUE(killed.ok()) << killed.message();  // the box is gone: that is what kill promises
  EXPECT_FALSE(rt_.Box(id));
  EXPECT_EQ(Stored(id).state, "running");  // the write really failed...
  EXPECT_EQ(State(id), "killed");          // ...but the manager never answers running
  auto listed = M().List(key_, store::SandboxFilter{{"running"}});
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->items.empty());
  EXPECT_EQ(M().Kill(key_, id).err(), ENOENT);
  M().ExpireDue();  // still full: still pending
  EXPECT_EQ(Stored(id).state, "running");
  Free();
  M().ExpireDue();  // the scan writes it
  EXPECT_EQ(Stored(id).state, "killed");
  EXPECT_EQ(State(id), "killed");
}

TEST_F(FullDiskTest, APauseThatCannotBeRecordedIsUndoneAndRefused) {
  std::string id = Create();
  Fill();
  Status s = M().Pause(key_, id);
  EXPECT_EQ(s.err(), ENOSPC) << s.message();  // the facades' 507
  EXPECT_EQ(State(id), "running");
  EXPECT_FALSE(rt_.Box(id)->frozen);  // thawed again: the record and the box agree
  Free();
  ASSERT_TRUE(M().Pause(key_, id).ok());
  Fill();
  s = M().Resume(key_, id);
  EXPECT_EQ(s.err(), ENOSPC) << s.message();
  EXPECT_EQ(State(id), "paused");
  EXPECT_TRUE(rt_.Box(id)->frozen);  // frozen again
}

TEST_F(FullDiskTest, APauseThatCanBeNeitherRecordedNorUndoneFailsTheSandbox) {
  std::string id = Create();
  Fill();
  rt_.fail_thaw = Status::Error("thaw: the cgroup is gone", EIO);
  EXPECT_EQ(M().Pause(key_, id).err(), ENOSPC);
  EXPECT_FALSE(rt_.Box(id));  // destroyed rather than left frozen under a running record
  EXPECT_EQ(State(id), "failed");
  Free();
  M().ExpireDue();
  EXPECT_EQ(Stored(id).state, "failed");
}

TEST_F(FullDiskTest, ACreateThatCannotBeRecordedMakesNothing) {
  Create();  // the template is built and the store warmed up
  Fill();
  auto r = M().Create(key_, CreateRequest{});
  EXPECT_EQ(r.status().err(), ENOSPC) << r.status().message();
  EXPECT_EQ(rt_.size(), 1u);
}

// ---- The network (issue 12): the manager's calls into network::Stack ----

// A Stack that records the calls the manager makes: the real one needs the host's netlink and
// nftables and is the lead's to assemble; these tests are about the manager's half of the
// contract (which call, when, and that every failure after Prepare releases).
class RecordingStack : public network::Stack {
 public:
  Status fail_prepare, fail_attach, fail_update;
  std::vector<std::string> calls;  // "prepare ID MODE", "attach ID PID", "update ID MODE", ...
  std::map<std::string, network::Policy> live;

  Result<network::BoxNetPlan> Prepare(const std::string& id,
                                      const network::BoxNetRequest& r) override {
    Note("prepare " + id + " " + network::ModeName(r.policy.mode));
    if (!fail_prepare.ok()) return fail_prepare;
    std::lock_guard<std::mutex> l(mu_);
    live[id] = r.policy;
    network::BoxNetPlan plan;
    plan.files.push_back({"/state/" + id + "/resolv.conf", "/etc/resolv.conf"});
    plan.env["SSL_CERT_FILE"] = "/etc/sbx/ca.pem";
    return plan;
  }
  Status Attach(const std::string& id, pid_t pid) override {
    Note("attach " + id + " " + std::to_string(pid));
    return fail_attach;
  }
  Status Update(const std::string& id, const network::BoxNetRequest& r) override {
    Note("update " + id + " " + network::ModeName(r.policy.mode));
    if (!fail_update.ok()) return fail_update;
    std::lock_guard<std::mutex> l(mu_);
    live[id] = r.policy;
    return {};
  }
  Status Release(const std::string& id) override {
    Note("release " + id);
    std::lock_guard<std::mutex> l(mu_);
    live.erase(id);
    return {};
  }
  Status Reconcile(const std::set<std::string>& ids) override {
    std::string all;
    for (const auto& id : ids) all += " " + id;
    Note("reconcile" + all);
    return {};
  }
  std::vector<std::string> HostObjects() override { return {}; }

  std::vector<std::string> Calls() {
    std::lock_guard<std::mutex> l(mu_);
    return calls;
  }
  void Clear() {
    std::lock_guard<std::mutex> l(mu_);
    calls.clear();
  }

 private:
  void Note(std::string c) {
    std::lock_guard<std::mutex> l(mu_);
    calls.push_back(std::move(c));
  }
  std::mutex mu_;
};

network::Policy Allow(std::initializer_list<const char*> entries) {
  network::Policy p;
  p.mode = network::Mode::kAllowlist;
  for (const char* e : entries) {
    auto r = network::ParseRule(e);
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (r.ok()) p.allow.push_back(*r);
  }
  return p;
}

class NetworkManagerTest : public ManagerTest {
 protected:
  // A manager with the recording stack (or none: networking off).
  Manager& WithStack(bool on) {
    ManagerConfig c;
    c.clock = &clock_;
    c.network = on ? &stack_ : nullptr;
    storage::TemplateStore ts;
    ts.dir = dir_ + "/templates";
    manager_ = std::make_unique<Manager>(c, rt_, ts, *store_);
    return *manager_;
  }
  size_t LiveRows() {
    auto live = store_->ListLiveSandboxes();
    EXPECT_TRUE(live.ok());
    return live.ok() ? live->size() : 0;
  }
  size_t AllRows() {
    auto page = store_->ListSandboxes({});
    EXPECT_TRUE(page.ok());
    return page.ok() ? page->items.size() : 0;
  }
  RecordingStack stack_;
};

TEST_F(NetworkManagerTest, WithoutAStackANetworkIsRefusedAndNothingIsMade) {
  Manager& m = WithStack(false);
  EXPECT_FALSE(m.networking_enabled());
  CreateRequest r;
  r.network = Allow({"pypi.org"});
  auto rec = m.Create(key_, r);
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(rec.status().err(), EINVAL);
  EXPECT_NE(rec.status().message().find("networking is not enabled on this daemon"),
            std::string::npos)
      << rec.status().message();
  r.network = network::Policy{};
  r.network.mode = network::Mode::kOpen;
  EXPECT_EQ(m.Create(key_, r).status().err(), EINVAL);
  r = CreateRequest{};
  r.secrets["OPENAI_API_KEY"] = "openai";
  EXPECT_EQ(m.Create(key_, r).status().err(), EINVAL);
  EXPECT_EQ(AllRows(), 0u);
  EXPECT_EQ(rt_.size(), 0u);

  // A policy that lets nothing out is what a box without networking is: `none`.
  r = CreateRequest{};
  r.network.mode = network::Mode::kAllowlist;
  auto ok = m.Create(key_, r);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(network::Policy::FromJson(ok->network)->mode, network::Mode::kNone);
  EXPECT_FALSE(rt_.last_spec.at_sync_point);
}

TEST_F(NetworkManagerTest, SecretsAreCheckedForShape) {
  Manager& m = WithStack(true);
  CreateRequest r;
  r.network.mode = network::Mode::kOpen;
  for (const char* bad : {"1ABC", "A-B", "", "A B", "ÄB"}) {
    r.secrets = {{bad, "openai"}};
    auto rec = m.Create(key_, r);
    EXPECT_EQ(rec.status().err(), EINVAL) << bad;
    if (*bad) {
      EXPECT_NE(rec.status().message().find(bad), std::string::npos) << rec.status().message();
    }
  }
  r.secrets = {{"OK_1", ""}};
  EXPECT_EQ(m.Create(key_, r).status().err(), EINVAL);
  r.secrets = {{"DUP", "x"}};
  r.env = {{"DUP", "y"}};
  EXPECT_EQ(m.Create(key_, r).status().err(), EINVAL);
  r.env.clear();
  r.secrets.clear();
  for (int i = 0; i <= static_cast<int>(kMaxSecrets); ++i) r.secrets["V" + std::to_string(i)] = "s";
  EXPECT_EQ(m.Create(key_, r).status().err(), EINVAL);
  EXPECT_EQ(AllRows(), 0u);
  EXPECT_TRUE(stack_.Calls().empty());
  // Well-formed names that name no secret of the key (this manager has no secret store at all):
  // refused, and nothing recorded.
  r.secrets.erase("V0");
  EXPECT_FALSE(m.Create(key_, r).ok());
  EXPECT_EQ(AllRows(), 0u);
}

TEST_F(NetworkManagerTest, CreatePreparesAttachesAtTheSyncPointAndKillReleases) {
  Manager& m = WithStack(true);
  CreateRequest r;
  r.network = Allow({"pypi.org", "*.pythonhosted.org"});
  r.env["A"] = "1";
  auto rec = m.Create(key_, r);
  ASSERT_TRUE(rec.ok()) << rec.status().message();
  std::string id = rec->id;
  EXPECT_EQ(stack_.Calls(),
            (std::vector<std::string>{"prepare " + id + " allowlist", "attach " + id + " 4242"}));
  // The plan's files are bound read-only, its env joins the sandbox's.
  ASSERT_FALSE(rt_.last_spec.binds.empty());
  EXPECT_EQ(rt_.last_spec.binds.back().target, "/etc/resolv.conf");
  EXPECT_TRUE(rt_.last_spec.binds.back().read_only);
  EXPECT_EQ(Stored(id).env.at("SSL_CERT_FILE"), "/etc/sbx/ca.pem");
  EXPECT_EQ(Stored(id).env.at("A"), "1");
  auto p = network::Policy::FromJson(Stored(id).network);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->Describe(), Allow({"pypi.org", "*.pythonhosted.org"}).Describe());

  stack_.Clear();
  ASSERT_TRUE(m.Kill(key_, id).ok());
  ASSERT_TRUE(m.AwaitCleanup(id, 30s));  // the network is released after the kill answers
  EXPECT_EQ(stack_.Calls(), (std::vector<std::string>{"release " + id}));

  // A sandbox with no network never reaches the stack.
  stack_.Clear();
  auto plain = m.Create(key_, CreateRequest{});
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE(m.Kill(key_, plain->id).ok());
  EXPECT_TRUE(stack_.Calls().empty());
}

TEST_F(NetworkManagerTest, EveryFailureAfterPrepareReleases) {
  Manager& m = WithStack(true);
  CreateRequest r;
  r.network.mode = network::Mode::kOpen;
  // The runtime fails.
  rt_.fail_create = Status::Error("clone: no", EAGAIN);
  auto rec = m.Create(key_, r);
  ASSERT_FALSE(rec.ok());
  auto calls = stack_.Calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].rfind("prepare ", 0), 0u);
  EXPECT_EQ(calls[1].rfind("release ", 0), 0u);
  rt_.fail_create = {};
  // Attach fails at the sync point: the create fails, released.
  stack_.Clear();
  stack_.fail_attach = Status::Error("veth: no", EPERM);
  rec = m.Create(key_, r);
  ASSERT_FALSE(rec.ok());
  calls = stack_.Calls();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[2].rfind("release ", 0), 0u);
  stack_.fail_attach = {};
  // Prepare fails: nothing to release, nothing made, the record says why.
  stack_.Clear();
  stack_.fail_prepare = Status::Error("no free slot", ENOSPC);
  rec = m.Create(key_, r);
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(rec.status().err(), ENOSPC);
  EXPECT_EQ(stack_.Calls().size(), 1u);
  EXPECT_EQ(rt_.size(), 0u);
  EXPECT_EQ(LiveRows(), 0u);
  EXPECT_TRUE(stack_.live.empty());
}

TEST_F(NetworkManagerTest, TtlKillAndADeadAgentRelease) {
  Manager& m = WithStack(true);
  CreateRequest r;
  r.network.mode = network::Mode::kOpen;
  r.timeout_ms = 1000;
  auto a = m.Create(key_, r);
  r.timeout_ms = 600000;
  auto b = m.Create(key_, r);
  ASSERT_TRUE(a.ok() && b.ok());
  clock_.Advance(2s);
  m.ExpireDue();
  ASSERT_TRUE(m.AwaitCleanups(30s));  // the network is released after the kill answers
  EXPECT_EQ(stack_.live.count(a->id), 0u);
  EXPECT_EQ(stack_.live.count(b->id), 1u);
  rt_.SetExited(b->id, "killed by signal 9");
  m.ExpireDue();
  ASSERT_TRUE(m.AwaitCleanups(30s));
  EXPECT_TRUE(stack_.live.empty());
}

TEST_F(NetworkManagerTest, SetNetworkValidatesPersistsAndSurvivesARestart) {
  rt_.adoptable = true;
  Manager& m = WithStack(true);
  CreateRequest r;
  r.network = Allow({"pypi.org"});
  auto rec = m.Create(key_, r);
  ASSERT_TRUE(rec.ok()) << rec.status().message();
  std::string id = rec->id;

  // Another key's sandbox does not exist for it.
  auto other = store_->CreateApiKey("other", 0, 0);
  ASSERT_TRUE(other.ok());
  network::Policy open;
  open.mode = network::Mode::kOpen;
  EXPECT_EQ(m.SetNetwork(other->record, id, open).status().err(), ENOENT);

  stack_.Clear();
  std::string rules = R"({"api.x.com":[]})";
  auto set = m.SetNetwork(key_, id, open, &rules);
  ASSERT_TRUE(set.ok()) << set.status().message();
  EXPECT_EQ(stack_.Calls(), (std::vector<std::string>{"update " + id + " open"}));
  EXPECT_EQ(network::Policy::FromJson(Stored(id).network)->mode, network::Mode::kOpen);
  EXPECT_EQ(Stored(id).egress_rules, rules);
  EXPECT_EQ(network::Policy::FromJson(m.Get(key_, id)->network)->mode, network::Mode::kOpen);

  // Paused: still changed live, and kept through resume.
  ASSERT_TRUE(m.Pause(key_, id).ok());
  ASSERT_TRUE(m.SetNetwork(key_, id, Allow({"x.org"})).ok());
  ASSERT_TRUE(m.Resume(key_, id).ok());
  EXPECT_EQ(Stored(id).network, Allow({"x.org"}).ToJson());
  EXPECT_EQ(Stored(id).egress_rules, rules);  // not given: kept

  // A change the stack refuses changes nothing.
  stack_.fail_update = Status::Error("nft: no", EIO);
  EXPECT_FALSE(m.SetNetwork(key_, id, open).ok());
  EXPECT_EQ(Stored(id).network, Allow({"x.org"}).ToJson());
  stack_.fail_update = {};

  // A restart on the same store: the box is adopted and gets its recorded policy back.
  stack_.Clear();
  Manager& again = WithStack(true);
  ASSERT_TRUE(again.Reconcile().ok());
  EXPECT_EQ(stack_.Calls(),
            (std::vector<std::string>{"reconcile " + id, "update " + id + " allowlist"}));
  EXPECT_EQ(stack_.live.at(id).ToJson(), Allow({"x.org"}).ToJson());
  EXPECT_EQ(again.Get(key_, id)->network, Allow({"x.org"}).ToJson());

  // No network on a sandbox created without one; none is always allowed.
  auto plain = again.Create(key_, CreateRequest{});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(again.SetNetwork(key_, plain->id, open).status().err(), EBUSY);
  EXPECT_TRUE(again.SetNetwork(key_, plain->id, network::Policy{}).ok());
  ASSERT_TRUE(again.Kill(key_, id).ok());
  EXPECT_EQ(again.SetNetwork(key_, id, open).status().err(), ENOENT);
}

TEST_F(NetworkManagerTest, SetNetworkWithoutAStackTakesOnlyNone) {
  Manager& m = WithStack(false);
  auto rec = m.Create(key_, CreateRequest{});
  ASSERT_TRUE(rec.ok());
  network::Policy open;
  open.mode = network::Mode::kOpen;
  auto set = m.SetNetwork(key_, rec->id, open);
  EXPECT_EQ(set.status().err(), EINVAL);
  EXPECT_NE(set.status().message().find("networking is not enabled"), std::string::npos);
  EXPECT_TRUE(m.SetNetwork(key_, rec->id, network::Policy{}).ok());
}

// ---- Warm pools (pool.h) ----

class PoolTest : public ManagerTest {
 protected:
  // Fills every pool to its size, as the refill thread would.
  void Fill() {
    bool failed = false;
    while (M().RefillPass(&failed)) ASSERT_FALSE(failed);
  }
  PoolStatus Pool(const std::string& name = "host") {
    for (const auto& p : M().Pools())
      if (p.template_name == name) return p;
    return PoolStatus{};
  }
  std::vector<std::string> Pooled() {
    store::SandboxFilter f;
    f.states = {store::kStatePooled};
    f.oldest_first = true;  // as the reconciler keeps them
    auto page = store_->ListSandboxes(f);
    EXPECT_TRUE(page.ok());
    std::vector<std::string> ids;
    if (page.ok())
      for (const auto& r : page->items) ids.push_back(r.id);
    return ids;
  }
};

TEST(PoolSpecTest, ParsesTemplateAndSize) {
  auto a = ParsePoolSpec("host");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->template_name, "host");
  EXPECT_EQ(a->size, 1);
  auto b = ParsePoolSpec("my-tmpl:12");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->template_name, "my-tmpl");
  EXPECT_EQ(b->size, 12);
  for (const char* bad : {"", ":3", "host:", "host:x", "host:-1", "host:257", "host:3x"})
    EXPECT_EQ(ParsePoolSpec(bad).status().err(), EINVAL) << bad;
}

TEST_F(PoolTest, APoolFillsAndACreateTakesABoxWithItsOwnLimitsAndRecord) {
  ASSERT_TRUE(M().SetPool({"host", 2}).ok());
  Fill();
  EXPECT_EQ(Pool().ready, 2);
  auto pooled = Pooled();
  ASSERT_EQ(pooled.size(), 2u);
  EXPECT_EQ(Stored(pooled[0]).owner_key_id, "");
  // No key sees a pooled box: not in its list, not by id, not counted.
  auto op = store_->CreateApiKey("op", 0, 0, true);
  ASSERT_TRUE(op.ok());
  EXPECT_TRUE(M().List(op->record, {})->items.empty());
  EXPECT_EQ(M().Get(key_, pooled[0]).status().err(), ENOENT);
  EXPECT_EQ(M().Get(op->record, pooled[0]).status().err(), ENOENT);
  EXPECT_EQ(M().Kill(op->record, pooled[0]).err(), ENOENT);

  CreateRequest r;
  r.limits.memory_bytes = 256LL << 20;
  r.metadata = {{"k", "v"}};
  r.env = {{"A", "1"}};
  auto rec = M().Create(key_, r);
  ASSERT_TRUE(rec.ok()) << rec.status().message();
  EXPECT_TRUE(std::find(pooled.begin(), pooled.end(), rec->id) != pooled.end());
  store::SandboxRecord got = Stored(rec->id);
  EXPECT_EQ(got.state, store::kStateRunning);
  EXPECT_EQ(got.owner_key_id, key_.id);
  EXPECT_EQ(got.metadata, r.metadata);
  EXPECT_EQ(got.env, r.env);
  EXPECT_EQ(got.limits.memory_bytes, 256LL << 20);
  EXPECT_GT(got.expires_at, 0);
  // The create's limits went to the box's cgroups.
  auto set = rt_.LimitsSet(rec->id);
  ASSERT_TRUE(set);
  EXPECT_EQ(set->memory_bytes, 256LL << 20);
  EXPECT_EQ(M().List(key_, {})->items.size(), 1u);
  PoolStatus p = Pool();
  EXPECT_EQ(p.ready, 1);
  EXPECT_EQ(p.claims, 1u);
  // The refill makes the taken box again.
  Fill();
  EXPECT_EQ(Pool().ready, 2);
  // A sandbox from the pool ends as any other: its box goes, never back to the pool.
  ASSERT_TRUE(M().Kill(key_, rec->id).ok());
  EXPECT_FALSE(rt_.Box(rec->id));
  EXPECT_EQ(Pool().ready, 2);
}

TEST_F(PoolTest, CreatesThePoolCannotServeAreMadeCold) {
  ASSERT_TRUE(M().SetPool({"host", 1}).ok());
  Fill();
  std::string pooled = Pooled().at(0);
  CreateRequest disk;  // its disk image would have another size
  disk.limits.disk_bytes = 1LL << 30;
  auto rec = M().Create(key_, disk);
  ASSERT_TRUE(rec.ok()) << rec.status().message();
  EXPECT_NE(rec->id, pooled);
  EXPECT_EQ(Pool().ready, 1);
  // An empty pool: the create is made cold, and counted as a miss.
  ASSERT_TRUE(M().Create(key_, {}).ok());
  EXPECT_EQ(Pool().ready, 0);
  auto cold = M().Create(key_, {});
  ASSERT_TRUE(cold.ok());
  EXPECT_EQ(Pool().misses, 1u);
  // A pooled box whose agent died is not handed out: removed, and the create is made cold.
  Fill();
  std::string dead = Pooled().at(0);
  rt_.SetExited(dead, "killed by signal 9");
  auto after = M().Create(key_, {});
  ASSERT_TRUE(after.ok());
  EXPECT_NE(after->id, dead);
  EXPECT_FALSE(rt_.Box(dead));
  EXPECT_FALSE(store_->GetSandbox(dead).value());
}

TEST_F(PoolTest, AClaimOverTheQuotaFailsAndLeavesTheBoxInThePool) {
  auto k = store_->CreateApiKey("one", 1, 0);
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE(M().SetPool({"host", 2}).ok());
  Fill();
  ASSERT_TRUE(M().Create(k->record, {}).ok());
  QuotaExceeded q;
  auto over = M().Create(k->record, {}, &q);
  EXPECT_EQ(over.status().err(), EAGAIN);
  EXPECT_EQ(Pool().ready, 1);
  EXPECT_EQ(Pooled().size(), 1u);
}

TEST_F(PoolTest, ARestartKeepsThePooledBoxesItsPoolsWantAndRemovesTheRest) {
  rt_.adoptable = true;
  pools_ = {{"host", 2}};
  ASSERT_TRUE(M().StartPools().ok());
  M().Stop();  // the test fills the pools itself
  Fill();
  auto before = Pooled();
  ASSERT_EQ(before.size(), 2u);
  // The daemon restarts wanting one: one is kept (its box adopted), the other removed.
  pools_ = {{"host", 1}};
  manager_.reset();
  ASSERT_TRUE(M().Reconcile().ok());
  auto after = Pooled();
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0], before[0]);
  EXPECT_TRUE(rt_.Box(before[0]));
  EXPECT_FALSE(rt_.Box(before[1]));
  ASSERT_TRUE(M().SetPool({"host", 1}).ok());
  EXPECT_EQ(Pool().ready, 1);
  auto rec = M().Create(key_, {});
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->id, before[0]);
  // Wanting none: nothing pooled is left after a restart.
  Fill();
  pools_ = {};
  manager_.reset();
  ASSERT_TRUE(M().Reconcile().ok());
  EXPECT_TRUE(Pooled().empty());
  EXPECT_EQ(rt_.size(), 1u);  // the claimed sandbox's box alone
}

TEST_F(PoolTest, ShrinkingAPoolRemovesItsBoxesAndUnknownTemplatesAreRefused) {
  ASSERT_TRUE(M().SetPool({"host", 3}).ok());
  Fill();
  EXPECT_EQ(rt_.size(), 3u);
  ASSERT_TRUE(M().SetPool({"host", 0}).ok());
  Fill();
  EXPECT_EQ(rt_.size(), 0u);
  EXPECT_TRUE(Pooled().empty());
  EXPECT_TRUE(M().Pools().empty());
  EXPECT_EQ(M().SetPool({"nope", 1}).err(), EINVAL);
  EXPECT_EQ(M().SetPool({"host", kMaxPoolSize + 1}).err(), EINVAL);
}

}  // namespace
}  // namespace sbx::sandbox
