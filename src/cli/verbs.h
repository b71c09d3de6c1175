// The client verbs of `sbx`: create, ls, inspect, exec, cp, kill, pause, resume, timeout,
// logs/attach, ps, audit (all over the daemon's REST API, docs/api.md) and key (on the store
// directly, for root). Each verb prints a table by default and the API's JSON with --json; a
// failure prints "sbx: <message>" and exits 125 (kExitSbxError).
//
// Files: verbs.cc (registration, sandbox and admin verbs), exec.cc (exec, logs), cp.cc (cp).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cli/client.h"
#include "cli/run.h"

namespace sbx::cli {

// The verbs added to an app and what runs each of them once parsed.
class ClientVerbs {
 public:
  // Adds every client verb to `app`. `global` is read when a verb runs (after parsing), so it
  // must outlive this object.
  void Register(CLI::App& app, const GlobalOptions& global);
  // Runs the verb that was parsed and returns its exit status; nullopt when none of them was.
  std::optional<int> Run() const;

  // For the per-file registration functions below.
  void Add(CLI::App* verb, std::function<int()> run) { verbs_.push_back({verb, std::move(run)}); }

 private:
  struct Verb {
    CLI::App* app;
    std::function<int()> run;
  };
  std::vector<Verb> verbs_;
};

// ---- shared by verbs.cc, exec.cc and cp.cc ----

// Prints "sbx: <message>" and returns kExitSbxError.
int Fail(const Status& s);
// The client for a verb's connection flags, or the reason there is none.
Result<Client> MakeClient(const GlobalOptions& global, const ConnectionFlags& flags);
// "/v1/sandboxes/<id>" with the id percent-encoded.
std::string SandboxPath(const std::string& id);
// Checks "K=V" items (-e, --metadata) and splits them.
Result<std::vector<std::pair<std::string, std::string>>> ParsePairs(
    const std::vector<std::string>& items, const char* flag);

void RegisterExecVerbs(CLI::App& app, const GlobalOptions& global, ClientVerbs& verbs);
void RegisterCpVerb(CLI::App& app, const GlobalOptions& global, ClientVerbs& verbs);
void RegisterMcpVerb(CLI::App& app, const GlobalOptions& global, ClientVerbs& verbs);  // mcp.cc
void RegisterSecretVerbs(CLI::App& app, const GlobalOptions& global,
                         ClientVerbs& verbs);  // secret.cc

}  // namespace sbx::cli
