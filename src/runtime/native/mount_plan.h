// The mount plan: every mount, directory, file and symlink a box's root needs, computed in the
// parent as plain data so it can be unit-tested, and executed in the child (child.cc) with a few
// system calls per step. Why each step exists is in docs/isolation.md ("Mounts").
//
// Paths inside the box's root come from the template's layers, which are untrusted (threat row
// 25): a layer may put a symlink where /proc, /dev or /etc/resolv.conf should be. Such ops are
// marked `in_root` and the child resolves them below a descriptor of the new root with
// openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS), creating missing directories one component at
// a time below the descriptor, never by a path string walked from the host's root.
#pragma once

#include <string>
#include <vector>

#include "runtime/runtime.h"

namespace sbx::runtime {

struct MountOp {
  enum class Kind {
    kMount,    // mount(source, target, fstype, flags, data)
    kMkdir,    // mkdir(target, 0755), EEXIST is fine; in the root: a directory, whatever was there
    kTouch,    // an empty regular file `target` to bind a file over (in the root: as kMkdir)
    kSymlink,  // symlink(source, target), EEXIST is fine
    kAttach,   // move_mount() the detached mount number `fd_index` onto target
    // The root's overlay: layers lower/0 .. lower/<fd_index - 1> (topmost first), or with
    // `stacked` the one directory they were stacked on (kLowerStack), under the writable layer
    // `source` (its work directory is `data`), mounted on `target`. With fsconfig's lowerdir+
    // where the kernel has it (6.8+), else one option string.
    kOverlay,
    // A read-only overlay of lower/0 .. lower/<fd_index - 1> over the empty directory `data`
    // (overlayfs wants two layers where there is no upper), mounted on `target`: the root
    // overlay's one lower layer when the writable layer is a btrfs subvolume on the layers' own
    // filesystem. btrfs numbers inodes per subvolume, and overlayfs passes a layer's inode
    // numbers through when all its layers are on one filesystem: stacked, the layers reach the
    // root overlay from a filesystem of their own, so their files and the box's cannot show the
    // same device and inode number.
    kLowerStack,
    // A read-only overlay of the topmost layer's directory `source` (a path inside the box,
    // resolved inside the layer attached on lower/0) over the directory `target` of the root.
    kOverlaySub,
  };
  Kind kind = Kind::kMount;
  std::string source;
  std::string target;
  std::string fstype;
  unsigned long flags = 0;
  std::string data;
  bool optional = false;  // ENOENT (the target or source does not exist here) is not an error
  int fd_index = -1;      // kAttach: index into the detached mounts the parent sends
  // `target` (and with source_in_root `source`) is an absolute path inside the box's root,
  // resolved by the child below the root's descriptor; otherwise a path relative to the box's
  // directory, which only the host writes.
  bool in_root = false;
  bool source_in_root = false;
  std::string stacked;  // kOverlay: the kLowerStack's target, when the layers were stacked

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
  // The box's own boot id (a file holding a random UUID, relative to the box's directory), bound
  // read-only over /proc/sys/kernel/random/boot_id; empty: the kernel's.
  std::string boot_id;
  // The layers are stacked on an overlay of their own first (MountOp::kLowerStack), at most
  // kMaxLayers - 1 of them.
  bool stack_layers = false;
  // The directory holding `upper` and `work` (relative to the box's directory), when the
  // writable layer arrives as a detached (idmapped) mount of its own, the last one, attached
  // there before the overlay is mounted; empty: it is a directory on the host as it is.
  std::string writable_mount;
};

// The most lower layers one overlay stacks (the kernel's OVL_MAX_STACK).
inline constexpr size_t kMaxLayers = 500;

// The ops to run before pivot_root, in order.
std::vector<MountOp> BuildMountPlan(const MountPlanInput& in);

// Escapes ',' ':' and '\' in an overlay option path (lowerdir uses ':' as its separator).
std::string OverlayEscape(const std::string& path);

}  // namespace sbx::runtime
