#include "runtime/native/disk.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/loop.h>
#include <spawn.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "common/fd.h"

extern char** environ;

namespace sbx::runtime {
namespace {

// Runs mke2fs without a shell; returns its stderr in the error on failure.
Status Format(const std::string& image, uint32_t owner) {
  std::string opts = "root_owner=" + std::to_string(owner) + ":" + std::to_string(owner) +
                     ",lazy_itable_init=1,lazy_journal_init=1,nodiscard";
  const char* argv[] = {"mke2fs", "-q", "-F",         "-t",          "ext4", "-m",
                        "0",      "-E", opts.c_str(), image.c_str(), nullptr};
  int err_pipe[2];
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) return Status::Errno("pipe");
  UniqueFd rd(err_pipe[0]), wr(err_pipe[1]);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, wr.get(), 2);
  pid_t pid;
  int rc = ::posix_spawnp(&pid, "mke2fs", &fa, nullptr, const_cast<char**>(argv), environ);
  posix_spawn_file_actions_destroy(&fa);
  wr.reset();
  if (rc != 0) return Status::Error("run mke2fs (install e2fsprogs)", rc);
  auto err = ReadAll(rd.get(), 1 << 16);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return Status::Error("mke2fs " + image + ": " + (err.ok() ? *err : std::string("failed")), EIO);
  return {};
}

// Attaches `image` to a free loop device with autoclear; returns the device's open fd and path.
Result<std::pair<UniqueFd, std::string>> Attach(const std::string& image) {
  UniqueFd file(::open(image.c_str(), O_RDWR | O_CLOEXEC));
  if (!file) return Status::Errno("open " + image);
  UniqueFd control(::open("/dev/loop-control", O_RDWR | O_CLOEXEC));
  if (!control) return Status::Errno("open /dev/loop-control");
  // Another process may take the free device between GET_FREE and CONFIGURE: retry.
  for (int attempt = 0; attempt < 16; ++attempt) {
    int n = ::ioctl(control.get(), LOOP_CTL_GET_FREE);
    if (n < 0) return Status::Errno("LOOP_CTL_GET_FREE");
    std::string dev = "/dev/loop" + std::to_string(n);
    UniqueFd loop(::open(dev.c_str(), O_RDWR | O_CLOEXEC));
    if (!loop) return Status::Errno("open " + dev);
    loop_config cfg{};
    cfg.fd = static_cast<uint32_t>(file.get());
    cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR;
    std::strncpy(reinterpret_cast<char*>(cfg.info.lo_file_name), image.c_str(), LO_NAME_SIZE - 1);
    if (::ioctl(loop.get(), LOOP_CONFIGURE, &cfg) == 0) return std::make_pair(std::move(loop), dev);
    if (errno != EBUSY) return Status::Errno("LOOP_CONFIGURE " + dev);
  }
  return Status::Error("no free loop device", EBUSY);
}

}  // namespace

