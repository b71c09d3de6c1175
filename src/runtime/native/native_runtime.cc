#include "runtime/native/native_runtime.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "common/btrfs.h"
#include "common/fs.h"
#include "runtime/box_host.h"
#include "runtime/native/box_owners.h"
#include "runtime/native/capabilities.h"
#include "runtime/native/cgroup_internal.h"
#include "runtime/native/child.h"
#include "runtime/native/disk.h"
#include "runtime/native/idmap.h"
#include "runtime/native/layer_copy.h"
#include "runtime/native/mount_plan.h"
#include "runtime/native/seccomp_policy.h"

namespace sbx::runtime {
namespace {

// The box's own boot id, in its fs/ directory (mount_plan.h, MountPlanInput::boot_id).
constexpr char kBootIdFile[] = "boot_id";

int64_t MicrosSince(std::chrono::steady_clock::time_point& t) {
  auto now = std::chrono::steady_clock::now();
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(now - t).count();
  t = now;
  return us;
}

// The agent binary is copied into a sealed memfd once; boxes exec it from there, so nothing a box
// does to /proc/1/exe can reach a file on the host (CVE-2019-5736). OpenAgentImage checks the
// file and makes the memfd; FillAgentImage copies and seals it (a megabyte, about a millisecond),
// on a thread of Open's while the caller goes on (JoinWarmUp).
struct AgentImage {
  UniqueFd src, memfd;
  off_t size = 0;
};

Result<AgentImage> OpenAgentImage(const std::string& path) {
  AgentImage image;
  image.src = UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (!image.src || ::fstat(image.src.get(), &st) != 0)
    return Status::Errno("load sbx-agent: open " + path);
  image.size = st.st_size;
  image.memfd = UniqueFd(::memfd_create("sbx-agent", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!image.memfd) return Status::Errno("memfd_create");
  return image;
}

Status FillAgentImage(int src, int memfd, off_t size, const std::string& path) {
  for (off_t off = 0; off < size;) {
    ssize_t n = ::sendfile(memfd, src, &off, static_cast<size_t>(size - off));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::Errno("load sbx-agent: copy " + path);
  }
  if (::fchmod(memfd, 0555) != 0) return Status::Errno("fchmod agent image");
  if (::fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0)
    return Status::Errno("seal agent image");
  return {};
}

// Whether idmapped layers work does not change while the kernel runs and the run directory stays
// on one filesystem: a probe that passed is remembered for that pair in <run_dir>.idmap-probe
// (beside the run directory, which holds boxes only; root-only), so a one-shot `sbx run` does not
// build and tear down the probe's namespace and mounts every time (a few milliseconds). A failure
// is never remembered: it is tried again, and warned about, at every start.
Status ProbeIdmappedOnce(const std::string& run_dir, uint32_t id_base) {
  struct stat st {};
  auto boot = ReadFile("/proc/sys/kernel/random/boot_id", 64);
  std::string key;
  if (boot.ok() && ::stat(run_dir.c_str(), &st) == 0) {
    key = boot->substr(0, boot->find('\n')) + " " + std::to_string(st.st_dev) + " " +
          std::to_string(id_base) + " ok\n";
  }
  const std::string memo = run_dir + ".idmap-probe";
  if (!key.empty()) {
    if (auto seen = ReadFile(memo, 256); seen.ok() && *seen == key) return {};
  }
  // Named as a creation of this process: if it dies mid-probe, the next ReapOrphans removes it.
  std::string scratch =
      run_dir + "/" +
      CreationDirName("idmap-probe-" + RandomId(8), ::getpid(), ProcessStartTime(::getpid()));
  Status probe = ::mkdir(scratch.c_str(), 0700) == 0 ? ProbeIdmappedLayers(scratch, id_base)
                                                     : Status::Errno("mkdir " + scratch);
  (void)RemoveTree(scratch);  // a leftover probe directory is never used; only wasted space
  // Written in place: a reader that sees half of it (or a daemon killed mid-write) only probes
  // again.
  if (probe.ok() && !key.empty()) (void)WriteFile(memo, key, 0600);
  return probe;
}

// On cgroup v1, moving a process between cgroups takes a global lock whose write side first
// waits for an RCU grace period when the lock has been idle (10-20 ms here); writers that follow
// within the next grace period are fast. A no-op move of ourselves into the cgroup we are already
// in, started while the rest of Open runs, pays that wait in parallel instead of inside the first
// Create. Harmless where it does not help (v2, or a failure to write).
std::thread WarmUpCgroupAttach(const CgroupHost& host) {
  if (host.version != CgroupVersion::kV1) return {};
  for (const auto& [controller, dir] : host.v1_dirs) {
    if (controller != "memory") continue;
    std::string own = dir.substr(0, dir.rfind('/'));
    return std::thread(
        [own] { (void)WriteFile(own + "/cgroup.procs", std::to_string(::getpid())); });
  }
  return {};
}

// The box's ids and mode, for whoever adopts it later.
constexpr char kIdsFile[] = "/ids";

// A pidfd of the box's agent, if `box.init_pid` still is that agent: alive and in this box's
// cgroup. Pids are reused, so the pid alone names whoever has it now; the pidfd pins the process,
// and a signal 0 after the cgroup read tells that the read was of that process. ESRCH otherwise.
Result<UniqueFd> AgentPidfd(const Box& box) {
  if (box.init_pid <= 0) return Status::Error("no agent pid", ESRCH);
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, box.init_pid, 0)));
  if (!pidfd) return Status::Errno("agent pid " + std::to_string(box.init_pid));
  auto cg = ReadFile("/proc/" + std::to_string(box.init_pid) + "/cgroup", 1 << 16);
  if (!cg.ok() || cg->find("/" + box.id + "\n") == std::string::npos ||
      ::syscall(SYS_pidfd_send_signal, pidfd.get(), 0, nullptr, 0) != 0)
    return Status::Error("its agent is gone", ESRCH);
  return pidfd;
}

