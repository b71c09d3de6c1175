// OciRuntime with the real binaries: boxes of the host template under gVisor (runsc) and runc,
// reached through their agents, then destroyed with nothing left on the host (box directory,
// mounts, the binary's container state, cgroups). Needs root; a runtime whose binary is missing is
// skipped, saying so.
#include "runtime/oci/oci_runtime.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/sockios.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "common/fd.h"
#include "common/fs.h"
#include "protocol/client.h"
#include "runtime/box_host.h"
#include "runtime/native/cgroup_internal.h"
#include "runtime/native/disk.h"
#include "storage/template.h"
#include "store/store.h"

namespace sbx::runtime {
namespace {

using protocol::Tag;
using protocol::Type;

std::string Trim(std::string s) {
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

const char* BinaryOf(const std::string& runtime) { return runtime == "gvisor" ? "runsc" : "runc"; }

bool Installed(const std::string& binary) {
  for (const char* dir : {"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin"})
    if (::access((std::string(dir) + "/" + binary).c_str(), X_OK) == 0) return true;
  return false;
}

// A command's stdout and exit code in `box`, through its agent.
std::pair<std::string, int64_t> RunSh(const Box& box, const std::string& command,
                                      int timeout_ms = 20000) {
  auto c = protocol::AgentConnection::Connect(box.agent_socket, timeout_ms);
  if (!c.ok()) return {"connect: " + c.status().message(), -1};
  protocol::Writer w;
  w.Str(Tag::kArgv, "/bin/sh")
      .Str(Tag::kArgv, "-c")
      .Str(Tag::kArgv, command)
      .Str(Tag::kEnv, "PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin");
  if (auto r = c->Call(Type::kSpawn, w); !r.ok()) return {"spawn: " + r.status().message(), -1};
  std::string out;
  for (;;) {
    auto f = c->Receive(timeout_ms);
    if (!f.ok()) return {out + "receive: " + f.status().message(), -1};
    if (f->type() == Type::kOutput && f->fields.Int(Tag::kStream) == 1)
      out += f->fields.Str(Tag::kData);
    if (f->type() == Type::kExit) return {out, f->fields.Int(Tag::kExitCode, -1)};
  }
}

// Directories named `name` anywhere below the cgroup hierarchies' mount points that hold our own
// cgroup's `parent` (the leak check).
std::vector<std::string> CgroupDirs(const std::string& parent, const std::string& name) {
  std::vector<std::string> out;
  auto mountinfo = ReadFile("/proc/self/mountinfo", 16 << 20);
  auto own = ReadFile("/proc/self/cgroup", 1 << 16);
  if (!mountinfo.ok() || !own.ok()) return out;
  for (const auto& m : cgroup_internal::ParseMountInfo(*mountinfo)) {
    for (const auto& e : cgroup_internal::ParseProcCgroup(*own)) {
      bool match = m.v2 ? e.id == 0 && e.controllers.empty()
                        : !e.controllers.empty() &&
                              std::is_permutation(e.controllers.begin(), e.controllers.end(),
                                                  m.controllers.begin(), m.controllers.end());
      if (!match || e.path.rfind(m.root, 0) != 0) continue;
      std::string rel = e.path.substr(m.root == "/" ? 0 : m.root.size());
      std::string dir = m.mount_point + (rel == "/" ? "" : rel) + "/" + parent;
      if (!name.empty()) dir += "/" + name;
      struct stat st {};
      if (::stat(dir.c_str(), &st) == 0) out.push_back(dir);
    }
  }
  return out;
}

// Gone, or a zombie its new parent (the host's init: the binary that started it has exited) has
// not reaped yet.
bool Dead(pid_t pid) {
  auto stat = ReadFile("/proc/" + std::to_string(pid) + "/stat", 4096);
  if (!stat.ok()) return true;
  size_t paren = stat->rfind(')');
  return paren != std::string::npos && paren + 2 < stat->size() &&
         ((*stat)[paren + 2] == 'Z' || (*stat)[paren + 2] == 'X');
}

class OciRuntimeTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    name_ = GetParam();
    if (::geteuid() != 0) GTEST_SKIP() << "needs root";
    if (!Installed(BinaryOf(name_)))
      GTEST_SKIP() << BinaryOf(name_) << " is not installed (make deps installs it)";
    char tmpl[] = "/tmp/sbx-oci-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    ASSERT_EQ(::chmod(tmpl, 0711), 0);
    dir_ = tmpl;
    config_.name = name_;
    config_.binary = BinaryOf(name_);
    config_.run_dir = dir_ + "/run";
    config_.agent_path = SBX_AGENT_BIN;
    config_.preload_path = SBX_PRELOAD_SO;
    config_.cgroup_parent = "sbx-oci-test-" + std::to_string(::getpid());
    auto t0 = std::chrono::steady_clock::now();
    auto rt = OciRuntime::Open(config_);
    ASSERT_TRUE(rt.ok()) << rt.status().message();
    std::cout << name_ << ": Open (with its probe) took "
              << std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::steady_clock::now() - t0)
                     .count()
              << " ms; " << (*rt)->version() << "\n";
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
    if (dir_.empty()) return;
    rt_.reset();
    // Nothing of any box is left: its directory, a mount, the binary's container, a cgroup.
    for (const auto& n : DirNames(dir_ + "/run"))
      EXPECT_EQ(n[0], '.') << "leaked box directory " << n;
    auto mounts = ReadFile("/proc/self/mountinfo", 16 << 20);
    ASSERT_TRUE(mounts.ok());
    EXPECT_EQ(mounts->find(dir_), std::string::npos) << "a mount is left under " << dir_;
    EXPECT_EQ(Containers(), "") << "the binary still knows containers";
    for (const auto& d : CgroupDirs(config_.cgroup_parent, "")) {
      EXPECT_TRUE(DirNames(d).empty() || !HasSubdirs(d)) << "cgroup left in " << d;
      (void)::rmdir(d.c_str());
    }
    (void)RemoveTree(dir_);
  }

