#include "store/store.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <future>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "common/fd.h"
#include "common/fs.h"
#include "store/migrations.h"
#include "store/small_fs_test.h"

namespace sbx::store {
namespace {

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-store-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/data/" + kDbFileName;
  }
  void TearDown() override { (void)RemoveTree(dir_); }

  std::unique_ptr<Store> OpenStore() {
    Result<std::unique_ptr<Store>> s = Store::Open(path_);
    EXPECT_TRUE(s.ok()) << s.status().message();
    return s.ok() ? std::move(*s) : nullptr;
  }

  // A store file as a build of schema `version` left it: migrations 1..version, then `rows`
  // (SQL). Call with ASSERT_NO_FATAL_FAILURE.
  void MakeFileAtVersion(int version, const std::string& rows) {
    ASSERT_TRUE(MakeDirs(path_.substr(0, path_.rfind('/'))).ok());
    auto db = Db::Open(path_);
    ASSERT_TRUE(db.ok());
    for (int v = 1; v <= version; ++v) ASSERT_TRUE((*db)->Exec(Migrations()[v - 1].sql).ok()) << v;
    ASSERT_TRUE((*db)->Exec("PRAGMA user_version = " + std::to_string(version)).ok());
    ASSERT_TRUE((*db)->Exec(rows).ok()) << rows;
  }

  static SandboxRecord Sandbox(const std::string& id, int64_t created_at = 0,
                               const std::string& state = kStateRunning) {
    SandboxRecord r;
    r.id = id;
    r.template_name = "host";
    r.state = state;
    r.created_at = created_at;
    return r;
  }

  static std::vector<std::string> Ids(const std::vector<SandboxRecord>& v) {
    std::vector<std::string> out;
    out.reserve(v.size());
    for (const auto& r : v) out.push_back(r.id);
    return out;
  }

  // Reads a pragma through a plain sqlite3 connection, independent of Db's own configuration.
  std::string RawPragma(const std::string& pragma) { return RawQuery("PRAGMA " + pragma); }
  // The first column of the first row of `sql`, read the same way.
  std::string RawQuery(const std::string& sql) {
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open_v2(path_.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
    sqlite3_stmt* st = nullptr;
    std::string out;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW) {
      out = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    return out;
  }

  std::string dir_;
  std::string path_;
};

int Mode(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int>(st.st_mode & 07777);
}

// ---- open, migrations ----

TEST_F(StoreTest, OpenCreatesPrivateWalDatabase) {
  mode_t old = ::umask(0);  // the modes must not depend on the umask
  auto store = OpenStore();
  ::umask(old);
  ASSERT_TRUE(store);
  EXPECT_EQ(Mode(path_), 0600);
  ASSERT_TRUE(store->PutSandbox(Sandbox("sb1")).ok());
  EXPECT_EQ(Mode(path_ + "-wal"), 0600);
  EXPECT_EQ(Mode(path_ + "-shm"), 0600);
  EXPECT_EQ(RawPragma("journal_mode"), "wal");
  EXPECT_EQ(RawPragma("user_version"), std::to_string(LatestSchemaVersion()));
  EXPECT_EQ(store->schema_version(), LatestSchemaVersion());
  EXPECT_TRUE(store->CheckIntegrity().ok());
}

// The quota is counted in the insert's own transaction, across connections (as two processes
// would hold them): the one over it gets EDQUOT and writes nothing.
TEST_F(StoreTest, InsertSandboxChecksTheQuotaInItsTransaction) {
  auto a = OpenStore();
  auto b = OpenStore();
  ASSERT_TRUE(a && b);
  auto live = [](const std::string& id, const std::string& state) {
    SandboxRecord r = Sandbox(id, 0, state);
    r.owner_key_id = "key_q";
    return r;
  };
  ASSERT_TRUE(a->InsertSandbox(live("s1", kStateCreating), 2).ok());
  EXPECT_EQ(a->InsertSandbox(live("s1", kStateCreating), 2).err(), EEXIST);
  ASSERT_TRUE(b->InsertSandbox(live("s2", kStatePaused), 2).ok());
  Status over = a->InsertSandbox(live("s3", kStateCreating), 2);
  EXPECT_EQ(over.err(), EDQUOT) << over.message();
  EXPECT_FALSE(*b->GetSandbox("s3"));
  // Ended sandboxes and other keys do not count; 0 is no quota.
  ASSERT_TRUE(a->PutSandbox(live("s2", kStateKilled)).ok());
  EXPECT_TRUE(b->InsertSandbox(live("s3", kStateCreating), 2).ok());
  SandboxRecord other = Sandbox("o1", 0, kStateCreating);
  other.owner_key_id = "key_other";
  EXPECT_TRUE(a->InsertSandbox(other, 1).ok());
  EXPECT_TRUE(a->InsertSandbox(live("s4", kStateCreating), 0).ok());
}

// Times the store stamps come from its clock.
TEST_F(StoreTest, TimesComeFromTheStoresClock) {
  FakeClock clock(1234567);
  auto s = Store::Open(path_, clock);
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_TRUE((*s)->PutSandbox(Sandbox("t1")).ok());
  EXPECT_EQ((**(*s)->GetSandbox("t1")).created_at, 1234567);
  clock.Advance(std::chrono::milliseconds(5));
  auto updated = (*s)->UpdateSandbox("t1", [](SandboxRecord&) { return Status(); });
  ASSERT_TRUE(updated.ok());
  EXPECT_EQ(updated->updated_at, 1234572);
  AuditEvent e;
  e.type = "x";
  ASSERT_TRUE((*s)->AppendAudit(e).ok());
  EXPECT_EQ((*s)->QueryAudit({})->at(0).time, 1234572);
}

TEST_F(StoreTest, OpenTightensLooseModes) {
  ASSERT_TRUE(MakeDirs(dir_ + "/data").ok());
  ASSERT_TRUE(WriteFile(path_, "", 0644).ok());
  ASSERT_EQ(::chmod(path_.c_str(), 0644), 0);
  auto store = OpenStore();
  ASSERT_TRUE(store);
  EXPECT_EQ(Mode(path_), 0600);
}

// A one-shot process keeps the WAL short: its commits checkpoint it past the limit, so the WAL
// starts over and never grows to SQLite's default 1000 pages (which the next process to open the
// database alone would read whole to rebuild the WAL's index).
TEST_F(StoreTest, KeepWalShortBoundsTheWal) {
  constexpr int kWrites = 150;  // a few pages each: far past 16 pages, short of 1000
  // The frames in the WAL after the writes, as a checkpoint by another connection counts them
  // (with the store still open, so that no close checkpoints it first).
  auto frames_after_writes = [&](bool keep_short) -> int {
    (void)RemoveTree(dir_ + "/data");
    auto store = OpenStore();
    if (!store) return -1;
    if (keep_short) {
      EXPECT_TRUE(store->KeepWalShort(16).ok());
    }
    for (int i = 0; i < kWrites; ++i)
      EXPECT_TRUE(store->PutSandbox(Sandbox("s" + std::to_string(i))).ok());
    sqlite3* raw = nullptr;
    int log = -1;
    EXPECT_EQ(sqlite3_open_v2(path_.c_str(), &raw, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
    // A read first: a connection opens the WAL with its first transaction.
    EXPECT_EQ(sqlite3_exec(raw, "SELECT count(*) FROM sqlite_master", nullptr, nullptr, nullptr),
              SQLITE_OK);
    EXPECT_EQ(sqlite3_wal_checkpoint_v2(raw, nullptr, SQLITE_CHECKPOINT_PASSIVE, &log, nullptr),
              SQLITE_OK);
    sqlite3_close(raw);
    return log;
  };
  int kept = frames_after_writes(true);
  EXPECT_GE(kept, 0);
  EXPECT_LE(kept, 16 + 8);  // a commit may pass the limit by its own pages
  // The same writes without the limit leave a frame or more per write.
  EXPECT_GE(frames_after_writes(false), kWrites);
}

TEST_F(StoreTest, ReopenIsIdempotent) {
  {
    auto store = OpenStore();
    ASSERT_TRUE(store);
    ASSERT_TRUE(store->PutSandbox(Sandbox("keep")).ok());
  }
  for (int i = 0; i < 3; ++i) {
    auto store = OpenStore();
    ASSERT_TRUE(store);
    EXPECT_EQ(store->schema_version(), LatestSchemaVersion());
    auto got = store->GetSandbox("keep");
    ASSERT_TRUE(got.ok());
    EXPECT_TRUE(got->has_value());
  }
}

TEST_F(StoreTest, MigrationsAreOrderedAndComplete) {
  const auto& all = Migrations();
  ASSERT_FALSE(all.empty());
  // 1..N without a gap: branches that took the same number in parallel are renumbered when
  // they merge, and this catches a merge that left a hole or a duplicate.
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i].version, static_cast<int>(i) + 1);
}

TEST_F(StoreTest, AVersionOneFileIsMigratedAndKeepsItsRows) {
  // A file as the first release wrote it: version 1 only, one sandbox.
  ASSERT_NO_FATAL_FAILURE(
      MakeFileAtVersion(1,
                        "INSERT INTO sandboxes (id, state, created_at, updated_at) VALUES "
                        "('old', 'running', 1, 1)"));
  auto store = OpenStore();
  ASSERT_TRUE(store);
  EXPECT_EQ(store->schema_version(), LatestSchemaVersion());
  auto old = store->GetSandbox("old");
  ASSERT_TRUE(old.ok() && old->has_value());
  EXPECT_FALSE((*old)->public_ports);  // the default of a column added later
  SandboxRecord r = Sandbox("pub");
  r.public_ports = true;
  ASSERT_TRUE(store->PutSandbox(r).ok());
  EXPECT_TRUE((*store->GetSandbox("pub"))->public_ports);
}

TEST_F(StoreTest, AVersionNineFileGetsNoNetworkAndKeepsAPolicyWritten) {
  // A file migrated up to version 9, with a sandbox made then.
  ASSERT_NO_FATAL_FAILURE(
      MakeFileAtVersion(9,
                        "INSERT INTO sandboxes (id, state, created_at, updated_at) VALUES "
                        "('old', 'running', 1, 1)"));
  auto store = OpenStore();
  ASSERT_TRUE(store);
  auto old = store->GetSandbox("old");
  ASSERT_TRUE(old.ok() && old->has_value());
  EXPECT_EQ((*old)->network, R"({"mode":"none"})");
  EXPECT_EQ((*old)->egress_rules, "{}");
  EXPECT_EQ((*old)->mask_request_host, "");

  SandboxRecord r = Sandbox("net");
  r.network = R"({"mode":"allowlist","allow":["pypi.org"],"deny":[]})";
  r.egress_rules = R"({"api.x.com":[{"transform":{"headers":{"A":"b"}}}]})";
  r.mask_request_host = "localhost:${PORT}";
  ASSERT_TRUE(store->PutSandbox(r).ok());
  auto got = store->GetSandbox("net");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->network, r.network);
  EXPECT_EQ((*got)->egress_rules, r.egress_rules);
  EXPECT_EQ((*got)->mask_request_host, r.mask_request_host);
  // An empty policy is written as none, never as an unparseable "".
  r.network.clear();
  ASSERT_TRUE(store->PutSandbox(r).ok());
  EXPECT_EQ((*store->GetSandbox("net"))->network, R"({"mode":"none"})");
}

