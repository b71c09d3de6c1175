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
#include <thread>
#include <vector>

#include "common/fd.h"
#include "common/thread_annotations.h"
#include "runtime/id_pool.h"
#include "runtime/native/cgroup.h"
#include "runtime/runtime.h"

namespace sbx::runtime {

struct NativeConfig {
  std::string run_dir = "/var/lib/sbx/run";  // per-box directories: <run_dir>/<id>/ (root-only)
  std::string agent_path;                    // sbx-agent binary
  std::string cgroup_parent = "sbx";         // under the caller's own cgroup
  // The shared legacy base: root inside a box maps to host uid/gid id_base (ids 0..65535 inside
  // to id_base..id_base+65535) for boxes whose spec names no range when there is no pool, and for
  // every box in the fallback (idmapped mounts unavailable or `idmap` false).
  uint32_t id_base = 1000000;
  // Where boxes whose spec names no range get their private one (not owned; must outlive the
  // runtime). nullptr: they share id_base.
  IdPool* id_pool = nullptr;
  // The run directories of the other runtimes whose boxes take ranges from id_pool (the oci
  // runtimes'). ReapOrphans frees a held range whose box directory is gone; gone means from
  // run_dir and from each of these.
  std::vector<std::string> peer_run_dirs;
  // false forces the fallback (no idmapped mounts), as when Open's probe finds them unavailable.
  bool idmap = true;
  // false: the root's overlay always gets its layers as one lowerdir option string, as on
  // kernels without overlayfs' lowerdir+ (before 6.8). For tests of that path.
  bool overlay_lowerdir_plus = true;
  // false: writable layers are plain directories and disk limits ext4 images even when run_dir
  // is on btrfs (where they are otherwise subvolumes with qgroup limits; btrfs.h).
  bool btrfs = true;
};

// How many host ids a box maps (uid and gid 0..65535 inside).
inline constexpr uint32_t kIdRange = 65536;

// The limits written to /proc/sys/user in every box's user namespace (docs/isolation.md,
// "Per-box kernel limits"), as file name and value.
struct UserNamespaceLimit {
  const char* name;
  const char* value;
};
extern const UserNamespaceLimit kUserNamespaceLimits[];
extern const size_t kUserNamespaceLimitCount;

class NativeRuntime : public Runtime {
 public:
  // Probes cgroups and loads the agent image; fails with a message an operator can act on.
  static Result<std::unique_ptr<NativeRuntime>> Open(const NativeConfig& config);
  ~NativeRuntime() override;

  Result<Box> Create(const BoxSpec& spec) override;
  Status Freeze(const Box& box) override;
  size_t MaxLayers(const Box& box) override;
  Status SetLimits(const Box& box, const Limits& limits) override;
  Status Thaw(const Box& box) override;
  Result<BoxStats> Stats(const Box& box) override;
  Result<uint64_t> OomKills(const Box& box) override;
  Result<UniqueFd> OpenSocket(const Box& box, int domain, int type) override;
  std::optional<std::string> AgentExit(const Box& box) override;
  Status Destroy(const Box& box) override;
  Status Stop(const Box& box) override;
  Status DestroyKeepingUpper(const Box& box, const std::string& dest) override;
  Status CopyWritableLayer(const Box& box, const std::string& dest, int64_t limit_bytes) override;
  Result<int> ReapOrphans(const std::string& owner) override;
  Result<Box> Adopt(const std::string& id) override;
  Result<std::vector<std::string>> ListBoxes() override;

  const NativeConfig& config() const { return config_; }
  // Whether boxes get idmapped layers (false: the fallback, see NativeConfig::idmap).
  bool idmapped() const { return idmapped_; }
  // Whether writable layers are btrfs subvolumes (run_dir on btrfs, NativeConfig::btrfs).
  bool btrfs() const { return btrfs_; }
  // Whether the boxes' agents get oom_score_adj -1000 (needs CAP_SYS_RESOURCE on the host).
  bool protects_agent() const { return can_protect_agent_; }
  // What Open found missing (the idmap fallback first, when it is in effect), for the caller
  // to log once: the runtime itself writes nothing to the process's stderr.
  const std::vector<std::string>& warnings() const { return warnings_; }
  const CgroupHost& cgroup_host() const { return cgroups_; }

 private:
  NativeRuntime(NativeConfig config, CgroupHost cgroups, UniqueFd agent_image, bool idmapped);
  // Create's phases, in order, each adding to one Creation (its owners undo what was made when
  // a later phase fails). Named as `sbx run --timings` prints them (docs/isolation.md).
  struct Creation;
  // "prepare": the box directory (made elsewhere and renamed into place with its locked owner
  // file), its id range, the writable layer (disk image mounted), agent socket and log.
  Status Prepare(Creation& c);
  Status PrepareWritableLayer(Creation& c);
  // "cgroup": the box's cgroups with its limits.
  Status MakeCgroups(Creation& c);
  // "clone": the child in its new namespaces, its id maps, cgroup attach and OOM score.
  Status Clone(Creation& c);
  // The parent/child synchronisation point (still "clone"): the hook for what the host does to
  // the child's namespaces from outside before it may go on (empty today), then the go-ahead
  // with the child's mounts.
  Status AtSyncPoint(Creation& c);
  Status SendGoAhead(Creation& c);
  // "child": waits for the child's own setup (mounts, pivot_root, caps, seccomp) and the exec of
  // the agent, or the step that failed. The "hello" phase after it is the caller's.
  Status AwaitChildSetup(Creation& c);
  // The read-only layers a box of host id `base` mounts: the spec's in idmapped mode, shifted
  // copies in the fallback.
  Result<std::vector<std::string>> LayersFor(const BoxSpec& spec, uint32_t base);
  // Destroy; with `keep_upper`, the writable layer is moved there before the box's directory goes.
  Status DestroyBox(const Box& box, const std::string* keep_upper);

  // Waits for Open's threads, once: the cgroup attach warm-up (WarmUpCgroupAttach) and the agent
  // image's copy (image_status_ says how it went).
  void JoinWarmUp();

  NativeConfig config_;
  const bool idmapped_;
  const bool btrfs_;
  std::once_flag quota_enabled_;   // btrfs quotas are turned on by the first disk-limited box
  Status quota_status_;            // what turning them on gave (written once, under the flag)
  bool can_protect_agent_ = true;  // this process may lower oom_score_adj (CAP_SYS_RESOURCE)
  std::vector<std::string> warnings_;
  CgroupHost cgroups_;
  UniqueFd agent_image_;  // sealed memfd: what a box execs can never be changed from inside
  Mutex mu_;
  // Per live box created by this process: an open, flock()ed <dir>/owner file. The lock is
  // released by the kernel when this process dies, which is how ReapOrphans tells orphans.
  std::map<std::string, UniqueFd> owner_locks_ GUARDED_BY(mu_);
  std::thread warm_up_;
  std::thread image_copy_;  // fills agent_image_ (FillAgentImage)
  Status image_status_;     // its outcome: written by that thread, read after JoinWarmUp
  std::once_flag warm_up_joined_;
};

// Validates a box id: 1..64 characters of [a-z0-9-], not starting with '-'.
Status ValidateBoxId(const std::string& id);

}  // namespace sbx::runtime
