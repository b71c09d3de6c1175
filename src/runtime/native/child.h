// The code that runs in the box's first process between clone() and the exec of sbx-agent.
//
// The parent may be multi-threaded (the daemon), so everything here is async-signal-safe: raw
// system calls on memory prepared by the parent, no allocation, no locks, no logging, no
// exceptions. Failures are reported to the parent as {step, errno} on the status pipe.
#pragma once

#include <linux/filter.h>
#include <sys/resource.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/native/capabilities.h"
#include "runtime/native/mount_plan.h"

namespace sbx::runtime {

// What the child reports when a step fails. The parent maps `step` back to a description.
struct ChildFailure {
  int32_t step;
  int32_t err;
};

// Step numbers >= 0 index ChildPlan::ops; negative ones name the fixed steps.
enum ChildStep : int32_t {
  kStepWaitParent = -1,
  kStepSetIds = -2,
  kStepCgroupNs = -3,
  kStepPrivate = -4,
  kStepPivot = -5,
  kStepHostname = -6,
  kStepRlimits = -7,
  kStepCaps = -8,
  kStepNoNewPrivs = -9,
  kStepSeccomp = -10,
  kStepFds = -11,
  kStepExec = -12,
  kStepLoopback = -13,
  kStepUserLimits = -14,
  kStepBoxDir = -15,
};

// At most this many descriptors reach the child with its go-ahead: its box directory, one
// detached mount per lower layer (kMaxLayers) and bind (kMaxBinds), and one of its writable
// layer (MountPlanInput::writable_mount). They come in messages of at most kMaxFdsPerMessage
// (the kernel takes at most 253 per SCM_RIGHTS message).
inline constexpr size_t kMaxBinds = 64;
inline constexpr size_t kMaxSetupFds = 1 + kMaxLayers + kMaxBinds + 1;
inline constexpr size_t kMaxFdsPerMessage = 250;

const char* ChildStepName(int32_t step);

// Everything the child needs, as C pointers into storage the parent keeps alive until the child
// has exec'd or failed (the child sees a copy-on-write copy of the parent's memory).
struct ChildPlan {
  struct Op {
    MountOp::Kind kind;
    const char* source;  // nullptr when empty
    const char* target;
    const char* fstype;
    unsigned long flags;
    const char* data;
    bool optional;
    int fd_index;  // kAttach: which received mount (0 = the first layer); kOverlay: layer count
    bool in_root;  // target inside the new root (MountOp::in_root)
    bool source_in_root;
    const char* stacked;  // kOverlay: MountOp::stacked, nullptr when empty
  };
  const Op* ops = nullptr;
  size_t op_count = 0;
  const char* root = nullptr;  // new root, relative to the box directory
  // The root's overlay takes its layers one fsconfig(lowerdir+) each (OverlayHasLowerdirPlus),
  // else one option string (shortened: the layers' names relative to lower/).
  bool lowerdir_plus = false;
  const char* hostname = nullptr;
  struct Rlimit {
    int resource;
    rlimit value;
  };
  const Rlimit* rlimits = nullptr;
  size_t rlimit_count = 0;
  // Files of /proc/sys/user written inside the box's user namespace (its own limits).
  struct Sysctl {
    const char* path;
    const char* value;
  };
  const Sysctl* sysctls = nullptr;
  size_t sysctl_count = 0;
  const sock_fprog* seccomp = nullptr;
  CapabilityPlan caps;           // what root keeps (capabilities.h)
  bool die_with_parent = false;  // PR_SET_PDEATHSIG(SIGKILL)
  // Descriptors in the parent, placed by the child as: 0 <- stdin_fd, 1 and 2 <- log_fd,
  // 3 <- listen_fd. status_fd and agent_fd are kept close-on-exec; all others are closed.
  int stdin_fd = -1;
  int log_fd = -1;
  int listen_fd = -1;
  int status_fd = -1;  // write end of the status pipe
  // The child's end of a unix socket on which the parent sends its go-ahead (once the id maps are
  // written) with 1 + mount_count descriptors: an O_PATH descriptor of the box's directory as
  // seen in the child's own mount namespace (the child cannot walk host paths to it), then the
  // detached mounts the ops attach. Messages of at most kMaxFdsPerMessage descriptors, each with
  // one byte: 'm' (more follow) or 'g' (the last).
  int setup_fd = -1;
  size_t mount_count = 0;
  int agent_fd = -1;  // sealed memfd holding sbx-agent
  char* const* argv = nullptr;
  char* const* envp = nullptr;
};

// Owns the strings and arrays a ChildPlan points into.
class ChildPlanStorage {
 public:
  // Copies `ops` into storage and returns the plan (other fields are filled by the caller).
  ChildPlan Build(const std::vector<MountOp>& ops, const std::string& root,
                  const std::string& hostname, const std::vector<std::string>& argv);
  const std::vector<MountOp>& ops() const { return ops_; }

 private:
  std::vector<MountOp> ops_;
  std::vector<ChildPlan::Op> cops_;
  std::string root_, hostname_;
  std::vector<std::string> argv_strings_;
  std::vector<char*> argv_;
  std::vector<char*> envp_;
};

// Whether this kernel's overlayfs takes lower layers one at a time with
// fsconfig(FSCONFIG_SET_STRING, "lowerdir+") (Linux 6.8+), free of the one-page limit of the
// lowerdir option. Probed once.
bool OverlayHasLowerdirPlus();

// Runs in the child after clone(); never returns: execs sbx-agent or _exit(127)s.
[[noreturn]] void RunChild(const ChildPlan& plan);

// The child of ProbeIdmappedLayers (idmap.h): receives its directory and an idmapped layer on
// `sock`, mounts an overlay over it and copies its file up. Exits 0 when all of it worked, else
// the number of the step that failed (ProbeStepName).
[[noreturn]] void RunProbeChild(int sock);
const char* ProbeStepName(int step);

}  // namespace sbx::runtime
