// The runtimes beside native that `sbx serve` and `sbx run` offer on this host (runtime/router.h):
// each one is added when its binary is here and it works, else listed with why not.
#pragma once

#include "cli/run.h"
#include "runtime/router.h"

namespace sbx::cli {

// `only`: open that runtime alone (sbx run, which uses one), the others listed as not asked for;
// "": every one (sbx serve). `agent_path` is sbx-agent's, bound into boxes of other runtimes.
void AddHostRuntimes(runtime::Router& router, const GlobalOptions& global,
                     const std::string& agent_path, const std::string& only = "");

}  // namespace sbx::cli
