// The Builder of build.h. A build walks its steps with the image so far: the layer ids (topmost
// first), the host binds of its base (the host template's /usr) and the ImageConfig. Every step
// that changes files becomes one layer named by its cache key:
//   RUN      a box of the layers so far runs the command through its agent; the box's writable
//            layer is taken out as it is destroyed (Runtime::DestroyKeepingUpper) and becomes
//            the layer (AddLayerFromDir shifts the box's host ids back down).
//   COPY     the context's files are copied into a staging directory (fd-relative both sides, so
//            no symlink in the context or in what an earlier source made can lead outside), under
//            copies of the destination's parent directories as the layers so far have them.
//   WORKDIR  a layer only when the directory is missing from the layers so far.
// The cache key hashes the parent layer, the image state a step sees (env, ARGs, user, workdir),
// the instruction and, for COPY, what was copied: an unchanged step finds its layer recorded.
//
// Leftovers of a killed builder: its boxes (owner "build") are removed by the next Run's
// ReapOrphans, its staging directories and its layers' pins (a PinLease) by the cache's sweep.
#include "sandbox/build.h"

#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <linux/openat2.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <deque>
#include <set>
#include <thread>

#include "common/encoding.h"
#include "common/fd.h"
#include "common/fs.h"
#include "common/thread_annotations.h"
#include "protocol/client.h"
#include "sandbox/session.h"
#include "storage/registry.h"

namespace sbx::sandbox {
namespace {

using storage::BuildStep;
using Kind = BuildStep::Kind;
using protocol::Tag;
using protocol::Type;

constexpr int kMaxCopyDepth = 256;
constexpr size_t kMaxLineBytes = 8192;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Whether a build's policy lets anything out (a policy that allows nothing is taken as none, as
// a create's is on a daemon without networking).
bool Networked(const BuildSpec& spec) {
  const network::Policy& p = spec.network;
  return p.mode == network::Mode::kOpen ||
         (p.mode == network::Mode::kAllowlist && !p.allow.empty());
}

// The part of a layer id people read: "build-<hex>" -> 12 hex digits.
std::string ShortId(const std::string& id) {
  size_t dash = id.find('-');
  std::string tail = dash == std::string::npos ? id : id.substr(dash + 1);
  return tail.substr(0, 12);
}

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
    EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr);
  }
  void Raw(std::string_view s) { EVP_DigestUpdate(ctx_.get(), s.data(), s.size()); }
  // Length-prefixed, so that fields cannot run into each other.
  void Field(std::string_view s) {
    std::string n = std::to_string(s.size()) + ":";
    Raw(n);
    Raw(s);
  }
  std::string Hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx_.get(), md, &len);
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (unsigned i = 0; i < len; ++i) {
      out += digits[md[i] >> 4];
      out += digits[md[i] & 15];
    }
    return out;
  }

 private:
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx_;
};

// Lexically cleaned components of an absolute path; nullopt when ".." would climb above the
// root (for COPY sources: outside the context).
std::optional<std::vector<std::string>> Components(const std::string& path, bool clamp_at_root) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (i <= path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    std::string part = path.substr(i, j - i);
    if (part == "..") {
      if (parts.empty()) {
        if (!clamp_at_root) return std::nullopt;
      } else {
        parts.pop_back();
      }
    } else if (!part.empty() && part != ".") {
      parts.push_back(std::move(part));
    }
    i = j + 1;
  }
  return parts;
}

std::string Join(const std::vector<std::string>& parts, size_t n) {
  std::string out;
  for (size_t i = 0; i < n && i < parts.size(); ++i) out += "/" + parts[i];
  return out.empty() ? "/" : out;
}

// ---- the union of the layers so far, as overlayfs would show it ----

bool IsWhiteout(const struct stat& st) { return S_ISCHR(st.st_mode) && st.st_rdev == 0; }

bool IsOpaque(const std::string& path) {
  char v[4];
  for (const char* name : {"trusted.overlay.opaque", "user.overlay.opaque"}) {
    ssize_t n = ::lgetxattr(path.c_str(), name, v, sizeof v);
    if (n == 1 && v[0] == 'y') return true;
  }
  return false;
}

struct MergedEntry {
  bool exists = false;
  struct stat st {};
  std::string host_path;  // in the layer that shows it
};

// The entry at `parts` in the union of `layer_dirs` (topmost first), following no symlink: a
// directory's attributes come from the topmost layer that has it, a whiteout hides what is
// below, an opaque directory ends the layers below. A symlink or file in the middle of the path
// ends the walk: `exists` false, `st` that entry's (ENOTDIR for the caller to report).
Result<MergedEntry> LookupMerged(const std::vector<std::string>& layer_dirs,
                                 const std::vector<std::string>& parts, size_t n) {
  std::vector<std::string> contributing = layer_dirs;
  MergedEntry e;
  if (n == 0) {
    // The root: every layer has one.
    if (layer_dirs.empty() || ::lstat(layer_dirs[0].c_str(), &e.st) != 0) return e;
    e.exists = true;
    e.host_path = layer_dirs[0];
    return e;
  }
  std::string rel;
  for (size_t k = 0; k < n; ++k) {
    rel += "/" + parts[k];
    std::vector<std::string> next;
    bool found = false;
    for (const auto& layer : contributing) {
      std::string p = layer + rel;
      struct stat st {};
      if (::lstat(p.c_str(), &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR) continue;
        return Status::Errno("lstat " + p);
      }
      if (!found) {
        found = true;
        if (IsWhiteout(st)) return MergedEntry{};
        e.st = st;
        e.host_path = p;
        if (!S_ISDIR(st.st_mode)) {
          if (k + 1 < n) return Status::Error(Join(parts, k + 1) + " is not a directory", ENOTDIR);
          e.exists = true;
          return e;
        }
      }
      if (!S_ISDIR(st.st_mode)) break;  // a lower file under the directory: hidden, and so is below
      next.push_back(layer);
      if (IsOpaque(p)) break;
    }
    if (!found) return MergedEntry{};
    contributing = std::move(next);
  }
  e.exists = true;
  return e;
}

// ---- user and group names of the image ----

Result<std::string> ReadMergedFile(const std::vector<std::string>& layer_dirs,
                                   const std::string& path) {
  auto parts = Components(path, true);
  auto e = LookupMerged(layer_dirs, *parts, parts->size());
  if (!e.ok() || !e->exists || !S_ISREG(e->st.st_mode)) return std::string();
  UniqueFd fd(::open(e->host_path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) return Status::Errno("open " + path + " of the image");
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t r = ::read(fd.get(), buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::Errno("read " + path + " of the image");
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
    if (out.size() > (size_t{4} << 20))
      return Status::Error(path + " of the image is too large", EFBIG);
  }
  return out;
}

std::optional<uint32_t> Number(const std::string& s) {
  if (s.empty() || s.size() > 9) return std::nullopt;
  uint32_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint32_t>(c - '0');
  }
  return v;
}

