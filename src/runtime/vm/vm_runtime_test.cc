// VmRuntime with real QEMU: one box of the host template booted on the guest kernel (under TCG
// here, or KVM where the probe boot answers), reached through its agent over the virtio-serial
// port (two connections at once), its files, its console's bound, a QEMU that dies, then destroyed
// with nothing left on the host (QEMU, the port's host end, the disk image, the socket, the
// cgroup, the box directory, a mount). Boots are seconds under TCG: the one box does everything.
// Needs root; skipped, saying why, without QEMU or the kernel (make deps).
#include "runtime/vm/vm_runtime.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <chrono>
#include <iostream>

#include "agent/vm_mux.h"
#include "common/fd.h"
#include "common/fs.h"
#include "protocol/client.h"
#include "runtime/box_host.h"
#include "runtime/native/cgroup.h"
#include "runtime/vm/initramfs.h"
#include "storage/template.h"
#include "store/store.h"

namespace sbx::runtime {
namespace {

using protocol::Tag;
using protocol::Type;

constexpr char kKernelDir[] = "/var/cache/sbx/vm-kernel";

// Why the vm runtime cannot run here ("" when it can).
std::string Missing() {
  if (::geteuid() != 0) return "needs root";
  if (FindBinary("qemu-system-x86_64").empty())
    return "qemu-system-x86_64 is not installed (make deps installs qemu-system-x86)";
  bool kernel = false;
  for (const auto& n : DirNames(std::string(kKernelDir) + "/boot"))
    kernel = kernel || n.rfind("vmlinuz-", 0) == 0;
  if (!kernel) return std::string("no guest kernel in ") + kKernelDir + " (make deps unpacks one)";
  return "";
}

// Spawns `command` under /bin/sh in the box on connection `c`; the process's tag for Collect.
Status Start(protocol::AgentConnection& c, const std::string& command) {
  protocol::Writer w;
  w.Str(Tag::kArgv, "/bin/sh")
      .Str(Tag::kArgv, "-c")
      .Str(Tag::kArgv, command)
      .Str(Tag::kEnv, "PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin");
  return c.Call(Type::kSpawn, w).status();
}

// The stdout and exit code of the process started on `c`.
std::pair<std::string, int64_t> Collect(protocol::AgentConnection& c, int timeout_ms = 60000) {
  std::string out;
  for (;;) {
    auto f = c.Receive(timeout_ms);
    if (!f.ok()) return {out + "receive: " + f.status().message(), -1};
    if (f->type() == Type::kOutput && f->fields.Int(Tag::kStream) == 1)
      out += f->fields.Str(Tag::kData);
    if (f->type() == Type::kExit) return {out, f->fields.Int(Tag::kExitCode, -1)};
  }
}

std::pair<std::string, int64_t> RunSh(const Box& box, const std::string& command) {
  auto c = protocol::AgentConnection::Connect(box.agent_socket, 60000);
  if (!c.ok()) return {"connect: " + c.status().message(), -1};
  if (Status s = Start(*c, command); !s.ok()) return {"spawn: " + s.message(), -1};
  return Collect(*c);
}

bool Dead(pid_t pid) {
  auto stat = ReadFile("/proc/" + std::to_string(pid) + "/stat", 4096);
  if (!stat.ok()) return true;
  size_t paren = stat->rfind(')');
  return paren != std::string::npos && paren + 2 < stat->size() &&
         ((*stat)[paren + 2] == 'Z' || (*stat)[paren + 2] == 'X');
}

int64_t MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t)
      .count();
}

TEST(VmInitramfsTest, ModulesComeAfterWhatTheyNeed) {
  if (!Missing().empty() && Missing() != "needs root") GTEST_SKIP() << Missing();
  std::string modules;
  for (const auto& n : DirNames(std::string(kKernelDir) + "/lib/modules"))
    modules = std::string(kKernelDir) + "/lib/modules/" + n;
  auto mods = ResolveModules(modules, {"9pnet_virtio", "virtio_mmio"});
  ASSERT_TRUE(mods.ok()) << mods.status().message();
  auto pos = [&](const std::string& name) {
    for (size_t i = 0; i < mods->size(); ++i)
      if ((*mods)[i].find("/" + name + ".ko") != std::string::npos) return static_cast<int>(i);
    return -1;
  };
  ASSERT_GE(pos("virtio_ring"), 0);
  EXPECT_LT(pos("virtio_ring"), pos("virtio"));
  EXPECT_LT(pos("virtio"), pos("virtio_mmio"));
  EXPECT_LT(pos("9pnet"), pos("9pnet_virtio"));
  auto none = ResolveModules(modules, {"no_such_module"});
  EXPECT_EQ(none.status().err(), ENOENT);
}

