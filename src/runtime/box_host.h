// What every runtime's boxes share on the host side: the agent's listening socket, the owner lock
// that tells a box whose creator died (an orphan), a socket in a box's network namespace, and
// finding a runtime's binary, the mounts below a box's directory, the box directories of a run
// directory, the agent's copy. The native (native/), oci (oci/) and vm (vm/) runtimes use them,
// so that a box directory means the same to all.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/fd.h"
#include "common/status.h"

namespace sbx::runtime {

// A unix socket bound at `path` (0600) and listening.
Result<UniqueFd> ListenUnix(const std::string& path);
// A unix stream socket connected to `path` (close-on-exec).
Result<UniqueFd> ConnectUnix(const std::string& path);

// Whether box directory `dir` is an orphan of `owner`: its owner file names `owner` and nobody
// holds its lock. A box directory gets its name only with its owner file in it; one without was
// left by an older sbx whose creator died between its mkdir and its owner file, and counts once
// it is a minute old.
bool IsOrphan(const std::string& dir, const std::string& owner);

// A new socket (socket(2) arguments; close-on-exec) in the network namespace of the process
// `pidfd` refers to, made on a thread of its own (setns changes only the calling thread's).
// `what` prefixes the error.
Result<UniqueFd> SocketInNetworkOf(int pidfd, int domain, int type, const std::string& what);

// The absolute path of `name`: itself when it holds a '/', else the first executable of that name
// on PATH or in the sbin directories (runc is /usr/sbin/runc on Debian, off a user's PATH); ""
// when there is none.
std::string FindBinary(const std::string& name);

// Every mount point at or below `dir` in this process's mount table, in the table's order.
std::vector<std::string> MountsBelow(const std::string& dir);
// Detaches every mount at or below `dir`, latest first; EBUSY naming one still there after a few
// passes.
Status UnmountBelow(const std::string& dir);

// The names in directory `dir` but "." and ".." (none when it cannot be read).
std::vector<std::string> DirNames(const std::string& dir);
// The names in run directory `run_dir` that are box ids (ValidateBoxId).
Result<std::vector<std::string>> ListBoxIds(const std::string& run_dir);

// Copies the agent binary to `dest` (0555) unless it is already there with the same content:
// written beside it and renamed, so a running box keeps the file it execs.
Status InstallAgent(const std::string& src, const std::string& dest);

// An overlay's bounds: the lower layers it stacks (the kernel's OVL_MAX_STACK), and the bytes
// of mount(2) options it takes (a page, less what the kernel appends).
inline constexpr size_t kMaxOverlayLayers = 500;
inline constexpr size_t kMaxOverlayOptions = 4000;
// How many lower layers named `prefix` + their index (0, 1, ...), joined by ':', fit one
// overlay's option string beside `fixed_bytes` of other options (at most kMaxOverlayLayers).
size_t OverlayLayersThatFit(size_t fixed_bytes, const std::string& prefix);

}  // namespace sbx::runtime
