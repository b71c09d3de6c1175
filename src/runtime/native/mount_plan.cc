#include "runtime/native/mount_plan.h"

#include <sys/mount.h>
#include <sys/stat.h>

namespace sbx::runtime {
namespace {

// Files under /proc that expose the host kernel: replaced by an empty /dev/null bind.
constexpr const char* kMaskedProcFiles[] = {
    "/proc/kcore",         "/proc/keys",      "/proc/timer_list",  "/proc/sched_debug",
    "/proc/latency_stats", "/proc/kallsyms",  "/proc/kpagecount",  "/proc/kpageflags",
    "/proc/kpagecgroup",   "/proc/config.gz", "/proc/vmallocinfo",
};
// Directories under /proc and /sys that expose host hardware: covered by an empty read-only tmpfs.
constexpr const char* kMaskedDirs[] = {"/proc/acpi",   "/proc/scsi",    "/proc/asound",
                                       "/proc/driver", "/sys/firmware", "/sys/kernel/debug"};
// Writable kernel knobs under /proc: bound onto themselves read-only.
// /proc/1 is the agent (the child that runs the plan becomes it): its OOM score files are
// read-only, so nothing in the box can make the agent the OOM killer's first choice.
constexpr const char* kReadOnlyProcPaths[] = {
    "/proc/sys", "/proc/sysrq-trigger",   "/proc/irq",      "/proc/bus",
    "/proc/fs",  "/proc/1/oom_score_adj", "/proc/1/oom_adj"};
// Device nodes bound from the host into the box's /dev. None of them reaches hardware.
constexpr const char* kDevices[] = {"null", "zero", "full", "random", "urandom", "tty"};

constexpr unsigned long kRoFlags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC;
constexpr char kBootIdPath[] = "/proc/sys/kernel/random/boot_id";

MountOp Mount(std::string source, std::string target, std::string fstype, unsigned long flags,
              std::string data = "", bool optional = false) {
  MountOp op;
  op.kind = MountOp::Kind::kMount;
  op.source = std::move(source);
  op.target = std::move(target);
  op.fstype = std::move(fstype);
  op.flags = flags;
  op.data = std::move(data);
  op.optional = optional;
  return op;
}

// A mount on a path inside the box's root.
MountOp MountIn(std::string source, std::string target, std::string fstype, unsigned long flags,
                std::string data = "", bool optional = false) {
  MountOp op = Mount(std::move(source), std::move(target), std::move(fstype), flags,
                     std::move(data), optional);
  op.in_root = true;
  return op;
}

MountOp Attach(int fd_index, std::string source, std::string target, bool in_root) {
  MountOp op;
  op.kind = MountOp::Kind::kAttach;
  op.fd_index = fd_index;
  op.source = std::move(source);
  op.target = std::move(target);
  op.in_root = in_root;
  return op;
}

MountOp Simple(MountOp::Kind kind, std::string target, std::string source = "",
               bool in_root = false) {
  MountOp op;
  op.kind = kind;
  op.target = std::move(target);
  op.source = std::move(source);
  op.in_root = in_root;
  return op;
}

MountOp In(MountOp::Kind kind, std::string target, std::string source = "") {
  return Simple(kind, std::move(target), std::move(source), true);
}

// A bind of the root's `path` onto itself followed by the remount that makes it read-only (a
// bind mount ignores MS_RDONLY on its first call).
void BindReadOnly(std::vector<MountOp>& ops, const std::string& path, unsigned long extra,
                  bool optional) {
  MountOp bind = MountIn(path, path, "", MS_BIND | MS_REC, "", optional);
  bind.source_in_root = true;
  ops.push_back(bind);
  ops.push_back(MountIn("", path, "", MS_BIND | MS_REMOUNT | MS_RDONLY | extra, "", optional));
}

}  // namespace

std::string OverlayEscape(const std::string& path) {
  std::string out;
  for (char c : path) {
    if (c == ',' || c == ':' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

std::string MountOp::Describe(const std::string& root) const {
  auto strip = [&](const std::string& p) {
    if (in_root) return p;
    if (!root.empty() && p.rfind(root, 0) == 0)
      return p.size() == root.size() ? std::string("/") : p.substr(root.size());
    return p;
  };
  switch (kind) {
    case Kind::kMkdir:
      return "mkdir " + strip(target);
    case Kind::kTouch:
      return "create " + strip(target);
    case Kind::kSymlink:
      return "symlink " + strip(target) + " -> " + source;
    case Kind::kAttach:
      return "attach " + source + " on " + strip(target);
    case Kind::kOverlay:
      return "mount the overlay of " + std::to_string(fd_index) + " layers on " + strip(target);
    case Kind::kLowerStack:
      return "stack the " + std::to_string(fd_index) + " layers on " + strip(target);
    case Kind::kOverlaySub:
      return "overlay the top layer's " + source + " on " + strip(target);
    case Kind::kMount:
      break;
  }
  if (flags & MS_REMOUNT) return "remount " + strip(target) + " read-only";
  if (flags & MS_BIND) return "bind " + source + " on " + strip(target);
  return "mount " + fstype + " on " + strip(target);
}

std::vector<MountOp> BuildMountPlan(const MountPlanInput& in) {
  std::vector<MountOp> ops;
  const std::string& r = in.root;

  // Root: the template's layers under the box's own writable layer. Each layer is a detached
  // (idmapped) mount made by the parent, attached here on lower/<i> (in the box directory, which
  // only the host writes). userxattr: overlay is mounted from inside the user namespace, where
  // trusted.* xattrs are not available.
  ops.push_back(Simple(MountOp::Kind::kMkdir, "lower"));
  for (size_t i = 0; i < in.layers.size(); ++i) {
    std::string at = "lower/" + std::to_string(i);
    ops.push_back(Simple(MountOp::Kind::kMkdir, at));
    ops.push_back(Attach(static_cast<int>(i), in.layers[i], at, false));
  }
  if (!in.writable_mount.empty()) {
    ops.push_back(Attach(static_cast<int>(in.layers.size() + in.binds.size()), "the writable layer",
                         in.writable_mount, false));
  }
  MountOp overlay;
  if (in.stack_layers) {
    ops.push_back(Simple(MountOp::Kind::kMkdir, "lowers"));
    ops.push_back(Simple(MountOp::Kind::kMkdir, "lowers.empty"));
    MountOp stack;
    stack.kind = MountOp::Kind::kLowerStack;
    stack.target = "lowers";
    stack.data = "lowers.empty";
    stack.fd_index = static_cast<int>(in.layers.size());
    stack.flags = MS_RDONLY | MS_NOSUID | MS_NODEV;
    ops.push_back(stack);
    overlay.stacked = stack.target;
  }
  overlay.kind = MountOp::Kind::kOverlay;
  overlay.target = r;
  overlay.source = in.upper;
  overlay.data = in.work;
  overlay.fd_index = static_cast<int>(in.layers.size());
  overlay.flags = MS_NOSUID | MS_NODEV;
  ops.push_back(overlay);

  // From here on every target is a path inside the root, which the layers made: the child
  // resolves it there (child.cc). Binds arrive with their flags set (read-only ones: ro, nosuid,
  // nodev, idmapped). Their mount point is made with every missing parent (`sbx run --volume
  // H:/a/new/dir`), in the box's writable layer: a directory, or for a regular file (the
  // network's resolv.conf) a file. Whatever a layer has there instead (a symlink, a file where a
  // directory goes) is replaced in the box's view, never followed.
  for (size_t i = 0; i < in.binds.size(); ++i) {
    const auto& b = in.binds[i];
    struct stat st {};
    bool file = ::stat(b.source.c_str(), &st) == 0 && S_ISREG(st.st_mode);
    ops.push_back(In(file ? MountOp::Kind::kTouch : MountOp::Kind::kMkdir, b.target));
    ops.push_back(Attach(static_cast<int>(in.layers.size() + i), b.source, b.target, true));
    // A read-only overlay without an upper layer: the topmost layer's directory (attached on
    // lower/0) over the bound one. Optional: a host without the directory keeps its bind alone.
    for (const auto& sub : b.overlaid) {
      if (in.layers.empty()) break;
      MountOp o = In(MountOp::Kind::kOverlaySub, b.target + "/" + sub, b.target + "/" + sub);
      o.flags = MS_RDONLY | MS_NOSUID | MS_NODEV;
      o.fd_index = 0;
      o.optional = true;
      ops.push_back(o);
    }
  }

  // /proc of the box's own pid namespace, with the host-revealing parts masked or read-only.
  ops.push_back(In(MountOp::Kind::kMkdir, "/proc"));
  ops.push_back(MountIn("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC));
  for (const char* p : kReadOnlyProcPaths)
    BindReadOnly(ops, p, MS_NOSUID | MS_NODEV | MS_NOEXEC, true);
  for (const char* p : kMaskedProcFiles)
    ops.push_back(MountIn("/dev/null", p, "", MS_BIND, "", true));
  // The host's boot id names the host (and would be the same in every box); the box's own is
  // what tells a client a box was booted anew (E2B's SDK compares it across a pause).
  if (!in.boot_id.empty()) {
    ops.push_back(MountIn(in.boot_id, kBootIdPath, "", MS_BIND));
    ops.push_back(MountIn("", kBootIdPath, "", MS_BIND | MS_REMOUNT | kRoFlags));
  }

  // /sys of the box's own network namespace, read-only.
  ops.push_back(In(MountOp::Kind::kMkdir, "/sys"));
  ops.push_back(MountIn("sysfs", "/sys", "sysfs", kRoFlags));
  for (const char* p : kMaskedDirs)
    ops.push_back(MountIn("tmpfs", p, "tmpfs", kRoFlags, "size=4k", true));

  // A minimal /dev: a few harmless host nodes, a private devpts, /dev/shm and the usual links.
  ops.push_back(In(MountOp::Kind::kMkdir, "/dev"));
  ops.push_back(MountIn("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=1m"));
  for (const char* d : kDevices) {
    std::string target = std::string("/dev/") + d;
    ops.push_back(In(MountOp::Kind::kTouch, target));
    ops.push_back(MountIn(target, target, "", MS_BIND));  // the host's node (source: host path)
  }
  ops.push_back(In(MountOp::Kind::kMkdir, "/dev/pts"));
  ops.push_back(MountIn("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
                        "newinstance,ptmxmode=0666,mode=0620,gid=5"));
  ops.push_back(In(MountOp::Kind::kSymlink, "/dev/ptmx", "pts/ptmx"));
  ops.push_back(In(MountOp::Kind::kMkdir, "/dev/shm"));
  ops.push_back(MountIn("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=64m"));
  ops.push_back(In(MountOp::Kind::kMkdir, "/dev/mqueue"));
  ops.push_back(
      MountIn("mqueue", "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, "", true));
  ops.push_back(In(MountOp::Kind::kSymlink, "/dev/fd", "/proc/self/fd"));
  ops.push_back(In(MountOp::Kind::kSymlink, "/dev/stdin", "/proc/self/fd/0"));
  ops.push_back(In(MountOp::Kind::kSymlink, "/dev/stdout", "/proc/self/fd/1"));
  ops.push_back(In(MountOp::Kind::kSymlink, "/dev/stderr", "/proc/self/fd/2"));
  return ops;
}

}  // namespace sbx::runtime
