#include "runtime/oci/oci_runtime.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <linux/mount.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <thread>

#include "common/fs.h"
#include "runtime/box_host.h"
#include "runtime/native/box_owners.h"
#include "runtime/native/cgroup_internal.h"
#include "runtime/native/child.h"
#include "runtime/native/disk.h"
#include "runtime/native/idmap.h"
#include "runtime/native/layer_copy.h"
#include "runtime/native/native_runtime.h"

extern char** environ;

namespace sbx::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// Where sbx's pieces appear inside every box.
constexpr char kAgentInside[] = "/.sbx/sbx-agent";
constexpr char kSockInside[] = "/.sbx/run";  // gVisor: the directory the agent binds its socket in
constexpr char kPreloadInside[] = "/.sbx/preload.so";  // gVisor: sbx-gvisor-preload.so
constexpr auto kAgentWait = std::chrono::seconds(30);
constexpr auto kStopWait = std::chrono::seconds(5);
constexpr auto kCommandWait = std::chrono::seconds(60);  // any one call of the binary
constexpr size_t kMaxOutput = 1 << 20;
// Open's probe box: its id's prefix and the owner its directory names.
constexpr char kProbePrefix[] = "probe-";
constexpr char kProbeOwner[] = "probe";
// Part of the probe's memo: bump it when what a box needs of the binary changes (the bundle).
constexpr char kProbeVersion[] = "oci-probe-1";

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

std::string Tail(const std::string& s, size_t n) {
  return s.size() > n ? s.substr(s.size() - n) : s;
}

struct Ran {
  int status = -1;  // exit code, or 128 + signal
  std::string out, err;
};

}  // namespace

// How Spawn runs a binary (declared in the header for OciRuntime::BoxSpawn).
struct SpawnOptions {
  // Its stdout and stderr, when >= 0 (a container started by the binary keeps them: a pipe would
  // never reach EOF); else both are collected (up to 1 MiB each).
  int log_fd = -1;
  int fd3 = -1;  // when >= 0, its descriptor 3 (runc --preserve-fds 1)
  // Resource limits set in the child before its exec, inherited by everything it starts.
  std::vector<std::pair<int, rlimit>> rlimits;
  // Run it in a mount namespace of its own with an empty /proc/sys/net. runsc 20221219 tells
  // the host's network namespace by /proc/sys/net/core/rmem_default existing, which it does in
  // every namespace on kernels since 6.x, so its `start` refuses every box with a network
  // ("cannot run with network enabled in root network namespace"). Hidden, the test holds
  // again: sbx gives runsc only namespaces it made, never the host's.
  bool hide_proc_sys_net = false;
  // gVisor's `create` and Open's probe run: the box's cgroups (open cgroup.procs files) the child
  // joins, then the box's user namespace it enters as its root (host id base), so that runsc
  // makes the box's processes in the box's id range: its Sentry runs as the box's base+65534,
  // never as the host's nobody that every other box would share.
  std::vector<int> cgroup_procs;
  int userns_fd = -1;
  std::chrono::milliseconds timeout = kCommandWait;
};

namespace {

// What the child of Spawn does before its exec (the parent prepares it all).
struct ChildPlan {
  char* const* argv;
  const int* fds;
  const rlimit* limits;
  const int* resources;
  size_t nlimits;
  const int* cgroup_procs;
  size_t ncgroups;
  int userns_fd;
  bool hide_proc_sys_net;
};

// The child of Spawn between its fork (vfork() sharing the parent's memory, or fork() when it
// enters a user namespace, which a task sharing its memory cannot) and execve(): it runs only
// system calls on what the parent prepared, and never returns.
[[noreturn]] void ExecChild(const ChildPlan& c) {
  char* const* argv = c.argv;
  const int* fds = c.fds;
  // Default dispositions and an empty mask for the new program (the parent blocked everything
  // around the vfork).
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) (void)::sigaction(sig, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  (void)::sigprocmask(SIG_SETMASK, &none, nullptr);
  // Before the dup2s below, which may reuse these descriptors' numbers.
  for (size_t i = 0; i < c.ncgroups; ++i)
    if (::write(c.cgroup_procs[i], "0", 1) != 1) ::_exit(127);
  if (c.userns_fd >= 0 &&
      (::setns(c.userns_fd, CLONE_NEWUSER) != 0 || ::setgroups(0, nullptr) != 0 ||
       ::setresgid(0, 0, 0) != 0 || ::setresuid(0, 0, 0) != 0))
    ::_exit(127);
  int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0 || ::dup2(null_fd, 0) < 0 || ::dup2(fds[0], 1) < 0 || ::dup2(fds[1], 2) < 0)
    ::_exit(127);
  if (fds[2] >= 0 && ::dup2(fds[2], 3) < 0) ::_exit(127);
  for (size_t i = 0; i < c.nlimits; ++i)
    if (::setrlimit(static_cast<__rlimit_resource>(c.resources[i]), &c.limits[i]) != 0)
      ::_exit(127);
  if (c.hide_proc_sys_net &&
      (::unshare(CLONE_NEWNS) != 0 ||
       ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
       ::mount("sbx-hidden", "/proc/sys/net", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
               "size=4k,mode=555") != 0))
    ::_exit(127);
  ::execve(argv[0], argv, environ);
  ::_exit(127);
}

// Runs `argv` (no shell) with stdin from /dev/null and waits for it, at most the options'
// timeout (then it is killed: ETIMEDOUT). posix_spawn, or with rlimits a vfork() whose child
// only sets them (ExecChild): no code of ours that could allocate or lock runs between the fork
// and the exec.
Result<Ran> Spawn(const std::vector<std::string>& argv, const SpawnOptions& o = {}) {
  const int log_fd = o.log_fd;
  UniqueFd out_r, out_w, err_r, err_w, high3;
  if (log_fd < 0) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return Status::Errno("pipe");
    out_r.reset(p[0]);
    out_w.reset(p[1]);
    if (::pipe2(p, O_CLOEXEC) != 0) return Status::Errno("pipe");
    err_r.reset(p[0]);
    err_w.reset(p[1]);
  }
  if (o.fd3 >= 0 && o.fd3 <= 3) {  // dup2(3, 3) would leave its close-on-exec flag set
    high3.reset(::fcntl(o.fd3, F_DUPFD_CLOEXEC, 10));
    if (!high3) return Status::Errno("dup");
  }
  const int fd3 = high3 ? high3.get() : o.fd3;
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int child_fds[3] = {log_fd >= 0 ? log_fd : out_w.get(), log_fd >= 0 ? log_fd : err_w.get(),
                            fd3};
  pid_t pid = -1;
  int rc = 0;
  if (!o.rlimits.empty() || o.hide_proc_sys_net || !o.cgroup_procs.empty() || o.userns_fd >= 0) {
    std::vector<rlimit> limits;
    std::vector<int> resources;
    for (const auto& [resource, limit] : o.rlimits) {
      resources.push_back(resource);
      limits.push_back(limit);
    }
    ChildPlan plan{};
    plan.argv = args.data();
    plan.fds = child_fds;
    plan.limits = limits.data();
    plan.resources = resources.data();
    plan.nlimits = limits.size();
    plan.cgroup_procs = o.cgroup_procs.data();
    plan.ncgroups = o.cgroup_procs.size();
    plan.userns_fd = o.userns_fd;
    plan.hide_proc_sys_net = o.hide_proc_sys_net;
    sigset_t all, old;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &old);
    pid = o.userns_fd >= 0 ? ::fork() : ::vfork();  // NOLINT(clang-analyzer-unix.Vfork)
    // ExecChild makes only system calls, on memory prepared above, then execs or _exits.
    if (pid == 0) ExecChild(plan);  // NOLINT(clang-analyzer-unix.Vfork)
    rc = pid < 0 ? errno : 0;
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  } else {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, child_fds[0], 1);
    posix_spawn_file_actions_adddup2(&fa, child_fds[1], 2);
    if (fd3 >= 0) posix_spawn_file_actions_adddup2(&fa, fd3, 3);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    // The caller's signal mask and ignored signals are none of the binary's business.
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    rc = ::posix_spawn(&pid, args[0], &fa, &attr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
  }
  out_w.reset();
  err_w.reset();
  if (rc != 0) return Status::Error("run " + argv[0], rc);
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  Ran r;
  const auto deadline = Clock::now() + o.timeout;
  bool timed_out = false;
  std::string* into[2] = {&r.out, &r.err};
  pollfd fds[3] = {{out_r ? out_r.get() : -1, POLLIN, 0},
                   {err_r ? err_r.get() : -1, POLLIN, 0},
                   {pidfd.get(), POLLIN, 0}};
  // Until both pipes are at EOF (log_fd: until the process exits).
  for (;;) {
    bool pipes_open = fds[0].fd >= 0 || fds[1].fd >= 0;
    if (!pipes_open && log_fd < 0) break;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    int n = ::poll(fds, 3, static_cast<int>(left.count()));
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[8192];
      ssize_t got = ::read(fds[i].fd, buf, sizeof buf);
      if (got > 0) {
        if (into[i]->size() < kMaxOutput) into[i]->append(buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        fds[i].fd = -1;
      }
    }
    if (log_fd >= 0 && fds[2].revents != 0) break;
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out)
    return Status::Error(argv[0] + " " + (argv.size() > 1 ? argv.back() : "") + " did not finish",
                         ETIMEDOUT);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// A box's writable layer (its upper directory) on the host: in its disk image's mount when it
