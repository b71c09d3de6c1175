// The capabilities root keeps inside a native box, and the drop that enforces them.
//
// The set is Docker's default minus CAP_NET_RAW, CAP_MKNOD and CAP_SYS_CHROOT; why each one is
// kept or dropped is in docs/isolation-seccomp.md. The plan is prepared in the parent (it reads
// /proc) and executed in the child between clone() and exec, where only raw system calls are
// allowed.
#pragma once

#include <cstdint>

#include "common/status.h"

namespace sbx::runtime {

// Bit mask (1 << CAP_x) of the capabilities root keeps in a box.
uint64_t KeptCapabilities();

// Everything DropCapabilities() needs, computed before clone().
struct CapabilityPlan {
  int last_cap = 0;   // highest capability the running kernel knows (/proc/sys/kernel/cap_last_cap)
  uint64_t keep = 0;  // capabilities kept in bounding, effective and permitted
};

// The plan for this kernel with KeptCapabilities(). Read once, then the same object is returned
// for the life of the process; thread-safe. Call it in the parent before clone().
const Result<CapabilityPlan>& DefaultCapabilityPlan();

// Async-signal-safe (raw prctl/capset only, no allocation): drops every capability not in
// plan.keep from the bounding set, clears the ambient set, then sets effective = permitted =
// plan.keep and inheritable = 0. Needs CAP_SETPCAP in the caller's effective set. Returns 0 or
// -errno.
int DropCapabilities(const CapabilityPlan& plan);

}  // namespace sbx::runtime
