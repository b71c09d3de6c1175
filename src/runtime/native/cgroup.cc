// Probe of the host's cgroup layout, the Cgroup factory, and the file helpers both drivers share.
// The drivers themselves are cgroup_v1.cc and cgroup_v2.cc; docs/isolation.md lists what they
// write.
#include "runtime/native/cgroup.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <thread>

#include "common/fd.h"
#include "runtime/native/cgroup_internal.h"

namespace sbx::runtime {
namespace cgroup_internal {
namespace {

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    size_t end = s.find(sep, start);
    if (end == std::string_view::npos) {
      out.push_back(s.substr(start));
      return out;
    }
    out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
}

std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> out;
  for (std::string_view line : Split(text, '\n')) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

// mountinfo escapes space, tab, newline and backslash in paths as \ooo.
std::string Unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() &&
        std::all_of(s.begin() + static_cast<long>(i) + 1, s.begin() + static_cast<long>(i) + 4,
                    [](char c) { return c >= '0' && c <= '7'; })) {
      out.push_back(
          static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

bool Contains(const std::vector<std::string>& v, std::string_view x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// "a/b/" + "/c" -> "a/b/c": joins without doubling or dropping the separator.
std::string JoinPath(std::string_view a, std::string_view b) {
  while (!b.empty() && b.front() == '/') b.remove_prefix(1);
  if (b.empty()) return std::string(a);
  std::string out(a);
  if (out.empty() || out.back() != '/') out.push_back('/');
  out.append(b);
  return out;
}

// Where our own cgroup `own` (a path from /proc/self/cgroup) is under `mount`, or nullopt when the
// mount's root is not an ancestor of it (the mount shows some other part of the hierarchy).
std::optional<std::string> OwnDir(const CgroupMount& mount, const std::string& own) {
  std::string_view root = mount.root;
  while (root.size() > 1 && root.back() == '/') root.remove_suffix(1);
  if (root == "/") return JoinPath(mount.mount_point, own);
  if (own != root && (own.compare(0, root.size(), root) != 0 || own[root.size()] != '/')) {
    return std::nullopt;
  }
  return JoinPath(mount.mount_point, std::string_view(own).substr(root.size()));
}

// Kernel releases from 5.2 on have the v2 freezer; used only for the root cgroup, which has no
// cgroup.freeze file of its own.
bool ReleaseHasV2Freezer(std::string_view release) {
  int major = 0, minor = 0;
  if (std::sscanf(std::string(release).c_str(), "%d.%d", &major, &minor) != 2) return false;
  return major > 5 || (major == 5 && minor >= 2);
}

Status Unavailable(const std::string& v1_controller, const std::string& v2_detail) {
  return Status::Error("probe cgroups: need the memory, cpu, pids and freezer controllers, but " +
                           v2_detail + ", and no cgroup v1 mount has '" + v1_controller + "'",
                       ENOTSUP);
}

}  // namespace

std::vector<CgroupMount> ParseMountInfo(std::string_view mountinfo) {
  std::vector<CgroupMount> out;
  for (std::string_view line : Lines(mountinfo)) {
    std::vector<std::string_view> f;
    for (std::string_view field : Split(line, ' ')) {
      if (!field.empty()) f.push_back(field);
    }
    // id parent maj:min root mount_point options [optional...] - fstype source super_options
    auto dash = std::find(f.begin(), f.end(), "-");
    if (f.size() < 6 || dash == f.end() || f.end() - dash < 4) continue;
    std::string_view fstype = dash[1];
    if (fstype != "cgroup" && fstype != "cgroup2") continue;
    CgroupMount m;
    m.v2 = fstype == "cgroup2";
    m.root = Unescape(f[3]);
    m.mount_point = Unescape(f[4]);
    if (!m.v2) {
      for (std::string_view opt : Split(dash[3], ',')) {
        if (!opt.empty() && opt != "rw" && opt != "ro") m.controllers.emplace_back(opt);
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<ProcCgroupEntry> ParseProcCgroup(std::string_view proc_self_cgroup) {
  std::vector<ProcCgroupEntry> out;
  for (std::string_view line : Lines(proc_self_cgroup)) {
    size_t c1 = line.find(':');
    if (c1 == std::string_view::npos) continue;
    size_t c2 = line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    ProcCgroupEntry e;
    e.id = std::atoi(std::string(line.substr(0, c1)).c_str());
    std::string_view names = line.substr(c1 + 1, c2 - c1 - 1);
    if (!names.empty()) {
      for (std::string_view n : Split(names, ',')) e.controllers.emplace_back(n);
    }
    e.path = std::string(line.substr(c2 + 1));
    out.push_back(std::move(e));
  }
  return out;
}

Result<CgroupHost> ResolveCgroupHost(std::string_view mountinfo, std::string_view proc_self_cgroup,
                                     const std::string& parent, const FileReader& read) {
  std::string_view rel = parent;
  while (!rel.empty() && rel.front() == '/') rel.remove_prefix(1);
  while (!rel.empty() && rel.back() == '/') rel.remove_suffix(1);
  if (rel.empty()) return Status::Error("probe cgroups: empty parent name", EINVAL);
  for (std::string_view part : Split(rel, '/')) {
    if (part.empty() || part == "." || part == "..") {
      return Status::Error("probe cgroups: bad parent name '" + parent + "'", EINVAL);
    }
  }
  std::vector<CgroupMount> mounts = ParseMountInfo(mountinfo);
  std::vector<ProcCgroupEntry> self = ParseProcCgroup(proc_self_cgroup);

  // v2: our cgroup in the unified hierarchy must be offered memory, cpu and pids, and the kernel
  // must have the v2 freezer (cgroup.freeze).
  static const char* const kV2Needed[] = {"memory", "cpu", "pids"};
  std::string v2_detail = "there is no cgroup2 mount with our cgroup in it";
  auto v2_self = std::find_if(self.begin(), self.end(), [](const ProcCgroupEntry& e) {
    return e.id == 0 && e.controllers.empty();
  });
  for (const CgroupMount& m : mounts) {
    if (!m.v2 || v2_self == self.end()) continue;
    std::optional<std::string> own = OwnDir(m, v2_self->path);
    if (!own) continue;
    std::optional<std::string> text = read(JoinPath(*own, "cgroup.controllers"));
    if (!text) continue;
    std::vector<std::string> offered;
    for (std::string_view c : Split(*text, ' ')) {
      while (!c.empty() && (c.back() == '\n' || c.back() == ' ')) c.remove_suffix(1);
      if (!c.empty()) offered.emplace_back(c);
    }
    std::string missing;
    for (const char* c : kV2Needed) {
      if (!Contains(offered, c)) missing += missing.empty() ? c : std::string(",") + c;
    }
    bool at_root = OwnDir(m, "/") == own;
    bool freezer = read(JoinPath(*own, "cgroup.freeze")).has_value();
    if (!freezer && at_root) {
      std::optional<std::string> release = read("/proc/sys/kernel/osrelease");
      freezer = release && ReleaseHasV2Freezer(*release);
    }
    if (missing.empty() && freezer) {
      CgroupHost host;
      host.version = CgroupVersion::kV2;
      host.v2_dir = JoinPath(*own, rel);
      return host;
    }
    v2_detail = "the unified hierarchy at " + *own + " lacks " +
                (missing.empty() ? "" : missing + (freezer ? "" : " and ")) +
                (freezer ? "" : "the freezer (no cgroup.freeze)") + " (cgroup.controllers has '" +
                std::string(text->substr(0, text->find('\n'))) + "')";
    break;
  }

  // v1: one mount per controller (cpu and cpuacct are usually comounted), each with our cgroup in
  // it visible.
  static const char* const kV1Needed[] = {"memory", "cpu", "cpuacct", "pids", "freezer"};
  CgroupHost host;
  host.version = CgroupVersion::kV1;
  for (const char* controller : kV1Needed) {
    auto entry = std::find_if(self.begin(), self.end(), [&](const ProcCgroupEntry& e) {
      return Contains(e.controllers, controller);
    });
    std::optional<std::string> dir;
    for (const CgroupMount& m : mounts) {
      if (m.v2 || !Contains(m.controllers, controller)) continue;
      if (entry == self.end()) break;
      dir = OwnDir(m, entry->path);
      if (dir) break;
    }
    if (!dir) return Unavailable(controller, v2_detail);
    host.v1_dirs.emplace_back(controller, JoinPath(*dir, rel));
  }
  return host;
}

Status ValidateRequest(const std::string& name, const Limits& limits) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    return Status::Error("cgroup name '" + name + "' is not a single path component", EINVAL);
  }
  if (limits.memory_bytes < 0 ||
      (limits.memory_bytes > 0 && limits.memory_bytes < kMinMemoryBytes)) {
    return Status::Error("memory limit " + std::to_string(limits.memory_bytes) +
                             " bytes is below the minimum of " + std::to_string(kMinMemoryBytes),
                         EINVAL);
  }
  if (!(limits.cpus >= 0) || !std::isfinite(limits.cpus) ||
      (limits.cpus > 0 && CpuQuotaUs(limits.cpus) < kMinCpuQuotaUs)) {
    return Status::Error("cpu quota " + std::to_string(limits.cpus) + " is not 0 or at least " +
                             std::to_string(static_cast<double>(kMinCpuQuotaUs) / kCpuPeriodUs),
                         EINVAL);
  }
  if (limits.cpu_weight < 0 || limits.cpu_weight > 10000) {
    return Status::Error("cpu weight " + std::to_string(limits.cpu_weight) + " is not in 1..10000",
                         EINVAL);
  }
  if (limits.pids < 0) {
    return Status::Error("pids limit " + std::to_string(limits.pids) + " is negative", EINVAL);
  }
  return {};
}

int64_t CpuQuotaUs(double cpus) {
  if (cpus <= 0) return 0;
  return std::llround(cpus * static_cast<double>(kCpuPeriodUs));
}

int64_t WeightToShares(int64_t weight) {
  if (weight == 0) weight = 100;
  return std::clamp<int64_t>(weight * 1024 / 100, 2, 262144);
}

Status WriteKnob(const std::string& path, std::string_view value) {
  std::string what = "write '" + std::string(value) + "' to " + path;
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC));
  if (!fd) return Status::Errno(what);
  // One write(2): cgroupfs parses each write on its own.
  ssize_t n;
  do {
    n = ::write(fd.get(), value.data(), value.size());
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Status::Errno(what);
  if (static_cast<size_t>(n) != value.size()) return Status::Error(what + ": short write", EIO);
  return {};
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

Result<uint64_t> ReadUint(const std::string& path) {
  Result<std::string> text = ReadFile(path, 4096);
  if (!text.ok()) return text.status();
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(text->c_str(), &end, 10);
  if (end == text->c_str() || errno != 0) {
    return Status::Error("parse " + path + ": not a number: '" + *text + "'", EINVAL);
  }
  return static_cast<uint64_t>(v);
}

Result<uint64_t> ReadKeyedUint(const std::string& path, std::string_view key) {
  Result<std::string> text = ReadFile(path, 65536);
  if (!text.ok()) return text.status();
  for (std::string_view line : Lines(*text)) {
    size_t sp = line.find(' ');
    if (sp == std::string_view::npos || line.substr(0, sp) != key) continue;
    return static_cast<uint64_t>(
        std::strtoull(std::string(line.substr(sp + 1)).c_str(), nullptr, 10));
  }
  return uint64_t{0};
}

Result<std::vector<pid_t>> ReadProcs(const std::string& path) {
  Result<std::string> text = ReadFile(path);
  if (!text.ok()) {
    if (text.status().err() == ENOENT) return std::vector<pid_t>{};
    return text.status();
  }
  std::vector<pid_t> pids;
  for (std::string_view line : Lines(*text)) {
    pids.push_back(static_cast<pid_t>(std::atoi(std::string(line).c_str())));
  }
  return pids;
}

Status MakeDirs(const std::string& dir, const DriverOptions& options) {
  if (dir.empty() || Exists(dir)) return {};
  size_t slash = dir.find_last_of('/');
  if (slash != std::string::npos && slash > 0) {
    SBX_RETURN_IF_ERROR(MakeDirs(dir.substr(0, slash), options));
  }
  if (::mkdir(dir.c_str(), 0755) != 0) {
    if (errno == EEXIST) return {};  // another box made it meanwhile
    return Status::Errno("mkdir " + dir);
  }
  if (options.on_mkdir) options.on_mkdir(dir);
  return {};
}

Status RemoveCgroupDir(const std::string& dir, const DriverOptions& options) {
  if (options.before_rmdir && Exists(dir)) options.before_rmdir(dir);
  auto deadline = std::chrono::steady_clock::now() + options.rmdir_timeout;
  for (;;) {
    if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) return {};
    if (errno != EBUSY || std::chrono::steady_clock::now() >= deadline) {
      return Status::Errno("rmdir " + dir);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

Status PollUntil(const std::function<Result<bool>()>& done, std::chrono::milliseconds timeout,
                 const std::string& what) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(200);
  for (;;) {
    Result<bool> r = done();
    if (!r.ok()) return r.status().Wrap(what);
    if (*r) return {};
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status::Error(what + ": not done after " + std::to_string(timeout.count()) + " ms",
                           ETIMEDOUT);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(20));
  }
}

Result<size_t> KillListed(const std::vector<std::string>& procs_paths) {
  std::set<pid_t> seen;  // on v1 a task is listed once per hierarchy
  for (const std::string& path : procs_paths) {
    Result<std::vector<pid_t>> pids = ReadProcs(path);
    if (!pids.ok()) return pids.status();
    for (pid_t pid : *pids) {
      // pid 0 shows up for tasks in another pid namespace; never signal it (the whole group).
      if (pid <= 0 || !seen.insert(pid).second) continue;
      if (::kill(pid, SIGKILL) != 0 && errno != ESRCH) {
        return Status::Errno("kill " + std::to_string(pid) + " listed in " + path);
      }
    }
  }
  return seen.size();
}

}  // namespace cgroup_internal

Result<CgroupHost> ProbeCgroupHost(const std::string& parent) {
  Result<std::string> mountinfo = ReadFile("/proc/self/mountinfo");
  if (!mountinfo.ok()) return mountinfo.status().Wrap("probe cgroups");
  Result<std::string> self = ReadFile("/proc/self/cgroup");
  if (!self.ok()) return self.status().Wrap("probe cgroups");
  return cgroup_internal::ResolveCgroupHost(
      *mountinfo, *self, parent, [](const std::string& path) -> std::optional<std::string> {
        Result<std::string> text = ReadFile(path, 65536);
        if (!text.ok()) return std::nullopt;
        return *text;
      });
}

Result<std::unique_ptr<Cgroup>> Cgroup::Create(const CgroupHost& host, const std::string& name,
                                               const Limits& limits) {
  if (host.version == CgroupVersion::kV1) return cgroup_internal::CreateV1(host, name, limits, {});
  return cgroup_internal::CreateV2(host, name, limits, {});
}

std::unique_ptr<Cgroup> Cgroup::Open(const CgroupHost& host, const std::string& name) {
  if (host.version == CgroupVersion::kV1) return cgroup_internal::OpenV1(host, name, {});
  return cgroup_internal::OpenV2(host, name, {});
}

}  // namespace sbx::runtime
