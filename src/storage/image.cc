#include "storage/image.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "common/fd.h"
#include "common/fs.h"
#include "storage/cache.h"

namespace sbx::storage {
namespace {

using internal::CacheLock;
using nlohmann::json;

// Bounds on what an image's JSON documents may take in memory.
constexpr size_t kMaxJsonBytes = 4 << 20;
constexpr int kMaxIndexDepth = 4;
constexpr size_t kMaxLayers = 500;

bool IsHex64(std::string_view h) {
  if (h.size() != 64) return false;
  for (char c : h)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// "<hex>" of "sha256:<hex>"; EINVAL otherwise.
Result<std::string> Sha256Hex(const std::string& digest, const std::string& what) {
  if (digest.rfind("sha256:", 0) != 0 || !IsHex64(std::string_view(digest).substr(7)))
    return Status::Error(what + ": '" + digest.substr(0, 80) +
                             "' is not a digest (sha256: and 64 lowercase hex digits)",
                         EINVAL);
  return digest.substr(7);
}

std::string ShortDigest(const std::string& hex) { return hex.substr(0, 12); }

struct Sha256 {
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx{EVP_MD_CTX_new(), EVP_MD_CTX_free};
  Sha256() { EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr); }
  void Add(const void* p, size_t n) { EVP_DigestUpdate(ctx.get(), p, n); }
  std::string Hex() {
    unsigned char md[32];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx.get(), md, &len);
    std::string hex;
    for (unsigned i = 0; i < len; ++i) {
      char b[3];
      std::snprintf(b, sizeof b, "%02x", md[i]);
      hex += b;
    }
    return hex;
  }
};

bool ValidLeaseId(const std::string& id) {
  if (!store::IsLeasePinId(id) || id.size() > 100) return false;
  for (char c : id)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '-'))
      return false;
  return true;
}

bool ValidLayerId(const std::string& id) {
  return id.size() <= 80 && internal::ValidPart(std::string_view(id).substr(0, 64)) &&
         (id.size() <= 64 || internal::ValidPart(std::string_view(id).substr(64)));
}

// ---- ImageConfig <-> JSON ----

Status StringsFrom(const json& j, const char* key, std::vector<std::string>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_array()) return Status::Error(std::string(key) + ": not a list of strings", EINVAL);
  for (const auto& v : *it) {
    if (!v.is_string()) return Status::Error(std::string(key) + ": not a list of strings", EINVAL);
    out->push_back(v.get<std::string>());
  }
  return {};
}

Status StringFrom(const json& j, const char* key, std::string* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_string()) return Status::Error(std::string(key) + ": not a string", EINVAL);
  *out = it->get<std::string>();
  return {};
}

// The OCI / Docker image config's `config` object (capitalized keys) as an ImageConfig.
Result<ImageConfig> FromOciConfig(const json& c) {
  ImageConfig out;
  if (c.is_null()) return out;
  if (!c.is_object()) return Status::Error("config: not an object", EINVAL);
  SBX_RETURN_IF_ERROR(StringsFrom(c, "Env", &out.env));
  SBX_RETURN_IF_ERROR(StringFrom(c, "User", &out.user));
  SBX_RETURN_IF_ERROR(StringFrom(c, "WorkingDir", &out.workdir));
  SBX_RETURN_IF_ERROR(StringsFrom(c, "Entrypoint", &out.entrypoint));
  SBX_RETURN_IF_ERROR(StringsFrom(c, "Cmd", &out.cmd));
  if (auto it = c.find("ExposedPorts"); it != c.end() && it->is_object())
    for (const auto& [port, _] : it->items()) out.exposed_ports.push_back(port);
  if (auto it = c.find("Labels"); it != c.end() && it->is_object())
    for (const auto& [k, v] : it->items())
      if (v.is_string()) out.labels[k] = v.get<std::string>();
  for (const auto& e : out.env)
    if (e.find('=') == std::string::npos || e[0] == '=' || e.find('\0') != std::string::npos)
      return Status::Error("config: Env entry '" + e.substr(0, 64) + "' is not NAME=VALUE", EINVAL);
  return out;
}

// ---- reading untrusted files ----