TEST(VmRuntimeOpenTest, AMissingKernelFailsSayingWhere) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root";
  VmConfig c;
  c.run_dir = "/tmp/sbx-vm-open-test-" + std::to_string(::getpid());
  c.agent_path = SBX_AGENT_BIN;
  c.kernel_dir = "/nonexistent/vm-kernel";
  auto rt = VmRuntime::Open(c);
  ASSERT_FALSE(rt.ok());
  EXPECT_NE(rt.status().message().find("/nonexistent/vm-kernel"), std::string::npos)
      << rt.status().message();
  (void)RemoveTree(c.run_dir);
}

class VmRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = Missing(); !why.empty()) GTEST_SKIP() << why;
    char tmpl[] = "/tmp/sbx-vm-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    ASSERT_EQ(::chmod(tmpl, 0711), 0);
    dir_ = tmpl;
    config_.run_dir = dir_ + "/run";
    config_.agent_path = SBX_AGENT_BIN;
    config_.kernel_dir = kKernelDir;
    config_.cgroup_parent = "sbx-vm-test-" + std::to_string(::getpid());
    // The template store's layers reach the guest as a stack image; the host's binds over 9p.
    config_.immutable_layers = dir_ + "/templates/layers";
    auto t0 = std::chrono::steady_clock::now();
    auto rt = VmRuntime::Open(config_);
    ASSERT_TRUE(rt.ok()) << rt.status().message();
    std::cout << "vm: Open took " << MsSince(t0) << " ms; accelerator " << (*rt)->accel() << " ("
              << (*rt)->accel_why() << "); guest kernel " << (*rt)->kernel_release() << "\n";
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
    for (const auto& n : DirNames(dir_ + "/run"))
      EXPECT_EQ(n[0], '.') << "leaked box directory " << n;
    auto mounts = ReadFile("/proc/self/mountinfo", 16 << 20);
    ASSERT_TRUE(mounts.ok());
    EXPECT_EQ(mounts->find(dir_), std::string::npos) << "a mount is left under " << dir_;
    if (auto host = ProbeCgroupHost(config_.cgroup_parent); host.ok()) {
      for (const auto& d : {host->v2_dir}) {
        if (d.empty()) continue;
        for (const auto& n : DirNames(d)) {
          struct stat st {};
          if (::stat((d + "/" + n).c_str(), &st) == 0 && S_ISDIR(st.st_mode))
            ADD_FAILURE() << "cgroup left: " << d << "/" << n;
        }
        (void)::rmdir(d.c_str());
      }
      for (const auto& [controller, d] : host->v1_dirs) (void)::rmdir(d.c_str());
    }
    (void)RemoveTree(dir_);
  }

  std::string dir_;
  VmConfig config_;
  std::unique_ptr<VmRuntime> rt_;
  storage::Template tmpl_;
};

