#include "runtime/native/layer_copy.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/openat2.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "common/fd.h"
#include "common/fs.h"

namespace sbx::runtime {
namespace {

constexpr int kMaxDepth = 512;
constexpr int64_t kEntryCost = 512;  // what an entry costs beyond its data (as the cache counts)

// What a regular file holds, its holes left out: its size, or its allocated blocks where fewer
// (a sparse file). The cache counts the same (storage::internal::TreeBytes).
int64_t DataBytes(const struct stat& st) {
  return std::min<int64_t>(st.st_size, static_cast<int64_t>(st.st_blocks) * 512);
}

// The names in directory `dir` but "." and "..".
Result<std::vector<std::string>> Names(int dir, const std::string& what) {
  UniqueFd walk(::openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!walk) return Status::Errno("open " + what);
  DIR* d = ::fdopendir(walk.get());
  if (d == nullptr) return Status::Errno("read " + what);
  (void)walk.release();
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
      names.emplace_back(e->d_name);
  }
  ::closedir(d);
  return names;
}

struct Copier {
  int64_t limit = 0;
  int64_t bytes = 0;
  int root = -1;  // the copy's top
  // The directories from `root` down to the one being copied into.
  std::vector<std::string> at;
  // Hard links: the first copy of each (device, inode) with more than one link, as its parent
  // directory (below `root`) and name. Paths, not descriptors: a box may hold any number of
  // linked files, and this process's descriptors are every tenant's.
  std::map<std::pair<dev_t, ino_t>, std::pair<std::vector<std::string>, std::string>> links;

