#include "common/fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

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

// Empties the directory open as `dirfd` (which lives on device `dev`).
Status RemoveContents(int dirfd, dev_t dev, const std::string& path) {
  UniqueFd dup(::fcntl(dirfd, F_DUPFD_CLOEXEC, 0));
  if (!dup) return Status::Errno("dup " + path);
  DIR* dir = ::fdopendir(dup.get());
  if (dir == nullptr) return Status::Errno("opendir " + path);
  dup.release();
  Status result;
  while (dirent* e = ::readdir(dir)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;
      result = Status::Errno("stat " + path + "/" + name);
      break;
    }
    if (S_ISDIR(st.st_mode)) {
      if (st.st_dev != dev) {
        result = Status::Error("remove " + path + "/" + name + ": a mount point", EBUSY);
        break;
      }
      UniqueFd sub(::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!sub) {
        result = Status::Errno("open " + path + "/" + name);
        break;
      }
      result = RemoveContents(sub.get(), dev, path + "/" + name);
      if (!result.ok()) break;
      if (::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
        result = Status::Errno("rmdir " + path + "/" + name);
        break;
      }
    } else if (::unlinkat(dirfd, name.c_str(), 0) != 0 && errno != ENOENT) {
      result = Status::Errno("unlink " + path + "/" + name);
      break;
    }
  }
  ::closedir(dir);
  return result;
}

}  // namespace

Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return {};
    return Status::Errno("stat " + path);
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return Status::Errno("unlink " + path);
    return {};
  }
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) return Status::Errno("open " + path);
  SBX_RETURN_IF_ERROR(RemoveContents(fd.get(), st.st_dev, path));
  if (::rmdir(path.c_str()) != 0 && errno != ENOENT) return Status::Errno("rmdir " + path);
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
