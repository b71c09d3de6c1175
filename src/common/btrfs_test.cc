// The btrfs wrappers (btrfs.h) on a btrfs filesystem the test makes on a loop device.
#include "common/btrfs.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <unistd.h>

#include <string>

#include "common/fs.h"

namespace sbx::btrfs {
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

// RemoveTree deletes a subvolume whole: a read-only one, which no walk could empty, goes; one
// that holds another is walked and the inner one deleted; a mounted one stays.
TEST_F(BtrfsTest, RemoveTreeDeletesSubvolumesWhole) {
  auto read_only = [](const std::string& vol) {
    return ::system(("btrfs property set -ts " + vol + " ro true").c_str()) == 0;
  };
  const std::string ro = mnt_ + "/ro";
  ASSERT_TRUE(CreateSubvolume(ro).ok());
  ASSERT_TRUE(MakeDirs(ro + "/a/b").ok());
  ASSERT_TRUE(WriteFile(ro + "/a/b/f", "x", 0644).ok());
  ASSERT_TRUE(read_only(ro));
  EXPECT_EQ(::unlink((ro + "/a/b/f").c_str()), -1);  // a walk would stop here (EROFS)
  Status removed = RemoveTree(ro);
  EXPECT_TRUE(removed.ok()) << removed.message();
  EXPECT_NE(::access(ro.c_str(), F_OK), 0);

  // A plain directory holding a read-only subvolume, and a subvolume holding another.
  const std::string dir = mnt_ + "/dir", outer = mnt_ + "/dir/outer";
  ASSERT_TRUE(MakeDirs(dir + "/x").ok());
  ASSERT_TRUE(CreateSubvolume(dir + "/x/ro").ok());
  ASSERT_TRUE(WriteFile(dir + "/x/ro/f", "x", 0644).ok());
  ASSERT_TRUE(read_only(dir + "/x/ro"));
  ASSERT_TRUE(CreateSubvolume(outer).ok());
  ASSERT_TRUE(CreateSubvolume(outer + "/inner").ok());
  ASSERT_TRUE(WriteFile(outer + "/inner/f", "x", 0644).ok());
  ASSERT_TRUE(read_only(outer + "/inner"));
  EXPECT_EQ(DeleteSubvolume(outer).err(), ENOTEMPTY);
  removed = RemoveTree(dir);
  EXPECT_TRUE(removed.ok()) << removed.message();
  EXPECT_NE(::access(dir.c_str(), F_OK), 0);

  // A bind of a subvolume below: a subvolume root, but a mount's too (fs_test has the others).
  const std::string held = mnt_ + "/held", kept = mnt_ + "/kept";
  ASSERT_TRUE(CreateSubvolume(kept).ok());
  ASSERT_TRUE(WriteFile(kept + "/f", "x", 0644).ok());
  ASSERT_TRUE(MakeDirs(held + "/m").ok());
  ASSERT_EQ(::mount(kept.c_str(), (held + "/m").c_str(), nullptr, MS_BIND, nullptr), 0);
  EXPECT_EQ(RemoveTree(held).err(), EBUSY);
  ASSERT_EQ(::umount2((held + "/m").c_str(), 0), 0);
  removed = RemoveTree(held);
  EXPECT_TRUE(removed.ok()) << removed.message();
  EXPECT_EQ(*ReadFile(kept + "/f"), "x");
}

}  // namespace
}  // namespace sbx::btrfs