TEST_F(VmRuntimeTest, ABoxRunsOnItsOwnKernelThroughItsAgentAndDestroyLeavesNothing) {
  BoxSpec spec;
  spec.id = RandomId();
  spec.runtime = "vm";
  spec.layers = tmpl_.layers;
  spec.binds = tmpl_.binds;
  spec.limits.memory_bytes = 256 << 20;
  spec.limits.disk_bytes = 256 << 20;
  spec.limits.pids = 128;
  auto t0 = std::chrono::steady_clock::now();
  auto box = rt_->Create(spec);
  ASSERT_TRUE(box.ok()) << box.status().message();
  std::cout << "vm: boot to an answering agent took " << MsSince(t0) << " ms (prepare "
            << box->timings.prepare_us / 1000 << " ms, agent " << box->timings.agent_us / 1000
            << " ms)\n";
  EXPECT_EQ(rt_->AgentExit(*box), std::nullopt);
  struct stat st {};
  ASSERT_EQ(::lstat(box->agent_socket.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_uid, 0u) << "the agent socket is root's, never QEMU's id's";

  // The guest's own kernel, not the host's.
  t0 = std::chrono::steady_clock::now();
  auto [release, code] = RunSh(*box, "uname -r");
  std::cout << "vm: first command took " << MsSince(t0) << " ms\n";
  EXPECT_EQ(code, 0) << release;
  EXPECT_EQ(release, rt_->kernel_release() + "\n");
  utsname host{};
  ::uname(&host);
  auto [pid1, code1] = RunSh(*box, "cat /proc/1/cmdline | tr '\\0' ' '; echo; id -u; hostname");
  EXPECT_EQ(code1, 0);
  EXPECT_EQ(pid1,
            "/.sbx/sbx-agent --listen /.sbx/run/agent.sock --vm-port /dev/vport0p1 \n0\nsbx\n");

  // Files: written on the writable layer (ext4 in the guest), read back; the layers are read-only
  // underneath, and the host's /usr is there.
  auto [wrote, wcode] = RunSh(*box,
                              "echo hello > /root.txt && mkdir -p /home/x && cp /root.txt "
                              "/home/x/y && cat /home/x/y && test -x /usr/bin/env && "
                              "findmnt -no FSTYPE / ");
  EXPECT_EQ(wcode, 0) << wrote;
  EXPECT_EQ(wrote, "hello\noverlay\n");

  // The pids limit is the guest's own cgroup's, around everything the agent starts; the agent's
  // copy in /.sbx is read-only.
  auto [cg, cgcode] = RunSh(*box, "cat /proc/self/cgroup; touch /.sbx/x 2>&1 | grep -c Read-only");
  EXPECT_EQ(cg, "0::/box\n1\n");
  // kill(-1) by the guest's root spares PID 1, which carries the port: the box still answers.
  auto [killed, kcode] = RunSh(*box, "sleep 100 & kill -9 -1; echo alive");
  EXPECT_EQ(killed, "alive\n");
  EXPECT_EQ(RunSh(*box, "echo still").first, "still\n");
  // A memory bomb meets the guest's OOM killer, whose kills Stats counts (the host's cgroup sees
  // none). dd fills a 200 MiB buffer (less than the guest's RAM, which its kernel would refuse
  // outright; more than it has free) in one read(2), so the OOM kill comes at once: a bomb that
  // runs code between its allocations, Python's, first has the guest evict and re-read its own
  // program's pages over and over under TCG.
  auto [bomb, bcode0] =
      RunSh(*box, "dd if=/dev/zero of=/dev/null bs=200M count=1 2>/dev/null; echo $?");
  EXPECT_EQ(bomb, "137\n");
  auto oom = rt_->Stats(*box);
  ASSERT_TRUE(oom.ok()) << oom.status().message();
  EXPECT_EQ(oom->oom_kills, 1u);

  // Two connections at once, each with a process whose output interleaves with the other's.
  auto a = protocol::AgentConnection::Connect(box->agent_socket, 60000);
  auto b = protocol::AgentConnection::Connect(box->agent_socket, 60000);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(Start(*a, "seq 1 30000 | tail -n 1").ok());
  ASSERT_TRUE(Start(*b, "seq 1 20000 | tail -n 1").ok());
  auto [bout, bcode] = Collect(*b);
  EXPECT_EQ(bout, "20000\n");
  EXPECT_EQ(bcode, 0);
  auto [aout, acode2] = Collect(*a);
  EXPECT_EQ(aout, "30000\n");
  EXPECT_EQ(acode2, 0);

  // The host template binds host directories (9p): QEMU cannot save such a box, and the box is
  // left as it was.
  ASSERT_EQ(::mkdir((dir_ + "/nosave").c_str(), 0700), 0);
  EXPECT_EQ(rt_->SaveMemory(*box, dir_ + "/nosave", true).err(), ENOTSUP);
  EXPECT_EQ(RunSh(*box, "cat /root.txt").first, "hello\n");

  EXPECT_TRUE(rt_->Freeze(*box).ok());
  EXPECT_TRUE(rt_->Thaw(*box).ok());
  auto stats = rt_->Stats(*box);
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  EXPECT_GT(stats->memory_current, 0u);
  EXPECT_EQ(stats->disk_total, 256u << 20);
  auto [after, acode] = RunSh(*box, "cat /root.txt");
  EXPECT_EQ(after, "hello\n");

  const std::string cgroup_dir =
      ProbeCgroupHost(config_.cgroup_parent).ok()
          ? ProbeCgroupHost(config_.cgroup_parent)->v2_dir + "/" + spec.id
          : "";
  // The guest writes its console at will; the host keeps the newest part of it, bounded.
  t0 = std::chrono::steady_clock::now();
  auto [flood, fcode] =
      RunSh(*box, "head -c 1100000 /dev/zero | tr '\\0' x > /dev/console; echo END > /dev/console");
  EXPECT_EQ(fcode, 0) << flood;
  const std::string console = box->dir + "/console.log";
  UniqueFd in(::inotify_init1(IN_CLOEXEC));
  ASSERT_TRUE(in);
  ASSERT_GE(::inotify_add_watch(in.get(), console.c_str(), IN_MODIFY), 0);
  for (;;) {
    auto log = ReadFile(console, 4 << 20);
    ASSERT_TRUE(log.ok());
    ASSERT_LE(log->size(), agent::kMuxConsoleMax);
    if (log->size() >= 5 && log->compare(log->size() - 5, 5, "END\r\n") == 0) {
      EXPECT_GT(log->size(), agent::kMuxConsoleKeep) << "the console's older part was dropped";
      break;
    }
    pollfd p{in.get(), POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 60000), 1) << "the console's end never reached console.log";
    char buf[4096];
    (void)!::read(in.get(), buf, sizeof buf);
  }
  std::cout << "vm: 1.1 MB through the console took " << MsSince(t0) << " ms\n";

  // A QEMU that dies is reported, with how.
  pid_t qemu = box->init_pid;
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, qemu, 0)));
  ASSERT_TRUE(pidfd);
  ASSERT_EQ(::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGKILL, nullptr, 0U), 0);
  pollfd p{pidfd.get(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 30000), 1);
  auto exit = rt_->AgentExit(*box);
  ASSERT_TRUE(exit.has_value());
  EXPECT_NE(exit->find("QEMU exited with status 137"), std::string::npos) << *exit;
  t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(rt_->Destroy(*box).ok());
  std::cout << "vm: destroy took " << MsSince(t0) << " ms\n";
  EXPECT_TRUE(Dead(qemu)) << "QEMU lives";
  EXPECT_NE(::lstat(box->dir.c_str(), &st), 0) << "the box directory is left";
  if (!cgroup_dir.empty()) {
    EXPECT_NE(::lstat(cgroup_dir.c_str(), &st), 0) << cgroup_dir;
  }
  EXPECT_TRUE(rt_->AgentExit(*box).has_value());
  EXPECT_TRUE(rt_->Destroy(*box).ok()) << "Destroy is idempotent";
}

