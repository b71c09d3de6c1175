#include "runtime/native/child.h"

#include <fcntl.h>
#include <linux/openat2.h>
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
                     op.optional, op.fd_index, op.in_root, op.source_in_root, c(op.stacked)});
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

bool OverlayHasLowerdirPlus() {
  // An unknown parameter is EINVAL at fsconfig time; a known one only records the path. Nothing is
  // mounted: the context is closed unused.
  static const bool has = [] {
    int fs = static_cast<int>(::syscall(SYS_fsopen, "overlay", FSOPEN_CLOEXEC));
    if (fs < 0) return false;
    bool ok = ::syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "lowerdir+", "/", 0) == 0;
    ::close(fs);
    return ok;
  }();
  return has;
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

// Takes the parent's go-ahead and the descriptors that come with it, in messages of at most
// kMaxFdsPerMessage ('m' while more follow, 'g' for the last). 0 or an errno.
int ReceiveSetup(int sock, Received& r, size_t want) {
  r.count = 0;
  for (;;) {
    char byte = 0;
    iovec iov{&byte, 1};
    alignas(cmsghdr) char buf[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
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
    if (n != 1 || (byte != 'g' && byte != 'm')) return EPIPE;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < k; ++i) {
        int fd;
        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (r.count < kMaxSetupFds) {
          r.fds[r.count++] = fd;
        } else {
          close(fd);
          return EPROTO;
        }
      }
    }
    if (msg.msg_flags & MSG_CTRUNC) return EPROTO;
    if (byte == 'g') break;
  }
  if (r.count != want) return EPROTO;
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

// --- paths inside the new root ---
//
// The layers made the root, so any of its names may be a symlink meant to redirect a mount to
// the host (a layer's /proc -> /, /etc -> /host/dir). Every such path is resolved below an O_PATH
// descriptor of the root with RESOLVE_IN_ROOT (a symlink, absolute or "..", stays in the root, as
// it would once the box runs) and RESOLVE_NO_MAGICLINKS (no /proc/<pid>/fd trick through the
// box's own /proc). Mounts then go onto the resolved descriptor: mount(2) through /proc/self/fd/N
// of the host's /proc (still ours before pivot_root), or move_mount() onto the descriptor.

constexpr uint64_t kInRoot = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;

int OpenAt2(int dirfd, const char* path, uint64_t flags, uint64_t resolve) {
  open_how how;
  memset(&how, 0, sizeof how);
  how.flags = flags | O_CLOEXEC;
  how.resolve = resolve;
  int fd = -1;
  // EAGAIN: a rename elsewhere on the filesystem raced the lookup (RESOLVE_IN_ROOT's check).
  for (int tries = 0; tries < 16; ++tries) {
    fd = static_cast<int>(syscall(SYS_openat2, dirfd, path, &how, sizeof how));
    if (fd >= 0 || errno != EAGAIN) break;
  }
  return fd;
}

// "/proc/self/fd/<fd>" into `buf` (at least 32 bytes).
const char* FdPath(char* buf, int fd) {
  const char prefix[] = "/proc/self/fd/";
  memcpy(buf, prefix, sizeof prefix - 1);
  char digits[12];
  size_t n = 0;
  unsigned v = static_cast<unsigned>(fd);
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  size_t at = sizeof prefix - 1;
  while (n > 0) buf[at++] = digits[--n];
  buf[at] = '\0';
  return buf;
}

// The existing object at `path` in the root, never a symlink (ELOOP: one there is not followed
// as the last component). A descriptor or -errno.
int OpenInRoot(int root, const char* path, bool want_dir) {
  int fd = OpenAt2(root, path, O_PATH | O_NOFOLLOW | (want_dir ? O_DIRECTORY : 0), kInRoot);
  if (fd < 0) return -errno;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return -err;
  }
  if (S_ISLNK(st.st_mode)) {
    close(fd);
    return -ELOOP;
  }
  return fd;
}

