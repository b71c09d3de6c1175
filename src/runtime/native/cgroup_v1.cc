// The cgroup v1 driver: one directory per box in each of the memory, cpu, cpuacct, pids and
// freezer hierarchies (cpu and cpuacct usually share one). docs/isolation.md ("Cgroups") lists
// every file written here and why.
#include <sys/stat.h>

#include <algorithm>
#include <string>
#include <utility>

#include "common/fd.h"
#include "runtime/native/cgroup.h"
#include "runtime/native/cgroup_internal.h"

namespace sbx::runtime::cgroup_internal {
namespace {

constexpr const char* kV1Controllers[] = {"memory", "cpu", "cpuacct", "pids", "freezer"};

class CgroupV1 final : public Cgroup {
 public:
  CgroupV1(const CgroupHost& host, const std::string& name, DriverOptions options)
      : options_(std::move(options)) {
    for (const auto& [controller, parent] : host.v1_dirs) {
      std::string dir = parent + "/" + name;
      controller_dirs_.emplace_back(controller, dir);
      if (std::find(dirs_.begin(), dirs_.end(), dir) == dirs_.end()) {
        dirs_.push_back(dir);
        parents_.push_back(parent);
      }
    }
  }

  // Makes the directories and writes `limits`; on failure removes every directory it made.
  Status Setup(const Limits& limits) {
    for (const std::string& parent : parents_) {
      SBX_RETURN_IF_ERROR(MakeDirs(parent, options_).Wrap("create cgroup parent"));
    }
    for (size_t i = 0; i < dirs_.size(); ++i) {
      if (::mkdir(dirs_[i].c_str(), 0755) != 0) {
        Status s = Status::Errno("mkdir " + dirs_[i]);
        for (size_t j = i; j-- > 0;) (void)RemoveCgroupDir(dirs_[j], options_);
        return s;
      }
      if (options_.on_mkdir) options_.on_mkdir(dirs_[i]);
    }
    Status s = WriteLimits(limits);
    if (!s.ok()) (void)Destroy();
    return s;
  }

  Status AddProcess(pid_t pid) override {
    for (const std::string& dir : dirs_) {
      SBX_RETURN_IF_ERROR(WriteKnob(dir + "/cgroup.procs", std::to_string(pid)));
    }
    return {};
  }

  Status Freeze() override {
    const std::string state = Dir("freezer") + "/freezer.state";
    SBX_RETURN_IF_ERROR(WriteKnob(state, "FROZEN"));
    Status s = PollUntil(
        [&]() -> Result<bool> {
          Result<std::string> text = ReadFile(state, 64);
          if (!text.ok()) return text.status();
          if (text->starts_with("FROZEN")) return true;
          // Still FREEZING: a task was busy (e.g. in a vfork). Writing FROZEN again retries it.
          SBX_RETURN_IF_ERROR(WriteKnob(state, "FROZEN"));
          return false;
        },
        options_.freeze_timeout, "freeze " + Dir("freezer"));
    if (!s.ok()) (void)WriteKnob(state, "THAWED");  // half-frozen helps nobody
    return s;
  }

  Status Thaw() override { return WriteKnob(Dir("freezer") + "/freezer.state", "THAWED"); }

  Result<BoxStats> Stats() override {
    BoxStats stats;
    const std::string mem = Dir("memory");
    Result<uint64_t> cpu = ReadUint(Dir("cpuacct") + "/cpuacct.usage");
    if (!cpu.ok()) return cpu.status();
    stats.cpu_usage_ns = *cpu;
    Result<uint64_t> current = ReadUint(mem + "/memory.usage_in_bytes");
    if (!current.ok()) return current.status();
    stats.memory_current = *current;
    Result<uint64_t> peak = ReadUint(mem + "/memory.max_usage_in_bytes");
    if (!peak.ok()) return peak.status();
    stats.memory_peak = *peak;
    Result<uint64_t> pids = ReadUint(Dir("pids") + "/pids.current");
    if (!pids.ok()) return pids.status();
    stats.pids_current = *pids;
    Result<uint64_t> ooms = OomKills();
    if (!ooms.ok()) return ooms.status();
    stats.oom_kills = *ooms;
    Result<std::string> state = ReadFile(Dir("freezer") + "/freezer.state", 64);
    stats.frozen = state.ok() && !state->starts_with("THAWED");
    return stats;
  }

  Result<uint64_t> OomKills() override {
    return ReadKeyedUint(Dir("memory") + "/memory.oom_control", "oom_kill");
  }

  Status KillAll() override {
    const std::string freezer = Dir("freezer");
    const bool can_freeze = Exists(freezer);
    // Frozen tasks cannot fork, so one pass over cgroup.procs sees them all. If freezing times out
    // we kill anyway; the poll below catches whatever forked meanwhile.
    if (can_freeze) (void)Freeze();
    std::vector<std::string> procs;
    for (const std::string& dir : dirs_) procs.push_back(dir + "/cgroup.procs");
    Result<size_t> killed = KillListed(procs);
    if (can_freeze) {
      Status s = Thaw();
      if (!s.ok() && Exists(freezer)) return s.Wrap("kill tasks of " + freezer);
    }
    if (!killed.ok()) return killed.status();
    return PollUntil(
        [&]() -> Result<bool> {
          Result<size_t> left = KillListed(procs);
          if (!left.ok()) return left.status();
          return *left == 0;
        },
        options_.kill_timeout, "wait for the tasks of cgroup " + dirs_.front() + " to exit");
  }