// has a disk limit.
std::string Upper(const std::string& box_dir) {
  const std::string image = box_dir + "/fs/disk/upper";
  struct stat st {};
  return ::lstat(image.c_str(), &st) == 0 ? image : box_dir + "/fs/upper";
}

// The immutable flag of directory `path` (FS_IOC_SETFLAGS).
Status SetImmutable(const std::string& path, bool on) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) return Status::Errno("open " + path);
  int flags = 0;
  if (::ioctl(fd.get(), FS_IOC_GETFLAGS, &flags) != 0) return Status::Errno("get flags of " + path);
  int want = on ? (flags | FS_IMMUTABLE_FL) : (flags & ~FS_IMMUTABLE_FL);
  if (want != flags && ::ioctl(fd.get(), FS_IOC_SETFLAGS, &want) != 0)
    return Status::Errno(std::string(on ? "make " : "unmake ") + path + " immutable");
  return {};
}

// Removes directory <hierarchy>/<own cgroup>/<parent>/<id> in every cgroup hierarchy mounted
// here, v1 and v2 (runc makes one in every v1 hierarchy, not only those the native driver
// uses). What the runtime binary's delete already removed is fine; a directory that still holds
// processes is EBUSY.
Status RemoveBoxCgroups(const std::string& parent, const std::string& id) {
  auto mountinfo = ReadFile("/proc/self/mountinfo", 16 << 20);
  auto own = ReadFile("/proc/self/cgroup", 1 << 16);
  if (!mountinfo.ok() || !own.ok()) return Status::Error("read this process's cgroups", EIO);
  auto mounts = cgroup_internal::ParseMountInfo(*mountinfo);
  auto entries = cgroup_internal::ParseProcCgroup(*own);
  Status first;
  for (const auto& m : mounts) {
    for (const auto& e : entries) {
      bool match = m.v2 ? (e.id == 0 && e.controllers.empty())
                        : (!e.controllers.empty() &&
                           std::is_permutation(e.controllers.begin(), e.controllers.end(),
                                               m.controllers.begin(), m.controllers.end()));
      if (!match || e.path.rfind(m.root, 0) != 0) continue;
      std::string rel = e.path.substr(m.root == "/" ? 0 : m.root.size());
      std::string dir = m.mount_point + (rel == "/" ? "" : rel) + "/" + parent + "/" + id;
      if (::rmdir(dir.c_str()) != 0 && errno != ENOENT && first.ok())
        first = Status::Errno("remove cgroup " + dir);
    }
  }
  return first;
}

// Gives everything in directory `dir_fd` (and the directory) to uid:gid, never following a
// symbolic link: what is in it was written by another id.
Status ChownAt(int dir_fd, const std::string& path, uid_t uid, gid_t gid, int depth = 0) {
  if (depth > 8) return Status::Error(path + ": nested too deep", ELOOP);
  if (::fchown(dir_fd, uid, gid) != 0) return Status::Errno("chown " + path);
  UniqueFd dup(::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0));
  DIR* d = dup ? ::fdopendir(dup.get()) : nullptr;
  if (d == nullptr) return Status::Errno("open " + path);
  (void)dup.release();
  Status s;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    UniqueFd sub(::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (sub) {
      s = ChownAt(sub.get(), path + "/" + name, uid, gid, depth + 1);
    } else if (::fchownat(dir_fd, name.c_str(), uid, gid, AT_SYMLINK_NOFOLLOW) != 0) {
      s = Status::Errno("chown " + path + "/" + name);
    }
    if (!s.ok()) break;
  }
  ::closedir(d);
  return s;
}

Status ChownTree(const std::string& dir, uid_t uid, gid_t gid) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) return Status::Errno("open " + dir);
  return ChownAt(fd.get(), dir, uid, gid);
}

// Field 22 of /proc/<pid>/stat and whether the process is a zombie (or gone: 0).
std::pair<unsigned long long, bool> StartTimeAndZombie(pid_t pid) {
  auto stat = ReadFile("/proc/" + std::to_string(pid) + "/stat", 4096);
  if (!stat.ok()) return {0, true};
  size_t paren = stat->rfind(')');
  bool zombie = paren == std::string::npos || paren + 2 >= stat->size() ||
                (*stat)[paren + 2] == 'Z' || (*stat)[paren + 2] == 'X';
  return {ProcessStartTime(pid), zombie};
}

// The box's first process as <dir>/pid records it ("<pid> <start time>"): a pidfd of it while it
// is still that process and not a zombie (pids are reused), else ESRCH.
Result<UniqueFd> BoxProcess(const std::string& dir) {
  auto text = ReadFile(dir + "/pid", 64);
  if (!text.ok()) return Status::Error("no pid recorded", ESRCH);
  char* end = nullptr;
  long pid = std::strtol(text->c_str(), &end, 10);
  unsigned long long start = std::strtoull(end, nullptr, 10);
  if (pid <= 0) return Status::Error("no pid recorded", ESRCH);
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0)));
  if (!pidfd) return Status::Error("its first process is gone", ESRCH);
  // Read after the pidfd is held: the start time then names the process the pidfd pins.
  auto [now_start, zombie] = StartTimeAndZombie(static_cast<pid_t>(pid));
  if (zombie || now_start != start) return Status::Error("its first process is gone", ESRCH);
  return pidfd;
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
    if (n == 0) return false;
    if (errno != EINTR) return false;
  }
}

// A process that only holds a user namespace owned by, and mapping ids 0..65535 to, host ids
// base..base+65535 (idmap.h, CloneOwnedBy): the source of the box's idmapped mounts, and for runc
// the namespace the box joins, so that it is owned by the box's own root id as a native box's is.
// It exits when this object goes (its pipe closes) or this process dies.
class UsernsHolder {
 public:
  // `extra`: more namespaces for it to hold, owned by the user namespace (CLONE_NEWNET).
  static Result<std::unique_ptr<UsernsHolder>> Make(uint32_t base, unsigned long extra = 0) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return Status::Errno("pipe");
    UniqueFd r(p[0]), w(p[1]);
    const int rfd = r.get();
    int pidfd = -1;
    long pid = CloneOwnedBy(CLONE_NEWUSER | extra, base, &pidfd);
    if (pid == 0) {
      // The child: raw system calls only (a clone of a multi-threaded process). It keeps nothing
      // of the parent's but the pipe's read end, and waits for its EOF.
      ::syscall(SYS_dup3, rfd, 0, 0);
      ::syscall(SYS_close_range, 1, ~0U, 0);
      char c;
      while (::syscall(SYS_read, 0, &c, 1) < 0 && errno == EINTR) {
      }
      ::syscall(SYS_exit_group, 0);
    }
    if (pid < 0) return Status::Error("clone a user namespace", static_cast<int>(-pid));
    std::unique_ptr<UsernsHolder> h(new UsernsHolder(static_cast<pid_t>(pid), UniqueFd(pidfd)));
    h->wake_ = std::move(w);
    r.reset();
    SBX_RETURN_IF_ERROR(WriteIdMaps(h->pid_, base));
    auto ns = OpenUserNamespace(h->pid_);
    if (!ns.ok()) return ns.status();
    h->ns_ = std::move(ns).value();
    return h;
  }
  UsernsHolder(const UsernsHolder&) = delete;
  UsernsHolder& operator=(const UsernsHolder&) = delete;
  ~UsernsHolder() {
    wake_.reset();
    siginfo_t info{};
    while (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd_.get()), &info,
                    WEXITED | __WALL) < 0 &&
           errno == EINTR) {
    }
  }
  int fd() const { return ns_.get(); }
  pid_t pid() const { return pid_; }
  std::string path(const char* ns = "user") const {
    return "/proc/" + std::to_string(pid_) + "/ns/" + ns;
  }

 private:
  UsernsHolder(pid_t pid, UniqueFd pidfd) : pid_(pid), pidfd_(std::move(pidfd)) {}
  pid_t pid_;
  UniqueFd pidfd_, wake_, ns_;
};

// Host mounts made for a box, unmounted (latest first) unless committed.
class HostMounts {
 public:
  HostMounts() = default;
  HostMounts(const HostMounts&) = delete;
  HostMounts& operator=(const HostMounts&) = delete;
  ~HostMounts() {
    if (committed_) return;
    for (auto it = paths_.rbegin(); it != paths_.rend(); ++it)
      (void)::umount2(it->c_str(), MNT_DETACH);
  }
  void Add(std::string path) { paths_.push_back(std::move(path)); }
  void Commit() { committed_ = true; }

 private:
  std::vector<std::string> paths_;
  bool committed_ = false;
};

// The container as the binary knows it, deleted (with everything in it) unless committed; then
// the box's cgroups, which a failed create may leave.
class ContainerOwner {
 public:
  ContainerOwner(const OciRuntime& rt, std::string id) : rt_(rt), id_(std::move(id)) {}
  ContainerOwner(const ContainerOwner&) = delete;
  ContainerOwner& operator=(const ContainerOwner&) = delete;
  ~ContainerOwner() {
    if (!armed_ || committed_) return;
    (void)rt_.DeleteContainer(id_);
    (void)rt_.DestroyCgroups(id_);
  }
  void Arm() { armed_ = true; }
  void Commit() { committed_ = true; }

