#include "runtime/native/child.h"

#include <fcntl.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "runtime/native/capabilities.h"
#include "runtime/native/seccomp_policy.h"

namespace sbx::runtime {

const char* ChildStepName(int32_t step) {
  switch (step) {
    case kStepWaitParent:
      return "wait for the parent";
    case kStepSetIds:
      return "become root in the user namespace";
    case kStepCgroupNs:
      return "unshare the cgroup namespace";
    case kStepPrivate:
      return "make mounts private";
    case kStepPivot:
      return "pivot_root into the box";
    case kStepHostname:
      return "set the hostname";
    case kStepRlimits:
      return "set rlimits";
    case kStepCaps:
      return "drop capabilities";
    case kStepNoNewPrivs:
      return "set no_new_privs";
    case kStepSeccomp:
      return "load the seccomp filter";
    case kStepFds:
      return "arrange file descriptors";
    case kStepExec:
      return "exec sbx-agent";
    case kStepLoopback:
      return "bring up the loopback interface";
    case kStepUserLimits:
      return "set the user namespace's limits (/proc/sys/user)";
    case kStepBoxDir:
      return "enter the box directory";
    default:
      return "unknown step";
  }
}

ChildPlan ChildPlanStorage::Build(const std::vector<MountOp>& ops, const std::string& root,
                                  const std::string& hostname,
                                  const std::vector<std::string>& argv) {
  ops_ = ops;
  root_ = root;
  hostname_ = hostname;
  cops_.clear();
  auto c = [](const std::string& s) -> const char* { return s.empty() ? nullptr : s.c_str(); };
  for (const auto& op : ops_) {
    cops_.push_back({op.kind, c(op.source), op.target.c_str(), c(op.fstype), op.flags, c(op.data),
                     op.optional, op.fd_index});
  }
  argv_strings_ = argv;
  argv_.clear();
  for (auto& a : argv_strings_) argv_.push_back(a.data());
  argv_.push_back(nullptr);
  envp_ = {nullptr};

  ChildPlan plan;
  plan.ops = cops_.data();
  plan.op_count = cops_.size();
  plan.root = root_.c_str();
  plan.hostname = hostname_.c_str();
  plan.argv = argv_.data();
  plan.envp = envp_.data();
  return plan;
}

namespace {

// --- async-signal-safe from here on ---

[[noreturn]] void Fail(const ChildPlan& plan, int32_t step, int err) {
  ChildFailure f{step, err};
  // Nothing useful can be done if this write fails; the parent then sees EOF without an exec.
  ssize_t n = write(plan.status_fd, &f, sizeof f);
  (void)n;
  _exit(127);
}

size_t Len(const char* s) {
  size_t n = 0;
  while (s[n] != '\0') ++n;
  return n;
}

// The descriptors received with the go-ahead: [0] the box directory, then the detached mounts.
struct Received {
  int fds[kMaxSetupFds];
  size_t count;
};

// Takes the parent's go-ahead byte and the descriptors that come with it. 0 or an errno.
int ReceiveSetup(int sock, Received& r, size_t want) {
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char buf[CMSG_SPACE(sizeof(int) * kMaxSetupFds)];
  msghdr msg;
  memset(&msg, 0, sizeof msg);
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = buf;
  msg.msg_controllen = sizeof buf;
  ssize_t n;
  do {
    n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return errno;
  if (n != 1 || byte != 'g') return EPIPE;
  r.count = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k && r.count < kMaxSetupFds; ++i)
      memcpy(&r.fds[r.count++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
  }
  if ((msg.msg_flags & MSG_CTRUNC) || r.count != want) return EPROTO;
  return 0;
}

int MoveMount(int fd, const char* target) {
  if (syscall(SYS_move_mount, fd, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH) != 0) return errno;
  return 0;
}

int WriteText(const char* path, const char* value) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  size_t len = Len(value);
  ssize_t n = write(fd, value, len);
  int err = n == static_cast<ssize_t>(len) ? 0 : (n < 0 ? errno : EIO);
  close(fd);
  return err;
}

int RunOp(const ChildPlan::Op& op, const Received& mounts) {
  switch (op.kind) {
    case MountOp::Kind::kAttach:
      if (op.fd_index < 0 || static_cast<size_t>(op.fd_index) + 1 >= mounts.count) return EBADF;
      return MoveMount(mounts.fds[op.fd_index + 1], op.target);
    case MountOp::Kind::kMkdir:
      if (mkdir(op.target, 0755) != 0 && errno != EEXIST) return errno;
      return 0;
    case MountOp::Kind::kTouch: {
      int fd = open(op.target, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
      if (fd < 0) return errno;
      close(fd);
      return 0;
    }
    case MountOp::Kind::kSymlink:
      if (symlink(op.source, op.target) != 0 && errno != EEXIST) return errno;
      return 0;
    case MountOp::Kind::kMount:
      break;
  }
  if (mount(op.source, op.target, op.fstype, op.flags, op.data) == 0) return 0;
  int err = errno;
  // A read-only remount must keep the flags the kernel locked on the source mount (nosuid,
  // nodev, noexec as the host had them); retry with them added.
  if (err == EPERM && (op.flags & MS_REMOUNT)) {
    unsigned long extra = MS_NOSUID | MS_NODEV | MS_NOEXEC;
    if (mount(op.source, op.target, op.fstype, op.flags | extra, op.data) == 0) return 0;
  }
  return err;
}

int SetRootIds() {
  // Raw system calls: glibc's wrappers broadcast id changes to every thread it knows of, and
  // after a raw clone() of a multi-threaded parent its list names threads that do not exist here.
  if (syscall(SYS_setresgid, 0, 0, 0) != 0) return errno;
  if (syscall(SYS_setgroups, 0, nullptr) != 0) return errno;
  if (syscall(SYS_setresuid, 0, 0, 0) != 0) return errno;
  return 0;
}

// Moves `fd` to exactly `target`, close-on-exec or not.
int Place(int fd, int target, bool cloexec) {
  if (fd == target) {
    int flags = fcntl(fd, F_GETFD);
    if (flags < 0) return errno;
    flags = cloexec ? (flags | FD_CLOEXEC) : (flags & ~FD_CLOEXEC);
    return fcntl(fd, F_SETFD, flags) == 0 ? 0 : errno;
  }
  return dup3(fd, target, cloexec ? O_CLOEXEC : 0) >= 0 ? 0 : errno;
}

// A new network namespace starts with its loopback down: nothing in the box could reach a server
// it started on 127.0.0.1.
int LoopbackUp() {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return errno;
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  memcpy(ifr.ifr_name, "lo", 3);
  int err = 0;
  if (ioctl(s, SIOCGIFFLAGS, &ifr) != 0) {
    err = errno;
  } else {
    ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP | IFF_RUNNING);
    if (ioctl(s, SIOCSIFFLAGS, &ifr) != 0) err = errno;
  }
  close(s);
  return err;
}

// Closes every descriptor but the plan's own (async-signal-safe: a fixed array, no allocation).
int CloseAllBut(const ChildPlan& plan) {
  int keep[] = {plan.stdin_fd,  plan.log_fd,   plan.listen_fd,
                plan.status_fd, plan.setup_fd, plan.agent_fd};
  constexpr size_t n = sizeof keep / sizeof keep[0];
  for (size_t i = 1; i < n; ++i) {  // insertion sort
    for (size_t j = i; j > 0 && keep[j - 1] > keep[j]; --j) {
      int t = keep[j];
      keep[j] = keep[j - 1];
      keep[j - 1] = t;
    }
  }
  unsigned int next = 0;  // the lowest descriptor not yet handled
  for (int fd : keep) {
    if (fd < 0 || static_cast<unsigned int>(fd) < next) continue;
    if (static_cast<unsigned int>(fd) > next &&
        syscall(SYS_close_range, next, static_cast<unsigned int>(fd) - 1, 0U) != 0)
      return errno;
    next = static_cast<unsigned int>(fd) + 1;
  }
  if (syscall(SYS_close_range, next, ~0U, 0U) != 0) return errno;
  return 0;
}

// True once the parent's end of the go-ahead channel is closed: the parent died (it holds its end
// until we have exec'd or failed, and we hold no copy of it).
bool ParentGone(int sock) {
  pollfd pfd{sock, POLLIN, 0};
  int n;
  do {
    n = poll(&pfd, 1, 0);
  } while (n < 0 && errno == EINTR);
  return n < 0 || (pfd.revents & (POLLHUP | POLLERR)) != 0;
}

}  // namespace

void RunChild(const ChildPlan& plan) {
  // First, before anything can block: die with the thread that cloned us (it lives until we have
  // exec'd or failed, see NativeRuntime::CreateIn). If the parent died before this call, the
  // signal never comes; the go-ahead channel below then reads EOF instead, once we hold no
  // copy of the parent's end of it.
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  // Every descriptor of the (multi-threaded) parent came along with the clone: the parent's end
  // of our go-ahead channel and of our status pipe, other boxes' channels, pipes and owner locks
  // being created at the same moment, the daemon's serve.lock, listening socket and database.
  // Holding any of them could keep this process (or another box's) waiting forever after the
  // parent died, and keep the daemon's locks held: close all but the plan's own, now.
  if (CloseAllBut(plan) != 0) _exit(127);

  // The parent's signal dispositions and mask must not leak into the box: a daemon that ignores
  // SIGPIPE would otherwise make `yes | head` inside run forever.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) sigaction(sig, &dfl, nullptr);  // EINVAL for KILL/STOP
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);

