// OciRuntime: boxes run by an OCI runtime binary — gVisor's runsc (the box runs on gVisor's
// user-space kernel, the Sentry, not on the host's) or runc (namespaces and cgroups, as native,
// set up by runc) — from an OCI bundle sbx writes per box. One implementation for both; the
// settings that differ are named where they are made. docs/isolation.md, "The oci runtime
// (gVisor, runc)", explains every choice and what was measured to make it.
//
// A box's directory, <run_dir>/<id>/ (root's, 0711: passed through by the runtime's processes in
// the box's user namespace, which run as the box's root id on the host; run_dir is 0711 too):
//   owner       locked while the box's creator (or adopter) lives, as the native runtime's
//   ids, pid    the box's host id base; the host pid of its first process and its start time
//   config.json the bundle's spec (oci_spec.h)
//   agent.log   the agent's stderr and the runtime binary's create errors
//   agent.sock  runc: the agent's listening socket, bound here by sbx and passed as fd 3
//   oom_kills   gVisor: how many of the box's processes sbx's OOM guard has killed (oom_guard.h)
// and, each the box's root id's alone (0700):
//   fs/upper, fs/work   the writable layer (overlayfs' form, files owned by the box's host ids)
//   fs/root     the box's root: an overlay of lower/* under fs/upper, mounted on the host
//   lower/<i>   idmapped read-only mounts of the spec's layers; binds/<i> of its read-only binds;
//               over/<k> read-only overlays of a layer's directory over a bind
//               (BindMount::overlaid)
//   sock/       gVisor: bound at /.sbx/run in the box; the agent makes agent.sock in it (a host
//               socket through runsc --host-uds=create), then the directory is made immutable
// The binary's own state is under <run_dir>/.state (--root), never the system default, and the
// agent binary every box execs is <run_dir>/.sbx-agent (a copy, bound read-only).
//
// Thread-safe.
#pragma once

#include <sys/resource.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/fd.h"
#include "common/thread_annotations.h"
#include "runtime/id_pool.h"
#include "runtime/native/cgroup.h"
#include "runtime/oci/oci_spec.h"
#include "runtime/oci/oom_guard.h"
#include "runtime/runtime.h"

namespace sbx::runtime {

struct OciConfig {
  // Which runtime this is (kRuntimeNames): "gvisor" (binary runsc) or "runc".
  std::string name = "gvisor";
  std::string binary = "runsc";     // a path, or a name looked up on PATH (and the sbin dirs)
  std::string platform = "ptrace";  // runsc --platform: ptrace here, kvm where /dev/kvm is usable
  std::string run_dir;              // per-box directories and the binary's state
  std::string agent_path;           // sbx-agent, copied into run_dir and bound into every box
  // gVisor: sbx-gvisor-preload.so (gvisor_preload.c), copied into run_dir and preloaded into the
  // box's programs through /etc/ld.so.preload. "" or missing: none (`ls -l` fails in the box).
  std::string preload_path;
  std::string cgroup_parent = "sbx";  // under the caller's own cgroup, as the native runtime's
  // Where boxes whose spec names no range get one (not owned; must outlive the runtime). nullptr:
  // they share id_base.
  IdPool* id_pool = nullptr;
  uint32_t id_base = 1000000;  // the shared legacy base, as NativeConfig::id_base
  // The root overlay takes its layers one fsconfig(lowerdir+) each where the kernel can (6.8+),
  // else one option string, which bounds a box's layers (MaxLayers). false: always the string
  // (for tests of it on newer kernels).
  bool overlay_lowerdir_plus = true;
};

struct SpawnOptions;

class OciRuntime : public Runtime {
 public:
  // Finds the binary, asks its --version, and runs one real container as boxes will be run
  // (user namespace, idmapped bind, cgroups, the seccomp policy): fails naming the runtime, the
  // binary and why. A probe that passed is remembered for this boot and binary (run_dir/.probe).
  static Result<std::unique_ptr<OciRuntime>> Open(const OciConfig& config);
  ~OciRuntime() override;

  Status CanCreate(const std::string& name) const override;
  Result<Box> Create(const BoxSpec& spec) override;
  Status Freeze(const Box& box) override;
  size_t MaxLayers(const Box& box) override;
  // Whether the root overlay takes its layers one fsconfig(lowerdir+) each (OciConfig).
  bool LowerdirPlus() const;
  Status Thaw(const Box& box) override;
  Result<BoxStats> Stats(const Box& box) override;
  Result<uint64_t> OomKills(const Box& box) override;
  Status SetLimits(const Box& box, const Limits& limits) override;
  Result<UniqueFd> OpenSocket(const Box& box, int domain, int type) override;
  std::optional<std::string> AgentExit(const Box& box) override;
  Status Stop(const Box& box) override;
  Status Destroy(const Box& box) override;
  Status DestroyKeepingUpper(const Box& box, const std::string& dest) override;
  Status CopyWritableLayer(const Box& box, const std::string& dest, int64_t limit_bytes) override;
  Result<int> ReapOrphans(const std::string& owner) override;
  Result<Box> Adopt(const std::string& id) override;
  Result<std::vector<std::string>> ListBoxes() override;

