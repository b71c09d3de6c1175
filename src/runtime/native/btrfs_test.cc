// The btrfs wrappers (btrfs.h) on a btrfs filesystem the test makes on a loop device.
#include "runtime/native/btrfs.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <unistd.h>

#include <string>

#include "common/fs.h"

namespace sbx::runtime::btrfs {
namespace {

class BtrfsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::system("command -v mkfs.btrfs > /dev/null 2>&1") != 0)
      GTEST_SKIP() << "mkfs.btrfs is missing (make deps installs btrfs-progs)";
    char tmpl[] = "/tmp/sbx-btrfs-unit-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    mnt_ = dir_ + "/mnt";
    ASSERT_EQ(::mkdir(mnt_.c_str(), 0700), 0);
    ASSERT_EQ(::system(("truncate -s 512M " + dir_ + "/img && mkfs.btrfs -q -f " + dir_ +
                        "/img > /dev/null && mount -o loop " + dir_ + "/img " + mnt_)
                           .c_str()),
              0);
    mounted_ = true;
  }
  void TearDown() override {
    if (mounted_) {
      EXPECT_EQ(::umount2(mnt_.c_str(), 0), 0);
    }
    if (!dir_.empty()) (void)RemoveTree(dir_);
  }
  std::string dir_, mnt_;
  bool mounted_ = false;
};

TEST_F(BtrfsTest, SubvolumesSnapshotsAndLimits) {
  EXPECT_TRUE(IsBtrfs(mnt_));
  EXPECT_FALSE(IsBtrfs("/proc"));
  const std::string vol = mnt_ + "/vol", snap = mnt_ + "/snap";
  ASSERT_TRUE(CreateSubvolume(vol).ok());
  EXPECT_EQ(CreateSubvolume(vol).err(), EEXIST);
  EXPECT_TRUE(IsSubvolume(vol));
  EXPECT_FALSE(IsSubvolume(mnt_ + "/nothing"));
  ASSERT_TRUE(WriteFile(vol + "/f", "data\n", 0644).ok());
  EXPECT_FALSE(IsSubvolume(vol + "/f"));

  // Quotas: on twice is fine; a limit stops writes past it with EDQUOT, and comes off again.
  ASSERT_TRUE(EnableQuota(mnt_).ok());
  ASSERT_TRUE(EnableQuota(mnt_).ok());
  ASSERT_TRUE(SetLimit(vol, 1 << 20).ok());
  // Qgroups are counted when a transaction commits.
  int fs = ::open(mnt_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(fs, 0);
  ASSERT_EQ(::syncfs(fs), 0);
  ::close(fs);
  auto u = GetUsage(vol);
  ASSERT_TRUE(u.ok()) << u.status().message();
  EXPECT_EQ(u->limit, 1u << 20);
  EXPECT_GT(u->referenced, 0u);
  Status big = WriteFile(vol + "/big", std::string(4 << 20, 'x'), 0644);
  EXPECT_EQ(big.err(), EDQUOT) << big.message();
  (void)::unlink((vol + "/big").c_str());
  ASSERT_TRUE(SetLimit(vol, 0).ok());
  EXPECT_EQ(GetUsage(vol)->limit, 0u);

  // A snapshot is writable, holds the files, and is a subvolume of its own.
  ASSERT_TRUE(Snapshot(vol, snap).ok());
  EXPECT_TRUE(IsSubvolume(snap));
  EXPECT_EQ(*ReadFile(snap + "/f"), "data\n");
  ASSERT_TRUE(WriteFile(snap + "/g", "more\n", 0644).ok());
  EXPECT_NE(::access((vol + "/g").c_str(), F_OK), 0);

  ASSERT_TRUE(DeleteSubvolume(snap).ok());
  ASSERT_TRUE(DeleteSubvolume(vol).ok());
  EXPECT_NE(::access(vol.c_str(), F_OK), 0);
  EXPECT_EQ(DeleteSubvolume(vol).err(), ENOENT);
  EXPECT_EQ(CreateSubvolume(mnt_ + "/..").err(), EINVAL);
}

}  // namespace
}  // namespace sbx::runtime::btrfs
