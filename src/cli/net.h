// The CLI's network verbs and flags (issue 12): `--net` of `sbx create`, `sbx net ID [POLICY...]`
// and `sbx port-url ID PORT --ttl`, over the native API (docs/api.md, "Network").
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/verbs.h"
#include "common/status.h"

namespace sbx::cli {

// `--net` values (or `sbx net ID` arguments) as the API's policy JSON: "none", "open",
// "allow=a,b" and "deny=c" (repeatable, comma-separated lists). allow= alone is an allowlist;
// open with allow= and deny= is open minus deny, allow winning. Entries are checked by the
// daemon (network/policy.h); this checks the shape only.
Result<nlohmann::json> ParseNetFlags(const std::vector<std::string>& items);

// One line for people: "allowlist: pypi.org, *.npmjs.org" / "open (deny: 1.2.3.0/24)" / "none".
std::string DescribeNetwork(const nlohmann::json& policy);

void RegisterNetVerbs(CLI::App& app, const GlobalOptions& global, ClientVerbs& verbs);

}  // namespace sbx::cli
