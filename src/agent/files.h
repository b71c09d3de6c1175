// File operations of the agent (docs/agent-protocol.md, "Files"): STAT, LIST, READ, WRITE_*,
// MKDIR, MOVE, REMOVE. Paths arrive already cleaned (paths.h). Errors name the operation and path
// ("mkdir /a/b") and carry errno; the loop turns them into ERROR frames.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "agent/stream.h"
#include "agent/users.h"
#include "common/fd.h"
#include "common/status.h"
#include "protocol/wire.h"

namespace sbx::agent {

// Extended attributes as (full name, value), e.g. {"user.e2b.owner", "alice"}.
using Xattrs = std::vector<std::pair<std::string, std::string>>;

// Bounds on the xattrs a write sets and an entry reports.
inline constexpr size_t kMaxXattrName = 255;        // XATTR_NAME_MAX
inline constexpr size_t kMaxXattrBytes = 16 << 10;  // names + values, per file

// Checks xattrs a client asks to set: "user." names of at most kMaxXattrName bytes, all names and
// values within kMaxXattrBytes.
Status CheckXattrs(const Xattrs& xattrs);

// Appends the entry fields (name, path, file_type, size, mode, uid, gid, owner, group_name,
// mtime_ns, link_target, and xattr* for the names starting with `xattr_prefix` when it is not
// empty) of `path` without following a final symlink. Xattrs beyond kMaxXattrBytes are left out.
// With `follow`, a symlink answers as envd's Stat does: file_type and mode are its target's (kOther
// and 0 when the target does not exist), link_target the absolute path it resolves to (itself when
// it does not resolve), the rest (size, owner, mtime) the link's own. Resolution happens in the
// agent's root, which is the box's: a link cannot lead out of the box.
Status StatEntry(const std::string& path, const UserDb& users, const std::string& xattr_prefix,
                 protocol::Writer* w, bool follow = false);

// LIST: ENTRY frames for `path`'s content down to `depth` levels (clamped to 1..16), directories
// before their content, sorted by name within a directory, then OK.
Result<std::unique_ptr<Stream>> StartList(const std::string& path, int64_t depth, uint32_t id,
                                          const UserDb& users, std::string xattr_prefix);

// READ: DATA frames from `offset` for `length` bytes (0 = to the end), then OK {size}. Regular
// files only (EISDIR for a directory, EINVAL for devices, FIFOs and sockets).
Result<std::unique_ptr<Stream>> StartRead(const std::string& path, int64_t offset, int64_t length,
                                          uint32_t id);

// MKDIR; `parents` creates missing parents and accepts an existing directory. New directories get
// `mode` (umask not applied) and `uid`/`gid`.
Status MakeDir(const std::string& path, mode_t mode, uid_t uid, gid_t gid, bool parents);
Status MovePath(const std::string& from, const std::string& to);
// REMOVE; `recursive` walks with openat/unlinkat and never follows a symlink.
Status RemovePath(const std::string& path, bool recursive);

// One WRITE_BEGIN..WRITE_END transfer: a temporary file beside the target, renamed over it on
// Finish(). Destroying an unfinished write removes the temporary file. The new file has exactly
// `xattrs` (checked with CheckXattrs); a filesystem without xattr support skips them.
class PendingWrite {
 public:
  static Result<std::unique_ptr<PendingWrite>> Begin(const std::string& path, mode_t mode,
                                                     uid_t uid, gid_t gid, bool parents,
                                                     Xattrs xattrs);
  ~PendingWrite();
  // Appends; the first failure is kept and reported by Finish().
  void Append(std::string_view data);
  // fsync, chmod, chown, set xattrs, rename over the target.
  Status Finish();
  const std::string& path() const { return path_; }
  // The prefix of the xattrs WRITE_END's entry reports.
  std::string xattr_prefix;

 private:
  PendingWrite() = default;
  std::string path_, temp_;
  Xattrs xattrs_;
  UniqueFd fd_;
  mode_t mode_ = 0644;
  uid_t uid_ = 0;
  gid_t gid_ = 0;
  int error_ = 0;
  bool done_ = false;
};

}  // namespace sbx::agent
