// Test helper: a small tmpfs the test mounts (the tests run as root), to fill to the last byte
// and free again, so the store meets a real full disk (ENOSPC from write(2)). Unmounted on
// destruction, whatever the test did.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "common/fd.h"

namespace sbx::store {

class SmallFs {
 public:
  SmallFs(std::string dir, size_t bytes) : dir_(std::move(dir)) {
    ::mkdir(dir_.c_str(), 0711);
    std::string opts = "size=" + std::to_string(bytes) + ",mode=0711";
    mounted_ = ::mount("tmpfs", dir_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, opts.c_str()) == 0;
    EXPECT_TRUE(mounted_) << "mount tmpfs on " << dir_ << ": " << std::strerror(errno);
  }
  ~SmallFs() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  SmallFs(const SmallFs&) = delete;
  SmallFs& operator=(const SmallFs&) = delete;

  bool mounted() const { return mounted_; }
  // Writes a file until the filesystem has not one byte left.
  void Fill() {
    UniqueFd fd(::open(filler().c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    ASSERT_TRUE(fd) << std::strerror(errno);
    std::string chunk(4096, 'x');
    while (::write(fd.get(), chunk.data(), chunk.size()) > 0) {
    }
    while (::write(fd.get(), chunk.data(), 1) > 0) {
    }
    ASSERT_EQ(errno, ENOSPC);
  }
  void Free() { ASSERT_EQ(::unlink(filler().c_str()), 0) << std::strerror(errno); }

 private:
  std::string filler() const { return dir_ + "/filler"; }
  std::string dir_;
  bool mounted_ = false;
};

}  // namespace sbx::store
