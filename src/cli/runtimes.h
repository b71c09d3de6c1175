// The runtimes beside native that `sbx serve` and `sbx run` offer on this host (runtime/router.h):
// each one is added when its binary is here and it works, else listed with why not.
#pragma once

#include "cli/run.h"
#include "runtime/router.h"

namespace sbx::cli {

void AddHostRuntimes(runtime::Router& router, const GlobalOptions& global);

}  // namespace sbx::cli