  const OciConfig& config() const { return config_; }
  OciKind kind() const { return kind_; }
  // The binary's absolute path and the first line of its --version.
  const std::string& binary() const { return binary_; }
  const std::string& version() const { return version_; }

  // Makes the binary forget container `id` (`delete --force`: what is left of it is killed); a
  // container it no longer knows is success.
  Status DeleteContainer(const std::string& id) const;
  // Kills what is left in box `id`'s cgroups and removes them, in every hierarchy.
  Status DestroyCgroups(const std::string& id) const;

  // The argv of one call of the binary about box `id` (empty: about none, as `list`): its path,
  // the global flags every call of this runtime passes (the state root: gVisor's is the box's
  // own), then `args`.
  // `network`: runsc's --network (gVisor only).
  std::vector<std::string> Command(const std::string& id, const std::vector<std::string>& args,
                                   const std::string& network = "none") const;

 private:
  OciRuntime(OciConfig config, OciKind kind, std::string binary, std::string version,
             CgroupHost cgroups);
  struct Creation;
  // The phases of Create, in order (each adds to `c`, whose owners undo it on failure).
  Status Prepare(Creation& c);  // directory, id range, user namespace, mounts, bundle
  Status Launch(Creation& c);   // `create`, the sync point hook, `start`
  Status AwaitAgent(Creation& c);
  // Runs the binary; its stdout, or an error naming the runtime, the command and its stderr.
  Result<std::string> Run(const std::string& id, const std::vector<std::string>& args,
                          const std::string& network = "none") const;
  // Where the binary keeps its state of box `id`: gVisor's in the box's directory (its `create`
  // writes it as the box's root, see SpawnOptions), else one directory for every box.
  std::string StateRoot(const std::string& id) const;
  // How a `create` or `run` of the box being made is spawned: gVisor's in the box's cgroups
  // (`procs`: the open cgroup.procs files) and user namespace.
  Status BoxSpawn(Creation& c, SpawnOptions& o, std::vector<UniqueFd>& procs) const;
  // Destroy; with `keep_upper`, the writable layer is moved there before the directory goes.
  Status DestroyBox(const Box& box, const std::string* keep_upper);
  std::string Dir(const std::string& id) const { return config_.run_dir + "/" + id; }
  // Where box `id`'s agent listens on the host: gVisor's makes its socket in sock/ (a host socket
  // through the gofer), runc's is bound by sbx.
  std::string AgentSocket(const std::string& id) const {
    return Dir(id) + (kind_ == OciKind::kGvisor ? "/sock/agent.sock" : "/agent.sock");
  }
  std::string AgentCopy() const { return config_.run_dir + "/.sbx-agent"; }
  std::string PreloadCopy() const { return config_.run_dir + "/.sbx-preload.so"; }
  // RLIMIT_NOFILE in a box: the native runtime's 65536, or less where this process has less.
  static int64_t BoxNofile();
  // The limits the binary is started with for a `create`, inherited by the box (runc: see
  // oci_spec.cc); none for gVisor.
  std::vector<std::pair<int, rlimit>> BoxRlimits() const;
  // linux.cgroupsPath of box `id` (the same directories as a native box's: cgroup.h).
  std::string CgroupsPath(const std::string& id) const;
  // gVisor: hands box `id`'s OOM kills to oom_guard_ (oom_guard.h), where the host has a v1
  // memory controller and the box a memory limit; else nothing.
  Status GuardMemory(const std::string& id);
  // Box `id`'s v1 memory cgroup directory; "" without a v1 memory controller.
  std::string MemoryCgroup(const std::string& id) const;

  const OciConfig config_;
  const OciKind kind_;
  bool preload_ = false;  // gVisor: PreloadCopy() is installed
  const std::string binary_;
  const std::string version_;
  const CgroupHost cgroups_;
  // gVisor on a host whose memory controller is v1: the OOM killer of its boxes.
  std::unique_ptr<OomGuard> oom_guard_;
  Mutex mu_;
  // Per live box created or adopted by this process: its open, flock()ed <dir>/owner file.
  std::map<std::string, UniqueFd> owner_locks_ GUARDED_BY(mu_);
  // Boxes made with die_with_parent: a process of ours that kills the box's first process once
  // the last write end of its pipe is gone (this process died, or Destroy closed it), and the
  // write end. Unlike native boxes, an OCI box's processes are not our children and do not
  // hear of our death themselves.
  struct Watchdog {
    UniqueFd wake, pidfd;
    ~Watchdog();
  };
  std::map<std::string, std::unique_ptr<Watchdog>> watchdogs_ GUARDED_BY(mu_);
  // Starts the Watchdog of box directory `dir` (its first process from `dir`/pid).
  static Result<std::unique_ptr<Watchdog>> StartWatchdog(const std::string& dir);
};

}  // namespace sbx::runtime
