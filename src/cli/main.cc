// sbx: the command-line entry point. Verbs: run (one-shot box), serve (the daemon) and the
// client verbs that talk to it (cli/verbs.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include "cli/build.h"
#include "cli/range_flags.h"
#include "cli/run.h"
#include "cli/run_net.h"
#include "cli/serve.h"
#include "cli/template.h"
#include "cli/units.h"
#include "cli/verbs.h"

namespace {

// The daemon's verb and its flags. The ranges and the cache size are text until main parses them.
CLI::App* AddServeVerb(CLI::App& app, sbx::cli::ServeOptions& serve, sbx::cli::RangeFlags& ranges,
                       std::string& cache_size) {
  CLI::App* sv =
      app.add_subcommand("serve", "Run the daemon: REST API, sandboxes that outlive requests");
  sv->add_option("--listen", serve.listen, "HOST:PORT to listen on (port 0: any free port)")
      ->capture_default_str();
  sv->add_option("--unix-socket", serve.unix_socket, "Also listen on this unix socket");
  sv->add_option("--threads", serve.threads,
                 "I/O threads (0: one per 4 CPUs this process may use, 1 to 8)")
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  sv->add_option("--default-timeout", serve.default_timeout_s, "Default sandbox timeout in seconds")
      ->capture_default_str();
  sv->add_option("--disk-reserve", serve.disk_reserve,
                 "Free space of the data directory no disk limit may take: a size (1G) or a "
                 "share of the filesystem (5%); a create that does not fit gets HTTP 507")
      ->capture_default_str();
  sv->add_option("--id-pool-base", serve.id_pool_base,
                 "First host id of the boxes' private id ranges (sbx run uses the same)")
      ->capture_default_str();
  sv->add_option("--id-pool-size", serve.id_pool_size, "How many boxes' id ranges (65536 ids each)")
      ->capture_default_str();
  sv->add_flag("--no-idmap", serve.no_idmap,
               "No idmapped mounts: every box shares one id range (the fallback, for testing)");
  sv->add_option("--template-cache-size", cache_size,
                 "Bound of the unpacked template layers, e.g. 20G (default 20G)");
  sv->add_option("--audit-retention", serve.audit_retention,
                 "Delete audit events older than this, e.g. 30d, 12h (0: keep forever)")
      ->capture_default_str();
  sbx::cli::AddRangeFlags(sv, ranges,
                          "for every key (a key's own bounds narrow it; default: the host's)");
  sbx::cli::AddEgressRangeFlags(sv, ranges, "for every sandbox (default: 0.1 to 100000)");
  sv->add_option("--default-egress-mbps", serve.default_egress_mbps,
                 "Egress bandwidth limit of a create that asks for none, Mbit/s (default 0: no "
                 "limit, or --max-egress-mbps when set)");
  sv->add_option("--max-connections", serve.max_connections, "Open HTTP connections at most")
      ->capture_default_str();
  sv->add_option("--max-connections-per-address", serve.max_connections_per_address,
                 "Open HTTP connections per remote address (0: no cap; loopback is exempt)")
      ->capture_default_str();

  sv->add_option("--network", serve.network,
                 "Give sandboxes networking when they ask for it (policies: allowlist, open): "
                 "auto (when the host can), on (fail to start if it cannot), off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  sv->add_option("--box-subnet", serve.box_subnet,
                 "IPv4 pool of the boxes' addresses, a /30 each (default 10.213.0.0/16)");
  sv->add_option("--upstream-dns", serve.upstream_dns,
                 "Resolver for the names policies allow, ADDR:PORT (repeatable; default: the "
                 "host's /etc/resolv.conf)");
  sv->add_option("--upstream-ca", serve.upstream_ca,
                 "CA bundle to verify upstream HTTPS with (default: the host's CA store)");
  sv->add_option("--allow-range", serve.allow_ranges,
                 "Open this CIDR inside an always-denied range, e.g. 192.168.5.0/24 (repeatable)");
  sv->add_flag("--ipv6", serve.ipv6, "Give boxes IPv6 too (default: IPv4 only)");
  sv->add_option("--box-subnet6", serve.box_subnet6,
                 "With --ipv6: IPv6 pool of the boxes' addresses, a /126 each (default "
                 "fd73:6278::/64)");
  sv->add_option("--registry", serve.registries,
                 "A registry builds may pull FROM images from, HOST or HOST:PORT (repeatable; "
                 "default: none)");
  sv->add_option("--registry-mirror", serve.registry_mirrors,
                 "Pull REGISTRY's images from HOST:PORT instead, REGISTRY=HOST:PORT, e.g. "
                 "docker.io=127.0.0.1:5000 (repeatable; allows REGISTRY)");
  sv->add_option("--insecure-registry", serve.insecure_registries,
                 "Speak plain HTTP to this registry, HOST or HOST:PORT (repeatable)");
  sv->add_option("--registry-ca-file", serve.registry_ca_file,
                 "Verify registries with this PEM bundle instead of the host's CAs");
  sv->add_option("--build-network", serve.build_network,
                 "Network of the RUN steps of E2B template builds (their API has no policy): "
                 "none (default), open, or allow=NAME,... as sbx create --net (repeatable)");
  sv->add_option("--pool", serve.pools,
                 "Keep SIZE boxes of TEMPLATE made ahead (default 1), TEMPLATE[:SIZE]; a create "
                 "of that template with no network and the default disk takes one at once "
                 "(repeatable)");
  return sv;
}

// The verb a command line names (its first word that is not one of `app`'s options or an option's
// value), or "" for none.
std::string NamedVerb(const CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    const CLI::Option* option =
        a.starts_with('-') ? app.get_option_no_throw(std::string(a)) : nullptr;
    if (option != nullptr && option->get_type_size() > 0) {
      ++i;  // its value (a flag has none; --data-dir=X is one word)
    } else if (a.empty() || a[0] != '-') {
      return std::string(a);
    } else if (a == "--" || a == "-h" || a == "--help") {
      return "";  // the top-level help lists every verb
    }
  }
  return "";
}