// Kills the box's agent and waits until it is gone. Killing PID 1 of a pid namespace kills every
// process in it, and its exit waits for theirs, so nothing of the box runs once it is reaped (the
// cgroup, removed later, catches anything else). A frozen box is thawed first: frozen tasks
// (cgroup v1) do not die until they run again.
void KillAgent(const Box& box, Cgroup& cgroup) {
  // Only through a pidfd that is still this box's agent: an adopted agent is not our child, so
  // once it has died its pid may belong to any host process (or to another box's agent, our
  // child, whose wait would block here).
  if (auto pidfd = AgentPidfd(box); pidfd.ok()) {
    ::syscall(SYS_pidfd_send_signal, pidfd->get(), SIGKILL, nullptr, 0);
    (void)cgroup.Thaw();
    // Reap it if it is our child; ECHILD after a daemon restart is fine.
    siginfo_t info{};
    while (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd->get()), &info,
                    WEXITED | __WALL) < 0 &&
           errno == EINTR) {
    }
  } else {
    (void)cgroup.Thaw();
    // A dead agent that was our child is a zombie until reaped (its pid cannot have been reused
    // meanwhile); never wait for anything alive here.
    if (box.init_pid > 0) ::waitpid(box.init_pid, nullptr, WNOHANG | __WALL);
  }
}

// A btrfs snapshot's qgroup takes its source's limit: a layer has none (nor does a box without a
// disk limit that starts from one). Nothing to do where quotas are off.
Status Unlimited(const std::string& subvolume) {
  auto q = btrfs::GetUsage(subvolume);
  if (!q.ok() || q->limit == 0) return {};
  return btrfs::SetLimit(subvolume, 0);
}

}  // namespace

// Values and reasons: docs/isolation.md, "Per-box kernel limits".
const UserNamespaceLimit kUserNamespaceLimits[] = {
    {"max_user_namespaces", "0"},     {"max_mnt_namespaces", "0"},
    {"max_net_namespaces", "0"},      {"max_ipc_namespaces", "0"},
    {"max_pid_namespaces", "0"},      {"max_uts_namespaces", "0"},
    {"max_cgroup_namespaces", "0"},   {"max_time_namespaces", "0"},
    {"max_inotify_instances", "128"}, {"max_inotify_watches", "65536"},
    {"max_fanotify_groups", "16"},    {"max_fanotify_marks", "65536"},
};
const size_t kUserNamespaceLimitCount = std::size(kUserNamespaceLimits);

Status ValidateBoxId(const std::string& id) {
  if (id.empty() || id.size() > 64 || id[0] == '-')
    return Status::Error("invalid box id '" + id + "'", EINVAL);
  for (char c : id) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'))
      return Status::Error("invalid box id '" + id + "'", EINVAL);
  }
  return {};
}

Result<std::unique_ptr<NativeRuntime>> NativeRuntime::Open(const NativeConfig& config) {
  auto cg = ProbeCgroupHost(config.cgroup_parent);
  if (!cg.ok()) return cg.status().Wrap("cgroups");
  std::thread warm_up = WarmUpCgroupAttach(*cg);
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable()) t.join();
    }
  } join{warm_up};
  auto image = OpenAgentImage(config.agent_path);
  if (!image.ok()) return image.status();
  const auto& seccomp = DefaultSeccompProgram();
  if (!seccomp.ok()) return seccomp.status().Wrap("seccomp");
  const auto& caps = DefaultCapabilityPlan();
  if (!caps.ok()) return caps.status().Wrap("capabilities");
  // Root-only: nothing under it (writable layers with whatever set-id files a box made, agent
  // sockets, logs) is reachable by any other host user. Boxes reach their own directory through
  // a descriptor (see CreateIn).
  SBX_RETURN_IF_ERROR(MakeDirs(config.run_dir, 0700));
  if (::chmod(config.run_dir.c_str(), 0700) != 0) return Status::Errno("chmod " + config.run_dir);
  if (config.id_base == 0 || uint64_t{config.id_base} + kIdRange > UINT32_MAX)
    return Status::Error("id base " + std::to_string(config.id_base) + " out of range", EINVAL);
  bool idmapped = config.idmap;
  std::vector<std::string> warnings;
  const std::string range =
      std::to_string(config.id_base) + ".." + std::to_string(config.id_base + kIdRange - 1);
  if (idmapped) {
    Status probe = ProbeIdmappedOnce(config.run_dir, config.id_base);
    if (!probe.ok()) {
      idmapped = false;
      warnings.push_back("idmapped mounts do not work here (" + probe.message() +
                         "): every box shares host ids " + range +
                         ", layers are copied with shifted owners, host binds show nobody");
    }
  } else {
    warnings.push_back("idmapped mounts turned off: every box shares host ids " + range +
                       ", layers are copied with shifted owners, host binds show nobody");
  }
  auto rt = std::unique_ptr<NativeRuntime>(
      new NativeRuntime(config, std::move(cg).value(), std::move(image->memfd), idmapped));
  rt->image_copy_ = std::thread([rt = rt.get(), src = std::move(image->src), size = image->size] {
    rt->image_status_ =
        FillAgentImage(src.get(), rt->agent_image_.get(), size, rt->config_.agent_path);
  });
  rt->can_protect_agent_ = ::prctl(PR_CAPBSET_READ, CAP_SYS_RESOURCE) == 1;
  if (!rt->can_protect_agent_) {
    warnings.push_back(
        "no CAP_SYS_RESOURCE: the boxes' agents keep the default OOM score (oom_score_adj -1000 "
        "needs it)");
  }
  rt->warnings_ = std::move(warnings);
  // The warm-up goes on while the caller resolves its template and prepares the first box; that
  // box's cgroup work waits for it (JoinWarmUp in Create).
  rt->warm_up_ = std::move(warm_up);
  return rt;
}

