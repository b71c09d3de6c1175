#include "agent/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <vector>

#include "agent/paths.h"
#include "protocol/wire.h"

namespace sbx::agent {
namespace {

using protocol::FileType;
using protocol::Tag;
using protocol::Type;
using protocol::Writer;

constexpr int kMaxRemoveDepth = 512;

int64_t TimeNs(const struct timespec& ts) {
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

FileType TypeOf(mode_t m) {
  if (S_ISREG(m)) return FileType::kFile;
  if (S_ISDIR(m)) return FileType::kDir;
  if (S_ISLNK(m)) return FileType::kSymlink;
  return FileType::kOther;
}

std::string ReadLinkAt(int dirfd, const char* name) {
  char buf[4096];
  ssize_t n = ::readlinkat(dirfd, name, buf, sizeof buf);
  return n < 0 ? std::string() : std::string(buf, static_cast<size_t>(n));
}

// xattr fields for `path`'s attributes named `prefix`…, within kMaxXattrBytes. Only regular files
// and directories can have user xattrs, so nothing else is asked.
void XattrFields(const std::string& path, const struct stat& st, const std::string& prefix,
                 Writer* w) {
  if (prefix.empty() || !(S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))) return;
  std::string names(64 << 10, '\0');  // XATTR_LIST_MAX
  ssize_t n = ::llistxattr(path.c_str(), names.data(), names.size());
  if (n <= 0) return;  // none, unsupported, or gone
  names.resize(static_cast<size_t>(n));
  size_t budget = kMaxXattrBytes;
  std::string value(kMaxXattrBytes, '\0');
  for (size_t pos = 0; pos < names.size();) {
    size_t end = names.find('\0', pos);
    if (end == std::string::npos) end = names.size();
    std::string name = names.substr(pos, end - pos);
    pos = end + 1;
    if (name.compare(0, prefix.size(), prefix) != 0 || name.size() >= budget) continue;
    ssize_t v = ::lgetxattr(path.c_str(), name.c_str(), value.data(), budget - name.size());
    if (v < 0) continue;  // removed meanwhile, or larger than what is left (ERANGE)
    Writer x;
    x.Str(Tag::kName, name).Str(Tag::kData, std::string_view(value.data(), static_cast<size_t>(v)));
    w->Nested(Tag::kXattr, x);
    budget -= name.size() + static_cast<size_t>(v);
  }
}

// The entry's type and mode: its own, or for a followed symlink its target's (`target`).
void EntryFields(const std::string& path, const struct stat& st, const std::string& link,
                 const UserDb& users, const std::string& xattr_prefix, Writer* w,
                 const struct stat* target = nullptr) {
  mode_t mode = target ? target->st_mode : st.st_mode;
  w->Str(Tag::kName, BaseName(path))
      .Str(Tag::kPath, path)
      .Int(Tag::kFileType, static_cast<int64_t>(mode == 0 ? FileType::kOther : TypeOf(mode)))
      .Int(Tag::kSize, st.st_size)
      .Int(Tag::kMode, mode)
      .Int(Tag::kUid, st.st_uid)
      .Int(Tag::kGid, st.st_gid)
      .Str(Tag::kOwner, users.UserName(st.st_uid))
      .Str(Tag::kGroupName, users.GroupName(st.st_gid))
      .Int(Tag::kMtimeNs, TimeNs(st.st_mtim));
  if (S_ISLNK(st.st_mode)) w->Str(Tag::kLinkTarget, link);
  XattrFields(path, st, xattr_prefix, w);
}

// Sorted names of a directory's entries (without . and ..); takes ownership of `fd`.
Status ReadNames(int fd, const std::string& path, std::vector<std::string>* names) {
  DIR* d = ::fdopendir(fd);
  if (!d) {
    int e = errno;
    ::close(fd);
    return Status::Error("opendir " + path, e);
  }
  errno = 0;
  while (struct dirent* de = ::readdir(d)) {
    std::string_view n = de->d_name;
    if (n != "." && n != "..") names->emplace_back(n);
  }
  int e = errno;
  ::closedir(d);
  if (e != 0) return Status::Error("readdir " + path, e);
  std::sort(names->begin(), names->end());
  return {};
}

class ListStream : public Stream {
 public:
  ListStream(uint32_t id, int depth, const UserDb& users, std::string xattr_prefix)
      : id_(id), depth_(depth), users_(users), xattr_prefix_(std::move(xattr_prefix)) {}

