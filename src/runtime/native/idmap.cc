#include "runtime/native/idmap.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <utility>

#include "common/fs.h"
#include "runtime/native/child.h"
#include "runtime/native/native_runtime.h"

namespace sbx::runtime {

long CloneOwnedBy(unsigned long flags, uint32_t owner, int* pidfd) {
  const uid_t euid = ::geteuid();
  const gid_t egid = ::getegid();
  const int dumpable = ::prctl(PR_GET_DUMPABLE);
  // Raw system calls: glibc's setresuid() changes every thread of the process, and only this
  // thread may change. The group first, while this thread still has CAP_SETGID.
  if (::syscall(SYS_setresgid, -1, owner, -1) != 0) return -errno;
  if (::syscall(SYS_setresuid, -1, owner, -1) != 0) {
    int err = errno;
    ::syscall(SYS_setresgid, -1, egid, -1);
    return -err;
  }
  // x86-64 clone(flags, stack, parent_tid, child_tid, tls): CLONE_PIDFD stores the pidfd at
  // parent_tid.
  if (pidfd != nullptr) flags |= CLONE_PIDFD;
  long pid = ::syscall(SYS_clone, flags | SIGCHLD, nullptr, pidfd, nullptr, nullptr);
  if (pid == 0) return 0;
  int err = errno;
  // Back to root: with the effective uid 0 again the kernel restores the effective capabilities
  // from the permitted set, which a switch of the effective uid alone never clears.
  ::syscall(SYS_setresuid, -1, euid, -1);
  ::syscall(SYS_setresgid, -1, egid, -1);
  // A change of effective uid makes the process non-dumpable; this process's dumpability is not
  // the box's business.
  if (dumpable > 0) ::prctl(PR_SET_DUMPABLE, dumpable);
  return pid < 0 ? -err : pid;
}

Status WriteIdMaps(pid_t pid, uint32_t base) {
  std::string map = "0 " + std::to_string(base) + " " + std::to_string(kIdRange) + "\n";
  std::string proc = "/proc/" + std::to_string(pid);
  SBX_RETURN_IF_ERROR(WriteFile(proc + "/uid_map", map));
  return WriteFile(proc + "/gid_map", map);
}

Result<UniqueFd> OpenUserNamespace(pid_t pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/ns/user";
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return Status::Errno("open " + path);
  return fd;
}

Result<UniqueFd> DetachedMount(const std::string& path, uint64_t attrs, int userns_fd) {
  UniqueFd fd(static_cast<int>(::syscall(SYS_open_tree, AT_FDCWD, path.c_str(),
                                         OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE)));
  if (!fd) return Status::Errno("open_tree " + path);
  mount_attr attr{};
  attr.attr_set = attrs;
  if (userns_fd >= 0) {
    attr.attr_set |= MOUNT_ATTR_IDMAP;
    attr.userns_fd = static_cast<uint64_t>(userns_fd);
  }
  if (attr.attr_set != 0 && ::syscall(SYS_mount_setattr, fd.get(), "", AT_EMPTY_PATH | AT_RECURSIVE,
                                      &attr, sizeof attr) != 0) {
    return Status::Errno(std::string(userns_fd >= 0 ? "idmap " : "set mount flags of ") + path);
  }
  return fd;
}

Status SendFds(int sock, char byte, const std::vector<int>& fds) {
  if (fds.size() > kMaxSetupFds) return Status::Error("too many descriptors for a box", E2BIG);
  iovec iov{&byte, 1};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char buf[CMSG_SPACE(sizeof(int) * kMaxSetupFds)];
  if (!fds.empty()) {
    msg.msg_control = buf;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n != 1) return Status::Errno("send setup to the box");
  return {};
}

Status ProbeIdmappedLayers(const std::string& scratch, uint32_t base) {
  const std::string lower = scratch + "/layer";
  const std::string fs = scratch + "/fs";
  if (::mkdir(lower.c_str(), 0700) != 0) return Status::Errno("mkdir " + lower);
  SBX_RETURN_IF_ERROR(WriteFile(lower + "/f", "probe", 0600));
  if (::mkdir(fs.c_str(), 0700) != 0) return Status::Errno("mkdir " + fs);
  for (const char* d : {"", "/lower", "/upper", "/work", "/merged"}) {
    std::string p = fs + d;
    if (*d != '\0' && ::mkdir(p.c_str(), 0755) != 0) return Status::Errno("mkdir " + p);
    if (::chown(p.c_str(), base, base) != 0) return Status::Errno("chown " + p);
  }
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    return Status::Errno("socketpair");
  UniqueFd parent_end(sv[0]), child_end(sv[1]);
  long pid = CloneOwnedBy(CLONE_NEWUSER | CLONE_NEWNS, base);
  if (pid < 0) return Status::Error("clone a user namespace", static_cast<int>(-pid));
  if (pid == 0) RunProbeChild(child_end.get());
  child_end.reset();
  struct Reap {
    pid_t pid;
    int status = -1;
    ~Reap() {
      if (status >= 0) return;
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, nullptr, __WALL) < 0 && errno == EINTR) {
      }
    }
  } reap{static_cast<pid_t>(pid)};
  SBX_RETURN_IF_ERROR(WriteIdMaps(reap.pid, base));
  auto userns = OpenUserNamespace(reap.pid);
  if (!userns.ok()) return userns.status();
  auto layer =
      DetachedMount(lower, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, userns->get());
  if (!layer.ok()) return layer.status();
  std::string fs_in_child = "/proc/" + std::to_string(reap.pid) + "/root" + fs;
  UniqueFd fs_fd(::open(fs_in_child.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!fs_fd) return Status::Errno("open " + fs_in_child);
  SBX_RETURN_IF_ERROR(SendFds(parent_end.get(), 'g', {fs_fd.get(), layer->get()}));
  int status = 0;
  while (::waitpid(reap.pid, &status, __WALL) < 0 && errno == EINTR) {
  }
  reap.status = status;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    int step = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return Status::Error(std::string("idmapped layer probe: ") + ProbeStepName(step), ENOTSUP);
  }
  // The copy-up landed in the box's range on the host.
  struct stat st {};
  if (::stat((fs + "/upper/f").c_str(), &st) != 0 || st.st_uid != base)
    return Status::Error("idmapped layer probe: copy-up not owned by the box's root", ENOTSUP);
  return {};
}