// The directory that holds the last component of `path` (absolute, inside the root), with every
// missing directory on the way made in the box's writable layer, one component at a time below
// descriptors of the root (mkdirat; never a path walked by string). Each prefix is resolved from
// the root as the box will see it. Sets *leaf to the last component (inside a static buffer).
// A descriptor or -errno: EINVAL for "", "/", "." or ".." components; ELOOP for a symlink that
// leads nowhere inside the root.
int ParentInRoot(int root, const char* path, const char** leaf) {
  static char buf[4096];
  size_t len = Len(path);
  if (len == 0 || len >= sizeof buf) return -ENAMETOOLONG;
  memcpy(buf, path, len + 1);
  // The components: [start, end) ranges between slashes.
  size_t i = 0;
  while (buf[i] == '/') ++i;
  if (buf[i] == '\0') return -EINVAL;
  int cur = fcntl(root, F_DUPFD_CLOEXEC, 0);
  if (cur < 0) return -errno;
  for (;;) {
    size_t start = i;
    while (buf[i] != '\0' && buf[i] != '/') ++i;
    size_t end = i;
    while (buf[i] == '/') ++i;
    size_t n = end - start;
    if ((n == 1 && buf[start] == '.') || (n == 2 && buf[start] == '.' && buf[start + 1] == '.')) {
      close(cur);
      return -EINVAL;
    }
    if (buf[i] == '\0') {  // the last component
      buf[end] = '\0';
      *leaf = buf + start;
      return cur;
    }
    char saved = buf[end];
    buf[end] = '\0';
    int fd = OpenAt2(root, buf, O_PATH | O_DIRECTORY, kInRoot);
    if (fd < 0 && errno == ENOENT) {
      // Missing in the directory the prefix so far resolved to: make it there, then open what
      // was made (a dangling symlink in its place makes mkdirat fail with EEXIST and the open
      // with ELOOP).
      if (mkdirat(cur, buf + start, 0755) != 0 && errno != EEXIST) {
        int err = errno;
        close(cur);
        return -err;
      }
      fd = OpenAt2(cur, buf + start, O_PATH | O_DIRECTORY | O_NOFOLLOW,
                   RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
      struct stat st;
      if (fd < 0 && errno == ENOTDIR && fstatat(cur, buf + start, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
          S_ISLNK(st.st_mode))
        errno = ELOOP;  // say what it is: a symlink that leads nowhere inside the root
    }
    if (fd < 0) {
      int err = errno;
      close(cur);
      return -err;
    }
    buf[end] = saved;
    close(cur);
    cur = fd;
  }
}

// Makes `path` inside the root a directory (or an empty regular file), with its parents. What a
// layer left there instead (a symlink, an object of the other kind) is taken out of the box's
// view first: the unlink is recorded in the writable layer, the layer is not touched.
int MakeInRoot(int root, const char* path, bool dir) {
  const char* leaf = nullptr;
  int parent = ParentInRoot(root, path, &leaf);
  if (parent < 0) return -parent;
  int err = 0;
  struct stat st;
  if (fstatat(parent, leaf, &st, AT_SYMLINK_NOFOLLOW) == 0) {
    bool fits = dir ? S_ISDIR(st.st_mode) : !S_ISDIR(st.st_mode) && !S_ISLNK(st.st_mode);
    if (fits) {
      close(parent);
      return 0;
    }
    if (unlinkat(parent, leaf, S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) != 0) err = errno;
  } else if (errno != ENOENT) {
    err = errno;
  }
  if (err == 0) {
    if (dir) {
      if (mkdirat(parent, leaf, 0755) != 0) err = errno;
    } else {
      int fd = openat(parent, leaf, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
      if (fd < 0) {
        err = errno;
      } else {
        close(fd);
      }
    }
  }
  close(parent);
  return err;
}

int SymlinkInRoot(int root, const char* value, const char* path) {
  const char* leaf = nullptr;
  int parent = ParentInRoot(root, path, &leaf);
  if (parent < 0) return -parent;
  int err = symlinkat(value, parent, leaf) == 0 || errno == EEXIST ? 0 : errno;
  close(parent);
  return err;
}

// Appends `s` to buf[*at..cap); false when it does not fit (with its terminating NUL).
bool Append(char* buf, size_t cap, size_t* at, const char* s) {
  size_t n = Len(s);
  if (*at + n + 1 > cap) return false;
  memcpy(buf + *at, s, n + 1);
  *at += n;
  return true;
}

bool AppendNumber(char* buf, size_t cap, size_t* at, unsigned v) {
  char digits[12];
  size_t n = 0;
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  char out[12];
  for (size_t k = 0; k < n; ++k) out[k] = digits[n - 1 - k];
  out[n] = '\0';
  return Append(buf, cap, at, out);
}

// The root's overlay (MountOp::kOverlay) and the layers' stack (kLowerStack). With lowerdir+
// each layer is its own fsconfig parameter, so the count is bounded only by overlayfs' stack
// (kMaxLayers), not by the page the lowerdir option string must fit in. Without it, the string
// names the layers relative to lower/ ("0:1:2", under 5 bytes a layer: 500 layers fit a page)
// while the mount runs from there.
int MountOverlay(const ChildPlan& plan, const ChildPlan::Op& op) {
  const bool stack = op.kind == MountOp::Kind::kLowerStack;
  // Below lower/, or the stack they were put on; a stack's bottom is an empty directory.
  const unsigned layers = op.stacked != nullptr ? 0 : static_cast<unsigned>(op.fd_index);
  const char* extra = stack ? op.data : op.stacked;
  if (plan.lowerdir_plus) {
    int fs = static_cast<int>(syscall(SYS_fsopen, "overlay", FSOPEN_CLOEXEC));
    if (fs < 0) return errno;
    int err = 0;
    for (unsigned i = 0; i < layers && err == 0; ++i) {
      char name[32];
      size_t at = 0;
      Append(name, sizeof name, &at, "lower/");
      AppendNumber(name, sizeof name, &at, i);
      if (syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "lowerdir+", name, 0) != 0) err = errno;
    }
    if (err == 0 && extra != nullptr &&
        syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "lowerdir+", extra, 0) != 0)
      err = errno;
    if (err == 0 && !stack &&
        (syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "upperdir", op.source, 0) != 0 ||
         syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "workdir", op.data, 0) != 0))
      err = errno;
    if (err == 0 && (syscall(SYS_fsconfig, fs, FSCONFIG_SET_FLAG, "userxattr", nullptr, 0) != 0 ||
                     syscall(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0))
      err = errno;
    int mnt = -1;
    if (err == 0) {
      unsigned attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (stack ? MOUNT_ATTR_RDONLY : 0);
      mnt = static_cast<int>(syscall(SYS_fsmount, fs, FSMOUNT_CLOEXEC, attrs));
      if (mnt < 0) err = errno;
    }
    close(fs);
    if (err == 0) {
      err = MoveMount(mnt, op.target);
      close(mnt);
    }
    return err;
  }
  static char data[4096];  // the page mount(2) copies of its options
  static char target[4096];
  size_t at = 0, tat = 0;
  bool fits = Append(data, sizeof data, &at, "lowerdir=");
  for (unsigned i = 0; fits && i < layers; ++i) {
    if (i > 0) fits = Append(data, sizeof data, &at, ":");
    fits = fits && AppendNumber(data, sizeof data, &at, i);
  }
  if (extra != nullptr) {
    fits = fits && (layers == 0 || Append(data, sizeof data, &at, ":")) &&
           Append(data, sizeof data, &at, "../") && Append(data, sizeof data, &at, extra);
  }
  if (!stack) {
    fits = fits && Append(data, sizeof data, &at, ",upperdir=../") &&
           Append(data, sizeof data, &at, op.source) &&
           Append(data, sizeof data, &at, ",workdir=../") &&
           Append(data, sizeof data, &at, op.data);
  }
  fits = fits && Append(data, sizeof data, &at, ",userxattr") &&
         Append(target, sizeof target, &tat, "../") &&
         Append(target, sizeof target, &tat, op.target);
  if (!fits) return E2BIG;
  if (chdir("lower") != 0) return errno;
  int err = mount("overlay", target, "overlay", op.flags, data) == 0 ? 0 : errno;
  if (chdir("..") != 0 && err == 0) err = errno;
  return err;
}

