// File operations of the agent (docs/agent-protocol.md, "Files"): STAT, LIST, READ, WRITE_*,
// MKDIR, MOVE, REMOVE. Paths arrive already cleaned (paths.h). Errors name the operation and path
// ("mkdir /a/b") and carry errno; the loop turns them into ERROR frames.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "agent/stream.h"
#include "agent/users.h"
#include "common/fd.h"
#include "common/status.h"
#include "protocol/wire.h"

namespace sbx::agent {

// Appends the entry fields (name, path, file_type, size, mode, uid, gid, owner, group_name,
// mtime_ns, link_target) of `path` without following a final symlink.
Status StatEntry(const std::string& path, const UserDb& users, protocol::Writer* w);

// LIST: ENTRY frames for `path`'s content down to `depth` levels (clamped to 1..16), directories
// before their content, sorted by name within a directory, then OK.
Result<std::unique_ptr<Stream>> StartList(const std::string& path, int64_t depth, uint32_t id,
                                          const UserDb& users);

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
// Finish(). Destroying an unfinished write removes the temporary file.
class PendingWrite {
 public:
  static Result<std::unique_ptr<PendingWrite>> Begin(const std::string& path, mode_t mode,
                                                     uid_t uid, gid_t gid, bool parents);
  ~PendingWrite();
  // Appends; the first failure is kept and reported by Finish().
  void Append(std::string_view data);
  // fsync, chmod, chown, rename over the target.
  Status Finish();
  const std::string& path() const { return path_; }

 private:
  PendingWrite() = default;
  std::string path_, temp_;
  UniqueFd fd_;
  mode_t mode_ = 0644;
  uid_t uid_ = 0;
  gid_t gid_ = 0;
  int error_ = 0;
  bool done_ = false;
};

}  // namespace sbx::agent
