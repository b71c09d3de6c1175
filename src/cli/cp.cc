// sbx cp: files and directories between the host and a sandbox, like docker cp. Files travel raw
// (GET/PUT .../files), directories as tar streams (GET/PUT .../files/archive) packed and unpacked
// here with libarchive. Nothing is held in memory whole: uploads are chunked from the file or the
// packer, downloads go to a temporary file beside the destination (renamed at the end) or through
// a pipe into the unpacker.
//
// Unpacking on the host never leaves the destination: names with `..` or a leading `/` are
// refused, symlinks in the archive are created but never followed (libarchive's SECURE_* flags),
// owners are not restored and set-id bits are dropped; devices and fifos are skipped.
#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <thread>

#include "cli/verbs.h"
#include "common/fd.h"

namespace sbx::cli {
namespace {

using nlohmann::json;

struct CpFlags {
  ConnectionFlags conn;
  std::string src, dst;
};

// "ID:/path" -> {ID, /path}; a host path otherwise ("./a:b" names a host file with a colon).
struct Location {
  std::string sandbox;  // empty: the host
  std::string path;
};

Location ParseLocation(const std::string& arg) {
  auto colon = arg.find(':');
  auto slash = arg.find('/');
  if (colon == std::string::npos || colon == 0 || (slash != std::string::npos && slash < colon))
    return {"", arg};
  return {arg.substr(0, colon), arg.substr(colon + 1)};
}

std::string BaseName(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  auto slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string Join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string FilesPath(const Location& l, const char* what) {
  return SandboxPath(l.sandbox) + "/files" + what + "?path=" + Q(l.path);
}

// The box entry at `l`: its JSON (type, mode...), or null when there is none.
Result<json> StatInBox(Client& c, const Location& l) {
  auto r = c.Send("GET", FilesPath(l, "/stat"));
  if (!r.ok()) return r.status();
  if (r->status == 404) return json(nullptr);
  if (r->status >= 300) return ApiError(r->status, r->raw);
  return r->body;
}

// ---- libarchive ----

struct ArchiveDeleter {
  void operator()(archive* a) const {
    if (a) archive_free(a);
  }
};
using ArchivePtr = std::unique_ptr<archive, ArchiveDeleter>;
struct EntryDeleter {
  void operator()(archive_entry* e) const { archive_entry_free(e); }
};

Status ArchiveError(const std::string& what, archive* a) {
  const char* msg = archive_error_string(a);
  return Status::Error(what + ": " + (msg ? msg : "libarchive error"));
}

// Writes a tar of `dir`'s contents to `fd`, named "./<prefix>..." ("./" alone for `dir` itself
// when `prefix` is empty). Symlinks are stored, not followed.
Status Pack(const std::string& dir, int fd, const std::string& prefix = "") {
  ArchivePtr disk(archive_read_disk_new()), out(archive_write_new());
  archive_read_disk_set_symlink_physical(disk.get());
  archive_write_set_format_pax_restricted(out.get());
  if (archive_write_open_fd(out.get(), fd) != ARCHIVE_OK)
    return ArchiveError("pack " + dir, out.get());
  if (archive_read_disk_open(disk.get(), dir.c_str()) != ARCHIVE_OK)
    return ArchiveError("read " + dir, disk.get());
  std::string base = dir;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  std::string buf(256 * 1024, '\0');
  for (;;) {
    std::unique_ptr<archive_entry, EntryDeleter> entry(archive_entry_new());
    int r = archive_read_next_header2(disk.get(), entry.get());
    if (r == ARCHIVE_EOF) break;
    if (r < ARCHIVE_WARN) return ArchiveError("read " + dir, disk.get());
    archive_read_disk_descend(disk.get());
    std::string name = archive_entry_pathname(entry.get());
    name = "." + (name.size() > base.size() ? name.substr(base.size()) : std::string());
    if (name.size() > 2 && name[1] == '/' && name[2] == '/') name.erase(1, 1);  // base "/"
    if (!prefix.empty()) name = "./" + prefix + name.substr(1);
    archive_entry_set_pathname(entry.get(), name.c_str());
    mode_t type = archive_entry_filetype(entry.get());
    if (type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK) {
      std::fprintf(stderr, "sbx: cp: skipping %s (not a file, directory or symlink)\n",
                   name.c_str());
      continue;
    }
    if (archive_write_header(out.get(), entry.get()) < ARCHIVE_WARN)
      return ArchiveError("pack " + name, out.get());
    if (type != AE_IFREG) continue;
    for (;;) {
      la_ssize_t n = archive_read_data(disk.get(), buf.data(), buf.size());
      if (n < 0) return ArchiveError("read " + name, disk.get());
      if (n == 0) break;
      if (archive_write_data(out.get(), buf.data(), static_cast<size_t>(n)) < 0)
        return ArchiveError("pack " + name, out.get());
    }
  }
  if (archive_write_close(out.get()) != ARCHIVE_OK) return ArchiveError("pack " + dir, out.get());
  return {};
}

bool SafeName(const std::string& name) {
  if (name.empty() || name[0] == '/') return false;
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string::npos) end = name.size();
    if (name.compare(start, end - start, "..") == 0 && end - start == 2) return false;
    start = end + 1;
  }
  return true;
}

// Unpacks the tar read from `fd` into the existing directory `dir` (see the file comment).
Status Unpack(int fd, const std::string& dir) {
  UniqueFd cwd(::open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!cwd) return Status::Errno("open the current directory");
  if (::chdir(dir.c_str()) != 0) return Status::Errno("chdir " + dir);
  struct Restore {
    int fd;
    ~Restore() { (void)!::fchdir(fd); }
  } restore{cwd.get()};
  ArchivePtr in(archive_read_new()), disk(archive_write_disk_new());
  archive_read_support_format_tar(in.get());
  archive_write_disk_set_options(
      disk.get(), ARCHIVE_EXTRACT_TIME | ARCHIVE_EXTRACT_PERM | ARCHIVE_EXTRACT_SECURE_SYMLINKS |
                      ARCHIVE_EXTRACT_SECURE_NODOTDOT | ARCHIVE_EXTRACT_SECURE_NOABSOLUTEPATHS);
  if (archive_read_open_fd(in.get(), fd, 256 * 1024) != ARCHIVE_OK)
    return ArchiveError("unpack into " + dir, in.get());
  for (;;) {
    archive_entry* entry = nullptr;
    int r = archive_read_next_header(in.get(), &entry);
    if (r == ARCHIVE_EOF) break;
    if (r < ARCHIVE_WARN) return ArchiveError("unpack into " + dir, in.get());
    std::string name = archive_entry_pathname(entry);
    const char* link = archive_entry_hardlink(entry);
    if (!SafeName(name) || (link && !SafeName(link)))
      return Status::Error("unpack into " + dir + ": refusing the entry '" + name +
                           "' (an absolute name or '..')");
    mode_t type = archive_entry_filetype(entry);
    if (!link && type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK) {
      std::fprintf(stderr, "sbx: cp: skipping %s (not a file, directory or symlink)\n",
                   name.c_str());
      continue;
    }
    archive_entry_set_perm(entry, archive_entry_perm(entry) & 0777);
    if (name == "." || name == "./") continue;  // the destination itself: keep its mode
    if (archive_write_header(disk.get(), entry) < ARCHIVE_WARN)
      return ArchiveError("unpack " + name, disk.get());
    const void* block;
    size_t size;
    la_int64_t offset;
    while ((r = archive_read_data_block(in.get(), &block, &size, &offset)) == ARCHIVE_OK)
      if (archive_write_data_block(disk.get(), block, size, offset) < ARCHIVE_WARN)
        return ArchiveError("unpack " + name, disk.get());
    if (r != ARCHIVE_EOF) return ArchiveError("unpack " + name, in.get());
    if (archive_write_finish_entry(disk.get()) < ARCHIVE_WARN)
      return ArchiveError("unpack " + name, disk.get());
  }
  if (archive_write_close(disk.get()) != ARCHIVE_OK)
    return ArchiveError("unpack into " + dir, disk.get());
  return {};
}

// ---- the two directions ----

Result<ApiResponse> UploadFd(Client& c, const std::string& target, int fd) {
  return c.Upload("PUT", target, "application/octet-stream",
                  [fd](char* buf, size_t size) -> Result<size_t> {
                    for (;;) {
                      ssize_t n = ::read(fd, buf, size);
                      if (n >= 0) return static_cast<size_t>(n);
                      if (errno != EINTR) return Status::Errno("read");
                    }
                  });
}

std::string Parent(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  auto slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : p.substr(0, slash);
}

// Who a copy into the box acts as: the owner of the nearest directory on the destination's path
// that exists. A copy into /home/user (or under it) belongs to user, as E2B's and docker's users
// expect of a sandbox whose default user owns its home; a copy into /tmp or /etc stays root's.
struct Owner {
  int64_t uid = 0, gid = 0;
  std::string dir;  // the directory found
};

Result<Owner> OwnerFor(Client& c, const Location& dir, const json& known) {
  Location l = dir;
  json entry = known;
  for (int depth = 0; depth < 256; ++depth) {
    if (entry.is_null()) {
      auto st = StatInBox(c, l);
      if (!st.ok()) return st.status();
      entry = std::move(*st);
    }
    if (entry.is_object() && entry.value("type", "") == "dir")
      return Owner{entry.value("uid", int64_t{0}), entry.value("gid", int64_t{0}), l.path};
    if (entry.is_object()) return Status::Error(l.sandbox + ":" + l.path + ": not a directory");
    if (l.path == "/" || l.path.empty() || l.path[0] != '/') return Owner{};
    l.path = Parent(l.path);
    entry = nullptr;
  }
  return Owner{};
}

std::string OwnerQuery(const Owner& o) {
  if (o.uid == 0 && o.gid == 0) return "";
  return "&uid=" + std::to_string(o.uid) + "&gid=" + std::to_string(o.gid);
}

// Runs the box's tar as the owner (by uid: the box's own /etc/passwd gives the groups).
std::string UserQuery(const Owner& o) { return o.uid == 0 ? "" : "&user=" + std::to_string(o.uid); }

// Streams `fd` (a tar) into the existing box directory `dir` as `owner`.
int UploadArchive(Client& c, const Location& dir, const Owner& owner, int fd) {
  auto res = UploadFd(c, FilesPath(dir, "/archive") + UserQuery(owner), fd);
  if (!res.ok()) return Fail(res.status());
  if (res->status >= 300) return Fail(ApiError(res->status, res->raw));
  return 0;
}

int HostToBox(Client& c, const std::string& src, Location dst) {
  bool from_stdin = src == "-";
  struct stat st;
  if (!from_stdin && ::stat(src.c_str(), &st) != 0) return Fail(Status::Errno(src));
  // A trailing slash names a directory that must exist, as cp(1) and docker cp: nothing is
  // created under a name the user meant as a directory.
  bool must_be_dir = from_stdin || dst.path.back() == '/';
  auto existing = StatInBox(c, dst);
  if (!existing.ok()) return Fail(existing.status());
  bool is_dir = existing->is_object() && existing->value("type", "") == "dir";
  std::string shown = dst.sandbox + ":" + dst.path;
  if (must_be_dir && existing->is_null())
    return Fail(Status::Error(shown + ": no such directory in the sandbox (cp creates no " +
                              "directory named with a trailing / or given a tar on stdin)"));
  if (must_be_dir && !is_dir) return Fail(Status::Error(shown + ": not a directory"));

  if (from_stdin) {
    auto owner = OwnerFor(c, dst, *existing);
    if (!owner.ok()) return Fail(owner.status());
    return UploadArchive(c, dst, *owner, 0);
  }
  // The directory the copy lands in, and whose it is.
  Location parent{dst.sandbox, is_dir ? dst.path : Parent(dst.path)};
  auto owner = OwnerFor(c, parent, is_dir ? *existing : json(nullptr));
  if (!owner.ok()) return Fail(owner.status());
  if (is_dir) dst.path = Join(dst.path, BaseName(src));

  if (S_ISDIR(st.st_mode)) {
    // Unpacked into the parent under the new name, so the box's tar (running as the owner)
    // makes the directory itself too; the parent must exist, as with docker cp.
    if (owner->dir != parent.path)
      return Fail(Status::Error(dst.sandbox + ":" + parent.path + ": no such directory"));
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return Fail(Status::Errno("pipe"));
    UniqueFd r(p[0]), w(p[1]);
    Status packed;
    std::string name = BaseName(dst.path);
    std::thread packer([&] {
      packed = Pack(src, w.get(), name);
      w.reset();
    });
    auto res = UploadFd(c, FilesPath(parent, "/archive") + UserQuery(*owner), r.get());
    r.reset();  // a packer still writing sees EPIPE and stops
    packer.join();
    if (!res.ok()) return Fail(res.status());
    if (res->status >= 300) return Fail(ApiError(res->status, res->raw));
    if (!packed.ok()) return Fail(packed);
    return 0;
  }
  if (!S_ISREG(st.st_mode)) return Fail(Status::Error(src + ": not a file or directory"));
  UniqueFd fd(::open(src.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return Fail(Status::Errno("open " + src));
  char mode[16];
  std::snprintf(mode, sizeof mode, "%o", st.st_mode & 0777);
  auto res = UploadFd(c, FilesPath(dst, "") + "&mode=" + mode + OwnerQuery(*owner), fd.get());
  if (!res.ok()) return Fail(res.status().Wrap(src));
  if (res->status >= 300) return Fail(ApiError(res->status, res->raw));
  return 0;
}

// A directory to stdout: its tar, as docker cp does (`sbx cp ID:/dir - | tar -t`).
int DirToStdout(Client& c, const Location& src) {
  // The archive route answers an error as JSON before any byte of tar, and a tar from it starts
  // with its first entry's name, "./": the first byte tells which this is, before stdout gets any.
  std::optional<bool> failed;
  std::string error_body;
  Status written;
  auto status = c.Download(FilesPath(src, "/archive"), [&](std::string_view d) {
    if (d.empty()) return true;
    if (!failed) failed = d[0] == '{';
    if (*failed) {
      if (error_body.size() < 4096) error_body.append(d.substr(0, 4096 - error_body.size()));
      return true;
    }
    written = WriteAll(1, d);
    return written.ok();
  });
  if (!status.ok()) return Fail(status.status());
  if (*status >= 300) return Fail(ApiError(*status, error_body));
  if (!written.ok()) return Fail(written.Wrap("stdout"));
  return 0;
}

int BoxToHost(Client& c, const Location& src, std::string dst) {
  auto entry = StatInBox(c, src);
  if (!entry.ok()) return Fail(entry.status());
  if (entry->is_null())
    return Fail(Status::Error(src.sandbox + ":" + src.path + ": no such file or directory"));
  struct stat st;
  bool dst_is_dir = dst != "-" && ::stat(dst.c_str(), &st) == 0 && S_ISDIR(st.st_mode);

  if (entry->value("type", "") == "dir" && dst == "-") return DirToStdout(c, src);
  if (entry->value("type", "") == "dir") {
    if (dst_is_dir) dst = Join(dst, BaseName(src.path));
    if (::mkdir(dst.c_str(), 0755) != 0 && errno != EEXIST) return Fail(Status::Errno(dst));
    if (::stat(dst.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      return Fail(Status::Error(dst + ": exists and is not a directory"));
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return Fail(Status::Errno("pipe"));
    UniqueFd r(p[0]), w(p[1]);
    Result<int> http_status = 0;
    std::thread downloader([&] {
      http_status = c.Download(FilesPath(src, "/archive"),
                               [&](std::string_view d) { return WriteAll(w.get(), d).ok(); });
      w.reset();
    });
    Status unpacked = Unpack(r.get(), dst);
    r.reset();  // a downloader still writing sees EPIPE and stops
    downloader.join();
    if (!http_status.ok()) return Fail(http_status.status());
    if (*http_status >= 300)
      return Fail(Status::Error(src.sandbox + ":" + src.path + ": the daemon refused (HTTP " +
                                std::to_string(*http_status) + ")"));
    if (!unpacked.ok()) return Fail(unpacked);
    return 0;
  }

  // A file: into a temporary file beside the destination, renamed over it at the end, so a
  // failure never leaves half a file (or an error message) under the destination's name.
  if (dst_is_dir) dst = Join(dst, BaseName(src.path));
  std::string tmp;
  UniqueFd out;
  if (dst == "-") {
    out.reset(::dup(1));
  } else {
    auto slash = dst.rfind('/');
    std::string dir = slash == std::string::npos ? "." : dst.substr(0, slash + 1);
    tmp = Join(dir, "." + BaseName(dst) + ".sbx-XXXXXX");
    out.reset(::mkostemp(tmp.data(), O_CLOEXEC));
    if (!out) return Fail(Status::Errno("create a temporary file in " + dir));
  }
  std::string error_body;
  Status written;
  auto status = c.Download(FilesPath(src, ""), [&](std::string_view d) {
    written = WriteAll(out.get(), d);
    if (error_body.size() < 4096) error_body.append(d.substr(0, 4096 - error_body.size()));
    return written.ok();
  });
  auto cleanup = [&] {
    if (!tmp.empty()) ::unlink(tmp.c_str());
  };
  if (!status.ok()) {
    cleanup();
    return Fail(status.status());
  }
  if (*status >= 300) {
    cleanup();
    return Fail(ApiError(*status, error_body));
  }
  if (!written.ok()) {
    cleanup();
    return Fail(written.Wrap(dst));
  }
  if (!tmp.empty()) {
    ::fchmod(out.get(), static_cast<mode_t>(entry->value("mode", 0644) & 0777));
    if (::rename(tmp.c_str(), dst.c_str()) != 0) {
      Status s = Status::Errno("rename to " + dst);
      cleanup();
      return Fail(s);
    }
  }
  return 0;
}

int Cp(const GlobalOptions& g, const CpFlags& f) {
  Location src = f.src == "-" ? Location{"", "-"} : ParseLocation(f.src);
  Location dst = f.dst == "-" ? Location{"", "-"} : ParseLocation(f.dst);
  if (src.sandbox.empty() == dst.sandbox.empty())
    return Fail(Status::Error("cp: exactly one of SRC and DST must be ID:/path"));
  if ((src.sandbox.empty() ? dst : src).path.empty())
    return Fail(Status::Error("cp: give a path after ID:"));
  auto c = MakeClient(g, f.conn);
  if (!c.ok()) return Fail(c.status());
  ::signal(SIGPIPE, SIG_IGN);
  return src.sandbox.empty() ? HostToBox(*c, src.path, dst) : BoxToHost(*c, src, dst.path);
}

}  // namespace

void RegisterCpVerb(CLI::App& app, const GlobalOptions& g, ClientVerbs& verbs) {
  auto f = std::make_shared<CpFlags>();
  CLI::App* v = app.add_subcommand(
      "cp", "Copy a file or directory between the host and a sandbox (one side is ID:/path)");
  v->add_option("src", f->src, "Source: a host path (- for a tar on stdin) or ID:/path")
      ->required();
  v->add_option("dst", f->dst,
                "Destination: a host path (- for stdout: a directory as a tar) or ID:/path")
      ->required();
  AddConnectionFlags(v, &f->conn, false);
  v->footer(
      "Like docker cp: into an existing directory, SRC keeps its name; otherwise it becomes DST.\n"
      "DST ending in / must be an existing directory. What is copied into the sandbox belongs\n"
      "to the owner of the directory it lands in (under /home/user: user).\n"
      "Examples: sbx cp ./data ID:/work    sbx cp ID:/work/out.txt .\n"
      "          sbx cp ID:/work - | tar -tv    tar -c . | sbx cp - ID:/work");
  verbs.Add(v, [f, &g] { return Cp(g, *f); });
}

}  // namespace sbx::cli
