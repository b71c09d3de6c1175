#include "runtime/native/layer_copy.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "common/fd.h"
#include "common/fs.h"

namespace sbx::runtime {
namespace {

class LayerCopyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char t[] = "/tmp/sbx-layer-copy-XXXXXX";
    ASSERT_NE(::mkdtemp(t), nullptr);
    root_ = t;
    src_ = root_ + "/src";
    dst_ = root_ + "/dst";
    ASSERT_EQ(::mkdir(src_.c_str(), 0755), 0);
    ASSERT_EQ(::mkdir(dst_.c_str(), 0700), 0);
  }
  void TearDown() override { (void)RemoveTree(root_); }

  Result<int64_t> Copy(int64_t limit = INT64_MAX) {
    UniqueFd fd(::open(src_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    return CopyLayerTree(fd.get(), dst_, limit);
  }
  static std::string Xattr(const std::string& path, const char* name) {
    char v[64] = {};
    ssize_t n = ::lgetxattr(path.c_str(), name, v, sizeof v);
    return n < 0 ? "" : std::string(v, static_cast<size_t>(n));
  }

  std::string root_, src_, dst_;
};

// Everything an overlay upper directory holds comes across as it was: owners (host ids of a
// box), modes with set-id bits, overlayfs' marks, whiteouts, hard links, symlinks, fifos.
TEST_F(LayerCopyTest, AnUpperDirectoryIsCopiedExactly) {
  ASSERT_EQ(::chown(src_.c_str(), 200000, 200000), 0);
  ASSERT_EQ(::mkdir((src_ + "/opaque").c_str(), 0750), 0);
  ASSERT_EQ(::setxattr((src_ + "/opaque").c_str(), "user.overlay.opaque", "y", 1, 0), 0);
  ASSERT_EQ(::setxattr((src_ + "/opaque").c_str(), "trusted.overlay.opaque", "y", 1, 0), 0);
  ASSERT_TRUE(WriteFile(src_ + "/opaque/suid", std::string(100000, 'x'), 0755).ok());
  ASSERT_EQ(::chown((src_ + "/opaque/suid").c_str(), 201000, 201000), 0);
  ASSERT_EQ(::chmod((src_ + "/opaque/suid").c_str(), 04755), 0);
  ASSERT_EQ(::link((src_ + "/opaque/suid").c_str(), (src_ + "/second-name").c_str()), 0);
  ASSERT_EQ(::mknod((src_ + "/gone").c_str(), S_IFCHR | 0, makedev(0, 0)), 0);  // a whiteout
  ASSERT_EQ(::mknod((src_ + "/null").c_str(), S_IFCHR | 0666, makedev(1, 3)), 0);
  ASSERT_EQ(::mkfifo((src_ + "/fifo").c_str(), 0640), 0);
  ASSERT_EQ(::symlink("/etc/passwd", (src_ + "/link").c_str()), 0);
  ASSERT_EQ(::lchown((src_ + "/link").c_str(), 200005, 200005), 0);
  struct timespec old[2] = {{1000, 0}, {1000, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, (src_ + "/fifo").c_str(), old, 0), 0);

  auto n = Copy();
  ASSERT_TRUE(n.ok()) << n.status().message();
  EXPECT_GE(*n, 100000);
  struct stat st {};
  ASSERT_EQ(::stat(dst_.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 200000u);  // the root's own attributes
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  ASSERT_EQ(::stat((dst_ + "/opaque").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  EXPECT_EQ(Xattr(dst_ + "/opaque", "user.overlay.opaque"), "y");
  EXPECT_EQ(Xattr(dst_ + "/opaque", "trusted.overlay.opaque"), "y");
  ASSERT_EQ(::stat((dst_ + "/opaque/suid").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 04755u);
  EXPECT_EQ(st.st_uid, 201000u);
  EXPECT_EQ(st.st_size, 100000);
  EXPECT_EQ(st.st_nlink, 2u);
  struct stat other {};
  ASSERT_EQ(::stat((dst_ + "/second-name").c_str(), &other), 0);
  EXPECT_EQ(other.st_ino, st.st_ino);
  EXPECT_EQ(*ReadFile(dst_ + "/opaque/suid"), std::string(100000, 'x'));
  ASSERT_EQ(::lstat((dst_ + "/gone").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0));
  EXPECT_NE(::lstat((dst_ + "/null").c_str(), &st), 0) << "a real device is never copied";
  ASSERT_EQ(::lstat((dst_ + "/fifo").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  ASSERT_EQ(::lstat((dst_ + "/link").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  EXPECT_EQ(st.st_uid, 200005u);
  char target[64] = {};
  ASSERT_GT(::readlink((dst_ + "/link").c_str(), target, sizeof target - 1), 0);
  EXPECT_STREQ(target, "/etc/passwd");
  // Nothing was followed out of the tree: the link's target is untouched and not copied.
  EXPECT_NE(::access((dst_ + "/etc").c_str(), F_OK), 0);
}

// A layer larger than the bound, or deeper than the copier goes, is refused with a clear errno.
TEST_F(LayerCopyTest, TooLargeOrTooDeepIsRefused) {
  ASSERT_TRUE(WriteFile(src_ + "/big", std::string(1 << 20, 'b'), 0644).ok());
  auto n = Copy(1 << 19);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().err(), ENOSPC) << n.status().message();

  (void)::unlink((src_ + "/big").c_str());
  (void)RemoveTree(dst_);
  ASSERT_EQ(::mkdir(dst_.c_str(), 0700), 0);
  UniqueFd dir(::open(src_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  for (int i = 0; i < 600; ++i) {
    ASSERT_EQ(::mkdirat(dir.get(), "d", 0755), 0);
    dir.reset(::openat(dir.get(), "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(dir);
  }
  n = Copy();
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().err(), ELOOP) << n.status().message();
}

// A snapshot of a box's writable-layer subvolume (upper/ and work/) becomes a layer and back by
// renames at its top alone; the root takes upper/'s attributes, and entries named as the layout's
// own (upper, work, the name upper/ steps aside under) are the box's files like any other.
// Many hard-linked files, in many directories, some of them past PATH_MAX: the copy links them
// again without holding a descriptor for each (it runs in the daemon, whose descriptors are
// every tenant's): here under a limit of 64 open files, in a child.
TEST_F(LayerCopyTest, HardLinksAreKeptWithoutADescriptorEach) {
  for (int d = 0; d < 50; ++d) {
    std::string dir = src_ + "/d" + std::to_string(d);
    ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
    for (int f = 0; f < 4; ++f) {
      std::string file = dir + "/f" + std::to_string(f);
      ASSERT_TRUE(WriteFile(file, std::to_string(d * 10 + f), 0644).ok());
      ASSERT_EQ(::link(file.c_str(), (src_ + "/l" + std::to_string(d * 10 + f)).c_str()), 0);
    }
  }
  // A file linked between the bottoms of two chains of 20 directories of 250 characters (5 KB
  // of path each): whichever is copied second is linked through a path longer than PATH_MAX.
  auto chain = [&](char c) {
    UniqueFd dir(::open(src_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    for (int i = 0; i < 20 && dir; ++i) {
      const std::string name(250, c);
      EXPECT_EQ(::mkdirat(dir.get(), name.c_str(), 0755), 0);
      dir = UniqueFd(::openat(dir.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    }
    return dir;
  };
  UniqueFd x = chain('x'), y = chain('y');
  ASSERT_TRUE(x && y);
  ASSERT_TRUE(UniqueFd(::openat(x.get(), "deep", O_CREAT | O_WRONLY | O_CLOEXEC, 0644)));
  ASSERT_EQ(::linkat(x.get(), "deep", y.get(), "deep", 0), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    rlimit few{64, 64};
    if (::setrlimit(RLIMIT_NOFILE, &few) != 0) ::_exit(2);
    auto copied = Copy();
    if (!copied.ok()) ::fprintf(stderr, "%s\n", copied.status().message().c_str());
    ::_exit(copied.ok() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  struct stat a {};
  struct stat b {};
  for (int n = 0; n < 500; ++n) {
    if (n % 10 >= 4) continue;
    std::string one = dst_ + "/d" + std::to_string(n / 10) + "/f" + std::to_string(n % 10);
    ASSERT_EQ(::stat(one.c_str(), &a), 0) << one;
    ASSERT_EQ(::stat((dst_ + "/l" + std::to_string(n)).c_str(), &b), 0);
    EXPECT_EQ(a.st_ino, b.st_ino) << one;
    EXPECT_EQ(a.st_nlink, 2u);
    EXPECT_EQ(*ReadFile(one), std::to_string(n));
  }
  UniqueFd xc(::open(dst_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  for (int i = 0; i < 20 && xc; ++i)
    xc = UniqueFd(::openat(xc.get(), std::string(250, 'x').c_str(), O_RDONLY | O_DIRECTORY));
  ASSERT_TRUE(xc);
  ASSERT_EQ(::fstatat(xc.get(), "deep", &b, 0), 0);
  EXPECT_EQ(b.st_nlink, 2u);
}

// A sparse file (a `truncate -s`, a disk image) is copied with its holes: the copy costs what
// the file holds, and counts that, not its size.
TEST_F(LayerCopyTest, ASparseFileKeepsItsHoles) {
  const int64_t size = int64_t{64} << 30;
  {
    UniqueFd f(::open((src_ + "/sparse").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
    ASSERT_TRUE(f);
    ASSERT_EQ(::pwrite(f.get(), "middle", 6, size / 2), 6);
    ASSERT_EQ(::pwrite(f.get(), "end", 3, size - 3), 3);
  }
  auto n = Copy(int64_t{16} << 20);  // far less than its size
  ASSERT_TRUE(n.ok()) << n.status().message();
  EXPECT_LT(*n, 1 << 20);
  struct stat st {};
  ASSERT_EQ(::stat((dst_ + "/sparse").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, size);
  EXPECT_LT(st.st_blocks * 512, 1 << 20);
  UniqueFd c(::open((dst_ + "/sparse").c_str(), O_RDONLY | O_CLOEXEC));
  char got[8] = {};
  ASSERT_EQ(::pread(c.get(), got, 6, size / 2), 6);
  EXPECT_EQ(std::string(got, 6), "middle");
  ASSERT_EQ(::pread(c.get(), got, 3, size - 3), 3);
  EXPECT_EQ(std::string(got, 3), "end");
  ASSERT_EQ(::pread(c.get(), got, 4, 4096), 4);
  EXPECT_EQ(std::string(got, 4), std::string(4, '\0'));
}

TEST_F(LayerCopyTest, AWritableLayerBecomesALayerAndBackAtItsTop) {
  const std::string upper = src_ + "/upper";
  for (const std::string& d : {upper, src_ + "/work", src_ + "/work/work", upper + "/upper",
                               upper + "/.sbx-upper.0", upper + "/work"})
    ASSERT_EQ(::mkdir(d.c_str(), 0755), 0) << d;
  ASSERT_TRUE(WriteFile(upper + "/upper/f", "f", 0644).ok());
  ASSERT_TRUE(WriteFile(upper + "/a", "a", 0600).ok());
  ASSERT_EQ(::chown((upper + "/a").c_str(), 1000, 1000), 0);
  ASSERT_EQ(::chmod(upper.c_str(), 0751), 0);
  ASSERT_EQ(::chown(upper.c_str(), 7, 8), 0);
  ASSERT_EQ(::setxattr(upper.c_str(), "user.overlay.opaque", "y", 1, 0), 0);
  ASSERT_TRUE(UpperToLayer(src_).ok());
  auto names = [](const std::string& dir) {
    std::string out;
    for (const char* n : {"a", "upper", "work", ".sbx-upper.0", ".sbx-upper.1"})
      if (::access((dir + "/" + n).c_str(), F_OK) == 0)
        out += std::string(out.empty() ? "" : " ") + n;
    return out;
  };
  EXPECT_EQ(names(src_), "a upper work .sbx-upper.0");
  EXPECT_EQ(*ReadFile(src_ + "/upper/f"), "f");
  EXPECT_EQ(::access((src_ + "/work/work").c_str(), F_OK), -1) << "overlayfs' work/ was kept";
  struct stat st {};
  ASSERT_EQ(::stat(src_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0751u);
  EXPECT_EQ(st.st_uid, 7u);
  EXPECT_EQ(st.st_gid, 8u);
  EXPECT_EQ(Xattr(src_, "user.overlay.opaque"), "y");
  ASSERT_EQ(::stat((src_ + "/a").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 1000u);
  // Back: everything moves into a new upper/ with the root's attributes, work/ beside it.
  ASSERT_TRUE(LayerToUpper(src_).ok());
  EXPECT_EQ(names(src_), "upper work");
  EXPECT_EQ(names(upper), "a upper work .sbx-upper.0");
  EXPECT_EQ(*ReadFile(upper + "/upper/f"), "f");
  ASSERT_EQ(::stat(upper.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0751u);
  EXPECT_EQ(st.st_uid, 7u);
  EXPECT_EQ(Xattr(upper, "user.overlay.opaque"), "y");
  ASSERT_EQ(::stat((src_ + "/work").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  ASSERT_EQ(::stat(src_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(st.st_uid, 0u);
}

// Runs `sh` (a shell command) in a child with a mount namespace of its own, in a user namespace
// (uid and gid 0 mapped to themselves) with `userns`: where overlayfs is mounted as a box's is,
// with `userxattr`. Returns the shell's exit status.
int InChild(bool userns, const std::string& sh) {
  pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    if (::unshare(CLONE_NEWNS | (userns ? CLONE_NEWUSER : 0)) != 0) ::_exit(100);
    if (userns && (!WriteFile("/proc/self/setgroups", "deny").ok() ||
                   !WriteFile("/proc/self/uid_map", "0 0 1").ok() ||
                   !WriteFile("/proc/self/gid_map", "0 0 1").ok()))
      ::_exit(101);
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) ::_exit(102);
    ::execl("/bin/sh", "sh", "-ec", sh.c_str(), static_cast<char*>(nullptr));
    ::_exit(103);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Two layers a box made, one after the other, on a base (real overlayfs writes them: whiteouts,
// opaque directories, copies up), merged into one: stacked on the base, the merged layer shows
// exactly what the two did, file by file, under the host's mount and under a user namespace's.
TEST_F(LayerCopyTest, MergedLayersShowWhatTheLayersShowed) {
  for (bool userns : {false, true}) {
    SCOPED_TRACE(userns ? "userxattr" : "trusted");
    const std::string t = root_ + (userns ? "/u" : "/t");
    const std::string base = t + "/base", l1 = t + "/l1", l2 = t + "/l2", m = t + "/merged";
    const std::string opts = userns ? "userxattr," : "";
    ASSERT_EQ(InChild(false, "mkdir -p " + t + " && cd " + t +
                                 " && mkdir base l1 l2 merged w1 w2 mnt v1 v2 && cd base && "
                                 "mkdir -p etc d1/sub d2 keep chm && echo one > etc/f1 && "
                                 "echo two > etc/f2 && echo a > d1/a && echo b > d1/sub/b && "
                                 "echo x > d2/x && echo f > file_to_dir && echo k > keep/k"),
              0);
    // The first layer.
    ASSERT_EQ(InChild(userns, "mount -t overlay o -o " + opts + "lowerdir=" + base + ",upperdir=" +
                                  l1 + ",workdir=" + t + "/w1 " + t + "/mnt && cd " + t +
                                  "/mnt && rm etc/f1 && echo mod >> etc/f2 && "
                                  "ln etc/f2 etc/f2link && rm -rf d1 && mkdir d1 && "
                                  "echo new > d1/n && mkdir n1 && echo a > n1/a && "
                                  "rm file_to_dir && mkdir file_to_dir && touch file_to_dir/in && "
                                  "chmod 0700 chm && ln -s target sym && mkfifo fifo && "
                                  "echo k1 > keep/k1"),
              0);
    // The second, over the first.
    ASSERT_EQ(
        InChild(userns, "mount -t overlay o -o " + opts + "lowerdir=" + l1 + ":" + base +
                            ",upperdir=" + l2 + ",workdir=" + t + "/w2 " + t + "/mnt && cd " + t +
                            "/mnt && rm -rf n1 && echo again > etc/f1 && rm d1/n && "
                            "touch d1/m && mkdir d2/y && rm -rf file_to_dir && "
                            "echo now-a-file > file_to_dir && mv d2/x d2/x2 && "
                            "chmod 0711 chm && rm sym && mkdir sym && rm -rf keep && "
                            "mkdir keep && echo 3 > keep/k3"),
        0);
    auto merged = MergeLayerDirs({l2, l1}, m, INT64_MAX);
    ASSERT_TRUE(merged.ok()) << merged.status().message();
    // What the two layers showed, and what the merged one does, on the base.
    const std::string list =
        " && (find . ! -type d -printf '%p %y %m %U:%G %s %n %l\\n' | sort; "
        "find . -type d -printf '%p %y %m %U:%G\\n' | sort; "
        "find . -type f -exec sha256sum {} + | sort)";
    ASSERT_EQ(InChild(userns, "cd " + t + " && mount -t overlay o -o " + opts + "lowerdir=" + l2 +
                                  ":" + l1 + ":" + base + " v1 && mount -t overlay o -o " + opts +
                                  "lowerdir=" + m + ":" + base + " v2 && (cd v1" + list + ") > " +
                                  t + "/v1.txt && (cd v2" + list + ") > " + t + "/v2.txt"),
              0);
    auto was = ReadFile(t + "/v1.txt"), is = ReadFile(t + "/v2.txt");
    ASSERT_TRUE(was.ok() && is.ok());
    EXPECT_NE(was->find("./etc/f1 f 644 0:0 6 1"), std::string::npos) << *was;
    EXPECT_NE(was->find("./file_to_dir f "), std::string::npos) << *was;
    EXPECT_EQ(was->find("./n1"), std::string::npos) << *was;
    EXPECT_NE(was->find("./etc/f2link f 644 0:0 8 2"), std::string::npos) << *was;
    EXPECT_EQ(*is, *was);
  }
}

}  // namespace
}  // namespace sbx::runtime
