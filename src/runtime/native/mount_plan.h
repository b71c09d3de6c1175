// The mount plan: every mount, directory, file and symlink a box's root needs, computed in the
// parent as plain data so it can be unit-tested, and executed in the child (child.cc) with one
// system call per step. Why each step exists is in docs/isolation.md ("Mounts").
#pragma once

#include <string>
#include <vector>

#include "runtime/runtime.h"

namespace sbx::runtime {

struct MountOp {
  enum class Kind {
    kMount,    // mount(source, target, fstype, flags, data)
    kMkdir,    // mkdir(target, 0755), EEXIST is fine
    kTouch,    // create an empty regular file `target` to bind a device node over
    kSymlink,  // symlink(source, target), EEXIST is fine
    kAttach,   // move_mount() the detached mount number `fd_index` onto target
  };
  Kind kind = Kind::kMount;
  std::string source;
  std::string target;
  std::string fstype;
  unsigned long flags = 0;
  std::string data;
  bool optional = false;  // ENOENT (the target or source does not exist here) is not an error
  int fd_index = -1;      // kAttach: index into the detached mounts the parent sends

  // A one-line description for error messages: "mount proc on /proc".
  std::string Describe(const std::string& root) const;
};

// Paths are relative to the box's directory, the child's working directory while it runs the
// plan (it cannot walk the root-only host path to it).
struct MountPlanInput {
  std::string root;   // the (empty) directory the overlay is mounted on
  std::string upper;  // writable layer
  std::string work;   // overlay work dir, same filesystem as upper
  // Read-only lower layers, topmost first: host paths, for messages only. Layer i arrives as
  // detached mount i and is attached on lower/<i>.
  std::vector<std::string> layers;
  // Bind i arrives as detached mount layers.size() + i (its flags already set).
  std::vector<BindMount> binds;
};

// The ops to run before pivot_root, in order. All targets are relative paths.
std::vector<MountOp> BuildMountPlan(const MountPlanInput& in);

// Escapes ',' ':' and '\' in an overlay option path (lowerdir uses ':' as its separator).
std::string OverlayEscape(const std::string& path);

}  // namespace sbx::runtime
