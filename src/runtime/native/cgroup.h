// Cgroup drivers for the native runtime: one interface, a v1 driver (controllers mounted
// separately, as on hosts in hybrid mode) and a v2 driver (the unified hierarchy). Probe() looks at
// the host and picks the one that has the memory, cpu, pids and freezer controllers.
//
// Layout: every box gets `<controller root>/<parent>/<name>` in each hierarchy it needs, where
// `parent` is relative to the cgroup the calling process is in (so sbx nests under whatever
// cgroup its operator put it in) and defaults to "sbx". docs/isolation.md lists every file written.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/runtime.h"

namespace sbx::runtime {

enum class CgroupVersion { kV1, kV2 };

// Where the hierarchies are. Tests point these at a scratch directory laid out like cgroupfs.
struct CgroupHost {
  CgroupVersion version = CgroupVersion::kV2;
  // v2: the directory under which boxes' cgroups are made (already including the parent).
  // v1: the same, per controller: controller name ("memory", "cpu", "cpuacct", "pids",
  //     "freezer") -> directory.
  std::string v2_dir;
  std::vector<std::pair<std::string, std::string>> v1_dirs;
};

// Finds the host's cgroup layout (reads /proc/self/mountinfo and /proc/self/cgroup) and returns
// where boxes' cgroups go under `parent`. Fails with a clear message when a required controller
// (memory, cpu, pids, freezer) is in neither hierarchy.
Result<CgroupHost> ProbeCgroupHost(const std::string& parent = "sbx");

class Cgroup {
 public:
  virtual ~Cgroup() = default;
  // Creates the box's cgroup(s) with `limits` applied. On failure removes what it created.
  static Result<std::unique_ptr<Cgroup>> Create(const CgroupHost& host, const std::string& name,
                                                const Limits& limits);
  // Re-opens the cgroup(s) of an existing box (after a daemon restart); does not create anything.
  static std::unique_ptr<Cgroup> Open(const CgroupHost& host, const std::string& name);

  virtual Status AddProcess(pid_t pid) = 0;
  virtual Status Freeze() = 0;  // returns once every task is frozen
  virtual Status Thaw() = 0;
  virtual Result<BoxStats> Stats() = 0;
  virtual Result<uint64_t> OomKills() = 0;  // BoxStats::oom_kills alone
  // Writes `limits` over the ones the cgroup has (a field of 0: no limit, or the default weight).
  // The caller validates them (as Create does). A memory limit below what the cgroup uses makes
  // the kernel reclaim, and fails (EBUSY) where it cannot.
  virtual Status SetLimits(const Limits& limits) = 0;
  // Kills every process in the cgroup(s) (SIGKILL; frozen tasks are thawed so they die) and waits
  // until they are gone, up to a few seconds.
  virtual Status KillAll() = 0;
  // KillAll(), then removes the directories. Idempotent: missing directories are fine.
  virtual Status Destroy() = 0;
  // Every directory this cgroup owns (for leak checks and reconciliation).
  virtual std::vector<std::string> Paths() const = 0;
  // v2: a directory fd of the box's cgroup for clone3(CLONE_INTO_CGROUP), owned by this object
  // and valid until it is destroyed or Destroy() runs. v1 (no such mechanism) and a cgroup that
  // does not exist: -1.
  virtual int DirFd() const { return -1; }
};

}  // namespace sbx::runtime
