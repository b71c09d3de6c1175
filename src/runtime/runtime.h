// Runtime: how a box is isolated. A runtime creates a box from a BoxSpec with sbx-agent as its
// PID 1, and can freeze, thaw, measure and destroy it. Everything above this interface (the CLI,
// the sandbox manager) talks to the box only through the agent socket it returns.
//
// Implementations: native/ (namespaces + cgroups; the default), oci/ (runc and gVisor's runsc),
// vm/ (a QEMU microvm per box). A Router (router.h) holds every runtime of the host and sends
// each call to the box's own.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/fd.h"
#include "common/status.h"

namespace sbx::runtime {

// The runtimes sbx knows, weakest isolation first (docs/isolation.md).
inline constexpr const char* kRuntimeNames[] = {"native", "runc", "gvisor", "vm"};

// EINVAL naming the runtimes sbx knows.
inline Status UnknownRuntime(const std::string& name) {
  std::string known;
  for (const char* n : kRuntimeNames) known += (known.empty() ? "" : ", ") + std::string(n);
  return Status::Error("runtime: '" + name + "' is not one of " + known, EINVAL);
}

// A runtime as `sbx runtimes` and GET /v1/runtimes list it.
struct RuntimeInfo {
  std::string name;
  bool available = false;
  std::string why;  // when not available
  // What its boxes run on, where that depends on the host (the vm runtime: "kvm" or "tcg"), and
  // why; empty otherwise.
  std::string accelerator, accelerator_why;
};

struct Limits {
  int64_t memory_bytes = 0;  // 0 = no limit. Swap is always off.
  double cpus = 0;           // CPU quota in cores; 0 = no quota
  int64_t cpu_weight = 0;    // relative share 1..10000 (cgroup v2 scale); 0 = default (100)
  int64_t pids = 0;          // 0 = no limit
  int64_t disk_bytes = 0;    // size of the writable layer; 0 = unbounded (on the data dir's fs)
};

// A host path mounted into the box.
struct BindMount {
  std::string source;  // host path
  std::string target;  // absolute path inside the box
  bool read_only = true;
  // Subdirectories of `target` (relative, such as "local/bin") over which the topmost layer's
  // own directory of the same path (its <target>/<subdir>, hidden by the bind) is laid,
  // read-only: what the layer has there wins, the rest of the bind shows through. Nothing of the
  // host changes. The host template adds sbx's sudo and python to /usr/local/bin this way.
  std::vector<std::string> overlaid;
};

struct BoxSpec {
  std::string id;                   // [a-z0-9-], unique among live boxes
  std::string runtime;              // one of kRuntimeNames, for a Router; "": native
  std::vector<std::string> layers;  // read-only lower layers, topmost first
  std::vector<BindMount> binds;     // after the overlay, in order
  std::string hostname = "sbx";
  Limits limits;
  // Kill the box when the thread that created it exits (for one-shot `sbx run`; a daemon, whose
  // threads come and go, leaves it false).
  bool die_with_parent = false;
  // Which kind of process owns the box ("run", "serve"). While the owning process lives it holds
  // a lock on the box; ReapOrphans(owner) removes the boxes whose owner died without destroying
  // them (killed with SIGKILL, crashed).
  std::string owner = "run";
  // First host id of the box's private range (uid 0 inside maps to it, 65536 ids). 0: take one
  // from the runtime's id pool, or without a pool the runtime's shared legacy base. A caller that
  // passes its own range keeps it: the runtime never releases it.
  uint32_t id_base = 0;
  // A sandbox's (or `sbx run`'s) box, whose writable layer may start as a copy of its topmost
  // layer when that is a btrfs subvolume (a snapshot's layer taken on btrfs):
  // Box::holds_top_layer then says so. A build's boxes leave it false (a build step's layer goes
  // above the layers it ran on).
  bool may_hold_top_layer = false;
  // Host work on the box's namespaces from outside, between the clone and the go-ahead (the
  // network moves the box's veth into its network namespace here): called with the agent's host
  // pid while it waits, before anything of its own runs. A failure fails the Create; what the
  // hook made is its caller's to remove (network::Stack::Release), the runtime knows nothing of it.
  std::function<Status(pid_t init_pid)> at_sync_point;
};

struct BoxStats {
  uint64_t cpu_usage_ns = 0;
  uint64_t memory_current = 0;
  uint64_t memory_peak = 0;
  uint64_t pids_current = 0;
  uint64_t oom_kills = 0;
  // Times the box met its memory limit with nothing left to reclaim (cgroup v2 memory.events
  // "oom"; a gVisor box on v1: sbx's OOM guard's count, oom_guard.h, or 1 for a sandbox that
  // ended after meeting its limit; else 0). One with no kill is a box whose runtime ended at the
  // limit (gVisor's Sentry failing an allocation).
  uint64_t ooms = 0;
  bool frozen = false;  // the box's cgroup is frozen (paused in memory)
  // The box's writable layer: the bytes it holds, and the most it may hold (the size of its disk
  // image, or without a disk limit the size of the filesystem it lives on). 0 when unknown.
  uint64_t disk_used = 0;
  uint64_t disk_total = 0;
};

// Per-phase timings of one Create, for `sbx run --timings` and the benchmarks.
struct CreateTimings {
  int64_t prepare_us = 0;  // directories, writable layer, agent socket
  int64_t cgroup_us = 0;   // create cgroups and write limits
  int64_t clone_us = 0;    // clone with namespaces, id maps, cgroup attach
  int64_t child_us = 0;    // mounts, pivot_root, caps, seccomp, exec of the agent
  int64_t agent_us = 0;    // agent answers HELLO
};

// A live box. Destroying the object does not destroy the box: call Runtime::Destroy.
struct Box {
  std::string id;
  pid_t init_pid = -1;       // host pid of the agent (PID 1 inside)
  std::string agent_socket;  // host path of the agent's unix socket
  std::string dir;           // host directory owned by this box (removed on Destroy)
  uint32_t id_base = 0;      // host id of root inside (its range is id_base..id_base+65535)
  // Shared read-only layers and binds are idmapped into the box's range (files show their real
  // owners inside). false: the runtime's loud fallback (shared legacy base, shifted layer copies,
  // host binds show `nobody`).
  bool idmapped = false;
  // Its writable layer stores files under ids 0..65535, as a layer does (a btrfs subvolume
  // reached through an idmapped mount): taken out as a layer, it is not shifted.
  bool layer_ids = false;
  // Its writable layer began as a copy of its topmost layer (a btrfs snapshot of a snapshot's
  // layer) and holds that layer's files: taken out as a layer, it replaces that layer rather
  // than going above it (where that layer would bring back what the box deleted of it).
  bool holds_top_layer = false;
  CreateTimings timings;
  // The runtime it runs under (kRuntimeNames), set by a Router's Create. "": not known (a Box
  // made of an id alone): a Router then asks every runtime.
  std::string runtime;

