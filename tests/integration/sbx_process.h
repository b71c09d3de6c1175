// Test helper: runs the sbx binary (or any program) with arguments and stdin, collecting stdout,
// stderr and the exit status; optionally sends a signal after a delay.
#pragma once

#include <set>
#include <string>
#include <vector>

namespace sbx::test {

struct ProcessResult {
  int exit_code = -1;  // 128+N when killed by signal N, like a shell
  std::string out;
  std::string err;
};

struct ProcessOptions {
  std::string stdin_data;
  bool close_stdin = true;  // stdin at EOF after stdin_data (else /dev/null when empty)
  int signal_after_ms = 0;  // send `signal` to the process this long after start
  int signal = 0;
  int timeout_ms = 120000;       // SIGKILL after this long (the test then fails on the result)
  std::vector<std::string> env;  // extra "K=V"
};

ProcessResult RunProcess(const std::vector<std::string>& argv, const ProcessOptions& opts = {});

// The directories a box cgroup parent named `parent` (SBX_CGROUP_PARENT) has in each cgroup v1
// hierarchy sbx uses, under this process's own cgroup, as sbx lays them out.
std::vector<std::string> CgroupParentDirs(const std::string& parent);
// Fails the current test for every box cgroup left under `parent`, then removes the (empty)
// parent directories.
void ExpectNoCgroupsAndRemoveParent(const std::string& parent);

// The links of this process's network namespace named as a box's host end ("sbx" or, for `sbx run
// --net`, "sbr", and digits; docs/network.md "Links and addresses"): after a case, one that was
// not there before is a leak.
std::set<std::string> BoxLinks();

}  // namespace sbx::test