// The file `rel` below the directory `root` as a string, not following symlinks, at most `limit`
// bytes (EFBIG past it).
Result<std::string> ReadBeneath(const std::string& root, const std::string& rel, size_t limit) {
  UniqueFd dir(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir) return Status::Errno("open " + root);
  UniqueFd fd = internal::OpenBeneath(dir.get(), rel, O_RDONLY | O_NOFOLLOW);
  if (!fd) return Status::Errno("open " + rel);
  struct stat sb {};
  if (::fstat(fd.get(), &sb) != 0 || !S_ISREG(sb.st_mode))
    return Status::Error(rel + ": not a regular file", EINVAL);
  if (static_cast<uint64_t>(sb.st_size) > limit)
    return Status::Error(rel + ": larger than " + std::to_string(limit) + " bytes", EFBIG);
  std::string out(static_cast<size_t>(sb.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::read(fd.get(), out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::Errno("read " + rel);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

Result<json> ParseJson(const std::string& text, const std::string& what) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return Status::Error(what + ": not valid JSON", EINVAL);
  return j;
}

// ---- unpacking a layer blob ----

// The blob is read through two libarchive readers: `raw` (gzip, zstd or no filter; the raw
// format) decompresses what `ReadBlob` reads from the file, hashing the blob; `tar` reads the
// tar from what `ReadRaw` takes from `raw`, hashing the uncompressed stream (the diff_id).
struct BlobStream {
  int fd = -1;
  Sha256 blob, diff;
  archive* raw = nullptr;
  std::vector<char> in = std::vector<char>(1 << 16), mid = std::vector<char>(1 << 16);
  int64_t read = 0, total = -1, reported = 0;
  int read_errno = 0;
  std::string what;
  const ProgressFn* progress = nullptr;
};

la_ssize_t ReadBlob(archive*, void* data, const void** buf) {
  auto* s = static_cast<BlobStream*>(data);
  for (;;) {
    ssize_t n = ::read(s->fd, s->in.data(), s->in.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      s->read_errno = errno;
      return -1;
    }
    s->blob.Add(s->in.data(), static_cast<size_t>(n));
    s->read += n;
    if (s->progress && *s->progress && (s->read - s->reported >= (1 << 20) || n == 0)) {
      s->reported = s->read;
      (*s->progress)({s->what, s->read, s->total});
    }
    *buf = s->in.data();
    return n;
  }
}

la_ssize_t ReadRaw(archive* a, void* data, const void** buf) {
  auto* s = static_cast<BlobStream*>(data);
  la_ssize_t n = archive_read_data(s->raw, s->mid.data(), s->mid.size());
  if (n < 0) {
    archive_set_error(a, EIO, "%s", internal::ArchiveError(s->raw).c_str());
    return -1;
  }
  s->diff.Add(s->mid.data(), static_cast<size_t>(n));
  *buf = s->mid.data();
  return n;
}

using ArchivePtr = std::unique_ptr<archive, int (*)(archive*)>;

struct Unpacked {
  int64_t bytes = 0;
  std::string blob_hex, diff_hex;
};

// Unpacks the layer blob at `blob_path` below `dest` (an empty directory), returning its size and
// both digests, computed over every byte of the file and of the decompressed stream.
Result<Unpacked> UnpackBlob(const std::string& blob_path, const std::string& dest,
                            const std::string& what, int64_t limit, const ProgressFn& progress) {
  UniqueFd fd(::open(blob_path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return Status::Errno(what + ": open the blob");
  struct stat sb {};
  if (::fstat(fd.get(), &sb) != 0 || !S_ISREG(sb.st_mode))
    return Status::Error(what + ": the blob is not a regular file", EINVAL);
  BlobStream s;
  s.fd = fd.get();
  s.total = sb.st_size;
  s.what = what.substr(what.rfind(' ') + 1);
  s.progress = &progress;
  ArchivePtr raw(archive_read_new(), archive_read_free);
  archive_read_support_filter_gzip(raw.get());
  archive_read_support_filter_zstd(raw.get());
  archive_read_support_format_raw(raw.get());
  s.raw = raw.get();
  if (archive_read_open(raw.get(), &s, nullptr, ReadBlob, nullptr) != ARCHIVE_OK)
    return Status::Error(what + ": " + internal::ArchiveError(raw.get()), EBADMSG);
  archive_entry* e;
  if (archive_read_next_header(raw.get(), &e) != ARCHIVE_OK)
    return Status::Error(what + ": " + internal::ArchiveError(raw.get()), EBADMSG);
  ArchivePtr tar(archive_read_new(), archive_read_free);
  archive_read_support_format_tar(tar.get());
  if (archive_read_open(tar.get(), &s, nullptr, ReadRaw, nullptr) != ARCHIVE_OK)
    return Status::Error(what + ": " + internal::ArchiveError(tar.get()), EBADMSG);
  internal::ExtractOptions o;
  o.what = what;
  o.limit = limit;
  o.oci_whiteouts = true;
  o.read_errno = EBADMSG;  // a truncated or corrupt stream: the blob is bad
  auto n = internal::Extract(tar.get(), dest, o);
  if (!n.ok()) {
    if (s.read_errno != 0) return Status::Error(what + ": read the blob", s.read_errno);
    return n.status();
  }
  // The digests cover the whole file and the whole stream (the tar's padding after its end).
  for (;;) {
    la_ssize_t r = archive_read_data(raw.get(), s.mid.data(), s.mid.size());
    if (r < 0) return Status::Error(what + ": " + internal::ArchiveError(raw.get()), EBADMSG);
    if (r == 0) break;
    s.diff.Add(s.mid.data(), static_cast<size_t>(r));
  }
  const void* rest;
  while (ReadBlob(nullptr, &s, &rest) > 0) {
  }
  if (s.read_errno != 0) return Status::Error(what + ": read the blob", s.read_errno);
  return Unpacked{*n, s.blob.Hex(), s.diff.Hex()};
}

// Registers the filled directory `root` (on the cache's filesystem) as layer `id` of `size`
// bytes pinned for `pin_for`, unless the layer exists (then `root` is dropped and the layer
// pinned). EDQUOT when it would take `charge.key_id` past its bound, ENOSPC when it does not fit
// after evicting unused layers; `root` is left then.
Result<store::LayerRecord> Commit(const TemplateStore& ts, store::Store& st,
                                  const std::string& root, const std::string& id, int64_t size,
                                  const std::string& pin_for, const std::string& what,
                                  bool* used_existing, const LayerCharge& charge = {}) {
  auto lock = CacheLock::Take(ts);
  if (!lock.ok()) return lock.status();
  auto known = st.GetLayer(id);
  if (!known.ok()) return known.status();
  struct stat sb {};
  if (*known && ::stat(LayerDir(ts, id).c_str(), &sb) == 0) {
    if (!pin_for.empty()) SBX_RETURN_IF_ERROR(st.PinLayer(pin_for, id).Wrap(what));
    *used_existing = true;
    return **known;
  }
  // The key's own bound first, then the cache's.
  if (charge.max_bytes > 0) {
    auto held = st.LayerBytesOwnedBy(charge.key_id);
    if (!held.ok()) return held.status().Wrap(what);
    if (size > charge.max_bytes - (*held - charge.credit_bytes))
      return Status::Error(what + ": " + std::to_string(size) + " bytes do not fit in what key " +
                               charge.key_id + " may save (" + std::to_string(*held) + " of its " +
                               std::to_string(charge.max_bytes) +
                               " bytes held by its snapshots, pauses without memory and builds)",
                           EDQUOT);
  }
  // Room first: a layer that cannot fit whatever is evicted evicts nothing (unused layers of
  // every tenant would go for it otherwise).
  auto fits = [&]() -> Status {
    auto room = internal::RoomLocked(ts, st);
    if (!room.ok()) return room.status();
    if (*room < size)
      return Status::Error(what + ": " + std::to_string(size) +
                               " bytes do not fit in the template cache (" +
                               std::to_string(ts.cache_bytes) + " bytes, the rest in use)",
                           ENOSPC);
    return {};
  };
  SBX_RETURN_IF_ERROR(fits());
  auto evicted = internal::EvictLocked(ts, st, std::max<int64_t>(ts.cache_bytes - size, 1));
  if (!evicted.ok()) return evicted.status().Wrap(what);
  SBX_RETURN_IF_ERROR(fits());
  SBX_RETURN_IF_ERROR(RemoveTree(LayerDir(ts, id)));  // an unrecorded leftover of a dead maker
  SBX_RETURN_IF_ERROR(internal::SetMarksDone(root).Wrap(what));  // both makers mirrored them
  if (::rename(root.c_str(), LayerDir(ts, id).c_str()) != 0)
    return Status::Errno(what + ": move the layer into the cache");
  store::LayerRecord rec{id, size, 0, 0, charge.key_id};
  if (Status s = st.PutLayer(rec, pin_for); !s.ok()) {
    (void)RemoveTree(LayerDir(ts, id));  // unrecorded: the next sweep takes what is left
    return s.Wrap(what);
  }
  auto got = st.GetLayer(id);
  if (!got.ok()) return got.status();
  if (!*got) return Status::Error(what + ": removed while being added", ENOENT);
  *used_existing = false;
  return **got;
}

// ---- shifting a build step's layer ----

// Gives every entry below `path` the owner a box with host id base `shift` meant (host id
// shift + n is n, anything else 65534), keeping set-id bits (chown clears them), dropping
// overlayfs' xattrs but the opaque mark, and device nodes but whiteouts. A file with several
// hard links is shifted once (`done` holds those already shifted): a second shift would take
// its new owner for one outside the range.
Status ShiftTree(const std::string& path, uint32_t shift, std::set<std::pair<dev_t, ino_t>>& done) {
  struct stat sb {};
  if (::lstat(path.c_str(), &sb) != 0) return Status::Errno("stat " + path);
  if (!S_ISDIR(sb.st_mode) && sb.st_nlink > 1 && !done.insert({sb.st_dev, sb.st_ino}).second)
    return {};
  if ((S_ISCHR(sb.st_mode) && sb.st_rdev != makedev(0, 0)) || S_ISBLK(sb.st_mode)) {
    if (::unlink(path.c_str()) != 0) return Status::Errno("remove device " + path);
    return {};
  }
  auto down = [shift](uint32_t id) -> uint32_t {
    return id >= shift && id - shift < 65536 ? id - shift : 65534;
  };
  if (::lchown(path.c_str(), down(sb.st_uid), down(sb.st_gid)) != 0)
    return Status::Errno("chown " + path);
  if (!S_ISLNK(sb.st_mode) && (sb.st_mode & (S_ISUID | S_ISGID)) != 0 &&
      ::chmod(path.c_str(), sb.st_mode & 07777) != 0)
    return Status::Errno("chmod " + path);
  char names[8192];
  ssize_t n = ::llistxattr(path.c_str(), names, sizeof names);
  for (ssize_t i = 0; n > 0 && i < n;) {
    std::string x = names + i;
    i += static_cast<ssize_t>(x.size()) + 1;
    if (x.rfind("trusted.overlay.", 0) == 0 && x != "trusted.overlay.opaque")
      (void)::lremovexattr(path.c_str(), x.c_str());
  }
  if (!S_ISDIR(sb.st_mode)) return {};
  for (const auto& e : internal::Entries(path))
    SBX_RETURN_IF_ERROR(ShiftTree(path + "/" + e, shift, done));
  return {};
}

// ---- image sources ----

// Where an image's files are: a directory (an OCI layout) or a tarball copied into a staging
// directory, member by member (regular files and symlinks between them; nothing is unpacked by
// its own name).
class ImageFiles {
 public:
  // The OCI layout directory `dir`.
  static ImageFiles Dir(const std::string& dir) {
    ImageFiles f;
    f.dir_ = dir;
    return f;
  }

  // Copies the members of `tarball` into `stage`, at most `limit` bytes.
  static Result<ImageFiles> Tarball(const std::string& tarball, const std::string& stage,
                                    int64_t limit, const std::string& what) {
    ImageFiles f;
    f.dir_ = stage;
    ArchivePtr in(archive_read_new(), archive_read_free);
    archive_read_support_format_tar(in.get());
    archive_read_support_filter_gzip(in.get());
    archive_read_support_filter_zstd(in.get());
    archive_read_support_filter_xz(in.get());
    if (archive_read_open_filename(in.get(), tarball.c_str(), 1 << 16) != ARCHIVE_OK)
      return Status::Error(what + ": " + internal::ArchiveError(in.get()), EINVAL);
    int64_t bytes = 0;
    archive_entry* e;
    for (;;) {
      int r = archive_read_next_header(in.get(), &e);
      if (r == ARCHIVE_EOF) break;
      if (r != ARCHIVE_OK && r != ARCHIVE_WARN)
        return Status::Error(what + ": " + internal::ArchiveError(in.get()), EINVAL);
      std::string name = Normal(archive_entry_pathname(e) ? archive_entry_pathname(e) : "");
      auto type = archive_entry_filetype(e);
      if (type == AE_IFLNK) {
        const char* t = archive_entry_symlink(e);
        std::string base =
            name.find('/') == std::string::npos ? "" : name.substr(0, name.rfind('/') + 1);
        f.links_[name] = Normal(t == nullptr ? "" : (t[0] == '/' ? std::string(t + 1) : base + t));
        continue;
      }
      if (const char* hl = archive_entry_hardlink(e)) {
        f.links_[name] = Normal(hl);
        continue;
      }
      if (type != AE_IFREG || name.empty()) continue;
      std::string file = stage + "/m" + std::to_string(f.files_.size());
      UniqueFd out(::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
      if (!out) return Status::Errno(what + ": stage a member");
      const void* buf;
      size_t size;
      la_int64_t offset;
      while ((r = archive_read_data_block(in.get(), &buf, &size, &offset)) == ARCHIVE_OK) {
        bytes += static_cast<int64_t>(size);
        if (bytes > limit)
          return Status::Error(what + ": larger than the template cache's free room", ENOSPC);
        if (::pwrite(out.get(), buf, size, offset) != static_cast<ssize_t>(size))
          return Status::Errno(what + ": stage a member");
      }
      if (r != ARCHIVE_EOF)
        return Status::Error(what + ": " + internal::ArchiveError(in.get()), EBADMSG);
      f.files_[name] = "m" + std::to_string(f.files_.size());
    }
    f.tarball_ = true;
    return f;
  }

  // The path of the file `name` (a name inside the image), or ENOENT.
  Result<std::string> Path(const std::string& name) const {
    std::string n = Normal(name);
    if (n.empty() || !internal::SafeArchivePath(n))
      return Status::Error("'" + name.substr(0, 100) + "' is not a name inside the image", EINVAL);
    if (!tarball_) {
      UniqueFd root(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      UniqueFd fd = root ? internal::OpenBeneath(root.get(), n, O_RDONLY | O_NOFOLLOW) : UniqueFd();
      struct stat sb {};
      if (!fd || ::fstat(fd.get(), &sb) != 0 || !S_ISREG(sb.st_mode))
        return Status::Error("the image has no file " + n, ENOENT);
      return dir_ + "/" + n;
    }
    for (int hops = 0; hops < 8; ++hops) {
      if (auto it = files_.find(n); it != files_.end()) return dir_ + "/" + it->second;
      auto l = links_.find(n);
      if (l == links_.end()) break;
      n = l->second;
    }
    return Status::Error("the image has no file " + Normal(name), ENOENT);
  }

  Result<std::string> Read(const std::string& name) const {
    auto p = Path(name);
    if (!p.ok()) return p.status();
    size_t cut = p->rfind('/');
    return ReadBeneath(p->substr(0, cut), p->substr(cut + 1), kMaxJsonBytes);
  }

  bool Has(const std::string& name) const { return Path(name).ok(); }

 private:
  // "a/./b//c" -> "a/b/c"; ".." components are resolved lexically (and may not leave the root:
  // then the name is "" ).
  static std::string Normal(const std::string& name) {
    std::vector<std::string> parts;
    size_t pos = 0;
    while (pos <= name.size()) {
      size_t end = name.find('/', pos);
      if (end == std::string::npos) end = name.size();
      std::string p = name.substr(pos, end - pos);
      if (p == "..") {
        if (parts.empty()) return "";
        parts.pop_back();
      } else if (!p.empty() && p != ".") {
        parts.push_back(p);
      }
      pos = end + 1;
    }
    std::string out;
    for (const auto& p : parts) out += (out.empty() ? "" : "/") + p;
    return out;
  }

  std::string dir_;
  bool tarball_ = false;
  std::map<std::string, std::string> files_;  // member name -> staged file name
  std::map<std::string, std::string> links_;  // member name -> the member it points to
};

struct Descriptor {
  std::string media_type, digest;
  int64_t size = -1;
};

Result<Descriptor> DescriptorFrom(const json& j, const std::string& what) {
  if (!j.is_object()) return Status::Error(what + ": a descriptor is not an object", EINVAL);
  Descriptor d;
  SBX_RETURN_IF_ERROR(StringFrom(j, "mediaType", &d.media_type).Wrap(what));
  SBX_RETURN_IF_ERROR(StringFrom(j, "digest", &d.digest).Wrap(what));
  if (auto it = j.find("size"); it != j.end() && it->is_number_integer())
    d.size = it->get<int64_t>();
  auto hex = Sha256Hex(d.digest, what);
  if (!hex.ok()) return hex.status();
  return d;
}

std::string BlobName(const std::string& digest) { return "blobs/sha256/" + digest.substr(7); }

// The content of blob `d` of an OCI layout, its digest (and size, when given) checked.
Result<std::string> ReadBlobJson(const ImageFiles& files, const Descriptor& d,
                                 const std::string& what) {
  auto text = files.Read(BlobName(d.digest));
  if (!text.ok()) return text.status().Wrap(what);
  Sha256 h;
  h.Add(text->data(), text->size());
  if ("sha256:" + h.Hex() != d.digest)
    return Status::Error(
        what + ": blob " + ShortDigest(d.digest.substr(7)) + " does not match its digest", EBADMSG);
  if (d.size >= 0 && static_cast<int64_t>(text->size()) != d.size)
    return Status::Error(
        what + ": blob " + ShortDigest(d.digest.substr(7)) + " is not of its recorded size",
        EBADMSG);
  return text;
}

bool IsIndexType(const std::string& t) {
  return t == "application/vnd.oci.image.index.v1+json" ||
         t == "application/vnd.docker.distribution.manifest.list.v2+json";
}

bool IsLayerType(const std::string& t) {
  return t == "application/vnd.oci.image.layer.v1.tar" ||
         t == "application/vnd.oci.image.layer.v1.tar+gzip" ||
         t == "application/vnd.oci.image.layer.v1.tar+zstd" ||
         t == "application/vnd.docker.image.rootfs.diff.tar.gzip" ||
         t == "application/vnd.docker.image.rootfs.diff.tar";
}

// What an image is made of, whichever its source.
struct ImagePlan {
  std::vector<std::string> blobs;     // paths, base layer first
  std::vector<std::string> digests;   // the blobs' "sha256:..." (empty: not known)
  std::vector<std::string> diff_ids;  // from the config
  ImageConfig config;
};

// `check_count`: the config's layers must be as many as plan->blobs (off when no manifest was
// read: CachedImage).
Status PlanFromConfig(const std::string& config_text, const std::string& what, ImagePlan* plan,
                      bool check_count = true) {
  auto cfg = ParseJson(config_text, what + ": image config");
  if (!cfg.ok()) return cfg.status();
  if (!cfg->is_object()) return Status::Error(what + ": the image config is not an object", EINVAL);
  if (auto os = cfg->find("os"); os != cfg->end() && os->is_string() && *os != "linux")
    return Status::Error(what + ": the image is for " + os->get<std::string>() + ", not linux",
                         EINVAL);
  if (auto a = cfg->find("architecture"); a != cfg->end() && a->is_string() && *a != "amd64")
    return Status::Error(what + ": the image is for " + a->get<std::string>() + ", not amd64",
                         EINVAL);
  auto rootfs = cfg->find("rootfs");
  if (rootfs == cfg->end() || !rootfs->is_object())
    return Status::Error(what + ": the image config has no rootfs", EINVAL);
  SBX_RETURN_IF_ERROR(StringsFrom(*rootfs, "diff_ids", &plan->diff_ids).Wrap(what));
  auto c = cfg->find("config");
  auto config = FromOciConfig(c == cfg->end() ? json() : *c);
  if (!config.ok()) return config.status().Wrap(what);
  plan->config = std::move(*config);
  if (check_count && plan->diff_ids.size() != plan->blobs.size())
    return Status::Error(what + ": the config lists " + std::to_string(plan->diff_ids.size()) +
                             " layers, the manifest " + std::to_string(plan->blobs.size()),
                         EINVAL);
  if (plan->diff_ids.size() > kMaxLayers)
    return Status::Error(what + ": more than " + std::to_string(kMaxLayers) + " layers", EINVAL);
  return {};
}

Result<ImagePlan> PlanOciLayout(const ImageFiles& files, const std::string& ref,
                                const std::string& what) {
  auto index_text = files.Read("index.json");
  if (!index_text.ok()) return index_text.status().Wrap(what);
  auto index = ParseJson(*index_text, what + ": index.json");
  if (!index.ok()) return index.status();
  auto manifests = index->find("manifests");
  if (!index->is_object() || manifests == index->end() || !manifests->is_array() ||
      manifests->empty())
    return Status::Error(what + ": index.json lists no manifests", EINVAL);
  // The top level: the one manifest, or the one whose ref.name annotation is `ref`.
  const json* pick = nullptr;
  std::vector<std::string> names;
  for (const auto& m : *manifests) {
    std::string name;
    if (m.is_object())
      if (auto a = m.find("annotations"); a != m.end() && a->is_object())
        if (auto n = a->find("org.opencontainers.image.ref.name"); n != a->end() && n->is_string())
          name = n->get<std::string>();
    names.push_back(name);
    if (!ref.empty() && name == ref) pick = &m;
  }
  if (ref.empty() && manifests->size() == 1) pick = &(*manifests)[0];
  if (pick == nullptr) {
    std::string known;
    for (const auto& n : names)
      if (!n.empty()) known += (known.empty() ? "" : ", ") + n;
    return Status::Error(what +
                             (ref.empty() ? ": the layout holds several images; give --ref"
                                          : ": no image named '" + ref + "'") +
                             (known.empty() ? "" : " (it has: " + known + ")"),
                         ref.empty() ? EINVAL : ENOENT);
  }
  auto d = DescriptorFrom(*pick, what + ": index.json");
  if (!d.ok()) return d.status();
  for (int depth = 0;; ++depth) {
    if (depth >= kMaxIndexDepth) return Status::Error(what + ": indexes nested too deep", EINVAL);
    auto text = ReadBlobJson(files, *d, what);
    if (!text.ok()) return text.status();
    auto doc = ParseJson(*text, what + ": manifest");
    if (!doc.ok()) return doc.status();
    if (!doc->is_object()) return Status::Error(what + ": a manifest is not an object", EINVAL);
    std::string type = d->media_type;
    if (auto mt = doc->find("mediaType"); mt != doc->end() && mt->is_string()) type = *mt;
    if (IsIndexType(type) || (type.empty() && doc->contains("manifests"))) {
      auto list = doc->find("manifests");
      if (list == doc->end() || !list->is_array())
        return Status::Error(what + ": an index lists no manifests", EINVAL);
      const json* amd64 = nullptr;
      for (const auto& m : *list) {
        if (!m.is_object()) continue;
        auto p = m.find("platform");
        if (p != m.end() && p->is_object() && p->value("os", "") == "linux" &&
            p->value("architecture", "") == "amd64") {
          amd64 = &m;
          break;
        }
      }
      if (amd64 == nullptr)
        return Status::Error(what + ": the image index has no linux/amd64 image", ENOENT);
      auto next = DescriptorFrom(*amd64, what + ": index");
      if (!next.ok()) return next.status();
      d = std::move(next);
      continue;
    }
    auto cfg = doc->find("config");
    auto layers = doc->find("layers");
    if (cfg == doc->end() || layers == doc->end() || !layers->is_array())
      return Status::Error(what + ": the manifest has no config or layers", EINVAL);
    auto cd = DescriptorFrom(*cfg, what + ": manifest config");
    if (!cd.ok()) return cd.status();
    ImagePlan plan;
    for (const auto& l : *layers) {
      auto ld = DescriptorFrom(l, what + ": manifest layer");
      if (!ld.ok()) return ld.status();
      if (!ld->media_type.empty() && !IsLayerType(ld->media_type))
        return Status::Error(what + ": layer " + ShortDigest(ld->digest.substr(7)) +
                                 " is of type " + ld->media_type.substr(0, 100) +
                                 ", not a tar (plain, gzip or zstd)",
                             EINVAL);
      auto path = files.Path(BlobName(ld->digest));
      if (!path.ok()) return path.status().Wrap(what);
      plan.blobs.push_back(*path);
      plan.digests.push_back(ld->digest);
    }
    auto config_text = ReadBlobJson(files, *cd, what);
    if (!config_text.ok()) return config_text.status();
    SBX_RETURN_IF_ERROR(PlanFromConfig(*config_text, what, &plan));
    return plan;
  }
}

// `docker save`'s manifest.json: [{"Config": "<hex>.json", "RepoTags": [...], "Layers": [...]}].
Result<ImagePlan> PlanDockerArchive(const ImageFiles& files, const std::string& ref,
                                    const std::string& what) {
  auto text = files.Read("manifest.json");
  if (!text.ok()) return text.status().Wrap(what);
  auto doc = ParseJson(*text, what + ": manifest.json");
  if (!doc.ok()) return doc.status();
  if (!doc->is_array() || doc->empty())
    return Status::Error(what + ": manifest.json lists no images", EINVAL);
  const json* pick = nullptr;
  std::string known;
  for (const auto& m : *doc) {
    if (!m.is_object()) return Status::Error(what + ": manifest.json: not an object", EINVAL);
    std::vector<std::string> tags;
    SBX_RETURN_IF_ERROR(StringsFrom(m, "RepoTags", &tags).Wrap(what));
    for (const auto& t : tags) {
      known += (known.empty() ? "" : ", ") + t;
      if (!ref.empty() && (t == ref || t == ref + ":latest")) pick = &m;
    }
  }
  if (ref.empty() && doc->size() == 1) pick = &(*doc)[0];
  if (pick == nullptr)
    return Status::Error(what +
                             (ref.empty() ? ": the archive holds several images; give --ref"
                                          : ": no image tagged '" + ref + "'") +
                             (known.empty() ? "" : " (it has: " + known + ")"),
                         ref.empty() ? EINVAL : ENOENT);
  std::string config_name;
  SBX_RETURN_IF_ERROR(StringFrom(*pick, "Config", &config_name).Wrap(what));
  std::vector<std::string> layers;
  SBX_RETURN_IF_ERROR(StringsFrom(*pick, "Layers", &layers).Wrap(what));
  auto config_text = files.Read(config_name);
  if (!config_text.ok()) return config_text.status().Wrap(what);
  // The config's name is its digest ("<hex>.json", or "blobs/sha256/<hex>" since Docker 25).
  std::string base = config_name.substr(config_name.rfind('/') + 1);
  if (base.size() > 5 && base.compare(base.size() - 5, 5, ".json") == 0)
    base.resize(base.size() - 5);
  if (IsHex64(base)) {
    Sha256 h;
    h.Add(config_text->data(), config_text->size());
    if (h.Hex() != base)
      return Status::Error(what + ": the image config does not match its digest", EBADMSG);
  } else {
    return Status::Error(
        what + ": the image config's name '" + config_name.substr(0, 100) + "' is not its digest",
        EINVAL);
  }
  ImagePlan plan;
  for (const auto& l : layers) {
    auto path = files.Path(l);
    if (!path.ok()) return path.status().Wrap(what);
    plan.blobs.push_back(*path);
    // "blobs/sha256/<hex>": the blob's digest, checked too; "<id>/layer.tar": the diff_id only.
    std::string hex = l.rfind("blobs/sha256/", 0) == 0 ? l.substr(13) : "";
    plan.digests.push_back(IsHex64(hex) ? "sha256:" + hex : "");
  }
  SBX_RETURN_IF_ERROR(PlanFromConfig(*config_text, what, &plan));
  return plan;
}

}  // namespace

// ---- ImageConfig ----

std::string ImageConfigToJson(const ImageConfig& c) {
  json j = json::object();
  if (!c.env.empty()) j["env"] = c.env;
  if (!c.user.empty()) j["user"] = c.user;
  if (!c.workdir.empty()) j["workdir"] = c.workdir;
  if (!c.entrypoint.empty()) j["entrypoint"] = c.entrypoint;
  if (!c.cmd.empty()) j["cmd"] = c.cmd;
  if (!c.exposed_ports.empty()) j["exposed_ports"] = c.exposed_ports;
  if (!c.labels.empty()) j["labels"] = c.labels;
  if (!c.start_cmd.empty()) j["start_cmd"] = c.start_cmd;
  if (!c.ready_cmd.empty()) j["ready_cmd"] = c.ready_cmd;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<ImageConfig> ImageConfigFromJson(const std::string& text) {
  ImageConfig c;
  if (text.empty()) return c;
  json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return Status::Error("image config: not a JSON object", EINVAL);
  SBX_RETURN_IF_ERROR(StringsFrom(j, "env", &c.env).Wrap("image config"));
  SBX_RETURN_IF_ERROR(StringFrom(j, "user", &c.user).Wrap("image config"));
  SBX_RETURN_IF_ERROR(StringFrom(j, "workdir", &c.workdir).Wrap("image config"));
  SBX_RETURN_IF_ERROR(StringsFrom(j, "entrypoint", &c.entrypoint).Wrap("image config"));
  SBX_RETURN_IF_ERROR(StringsFrom(j, "cmd", &c.cmd).Wrap("image config"));
  SBX_RETURN_IF_ERROR(StringsFrom(j, "exposed_ports", &c.exposed_ports).Wrap("image config"));
  if (auto it = j.find("labels"); it != j.end() && it->is_object())
    for (const auto& [k, v] : it->items())
      if (v.is_string()) c.labels[k] = v.get<std::string>();
  SBX_RETURN_IF_ERROR(StringFrom(j, "start_cmd", &c.start_cmd).Wrap("image config"));
  SBX_RETURN_IF_ERROR(StringFrom(j, "ready_cmd", &c.ready_cmd).Wrap("image config"));
  return c;
}

void ApplyImageConfig(const ImageConfig& c, Template* t) {
  for (const auto& e : c.env) {
    size_t eq = e.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    std::string key = e.substr(0, eq + 1);
    auto same = std::find_if(t->env.begin(), t->env.end(),
                             [&](const std::string& x) { return x.rfind(key, 0) == 0; });
    if (same != t->env.end())
      *same = e;
    else
      t->env.push_back(e);
  }
  t->user = c.user.empty() ? "root" : c.user;
  t->workdir = c.workdir;
  t->entrypoint = c.entrypoint;
  t->cmd = c.cmd;
  t->start_cmd = c.start_cmd;
  t->ready_cmd = c.ready_cmd;
}

// ---- leases ----

Result<PinLease> PinLease::Take(const TemplateStore& ts, store::Store& st, const std::string& id) {
  if (!ValidLeaseId(id))
    return Status::Error("pin lease '" + id.substr(0, 100) +
                             "': an id is bld_ or pull_ and then [A-Za-z0-9_-], at most 100",
                         EINVAL);
  SBX_RETURN_IF_ERROR(internal::EnsureCacheDirs(ts));
  std::string path = internal::LeasesRoot(ts) + "/" + id;
  // The sweep unlinks a file it could lock; a file opened before that is not the lease any more.
  for (int tries = 0; tries < 100; ++tries) {
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd) return Status::Errno("pin lease " + id + ": open");
    while (::flock(fd.get(), LOCK_SH) != 0) {
      if (errno != EINTR) return Status::Errno("pin lease " + id + ": lock");
    }
    struct stat a {
    }, b{};
    if (::fstat(fd.get(), &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_ino == b.st_ino &&
        a.st_dev == b.st_dev) {
      PinLease l;
      l.st_ = &st;
      l.path_ = path;
      l.id_ = id;
      l.fd_ = fd.release();
      return l;
    }
  }
  return Status::Error("pin lease " + id + ": the lock file keeps being replaced", EAGAIN);
}

PinLease::PinLease(PinLease&& o) noexcept
    : st_(o.st_), path_(std::move(o.path_)), id_(std::move(o.id_)), fd_(o.fd_) {
  o.fd_ = -1;
  o.st_ = nullptr;
}

PinLease& PinLease::operator=(PinLease&& o) noexcept {
  if (this != &o) {
    Release();
    st_ = o.st_;
    path_ = std::move(o.path_);
    id_ = std::move(o.id_);
    fd_ = o.fd_;
    o.fd_ = -1;
    o.st_ = nullptr;
  }
  return *this;
}

void PinLease::Release() {
  if (fd_ < 0) return;
  // Unpinned first: should that fail, the pins outlive the lock file and the next sweep drops
  // them.
  (void)st_->UnpinLayers(id_);
  (void)::unlink(path_.c_str());
  ::close(fd_);
  fd_ = -1;
}

// ---- layers ----

Result<std::string> LayerIdForDiffId(const std::string& diff_id) {
  auto hex = Sha256Hex(diff_id, "layer");
  if (!hex.ok()) return hex.status();
  return "sha256-" + *hex;
}

Result<std::string> MakeStagingDir(const TemplateStore& ts) {
  SBX_RETURN_IF_ERROR(internal::EnsureCacheDirs(ts));
  std::string dir = internal::StagingRoot(ts) + "/" + internal::SelfStagingPrefix() + RandomId(12);
  if (::mkdir(dir.c_str(), 0700) != 0) return Status::Errno("make staging directory");
  return dir;
}

Result<store::LayerRecord> AddLayerFromBlob(const TemplateStore& ts, store::Store& st,
                                            const std::string& blob_path,
                                            const std::string& blob_digest,
                                            const std::string& diff_id, const std::string& pin_for,
                                            const ProgressFn& progress) {
  auto id = LayerIdForDiffId(diff_id);
  if (!id.ok()) return id.status();
  std::string what = "layer " + ShortDigest(id->substr(7));
  std::string want_blob;
  if (!blob_digest.empty()) {
    auto hex = Sha256Hex(blob_digest, what);
    if (!hex.ok()) return hex.status();
    want_blob = *hex;
  }
  int64_t room = 0;
  {
    auto lock = CacheLock::Take(ts);
    if (!lock.ok()) return lock.status();
    internal::SweepCache(ts, st);
    auto known = st.GetLayer(*id);
    if (!known.ok()) return known.status();
    struct stat sb {};
    if (*known && ::stat(LayerDir(ts, *id).c_str(), &sb) == 0) {
      // Unpacked once per digest: a second import of the same layer only pins it.
      if (!pin_for.empty()) SBX_RETURN_IF_ERROR(st.PinLayer(pin_for, *id).Wrap(what));
      struct stat blob {};
      int64_t n = ::stat(blob_path.c_str(), &blob) == 0 ? blob.st_size : 0;
      if (progress) progress({what.substr(6), n, n});
      return **known;
    }
    auto r = internal::RoomLocked(ts, st);
    if (!r.ok()) return r.status();
    room = *r;
  }
  if (room <= 0)
    return Status::Error(what + ": the template cache is full (" + std::to_string(ts.cache_bytes) +
                             " bytes, all in use)",
                         ENOSPC);
  // Unpacked outside the cache lock (layers of one image unpack in parallel), into a staging
  // directory that the sweep removes should we die; then moved into place under the lock.
  auto stage = MakeStagingDir(ts);
  if (!stage.ok()) return stage.status();
  std::string root = *stage + "/root";
  auto result = [&]() -> Result<store::LayerRecord> {
    if (::mkdir(root.c_str(), 0755) != 0 || ::chmod(root.c_str(), 0755) != 0)
      return Status::Errno(what + ": make the layer directory");
    auto n = UnpackBlob(blob_path, root, what, room, progress);
    if (!n.ok()) return n.status();
    if (!want_blob.empty() && n->blob_hex != want_blob)
      return Status::Error(what + ": the blob does not match its digest " + ShortDigest(want_blob) +
                               " (got " + ShortDigest(n->blob_hex) + ")",
                           EBADMSG);
    if ("sha256-" + n->diff_hex != *id)
      return Status::Error(what + ": the unpacked layer does not match its diff_id (got " +
                               ShortDigest(n->diff_hex) + ")",
                           EBADMSG);
    bool existing = false;
    return Commit(ts, st, root, *id, n->bytes, pin_for, what, &existing);
  }();
  (void)RemoveTree(*stage);  // what is left is a dead maker's to the next sweep
  return result;
}

Result<store::LayerRecord> AddLayerFromTarball(const TemplateStore& ts, store::Store& st,
                                               const std::string& tar_path,
                                               const std::string& pin_for,
                                               const ProgressFn& progress) {
  auto hex = internal::Sha256File(tar_path);
  if (!hex.ok()) return hex.status().Wrap("add layer from a tarball");
  // The blob is the diff: AddLayerFromBlob checks both while it unpacks.
  std::string digest = "sha256:" + *hex;
  return AddLayerFromBlob(ts, st, tar_path, digest, digest, pin_for, progress);
}

Result<store::LayerRecord> AddLayerFromDir(const TemplateStore& ts, store::Store& st,
                                           const std::string& dir, const std::string& id,
                                           std::optional<uint32_t> id_shift,
                                           const std::string& pin_for, const LayerCharge& charge) {
  std::string what = "add layer " + id;
  if (!ValidLayerId(id) || id.rfind("sha256-", 0) == 0)
    return Status::Error(what + ": a layer id is [a-z0-9][a-z0-9._-]* (not sha256-...)", EINVAL);
  struct stat sb {};
  if (::lstat(dir.c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode))
    return Status::Error(what + ": not a directory", EINVAL);
  std::set<std::pair<dev_t, ino_t>> shifted;
  if (id_shift) SBX_RETURN_IF_ERROR(ShiftTree(dir, *id_shift, shifted).Wrap(what));
  auto size = internal::TreeBytes(dir, /*mirror_opaque=*/true);
  if (!size.ok()) return size.status().Wrap(what);
  bool existing = false;
  auto rec = Commit(ts, st, dir, id, *size, pin_for, what, &existing, charge);
  if (rec.ok() && existing) (void)RemoveTree(dir);  // the same step's layer, made before
  return rec;
}

Result<store::TemplateRecord> PutImageTemplate(
    const TemplateStore& ts, store::Store& st, const std::string& name, const std::string& kind,
    const std::string& source, const std::vector<std::string>& layers, const ImageConfig& config,
    bool replace, const std::string& sandbox_id, const std::string& runtime) {
  std::string what = "register template " + name;
  if (!IsValidTemplateName(name))
    return Status::Error(what + ": a name is [a-z0-9][a-z0-9._-]{0,63}, optionally :TAG", EINVAL);
  if (name == kHostTemplate) return Status::Error(what + ": host is built in", EPERM);
  if (kind != store::kTemplateOci && kind != store::kTemplateBuild &&
      kind != store::kTemplateSnapshot)
    return Status::Error(what + ": kind is oci, build or snapshot", EINVAL);
  auto lock = CacheLock::Take(ts);
  if (!lock.ok()) return lock.status();
  auto existing = st.GetTemplate(name);
  if (!existing.ok()) return existing.status();
  if (*existing && !replace)
    return Status::Error(what + ": a template of that name exists", EEXIST);
  if (*existing && (*existing)->kind == store::kTemplateHost)
    return Status::Error(what + ": host is built in", EPERM);
  store::TemplateRecord t;
  t.name = name;
  t.kind = kind;
  t.source = source;
  t.layers = layers;
  t.config = ImageConfigToJson(config);
  t.sandbox_id = sandbox_id;
  t.runtime = runtime;
  std::set<std::string> seen;
  for (const auto& l : layers) {
    auto rec = st.GetLayer(l);
    if (!rec.ok()) return rec.status();
    if (!*rec) return Status::Error(what + ": no layer " + l, ENOENT);
    if (seen.insert(l).second) t.size_bytes += (*rec)->size_bytes;
  }
  SBX_RETURN_IF_ERROR(*existing ? st.PutTemplate(t) : st.AddTemplate(t));
  // A replaced template's layers may be unused now.
  auto evicted = internal::EvictLocked(ts, st, ts.cache_bytes);
  if (!evicted.ok()) return evicted.status().Wrap(what + ": evict unused layers");
  auto got = st.GetTemplate(name);
  if (!got.ok()) return got.status();
  if (!*got) return Status::Error(what + ": removed while being added", ENOENT);
  return **got;
}

Result<ImageConfig> GetImageConfig(store::Store& st, const std::string& name) {
  auto rec = st.GetTemplate(name);
  if (!rec.ok()) return rec.status();
  if (!*rec) return TemplateNotFound(name);
  if ((*rec)->kind == store::kTemplateAlias) {
    rec = st.GetTemplate((*rec)->alias_of);
    if (!rec.ok()) return rec.status();
    if (!*rec) return TemplateNotFound(name);
  }
  return ImageConfigFromJson((*rec)->config);
}

Result<std::vector<store::LayerRecord>> GcLayers(const TemplateStore& ts, store::Store& st) {
  auto swept = SweepAbandoned(ts, st);  // killed pulls' directories too
  if (!swept.ok()) return swept.status();
  auto lock = CacheLock::Take(ts);
  if (!lock.ok()) return lock.status();
  std::vector<store::LayerRecord> removed;
  auto freed = internal::EvictLocked(ts, st, 0, &removed);
  if (!freed.ok()) return freed.status();
  return removed;
}

namespace {

// Topmost first. A layer listed twice is kept where it is highest: the lower copy shows nothing
// the upper one does not (and overlayfs refuses a directory twice).
void PushLayer(std::vector<std::string>* layers, const std::string& id) {
  layers->erase(std::remove(layers->begin(), layers->end(), id), layers->end());
  layers->insert(layers->begin(), id);
}

}  // namespace

Result<UnpackedImage> UnpackImage(const TemplateStore& ts, store::Store& st,
                                  const std::string& path, const std::string& ref,
                                  const std::string& pin_for, const ProgressFn& progress) {
  std::string what = "unpack " + (ref.empty() ? std::string("the image") : ref);
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0) return Status::Errno(what + ": " + path);
  std::string stage;
  auto cleanup = [&] {
    if (!stage.empty()) (void)RemoveTree(stage);  // else the sweep takes it
  };
  auto result = [&]() -> Result<UnpackedImage> {
    ImageFiles files = ImageFiles::Dir(path);
    if (S_ISREG(sb.st_mode)) {
      auto dir = MakeStagingDir(ts);
      if (!dir.ok()) return dir.status();
      stage = *dir;
      int64_t room = ts.cache_bytes;
      {
        auto lock = CacheLock::Take(ts);
        if (!lock.ok()) return lock.status();
        auto r = internal::RoomLocked(ts, st);
        if (!r.ok()) return r.status();
        room = *r;
      }
      auto t = ImageFiles::Tarball(path, stage, room, what);
      if (!t.ok()) return t.status();
      files = std::move(*t);
    } else if (!S_ISDIR(sb.st_mode)) {
      return Status::Error(what + ": " + path + " is not an OCI layout directory or a tarball",
                           EINVAL);
    }
    Result<ImagePlan> plan =
        Status::Error(what + ": " + path +
                          " is neither an OCI image layout (index.json) nor a docker-archive "
                          "(manifest.json)",
                      EINVAL);
    if (files.Has("manifest.json"))
      plan = PlanDockerArchive(files, ref, what);
    else if (files.Has("index.json"))
      plan = PlanOciLayout(files, ref, what);
    if (!plan.ok()) return plan.status();
    UnpackedImage out;
    for (size_t i = 0; i < plan->blobs.size(); ++i) {
      auto l = AddLayerFromBlob(ts, st, plan->blobs[i], plan->digests[i], plan->diff_ids[i],
                                pin_for, progress);
      if (!l.ok()) return l.status().Wrap(what);
      PushLayer(&out.layers, l->id);
    }
    if (out.layers.empty()) return Status::Error(what + ": the image has no layers", EINVAL);
    out.config = std::move(plan->config);
    return out;
  }();
  cleanup();
  return result;
}

Result<UnpackedImage> CachedImage(const TemplateStore& ts, store::Store& st,
                                  const std::string& config_json, const std::string& pin_for) {
  ImagePlan plan;
  SBX_RETURN_IF_ERROR(PlanFromConfig(config_json, "the cached image", &plan, false));
  UnpackedImage out;
  for (const auto& diff_id : plan.diff_ids) {
    auto id = LayerIdForDiffId(diff_id);
    if (!id.ok()) return id.status();
    // Pinned first, then looked for: eviction skips a pinned layer, so once both hold it stays.
    SBX_RETURN_IF_ERROR(st.PinLayer(pin_for, *id));
    struct stat sb {};
    if (::stat(LayerDir(ts, *id).c_str(), &sb) != 0)
      return Status::Error("layer " + *id + " is not in the cache", ENOENT);
    PushLayer(&out.layers, *id);
  }
  if (out.layers.empty()) return Status::Error("the cached image has no layers", EINVAL);
  out.config = std::move(plan.config);
  return out;
}

Result<store::TemplateRecord> ImportImage(const TemplateStore& ts, store::Store& st,
                                          const std::string& name, const std::string& path,
                                          const std::string& ref, bool replace,
                                          const ProgressFn& progress) {
  std::string what = "import " + name;
  if (!IsValidTemplateName(name))
    return Status::Error(what + ": a name is [a-z0-9][a-z0-9._-]{0,63}, optionally :TAG", EINVAL);
  if (name == kHostTemplate) return Status::Error(what + ": host is built in", EPERM);
  if (!replace) {
    auto existing = st.GetTemplate(name);
    if (!existing.ok()) return existing.status();
    if (*existing) return Status::Error(what + ": a template of that name exists", EEXIST);
  }
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0) return Status::Errno(what + ": " + path);
  auto lease = PinLease::Take(ts, st, "pull_import_" + RandomId(12));
  if (!lease.ok()) return lease.status();
  auto image = UnpackImage(ts, st, path, ref, lease->id(), progress);
  if (!image.ok()) return image.status().Wrap(what);
  std::string source = path + (ref.empty() ? "" : " (" + ref + ")");
  return PutImageTemplate(ts, st, name, store::kTemplateOci, source, image->layers, image->config,
                          replace);
}

}  // namespace sbx::storage
