// Internal to sbx_storage: the template cache's pieces shared by template.cc (tar and directory
// templates, the host layer) and image.cc (the content-addressed layer store): the lock every
// change to the cache happens under, its sweep and eviction, and the one unpacking of untrusted
// archives (threat row 25). Not for other facades: they use template.h and image.h.
#pragma once

#include <archive.h>

#include <cerrno>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/fd.h"
#include "common/status.h"
#include "storage/template.h"
#include "store/store.h"

namespace sbx::storage::internal {

// What each entry costs beyond its data (a header, an inode): so that a million empty files
// count too.
inline constexpr int64_t kEntryOverheadBytes = 512;
// The deepest a layer's directories nest (as a copy of a writable layer allows: layer_copy.cc).
inline constexpr int kMaxLayerDepth = 512;

std::string LayersRoot(const TemplateStore& ts);
// <templates dir>/staging: directories being filled (an unpacking layer, a build step's upper),
// named "<pid>-<start time>-<random>" so a sweep can tell the ones whose maker has died.
std::string StagingRoot(const TemplateStore& ts);
// <templates dir>/leases: one lock file per build or pull id (PinLease).
std::string LeasesRoot(const TemplateStore& ts);

// The cache directories exist, root's only.
Status EnsureCacheDirs(const TemplateStore& ts);

// Holds <templates dir>/.lock: every change to the cache directory (a layer made or removed)
// happens under it, in the daemon and in `sbx template` alike.
class CacheLock {
 public:
  static Result<CacheLock> Take(const TemplateStore& ts);

 private:
  explicit CacheLock(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

// Caller holds the CacheLock for all of these.
// Removes what dead processes left: layer directories the store does not know, staging
// directories of dead makers, and the pins (and lease files) of builds and pulls whose lease no
// process holds.
void SweepCache(const TemplateStore& ts, store::Store& st);
// Removes unused layers, least recently used first, until the cache holds at most
// `target_bytes` (0: every unused one). Each removed layer is appended to `removed` if given.
Result<int64_t> EvictLocked(const TemplateStore& ts, store::Store& st, int64_t target_bytes,
                            std::vector<store::LayerRecord>* removed = nullptr);
// The bound minus what layers in use take (unused ones can be evicted).
Result<int64_t> RoomLocked(const TemplateStore& ts, store::Store& st);
void RemoveLayerDirs(const TemplateStore& ts, const std::string& id);

// Every layer of the cache marks an opaque directory under both of overlayfs' prefixes
// (common/fs.h: IsOpaqueDir, MarkOpaqueDir), so that each kind of mount sees what the other kind
// made: an image's ".wh..wh..opq" (unpacked here), a box's replaced directory (its overlay's own
// mark, copied into a snapshot's or a build step's layer).
// On a layer's top directory once every opaque directory in it carries both marks: set before a
// new layer enters the cache, and by EnsureOpaqueMarks on a layer an older sbx made.
inline constexpr char kMarksXattr[] = "trusted.sbx.marks";

// Gives directory `fd` the opaque mark ("y") under both prefixes when it has it under either.
Status MirrorOpaqueMark(int fd);
// Size of a tree: kEntryOverheadBytes an entry, and each regular file's data, its holes left out
// (the copy of a writable layer keeps them). ELOOP for one deeper than kMaxLayerDepth directories.
// With `mirror_opaque`, each directory gets MirrorOpaqueMark on the way.
Result<int64_t> TreeBytes(const std::string& path, bool mirror_opaque = false);
// Sets kMarksXattr on the layer directory `dir`.
Status SetMarksDone(const std::string& dir);
// The names in directory `dir` (none when it cannot be read).
std::vector<std::string> Entries(const std::string& dir);
// libarchive's message for the last failure of `a`, never NULL.
std::string ArchiveError(archive* a);
// A name from an archive is used only when it stays below the root: not empty, not absolute,
// no ".." component.
bool SafeArchivePath(const std::string& name);
// "<pid>-<start time>-" of this process: the prefix of its staging directories' names.
std::string SelfStagingPrefix();
// [a-z0-9][a-z0-9._-]{0,63}: one part of a template name.
bool ValidPart(std::string_view p);
// Opens `rel` below the directory `root_fd` without following any symlink (a final symlink is
// opened itself with O_PATH | O_NOFOLLOW) and without leaving the root (openat2). Invalid on
// failure, errno set.
UniqueFd OpenBeneath(int root_fd, const std::string& rel, uint64_t flags);
// Lowercase hex of sha256 of the file at `path`.
Result<std::string> Sha256File(const std::string& path);
// A hash of what lstat says of `path` (mtime, size, inode) and, for a directory, of its entries
// the same way, a symlink entry by its name and inode (a new target is a new link renamed over):
// changes when anything below it is added, removed, replaced or written. The host template's
// fingerprint of the host files it copies.
uint64_t PathFingerprint(const std::string& path);

struct ExtractOptions {
  std::string what;           // for errors: the tarball or directory being read
  std::string strip_prefix;   // removed from every entry name (reading a directory: its path)
  int64_t limit = INT64_MAX;  // stop with ENOSPC once this many bytes are written
  std::function<void(int64_t)> progress;
  // An OCI layer: ".wh.NAME" becomes a 0/0 character device NAME and ".wh..wh..opq" the
  // trusted.overlay.opaque=y xattr of its directory (overlayfs' form).
  bool oci_whiteouts = false;
  // The errno of an unreadable archive (a corrupt or truncated stream).
  int read_errno = EINVAL;
};

// Writes every entry `in` yields below the existing directory `dest`, refusing names that leave
// it, hard links that point out of it or through a symlink, writing through symlinks, ids outside
// 0..65535; skipping devices, sockets and fifos (but making whiteouts with oci_whiteouts). Never
// restores the archive's xattrs (an archive's trusted.overlay.* would steer overlayfs). Returns
// the bytes written (data plus kEntryOverheadBytes per entry).
Result<int64_t> Extract(archive* in, const std::string& dest, const ExtractOptions& o);

}  // namespace sbx::storage::internal
