#include "common/fd.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>

namespace sbx {

Status WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Errno("write");
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return {};
}

Result<std::string> ReadAll(int fd, size_t limit) {
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Errno("read");
    }
    if (n == 0) break;
    if (out.size() + static_cast<size_t>(n) > limit)
      return Status::Error("read: over limit", EFBIG);
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

Result<std::string> ReadFile(const std::string& path, size_t limit) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return Status::Errno("open " + path);
  auto r = ReadAll(fd.get(), limit);
  if (!r.ok()) return r.status().Wrap(path);
  return r;
}

Status WriteFile(const std::string& path, std::string_view data, int mode) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode));
  if (!fd) return Status::Errno("open " + path);
  Status s = WriteAll(fd.get(), data);
  if (!s.ok()) return s.Wrap(path);
  return {};
}

Status WriteFileAtomic(const std::string& path, std::string_view data, int mode) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode));
  if (!fd) return Status::Errno("open " + tmp);
  Status s = WriteAll(fd.get(), data);
  if (s.ok() && ::fchmod(fd.get(), static_cast<mode_t>(mode)) != 0)
    s = Status::Errno("fchmod " + tmp);
  if (s.ok() && ::fsync(fd.get()) != 0) s = Status::Errno("fsync " + tmp);
  fd.reset();
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) s = Status::Errno("rename " + tmp);
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

}  // namespace sbx
