// The cgroup v2 driver: one directory per box in the unified hierarchy, under a parent that has
// the memory, cpu and pids controllers enabled for its children. docs/isolation.md ("Cgroups")
// lists every file written here and why.
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>

#include "common/fd.h"
#include "runtime/native/cgroup.h"
#include "runtime/native/cgroup_internal.h"

namespace sbx::runtime::cgroup_internal {
namespace {

constexpr const char* kV2Controllers[] = {"memory", "cpu", "pids"};

// Whether "key 1"-style cgroup.events says `key` is 1.
Result<bool> EventIsSet(const std::string& events, std::string_view key) {
  Result<uint64_t> v = ReadKeyedUint(events, key);
  if (!v.ok()) return v.status();
  return *v == 1;
}

class CgroupV2 final : public Cgroup {
 public:
  CgroupV2(const CgroupHost& host, const std::string& name, DriverOptions options)
      : options_(std::move(options)), parent_(host.v2_dir), dir_(host.v2_dir + "/" + name) {}

  // Makes the parent chain and the box's directory and writes `limits`; on failure removes the
  // box's directory (parents are shared and stay).
  Status Setup(const Limits& limits) {
    SBX_RETURN_IF_ERROR(EnsureParent(parent_));
    if (::mkdir(dir_.c_str(), 0755) != 0) return Status::Errno("mkdir " + dir_);
    if (options_.on_mkdir) options_.on_mkdir(dir_);
    Status s = WriteLimits(limits);
    if (s.ok()) s = OpenDirFd();
    if (!s.ok()) (void)Destroy();
    return s;
  }

  Status OpenDirFd() {
    fd_.reset(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd_) return Status::Errno("open " + dir_);
    return {};
  }

  Status AddProcess(pid_t pid) override {
    return WriteKnob(dir_ + "/cgroup.procs", std::to_string(pid));
  }

  Status Freeze() override {
    SBX_RETURN_IF_ERROR(WriteKnob(dir_ + "/cgroup.freeze", "1"));
    Status s = PollUntil([&]() { return EventIsSet(dir_ + "/cgroup.events", "frozen"); },
                         options_.freeze_timeout, "freeze " + dir_);
    if (!s.ok()) (void)WriteKnob(dir_ + "/cgroup.freeze", "0");  // half-frozen helps nobody
    return s;
  }

  Status Thaw() override { return WriteKnob(dir_ + "/cgroup.freeze", "0"); }

  Result<BoxStats> Stats() override {
    BoxStats stats;
    Result<uint64_t> usec = ReadKeyedUint(dir_ + "/cpu.stat", "usage_usec");
    if (!usec.ok()) return usec.status();
    stats.cpu_usage_ns = *usec * 1000;
    Result<uint64_t> current = ReadUint(dir_ + "/memory.current");
    if (!current.ok()) return current.status();
    stats.memory_current = *current;
    if (Exists(dir_ + "/memory.peak")) {  // since Linux 5.19
      Result<uint64_t> peak = ReadUint(dir_ + "/memory.peak");
      if (!peak.ok()) return peak.status();
      stats.memory_peak = *peak;
    }
    Result<uint64_t> pids = ReadUint(dir_ + "/pids.current");
    if (!pids.ok()) return pids.status();
    stats.pids_current = *pids;
    Result<uint64_t> ooms = OomKills();
    if (!ooms.ok()) return ooms.status();
    stats.oom_kills = *ooms;
    if (auto events = ReadKeyedUint(dir_ + "/memory.events", "oom"); events.ok())
      stats.ooms = *events;
    Result<uint64_t> frozen = ReadKeyedUint(dir_ + "/cgroup.events", "frozen");
    stats.frozen = frozen.ok() && *frozen != 0;
    return stats;
  }

  Result<uint64_t> OomKills() override {
    return ReadKeyedUint(dir_ + "/memory.events", "oom_kill");
  }

  Status KillAll() override {
    if (!Exists(dir_)) return {};
    const std::vector<std::string> procs = {dir_ + "/cgroup.procs"};
    if (Exists(dir_ + "/cgroup.kill")) {  // since Linux 5.14: kills the whole subtree at once
      Status s = WriteKnob(dir_ + "/cgroup.kill", "1");
      if (!s.ok() && Exists(dir_)) return s;
    } else {
      // Frozen tasks cannot fork, so one pass over cgroup.procs sees them all.
      (void)Freeze();
      Result<size_t> killed = KillListed(procs);
      Status s = Thaw();
      if (!s.ok() && Exists(dir_)) return s.Wrap("kill tasks of " + dir_);
      if (!killed.ok()) return killed.status();
    }
    return PollUntil(
        [&]() -> Result<bool> {
          Result<size_t> left = KillListed(procs);
          if (!left.ok()) return left.status();
          if (*left > 0) return false;
          if (!Exists(dir_ + "/cgroup.events")) return true;  // the cgroup is gone
          Result<bool> populated = EventIsSet(dir_ + "/cgroup.events", "populated");
          if (!populated.ok()) return populated.status();
          return !*populated;
        },
        options_.kill_timeout, "wait for the tasks of cgroup " + dir_ + " to exit");
  }