  // What its writable layer's owners are shifted down by when it is taken out as a layer
  // (storage::AddLayerFromDir): its id base, or nothing with layer_ids.
  std::optional<uint32_t> LayerIdShift() const {
    return layer_ids ? std::nullopt : std::optional<uint32_t>(id_base);
  }
};

class Runtime {
 public:
  virtual ~Runtime() = default;
  // Creates a box and waits until its agent accepts connections. On failure nothing it made is
  // left behind (mounts, cgroups, processes, directories).
  virtual Result<Box> Create(const BoxSpec& spec) = 0;
  // OK when Create can make boxes of runtime `name` (BoxSpec::runtime; "" is native): a runtime
  // makes only its own kind, a Router any it holds. EINVAL for a name sbx does not know, ENOTSUP
  // naming why for one this host lacks.
  virtual Status CanCreate(const std::string& name) const {
    if (name.empty() || name == kRuntimeNames[0]) return {};
    for (const char* known : kRuntimeNames)
      if (name == known)
        return Status::Error(
            "runtime " + name + " is not available here: this sbx runs only " + kRuntimeNames[0],
            ENOTSUP);
    return UnknownRuntime(name);
  }
  // Every runtime sbx knows, in kRuntimeNames order, and whether Create can make its boxes.
  virtual std::vector<RuntimeInfo> Runtimes() const {
    std::vector<RuntimeInfo> out;
    for (const char* n : kRuntimeNames) {
      Status can = CanCreate(n);
      out.push_back({n, can.ok(), can.ok() ? "" : can.message()});
    }
    return out;
  }
  // The accelerator its boxes run on and why (RuntimeInfo::accelerator), or empty ones.
  virtual std::pair<std::string, std::string> Accelerator() const { return {}; }
  // The most layers Create takes for a box of `box`'s runtime and id (it refuses more). A sandbox
  // grows a layer with every pause without memory, which must not take it past this: its files
  // could then never be started again.
  virtual size_t MaxLayers(const Box& box) {
    (void)box;
    return SIZE_MAX;
  }
  virtual Status Freeze(const Box& box) = 0;
  virtual Status Thaw(const Box& box) = 0;
  virtual Result<BoxStats> Stats(const Box& box) = 0;
  // BoxStats::oom_kills alone, which the command path reads before and after every command: one
  // counter, where Stats reads every figure (cgroup files, the writable layer's usage).
  virtual Result<uint64_t> OomKills(const Box& box) {
    auto st = Stats(box);
    if (!st.ok()) return st.status();
    return st->oom_kills;
  }
  // Changes the memory, CPU and pids limits of a live box (a warm pool's box claimed by a create
  // with its own limits); its disk size stays. EINVAL for limits Create would refuse.
  virtual Status SetLimits(const Box& box, const Limits& limits) {
    (void)limits;
    return Status::Error("set the limits of box " + box.id + ": this runtime cannot", ENOTSUP);
  }
  // A new, unconnected socket (socket(2) arguments; close-on-exec) in the box's network
  // namespace, to reach what listens on the box's loopback. ESRCH when the box's agent is gone.
  virtual Result<UniqueFd> OpenSocket(const Box& box, int domain, int type) = 0;
  // nullopt while the box's agent lives; once it has exited, how: its exit status when this
  // process was its parent (reaping it), and the tail of its log. Cheap: called for every live
  // box twice a second.
  virtual std::optional<std::string> AgentExit(const Box& box) = 0;
  // Kills every process of the box and removes everything Create made. Idempotent.
  virtual Status Destroy(const Box& box) = 0;
  // Kills every process of the box and returns once they are gone, leaving its files, cgroups
  // and directory for a Destroy later (the part of a kill a caller must wait for). Pass Destroy
  // a Box without init_pid then: the pid may belong to another process by that time. Idempotent.
  virtual Status Stop(const Box& box) { return Destroy(box); }
  // Destroy, keeping the box's writable layer: once every process of the box is gone, its
  // overlay upper directory (in overlayfs' form, files owned by the box's host ids, or as a
  // layer stores them with Box::layer_ids) is renamed to `dest`, an empty directory on the same
  // filesystem (a build step's result becomes a layer this way: sandbox/build.h). Not for boxes
  // whose disk limit is an image: ENOTSUP then, and from runtimes that cannot. The box is
  // destroyed even when the move fails.
  virtual Status DestroyKeepingUpper(const Box& box, const std::string& dest) {
    (void)dest;
    Status destroyed = Destroy(box);
    if (!destroyed.ok()) return destroyed;
    return Status::Error("destroy box " + box.id + ": this runtime cannot keep its writable layer",
                         ENOTSUP);
  }
  // Copies the box's writable layer (its overlay upper directory, in overlayfs' form: whiteouts,
  // opaque marks, owners as the box's host ids or with Box::layer_ids as a layer's, hard links)
  // into `dest`, an empty directory, so that it can become a layer (a snapshot). The caller
  // freezes the box first: a box that runs meanwhile gives a torn copy. ENOSPC past
  // `limit_bytes` (what is copied is left in `dest`). ENOTSUP from runtimes that cannot. A
  // native box on btrfs makes `dest` a subvolume snapshot instead, whatever the size (O(1)).
  virtual Status CopyWritableLayer(const Box& box, const std::string& dest, int64_t limit_bytes) {
    (void)dest;
    (void)limit_bytes;
    return Status::Error("copy the writable layer of box " + box.id + ": this runtime cannot",
                         ENOTSUP);
  }
  // Memory snapshots (the vm runtime; ENOTSUP from the others). SaveMemory saves the box's
  // memory and devices, a copy of its writable layer and what else a restore needs into `dest`,
  // an empty directory. The box stands still while it is saved and its agent connections close
  // (its processes live on); then it runs on, or with `stop` is stopped as by Stop (Destroy
  // removes the rest).
  virtual Status SaveMemory(const Box& box, const std::string& dest, bool stop) {
    (void)dest;
    (void)stop;
    return Status::Error("save the memory of box " + box.id + ": this runtime cannot", ENOTSUP);
  }
  // A new box of `spec` from what SaveMemory saved in `src` (which stays, and can start more):
  // its processes, memory and writable layer as they were, re-keyed with spec's id and hostname,
  // the host's clock and fresh entropy. EINVAL when `spec` does not have the saved box's shape
  // (memory, CPUs, layers, binds).
  virtual Result<Box> RestoreMemory(const BoxSpec& spec, const std::string& src) {
    (void)src;
    return Status::Error("restore box " + spec.id + " from saved memory: this runtime cannot",
                         ENOTSUP);
  }
  // Destroys every box of `owner` whose owning process is gone; returns how many it removed.
  virtual Result<int> ReapOrphans(const std::string& owner) = 0;
  // Takes over a live box whose owning process died (a daemon restart): its processes kept
  // running. Fails with ESRCH when the box's agent is gone, EBUSY when another process owns it.
  virtual Result<Box> Adopt(const std::string& id) = 0;
  // Ids of every box directory under this runtime's control, live or not (for reconciliation).
  virtual Result<std::vector<std::string>> ListBoxes() = 0;
};

}  // namespace sbx::runtime
