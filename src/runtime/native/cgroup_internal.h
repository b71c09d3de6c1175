// Private to the cgroup drivers (cgroup.cc, cgroup_v1.cc, cgroup_v2.cc) and their tests: the pure
// parsers behind ProbeCgroupHost, the knobs tests use to run the drivers against a scratch
// directory, and the file helpers both drivers share. docs/isolation.md lists every file written.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "runtime/native/cgroup.h"

namespace sbx::runtime::cgroup_internal {

// ---- Probe: pure functions over the text of /proc/self/mountinfo and /proc/self/cgroup. ----

// One cgroup or cgroup2 line of /proc/self/mountinfo.
struct CgroupMount {
  bool v2 = false;
  std::string root;                      // field 4: the cgroup that is the mount's root
  std::string mount_point;               // field 5, octal escapes (\040) decoded
  std::vector<std::string> controllers;  // v1: super options ("cpu", "cpuacct", "name=systemd")
};
std::vector<CgroupMount> ParseMountInfo(std::string_view mountinfo);

// One line of /proc/self/cgroup: "id:controller,controller:/path". The v2 line has id 0 and no
// controllers.
struct ProcCgroupEntry {
  int id = 0;
  std::vector<std::string> controllers;
  std::string path;
};
std::vector<ProcCgroupEntry> ParseProcCgroup(std::string_view proc_self_cgroup);

// Reads a file, or nullopt when it cannot be read. The probe reads cgroup.controllers,
// cgroup.freeze and the kernel release through this so tests can answer from a map.
using FileReader = std::function<std::optional<std::string>(const std::string& path)>;

// The decision behind ProbeCgroupHost: v2 when the unified hierarchy offers memory, cpu and pids
// to our cgroup and has the v2 freezer; else v1 when memory, cpu, cpuacct, pids and freezer each
// have a v1 mount; else an error naming the first missing controller. `parent` is relative to our
// own cgroup in each hierarchy.
Result<CgroupHost> ResolveCgroupHost(std::string_view mountinfo, std::string_view proc_self_cgroup,
                                     const std::string& parent, const FileReader& read);

// ---- Drivers ----

struct DriverOptions {
  // Called after the driver makes a directory (parents and the box's own). Tests use it to lay
  // out the files the kernel would create, since a scratch directory has none.
  std::function<void(const std::string& dir)> on_mkdir;
  // Called before the driver removes a directory: tests remove the files the kernel would take
  // with it (rmdir of a real cgroup succeeds despite its knob files).
  std::function<void(const std::string& dir)> before_rmdir;
  // How long Freeze waits for every task to be frozen, and KillAll for the cgroup to empty.
  std::chrono::milliseconds freeze_timeout{5000};
  std::chrono::milliseconds kill_timeout{5000};
  // How long Destroy retries rmdir while it fails with EBUSY (tasks still on their way out).
  std::chrono::milliseconds rmdir_timeout{1000};
};

Result<std::unique_ptr<Cgroup>> CreateV1(const CgroupHost& host, const std::string& name,
                                         const Limits& limits, const DriverOptions& options);
std::unique_ptr<Cgroup> OpenV1(const CgroupHost& host, const std::string& name,
                               const DriverOptions& options);
Result<std::unique_ptr<Cgroup>> CreateV2(const CgroupHost& host, const std::string& name,
                                         const Limits& limits, const DriverOptions& options);
std::unique_ptr<Cgroup> OpenV2(const CgroupHost& host, const std::string& name,
                               const DriverOptions& options);

// ---- Shared helpers ----

inline constexpr int64_t kMinMemoryBytes = 4 << 20;  // below this a box cannot even start
inline constexpr int64_t kCpuPeriodUs = 100000;      // CFS period for both versions
inline constexpr int64_t kMinCpuQuotaUs = 1000;      // the kernel rejects smaller quotas

// Checks a box name (one path component) and limits before anything touches the filesystem.
Status ValidateRequest(const std::string& name, const Limits& limits);
// cpus -> CFS quota in microseconds per kCpuPeriodUs; 0 when there is no quota.
int64_t CpuQuotaUs(double cpus);
// v2 cpu.weight (1..10000, 0 = default 100) -> v1 cpu.shares (default 1024), linear, clamped to
// the kernel's 2..262144.
int64_t WeightToShares(int64_t weight);

// Writes `value` to an existing knob in one write(2) (no O_CREAT: a missing knob is an error, not
// a new file). The Status names the file and the value.
Status WriteKnob(const std::string& path, std::string_view value);
bool Exists(const std::string& path);
// Reads a knob holding one unsigned integer ("max" is an error).
Result<uint64_t> ReadUint(const std::string& path);
// Reads "key value" lines (cpu.stat, memory.events, memory.oom_control) and returns the value of
// `key`, or 0 when the key is absent.
Result<uint64_t> ReadKeyedUint(const std::string& path, std::string_view key);
// Pids listed in a cgroup.procs file; a missing file (the cgroup is gone) is an empty list.
Result<std::vector<pid_t>> ReadProcs(const std::string& path);
// mkdir -p: makes each missing component, calling options.on_mkdir for each one it made.
Status MakeDirs(const std::string& dir, const DriverOptions& options);
// rmdir that treats a missing directory as done and retries EBUSY until options.rmdir_timeout.
Status RemoveCgroupDir(const std::string& dir, const DriverOptions& options);
// Calls `done` every few milliseconds until it returns true, fails, or `timeout` passes; the
// final timeout is ETIMEDOUT naming `what`.
Status PollUntil(const std::function<Result<bool>()>& done, std::chrono::milliseconds timeout,
                 const std::string& what);
// SIGKILLs every pid listed in the cgroup.procs files at `procs_paths`; returns how many it listed.
Result<size_t> KillListed(const std::vector<std::string>& procs_paths);

}  // namespace sbx::runtime::cgroup_internal
