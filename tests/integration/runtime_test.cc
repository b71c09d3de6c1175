// The native runtime through its own interface: create, freeze, thaw, stats, destroy, and a
// creation that fails halfway. Real namespaces, cgroups and mounts; host-side checks after each.
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <linux/nsfs.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <iostream>

#include "common/fd.h"
#include "common/fs.h"
#include "protocol/client.h"
#include "runtime/native/box_owners.h"
#include "common/btrfs.h"
#include "runtime/native/native_runtime.h"
#include "sandbox/id_pool.h"
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
    (void)RemoveTree(dir_);  // the test's scratch directory: a leftover in /tmp harms no result
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
  EXPECT_NE(box.status().message().find(dir_ + "/no-such-layer"), std::string::npos)
      << box.status().message();
  // TearDown checks directories, mounts and cgroups.
}

// The agent image is checked by Open and copied on a thread of Open's: a missing binary fails Open
// at once, one that cannot be copied (a directory) fails the first create, naming what went
// wrong, and leaves nothing behind (TearDown).
TEST_F(RuntimeTest, AnAgentThatCannotBeLoadedFailsOpenOrTheCreate) {
  NativeConfig cfg = rt_->config();
  cfg.agent_path = dir_ + "/no-such-agent";
  auto missing = NativeRuntime::Open(cfg);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("load sbx-agent: open " + cfg.agent_path),
            std::string::npos)
      << missing.status().message();
  cfg.agent_path = dir_;
  auto rt = NativeRuntime::Open(cfg);
  ASSERT_TRUE(rt.ok()) << rt.status().message();
  auto box = (*rt)->Create(Spec());
  ASSERT_FALSE(box.ok());
  EXPECT_NE(box.status().message().find("load sbx-agent: copy " + cfg.agent_path),
            std::string::npos)
      << box.status().message();
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

// A command's stdout and exit code in `box`, through its agent.
std::pair<std::string, int64_t> RunSh(const Box& box, const std::string& command) {
  auto c = protocol::AgentConnection::Connect(box.agent_socket);
  if (!c.ok()) return {"connect: " + c.status().message(), -1};
  protocol::Writer w;
  w.Str(Tag::kArgv, "/bin/sh").Str(Tag::kArgv, "-c").Str(Tag::kArgv, command);
  if (auto r = c->Call(Type::kSpawn, w); !r.ok()) return {"spawn: " + r.status().message(), -1};
  std::string out;
  for (;;) {
    auto f = c->Receive(10000);
    if (!f.ok()) return {out + "receive: " + f.status().message(), -1};
    if (f->type() == Type::kOutput && f->fields.Int(Tag::kStream) == 1)
      out += f->fields.Str(Tag::kData);
    if (f->type() == Type::kExit) return {out, f->fields.Int(Tag::kExitCode, -1)};
  }
}

// Each box has a boot id of its own: not the host's (which names the host), not another box's,
// the same for the box's whole life (a freeze included), and read-only inside.
TEST_F(RuntimeTest, EachBoxHasItsOwnReadOnlyBootId) {
  auto a = rt_->Create(Spec());
  auto b = rt_->Create(Spec());
  ASSERT_TRUE(a.ok() && b.ok());
  const std::string read = "cat /proc/sys/kernel/random/boot_id";
  auto [id_a, code_a] = RunSh(*a, read);
  auto [id_b, code_b] = RunSh(*b, read);
  ASSERT_EQ(code_a, 0) << id_a;
  ASSERT_EQ(code_b, 0) << id_b;
  auto host = ReadFile("/proc/sys/kernel/random/boot_id");
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(id_a.size(), 37u) << id_a;  // 36 characters and a newline, as the kernel's
  EXPECT_EQ(id_a[14], '4') << "a version 4 UUID: " << id_a;
  EXPECT_NE(id_a, *host);
  EXPECT_NE(id_b, *host);
  EXPECT_NE(id_a, id_b);
  ASSERT_TRUE(rt_->Freeze(*a).ok());
  ASSERT_TRUE(rt_->Thaw(*a).ok());
  EXPECT_EQ(RunSh(*a, read).first, id_a);
  // Not even the box's root can change it, or unmount it to see the host's.
  auto [w, wcode] = RunSh(*a,
                          "echo 00000000-0000-4000-8000-000000000000 > "
                          "/proc/sys/kernel/random/boot_id 2>/dev/null; "
                          "umount /proc/sys/kernel/random/boot_id 2>/dev/null; " +
                              read);
  EXPECT_EQ(w, id_a);
  EXPECT_TRUE(rt_->Destroy(*a).ok());
  EXPECT_TRUE(rt_->Destroy(*b).ok());
}