namespace {

// One entry of a shifted copy. `links` maps (dev, ino) of already copied files with more than
// one link to their copy, so hard links stay hard links.
Status ShiftEntry(int src_dir, int dst_dir, const char* name, uint32_t base,
                  std::map<std::pair<dev_t, ino_t>, std::string>& links, const std::string& dst,
                  const std::string& what) {
  struct stat st {};
  if (::fstatat(src_dir, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return Status::Errno("stat " + what);
  if (st.st_uid >= kIdRange || st.st_gid >= kIdRange)
    return Status::Error(what + ": owner outside 0..65535 cannot be shifted", EINVAL);
  const uid_t uid = base + st.st_uid;
  const gid_t gid = base + st.st_gid;
  if (S_ISREG(st.st_mode) && st.st_nlink > 1) {
    auto it = links.find({st.st_dev, st.st_ino});
    if (it != links.end()) {
      if (::linkat(AT_FDCWD, it->second.c_str(), dst_dir, name, 0) != 0)
        return Status::Errno("link " + what);
      return {};
    }
    links[{st.st_dev, st.st_ino}] = dst;
  }
  if (S_ISDIR(st.st_mode)) {
    if (::mkdirat(dst_dir, name, 0700) != 0) return Status::Errno("mkdir " + what);
    UniqueFd s(::openat(src_dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    UniqueFd d(::openat(dst_dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!s || !d) return Status::Errno("open " + what);
    DIR* dir = ::fdopendir(::dup(s.get()));
    if (dir == nullptr) return Status::Errno("opendir " + what);
    Status result;
    while (dirent* e = ::readdir(dir)) {
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
      result = ShiftEntry(s.get(), d.get(), e->d_name, base, links, dst + "/" + e->d_name,
                          what + "/" + e->d_name);
      if (!result.ok()) break;
    }
    ::closedir(dir);
    SBX_RETURN_IF_ERROR(result);
  } else if (S_ISREG(st.st_mode)) {
    UniqueFd s(::openat(src_dir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    UniqueFd d(::openat(dst_dir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!s || !d) return Status::Errno("copy " + what);
    for (off_t left = st.st_size; left > 0;) {
      ssize_t n =
          ::copy_file_range(s.get(), nullptr, d.get(), nullptr, static_cast<size_t>(left), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Status::Errno("copy " + what);
      left -= n;
    }
  } else if (S_ISLNK(st.st_mode)) {
    std::string target(static_cast<size_t>(st.st_size) + 1, '\0');
    ssize_t n = ::readlinkat(src_dir, name, target.data(), target.size());
    if (n < 0 || static_cast<size_t>(n) >= target.size()) return Status::Errno("readlink " + what);
    target.resize(static_cast<size_t>(n));
    if (::symlinkat(target.c_str(), dst_dir, name) != 0) return Status::Errno("symlink " + what);
  } else if (S_ISFIFO(st.st_mode)) {
    if (::mkfifoat(dst_dir, name, 0600) != 0) return Status::Errno("mkfifo " + what);
  } else {
    return {};  // devices and sockets are useless in a layer: skipped, as when unpacking
  }
  if (::fchownat(dst_dir, name, uid, gid, AT_SYMLINK_NOFOLLOW) != 0)
    return Status::Errno("chown " + what);
  if (!S_ISLNK(st.st_mode)) {
    // After the chown, which clears set-id bits.
    if (::fchmodat(dst_dir, name, st.st_mode & 07777, 0) != 0)
      return Status::Errno("chmod " + what);
  }
  const timespec times[2] = {st.st_atim, st.st_mtim};
  ::utimensat(dst_dir, name, times, AT_SYMLINK_NOFOLLOW);
  return {};
}

}  // namespace

Result<std::string> ShiftedLayer(const std::string& layer, uint32_t base) {
  const std::string final_dir = layer + ".shift-" + std::to_string(base);
  const std::string root = final_dir + "/root";
  struct stat st {};
  if (::stat(root.c_str(), &st) == 0) return root;
  const std::string tmp = final_dir + ".tmp-" + RandomId(8);
  if (::mkdir(tmp.c_str(), 0700) != 0) return Status::Errno("mkdir " + tmp);
  Status s = [&]() -> Status {
    size_t slash = layer.rfind('/');
    std::string parent = slash == 0 ? "/" : layer.substr(0, slash);
    UniqueFd src(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    UniqueFd dst(::open(tmp.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!src || !dst) return Status::Errno("open " + parent);
    std::string name = layer.substr(slash + 1);
    std::map<std::pair<dev_t, ino_t>, std::string> links;
    SBX_RETURN_IF_ERROR(
        ShiftEntry(src.get(), dst.get(), name.c_str(), base, links, tmp + "/" + name, layer));
    if (::renameat(dst.get(), name.c_str(), dst.get(), "root") != 0)
      return Status::Errno("rename " + tmp + "/" + name);
    return {};
  }();
  // Another process may have built it first: then ours is discarded and theirs used.
  if (s.ok() && ::rename(tmp.c_str(), final_dir.c_str()) != 0 && errno != EEXIST &&
      errno != ENOTEMPTY) {
    s = Status::Errno("rename " + tmp);
  }
  (void)RemoveTree(tmp);  // a leftover temporary copy is never used; only wasted space
  if (!s.ok()) return s.Wrap("shift layer " + layer + " to host ids " + std::to_string(base));
  return root;
}

}  // namespace sbx::runtime
