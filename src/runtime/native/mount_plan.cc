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

MountOp Attach(int fd_index, std::string source, std::string target) {
  MountOp op;
  op.kind = MountOp::Kind::kAttach;
  op.fd_index = fd_index;
  op.source = std::move(source);
  op.target = std::move(target);
  return op;
}

MountOp Simple(MountOp::Kind kind, std::string target, std::string source = "") {
  MountOp op;
  op.kind = kind;
  op.target = std::move(target);
  op.source = std::move(source);
  return op;
}

// A bind of `src` onto `dst` followed by the remount that makes it read-only (a bind mount
// ignores MS_RDONLY on its first call).
void BindReadOnly(std::vector<MountOp>& ops, const std::string& src, const std::string& dst,
                  unsigned long extra, bool optional) {
  ops.push_back(Mount(src, dst, "", MS_BIND | MS_REC, "", optional));
  ops.push_back(Mount("", dst, "", MS_BIND | MS_REMOUNT | MS_RDONLY | extra, "", optional));
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
  // (idmapped) mount made by the parent, attached here on lower/<i>. userxattr: overlay is
  // mounted from inside the user namespace, where trusted.* xattrs are not available.
  std::string lower;
  ops.push_back(Simple(MountOp::Kind::kMkdir, "lower"));
  for (size_t i = 0; i < in.layers.size(); ++i) {
    std::string at = "lower/" + std::to_string(i);
    ops.push_back(Simple(MountOp::Kind::kMkdir, at));
    ops.push_back(Attach(static_cast<int>(i), in.layers[i], at));
    if (!lower.empty()) lower += ':';
    lower += at;
  }
  ops.push_back(Mount("overlay", r, "overlay", MS_NOSUID | MS_NODEV,
                      "lowerdir=" + lower + ",upperdir=" + OverlayEscape(in.upper) +
                          ",workdir=" + OverlayEscape(in.work) + ",userxattr"));

  // Binds arrive with their flags set (read-only ones: ro, nosuid, nodev, idmapped). Their
  // mount points are made with every missing parent (`sbx run --volume H:/a/new/dir`), in the
  // box's writable layer: a directory, or for a regular file (the network's resolv.conf) a file,
  // never followed if it is a symlink (the bind then fails: nothing is mounted outside the box).
  for (size_t i = 0; i < in.binds.size(); ++i) {
    const auto& b = in.binds[i];
    for (size_t slash = b.target.find('/', 1); slash != std::string::npos;
         slash = b.target.find('/', slash + 1))
      ops.push_back(Simple(MountOp::Kind::kMkdir, r + b.target.substr(0, slash)));
    struct stat st {};
    bool file = ::stat(b.source.c_str(), &st) == 0 && S_ISREG(st.st_mode);
    ops.push_back(Simple(file ? MountOp::Kind::kTouch : MountOp::Kind::kMkdir, r + b.target));
    ops.push_back(Attach(static_cast<int>(in.layers.size() + i), b.source, r + b.target));
    // A read-only overlay without an upper layer: the topmost layer's directory (attached on
    // lower/0) over the bound one. Optional: a host without the directory keeps its bind alone.
    for (const auto& sub : b.overlaid) {
      if (in.layers.empty()) break;
      std::string at = r + b.target + "/" + sub;
      ops.push_back(Mount("overlay", at, "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV,
                          "lowerdir=" + OverlayEscape("lower/0" + b.target + "/" + sub) + ":" +
                              OverlayEscape(at) + ",userxattr",
                          true));
    }
  }

  // /proc of the box's own pid namespace, with the host-revealing parts masked or read-only.
  ops.push_back(Simple(MountOp::Kind::kMkdir, r + "/proc"));
  ops.push_back(Mount("proc", r + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC));
  for (const char* p : kReadOnlyProcPaths)
    BindReadOnly(ops, r + p, r + p, MS_NOSUID | MS_NODEV | MS_NOEXEC, true);
  for (const char* p : kMaskedProcFiles)
    ops.push_back(Mount("/dev/null", r + p, "", MS_BIND, "", true));

  // /sys of the box's own network namespace, read-only.
  ops.push_back(Simple(MountOp::Kind::kMkdir, r + "/sys"));
  ops.push_back(Mount("sysfs", r + "/sys", "sysfs", kRoFlags));
  for (const char* p : kMaskedDirs)
    ops.push_back(Mount("tmpfs", r + p, "tmpfs", kRoFlags, "size=4k", true));

  // A minimal /dev: a few harmless host nodes, a private devpts, /dev/shm and the usual links.
  ops.push_back(Simple(MountOp::Kind::kMkdir, r + "/dev"));
  ops.push_back(Mount("tmpfs", r + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=1m"));
  for (const char* d : kDevices) {
    std::string target = r + "/dev/" + d;
    ops.push_back(Simple(MountOp::Kind::kTouch, target));
    ops.push_back(Mount(std::string("/dev/") + d, target, "", MS_BIND));
  }
  ops.push_back(Simple(MountOp::Kind::kMkdir, r + "/dev/pts"));
  ops.push_back(Mount("devpts", r + "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
                      "newinstance,ptmxmode=0666,mode=0620,gid=5"));
  ops.push_back(Simple(MountOp::Kind::kSymlink, r + "/dev/ptmx", "pts/ptmx"));
  ops.push_back(Simple(MountOp::Kind::kMkdir, r + "/dev/shm"));
  ops.push_back(
      Mount("tmpfs", r + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=64m"));
  ops.push_back(Simple(MountOp::Kind::kMkdir, r + "/dev/mqueue"));
  ops.push_back(
      Mount("mqueue", r + "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, "", true));
  ops.push_back(Simple(MountOp::Kind::kSymlink, r + "/dev/fd", "/proc/self/fd"));
  ops.push_back(Simple(MountOp::Kind::kSymlink, r + "/dev/stdin", "/proc/self/fd/0"));
  ops.push_back(Simple(MountOp::Kind::kSymlink, r + "/dev/stdout", "/proc/self/fd/1"));
  ops.push_back(Simple(MountOp::Kind::kSymlink, r + "/dev/stderr", "/proc/self/fd/2"));
  return ops;
}

}  // namespace sbx::runtime
