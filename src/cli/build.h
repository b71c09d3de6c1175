// `sbx build`: builds a template from a Dockerfile and a context directory on this host, as a
// local root action like `sbx run` (not through the daemon): sandbox::Builder with the native
// runtime, the store and the template cache of the data directory. With --net each RUN step's
// box gets that policy through a network stack of its own, as a `sbx run --net` box does
// (cli/run_net.h). docs/build.md.
#pragma once

#include <CLI/CLI.hpp>

#include "cli/run.h"
#include "cli/verbs.h"

namespace sbx::cli {

void RegisterBuildVerb(CLI::App& app, const GlobalOptions& global, ClientVerbs& verbs);

}  // namespace sbx::cli
