// Which registries a build may pull its base image from (FROM of a Dockerfile, E2B's fromImage;
// docs/build.md "Images from registries"). A reference comes from a tenant and the daemon would
// connect wherever it names (SSRF, threats.md rows 34 and 41), so daemon builds pull only from the
// registries the operator lists (`sbx serve --registry HOST[:PORT]`, none by default); `sbx build`
// is the operator's own root action and pulls from any registry.
//
// The rules of a restricted (daemon) policy:
//  - a reference's registry must be listed (an entry "host" allows every port of it,
//    "host:port" that port) or have a mirror (`--registry-mirror docker.io=HOST:PORT`, whose
//    target is then where the pull connects); anything else is EPERM naming --registry, before
//    any connection;
//  - every connection of the pull (the registry, its bearer-token realm, every redirect a blob
//    fetch answers) goes to a listed host or mirror target, whatever its addresses (the operator
//    named it: a registry on loopback is fine), or else to a host whose every address is public:
//    a redirect or token realm on loopback, link-local, a private range, CGNAT, multicast or
//    unspecified (network::AlwaysDeniedRange) is refused. The addresses checked are the ones
//    connected to (storage::PullOptions::check_connect).
//  - plain HTTP only to hosts named with --insecure-registry (storage's rule, for every pull).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "storage/registry.h"

namespace sbx::sandbox {

struct RegistryPolicy {
  bool any_registry = false;         // `sbx build`: no list; the daemon: only what is listed
  std::vector<std::string> allowed;  // --registry HOST[:PORT]
  // --registry-mirror REGISTRY=HOST[:PORT]: pulls of REGISTRY's references connect to HOST:PORT
  // (the repository path stays the reference's: docker.io/library/x is /v2/library/x there).
  std::vector<std::pair<std::string, std::string>> mirrors;
  std::vector<std::string> insecure;  // --insecure-registry HOST[:PORT]
  std::string ca_file;                // verify registries with this PEM bundle
  std::string docker_config;          // credentials file (`sbx build` only; empty: none)
};

// EINVAL naming the flag for an entry that is not HOST[:PORT] (or REGISTRY=HOST[:PORT]).
Status ValidateRegistryPolicy(const RegistryPolicy& p);

// Whether `ref` may be pulled under `p` (EPERM naming `sbx serve --registry` when not, checked
// without any connection), and the options to pull it with: endpoint, plain-HTTP hosts, CA and
// the connection check above. Credentials are the caller's to add.
Result<storage::PullOptions> PullOptionsFor(const RegistryPolicy& p, const storage::ImageRef& ref);

}  // namespace sbx::sandbox
