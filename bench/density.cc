// sbx-bench-density: how many idle boxes fit, what each costs the host in memory, and how long
// creating and destroying them takes (issue 5, item 4). Until the daemon exists it drives
// runtime::NativeRuntime directly, the same way `sbx run` and later `sbx serve` do.
//
//   sbx-bench-density --agent PATH [--counts 100,1000] [--memory BYTES] [--pids N]
//
// For each count N: reads /proc/meminfo, creates N boxes one after another (host template,
// memory and pids limits as in the latency benchmark), lets them settle, reads /proc/meminfo and
// every box's cgroup memory usage, then destroys them all. A failed Create stops that round: the
// output names the error and how many boxes were reached, and every box made is destroyed.
// Writes one JSON document to stdout; progress goes to stderr. SIGINT/SIGTERM stop a round
// between two creations and still clean up.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/fs.h"
#include "runtime/native/native_runtime.h"
#include "storage/template.h"
#include "store/store.h"

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// /proc/meminfo in bytes, by field name.
std::map<std::string, int64_t> MemInfo() {
  std::map<std::string, int64_t> out;
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t value;
  while (in >> key >> value) {
    key.pop_back();  // ':'
    std::getline(in, unit);
    out[key] = unit.find("kB") != std::string::npos ? value * 1024 : value;
  }
  return out;
}

json MemDelta(const std::map<std::string, int64_t>& before,
              const std::map<std::string, int64_t>& after) {
  json d;
  for (const char* k : {"MemAvailable", "MemFree", "Slab", "SUnreclaim", "KernelStack",
                        "PageTables", "Shmem", "AnonPages", "Cached"})
    if (before.count(k) && after.count(k)) d[k] = after.at(k) - before.at(k);
  return d;
}

// Resident set of one process from /proc/<pid>/smaps_rollup (Pss splits shared pages fairly).
std::pair<int64_t, int64_t> RssPss(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/smaps_rollup");
  std::string line;
  int64_t rss = 0, pss = 0;
  while (std::getline(in, line)) {
    long long v;
    if (std::sscanf(line.c_str(), "Rss: %lld kB", &v) == 1) rss = v * 1024;
    if (std::sscanf(line.c_str(), "Pss: %lld kB", &v) == 1) pss = v * 1024;
  }
  return {rss, pss};
}