  // Move every descriptor we keep far up first, so placing them at 0..6 cannot clobber another.
  ChildPlan p = plan;
  int* fds[] = {&p.stdin_fd, &p.log_fd, &p.listen_fd, &p.status_fd, &p.setup_fd, &p.agent_fd};
  for (int* fd : fds) {
    int moved = fcntl(*fd, F_DUPFD_CLOEXEC, 1000);
    if (moved < 0) Fail(plan, kStepFds, errno);
    *fd = moved;
  }
  if (Place(p.status_fd, 4, true) != 0) _exit(127);
  p.status_fd = 4;

  // Wait until the parent has written our id maps, put us in our cgroups and made our mounts.
  static Received received;  // a copy-on-write page of our own: no allocation
  if (int err = ReceiveSetup(p.setup_fd, received, 1 + p.mount_count))
    Fail(p, kStepWaitParent, err);

  if (int err = SetRootIds()) Fail(p, kStepSetIds, err);
  // The id change cleared the parent-death signal: set it again, then make sure the parent did
  // not die in between (it keeps its end of the channel open until we have exec'd or failed).
  // getppid() cannot tell: in our own pid namespace the parent is outside and it is always 0.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) Fail(p, kStepSetIds, errno);
  if (ParentGone(p.setup_fd)) _exit(127);
  if (unshare(CLONE_NEWCGROUP) != 0) Fail(p, kStepCgroupNs, errno);
  // The user namespace's own limits, while we still hold CAP_SYS_RESOURCE in it (these files are
  // per user namespace: the host's values are not touched). After our own namespaces exist.
  for (size_t i = 0; i < p.sysctl_count; ++i) {
    if (int err = WriteText(p.sysctls[i].path, p.sysctls[i].value)) Fail(p, kStepUserLimits, err);
  }
  // Every path of the plan is relative to the box directory.
  if (fchdir(received.fds[0]) != 0) Fail(p, kStepBoxDir, errno);
  close(received.fds[0]);
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) Fail(p, kStepPrivate, errno);

  for (size_t i = 0; i < p.op_count; ++i) {
    int err = RunOp(p.ops[i], received);
    if (err == 0 || (err == ENOENT && p.ops[i].optional)) continue;
    Fail(p, static_cast<int32_t>(i), err);
  }

  for (size_t i = 1; i < received.count; ++i) close(received.fds[i]);
  if (chdir(p.root) != 0) Fail(p, kStepPivot, errno);
  if (syscall(SYS_pivot_root, ".", ".") != 0) Fail(p, kStepPivot, errno);
  if (umount2(".", MNT_DETACH) != 0) Fail(p, kStepPivot, errno);
  if (chdir("/") != 0) Fail(p, kStepPivot, errno);

  if (sethostname(p.hostname, Len(p.hostname)) != 0) Fail(p, kStepHostname, errno);
  if (int err = LoopbackUp()) Fail(p, kStepLoopback, err);
  for (size_t i = 0; i < p.rlimit_count; ++i) {
    if (setrlimit(static_cast<__rlimit_resource>(p.rlimits[i].resource), &p.rlimits[i].value) != 0)
      Fail(p, kStepRlimits, errno);
  }
  if (int err = DropCapabilities(p.caps); err != 0) Fail(p, kStepCaps, -err);
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) Fail(p, kStepNoNewPrivs, errno);

  // Descriptors: 0 stdin (/dev/null), 1 and 2 the agent log, 3 the listening socket, 4 the status
  // pipe (close-on-exec: EOF tells the parent the exec happened), 5 the agent image.
  if (Place(p.stdin_fd, 0, false) != 0 || Place(p.log_fd, 1, false) != 0 ||
      Place(p.log_fd, 2, false) != 0 || Place(p.listen_fd, 3, false) != 0 ||
      Place(p.agent_fd, 5, true) != 0 || Place(p.setup_fd, 6, true) != 0) {
    Fail(p, kStepFds, errno);
  }
  p.setup_fd = 6;
  if (syscall(SYS_close_range, 7U, ~0U, 0U) != 0) Fail(p, kStepFds, errno);

  // A box that outlives its creator (the daemon's) stops dying with it only now: the parent has
  // recorded our pid and holds the box's owner lock since before its go-ahead, so from here on a
  // dead parent leaves a box its next start adopts or reaps (a record still `creating`, or none,
  // is reaped; the cgroup kills what is in it). Checked once more after: a parent that died just
  // before the clear must not leave an agent behind. The window left is between that check and
  // the exec below (a few system calls); what it leaves is that reapable box.
  if (!p.die_with_parent) {
    if (prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0) != 0) Fail(p, kStepFds, errno);
    if (ParentGone(p.setup_fd)) _exit(127);
  }

  // Last: once loaded, the filter also governs the exec below.
  if (p.seccomp != nullptr) {
    if (int err = ApplySeccompProgram(*p.seccomp); err != 0) Fail(p, kStepSeccomp, -err);
  }

  syscall(SYS_execveat, 5, "", p.argv, p.envp, AT_EMPTY_PATH);
  Fail(p, kStepExec, errno);
}