 private:
  const OciRuntime& rt_;
  std::string id_;
  bool armed_ = false, committed_ = false;
};

// An idmapped read-only copy (open_tree, idmapped to `userns`) of `source` attached at `target`
// on the host; `target` is made first, as a file when `source` is one.
Status AttachIdmapped(const std::string& source, const std::string& target, int userns,
                      uint32_t base, HostMounts& mounts) {
  struct stat st {};
  if (::stat(source.c_str(), &st) != 0) return Status::Errno("stat " + source);
  if (S_ISDIR(st.st_mode)) {
    if (::mkdir(target.c_str(), 0700) != 0) return Status::Errno("mkdir " + target);
  } else {
    SBX_RETURN_IF_ERROR(WriteFile(target, "", 0600));
  }
  if (::chown(target.c_str(), base, base) != 0) return Status::Errno("chown " + target);
  auto m = DetachedMount(source, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, userns);
  if (!m.ok()) return m.status();
  if (::syscall(SYS_move_mount, m->get(), "", AT_FDCWD, target.c_str(), MOVE_MOUNT_F_EMPTY_PATH) !=
      0)
    return Status::Errno("attach " + source + " at " + target);
  mounts.Add(target);
  return {};
}

bool Connects(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path) return false;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  return fd && ::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
}

// The skeleton root of Open's probe container: the host's /usr is bound over its usr, and the
// usual top-level links point into it (as in the host template).
Status MakeProbeLayer(const std::string& dir) {
  struct stat st {};
  if (::stat((dir + "/usr").c_str(), &st) == 0) return {};
  std::string tmp = dir + ".new-" + std::to_string(::getpid());
  (void)RemoveTree(tmp);
  SBX_RETURN_IF_ERROR(MakeDirs(tmp, 0755));
  for (const char* d : {"usr", "proc", "sys", "dev", "tmp", "etc"})
    if (::mkdir((tmp + "/" + d).c_str(), 0755) != 0) return Status::Errno("mkdir " + tmp + "/" + d);
  for (const char* l : {"bin", "lib", "lib64", "sbin"})
    if (::symlink((std::string("usr/") + l).c_str(), (tmp + "/" + l).c_str()) != 0)
      return Status::Errno("symlink " + tmp + "/" + l);
  if (::rename(tmp.c_str(), dir.c_str()) != 0 && errno != ENOTEMPTY && errno != EEXIST)
    return Status::Errno("rename " + tmp);
  (void)RemoveTree(tmp);
  return {};
}

}  // namespace

// Everything one Create makes, in the order it is made: the owners undo it in reverse when
// Create returns early, and are committed once the box is live.
struct OciRuntime::Creation {
  Creation(const OciRuntime& rt, const BoxSpec& s) : spec(s), container(rt, s.id) {}
  const BoxSpec& spec;
  // The container's process: sbx-agent (Create), or what the probe runs.
  std::vector<std::string> args;
  Box box;
  Clock::time_point t = Clock::now();
  std::optional<BoxDir> dir;
  uint32_t base = 0;
  std::unique_ptr<UsernsHolder> userns;
  HostMounts mounts;
  UniqueFd listen;  // runc: the agent's listening socket (its fd 3)
  UniqueFd log;     // agent.log
  // gVisor: the box's cgroups, made by sbx; destroyed unless committed.
  struct OwnedCgroup {
    std::unique_ptr<Cgroup> cgroup;
    bool committed = false;
    ~OwnedCgroup() {
      if (cgroup && !committed) (void)cgroup->Destroy();
    }
  } cgroup;
  ContainerOwner container;
};

Result<std::unique_ptr<OciRuntime>> OciRuntime::Open(const OciConfig& config) {
  const std::string who = "runtime " + config.name;
  OciKind kind;
  if (config.name == "gvisor") {
    kind = OciKind::kGvisor;
  } else if (config.name == "runc") {
    kind = OciKind::kRunc;
  } else {
    return Status::Error(who + ": not an OCI runtime sbx drives (gvisor, runc)", EINVAL);
  }
  std::string binary = FindBinary(config.binary);
  if (binary.empty())
    return Status::Error(who + ": " + config.binary + " is not installed (make deps installs it)",
                         ENOENT);
  auto ver = Spawn({binary, "--version"});
  if (!ver.ok()) return ver.status().Wrap(who + ": " + binary + " --version");
  if (ver->status != 0)
    return Status::Error(who + ": " + binary + " --version failed: " + Trim(Tail(ver->err, 500)),
                         EIO);
  std::string version = Trim(ver->out.substr(0, ver->out.find('\n')));
  if (config.run_dir.empty() || config.run_dir[0] != '/')
    return Status::Error(who + ": run directory '" + config.run_dir + "' is not absolute", EINVAL);
  if (::access(config.agent_path.c_str(), R_OK) != 0)
    return Status::Errno(who + ": sbx-agent " + config.agent_path);
  auto cg = ProbeCgroupHost(config.cgroup_parent);
  if (!cg.ok()) return cg.status().Wrap(who + ": cgroups");
  const auto& seccomp = DefaultSeccompRules();
  if (!seccomp.ok()) return seccomp.status().Wrap(who + ": seccomp policy");
  // 0711: the runtime's processes in a box's user namespace (runc's init, runsc's gofer) run as
  // the box's host ids and must pass through to the box's own directory, which is theirs alone
  // (0700). Nothing here can be listed by them or by any other host user.
  SBX_RETURN_IF_ERROR(MakeDirs(config.run_dir, 0711).Wrap(who));
  if (::chmod(config.run_dir.c_str(), 0711) != 0)
    return Status::Errno(who + ": chmod " + config.run_dir);
  // So must every directory above it (sbx changes none of the operator's modes).
  for (std::string up = config.run_dir; up.size() > 1;) {
    up = up.substr(0, std::max<size_t>(up.rfind('/'), 1));
    struct stat st {};
    if (::stat(up.c_str(), &st) == 0 && (st.st_mode & S_IXOTH) == 0)
      return Status::Error(who + ": " + up + " (mode " + ModeString(st.st_mode) +
                               ") is not searchable by other users, which a box's ids are: " +
                               "make it 0711 (chmod o+x), or give another data directory",
                           EACCES);
  }
  SBX_RETURN_IF_ERROR(MakeDirs(config.run_dir + "/.state", 0700).Wrap(who));
  std::unique_ptr<OciRuntime> rt(
      new OciRuntime(config, kind, binary, version, std::move(cg).value()));
  SBX_RETURN_IF_ERROR(InstallAgent(config.agent_path, rt->AgentCopy()).Wrap(who));
  if (kind == OciKind::kGvisor && rt->cgroups_.version == CgroupVersion::kV1) {
    auto guard = OomGuard::Start();
    if (!guard.ok()) return guard.status().Wrap(who);
    rt->oom_guard_ = std::move(guard).value();
  }
  if (kind == OciKind::kGvisor && !config.preload_path.empty() &&
      ::access(config.preload_path.c_str(), R_OK) == 0) {
    SBX_RETURN_IF_ERROR(InstallAgent(config.preload_path, rt->PreloadCopy()).Wrap(who));
    rt->preload_ = true;
  }

  // The probe: a container made as boxes are (user namespace, idmapped layer and bind, overlay
  // root, cgroups, seccomp) running the host's /bin/true. Remembered for this boot and this
  // binary; a failure is never remembered.
  struct stat bin {};
  auto boot = ReadFile("/proc/sys/kernel/random/boot_id", 64);
  std::string key;
  if (boot.ok() && ::stat(binary.c_str(), &bin) == 0)
    key = std::string(kProbeVersion) + " " + Trim(*boot) + " " + binary + " " +
          std::to_string(bin.st_mtime) + " " + std::to_string(bin.st_size) + " " + config.platform +
          " ok\n";
  const std::string memo = config.run_dir + "/.probe";
  auto seen = ReadFile(memo, 1024);
  if (key.empty() || !seen.ok() || *seen != key) {
    const std::string layer = config.run_dir + "/.probe-layer";
    SBX_RETURN_IF_ERROR(MakeProbeLayer(layer).Wrap(who + ": probe"));
    BoxSpec probe;
    // If this process dies mid-probe, ReapOrphans removes what it left (kProbeOwner).
    probe.id = kProbePrefix + RandomId(8);
    probe.owner = kProbeOwner;
    probe.layers = {layer};
    probe.binds = {{"/usr", "/usr", true, {}}};
    probe.limits.memory_bytes = 256 << 20;
    probe.limits.pids = 64;
    probe.id_base = config.id_base;
    probe.runtime = config.name;
    Creation c(*rt, probe);
    c.args = {"/bin/true"};
    Status ran = rt->Prepare(c);
    if (ran.ok()) {
      c.container.Arm();
      SpawnOptions o;
      std::vector<UniqueFd> procs;
      ran = rt->BoxSpawn(c, o, procs);
      auto r = ran.ok()
                   ? Spawn(rt->Command(probe.id, {"run", "--bundle", c.dir->path(), probe.id}), o)
                   : Result<Ran>(ran);
      if (!r.ok()) {
        ran = r.status();
      } else if (r->status != 0) {
        ran = Status::Error("a container of /bin/true exited with " + std::to_string(r->status) +
                                ": " + Trim(Tail(r->err + r->out, 1500)),
                            EIO);
      }
    }
    if (!ran.ok())
      return ran.Wrap(who + ": " + binary + " (" + version + ") does not run boxes here");
    if (!key.empty()) (void)WriteFile(memo, key, 0600);  // a lost memo only costs a probe
  }
  return rt;
}