// A layer of the template store holding a static busybox and its applets (no host binds: QEMU can
// save a box of it).
std::string BusyboxLayer(const std::string& layers) {
  const std::string l = layers + "/busybox-test";
  for (const char* d : {"", "/bin", "/etc", "/tmp", "/root"})
    if (Status s = MakeDirs(l + d, 0755); !s.ok()) return "";
  ::chmod((l + "/tmp").c_str(), 01777);
  auto bb = ReadFile("/bin/busybox", 64 << 20);
  if (!bb.ok() || !WriteFile(l + "/bin/busybox", *bb, 0755).ok()) return "";
  FILE* list = ::popen("/bin/busybox --list", "r");
  if (list == nullptr) return "";
  char name[128];
  while (std::fgets(name, sizeof name, list) != nullptr) {
    std::string n = name;
    while (!n.empty() && n.back() == '\n') n.pop_back();
    if (!n.empty() && n != "busybox") (void)::symlink("busybox", (l + "/bin/" + n).c_str());
  }
  ::pclose(list);
  if (!WriteFile(l + "/etc/passwd", "root:x:0:0:root:/root:/bin/sh\n", 0644).ok() ||
      !WriteFile(l + "/etc/group", "root:x:0:\n", 0644).ok())
    return "";
  return l;
}

// The counter's value in `box`, once it has moved past `above` (each look is a command: the
// counter ticks every 50 ms of the guest's time).
int64_t CountPast(const Box& box, int64_t above) {
  for (int i = 0; i < 200; ++i) {
    auto [out, code] = RunSh(box, "cat /tmp/count 2>/dev/null");
    int64_t n = code == 0 ? std::strtoll(out.c_str(), nullptr, 10) : 0;
    if (n > above) return n;
  }
  return -1;
}

