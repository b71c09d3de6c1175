#include "common/fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fd.h"

namespace sbx {

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
