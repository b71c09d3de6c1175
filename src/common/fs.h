// Filesystem helpers for the daemon side: directory creation and tree removal that never follow
// symlinks and never cross into another mount.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "common/fd.h"
#include "common/status.h"

namespace sbx {

// A file mode's permission bits as four octal digits ("0711").
std::string ModeString(mode_t mode);

// mkdir -p with `mode` for the directories it creates.
Status MakeDirs(const std::string& path, int mode = 0755);
// Removes `path` and everything below it. Symlinks are removed, never followed; a mount point
// below `path` is an error (EBUSY), not something to descend into. A btrfs subvolume, `path`
// itself or one below it, is deleted whole (O(1), the kernel frees its blocks after). A missing
// `path` is fine.
Status RemoveTree(const std::string& path);
// Overlayfs reads its marks under one prefix per mount: trusted.overlay.* where the host mounts
// (a vm guest's root), user.overlay.* where a user namespace does (`userxattr`: the other boxes).
// A layer marks an opaque directory under both (docs/storage.md, "Opaque marks").
// Whether directory `fd` is marked opaque ("y") under either prefix.
bool IsOpaqueDir(int fd);
// Marks directory `fd` opaque under both prefixes. A filesystem without user xattrs (tmpfs before
// Linux 6.6) keeps the trusted mark alone.
Status MarkOpaqueDir(int fd);
// RemoveTree of the entry `name` of the directory open as `dir` (or, with AT_FDCWD, of the path
// `name`); `what` names it in errors.
Status RemoveTreeAt(int dir, const std::string& name, const std::string& what);
// Private files (the install secret, the CA key): made once and never rewritten, readable by this
// process's user only.
//
// Makes `path` holding `data` unless it exists: a 0600 O_EXCL temporary beside it, fsync'd, then
// renamed without replacing (link() where RENAME_NOREPLACE is missing), and the directory
// fsync'd. EEXIST when another process made it first (load that one).
Status CreatePrivateFile(const std::string& path, std::string_view data);
// Opens `path` to read, refusing (EPERM) a symlink, another user's file or a mode wider than
// 0600, and (EINVAL) what is not a regular file. Errors say "<what> <path> ..."; `why` ends the
// wide-mode one (what a reader of it could do). `*size`, when given, gets its size.
Result<UniqueFd> OpenPrivateFile(const std::string& path, const std::string& what,
                                 const std::string& why, off_t* size = nullptr);

// 16 random characters from [a-z0-9], for box and template ids.
std::string RandomId(size_t length = 16);
// A random (version 4) UUID in the kernel's boot_id form: 36 lowercase characters.
Result<std::string> RandomUuid();

}  // namespace sbx
