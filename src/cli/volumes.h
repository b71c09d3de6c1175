// `sbx run --volume HOST:BOX[:ro|:rw]`: a host directory bind-mounted into the one-shot box. Only
// `sbx run` takes host paths (it is a local root action); daemon sandboxes never do.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/runtime.h"

namespace sbx::cli {

// Checks and splits each --volume. HOST must be an existing directory, given as an absolute path
// without `.` or `..` components; BOX an absolute path in the box below `/` and outside /proc,
// /sys and /dev, without `.` or `..`; the mode `ro` or `rw` (default rw). Errors say which
// --volume is wrong and why.
Result<std::vector<runtime::BindMount>> ParseVolumes(const std::vector<std::string>& volumes);

}  // namespace sbx::cli