  static bool HasSubdirs(const std::string& dir) {
    for (const auto& n : DirNames(dir)) {
      struct stat st {};
      if (::stat((dir + "/" + n).c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return true;
    }
    return false;
  }

  // The ids `<binary> list` prints, one a line ("" for none).
  std::string Containers() {
    std::string cmd =
        std::string(BinaryOf(name_)) + " --root " + dir_ + "/run/.state list --quiet 2>&1";
    std::string out;
    if (FILE* p = ::popen(cmd.c_str(), "r")) {
      char buf[512];
      while (size_t n = ::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
      ::pclose(p);
    }
    return out;
  }

  BoxSpec Spec() {
    BoxSpec spec;
    spec.id = RandomId();
    spec.runtime = name_;
    spec.layers = tmpl_.layers;
    spec.binds = tmpl_.binds;
    spec.limits.memory_bytes = 256 << 20;
    spec.limits.pids = 64;
    return spec;
  }

  // The first line of `file` in the box's cgroup of the hierarchy that has it ("" if none).
  std::string CgroupValue(const std::string& id, const std::string& file) {
    for (const auto& d : CgroupDirs(config_.cgroup_parent, id)) {
      if (auto v = ReadFile(d + "/" + file, 4096); v.ok()) return v->substr(0, v->find('\n'));
    }
    return "";
  }

  // Everything Destroy must remove is gone.
  void ExpectGone(const Box& box) {
    struct stat st {};
    EXPECT_NE(::lstat(box.dir.c_str(), &st), 0) << box.dir;
    auto mounts = ReadFile("/proc/self/mountinfo", 16 << 20);
    ASSERT_TRUE(mounts.ok());
    EXPECT_EQ(mounts->find(box.dir), std::string::npos) << "a mount of the box is left";
    EXPECT_EQ(Containers().find(box.id), std::string::npos) << "the binary still knows it";
    EXPECT_TRUE(CgroupDirs(config_.cgroup_parent, box.id).empty()) << "a cgroup of it is left";
    if (box.init_pid > 0) {
      EXPECT_TRUE(Dead(box.init_pid)) << "its first process lives";
    }
  }

  std::string name_;
  std::string dir_;
  OciConfig config_;
  std::unique_ptr<OciRuntime> rt_;
  storage::Template tmpl_;
};

TEST_P(OciRuntimeTest, ABoxRunsCommandsThroughItsAgentAndDestroyLeavesNothing) {
  auto t0 = std::chrono::steady_clock::now();
  auto box = rt_->Create(Spec());
  ASSERT_TRUE(box.ok()) << box.status().message();
  auto created = std::chrono::steady_clock::now();
  auto [out, code] = RunSh(*box, "echo hello; id -u");
  auto answered = std::chrono::steady_clock::now();
  EXPECT_EQ(out, "hello\n0\n");
  EXPECT_EQ(code, 0);
  // A command holds its stdio and nothing of the agent's (gVisor has no close_range: the agent
  // closes what /proc/self/fd lists), with the native descriptor limit: soft as hard.
  auto fds = RunSh(*box,
                   "test $(ulimit -n) = $(ulimit -Hn) && test $(ulimit -n) -gt 1024 && echo "
                   "limit ok; python3 -c \"import os; "
                   "print(sorted(int(f) for f in os.listdir('/proc/self/fd')))\"");
  EXPECT_EQ(fds.first, "limit ok\n[0, 1, 2, 3]\n");
  // Users other than root reach the box's files: "/" is 0755, as in a native box.
  auto user =
      RunSh(*box,
            "setpriv --reuid=1000 --regid=1000 --clear-groups sh -c "
            "'cd /tmp && echo x > /tmp/u && cat /etc/hostname > /dev/null && echo user ok'");
  EXPECT_EQ(user.first, "user ok\n");
  // gVisor's /proc has no boot id: the box gets one of its own (runc's is the host's: runc
  // refuses binds into /proc).
  if (name_ == "gvisor") {
    auto boot = RunSh(*box, "cat /proc/sys/kernel/random/boot_id");
    auto host = ReadFile("/proc/sys/kernel/random/boot_id");
    ASSERT_TRUE(host.ok());
    EXPECT_EQ(boot.first.size(), 37u) << boot.first;
    EXPECT_NE(boot.first, *host);
    // Every host process of the box is in the box's id range: the Sentry is the box's
    // base+65534 (runsc's "nobody" in the box's user namespace), never the host's 65534 that
    // every other box's Sentry would share; all of them in the box's cgroup.
    auto procs = ReadFile(CgroupDirs(config_.cgroup_parent, box->id).front() + "/cgroup.procs");
    ASSERT_TRUE(procs.ok());
    std::set<std::string> uids;
    std::istringstream lines(*procs);
    for (std::string pid; std::getline(lines, pid);) {
      auto status = ReadFile("/proc/" + pid + "/status");
      if (!status.ok()) continue;
      size_t at = status->find("\nUid:\t");
      if (at != std::string::npos)
        uids.insert(status->substr(at + 6, status->find('\t', at + 6) - at - 6));
    }
    const std::string base = std::to_string(box->id_base);
    const std::string sentry = std::to_string(box->id_base + 65534);
    EXPECT_EQ(uids, (std::set<std::string>{base, sentry})) << "the box's host processes' uids";
    auto sentry_status = ReadFile("/proc/" + std::to_string(box->init_pid) + "/status");
    ASSERT_TRUE(sentry_status.ok());
    EXPECT_NE(sentry_status->find("\nUid:\t" + sentry + "\t"), std::string::npos) << *sentry_status;
    // What the host's root reads back is the host's root's: runsc's state (written by `create`
    // as the box's root, then given away) and the bundle (readable by the box's root group).
    struct stat state {};
    ASSERT_EQ(::stat((box->dir + "/state").c_str(), &state), 0);
    EXPECT_EQ(state.st_uid, 0u);
    EXPECT_FALSE(DirNames(box->dir + "/state").empty());
    for (const auto& n : DirNames(box->dir + "/state")) {
      struct stat st {};
      ASSERT_EQ(::lstat((box->dir + "/state/" + n).c_str(), &st), 0) << n;
      EXPECT_EQ(st.st_uid, 0u) << "state/" << n;
    }
    struct stat config {};
    ASSERT_EQ(::stat((box->dir + "/config.json").c_str(), &config), 0);
    EXPECT_EQ(config.st_uid, 0u);
    EXPECT_EQ(config.st_gid, box->id_base);
    EXPECT_EQ(config.st_mode & 07777, 0640u);
  }
  auto ms = [](auto a, auto b) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
  };
  std::cout << name_ << ": create " << ms(t0, created) << " ms (prepare "
            << box->timings.prepare_us / 1000 << ", create " << box->timings.clone_us / 1000
            << ", start " << box->timings.child_us / 1000 << ", agent "
            << box->timings.agent_us / 1000 << "), first command " << ms(created, answered)
            << " ms, create to first command " << ms(t0, answered) << " ms\n";
  RecordProperty("create_to_first_command_ms", std::to_string(ms(t0, answered)));
  EXPECT_EQ(box->runtime, name_);
  EXPECT_TRUE(box->idmapped);
  // The box's directory is root's and only passed through; its files are its root id's alone.
  struct stat dir_st {
  }, fs_st{};
  ASSERT_EQ(::stat(box->dir.c_str(), &dir_st), 0);
  EXPECT_EQ(dir_st.st_uid, 0u);
  EXPECT_EQ(dir_st.st_mode & 07777, 0711u);
  ASSERT_EQ(::stat((box->dir + "/fs").c_str(), &fs_st), 0);
  EXPECT_EQ(fs_st.st_uid, box->id_base);
  EXPECT_EQ(fs_st.st_mode & 07777, 0700u);

  // Under gVisor the box's kernel is gVisor's.
  if (name_ == "gvisor") {
    auto [dmesg, dcode] = RunSh(*box, "dmesg");
    EXPECT_NE(dmesg.find("Starting gVisor"), std::string::npos) << dmesg;
    // coreutils' statx with AT_NO_AUTOMOUNT, which this runsc refuses (EINVAL for every path
    // without the preloaded fix, gvisor_preload.c); a static program is on its own.
    auto [ls, lcode] =
        RunSh(*box, "ls -ld / > /dev/null && stat -c %F /etc && cat /etc/ld.so.preload");
    EXPECT_EQ(lcode, 0) << ls;
    EXPECT_EQ(ls, "directory\n/.sbx/preload.so\n");
  } else {
    // runc: root inside is the box's own host range, in a user namespace the box's root id owns.
    auto map = ReadFile("/proc/" + std::to_string(box->init_pid) + "/uid_map", 4096);
    ASSERT_TRUE(map.ok());
    EXPECT_NE(map->find(std::to_string(box->id_base)), std::string::npos) << *map;
    auto [k, kcode] = RunSh(*box, "uname -r");
    EXPECT_EQ(k, Trim(*ReadFile("/proc/sys/kernel/osrelease")) + "\n");
  }
  // The layers' files show their real owners; what the box writes is the box's range's on the
  // host, in its writable layer.
  auto [owners, ocode] =
      RunSh(*box,
            "stat -c %u /etc/passwd 2>/dev/null || python3 -c 'import os; "
            "print(os.stat(\"/etc/passwd\").st_uid)'; echo data > /root/f; sync");
  EXPECT_EQ(owners, "0\n");
  struct stat st {};
  ASSERT_EQ(::stat((box->dir + "/fs/upper/root/f").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, box->id_base);
  EXPECT_EQ(*ReadFile(box->dir + "/fs/upper/root/f"), "data\n");

  // The limits are the box's cgroups' (under gVisor the pids limit is the sandbox's host tasks').
  EXPECT_EQ(CgroupValue(box->id, "memory.limit_in_bytes"), std::to_string(256 << 20));
  EXPECT_EQ(CgroupValue(box->id, "pids.max"),
            std::to_string(name_ == "gvisor" ? GvisorHostPids(64) : 64));

  EXPECT_EQ(rt_->AgentExit(*box), std::nullopt);
  auto d0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(rt_->Destroy(*box).ok());
  std::cout << name_ << ": destroy " << ms(d0, std::chrono::steady_clock::now()) << " ms\n";
  ExpectGone(*box);
  EXPECT_TRUE(rt_->Destroy(*box).ok()) << "Destroy is idempotent";
}

TEST_P(OciRuntimeTest, FreezeThawStatsAndACopyOfTheWritableLayer) {
  auto box = rt_->Create(Spec());
  ASSERT_TRUE(box.ok()) << box.status().message();
  auto conn = protocol::AgentConnection::Connect(box->agent_socket);
  ASSERT_TRUE(conn.ok()) << conn.status().message();
  auto [out, code] = RunSh(*box, "mkdir -p /work && echo kept > /work/file && rm -f /etc/hostname");
  EXPECT_EQ(code, 0) << out;

  auto stats = rt_->Stats(*box);
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  EXPECT_GT(stats->memory_current, 0u);
  EXPECT_GE(stats->pids_current, 1u);
  EXPECT_GT(stats->disk_total, 0u);

  ASSERT_TRUE(rt_->Freeze(*box).ok());
  // A frozen agent cannot answer.
  auto frozen = conn->Call(Type::kListProcs, protocol::Writer(), nullptr, 300);
  EXPECT_FALSE(frozen.ok());
  // The copy a snapshot takes while the box is frozen: overlayfs' form (a whiteout for the
  // removed file), owned by the box's range.
  std::string dest = dir_ + "/copy";
  ASSERT_EQ(::mkdir(dest.c_str(), 0700), 0);
  ASSERT_TRUE(rt_->CopyWritableLayer(*box, dest, 1 << 30).ok());
  EXPECT_EQ(*ReadFile(dest + "/work/file"), "kept\n");
  struct stat st {};
  ASSERT_EQ(::lstat((dest + "/etc/hostname").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode) && st.st_rdev == 0) << "a whiteout";
  ASSERT_EQ(::stat((dest + "/work/file").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, box->id_base);

  ASSERT_TRUE(rt_->Thaw(*box).ok());
  // A claimed pool box's new limits.
  Limits wider;
  wider.memory_bytes = 512 << 20;
  wider.pids = 128;
  ASSERT_TRUE(rt_->SetLimits(*box, wider).ok());
  EXPECT_EQ(CgroupValue(box->id, "memory.limit_in_bytes"), std::to_string(512 << 20));
  EXPECT_EQ(CgroupValue(box->id, "pids.max"),
            std::to_string(name_ == "gvisor" ? GvisorHostPids(128) : 128));
  std::vector<protocol::Frame> procs;
  auto listed = conn->Call(Type::kListProcs, protocol::Writer(), &procs, 10000);
  ASSERT_TRUE(listed.ok()) << listed.status().message();
  ASSERT_TRUE(rt_->Destroy(*box).ok());
  ExpectGone(*box);
}

// A disk limit: the writable layer in an ext4 image of that size, mounted on the host beside the
// box (the root overlay writes there); a write past it is ENOSPC inside, the stats are the
// image's, and the box goes with its image's mount and loop device.
TEST_P(OciRuntimeTest, ADiskLimitIsAnImageOfThatSize) {
  BoxSpec spec = Spec();
  spec.limits.disk_bytes = 32 << 20;
  auto box = rt_->Create(spec);
  ASSERT_TRUE(box.ok()) << box.status().message();
  auto [out, code] = RunSh(*box,
                           "echo kept > /root/k && head -c 64M /dev/zero > /root/z; echo $?; "
                           "cat /root/k; setpriv --reuid=1000 --regid=1000 --clear-groups sh -c "
                           "'cd /tmp && echo user ok'");
  EXPECT_EQ(out, "1\nkept\nuser ok\n");
  auto stats = rt_->Stats(*box);
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  EXPECT_LE(stats->disk_total, uint64_t{32} << 20);
  EXPECT_GE(stats->disk_total, uint64_t{20} << 20);
  EXPECT_GE(stats->disk_used, uint64_t{16} << 20);
  std::string dest = dir_ + "/copy";
  ASSERT_EQ(::mkdir(dest.c_str(), 0700), 0);
  ASSERT_TRUE(rt_->CopyWritableLayer(*box, dest, 1 << 30).ok());
  EXPECT_EQ(*ReadFile(dest + "/root/k"), "kept\n");
  auto loop = LoopDeviceOf(box->dir + "/disk.img");
  ASSERT_TRUE(loop.ok()) << loop.status().message();
  ASSERT_TRUE(rt_->Destroy(*box).ok());
  ExpectGone(*box);
  EXPECT_FALSE(LoopDeviceOf(box->dir + "/disk.img").ok()) << *loop << " is still attached";
}

// runc boxes run under the native seccomp policy: a denied call is EPERM (or EAFNOSUPPORT for a
// socket family), a call the policy does not name ENOSYS, so glibc's fallbacks (clone3 -> clone)
// work and threads start. gVisor boxes meet gVisor's own system calls (no OCI seccomp there, see
// oci_spec.cc): threads start and dmesg reads gVisor's log.
TEST_P(OciRuntimeTest, SystemCallsAreTheNativePolicysUnderRunc) {
  auto box = rt_->Create(Spec());
  ASSERT_TRUE(box.ok()) << box.status().message();
  const std::string probe =
      "python3 -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); "
      "print(l.syscall(250, 0, 0, 0, 0, 0), ctypes.get_errno(), "  // keyctl: denied
      "l.syscall(399, 0, 0, 0, 0, 0), ctypes.get_errno(), "        // unassigned: not named
      "l.syscall(41, 17, 3, 0), ctypes.get_errno())' 2>&1; "       // socket(AF_PACKET)
      "python3 -c 'import threading; t = threading.Thread(target=print, args=(\"thread\",)); "
      "t.start(); t.join()' 2>&1";
  auto [out, code] = RunSh(*box, probe);
  if (name_ == "runc") {
    EXPECT_EQ(out, "-1 1 -1 38 -1 97\nthread\n") << "code " << code;
  } else {
    EXPECT_NE(out.find("thread\n"), std::string::npos) << out;
  }
  ASSERT_TRUE(rt_->Destroy(*box).ok());
}

TEST_P(OciRuntimeTest, SocketsInTheBoxsNetworkNamespace) {
  auto box = rt_->Create(Spec());
  ASSERT_TRUE(box.ok()) << box.status().message();
  auto sock = rt_->OpenSocket(*box, AF_INET, SOCK_STREAM);
  if (name_ == "gvisor") {
    ASSERT_FALSE(sock.ok());
    EXPECT_EQ(sock.status().err(), ENOTSUP);
    EXPECT_NE(sock.status().message().find("gVisor"), std::string::npos) << sock.status().message();
  } else {
    ASSERT_TRUE(sock.ok()) << sock.status().message();
    // The socket's network namespace is the box's agent's.
    UniqueFd ns(::ioctl(sock->get(), SIOCGSKNS));
    ASSERT_TRUE(ns) << std::strerror(errno);
    struct stat a {
    }, b{};
    ASSERT_EQ(::fstat(ns.get(), &a), 0);
    ASSERT_EQ(::stat(("/proc/" + std::to_string(box->init_pid) + "/ns/net").c_str(), &b), 0);
    EXPECT_EQ(a.st_ino, b.st_ino);
    struct stat mine {};
    ASSERT_EQ(::stat("/proc/self/ns/net", &mine), 0);
    EXPECT_NE(a.st_ino, mine.st_ino);
  }
  ASSERT_TRUE(rt_->Destroy(*box).ok());
}

// The owner lock: a box whose owner lives cannot be adopted; once it is gone (its runtime object
// and so its lock), another adopts it and it keeps running; orphans of a dead owner are reaped.
TEST_P(OciRuntimeTest, AdoptionAndOrphansFollowTheOwnerLock) {
  BoxSpec spec = Spec();
  spec.owner = "serve";
  auto box = rt_->Create(spec);
  ASSERT_TRUE(box.ok()) << box.status().message();
  auto other = OciRuntime::Open(config_);
  ASSERT_TRUE(other.ok()) << other.status().message();
  auto taken = (*other)->Adopt(box->id);
  ASSERT_FALSE(taken.ok());
  EXPECT_EQ(taken.status().err(), EBUSY);
  EXPECT_EQ(*(*other)->ReapOrphans("serve"), 0);

  rt_.reset();  // its owner "dies": the lock is released, the box runs on
  auto adopted = (*other)->Adopt(box->id);
  ASSERT_TRUE(adopted.ok()) << adopted.status().message();
  EXPECT_EQ(adopted->id_base, box->id_base);
  EXPECT_EQ(RunSh(*adopted, "echo still").first, "still\n");
  auto ids = (*other)->ListBoxes();
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, std::vector<std::string>{box->id});

  other->reset();  // and its adopter too
  auto reaper = OciRuntime::Open(config_);
  ASSERT_TRUE(reaper.ok());
  EXPECT_EQ(*(*reaper)->ReapOrphans("run"), 0) << "another owner's orphans are not ours";
  EXPECT_EQ(*(*reaper)->ReapOrphans("serve"), 1);
  ExpectGone(*box);
  rt_ = std::move(*reaper);
}

// A gVisor sandbox that ends after its box met its memory limit is told as ended of it: with the
// kernel's killer off (the guard's), an allocation of the kernel's own for the Sentry at the limit
// fails without an OOM event, and gVisor panics on some (oom_guard.h). The limit is met here by a
// host process the test puts in the box's memory cgroup (page cache it writes past the limit,
// reclaimed as it goes), and the panic is a SIGKILL of the sandbox's processes; a sandbox killed
// far from its limit is no OOM.
TEST_P(OciRuntimeTest, AGuardedSandboxThatEndsAfterMeetingItsLimitEndedOfIt) {
  if (name_ != "gvisor") GTEST_SKIP() << "the OOM guard watches gVisor boxes alone";
  for (bool met : {false, true}) {
    SCOPED_TRACE(met ? "met its limit" : "did not");
    BoxSpec spec = Spec();
    spec.limits.memory_bytes = 128 << 20;
    auto box = rt_->Create(spec);
    ASSERT_TRUE(box.ok()) << box.status().message();
    if (CgroupValue(box->id, "memory.oom_control") != "oom_kill_disable 1")
      GTEST_SKIP() << "no v1 memory controller: the guard does not act";
    std::string memcg;
    for (const auto& d : CgroupDirs(config_.cgroup_parent, box->id))
      if (::access((d + "/memory.limit_in_bytes").c_str(), F_OK) == 0) memcg = d;
    ASSERT_FALSE(memcg.empty());
    if (met) {
      std::string buf(64 << 10, 'x');
      std::string file = box->dir + "/page-cache";
      pid_t pid = ::fork();
      if (pid == 0) {
        int procs = ::open((memcg + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
        int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        if (procs < 0 || fd < 0 || ::write(procs, "0", 1) != 1) ::_exit(2);
        for (int i = 0; i < 4096; ++i) {
          if (::write(fd, buf.data(), buf.size()) != static_cast<ssize_t>(buf.size())) ::_exit(3);
          if (i % 128 == 127 && ::fdatasync(fd) != 0) ::_exit(4);
        }
        ::_exit(0);
      }
      int status = 0;
      ASSERT_EQ(::waitpid(pid, &status, 0), pid);
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
      ASSERT_EQ(::unlink(file.c_str()), 0);
    }
    // gVisor's panic: every process of the sandbox ends.
    std::vector<UniqueFd> ending;
    auto procs = ReadFile(memcg + "/cgroup.procs", 1 << 16);
    ASSERT_TRUE(procs.ok());
    std::istringstream lines(*procs);
    for (std::string pid; std::getline(lines, pid);) {
      UniqueFd p(static_cast<int>(::syscall(SYS_pidfd_open, std::stoi(pid), 0)));
      if (!p) continue;
      EXPECT_EQ(::syscall(SYS_pidfd_send_signal, p.get(), SIGKILL, nullptr, 0), 0);
      ending.push_back(std::move(p));
    }
    ASSERT_FALSE(ending.empty());
    for (const UniqueFd& p : ending) {
      pollfd pfd{.fd = p.get(), .events = POLLIN, .revents = 0};
      ASSERT_EQ(::poll(&pfd, 1, -1), 1);
    }
    EXPECT_TRUE(rt_->AgentExit(*box).has_value());
    auto stats = rt_->Stats(*box);
    ASSERT_TRUE(stats.ok()) << stats.status().message();
    EXPECT_EQ(stats->oom_kills, 0u);
    EXPECT_EQ(stats->ooms, met ? 1u : 0u);
    ASSERT_TRUE(rt_->Destroy(*box).ok());
    ExpectGone(*box);
  }
}

// Row 43 of threats.md: a memory bomb dies alone and the box serves on. Under runc the host's
// kernel kills the bomb's process; under gVisor that kernel would take one of the sandbox's host
// processes and the whole sandbox with it, so sbx's OOM guard (oom_guard.h) has the box's agent
// kill the bomb instead: the kernel's own count stays 0, the limit is the box's again after, and
// a runtime that adopts the box takes the guard over.
TEST_P(OciRuntimeTest, AMemoryBombDiesAloneAndTheBoxServesOn) {
  BoxSpec spec = Spec();
  spec.owner = "serve";
  spec.limits.memory_bytes = 128 << 20;
  auto box = rt_->Create(spec);
  ASSERT_TRUE(box.ok()) << box.status().message();
  const bool guarded = name_ == "gvisor" && !CgroupValue(box->id, "memory.oom_control").empty();
  if (guarded) {
    EXPECT_EQ(CgroupValue(box->id, "memory.oom_control"), "oom_kill_disable 1");
  }
  const std::string bomb =
      "python3 -c 'a = []\nwhile True: a.append(b\"x\" * (16 << 20))'; echo status $?";
  auto limit_back = [&] {
    // The guard writes the limit back once the box's usage is under it (it polls for that).
    for (int i = 0; i < 5000; ++i) {
      if (CgroupValue(box->id, "memory.limit_in_bytes") == std::to_string(128 << 20)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  };
  OciRuntime* rt = rt_.get();
  std::unique_ptr<OciRuntime> adopter;
  for (int round = 1; round <= 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto [out, code] = RunSh(*box, bomb, 60000);
    EXPECT_EQ(out, "status 137\n") << "the bomb dies of SIGKILL";
    EXPECT_EQ(code, 0);
    EXPECT_EQ(RunSh(*box, "echo alive").first, "alive\n");
    auto kills = rt->OomKills(*box);
    ASSERT_TRUE(kills.ok()) << kills.status().message();
    EXPECT_EQ(*kills, static_cast<uint64_t>(round));
    auto stats = rt->Stats(*box);
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats->oom_kills, static_cast<uint64_t>(round));
    if (guarded) {
      // Each runtime's guard counts the OOMs it heard (the adopter's from round 2 on).
      EXPECT_GE(stats->ooms, 1u);
      EXPECT_TRUE(limit_back()) << "the limit stayed raised";
      auto log = ReadFile(box->dir + "/agent.log", 1 << 20);
      ASSERT_TRUE(log.ok());
      EXPECT_NE(log->find("out of memory: killed pid"), std::string::npos) << *log;
      EXPECT_EQ(log->find("OOM killer decides"), std::string::npos) << *log;
    }
    if (round == 1) {
      rt_.reset();  // its owner "dies" cleanly: the box is the kernel's again, until adopted
      if (guarded) {
        EXPECT_EQ(CgroupValue(box->id, "memory.oom_control"), "oom_kill_disable 0");
      }
      auto other = OciRuntime::Open(config_);
      ASSERT_TRUE(other.ok()) << other.status().message();
      adopter = std::move(other).value();
      auto adopted = adopter->Adopt(box->id);
      ASSERT_TRUE(adopted.ok()) << adopted.status().message();
      if (guarded) {
        EXPECT_EQ(CgroupValue(box->id, "memory.oom_control"), "oom_kill_disable 1");
      }
      rt = adopter.get();
    }
  }
  if (guarded) {
    for (const auto& d : CgroupDirs(config_.cgroup_parent, box->id)) {
      auto oc = ReadFile(d + "/memory.oom_control", 4096);
      if (oc.ok()) {
        EXPECT_NE(oc->find("oom_kill 0"), std::string::npos) << *oc;
      }
    }
  }
  ASSERT_TRUE(rt->Destroy(*box).ok());
  ExpectGone(*box);
  rt_ = std::move(adopter);
}

// MaxLayers says how many layers a box stacks: with the layers given one fsconfig(lowerdir+)
// each (kernels from 6.8), overlayfs' own 500; with one option string, as many as fit a page for
// a box of that id. A box of that many starts; one of one more is refused (E2BIG), leaving
// nothing.
TEST_P(OciRuntimeTest, MaxLayersIsAsManyAsTheOverlayTakes) {
  for (bool plus : {true, false}) {
    OciConfig c = config_;
    c.overlay_lowerdir_plus = plus;
    auto rt = OciRuntime::Open(c);
    ASSERT_TRUE(rt.ok()) << rt.status().message();
    BoxSpec spec = Spec();
    const size_t most = (*rt)->MaxLayers(Box{spec.id});
    if (plus && (*rt)->LowerdirPlus()) {
      EXPECT_EQ(most, 500u);
    } else {
      EXPECT_GT(most, 10u);
      EXPECT_LT(most, 500u);
    }
    for (size_t i = spec.layers.size(); i <= most; ++i) {
      std::string layer = dir_ + "/empty-layer-" + std::to_string(i);
      ASSERT_TRUE(MakeDirs(layer).ok());
      spec.layers.insert(spec.layers.begin(), layer);
    }
    ASSERT_EQ(spec.layers.size(), most + 1);
    auto refused = (*rt)->Create(spec);
    EXPECT_EQ(refused.status().err(), E2BIG) << refused.status().message();
    Box gone{spec.id};
    gone.dir = config_.run_dir + "/" + spec.id;
    ExpectGone(gone);
    spec.layers.erase(spec.layers.begin());
    spec.id = RandomId();
    auto box = (*rt)->Create(spec);
    ASSERT_TRUE(box.ok()) << box.status().message();
    EXPECT_EQ(RunSh(*box, "test -d /etc && echo up", 30000).first, "up\n");
    ASSERT_TRUE((*rt)->Destroy(*box).ok());
    ExpectGone(*box);
  }
}

TEST_P(OciRuntimeTest, AFailedCreateLeavesNothing) {
  BoxSpec spec = Spec();
  spec.layers = {dir_ + "/no-such-layer"};
  auto box = rt_->Create(spec);
  ASSERT_FALSE(box.ok());
  EXPECT_NE(box.status().message().find(dir_ + "/no-such-layer"), std::string::npos)
      << box.status().message();
  // A bind whose source is missing, after the layers were mounted.
  spec = Spec();
  spec.binds.push_back({"/nonexistent-source", "/x", true, {}});
  auto bound = rt_->Create(spec);
  ASSERT_FALSE(bound.ok());
  EXPECT_NE(bound.status().message().find("/nonexistent-source"), std::string::npos)
      << bound.status().message();
  // A hook at the sync point that fails (runc: its init waiting; gVisor: before `create`).
  spec = Spec();
  spec.at_sync_point = [](pid_t) { return Status::Error("hook says no", EIO); };
  auto hooked = rt_->Create(spec);
  ASSERT_FALSE(hooked.ok());
  EXPECT_NE(hooked.status().message().find("hook says no"), std::string::npos)
      << hooked.status().message();
  // TearDown checks directories, mounts, containers and cgroups.
}

// An agent that exits at once: under gVisor the create fails (the socket never appears) after the
// container was made, and takes it away; under runc the socket is sbx's own, so the box is made
// and its agent's exit is reported.
TEST_P(OciRuntimeTest, AnAgentThatCannotStart) {
  OciConfig broken = config_;
  broken.agent_path = "/bin/false";
  auto rt = OciRuntime::Open(broken);
  ASSERT_TRUE(rt.ok()) << rt.status().message();
  auto box = (*rt)->Create(Spec());
  if (name_ == "gvisor") {
    ASSERT_FALSE(box.ok());
    EXPECT_NE(box.status().message().find("exited before its agent listened"), std::string::npos)
        << box.status().message();
  } else {
    ASSERT_TRUE(box.ok()) << box.status().message();
    auto first = RunSh(*box, "true", 2000);
    EXPECT_EQ(first.second, -1) << first.first;
    // The agent exits on its own, and may not have yet when the connection is refused: wait for
    // that event (its pidfd turns readable; an already reaped one has none to wait for).
    UniqueFd agent(static_cast<int>(::syscall(SYS_pidfd_open, box->init_pid, 0)));
    if (agent) {
      pollfd p{agent.get(), POLLIN, 0};
      EXPECT_EQ(::poll(&p, 1, 30000), 1) << "the agent did not exit";
    }
    EXPECT_TRUE((*rt)->AgentExit(*box).has_value());
    ASSERT_TRUE((*rt)->Destroy(*box).ok());
    ExpectGone(*box);
  }
  // TearDown checks directories, mounts, containers and cgroups.
}

// A build step's result: the box is destroyed and its writable layer moved to become a layer.
TEST_P(OciRuntimeTest, DestroyKeepingTheWritableLayer) {
  auto box = rt_->Create(Spec());
  ASSERT_TRUE(box.ok()) << box.status().message();
  EXPECT_EQ(RunSh(*box, "echo built > /root/out").second, 0);
  std::string dest = dir_ + "/kept";
  auto kept = rt_->DestroyKeepingUpper(*box, dest);
  ASSERT_TRUE(kept.ok()) << kept.message();
  EXPECT_EQ(*ReadFile(dest + "/root/out"), "built\n");
  ExpectGone(*box);
}

TEST_P(OciRuntimeTest, APausedBoxIsDestroyedAtOnce) {
  auto box = rt_->Create(Spec());
  ASSERT_TRUE(box.ok()) << box.status().message();
  ASSERT_TRUE(rt_->Freeze(*box).ok());
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(rt_->Stop(*box).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2)) << "Stop waited";
  EXPECT_TRUE(rt_->AgentExit(*box).has_value());
  auto destroyed = rt_->Destroy(*box);
  ASSERT_TRUE(destroyed.ok()) << destroyed.message();
  ExpectGone(*box);
}

TEST_P(OciRuntimeTest, AnAgentThatExitsIsReported) {
  auto box = rt_->Create(Spec());
  ASSERT_TRUE(box.ok()) << box.status().message();
  EXPECT_EQ(rt_->AgentExit(*box), std::nullopt);
  ASSERT_TRUE(rt_->Stop(*box).ok());
  auto exit = rt_->AgentExit(*box);
  ASSERT_TRUE(exit.has_value());
  EXPECT_FALSE(exit->empty());
  ASSERT_TRUE(rt_->Destroy(*box).ok());
  ExpectGone(*box);
}

INSTANTIATE_TEST_SUITE_P(Runtimes, OciRuntimeTest, ::testing::Values("gvisor", "runc"),
                         [](const auto& p) { return p.param; });

TEST(OciRuntimeOpenTest, AMissingBinaryFailsNamingTheRuntime) {
  for (const char* name : {"gvisor", "runc"}) {
    OciConfig c;
    c.name = name;
    c.binary = std::string("/nonexistent/") + BinaryOf(name);
    c.run_dir = "/nonexistent/run";
    c.agent_path = SBX_AGENT_BIN;
    auto rt = OciRuntime::Open(c);
    ASSERT_FALSE(rt.ok());
    EXPECT_EQ(rt.status().err(), ENOENT);
    EXPECT_NE(rt.status().message().find(std::string("runtime ") + name), std::string::npos)
        << rt.status().message();
    EXPECT_NE(rt.status().message().find("not installed"), std::string::npos)
        << rt.status().message();
  }
  OciConfig c;
  c.name = "kata";
  auto rt = OciRuntime::Open(c);
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().err(), EINVAL);
}

// A binary that exists but cannot run containers fails its probe, naming the runtime.
TEST(OciRuntimeOpenTest, ABinaryThatFailsItsProbeFailsOpen) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root";
  char tmpl[] = "/tmp/sbx-oci-open-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  ASSERT_EQ(::chmod(tmpl, 0711), 0);
  std::string dir = tmpl;
  // Answers --version, fails everything else.
  std::string fake = dir + "/runc";
  ASSERT_TRUE(
      WriteFile(fake,
                "#!/bin/sh\n[ \"$1\" = --version ] && { echo 'runc version 0-fake'; exit 0; }\n"
                "echo 'fake runtime: cannot' >&2; exit 1\n",
                0755)
          .ok());
  OciConfig c;
  c.name = "runc";
  c.binary = fake;
  c.run_dir = dir + "/run";
  c.agent_path = SBX_AGENT_BIN;
  c.cgroup_parent = "sbx-oci-open-test-" + std::to_string(::getpid());
  auto rt = OciRuntime::Open(c);
  ASSERT_FALSE(rt.ok());
  EXPECT_NE(rt.status().message().find("runtime runc"), std::string::npos) << rt.status().message();
  EXPECT_NE(rt.status().message().find("does not run boxes here"), std::string::npos)
      << rt.status().message();
  EXPECT_NE(rt.status().message().find("fake runtime: cannot"), std::string::npos)
      << rt.status().message();
  auto mounts = ReadFile("/proc/self/mountinfo", 16 << 20);
  EXPECT_EQ(mounts->find(dir), std::string::npos) << "the probe left a mount";
  for (const auto& d : CgroupDirs(c.cgroup_parent, "")) (void)::rmdir(d.c_str());
  // A directory above the run directory that a box's ids cannot pass: said before any probe.
  ASSERT_EQ(::chmod(tmpl, 0700), 0);
  auto closed = OciRuntime::Open(c);
  ASSERT_FALSE(closed.ok());
  EXPECT_EQ(closed.status().err(), EACCES);
  EXPECT_NE(closed.status().message().find(dir + " (mode 0700) is not searchable"),
            std::string::npos)
      << closed.status().message();
  (void)RemoveTree(dir);
}

}  // namespace
}  // namespace sbx::runtime