// Threat 24: the agent's file API resolves every path inside the box's own root, so traversal,
// absolute paths and symlinks pointing out all stay in the box.
// A regular file bound over a file of the layer (the network's /etc/resolv.conf) replaces it,
// read-only.
TEST_F(RuntimeTest, AFileBindReplacesTheLayersFile) {
  std::string conf = dir_ + "/resolv.conf";
  ASSERT_TRUE(WriteFile(conf, "nameserver 10.213.0.1\n", 0644).ok());
  BoxSpec spec = Spec();
  spec.binds.push_back({conf, "/etc/resolv.conf", true});
  auto box = rt_->Create(spec);
  ASSERT_TRUE(box.ok()) << box.status().message();
  auto conn = protocol::AgentConnection::Connect(box->agent_socket);
  ASSERT_TRUE(conn.ok());
  std::vector<protocol::Frame> data;
  auto r = conn->Call(Type::kRead, protocol::Writer().Str(Tag::kPath, "/etc/resolv.conf"), &data);
  ASSERT_TRUE(r.ok()) << r.status().message();
  std::string got;
  for (const auto& f : data) got += f.fields.Str(Tag::kData);
  EXPECT_EQ(got, "nameserver 10.213.0.1\n");
  // The agent writes a temporary file and renames it over the target: the bind refuses that.
  uint32_t wid = conn->NextId();
  auto w = conn->CallWithId(Type::kWriteBegin, wid,
                            protocol::Writer().Str(Tag::kPath, "/etc/resolv.conf"));
  if (w.ok()) w = conn->CallWithId(Type::kWriteEnd, wid, protocol::Writer());
  EXPECT_FALSE(w.ok()) << "a read-only bind was replaced";
  ASSERT_TRUE(rt_->Destroy(*box).ok());
}

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

