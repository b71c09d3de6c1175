// NativeRuntime: boxes made of Linux namespaces, an overlay root, cgroups, dropped capabilities
// and a seccomp filter, with sbx-agent as PID 1. docs/isolation.md explains every setting.
//
// Thread-safe: Create, Destroy and the rest may be called from several threads at once; the
// shared pieces (agent image, seccomp program) are built once and then only read.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/fd.h"
#include "runtime/native/cgroup.h"
#include "runtime/runtime.h"

namespace sbx::runtime {

struct NativeConfig {
  std::string run_dir = "/var/lib/sbx/run";  // per-box directories: <run_dir>/<id>/
  std::string agent_path;                    // sbx-agent binary
  std::string cgroup_parent = "sbx";         // under the caller's own cgroup
  // Root inside maps to host uid/gid id_base; ids 0..65535 inside map to id_base..id_base+65535.
  uint32_t id_base = 1000000;
};

// The host uid that uid 0 inside a box maps to, for a given config (also used by templates to
// give their files to the box's root).
inline constexpr uint32_t kIdRange = 65536;

class NativeRuntime : public Runtime {
 public:
  // Probes cgroups and loads the agent image; fails with a message an operator can act on.
  static Result<std::unique_ptr<NativeRuntime>> Open(const NativeConfig& config);

  Result<Box> Create(const BoxSpec& spec) override;
  Status Freeze(const Box& box) override;
  Status Thaw(const Box& box) override;
  Result<BoxStats> Stats(const Box& box) override;
  Result<UniqueFd> OpenSocket(const Box& box, int domain, int type) override;
  Status Destroy(const Box& box) override;
  Result<int> ReapOrphans(const std::string& owner) override;
  Result<Box> Adopt(const std::string& id) override;
  Result<std::vector<std::string>> ListBoxes() override;

  const NativeConfig& config() const { return config_; }
  const CgroupHost& cgroup_host() const { return cgroups_; }

 private:
  NativeRuntime(NativeConfig config, CgroupHost cgroups, UniqueFd agent_image);
  Result<Box> CreateIn(const BoxSpec& spec, Box& box, std::unique_ptr<Cgroup>& cgroup);

  NativeConfig config_;
  CgroupHost cgroups_;
  UniqueFd agent_image_;  // sealed memfd: what a box execs can never be changed from inside
  std::mutex mu_;
  // Per live box created by this process: an open, flock()ed <dir>/owner file. The lock is
  // released by the kernel when this process dies, which is how ReapOrphans tells orphans.
  std::map<std::string, UniqueFd> owner_locks_;  // guarded by mu_
};

// Validates a box id: 1..64 characters of [a-z0-9-], not starting with '-'.
Status ValidateBoxId(const std::string& id);

}  // namespace sbx::runtime