OciRuntime::OciRuntime(OciConfig config, OciKind kind, std::string binary, std::string version,
                       CgroupHost cgroups)
    : config_(std::move(config)),
      kind_(kind),
      binary_(std::move(binary)),
      version_(std::move(version)),
      cgroups_(std::move(cgroups)) {}

OciRuntime::~OciRuntime() = default;

Status OciRuntime::DeleteContainer(const std::string& id) const {
  // A gVisor box whose state is its own needs no `delete` (and runsc 20221219 takes 1.5 s over a
  // dead sandbox): its processes die with its cgroups (DestroyCgroups), its state with its
  // directory.
  if (StateRoot(id) == Dir(id) + "/state") return {};
  // delete --force kills what is left and removes the binary's state and the box's cgroups.
  Status deleted = Run(id, {"delete", "--force", id}).status();
  auto unknown = [](const Status& s) {
    const std::string m = s.message();
    return m.find("not exist") != std::string::npos || m.find("cannot load") != std::string::npos ||
           m.find("no such") != std::string::npos || m.find("not found") != std::string::npos;
  };
  // Gone either way: the binary no longer knows it (runsc's delete can fail after removing it).
  if (!deleted.ok() && (unknown(deleted) || unknown(Run(id, {"state", id}).status()))) return {};
  return deleted;
}

Status OciRuntime::DestroyCgroups(const std::string& id) const {
  // The processes first (a cgroup with any cannot go), then whatever hierarchy the binary used.
  Status killed = Cgroup::Open(cgroups_, id)->Destroy();
  Status removed = RemoveBoxCgroups(config_.cgroup_parent, id);
  return killed.ok() ? removed : killed;
}

