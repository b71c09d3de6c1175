// What `sbx exec`, `sbx logs` and `sbx run` tell on stderr after a command's output when the box's
// network refused something during it (docs/network.md, "Refusals"): inside the box a refused
// name is only NXDOMAIN ("could not resolve") and a refused raw-address TLS connection only
// closed, so this is where the person or agent who ran the command learns that the policy did it.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "network/refusals.h"

namespace sbx::cli {

// The refusals an exit event of the /v1 API carries (network_refused, network_refused_more,
// network_policy; docs/api.md), nullopt when it carries none. Bounded by what it reads: at most
// network::RefusalLog::kMaxEntries entries, fields cut as the log cuts them.
std::optional<network::BoxRefusals> RefusalsOfExit(const nlohmann::json& exit);

// One block, e.g.
//   sbx: this sandbox's network policy (mode allowlist; allowed: pypi.test) refused during this
//   command: DNS lookup of files.example (not in the allowlist) ×3; connection to
//   198.18.0.5:443 (not in the allowlist). Change it with `sbx net ID`.
// `hint` is the last sentence (empty: none). Control characters are shown as '?'. Ends with a
// newline.
std::string RefusalBlock(const network::BoxRefusals& refused, const std::string& hint);

// Writes RefusalBlock to stderr when `refused` is not empty.
void PrintRefusals(const network::BoxRefusals& refused, const std::string& hint);

}  // namespace sbx::cli