// Issue 10: Destroy signalled the recorded agent pid without checking it still was the agent. An
// adopted agent is not our child, so after it died its pid could be any host process's.
TEST_F(RuntimeTest, DestroyNeverSignalsAProcessThatIsNotTheBoxsAgent) {
  auto box = rt_->Create(Spec());
  ASSERT_TRUE(box.ok()) << box.status().message();
  pid_t stranger = ::fork();
  if (stranger == 0) {
    ::pause();
    ::_exit(0);
  }
  ASSERT_GT(stranger, 0);
  Box stale = *box;
  stale.init_pid = stranger;  // what a record says once the agent's pid was reused
  EXPECT_TRUE(rt_->Destroy(stale).ok());
  EXPECT_EQ(::kill(stranger, 0), 0) << "Destroy killed a process outside the box";
  int status = 0;
  EXPECT_EQ(::waitpid(stranger, &status, WNOHANG), 0) << "the stranger died";
  // The box itself is gone all the same: its cgroup killed the agent.
  EXPECT_NE(::access(box->dir.c_str(), F_OK), 0);
  ::kill(stranger, SIGKILL);
  ::waitpid(stranger, &status, 0);
  // The real agent was our child and is reaped (no zombie left behind).
  EXPECT_TRUE(rt_->Destroy(*box).ok());
  EXPECT_EQ(::waitpid(box->init_pid, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
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

TEST_F(RuntimeTest, ACreatorKilledBeforeItsRenameLeavesNothingForTheReaperToAgeOut) {
  // A box directory is made under a temporary name naming its creator, and renamed into place
  // with its locked owner file. A creator killed before the rename (here right after its mkdir,
  // before the owner file) leaves a name that the next reap removes at once, not after a minute.
  const std::string run = dir_ + "/run";
  pid_t creator = ::fork();
  ASSERT_GE(creator, 0);
  if (creator == 0) {
    std::string tmp = run + "/" + CreationDirName("dead", ::getpid(), ProcessStartTime(::getpid()));
    if (::mkdir(tmp.c_str(), 0700) != 0) ::_exit(1);
    ::raise(SIGKILL);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(creator, &status, 0), creator);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the creator did not get to its mkdir";
  // A reused pid: alive, but started at another time than the name says.
  const std::string reused = run + "/" + CreationDirName("reused", ::getpid(), 1);
  // This process, creating right now: never touched.
  const std::string live =
      run + "/" + CreationDirName("live", ::getpid(), ProcessStartTime(::getpid()));
  ASSERT_EQ(::mkdir(reused.c_str(), 0700), 0);
  ASSERT_EQ(::mkdir(live.c_str(), 0700), 0);
  auto reaped = rt_->ReapOrphans("run");
  ASSERT_TRUE(reaped.ok()) << reaped.status().message();
  EXPECT_EQ(*reaped, 2);
  struct stat st {};
  if (DIR* d = ::opendir(run.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      EXPECT_FALSE(n.size() > 5 && n.substr(n.size() - 5) == ".dead") << "left: " << n;
    }
    ::closedir(d);
  }
  EXPECT_NE(::stat(reused.c_str(), &st), 0);
  EXPECT_EQ(::stat(live.c_str(), &st), 0) << "a live creator's directory was reaped";
  ASSERT_EQ(::rmdir(live.c_str()), 0);
  // Nothing but box directories is left by a real create, failed or not (TearDown checks).
  BoxSpec bad = Spec();
  bad.layers = {dir_ + "/no-such-layer"};
  EXPECT_FALSE(rt_->Create(bad).ok());
}

// Runs argv in the box and returns its output (stdout and stderr) and exit code.
struct Ran {
  std::string out;
  int64_t code = -1;
};
Ran RunIn(const Box& box, const std::vector<std::string>& argv, int timeout_ms = 20000) {
  Ran ran;
  auto conn = protocol::AgentConnection::Connect(box.agent_socket);
  if (!conn.ok()) return ran;
  protocol::Writer w;
  for (const auto& a : argv) w.Str(Tag::kArgv, a);
  w.Str(Tag::kEnv, "PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin");
  if (!conn->Call(Type::kSpawn, w).ok()) return ran;
  for (;;) {
    auto f = conn->Receive(timeout_ms);
    if (!f.ok()) return ran;
    if (f->type() == Type::kOutput) ran.out += f->fields.Str(Tag::kData);
    if (f->type() == Type::kExit) {
      ran.code = f->fields.Int(Tag::kExitCode);
      return ran;
    }
  }
}

// A runtime whose boxes take private id ranges from a pool in a real store.
class PooledRuntimeTest : public RuntimeTest {
 protected:
  void SetUp() override {
    RuntimeTest::SetUp();
    if (HasFatalFailure()) return;
    auto st = store::Store::Open(dir_ + "/sbx.db");
    ASSERT_TRUE(st.ok()) << st.status().message();
    store_ = std::move(st).value();
    auto pool = sandbox::StoreIdPool::Make(*store_, {}, 1000000);
    ASSERT_TRUE(pool.ok()) << pool.status().message();
    pool_ = std::move(pool).value();
    NativeConfig cfg = rt_->config();
    cfg.id_pool = pool_.get();
    auto rt = NativeRuntime::Open(cfg);
    ASSERT_TRUE(rt.ok()) << rt.status().message();
    rt_ = std::move(rt).value();
    ASSERT_TRUE(rt_->idmapped()) << "idmapped mounts must work on this kernel (>= 5.19)";
  }
  size_t Slots() { return store_->ListIdSlots().value().size(); }

  std::unique_ptr<store::Store> store_;
  std::unique_ptr<sandbox::StoreIdPool> pool_;
};

uid_t UsernsOwner(pid_t pid) {
  UniqueFd ns(::open(("/proc/" + std::to_string(pid) + "/ns/user").c_str(), O_RDONLY | O_CLOEXEC));
  uid_t owner = static_cast<uid_t>(-1);
  if (!ns || ::ioctl(ns.get(), NS_GET_OWNER_UID, &owner) != 0) return static_cast<uid_t>(-1);
  return owner;
}

TEST_F(PooledRuntimeTest, EachBoxHasItsOwnHostIdsAndUserNamespaceOwner) {
  auto a = rt_->Create(Spec());
  ASSERT_TRUE(a.ok()) << a.status().message();
  auto b = rt_->Create(Spec());
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_TRUE(a->idmapped);
  EXPECT_EQ(a->id_base, 0x10000000u);  // slot 0 of the default pool
  EXPECT_EQ(b->id_base, 0x10000000u + kIdRange);
  EXPECT_EQ(Slots(), 2u);
  for (const Box* box : {&*a, &*b}) {
    // Root of each box is its own host id: a file it writes is owned by its own range.
    Ran r = RunIn(*box, {"/bin/sh", "-c",
                         "echo hi > /tmp/mine && chown 1000:1000 /tmp/mine && "
                         "touch /tmp/root-owned && id -u"});
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(r.out, "0\n");
    struct stat st {};
    ASSERT_EQ(::stat((box->dir + "/fs/upper/tmp/mine").c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, box->id_base + 1000);
    EXPECT_EQ(st.st_gid, box->id_base + 1000);
    ASSERT_EQ(::stat((box->dir + "/fs/upper/tmp/root-owned").c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, box->id_base);
    // The user namespace belongs to the box's root, so the kernel's per-user counters are its.
    EXPECT_EQ(UsernsOwner(box->init_pid), box->id_base);
    // Host files idmapped: root's files are root's inside (not nobody).
    r = RunIn(*box, {"stat", "-c", "%u:%g", "/usr/bin/passwd", "/etc/passwd"});
    EXPECT_EQ(r.out, "0:0\n0:0\n");
    // Its own kernel limits, and no nested user namespaces.
    r = RunIn(*box, {"cat", "/proc/sys/user/max_user_namespaces",
                     "/proc/sys/user/max_inotify_instances"});
    EXPECT_EQ(r.out, "0\n128\n");
    r = RunIn(*box, {"unshare", "-U", "true"});
    EXPECT_NE(r.code, 0);
    // /usr stays read-only for root inside, though its files are root's there.
    r = RunIn(*box, {"/bin/sh", "-c", "touch /usr/bin/passwd"});
    EXPECT_NE(r.code, 0);
    // The agent is never the OOM killer's choice.
    auto adj = ReadFile("/proc/" + std::to_string(box->init_pid) + "/oom_score_adj");
    ASSERT_TRUE(adj.ok());
    if (rt_->protects_agent()) {
      EXPECT_EQ(*adj, "-1000\n");
    } else {
      // This host withholds CAP_SYS_RESOURCE from root: the score cannot be lowered here.
      std::cerr << "note: no CAP_SYS_RESOURCE, oom_score_adj of the agent is " << *adj;
    }
  }
  EXPECT_TRUE(rt_->Destroy(*a).ok());
  EXPECT_EQ(Slots(), 1u);
  // The lowest free slot is reused.
  auto c = rt_->Create(Spec());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->id_base, 0x10000000u);
  EXPECT_TRUE(rt_->Destroy(*b).ok());
  EXPECT_TRUE(rt_->Destroy(*c).ok());
  EXPECT_EQ(Slots(), 0u);
}

// A template layer as templates store them: real owners (root), below root-only directories.
TEST_F(PooledRuntimeTest, RootOwnedLayerBelowPrivateDirectoriesIsRootsInside) {
  std::string layer = dir_ + "/private/cache/layer";
  ASSERT_TRUE(MakeDirs(layer + "/opt/secret", 0700).ok());
  ASSERT_EQ(::chmod((dir_ + "/private").c_str(), 0700), 0);
  ASSERT_EQ(::chmod((dir_ + "/private/cache").c_str(), 0700), 0);
  ASSERT_EQ(::chmod(layer.c_str(), 0755), 0);
  ASSERT_EQ(::chmod((layer + "/opt").c_str(), 0755), 0);
  ASSERT_TRUE(WriteFile(layer + "/opt/secret/data", "layer data\n", 0600).ok());
  BoxSpec spec = Spec();
  spec.layers.insert(spec.layers.begin(), layer);
  auto box = rt_->Create(spec);
  ASSERT_TRUE(box.ok()) << box.status().message();
  Ran r = RunIn(*box, {"stat", "-c", "%u:%g %a", "/opt/secret", "/opt/secret/data"});
  EXPECT_EQ(r.out, "0:0 700\n0:0 600\n");
  // Copy-up of a root-only file by root inside; the layer itself is untouched.
  r = RunIn(*box, {"/bin/sh", "-c", "echo more >> /opt/secret/data && cat /opt/secret/data"});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "layer data\nmore\n");
  auto untouched = ReadFile(layer + "/opt/secret/data");
  ASSERT_TRUE(untouched.ok());
  EXPECT_EQ(*untouched, "layer data\n");
  struct stat st {};
  ASSERT_EQ(::stat((box->dir + "/fs/upper/opt/secret/data").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, box->id_base);
  EXPECT_TRUE(rt_->Destroy(*box).ok());
}

// Threat 46: nothing under the run directory is reachable by another host user, so a set-id file
// a box writes in its layer cannot be run from the host.
TEST_F(PooledRuntimeTest, HostUsersCannotReachTheRunDirectory) {
  auto box = rt_->Create(Spec());
  ASSERT_TRUE(box.ok()) << box.status().message();
  Ran r = RunIn(*box, {"/bin/sh", "-c", "cp /bin/true /tmp/suid && chmod 4755 /tmp/suid"});
  ASSERT_EQ(r.code, 0) << r.out;
  struct stat st {};
  ASSERT_EQ(::stat(rt_->config().run_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(st.st_uid, 0u);
  for (uid_t uid : {uid_t{65534}, uid_t{box->id_base}, uid_t{box->id_base + 1000}}) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      if (::setgroups(0, nullptr) != 0 || ::setresgid(uid, uid, uid) != 0 ||
          ::setresuid(uid, uid, uid) != 0)
        _exit(2);
      struct stat s {};
      for (const std::string& p : {rt_->config().run_dir + "/" + box->id, box->dir + "/fs",
                                   box->dir + "/fs/upper/tmp/suid", box->agent_socket}) {
        if (::stat(p.c_str(), &s) == 0 || errno != EACCES) _exit(1);
      }
      _exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "uid " << uid << " reached it";
  }
  EXPECT_TRUE(rt_->Destroy(*box).ok());
}

// Item 8 of issue 9: one box exhausting its inotify instances leaves another box's untouched
// (each user namespace is owned by its own host id, whose per-user counter is its own).
TEST_F(PooledRuntimeTest, InotifyExhaustionInOneBoxLeavesTheOtherAlone) {
  auto a = rt_->Create(Spec());
  auto b = rt_->Create(Spec());
  ASSERT_TRUE(a.ok() && b.ok());
  const std::string hog =
      "import ctypes, os, sys, time\n"
      "libc = ctypes.CDLL(None, use_errno=True)\n"
      "n = 0\n"
      "while libc.inotify_init() >= 0: n += 1\n"
      "print(n, os.strerror(ctypes.get_errno()), flush=True)\n";
  // The hog keeps its instances: it is still running (and holding them) when b tries.
  auto conn = protocol::AgentConnection::Connect(a->agent_socket);
  ASSERT_TRUE(conn.ok());
  protocol::Writer w;
  w.Str(Tag::kArgv, "python3")
      .Str(Tag::kArgv, "-c")
      .Str(Tag::kArgv, hog + "sys.stdin.read()\n")
      .Str(Tag::kEnv, "PATH=/usr/bin:/bin");
  w.Int(Tag::kStdinOpen, 1);
  ASSERT_TRUE(conn->Call(Type::kSpawn, w).ok());
  std::string out;
  while (out.find('\n') == std::string::npos) {
    auto f = conn->Receive(20000);
    ASSERT_TRUE(f.ok()) << f.status().message();
    if (f->type() == Type::kOutput) out += f->fields.Str(Tag::kData);
    ASSERT_NE(f->type(), Type::kExit) << out;
  }
  EXPECT_NE(out.find("Too many open files"), std::string::npos) << out;
  EXPECT_LE(std::atoi(out.c_str()), 128);
  Ran r = RunIn(*b, {"python3", "-c", hog});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_GE(std::atoi(r.out.c_str()), 100) << r.out;  // b has (nearly) its whole budget
  // And the host (this process, root) still has its own.
  int fd = ::inotify_init1(IN_CLOEXEC);
  EXPECT_GE(fd, 0);
  if (fd >= 0) ::close(fd);
  EXPECT_TRUE(rt_->Destroy(*a).ok());
  EXPECT_TRUE(rt_->Destroy(*b).ok());
}

TEST_F(PooledRuntimeTest, RangesOfReapedOrphansAndVanishedBoxesAreReleased) {
  NativeConfig cfg = rt_->config();
  Box orphan;
  {
    auto other = NativeRuntime::Open(cfg);
    ASSERT_TRUE(other.ok());
    auto box = (*other)->Create(Spec());
    ASSERT_TRUE(box.ok()) << box.status().message();
    orphan = *box;
  }  // its owner is gone: the lock is released, the box keeps running
  // A range whose box directory vanished (a process died between removing it and releasing).
  ASSERT_TRUE(store_->AcquireIdSlot("ghost", 8192).ok());
  EXPECT_EQ(Slots(), 2u);
  auto reaped = rt_->ReapOrphans("run");
  ASSERT_TRUE(reaped.ok()) << reaped.status().message();
  EXPECT_EQ(*reaped, 1);
  // Killed (it is our child, so reaping it proves it died).
  EXPECT_EQ(::waitpid(orphan.init_pid, nullptr, 0), orphan.init_pid);
  EXPECT_EQ(Slots(), 0u);
}

TEST_F(PooledRuntimeTest, DiskImageIsAllocatedForReal) {
  BoxSpec spec = Spec();
  spec.limits.disk_bytes = 64 << 20;
  auto box = rt_->Create(spec);
  ASSERT_TRUE(box.ok()) << box.status().message();
  struct stat st {};
  ASSERT_EQ(::stat((box->dir + "/disk.img").c_str(), &st), 0);
  EXPECT_GE(static_cast<int64_t>(st.st_blocks) * 512, spec.limits.disk_bytes);
  Ran r = RunIn(*box, {"/bin/sh", "-c", "echo x > /root/f && stat -c %u /root/f"});
  EXPECT_EQ(r.out, "0\n");
  EXPECT_TRUE(rt_->Destroy(*box).ok());
  // A disk that cannot fit is refused before anything is allocated.
  spec = Spec();
  spec.limits.disk_bytes = int64_t{1} << 50;  // 1 PiB
  auto huge = rt_->Create(spec);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().err(), ENOSPC) << huge.status().message();
  EXPECT_NE(huge.status().message().find("bytes free"), std::string::npos);
  EXPECT_EQ(Slots(), 0u);
}

// RuntimeTest with a 1 GiB btrfs filesystem on a loop device, made in dir_ and mounted at
// mnt_ (<dir_>/btrfs, 0711) until the test ends (detached: the loop device goes with its last
// user). Skipped where mkfs.btrfs is missing.
class BtrfsRuntimeTest : public RuntimeTest {
 protected:
  void SetUp() override {
    RuntimeTest::SetUp();
    if (HasFatalFailure()) return;
    if (::system("command -v mkfs.btrfs > /dev/null 2>&1") != 0)
      GTEST_SKIP() << "mkfs.btrfs is missing (make deps installs btrfs-progs)";
    const std::string img = dir_ + "/btrfs.img", at = dir_ + "/btrfs";
    ASSERT_EQ(::mkdir(at.c_str(), 0711), 0);
    ASSERT_EQ(::system(("truncate -s 1G " + img + " && mkfs.btrfs -q -f " + img +
                        " > /dev/null && mount -o loop " + img + " " + at + " && chmod 711 " + at)
                           .c_str()),
              0);
    mnt_ = at;
  }
  void TearDown() override {
    if (!mnt_.empty()) ::umount2(mnt_.c_str(), MNT_DETACH);
    RuntimeTest::TearDown();
  }
  std::string mnt_;
};

// A layer at `path`: a static busybox, the applets the btrfs tests use, and `dirs` directories
// /opt/d<i>, each with a file f holding i.
bool MakeBusyboxLayer(const std::string& path, int dirs) {
  return ::system(("mkdir -p " + path + "/bin && chmod 755 " + path + " && cd " + path +
                   " && cp /bin/busybox bin/ && for a in sh find stat sort uniq wc cat rm ls chown "
                   "mkdir seq; do ln -s busybox bin/$a; done && for i in $(seq " +
                   std::to_string(dirs) + "); do mkdir -p opt/d$i && echo $i > opt/d$i/f; done")
                      .c_str()) == 0;
}

// Issue 14 item 3: with the run directory on btrfs, a disk limit is the qgroup limit of a
// subvolume holding the writable layer, not an ext4 image on a loop device. The btrfs filesystem
// is one the test makes on a loop device.
TEST_F(BtrfsRuntimeTest, ADiskLimitOnBtrfsIsAQgroupNotAnImage) {
  const std::string& mnt = mnt_;
  NativeConfig cfg = rt_->config();
  cfg.run_dir = mnt + "/run";
  auto rt = NativeRuntime::Open(cfg);
  ASSERT_TRUE(rt.ok()) << rt.status().message();
  EXPECT_TRUE((*rt)->btrfs());
  BoxSpec spec = Spec();
  spec.limits.disk_bytes = 32 << 20;
  auto box = (*rt)->Create(spec);
  ASSERT_TRUE(box.ok()) << box.status().message();
  struct stat st {};
  EXPECT_NE(::stat((box->dir + "/disk.img").c_str(), &st), 0) << "an image was made";
  EXPECT_TRUE(btrfs::IsSubvolume(box->dir + "/fs/layer"));
  Ran r = RunIn(*box, {"/bin/sh", "-c", "head -c 64M /dev/zero > /root/x; echo kept > /root/k"});
  EXPECT_NE(r.out.find("Disk quota exceeded"), std::string::npos) << r.out;
  {
    UniqueFd fs(::open(mnt.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_EQ(::syncfs(fs.get()), 0);  // qgroups are counted when a transaction commits
  }
  auto stats = (*rt)->Stats(*box);
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  EXPECT_EQ(stats->disk_total, uint64_t{32} << 20);
  EXPECT_GE(stats->disk_used, uint64_t{30} << 20);
  // A snapshot's copy is a subvolume snapshot (SnapshotsOnBtrfsAreSubvolumes...); then the box
  // goes with its subvolume.
  const std::string copy = mnt + "/copy";
  ASSERT_EQ(::mkdir(copy.c_str(), 0700), 0);
  Status copied = (*rt)->CopyWritableLayer(*box, copy, int64_t{1} << 30);
  ASSERT_TRUE(copied.ok()) << copied.message();
  EXPECT_EQ(::stat((copy + "/root/x").c_str(), &st), 0);
  EXPECT_GE(st.st_size, 30 << 20);
  ASSERT_TRUE((*rt)->Destroy(*box).ok());
  EXPECT_NE(::access(box->dir.c_str(), F_OK), 0);
  ASSERT_TRUE(RemoveTree(copy).ok());
  EXPECT_EQ(::system(("test -z \"$(btrfs subvolume list " + mnt + ")\"").c_str()), 0)
      << "a subvolume is left";
  // A create that fails after its subvolume was made (here: its layer cannot be mounted) leaves
  // neither the subvolume nor the box's directory.
  BoxSpec bad = Spec();
  bad.limits.disk_bytes = 32 << 20;
  bad.layers = {dir_ + "/no-such-layer"};
  EXPECT_FALSE((*rt)->Create(bad).ok());
  EXPECT_EQ(::system(("test -z \"$(btrfs subvolume list " + mnt + ")\"").c_str()), 0)
      << "the failed create's subvolume is left";
  EXPECT_NE(::access((mnt + "/run/" + bad.id).c_str(), F_OK), 0);
  rt->reset();
}

// A lower layer on the run directory's own btrfs filesystem. btrfs numbers inodes per subvolume
// and overlayfs passes a layer's numbers through for layers of one filesystem, so an upper layer
// in a subvolume of its own would show the numbers of the layer's files again for its own (find
// reports loops, tar makes hard links of different files). Such a box's disk limit is an image;
// every file inside keeps a number of its own.
TEST_F(BtrfsRuntimeTest, ALayerOnTheRunDirectorysBtrfsIsStackedAndKeepsInodeNumbersUnique) {
  const std::string& mnt = mnt_;
  // The box's only layer, on that filesystem: a static busybox and 40 directories with a file
  // each (inode numbers from 257 on, as the writable layer's would be in a new subvolume).
  const std::string layer = mnt + "/layer";
  ASSERT_TRUE(MakeBusyboxLayer(layer, 40));
  // Both ways the child mounts overlays: fsconfig's lowerdir+ (kernel 6.8+) and one option
  // string.
  for (bool lowerdir_plus : {true, false}) {
    SCOPED_TRACE(lowerdir_plus ? "lowerdir+" : "option string");
    NativeConfig cfg = rt_->config();
    cfg.run_dir = mnt + "/run";
    cfg.overlay_lowerdir_plus = lowerdir_plus;
    auto rt = NativeRuntime::Open(cfg);
    ASSERT_TRUE(rt.ok()) << rt.status().message();
    ASSERT_TRUE((*rt)->btrfs());
    BoxSpec spec = Spec();
    spec.layers = {layer};
    spec.binds.clear();
    spec.limits.disk_bytes = 32 << 20;
    auto box = (*rt)->Create(spec);
    ASSERT_TRUE(box.ok()) << box.status().message();
    // The writable layer is a subvolume limited by its qgroup, as where the layers are elsewhere:
    // the layers reach the box's overlay stacked on an overlay of their own.
    EXPECT_TRUE(btrfs::IsSubvolume(box->dir + "/fs/layer"));
    struct stat st {};
    EXPECT_NE(::stat((box->dir + "/disk.img").c_str(), &st), 0) << "an image was made";
    // Files of the layer (some copied up by a write), and as many made in the box.
    Ran r = RunIn(*box, {"/bin/sh", "-c",
                         "for i in $(seq 40); do mkdir -p /srv/d$i && echo $i > /srv/d$i/f; done; "
                         "for i in $(seq 10); do echo more >> /opt/d$i/f; done; "
                         "for f in $(find /opt /srv); do stat -c '%d %i' $f; done | sort | uniq -d "
                         "| wc -l"});
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(r.out, "0\n") << "inode numbers seen twice inside the box";
    r = RunIn(*box, {"/bin/sh", "-c", "cat /opt/d3/f /opt/d30/f"});
    EXPECT_EQ(r.out, "3\nmore\n30\n");
    // The disk limit holds: 64 MiB do not fit in 32.
    r = RunIn(*box, {"/bin/busybox", "dd", "if=/dev/zero", "of=/srv/big", "bs=1M", "count=64"});
    EXPECT_NE(r.out.find("Disk quota exceeded"), std::string::npos) << r.out;
    ASSERT_TRUE((*rt)->Destroy(*box).ok());
    rt->reset();
  }
}

// Issue 14 item 3: with the run directory on btrfs, a box's writable layer is a subvolume that
// stores its files as a layer does (ids 0..65535, through an idmapped mount), so a snapshot of it
// is a subvolume snapshot, O(1) in its size and with no chown. A box started from such a layer
// begins with a writable snapshot of it and does not stack it (two subvolumes among its lower
// layers would collide on inode numbers): a snapshot of that box replaces the layer, so what the
// box deleted of it stays deleted. A build's box keeps a plain copy.
TEST_F(BtrfsRuntimeTest, SnapshotsOnBtrfsAreSubvolumesThatTheNextBoxStartsFrom) {
  if (!rt_->idmapped()) GTEST_SKIP() << "idmapped mounts do not work here";
  const std::string& mnt = mnt_;
  const std::string layer = mnt + "/layer";
  ASSERT_TRUE(MakeBusyboxLayer(layer, 20));
  NativeConfig cfg = rt_->config();
  cfg.run_dir = mnt + "/run";
  auto rt = NativeRuntime::Open(cfg);
  ASSERT_TRUE(rt.ok()) << rt.status().message();
  ASSERT_TRUE((*rt)->btrfs());
  auto spec = [&](std::vector<std::string> layers) {
    BoxSpec s = Spec();
    s.layers = std::move(layers);
    s.binds.clear();
    s.may_hold_top_layer = true;
    return s;
  };
  // Inode numbers seen twice among the files inside (none may be).
  const std::string dups =
      "for f in $(find /opt /srv /upper); do stat -c '%d %i' $f; done | sort | uniq -d | wc -l";
  // Takes the writable layer of `box` (frozen meanwhile) into a new directory `name` of `mnt`.
  auto take = [&](const Box& box, const std::string& name) {
    const std::string dest = mnt + "/" + name;
    EXPECT_EQ(::mkdir(dest.c_str(), 0700), 0);
    EXPECT_TRUE((*rt)->Freeze(box).ok());
    Status copied = (*rt)->CopyWritableLayer(box, dest, int64_t{1} << 30);
    EXPECT_TRUE((*rt)->Thaw(box).ok());
    EXPECT_TRUE(copied.ok()) << copied.message();
    return dest;
  };

  auto a = (*rt)->Create(spec({layer}));
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_TRUE(btrfs::IsSubvolume(a->dir + "/fs/layer"));
  EXPECT_TRUE(a->layer_ids);
  EXPECT_FALSE(a->holds_top_layer);
  // Entries named as the layout's own (upper, work) must come through as the box's.
  Ran r = RunIn(*a, {"/bin/sh", "-c",
                     "mkdir -p /srv /upper/work && echo a > /srv/a && chown 1000:1000 /srv/a && "
                     "echo w > /upper/work/w && echo gone > /srv/gone && rm /opt/d1/f && " +
                         dups});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "0\n");
  const std::string s1 = take(*a, "s1");
  EXPECT_TRUE(btrfs::IsSubvolume(s1)) << "not a subvolume snapshot";
  struct stat st {};
  ASSERT_EQ(::lstat((s1 + "/srv/a").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 1000u) << "stored under the box's host ids, not a layer's";
  ASSERT_EQ(::lstat((s1 + "/opt/d1/f").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0)) << "not a whiteout";
  auto w = ReadFile(s1 + "/upper/work/w");
  EXPECT_TRUE(w.ok() && *w == "w\n");
  EXPECT_EQ(
      ::system(("test -z \"$(ls -A " + s1 + " | grep -x -e work -e '.sbx-upper.*')\"").c_str()), 0)
      << "the layout's own entries are left in the layer";
  ASSERT_TRUE((*rt)->Destroy(*a).ok());

  // The next box starts from s1: it holds it rather than stacking it.
  auto b = (*rt)->Create(spec({s1, layer}));
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_TRUE(b->holds_top_layer);
  EXPECT_TRUE(btrfs::IsSubvolume(b->dir + "/fs/layer"));
  r = RunIn(*b, {"/bin/sh", "-c",
                 "cat /srv/a /upper/work/w /opt/d2/f && stat -c %u /srv/a && ls /opt/d1 && "
                 "rm /srv/gone && echo b > /srv/b && " +
                     dups});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "a\nw\n2\n1000\n0\n");
  const std::string s2 = take(*b, "s2");
  ASSERT_TRUE((*rt)->Destroy(*b).ok());
  // A box of s2 alone over the template's layer: what b deleted of s1 stays deleted.
  auto c = (*rt)->Create(spec({s2, layer}));
  ASSERT_TRUE(c.ok()) << c.status().message();
  r = RunIn(*c, {"/bin/sh", "-c", "cat /srv/a /srv/b; ls /srv; " + dups});
  EXPECT_EQ(r.out, "a\nb\na\nb\n0\n");
  // Adopted by another runtime (a daemon's restart), the box still says how its writable layer
  // is kept: a snapshot of it replaces s2.
  rt->reset();
  rt = NativeRuntime::Open(cfg);
  ASSERT_TRUE(rt.ok()) << rt.status().message();
  auto adopted = (*rt)->Adopt(c->id);
  ASSERT_TRUE(adopted.ok()) << adopted.status().message();
  EXPECT_TRUE(adopted->layer_ids);
  EXPECT_TRUE(adopted->holds_top_layer);
  ASSERT_TRUE((*rt)->Destroy(*adopted).ok());

  // A build's box (may_hold_top_layer false) keeps its writable layer as a plain directory of
  // files under a layer's ids.
  BoxSpec build = spec({layer});
  build.may_hold_top_layer = false;
  auto d = (*rt)->Create(build);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_TRUE(RunIn(*d, {"/bin/sh", "-c", "echo d > /opt/d"}).code == 0);
  const std::string kept = mnt + "/kept";
  ASSERT_EQ(::mkdir(kept.c_str(), 0700), 0);
  ASSERT_TRUE((*rt)->DestroyKeepingUpper(*d, kept).ok());
  EXPECT_FALSE(btrfs::IsSubvolume(kept));
  ASSERT_EQ(::lstat((kept + "/opt/d").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  rt->reset();
  for (const auto& l : {s1, s2, kept}) EXPECT_TRUE(RemoveTree(l).ok()) << l;
  EXPECT_EQ(::system(("test -z \"$(btrfs subvolume list " + mnt + ")\"").c_str()), 0)
      << "a subvolume is left";
}

// The idmap probe's pass is remembered beside the run directory for this boot and filesystem
// only: a note of another boot is probed again and replaced.
TEST_F(RuntimeTest, APassedIdmapProbeIsRememberedForThisBootOnly) {
  if (!rt_->idmapped()) GTEST_SKIP() << "idmapped mounts do not work here: nothing is remembered";
  const std::string memo = rt_->config().run_dir + ".idmap-probe";
  auto boot = ReadFile("/proc/sys/kernel/random/boot_id");
  ASSERT_TRUE(boot.ok());
  struct stat st {};
  ASSERT_EQ(::stat(rt_->config().run_dir.c_str(), &st), 0);
  const std::string want = boot->substr(0, boot->find('\n')) + " " + std::to_string(st.st_dev) +
                           " " + std::to_string(rt_->config().id_base) + " ok\n";
  auto seen = ReadFile(memo);
  ASSERT_TRUE(seen.ok()) << seen.status().message();
  EXPECT_EQ(*seen, want);
  // Whether an Open probed: the probe's scratch directory appears in the run directory.
  auto probes_in_open = [&] {
    UniqueFd in(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
    EXPECT_GE(::inotify_add_watch(in.get(), rt_->config().run_dir.c_str(), IN_CREATE), 0);
    auto rt = NativeRuntime::Open(rt_->config());
    EXPECT_TRUE(rt.ok()) << rt.status().message();
    EXPECT_TRUE(rt.ok() && (*rt)->idmapped());
    int probes = 0;
    alignas(inotify_event) char buf[4096];
    for (ssize_t n; (n = ::read(in.get(), buf, sizeof buf)) > 0;) {
      for (char* p = buf; p < buf + n;) {
        auto* e = reinterpret_cast<inotify_event*>(p);
        if (e->len > 0 && std::string(e->name).find("idmap-probe") != std::string::npos) ++probes;
        p += sizeof(inotify_event) + e->len;
      }
    }
    return probes;
  };
  EXPECT_EQ(probes_in_open(), 0);
  ASSERT_TRUE(WriteFile(memo, "00000000-0000-0000-0000-000000000000 1 2 ok\n", 0600).ok());
  EXPECT_EQ(probes_in_open(), 1);
  EXPECT_EQ(*ReadFile(memo), want);
  EXPECT_EQ(probes_in_open(), 0);
  ASSERT_EQ(::stat(memo.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

// The loud fallback: no idmapped mounts, every box at the shared base, layers as shifted copies.
TEST_F(RuntimeTest, FallbackWithoutIdmapStillRunsABox) {
  NativeConfig cfg = rt_->config();
  cfg.idmap = false;
  auto rt = NativeRuntime::Open(cfg);
  ASSERT_TRUE(rt.ok()) << rt.status().message();
  EXPECT_FALSE((*rt)->idmapped());
  auto box = (*rt)->Create(Spec());
  ASSERT_TRUE(box.ok()) << box.status().message();
  EXPECT_FALSE(box->idmapped);
  EXPECT_EQ(box->id_base, cfg.id_base);
  Ran r = RunIn(*box, {"/bin/sh", "-c", "echo x > /root/f && stat -c %u:%g /etc/passwd /root/f"});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "0:0\n0:0\n");
  // The shifted copy is root-only on the host.
  struct stat st {};
  ASSERT_EQ(::stat((tmpl_.layers[0] + ".shift-" + std::to_string(cfg.id_base)).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(st.st_uid, 0u);
  ASSERT_EQ(
      ::stat(
          (tmpl_.layers[0] + ".shift-" + std::to_string(cfg.id_base) + "/root/etc/passwd").c_str(),
          &st),
      0);
  EXPECT_EQ(st.st_uid, cfg.id_base);
  EXPECT_TRUE((*rt)->Destroy(*box).ok());
}

}  // namespace
TEST_F(RuntimeTest, ACreateOfAnIdInUseFailsAndLeavesThatBoxAlone) {
  // The rename into place never replaces an existing box's directory, and the failed create's
  // owners undo only what it made.
  BoxSpec spec = Spec();
  auto box = rt_->Create(spec);
  ASSERT_TRUE(box.ok()) << box.status().message();
  auto again = rt_->Create(spec);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().err(), EEXIST) << again.status().message();
  struct stat st {};
  EXPECT_EQ(::stat((box->dir + "/owner").c_str(), &st), 0);
  EXPECT_FALSE(rt_->AgentExit(*box).has_value()) << "the first box's agent was killed";
  EXPECT_TRUE(RunIn(*box, {"true"}).code == 0);
  EXPECT_TRUE(rt_->Destroy(*box).ok());
}

}  // namespace sbx::runtime
