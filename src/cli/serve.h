// `sbx serve`: the daemon. Opens the store, the install secret and the runtime, reconciles what
// survived a restart, makes the first API key (an operator key, for root's CLI) on first start,
// and serves the REST API until SIGTERM or SIGINT.
// Sandboxes keep running when the daemon stops.
#pragma once

#include <string>
#include <vector>

#include "cli/run.h"
#include "network/network.h"
#include "sandbox/registry_policy.h"
#include "store/store.h"

namespace sbx::cli {

struct ServeOptions {
  std::string listen = "127.0.0.1:7777";  // host:port
  std::string unix_socket;                // optional, in addition
  int threads = 0;  // I/O threads; 0: IoThreadsFor(the CPUs this process may use)
  int64_t default_timeout_s = 300;
  std::string disk_reserve = "1G";  // a size, or "N%" of the data directory's filesystem
  // The box id pool: box ranges start at host id id_pool_base, id_pool_size ranges of 65536.
  uint32_t id_pool_base = 0x10000000;
  uint32_t id_pool_size = 8192;
  bool no_idmap = false;  // force the runtime's fallback (shared ids, shifted layer copies)
  int64_t template_cache_bytes = 0;     // --template-cache-size; 0: storage's default (20 GiB)
  std::string audit_retention = "30d";  // a duration (units.h); "0" keeps events forever
  size_t max_connections = 1024;
  size_t max_connections_per_address = 64;  // loopback clients are exempt
  // --min-memory/--max-memory ... (range_flags.h): the daemon-wide bounds; 0: the host's.
  store::LimitRanges ranges;
  double default_egress_mbps = 0;  // --default-egress-mbps (0: none, or the maximum when set)
  // Networking (issue 12): --network on|off, and the stack's settings as the flags gave them.
  std::string network = "auto";
  std::string box_subnet;                 // --box-subnet CIDR
  std::vector<std::string> upstream_dns;  // --upstream-dns ADDR:PORT (repeatable)
  std::string upstream_ca;                // --upstream-ca FILE
  std::vector<std::string> allow_ranges;  // --allow-range CIDR (repeatable)
  bool ipv6 = false;                      // --ipv6
  std::string box_subnet6;                // --box-subnet6 CIDR (with --ipv6)
  // Where builds may pull FROM images (sandbox/registry_policy.h): --registry HOST[:PORT],
  // --registry-mirror REGISTRY=HOST[:PORT], --insecure-registry HOST[:PORT], --registry-ca-file.
  std::vector<std::string> registries;
  std::vector<std::string> registry_mirrors;
  std::vector<std::string> insecure_registries;
  std::string registry_ca_file;
  // --build-network: the RUN steps' policy of E2B template builds, in `--net`'s grammar
  // (none, open, allow=NAME,...; cli/net.h). Empty: none.
  std::vector<std::string> build_network;
  // --pool TEMPLATE[:SIZE] (repeatable): warm pools (sandbox/pool.h).
  std::vector<std::string> pools;
};

// The --network flags of `o` as the stack's config (state_dir and daemon_ports are filled in by
// serve); EINVAL naming the flag and the value. Checks shapes only: whether the host can give
// networking is Stack::Start's to say.
Result<network::StackConfig> NetworkConfig(const ServeOptions& o);

// The registry flags of `o` as the builder's policy; EINVAL naming the flag and the value.
Result<sandbox::RegistryPolicy> RegistryPolicyOf(const ServeOptions& o);

// The default number of I/O threads for a host where this process may use `cpus` CPUs: one per
// four, from 1 to 8. The I/O threads share one io_context and hand each request's steps to each
// other; on a small host every hand-off (a futex wake-up and a context switch) costs more than a
// second thread gives, and the boxes' own processes need the other cores (docs/benchmarks.md,
// section 10: a command through the API uses a quarter less of the daemon's CPU on one thread).
int IoThreadsFor(int cpus);
// The CPUs this process may run on (its affinity mask), at least 1.
int UsableCpus();

int ServeCommand(const GlobalOptions& global, const ServeOptions& options);

// Where the CLI finds the API key that `sbx serve` wrote at first start.
std::string ApiKeyFile(const std::string& data_dir);

}  // namespace sbx::cli
