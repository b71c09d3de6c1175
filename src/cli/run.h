// `sbx run`: one box, one command, like `docker run --rm`. Creates a box, runs the command with
// stdio passed through, propagates its exit status and removes everything afterwards, also on
// Ctrl-C, SIGTERM and SIGHUP.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sbx::cli {

struct GlobalOptions {
  std::string data_dir = "/var/lib/sbx";
  std::string agent_path;  // empty: beside the sbx binary
  bool verbose = false;
};

struct RunOptions {
  std::string template_name = "host";
  std::string memory, cpus, pids, disk, timeout;  // as typed; parsed by RunCommand
  std::vector<std::string> env;
  std::string workdir;
  std::string user;
  bool interactive = false;
  bool tty = false;
  bool timings = false;
  std::vector<std::string> command;
};

// Exit status conventions (as docker run and timeout(1)): the command's own exit code; 128+N when
// a signal N killed it; 124 on --timeout; 125 when sbx itself failed.
inline constexpr int kExitSbxError = 125;
inline constexpr int kExitTimeout = 124;

int RunCommand(const GlobalOptions& global, const RunOptions& options);

// Where sbx-agent is: --agent, $SBX_AGENT, beside this binary, then /usr/local/lib/sbx.
std::string FindAgent(const std::string& flag);

}  // namespace sbx::cli