// The data directory, absolute and without a trailing slash: it is joined to other paths (a box's
// files are reached through /proc/<pid>/root followed by it), and the daemon's banner prints it.
bool MakeDataDirAbsolute(std::string& dir) {
  std::error_code ec;
  std::filesystem::path abs;
  if (!dir.empty()) abs = std::filesystem::absolute(dir, ec);
  if (abs.empty()) {
    std::fprintf(stderr, "sbx: --data-dir: '%s' is not a directory path%s%s\n", dir.c_str(),
                 ec ? ": " : "", ec ? ec.message().c_str() : "");
    return false;
  }
  dir = abs.lexically_normal().string();
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sbx: isolated boxes for AI agents' processes, files and network"};
  app.require_subcommand(1);
  sbx::cli::GlobalOptions global;
  if (const char* d = std::getenv("SBX_DATA_DIR")) global.data_dir = d;
  app.add_option("--data-dir", global.data_dir, "State directory ($SBX_DATA_DIR)")
      ->capture_default_str();
  app.add_option("--agent", global.agent_path,
                 "Path of sbx-agent ($SBX_AGENT; default: beside sbx)");
  app.add_flag("-v,--verbose", global.verbose, "Log what sbx does to stderr");
  app.set_version_flag("--version", "sbx 0.1.0");

  sbx::cli::RunOptions run;
  CLI::App* r =
      app.add_subcommand("run", "Run a command in a new box and remove the box afterwards");
  r->add_option("--template", run.template_name,
                "host (default), a registered template, a rootfs directory or a tarball path")
      ->capture_default_str();
  r->add_option("--runtime", run.runtime,
                "Isolation: native, runc, gvisor or vm (default: the template's, else native)");
  r->add_option("--memory", run.memory, "Memory limit, e.g. 512M or 2G (swap is off)");
  r->add_option("--cpus", run.cpus, "CPU quota in cores, e.g. 0.5 or 2");
  r->add_option("--pids", run.pids, "Maximum number of processes and threads");
  r->add_option("--disk", run.disk, "Size of the writable layer, e.g. 1G");
  r->add_option("--timeout", run.timeout, "Kill the box after this long, e.g. 30s, 5m");
  r->add_option("-e,--env", run.env, "Set an environment variable K=V (repeatable)");
  r->add_option("--volume", run.volumes,
                "Bind a host directory into the box: HOST:BOX[:ro] (absolute paths; repeatable)");
  r->add_option("-w,--workdir", run.workdir, "Working directory inside the box");
  r->add_option("-u,--user", run.user, "User name or uid inside the box (default root)");
  r->add_flag("-i,--interactive", run.interactive, "Pass stdin to the command");
  r->add_flag("-t,--tty", run.tty, "Run the command on a terminal");
  r->add_flag("--timings", run.timings, "Print how long each phase took to stderr");
  sbx::cli::AddRunNetFlags(r, run.network, "the box");
  r->add_option("command", run.command, "Command and arguments (after --)")->required();
  r->positionals_at_end(true);

  // A one-shot run builds only its own flags: building the other verbs' two hundred options took
  // 0.7 ms of every run. Any other command line (help, a typo) gets every verb.
  sbx::cli::ServeOptions serve;
  sbx::cli::RangeFlags serve_ranges;
  std::string template_cache_size;
  CLI::App* sv = nullptr;
  sbx::cli::ClientVerbs client_verbs;
  if (NamedVerb(app, argc, argv) != "run") {
    sv = AddServeVerb(app, serve, serve_ranges, template_cache_size);
    client_verbs.Register(app, global);
    sbx::cli::RegisterTemplateVerbs(app, global, client_verbs);
    sbx::cli::RegisterBuildVerb(app, global, client_verbs);
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : sbx::cli::kExitSbxError;
  }
  if (!MakeDataDirAbsolute(global.data_dir)) return sbx::cli::kExitSbxError;
  if (r->parsed()) {
    // A one-shot run is over here: its box is removed and its output written. The CLI's option
    // tree and the libraries' static state need no teardown, which after the box's clone made
    // the heap copy-on-write costs a fault on nearly every page it frees: leave at once.
    int code = sbx::cli::RunCommand(global, run);
    std::fflush(nullptr);
    std::_Exit(code);
  }
  if (sv != nullptr && sv->parsed()) {
    auto ranges = sbx::cli::ParseRangeFlags(serve_ranges);
    if (!ranges.ok()) {
      std::fprintf(stderr, "sbx: %s\n", ranges.status().what().c_str());
      return sbx::cli::kExitSbxError;
    }
    serve.ranges = *ranges;
    if (!template_cache_size.empty()) {
      auto n = sbx::cli::ParseSize(template_cache_size);
      if (!n.ok() || *n <= 0) {
        std::fprintf(stderr, "sbx: --template-cache-size: expected a size such as 20G, got '%s'\n",
                     template_cache_size.c_str());
        return sbx::cli::kExitSbxError;
      }
      serve.template_cache_bytes = *n;
    }
    return sbx::cli::ServeCommand(global, serve);
  }
  if (auto code = client_verbs.Run()) return *code;
  return 0;
}