NativeRuntime::~NativeRuntime() { JoinWarmUp(); }

void NativeRuntime::JoinWarmUp() {
  std::call_once(warm_up_joined_, [this] {
    if (warm_up_.joinable()) warm_up_.join();
    if (image_copy_.joinable()) image_copy_.join();
  });
}

NativeRuntime::NativeRuntime(NativeConfig config, CgroupHost cgroups, UniqueFd agent_image,
                             bool idmapped)
    : config_(std::move(config)),
      idmapped_(idmapped),
      btrfs_(config_.btrfs && btrfs::IsBtrfs(config_.run_dir)),
      cgroups_(std::move(cgroups)),
      agent_image_(std::move(agent_image)) {}

Result<std::vector<std::string>> NativeRuntime::LayersFor(const BoxSpec& spec, uint32_t base) {
  if (idmapped_) return spec.layers;
  std::vector<std::string> out;
  for (const auto& l : spec.layers) {
    auto shifted = ShiftedLayer(l, base);
    if (!shifted.ok()) return shifted.status();
    out.push_back(*shifted);
  }
  return out;
}

// Everything one Create makes, in the order it is made: the owners (box_owners.h) undo it in
// reverse when Create returns early or throws, and are committed only once the box is live.
struct NativeRuntime::Creation {
  const BoxSpec& spec;
  Box box;
  std::chrono::steady_clock::time_point t = std::chrono::steady_clock::now();
  // prepare
  std::optional<BoxDir> dir;
  uint32_t own_base = 0;      // the box's own host id range (its user namespace's owner)
  uint32_t root_id = 0;       // host id of root inside (own_base, or the fallback's shared base)
  std::string fs;             // <dir>/fs: everything the child touches by path
  std::string layer;          // the writable layer, relative to fs/ ("", "layer/" or "disk/")
  bool stack_layers = false;  // MountPlanInput::stack_layers
  HostMount disk;
  std::vector<std::string> layers;  // read-only layers as this box mounts them
  UniqueFd listen, log, devnull;
  // cgroups
  CgroupOwner cgroup;
  // clone
  MountPlanInput mounts;     // what the child mounts, and how its failures are named
  ChildPlanStorage storage;  // the child's plan, built before the clone (it may not allocate)
  UniqueFd status_r, setup_parent;  // the parent's ends of the child's channels
  ChildProcess child;
};

Result<Box> NativeRuntime::Create(const BoxSpec& spec) {
  SBX_RETURN_IF_ERROR(ValidateBoxId(spec.id));
  if (spec.layers.empty()) return Status::Error("box " + spec.id + ": no rootfs layers", EINVAL);
  // One overlay stacks at most kMaxLayers lower layers (the kernel's limit); a template of more
  // must be flattened into fewer layers where it is made.
  if (spec.layers.size() > kMaxLayers)
    return Status::Error("box " + spec.id + ": " + std::to_string(spec.layers.size()) +
                             " layers, more than the " + std::to_string(kMaxLayers) +
                             " one overlay can stack",
                         E2BIG);
  if (spec.binds.size() > kMaxBinds)
    return Status::Error("box " + spec.id + ": more than " + std::to_string(kMaxBinds) + " binds",
                         E2BIG);
  if (spec.id_base != 0 && uint64_t{spec.id_base} + kIdRange > UINT32_MAX)
    return Status::Error("box " + spec.id + ": id base out of range", EINVAL);
  Creation c{spec};
  c.box.id = spec.id;
  // The phases, named as `sbx run --timings` prints them. The last, the agent's HELLO, is the
  // caller's: the agent listens from its exec on, so the first connection answers it.
  Status st = Prepare(c);
  if (st.ok()) c.box.timings.prepare_us = MicrosSince(c.t);
  // Cgroup changes take the lock that Open's warm-up holds while it waits for its grace period.
  JoinWarmUp();
  if (st.ok() && !image_status_.ok()) st = image_status_;
  if (st.ok()) st = MakeCgroups(c);
  if (st.ok()) c.box.timings.cgroup_us = MicrosSince(c.t);
  if (st.ok()) st = Clone(c);
  if (st.ok()) st = AtSyncPoint(c);
  if (st.ok()) st = SendGoAhead(c);
  if (st.ok()) c.box.timings.clone_us = MicrosSince(c.t);
  if (st.ok()) st = AwaitChildSetup(c);
  if (st.ok()) c.box.timings.child_us = MicrosSince(c.t);
  if (!st.ok()) return st.Wrap("create box " + spec.id);  // the owners undo, in reverse
  c.child.Commit();
  c.cgroup.Commit();
  UniqueFd lock = c.dir->Commit();
  MutexLock guard(mu_);
  owner_locks_[c.box.id] = std::move(lock);
  return std::move(c.box);
}