std::string ReadSmall(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

bool Interrupted() {
  sigset_t pending;
  sigpending(&pending);
  return sigismember(&pending, SIGINT) || sigismember(&pending, SIGTERM);
}

json Round(sbx::runtime::NativeRuntime& rt, const sbx::storage::Template& tmpl, int count,
           int64_t memory, int64_t pids) {
  json r;
  r["requested"] = count;
  std::vector<sbx::runtime::Box> boxes;
  boxes.reserve(count);
  ::sync();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  auto before = MemInfo();
  std::vector<double> create_ms;
  auto t0 = Clock::now();
  for (int i = 0; i < count; i++) {
    if (Interrupted()) {
      r["error"] = "interrupted";
      break;
    }
    sbx::runtime::BoxSpec spec;
    spec.id = "bench-" + std::to_string(::getpid()) + "-" + std::to_string(i);
    spec.layers = tmpl.layers;
    spec.binds = tmpl.binds;
    spec.limits.memory_bytes = memory;
    spec.limits.pids = pids;
    spec.owner = "bench";
    auto c0 = Clock::now();
    auto box = rt.Create(spec);
    create_ms.push_back(Ms(c0, Clock::now()));
    if (!box.ok()) {
      create_ms.pop_back();
      r["error"] = box.status().message();
      std::fprintf(stderr, "density: create #%d failed: %s\n", i + 1,
                   box.status().message().c_str());
      break;
    }
    boxes.push_back(std::move(*box));
    if ((i + 1) % 100 == 0) std::fprintf(stderr, "density: %d/%d boxes\n", i + 1, count);
  }
  auto t1 = Clock::now();
  r["created"] = boxes.size();
  r["create_total_ms"] = Ms(t0, t1);
  r["create_ms"] = create_ms;
  // Idle: the agents have started and have nothing to do.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  auto idle = MemInfo();
  int64_t cg_sum = 0, rss_sum = 0, pss_sum = 0;
  int stats_failed = 0;
  for (const auto& b : boxes) {
    auto st = rt.Stats(b);
    if (st.ok())
      cg_sum += static_cast<int64_t>(st->memory_current);
    else
      stats_failed++;
    auto [rss, pss] = RssPss(b.init_pid);
    rss_sum += rss;
    pss_sum += pss;
  }
  r["meminfo_before"] = {{"MemAvailable", before["MemAvailable"]},
                         {"MemTotal", before["MemTotal"]}};
  r["idle_delta"] = MemDelta(before, idle);
  r["cgroup_memory_usage_sum"] = cg_sum;
  r["stats_failed"] = stats_failed;
  r["agent_rss_sum"] = rss_sum;
  r["agent_pss_sum"] = pss_sum;

  auto d0 = Clock::now();
  int destroy_failed = 0;
  std::string destroy_error;
  for (const auto& b : boxes) {
    auto s = rt.Destroy(b);
    if (!s.ok()) {
      destroy_failed++;
      destroy_error = s.message();
    }
  }
  r["destroy_total_ms"] = Ms(d0, Clock::now());
  r["destroy_failed"] = destroy_failed;
  if (destroy_failed) r["destroy_error"] = destroy_error;
  std::this_thread::sleep_for(std::chrono::seconds(1));
  r["after_destroy_delta"] = MemDelta(before, MemInfo());
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string agent;
  std::vector<int> counts = {100, 1000};
  int64_t memory = 256 << 20, pids = 256;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "density: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--agent") {
      agent = next();
    } else if (a == "--counts") {
      counts.clear();
      std::stringstream ss(next());
      std::string c;
      while (std::getline(ss, c, ',')) counts.push_back(std::stoi(c));
    } else if (a == "--memory") {
      memory = std::stoll(next());
    } else if (a == "--pids") {
      pids = std::stoll(next());
    } else {
      std::fprintf(stderr,
                   "usage: sbx-bench-density --agent PATH [--counts 100,1000] "
                   "[--memory BYTES] [--pids N]\n");
      return 2;
    }
  }
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  ::sigprocmask(SIG_BLOCK, &sigs, nullptr);

  json out;
  // Every box holds descriptors in this process (its owner lock); raise the soft limit to the hard.
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  rlim_t soft_before = rl.rlim_cur;
  rl.rlim_cur = rl.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &rl);
  out["rlimit_nofile"] = {{"soft_before", soft_before}, {"soft", rl.rlim_cur}};
  json limits;
  for (const char* p : {"/proc/sys/user/max_user_namespaces", "/proc/sys/user/max_mnt_namespaces",
                        "/proc/sys/user/max_pid_namespaces", "/proc/sys/user/max_net_namespaces",
                        "/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max",
                        "/proc/sys/fs/inotify/max_user_instances", "/proc/sys/fs/file-max"})
    limits[p] = ReadSmall(p);
  out["kernel_limits"] = limits;

  char tmpl_dir[] = "/tmp/sbx-bench-density-XXXXXX";
  if (::mkdtemp(tmpl_dir) == nullptr || ::chmod(tmpl_dir, 0711) != 0) {
    std::perror("density: mkdtemp");
    return 1;
  }
  std::string dir = tmpl_dir;
  sbx::runtime::NativeConfig cfg;
  cfg.run_dir = dir + "/run";
  cfg.agent_path = agent;
  cfg.cgroup_parent = "sbx-bench-" + std::to_string(::getpid());
  int rc = 0;
  auto rt = sbx::runtime::NativeRuntime::Open(cfg);
  if (!rt.ok()) {
    out["error"] = "open runtime: " + rt.status().message();
    rc = 1;
  } else {
    sbx::storage::TemplateStore ts;
    ts.dir = dir + "/templates";
    auto registry = sbx::store::Store::Open(dir + "/sbx.db");
    auto tmpl = registry.ok() ? sbx::storage::ResolveTemplate(ts, **registry, "host", "")
                              : sbx::Result<sbx::storage::Template>(registry.status());
    if (!tmpl.ok()) {
      out["error"] = "template: " + tmpl.status().message();
      rc = 1;
    } else {
      json rounds = json::array();
      for (int n : counts) {
        std::fprintf(stderr, "density: %d idle boxes\n", n);
        rounds.push_back(Round(**rt, *tmpl, n, memory, pids));
        if (Interrupted()) break;
      }
      out["rounds"] = rounds;
    }
    for (const auto& [controller, parent] : (*rt)->cgroup_host().v1_dirs) ::rmdir(parent.c_str());
    if (!(*rt)->cgroup_host().v2_dir.empty()) ::rmdir((*rt)->cgroup_host().v2_dir.c_str());
  }
  (void)sbx::RemoveTree(dir);  // a temporary directory; nothing to report if it stays
  std::printf("%s\n", out.dump().c_str());
  return rc;
}
