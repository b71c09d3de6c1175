// `sbx serve`: the daemon. Opens the store and the runtime, reconciles what survived a restart,
// makes the first API key on first start, and serves the REST API until SIGTERM or SIGINT.
// Sandboxes keep running when the daemon stops.
#pragma once

#include <string>

#include "cli/run.h"

namespace sbx::cli {

struct ServeOptions {
  std::string listen = "127.0.0.1:7777";  // host:port
  std::string unix_socket;                // optional, in addition
  int threads = 2;
  int64_t default_timeout_s = 300;
  std::string audit_retention = "30d";  // a duration (units.h); "0" keeps events forever
  size_t max_connections = 1024;
  size_t max_connections_per_address = 64;  // loopback clients are exempt
};

int ServeCommand(const GlobalOptions& global, const ServeOptions& options);

// Where the CLI finds the API key that `sbx serve` wrote at first start.
std::string ApiKeyFile(const std::string& data_dir);

}  // namespace sbx::cli
