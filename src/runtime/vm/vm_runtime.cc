#include "runtime/vm/vm_runtime.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <linux/fs.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "common/fs.h"
#include "protocol/client.h"
#include "runtime/box_host.h"
#include "runtime/native/box_owners.h"
#include "runtime/native/cgroup_internal.h"
#include "runtime/native/native_runtime.h"
#include "runtime/vm/initramfs.h"

extern char** environ;

namespace sbx::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// A boot under TCG on a loaded 2-core host took up to 13 s; the deadline leaves room for more.
constexpr auto kBootWait = std::chrono::seconds(120);
constexpr auto kProbeWait = std::chrono::seconds(20);  // KVM's probe: it boots in well under 1 s
constexpr auto kStopWait = std::chrono::seconds(5);
constexpr auto kToolWait = std::chrono::seconds(300);  // mke2fs (a stack image: seconds per GB)
// Saving or restoring a guest's memory: QEMU writes or reads its RAM's pages in use, at disk speed.
constexpr auto kMigrateWait = std::chrono::seconds(300);
constexpr auto kQuiesceWait = std::chrono::seconds(30);
constexpr int64_t kDefaultMemory = 512LL << 20;  // the guest's RAM without a limit
constexpr int64_t kDefaultDisk = 4LL << 30;      // the writable layer without a limit
constexpr int64_t kQemuOverhead = 256LL << 20;   // QEMU's own memory beside the guest's
// The least RAM a guest boots in: its kernel, the unpacked initramfs (~7 MiB: modules, busybox,
// the agent) and its first processes. 112 MiB booted here; with 96 MiB QEMU exits at once and the
// console says nothing.
constexpr int64_t kMinMemory = 128LL << 20;
constexpr char kProbeVersion[] = "vm-accel-1";

// How long Stats waits for a guest's agent to tell its kernel's OOM kills.
constexpr int kGuestStatsWaitMs = 2000;

// The guest kernel's own OOM kills (its /proc/vmstat, read through its agent): the host's cgroup
// counts none, as the guest's memory is QEMU's and the host's OOM killer never acts inside it.
// nullopt when the agent does not answer in time. The guest's root may make the count up: it
// says something of that box alone.
std::optional<uint64_t> GuestOomKills(const std::string& agent_socket) {
  auto c = protocol::AgentConnection::Connect(agent_socket, kGuestStatsWaitMs);
  if (!c.ok()) return std::nullopt;
  std::vector<protocol::Frame> data;
  auto ok =
      c->Call(protocol::Type::kRead, protocol::Writer().Str(protocol::Tag::kPath, "/proc/vmstat"),
              &data, kGuestStatsWaitMs);
  if (!ok.ok()) return std::nullopt;
  std::string text = "\n";
  for (const auto& f : data) text.append(f.fields.Str(protocol::Tag::kData));
  auto pos = text.find("\noom_kill ");
  if (pos == std::string::npos) return std::nullopt;
  return std::strtoull(text.c_str() + pos + 10, nullptr, 10);
}

int64_t MicrosSince(Clock::time_point& t) {
  auto now = Clock::now();
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(now - t).count();
  t = now;
  return us;
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

std::string Tail(const std::string& path, size_t n) {
  auto s = ReadFile(path, 16 << 20);
  if (!s.ok()) return "";
  return Trim(s->size() > n ? s->substr(s->size() - n) : *s);
}

// A QEMU option value: its commas doubled.
std::string QemuEscape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    out += ch;
    if (ch == ',') out += ',';
  }
  return out;
}

// A single-quoted shell word.
std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) {
    if (ch == '\'')
      out += "'\\''";
    else
      out += ch;
  }
  return out + "'";
}

// A process started by Spawn: its pid and a pidfd of it.
struct Started {
  pid_t pid = -1;
  UniqueFd pidfd;
};

// Starts `argv` (no shell) with stdin from /dev/null, stdout and stderr on `log_fd`, and each
// (target, source) of `fds` as its descriptor target; nothing else of ours is inherited
// (everything we open is close-on-exec). posix_spawn: no code of ours runs in the child.
Result<Started> Spawn(const std::vector<std::string>& argv, int log_fd,
                      const std::vector<std::pair<int, int>>& fds = {}) {
  // Sources moved above every target first, so that one dup2 never overwrites another's source.
  std::vector<UniqueFd> high;
  for (const auto& [target, source] : fds) {
    high.emplace_back(::fcntl(source, F_DUPFD_CLOEXEC, 64));
    if (!high.back()) return Status::Errno("dup");
  }
  UniqueFd high_log(::fcntl(log_fd, F_DUPFD_CLOEXEC, 64));
  if (!high_log) return Status::Errno("dup");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, high_log.get(), 1);
  posix_spawn_file_actions_adddup2(&fa, high_log.get(), 2);
  int last = 2;
  for (size_t i = 0; i < fds.size(); ++i) {
    posix_spawn_file_actions_adddup2(&fa, high[i].get(), fds[i].first);
    last = std::max(last, fds[i].first);
  }
  // Whatever this process holds without close-on-exec (a daemon's listening sockets) is not the
  // box's to keep.
  posix_spawn_file_actions_addclosefrom_np(&fa, last + 1);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  // A session of its own: a terminal's ^C or a signal to the daemon's process group is not the
  // box's (a box outlives its daemon).
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSID);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, args[0], &fa, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return Status::Error("run " + argv[0], rc);
  Started s;
  s.pid = pid;
  s.pidfd.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!s.pidfd) return Status::Errno("pidfd_open " + argv[0]);
  return s;
}

// Waits until the process of `pidfd` exits, at most `timeout`. True when it did.
bool AwaitExit(int pidfd, std::chrono::milliseconds timeout) {
  pollfd p{pidfd, POLLIN, 0};
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() < 0) left = std::chrono::milliseconds(0);
    int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n > 0) return true;
    if (n == 0 || errno != EINTR) return false;
  }
}

// Reaps a child of ours that has exited; its exit status (128 + signal), or -1.
int Reap(int pidfd) {
  siginfo_t info{};
  if (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &info,
               WEXITED | WNOHANG | __WALL) != 0 ||
      info.si_pid == 0)
    return -1;
  return info.si_code == CLD_EXITED ? info.si_status : 128 + info.si_status;
}

// Runs a tool to completion (its output on `log_fd`); an error naming it and its exit status.
Status RunTool(const std::vector<std::string>& argv, int log_fd, const std::string& log_path) {
  auto p = Spawn(argv, log_fd);
  if (!p.ok()) return p.status();
  if (!AwaitExit(p->pidfd.get(), kToolWait)) {
    ::syscall(SYS_pidfd_send_signal, p->pidfd.get(), SIGKILL, nullptr, 0U);
    AwaitExit(p->pidfd.get(), kStopWait);
    Reap(p->pidfd.get());
    return Status::Error(argv[0] + " did not finish", ETIMEDOUT);
  }
  int st = Reap(p->pidfd.get());
  if (st != 0)
    return Status::Error(
        argv[0] + " exited with " + std::to_string(st) + ": " + Tail(log_path, 1000), EIO);
  return {};
}

// The process <file> names ("<pid> <start time>"): a pidfd of it while it is still that process
// and not a zombie (pids are reused), else ESRCH.
Result<UniqueFd> LiveProcess(const std::string& file) {
  auto text = ReadFile(file, 64);
  if (!text.ok()) return Status::Error("no pid recorded", ESRCH);
  char* end = nullptr;
  long pid = std::strtol(text->c_str(), &end, 10);
  unsigned long long start = std::strtoull(end, nullptr, 10);
  if (pid <= 0) return Status::Error("no pid recorded", ESRCH);
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0)));
  if (!pidfd) return Status::Error("it is gone", ESRCH);
  auto stat = ReadFile("/proc/" + std::to_string(pid) + "/stat", 4096);
  if (!stat.ok()) return Status::Error("it is gone", ESRCH);
  size_t paren = stat->rfind(')');
  bool zombie = paren == std::string::npos || paren + 2 >= stat->size() ||
                (*stat)[paren + 2] == 'Z' || (*stat)[paren + 2] == 'X';
  if (zombie || ProcessStartTime(static_cast<pid_t>(pid)) != start)
    return Status::Error("it is gone", ESRCH);
  return pidfd;
}

