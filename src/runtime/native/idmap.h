// The parent's side of a box's user namespace and shared read-only mounts: cloning the box's
// first process so that its user namespace is owned by the box's own host root id, writing its
// id maps, and making the detached (optionally idmapped) mounts of its lower layers and binds
// that the child attaches in its own mount tree. Also the probe that tells at Open whether
// idmapped overlay layers work here, and the fallback's shifted layer copies.
// docs/isolation.md ("Id ranges", "Idmapped layers") explains why each piece exists.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/fd.h"
#include "common/status.h"

namespace sbx::runtime {

// clone(2) with fork semantics (no new stack, no atfork handlers) and `flags` (which must include
// CLONE_NEWUSER), with the calling thread's effective uid and gid switched to `owner` for the
// call only: the new user namespace is then owned by `owner`, so the kernel's per-user counters
// (inotify instances, user namespaces, processes...) of everything in it are charged to `owner`
// on the host, not to root. Returns 0 in the child (effective ids `owner`, full capabilities in
// its new user namespace only), the child's pid in the parent (ids and capabilities restored),
// or -errno. The child may run only async-signal-safe code. With `pidfd`, the parent also gets a
// pidfd of the child (CLONE_PIDFD, close-on-exec) from the clone itself.
long CloneOwnedBy(unsigned long flags, uint32_t owner, int* pidfd = nullptr);

// Writes "0 <base> 65536" to /proc/<pid>/uid_map and gid_map.
Status WriteIdMaps(pid_t pid, uint32_t base);

// An O_PATH descriptor of /proc/<pid>/ns/user.
Result<UniqueFd> OpenUserNamespace(pid_t pid);

// A detached copy of the mount tree at host `path` (open_tree OPEN_TREE_CLONE | AT_RECURSIVE)
// with MOUNT_ATTR_* `attrs` set on every mount of it, idmapped to `userns_fd` when it is >= 0.
Result<UniqueFd> DetachedMount(const std::string& path, uint64_t attrs, int userns_fd);

// Sends one byte and `fds` (SCM_RIGHTS) on the unix socket `sock`.
Status SendFds(int sock, char byte, const std::vector<int>& fds);

// Tries, on a throwaway user namespace owned by and mapped to `base`, what every box does with a
// template layer: an idmapped detached mount of a root-owned 0700 directory, attached by the
// child and used as an overlay lower layer, whose root-owned file shows as root's and can be
// copied up. `scratch` is a root-only directory for the attempt (removed afterwards). OK when all
// of it works; otherwise the first step that failed.
Status ProbeIdmappedLayers(const std::string& scratch, uint32_t base);

// The fallback's copy of read-only `layer` with every uid and gid shifted by `base` (so root of a
// box mapped at `base` owns what root owns in the layer), built once beside it as
// <layer>.shift-<base>/root (the wrapper directory is root-only 0700) and renamed into place.
// Returns the path of the shifted root.
Result<std::string> ShiftedLayer(const std::string& layer, uint32_t base);

}  // namespace sbx::runtime