TEST_F(StoreTest, RefusesNewerSchema) {
  { ASSERT_TRUE(OpenStore()); }
  {
    auto db = Db::Open(path_);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE((*db)->Exec("PRAGMA user_version = 99").ok());
  }
  Result<std::unique_ptr<Store>> s = Store::Open(path_);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().err(), ENOTSUP);
  EXPECT_NE(s.status().message().find("schema version 99"), std::string::npos)
      << s.status().message();
  EXPECT_NE(s.status().message().find("newer"), std::string::npos);
  EXPECT_EQ(RawPragma("user_version"), "99");  // left untouched
}

// ---- sandboxes ----

TEST_F(StoreTest, SecretsBelongToOneOwner) {
  auto store = OpenStore();
  SecretRecord r;
  r.id = "sec_a";
  r.owner_key_id = "key_a";
  r.name = "openai";
  r.sealed = "c2VhbGVk";
  r.hosts = {"api.openai.com", "*.openai.com"};
  r.header = "Authorization";
  r.format = "Bearer {}";
  r.metadata = {{"team", "ml"}};
  auto put = store->PutSecret(r, false);
  ASSERT_TRUE(put.ok()) << put.status().message();
  EXPECT_EQ(put->version, 1);
  EXPECT_GT(put->created_at, 0);
  EXPECT_EQ(store->PutSecret(r, false).status().err(), EEXIST);
  // Another owner may use the same name; neither sees the other's.
  SecretRecord b = r;
  b.id = "sec_b";
  b.owner_key_id = "key_b";
  ASSERT_TRUE(store->PutSecret(b, false).ok());
  auto got = store->GetSecret("key_a", "openai");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->id, "sec_a");
  EXPECT_EQ((*got)->hosts, r.hosts);
  EXPECT_EQ((*got)->format, "Bearer {}");
  EXPECT_EQ((*got)->metadata, r.metadata);
  EXPECT_TRUE(store->GetSecret("key_a", "sec_a")->has_value());  // by id too
  EXPECT_FALSE(store->GetSecret("key_a", "sec_b")->has_value());
  EXPECT_FALSE(store->GetSecret("key_c", "openai")->has_value());
  // Replacing keeps the id and creation time and bumps the version.
  r.id = "sec_new";
  r.sealed = "b3RoZXI=";
  auto replaced = store->PutSecret(r, true);
  ASSERT_TRUE(replaced.ok());
  EXPECT_EQ(replaced->id, "sec_a");
  EXPECT_EQ(replaced->version, 2);
  EXPECT_EQ((*store->GetSecret("key_a", "openai"))->sealed, "b3RoZXI=");
  ASSERT_EQ(store->ListSecrets("key_a")->size(), 1u);
  EXPECT_EQ(store->DeleteSecret("key_b", "sec_a").err(), ENOENT);
  EXPECT_TRUE(store->DeleteSecret("key_a", "openai").ok());
  EXPECT_TRUE(store->ListSecrets("key_a")->empty());
  EXPECT_EQ(store->ListSecrets("key_b")->size(), 1u);
}

TEST_F(StoreTest, SandboxRoundTrip) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  SandboxRecord r = Sandbox("sb_rt", 1234);
  r.owner_key_id = "key_abc";
  r.metadata = {{"user", "ann"}, {"unicode", "ключ ✓"}};
  r.env = {{"PATH", "/usr/bin"}, {"EMPTY", ""}};
  r.limits = {.memory_bytes = 512 << 20,
              .cpus = 1.5,
              .cpu_weight = 100,
              .pids = 64,
              .disk_bytes = int64_t{1} << 30};
  r.timeout_ms = 300000;
  r.on_timeout = kOnTimeoutPause;
  r.updated_at = 1300;
  r.expires_at = 301234;
  r.init_pid = 4242;
  r.agent_socket = "/var/lib/sbx/run/x/agent.sock";
  r.box_dir = "/var/lib/sbx/run/x";
  r.error = "";
  ASSERT_TRUE(store->PutSandbox(r).ok());
  auto got = store->GetSandbox("sb_rt");
  ASSERT_TRUE(got.ok()) << got.status().message();
  ASSERT_TRUE(got->has_value());
  const SandboxRecord& g = **got;
  EXPECT_EQ(g.template_name, "host");
  EXPECT_EQ(g.state, kStateRunning);
  EXPECT_EQ(g.owner_key_id, "key_abc");
  EXPECT_EQ(g.metadata, r.metadata);
  EXPECT_EQ(g.env, r.env);
  EXPECT_EQ(g.limits.memory_bytes, 512 << 20);
  EXPECT_EQ(g.limits.cpus, 1.5);
  EXPECT_EQ(g.limits.cpu_weight, 100);
  EXPECT_EQ(g.limits.pids, 64);
  EXPECT_EQ(g.limits.disk_bytes, int64_t{1} << 30);
  EXPECT_EQ(g.timeout_ms, 300000);
  EXPECT_EQ(g.on_timeout, kOnTimeoutPause);
  EXPECT_EQ(g.created_at, 1234);
  EXPECT_EQ(g.updated_at, 1300);
  EXPECT_EQ(g.expires_at, 301234);
  EXPECT_EQ(g.init_pid, 4242);
  EXPECT_EQ(g.agent_socket, r.agent_socket);
  EXPECT_EQ(g.box_dir, r.box_dir);
  EXPECT_TRUE(g.layers.empty());
  EXPECT_FALSE(g.on_disk);
  EXPECT_TRUE(g.pause_memory);

  // Version 15: its layers, and how it pauses.
  r.layers = {"disk-sb_rt-1", "host-abc"};
  r.on_disk = true;
  r.pause_memory = false;
  r.auto_resume = true;
  ASSERT_TRUE(store->PutSandbox(r).ok());
  got = store->GetSandbox("sb_rt");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->layers, r.layers);
  EXPECT_TRUE((*got)->on_disk);
  EXPECT_FALSE((*got)->pause_memory);
  EXPECT_TRUE((*got)->auto_resume);
  // Version 16: its runtime (native until set).
  EXPECT_EQ((*got)->runtime, kRuntimeNative);
  r.runtime = "gvisor";
  ASSERT_TRUE(store->PutSandbox(r).ok());
  EXPECT_EQ((*store->GetSandbox("sb_rt"))->runtime, "gvisor");
  // Version 17: where its memory was saved (none until set).
  EXPECT_EQ((*store->GetSandbox("sb_rt"))->saved_memory, "");
  r.saved_memory = "/data/memory/sb_rt-1";
  ASSERT_TRUE(store->PutSandbox(r).ok());
  EXPECT_EQ((*store->GetSandbox("sb_rt"))->saved_memory, r.saved_memory);

  // Replace.
  r.state = kStateFailed;
  r.error = "agent did not start";
  r.ended_at = 2000;
  ASSERT_TRUE(store->PutSandbox(r).ok());
  got = store->GetSandbox("sb_rt");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->state, kStateFailed);
  EXPECT_EQ((*got)->error, "agent did not start");
  EXPECT_EQ((*got)->ended_at, 2000);

  auto missing = store->GetSandbox("nope");
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->has_value());

  ASSERT_TRUE(store->DeleteSandbox("sb_rt").ok());
  EXPECT_EQ(store->DeleteSandbox("sb_rt").err(), ENOENT);
  EXPECT_FALSE(store->GetSandbox("sb_rt")->has_value());
}

TEST_F(StoreTest, PutSandboxValidates) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  EXPECT_EQ(store->PutSandbox(Sandbox("")).err(), EINVAL);
  EXPECT_EQ(store->PutSandbox(Sandbox("x", 0, "zombie")).err(), EINVAL);
  SandboxRecord r = Sandbox("x");
  r.on_timeout = "explode";
  EXPECT_EQ(store->PutSandbox(r).err(), EINVAL);
  r = Sandbox("x");
  r.metadata["bad"] = std::string("\xff\xfe", 2);  // not UTF-8
  Status s = store->PutSandbox(r);
  EXPECT_EQ(s.err(), EINVAL) << s.message();
  // Defaults stamped.
  ASSERT_TRUE(store->PutSandbox(Sandbox("x")).ok());
  auto got = store->GetSandbox("x");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_GT((*got)->created_at, 0);
  EXPECT_GT((*got)->updated_at, 0);
}