  Status Destroy() override {
    SBX_RETURN_IF_ERROR(KillAll());
    fd_.reset();
    return RemoveCgroupDir(dir_, options_);
  }

  std::vector<std::string> Paths() const override { return {dir_}; }

  Status SetLimits(const Limits& limits) override { return WriteLimits(limits, true); }
  int DirFd() const override { return fd_.get(); }

 private:
  // mkdir -p for the parent chain, enabling the controllers in each level's subtree_control on the
  // way down (a child can only use what its parent enabled). The first level that exists is our
  // own cgroup or below it.
  Status EnsureParent(const std::string& dir) {
    if (!Exists(dir)) {
      size_t slash = dir.find_last_of('/');
      if (slash == std::string::npos || slash == 0) return Status::Error("mkdir " + dir, ENOENT);
      SBX_RETURN_IF_ERROR(EnsureParent(dir.substr(0, slash)));
      if (::mkdir(dir.c_str(), 0755) != 0) {
        if (errno != EEXIST) return Status::Errno("mkdir " + dir);
      } else if (options_.on_mkdir) {
        options_.on_mkdir(dir);
      }
    }
    return EnableControllers(dir);
  }

  Status EnableControllers(const std::string& dir) {
    const std::string knob = dir + "/cgroup.subtree_control";
    Result<std::string> enabled = ReadFile(knob, 4096);
    if (!enabled.ok()) return enabled.status();
    std::istringstream tokens(*enabled);
    std::vector<std::string> present{std::istream_iterator<std::string>(tokens),
                                     std::istream_iterator<std::string>()};
    std::string want;
    for (const char* c : kV2Controllers) {
      if (std::find(present.begin(), present.end(), c) != present.end()) continue;
      want += (want.empty() ? "+" : " +") + std::string(c);
    }
    if (want.empty()) return {};
    Status s = WriteKnob(knob, want);
    if (!s.ok() && s.err() == EBUSY) {
      return s.Wrap(
          "cgroup " + dir +
          " holds processes, and cgroup v2 forbids enabling controllers for the children of such a "
          "cgroup (no internal processes); run sbx in a leaf cgroup of its own and give it a "
          "parent cgroup without processes");
    }
    return s;
  }

  // `reset`: the cgroup has had limits (SetLimits), so a field of 0 writes "no limit" back.
  Status WriteLimits(const Limits& limits, bool reset = false) {
    if (limits.memory_bytes > 0 || reset) {
      SBX_RETURN_IF_ERROR(WriteKnob(dir_ + "/memory.max", limits.memory_bytes > 0
                                                              ? std::to_string(limits.memory_bytes)
                                                              : "max"));
    }
    // Absent when the kernel has no swap accounting; then there is no swap control to set.
    if (Exists(dir_ + "/memory.swap.max")) {
      SBX_RETURN_IF_ERROR(WriteKnob(dir_ + "/memory.swap.max", "0"));
    }
    const int64_t quota = CpuQuotaUs(limits.cpus);
    SBX_RETURN_IF_ERROR(WriteKnob(dir_ + "/cpu.max", (quota > 0 ? std::to_string(quota) : "max") +
                                                         " " + std::to_string(kCpuPeriodUs)));
    if (limits.cpu_weight > 0 || reset) {
      SBX_RETURN_IF_ERROR(WriteKnob(
          dir_ + "/cpu.weight", std::to_string(limits.cpu_weight > 0 ? limits.cpu_weight : 100)));
    }
    if (limits.pids > 0 || reset) {
      SBX_RETURN_IF_ERROR(
          WriteKnob(dir_ + "/pids.max", limits.pids > 0 ? std::to_string(limits.pids) : "max"));
    }
    return {};
  }

  DriverOptions options_;
  std::string parent_;
  std::string dir_;
  UniqueFd fd_;  // dir_, for clone3(CLONE_INTO_CGROUP)
};

}  // namespace

Result<std::unique_ptr<Cgroup>> CreateV2(const CgroupHost& host, const std::string& name,
                                         const Limits& limits, const DriverOptions& options) {
  SBX_RETURN_IF_ERROR(ValidateRequest(name, limits).Wrap("create cgroup"));
  if (host.v2_dir.empty()) return Status::Error("create cgroup: host has no v2 directory", EINVAL);
  auto cgroup = std::make_unique<CgroupV2>(host, name, options);
  SBX_RETURN_IF_ERROR(cgroup->Setup(limits).Wrap("create cgroup " + name));
  return std::unique_ptr<Cgroup>(std::move(cgroup));
}

std::unique_ptr<Cgroup> OpenV2(const CgroupHost& host, const std::string& name,
                               const DriverOptions& options) {
  auto cgroup = std::make_unique<CgroupV2>(host, name, options);
  (void)cgroup->OpenDirFd();  // -1 when the cgroup is gone; Destroy still works
  return cgroup;
}

}  // namespace sbx::runtime::cgroup_internal
