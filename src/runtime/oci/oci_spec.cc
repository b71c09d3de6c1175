#include "runtime/oci/oci_spec.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "runtime/native/capabilities.h"
#include "runtime/native/cgroup_internal.h"
#include "runtime/native/native_runtime.h"

namespace sbx::runtime {
namespace {

using nlohmann::json;

// The native runtime's masked and read-only /proc and /sys paths (mount_plan.cc keeps its own
// copy of these lists in the form its mount plan needs; keep the two in step). runc masks a file
// with /dev/null and a directory with an empty read-only tmpfs, as the native plan does. gVisor's
// /proc and /sys are its own and show nothing of the host, so its bundle leaves them out.
constexpr const char* kMaskedPaths[] = {
    "/proc/kcore",         "/proc/keys",      "/proc/timer_list",  "/proc/sched_debug",
    "/proc/latency_stats", "/proc/kallsyms",  "/proc/kpagecount",  "/proc/kpageflags",
    "/proc/kpagecgroup",   "/proc/config.gz", "/proc/vmallocinfo", "/proc/acpi",
    "/proc/scsi",          "/proc/asound",    "/proc/driver",      "/sys/firmware",
    "/sys/kernel/debug",
};
constexpr const char* kReadOnlyPaths[] = {
    "/proc/sys", "/proc/sysrq-trigger",   "/proc/irq",      "/proc/bus",
    "/proc/fs",  "/proc/1/oom_score_adj", "/proc/1/oom_adj"};

// Index = capability number (linux/capability.h).
constexpr const char* kCapabilityNames[] = {
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
};

json Mount(const char* target, const char* type, const char* source,
           std::initializer_list<const char*> options) {
  json o = json::array();
  for (const char* opt : options) o.push_back(opt);
  return {{"destination", target}, {"type", type}, {"source", source}, {"options", o}};
}

json SeccompJson(const SeccompRules& rules) {
  json calls = json::array();
  for (const auto& r : rules.rules) {
    json action = r.allow ? json("SCMP_ACT_ALLOW") : json("SCMP_ACT_ERRNO");
    if (!r.has_arg && !calls.empty()) {
      // Consecutive unconditional rules with one action share an entry.
      json& last = calls.back();
      if (!last.contains("args") && last["action"] == action &&
          (r.allow || last.value("errnoRet", 0) == r.err)) {
        last["names"].push_back(r.name);
        continue;
      }
    }
    json entry = {{"names", json::array({r.name})}, {"action", action}};
    if (!r.allow) entry["errnoRet"] = r.err;
    if (r.has_arg) {
      // libseccomp's SCMP_CMP_MASKED_EQ compares (arg & datum_a) == datum_b: OCI's value and
      // valueTwo, in that order.
      entry["args"] = json::array({{{"index", r.arg},
                                    {"value", r.mask},
                                    {"valueTwo", r.value},
                                    {"op", "SCMP_CMP_MASKED_EQ"}}});
    }
    calls.push_back(std::move(entry));
  }
  return {{"defaultAction", "SCMP_ACT_ERRNO"},
          {"defaultErrnoRet", rules.default_errno},
          {"architectures", json::array({"SCMP_ARCH_X86_64"})},
          {"syscalls", calls}};
}

}  // namespace

std::vector<std::string> CapabilityNames(uint64_t mask) {
  std::vector<std::string> out;
  for (size_t i = 0; i < std::size(kCapabilityNames); ++i)
    if (mask & (uint64_t{1} << i)) out.emplace_back(kCapabilityNames[i]);
  return out;
}

int64_t GvisorHostPids(int64_t pids) { return pids > 0 ? pids * 16 + 256 : 0; }

std::string SeccompToOciJson(const SeccompRules& rules) { return SeccompJson(rules).dump(); }

std::string BuildOciSpec(const OciSpecInput& in) {
  const bool gvisor = in.kind == OciKind::kGvisor;
  json caps = CapabilityNames(KeptCapabilities());
  // RLIMIT_NOFILE 65536, soft and hard, as native boxes. (Where close_range(2) is missing, as in
  // gVisor 20221219, sbx-agent closes what /proc/self/fd lists before a command's exec, not every
  // number up to the limit.)
  const int64_t nofile_soft = in.nofile;
  json process = {
      {"terminal", false},
      {"user", {{"uid", 0}, {"gid", 0}}},
      {"args", in.args},
      {"env", json::array()},  // as the native runtime's agent: each command gets its own
      {"cwd", "/"},
      {"capabilities",
       {{"bounding", caps},
        {"effective", caps},
        {"permitted", caps},
        {"inheritable", json::array()},
        {"ambient", json::array()}}},
      {"noNewPrivileges", true},
  };
  // runc sets process.rlimits from outside, with prlimit(2) on its init, which needs
  // CAP_SYS_RESOURCE over a user namespace it did not make (hosts such as this project's CI
  // withhold it even from root): a box joining one gets its limits by inheritance instead, from
  // the runc process sbx starts with them (oci_runtime.cc, BoxRlimits).
  if (gvisor || in.userns_path.empty()) {
    process["rlimits"] =
        json::array({{{"type", "RLIMIT_NOFILE"}, {"hard", in.nofile}, {"soft", nofile_soft}},
                     {{"type", "RLIMIT_CORE"}, {"hard", 0}, {"soft", 0}}});
  }

  json mounts = json::array({
      Mount("/proc", "proc", "proc", {"nosuid", "noexec", "nodev"}),
      Mount("/dev", "tmpfs", "tmpfs", {"nosuid", "noexec", "strictatime", "mode=755", "size=1m"}),
      Mount("/dev/pts", "devpts", "devpts",
            {"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}),
      Mount("/dev/shm", "tmpfs", "shm", {"nosuid", "nodev", "mode=1777", "size=65536k"}),
      Mount("/dev/mqueue", "mqueue", "mqueue", {"nosuid", "noexec", "nodev"}),
      Mount("/sys", "sysfs", "sysfs", {"nosuid", "noexec", "nodev", "ro"}),
  });
  for (const auto& b : in.binds) {
    // nosuid and nodev always: an idmapped source's are locked once it is bound into the box's
    // user namespace, and a remount that would clear them fails (EPERM).
    mounts.push_back({{"destination", b.target},
                      {"type", "bind"},
                      {"source", b.source},
                      {"options", {"rbind", b.read_only ? "ro" : "rw", "nosuid", "nodev"}}});
  }

  json user_ns = {{"type", "user"}};
  if (!in.userns_path.empty()) user_ns["path"] = in.userns_path;
  json net_ns = {{"type", "network"}};
  if (!in.netns_path.empty()) net_ns["path"] = in.netns_path;
  json namespaces = json::array({{{"type", "pid"}},
                                 {{"type", "ipc"}},
                                 {{"type", "uts"}},
                                 {{"type", "mount"}},
                                 net_ns,
                                 user_ns});
  // The box sees "/" as its cgroup. gVisor's cgroups are its own anyway.
  if (!gvisor) namespaces.push_back({{"type", "cgroup"}});
  const json map = json::array({{{"containerID", 0}, {"hostID", in.id_base}, {"size", kIdRange}}});

  json resources = {{"devices", json::array({{{"allow", false}, {"access", "rwm"}}})}};
  const Limits& l = in.limits;
  // Memory and memory+swap equal: no swap, as native (runc writes memsw only where it exists).
  if (l.memory_bytes > 0)
    resources["memory"] = {{"limit", l.memory_bytes}, {"swap", l.memory_bytes}};
  json cpu = json::object();
  if (l.cpus > 0) {
    cpu["period"] = cgroup_internal::kCpuPeriodUs;
    cpu["quota"] = cgroup_internal::CpuQuotaUs(l.cpus);
  }
  if (l.cpu_weight > 0) cpu["shares"] = cgroup_internal::WeightToShares(l.cpu_weight);
  if (!cpu.empty()) resources["cpu"] = cpu;
  if (l.pids > 0) resources["pids"] = {{"limit", gvisor ? GvisorHostPids(l.pids) : l.pids}};

  json linux = {
      {"uidMappings", map},
      {"gidMappings", map},
      {"namespaces", namespaces},
      {"resources", resources},
      {"cgroupsPath", in.cgroups_path},
  };
  if (!gvisor) {
    linux["maskedPaths"] = kMaskedPaths;
    linux["readonlyPaths"] = kReadOnlyPaths;
  }
  // gVisor: runsc applies linux.seccomp only with --oci-seccomp, and runsc 20221219 then ignores
  // every errnoRet (defaultErrnoRet included): each refusal is EPERM, clone3 among them, and glibc
  // falls back to clone only on ENOSYS, so no thread could start (measured). Its bundle has none;
  // the Sentry's own system call surface is what a gVisor box meets.
  if (in.seccomp != nullptr && !gvisor) linux["seccomp"] = SeccompJson(*in.seccomp);

  json spec = {
      {"ociVersion", "1.0.2"},
      {"process", process},
      {"root", {{"path", in.root}, {"readonly", false}}},
      {"hostname", in.hostname},
      {"mounts", mounts},
      {"linux", linux},
  };
  return spec.dump(1);
}

}  // namespace sbx::runtime