// name:x:uid:gid... from /etc/passwd (field 2, 3) or name:x:gid from /etc/group (field 2).
std::optional<std::pair<uint32_t, uint32_t>> FindEntry(const std::string& file,
                                                       const std::string& name) {
  size_t pos = 0;
  while (pos < file.size()) {
    size_t end = file.find('\n', pos);
    if (end == std::string::npos) end = file.size();
    std::string line = file.substr(pos, end - pos);
    pos = end + 1;
    std::vector<std::string> f;
    size_t s = 0;
    for (size_t c = line.find(':'); f.size() < 4; c = line.find(':', s)) {
      f.push_back(line.substr(s, c == std::string::npos ? std::string::npos : c - s));
      if (c == std::string::npos) break;
      s = c + 1;
    }
    if (f.size() >= 3 && f[0] == name) {
      auto a = Number(f[2]);
      // /etc/group has no 4th id field (its members follow): the gid is the id.
      auto b = f.size() >= 4 ? Number(f[3]) : a;
      if (a) return std::make_pair(*a, b ? *b : *a);
    }
  }
  return std::nullopt;
}

// "user[:group]" (names or numbers) as ids inside the image; a user without a group takes the
// user's primary group when named, the same number when numeric (as Docker's --chown).
Result<std::pair<uint32_t, uint32_t>> ResolveOwner(const std::vector<std::string>& layer_dirs,
                                                   const std::string& spec) {
  size_t colon = spec.find(':');
  std::string user = spec.substr(0, colon);
  std::string group = colon == std::string::npos ? "" : spec.substr(colon + 1);
  uint32_t uid = 0, gid = 0;
  if (auto n = Number(user)) {
    uid = gid = *n;
  } else {
    auto passwd = ReadMergedFile(layer_dirs, "/etc/passwd");
    if (!passwd.ok()) return passwd.status();
    auto e = FindEntry(*passwd, user);
    if (!e)
      return Status::Error("user " + user.substr(0, 64) + " is not in the image's /etc/passwd",
                           EINVAL);
    uid = e->first;
    gid = e->second;
  }
  if (!group.empty()) {
    if (auto n = Number(group)) {
      gid = *n;
    } else {
      auto groups = ReadMergedFile(layer_dirs, "/etc/group");
      if (!groups.ok()) return groups.status();
      auto e = FindEntry(*groups, group);
      if (!e)
        return Status::Error("group " + group.substr(0, 64) + " is not in the image's /etc/group",
                             EINVAL);
      gid = e->first;
    }
  }
  if (uid > 65535 || gid > 65535)
    return Status::Error("owner " + spec.substr(0, 64) + ": ids go up to 65535", EINVAL);
  return std::make_pair(uid, gid);
}

// ---- staging: fd-relative writes below a directory of ours ----

// Opens (making it when missing) directory `name` below `parent`; a non-directory in its place
// is replaced (what a later COPY source says wins, as in Docker).
Result<UniqueFd> OpenOrMakeDir(int parent, const std::string& name, mode_t mode, uint32_t uid,
                               uint32_t gid, bool* made) {
  *made = false;
  UniqueFd fd(::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd) return fd;
  if (errno != ENOENT) {
    struct stat st {};
    if (::fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(st.st_mode)) {
      if (::unlinkat(parent, name.c_str(), 0) != 0) return Status::Errno("unlink " + name);
    } else {
      return Status::Errno("open " + name);
    }
  }
  if (::mkdirat(parent, name.c_str(), 0700) != 0) return Status::Errno("mkdir " + name);
  fd.reset(::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) return Status::Errno("open " + name);
  if (::fchown(fd.get(), uid, gid) != 0 || ::fchmod(fd.get(), mode & 07777) != 0)
    return Status::Errno("set the owner of " + name);
  *made = true;
  return fd;
}

// Makes the directories of `parts` below the staging root `root`: those the layers so far have
// with their attributes (so that a copy into /tmp keeps /tmp's mode), the missing ones 0755 with
// `owner`. Returns the innermost one, and in `missing` how many were missing from the layers.
Result<UniqueFd> StageParents(int root, const std::vector<std::string>& layer_dirs,
                              const std::vector<std::string>& parts,
                              std::pair<uint32_t, uint32_t> owner, int* missing) {
  UniqueFd dir(::fcntl(root, F_DUPFD_CLOEXEC, 0));
  if (!dir) return Status::Errno("dup");
  *missing = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    auto e = LookupMerged(layer_dirs, parts, k + 1);
    if (!e.ok()) return e.status();
    mode_t mode = 0755;
    uint32_t uid = owner.first, gid = owner.second;
    if (e->exists) {
      if (!S_ISDIR(e->st.st_mode))
        return Status::Error(Join(parts, k + 1) +
                                 " is not a directory in the image (a symlink in a destination "
                                 "is not followed by sbx build)",
                             ENOTDIR);
      mode = e->st.st_mode;
      uid = e->st.st_uid;
      gid = e->st.st_gid;
    } else {
      ++*missing;
    }
    bool made = false;
    auto next = OpenOrMakeDir(dir.get(), parts[k], mode, uid, gid, &made);
    if (!next.ok()) return next.status();
    dir = std::move(next).value();
  }
  return dir;
}

struct CopyState {
  int64_t bytes_left = 0;
  const storage::IgnoreRules* ignore = nullptr;  // the context's .dockerignore
};

// Copies what `src` (an open O_PATH or O_RDONLY descriptor of the context) is to `name` below
// `dest_dir`, hashing every entry's relative path, type, mode and content into `h`.
Status CopyEntry(int src, const struct stat& st, int dest_dir, const std::string& name,
                 const std::string& rel, std::pair<uint32_t, uint32_t> owner, Sha256& h,
                 CopyState& budget, int depth);

