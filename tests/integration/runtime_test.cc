// The native runtime through its own interface: create, freeze, thaw, stats, destroy, and a
// creation that fails halfway. Real namespaces, cgroups and mounts; host-side checks after each.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fd.h"
#include "common/fs.h"
#include "protocol/client.h"
#include "runtime/native/native_runtime.h"
#include "storage/template.h"
#include "store/store.h"

namespace sbx::runtime {
namespace {

using protocol::Tag;
using protocol::Type;

class RuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-runtime-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    ASSERT_EQ(::chmod(tmpl, 0711), 0);
    dir_ = tmpl;
    NativeConfig cfg;
    cfg.run_dir = dir_ + "/run";
    cfg.agent_path = SBX_AGENT_BIN;
    cfg.cgroup_parent = "sbx-runtime-test-" + std::to_string(::getpid());
    auto rt = NativeRuntime::Open(cfg);
    ASSERT_TRUE(rt.ok()) << rt.status().message();
    rt_ = std::move(rt).value();
    auto st = store::Store::Open(dir_ + "/sbx.db");
    ASSERT_TRUE(st.ok()) << st.status().message();
    storage::TemplateStore ts;
    ts.dir = dir_ + "/templates";
    ts.shifted_copy_base = cfg.id_base;
    auto t = storage::ResolveTemplate(ts, **st, "host", "");
    ASSERT_TRUE(t.ok()) << t.status().message();
    tmpl_ = *t;
  }

  void TearDown() override {
    // Nothing of any box is left: directories, mounts, cgroups.
    if (DIR* d = ::opendir((dir_ + "/run").c_str())) {
      while (dirent* e = ::readdir(d)) {
        std::string n = e->d_name;
        EXPECT_TRUE(n == "." || n == "..") << "leaked box directory " << n;
      }
      ::closedir(d);
    }
    auto mounts = ReadFile("/proc/self/mountinfo");
    ASSERT_TRUE(mounts.ok());
    EXPECT_EQ(mounts->find(dir_), std::string::npos);
    for (const auto& [controller, parent] : rt_->cgroup_host().v1_dirs) {
      EXPECT_EQ(::rmdir(parent.c_str()) == 0 || errno == ENOENT, true)
          << "cgroup left in " << parent;
    }
    if (!rt_->cgroup_host().v2_dir.empty()) ::rmdir(rt_->cgroup_host().v2_dir.c_str());
    RemoveTree(dir_);
  }

  BoxSpec Spec() {
    BoxSpec spec;
    spec.id = RandomId();
    spec.layers = tmpl_.layers;
    spec.binds = tmpl_.binds;
    spec.limits.memory_bytes = 256 << 20;
    spec.limits.pids = 64;
    return spec;
  }

  std::string dir_;
  std::unique_ptr<NativeRuntime> rt_;
  storage::Template tmpl_;
};

TEST_F(RuntimeTest, CreateFreezeThawStatsDestroy) {
  auto box = rt_->Create(Spec());
  ASSERT_TRUE(box.ok()) << box.status().message();
  EXPECT_GT(box->init_pid, 0);
  auto conn = protocol::AgentConnection::Connect(box->agent_socket);
  ASSERT_TRUE(conn.ok()) << conn.status().message();
  protocol::Writer w;
  w.Str(Tag::kArgv, "sleep").Str(Tag::kArgv, "60").Str(Tag::kEnv, "PATH=/usr/bin:/bin");
  auto spawned = conn->Call(Type::kSpawn, w);
  ASSERT_TRUE(spawned.ok()) << spawned.status().message();

  auto stats = rt_->Stats(*box);
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  EXPECT_GE(stats->pids_current, 2u);  // the agent and sleep
  EXPECT_GT(stats->memory_current, 0u);

  ASSERT_TRUE(rt_->Freeze(*box).ok());
  // A frozen agent cannot answer.
  auto frozen = conn->Call(Type::kListProcs, protocol::Writer(), nullptr, 300);
  EXPECT_FALSE(frozen.ok());
  ASSERT_TRUE(rt_->Thaw(*box).ok());
  std::vector<protocol::Frame> procs;
  // The request sent while frozen is answered first, then ours.
  auto listed = conn->Call(Type::kListProcs, protocol::Writer(), &procs, 5000);
  ASSERT_TRUE(listed.ok()) << listed.status().message();
  EXPECT_GE(procs.size(), 1u);

  pid_t init = box->init_pid;
  ASSERT_TRUE(rt_->Destroy(*box).ok());
  EXPECT_NE(::kill(init, 0), 0);
  EXPECT_TRUE(rt_->Destroy(*box).ok()) << "Destroy is idempotent";
}

TEST_F(RuntimeTest, FailedCreateLeavesNothing) {
  BoxSpec spec = Spec();
  spec.layers = {dir_ + "/no-such-layer"};
  auto box = rt_->Create(spec);
  ASSERT_FALSE(box.ok());
  EXPECT_NE(box.status().message().find("mount overlay on /"), std::string::npos)
      << box.status().message();
  // TearDown checks directories, mounts and cgroups.
}

TEST_F(RuntimeTest, BadSpecIsRejectedBeforeAnythingIsMade) {
  BoxSpec spec = Spec();
  spec.id = "../escape";
  EXPECT_FALSE(rt_->Create(spec).ok());
  spec.id = "ok";
  spec.layers.clear();
  EXPECT_FALSE(rt_->Create(spec).ok());
  spec = Spec();
  spec.limits.memory_bytes = 1024;  // below any sane minimum
  auto box = rt_->Create(spec);
  EXPECT_FALSE(box.ok());
}