Status OciRuntime::BoxSpawn(Creation& c, SpawnOptions& o, std::vector<UniqueFd>& procs) const {
  o.rlimits = BoxRlimits();
  if (kind_ != OciKind::kGvisor) return {};
  if (!c.cgroup.cgroup) return Status::Error("the box has no cgroup", EINVAL);
  for (const std::string& dir : c.cgroup.cgroup->Paths()) {
    const std::string f = dir + "/cgroup.procs";
    UniqueFd fd(::open(f.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd) return Status::Errno("open " + f);
    o.cgroup_procs.push_back(fd.get());
    procs.push_back(std::move(fd));
  }
  o.userns_fd = c.userns->fd();
  return {};
}

std::string OciRuntime::StateRoot(const std::string& id) const {
  if (kind_ == OciKind::kGvisor && !id.empty()) {
    // Boxes made before the state moved keep theirs in the shared root.
    std::string own = Dir(id) + "/state";
    struct stat st {};
    if (::lstat(own.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return own;
  }
  return config_.run_dir + "/.state";
}

std::vector<std::string> OciRuntime::Command(const std::string& id,
                                             const std::vector<std::string>& args,
                                             const std::string& network) const {
  std::vector<std::string> argv = {binary_, "--root", StateRoot(id)};
  if (kind_ == OciKind::kGvisor) {
    // --network=none: loopback only, inside gVisor's own network stack; a box with a network is
    // made with --network=sandbox (Launch): gVisor's stack drives the link sbx put in its
    // namespace, so the host's stack never handles the box's packets. --host-uds=create: the
    // box may create host unix sockets in its bound directories, and nothing more (not connect to
    // the host's): how the agent's socket reaches the host. --overlay2=none: writes go to the
    // box's writable layer on the host (fs/upper), where snapshots read them, not to a gVisor
    // memory overlay. No --oci-seccomp: see oci_spec.cc. --ignore-cgroups: runsc runs in the
    // box's user namespace, where it could not make cgroups; sbx makes them (Prepare) and starts
    // it inside them (BoxSpawn).
    argv.insert(argv.end(), {"--platform=" + config_.platform, "--network=" + network,
                             "--host-uds=create", "--overlay2=none", "--ignore-cgroups"});
  }
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

Result<std::string> OciRuntime::Run(const std::string& id, const std::vector<std::string>& args,
                                    const std::string& network) const {
  SpawnOptions o;
  o.hide_proc_sys_net = network == "sandbox";
  auto r = Spawn(Command(id, args, network), o);
  const std::string what = config_.name + ": " + config_.binary + " " + args.front();
  if (!r.ok()) return r.status().Wrap(what);
  if (r->status != 0) {
    std::string err = Trim(Tail(r->err.empty() ? r->out : r->err, 2000));
    return Status::Error(what + ": " + (err.empty() ? "exit " + std::to_string(r->status) : err),
                         EIO);
  }
  return r->out;
}

int64_t OciRuntime::BoxNofile() {
  // A limit cannot be raised from inside a user namespace: never more than this process has.
  rlimit nofile{};
  ::getrlimit(RLIMIT_NOFILE, &nofile);
  return static_cast<int64_t>(std::min<rlim_t>(nofile.rlim_max, 65536));
}

std::vector<std::pair<int, rlimit>> OciRuntime::BoxRlimits() const {
  // gVisor: the spec's limits are the Sentry's business; the sandbox's host processes keep ours.
  if (kind_ == OciKind::kGvisor) return {};
  const rlim_t nofile = static_cast<rlim_t>(BoxNofile());
  return {{RLIMIT_NOFILE, {nofile, nofile}}, {RLIMIT_CORE, {0, 0}}};
}

std::string OciRuntime::CgroupsPath(const std::string& id) const {
  // Where /sys/fs/cgroup is the unified hierarchy, runc and runsc take a relative path as
  // relative to their own cgroup's *parent*; an absolute one names the native layout exactly.
  struct statfs fs {};
  if (::statfs("/sys/fs/cgroup", &fs) == 0 && fs.f_type == CGROUP2_SUPER_MAGIC) {
    auto own = ReadFile("/proc/self/cgroup", 1 << 16);
    std::string path = "/";
    if (own.ok()) {
      for (const auto& e : cgroup_internal::ParseProcCgroup(*own))
        if (e.id == 0 && e.controllers.empty()) path = e.path;
    }
    return (path == "/" ? "" : path) + "/" + config_.cgroup_parent + "/" + id;
  }
  // v1: relative to the caller's own cgroup in each hierarchy, as the native driver's.
  return config_.cgroup_parent + "/" + id;
}

Status OciRuntime::CanCreate(const std::string& name) const {
  if (name == config_.name) return {};
  return Status::Error("runtime " + (name.empty() ? std::string(kRuntimeNames[0]) : name) +
                           ": this is the " + config_.name + " runtime",
                       ENOTSUP);
}

Result<Box> OciRuntime::Create(const BoxSpec& spec) {
  const std::string what = "create box " + spec.id;
  SBX_RETURN_IF_ERROR(CanCreate(spec.runtime).Wrap(what));
  Creation c(*this, spec);
  c.args = {kAgentInside};
  if (kind_ == OciKind::kGvisor) {
    c.args.insert(c.args.end(), {"--listen", std::string(kSockInside) + "/agent.sock"});
  } else {
    c.args.insert(c.args.end(), {"--listen-fd", "3"});
  }
  SBX_RETURN_IF_ERROR(Prepare(c).Wrap(what));
  c.box.timings.prepare_us = MicrosSince(c.t);
  SBX_RETURN_IF_ERROR(Launch(c).Wrap(what));
  SBX_RETURN_IF_ERROR(AwaitAgent(c).Wrap(what));
  c.box.timings.agent_us = MicrosSince(c.t);
  std::unique_ptr<Watchdog> watchdog;
  if (spec.die_with_parent) {
    auto w = StartWatchdog(c.dir->path());
    if (!w.ok()) return w.status().Wrap(what);
    watchdog = std::move(w).value();
  }
  // Last before the box is live: nothing after it fails, so the guard never watches a box that
  // is undone.
  SBX_RETURN_IF_ERROR(GuardMemory(spec.id).Wrap(what));
  // Live: from here Destroy owns everything.
  c.container.Commit();
  c.cgroup.committed = true;
  c.mounts.Commit();
  UniqueFd lock = c.dir->Commit();
  {
    MutexLock g(mu_);
    owner_locks_[spec.id] = std::move(lock);
    if (watchdog) watchdogs_[spec.id] = std::move(watchdog);
  }
  return c.box;
}

OciRuntime::Watchdog::~Watchdog() {
  wake.reset();  // it wakes, finds the box's first process gone (or kills it), and exits
  siginfo_t info{};
  while (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd.get()), &info,
                  WEXITED | __WALL) < 0 &&
         errno == EINTR) {
  }
}

Result<std::unique_ptr<OciRuntime::Watchdog>> OciRuntime::StartWatchdog(const std::string& dir) {
  auto first = BoxProcess(dir);
  if (!first.ok()) return first.status().Wrap("watchdog");
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return Status::Errno("watchdog: pipe");
  UniqueFd r(p[0]), w(p[1]);
  const int rfd = r.get(), target = first->get();
  int pidfd = -1;
  // fork semantics (x86-64 clone(flags, stack, parent_tid, ...): the pidfd lands at parent_tid).
  long pid = ::syscall(SYS_clone, CLONE_PIDFD | SIGCHLD, nullptr, &pidfd, nullptr, nullptr);
  if (pid == 0) {
    // The child: raw system calls only (a clone of a possibly multi-threaded process). It keeps
    // the pipe's read end and the box's pidfd, waits for EOF, then kills.
    ::syscall(SYS_dup3, rfd, 0, 0);
    ::syscall(SYS_dup3, target, 1, 0);
    ::syscall(SYS_close_range, 2, ~0U, 0);
    char ch;
    while (::syscall(SYS_read, 0, &ch, 1) != 0 && errno == EINTR) {
    }
    ::syscall(SYS_pidfd_send_signal, 1, SIGKILL, nullptr, 0);
    ::syscall(SYS_exit_group, 0);
  }
  if (pid < 0) return Status::Errno("watchdog: clone");
  auto dog = std::make_unique<Watchdog>();
  dog->wake = std::move(w);
  dog->pidfd.reset(pidfd);
  return dog;
}

namespace {

// Mounts on `target` an overlay of `lowers` (topmost first) under `upper`, with overlayfs' user.*
// xattrs: one fsconfig(lowerdir+) per layer where the kernel takes that (6.8+), else one option
// string, which must fit in a page (MaxLayers keeps it so).
Status MountRootOverlay(const std::vector<std::string>& lowers, const std::string& upper,
                        const std::string& work, const std::string& target, bool lowerdir_plus) {
  if (!lowerdir_plus) {
    std::string opts = "userxattr,lowerdir=";
    for (size_t i = 0; i < lowers.size(); ++i) opts += (i ? ":" : "") + lowers[i];
    opts += ",upperdir=" + upper + ",workdir=" + work;
    if (opts.size() >= kMaxOverlayOptions)
      return Status::Error(std::to_string(lowers.size()) + " layers do not fit one overlay", E2BIG);
    if (::mount("overlay", target.c_str(), "overlay", MS_NOSUID | MS_NODEV, opts.c_str()) != 0)
      return Status::Errno("mount the root overlay");
    return {};
  }
  UniqueFd fs(static_cast<int>(::syscall(SYS_fsopen, "overlay", FSOPEN_CLOEXEC)));
  if (!fs) return Status::Errno("mount the root overlay: fsopen");
  auto set = [&](const char* key, const std::string& value) {
    return ::syscall(SYS_fsconfig, fs.get(), FSCONFIG_SET_STRING, key, value.c_str(), 0) == 0;
  };
  for (const auto& l : lowers)
    if (!set("lowerdir+", l)) return Status::Errno("mount the root overlay: layer " + l);
  if (!set("upperdir", upper) || !set("workdir", work) ||
      ::syscall(SYS_fsconfig, fs.get(), FSCONFIG_SET_FLAG, "userxattr", nullptr, 0) != 0 ||
      ::syscall(SYS_fsconfig, fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0)
    return Status::Errno("mount the root overlay");
  UniqueFd mnt(static_cast<int>(
      ::syscall(SYS_fsmount, fs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)));
  if (!mnt) return Status::Errno("mount the root overlay: fsmount");
  if (::syscall(SYS_move_mount, mnt.get(), "", AT_FDCWD, target.c_str(), MOVE_MOUNT_F_EMPTY_PATH) !=
      0)
    return Status::Errno("mount the root overlay: move_mount");
  return {};
}

}  // namespace

bool OciRuntime::LowerdirPlus() const {
  return config_.overlay_lowerdir_plus && OverlayHasLowerdirPlus();
}

size_t OciRuntime::MaxLayers(const Box& box) {
  // Where the kernel takes the layers one fsconfig(lowerdir+) each, the overlay's own limit;
  // elsewhere the root overlay's option string (Prepare) must fit in a page: the layers as
  // d/lower/<i> joined by ':', and the writable layer's two paths at their longest (with a disk
  // limit).
  if (LowerdirPlus()) return kMaxOverlayLayers;
  const std::string d = config_.run_dir + "/" + box.id;
  return OverlayLayersThatFit(std::string("userxattr,lowerdir=,upperdir=,workdir=").size() +
                                  (d + "/fs/disk/upper").size() + (d + "/fs/disk/work").size(),
                              d + "/lower/");
}

Status OciRuntime::Prepare(Creation& c) {
  const BoxSpec& spec = c.spec;
  SBX_RETURN_IF_ERROR(ValidateBoxId(spec.id));
  if (spec.layers.empty()) return Status::Error("a box needs at least one layer", EINVAL);
  if (const size_t most = MaxLayers(Box{spec.id}); spec.layers.size() > most)
    return Status::Error(std::to_string(spec.layers.size()) + " layers, more than the " +
                             std::to_string(most) + " a box of this runtime stacks",
                         E2BIG);
  SBX_RETURN_IF_ERROR(cgroup_internal::ValidateRequest(spec.id, spec.limits));
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
  // The box's directory stays root's (what sbx reads back from it, such as its pid file, cannot
  // be changed by the box's ids), and may only be passed through (0711); what the runtime's
  // processes in the box's user namespace use (runc's init, runsc's gofer: the box's root id on
  // the host) is below it in directories of that id's alone (0700), so that no other host user
  // and no other box reaches the box's files.
  if (::chmod(d.c_str(), 0711) != 0) return Status::Errno("chmod " + d);
  auto make_dir = [&](const std::string& p, mode_t mode) -> Status {
    if (::mkdir(p.c_str(), mode) != 0 || ::chmod(p.c_str(), mode) != 0)
      return Status::Errno("mkdir " + p);
    if (::chown(p.c_str(), base, base) != 0) return Status::Errno("chown " + p);
    return {};
  };
  for (const char* sub : {"/fs", "/fs/root", "/lower", "/binds", "/over"})
    SBX_RETURN_IF_ERROR(make_dir(d + sub, 0700));
  if (kind_ == OciKind::kGvisor) {
    // runsc's state of the box: written by its `create` as the box's root (BoxSpawn), then the
    // host root's alone (Launch).
    SBX_RETURN_IF_ERROR(make_dir(d + "/state", 0700));
    // The box's cgroups, with its limits: runsc runs where it could not make them.
    Limits host = spec.limits;
    host.pids = GvisorHostPids(spec.limits.pids);
    auto cg = Cgroup::Create(cgroups_, spec.id, host);
    if (!cg.ok()) return cg.status();
    c.cgroup.cgroup = std::move(cg).value();
  }
  // The writable layer: fs/{upper,work}, or with a disk limit the same in an ext4 image of that
  // size mounted on fs/disk (on the host for the box's life: the root overlay, mounted on the
  // host, writes there). The image's undo is its mount's, after the overlay's (HostMounts).
  std::string layer = d + "/fs";
  if (spec.limits.disk_bytes > 0) {
    layer = d + "/fs/disk";
    SBX_RETURN_IF_ERROR(make_dir(layer, 0700));
    SBX_RETURN_IF_ERROR(MountDiskImage(d + "/disk.img", layer, spec.limits.disk_bytes, base));
    c.mounts.Add(layer);
    if (::chmod(layer.c_str(), 0700) != 0) return Status::Errno("chmod " + layer);
  }
  // upper is the box's "/" (an overlay's root takes its upper directory's mode): 0755 as in native
  // boxes, or no user but root could reach anything inside; fs/ above it keeps the host out.
  const std::string up = layer + "/upper";
  SBX_RETURN_IF_ERROR(make_dir(up, 0755));
  SBX_RETURN_IF_ERROR(make_dir(layer + "/work", 0700));
  // Mount points of sbx's own binds, made in the (still empty) writable layer so that whatever a
  // layer has at /.sbx is hidden, never followed.
  for (const std::string p : {"/.sbx", "/.sbx/run"}) {
    if (::mkdir((up + p).c_str(), 0755) != 0) return Status::Errno("mkdir " + up + p);
    if (::chown((up + p).c_str(), base, base) != 0) return Status::Errno("chown " + up + p);
  }
  SBX_RETURN_IF_ERROR(WriteFile(up + kAgentInside, "", 0555));
  if (::chown((up + kAgentInside).c_str(), base, base) != 0) return Status::Errno("chown agent");
  if (preload_) {
    // gVisor: the preloaded statx fix (gvisor_preload.c) and /etc/ld.so.preload naming it.
    if (::mkdir((up + "/etc").c_str(), 0755) != 0 ||
        ::chown((up + "/etc").c_str(), base, base) != 0)
      return Status::Errno("mkdir " + up + "/etc");
    for (const char* p : {kPreloadInside, "/etc/ld.so.preload"}) {
      SBX_RETURN_IF_ERROR(WriteFile(up + p, "", 0444));
      if (::chown((up + p).c_str(), base, base) != 0) return Status::Errno("chown " + up + p);
    }
  }
  // gVisor: /tmp in the writable layer, as in every other box. Where a bundle mounts nothing
  // there runsc mounts a tmpfs of the Sentry's own, which no disk limit covers and no snapshot
  // sees; so /tmp is bound to itself (the root's own /tmp, below: made here, sticky, when no
  // layer has one).
  if (kind_ == OciKind::kGvisor) {
    const std::string tmp = up + "/tmp";
    if (::mkdir(tmp.c_str(), 01777) != 0 || ::chmod(tmp.c_str(), 01777) != 0 ||
        ::chown(tmp.c_str(), base, base) != 0)
      return Status::Errno("mkdir " + tmp);
  }

  // A gVisor box with a network: the holder holds its network namespace too, where the sync point
  // puts the box's link before `runsc create` (Launch), which hands the links it finds there to
  // gVisor's own stack (--network=sandbox).
  const bool gvisor_net = kind_ == OciKind::kGvisor && spec.at_sync_point;
  auto holder = UsernsHolder::Make(base, gvisor_net ? CLONE_NEWNET : 0);
  if (!holder.ok()) return holder.status();
  c.userns = std::move(holder).value();
  // The layers and read-only binds as idmapped mounts on the host: files show their real owners
  // inside, and what the box writes lands in its range (docs/isolation.md, "Idmapped layers").
  std::vector<std::string> lowers;
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    lowers.push_back(d + "/lower/" + std::to_string(i));
    SBX_RETURN_IF_ERROR(
        AttachIdmapped(spec.layers[i], lowers.back(), c.userns->fd(), base, c.mounts));
  }
  std::vector<OciBind> binds;
  size_t over = 0;
  for (size_t i = 0; i < spec.binds.size(); ++i) {
    const BindMount& b = spec.binds[i];
    if (b.target.empty() || b.target[0] != '/')
      return Status::Error("bind target '" + b.target + "' is not absolute", EINVAL);
    std::string source = b.source;
    if (b.read_only) {
      source = d + "/binds/" + std::to_string(i);
      SBX_RETURN_IF_ERROR(AttachIdmapped(b.source, source, c.userns->fd(), base, c.mounts));
    }
    binds.push_back({source, b.target, b.read_only});
    // The topmost layer's own directory laid over the bound one, read-only (an overlay without
    // an upper layer). Optional: a layer without the directory keeps the bind alone.
    for (const auto& sub : b.overlaid) {
      std::string top = d + "/lower/0" + b.target + "/" + sub;
      struct stat st {};
      if (::lstat(top.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
      std::string at = d + "/over/" + std::to_string(over++);
      if (::mkdir(at.c_str(), 0755) != 0) return Status::Errno("mkdir " + at);
      std::string opts = "userxattr,lowerdir=" + top + ":" + source + "/" + sub;
      if (::mount("overlay", at.c_str(), "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV,
                  opts.c_str()) != 0)
        return Status::Errno("mount " + b.target + "/" + sub + " of the layer over the bind");
      c.mounts.Add(at);
      binds.push_back({at, b.target + "/" + sub, true});
    }
  }
  // The root: an overlay of the idmapped layers under the writable layer, on the host, with
  // overlayfs' user.* xattrs as in a native box (its writable layer has the same form).
  SBX_RETURN_IF_ERROR(
      MountRootOverlay(lowers, up, layer + "/work", d + "/fs/root", LowerdirPlus()));
  c.mounts.Add(d + "/fs/root");

  binds.push_back({AgentCopy(), kAgentInside, true});
  if (kind_ == OciKind::kGvisor) {
    // The agent's socket directory: the box's root id's (the gofer creates the socket as it).
    std::string sock = d + "/sock";
    if (::mkdir(sock.c_str(), 0700) != 0 || ::chown(sock.c_str(), base, base) != 0)
      return Status::Errno("mkdir " + sock);
    binds.push_back({sock, kSockInside, false});
    binds.push_back({d + "/fs/root/tmp", "/tmp", false});
    // A boot id of the box's own (gVisor's /proc has none): what a restore or a fork changes, as
    // E2B's SDK checks after a pause without memory. (runc refuses binds into /proc.)
    auto boot_id = RandomUuid();
    if (!boot_id.ok()) return boot_id.status();
    SBX_RETURN_IF_ERROR(WriteFile(d + "/boot_id", *boot_id + "\n", 0444));
    binds.push_back({d + "/boot_id", "/proc/sys/kernel/random/boot_id", true});
    if (preload_) {
      SBX_RETURN_IF_ERROR(
          WriteFile(d + "/ld.so.preload", std::string(kPreloadInside) + "\n", 0444));
      binds.push_back({PreloadCopy(), kPreloadInside, true});
      binds.push_back({d + "/ld.so.preload", "/etc/ld.so.preload", true});
    }
  } else if (c.args.size() > 1 && c.args[1] == "--listen-fd") {
    auto l = ListenUnix(d + "/agent.sock");
    if (!l.ok()) return l.status();
    c.listen = std::move(l).value();
  }
  c.log.reset(::open((d + "/agent.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  if (!c.log) return Status::Errno("open " + d + "/agent.log");

  OciSpecInput in;
  in.kind = kind_;
  in.hostname = spec.hostname;
  in.root = d + "/fs/root";
  in.args = c.args;
  in.binds = std::move(binds);
  // gVisor: runsc runs in the holder's namespace, where the box's ids are 0..65535 already.
  in.id_base = kind_ == OciKind::kGvisor ? 0 : base;
  // runc joins the holder's namespace (owned by the box's root id, as a native box's). runsc,
  // running in it (BoxSpawn), makes one for its gofer from the mappings.
  if (kind_ == OciKind::kRunc) in.userns_path = c.userns->path();
  if (gvisor_net) {
    // runsc's `create` runs as the box's root, which may not open the holder's /proc/<pid>/ns
    // (a host root process): the namespace is bound on a file of the box's directory instead
    // (unmounted with the box's other mounts).
    in.netns_path = d + "/netns";
    SBX_RETURN_IF_ERROR(WriteFile(in.netns_path, "", 0444));
    if (::mount(c.userns->path("net").c_str(), in.netns_path.c_str(), nullptr, MS_BIND, nullptr) !=
        0)
      return Status::Errno("bind the box's network namespace");
    c.mounts.Add(in.netns_path);
  }
  in.limits = spec.limits;
  in.nofile = BoxNofile();
  in.cgroups_path = CgroupsPath(spec.id);
  in.seccomp = &*DefaultSeccompRules();
  // The host root's, readable by the box's root group: gVisor's `create` reads it as the box's
  // root, and nothing of the box may change it.
  const std::string config = d + "/config.json";
  SBX_RETURN_IF_ERROR(WriteFile(config, BuildOciSpec(in), 0600));
  if (kind_ == OciKind::kGvisor &&
      (::chown(config.c_str(), 0, base) != 0 || ::chmod(config.c_str(), 0640) != 0))
    return Status::Errno("chown " + config);

  c.box.id = spec.id;
  c.box.dir = d;
  c.box.id_base = base;
  c.box.idmapped = true;
  c.box.runtime = config_.name;
  c.box.agent_socket = AgentSocket(spec.id);
  return {};
}

Status OciRuntime::Launch(Creation& c) {
  const std::string& id = c.spec.id;
  const std::string d = c.dir->path();
  std::vector<std::string> args = {"create", "--bundle", d};
  if (c.listen) args.insert(args.end(), {"--preserve-fds", "1"});
  args.push_back(id);
  // gVisor: the box's link goes into the namespace the holder keeps before `create`, whose
  // sandbox process joins it; `start` hands the links it finds there (their addresses and
  // routes) to gVisor's stack.
  const bool gvisor_net = kind_ == OciKind::kGvisor && c.spec.at_sync_point;
  if (gvisor_net) SBX_RETURN_IF_ERROR(c.spec.at_sync_point(c.userns->pid()));
  c.container.Arm();
  // The container keeps the binary's stdout and stderr: agent.log, never a pipe.
  SpawnOptions o;
  std::vector<UniqueFd> procs;
  SBX_RETURN_IF_ERROR(BoxSpawn(c, o, procs));
  o.log_fd = c.log.get();
  o.fd3 = c.listen ? c.listen.get() : -1;
  auto created = Spawn(Command(id, args, gvisor_net ? "sandbox" : "none"), o);
  if (!created.ok()) return created.status().Wrap(config_.binary + " create");
  if (created->status != 0) {
    auto log = ReadFile(d + "/agent.log", 1 << 20);
    return Status::Error(config_.binary + " create: " + Trim(Tail(log.ok() ? *log : "", 1500)),
                         EIO);
  }
  c.box.timings.clone_us = MicrosSince(c.t);
  // From now on only the host's root writes the state the host's root reads back: nothing the
  // box's ids run (its gofer) can change what a later `kill` or `delete` acts on.
  if (kind_ == OciKind::kGvisor) SBX_RETURN_IF_ERROR(ChownTree(d + "/state", 0, 0));
  auto state = Run(id, {"state", id});
  if (!state.ok()) return state.status();
  auto st = nlohmann::json::parse(*state, nullptr, false);
  c.box.init_pid = st.is_object() ? st.value("pid", -1) : -1;
  if (c.box.init_pid <= 0) return Status::Error(config_.binary + " state: no pid", EIO);
  SBX_RETURN_IF_ERROR(WriteFile(d + "/pid",
                                std::to_string(c.box.init_pid) + " " +
                                    std::to_string(ProcessStartTime(c.box.init_pid)) + "\n",
                                0600));
  // runc: its init waits in the box's namespaces for `start`, the sync point. (gVisor's was
  // before `create`.)
  if (c.spec.at_sync_point && !gvisor_net)
    SBX_RETURN_IF_ERROR(c.spec.at_sync_point(c.box.init_pid));
  c.listen.reset();  // the box holds it now
  c.userns.reset();  // runc's init joined it; runsc's gofer has its own
  // runsc sets the network up at `start`, from that call's flags.
  SBX_RETURN_IF_ERROR(Run(id, {"start", id}, gvisor_net ? "sandbox" : "none").status());
  c.box.timings.child_us = MicrosSince(c.t);
  return {};
}

Status OciRuntime::AwaitAgent(Creation& c) {
  // runc: the socket is this process's, bound and listening before the box started; connections
  // wait in its backlog until the agent accepts them.
  if (kind_ != OciKind::kGvisor) return {};
  // gVisor: the agent binds its socket in sock/ (a host socket, made by the gofer), and listens.
  const std::string sock_dir = c.dir->path() + "/sock";
  const std::string& sock = c.box.agent_socket;
  UniqueFd in(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!in) return Status::Errno("inotify");
  if (::inotify_add_watch(in.get(), sock_dir.c_str(), IN_CREATE | IN_MOVED_TO) < 0)
    return Status::Errno("watch " + sock_dir);
  auto gone = [&]() -> Status {
    auto log = ReadFile(c.dir->path() + "/agent.log", 1 << 20);
    return Status::Error("the sandbox exited before its agent listened" +
                             (log.ok() && !log->empty() ? ": " + Trim(Tail(*log, 1000)) : ""),
                         ECHILD);
  };
  // A sandbox whose agent failed at once may be gone already.
  auto sandbox = BoxProcess(c.dir->path());
  if (!sandbox.ok()) return sandbox.status().err() == ESRCH ? gone() : sandbox.status();
  const auto deadline = Clock::now() + kAgentWait;
  for (;;) {
    struct stat st {};
    if (::lstat(sock.c_str(), &st) == 0) break;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return Status::Error("its agent did not listen within 30 s", ETIMEDOUT);
    pollfd p[2] = {{in.get(), POLLIN, 0}, {sandbox->get(), POLLIN, 0}};
    if (::poll(p, 2, static_cast<int>(left.count())) < 0 && errno != EINTR)
      return Status::Errno("poll");
    if (p[1].revents != 0) return gone();
    char buf[4096];
    while (::read(in.get(), buf, sizeof buf) > 0) {
    }
  }
  // What the daemon will connect to must be the agent's socket: a socket, made by the box's root
  // (through the gofer), not a symlink the box planted to send the daemon to a host socket.
  struct stat st {};
  if (::lstat(sock.c_str(), &st) != 0) return Status::Errno("stat " + sock);
  if (!S_ISSOCK(st.st_mode) || st.st_uid != c.base)
    return Status::Error(sock + " is not a socket of the box's root", EPERM);
  // It is bound; it listens a moment later.
  while (!Connects(sock)) {
    if (AwaitExit(sandbox->get(), std::chrono::milliseconds(1))) return gone();
    if (Clock::now() >= deadline)
      return Status::Error("its agent did not listen within 30 s", ETIMEDOUT);
  }
  // From now on nothing in the box can replace the socket or add to the directory (the gofer
  // lacks CAP_LINUX_IMMUTABLE): the path the daemon connects to stays the agent's.
  return SetImmutable(sock_dir, true);
}

Status OciRuntime::Freeze(const Box& box) {
  return Run(box.id, {"pause", box.id}).status().Wrap("freeze box " + box.id);
}

Status OciRuntime::Thaw(const Box& box) {
  return Run(box.id, {"resume", box.id}).status().Wrap("thaw box " + box.id);
}

Result<uint64_t> OciRuntime::OomKills(const Box& box) {
  SBX_RETURN_IF_ERROR(ValidateBoxId(box.id));
  const uint64_t guarded = oom_guard_ ? oom_guard_->Kills(box.id) : 0;
  if (auto n = Cgroup::Open(cgroups_, box.id)->OomKills(); n.ok()) return *n + guarded;
  return Runtime::OomKills(box);  // another layout than the native driver's: Stats asks runsc
}

Result<BoxStats> OciRuntime::Stats(const Box& box) {
  SBX_RETURN_IF_ERROR(ValidateBoxId(box.id));
  // The box's cgroups are where the native driver would put them (CgroupsPath): read directly,
  // cheaply. Under gVisor they hold the whole sandbox (the Sentry, its gofer and the host threads
  // behind the box's processes), which is what the box costs the host.
  auto st = Cgroup::Open(cgroups_, box.id)->Stats();
  if (!st.ok()) {
    // Another layout than the native driver's: ask the binary.
    auto ev = Run(box.id, {"events", "--stats", box.id});
    if (!ev.ok()) return st.status().Wrap("stats of box " + box.id);
    auto j = nlohmann::json::parse(*ev, nullptr, false);
    if (!j.is_object() || !j.contains("data")) return st.status().Wrap("stats of box " + box.id);
    const auto& data = j["data"];
    BoxStats s;
    s.cpu_usage_ns = data.value("/cpu/usage/total"_json_pointer, uint64_t{0});
    s.memory_current = data.value("/memory/usage/usage"_json_pointer, uint64_t{0});
    s.memory_peak = data.value("/memory/usage/max"_json_pointer, uint64_t{0});
    s.pids_current = data.value("/pids/current"_json_pointer, uint64_t{0});
    st = s;
  }
  const std::string dir = Dir(box.id);
  if (oom_guard_) {
    st->oom_kills += oom_guard_->Kills(box.id);
    st->ooms += oom_guard_->Ooms(box.id);
    // A guarded sandbox that ended after its cgroup met its limit ended of it, though the guard
    // heard no OOM: with the kernel's killer off, an allocation of the kernel's own for the
    // Sentry that meets the limit fails without one, and gVisor panics on some (oom_guard.h).
    // Told as an OOM, `sbx run` exits 137 as the command died of the limit. Met: its peak came
    // within 1 MiB of the limit, more than any such allocation (memory.failcnt would say it, but
    // the kernel counts no failure of the memory+swap limit a box also has).
    // The limit first: a box near it is rare, so that most Stats (every metrics sample) look for
    // no process.
    if (st->ooms == 0 && st->oom_kills == 0) {
      auto limit = cgroup_internal::ReadUint(MemoryCgroup(box.id) + "/memory.limit_in_bytes");
      if (limit.ok() && *limit < OomGuard::kNoLimit && st->memory_peak + (1 << 20) >= *limit &&
          !BoxProcess(dir).ok())
        st->ooms = 1;
    }
  }
  struct statvfs vfs {};
  if (Upper(dir) != dir + "/fs/upper") {
    // A disk limit: its image's filesystem.
    if (::statvfs((dir + "/fs/disk").c_str(), &vfs) == 0) {
      st->disk_used = static_cast<uint64_t>(vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize;
      st->disk_total = static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize;
    }
  } else if (auto disk = DirectoryUsage(dir + "/fs/upper"); disk.ok()) {
    st->disk_used = disk->used;
    st->disk_total = disk->total;
  }
  return st;
}

Status OciRuntime::SetLimits(const Box& box, const Limits& limits) {
  const std::string what = "set the limits of box " + box.id;
  SBX_RETURN_IF_ERROR(cgroup_internal::ValidateRequest(box.id, limits).Wrap(what));
  Limits host = limits;
  if (kind_ == OciKind::kGvisor) host.pids = GvisorHostPids(limits.pids);
  SBX_RETURN_IF_ERROR(Cgroup::Open(cgroups_, box.id)->SetLimits(host).Wrap(what));
  return GuardMemory(box.id).Wrap(what);
}

std::string OciRuntime::MemoryCgroup(const std::string& id) const {
  for (const auto& [controller, dir] : cgroups_.v1_dirs)
    if (controller == "memory") return dir + "/" + id;
  return "";
}

Status OciRuntime::GuardMemory(const std::string& id) {
  if (!oom_guard_) return {};
  std::string memcg = MemoryCgroup(id);
  if (memcg.empty()) return {};
  // No limit of its own (or no longer): the kernel's killer acts only for a parent's, which is
  // no box's to handle.
  auto limit = cgroup_internal::ReadUint(memcg + "/memory.limit_in_bytes");
  if (!limit.ok()) return {};  // no memory cgroup where the native layout puts it
  if (*limit >= OomGuard::kNoLimit) {
    oom_guard_->Forget(id);
    return cgroup_internal::WriteKnob(memcg + "/memory.oom_control", "0");
  }
  return oom_guard_->Watch(id, memcg, AgentSocket(id), Dir(id));
}

Result<UniqueFd> OciRuntime::OpenSocket(const Box& box, int domain, int type) {
  const std::string what = "socket in box " + box.id;
  SBX_RETURN_IF_ERROR(ValidateBoxId(box.id).Wrap(what));
  if (kind_ == OciKind::kGvisor)
    return Status::Error(what +
                             ": a gVisor box's sockets are inside gVisor's own network stack, "
                             "not in a host network namespace",
                         ENOTSUP);
  auto pidfd = BoxProcess(Dir(box.id));
  if (!pidfd.ok()) return pidfd.status().Wrap(what);
  return SocketInNetworkOf(pidfd->get(), domain, type, what);
}

std::optional<std::string> OciRuntime::AgentExit(const Box& box) {
  if (!ValidateBoxId(box.id).ok()) return "invalid box id";
  const std::string dir = Dir(box.id);
  if (BoxProcess(dir).ok()) return std::nullopt;
  std::string how = kind_ == OciKind::kGvisor ? "gVisor sandbox exited" : "agent exited";
  auto log = ReadFile(dir + "/agent.log", 1 << 20);
  if (log.ok() && !log->empty()) how += "; agent.log ends: " + Trim(Tail(*log, 512));
  return how;
}

Status OciRuntime::Stop(const Box& box) {
  SBX_RETURN_IF_ERROR(ValidateBoxId(box.id));
  auto first = BoxProcess(Dir(box.id));
  if (!first.ok()) return {};  // nothing of the box runs
  if (kind_ == OciKind::kGvisor) {
    // runsc 20221219 cannot delete a container it last saw paused once its sandbox is dead (it
    // panics: "invalid state transition: paused => stopped"), so a paused box is resumed first.
    if (auto st = Run(box.id, {"state", box.id});
        st.ok() && st->find("\"paused\"") != std::string::npos)
      (void)Run(box.id, {"resume", box.id});
    // The sandbox process is the whole box (its Sentry runs every process of it): killed, nothing
    // of the box runs any more; its gofer exits with it.
    ::syscall(SYS_pidfd_send_signal, first->get(), SIGKILL, nullptr, 0);
  } else {
    // Frozen tasks (runc's freezer cgroup) die only once thawed. The binary's kill signals the
    // box's PID 1; its pid namespace dies with it.
    (void)Cgroup::Open(cgroups_, box.id)->Thaw();
    (void)Run(box.id, {"kill", box.id, "KILL"});
  }
  if (AwaitExit(first->get(), kStopWait)) return {};
  // The first process itself, through the pidfd (never a process that reused the pid).
  ::syscall(SYS_pidfd_send_signal, first->get(), SIGKILL, nullptr, 0);
  if (AwaitExit(first->get(), kStopWait)) return {};
  return Status::Error("stop box " + box.id + ": its first process did not exit", ETIMEDOUT);
}

Status OciRuntime::Destroy(const Box& box) { return DestroyBox(box, nullptr); }

Status OciRuntime::DestroyKeepingUpper(const Box& box, const std::string& dest) {
  return DestroyBox(box, &dest);
}

Status OciRuntime::DestroyBox(const Box& box, const std::string* keep_upper) {
  SBX_RETURN_IF_ERROR(ValidateBoxId(box.id));
  const std::string what = "destroy box " + box.id;
  const std::string dir = Dir(box.id);
  Status stopped = Stop(box);
  std::unique_ptr<Watchdog> watchdog;
  {
    MutexLock g(mu_);
    if (auto it = watchdogs_.find(box.id); it != watchdogs_.end()) {
      watchdog = std::move(it->second);
      watchdogs_.erase(it);
    }
  }
  watchdog.reset();  // the box's first process is dead: it has nothing left to kill
  if (oom_guard_) oom_guard_->Forget(box.id);
  Status deleted = DeleteContainer(box.id);
  Status cgroups = DestroyCgroups(box.id);  // nothing of the box runs any more
  Status unmounted = UnmountBelow(dir);
  (void)SetImmutable(dir + "/sock", false);  // gVisor's socket directory; absent under runc
  Status kept;
  if (keep_upper != nullptr) {
    if (!stopped.ok() || !unmounted.ok()) {
      kept = Status::Error("keep the writable layer of box " + box.id + ": the box is not stopped",
                           EBUSY);
    } else if (::access((dir + "/disk.img").c_str(), F_OK) == 0) {
      kept = Status::Error("keep the writable layer of box " + box.id + ": it has a disk limit",
                           ENOTSUP);
    } else if (::rename((dir + "/fs/upper").c_str(), keep_upper->c_str()) != 0) {
      kept =
          Status::Errno("keep the writable layer of box " + box.id + ": rename to " + *keep_upper);
    }
  }
  Status fs = unmounted.ok() ? RemoveTree(dir) : unmounted;
  {
    MutexLock g(mu_);
    owner_locks_.erase(box.id);
  }
  // The range is free only once nothing the box wrote is left on the host.
  if (fs.ok() && config_.id_pool != nullptr) {
    Status released = config_.id_pool->Release(box.id);
    if (!released.ok()) return released.Wrap(what);
  }
  for (const Status* s : {&stopped, &deleted, &cgroups, &fs})
    if (!s->ok()) return s->Wrap(what);
  return kept;
}

Status OciRuntime::CopyWritableLayer(const Box& box, const std::string& dest, int64_t limit_bytes) {
  SBX_RETURN_IF_ERROR(ValidateBoxId(box.id));
  const std::string what = "copy the writable layer of box " + box.id;
  UniqueFd src(::open(Upper(Dir(box.id)).c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!src) return Status::Errno(what + ": open");
  auto copied = CopyLayerTree(src.get(), dest, limit_bytes);
  if (!copied.ok()) return copied.status().Wrap(what);
  return {};
}

Result<std::vector<std::string>> OciRuntime::ListBoxes() { return ListBoxIds(config_.run_dir); }

Result<Box> OciRuntime::Adopt(const std::string& id) {
  SBX_RETURN_IF_ERROR(ValidateBoxId(id));
  const std::string what = "adopt box " + id;
  Box box;
  box.id = id;
  box.dir = Dir(id);
  box.runtime = config_.name;
  box.idmapped = true;
  box.agent_socket = AgentSocket(id);
  UniqueFd lock(::open((box.dir + "/owner").c_str(), O_RDWR | O_CLOEXEC));
  if (!lock) return Status::Errno(what + ": open owner");
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0)
    return Status::Error(what + ": owned by a live process", EBUSY);
  if (auto ids = ReadFile(box.dir + "/ids", 64); ids.ok())
    box.id_base = static_cast<uint32_t>(std::strtoul(ids->c_str(), nullptr, 10));
  if (!BoxProcess(box.dir).ok()) return Status::Error(what + ": its agent is gone", ESRCH);
  auto pid = ReadFile(box.dir + "/pid", 64);
  box.init_pid = pid.ok() ? static_cast<pid_t>(std::atoi(pid->c_str())) : -1;
  // The binary must still know it as running (or paused).
  auto state = Run(id, {"state", id});
  if (!state.ok()) return state.status().Wrap(what);
  auto st = nlohmann::json::parse(*state, nullptr, false);
  std::string status = st.is_object() ? st.value("status", "") : "";
  if (status != "running" && status != "paused")
    return Status::Error(what + ": " + config_.binary + " says it is " + status, ESRCH);
  {
    MutexLock g(mu_);
    owner_locks_[id] = std::move(lock);
  }
  // It may have run out of memory while nobody watched (it waits then): handled now. A box the
  // guard cannot watch is left to the kernel's OOM killer, as before the guard.
  (void)GuardMemory(id);
  return box;
}

Result<int> OciRuntime::ReapOrphans(const std::string& owner) {
  auto ids = ListBoxes();
  if (!ids.ok()) return ids.status();
  int reaped = 0;
  for (const auto& id : *ids) {
    {
      MutexLock g(mu_);
      if (owner_locks_.count(id)) continue;  // ours and alive
    }
    // Open's probe boxes belong to whichever process probed; one whose lock is free is a leftover.
    if (!IsOrphan(Dir(id), id.rfind(kProbePrefix, 0) == 0 ? kProbeOwner : owner)) continue;
    Box box;
    box.id = id;
    if (Destroy(box).ok()) ++reaped;
  }
  // Directories still under their creation name whose creator died before the rename (they hold
  // only the owner file).
  for (const auto& name : DirNames(config_.run_dir)) {
    if (!IsAbandonedCreation(name)) continue;
    (void)UnmountBelow(config_.run_dir + "/" + name);
    if (RemoveTree(config_.run_dir + "/" + name).ok()) ++reaped;
  }
  // Containers the binary still knows whose box directory is gone (a crash between the two).
  if (auto listed = Run("", {"list", "--quiet"}); listed.ok()) {
    size_t pos = 0;
    while (pos < listed->size()) {
      size_t end = listed->find('\n', pos);
      if (end == std::string::npos) end = listed->size();
      std::string id = Trim(listed->substr(pos, end - pos));
      pos = end + 1;
      struct stat st {};
      if (!ValidateBoxId(id).ok() || ::lstat(Dir(id).c_str(), &st) == 0) continue;
      if (Run(id, {"delete", "--force", id}).ok()) ++reaped;
      (void)DestroyCgroups(id);
    }
  }
  return reaped;
}

}  // namespace sbx::runtime