TEST_F(StoreTest, UpdateSandboxIsReadModifyWrite) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  ASSERT_TRUE(store->PutSandbox(Sandbox("u", 10)).ok());
  auto r = store->UpdateSandbox("u", [](SandboxRecord& rec) {
    rec.state = kStatePaused;
    return Status();
  });
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->state, kStatePaused);
  EXPECT_EQ((*store->GetSandbox("u"))->state, kStatePaused);
  // A failing change writes nothing.
  auto fail = store->UpdateSandbox("u", [](SandboxRecord& rec) {
    rec.state = kStateKilled;
    return Status::Error("not now", EAGAIN);
  });
  EXPECT_EQ(fail.status().err(), EAGAIN);
  EXPECT_EQ((*store->GetSandbox("u"))->state, kStatePaused);
  EXPECT_EQ(store->UpdateSandbox("ghost", [](SandboxRecord&) { return Status(); }).status().err(),
            ENOENT);
}

TEST_F(StoreTest, ListFiltersByStateOwnerAndCounts) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  const char* states[] = {kStateCreating, kStateRunning, kStatePaused, kStateKilled, kStateFailed};
  for (int i = 0; i < 10; ++i) {
    SandboxRecord r = Sandbox("s" + std::to_string(i), 100 + i, states[i % 5]);
    r.owner_key_id = i < 6 ? "key_a" : "key_b";
    ASSERT_TRUE(store->PutSandbox(r).ok());
  }
  SandboxFilter f;
  f.states = {kStateRunning};
  auto page = store->ListSandboxes(f);
  ASSERT_TRUE(page.ok()) << page.status().message();
  EXPECT_EQ(Ids(page->items), (std::vector<std::string>{"s6", "s1"}));
  EXPECT_TRUE(page->next.empty());

  f.states = {kStateRunning, kStatePaused};
  f.owner_key_id = "key_a";
  page = store->ListSandboxes(f);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(Ids(page->items), (std::vector<std::string>{"s2", "s1"}));

  auto live = store->ListLiveSandboxes();
  ASSERT_TRUE(live.ok());
  EXPECT_EQ(Ids(*live), (std::vector<std::string>{"s0", "s1", "s2", "s5", "s6", "s7"}));

  EXPECT_EQ(*store->CountSandboxes("", {}), 10);
  EXPECT_EQ(*store->CountSandboxes("key_a", {}), 6);
  EXPECT_EQ(*store->CountSandboxes("key_a", {kStateCreating, kStateRunning, kStatePaused}), 4);
  EXPECT_EQ(*store->CountSandboxes("key_b", {kStateKilled}), 1);
  EXPECT_EQ(*store->CountSandboxes("key_zzz", {}), 0);
}

TEST_F(StoreTest, MetadataFilterHandlesAwkwardKeys) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  const std::vector<std::pair<std::string, std::string>> awkward = {
      {"a.b", "dot"},
      {"say \"hi\"", "quote"},
      {"with space", "space"},
      {"$.x", "dollar"},
      {"back\\slash", "back\\slash"},
      {"it's", "apostrophe'"},
      {"ключ", "значение"},
      {"[0]", "bracket"},
  };
  for (size_t i = 0; i < awkward.size(); ++i) {
    SandboxRecord r = Sandbox("m" + std::to_string(i), 100 + static_cast<int64_t>(i));
    r.metadata = {{awkward[i].first, awkward[i].second}, {"team", i % 2 ? "odd" : "even"}};
    ASSERT_TRUE(store->PutSandbox(r).ok());
  }
  for (size_t i = 0; i < awkward.size(); ++i) {
    SandboxFilter f;
    f.metadata = {awkward[i]};
    auto page = store->ListSandboxes(f);
    ASSERT_TRUE(page.ok()) << page.status().message();
    EXPECT_EQ(Ids(page->items), std::vector<std::string>{"m" + std::to_string(i)})
        << "key " << awkward[i].first;
    f.metadata = {{awkward[i].first, awkward[i].second + "x"}};
    EXPECT_TRUE(store->ListSandboxes(f)->items.empty()) << "key " << awkward[i].first;
  }
  // Several pairs: all must match.
  SandboxFilter f;
  f.metadata = {{"team", "odd"}, {"say \"hi\"", "quote"}};
  EXPECT_EQ(Ids(store->ListSandboxes(f)->items), std::vector<std::string>{"m1"});
  f.metadata = {{"team", "even"}, {"say \"hi\"", "quote"}};
  EXPECT_TRUE(store->ListSandboxes(f)->items.empty());
  f.metadata = {{"team", "odd"}};
  EXPECT_EQ(store->ListSandboxes(f)->items.size(), awkward.size() / 2);
  // Input is data, never SQL.
  f.metadata = {{"x' OR 1=1 --", "y"}, {"\") OR 1=1 --", "') OR ('1'='1"}};
  auto page = store->ListSandboxes(f);
  ASSERT_TRUE(page.ok()) << page.status().message();
  EXPECT_TRUE(page->items.empty());
}

TEST_F(StoreTest, PaginationIsStableWhileRowsArrive) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  // 25 sandboxes, two per millisecond so ties are broken by id.
  std::set<std::string> original;
  for (int i = 0; i < 25; ++i) {
    std::string id = "p" + std::string(i < 10 ? "0" : "") + std::to_string(i);
    ASSERT_TRUE(store->PutSandbox(Sandbox(id, 1000 + i / 2)).ok());
    original.insert(id);
  }
  SandboxFilter f;
  f.limit = 10;
  std::vector<std::string> seen;
  std::vector<size_t> sizes;
  int64_t later = 5000;
  for (int page_no = 0; page_no < 10; ++page_no) {
    auto page = store->ListSandboxes(f);
    ASSERT_TRUE(page.ok()) << page.status().message();
    sizes.push_back(page->items.size());
    for (const auto& r : page->items) seen.push_back(r.id);
    if (page->next.empty()) break;
    // New sandboxes arrive between pages; they are newer than the cursor.
    for (int k = 0; k < 3; ++k) {
      ASSERT_TRUE(store->PutSandbox(Sandbox("new" + std::to_string(later), later)).ok());
      ++later;
    }
    f.after = page->next;
  }
  EXPECT_EQ(sizes, (std::vector<size_t>{10, 10, 5}));
  EXPECT_EQ(std::set<std::string>(seen.begin(), seen.end()), original);
  EXPECT_EQ(seen.size(), original.size());  // no duplicates
  // Newest first, ties by id descending.
  EXPECT_EQ(seen.front(), "p24");
  EXPECT_EQ(seen[1], "p23");
  EXPECT_EQ(seen[2], "p22");
  EXPECT_EQ(seen.back(), "p00");

  SandboxFilter bad;
  bad.after = "not-a-token";
  EXPECT_EQ(store->ListSandboxes(bad).status().err(), EINVAL);
  bad.after = "7031";  // valid hex, wrong content
  EXPECT_EQ(store->ListSandboxes(bad).status().err(), EINVAL);
}

TEST_F(StoreTest, ListOldestFirstSinceATimeAndByTemplate) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  for (int i = 0; i < 6; ++i) {
    SandboxRecord r = Sandbox("o" + std::to_string(i), 100 + i);
    if (i % 2) r.template_name = "py";
    ASSERT_TRUE(store->PutSandbox(r).ok());
  }
  SandboxFilter f;
  f.oldest_first = true;
  f.limit = 2;
  std::vector<std::string> seen;
  for (;;) {
    auto page = store->ListSandboxes(f);
    ASSERT_TRUE(page.ok()) << page.status().message();
    for (const auto& r : page->items) seen.push_back(r.id);
    if (page->next.empty()) break;
    f.after = page->next;
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"o0", "o1", "o2", "o3", "o4", "o5"}));
  SandboxFilter since;
  since.created_since = 104;  // inclusive: o4 was created at exactly 104
  EXPECT_EQ(Ids(store->ListSandboxes(since)->items), (std::vector<std::string>{"o5", "o4"}));
  since.template_name = "py";
  EXPECT_EQ(Ids(store->ListSandboxes(since)->items), std::vector<std::string>{"o5"});
  since.template_name = "";
  EXPECT_TRUE(store->ListSandboxes(since)->items.empty());
}

TEST_F(StoreTest, PageOfExactlyLimitHasNoNext) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(store->PutSandbox(Sandbox("e" + std::to_string(i), i + 1)).ok());
  SandboxFilter f;
  f.limit = 4;
  auto page = store->ListSandboxes(f);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->items.size(), 4u);
  EXPECT_TRUE(page->next.empty());
}

// ---- API keys ----

TEST_F(StoreTest, OperatorKeysAreMarkedAndOlderKeysAreNot) {
  // A file of schema version 2 with one key: it stays a tenant key after the migration.
  ASSERT_NO_FATAL_FAILURE(
      MakeFileAtVersion(2,
                        "INSERT INTO api_keys (id, name, hash, prefix, created_at) VALUES "
                        "('key_old', 'old', 'h', 'sbx_abcd', 1)"));
  auto store = OpenStore();
  ASSERT_TRUE(store);
  auto old = store->GetApiKey("key_old");
  ASSERT_TRUE(old.ok() && old->has_value());
  EXPECT_FALSE((*old)->is_operator);

  auto op = store->CreateApiKey("ops", 0, 0, /*is_operator=*/true);
  ASSERT_TRUE(op.ok()) << op.status().message();
  EXPECT_TRUE(op->record.is_operator);
  auto tenant = store->CreateApiKey("tenant", 0, 0);
  ASSERT_TRUE(tenant.ok());
  EXPECT_FALSE(tenant->record.is_operator);
  auto v = store->VerifyApiKey(op->secret);
  ASSERT_TRUE(v.ok() && v->has_value());
  EXPECT_TRUE((*v)->is_operator);
  v = store->VerifyApiKey(tenant->secret);
  ASSERT_TRUE(v.ok() && v->has_value());
  EXPECT_FALSE((*v)->is_operator);
  auto all = store->ListApiKeys();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  for (const auto& k : *all) EXPECT_EQ(k.is_operator, k.id == op->record.id) << k.id;
  EXPECT_TRUE(store->Ping().ok());

  // Version 16: the runtimes a key may ask for, none until set.
  EXPECT_TRUE((*store->GetApiKey(tenant->record.id))->runtimes.empty());
  ASSERT_TRUE(store->SetApiKeyRuntimes(tenant->record.id, {"gvisor", "vm"}).ok());
  EXPECT_EQ((*store->GetApiKey(tenant->record.id))->runtimes,
            (std::vector<std::string>{"gvisor", "vm"}));
  EXPECT_EQ(store->SetApiKeyRuntimes(tenant->record.id, {"g visor"}).err(), EINVAL);
  EXPECT_EQ(store->SetApiKeyRuntimes("key_none", {"vm"}).err(), ENOENT);
}

