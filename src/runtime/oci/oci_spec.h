// The config.json of a box's OCI bundle: what OciRuntime hands runc or runsc. A pure function of
// its input (no filesystem, no processes), so every field is testable on its own; the host side
// (overlay root, idmapped mounts, user namespace, agent socket) is prepared by oci_runtime.cc.
// docs/isolation.md, "The oci runtime (gVisor, runc)", explains each setting and how it differs
// from the native runtime's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/native/seccomp_policy.h"
#include "runtime/runtime.h"

namespace sbx::runtime {

// Which OCI runtime binary the bundle is for: the settings that differ are named where they are
// made in oci_spec.cc.
enum class OciKind { kRunc, kGvisor };

// A host path mounted into the box by the OCI runtime (a bind).
struct OciBind {
  std::string source;  // host path (an idmapped mount the runtime prepared, or the spec's own)
  std::string target;  // absolute path inside the box
  bool read_only = true;
};

struct OciSpecInput {
  OciKind kind = OciKind::kRunc;
  std::string hostname = "sbx";
  std::string root;               // host path of the box's root (the overlay mounted on the host)
  std::vector<std::string> args;  // the container's one process: sbx-agent and its flags
  std::vector<OciBind> binds;     // after the standard mounts, in order
  // Root inside maps to host id `id_base` (uid and gid 0..65535 inside to id_base..+65535).
  uint32_t id_base = 0;
  // The user namespace to join ("/proc/<pid>/ns/user" of a process that holds one with the same
  // mapping): the box's namespace is then owned by that process's user, not by root. "": the OCI
  // runtime makes one. runc joins it; runsc makes its own for the gofer either way.
  std::string userns_path;
  // The network namespace to join ("/proc/<pid>/ns/net"), one sbx gave the box's link already
  // (gVisor's `--network=sandbox` takes the links it finds there at create). "": a new one.
  std::string netns_path;
  Limits limits;
  // RLIMIT_NOFILE's hard limit in the box: the native runtime's 65536, or the caller's own hard
  // limit where that is lower (a limit cannot be raised from inside a user namespace).
  int64_t nofile = 65536;
  std::string cgroups_path;  // linux.cgroupsPath
  // The native filter's rules, written as linux.seccomp (nullptr: none).
  const SeccompRules* seccomp = nullptr;
};

// The bundle's config.json, serialised.
std::string BuildOciSpec(const OciSpecInput& in);

// linux.seccomp of `rules`, serialised: default action ERRNO(default_errno), x86_64 only, one
// entry per rule in the builder's order (consecutive unconditional rules with one action merged).
std::string SeccompToOciJson(const SeccompRules& rules);

// "CAP_CHOWN", ... for each bit set in `mask` (1 << CAP_x), lowest first. Bits the table does
// not know are skipped.
std::vector<std::string> CapabilityNames(uint64_t mask);

// The host pids limit of a gVisor sandbox whose box may run `pids` processes: under the ptrace
// platform every process of the box costs the sandbox several host threads (measured: 300
// sleeping processes, 2637 host tasks), so the box's own figure cannot be the host's. 0 stays 0.
int64_t GvisorHostPids(int64_t pids);

}  // namespace sbx::runtime