// A read-only overlay of the topmost layer's `op.source` over the root's `op.target`
// (MountOp::kOverlaySub). The layer's path is resolved inside the layer as if it were the root.
int MountOverlaySub(int root, const ChildPlan::Op& op) {
  int layer = open("lower/0", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (layer < 0) return errno;
  int src = OpenInRoot(layer, op.source, true);
  close(layer);
  if (src < 0) return -src;
  int dst = OpenInRoot(root, op.target, true);
  if (dst < 0) {
    close(src);
    return -dst;
  }
  static char data[128];
  char a[32], b[32];
  size_t at = 0;
  Append(data, sizeof data, &at, "lowerdir=");
  Append(data, sizeof data, &at, FdPath(a, src));
  Append(data, sizeof data, &at, ":");
  Append(data, sizeof data, &at, FdPath(b, dst));
  Append(data, sizeof data, &at, ",userxattr");
  int err = mount("overlay", b, "overlay", op.flags, data) == 0 ? 0 : errno;
  close(src);
  close(dst);
  return err;
}

struct OpContext {
  const ChildPlan& plan;
  const Received& mounts;
  int root = -1;  // the new root, opened once its overlay is mounted
};

int RunOp(const ChildPlan::Op& op, OpContext& ctx) {
  if (op.in_root && ctx.root < 0) {
    ctx.root = open(ctx.plan.root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (ctx.root < 0) return errno;
  }
  const int root = ctx.root;
  switch (op.kind) {
    case MountOp::Kind::kAttach: {
      if (op.fd_index < 0 || static_cast<size_t>(op.fd_index) + 1 >= ctx.mounts.count) return EBADF;
      int from = ctx.mounts.fds[op.fd_index + 1];
      if (!op.in_root) return MoveMount(from, op.target);
      int to = OpenInRoot(root, op.target, false);
      if (to < 0) return -to;
      int err = syscall(SYS_move_mount, from, "", to, "",
                        MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) == 0
                    ? 0
                    : errno;
      close(to);
      return err;
    }
    case MountOp::Kind::kMkdir:
      if (op.in_root) return MakeInRoot(root, op.target, true);
      if (mkdir(op.target, 0755) != 0 && errno != EEXIST) return errno;
      return 0;
    case MountOp::Kind::kTouch: {
      if (op.in_root) return MakeInRoot(root, op.target, false);
      int fd = open(op.target, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
      if (fd < 0) return errno;
      close(fd);
      return 0;
    }
    case MountOp::Kind::kSymlink:
      if (op.in_root) return SymlinkInRoot(root, op.source, op.target);
      if (symlink(op.source, op.target) != 0 && errno != EEXIST) return errno;
      return 0;
    case MountOp::Kind::kOverlay:
    case MountOp::Kind::kLowerStack:
      return MountOverlay(ctx.plan, op);
    case MountOp::Kind::kOverlaySub:
      return MountOverlaySub(root, op);
    case MountOp::Kind::kMount:
      break;
  }
  char target_buf[32], source_buf[32];
  const char* target = op.target;
  const char* source = op.source;
  int target_fd = -1, source_fd = -1;
  if (op.in_root) {
    target_fd = OpenInRoot(root, op.target, false);
    if (target_fd < 0) return -target_fd;
    target = FdPath(target_buf, target_fd);
  }
  if (op.source_in_root) {
    source_fd = OpenInRoot(root, op.source, false);
    if (source_fd < 0) {
      if (target_fd >= 0) close(target_fd);
      return -source_fd;
    }
    source = FdPath(source_buf, source_fd);
  }
  int err = mount(source, target, op.fstype, op.flags, op.data) == 0 ? 0 : errno;
  // A read-only remount must keep the flags the kernel locked on the source mount (nosuid,
  // nodev, noexec as the host had them); retry with them added.
  if (err == EPERM && (op.flags & MS_REMOUNT)) {
    unsigned long extra = MS_NOSUID | MS_NODEV | MS_NOEXEC;
    if (mount(source, target, op.fstype, op.flags | extra, op.data) == 0) err = 0;
  }
  if (target_fd >= 0) close(target_fd);
  if (source_fd >= 0) close(source_fd);
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
  // Every path of the plan is relative to the box directory.
  if (fchdir(received.fds[0]) != 0) Fail(p, kStepBoxDir, errno);
  close(received.fds[0]);
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) Fail(p, kStepPrivate, errno);

  OpContext ctx{p, received};
  for (size_t i = 0; i < p.op_count; ++i) {
    int err = RunOp(p.ops[i], ctx);
    if (err == 0 || (err == ENOENT && p.ops[i].optional)) continue;
    Fail(p, static_cast<int32_t>(i), err);
  }
  if (ctx.root >= 0) close(ctx.root);
  // The user namespace's own limits, while we still hold CAP_SYS_RESOURCE in it (these files are
  // per user namespace: the host's values are not touched; the path is the host's /proc, ours
  // until pivot_root). After our own namespaces exist, and after the mounts: fsmount() (the
  // root's overlay) makes an anonymous mount namespace, which max_mnt_namespaces 0 refuses.
  for (size_t i = 0; i < p.sysctl_count; ++i) {
    if (int err = WriteText(p.sysctls[i].path, p.sysctls[i].value)) Fail(p, kStepUserLimits, err);
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
