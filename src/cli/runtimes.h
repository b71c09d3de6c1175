// The runtimes beside native that `sbx serve` and `sbx run` offer on this host (runtime/router.h):
// each one is added when its binary is here and it works, else listed with why not.
#pragma once

#include <string>
#include <vector>

#include "cli/run.h"
#include "runtime/id_pool.h"
#include "runtime/router.h"

namespace sbx::cli {

// `only`: open that runtime alone (sbx run, which uses one), the others listed as not asked for;
// "": every one (sbx serve). `agent_path` is sbx-agent's, bound into boxes of other runtimes.
// Their boxes take their host id ranges from `pool` (the native runtime's; not owned).
void AddHostRuntimes(runtime::Router& router, const GlobalOptions& global,
                     const std::string& agent_path, runtime::IdPool* pool,
                     const std::string& only = "");

// The run directories of the runtimes AddHostRuntimes adds, whether or not this host has them
// (an earlier start may have): NativeConfig::peer_run_dirs.
std::vector<std::string> HostRuntimeRunDirs(const GlobalOptions& global);

}  // namespace sbx::cli