Status CopyDirContents(int src_dir, int dest_dir, const std::string& rel,
                       std::pair<uint32_t, uint32_t> owner, Sha256& h, CopyState& budget,
                       int depth) {
  if (depth > kMaxCopyDepth) return Status::Error(rel + ": directories nested too deeply", ELOOP);
  int dup = ::fcntl(src_dir, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return Status::Errno("dup");
  DIR* d = ::fdopendir(dup);
  if (d == nullptr) {
    ::close(dup);
    return Status::Errno("opendir " + rel);
  }
  std::vector<std::string> names;
  while (dirent* de = ::readdir(d)) {
    std::string n = de->d_name;
    if (n != "." && n != "..") names.push_back(std::move(n));
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());  // the hash must not depend on readdir's order
  for (const auto& n : names) {
    UniqueFd fd(::openat(src_dir, n.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (!fd) return Status::Errno("open " + rel + "/" + n);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return Status::Errno("stat " + rel + "/" + n);
    SBX_RETURN_IF_ERROR(
        CopyEntry(fd.get(), st, dest_dir, n, rel + "/" + n, owner, h, budget, depth + 1));
  }
  return {};
}

Status CopyEntry(int src, const struct stat& st, int dest_dir, const std::string& name,
                 const std::string& rel, std::pair<uint32_t, uint32_t> owner, Sha256& h,
                 CopyState& budget, int depth) {
  mode_t mode = st.st_mode & 07777;
  auto [uid, gid] = owner;
  std::string self = "/proc/self/fd/" + std::to_string(src);
  bool excluded = budget.ignore != nullptr && budget.ignore->Excluded(rel);
  // An excluded directory is entered only when a `!` pattern may re-include something in it.
  if (excluded && !(S_ISDIR(st.st_mode) && budget.ignore->HasExceptions())) return {};
  if (S_ISDIR(st.st_mode)) {
    if (!excluded) {
      h.Field("d");
      h.Field(rel);
      h.Field(std::to_string(mode));
    }
    bool made = false;
    auto out = OpenOrMakeDir(dest_dir, name, mode, uid, gid, &made);
    if (!out.ok()) return out.status().Wrap(rel);
    if (!made && !excluded &&
        (::fchown(out->get(), uid, gid) != 0 || ::fchmod(out->get(), mode) != 0))
      return Status::Errno("set the owner of " + rel);
    UniqueFd in(::open(self.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!in) return Status::Errno("open " + rel);
    SBX_RETURN_IF_ERROR(CopyDirContents(in.get(), out->get(), rel, owner, h, budget, depth));
    // An excluded directory stays only as the parent of something re-included (as in Docker);
    // rmdir fails, as wanted, when it is not empty.
    if (excluded && made) (void)::unlinkat(dest_dir, name.c_str(), AT_REMOVEDIR);
    return {};
  }
  // A file or link replaces what is there (a directory only when empty, as rename would).
  struct stat old {};
  if (::fstatat(dest_dir, name.c_str(), &old, AT_SYMLINK_NOFOLLOW) == 0 &&
      ::unlinkat(dest_dir, name.c_str(), S_ISDIR(old.st_mode) ? AT_REMOVEDIR : 0) != 0)
    return Status::Errno("replace " + rel);
  if (S_ISLNK(st.st_mode)) {
    char target[4096];
    // readlinkat on an O_PATH descriptor of the link itself, with an empty name.
    ssize_t n = ::readlinkat(src, "", target, sizeof target - 1);
    if (n < 0) return Status::Errno("readlink " + rel);
    std::string t(target, static_cast<size_t>(n));
    h.Field("l");
    h.Field(rel);
    h.Field(t);
    if (::symlinkat(t.c_str(), dest_dir, name.c_str()) != 0) return Status::Errno("symlink " + rel);
    if (::fchownat(dest_dir, name.c_str(), uid, gid, AT_SYMLINK_NOFOLLOW) != 0)
      return Status::Errno("chown " + rel);
    return {};
  }
  if (!S_ISREG(st.st_mode)) return {};  // sockets, fifos and devices of the context: not copied
  UniqueFd in(::open(self.c_str(), O_RDONLY | O_NOCTTY | O_CLOEXEC));
  if (!in) return Status::Errno("open " + rel);
  struct stat again {};
  if (::fstat(in.get(), &again) != 0 || again.st_ino != st.st_ino || !S_ISREG(again.st_mode))
    return Status::Error(rel + " changed while being copied", EAGAIN);
  UniqueFd out(
      ::openat(dest_dir, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!out) return Status::Errno("create " + rel);
  h.Field("f");
  h.Field(rel);
  h.Field(std::to_string(mode));
  Sha256 content;
  char buf[1 << 16];
  for (;;) {
    ssize_t r = ::read(in.get(), buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::Errno("read " + rel);
    if (r == 0) break;
    budget.bytes_left -= r;
    if (budget.bytes_left < 0)
      return Status::Error("COPY: the sources do not fit in the template cache", ENOSPC);
    content.Raw(std::string_view(buf, static_cast<size_t>(r)));
    for (ssize_t off = 0; off < r;) {
      ssize_t w = ::write(out.get(), buf + off, static_cast<size_t>(r - off));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return Status::Errno("write " + rel);
      off += w;
    }
  }
  h.Field(content.Hex());
  if (::fchown(out.get(), uid, gid) != 0 || ::fchmod(out.get(), mode) != 0)
    return Status::Errno("set the owner of " + rel);
  struct timespec times[2] = {st.st_atim, st.st_mtim};
  (void)::futimens(out.get(), times);  // mtimes are kept as Docker keeps them; not essential
  return {};
}

// Opens `rel` (components) below the context `root` with RESOLVE_IN_ROOT: symlinks on the way
// resolve inside the context, never outside it; with `follow_final` false a final symlink is
// opened itself (O_PATH | O_NOFOLLOW), not resolved.
Result<UniqueFd> OpenInContext(int root, const std::string& rel, bool follow_final = true) {
  open_how how{};
  how.flags = O_PATH | O_CLOEXEC | (follow_final ? 0 : O_NOFOLLOW);
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
  std::string path = rel.empty() ? "." : rel;
  long fd = ::syscall(SYS_openat2, root, path.c_str(), &how, sizeof how);
  if (fd < 0) return Status::Errno(rel.empty() ? "the build context" : rel);
  return UniqueFd(static_cast<int>(fd));
}

bool HasGlob(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// ---- what FROM names ----

// docs/build.md "FROM": "scratch"; else the local template of that name when there is one
// (unless the spec says the base is an image); else an image to pull when the name reads as a
// reference (it has a '/', a ':' tag or an '@' digest: a bare "python" is a template name, never
// an implied docker.io/library/python:latest); else not found.
struct Base {
  enum class Kind { kScratch, kTemplate, kImage } kind = Kind::kScratch;
  storage::ImageRef image;
};

Result<Base> ResolveBase(store::Store& st, const BuildSpec& spec) {
  const std::string& name = spec.steps[0].args[0];
  Base b;
  if (!spec.from_registry) {
    if (name == "scratch") return b;
    auto t = st.GetTemplate(name);
    if (!t.ok()) return t.status();
    if (*t) {
      b.kind = Base::Kind::kTemplate;
      return b;
    }
    if (name.find_first_of("/:@") == std::string::npos)
      return Status::Error("FROM " + name.substr(0, 256) +
                               ": template not found (register, import or pull it first; an "
                               "image of Docker Hub is written " +
                               name.substr(0, 256) + ":latest)",
                           EINVAL);
  }
  auto ref = storage::ParseImageRef(name, /*docker_hub=*/true);
  if (!ref.ok()) return ref.status().Wrap("FROM");
  b.kind = Base::Kind::kImage;
  b.image = *ref;
  return b;
}

// Pull and unpack progress as build log lines: one per blob as it ends ("fetch 3f4e1a2b9c0d:
// 1.0 MiB / 1.0 MiB, 4.2 MiB/s, done"), as `sbx template pull` prints when not on a terminal.
class ProgressLog {
 public:
  ProgressLog(std::string verb, std::function<void(const std::string&)> log)
      : verb_(std::move(verb)), log_(std::move(log)) {}
  void operator()(const storage::Progress& p) {
    auto now = std::chrono::steady_clock::now();
    auto [it, added] = started_.try_emplace(p.what, now, p.done);
    if (p.total < 0 || p.done < p.total || !ended_.insert(p.what).second) return;
    double secs = std::chrono::duration<double>(now - it->second.first).count();
    std::string rate =
        secs > 0.05
            ? ", " + FormatSize(static_cast<int64_t>((p.done - it->second.second) / secs)) + "/s"
            : "";
    log_(verb_ + " " + p.what + ": " + FormatSize(p.done) + " / " + FormatSize(p.total) + rate +
         ", done");
  }

 private:
  std::string verb_;
  std::function<void(const std::string&)> log_;
  std::map<std::string, std::pair<std::chrono::steady_clock::time_point, int64_t>> started_;
  std::set<std::string> ended_;
};

// ---- one build ----

struct Image {
  std::vector<std::string> layers;  // ids, topmost first
  std::vector<runtime::BindMount> binds;
  storage::ImageConfig config;
  bool cmd_set = false;  // by this Dockerfile (an ENTRYPOINT resets only an inherited CMD)
  std::map<std::string, std::string> args;  // ARG values (RUN steps' environment, not the image's)
};

std::string EnvValue(const storage::ImageConfig& c, const std::string& key, bool* found) {
  *found = false;
  for (const auto& e : c.env)
    if (e.compare(0, key.size() + 1, key + "=") == 0) {
      *found = true;
      return e.substr(key.size() + 1);
    }
  return "";
}

void SetEnv(storage::ImageConfig& c, const std::string& key, const std::string& value) {
  for (auto& e : c.env)
    if (e.compare(0, key.size() + 1, key + "=") == 0) {
      e = key + "=" + value;
      return;
    }
  c.env.push_back(key + "=" + value);
}

class Build {
 public:
  Build(const BuilderConfig& c, std::string id, const BuildSpec& spec,
        const std::function<void(const BuildLogLine&)>& log)
      : c_(c), ts_(c.templates), st_(*c.store), id_(std::move(id)), spec_(spec), log_(log) {}

  Result<store::TemplateRecord> Run();

 private:
  void Log(const std::string& text, const char* level = "info") {
    BuildLogLine l;
    l.at_ms = NowMs();
    l.level = level;
    l.text = text.size() > kMaxLineBytes ? text.substr(0, kMaxLineBytes) : text;
    if (log_) log_(l);
  }

  std::vector<std::string> LayerDirs() const {
    std::vector<std::string> dirs;
    for (const auto& id : img_.layers) dirs.push_back(storage::LayerDir(ts_, id));
    return dirs;
  }

  // Milliseconds left of the build's time limit (INT64_MAX without one; 0 once past it).
  int64_t TimeLeftMs() const {
    if (spec_.timeout_ms <= 0) return INT64_MAX;
    auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::steady_clock::now() - started_)
                     .count();
    return std::max<int64_t>(0, spec_.timeout_ms - spent);
  }
  Status PastTimeLimit(const std::string& where) const {
    char limit[32];
    std::snprintf(limit, sizeof limit, "%g s", static_cast<double>(spec_.timeout_ms) / 1000);
    return Status::Error(where + ": the build passed its time limit of " + std::string(limit) +
                             "; the step was stopped",
                         ETIMEDOUT);
  }

  // A step's layer is the building key's, within what it may save (its cache key is the key's
  // alone: Key).
  storage::LayerCharge Charge() const {
    return {.key_id = spec_.owner_key_id, .max_bytes = spec_.max_saved_bytes};
  }

  // What every step's result depends on besides its own instruction.
  std::string Key(const BuildStep& s, const std::string& extra) const {
    Sha256 h;
    h.Field("sbx-build-2");
    // Each key's builds have a cache of their own (the operator's builds, key "", share one): a
    // step another key ran is never reused, which would tell this key what another built (its
    // "Using cache" answers a guess of another's step, ARG values included) and hand it a layer
    // another key's network made.
    h.Field(spec_.owner_key_id);
    h.Field(Parent());
    h.Field(std::to_string(static_cast<int>(s.kind)));
    h.Field(s.text);
    for (const auto& a : s.args) h.Field(a);
    h.Field(s.chown);
    h.Field(s.exec_form ? "exec" : "shell");
    for (const auto& e : img_.config.env) h.Field(e);
    h.Field("args");
    for (const auto& [k, v] : img_.args) {
      h.Field(k);
      h.Field(v);
    }
    h.Field(img_.config.user);
    h.Field(img_.config.workdir);
    h.Field(extra);
    if (spec_.no_cache) h.Field(nonce_);
    return "build-" + h.Hex();
  }

  // What the layers so far are: a build layer's id names its whole chain (its key hashed its
  // parent's), an image's topmost layer (named by its own content) does not, so the base's
  // layers are all named.
  std::string Parent() const {
    if (img_.layers.empty()) return "scratch";
    if (img_.layers.front().rfind("build-", 0) == 0) return img_.layers.front();
    Sha256 h;
    for (const auto& l : img_.layers) h.Field(l);
    return "base-" + h.Hex();
  }

  // The layer `key` when a build made it before (pinned for this build from now on).
  bool Cached(const std::string& key) {
    if (spec_.no_cache) return false;
    auto rec = st_.GetLayer(key);
    if (!rec.ok() || !*rec) return false;
    struct stat sb {};
    if (::stat(storage::LayerDir(ts_, key).c_str(), &sb) != 0) return false;
    return st_.PinLayer(id_, key).ok();
  }

  void Push(const std::string& layer) {
    img_.layers.insert(img_.layers.begin(), layer);
    Log(" ---> " + ShortId(layer));
  }

  Status From(const BuildStep& s);
  Status Pull(const storage::ImageRef& ref);
  Status RunStep(const BuildStep& s, const std::string& where);
  Status Copy(const BuildStep& s);
  Result<const storage::IgnoreRules*> Ignore(int ctx);
  Status Workdir(const BuildStep& s);
  Status Stage(const BuildStep& s,
               const std::function<Status(int root, std::string* extra, bool* empty)>& fill);

  const BuilderConfig& c_;
  const storage::TemplateStore& ts_;
  store::Store& st_;
  std::string id_;
  const BuildSpec& spec_;
  const std::function<void(const BuildLogLine&)>& log_;
  std::string nonce_ = RandomId(16);
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::string pulled_;  // " from REF@MANIFEST" of a pulled base, for the template's source
  Image img_;
  std::optional<storage::IgnoreRules> ignore_;  // read at the first COPY
};

// A staging directory removed unless consumed.
struct Staging {
  std::string path;
  ~Staging() {
    if (!path.empty()) (void)RemoveTree(path);  // the cache sweep takes what this misses
  }
};

Status Build::From(const BuildStep& s) {
  const std::string& name = s.args.empty() ? "" : s.args[0];
  auto base = ResolveBase(st_, spec_);
  if (!base.ok()) return base.status();
  if (base->kind == Base::Kind::kScratch) return {};
  if (base->kind == Base::Kind::kImage) return Pull(base->image);
  auto t = storage::ResolveTemplate(ts_, st_, name, id_);
  if (!t.ok()) {
    if (storage::IsTemplateNotFound(t.status()))
      return Status::Error(
          "FROM " + name + ": template not found (register, import or pull it first)", EINVAL);
    return t.status();
  }
  for (const auto& dir : t->layers) {
    std::string lid = dir.substr(dir.rfind('/') + 1);
    if (storage::LayerDir(ts_, lid) != dir)
      return Status::Error("FROM " + name + ": not made of cached layers", EINVAL);
    img_.layers.push_back(lid);
  }
  img_.binds = t->binds;
  auto config = storage::GetImageConfig(st_, name);
  if (config.ok()) img_.config = *config;
  img_.config.env = t->env;
  img_.config.user = t->user == "root" ? "" : t->user;
  img_.config.workdir = t->workdir;
  img_.config.entrypoint = t->entrypoint;
  img_.config.cmd = t->cmd;
  if (!img_.layers.empty()) Log(" ---> " + ShortId(img_.layers.front()));
  return {};
}

// The image `ref` as the base: its manifest and config fetched with the spec's credentials every
// time (a layer in the cache is no licence to an image the registry would refuse this caller),
// its layers only when the cache lacks one of them; unpacked, pinned for this build.
Status Build::Pull(const storage::ImageRef& ref) {
  auto options = PullOptionsFor(c_.registries, ref);
  if (!options.ok()) return options.status();
  storage::PullOptions o = std::move(*options);
  o.username = spec_.registry_username;
  o.password = spec_.registry_password;
  o.max_total_bytes = ts_.cache_bytes;
  std::optional<storage::UnpackedImage> cached;
  o.have_layers = [&](const std::string& config_json) {
    auto img = storage::CachedImage(ts_, st_, config_json, id_);
    if (img.ok()) cached = std::move(*img);
    return img.ok();
  };
  // In a staging directory: the cache's sweep removes it if this process dies mid-pull.
  auto dir = storage::MakeStagingDir(ts_);
  if (!dir.ok()) return dir.status();
  Staging staging{*dir};
  auto log = [this](const std::string& line) { Log(line); };
  ProgressLog fetch("fetch", log);
  const std::string what = ref.String();
  Log("Pulling " + what);
  auto pulled = storage::PullImage(o, what, staging.path + "/layout",
                                   [&](const storage::Progress& p) { fetch(p); });
  if (!pulled.ok()) return pulled.status();
  storage::UnpackedImage image;
  if (!pulled->layers_fetched && cached) {
    Log(" ---> Using cached layers of " + pulled->manifest_digest);
    image = std::move(*cached);
  } else {
    ProgressLog unpack("unpack", log);
    auto unpacked = storage::UnpackImage(ts_, st_, staging.path + "/layout", pulled->ref_name, id_,
                                         [&](const storage::Progress& p) { unpack(p); });
    if (!unpacked.ok()) return unpacked.status().Wrap("FROM " + what);
    image = std::move(*unpacked);
    Log("Pulled " + what + " (" + pulled->manifest_digest + ", " +
        FormatSize(pulled->fetched_bytes) + " fetched)");
  }
  img_.layers = std::move(image.layers);
  img_.config = std::move(image.config);
  pulled_ = " from " + what + " (" + pulled->manifest_digest + ")";
  if (img_.config.user == "root") img_.config.user.clear();
  Log(" ---> " + ShortId(img_.layers.front()));
  return {};
}

Status Build::Stage(const BuildStep& s,
                    const std::function<Status(int root, std::string* extra, bool* empty)>& fill) {
  auto dir = storage::MakeStagingDir(ts_);
  if (!dir.ok()) return dir.status();
  Staging staging{*dir};
  UniqueFd root(::open(staging.path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!root) return Status::Errno("open the staging directory");
  std::string extra;
  bool empty = false;
  SBX_RETURN_IF_ERROR(fill(root.get(), &extra, &empty));
  if (empty) {
    Log(" ---> " + (img_.layers.empty() ? std::string("scratch") : ShortId(img_.layers.front())));
    return {};
  }
  std::string key = Key(s, extra);
  if (Cached(key)) {
    Log(" ---> Using cache");
    Push(key);
    return {};
  }
  // The staging root becomes the layer's root: the image's own root attributes.
  if (::fchmod(root.get(), 0755) != 0) return Status::Errno("chmod the staging directory");
  auto added = storage::AddLayerFromDir(ts_, st_, staging.path, key, 0, id_, Charge());
  if (!added.ok()) return added.status();
  staging.path.clear();
  Push(key);
  return {};
}

Status Build::Workdir(const BuildStep& s) {
  std::string dir = s.args.empty() ? "/" : s.args[0];
  if (dir[0] != '/') dir = (img_.config.workdir.empty() ? "/" : img_.config.workdir) + "/" + dir;
  auto parts = *Components(dir, true);
  img_.config.workdir = Join(parts, parts.size());
  // The directory is made (as Docker does) only when the layers so far lack it, owned by the
  // USER so far.
  std::pair<uint32_t, uint32_t> owner{0, 0};
  if (!img_.config.user.empty() && img_.config.user != "root") {
    auto o = ResolveOwner(LayerDirs(), img_.config.user);
    if (o.ok()) owner = *o;
  }
  return Stage(s, [&](int root, std::string*, bool* empty) {
    int missing = 0;
    auto made = StageParents(root, LayerDirs(), parts, owner, &missing);
    if (!made.ok()) return made.status().Wrap("WORKDIR");
    *empty = missing == 0;
    return Status();
  });
}

// The context's .dockerignore (none: nothing excluded), read once per build.
Result<const storage::IgnoreRules*> Build::Ignore(int ctx) {
  if (!ignore_) {
    auto fd = OpenInContext(ctx, ".dockerignore");
    if (!fd.ok() && fd.status().err() != ENOENT) return fd.status();
    std::string text;
    if (fd.ok()) {
      UniqueFd in(
          ::open(("/proc/self/fd/" + std::to_string(fd->get())).c_str(), O_RDONLY | O_CLOEXEC));
      if (!in) return Status::Errno(".dockerignore");
      auto read = ReadAll(in.get(), (size_t{1} << 20) + 1);
      if (!read.ok()) return Status::Error(".dockerignore: larger than 1 MiB", EINVAL);
      text = std::move(read).value();
    }
    auto rules = storage::IgnoreRules::Parse(text);
    if (!rules.ok()) return rules.status();
    ignore_ = std::move(rules).value();
  }
  return &*ignore_;
}

Status Build::Copy(const BuildStep& s) {
  bool is_add = s.text.size() >= 3 && (s.text[0] == 'A' || s.text[0] == 'a');
  const char* kw = is_add ? "ADD" : "COPY";
  std::pair<uint32_t, uint32_t> owner{0, 0};
  if (!s.chown.empty()) {
    auto o = ResolveOwner(LayerDirs(), s.chown);
    if (!o.ok()) return o.status().Wrap(std::string(kw) + " --chown");
    owner = *o;
  }
  UniqueFd ctx(::open(spec_.context_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!ctx) return Status::Error(std::string(kw) + ": the build context cannot be opened", errno);
  auto ignore = Ignore(ctx.get());
  if (!ignore.ok()) return ignore.status().Wrap(kw);
  // The sources, globs expanded, as paths relative to the context.
  std::vector<std::string> sources;
  std::set<std::string> named;  // sources named as they are, not matched by a glob
  for (size_t i = 0; i + 1 < s.args.size(); ++i) {
    auto parts = Components("/" + s.args[i], false);
    if (!parts)
      return Status::Error(std::string(kw) + " " + s.args[i] + ": outside the build context",
                           EINVAL);
    if (parts->empty() || !HasGlob(parts->back())) {
      std::string rel = Join(*parts, parts->size()).substr(1);
      named.insert(rel);
      sources.push_back(rel);
      continue;
    }
    std::string parent = Join(*parts, parts->size() - 1).substr(1);
    auto pd = OpenInContext(ctx.get(), parent);
    if (!pd.ok()) return pd.status().Wrap(kw);
    UniqueFd rd(::open(("/proc/self/fd/" + std::to_string(pd->get())).c_str(),
                       O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    DIR* d = rd ? ::fdopendir(rd.release()) : nullptr;
    if (d == nullptr) return Status::Errno(std::string(kw) + " " + s.args[i]);
    std::vector<std::string> matched;
    while (dirent* de = ::readdir(d)) {
      std::string n = de->d_name;
      if (n != "." && n != ".." && ::fnmatch(parts->back().c_str(), n.c_str(), FNM_PERIOD) == 0)
        matched.push_back(parent.empty() ? n : parent + "/" + n);
    }
    ::closedir(d);
    std::sort(matched.begin(), matched.end());
    sources.insert(sources.end(), matched.begin(), matched.end());
  }
  if (sources.empty())
    return Status::Error(std::string(kw) + ": no source files were specified", EINVAL);
  std::string dest = s.args.back();
  bool dest_is_dir = dest.back() == '/' || sources.size() > 1;
  if (dest[0] != '/') dest = (img_.config.workdir.empty() ? "/" : img_.config.workdir) + "/" + dest;
  auto dparts = *Components(dest, true);
  auto existing = LookupMerged(LayerDirs(), dparts, dparts.size());
  if (existing.ok() && existing->exists && S_ISDIR(existing->st.st_mode)) dest_is_dir = true;
  return Stage(s, [&](int root, std::string* extra, bool*) {
    Sha256 h;
    CopyState budget{ts_.cache_bytes, *ignore};
    for (const auto& rel : sources) {
      auto fd = OpenInContext(ctx.get(), rel, !s.copy_links);
      if (!fd.ok()) return fd.status().Wrap(std::string(kw) + " source");
      struct stat st {};
      if (::fstat(fd->get(), &st) != 0) return Status::Errno(std::string(kw) + " " + rel);
      // A file named outright that .dockerignore excludes is as missing as in Docker; a
      // directory is copied without its excluded entries, and what a glob matched is skipped.
      if (named.count(rel) != 0 && !S_ISDIR(st.st_mode) && (*ignore)->Excluded(rel))
        return Status::Error(std::string(kw) + " " + rel + ": excluded by .dockerignore", ENOENT);
      if (is_add && S_ISREG(st.st_mode)) {
        // Docker unpacks a local archive given to ADD; sbx build does not (say so, not copy it).
        UniqueFd in(
            ::open(("/proc/self/fd/" + std::to_string(fd->get())).c_str(), O_RDONLY | O_CLOEXEC));
        unsigned char m[264] = {};
        ssize_t n = in ? ::pread(in.get(), m, sizeof m, 0) : 0;
        bool archive = (n >= 2 && m[0] == 0x1f && m[1] == 0x8b) ||
                       (n >= 3 && !std::memcmp(m, "BZh", 3)) ||
                       (n >= 6 && !std::memcmp(m,
                                               "\xfd"
                                               "7zXZ\0",
                                               6)) ||
                       (n >= 4 && !std::memcmp(m, "\x28\xb5\x2f\xfd", 4)) ||
                       (n >= 262 && !std::memcmp(m + 257, "ustar", 5));
        if (archive)
          return Status::Error("ADD " + rel +
                                   ": unpacking a local archive is not supported by sbx build "
                                   "(COPY it and unpack it in a RUN step)",
                               EINVAL);
      }
      std::vector<std::string> into = dparts;
      std::string name;
      if (S_ISDIR(st.st_mode)) {
        // A directory's contents go into the destination.
      } else if (dest_is_dir) {
        name = rel.substr(rel.rfind('/') == std::string::npos ? 0 : rel.rfind('/') + 1);
      } else {
        if (into.empty())
          return Status::Error(std::string(kw) + ": cannot copy a file onto /", EINVAL);
        name = into.back();
        into.pop_back();
      }
      int missing = 0;
      auto dir = StageParents(root, LayerDirs(), into, owner, &missing);
      if (!dir.ok()) return dir.status().Wrap(std::string(kw) + " " + s.args.back());
      h.Field(rel);
      Status copied = S_ISDIR(st.st_mode)
                          ? [&] {
                              UniqueFd in(::open(("/proc/self/fd/" + std::to_string(fd->get())).c_str(),
                                                 O_RDONLY | O_DIRECTORY | O_CLOEXEC));
                              if (!in) return Status::Errno("open " + rel);
                              return CopyDirContents(in.get(), dir->get(), rel, owner, h, budget, 0);
                            }()
                          : CopyEntry(fd->get(), st, dir->get(), name, rel, owner, h, budget, 0);
      if (!copied.ok()) return copied.Wrap(kw);
    }
    *extra = h.Hex();
    return Status();
  });
}

}  // namespace

// ---- the Builder ----

class BuilderImpl : public Builder {
 public:
  explicit BuilderImpl(BuilderConfig c) : c_(std::move(c)) {}
  ~BuilderImpl() override {
    std::vector<std::thread> threads;
    {
      MutexLock g(mu_);
      for (auto& [id, e] : builds_)
        if (e->thread.joinable()) threads.push_back(std::move(e->thread));
    }
    for (auto& t : threads) t.join();
  }

  Result<std::string> Start(BuildSpec spec) override {
    SBX_RETURN_IF_ERROR(Validate(spec));
    std::string id = "bld_" + RandomId(20);
    auto entry = std::make_shared<Entry>();
    entry->status.id = id;
    entry->status.name = spec.name;
    entry->key_id = spec.owner_key_id;
    MutexLock g(mu_);
    if (!spec.owner_key_id.empty()) {
      // Each build holds a box, a thread and its steps' disk: one key's builds are bounded as
      // its sandboxes are, whatever it asks.
      size_t running = 0;
      for (const auto& [other, e] : builds_)
        running += e->key_id == spec.owner_key_id && e->status.state == BuildState::kBuilding;
      if (running >= c_.max_builds_per_key)
        return Status::Error("key " + spec.owner_key_id + " runs " + std::to_string(running) +
                                 " builds: at most " + std::to_string(c_.max_builds_per_key) +
                                 " at once; start this one when one of them has ended",
                             EAGAIN);
    }
    Prune();
    builds_[id] = entry;
    order_.push_back(id);
    // Made under the lock, so that no Prune sees the entry without its thread; the thread's
    // first log line waits for the lock meanwhile. The thread holds the entry: the map may have
    // pruned it by the time the thread ends.
    entry->thread = std::thread([this, entry, id, spec = std::move(spec)] {
      auto log = [this, entry](const BuildLogLine& l) {
        MutexLock lg(mu_);
        entry->logs.push_back(l);
        if (entry->logs.size() > c_.max_log_lines) {
          entry->logs.pop_front();
          ++entry->dropped;
        }
      };
      auto rec = Execute(id, spec, log);
      MutexLock lg(mu_);
      if (rec.ok()) {
        entry->status.state = BuildState::kReady;
        entry->status.size_bytes = rec->size_bytes;
      } else {
        entry->status.state = BuildState::kError;
        entry->status.error = rec.status().what();
      }
    });
    return id;
  }

  Result<BuildStatus> Get(const std::string& id, int64_t offset) override {
    MutexLock g(mu_);
    auto it = builds_.find(id);
    if (it == builds_.end())
      return Status::Error("build " + id.substr(0, 64) + " not found", ENOENT);
    const Entry& e = *it->second;
    BuildStatus out = e.status;
    int64_t from = std::max<int64_t>(offset, e.dropped) - e.dropped;
    for (size_t i = static_cast<size_t>(from); i < e.logs.size(); ++i)
      out.logs.push_back(e.logs[i]);
    return out;
  }

  Result<store::TemplateRecord> Run(BuildSpec spec,
                                    const std::function<void(const BuildLogLine&)>& log) override {
    SBX_RETURN_IF_ERROR(Validate(spec));
    return Execute("bld_" + RandomId(20), spec, log);
  }

 private:
  struct Entry {
    std::string key_id;  // who started it (BuildSpec::owner_key_id)
    BuildStatus status;  // its logs stay empty: they are kept in `logs`
    std::deque<BuildLogLine> logs;
    int64_t dropped = 0;  // log lines dropped from the front
    std::thread thread;
  };

  Status Validate(const BuildSpec& spec) {
    if (!storage::IsValidTemplateName(spec.name))
      return Status::Error("build: invalid template name '" + spec.name.substr(0, 64) + "'",
                           EINVAL);
    if (spec.name == storage::kHostTemplate)
      return Status::Error("build: host is built in", EINVAL);
    if (spec.steps.empty() || spec.steps[0].kind != Kind::kFrom || spec.steps[0].args.size() != 1)
      return Status::Error("build: the first step must be FROM", EINVAL);
    for (size_t i = 1; i < spec.steps.size(); ++i)
      if (spec.steps[i].kind == Kind::kFrom)
        return Status::Error("build: only the first step may be FROM", EINVAL);
    // The base as From will see it; a registry the policy refuses is refused now, before any
    // connection and before the build starts.
    auto base = ResolveBase(*c_.store, spec);
    if (!base.ok()) return base.status();
    if (base->kind == Base::Kind::kImage) {
      auto o = PullOptionsFor(c_.registries, base->image);
      if (!o.ok()) return o.status().Wrap("FROM " + base->image.String());
    }
    bool copies = false;
    for (const auto& s : spec.steps) {
      if (s.kind != Kind::kCopy) continue;
      copies = true;
      for (size_t i = 0; i + 1 < s.args.size(); ++i)
        if (!Components("/" + s.args[i], false))
          return Status::Error("COPY " + s.args[i].substr(0, 256) + ": outside the build context",
                               EINVAL);
    }
    if (copies) {
      struct stat sb {};
      if (spec.context_dir.empty() || ::stat(spec.context_dir.c_str(), &sb) != 0 ||
          !S_ISDIR(sb.st_mode))
        return Status::Error("build: COPY needs a build context directory", EINVAL);
    }
    if (Networked(spec) && c_.network == nullptr)
      return Status::Error(
          "network: networking is not enabled here (sbx serve --network on, or sbx build --net); "
          "the RUN steps of this build would have no network",
          EINVAL);
    return {};
  }

  Result<store::TemplateRecord> Execute(const std::string& id, const BuildSpec& spec,
                                        const std::function<void(const BuildLogLine&)>& log);

  // Finished builds beyond the bound go, oldest first (their threads have ended: joined here).
  void Prune() REQUIRES(mu_) {
    size_t finished = 0;
    for (const auto& id : order_)
      if (builds_[id]->status.state != BuildState::kBuilding) ++finished;
    for (auto it = order_.begin(); it != order_.end() && finished > c_.max_finished;) {
      auto& e = builds_[*it];
      if (e->status.state == BuildState::kBuilding) {
        ++it;
        continue;
      }
      if (e->thread.joinable()) e->thread.join();  // it has set its state: it is returning
      builds_.erase(*it);
      it = order_.erase(it);
      --finished;
    }
  }

  BuilderConfig c_;
  Mutex mu_;
  std::map<std::string, std::shared_ptr<Entry>> builds_ GUARDED_BY(mu_);
  std::deque<std::string> order_ GUARDED_BY(mu_);
};

namespace {

// The box of a RUN step, destroyed unless its writable layer was taken.
struct BoxGuard {
  runtime::Runtime* rt = nullptr;
  std::optional<runtime::Box> box;
  ~BoxGuard() {
    if (box) (void)rt->Destroy(*box);  // ReapOrphans of the next build takes what this misses
  }
};

struct NetGuard {
  network::Stack* stack = nullptr;
  std::string id;
  ~NetGuard() {
    if (stack != nullptr) (void)stack->Release(id);  // Reconcile at the daemon's start remains
  }
};

}  // namespace

Status Build::RunStep(const BuildStep& s, const std::string& where) {
  std::string key = Key(s, "");
  if (Cached(key)) {
    Log(" ---> Using cache");
    Push(key);
    return {};
  }
  if (img_.layers.empty())
    return Status::Error("RUN needs a base with a shell (FROM scratch has nothing to run)", EINVAL);
  auto dir = storage::MakeStagingDir(ts_);
  if (!dir.ok()) return dir.status();
  Staging staging{*dir};

  runtime::BoxSpec box;
  box.id = "build-" + RandomId(12);
  box.layers = LayerDirs();
  box.binds = img_.binds;
  box.limits = c_.default_limits;
  box.limits.disk_bytes = 0;  // the writable layer must be a directory to take out
  if (spec_.memory_bytes > 0) box.limits.memory_bytes = spec_.memory_bytes;
  if (spec_.cpus > 0) box.limits.cpus = spec_.cpus;
  box.die_with_parent = true;
  box.owner = c_.box_owner;
  NetGuard net;
  std::map<std::string, std::string> env;
  // With a stack even a policy that allows nothing gets one (and its refusals say why).
  bool networked = c_.network != nullptr && spec_.network.mode != network::Mode::kNone;
  if (networked) {
    network::BoxNetRequest want;
    want.policy = spec_.network;
    want.refusal_hint = c_.refusal_hint;
    auto plan = c_.network->Prepare(box.id, want);
    if (!plan.ok()) return plan.status().Wrap("the network of RUN");
    // Set in place: assigning a temporary guard would Release the network as it dies.
    net.stack = c_.network;
    net.id = box.id;
    for (const auto& [host, inside] : plan->files) box.binds.push_back({host, inside, true, {}});
    env = plan->env;
    network::Stack* stack = c_.network;
    box.at_sync_point = [stack, id = box.id](pid_t pid) { return stack->Attach(id, pid); };
  } else {
    for (const auto& [host, inside] : c_.no_network_files)
      box.binds.push_back({host, inside, true, {}});
  }
  BoxGuard guard{c_.runtime, std::nullopt};
  auto made = c_.runtime->Create(box);
  if (!made.ok()) return made.status().Wrap("RUN");
  guard.box = *made;
  Log(" ---> Running in " + box.id +
      (networked ? " (network: " + spec_.network.Describe() + ")" : ""));

  // The step's command: ENV over ARG (as Docker), the image's user and workdir so far.
  CommandSpec cmd;
  cmd.argv = s.exec_form ? s.args : std::vector<std::string>{"/bin/sh", "-c", s.args.at(0)};
  for (const auto& [k, v] : img_.args) {
    bool found = false;
    (void)EnvValue(img_.config, k, &found);
    if (!found) cmd.env[k] = v;
  }
  for (const auto& [k, v] : env) cmd.env[k] = v;
  cmd.cwd = img_.config.workdir.empty() ? "/" : img_.config.workdir;
  store::TemplateDefaults defaults{img_.config.env, img_.config.user, ""};
  auto w = SpawnRequest(defaults, {}, cmd);
  if (!w.ok()) return w.status().Wrap("RUN");
  auto conn = protocol::AgentConnection::Connect(made->agent_socket, 10000);
  if (!conn.ok()) return conn.status().Wrap("RUN: connect to the box's agent");
  uint32_t call = conn->NextId();
  auto reply = conn->CallWithId(Type::kSpawn, call, *w, nullptr, 30000);
  if (!reply.ok()) {
    std::string said = reply.status().message();
    if (said.rfind("agent: ", 0) == 0) said.erase(0, 7);
    return Status::Error(where + ": " + said, EINVAL);
  }
  // Output, line by line, until the exit.
  std::string pending[3];
  auto flush = [&](int stream, bool all) {
    std::string& p = pending[stream];
    size_t start = 0;
    for (size_t nl = p.find('\n'); nl != std::string::npos; nl = p.find('\n', start)) {
      std::string line = p.substr(start, nl - start);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      Log(line, stream == 2 ? "error" : "info");
      start = nl + 1;
    }
    p.erase(0, start);
    if ((all && !p.empty()) || p.size() > kMaxLineBytes) {
      Log(p, stream == 2 ? "error" : "info");
      p.clear();
    }
  };
  int64_t code = -1, signal = 0;
  for (;;) {
    // Checked before each wait: a step whose output never pauses meets it too.
    int64_t left = TimeLeftMs();
    if (left == 0) return PastTimeLimit(where);
    auto f =
        conn->Receive(left == INT64_MAX ? -1 : static_cast<int>(std::min<int64_t>(left, INT_MAX)));
    if (!f.ok() && f.status().err() == ETIMEDOUT && TimeLeftMs() == 0) return PastTimeLimit(where);
    if (!f.ok()) return f.status().Wrap(where + ": the box's agent");
    if (f->header.id != call) continue;
    if (f->header.type == Type::kOutput) {
      int stream = f->fields.Int(Tag::kStream) == 2 ? 2 : 1;
      pending[stream].append(f->fields.Str(Tag::kData));
      flush(stream, false);
    } else if (f->header.type == Type::kExit) {
      code = f->fields.Int(Tag::kExitCode, -1);
      signal = f->fields.Int(Tag::kSignal, 0);
      break;
    } else if (f->header.type == Type::kError) {
      return protocol::ErrorFromFrame(*f).Wrap(where);
    }
  }
  flush(1, true);
  flush(2, true);
  if (signal != 0)
    return Status::Error(where + ": killed by signal " + std::to_string(signal), ECANCELED);
  if (code != 0)
    return Status::Error(where + ": returned a non-zero code: " + std::to_string(code), ECANCELED);
  runtime::Box b = *guard.box;
  guard.box.reset();
  SBX_RETURN_IF_ERROR(c_.runtime->DestroyKeepingUpper(b, staging.path).Wrap(where));
  auto added =
      storage::AddLayerFromDir(ts_, st_, staging.path, key, b.LayerIdShift(), id_, Charge());
  if (!added.ok()) return added.status().Wrap(where);
  staging.path.clear();
  Push(key);
  return {};
}

Result<store::TemplateRecord> Build::Run() {
  auto lease = storage::PinLease::Take(ts_, st_, id_);
  if (!lease.ok()) return lease.status();
  if (auto reaped = c_.runtime->ReapOrphans(c_.box_owner); !reaped.ok())
    return reaped.status().Wrap("remove the boxes of killed builds");
  // The cache's sweep (staging directories and pins of dead builders), evicting nothing while
  // the cache is within its bound.
  if (auto swept = storage::EvictUnusedLayers(ts_, st_, ts_.cache_bytes); !swept.ok())
    return swept.status().Wrap("sweep the template cache");
  size_t m = spec_.steps.size();
  for (size_t i = 0; i < m; ++i) {
    const BuildStep& s = spec_.steps[i];
    std::string where = "step " + std::to_string(i + 1) + "/" + std::to_string(m) + " (" +
                        (s.text.size() > 200 ? s.text.substr(0, 200) + "..." : s.text) + ")";
    Log("Step " + std::to_string(i + 1) + "/" + std::to_string(m) + " : " + s.text);
    Status st;
    switch (s.kind) {
      case Kind::kFrom:
        st = From(s);
        break;
      case Kind::kRun:
        st = RunStep(s, where);
        break;
      case Kind::kCopy:
        st = Copy(s);
        break;
      case Kind::kWorkdir:
        st = Workdir(s);
        break;
      case Kind::kEnv:
        for (size_t k = 0; k + 1 < s.args.size(); k += 2)
          SetEnv(img_.config, s.args[k], s.args[k + 1]);
        break;
      case Kind::kArg:
        for (size_t k = 0; k + 1 < s.args.size(); k += 2) img_.args[s.args[k]] = s.args[k + 1];
        break;
      case Kind::kUser:
        img_.config.user = s.args.empty() ? "" : s.args[0];
        break;
      case Kind::kLabel:
        for (size_t k = 0; k + 1 < s.args.size(); k += 2)
          img_.config.labels[s.args[k]] = s.args[k + 1];
        break;
      case Kind::kExpose:
        for (const auto& p : s.args)
          if (std::find(img_.config.exposed_ports.begin(), img_.config.exposed_ports.end(), p) ==
              img_.config.exposed_ports.end())
            img_.config.exposed_ports.push_back(p);
        break;
      case Kind::kCmd:
        img_.config.cmd =
            s.exec_form ? s.args : std::vector<std::string>{"/bin/sh", "-c", s.args.at(0)};
        img_.cmd_set = true;
        break;
      case Kind::kEntrypoint:
        img_.config.entrypoint =
            s.exec_form ? s.args : std::vector<std::string>{"/bin/sh", "-c", s.args.at(0)};
        if (!img_.cmd_set) img_.config.cmd.clear();
        break;
    }
    if (!st.ok()) {
      Status failed = st.what().rfind("step ", 0) == 0 ? st : st.Wrap(where);
      Log(failed.what(), "error");
      return failed;
    }
  }
  if (img_.layers.empty())
    return Status::Error("build: the image has no layers (FROM scratch and no COPY)", EINVAL);
  if (!spec_.start_cmd.empty()) img_.config.start_cmd = spec_.start_cmd;
  if (!spec_.ready_cmd.empty()) img_.config.ready_cmd = spec_.ready_cmd;
  std::string source = "build " + (spec_.record_id.empty() ? id_ : spec_.record_id) + pulled_;
  auto rec = storage::PutImageTemplate(ts_, st_, spec_.name, store::kTemplateBuild, source,
                                       img_.layers, img_.config, true);
  if (!rec.ok()) {
    Log(rec.status().what(), "error");
    return rec.status();
  }
  // The other tags: records of their own (not aliases), so that each keeps this build when the
  // others are rebuilt or removed; the layers are shared.
  for (const auto& n : spec_.also_names) {
    auto tagged = storage::PutImageTemplate(ts_, st_, n, store::kTemplateBuild, source, img_.layers,
                                            img_.config, true);
    if (!tagged.ok()) {
      Log(tagged.status().what(), "error");
      return tagged.status();
    }
    Log("Tagged " + n);
  }
  Log("Successfully built " + spec_.name + " (" + FormatSize(rec->size_bytes) + ")");
  return rec;
}

Result<store::TemplateRecord> BuilderImpl::Execute(
    const std::string& id, const BuildSpec& spec,
    const std::function<void(const BuildLogLine&)>& log) {
  Build b(c_, id, spec, log);
  return b.Run();
}

std::string BuildIdOf(const store::TemplateRecord& r) {
  if (r.kind != store::kTemplateBuild || r.source.rfind("build ", 0) != 0) return "";
  // "build <id>", or "build <id> from REF (DIGEST)" for a build FROM a pulled image.
  return r.source.substr(6, r.source.find(' ', 6) - 6);
}

std::unique_ptr<Builder> MakeBuilder(BuilderConfig config) {
  return std::make_unique<BuilderImpl>(std::move(config));
}

}  // namespace sbx::sandbox
