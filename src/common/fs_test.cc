// RemoveTree (fs.h) on trees a box may leave in its writable layer: symlinks out of the tree,
// directories nested thousands deep, wide directories at every depth.
#include "common/fs.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

namespace sbx {
namespace {

class RemoveTreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-fs-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { (void)RemoveTree(dir_); }

  // Nests `depth` directories named `d` under `root` (relative to each other: the whole path is
  // far past PATH_MAX), each holding `files` files and `leaves` directories of one file each.
  static void Nest(const std::string& root, int depth, int files, int leaves) {
    ASSERT_EQ(::mkdir(root.c_str(), 0755), 0);
    int fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    for (int i = 0; i < depth; ++i) {
      for (int f = 0; f < files; ++f) {
        int file =
            ::openat(fd, ("f" + std::to_string(f)).c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
        ASSERT_GE(file, 0);
        ::close(file);
      }
      for (int l = 0; l < leaves; ++l) {
        std::string leaf = "l" + std::to_string(l);
        ASSERT_EQ(::mkdirat(fd, leaf.c_str(), 0755), 0);
        int file = ::openat(fd, (leaf + "/f").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
        ASSERT_GE(file, 0);
        ::close(file);
      }
      ASSERT_EQ(::mkdirat(fd, "d", 0755), 0);
      int sub = ::openat(fd, "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      ASSERT_GE(sub, 0);
      ::close(fd);
      fd = sub;
    }
    ::close(fd);
  }

  std::string dir_;
};

TEST_F(RemoveTreeTest, SymlinksAreRemovedNotFollowed) {
  const std::string outside = dir_ + "/outside", tree = dir_ + "/tree";
  ASSERT_TRUE(MakeDirs(outside + "/keep").ok());
  ASSERT_TRUE(WriteFile(outside + "/keep/f", "x", 0644).ok());
  ASSERT_TRUE(MakeDirs(tree + "/a").ok());
  ASSERT_EQ(::symlink(outside.c_str(), (tree + "/a/dir").c_str()), 0);
  ASSERT_EQ(::symlink((outside + "/keep/f").c_str(), (tree + "/file").c_str()), 0);
  ASSERT_TRUE(RemoveTree(tree).ok());
  EXPECT_NE(::access(tree.c_str(), F_OK), 0);
  EXPECT_EQ(*ReadFile(outside + "/keep/f"), "x");
  // A symlink given as the tree is removed itself.
  ASSERT_EQ(::symlink(outside.c_str(), tree.c_str()), 0);
  ASSERT_TRUE(RemoveTree(tree).ok());
  EXPECT_EQ(*ReadFile(outside + "/keep/f"), "x");
  EXPECT_TRUE(RemoveTree(dir_ + "/missing").ok());
}

// 5,000 levels under a limit of 128 open files: the walk holds at most 65 directories open (a
// recursive one runs out of descriptors near 60 levels here, or of stack far deeper).
TEST_F(RemoveTreeTest, ADeepTreeGoesWithFewDescriptors) {
  const std::string tree = dir_ + "/deep";
  Nest(tree, 5000, 1, 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    rlimit few{128, 128};
    if (::setrlimit(RLIMIT_NOFILE, &few) != 0) ::_exit(2);
    Status s = RemoveTree(tree);
    if (!s.ok()) ::fprintf(stderr, "%s\n", s.message().c_str());
    ::_exit(s.ok() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_NE(::access(tree.c_str(), F_OK), 0);
}

// Wide levels past the ones held open: each is read again from its start on the way back up, and
// everything goes.
TEST_F(RemoveTreeTest, WideLevelsBelowTheHeldOnesAreEmptiedToo) {
  const std::string tree = dir_ + "/wide";
  Nest(tree, 300, 20, 5);
  Status s = RemoveTree(tree);
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_NE(::access(tree.c_str(), F_OK), 0);
}

// A mount below the tree stops the walk; what is mounted there is untouched.
TEST_F(RemoveTreeTest, AMountBelowIsNotWalkedInto) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting needs root";
  const std::string tree = dir_ + "/tree", other = dir_ + "/other";
  ASSERT_TRUE(MakeDirs(tree + "/a/m").ok());
  ASSERT_TRUE(MakeDirs(other).ok());
  ASSERT_TRUE(WriteFile(other + "/f", "x", 0644).ok());
  for (const std::string how : {"tmpfs", "bind"}) {
    if (how == "tmpfs") {
      ASSERT_EQ(::mount("tmpfs", (tree + "/a/m").c_str(), "tmpfs", 0, nullptr), 0);
      ASSERT_TRUE(WriteFile(tree + "/a/m/f", "x", 0644).ok());
    } else {
      ASSERT_EQ(::mount(other.c_str(), (tree + "/a/m").c_str(), nullptr, MS_BIND, nullptr), 0);
    }
    EXPECT_EQ(RemoveTree(tree).err(), EBUSY) << how;
    EXPECT_EQ(::access((tree + "/a/m/f").c_str(), F_OK), 0) << how;
    ASSERT_EQ(::umount2((tree + "/a/m").c_str(), 0), 0);
  }
  EXPECT_EQ(*ReadFile(other + "/f"), "x");
  ASSERT_TRUE(RemoveTree(tree).ok());
}

}  // namespace
}  // namespace sbx