// Issue 10 item 7: a key's own bounds of its sandboxes' limits (version 7). Unset bounds are
// NULL, read back as 0 ("the daemon's"), also for keys made before the migration.
TEST_F(StoreTest, KeysCarryTheirOwnLimitRangesNullMeaningTheDaemons) {
  // A version 6 file with one key: after the migration its bounds are all the daemon's.
  ASSERT_NO_FATAL_FAILURE(
      MakeFileAtVersion(6,
                        "INSERT INTO api_keys (id, name, hash, prefix, created_at) VALUES "
                        "('key_old', 'old', 'h', 'sbx_abcd', 1)"));
  auto store = OpenStore();
  ASSERT_TRUE(store);
  EXPECT_GE(store->schema_version(), 7);
  auto old = store->GetApiKey("key_old");
  ASSERT_TRUE(old.ok() && old->has_value());
  EXPECT_EQ((*old)->ranges, LimitRanges{});

  LimitRanges r;
  r.min_memory_bytes = int64_t{64} << 20;
  r.max_memory_bytes = int64_t{2} << 30;
  r.max_cpus = 1.5;
  r.min_cpus = 0.25;
  r.max_pids = 256;
  r.max_disk_bytes = int64_t{10} << 30;
  r.max_timeout_ms = 3600 * 1000;
  auto k = store->CreateApiKey("bounded", 0, 0, false, r);
  ASSERT_TRUE(k.ok()) << k.status().message();
  EXPECT_EQ(k->record.ranges, r);
  auto v = store->VerifyApiKey(k->secret);
  ASSERT_TRUE(v.ok() && v->has_value());
  EXPECT_EQ((*v)->ranges, r);
  auto all = store->ListApiKeys();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[1].ranges, r);
  // Unset bounds are NULL in the file, not 0.
  auto nulls = RawQuery(
      "SELECT count(*) FROM api_keys WHERE min_pids IS NULL AND "
      "min_timeout_ms IS NULL AND max_pids = 256");
  EXPECT_EQ(nulls, "1");

  // Negative, non-finite and crossed bounds are refused, naming the field; nothing is stored.
  auto refused = [&](LimitRanges b, const std::string& field) {
    auto made = store->CreateApiKey("bad", 0, 0, false, b);
    EXPECT_EQ(made.status().err(), EINVAL) << field;
    EXPECT_NE(made.status().message().find(field), std::string::npos) << made.status().message();
  };
  LimitRanges bad;
  bad.max_memory_bytes = -1;
  refused(bad, "memory_bytes");
  bad = {};
  bad.max_cpus = std::nan("");
  refused(bad, "cpus");
  bad = {};
  bad.min_pids = 100;
  bad.max_pids = 10;
  refused(bad, "pids");
  bad = {};
  bad.min_timeout_ms = -5;
  refused(bad, "timeout_ms");
  EXPECT_EQ(store->ListApiKeys()->size(), 2u);
}

// Every HTTP request checks its key on the server's I/O thread: a check must not wait for another
// call that holds the store, or one slow call would stall every request.
TEST_F(StoreTest, KeysVerifyWhileAnotherCallHoldsTheStore) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  auto k = store->CreateApiKey("agent", 0, 0);
  ASSERT_TRUE(k.ok()) << k.status().message();
  ASSERT_TRUE(store->InsertSandbox(Sandbox("held")).ok());
  std::promise<void> holding, verified;
  std::future<void> verified_done = verified.get_future();
  bool verified_while_held = false;
  std::thread holder([&] {
    auto r = store->UpdateSandbox("held", [&](SandboxRecord&) {
      holding.set_value();
      // Generous: the check takes microseconds; waiting out this bound is the failure.
      verified_while_held =
          verified_done.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
      return Status();
    });
    EXPECT_TRUE(r.ok());
  });
  holding.get_future().wait();
  auto v = store->VerifyApiKey(k->secret);
  verified.set_value();
  holder.join();
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_TRUE(v->has_value());
  EXPECT_TRUE(verified_while_held);
}

// A key minted before keys took E2B's format ("sbx_" + 40 [a-z0-9]) still authenticates: the
// row an older sbx wrote holds only the secret's hash, and verification never looks at the form.
TEST_F(StoreTest, OldFormatKeyStillVerifies) {
  const std::string old_secret = "sbx_k3y0" + std::string(36, 'q');
  ASSERT_EQ(old_secret.size(), 44u);
  std::string id;
  {
    auto store = OpenStore();
    ASSERT_TRUE(store);
    auto k = store->CreateApiKey("old", 0, 0);
    ASSERT_TRUE(k.ok());
    id = k->record.id;
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2(path_.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
  std::string sql = "UPDATE api_keys SET hash = '" + Sha256Hex(old_secret) + "', prefix = '" +
                    old_secret.substr(0, 8) + "' WHERE id = '" + id + "'";
  EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  auto store = OpenStore();
  ASSERT_TRUE(store);
  auto v = store->VerifyApiKey(old_secret);
  ASSERT_TRUE(v.ok());
  ASSERT_TRUE(v->has_value());
  EXPECT_EQ((*v)->id, id);
  EXPECT_EQ((*v)->prefix, "sbx_k3y0");
}

TEST_F(StoreTest, ApiKeysVerifyByHashAndRevoke) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  auto k = store->CreateApiKey("laptop", 5, 2.5);
  ASSERT_TRUE(k.ok()) << k.status().message();
  // E2B's own format, which the official SDKs check on the client side (JS: ^e2b_[0-9a-f]+$).
  EXPECT_TRUE(std::regex_match(k->secret, std::regex("e2b_[0-9a-f]{48}"))) << k->secret;
  EXPECT_TRUE(std::regex_match(k->record.id, std::regex("key_[a-z0-9]{12}"))) << k->record.id;
  EXPECT_EQ(k->record.prefix, k->secret.substr(0, 8));
  EXPECT_NE(k->record.hash, k->secret);
  EXPECT_EQ(k->record.hash, Sha256Hex(k->secret));
  EXPECT_EQ(k->record.hash.size(), 64u);

  auto v = store->VerifyApiKey(k->secret);
  ASSERT_TRUE(v.ok());
  ASSERT_TRUE(v->has_value());
  EXPECT_EQ((*v)->id, k->record.id);
  EXPECT_EQ((*v)->name, "laptop");
  EXPECT_EQ((*v)->max_sandboxes, 5);
  EXPECT_EQ((*v)->creates_per_second, 2.5);

  std::string wrong = k->secret;
  wrong.back() = wrong.back() == 'a' ? 'b' : 'a';
  EXPECT_FALSE(store->VerifyApiKey(wrong)->has_value());
  EXPECT_FALSE(store->VerifyApiKey("")->has_value());
  EXPECT_FALSE(store->VerifyApiKey(k->record.hash)->has_value());  // the hash is not a secret
  EXPECT_FALSE(store->VerifyApiKey(std::string(100000, 'x'))->has_value());

  auto other = store->CreateApiKey("ci", 0, 0);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->secret, k->secret);
  ASSERT_TRUE(store->RevokeApiKey(k->record.id).ok());
  EXPECT_FALSE(store->VerifyApiKey(k->secret)->has_value());
  EXPECT_TRUE(store->VerifyApiKey(other->secret)->has_value());
  int64_t revoked_at = (*store->GetApiKey(k->record.id))->revoked_at;
  EXPECT_GT(revoked_at, 0);
  ASSERT_TRUE(store->RevokeApiKey(k->record.id).ok());  // twice is fine, time kept
  EXPECT_EQ((*store->GetApiKey(k->record.id))->revoked_at, revoked_at);
  EXPECT_EQ(store->RevokeApiKey("key_nope").err(), ENOENT);

  auto list = store->ListApiKeys();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_FALSE((*list)[0].active() && (*list)[1].active());

  EXPECT_EQ(store->CreateApiKey("x", -1, 0).status().err(), EINVAL);
  EXPECT_EQ(store->CreateApiKey("x", 0, -1).status().err(), EINVAL);

  // The secret is nowhere on disk.
  std::string secret = other->secret;
  store.reset();
  for (const char* suffix : {"", "-wal"}) {
    Result<std::string> bytes = ReadFile(path_ + suffix);
    if (!bytes.ok()) continue;
    EXPECT_EQ(bytes->find(secret), std::string::npos) << suffix;
    EXPECT_EQ(bytes->find(secret.substr(4)), std::string::npos) << suffix;
  }
}

// ---- audit ----

