#include "agent/oom.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>

namespace sbx::agent {
namespace {

// A small file's text, or "" (a process that exited meanwhile reads as nothing).
std::string ReadSmall(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  char buf[256];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

}  // namespace

std::vector<OomCandidate> ScanOomCandidates(const std::string& proc, pid_t self) {
  std::vector<OomCandidate> out;
  DIR* d = ::opendir(proc.c_str());
  if (!d) return out;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0' || pid == self) continue;
    const std::string dir = proc + "/" + e->d_name;
    // statm: size resident shared ... in pages.
    std::string statm = ReadSmall(dir + "/statm");
    const char* p = statm.c_str();
    std::strtoull(p, &end, 10);
    if (end == p) continue;
    const char* q = end;
    uint64_t resident = std::strtoull(q, &end, 10);
    if (end == q || resident == 0) continue;
    std::string adj = ReadSmall(dir + "/oom_score_adj");
    OomCandidate c;
    c.pid = static_cast<pid_t>(pid);
    c.rss_bytes = resident * page;
    c.oom_score_adj = adj.empty() ? 0 : static_cast<int>(std::strtol(adj.c_str(), nullptr, 10));
    out.push_back(c);
  }
  ::closedir(d);
  return out;
}

std::optional<OomCandidate> ChooseOomVictim(const std::vector<OomCandidate>& candidates,
                                            uint64_t limit_bytes) {
  std::optional<OomCandidate> best;
  long double best_points = 0;
  for (const OomCandidate& c : candidates) {
    if (c.oom_score_adj <= -1000) continue;
    long double points = static_cast<long double>(c.rss_bytes) +
                         static_cast<long double>(c.oom_score_adj) * limit_bytes / 1000;
    // The kernel keeps a chosen task at 1 point at least: any process may be killed.
    if (points < 1) points = 1;
    if (!best || points > best_points || (points == best_points && c.pid > best->pid)) {
      best = c;
      best_points = points;
    }
  }
  return best;
}

}  // namespace sbx::agent