TEST_F(RuntimeTest, TwoBoxesCannotSeeEachOther) {
  auto a = rt_->Create(Spec());
  auto b = rt_->Create(Spec());
  ASSERT_TRUE(a.ok() && b.ok());
  auto ca = protocol::AgentConnection::Connect(a->agent_socket);
  ASSERT_TRUE(ca.ok());
  // Each box's pid namespace holds only its own agent (pid 1) and what it spawned.
  protocol::Writer w;
  // Not `ls | grep`: ls may read /proc before the shell has forked grep.
  w.Str(Tag::kArgv, "/bin/sh")
      .Str(Tag::kArgv, "-c")
      .Str(Tag::kArgv, "ls /proc > /tmp/pids; grep -c '^[0-9]' /tmp/pids");
  auto r = ca->Call(Type::kSpawn, w);
  ASSERT_TRUE(r.ok());
  std::string out;
  for (;;) {
    auto f = ca->Receive(5000);
    ASSERT_TRUE(f.ok());
    if (f->type() == Type::kOutput) out += f->fields.Str(Tag::kData);
    if (f->type() == Type::kExit) break;
  }
  EXPECT_EQ(out, "3\n");  // the agent, sh and ls: nothing of box b or the host
  EXPECT_TRUE(rt_->Destroy(*a).ok());
  EXPECT_TRUE(rt_->Destroy(*b).ok());
}

// Threat 24: the agent's file API resolves every path inside the box's own root, so traversal,
// absolute paths and symlinks pointing out all stay in the box.
TEST_F(RuntimeTest, FileApiStaysInsideTheBox) {
  // A host file the box must never reach.
  std::string secret = dir_ + "/host-secret";
  ASSERT_TRUE(WriteFile(secret, "host secret").ok());
  auto box = rt_->Create(Spec());
  ASSERT_TRUE(box.ok()) << box.status().message();
  auto conn = protocol::AgentConnection::Connect(box->agent_socket);
  ASSERT_TRUE(conn.ok());
  auto read = [&](const std::string& path) -> Result<std::string> {
    std::vector<protocol::Frame> data;
    auto r = conn->Call(Type::kRead, protocol::Writer().Str(Tag::kPath, path), &data);
    if (!r.ok()) return r.status();
    std::string out;
    for (const auto& f : data) out += f.fields.Str(Tag::kData);
    return out;
  };
  for (const std::string& p : {"/../../../../" + secret, secret, "../../" + secret.substr(1),
                               "/proc/1/root/../../" + secret}) {
    auto r = read(p);
    EXPECT_FALSE(r.ok()) << p << " read " << (r.ok() ? *r : "");
  }
  // /etc/passwd by traversal is the box's own, not the host's.
  auto passwd = read("/../../etc/passwd");
  ASSERT_TRUE(passwd.ok());
  EXPECT_EQ(passwd->find("postgres"), std::string::npos);
  EXPECT_NE(passwd->find("user:x:1000"), std::string::npos);
  // A symlink pointing out resolves inside the box: a write through it lands in the box.
  protocol::Writer sym;
  sym.Str(Tag::kArgv, "/bin/ln")
      .Str(Tag::kArgv, "-s")
      .Str(Tag::kArgv, secret)
      .Str(Tag::kArgv, "/tmp/out");
  ASSERT_TRUE(conn->Call(Type::kSpawn, sym).ok());
  for (;;) {
    auto f = conn->Receive(5000);
    ASSERT_TRUE(f.ok());
    if (f->type() == Type::kExit) break;
  }
  EXPECT_FALSE(read("/tmp/out").ok());
  uint32_t id = conn->NextId();
  ASSERT_TRUE(conn->CallWithId(Type::kWriteBegin, id,
                               protocol::Writer().Str(Tag::kPath, "/tmp/out").Int(Tag::kParents, 1))
                  .ok());
  ASSERT_TRUE(conn->Send(Type::kWriteData, id, protocol::Writer().Str(Tag::kData, "pwned")).ok());
  (void)conn->CallWithId(Type::kWriteEnd, id, protocol::Writer());
  EXPECT_EQ(*ReadFile(secret), "host secret");
  EXPECT_TRUE(rt_->Destroy(*box).ok());
}

TEST_F(RuntimeTest, AnotherRuntimeAdoptsABoxOnlyOnceItsOwnerIsGone) {
  auto box = rt_->Create(Spec());
  ASSERT_TRUE(box.ok());
  NativeConfig cfg = rt_->config();
  auto other = NativeRuntime::Open(cfg);
  ASSERT_TRUE(other.ok());
  // Our runtime holds the owner lock: the other one cannot take the box.
  auto taken = (*other)->Adopt(box->id);
  ASSERT_FALSE(taken.ok());
  EXPECT_EQ(taken.status().err(), EBUSY);
  auto ids = (*other)->ListBoxes();
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, std::vector<std::string>{box->id});
  EXPECT_TRUE(rt_->Destroy(*box).ok());
  auto gone = (*other)->Adopt(box->id);
  EXPECT_FALSE(gone.ok());
}

TEST_F(RuntimeTest, OrphansOfADeadOwnerAreReaped) {
  // A box whose owner lock is not held by anyone is an orphan; one we own is not.
  auto mine = rt_->Create(Spec());
  ASSERT_TRUE(mine.ok());
  auto reaped = rt_->ReapOrphans("run");
  ASSERT_TRUE(reaped.ok());
  EXPECT_EQ(*reaped, 0);
  struct stat st;
  EXPECT_EQ(::stat(mine->dir.c_str(), &st), 0);
  EXPECT_TRUE(rt_->Destroy(*mine).ok());
}

}  // namespace
}  // namespace sbx::runtime