TEST_F(StoreTest, AuditAppendAndQuery) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  std::vector<int64_t> seqs;
  for (int i = 0; i < 20; ++i) {
    AuditEvent e;
    e.time = 1000 + i * 10;
    e.sandbox_id = i % 2 ? "sb_odd" : "sb_even";
    e.key_id = "key_a";
    e.type = i % 4 == 0 ? "sandbox.create" : "command.start";
    e.detail = {{"i", i}, {"cmd", "echo \"x\""}};
    auto seq = store->AppendAudit(e);
    ASSERT_TRUE(seq.ok()) << seq.status().message();
    if (!seqs.empty()) {
      EXPECT_GT(*seq, seqs.back());
    }
    seqs.push_back(*seq);
  }
  AuditEvent now_event;
  now_event.type = "auth.denied";
  now_event.detail = nullptr;  // counts as {}
  auto now_seq = store->AppendAudit(now_event);
  ASSERT_TRUE(now_seq.ok());

  AuditQuery q;
  q.sandbox_id = "sb_odd";
  auto r = store->QueryAudit(q);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->size(), 10u);
  for (const auto& e : *r) EXPECT_EQ(e.sandbox_id, "sb_odd");
  EXPECT_EQ((*r)[0].detail["i"], 1);
  EXPECT_EQ((*r)[0].detail["cmd"], "echo \"x\"");
  EXPECT_EQ((*r)[0].key_id, "key_a");

  q = {};
  q.type = "sandbox.create";
  r = store->QueryAudit(q);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->size(), 5u);

  q = {};
  q.since = 1050;
  q.until = 1100;  // i = 5..9
  r = store->QueryAudit(q);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->size(), 5u);
  EXPECT_EQ(r->front().time, 1050);
  EXPECT_EQ(r->back().time, 1090);

  // Paging with after_seq + limit.
  q = {};
  q.type = "command.start";
  q.limit = 4;
  std::vector<int64_t> paged;
  for (;;) {
    r = store->QueryAudit(q);
    ASSERT_TRUE(r.ok());
    if (r->empty()) break;
    EXPECT_LE(r->size(), 4u);
    for (const auto& e : *r) paged.push_back(e.seq);
    q.after_seq = r->back().seq;
  }
  EXPECT_EQ(paged.size(), 15u);
  EXPECT_TRUE(std::is_sorted(paged.begin(), paged.end()));

  // Newest first, paged with before_seq: the same events the other way round.
  q = {};
  q.type = "command.start";
  q.limit = 4;
  q.newest_first = true;
  std::vector<int64_t> backwards;
  for (;;) {
    r = store->QueryAudit(q);
    ASSERT_TRUE(r.ok());
    if (r->empty()) break;
    for (const auto& e : *r) backwards.push_back(e.seq);
    q.before_seq = r->back().seq;
  }
  EXPECT_EQ(backwards, std::vector<int64_t>(paged.rbegin(), paged.rend()));

  q = {};
  q.type = "auth.denied";
  r = store->QueryAudit(q);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->size(), 1u);
  EXPECT_GT(r->front().time, 1000000000000);  // stamped with now
  EXPECT_TRUE(r->front().detail.is_object());
  EXPECT_EQ(r->front().seq, *now_seq);

  AuditEvent bad;
  bad.type = "x";
  bad.detail = nlohmann::json::array({1, 2});
  EXPECT_EQ(store->AppendAudit(bad).status().err(), EINVAL);
  bad = {};
  EXPECT_EQ(store->AppendAudit(bad).status().err(), EINVAL);  // no type

  // Purging keeps seqs increasing.
  auto purged = store->PurgeAuditBefore(1100);
  ASSERT_TRUE(purged.ok());
  EXPECT_EQ(*purged, 10);
  AuditEvent after;
  after.type = "sandbox.kill";
  auto next = store->AppendAudit(after);
  ASSERT_TRUE(next.ok());
  EXPECT_GT(*next, *now_seq);
}

// A flood of one key's events must not hide another key's: the key filter is applied in SQL,
// before the limit.
TEST_F(StoreTest, AuditKeyFilterComesBeforeTheLimit) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  for (int i = 0; i < 500; ++i) {
    AuditEvent e;
    e.type = "command.start";
    e.key_id = "key_a";
    e.time = 1000 + i;
    ASSERT_TRUE(store->AppendAudit(e).ok());
    if (i % 150 == 100) {  // at 1100, 1250 and 1400
      e.key_id = "key_b";
      ASSERT_TRUE(store->AppendAudit(e).ok());
    }
  }
  AuditQuery q;
  q.key_id = "key_b";
  q.limit = 100;
  auto r = store->QueryAudit(q);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->size(), 3u);
  for (const auto& e : *r) EXPECT_EQ(e.key_id, "key_b");
  EXPECT_LT((*r)[0].seq, (*r)[1].seq);

  // Batched purge: at most max_rows per call, oldest first, until nothing is left to delete.
  auto first = store->PurgeAuditBefore(1250, 100);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(*first, 100);
  int64_t total = *first;
  for (;;) {
    auto n = store->PurgeAuditBefore(1250, 100);
    ASSERT_TRUE(n.ok());
    total += *n;
    if (*n < 100) break;
  }
  EXPECT_EQ(total, 250 + 1);  // key_a's 1000..1249 and key_b's at 1100
  EXPECT_EQ(store->PurgeAuditBefore(1250, -1).status().err(), EINVAL);
}

// ---- idempotency ----

TEST_F(StoreTest, IdempotencyKeys) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  IdempotencyRecord r{.key_id = "key_a", .key = "req-1", .request_hash = "h1", .sandbox_id = "sb1"};
  ASSERT_TRUE(store->PutIdempotency(r).ok());
  auto got = store->GetIdempotency("key_a", "req-1");
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->sandbox_id, "sb1");
  EXPECT_EQ((*got)->request_hash, "h1");
  EXPECT_GT((*got)->created_at, 0);

  IdempotencyRecord dup = r;
  dup.sandbox_id = "sb2";
  Status s = store->PutIdempotency(dup);
  EXPECT_EQ(s.err(), EEXIST) << s.message();
  EXPECT_EQ((*store->GetIdempotency("key_a", "req-1"))->sandbox_id, "sb1");

  // Keys are per API key.
  EXPECT_FALSE(store->GetIdempotency("key_b", "req-1")->has_value());
  IdempotencyRecord other = r;
  other.key_id = "key_b";
  EXPECT_TRUE(store->PutIdempotency(other).ok());

  // Older than 24 h: invisible, and purged by the next insert so the key can be reused.
  IdempotencyRecord old{.key_id = "key_a",
                        .key = "req-old",
                        .request_hash = "h0",
                        .sandbox_id = "sb0",
                        .created_at = NowMs() - kIdempotencyTtlMs - 1000};
  ASSERT_TRUE(store->PutIdempotency(old).ok());
  EXPECT_FALSE(store->GetIdempotency("key_a", "req-old")->has_value());
  old.created_at = 0;
  old.sandbox_id = "sb0-again";
  ASSERT_TRUE(store->PutIdempotency(old).ok());
  EXPECT_EQ((*store->GetIdempotency("key_a", "req-old"))->sandbox_id, "sb0-again");

  ASSERT_TRUE(store->DeleteIdempotency("key_a", "req-1").ok());
  EXPECT_FALSE(store->GetIdempotency("key_a", "req-1")->has_value());
  EXPECT_TRUE(store->DeleteIdempotency("key_a", "req-1").ok());
}

// ---- templates ----

TEST_F(StoreTest, RegistryIsSeededWithHostAndTheE2bDefaultNamesAsItsAliases) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  auto all = store->ListTemplates();
  ASSERT_TRUE(all.ok());
  std::map<std::string, TemplateRecord> by_name;
  for (const auto& t : *all) by_name[t.name] = t;
  ASSERT_TRUE(by_name.count("host"));
  EXPECT_EQ(by_name["host"].kind, kTemplateHost);
  for (const char* alias :
       {"base", "code-interpreter-v1", "code-interpreter-stateful", "desktop", "mcp-gateway"}) {
    ASSERT_TRUE(by_name.count(alias)) << alias;
    EXPECT_EQ(by_name[alias].kind, kTemplateAlias);
    EXPECT_EQ(by_name[alias].alias_of, "host");
  }
  EXPECT_EQ(all->size(), 6u);
  // host is protected by storage; the store protects it as the target of aliases.
  EXPECT_EQ(store->DeleteTemplate("host").err(), EBUSY);
}

TEST_F(StoreTest, TemplatesAreCheckedAgainstTheirLayersAndTargets) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  TemplateRecord t{.name = "alpine", .kind = kTemplateTar, .source = "/x.tar", .layers = {"l1"}};
  EXPECT_EQ(store->AddTemplate(t).err(), ENOENT);  // no such layer yet
  ASSERT_TRUE(store->PutLayer({.id = "l1", .size_bytes = 100}).ok());
  ASSERT_TRUE(store->AddTemplate(t).ok());
  EXPECT_EQ(store->AddTemplate(t).err(), EEXIST);
  auto got = store->GetTemplate("alpine");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->layers, std::vector<std::string>{"l1"});
  EXPECT_EQ((*got)->kind, kTemplateTar);
  EXPECT_GT((*got)->created_at, 0);
  EXPECT_EQ((*got)->runtime, "");  // the daemon's default
  t.runtime = "gvisor";
  ASSERT_TRUE(store->PutTemplate(t).ok());
  EXPECT_EQ((*store->GetTemplate("alpine"))->runtime, "gvisor");

  EXPECT_EQ(store->AddTemplate({.name = "x", .kind = "image"}).err(), EINVAL);
  EXPECT_EQ(store->AddTemplate({.name = "", .kind = kTemplateTar}).err(), EINVAL);
  EXPECT_EQ(store->AddTemplate({.name = "a", .kind = kTemplateAlias, .alias_of = "nope"}).err(),
            EINVAL);
  EXPECT_EQ(store->AddTemplate({.name = "a", .kind = kTemplateAlias, .alias_of = "base"}).err(),
            EINVAL);  // an alias of an alias
  ASSERT_TRUE(store->AddTemplate({.name = "a", .kind = kTemplateAlias, .alias_of = "alpine"}).ok());
  // The operator sets a template's runtime; an alias has its template's.
  ASSERT_TRUE(store->SetTemplateRuntime("alpine", "runc").ok());
  EXPECT_EQ((*store->GetTemplate("alpine"))->runtime, "runc");
  EXPECT_EQ(store->SetTemplateRuntime("a", "vm").err(), EINVAL);
  EXPECT_EQ(store->SetTemplateRuntime("alpine", "Bad name").err(), EINVAL);
  EXPECT_EQ(store->SetTemplateRuntime("nope", "vm").err(), ENOENT);
  ASSERT_TRUE(store->SetTemplateRuntime("alpine", "").ok());
  EXPECT_EQ((*store->GetTemplate("alpine"))->runtime, "");
  EXPECT_EQ(store->DeleteTemplate("alpine").err(), EBUSY);
  ASSERT_TRUE(store->DeleteTemplate("a").ok());
  ASSERT_TRUE(store->DeleteTemplate("alpine").ok());
  EXPECT_EQ(store->DeleteTemplate("alpine").err(), ENOENT);
}