Status NativeRuntime::Prepare(Creation& c) {
  const BoxSpec& spec = c.spec;
  auto made = BoxDir::Make(config_.run_dir, spec.id, spec.owner);
  if (!made.ok()) return made.status();
  c.dir.emplace(std::move(made).value());
  const std::string& dir = c.dir->path();
  c.box.dir = dir;
  // The range is taken once the directory exists and given back only after it is gone, so a
  // range held by no directory is free (ReapOrphans).
  c.own_base = spec.id_base;
  if (c.own_base == 0 && config_.id_pool != nullptr) {
    auto acquired = c.dir->AcquireIdRange(config_.id_pool);
    if (!acquired.ok()) return acquired.status();
    c.own_base = *acquired;
  }
  if (c.own_base == 0) c.own_base = config_.id_base;
  // The fallback maps every box at the shared base (its layers are shifted copies for that base);
  // its user namespace is still owned by the box's own id, so kernel counters stay per box.
  c.root_id = idmapped_ ? c.own_base : config_.id_base;
  c.box.id_base = c.root_id;
  c.box.idmapped = idmapped_;
  // Everything the box's first process touches by path is below fs/, owned by the box's root.
  c.fs = dir + "/fs";
  for (const std::string& d : {c.fs, c.fs + "/rootfs"}) {
    if (::mkdir(d.c_str(), 0700) != 0) return Status::Errno("mkdir " + d);
    if (::chown(d.c_str(), c.root_id, c.root_id) != 0) return Status::Errno("chown " + d);
  }
  auto boot_id = RandomUuid();
  if (!boot_id.ok()) return boot_id.status();
  SBX_RETURN_IF_ERROR(WriteFile(c.fs + "/" + kBootIdFile, *boot_id + "\n", 0444));
  auto layers = LayersFor(spec, c.root_id);
  if (!layers.ok()) return layers.status();
  c.layers = std::move(layers).value();
  SBX_RETURN_IF_ERROR(PrepareWritableLayer(c));
  SBX_RETURN_IF_ERROR(WriteFile(dir + kIdsFile,
                                std::to_string(c.root_id) + " " + (idmapped_ ? "1" : "0") + " " +
                                    (c.box.layer_ids ? "1" : "0") + " " +
                                    (c.box.holds_top_layer ? "1" : "0") + "\n",
                                0600));
  c.box.agent_socket = dir + "/agent.sock";
  auto listen = ListenUnix(c.box.agent_socket);
  if (!listen.ok()) return listen.status();
  c.listen = std::move(listen).value();
  c.log.reset(
      ::open((dir + "/agent.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  if (!c.log) return Status::Errno("open " + dir + "/agent.log");
  c.devnull.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!c.devnull) return Status::Errno("open /dev/null");
  return {};
}

// The writable layer: a directory on the data dir's filesystem, or with a disk limit an ext4
// image of that size. The image's mount exists on the host only until the box's mount namespace
// has its own copy (HostMount, detached in AwaitChildSetup).
//
// On btrfs it is the subvolume `layer` instead, upper and work in it (both: overlayfs renames
// from work to upper, and renames across subvolumes are EXDEV), so that a snapshot of it is O(1)
// (CopyWritableLayer), and a disk limit is its qgroup's limit. With idmapped layers its files
// are stored as a layer's (ids 0..65535; the box reaches it through an idmapped mount made in
// SendGoAhead), so that the snapshot needs no chown; and when the topmost layer is such a
// snapshot (a subvolume on this filesystem), the box's writable layer starts as a writable
// snapshot of it, which the box's overlay then does not stack as a layer: two subvolumes among
// the lower layers would show one inode number for different files. For the same reason, when
// a lower layer is on this btrfs (btrfs::SameFilesystem), the lower layers are stacked on an
// overlay of their own first (MountOp::kLowerStack), which takes one more layer (an empty
// bottom) than the template has: a template of the most layers an overlay stacks gets a
// directory or an image instead.
Status NativeRuntime::PrepareWritableLayer(Creation& c) {
  const BoxSpec& spec = c.spec;
  const int64_t disk = spec.limits.disk_bytes;
  const bool layer_ids = btrfs_ && idmapped_;
  const bool seed = layer_ids && spec.may_hold_top_layer && c.layers.size() >= 2 &&
                    btrfs::IsSubvolume(c.layers[0]) &&
                    btrfs::SameFilesystem(c.layers[0], config_.run_dir);
  const auto lowers = c.layers.begin() + (seed ? 1 : 0);
  const bool same_fs = std::any_of(lowers, c.layers.end(), [&](const std::string& l) {
    return btrfs::SameFilesystem(l, config_.run_dir);
  });
  const size_t stacked = static_cast<size_t>(c.layers.end() - lowers);
  uint32_t owner = c.root_id;  // of upper and work, as stored
  if (btrfs_ && (layer_ids || disk > 0) && (!same_fs || stacked < kMaxLayers)) {
    c.layer = "layer/";
    c.stack_layers = same_fs;
    c.box.layer_ids = layer_ids;
    c.box.holds_top_layer = seed;
    if (layer_ids) owner = 0;
    const std::string vol = c.fs + "/layer";
    if (disk > 0) {
      std::call_once(quota_enabled_, [&] { quota_status_ = btrfs::EnableQuota(config_.run_dir); });
      SBX_RETURN_IF_ERROR(quota_status_);
    }
    if (seed) {
      SBX_RETURN_IF_ERROR(btrfs::Snapshot(c.layers[0], vol));
      SBX_RETURN_IF_ERROR(LayerToUpper(vol).Wrap("start box " + spec.id + " from its top layer"));
      c.layers.erase(c.layers.begin());
    } else {
      SBX_RETURN_IF_ERROR(btrfs::CreateSubvolume(vol));
      if (::chmod(vol.c_str(), 0700) != 0) return Status::Errno("chmod " + vol);
      if (::chown(vol.c_str(), owner, owner) != 0) return Status::Errno("chown " + vol);
    }
    // A box started from a snapshot counts what that snapshot holds in its limit, as the box
    // the snapshot was taken of did.
    SBX_RETURN_IF_ERROR(disk > 0 ? btrfs::SetLimit(vol, disk) : Unlimited(vol));
    if (seed) return {};  // LayerToUpper made upper and work
  } else if (disk > 0) {
    c.layer = "disk/";
    const std::string mnt = c.fs + "/disk";
    if (::mkdir(mnt.c_str(), 0700) != 0) return Status::Errno("mkdir " + mnt);
    SBX_RETURN_IF_ERROR(MountDiskImage(c.dir->path() + "/disk.img", mnt, disk, c.root_id));
    c.disk = HostMount(mnt);
  }
  for (const char* sub : {"upper", "work"}) {
    std::string p = c.fs + "/" + c.layer + sub;
    if (::mkdir(p.c_str(), 0755) != 0) return Status::Errno("mkdir " + p);
    if (::chown(p.c_str(), owner, owner) != 0) return Status::Errno("chown " + p);
  }
  return {};
}

Status NativeRuntime::MakeCgroups(Creation& c) {
  auto cg = Cgroup::Create(cgroups_, c.spec.id, c.spec.limits);
  if (!cg.ok()) return cg.status();
  c.cgroup = CgroupOwner(std::move(cg).value());
  return {};
}

Status NativeRuntime::Clone(Creation& c) {
  const BoxSpec& spec = c.spec;
  c.mounts = {"rootfs",   c.layer + "upper", c.layer + "work", c.layers,
              spec.binds, kBootIdFile,       c.stack_layers};
  if (c.box.layer_ids) c.mounts.writable_mount = "layer";
  int status_pipe[2], setup[2];
  if (::pipe2(status_pipe, O_CLOEXEC) != 0) return Status::Errno("pipe");
  c.status_r.reset(status_pipe[0]);
  UniqueFd status_w(status_pipe[1]);
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, setup) != 0)
    return Status::Errno("socketpair");
  c.setup_parent.reset(setup[0]);
  UniqueFd setup_child(setup[1]);

  // Everything the child reads is built before the clone: it may not allocate.
  ChildPlan plan = c.storage.Build(BuildMountPlan(c.mounts), c.mounts.root, spec.hostname,
                                   {"sbx-agent", "--listen-fd", "3"});
  // Limits can only be lowered from inside a user namespace: never ask for more than we have.
  rlimit nofile{};
  ::getrlimit(RLIMIT_NOFILE, &nofile);
  nofile.rlim_max = std::min<rlim_t>(nofile.rlim_max, 65536);
  nofile.rlim_cur = nofile.rlim_max;
  const ChildPlan::Rlimit rlimits[] = {
      {RLIMIT_NOFILE, nofile},
      {RLIMIT_CORE, {0, 0}},
  };
  plan.rlimits = rlimits;
  plan.rlimit_count = std::size(rlimits);
  std::vector<std::string> sysctl_paths;
  std::vector<ChildPlan::Sysctl> sysctls;
  for (size_t i = 0; i < kUserNamespaceLimitCount; ++i)
    sysctl_paths.push_back(std::string("/proc/sys/user/") + kUserNamespaceLimits[i].name);
  for (size_t i = 0; i < kUserNamespaceLimitCount; ++i)
    sysctls.push_back({sysctl_paths[i].c_str(), kUserNamespaceLimits[i].value});
  plan.sysctls = sysctls.data();
  plan.sysctl_count = sysctls.size();
  plan.caps = DefaultCapabilityPlan().value();
  const sock_fprog prog = DefaultSeccompProgram().value().prog();
  plan.seccomp = &prog;
  plan.die_with_parent = spec.die_with_parent;
  plan.stdin_fd = c.devnull.get();
  plan.log_fd = c.log.get();
  plan.listen_fd = c.listen.get();
  plan.status_fd = status_w.get();
  plan.setup_fd = setup_child.get();
  plan.mount_count = c.layers.size() + spec.binds.size() + (c.box.layer_ids ? 1 : 0);
  plan.lowerdir_plus = config_.overlay_lowerdir_plus && OverlayHasLowerdirPlus();
  plan.agent_fd = agent_image_.get();

  constexpr unsigned long kFlags =
      CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET;
  // The user namespace is owned by the box's own host id, not root: the kernel charges per-user
  // counters (inotify, user namespaces, processes) of everything in the box to that id.
  // The child dies with this thread (its parent-death signal), and this thread stays in Create
  // until the child has exec'd or failed: the daemon's request threads come and go, but never
  // while one of them is inside Create. The child never returns here (RunChild execs or exits),
  // so no destructor of this process's owners ever runs in it.
  int child_pidfd = -1;
  long pid = CloneOwnedBy(kFlags, c.own_base, &child_pidfd);
  if (pid < 0) return Status::Error("clone", static_cast<int>(-pid));
  if (pid == 0) RunChild(plan);
  c.child = ChildProcess(static_cast<pid_t>(pid), UniqueFd(child_pidfd));
  c.box.init_pid = static_cast<pid_t>(pid);
  status_w.reset();
  setup_child.reset();
  // The agent's host pid, for whoever adopts this box after its owner died. Written before the
  // go-ahead: a box that outlives its creator stops dying with it only after that (RunChild).
  SBX_RETURN_IF_ERROR(WriteFile(c.box.dir + "/pid", std::to_string(c.box.init_pid) + "\n", 0600));
  SBX_RETURN_IF_ERROR(WriteIdMaps(c.box.init_pid, c.root_id));
  SBX_RETURN_IF_ERROR(c.cgroup->AddProcess(c.box.init_pid));
  // The agent is never the OOM killer's victim: a memory bomb in the box dies instead of it.
  // Lowering a score needs CAP_SYS_RESOURCE, which some hosts withhold even from root (Open
  // warns once); the box still works there, only without this protection (the agent also puts
  // what it spawns at +500, see src/agent/spawn.cc). The legacy file: -17 there is -1000, and
  // unlike a privileged write of oom_score_adj it leaves oom_score_adj_min alone, so what the
  // agent spawns can never lower itself back to -1000.
  if (Status adj = WriteFile("/proc/" + std::to_string(c.box.init_pid) + "/oom_adj", "-17");
      !adj.ok() && !(adj.err() == EACCES && !can_protect_agent_)) {
    return adj;
  }
  return {};
}

