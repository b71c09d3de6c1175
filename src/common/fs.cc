#include "common/fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <vector>

#include "common/btrfs.h"
#include "common/fd.h"

namespace sbx {

Status CreatePrivateFile(const std::string& path, std::string_view data) {
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  std::string tmp = dir + "/." + base + ".tmp." + RandomId(12);
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) return Status::Errno("create " + tmp);
  Status s = WriteAll(fd.get(), data);
  if (s.ok() && ::fchmod(fd.get(), 0600) != 0) s = Status::Errno("fchmod " + tmp);
  if (s.ok() && ::fsync(fd.get()) != 0) s = Status::Errno("fsync " + tmp);
  fd.reset();
  if (s.ok() && ::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) != 0) {
    // A filesystem without RENAME_NOREPLACE: link() never replaces either.
    if (errno == EINVAL || errno == ENOSYS) {
      if (::link(tmp.c_str(), path.c_str()) != 0) s = Status::Errno("link " + path);
    } else {
      s = Status::Errno("rename " + tmp + " to " + path);
    }
  }
  ::unlink(tmp.c_str());  // gone after the rename; after link() or a failure, the spare name
  if (!s.ok()) return s;
  UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d && ::fsync(d.get()) != 0) return Status::Errno("fsync " + dir);
  return {};
}

Result<UniqueFd> OpenPrivateFile(const std::string& path, const std::string& what,
                                 const std::string& why, off_t* size) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) {
    if (errno == ELOOP) return Status::Error(what + " " + path + " is a symlink: refused", EPERM);
    return Status::Errno("open " + path);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::Errno("stat " + path);
  if (!S_ISREG(st.st_mode))
    return Status::Error(what + " " + path + " is not a regular file: refused", EINVAL);
  if (st.st_uid != ::geteuid())
    return Status::Error(what + " " + path + " is owned by uid " + std::to_string(st.st_uid) +
                             ", not by this process's user: refused",
                         EPERM);
  if ((st.st_mode & 07777 & ~mode_t{0600}) != 0) {
    return Status::Error(what + " " + path + " has mode " + ModeString(st.st_mode) +
                             ", wider than 0600: refused (" + why +
                             "; make a new one by moving it away)",
                         EPERM);
  }
  if (size) *size = st.st_size;
  return fd;
}