Status MountDiskImage(const std::string& image, const std::string& mountpoint, int64_t bytes,
                      uint32_t owner) {
  {
    UniqueFd fd(::open(image.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!fd) return Status::Errno("create " + image);
    // Allocated for real, not sparse: a write the box's filesystem acknowledged can never fail
    // later because the host's disk filled up meanwhile. The free-space check first, so an
    // impossible size is refused without filling the host's disk on the way.
    struct statvfs vfs {};
    if (::fstatvfs(fd.get(), &vfs) != 0) return Status::Errno("statvfs " + image);
    const uint64_t avail = uint64_t{vfs.f_bavail} * vfs.f_frsize;
    if (static_cast<uint64_t>(bytes) > avail) {
      return Status::Error("disk of " + std::to_string(bytes) + " bytes does not fit: " +
                               std::to_string(avail) + " bytes free for " + image,
                           ENOSPC);
    }
    int rc;
    do {
      rc = ::fallocate(fd.get(), 0, 0, bytes);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      if (errno == ENOSPC)
        return Status::Error("allocate " + std::to_string(bytes) + " bytes for " + image +
                                 ": the data directory's filesystem is full",
                             ENOSPC);
      return Status::Errno("allocate " + std::to_string(bytes) + " bytes for " + image);
    }
  }
  SBX_RETURN_IF_ERROR(Format(image, owner));
  auto loop = Attach(image);
  if (!loop.ok()) return loop.status();
  // Mounting takes a reference; the autoclear device goes away once the last mount does, even if
  // this process dies right after. Our descriptor is closed on return either way.
  if (::mount(loop->second.c_str(), mountpoint.c_str(), "ext4", MS_NOSUID | MS_NODEV, "") != 0)
    return Status::Errno("mount " + loop->second + " on " + mountpoint);
  return {};
}

Result<UniqueFd> MountDetached(const std::string& dev) {
  UniqueFd fs(static_cast<int>(::syscall(SYS_fsopen, "ext4", FSOPEN_CLOEXEC)));
  if (!fs) return Status::Errno("fsopen ext4");
  if (::syscall(SYS_fsconfig, fs.get(), FSCONFIG_SET_STRING, "source", dev.c_str(), 0) != 0 ||
      ::syscall(SYS_fsconfig, fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0)
    return Status::Errno("mount " + dev);
  UniqueFd mnt(static_cast<int>(
      ::syscall(SYS_fsmount, fs.get(), FSMOUNT_CLOEXEC,
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)));
  if (!mnt) return Status::Errno("fsmount " + dev);
  return mnt;
}

Result<std::string> LoopDeviceOf(const std::string& image) {
  struct stat want {};
  if (::stat(image.c_str(), &want) != 0) return Status::Errno("stat " + image);
  DIR* d = ::opendir("/sys/block");
  if (d == nullptr) return Status::Errno("opendir /sys/block");
  std::string found;
  while (dirent* e = ::readdir(d)) {
    if (std::strncmp(e->d_name, "loop", 4) != 0) continue;
    // The backing file by device and inode, which a renamed or re-created path cannot fake.
    auto dev = ReadFile(std::string("/sys/block/") + e->d_name + "/loop/backing_file", 4096);
    if (!dev.ok()) continue;
    std::string path = *dev;
    while (!path.empty() && path.back() == '\n') path.pop_back();
    struct stat got {};
    if (::stat(path.c_str(), &got) == 0 && got.st_dev == want.st_dev && got.st_ino == want.st_ino) {
      found = std::string("/dev/") + e->d_name;
      break;
    }
  }
  ::closedir(d);
  if (found.empty()) return Status::Error("no loop device holds " + image, ENOENT);
  return found;
}

namespace {

// Sums st_blocks below the directory `dir` (consumed) into *bytes. Every step is relative to an
// fd opened with O_NOFOLLOW, so a box that swaps a directory for a symlink mid-walk only ends
// its own walk early; nothing outside the layer is ever counted. Mount points are not crossed.
void SumBlocks(UniqueFd dir, dev_t dev, int depth, size_t& entries, uint64_t& bytes) {
  DIR* d = ::fdopendir(dir.get());
  if (d == nullptr) return;
  (void)dir.release();  // owned by `d` now
  while (entries > 0) {
    errno = 0;
    struct dirent* e = ::readdir(d);
    if (e == nullptr) break;
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    --entries;
    struct stat st {};
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_dev != dev)
      continue;
    bytes += static_cast<uint64_t>(st.st_blocks) * 512;
    if (S_ISDIR(st.st_mode) && depth < 64) {
      UniqueFd sub(::openat(::dirfd(d), e->d_name,
                            O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NOATIME));
      if (!sub && errno == EPERM)
        sub.reset(::openat(::dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (sub) SumBlocks(std::move(sub), dev, depth + 1, entries, bytes);
    }
  }
  ::closedir(d);
}

}  // namespace

Result<LayerUsage> ImageUsage(int root_fd) {
  struct statvfs vfs {};
  if (::fstatvfs(root_fd, &vfs) != 0) return Status::Errno("statvfs of the box's root");
  LayerUsage u;
  u.total = uint64_t{vfs.f_blocks} * vfs.f_frsize;
  u.used = uint64_t{vfs.f_blocks - vfs.f_bfree} * vfs.f_frsize;
  return u;
}

Result<LayerUsage> DirectoryUsage(const std::string& upper, size_t max_entries) {
  UniqueFd dir(::open(upper.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir) return Status::Errno("open " + upper);
  struct stat st {};
  struct statvfs vfs {};
  if (::fstat(dir.get(), &st) != 0) return Status::Errno("stat " + upper);
  if (::fstatvfs(dir.get(), &vfs) != 0) return Status::Errno("statvfs " + upper);
  LayerUsage u;
  u.total = uint64_t{vfs.f_blocks} * vfs.f_frsize;
  SumBlocks(std::move(dir), st.st_dev, 0, max_entries, u.used);
  return u;
}

}  // namespace sbx::runtime