Status NativeRuntime::AtSyncPoint(Creation& c) {
  // The child is cloned, mapped and in its cgroups, and waits for the go-ahead before any of its
  // own setup: what the host does to the box's namespaces from outside goes here (its veth).
  if (!c.spec.at_sync_point) return {};
  return c.spec.at_sync_point(c.box.init_pid);
}

Status NativeRuntime::SendGoAhead(Creation& c) {
  // The go-ahead: the mounts the child attaches, layers then binds. Read-only ones
  // are idmapped into the box's range (files show their real owners inside); writable binds
  // never are (the box's root would write as the files' real owners). Each is a detached mount
  // owned by its descriptor: closing it (here, once sent) leaves it only to the child.
  const BoxSpec& spec = c.spec;
  std::vector<UniqueFd> mounts;
  UniqueFd userns;
  if (idmapped_) {
    auto u = OpenUserNamespace(c.box.init_pid);
    if (!u.ok()) return u.status();
    userns = std::move(u).value();
  }
  constexpr uint64_t kRo = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
  for (const auto& l : c.layers) {
    auto m = DetachedMount(l, kRo, userns ? userns.get() : -1);
    if (!m.ok()) return m.status();
    mounts.push_back(std::move(m).value());
  }
  for (const auto& b : spec.binds) {
    auto m = b.read_only ? DetachedMount(b.source, kRo, userns ? userns.get() : -1)
                         : DetachedMount(b.source, 0, -1);
    if (!m.ok()) return m.status();
    mounts.push_back(std::move(m).value());
  }
  // A writable layer that stores files as a layer does reaches the box idmapped, as the layers
  // do (PrepareWritableLayer).
  if (c.box.layer_ids) {
    auto m = DetachedMount(c.fs + "/layer", 0, userns.get());
    if (!m.ok()) return m.status();
    mounts.push_back(std::move(m).value());
  }
  // The box directory as the child's mount namespace sees it: the child (no capability on the
  // host) could not walk the root-only run directory to it, and a descriptor of the host's copy
  // would name mounts outside its namespace.
  std::string fs_in_child = "/proc/" + std::to_string(c.box.init_pid) + "/root" + c.fs;
  UniqueFd fs_fd(::open(fs_in_child.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!fs_fd) return Status::Errno("open " + fs_in_child);
  std::vector<int> fds{fs_fd.get()};
  for (const auto& m : mounts) fds.push_back(m.get());
  // setup_parent stays open until the exec or the failure: the child takes its hang-up for this
  // process's death. In messages the kernel accepts ('m': more follow, 'g': the go-ahead).
  for (size_t at = 0;;) {
    size_t n = std::min(kMaxFdsPerMessage, fds.size() - at);
    std::vector<int> part(fds.begin() + static_cast<ptrdiff_t>(at),
                          fds.begin() + static_cast<ptrdiff_t>(at + n));
    at += n;
    bool last = at == fds.size();
    SBX_RETURN_IF_ERROR(SendFds(c.setup_parent.get(), last ? 'g' : 'm', part));
    if (last) return {};
  }
}

Status NativeRuntime::AwaitChildSetup(Creation& c) {
  const auto& ops = c.storage.ops();
  // EOF on the status pipe means the exec of the agent happened (the pipe is close-on-exec);
  // a ChildFailure record names the step that failed.
  ChildFailure failure{};
  ssize_t n;
  do {
    n = ::read(c.status_r.get(), &failure, sizeof failure);
  } while (n < 0 && errno == EINTR);
  // The box's mount namespace holds its own reference to the disk mount from the moment it has
  // made its mounts private, so the host's copy goes as soon as the child is past setup (or
  // dead): it never stays in the host's mount table.
  c.disk.Detach();
  if (n == 0) return {};
  if (n != static_cast<ssize_t>(sizeof failure))
    return Status::Error("box setup: short status", EIO);
  std::string what = failure.step >= 0 && static_cast<size_t>(failure.step) < ops.size()
                         ? ops[static_cast<size_t>(failure.step)].Describe(c.mounts.root)
                         : ChildStepName(failure.step);
  return Status::Error("box setup: " + what, failure.err);
}

Status NativeRuntime::Freeze(const Box& box) { return Cgroup::Open(cgroups_, box.id)->Freeze(); }
Status NativeRuntime::Thaw(const Box& box) { return Cgroup::Open(cgroups_, box.id)->Thaw(); }

Status NativeRuntime::SetLimits(const Box& box, const Limits& limits) {
  std::string what = "set the limits of box " + box.id;
  SBX_RETURN_IF_ERROR(cgroup_internal::ValidateRequest(box.id, limits).Wrap(what));
  return Cgroup::Open(cgroups_, box.id)->SetLimits(limits).Wrap(what);
}
Result<UniqueFd> NativeRuntime::OpenSocket(const Box& box, int domain, int type) {
  std::string what = "socket in box " + box.id;
  auto pidfd = AgentPidfd(box);
  if (!pidfd.ok()) return pidfd.status().Wrap(what);
  return SocketInNetworkOf(pidfd->get(), domain, type, what);
}

Result<uint64_t> NativeRuntime::OomKills(const Box& box) {
  return Cgroup::Open(cgroups_, box.id)->OomKills();
}

Result<BoxStats> NativeRuntime::Stats(const Box& box) {
  auto st = Cgroup::Open(cgroups_, box.id)->Stats();
  if (!st.ok()) return st;
  // The writable layer (Prepare): with a disk limit, a btrfs subvolume whose qgroup says what
  // it holds and may hold, or an ext4 image mounted only in the box's own mount namespace, read
  // through its agent's root; else a directory on the data directory's filesystem. Disk
  // figures are best effort: a box whose agent is going away still reports its cgroup's.
  Result<LayerUsage> disk = Status::Error("no disk figures", ENOENT);
  struct stat img {};
  const std::string vol = box.dir + "/fs/layer";
  const bool subvolume = btrfs::IsSubvolume(vol);
  if (subvolume) {
    if (auto q = btrfs::GetUsage(vol); q.ok() && q->limit > 0)
      disk = LayerUsage{q->referenced, q->limit};
  }
  if (disk.ok()) {
    // the qgroup's
  } else if (subvolume) {
    disk = DirectoryUsage(vol + "/upper");
  } else if (::stat((box.dir + "/disk.img").c_str(), &img) == 0) {
    if (auto pidfd = AgentPidfd(box); pidfd.ok()) {
      UniqueFd root(::open(("/proc/" + std::to_string(box.init_pid) + "/root").c_str(),
                           O_PATH | O_DIRECTORY | O_CLOEXEC));
      // Still that agent once its root is open: the fd is of this box's root, not a successor's.
      if (root && ::syscall(SYS_pidfd_send_signal, pidfd->get(), 0, nullptr, 0) == 0)
        disk = ImageUsage(root.get());
    }
  } else {
    disk = DirectoryUsage(box.dir + "/fs/upper");
  }
  if (disk.ok()) {
    st->disk_used = disk->used;
    st->disk_total = disk->total;
  }
  return st;
}

std::optional<std::string> NativeRuntime::AgentExit(const Box& box) {
  if (AgentPidfd(box).ok()) return std::nullopt;
  std::string how = "agent exited";
  siginfo_t info{};
  if (box.init_pid > 0 &&
      ::waitid(P_PID, static_cast<id_t>(box.init_pid), &info, WEXITED | WNOHANG | __WALL) == 0) {
    // Our child, but not a zombie yet: it has left its cgroup and is still exiting. Not exited
    // yet, then; the next scan finds the zombie and its status.
    if (info.si_pid == 0) return std::nullopt;
    how += info.si_code == CLD_EXITED ? " with status " + std::to_string(info.si_status)
                                      : " on signal " + std::to_string(info.si_status);
  }
  auto log = ReadFile(config_.run_dir + "/" + box.id + "/agent.log", 1 << 20);
  if (log.ok() && !log->empty()) {
    constexpr size_t kTail = 512;
    std::string tail = log->size() > kTail ? log->substr(log->size() - kTail) : *log;
    while (!tail.empty() && tail.back() == '\n') tail.pop_back();
    how += "; agent.log ends: " + tail;
  }
  return how;
}

size_t NativeRuntime::MaxLayers(const Box& box) {
  (void)box;
  return kMaxLayers;
}

Status NativeRuntime::Destroy(const Box& box) { return DestroyBox(box, nullptr); }

Status NativeRuntime::Stop(const Box& box) {
  SBX_RETURN_IF_ERROR(ValidateBoxId(box.id));
  KillAgent(box, *Cgroup::Open(cgroups_, box.id));
  return {};
}

Status NativeRuntime::DestroyKeepingUpper(const Box& box, const std::string& dest) {
  return DestroyBox(box, &dest);
}

// A disk-limited box's writable layer is on an ext4 image mounted only in the box's own mount
// namespace (Prepare). Mounting its loop device again here gives another mount of that same live
// filesystem (the kernel shares the superblock; nothing of the image is parsed again): a
// detached one, never attached anywhere, so that it goes with its descriptor, however this
// process ends.
Status NativeRuntime::CopyWritableLayer(const Box& box, const std::string& dest,
                                        int64_t limit_bytes) {
  SBX_RETURN_IF_ERROR(ValidateBoxId(box.id));
  const std::string dir = config_.run_dir + "/" + box.id;
  const std::string what = "copy the writable layer of box " + box.id;
  UniqueFd mount;  // of the disk image
  std::string upper = dir + "/fs/upper";
  struct stat sb {};
  if (const std::string vol = dir + "/fs/layer"; btrfs::IsSubvolume(vol)) {
    // On btrfs: a snapshot, which takes no room up front, when `dest` is on that filesystem.
    if (btrfs::SameFilesystem(vol, dest)) {
      if (::rmdir(dest.c_str()) != 0) return Status::Errno(what + ": rmdir " + dest);
      SBX_RETURN_IF_ERROR(btrfs::Snapshot(vol, dest).Wrap(what));
      SBX_RETURN_IF_ERROR(Unlimited(dest).Wrap(what));
      return UpperToLayer(dest).Wrap(what);
    }
    upper = vol + "/upper";
  } else if (::lstat((dir + "/disk.img").c_str(), &sb) == 0) {
    auto dev = LoopDeviceOf(dir + "/disk.img");
    if (!dev.ok()) return dev.status().Wrap(what);
    auto detached = MountDetached(*dev);
    if (!detached.ok()) return detached.status().Wrap(what);
    mount = std::move(detached).value();
  }
  UniqueFd from(
      mount ? ::openat(mount.get(), "upper", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
            : ::open(upper.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!from) return Status::Errno(what + ": open its upper directory");
  Result<int64_t> copied = CopyLayerTree(from.get(), dest, limit_bytes);
  if (!copied.ok()) return copied.status().Wrap(what);
  return {};
}

Status NativeRuntime::DestroyBox(const Box& box, const std::string* keep_upper) {
  SBX_RETURN_IF_ERROR(ValidateBoxId(box.id));
  // The cgroup's removal kills whatever got out of the pid namespace's reach (nothing can, but
  // the cgroup is the authority).
  std::unique_ptr<Cgroup> cgroup = Cgroup::Open(cgroups_, box.id);
  KillAgent(box, *cgroup);
  Status cg = cgroup->Destroy();
  // The agent is reaped and, as PID 1 of its pid namespace, took every process of the box with
  // it: nothing writes to the upper directory any more (the cgroup, just emptied, agrees).
  Status kept;
  if (keep_upper != nullptr) {
    std::string upper = config_.run_dir + "/" + box.id + "/fs/upper";
    struct stat sb {};
    const std::string vol = config_.run_dir + "/" + box.id + "/fs/layer";
    if (!cg.ok()) {
      kept = cg.Wrap("keep the writable layer of box " + box.id);
    } else if (::lstat((config_.run_dir + "/" + box.id + "/disk.img").c_str(), &sb) == 0) {
      kept = Status::Error("keep the writable layer of box " + box.id + ": it has a disk limit",
                           ENOTSUP);
    } else if (btrfs::IsSubvolume(vol)) {
      // A copy (of clones) in a plain directory: a layer below others is never a subvolume of
      // its own, whose inode numbers would collide with theirs (PrepareWritableLayer).
      auto copied = CopyLayerDir(vol + "/upper", *keep_upper, INT64_MAX);
      if (!copied.ok()) kept = copied.status().Wrap("keep the writable layer of box " + box.id);
    } else if (::rename(upper.c_str(), keep_upper->c_str()) != 0) {
      kept = Status::Errno("keep the writable layer of box " + box.id + ": rename " + upper +
                           " to " + *keep_upper);
    }
  }
  // A disk image still mounted on the host means its creator died mid-create.
  ::umount2((config_.run_dir + "/" + box.id + "/fs/disk").c_str(), MNT_DETACH);
  // Or a copy of its writable layer by an sbx before detached mounts (CopyWritableLayer).
  ::umount2((config_.run_dir + "/" + box.id + "/fs/peek").c_str(), MNT_DETACH);
  Status fs = RemoveTree(config_.run_dir + "/" + box.id);
  {
    MutexLock guard(mu_);
    owner_locks_.erase(box.id);
  }
  // The range is free only once nothing the box wrote is left on the host.
  if (fs.ok() && config_.id_pool != nullptr) {
    Status released = config_.id_pool->Release(box.id);
    if (!released.ok()) return released.Wrap("destroy box " + box.id);
  }
  if (!cg.ok()) return cg.Wrap("destroy box " + box.id);
  if (!fs.ok()) return fs.Wrap("destroy box " + box.id);
  return kept;
}

Result<std::vector<std::string>> NativeRuntime::ListBoxes() { return ListBoxIds(config_.run_dir); }

Result<Box> NativeRuntime::Adopt(const std::string& id) {
  SBX_RETURN_IF_ERROR(ValidateBoxId(id));
  Box box;
  box.id = id;
  box.dir = config_.run_dir + "/" + id;
  box.agent_socket = box.dir + "/agent.sock";
  UniqueFd lock(::open((box.dir + "/owner").c_str(), O_RDWR | O_CLOEXEC));
  if (!lock) return Status::Errno("adopt box " + id + ": open owner");
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0)
    return Status::Error("adopt box " + id + ": owned by a live process", EBUSY);
  auto pid = ReadFile(box.dir + "/pid", 64);
  if (!pid.ok()) return Status::Error("adopt box " + id + ": no agent pid recorded", ESRCH);
  box.init_pid = static_cast<pid_t>(std::atoi(pid->c_str()));
  // "<root id> <idmapped> <layer_ids> <holds_top_layer>" (Prepare); older boxes wrote the first
  // two alone.
  if (auto ids = ReadFile(box.dir + kIdsFile, 64); ids.ok()) {
    unsigned long root = 0;
    int idmapped = 0, layer_ids = 0, holds_top = 0;
    (void)std::sscanf(ids->c_str(), "%lu %d %d %d", &root, &idmapped, &layer_ids, &holds_top);
    box.id_base = static_cast<uint32_t>(root);
    box.idmapped = idmapped == 1;
    box.layer_ids = layer_ids == 1;
    box.holds_top_layer = holds_top == 1;
  }
  // The pid must still be this box's agent: alive, and in this box's cgroup (pids are reused).
  auto cg = ReadFile("/proc/" + std::to_string(box.init_pid) + "/cgroup", 1 << 16);
  if (box.init_pid <= 0 || !cg.ok() || cg->find("/" + id + "\n") == std::string::npos)
    return Status::Error("adopt box " + id + ": its agent is gone", ESRCH);
  MutexLock guard(mu_);
  owner_locks_[id] = std::move(lock);
  return box;
}

Result<int> NativeRuntime::ReapOrphans(const std::string& owner) {
  auto ids = ListBoxes();
  if (!ids.ok()) return ids.status();
  std::vector<std::string> orphans;
  for (const auto& id : *ids) {
    {
      MutexLock guard(mu_);
      if (owner_locks_.count(id)) continue;  // ours and alive
    }
    if (IsOrphan(config_.run_dir + "/" + id, owner)) orphans.push_back(id);
  }
  int reaped = 0;
  // Box directories still under their temporary name whose creator died before the rename: they
  // hold only an owner file (no range, cgroup, mount or process yet), and no one else will
  // ever finish them.
  if (DIR* d = ::opendir(config_.run_dir.c_str())) {
    std::vector<std::string> abandoned;
    while (dirent* e = ::readdir(d)) {
      if (IsAbandonedCreation(e->d_name)) abandoned.emplace_back(e->d_name);
    }
    ::closedir(d);
    for (const auto& name : abandoned) {
      if (RemoveTree(config_.run_dir + "/" + name).ok()) ++reaped;
    }
  }
  for (const auto& id : orphans) {
    Box box;
    box.id = id;
    if (Destroy(box).ok()) ++reaped;
  }
  // Ranges whose box directory is gone (a process died between removing it and releasing the
  // range). A range is taken only after its directory exists, so this never frees a range that
  // a box being created right now holds.
  if (config_.id_pool != nullptr) {
    auto holders = config_.id_pool->Holders();
    if (!holders.ok()) return holders.status().Wrap("reap orphans");
    auto gone = [](const std::string& path) {
      struct stat st {};
      return ::lstat(path.c_str(), &st) != 0 && errno == ENOENT;
    };
    for (const auto& id : *holders) {
      if (!gone(config_.run_dir + "/" + id)) continue;
      if (std::all_of(config_.peer_run_dirs.begin(), config_.peer_run_dirs.end(),
                      [&](const std::string& d) { return gone(d + "/" + id); }))
        SBX_RETURN_IF_ERROR(config_.id_pool->Release(id).Wrap("reap orphans"));
    }
  }
  return reaped;
}

}  // namespace sbx::runtime