  Status Enter(UniqueFd fd, std::string path) {
    Level l;
    l.path = std::move(path);
    UniqueFd keep(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 3));
    if (!keep) return Status::Errno("list " + l.path);
    SBX_RETURN_IF_ERROR(ReadNames(fd.release(), l.path, &l.names));
    l.fd = std::move(keep);
    stack_.push_back(std::move(l));
    return {};
  }

  uint32_t id() const override { return id_; }
  bool Pump(FrameSink& sink) override {
    while (!sink.Full()) {
      if (stack_.empty()) {
        sink.Send(Type::kOk, id_, Writer());
        return true;
      }
      Level& top = stack_.back();
      if (top.next >= top.names.size()) {
        stack_.pop_back();
        continue;
      }
      const std::string& name = top.names[top.next++];
      struct stat st;
      if (::fstatat(top.fd.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone
      std::string path = JoinPath(top.path, name);
      Writer w;
      EntryFields(path, st, S_ISLNK(st.st_mode) ? ReadLinkAt(top.fd.get(), name.c_str()) : "",
                  users_, xattr_prefix_, &w);
      sink.Send(Type::kEntry, id_, w);
      if (S_ISDIR(st.st_mode) && static_cast<int>(stack_.size()) < depth_) {
        UniqueFd sub(
            ::openat(top.fd.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        // An unreadable subdirectory is listed but not entered.
        if (sub) (void)Enter(std::move(sub), std::move(path));
      }
    }
    return false;
  }

 private:
  struct Level {
    UniqueFd fd;
    std::string path;
    std::vector<std::string> names;
    size_t next = 0;
  };
  uint32_t id_;
  int depth_;
  const UserDb& users_;
  std::string xattr_prefix_;
  std::vector<Level> stack_;
};

class ReadStream : public Stream {
 public:
  ReadStream(UniqueFd fd, std::string path, uint32_t id, uint64_t offset, uint64_t length,
             int64_t size)
      : limited_(length != 0),
        fd_(std::move(fd)),
        path_(std::move(path)),
        id_(id),
        offset_(offset),
        remaining_(length),
        size_(size) {}

  uint32_t id() const override { return id_; }
  bool Pump(FrameSink& sink) override {
    std::string buf;
    while (!sink.Full()) {
      size_t want = protocol::kMaxChunk;
      if (remaining_ != 0 && remaining_ < want) want = static_cast<size_t>(remaining_);
      buf.resize(want);
      ssize_t n = ::pread(fd_.get(), buf.data(), want, static_cast<off_t>(offset_));
      if (n < 0) {
        if (errno == EINTR) continue;
        SendError(sink, id_, errno, "read " + path_);
        return true;
      }
      if (n > 0) {
        buf.resize(static_cast<size_t>(n));
        Writer w;
        w.Int(Tag::kOffset, static_cast<int64_t>(offset_)).Str(Tag::kData, buf);
        sink.Send(Type::kData, id_, w);
        offset_ += static_cast<uint64_t>(n);
        if (remaining_ != 0) remaining_ -= static_cast<uint64_t>(n);
      }
      if (n == 0 || (remaining_ == 0 && limited_)) {
        Writer w;
        w.Int(Tag::kSize, size_);
        sink.Send(Type::kOk, id_, w);
        return true;
      }
    }
    return false;
  }

 private:
  bool limited_;  // a length was given: stop when it is used up
  UniqueFd fd_;
  std::string path_;
  uint32_t id_;
  uint64_t offset_;
  uint64_t remaining_;
  int64_t size_;
};

Status EnsureParents(const std::string& dir, uid_t uid, gid_t gid) {
  return MakeDir(dir, 0755, uid, gid, true);
}

// Applies owner when it differs: a non-root agent (tests) cannot chown, and need not.
int ChownIfNeeded(int fd, uid_t uid, gid_t gid) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return errno;
  if (st.st_uid == uid && st.st_gid == gid) return 0;
  return ::fchown(fd, uid, gid) == 0 ? 0 : errno;
}

// Removes `name` in `dirfd`, recursing into directories without following symlinks.
int RemoveAt(int dirfd, const char* name, int depth) {
  if (::unlinkat(dirfd, name, 0) == 0) return 0;
  if (errno != EISDIR && errno != EPERM) return errno;
  if (depth > kMaxRemoveDepth) return ELOOP;
  int fd = ::openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errno == ENOTDIR ? EPERM : errno;
  DIR* d = ::fdopendir(fd);
  if (!d) {
    int e = errno;
    ::close(fd);
    return e;
  }
  int first_err = 0;
  std::vector<std::string> names;
  while (struct dirent* de = ::readdir(d)) {
    std::string_view n = de->d_name;
    if (n != "." && n != "..") names.emplace_back(n);
  }
  for (const auto& n : names) {
    int e = RemoveAt(::dirfd(d), n.c_str(), depth + 1);
    if (e != 0 && e != ENOENT && first_err == 0) first_err = e;
  }
  ::closedir(d);
  if (::unlinkat(dirfd, name, AT_REMOVEDIR) != 0 && first_err == 0) first_err = errno;
  return first_err;
}

}  // namespace

void SendError(FrameSink& sink, uint32_t id, int err, const std::string& message) {
  Writer w;
  w.Int(Tag::kErrno, err).Str(Tag::kMessage, message);
  sink.Send(Type::kError, id, w);
}

Status CheckXattrs(const Xattrs& xattrs) {
  size_t total = 0;
  for (const auto& [name, value] : xattrs) {
    if (name.rfind("user.", 0) != 0 || name.size() <= 5 || name.size() > kMaxXattrName ||
        name.find('\0') != std::string::npos)
      return Status::Error("xattr name '" + name + "': not a user.* name of at most 255 bytes",
                           EINVAL);
    total += name.size() + value.size();
  }
  if (total > kMaxXattrBytes)
    return Status::Error("xattrs: " + std::to_string(total) + " bytes, more than 16384", EINVAL);
  return {};
}

Status StatEntry(const std::string& path, const UserDb& users, const std::string& xattr_prefix,
                 Writer* w, bool follow) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return Status::Errno("stat " + path);
  std::string link;
  if (!S_ISLNK(st.st_mode)) {
    EntryFields(path, st, link, users, xattr_prefix, w);
    return {};
  }
  if (!follow) {
    link = ReadLinkAt(AT_FDCWD, path.c_str());
    EntryFields(path, st, link, users, xattr_prefix, w);
    return {};
  }
  // As Go's filepath.EvalSymlinks then os.Stat (envd): a link that does not resolve (dangling,
  // a loop, too deep) names itself, and its type is unknown.
  struct stat target {};
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) != nullptr && ::stat(resolved, &target) == 0) {
    link = resolved;
  } else {
    link = path;
    target = {};
  }
  EntryFields(path, st, link, users, xattr_prefix, w, &target);
  return {};
}

