// sbx: the command-line entry point. Verbs: run (one-shot box), serve (the daemon) and the
// client verbs that talk to it (cli/verbs.h).
#include <CLI/CLI.hpp>
#include <cstdlib>

#include "cli/run.h"
#include "cli/serve.h"
#include "cli/verbs.h"

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
                "host (default), a rootfs directory, or a rootfs tarball (.tar[.gz|.zst|.xz])")
      ->capture_default_str();
  r->add_option("--memory", run.memory, "Memory limit, e.g. 512M or 2G (swap is off)");
  r->add_option("--cpus", run.cpus, "CPU quota in cores, e.g. 0.5 or 2");
  r->add_option("--pids", run.pids, "Maximum number of processes and threads");
  r->add_option("--disk", run.disk, "Size of the writable layer, e.g. 1G");
  r->add_option("--timeout", run.timeout, "Kill the box after this long, e.g. 30s, 5m");
  r->add_option("-e,--env", run.env, "Set an environment variable K=V (repeatable)");
  r->add_option("-w,--workdir", run.workdir, "Working directory inside the box");
  r->add_option("-u,--user", run.user, "User name or uid inside the box (default root)");
  r->add_flag("-i,--interactive", run.interactive, "Pass stdin to the command");
  r->add_flag("-t,--tty", run.tty, "Run the command on a terminal");
  r->add_flag("--timings", run.timings, "Print how long each phase took to stderr");
  r->add_option("command", run.command, "Command and arguments (after --)")->required();
  r->positionals_at_end(true);

  sbx::cli::ServeOptions serve;
  CLI::App* sv =
      app.add_subcommand("serve", "Run the daemon: REST API, sandboxes that outlive requests");
  sv->add_option("--listen", serve.listen, "HOST:PORT to listen on (port 0: any free port)")
      ->capture_default_str();
  sv->add_option("--unix-socket", serve.unix_socket, "Also listen on this unix socket");
  sv->add_option("--threads", serve.threads, "I/O threads")->capture_default_str();
  sv->add_option("--default-timeout", serve.default_timeout_s, "Default sandbox timeout in seconds")
      ->capture_default_str();
  sv->add_option("--audit-retention", serve.audit_retention,
                 "Delete audit events older than this, e.g. 30d, 12h (0: keep forever)")
      ->capture_default_str();
  sv->add_option("--max-connections", serve.max_connections, "Open HTTP connections at most")
      ->capture_default_str();
  sv->add_option("--max-connections-per-address", serve.max_connections_per_address,
                 "Open HTTP connections per remote address (0: no cap; loopback is exempt)")
      ->capture_default_str();

  sbx::cli::ClientVerbs client_verbs;
  client_verbs.Register(app, global);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : sbx::cli::kExitSbxError;
  }
  if (r->parsed()) return sbx::cli::RunCommand(global, run);
  if (sv->parsed()) return sbx::cli::ServeCommand(global, serve);
  if (auto code = client_verbs.Run()) return *code;
  return 0;
}