  // The copy's directory at `path` below `root`. The copy is this process's alone (a directory
  // root's only, made by it), but it is opened refusing symlinks all the same; one component at a
  // time where the path is longer than the kernel takes in one go.
  UniqueFd OpenCopyDir(const std::vector<std::string>& path) const {
    std::string joined = ".";
    for (const auto& p : path) joined += "/" + p;
    if (joined.size() < PATH_MAX) {
      open_how how{};
      how.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC;
      how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
      return UniqueFd(
          static_cast<int>(::syscall(SYS_openat2, root, joined.c_str(), &how, sizeof how)));
    }
    UniqueFd dir(::fcntl(root, F_DUPFD_CLOEXEC, 0));
    for (const auto& p : path) {
      if (!dir) break;
      dir =
          UniqueFd(::openat(dir.get(), p.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    }
    return dir;
  }

  Status Charge(int64_t n, const std::string& what) {
    bytes += n + kEntryCost;
    if (bytes > limit)
      return Status::Error("copy the writable layer: more than " + std::to_string(limit) +
                               " bytes (at " + what + ")",
                           ENOSPC);
    return {};
  }

  // Extended attributes of `from` onto `to` (both open fds of regular files or directories).
  static Status CopyXattrs(int from, int to, const std::string& what) {
    std::vector<char> names(4096);
    ssize_t n;
    while ((n = ::flistxattr(from, names.data(), names.size())) < 0 && errno == ERANGE)
      names.resize(names.size() * 4);
    if (n < 0) return errno == ENOTSUP ? Status() : Status::Errno("list xattrs of " + what);
    std::vector<char> value(4096);
    for (ssize_t i = 0; i < n;) {
      const char* name = names.data() + i;
      i += static_cast<ssize_t>(std::strlen(name)) + 1;
      ssize_t v;
      while ((v = ::fgetxattr(from, name, value.data(), value.size())) < 0 && errno == ERANGE)
        value.resize(value.size() * 4);
      if (v < 0) return Status::Errno("read xattr " + std::string(name) + " of " + what);
      if (::fsetxattr(to, name, value.data(), static_cast<size_t>(v), 0) != 0)
        return Status::Errno("set xattr " + std::string(name) + " on the copy of " + what);
    }
    return {};
  }

  // Owner, mode (after the owner: chown clears set-id bits), xattrs and times of `st` onto `to`.
  static Status Finish(int from, int to, const struct stat& st, const std::string& what) {
    if (::fchown(to, st.st_uid, st.st_gid) != 0) return Status::Errno("chown the copy of " + what);
    if (::fchmod(to, st.st_mode & 07777) != 0) return Status::Errno("chmod the copy of " + what);
    SBX_RETURN_IF_ERROR(CopyXattrs(from, to, what));
    const struct timespec times[2] = {st.st_atim, st.st_mtim};
    if (::futimens(to, times) != 0) return Status::Errno("set times of the copy of " + what);
    return {};
  }

  // `len` bytes at `at` of `from` into `to` at the same offset: in the kernel where it can,
  // else read and written.
  static Status CopyRange(int from, int to, off_t at, int64_t len, const std::string& what) {
    bool in_kernel = true;
    std::vector<char> buf;
    while (len > 0) {
      ssize_t n = -1;
      if (in_kernel) {
        loff_t in = at, out = at;
        n = ::copy_file_range(from, &in, to, &out, static_cast<size_t>(len), 0);
        if (n < 0 &&
            (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) {
          in_kernel = false;
          continue;
        }
      } else {
        if (buf.empty()) buf.resize(1 << 20);
        n = ::pread(from, buf.data(), std::min<size_t>(buf.size(), static_cast<size_t>(len)), at);
        for (ssize_t off = 0; n > 0 && off < n;) {
          ssize_t w = ::pwrite(to, buf.data() + off, static_cast<size_t>(n - off), at + off);
          if (w < 0 && errno == EINTR) continue;
          if (w < 0) return Status::Errno("write the copy of " + what);
          off += w;
        }
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Status::Errno("copy " + what);
      if (n == 0) break;  // shorter than it was: frozen boxes do not shrink files, but be safe
      at += n;
      len -= n;
    }
    return {};
  }

  // The data of `from` (`size` bytes) into the empty file `to`: cloned where the filesystem can,
  // else its data segments copied and its holes left holes (SEEK_DATA), so that a sparse file
  // (a `truncate -s 100G`, a disk image) costs the copy what it holds, not its size.
  static Status CopyData(int from, int to, int64_t size, const std::string& what) {
    if (size == 0) return {};
    if (::ioctl(to, FICLONE, from) == 0) return {};
    for (off_t at = 0; at < size;) {
      off_t data = ::lseek(from, at, SEEK_DATA);
      if (data < 0 && errno == ENXIO) break;  // a hole to the end
      off_t hole = data < 0 ? -1 : ::lseek(from, data, SEEK_HOLE);
      if (data < 0 || hole < 0) {
        if (errno != EINVAL && errno != EOPNOTSUPP) return Status::Errno("seek in " + what);
        data = at;  // no SEEK_DATA here: the rest is data
        hole = size;
      }
      hole = std::min<off_t>(hole, size);
      SBX_RETURN_IF_ERROR(CopyRange(from, to, data, hole - data, what));
      at = hole;
    }
    if (::ftruncate(to, size) != 0) return Status::Errno("size the copy of " + what);
    return {};
  }

  Status Entry(int src, int dst, const char* name, const std::string& what, int depth) {
    struct stat st {};
    if (::fstatat(src, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return Status::Errno("stat " + what);
    if (S_ISREG(st.st_mode) && st.st_nlink > 1) {
      auto it = links.find({st.st_dev, st.st_ino});
      if (it != links.end()) {
        UniqueFd first = OpenCopyDir(it->second.first);
        if (!first || ::linkat(first.get(), it->second.second.c_str(), dst, name, 0) != 0)
          return Status::Errno("link the copy of " + what);
        return {};
      }
    }
    switch (st.st_mode & S_IFMT) {
      case S_IFDIR: {
        if (depth >= kMaxDepth)
          return Status::Error("copy the writable layer: deeper than " + std::to_string(kMaxDepth) +
                                   " directories at " + what,
                               ELOOP);
        SBX_RETURN_IF_ERROR(Charge(0, what));
        UniqueFd from(::openat(src, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!from) return Status::Errno("open " + what);
        if (::mkdirat(dst, name, 0700) != 0) return Status::Errno("make the copy of " + what);
        UniqueFd to(::openat(dst, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!to) return Status::Errno("open the copy of " + what);
        at.emplace_back(name);
        SBX_RETURN_IF_ERROR(Tree(from.get(), to.get(), what, depth + 1));
        at.pop_back();
        return Finish(from.get(), to.get(), st, what);
      }
      case S_IFREG: {
        SBX_RETURN_IF_ERROR(Charge(DataBytes(st), what));
        UniqueFd from(::openat(src, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
        if (!from) return Status::Errno("open " + what);
        UniqueFd to(
            ::openat(dst, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
        if (!to) return Status::Errno("make the copy of " + what);
        SBX_RETURN_IF_ERROR(CopyData(from.get(), to.get(), st.st_size, what));
        SBX_RETURN_IF_ERROR(Finish(from.get(), to.get(), st, what));
        if (st.st_nlink > 1) links[{st.st_dev, st.st_ino}] = {at, name};
        return {};
      }
      case S_IFLNK: {
        SBX_RETURN_IF_ERROR(Charge(st.st_size, what));
        std::vector<char> target(static_cast<size_t>(st.st_size) + 1);
        ssize_t n = ::readlinkat(src, name, target.data(), target.size());
        if (n < 0) return Status::Errno("read link " + what);
        target[static_cast<size_t>(std::min<ssize_t>(n, st.st_size))] = '\0';
        if (::symlinkat(target.data(), dst, name) != 0)
          return Status::Errno("make the copy of " + what);
        if (::fchownat(dst, name, st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW) != 0)
          return Status::Errno("chown the copy of " + what);
        const struct timespec times[2] = {st.st_atim, st.st_mtim};
        (void)::utimensat(dst, name, times, AT_SYMLINK_NOFOLLOW);
        return {};
      }
      case S_IFCHR:
      case S_IFIFO: {
        // A whiteout (0/0) or a fifo; other devices were never the box's to make.
        if (S_ISCHR(st.st_mode) && st.st_rdev != makedev(0, 0)) return {};
        SBX_RETURN_IF_ERROR(Charge(0, what));
        if (::mknodat(dst, name, st.st_mode & (S_IFMT | 0777), st.st_rdev) != 0)
          return Status::Errno("make the copy of " + what);
        if (::fchownat(dst, name, st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW) != 0)
          return Status::Errno("chown the copy of " + what);
        if (::fchmodat(dst, name, st.st_mode & 07777, 0) != 0)
          return Status::Errno("chmod the copy of " + what);
        return {};
      }
      default:
        return {};  // sockets, block devices: nothing a layer keeps
    }
  }

  Status Tree(int src, int dst, const std::string& what, int depth) {
    auto names = Names(src, what);
    if (!names.ok()) return names.status();
    for (const auto& n : *names)
      SBX_RETURN_IF_ERROR(Entry(src, dst, n.c_str(), what + "/" + n, depth));
    return {};
  }

  // Removes every extended attribute of `fd`.
  static Status DropXattrs(int fd, const std::string& what) {
    std::vector<char> names(4096);
    ssize_t n;
    while ((n = ::flistxattr(fd, names.data(), names.size())) < 0 && errno == ERANGE)
      names.resize(names.size() * 4);
    if (n < 0) return errno == ENOTSUP ? Status() : Status::Errno("list xattrs of " + what);
    for (ssize_t i = 0; i < n;) {
      const char* name = names.data() + i;
      i += static_cast<ssize_t>(std::strlen(name)) + 1;
      if (::fremovexattr(fd, name) != 0 && errno != ENODATA)
        return Status::Errno("drop xattr " + std::string(name) + " of the copy of " + what);
    }
    return {};
  }

  // The entries of the layer directory `src` over the copy `dst` of the layers below it, as
  // overlayfs shows them (ApplyLayerTree).
  Status Apply(int src, int dst, const std::string& what, int depth) {
    auto names = Names(src, what);
    if (!names.ok()) return names.status();
    for (const auto& n : *names) {
      const std::string w = what + "/" + n;
      struct stat up {
      }, below{};
      if (::fstatat(src, n.c_str(), &up, AT_SYMLINK_NOFOLLOW) != 0)
        return Status::Errno("stat " + w);
      const bool has_below = ::fstatat(dst, n.c_str(), &below, AT_SYMLINK_NOFOLLOW) == 0;
      if (!has_below && errno != ENOENT) return Status::Errno("stat the copy of " + w);
      bool hides_below = false;
      if (S_ISDIR(up.st_mode)) {
        UniqueFd from(::openat(src, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!from) return Status::Errno("open " + w);
        const bool opaque = IsOpaqueDir(from.get());
        if (!opaque && has_below && S_ISDIR(below.st_mode)) {
          // Both directories: their entries merge, the upper one's attributes (its xattrs
          // exactly, as overlayfs shows them) and the lower one's opacity.
          if (depth >= kMaxDepth)
            return Status::Error(
                "merge layers: deeper than " + std::to_string(kMaxDepth) + " directories at " + w,
                ELOOP);
          SBX_RETURN_IF_ERROR(Charge(0, w));
          UniqueFd to(::openat(dst, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
          if (!to) return Status::Errno("open the copy of " + w);
          const bool was_opaque = IsOpaqueDir(to.get());
          at.emplace_back(n);
          SBX_RETURN_IF_ERROR(Apply(from.get(), to.get(), w, depth + 1));
          at.pop_back();
          SBX_RETURN_IF_ERROR(DropXattrs(to.get(), w));
          SBX_RETURN_IF_ERROR(Finish(from.get(), to.get(), up, w));
          if (was_opaque)
            SBX_RETURN_IF_ERROR(MarkOpaqueDir(to.get()).Wrap("mark the copy of " + w + " opaque"));
          continue;
        }
        // Over a file, a symlink or a whiteout, overlayfs shows the directory alone: nothing of
        // the layers further down either.
        hides_below = !opaque && has_below;
      }
      // Anything else replaces what was below it: a whiteout stays one (it hides the layers
      // further down), an opaque directory comes whole.
      if (has_below) SBX_RETURN_IF_ERROR(RemoveTreeAt(dst, n, "the copy of " + w));
      SBX_RETURN_IF_ERROR(Entry(src, dst, n.c_str(), w, depth));
      if (hides_below) {
        UniqueFd made(::openat(dst, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!made) return Status::Errno("open the copy of " + w);
        SBX_RETURN_IF_ERROR(MarkOpaqueDir(made.get()).Wrap("mark the copy of " + w + " opaque"));
      }
    }
    return {};
  }
};

// A name for a directory in `dir` that nothing there has, nor in `also` (-1: none).
std::string FreeName(int dir, int also) {
  struct stat st {};
  for (int i = 0;; ++i) {
    std::string name = ".sbx-upper." + std::to_string(i);
    if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 &&
        (also < 0 || ::fstatat(also, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0))
      return name;
  }
}

// Moves every entry of `from` (but `except`) into `to`, by rename: one filesystem, one
// subvolume.
Status MoveEntries(int from, int to, const std::string& except, const std::string& what) {
  auto names = Names(from, what);
  if (!names.ok()) return names.status();
  for (const auto& n : *names) {
    if (n == except) continue;
    if (::renameat2(from, n.c_str(), to, n.c_str(), RENAME_NOREPLACE) != 0)
      return Status::Errno("move " + what + "/" + n);
  }
  return {};
}

UniqueFd OpenDir(int at, const char* name) {
  return UniqueFd(::openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
}

}  // namespace

Status UpperToLayer(const std::string& dir) {
  UniqueFd root = OpenDir(AT_FDCWD, dir.c_str());
  if (!root) return Status::Errno("open " + dir);
  UniqueFd upper = OpenDir(root.get(), "upper");
  if (!upper) return Status::Errno("open " + dir + "/upper");
  // upper/ steps aside under a name none of its entries has, so each can move up.
  std::string aside = FreeName(root.get(), upper.get());
  if (::renameat2(root.get(), "upper", root.get(), aside.c_str(), RENAME_NOREPLACE) != 0)
    return Status::Errno("rename " + dir + "/upper");
  SBX_RETURN_IF_ERROR(RemoveTree(dir + "/work"));
  SBX_RETURN_IF_ERROR(MoveEntries(upper.get(), root.get(), "", dir + "/upper"));
  struct stat st {};
  if (::fstat(upper.get(), &st) != 0) return Status::Errno("stat " + dir + "/upper");
  SBX_RETURN_IF_ERROR(Copier::Finish(upper.get(), root.get(), st, dir));
  if (::unlinkat(root.get(), aside.c_str(), AT_REMOVEDIR) != 0)
    return Status::Errno("remove " + dir + "/" + aside);
  return {};
}

Status LayerToUpper(const std::string& dir) {
  UniqueFd root = OpenDir(AT_FDCWD, dir.c_str());
  if (!root) return Status::Errno("open " + dir);
  std::string made = FreeName(root.get(), -1);
  if (::mkdirat(root.get(), made.c_str(), 0700) != 0)
    return Status::Errno("mkdir " + dir + "/" + made);
  UniqueFd upper = OpenDir(root.get(), made.c_str());
  if (!upper) return Status::Errno("open " + dir + "/" + made);
  SBX_RETURN_IF_ERROR(MoveEntries(root.get(), upper.get(), made, dir));
  struct stat st {};
  if (::fstat(root.get(), &st) != 0) return Status::Errno("stat " + dir);
  SBX_RETURN_IF_ERROR(Copier::Finish(root.get(), upper.get(), st, dir));
  if (::renameat2(root.get(), made.c_str(), root.get(), "upper", RENAME_NOREPLACE) != 0)
    return Status::Errno("rename " + dir + "/" + made);
  if (::mkdirat(root.get(), "work", 0700) != 0) return Status::Errno("mkdir " + dir + "/work");
  if (::fchown(root.get(), 0, 0) != 0) return Status::Errno("chown " + dir);
  if (::fchmod(root.get(), 0700) != 0) return Status::Errno("chmod " + dir);
  return {};
}

Result<int64_t> CopyLayerTree(int src_dir, const std::string& dest, int64_t limit_bytes) {
  UniqueFd to(::open(dest.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!to) return Status::Errno("open " + dest);
  struct stat st {};
  if (::fstat(src_dir, &st) != 0) return Status::Errno("stat the writable layer");
  Copier c;
  c.limit = limit_bytes;
  c.root = to.get();
  SBX_RETURN_IF_ERROR(c.Tree(src_dir, to.get(), "", 0));
  SBX_RETURN_IF_ERROR(Copier::Finish(src_dir, to.get(), st, "the layer's root"));
  return c.bytes;
}

Result<int64_t> ApplyLayerTree(int upper_dir, const std::string& dest, int64_t limit_bytes) {
  UniqueFd to(::open(dest.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!to) return Status::Errno("open " + dest);
  struct stat st {};
  if (::fstat(upper_dir, &st) != 0) return Status::Errno("stat the upper layer");
  Copier c;
  c.limit = limit_bytes;
  c.root = to.get();
  const bool was_opaque = IsOpaqueDir(to.get());
  SBX_RETURN_IF_ERROR(c.Apply(upper_dir, to.get(), "", 0));
  SBX_RETURN_IF_ERROR(Copier::DropXattrs(to.get(), "the layer's root"));
  SBX_RETURN_IF_ERROR(Copier::Finish(upper_dir, to.get(), st, "the layer's root"));
  if (was_opaque) SBX_RETURN_IF_ERROR(MarkOpaqueDir(to.get()).Wrap("mark the layer's root opaque"));
  return c.bytes;
}

Result<int64_t> MergeLayerDirs(const std::vector<std::string>& layers, const std::string& dest,
                               int64_t limit_bytes) {
  if (layers.empty()) return Status::Error("merge layers: none given", EINVAL);
  int64_t bytes = 0;
  for (size_t i = layers.size(); i-- > 0;) {
    UniqueFd from = OpenDir(AT_FDCWD, layers[i].c_str());
    if (!from) return Status::Errno("open " + layers[i]);
    auto n = i + 1 == layers.size() ? CopyLayerTree(from.get(), dest, limit_bytes - bytes)
                                    : ApplyLayerTree(from.get(), dest, limit_bytes - bytes);
    if (!n.ok()) return n.status();
    bytes += *n;
  }
  return bytes;
}

Result<int64_t> CopyLayerDir(const std::string& src, const std::string& dest, int64_t limit_bytes) {
  UniqueFd from = OpenDir(AT_FDCWD, src.c_str());
  if (!from) return Status::Errno("open " + src);
  return CopyLayerTree(from.get(), dest, limit_bytes);
}

}  // namespace sbx::runtime