Result<std::unique_ptr<Stream>> StartList(const std::string& path, int64_t depth, uint32_t id,
                                          const UserDb& users, std::string xattr_prefix) {
  int d = depth <= 0                        ? 1
          : depth > protocol::kMaxListDepth ? static_cast<int>(protocol::kMaxListDepth)
                                            : static_cast<int>(depth);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return Status::Errno("list " + path);
  auto s = std::make_unique<ListStream>(id, d, users, std::move(xattr_prefix));
  SBX_RETURN_IF_ERROR(s->Enter(std::move(fd), path));
  return std::unique_ptr<Stream>(std::move(s));
}

Result<std::unique_ptr<Stream>> StartRead(const std::string& path, int64_t offset, int64_t length,
                                          uint32_t id) {
  if (offset < 0 || length < 0) return Status::Error("read " + path, EINVAL);
  // O_NONBLOCK so that opening a FIFO cannot hang the agent; only regular files are read.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
  if (!fd) return Status::Errno("read " + path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::Errno("read " + path);
  if (S_ISDIR(st.st_mode)) return Status::Error("read " + path, EISDIR);
  if (!S_ISREG(st.st_mode)) return Status::Error("read " + path + ": not a regular file", EINVAL);
  auto s = std::make_unique<ReadStream>(std::move(fd), path, id, static_cast<uint64_t>(offset),
                                        static_cast<uint64_t>(length), st.st_size);
  return std::unique_ptr<Stream>(std::move(s));
}

Status MakeDir(const std::string& path, mode_t mode, uid_t uid, gid_t gid, bool parents) {
  if (!parents) {
    if (::mkdir(path.c_str(), 0700) != 0) return Status::Errno("mkdir " + path);
  } else {
    // Walk down from "/", creating what is missing.
    size_t pos = 1;
    for (;;) {
      size_t slash = path.find('/', pos);
      std::string prefix = slash == std::string::npos ? path : path.substr(0, slash);
      bool last = slash == std::string::npos;
      if (prefix.size() > 1) {
        if (::mkdir(prefix.c_str(), last ? 0700 : 0755) == 0) {
          if (!last) {
            UniqueFd fd(::open(prefix.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
            if (fd) {
              ::fchmod(fd.get(), 0755);
              if (int e = ChownIfNeeded(fd.get(), uid, gid))
                return Status::Error("chown " + prefix, e);
            }
          } else {
            break;  // created the target itself; finish below
          }
        } else if (errno == EEXIST) {
          struct stat st;
          if (::stat(prefix.c_str(), &st) != 0) return Status::Errno("mkdir " + prefix);
          if (!S_ISDIR(st.st_mode)) return Status::Error("mkdir " + prefix, ENOTDIR);
          if (last) return {};  // already there: not an error with parents
        } else {
          return Status::Errno("mkdir " + prefix);
        }
      }
      if (last) break;
      pos = slash + 1;
    }
  }
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) return Status::Errno("mkdir " + path);
  if (::fchmod(fd.get(), mode & 07777) != 0) return Status::Errno("chmod " + path);
  if (int e = ChownIfNeeded(fd.get(), uid, gid)) return Status::Error("chown " + path, e);
  return {};
}

Status MovePath(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) return Status::Errno("move " + from + " to " + to);
  return {};
}

Status RemovePath(const std::string& path, bool recursive) {
  if (path == "/") return Status::Error("remove /", EBUSY);
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return Status::Errno("remove " + path);
  if (!S_ISDIR(st.st_mode)) {
    if (::unlink(path.c_str()) != 0) return Status::Errno("remove " + path);
    return {};
  }
  if (!recursive) {
    if (::rmdir(path.c_str()) != 0) return Status::Errno("remove " + path);
    return {};
  }
  UniqueFd parent(::open(DirName(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!parent) return Status::Errno("remove " + path);
  std::string base = BaseName(path);
  if (int e = RemoveAt(parent.get(), base.c_str(), 0)) return Status::Error("remove " + path, e);
  return {};
}

Result<std::unique_ptr<PendingWrite>> PendingWrite::Begin(const std::string& path, mode_t mode,
                                                          uid_t uid, gid_t gid, bool parents,
                                                          Xattrs xattrs) {
  if (path == "/") return Status::Error("write /", EISDIR);
  if (Status s = CheckXattrs(xattrs); !s.ok())
    return Status::Error("write " + path + ": " + s.what(), EINVAL);
  std::string dir = DirName(path);
  if (parents) SBX_RETURN_IF_ERROR(EnsureParents(dir, uid, gid));
  std::unique_ptr<PendingWrite> w(new PendingWrite());
  w->path_ = path;
  w->xattrs_ = std::move(xattrs);
  w->temp_ = JoinPath(dir, "." + BaseName(path) + ".sbx-XXXXXX");
  int fd = ::mkostemp(w->temp_.data(), O_CLOEXEC);
  if (fd < 0) {
    w->done_ = true;
    return Status::Errno("write " + path);
  }
  w->fd_.reset(fd);
  w->mode_ = mode & 07777;
  w->uid_ = uid;
  w->gid_ = gid;
  return w;
}

PendingWrite::~PendingWrite() {
  if (!done_) ::unlink(temp_.c_str());
}

void PendingWrite::Append(std::string_view data) {
  while (error_ == 0 && !data.empty()) {
    ssize_t n = ::write(fd_.get(), data.data(), data.size());
    if (n < 0) {
      if (errno != EINTR) error_ = errno;
      continue;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
}

Status PendingWrite::Finish() {
  std::string what = "write " + path_;
  if (error_ != 0) return Status::Error(what, error_);
  if (::fsync(fd_.get()) != 0) return Status::Errno(what + ": fsync");
  if (::fchmod(fd_.get(), mode_) != 0) return Status::Errno(what + ": chmod");
  if (int e = ChownIfNeeded(fd_.get(), uid_, gid_)) return Status::Error(what + ": chown", e);
  for (const auto& [name, value] : xattrs_) {
    if (::fsetxattr(fd_.get(), name.c_str(), value.data(), value.size(), 0) == 0) continue;
    if (errno == ENOTSUP) break;  // the filesystem keeps no xattrs: the entry shows none
    return Status::Errno(what + ": set " + name);
  }
  if (::rename(temp_.c_str(), path_.c_str()) != 0) return Status::Errno(what + ": rename");
  done_ = true;
  fd_.reset();
  return {};
}

}  // namespace sbx::agent
