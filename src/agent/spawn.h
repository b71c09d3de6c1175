// Starting one process: the fork/exec of SPAWN (docs/agent-protocol.md, "Processes"). The code that
// runs in the child between fork and exec lives in spawn.cc alone because different rules apply
// there: only async-signal-safe calls, no allocation. Everything it needs is prepared before fork.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "common/fd.h"
#include "common/status.h"

namespace sbx::agent {

// Closes every descriptor from 3 on except `keep` (>= 3, or 2 to keep none): close_range, or
// where the kernel has none what /proc/self/fd lists. System calls only, on the stack: fit for
// the child of a fork.
void CloseAllBut(int keep);

struct SpawnPlan {
  std::vector<std::string> argv;  // non-empty, no NUL bytes
  std::vector<std::string> env;   // final environment, "KEY=VALUE"
  std::string cwd;
  bool change_ids = false;  // apply uid/gid/groups (false: inherit the agent's)
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;
  bool pty = false;
  unsigned short rows = 24, cols = 80;
  bool stdin_open = false;
  // Descriptors the child gets as its 0, 1 and 2 as they are, instead of pipes (sudo.h: the
  // caller's own stdio). All three or none; the SpawnedChild then has no descriptors.
  int stdio[3] = {-1, -1, -1};
  // RLIMIT_NOFILE to restore in the child (the agent raises its own).
  struct rlimit nofile = {RLIM_INFINITY, RLIM_INFINITY};
  bool restore_nofile = false;
};

struct SpawnedChild {
  pid_t pid = -1;
  UniqueFd stdin_fd;   // write end of the stdin pipe, or a dup of the PTY master; may be empty
  UniqueFd stdout_fd;  // read end of the stdout pipe, or the PTY master
  UniqueFd stderr_fd;  // read end of the stderr pipe; empty with a PTY
};

// Forks and execs `plan`. All returned descriptors are non-blocking and close-on-exec. When the
// child fails before exec (missing program, bad cwd, setuid), the child is reaped and the error
// comes back with the child's errno, naming the step that failed.
Result<SpawnedChild> Spawn(const SpawnPlan& plan);

// The search list for argv[0]: itself when it contains '/', else each PATH directory joined with
// it.
std::vector<std::string> ExecCandidates(const std::string& argv0, const std::string& path_env);

}  // namespace sbx::agent