TEST_F(VmRuntimeTest, ACounterKeepsCountingAcrossSavedMemoryAndInEachFork) {
  const std::string layer = BusyboxLayer(dir_ + "/templates/layers");
  ASSERT_FALSE(layer.empty());
  BoxSpec spec;
  spec.id = RandomId();
  spec.runtime = "vm";
  spec.layers = {layer};
  spec.limits.memory_bytes = 256 << 20;
  spec.limits.disk_bytes = 64 << 20;
  auto box = rt_->Create(spec);
  ASSERT_TRUE(box.ok()) << box.status().message();
  const pid_t first_qemu = box->init_pid;
  // A process of its own, counting; its pid is kept to see that the same process goes on.
  auto [started, scode] =
      RunSh(*box,
            "setsid sh -c 'echo $$ > /tmp/pid; i=0; while :; do i=$((i+1)); echo $i > /tmp/count; "
            "sleep 0.05; done' </dev/null >/dev/null 2>&1 & echo started");
  ASSERT_EQ(scode, 0) << started;
  const int64_t before = CountPast(*box, 0);
  ASSERT_GT(before, 0);
  auto [pid, pcode] = RunSh(*box, "cat /tmp/pid; cat /proc/sys/kernel/random/boot_id");
  ASSERT_EQ(pcode, 0);

  // Pause to disk: saved, stopped; its directory goes with Destroy, the saved state stays.
  const std::string saved = dir_ + "/saved";
  ASSERT_EQ(::mkdir(saved.c_str(), 0700), 0);
  auto t0 = std::chrono::steady_clock::now();
  Status s = rt_->SaveMemory(*box, saved, true);
  ASSERT_TRUE(s.ok()) << s.message();
  struct stat mem {};
  ASSERT_EQ(::stat((saved + "/memory").c_str(), &mem), 0);
  std::cout << "vm: saving 256 MiB of guest memory took " << MsSince(t0) << " ms, "
            << mem.st_size / (1 << 20) << " MiB on disk\n";
  EXPECT_TRUE(Dead(first_qemu)) << "a stopped box's QEMU lives";
  ASSERT_TRUE(rt_->Destroy(*box).ok());

  // Resume: the same processes, the counter going on from where it stood.
  t0 = std::chrono::steady_clock::now();
  auto resumed = rt_->RestoreMemory(spec, saved);
  ASSERT_TRUE(resumed.ok()) << resumed.status().message();
  std::cout << "vm: restore to an answering agent took " << MsSince(t0) << " ms\n";
  EXPECT_EQ(RunSh(*resumed, "cat /tmp/pid; cat /proc/sys/kernel/random/boot_id").first, pid)
      << "the same process, on the same boot";
  const int64_t resumed_at = CountPast(*resumed, before);
  EXPECT_GT(resumed_at, before);
  EXPECT_LT(resumed_at, before + 200) << "the counter started over, or ran while saved";
  EXPECT_GT(CountPast(*resumed, resumed_at), resumed_at) << "the counter stopped";

  // Saved again while it runs on (a fork's source), by a runtime that adopted it as a daemon's
  // does after a restart: it goes on, and two forks start from it.
  rt_.reset();
  auto adopting = VmRuntime::Open(config_);
  ASSERT_TRUE(adopting.ok()) << adopting.status().message();
  rt_ = std::move(adopting).value();
  const std::string running = dir_ + "/running";
  ASSERT_EQ(::mkdir(running.c_str(), 0700), 0);
  ASSERT_TRUE(rt_->SaveMemory(*resumed, running, false).ok());
  auto host_end = ReadFile(dir_ + "/run/" + resumed->id + "/mux.pid", 64);
  ASSERT_TRUE(host_end.ok());
  const int64_t source_at = CountPast(*resumed, resumed_at);
  EXPECT_GT(source_at, resumed_at) << "the source stopped counting after its save";
  EXPECT_EQ(RunSh(*resumed, "echo source > /tmp/who; cat /tmp/who").first, "source\n");
  ASSERT_TRUE(rt_->Destroy(*resumed).ok());
  // The host end the adopting runtime started is reaped, not left a zombie of the daemon.
  EXPECT_NE(::access(("/proc/" + std::to_string(std::stoi(*host_end))).c_str(), F_OK), 0)
      << "the new host end of an adopted box is left unreaped";

  std::vector<Box> forks;
  for (int i = 1; i <= 2; ++i) {
    BoxSpec f = spec;
    f.id = RandomId();
    f.hostname = "fork-" + std::to_string(i);
    auto fork = rt_->RestoreMemory(f, running);
    ASSERT_TRUE(fork.ok()) << fork.status().message();
    forks.push_back(*fork);
  }
  std::vector<std::string> randoms;
  for (size_t i = 0; i < forks.size(); ++i) {
    const Box& f = forks[i];
    EXPECT_EQ(RunSh(f, "cat /tmp/pid; cat /proc/sys/kernel/random/boot_id").first, pid);
    const int64_t at = CountPast(f, resumed_at);
    EXPECT_GT(at, resumed_at) << "fork " << i;
    EXPECT_GT(CountPast(f, at), at) << "fork " << i << " stopped counting";
    // Re-keyed: its own hostname, the host's clock, entropy of its own; its own writable layer
    // (the source's write after the save is not there).
    auto [who, wcode] =
        RunSh(f, "hostname; cat /tmp/who 2>/dev/null; echo $(( $(date +%s) / 60 ))");
    EXPECT_EQ(wcode, 0);
    EXPECT_EQ(who,
              "fork-" + std::to_string(i + 1) + "\n" + std::to_string(::time(nullptr) / 60) + "\n")
        << "(a minute's turn in between fails this once)";
    randoms.push_back(RunSh(f, "head -c 16 /dev/urandom | od -An -tx1").first);
    EXPECT_EQ(RunSh(f, "echo " + std::to_string(i) + " > /tmp/mine; cat /tmp/mine").first,
              std::to_string(i) + "\n");
  }
  ASSERT_EQ(randoms.size(), 2u);
  EXPECT_NE(randoms[0], randoms[1]) << "two forks of one saved state drew the same random bytes";
  EXPECT_EQ(RunSh(forks[0], "cat /tmp/mine").first, "0\n") << "the forks share a writable layer";

  // A restore whose spec is not the saved box's shape fails, leaving nothing.
  BoxSpec other = spec;
  other.id = RandomId();
  other.limits.memory_bytes = 512 << 20;
  EXPECT_EQ(rt_->RestoreMemory(other, running).status().err(), EINVAL);

  for (const Box& f : forks) {
    ASSERT_TRUE(rt_->Destroy(f).ok());
    EXPECT_TRUE(Dead(f.init_pid)) << "a fork's QEMU lives";
  }
}

