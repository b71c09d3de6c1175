// Filesystem helpers for the daemon side: directory creation and tree removal that never follow
// symlinks and never cross into another mount.
#pragma once

#include <string>

#include "common/status.h"

namespace sbx {

// mkdir -p with `mode` for the directories it creates.
Status MakeDirs(const std::string& path, int mode = 0755);
// Removes `path` and everything below it. Symlinks are removed, never followed; a mount point
// below `path` is an error (EBUSY), not something to descend into. A missing `path` is fine.
Status RemoveTree(const std::string& path);
// 16 random characters from [a-z0-9], for box and template ids.
std::string RandomId(size_t length = 16);

}  // namespace sbx
