// UniqueFd: the one owner of a file descriptor. Closing happens exactly once, in the destructor or
// reset(); release() hands ownership elsewhere. Also small helpers for whole-buffer I/O that retry
// on EINTR and short transfers.
#pragma once

#include <unistd.h>

#include <string>
#include <string_view>
#include <utility>

#include "common/status.h"

namespace sbx {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// Writes all of `data`, retrying on EINTR and short writes.
Status WriteAll(int fd, std::string_view data);
// Reads until EOF (at most `limit` bytes; more is an error).
Result<std::string> ReadAll(int fd, size_t limit = 64 << 20);
// Reads a whole (small) file.
Result<std::string> ReadFile(const std::string& path, size_t limit = 64 << 20);
// Writes a whole file with O_TRUNC (not atomic; use for /proc, /sys and cgroupfs knobs).
Status WriteFile(const std::string& path, std::string_view data, int mode = 0644);
// Writes `data` to a temporary file beside `path`, fsyncs it and renames it over `path`.
Status WriteFileAtomic(const std::string& path, std::string_view data, int mode = 0644);

}  // namespace sbx