TEST_F(StoreTest, TemplateOwnersKeepANameToTheKeyThatBuiltIt) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  auto a = store->ClaimTemplate("app", "key_a", "bld_1");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(store->ClaimTemplate("app", "key_b", "bld_2").status().err(), EPERM);
  auto again = store->ClaimTemplate("app", "key_a", "bld_3");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->build_id, "bld_3");
  EXPECT_EQ(again->created_at, a->created_at);
  // An operator may take it over; the row then names the operator's key.
  auto op = store->ClaimTemplate("app", "key_op", "bld_4", /*override=*/true);
  ASSERT_TRUE(op.ok());
  EXPECT_EQ(op->owner_key_id, "key_op");
  // Built-ins are nobody's to claim; the operator's own templates only with override.
  EXPECT_EQ(store->ClaimTemplate("host", "key_a", "bld_5").status().err(), EPERM);
  EXPECT_EQ(store->ClaimTemplate("base", "key_a", "bld_5", true).status().err(), EPERM);
  ASSERT_TRUE(store->PutLayer({.id = "l1", .size_bytes = 1}).ok());
  ASSERT_TRUE(store->AddTemplate({.name = "img", .kind = kTemplateTar, .layers = {"l1"}}).ok());
  EXPECT_EQ(store->ClaimTemplate("img", "key_a", "bld_6").status().err(), EPERM);
  EXPECT_TRUE(store->ClaimTemplate("img", "key_op", "bld_6", true).ok());
  EXPECT_EQ(store->ClaimTemplate("", "key_a", "bld_7").status().err(), EINVAL);

  ASSERT_TRUE(store->ClaimTemplate("web", "key_a", "bld_8").ok());
  auto mine = store->ListTemplateOwners("key_a");
  ASSERT_TRUE(mine.ok());
  ASSERT_EQ(mine->size(), 1u);
  EXPECT_EQ((*mine)[0].name, "web");
  auto all = store->ListTemplateOwners("");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 3u);
  ASSERT_TRUE(store->DeleteTemplateOwner("web").ok());
  ASSERT_TRUE(store->DeleteTemplateOwner("web").ok());  // missing is fine
  auto gone = store->GetTemplateOwner("web");
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->has_value());
}

TEST_F(StoreTest, UseTemplateFollowsAliasesAndPinsLayersWhileTheSandboxLives) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  ASSERT_TRUE(store->PutLayer({.id = "hostlayer", .size_bytes = 10}).ok());
  auto host = store->GetTemplate("host");
  ASSERT_TRUE(host.ok() && host->has_value());
  TemplateRecord h = **host;
  h.layers = {"hostlayer"};
  ASSERT_TRUE(store->PutTemplate(h).ok());

  auto used = store->UseTemplate("base", "sb1");
  ASSERT_TRUE(used.ok() && used->has_value());
  EXPECT_EQ((*used)->name, "host");
  EXPECT_EQ((*used)->layers, std::vector<std::string>{"hostlayer"});
  EXPECT_GT((*store->GetLayer("hostlayer"))->last_used_at, 0);
  EXPECT_FALSE(store->UseTemplate("nope", "sb1")->has_value());

  // Unregistered (the host moves to a new layer): the pin of sb1 keeps the old one while sb1 has
  // no record yet (a create in flight) and while it is live.
  ASSERT_TRUE(store->PutLayer({.id = "hostlayer2", .size_bytes = 10}).ok());
  h.layers = {"hostlayer2"};
  ASSERT_TRUE(store->PutTemplate(h).ok());
  EXPECT_TRUE(store->UnusedLayers()->empty());
  EXPECT_EQ(store->DeleteLayer("hostlayer").err(), EBUSY);
  ASSERT_TRUE(store->PutSandbox(Sandbox("sb1")).ok());
  EXPECT_TRUE(store->UnusedLayers()->empty());
  EXPECT_EQ(*store->LayerBytes(), 20);

  ASSERT_TRUE(store->PutSandbox(Sandbox("sb1", 0, kStateKilled)).ok());
  auto unused = store->UnusedLayers();
  ASSERT_TRUE(unused.ok());
  ASSERT_EQ(unused->size(), 1u);
  EXPECT_EQ((*unused)[0].id, "hostlayer");
  EXPECT_EQ(store->DeleteLayer("hostlayer2").err(), EBUSY);  // the host's
  ASSERT_TRUE(store->DeleteLayer("hostlayer").ok());
  EXPECT_EQ(store->DeleteLayer("hostlayer").err(), ENOENT);
  EXPECT_EQ(*store->LayerBytes(), 10);
}

TEST_F(StoreTest, OrphanPinsAreDroppedAndUnusedLayersComeLeastRecentlyUsedFirst) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  ASSERT_TRUE(store->PutLayer({.id = "old", .size_bytes = 1, .last_used_at = 100}).ok());
  ASSERT_TRUE(store->PutLayer({.id = "new", .size_bytes = 1, .last_used_at = 200}).ok());
  ASSERT_TRUE(store->AddTemplate({.name = "t", .kind = kTemplateDir, .layers = {"old"}}).ok());
  ASSERT_TRUE(store->UseTemplate("t", "ghost").ok());  // a create that died before its record
  ASSERT_TRUE(store->DeleteTemplate("t").ok());
  EXPECT_EQ(store->UnusedLayers()->size(), 1u);  // "old" is held by the pin of "ghost"
  EXPECT_EQ(*store->DropOrphanPins(), 1);
  auto unused = store->UnusedLayers();
  ASSERT_TRUE(unused.ok());
  ASSERT_EQ(unused->size(), 2u);
  EXPECT_EQ((*unused)[0].id, "new");  // "old" was used (by "ghost") after "new" was made
  ASSERT_TRUE(store->UnpinLayers("ghost").ok());
}

// A layer a key's sandbox saved (a snapshot's, a pause without memory's) is charged to that key
// while it is in use, whoever uses it; an unused one (the cache's to evict) is not. The key's
// bound of it is recorded with the key.
TEST_F(StoreTest, ASavedLayerIsChargedToItsKeyWhileItIsInUse) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  auto key = store->CreateApiKey("saver", 0, 0, false, {}, 3000);
  ASSERT_TRUE(key.ok()) << key.status().message();
  EXPECT_EQ((*store->GetApiKey(key->record.id))->max_saved_bytes, 3000);
  EXPECT_EQ(store->CreateApiKey("bad", 0, 0, false, {}, -1).status().err(), EINVAL);
  const std::string& k = key->record.id;
  ASSERT_TRUE(store->PutSandbox(Sandbox("sb1")).ok());
  ASSERT_TRUE(
      store->PutLayer({.id = "disk-sb1-a", .size_bytes = 100, .owner_key_id = k}, "sb1").ok());
  ASSERT_TRUE(store->PutLayer({.id = "snap-b", .size_bytes = 20, .owner_key_id = k}).ok());
  ASSERT_TRUE(store->PutLayer({.id = "shared", .size_bytes = 5}, "sb1").ok());
  EXPECT_EQ(*store->LayerBytesOwnedBy(k), 100);  // snap-b: nothing uses it
  ASSERT_TRUE(
      store->AddTemplate({.name = "snap-b", .kind = kTemplateSnapshot, .layers = {"snap-b"}}).ok());
  EXPECT_EQ(*store->LayerBytesOwnedBy(k), 120);
  EXPECT_EQ(*store->LayerBytesOwnedBy("key_other"), 0);
  EXPECT_EQ(store->LayerBytesOwnedBy("").status().err(), EINVAL);
  // Its owner is the first one's: the same layer put again is not another key's.
  ASSERT_TRUE(
      store->PutLayer({.id = "snap-b", .size_bytes = 30, .owner_key_id = "key_other"}).ok());
  EXPECT_EQ((*store->GetLayer("snap-b"))->owner_key_id, k);
  EXPECT_EQ(*store->LayerBytesOwnedBy(k), 130);
  // The sandbox ends: its pause layer is unused, and no longer charged.
  ASSERT_TRUE(store->PutSandbox(Sandbox("sb1", 0, kStateKilled)).ok());
  EXPECT_EQ(*store->LayerBytesOwnedBy(k), 30);
}

// A key's snapshots are counted as they are claimed, in the claim's transaction: at its bound the
// next is EDQUOT; a name given to a snapshot, or a build's row, is no snapshot.
TEST_F(StoreTest, SnapshotsAreClaimedWithinTheKeysCount) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  const std::string snap_a = "snap-" + std::string(20, 'a'),
                    snap_b = "snap-" + std::string(20, 'b'),
                    snap_c = "snap-" + std::string(20, 'c');
  ASSERT_TRUE(store->ClaimSnapshot(snap_a, "key_k", 2).ok());
  ASSERT_TRUE(store->ClaimTemplate("my-env", "key_k", snap_a).ok());  // a name of it
  ASSERT_TRUE(store->ClaimTemplate("built", "key_k", "bld_1").ok());  // a build
  EXPECT_EQ(store->ClaimSnapshot(snap_a, "key_k", 2).err(), EEXIST);
  ASSERT_TRUE(store->ClaimSnapshot(snap_b, "key_k", 2).ok());
  EXPECT_EQ(*store->CountSnapshots("key_k"), 2);
  Status over = store->ClaimSnapshot(snap_c, "key_k", 2);
  EXPECT_EQ(over.err(), EDQUOT) << over.message();
  EXPECT_TRUE(store->ClaimSnapshot(snap_c, "key_other", 2).ok());  // another key's count
  ASSERT_TRUE(store->DeleteTemplateOwner(snap_c).ok());
  ASSERT_TRUE(store->DeleteTemplateOwner(snap_a).ok());
  EXPECT_TRUE(store->ClaimSnapshot(snap_c, "key_k", 2).ok());
  EXPECT_TRUE(store->ClaimSnapshot(snap_a, "key_k", 0).ok());  // 0: no bound
  auto k = store->CreateApiKey("counted", 0, 0, false, {}, 0, 7);
  ASSERT_TRUE(k.ok()) << k.status().message();
  EXPECT_EQ((*store->GetApiKey(k->record.id))->max_snapshots, 7);
}

