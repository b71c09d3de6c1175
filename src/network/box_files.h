// The files through which a box sees its network: /etc/resolv.conf (sbx's resolver on the host end
// of its veth) and /etc/hosts. They are written to a per-box directory on the host and the caller
// binds them read-only into the box (BoxNetPlan::files). A box without networking gets a
// resolv.conf with no nameserver whose comment says why and how to get one, so that a user whose
// `pip install` fails and who looks finds the reason. docs/network.md, "Links and addresses".
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "network/policy.h"

namespace sbx::network {

// Host path -> path inside the box, for read-only binds.
using BoxFiles = std::vector<std::pair<std::string, std::string>>;

std::string ResolvConf(const address& nameserver);
std::string NoNetworkResolvConf();
std::string HostsFile(const std::string& hostname, const address& box_ip, bool ipv6);

// Writes resolv.conf and hosts of a box with networking into `dir` (made 0755 if missing; it and
// its parent must be directories only root can write, e.g. under the data directory). Each file
// is written atomically (a temporary file beside it, then rename), 0644, and never through a
// symlink. Returns the binds: <dir>/resolv.conf -> /etc/resolv.conf, <dir>/hosts -> /etc/hosts.
Result<BoxFiles> WriteBoxNetFiles(const std::string& dir, const address& host_ip,
                                  const address& box_ip, const std::string& hostname,
                                  bool ipv6 = false);
// The same for a box without networking (mode none): only the explanatory resolv.conf.
Result<BoxFiles> WriteNoNetworkFiles(const std::string& dir);

}  // namespace sbx::network