const char* ProbeStepName(int step) {
  switch (step) {
    case 1:
      return "receive the layer";
    case 2:
      return "become root in the user namespace";
    case 3:
      return "enter the probe directory";
    case 4:
      return "make mounts private";
    case 5:
      return "attach the idmapped layer";
    case 6:
      return "mount an overlay over the idmapped layer";
    case 7:
      return "the layer's root-owned file is not root's inside";
    case 8:
      return "copy up the layer's file";
    default:
      return "killed";
  }
}

void RunProbeChild(int sock) {
  // As RunChild: die with the parent, and hold none of its descriptors (its end of `sock` above
  // all, so that a dead parent reads as EOF).
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  if (sock > 0 && syscall(SYS_close_range, 0U, static_cast<unsigned int>(sock) - 1, 0U) != 0)
    _exit(1);
  if (syscall(SYS_close_range, static_cast<unsigned int>(sock) + 1, ~0U, 0U) != 0) _exit(1);
  static Received received;
  if (ReceiveSetup(sock, received, 2) != 0) _exit(1);
  if (SetRootIds() != 0) _exit(2);
  if (fchdir(received.fds[0]) != 0) _exit(3);
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) _exit(4);
  if (MoveMount(received.fds[1], "lower") != 0) _exit(5);
  if (mount("overlay", "merged", "overlay", MS_NOSUID | MS_NODEV,
            "lowerdir=lower,upperdir=upper,workdir=work,userxattr") != 0)
    _exit(6);
  struct stat st;
  if (stat("merged/f", &st) != 0 || st.st_uid != 0 || st.st_gid != 0) _exit(7);
  int fd = open("merged/f", O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) _exit(8);
  if (write(fd, "!", 1) != 1) _exit(8);
  close(fd);
  _exit(0);
}

}  // namespace sbx::runtime