// A file of version 17 gets the owners of the saved layers it holds: a snapshot's from its
// template's owner row, a pause's from its sandbox.
TEST_F(StoreTest, AVersionSeventeenFileChargesItsSavedLayersToTheirKeys) {
  ASSERT_NO_FATAL_FAILURE(
      MakeFileAtVersion(17,
                        "INSERT INTO sandboxes (id, state, owner_key_id, created_at, "
                        "updated_at) VALUES ('sbx1', 'paused', 'key_a', 1, 1);"
                        "INSERT INTO template_owners (name, owner_key_id, created_at, "
                        "updated_at) VALUES ('snap-one', 'key_b', 1, 1);"
                        "INSERT INTO template_layers (id, size_bytes, created_at) VALUES "
                        "('snap-one', 7, 1), ('disk-sbx1-abc', 11, 1), ('disk-gone-x', 13, 1),"
                        " ('sha256-cc', 17, 1)"));
  auto store = OpenStore();
  ASSERT_TRUE(store);
  EXPECT_EQ((*store->GetLayer("snap-one"))->owner_key_id, "key_b");
  EXPECT_EQ((*store->GetLayer("disk-sbx1-abc"))->owner_key_id, "key_a");
  EXPECT_EQ((*store->GetLayer("disk-gone-x"))->owner_key_id, "");
  EXPECT_EQ((*store->GetLayer("sha256-cc"))->owner_key_id, "");
}

// Whether a layer is in use is read from indexes: template_layer_refs, which triggers keep as
// templates are added, changed, renamed and deleted, and layer_pins. With a scan of every
// template's layers instead, a key's thousands of snapshots slowed every other key's creates,
// evictions and quota checks (quadratically, under the store's lock).
TEST_F(StoreTest, WhetherALayerIsInUseIsAnIndexLookup) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  for (const char* id : {"l1", "l2", "l3"}) ASSERT_TRUE(store->PutLayer({.id = id}).ok());
  ASSERT_TRUE(store->AddTemplate({.name = "a", .kind = kTemplateDir, .layers = {"l1", "l2"}}).ok());
  ASSERT_TRUE(store->AddTemplate({.name = "b", .kind = kTemplateDir, .layers = {"l2"}}).ok());
  auto db = Db::Open(path_);
  ASSERT_TRUE(db.ok());
  auto refs = [&] {
    std::vector<std::string> out;
    auto st = (*db)->Prepare(
        "SELECT template_name || ':' || layer_id FROM template_layer_refs ORDER BY 1");
    EXPECT_TRUE(st.ok());
    while (st.ok() && *st->Step()) out.push_back(st->ColumnText(0));
    return out;
  };
  auto unused = [&] {
    std::vector<std::string> out;
    auto layers = store->UnusedLayers();
    EXPECT_TRUE(layers.ok());
    for (const LayerRecord& l : *layers) out.push_back(l.id);
    std::sort(out.begin(), out.end());
    return out;
  };
  EXPECT_EQ(refs(), (std::vector<std::string>{"a:l1", "a:l2", "b:l2"}));
  EXPECT_EQ(unused(), std::vector<std::string>{"l3"});
  ASSERT_TRUE(store->PutTemplate({.name = "a", .kind = kTemplateDir, .layers = {"l3"}}).ok());
  EXPECT_EQ(refs(), (std::vector<std::string>{"a:l3", "b:l2"}));
  EXPECT_EQ(unused(), std::vector<std::string>{"l1"});
  ASSERT_TRUE((*db)->Exec("UPDATE templates SET name = 'c' WHERE name = 'b'").ok());
  EXPECT_EQ(refs(), (std::vector<std::string>{"a:l3", "c:l2"}));
  ASSERT_TRUE(store->DeleteTemplate("c").ok());
  EXPECT_EQ(refs(), std::vector<std::string>{"a:l3"});
  EXPECT_EQ(unused(), (std::vector<std::string>{"l1", "l2"}));
  EXPECT_EQ(store->DeleteLayer("l3").err(), EBUSY);
  ASSERT_TRUE(store->DeleteLayer("l2").ok());

  // The plan: each EXISTS is a search of an index; no table is scanned but template_layers.
  auto plan = (*db)->Prepare(std::string("EXPLAIN QUERY PLAN SELECT id FROM template_layers l"
                                         " WHERE NOT ") +
                             kLayerInUse);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  std::vector<std::string> scans, searches;
  while (*plan->Step()) {
    std::string detail = plan->ColumnText(3);
    if (detail.rfind("SCAN ", 0) == 0) scans.push_back(detail);
    if (detail.rfind("SEARCH ", 0) == 0) searches.push_back(detail);
  }
  ASSERT_EQ(scans.size(), 1u) << ::testing::PrintToString(scans);
  EXPECT_TRUE(scans[0] == "SCAN l" || scans[0].rfind("SCAN l USING ", 0) == 0) << scans[0];
  EXPECT_EQ(searches.size(), 3u) << ::testing::PrintToString(searches);
  for (const std::string& s : searches) EXPECT_NE(s.find("USING"), std::string::npos) << s;
}

// A file of version 18 gets the references of the templates it holds.
TEST_F(StoreTest, AVersionEighteenFileKnowsWhichTemplatesListItsLayers) {
  ASSERT_NO_FATAL_FAILURE(
      MakeFileAtVersion(18,
                        "INSERT INTO template_layers (id, size_bytes, created_at) VALUES "
                        "('l1', 1, 1), ('l2', 1, 1), ('l3', 1, 1);"
                        "INSERT INTO templates (name, kind, layers, created_at) VALUES "
                        "('t', 'dir', '[\"l1\", \"l2\"]', 1)"));
  auto store = OpenStore();
  ASSERT_TRUE(store);
  auto unused = store->UnusedLayers();
  ASSERT_TRUE(unused.ok());
  ASSERT_EQ(unused->size(), 1u);
  EXPECT_EQ((*unused)[0].id, "l3");
  ASSERT_TRUE(store->DeleteTemplate("t").ok());
  EXPECT_EQ(store->UnusedLayers()->size(), 3u);
}

TEST_F(StoreTest, ImageTemplatesKeepTheirConfigAndLeasePinsSurviveOrphanDrops) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  ASSERT_TRUE(store->PutLayer({.id = "sha256-aa", .size_bytes = 10}, "bld_one").ok());
  ASSERT_TRUE(store->PutLayer({.id = "sha256-bb", .size_bytes = 20}).ok());
  EXPECT_EQ(store->PinLayer("pull_two", "missing").err(), ENOENT);
  ASSERT_TRUE(store->PinLayer("pull_two", "sha256-bb").ok());
  ASSERT_TRUE(store->PinLayer("ghost", "sha256-bb").ok());  // a create that died
  auto owners = store->LeasePinOwners();
  ASSERT_TRUE(owners.ok());
  EXPECT_EQ(*owners, (std::vector<std::string>{"bld_one", "pull_two"}));
  EXPECT_EQ(*store->DropOrphanPins(), 1);  // only "ghost"
  auto unused = store->UnusedLayers();
  ASSERT_TRUE(unused.ok());
  EXPECT_TRUE(unused->empty());
  ASSERT_TRUE(store->UnpinLayers("bld_one").ok());
  unused = store->UnusedLayers();
  ASSERT_TRUE(unused.ok());
  ASSERT_EQ(unused->size(), 1u);
  EXPECT_EQ((*unused)[0].id, "sha256-aa");

  // A snapshot records the sandbox it was taken of (version 15).
  TemplateRecord snap{.name = "snap-x", .kind = kTemplateSnapshot, .layers = {"sha256-bb"}};
  snap.sandbox_id = "sb_1";
  ASSERT_TRUE(store->AddTemplate(snap).ok());
  EXPECT_EQ((*store->GetTemplate("snap-x"))->sandbox_id, "sb_1");
  ASSERT_TRUE(store->DeleteTemplate("snap-x").ok());

  TemplateRecord t{.name = "py", .kind = kTemplateOci, .source = "oci", .layers = {"sha256-bb"}};
  t.config = "[1]";
  EXPECT_EQ(store->AddTemplate(t).err(), EINVAL);
  t.config = R"({"env":["A=1"],"user":"1000"})";
  ASSERT_TRUE(store->AddTemplate(t).ok());
  t.kind = kTemplateBuild;
  t.config = R"({"user":"2"})";
  ASSERT_TRUE(store->PutTemplate(t).ok());
  auto got = store->GetTemplate("py");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->kind, kTemplateBuild);
  EXPECT_EQ((*got)->config, R"({"user":"2"})");
}

// ---- crashes and concurrency ----

