// OOM_KILL: the agent's choice of the process to kill when its box is out of memory and the host
// must not let its own kernel choose (gVisor: the host's OOM killer only sees the sandbox's host
// processes, and any of them dying ends the whole sandbox). The choice follows the kernel's
// (mm/oom_kill.c, oom_badness): resident memory, moved by oom_score_adj in thousandths of the
// box's limit; -1000 is never chosen. Split from the agent's loop so it can be tested over a
// scratch directory laid out like /proc.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sbx::agent {

struct OomCandidate {
  pid_t pid = 0;
  uint64_t rss_bytes = 0;
  int oom_score_adj = 0;
};

// Every process under `proc` (a /proc) but `self`, with memory of its own: kernel threads and
// processes that exited while being read are left out.
std::vector<OomCandidate> ScanOomCandidates(const std::string& proc, pid_t self);

// The candidate the kernel would kill in a box with `limit_bytes` of memory (0: unknown, then
// oom_score_adj only excludes -1000); ties go to the newest (highest) pid. nullopt: none.
std::optional<OomCandidate> ChooseOomVictim(const std::vector<OomCandidate>& candidates,
                                            uint64_t limit_bytes);

}  // namespace sbx::agent