std::string ModeString(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

Status MakeDirs(const std::string& path, int mode) {
  if (path.empty()) return Status::Error("mkdir: empty path", EINVAL);
  for (size_t pos = 1;; ++pos) {
    pos = path.find('/', pos);
    std::string prefix = path.substr(0, pos);
    if (::mkdir(prefix.c_str(), static_cast<mode_t>(mode)) != 0 && errno != EEXIST)
      return Status::Errno("mkdir " + prefix);
    if (pos == std::string::npos) break;
  }
  return {};
}

namespace {

// Whether `name` in `dirfd` is the root of a mount (a bind of a directory of the same filesystem
// too). Where the kernel cannot tell (before 5.8): `otherwise`.
bool IsMountRoot(int dirfd, const char* name, bool otherwise) {
  struct statx stx {};
  const int flags = AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT | (*name ? 0 : AT_EMPTY_PATH);
  if (::statx(dirfd, name, flags, STATX_INO, &stx) != 0 ||
      !(stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT))
    return otherwise;
  return (stx.stx_attributes & STATX_ATTR_MOUNT_ROOT) != 0;
}

// Empties the directory open as `top`, depth first and without recursion: a box may nest its
// directories tens of thousands deep, and its writable layer is removed by this. The directories
// of the kHeld levels nearest `top` stay open and are read on from where they were; deeper ones
// are closed on the way down and reopened on the way back up, through "..", checked against the
// device and inode they were left at, and read again from their start (what they held before the
// directory just removed is gone already). A btrfs subvolume below `top` (a device of its own,
// but not a mount) goes whole, in O(1); one the kernel will not delete that way (it holds
// another) is walked like any directory. A mount below it stops the walk (EBUSY).
Status RemoveContents(int top, const std::string& path) {
  constexpr size_t kHeld = 64;
  struct Level {
    DIR* dir = nullptr;  // null: closed on the way down
    dev_t dev = 0;
    ino_t ino = 0;
    std::string name;  // in the level above
  };
  std::vector<Level> levels;
  auto where = [&](const std::string& name) {
    std::string p = path;
    for (size_t i = 1; i < levels.size(); ++i) p += "/" + levels[i].name;
    return name.empty() ? p : p + "/" + name;
  };
  // Opens directory `fd` as a level (taking `fd`), or says why not.
  auto push = [&](int fd, std::string name) -> Status {
    struct stat st {};
    DIR* dir = nullptr;
    if (fd < 0 || ::fstat(fd, &st) != 0 || (dir = ::fdopendir(fd)) == nullptr) {
      Status s = Status::Errno("open " + where(name));
      if (fd >= 0) ::close(fd);
      return s;
    }
    levels.push_back({dir, st.st_dev, st.st_ino, std::move(name)});
    return {};
  };
  Status result = push(::fcntl(top, F_DUPFD_CLOEXEC, 0), "");
  while (result.ok() && !levels.empty()) {
    const size_t at = levels.size() - 1;
    const int fd = ::dirfd(levels[at].dir);
    std::string down;
    for (;;) {
      errno = 0;
      dirent* e = ::readdir(levels[at].dir);
      if (e == nullptr) {
        if (errno != 0) result = Status::Errno("read " + where(""));
        break;
      }
      std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      struct stat st;
      if (::fstatat(fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) continue;
        result = Status::Errno("stat " + where(name));
        break;
      }
      if (!S_ISDIR(st.st_mode)) {
        if (::unlinkat(fd, name.c_str(), 0) != 0 && errno != ENOENT) {
          result = Status::Errno("unlink " + where(name));
          break;
        }
        continue;
      }
      const bool other_device = st.st_dev != levels[at].dev;
      if (IsMountRoot(fd, name.c_str(), other_device)) {
        result = Status::Error("remove " + where(name) + ": a mount point", EBUSY);
        break;
      }
      if (other_device) {
        UniqueFd sub(::openat(fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!sub || !btrfs::IsSubvolume(st, sub.get())) {
          result = Status::Error("remove " + where(name) + ": another filesystem", EBUSY);
          break;
        }
        if (btrfs::DeleteSubvolumeAt(fd, name, "").ok()) continue;
      }
      down = std::move(name);
      break;
    }
    if (!result.ok()) break;
    if (!down.empty()) {
      int sub = ::openat(fd, down.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      result = push(sub, down);
      if (result.ok() && levels.size() > kHeld + 1) {
        ::closedir(levels[at].dir);
        levels[at].dir = nullptr;
      }
      continue;
    }
    // Empty: up a level, and remove it there.
    if (at == 0) break;
    Level& parent = levels[at - 1];
    if (parent.dir == nullptr) {
      UniqueFd up(::openat(fd, "..", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      struct stat st {};
      if (!up || ::fstat(up.get(), &st) != 0 || st.st_dev != parent.dev ||
          st.st_ino != parent.ino) {
        result = Status::Error("remove " + where("") + ": moved while it was removed", EBUSY);
        break;
      }
      parent.dir = ::fdopendir(up.get());
      if (parent.dir == nullptr) {
        result = Status::Errno("open " + where(".."));
        break;
      }
      up.release();
    }
    const std::string name = levels[at].name;
    ::closedir(levels[at].dir);
    levels.pop_back();
    if (::unlinkat(::dirfd(parent.dir), name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT)
      result = Status::Errno("rmdir " + where(name));
  }
  for (const Level& l : levels)
    if (l.dir != nullptr) ::closedir(l.dir);
  return result;
}

}  // namespace

namespace {
constexpr const char* kOpaqueXattrs[] = {"trusted.overlay.opaque", "user.overlay.opaque"};
}  // namespace

bool IsOpaqueDir(int fd) {
  for (const char* name : kOpaqueXattrs) {
    char v[2];
    if (::fgetxattr(fd, name, v, sizeof v) == 1 && v[0] == 'y') return true;
  }
  return false;
}

Status MarkOpaqueDir(int fd) {
  for (const char* name : kOpaqueXattrs)
    if (::fsetxattr(fd, name, "y", 1, 0) != 0 &&
        (name == kOpaqueXattrs[0] || (errno != ENOTSUP && errno != EOPNOTSUPP)))
      return Status::Errno(std::string("set ") + name);
  return {};
}

Status RemoveTree(const std::string& path) { return RemoveTreeAt(AT_FDCWD, path, path); }

Status RemoveTreeAt(int dir, const std::string& name, const std::string& what) {
  struct stat st;
  if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return {};
    return Status::Errno("stat " + what);
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlinkat(dir, name.c_str(), 0) != 0 && errno != ENOENT)
      return Status::Errno("unlink " + what);
    return {};
  }
  UniqueFd fd(::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) return Status::Errno("open " + what);
  // A btrfs subvolume (a layer of a snapshot, a box's writable layer) goes whole, in O(1).
  if (btrfs::IsSubvolume(st, fd.get()) && !IsMountRoot(fd.get(), "", true) &&
      (dir == AT_FDCWD ? btrfs::DeleteSubvolume(name) : btrfs::DeleteSubvolumeAt(dir, name, what))
          .ok())
    return {};
  SBX_RETURN_IF_ERROR(RemoveContents(fd.get(), what));
  if (::unlinkat(dir, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT)
    return Status::Errno("rmdir " + what);
  return {};
}

Result<std::string> RandomUuid() {
  unsigned char b[16];
  if (::getrandom(b, sizeof b, 0) != static_cast<ssize_t>(sizeof b))
    return Status::Errno("getrandom");
  b[6] = static_cast<unsigned char>((b[6] & 0x0f) | 0x40);
  b[8] = static_cast<unsigned char>((b[8] & 0x3f) | 0x80);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[b[i] >> 4];
    out += kHex[b[i] & 15];
  }
  return out;
}

std::string RandomId(size_t length) {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::string out(length, 'a');
  unsigned char buf[64];
  size_t got = 0;
  while (got < length) {
    ssize_t n = ::getrandom(buf, sizeof buf, 0);
    if (n <= 0) continue;
    for (ssize_t i = 0; i < n && got < length; ++i) {
      if (buf[i] >= 252) continue;  // 252 = 36 * 7: keeps the distribution uniform
      out[got++] = kAlphabet[buf[i] % 36];
    }
  }
  return out;
}

}  // namespace sbx