  Status Destroy() override {
    SBX_RETURN_IF_ERROR(KillAll());
    Status first;
    for (auto it = dirs_.rbegin(); it != dirs_.rend(); ++it) {
      Status s = RemoveCgroupDir(*it, options_);
      if (!s.ok() && first.ok()) first = s;
    }
    return first;
  }

  std::vector<std::string> Paths() const override { return dirs_; }

  Status SetLimits(const Limits& limits) override { return WriteLimits(limits, true); }

 private:
  // `reset`: the cgroup has had limits (SetLimits), so a field of 0 writes "no limit" back.
  Status WriteLimits(const Limits& limits, bool reset = false) {
    const std::string mem = Dir("memory");
    if (limits.memory_bytes > 0 || reset) {
      const std::string bytes =
          limits.memory_bytes > 0 ? std::to_string(limits.memory_bytes) : "-1";
      // memory+swap capped at the memory limit leaves no room for swap. Without swap accounting
      // (no memsw files) the best we can do is tell reclaim not to swap this cgroup. The kernel
      // keeps memory <= memory+swap at every write: a limit that grows moves memsw first.
      const std::string memsw = mem + "/memory.memsw.limit_in_bytes";
      const bool has_memsw = Exists(memsw);
      auto now = ReadUint(mem + "/memory.limit_in_bytes");
      const bool grows = limits.memory_bytes <= 0 ||
                         (now.ok() && static_cast<uint64_t>(limits.memory_bytes) > *now);
      if (has_memsw && grows) SBX_RETURN_IF_ERROR(WriteKnob(memsw, bytes));
      SBX_RETURN_IF_ERROR(WriteKnob(mem + "/memory.limit_in_bytes", bytes));
      if (has_memsw && !grows) {
        SBX_RETURN_IF_ERROR(WriteKnob(memsw, bytes));
      } else if (!has_memsw && Exists(mem + "/memory.swappiness")) {
        SBX_RETURN_IF_ERROR(WriteKnob(mem + "/memory.swappiness", "0"));
      }
    } else if (Exists(mem + "/memory.swappiness")) {
      SBX_RETURN_IF_ERROR(WriteKnob(mem + "/memory.swappiness", "0"));
    }

    const std::string cpu = Dir("cpu");
    SBX_RETURN_IF_ERROR(WriteKnob(cpu + "/cpu.cfs_period_us", std::to_string(kCpuPeriodUs)));
    const int64_t quota = CpuQuotaUs(limits.cpus);
    SBX_RETURN_IF_ERROR(
        WriteKnob(cpu + "/cpu.cfs_quota_us", quota > 0 ? std::to_string(quota) : "-1"));
    if (limits.cpu_weight > 0 || reset) {
      SBX_RETURN_IF_ERROR(WriteKnob(
          cpu + "/cpu.shares",
          std::to_string(WeightToShares(limits.cpu_weight > 0 ? limits.cpu_weight : 100))));
    }

    if (limits.pids > 0 || reset) {
      SBX_RETURN_IF_ERROR(WriteKnob(Dir("pids") + "/pids.max",
                                    limits.pids > 0 ? std::to_string(limits.pids) : "max"));
    }
    return {};
  }

  // The box's directory in the hierarchy that has `controller`. The host was checked in CreateV1
  // (and Open gets hosts from ProbeCgroupHost), so the lookup only misses on a malformed host; an
  // empty string then makes every file operation fail with a path that shows why.
  std::string Dir(std::string_view controller) const {
    for (const auto& [c, dir] : controller_dirs_) {
      if (c == controller) return dir;
    }
    return std::string("<no ") + std::string(controller) + " hierarchy>";
  }

  DriverOptions options_;
  std::vector<std::pair<std::string, std::string>> controller_dirs_;  // controller -> box dir
  std::vector<std::string> dirs_;     // distinct box dirs, in host.v1_dirs order
  std::vector<std::string> parents_;  // the parent of each of dirs_
};

}  // namespace

Result<std::unique_ptr<Cgroup>> CreateV1(const CgroupHost& host, const std::string& name,
                                         const Limits& limits, const DriverOptions& options) {
  SBX_RETURN_IF_ERROR(ValidateRequest(name, limits).Wrap("create cgroup"));
  for (const char* controller : kV1Controllers) {
    bool found = std::any_of(host.v1_dirs.begin(), host.v1_dirs.end(),
                             [&](const auto& entry) { return entry.first == controller; });
    if (!found) {
      return Status::Error(
          std::string("create cgroup: host has no v1 ") + controller + " directory", EINVAL);
    }
  }
  auto cgroup = std::make_unique<CgroupV1>(host, name, options);
  SBX_RETURN_IF_ERROR(cgroup->Setup(limits).Wrap("create cgroup " + name));
  return std::unique_ptr<Cgroup>(std::move(cgroup));
}

std::unique_ptr<Cgroup> OpenV1(const CgroupHost& host, const std::string& name,
                               const DriverOptions& options) {
  return std::make_unique<CgroupV1>(host, name, options);
}

}  // namespace sbx::runtime::cgroup_internal