Status RecordPid(const std::string& file, pid_t pid) {
  return WriteFile(file, std::to_string(pid) + " " + std::to_string(ProcessStartTime(pid)) + "\n",
                   0600);
}

// A read-only bind of `source` at `target` (made first, as a directory or a file like `source`),
// nosuid and nodev.
Status BindReadOnly(const std::string& source, const std::string& target) {
  struct stat st {};
  if (::stat(source.c_str(), &st) != 0) return Status::Errno("stat " + source);
  if (S_ISDIR(st.st_mode)) {
    if (::mkdir(target.c_str(), 0755) != 0) return Status::Errno("mkdir " + target);
  } else if (S_ISREG(st.st_mode)) {
    SBX_RETURN_IF_ERROR(WriteFile(target, "", 0644));
  } else {
    return Status::Error("share " + source + " with a vm box: neither a directory nor a file",
                         ENOTSUP);
  }
  if (::mount(source.c_str(), target.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0)
    return Status::Errno("bind " + source);
  if (::mount(nullptr, target.c_str(), nullptr,
              MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr) != 0) {
    Status s = Status::Errno("make the bind of " + source + " read-only");
    (void)::umount2(target.c_str(), MNT_DETACH);
    return s;
  }
  return {};
}

// The host's TSC rate in kHz, for a TCG guest (whose TSC is the host's): calibrating it against
// the emulated PIT fails on a loaded host and the boot then hangs. 0 when unknown.
long HostTscKhz() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("cpu MHz", 0) != 0) continue;
    size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    return std::lround(std::strtod(line.c_str() + colon + 1, nullptr) * 1000);
  }
  return 0;
}

