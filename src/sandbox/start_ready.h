// A template's start and ready commands (E2B's startCmd and readyCmd, storage::Template): run at
// every create from the template, since sbx's native runtime has no memory snapshot to take them
// from (E2B runs them once, during the build, and snapshots the running VM when ready).
//
// The start command runs in the background (it keeps running after RunStartAndReady returns:
// the box's processes never depend on a connection); the ready command is run again and again
// until it exits 0, `interval` apart, for at most `timeout` in all. Both run as `/bin/sh -c CMD`
// with the template's user, workdir and env and the sandbox's env, as any command does.
#pragma once

#include <chrono>
#include <map>
#include <string>

#include "common/clock.h"
#include "common/status.h"
#include "store/store.h"

namespace sbx::sandbox {

struct StartReadySpec {
  std::string start_cmd;  // "" = none
  std::string ready_cmd;  // "" = none: ready once the start command is running
  store::TemplateDefaults defaults;
  std::map<std::string, std::string> env;  // the sandbox's
  // Below the SDK's 60 s request timeout, so that its create gets this error, not its own.
  std::chrono::milliseconds timeout{50000};
  std::chrono::milliseconds interval{200};
};

// Blocks until the box at `agent_socket` is ready. Errors name the command and end with its last
// output (at most kLastOutputBytes): ETIMEDOUT when the ready command did not exit 0 in time,
// ECANCELED when the start command ended with a non-zero code (or a signal) before that, EINVAL
// for a command the agent refuses (no /bin/sh, an unknown user).
Status RunStartAndReady(const std::string& agent_socket, const StartReadySpec& spec, Clock& clock);

inline constexpr size_t kLastOutputBytes = 1024;

}  // namespace sbx::sandbox