// A child writes in a loop, half through Store calls and half in 50-row transactions, reporting
// each commit over a pipe, and is SIGKILLed while writing. With `hang_in_big_transaction` it
// stops after 40 commits inside a transaction large enough to spill uncommitted pages into the
// WAL, so the kill is certainly mid-transaction; otherwise the kill lands wherever the loop is.
// The reopened database must be intact, hold every commit the child reported, hold each batch
// entirely or not at all, and hold nothing of the unfinished transaction.
void CrashChildAndCheck(const std::string& path, bool hang_in_big_transaction) {
  { ASSERT_TRUE(Store::Open(path).ok()); }
  constexpr int32_t kMid = -1;
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    auto store = Store::Open(path);
    auto db = Db::Open(path);
    if (!store.ok() || !db.ok()) ::_exit(1);
    for (int32_t b = 1;; ++b) {
      SandboxRecord r;
      r.id = "crash-" + std::to_string(b);
      r.state = kStateRunning;
      r.created_at = b;
      if (!(*store)->PutSandbox(r).ok()) ::_exit(2);
      auto tx = Transaction::Begin(**db);
      if (!tx.ok()) ::_exit(3);
      auto st = (*db)->Prepare(
          "INSERT INTO audit_events (time, sandbox_id, type, detail) VALUES (?1, ?2, ?3, ?4)");
      if (!st.ok()) ::_exit(4);
      bool big = hang_in_big_transaction && b > 40;
      std::string detail = big ? "{\"pad\":\"" + std::string(1000, 'p') + "\"}" : "{}";
      for (int i = 0; i < (big ? 10000 : 50); ++i) {
        st->Reset();
        st->BindInt(1, b)
            .BindText(2, "batch-" + std::to_string(b))
            .BindText(3, big ? "big" : "crash")
            .BindText(4, detail);
        if (!st->Run().ok()) ::_exit(5);
      }
      if (big) {
        if (::write(fds[1], &kMid, sizeof kMid) != sizeof kMid) ::_exit(7);
        for (;;) ::pause();
      }
      if (!tx->Commit().ok()) ::_exit(6);
      if (::write(fds[1], &b, sizeof b) != sizeof b) ::_exit(7);
    }
  }
  ::close(fds[1]);
  int32_t reported = 0;
  for (;;) {
    int32_t b;
    ssize_t n = ::read(fds[0], &b, sizeof b);
    ASSERT_EQ(n, static_cast<ssize_t>(sizeof b)) << "child stopped early";
    if (b == kMid) break;
    reported = b;
    if (!hang_in_big_transaction && reported >= 40) break;
  }
  if (hang_in_big_transaction) {
    // The uncommitted transaction really reached the WAL file.
    struct stat st;
    ASSERT_EQ(::stat((path + "-wal").c_str(), &st), 0);
    EXPECT_GT(st.st_size, 4 << 20);
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with " << WEXITSTATUS(status);
  int32_t b;
  while (::read(fds[0], &b, sizeof b) == sizeof b) reported = b;  // reports still in the pipe
  ::close(fds[0]);

  auto store = Store::Open(path);
  ASSERT_TRUE(store.ok()) << store.status().message();
  EXPECT_TRUE((*store)->CheckIntegrity().ok());
  auto db = Db::Open(path);
  ASSERT_TRUE(db.ok());
  EXPECT_EQ(*(*db)->QueryText("PRAGMA integrity_check"), "ok");
  for (int32_t i = 1; i <= reported; ++i) {
    auto got = (*store)->GetSandbox("crash-" + std::to_string(i));
    ASSERT_TRUE(got.ok());
    EXPECT_TRUE(got->has_value()) << "committed sandbox " << i << " lost";
  }
  auto st = (*db)->Prepare(
      "SELECT sandbox_id, count(*) FROM audit_events WHERE type = 'crash' GROUP BY sandbox_id");
  ASSERT_TRUE(st.ok());
  int batches = 0;
  for (;;) {
    auto row = st->Step();
    ASSERT_TRUE(row.ok());
    if (!*row) break;
    ++batches;
    EXPECT_EQ(st->ColumnInt(1), 50) << st->ColumnText(0) << " is a partial batch";
  }
  EXPECT_GE(batches, reported);
  EXPECT_LE(batches, reported + 1);  // at most one commit the child had no time to report
  EXPECT_EQ(*(*db)->QueryText("SELECT count(*) FROM audit_events WHERE type = 'big'"), "0");
}

TEST_F(StoreTest, SurvivesSigkillAnywhereInWriteLoop) { CrashChildAndCheck(path_, false); }

TEST_F(StoreTest, SurvivesSigkillInsideLargeTransaction) { CrashChildAndCheck(path_, true); }

TEST_F(StoreTest, ConcurrentWritersAllLand) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  constexpr int kThreads = 4;
  constexpr int kPerThread = 200;
  std::atomic<int> failures{0};
  std::vector<std::vector<int64_t>> seqs(kThreads);
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        std::string id = "t" + std::to_string(t) + "-" + std::to_string(i);
        if (!store->PutSandbox(Sandbox(id)).ok()) ++failures;
        AuditEvent e;
        e.type = "sandbox.create";
        e.sandbox_id = id;
        auto seq = store->AppendAudit(e);
        if (!seq.ok()) {
          ++failures;
        } else {
          seqs[t].push_back(*seq);
        }
        if (i % 50 == 0 && !store->ListSandboxes({}).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(*store->CountSandboxes("", {}), kThreads * kPerThread);
  std::set<int64_t> all;
  for (const auto& v : seqs) all.insert(v.begin(), v.end());
  EXPECT_EQ(all.size(), static_cast<size_t>(kThreads * kPerThread));
  AuditQuery q;
  q.limit = 10000;
  EXPECT_EQ(store->QueryAudit(q)->size(), static_cast<size_t>(kThreads * kPerThread));
}

}  // namespace
}  // namespace sbx::store

namespace sbx::store {
namespace {

TEST_F(StoreTest, IdSlotsAreLowestFreeIdempotentAndSharedBetweenOpeners) {
  auto a = OpenStore();
  auto b = OpenStore();  // another process on the same file (sbx run beside sbx serve)
  EXPECT_EQ(a->AcquireIdSlot("box-a", 3).value(), 0);
  EXPECT_EQ(b->AcquireIdSlot("box-b", 3).value(), 1);
  EXPECT_EQ(a->AcquireIdSlot("box-a", 3).value(), 0) << "the same box keeps its slot";
  EXPECT_EQ(a->AcquireIdSlot("box-c", 3).value(), 2);
  auto full = b->AcquireIdSlot("box-d", 3);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().err(), ENOSPC);
  ASSERT_TRUE(b->ReleaseIdSlot("box-a").ok());
  ASSERT_TRUE(b->ReleaseIdSlot("box-a").ok()) << "releasing twice is fine";
  EXPECT_EQ(a->AcquireIdSlot("box-d", 3).value(), 0) << "the lowest free slot is reused";
  auto slots = a->ListIdSlots();
  ASSERT_TRUE(slots.ok());
  ASSERT_EQ(slots->size(), 3u);
  EXPECT_EQ((*slots)[0].box_id, "box-d");
  EXPECT_EQ((*slots)[1].box_id, "box-b");
  EXPECT_GT((*slots)[1].allocated_at, 0);
  EXPECT_FALSE(a->AcquireIdSlot("", 3).ok());
}

TEST_F(StoreTest, SandboxRecordKeepsItsIdBase) {
  auto store = OpenStore();
  SandboxRecord r;
  r.id = "sb1";
  r.state = kStateRunning;
  r.id_base = 0x10010000;
  r.idmapped = true;
  ASSERT_TRUE(store->PutSandbox(r).ok());
  auto got = store->GetSandbox("sb1");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->id_base, 0x10010000);
  EXPECT_TRUE((*got)->idmapped);
}

}  // namespace
}  // namespace sbx::store

namespace sbx::store {
namespace {

// A real full disk (a tmpfs filled to the last byte): the store says it cannot write, names
// the error, and says it can again after the first write that succeeds.
TEST_F(StoreTest, WriteHealthNamesAFullDiskAndClearsWithTheNextWrite) {
  SmallFs fs(dir_ + "/data", 2 << 20);
  ASSERT_TRUE(fs.mounted());
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->PutSandbox(Sandbox("sb1")).ok());
  EXPECT_TRUE(store->WriteHealth().ok());

  fs.Fill();
  int64_t filled_at = NowMs();
  Status put = store->PutSandbox(Sandbox("sb2"));
  ASSERT_FALSE(put.ok());
  EXPECT_EQ(put.err(), ENOSPC) << put.message();
  WriteHealth h = store->WriteHealth();
  EXPECT_FALSE(h.ok());
  EXPECT_EQ(h.error.err(), ENOSPC) << h.error.message();
  EXPECT_GE(h.failing_since, filled_at);
  // Reads still work, and a write refused for its input says nothing about the disk.
  auto got = store->GetSandbox("sb1");
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->has_value());
  EXPECT_FALSE(store->PutSandbox(Sandbox("")).ok());
  EXPECT_EQ(store->WriteHealth().failing_since, h.failing_since);
  // The probe needs real space too.
  EXPECT_FALSE(store->CheckWritable(0).ok());
  AuditEvent e;
  e.type = "x";
  EXPECT_EQ(store->AppendAudit(e).status().err(), ENOSPC);

  fs.Free();
  EXPECT_FALSE(store->WriteHealth().ok());  // nothing has written since
  // Within the probe interval the last failure stands; past it the probe finds out.
  EXPECT_FALSE(store->CheckWritable(int64_t{1} << 40).ok());
  WriteHealth again = store->CheckWritable(0);
  EXPECT_TRUE(again.ok()) << again.error.message();
  EXPECT_EQ(again.failing_since, 0);
  auto probe_row = store->GetIdempotency("", "sbx write probe");
  ASSERT_TRUE(probe_row.ok());
  EXPECT_FALSE(probe_row->has_value());  // the probe leaves nothing behind
  // A real write clears a failure as well.
  fs.Fill();
  EXPECT_FALSE(store->PutSandbox(Sandbox("sb3")).ok());
  EXPECT_FALSE(store->WriteHealth().ok());
  fs.Free();
  EXPECT_TRUE(store->PutSandbox(Sandbox("sb3")).ok());
  EXPECT_TRUE(store->WriteHealth().ok());
}

}  // namespace
}  // namespace sbx::store