// A file made for the box's root id alone.
Result<UniqueFd> BoxFile(const std::string& path, uint32_t base, int flags = O_WRONLY) {
  UniqueFd fd(::open(path.c_str(), flags | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd) return Status::Errno("create " + path);
  if (::fchown(fd.get(), base, base) != 0) return Status::Errno("chown " + path);
  return fd;
}

// Copies the file `from` to `to` (made, 0600, `owner`'s): a reflink where the filesystem has them,
// else its data extents only, so that a sparse disk image stays sparse.
Status CopySparse(const std::string& from, const std::string& to, uid_t owner) {
  UniqueFd in(::open(from.c_str(), O_RDONLY | O_CLOEXEC));
  if (!in) return Status::Errno("open " + from);
  struct stat st {};
  if (::fstat(in.get(), &st) != 0) return Status::Errno("stat " + from);
  UniqueFd out(::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!out) return Status::Errno("create " + to);
  if (::fchown(out.get(), owner, owner) != 0) return Status::Errno("chown " + to);
  off_t pos = 0;
  if (::ioctl(out.get(), FICLONE, in.get()) == 0)
    pos = st.st_size;  // shared with the original
  else if (::ftruncate(out.get(), st.st_size) != 0)
    return Status::Errno("size " + to);
  while (pos < st.st_size) {
    off_t data = ::lseek(in.get(), pos, SEEK_DATA);
    if (data < 0 && errno == ENXIO) break;  // only a hole is left
    if (data < 0) return Status::Errno("seek " + from);
    off_t hole = ::lseek(in.get(), data, SEEK_HOLE);
    if (hole < 0) return Status::Errno("seek " + from);
    for (off_t off = data; off < hole;) {
      loff_t a = off, b = off;
      ssize_t n =
          ::copy_file_range(in.get(), &a, out.get(), &b, static_cast<size_t>(hole - off), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Status::Errno("copy " + from);
      if (n == 0) break;
      off += n;
    }
    pos = hole;
  }
  if (::fsync(out.get()) != 0) return Status::Errno("sync " + to);
  return {};
}

// QEMU's monitor (QMP): one JSON object per line each way; events are skipped.
class Qmp {
 public:
  static Result<Qmp> Connect(const std::string& path, Clock::time_point deadline) {
    auto fd = ConnectUnix(path);
    if (!fd.ok()) return fd.status().Wrap("QEMU's monitor");
    Qmp q(std::move(fd).value(), deadline);
    auto greeting = q.Read();  // {"QMP": {...}}
    if (!greeting.ok()) return greeting.status();
    auto caps = q.Call("qmp_capabilities");
    if (!caps.ok()) return caps.status();
    return q;
  }

  // Runs `command`; its "return", or EIO with QEMU's description of the error. `fd` (not -1)
  // goes with it (SCM_RIGHTS), for getfd.
  Result<nlohmann::json> Call(const std::string& command,
                              const nlohmann::json& args = nlohmann::json::object(), int fd = -1) {
    nlohmann::json req = {{"execute", command}};
    if (!args.empty()) req["arguments"] = args;
    std::string line = req.dump() + "\n";
    msghdr m{};
    iovec v{line.data(), line.size()};
    m.msg_iov = &v;
    m.msg_iovlen = 1;
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
    if (fd >= 0) {
      m.msg_control = ctl;
      m.msg_controllen = sizeof ctl;
      cmsghdr* c = CMSG_FIRSTHDR(&m);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    if (::sendmsg(fd_.get(), &m, MSG_NOSIGNAL) != static_cast<ssize_t>(line.size()))
      return Status::Errno("QEMU's monitor: send " + command);
    for (;;) {
      auto reply = Read();
      if (!reply.ok()) return reply.status().Wrap(command);
      if (reply->contains("event")) continue;
      if (reply->contains("error"))
        return Status::Error(command + ": " + (*reply)["error"].value("desc", reply->dump()), EIO);
      return reply->value("return", nlohmann::json::object());
    }
  }

 private:
  Qmp(UniqueFd fd, Clock::time_point deadline) : fd_(std::move(fd)), deadline_(deadline) {}

  Result<nlohmann::json> Read() {
    for (;;) {
      if (size_t nl = buf_.find('\n'); nl != std::string::npos) {
        auto j = nlohmann::json::parse(buf_.substr(0, nl), nullptr, false);
        buf_.erase(0, nl + 1);
        if (j.is_discarded() || !j.is_object())
          return Status::Error("QEMU's monitor said what is not JSON", EPROTO);
        return j;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
      pollfd p{fd_.get(), POLLIN, 0};
      int n = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Status::Error("QEMU's monitor did not answer in time", ETIMEDOUT);
      char chunk[4096];
      ssize_t got = ::read(fd_.get(), chunk, sizeof chunk);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return Status::Error("QEMU's monitor closed", ECONNRESET);
      buf_.append(chunk, static_cast<size_t>(got));
      if (buf_.size() > (1 << 20)) return Status::Error("QEMU's monitor: a line too long", EPROTO);
    }
  }

  UniqueFd fd_;
  Clock::time_point deadline_;
  std::string buf_;
};

// Waits, polling QEMU's monitor, until `query` answers a status other than those in `busy`; that
// status.
Result<std::string> AwaitStatus(Qmp& q, const std::string& query, const std::string& field,
                                const std::vector<std::string>& busy, Clock::time_point deadline) {
  for (;;) {
    auto r = q.Call(query);
    if (!r.ok()) return r.status();
    std::string st = r->value(field, "");
    if (std::find(busy.begin(), busy.end(), st) == busy.end()) return st;
    if (Clock::now() > deadline) return Status::Error(query + " still says " + st, ETIMEDOUT);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// What a stack image must hold: the layers' bytes in 4 KiB blocks and their inodes (nftw's
// callback has no argument of its own: these are guarded by VmRuntime::images_mu_).
uint64_t walk_bytes = 0, walk_inodes = 0;
int CountEntry(const char*, const struct stat* st, int, FTW*) {
  ++walk_inodes;
  if (S_ISREG(st->st_mode) || S_ISDIR(st->st_mode) || S_ISLNK(st->st_mode))
    walk_bytes += (static_cast<uint64_t>(st->st_size) + 4095) / 4096 * 4096;
  return 0;
}

// FNV-1a: a name for a stack image from what identifies its layers.
uint64_t Fnv(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 1099511628211ULL;
  }
  return h;
}

}  // namespace

// Everything one Create makes, in the order it is made: the owners undo it in reverse when
// Create returns early, and are committed once the box is live.
struct VmRuntime::Creation {
  Creation(const BoxSpec& s, const std::string* from) : spec(s), restore_from(from) {}
  ~Creation() {
    if (!committed && dir) (void)UnmountBelow(dir->path());
  }
  const BoxSpec& spec;
  const std::string* restore_from;  // a memory snapshot's directory, or null: a boot
  Box box;
  Clock::time_point t = Clock::now();
  std::optional<BoxDir> dir;  // its destructor removes the directory, after the unmounts above
  uint32_t base = 0;
  Layout layout;
  UniqueFd stack;  // the stack image, read-only (QEMU's fd 5)
  UniqueFd log;    // qemu.log: QEMU's and the tools' stderr
  CgroupOwner cgroup;
  ChildProcess mux, qemu;
  UniqueFd mux_pidfd, qemu_pidfd;
  UniqueFd ready;  // read end: a byte once the guest's end said hello
  bool committed = false;
};

Result<std::unique_ptr<VmRuntime>> VmRuntime::Open(const VmConfig& config) {
  const std::string who = "runtime vm";
  std::string qemu = FindBinary(config.qemu);
  if (qemu.empty())
    return Status::Error(who + ": " + config.qemu + " is not installed (make deps installs it)",
                         ENOENT);
  std::string setpriv = FindBinary("setpriv"), mke2fs = FindBinary("mke2fs");
  if (setpriv.empty() || mke2fs.empty())
    return Status::Error(who + ": setpriv (util-linux) and mke2fs (e2fsprogs) are needed", ENOENT);
  if (::access(config.busybox.c_str(), X_OK) != 0)
    return Status::Error(
        who + ": no static busybox at " + config.busybox + " (make deps installs busybox-static)",
        ENOENT);
  std::string kernel, release;
  for (const auto& n : DirNames(config.kernel_dir + "/boot")) {
    if (n.rfind("vmlinuz-", 0) != 0) continue;
    kernel = config.kernel_dir + "/boot/" + n;
    release = n.substr(8);
  }
  if (kernel.empty())
    return Status::Error(
        who + ": no guest kernel in " + config.kernel_dir + "/boot (make deps unpacks one)",
        ENOENT);
  if (config.run_dir.empty() || config.run_dir[0] != '/')
    return Status::Error(who + ": run directory '" + config.run_dir + "' is not absolute", EINVAL);
  if (::access(config.agent_path.c_str(), R_OK) != 0)
    return Status::Errno(who + ": sbx-agent " + config.agent_path);
  auto cg = ProbeCgroupHost(config.cgroup_parent);
  if (!cg.ok()) return cg.status().Wrap(who + ": cgroups");
  // 0711: QEMU and the port's host end run as a box's root id and pass through to what they open
  // by name; nothing here can be listed by them.
  SBX_RETURN_IF_ERROR(MakeDirs(config.run_dir, 0711).Wrap(who));
  if (::chmod(config.run_dir.c_str(), 0711) != 0)
    return Status::Errno(who + ": chmod " + config.run_dir);
  std::unique_ptr<VmRuntime> rt(new VmRuntime(config, std::move(cg).value()));
  rt->qemu_ = qemu;
  rt->setpriv_ = setpriv;
  rt->mke2fs_ = mke2fs;
  rt->kernel_ = kernel;
  rt->release_ = release;
  SBX_RETURN_IF_ERROR(InstallAgent(config.agent_path, config.run_dir + "/.sbx-agent").Wrap(who));
  InitramfsInput in;
  in.busybox = config.busybox;
  in.agent = config.agent_path;
  in.modules_dir = config.kernel_dir + "/lib/modules/" + release;
  SBX_RETURN_IF_ERROR(WriteInitramfs(in, config.run_dir + "/.initramfs").Wrap(who));
  SBX_RETURN_IF_ERROR(rt->ProbeAccel().Wrap(who));
  return rt;
}

VmRuntime::VmRuntime(VmConfig config, CgroupHost cgroups)
    : config_(std::move(config)), cgroups_(std::move(cgroups)) {}

VmRuntime::~VmRuntime() = default;

std::vector<std::string> VmRuntime::AsBox(uint32_t base) const {
  // No capability, no way to gain one, none of the host's groups; only /dev/kvm's group when KVM
  // is used and the device is the group's (ProbeAccel).
  std::vector<std::string> argv = {setpriv_, "--reuid=" + std::to_string(base),
                                   "--regid=" + std::to_string(base)};
  struct stat kvm {};
  if (accel_ == "kvm" && ::stat("/dev/kvm", &kvm) == 0 && (kvm.st_mode & 0060) == 0060)
    argv.push_back("--groups=" + std::to_string(kvm.st_gid));
  else
    argv.push_back("--clear-groups");
  argv.insert(argv.end(), {"--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"});
  return argv;
}

std::vector<std::string> VmRuntime::QemuArgs(const std::string& dir, const std::string& accel,
                                             const BoxSpec* spec, const Layout& layout) const {
  int64_t mem =
      spec != nullptr && spec->limits.memory_bytes > 0 ? spec->limits.memory_bytes : kDefaultMemory;
  int cpus = spec != nullptr && spec->limits.cpus > 0
                 ? std::max(1, static_cast<int>(std::ceil(spec->limits.cpus)))
                 : 1;
  std::string append = "console=ttyS0 quiet panic=-1";
  if (accel == "tcg") {
    if (long khz = HostTscKhz(); khz > 0)
      append += " tsc_early_khz=" + std::to_string(khz) + " tsc=reliable";
  }
  if (spec == nullptr) append += " sbx.probe";
  std::vector<std::string> a = {
      qemu_,
      "-M",
      "microvm",
      "-cpu",
      accel == "kvm" ? "host" : "max",
      // TCG's translation cache is 1 GiB by default: a bound, since it counts in the box's memory.
      "-accel",
      accel == "kvm" ? "kvm" : "tcg,tb-size=64",
      "-m",
      std::to_string(std::max<int64_t>(mem >> 20, 64)) + "M",
      "-smp",
      std::to_string(cpus),
      "-nodefaults",
      "-no-user-config",
      "-display",
      "none",
      "-no-reboot",
      "-sandbox",
      "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
      "-kernel",
      QemuEscape(kernel_),
      "-initrd",
      QemuEscape(config_.run_dir + "/.initramfs"),
      "-append",
      append,
      "-chardev",
      spec == nullptr ? "file,id=con,path=" + QemuEscape(dir + "/console.log")
                      : std::string("socket,id=con,fd=4,server=on,wait=off"),
      "-serial",
      "chardev:con",
  };
  if (spec == nullptr) return a;
  auto share = [&](const std::string& tag, const std::string& path) {
    a.insert(a.end(),
             {"-fsdev",
              "local,id=" + tag + ",path=" + QemuEscape(path) + ",security_model=none,readonly=on",
              "-device", "virtio-9p-device,fsdev=" + tag + ",mount_tag=" + tag});
  };
  auto disk = [&](const std::string& id, const std::string& file, const std::string& opts) {
    a.insert(a.end(), {"-drive", "file=" + file + ",format=raw,if=none,id=" + id + opts, "-device",
                       "virtio-blk-device,drive=" + id + ",serial=" + id});
  };
  // The monitor and the port are QEMU's listening sockets: sbx connects the port (and a later host
  // end again, after a save); sbx alone talks to the monitor.
  a.insert(a.end(), {"-chardev", "socket,id=qmp,fd=6,server=on,wait=off", "-mon",
                     "chardev=qmp,mode=control", "-device", "virtio-serial-device", "-chardev",
                     "socket,id=agent,fd=3,server=on,wait=off", "-device",
                     "virtserialport,chardev=agent,name=sbx.agent"});
  disk("cfg", QemuEscape(dir + "/cfg.img"), ",readonly=on");
  if (layout.stack) {
    a.insert(a.end(), {"-add-fd", "fd=5,set=1"});
    disk("layers", "/dev/fdset/1", ",readonly=on");
  } else {
    for (size_t i = 0; i < spec->layers.size(); ++i)
      share("l" + std::to_string(i), dir + "/lower/" + std::to_string(i));
  }
  for (size_t i : layout.dir_binds)
    share("b" + std::to_string(i), dir + "/binds/" + std::to_string(i));
  disk("rw", QemuEscape(dir + "/disk.img"), ",discard=unmap,detect-zeroes=unmap");
  return a;
}

Status VmRuntime::ProbeAccel() {
  if (!config_.accel.empty()) {
    if (config_.accel != "kvm" && config_.accel != "tcg")
      return Status::Error("accelerator '" + config_.accel + "' is neither kvm nor tcg", EINVAL);
    accel_ = config_.accel;
    accel_why_ = "configured";
    return {};
  }
  struct stat kvm {};
  if (::stat("/dev/kvm", &kvm) != 0) {
    accel_ = "tcg";
    accel_why_ = "no /dev/kvm";
    return {};
  }
  if ((kvm.st_mode & 0006) != 0006 && (kvm.st_mode & 0060) != 0060) {
    // QEMU runs as the box's root id, which is in no group of the host's.
    accel_ = "tcg";
    accel_why_ = "/dev/kvm is open to neither its group nor others, and QEMU runs unprivileged";
    return {};
  }
  // KVM is there; whether a guest boots under it is another matter (a nested guest has hung after
  // the bootloader): a probe boot, remembered for this boot of the host.
  auto boot = ReadFile("/proc/sys/kernel/random/boot_id", 64);
  const std::string key = std::string(kProbeVersion) + " " + (boot.ok() ? Trim(*boot) : "") + " ";
  const std::string memo = config_.run_dir + "/.accel";
  if (auto seen = ReadFile(memo, 1024); boot.ok() && seen.ok() && seen->rfind(key, 0) == 0) {
    std::string rest = Trim(seen->substr(key.size()));
    accel_ = rest.substr(0, rest.find(' '));
    accel_why_ = rest.find(' ') == std::string::npos ? "" : rest.substr(rest.find(' ') + 1);
    if (accel_ == "kvm" || accel_ == "tcg") return {};
  }
  accel_ = "kvm";
  const std::string dir = config_.run_dir + "/.probe-" + RandomId(8);
  SBX_RETURN_IF_ERROR(MakeDirs(dir, 0711));
  std::string why;
  {
    auto con = BoxFile(dir + "/console.log", config_.id_base);
    UniqueFd log(::open((dir + "/qemu.log").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
    if (!con.ok() || !log) {
      (void)RemoveTree(dir);
      return con.ok() ? Status::Errno("create " + dir + "/qemu.log") : con.status();
    }
    std::vector<std::string> argv = AsBox(config_.id_base);
    auto q = QemuArgs(dir, "kvm", nullptr, Layout{});
    argv.insert(argv.end(), q.begin(), q.end());
    auto p = Spawn(argv, log.get());
    if (!p.ok()) {
      why = p.status().message();
    } else {
      bool exited = AwaitExit(p->pidfd.get(), kProbeWait);
      if (!exited) {
        ::syscall(SYS_pidfd_send_signal, p->pidfd.get(), SIGKILL, nullptr, 0U);
        AwaitExit(p->pidfd.get(), kStopWait);
      }
      Reap(p->pidfd.get());
      auto out = ReadFile(dir + "/console.log", 1 << 20);
      if (out.ok() && out->find("sbx-probe-ok") != std::string::npos) {
        why = "";
      } else if (!exited) {
        why = "a probe boot under KVM did not finish within 20 s";
      } else {
        why = "a probe boot under KVM failed: " + Tail(dir + "/qemu.log", 300);
      }
    }
  }
  (void)RemoveTree(dir);
  if (why.empty()) {
    accel_why_ = "a probe boot under KVM answered";
  } else {
    accel_ = "tcg";
    accel_why_ = why;
  }
  if (boot.ok()) (void)WriteFile(memo, key + accel_ + " " + accel_why_ + "\n", 0600);
  return {};
}

Status VmRuntime::CanCreate(const std::string& name) const {
  if (name == "vm") return {};
  return Status::Error("runtime " + (name.empty() ? std::string(kRuntimeNames[0]) : name) +
                           ": this is the vm runtime",
                       ENOTSUP);
}

Result<Box> VmRuntime::Create(const BoxSpec& spec) { return Make(spec, nullptr); }

Result<Box> VmRuntime::RestoreMemory(const BoxSpec& spec, const std::string& src) {
  return Make(spec, &src);
}

Result<Box> VmRuntime::Make(const BoxSpec& spec, const std::string* restore_from) {
  const std::string what = (restore_from ? "restore box " : "create box ") + spec.id;
  SBX_RETURN_IF_ERROR(CanCreate(spec.runtime).Wrap(what));
  Creation c(spec, restore_from);
  SBX_RETURN_IF_ERROR(Prepare(c).Wrap(what));
  c.box.timings.prepare_us = MicrosSince(c.t);
  SBX_RETURN_IF_ERROR(Launch(c).Wrap(what));
  // Live: from here Destroy owns everything.
  c.committed = true;
  c.cgroup.Commit();
  c.mux.Commit();
  c.qemu.Commit();
  UniqueFd lock = c.dir->Commit();
  {
    MutexLock g(mu_);
    owner_locks_[spec.id] = std::move(lock);
    children_[spec.id] = {std::move(c.qemu_pidfd), std::move(c.mux_pidfd)};
  }
  return c.box;
}

namespace {

// True when `path` is inside the directory `dir` (both resolved).
bool IsUnder(const std::string& path, const std::string& dir) {
  char rp[PATH_MAX], rd[PATH_MAX];
  if (::realpath(path.c_str(), rp) == nullptr || ::realpath(dir.c_str(), rd) == nullptr)
    return false;
  std::string p = rp, d = rd;
  return p.size() > d.size() + 1 && p.compare(0, d.size(), d) == 0 && p[d.size()] == '/';
}

// What of QEMU's arguments a restore must repeat: all but the kernel's command line (read once, at
// boot; its TSC rate may differ from one reading to the next), with the box's directory as "@".
std::string Shape(const std::vector<std::string>& args, const std::string& dir) {
  std::string out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "-append") {
      ++i;
      continue;
    }
    std::string a = args[i];
    for (size_t at = a.find(dir); at != std::string::npos; at = a.find(dir, at + 1))
      a.replace(at, dir.size(), "@");
    out += a + "\n";
  }
  return out;
}

}  // namespace

Status VmRuntime::Prepare(Creation& c) {
  const BoxSpec& spec = c.spec;
  SBX_RETURN_IF_ERROR(ValidateBoxId(spec.id));
  if (spec.layers.empty()) return Status::Error("a box needs at least one layer", EINVAL);
  SBX_RETURN_IF_ERROR(cgroup_internal::ValidateRequest(spec.id, spec.limits));
  if (spec.limits.memory_bytes > 0 && spec.limits.memory_bytes < kMinMemory)
    return Status::Error("a vm box needs a memory limit of at least " +
                             std::to_string(kMinMemory >> 20) +
                             " MiB (its guest's own kernel boots in it), got " +
                             std::to_string(spec.limits.memory_bytes >> 20) + " MiB",
                         EINVAL);
  if (spec.at_sync_point)
    return Status::Error("the vm runtime runs boxes without a network only (policy none) yet",
                         ENOTSUP);
  for (const auto& b : spec.binds) {
    if (b.target.empty() || b.target[0] != '/')
      return Status::Error("bind target '" + b.target + "' is not absolute", EINVAL);
    if (!b.read_only)
      return Status::Error("the vm runtime shares host directories read-only only", ENOTSUP);
  }
  auto dir = BoxDir::Make(config_.run_dir, spec.id, spec.owner);
  if (!dir.ok()) return dir.status();
  c.dir.emplace(std::move(dir).value());
  const std::string d = c.dir->path();
  if (spec.id_base != 0) {
    c.base = spec.id_base;
  } else if (config_.id_pool != nullptr) {
    auto base = c.dir->AcquireIdRange(config_.id_pool);
    if (!base.ok()) return base.status();
    c.base = *base;
  } else {
    c.base = config_.id_base;
  }
  const uint32_t base = c.base;
  SBX_RETURN_IF_ERROR(WriteFile(d + "/ids", std::to_string(base) + " 1\n", 0600));
  if (::chmod(d.c_str(), 0711) != 0) return Status::Errno("chmod " + d);
  for (const char* sub : {"/lower", "/binds", "/cfg"})
    if (::mkdir((d + sub).c_str(), 0711) != 0) return Status::Errno("mkdir " + d + sub);
  c.log.reset(::open((d + "/qemu.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  if (!c.log) return Status::Errno("open " + d + "/qemu.log");

  // Layers: one image of the whole stack when every layer is immutable, else a 9p share each.
  c.layout.stack = !config_.immutable_layers.empty();
  for (const auto& l : spec.layers)
    c.layout.stack = c.layout.stack && IsUnder(l, config_.immutable_layers);
  if (c.layout.stack) {
    auto img = StackImage(spec.layers, c.log.get(), d + "/qemu.log");
    if (!img.ok()) return img.status();
    c.stack.reset(::open(img->c_str(), O_RDONLY | O_CLOEXEC));
    if (!c.stack) return Status::Errno("open " + *img);
  } else {
    for (size_t i = 0; i < spec.layers.size(); ++i)
      SBX_RETURN_IF_ERROR(BindReadOnly(spec.layers[i], d + "/lower/" + std::to_string(i)));
  }
  // A directory is a 9p share of its own (tag b<i>); a file (the network's /etc/hosts and the
  // like) is copied into cfg/ and bound from there in the guest.
  std::string binds;
  int64_t cfg_bytes = 0;
  for (size_t i = 0; i < spec.binds.size(); ++i) {
    const BindMount& b = spec.binds[i];
    struct stat st {};
    if (::stat(b.source.c_str(), &st) != 0) return Status::Errno("stat " + b.source);
    const std::string n = std::to_string(i);
    if (S_ISDIR(st.st_mode)) {
      SBX_RETURN_IF_ERROR(BindReadOnly(b.source, d + "/binds/" + n));
      binds += "  bind b" + n + " " + ShellQuote(b.target) + "\n";
      c.layout.dir_binds.push_back(i);
    } else if (S_ISREG(st.st_mode)) {
      auto data = ReadFile(b.source, 16 << 20);
      if (!data.ok()) return data.status().Wrap("share " + b.source + " with a vm box");
      SBX_RETURN_IF_ERROR(WriteFile(d + "/cfg/f" + n, *data, st.st_mode & 0755));
      cfg_bytes += static_cast<int64_t>(data->size());
      binds += "  file f" + n + " " + ShellQuote(b.target) + "\n";
    } else {
      return Status::Error("share " + b.source + " with a vm box: neither a directory nor a file",
                           ENOTSUP);
    }
    for (const auto& sub : b.overlaid)
      binds += "  over " + ShellQuote(b.target) + " " + ShellQuote(sub) + "\n";
  }
  SBX_RETURN_IF_ERROR(WriteFile(d + "/cfg/box.sh",
                                "SBX_HOSTNAME=" + ShellQuote(spec.hostname) +
                                    "\nSBX_LAYERS=" + std::to_string(spec.layers.size()) +
                                    "\nSBX_STACK=" + (c.layout.stack ? "1" : "0") +
                                    "\nSBX_PIDS=" + std::to_string(spec.limits.pids) +
                                    "\nsbx_binds() {\n  :\n" + binds + "}\n",
                                0644));
  const std::string shape = Shape(QemuArgs(d, accel_, &spec, c.layout), d);
  SBX_RETURN_IF_ERROR(WriteFile(d + "/shape", shape, 0600));

  if (c.restore_from != nullptr) {
    // The saved box's disks, as they were (the guest's kernel holds their state in its memory).
    const std::string& src = *c.restore_from;
    auto saved = ReadFile(src + "/shape", 1 << 20);
    if (!saved.ok()) return saved.status().Wrap("the saved box in " + src);
    if (*saved != shape)
      return Status::Error(
          "its spec is not the saved box's: memory, CPUs, layers and binds must be the same",
          EINVAL);
    SBX_RETURN_IF_ERROR(CopySparse(src + "/cfg.img", d + "/cfg.img", base));
    SBX_RETURN_IF_ERROR(CopySparse(src + "/disk.img", d + "/disk.img", base));
  } else {
    // The configuration's disk, and the writable layer: sparse ext4 images, the box id's, without
    // a journal (the writable layer lives as long as the box; a crash of the box loses it anyway).
    auto cfg = BoxFile(d + "/cfg.img", base);
    if (!cfg.ok()) return cfg.status();
    if (::ftruncate(cfg->get(), (8 << 20) + cfg_bytes * 2) != 0)
      return Status::Errno("size " + d + "/cfg.img");
    cfg->reset();
    SBX_RETURN_IF_ERROR(
        RunTool({mke2fs_, "-q", "-F", "-t", "ext4", "-O", "^has_journal", "-m", "0", "-d",
                 d + "/cfg", "-E", "root_owner=0:0,nodiscard", d + "/cfg.img"},
                c.log.get(), d + "/qemu.log")
            .Wrap("make the configuration's disk"));
    const int64_t disk = spec.limits.disk_bytes > 0 ? spec.limits.disk_bytes : kDefaultDisk;
    auto img = BoxFile(d + "/disk.img", base);
    if (!img.ok()) return img.status();
    if (::ftruncate(img->get(), disk) != 0) return Status::Errno("size " + d + "/disk.img");
    img->reset();
    SBX_RETURN_IF_ERROR(RunTool({mke2fs_, "-q", "-F", "-t", "ext4", "-O", "^has_journal", "-m", "0",
                                 "-E", "root_owner=0:0,nodiscard", d + "/disk.img"},
                                c.log.get(), d + "/qemu.log")
                            .Wrap("make the writable layer"));
  }

  c.box.id = spec.id;
  c.box.dir = d;
  c.box.id_base = base;
  c.box.runtime = "vm";
  c.box.agent_socket = d + "/agent.sock";
  return {};
}

Result<std::string> VmRuntime::StackImage(const std::vector<std::string>& layers, int log_fd,
                                          const std::string& log_path) {
  // Named after what identifies each layer: its path, and its root directory's inode and time (a
  // layer removed and made again under the same path is another).
  std::string key;
  for (const auto& l : layers) {
    struct stat st {};
    if (::stat(l.c_str(), &st) != 0) return Status::Errno("stat layer " + l);
    key += l + "\n" + std::to_string(st.st_dev) + " " + std::to_string(st.st_ino) + " " +
           std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec) + "\n";
  }
  char name[32];
  std::snprintf(name, sizeof name, "%016llx.img", static_cast<unsigned long long>(Fnv(key)));
  const std::string images = config_.run_dir + "/.images";
  const std::string img = images + "/" + name;
  MutexLock g(images_mu_);
  if (::access(img.c_str(), F_OK) == 0) return img;
  SBX_RETURN_IF_ERROR(MakeDirs(images, 0700));
  // The layers side by side (0, 1, ...) under one directory, read-only binds, for mke2fs -d.
  const std::string stage = images + "/.build-" + RandomId(8);
  const std::string tmp = img + ".tmp-" + RandomId(8);
  auto cleanup = [&] {
    (void)UnmountBelow(stage);
    (void)RemoveTree(stage);
    ::unlink(tmp.c_str());
  };
  if (::mkdir(stage.c_str(), 0700) != 0) return Status::Errno("mkdir " + stage);
  walk_bytes = 0;
  walk_inodes = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    Status bound = BindReadOnly(layers[i], stage + "/" + std::to_string(i));
    if (!bound.ok()) {
      cleanup();
      return bound;
    }
    if (::nftw(layers[i].c_str(), CountEntry, 64, FTW_PHYS) != 0) {
      Status s = Status::Errno("walk layer " + layers[i]);
      cleanup();
      return s;
    }
  }
  // Room for every block and inode, and some: mke2fs fails rather than overfill, so a second try
  // doubles it. The image is sparse: room costs nothing.
  uint64_t size = walk_bytes + walk_bytes / 4 + walk_inodes * 512 + (64ULL << 20);
  const uint64_t inodes = walk_inodes + walk_inodes / 4 + 1024;
  Status made;
  for (int attempt = 0; attempt < 2; ++attempt, size *= 2) {
    ::unlink(tmp.c_str());
    UniqueFd f(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!f || ::ftruncate(f.get(), static_cast<off_t>(size)) != 0) {
      made = Status::Errno("create " + tmp);
      break;
    }
    f.reset();
    made = RunTool({mke2fs_, "-q", "-F", "-t", "ext4", "-O", "^has_journal", "-m", "0", "-N",
                    std::to_string(inodes), "-d", stage, "-E", "nodiscard", tmp},
                   log_fd, log_path);
    if (made.ok()) break;
  }
  // Beside it, its layers: ReapOrphans removes the image once one of them is gone.
  std::string list;
  for (const auto& l : layers) list += l + "\n";
  if (made.ok()) made = WriteFile(img + ".layers", list, 0600);
  if (made.ok() && ::rename(tmp.c_str(), img.c_str()) != 0) made = Status::Errno("rename " + tmp);
  cleanup();
  if (!made.ok()) return made.Wrap("make the image of the template's layers");
  return img;
}

Result<VmRuntime::HostEnd> VmRuntime::StartHostEnd(const std::string& dir, uint32_t base,
                                                   bool die_with_parent, bool reset,
                                                   const std::string& hostname, int log_fd) {
  // agent.sock: bound here, root's (0600) in the root-owned directory, so that nothing running as
  // the box's id can replace it; bound again by each host end.
  ::unlink((dir + "/agent.sock").c_str());
  auto listen = ListenUnix(dir + "/agent.sock");
  if (!listen.ok()) return listen.status();
  auto port = ConnectUnix(dir + "/port.sock");
  if (!port.ok()) return port.status().Wrap("QEMU's end of the agent's port");
  auto console = ConnectUnix(dir + "/console.sock");
  if (!console.ok()) return console.status().Wrap("QEMU's serial console");
  int rp[2];
  if (::pipe2(rp, O_CLOEXEC) != 0) return Status::Errno("pipe");
  HostEnd he;
  he.ready.reset(rp[0]);
  UniqueFd ready_w(rp[1]);
  // The console's copy (root's; read-write: the copy reads back the part it keeps), bounded.
  UniqueFd console_log(
      ::open((dir + "/console.log").c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  if (!console_log) return Status::Errno("open " + dir + "/console.log");
  std::vector<std::string> argv = AsBox(base);
  // setpriv sets the parent-death signal after its change of ids, which would clear it.
  if (die_with_parent) argv.insert(argv.begin() + 1, "--pdeathsig=KILL");
  argv.insert(argv.end(),
              {config_.run_dir + "/.sbx-agent", "--listen-fd", "3", "--vm-channel-fd", "4",
               "--vm-ready-fd", "5", "--vm-console-fd", "6", "--vm-console-log-fd", "7"});
  if (reset) argv.insert(argv.end(), {"--vm-reset", hostname});
  auto mux = Spawn(argv, log_fd,
                   {{3, listen->get()},
                    {4, port->get()},
                    {5, ready_w.get()},
                    {6, console->get()},
                    {7, console_log.get()}});
  if (!mux.ok()) return mux.status().Wrap("start the port's host end");
  he.pid = mux->pid;
  he.pidfd = std::move(mux->pidfd);
  return he;
}

Status VmRuntime::AwaitReady(const std::string& dir, int ready, int qemu_pidfd, int mux_pidfd) {
  const auto deadline = Clock::now() + kBootWait;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0)
      return Status::Error("its agent did not answer within " + std::to_string(kBootWait.count()) +
                               " s; console: " + Tail(dir + "/console.log", 800),
                           ETIMEDOUT);
    pollfd p[3] = {{ready, POLLIN, 0}, {qemu_pidfd, POLLIN, 0}, {mux_pidfd, POLLIN, 0}};
    if (::poll(p, 3, static_cast<int>(left.count())) < 0 && errno != EINTR)
      return Status::Errno("poll");
    if (p[0].revents != 0) {
      char b = 0;
      if (::read(ready, &b, 1) == 1) return {};
      // EOF without the byte: the host end exited; the next poll tells who.
    }
    if (p[1].revents != 0 || p[2].revents != 0)
      return Status::Error(
          std::string(p[1].revents != 0 ? "QEMU" : "the port's host end") +
              " exited before the agent answered: " + Tail(dir + "/qemu.log", 800) +
              "; console: " + Tail(dir + "/console.log", 800),
          ECHILD);
  }
}

Status VmRuntime::Launch(Creation& c) {
  const std::string d = c.dir->path();
  const BoxSpec& spec = c.spec;
  // QEMU's cgroup: the guest's memory and QEMU's own, the guest's CPUs.
  Limits host = spec.limits;
  host.memory_bytes =
      (spec.limits.memory_bytes > 0 ? spec.limits.memory_bytes : kDefaultMemory) + kQemuOverhead;
  host.pids = 0;  // QEMU's threads; the guest's processes are its kernel's business
  auto cg = Cgroup::Create(cgroups_, spec.id, host);
  if (!cg.ok()) return cg.status();
  c.cgroup = CgroupOwner(std::move(cg).value());
  c.box.timings.cgroup_us = MicrosSince(c.t);

  // QEMU's listening sockets: the agent's port, the serial console, the monitor.
  std::vector<std::pair<int, UniqueFd>> fds;
  for (const auto& [fd, name] : {std::pair{3, "port"}, {4, "console"}, {6, "qmp"}}) {
    auto l = ListenUnix(d + "/" + name + ".sock");
    if (!l.ok()) return l.status();
    fds.emplace_back(fd, std::move(l).value());
  }
  if (c.layout.stack) fds.emplace_back(5, std::move(c.stack));
  std::vector<std::string> argv = AsBox(c.base);
  if (spec.die_with_parent) argv.insert(argv.begin() + 1, "--pdeathsig=KILL");
  auto q = QemuArgs(d, accel_, &spec, c.layout);
  argv.insert(argv.end(), q.begin(), q.end());
  if (c.restore_from != nullptr) {
    // QEMU reads the saved memory from fd 7, then waits, stopped, for the monitor's cont.
    UniqueFd memory(::open((*c.restore_from + "/memory").c_str(), O_RDONLY | O_CLOEXEC));
    if (!memory) return Status::Errno("open " + *c.restore_from + "/memory");
    fds.emplace_back(7, std::move(memory));
    argv.insert(argv.end(), {"-incoming", "fd:7"});
  }
  std::vector<std::pair<int, int>> pass;
  pass.reserve(fds.size());
  for (const auto& [target, fd] : fds) pass.emplace_back(target, fd.get());
  auto qemu = Spawn(argv, c.log.get(), pass);
  if (!qemu.ok()) return qemu.status().Wrap("start QEMU");
  c.qemu = ChildProcess(qemu->pid, UniqueFd(::fcntl(qemu->pidfd.get(), F_DUPFD_CLOEXEC, 0)));
  c.qemu_pidfd = std::move(qemu->pidfd);
  SBX_RETURN_IF_ERROR(c.cgroup->AddProcess(qemu->pid));
  SBX_RETURN_IF_ERROR(RecordPid(d + "/pid", qemu->pid));
  c.box.init_pid = qemu->pid;
  fds.clear();

  if (c.restore_from != nullptr) {
    auto mon = Qmp::Connect(d + "/qmp.sock", Clock::now() + kMigrateWait);
    Result<std::string> st =
        mon.ok() ? AwaitStatus(*mon, "query-status", "status", {"inmigrate", "prelaunch"},
                               Clock::now() + kMigrateWait)
                 : Result<std::string>(mon.status());
    if (st.ok() && *st == "paused") {
      auto cont = mon->Call("cont");
      if (!cont.ok()) st = cont.status();
    } else if (st.ok() && *st != "running") {
      st = Status::Error("QEMU is " + *st + " after loading it", EIO);
    }
    if (!st.ok())
      return st.status().Wrap("load the saved memory (qemu.log: " + Tail(d + "/qemu.log", 400) +
                              ")");
  }

  auto he = StartHostEnd(d, c.base, spec.die_with_parent, c.restore_from != nullptr,
                         c.restore_from != nullptr ? spec.hostname : "", c.log.get());
  if (!he.ok()) return he.status();
  c.mux = ChildProcess(he->pid, UniqueFd(::fcntl(he->pidfd.get(), F_DUPFD_CLOEXEC, 0)));
  c.mux_pidfd = std::move(he->pidfd);
  c.ready = std::move(he->ready);
  SBX_RETURN_IF_ERROR(c.cgroup->AddProcess(he->pid));
  SBX_RETURN_IF_ERROR(RecordPid(d + "/mux.pid", he->pid));
  c.box.timings.clone_us = MicrosSince(c.t);

  // The guest boots (or goes on), and its end of the port says hello.
  SBX_RETURN_IF_ERROR(AwaitReady(d, c.ready.get(), c.qemu_pidfd.get(), c.mux_pidfd.get()));
  c.box.timings.agent_us = MicrosSince(c.t);
  return {};
}

Status VmRuntime::SaveMemory(const Box& box, const std::string& dest, bool stop) {
  SBX_RETURN_IF_ERROR(ValidateBoxId(box.id));
  const std::string what = "save the memory of box " + box.id;
  const std::string d = Dir(box.id);
  if (!DirNames(d + "/lower").empty() || !DirNames(d + "/binds").empty())
    return Status::Error(what +
                             ": it shares host directories with its guest over 9p (a layer "
                             "from outside the template store, or a bind of a directory), "
                             "which QEMU cannot save",
                         ENOTSUP);
  auto shape = ReadFile(d + "/shape", 1 << 20);
  if (!shape.ok()) return shape.status().Wrap(what);
  auto mux = LiveProcess(d + "/mux.pid");
  if (!mux.ok() || !LiveProcess(d + "/pid").ok())
    return Status::Error(what + ": its agent is gone", ESRCH);
  auto ids = ReadFile(d + "/ids", 64);
  const uint32_t base =
      ids.ok() ? static_cast<uint32_t>(std::strtoul(ids->c_str(), nullptr, 10)) : 0;
  UniqueFd log(::open((d + "/qemu.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  if (!log) return Status::Errno(what + ": open qemu.log");

  // The port quiesces (vm_mux.h): every agent connection closes, nothing is left in flight, and
  // its host end exits.
  ::syscall(SYS_pidfd_send_signal, mux->get(), SIGUSR1, nullptr, 0U);
  bool quiet = AwaitExit(mux->get(), kQuiesceWait);
  if (!quiet) ::syscall(SYS_pidfd_send_signal, mux->get(), SIGKILL, nullptr, 0U);
  {
    MutexLock g(mu_);
    if (auto it = children_.find(box.id); it != children_.end() && it->second.second) {
      AwaitExit(it->second.second.get(), kStopWait);
      Reap(it->second.second.get());
      it->second.second.reset();
    }
  }
  // The box runs on with a new host end: after a save, or when it fails.
  auto go_on = [&](Qmp* mon) -> Status {
    if (mon != nullptr) {
      auto cont = mon->Call("cont");
      if (!cont.ok()) return cont.status();
    }
    auto he = StartHostEnd(d, base, false, true, "", log.get());
    if (!he.ok()) return he.status();
    auto cg = Cgroup::Open(cgroups_, box.id);
    (void)cg->AddProcess(he->pid);
    SBX_RETURN_IF_ERROR(RecordPid(d + "/mux.pid", he->pid));
    auto qemu = LiveProcess(d + "/pid");
    if (!qemu.ok()) return qemu.status();
    SBX_RETURN_IF_ERROR(AwaitReady(d, he->ready.get(), qemu->get(), he->pidfd.get()));
    // Kept also for a box adopted after a restart (no entry yet): Stop reaps what it started.
    MutexLock g(mu_);
    children_[box.id].second = std::move(he->pidfd);
    return {};
  };
  auto failed = [&](const Status& s, Qmp* mon) -> Status {
    Status resumed = go_on(mon);
    std::string also = resumed.ok() ? "" : "; and it could not go on: " + resumed.message();
    return Status::Error(what + ": " + s.message() + also, s.err());
  };
  if (!quiet)
    return failed(Status::Error("the guest's end of its port did not quiesce", ETIMEDOUT), nullptr);

  auto mon = Qmp::Connect(d + "/qmp.sock", Clock::now() + kMigrateWait);
  if (!mon.ok()) return failed(mon.status(), nullptr);
  if (auto r = mon->Call("stop"); !r.ok()) return failed(r.status(), &*mon);
  UniqueFd memory(
      ::open((dest + "/memory").c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!memory) return failed(Status::Errno("create " + dest + "/memory"), &*mon);
  // QEMU's default bandwidth for a migration is 32 MiB/s: a file takes what the disk gives.
  Result<nlohmann::json> r =
      mon->Call("migrate-set-parameters", {{"max-bandwidth", int64_t{1} << 40}});
  if (r.ok()) r = mon->Call("getfd", {{"fdname", "sbx-memory"}}, memory.get());
  if (r.ok()) r = mon->Call("migrate", {{"uri", "fd:sbx-memory"}});
  if (!r.ok()) return failed(r.status(), &*mon);
  auto done = AwaitStatus(*mon, "query-migrate", "status",
                          {"none", "setup", "active", "pre-switchover", "device", "wait-unplug"},
                          Clock::now() + kMigrateWait);
  if (!done.ok()) return failed(done.status(), &*mon);
  if (*done != "completed")
    return failed(
        Status::Error("QEMU's migration to a file " + *done + ": " + Tail(d + "/qemu.log", 400),
                      EIO),
        &*mon);
  Status copied = ::fsync(memory.get()) == 0 ? Status() : Status::Errno("sync " + dest + "/memory");
  if (copied.ok()) copied = CopySparse(d + "/disk.img", dest + "/disk.img", 0);
  if (copied.ok()) copied = CopySparse(d + "/cfg.img", dest + "/cfg.img", 0);
  if (copied.ok()) copied = WriteFile(dest + "/shape", *shape, 0600);
  if (!copied.ok()) return failed(copied, &*mon);
  if (stop) return Stop(box).Wrap(what);
  Status on = go_on(&*mon);
  return on.ok() ? Status() : on.Wrap(what + ": saved, but it could not go on");
}

size_t VmRuntime::MaxLayers(const Box& box) {
  (void)box;
  // The guest's init mounts the root overlay with every layer in one option string
  // (initramfs.cc).
  return OverlayLayersThatFit(std::string("lowerdir=,upperdir=/rw/upper,workdir=/rw/work").size(),
                              "/layers/");
}

Status VmRuntime::Freeze(const Box& box) {
  SBX_RETURN_IF_ERROR(ValidateBoxId(box.id));
  return Cgroup::Open(cgroups_, box.id)->Freeze().Wrap("freeze box " + box.id);
}

Status VmRuntime::Thaw(const Box& box) {
  SBX_RETURN_IF_ERROR(ValidateBoxId(box.id));
  return Cgroup::Open(cgroups_, box.id)->Thaw().Wrap("thaw box " + box.id);
}

Result<uint64_t> VmRuntime::OomKills(const Box& box) {
  SBX_RETURN_IF_ERROR(ValidateBoxId(box.id));
  auto host = Cgroup::Open(cgroups_, box.id)->OomKills();
  if (!host.ok()) return host.status().Wrap("OOM kills of box " + box.id);
  return *host + GuestOomKills(box.agent_socket).value_or(0);
}

Result<BoxStats> VmRuntime::Stats(const Box& box) {
  SBX_RETURN_IF_ERROR(ValidateBoxId(box.id));
  auto st = Cgroup::Open(cgroups_, box.id)->Stats();
  if (!st.ok()) return st.status().Wrap("stats of box " + box.id);
  // A frozen guest cannot answer; a box saved to disk has no live cgroup to read above.
  if (!st->frozen && !box.agent_socket.empty()) {
    if (auto ooms = GuestOomKills(box.agent_socket)) st->oom_kills += *ooms;
  }
  struct stat img {};
  if (::stat((Dir(box.id) + "/disk.img").c_str(), &img) == 0) {
    st->disk_used = static_cast<uint64_t>(img.st_blocks) * 512;
    st->disk_total = static_cast<uint64_t>(img.st_size);
  }
  return st;
}

Result<UniqueFd> VmRuntime::OpenSocket(const Box& box, int domain, int type) {
  (void)domain;
  (void)type;
  return Status::Error("socket in box " + box.id +
                           ": a vm box's sockets are in its guest's kernel, not in a host network "
                           "namespace",
                       ENOTSUP);
}

std::optional<std::string> VmRuntime::AgentExit(const Box& box) {
  if (!ValidateBoxId(box.id).ok()) return "invalid box id";
  const std::string dir = Dir(box.id);
  const bool qemu = LiveProcess(dir + "/pid").ok();
  const bool mux = LiveProcess(dir + "/mux.pid").ok();
  if (qemu && mux) return std::nullopt;
  std::string how = qemu ? "the host end of the agent's port exited" : "QEMU exited";
  {
    MutexLock g(mu_);
    if (auto it = children_.find(box.id); it != children_.end()) {
      int st = Reap((qemu ? it->second.second : it->second.first).get());
      if (st >= 0) how += " with status " + std::to_string(st);
    }
  }
  if (auto log = Tail(dir + "/qemu.log", 400); !log.empty()) how += "; qemu.log ends: " + log;
  if (auto con = Tail(dir + "/console.log", 400); !con.empty()) how += "; the console ends: " + con;
  return how;
}

Status VmRuntime::Stop(const Box& box) {
  SBX_RETURN_IF_ERROR(ValidateBoxId(box.id));
  // QEMU is the whole guest and the host end its only other process: killing the cgroup's
  // processes (thawed first) stops every process of the box.
  Status killed = Cgroup::Open(cgroups_, box.id)->KillAll();
  const std::string dir = Dir(box.id);
  for (const char* f : {"/pid", "/mux.pid"}) {
    auto p = LiveProcess(dir + f);
    if (!p.ok()) continue;
    ::syscall(SYS_pidfd_send_signal, p->get(), SIGKILL, nullptr, 0U);
    if (!AwaitExit(p->get(), kStopWait))
      return Status::Error("stop box " + box.id + ": its " + (f + 1) + " process did not exit",
                           ETIMEDOUT);
  }
  MutexLock g(mu_);
  if (auto it = children_.find(box.id); it != children_.end()) {
    for (UniqueFd* fd : {&it->second.first, &it->second.second}) {
      if (!*fd) continue;
      AwaitExit(fd->get(), kStopWait);
      Reap(fd->get());
    }
    children_.erase(it);
  }
  return killed.ok() ? Status() : killed.Wrap("stop box " + box.id);
}

Status VmRuntime::Destroy(const Box& box) {
  SBX_RETURN_IF_ERROR(ValidateBoxId(box.id));
  const std::string what = "destroy box " + box.id;
  const std::string dir = Dir(box.id);
  Status stopped = Stop(box);
  Status cgroup = Cgroup::Open(cgroups_, box.id)->Destroy();
  Status unmounted = UnmountBelow(dir);
  Status fs = unmounted.ok() ? RemoveTree(dir) : unmounted;
  {
    MutexLock g(mu_);
    owner_locks_.erase(box.id);
  }
  if (fs.ok() && config_.id_pool != nullptr) {
    Status released = config_.id_pool->Release(box.id);
    if (!released.ok()) return released.Wrap(what);
  }
  for (const Status* s : {&stopped, &cgroup, &fs})
    if (!s->ok()) return s->Wrap(what);
  return {};
}

Result<std::vector<std::string>> VmRuntime::ListBoxes() { return ListBoxIds(config_.run_dir); }

Result<Box> VmRuntime::Adopt(const std::string& id) {
  SBX_RETURN_IF_ERROR(ValidateBoxId(id));
  const std::string what = "adopt box " + id;
  Box box;
  box.id = id;
  box.dir = Dir(id);
  box.runtime = "vm";
  box.agent_socket = box.dir + "/agent.sock";
  UniqueFd lock(::open((box.dir + "/owner").c_str(), O_RDWR | O_CLOEXEC));
  if (!lock) return Status::Errno(what + ": open owner");
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0)
    return Status::Error(what + ": owned by a live process", EBUSY);
  if (auto ids = ReadFile(box.dir + "/ids", 64); ids.ok())
    box.id_base = static_cast<uint32_t>(std::strtoul(ids->c_str(), nullptr, 10));
  if (!LiveProcess(box.dir + "/pid").ok() || !LiveProcess(box.dir + "/mux.pid").ok())
    return Status::Error(what + ": its agent is gone", ESRCH);
  auto pid = ReadFile(box.dir + "/pid", 64);
  box.init_pid = pid.ok() ? static_cast<pid_t>(std::atoi(pid->c_str())) : -1;
  MutexLock g(mu_);
  owner_locks_[id] = std::move(lock);
  return box;
}

Result<int> VmRuntime::ReapOrphans(const std::string& owner) {
  auto ids = ListBoxes();
  if (!ids.ok()) return ids.status();
  int reaped = 0;
  for (const auto& id : *ids) {
    {
      MutexLock g(mu_);
      if (owner_locks_.count(id)) continue;  // ours and alive
    }
    if (!IsOrphan(Dir(id), owner)) continue;
    Box box;
    box.id = id;
    if (Destroy(box).ok()) ++reaped;
  }
  for (const auto& name : DirNames(config_.run_dir)) {
    const std::string path = config_.run_dir + "/" + name;
    // Creations whose creator died before the rename; probe directories of a dead prober.
    bool probe = name.rfind(".probe-", 0) == 0;
    if (!IsAbandonedCreation(name) && !probe) continue;
    if (probe) {
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0 || st.st_mtime + 120 > ::time(nullptr)) continue;
    }
    (void)UnmountBelow(path);
    if (RemoveTree(path).ok()) ++reaped;
  }
  // Stack images of layers that are gone (no box can use them again: a sandbox's layers stay
  // while it lives), and images a dead process was making (a live one's is younger than an hour).
  const std::string images = config_.run_dir + "/.images";
  for (const auto& name : DirNames(images)) {
    if (name.size() < 4 || name.compare(name.size() - 4, 4, ".img") != 0) continue;
    const std::string img = images + "/" + name;
    auto list = ReadFile(img + ".layers", 1 << 20);
    bool gone = !list.ok();
    for (size_t at = 0; list.ok() && at < list->size();) {
      size_t nl = list->find('\n', at);
      if (nl == std::string::npos) nl = list->size();
      if (nl > at && ::access(list->substr(at, nl - at).c_str(), F_OK) != 0) gone = true;
      at = nl + 1;
    }
    if (!gone) continue;
    ::unlink(img.c_str());
    ::unlink((img + ".layers").c_str());
  }
  for (const auto& name : DirNames(images)) {
    if (name.rfind(".build-", 0) != 0 && name.find(".tmp-") == std::string::npos) continue;
    const std::string path = images + "/" + name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || st.st_mtime + 3600 > ::time(nullptr)) continue;
    (void)UnmountBelow(path);
    (void)RemoveTree(path);
  }
  return reaped;
}

}  // namespace sbx::runtime
