// `sbx template add|import|ls|inspect|rm|gc`: the operator's side of the template registry
// (docs/storage.md). Runs on the host as root, on the store (<data dir>/sbx.db) and the template
// cache directly, also while the daemon runs. Also the one place the CLI (serve, run, template)
// builds its storage::TemplateStore from, so that all three agree on the cache and its bound.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "cli/run.h"
#include "cli/verbs.h"
#include "common/status.h"
#include "storage/template.h"

namespace sbx::cli {

// The template cache of `data_dir` with bound `cache_bytes` (0: the bound `sbx serve` last
// recorded, else the default).
storage::TemplateStore CliTemplateStore(const std::string& data_dir, int64_t cache_bytes);

// Records the daemon's bound in the cache directory, for `sbx template add` to honour it.
Status RecordTemplateCacheBytes(const storage::TemplateStore& ts);

void RegisterTemplateVerbs(CLI::App& app, const GlobalOptions& global, ClientVerbs& verbs);

// `sbx template pull` (template_pull.cc), added to `sbx template` by RegisterTemplateVerbs.

// The client side of a registry login, for `sbx template pull` and `sbx build` (template_pull.cc):
// the docker config file to read credentials from ($DOCKER_CONFIG/config.json, else
// ~/.docker/config.json; "" when neither variable is set), and the password --password-stdin
// reads (the first line of stdin), which goes with --username (EINVAL when only one is given).
std::string DockerConfigPath();
Result<std::string> RegistryPassword(const std::string& username, bool password_stdin);
void RegisterTemplatePullVerb(CLI::App* tmpl, const GlobalOptions& global, ClientVerbs& verbs);
// `sbx template debian` (template_debian.cc), likewise.
void RegisterTemplateDebianVerb(CLI::App* tmpl, const GlobalOptions& global, ClientVerbs& verbs);

}  // namespace sbx::cli