TEST_F(VmRuntimeTest, CreatesItCannotDoFailLeavingNothing) {
  // No QEMU starts for any of these; TearDown checks that no directory, mount or cgroup is left.
  BoxSpec spec;
  spec.id = RandomId();
  spec.runtime = "vm";
  spec.layers = tmpl_.layers;
  spec.at_sync_point = [](pid_t) { return Status(); };  // a network
  auto net = rt_->Create(spec);
  ASSERT_FALSE(net.ok());
  EXPECT_EQ(net.status().err(), ENOTSUP) << net.status().message();
  spec.at_sync_point = nullptr;
  spec.binds = {{"/usr", "/usr", false, {}}};  // writable
  auto rw = rt_->Create(spec);
  EXPECT_EQ(rw.status().err(), ENOTSUP) << rw.status().message();
  spec.binds = tmpl_.binds;
  spec.layers.push_back(dir_ + "/no-such-layer");  // fails after some layers are bound
  auto missing = rt_->Create(spec);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no-such-layer"), std::string::npos)
      << missing.status().message();
  spec.layers = tmpl_.layers;
  spec.limits.memory_bytes = 64 << 20;  // too little for the guest's kernel
  auto small = rt_->Create(spec);
  EXPECT_EQ(small.status().err(), EINVAL) << small.status().message();
  EXPECT_NE(small.status().message().find("at least 128 MiB"), std::string::npos)
      << small.status().message();
  spec.runtime = "native";
  EXPECT_EQ(rt_->Create(spec).status().err(), ENOTSUP);
}

}  // namespace
}  // namespace sbx::runtime
