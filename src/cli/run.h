// `sbx run`: one box, one command, like `docker run --rm`. Creates a box, runs the command with
// stdio passed through, propagates its exit status and removes everything afterwards, also on
// Ctrl-C, SIGTERM and SIGHUP.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sbx::cli {

struct GlobalOptions {
  std::string data_dir = "/var/lib/sbx";
  std::string agent_path;  // empty: beside the sbx binary
  bool verbose = false;
};

// `sbx run --net ...` (cli/run_net.h).
struct RunNetOptions {
  std::vector<std::string> net;           // --net: the grammar of `sbx create --net` (cli/net.h)
  std::vector<std::string> upstream_dns;  // --upstream-dns ADDR:PORT (as sbx serve)
  std::string upstream_ca;                // --upstream-ca FILE (as sbx serve)
  std::string box_subnet;                 // --box-subnet CIDR (as sbx serve)
  // Not a flag: the last sentence of a refused connection's 403 (network::StackConfig::
  // refusal_hint); empty: sbx run's ("run the command again with another --net").
  std::string refusal_hint;
};

struct RunOptions {
  std::string template_name = "host";
  std::string memory, cpus, pids, disk, timeout;  // as typed; parsed by RunCommand
  std::vector<std::string> env;
  std::vector<std::string> volumes;  // HOST:BOX[:ro|:rw], see cli/volumes.h
  std::string workdir;
  std::string user;
  bool interactive = false;
  bool tty = false;
  bool timings = false;
  std::string runtime;  // "": the template's, else native (runtime::kRuntimeNames)
  RunNetOptions network;
  std::vector<std::string> command;
};

// Exit status conventions (as docker run and timeout(1)): the command's own exit code; 128+N when
// a signal N killed it; 124 on --timeout; 125 when sbx itself failed.
inline constexpr int kExitSbxError = 125;
inline constexpr int kExitTimeout = 124;
// As docker: the command exists but cannot be run (permissions, its user or working directory);
// the command is not there.
inline constexpr int kExitCannotExecute = 126;
inline constexpr int kExitNotFound = 127;

// The exit status for a spawn the box's agent refused, from its message ("spawn x: No such file or
// directory", as the agent and the API word it): 127 when the program is not there, 126 when it
// cannot be run; nullopt when the message is no spawn failure (then the failure is sbx's: 125).
std::optional<int> SpawnFailureExit(const std::string& message);

int RunCommand(const GlobalOptions& global, const RunOptions& options);

// Where sbx-agent is: --agent, $SBX_AGENT, beside this binary, then /usr/local/lib/sbx.
std::string FindAgent(const std::string& flag);

}  // namespace sbx::cli
