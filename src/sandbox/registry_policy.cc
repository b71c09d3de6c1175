#include "sandbox/registry_policy.h"

#include <algorithm>

#include "network/policy.h"

namespace sbx::sandbox {
namespace {

// "host[:port]" or "[v6][:port]" as host and port string ("" when none).
std::pair<std::string, std::string> SplitHostPort(const std::string& s) {
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find(']');
    if (close == std::string::npos) return {s, ""};
    std::string rest = s.substr(close + 1);
    return {s.substr(1, close - 1), rest.empty() ? "" : rest.substr(1)};
  }
  size_t colon = s.find(':');
  if (colon == std::string::npos) return {s, ""};
  return {s.substr(0, colon), s.substr(colon + 1)};
}

// Whether `entries` name host:port (an entry without a port names every port of its host).
// `port` "" is the reference's registry without a port: only a port-less entry names it.
bool Listed(const std::vector<std::string>& entries, const std::string& host,
            const std::string& port) {
  return std::any_of(entries.begin(), entries.end(), [&](const std::string& e) {
    auto [h, p] = SplitHostPort(e);
    return h == host && (p.empty() || p == port);
  });
}

// HOST[:PORT] as a registry of a reference would be.
bool ValidHost(const std::string& s) {
  auto r = storage::ParseImageRef(s + "/x");
  return r.ok() && r->registry == s;
}

}  // namespace

Status ValidateRegistryPolicy(const RegistryPolicy& p) {
  for (const auto& [flag, list] :
       {std::pair{"--registry", &p.allowed}, std::pair{"--insecure-registry", &p.insecure}})
    for (const auto& e : *list)
      if (!ValidHost(e))
        return Status::Error(std::string(flag) + ": expected HOST[:PORT] (e.g. 127.0.0.1:5000 or " +
                                 "registry.example.com), got '" + e + "'",
                             EINVAL);
  for (const auto& [from, to] : p.mirrors)
    if (!ValidHost(from) || !ValidHost(to))
      return Status::Error(
          "--registry-mirror: expected REGISTRY=HOST[:PORT] (e.g. "
          "docker.io=127.0.0.1:5000), got '" +
              from + "=" + to + "'",
          EINVAL);
  return {};
}

Result<storage::PullOptions> PullOptionsFor(const RegistryPolicy& p, const storage::ImageRef& ref) {
  storage::PullOptions o;
  o.insecure_registries = p.insecure;
  o.ca_file = p.ca_file;
  o.docker_config = p.docker_config;
  auto mirror = std::find_if(p.mirrors.begin(), p.mirrors.end(),
                             [&](const auto& m) { return m.first == ref.registry; });
  if (mirror != p.mirrors.end()) o.endpoint = mirror->second;
  if (p.any_registry) return o;

  auto [host, port] = SplitHostPort(ref.registry);
  if (mirror == p.mirrors.end() && !Listed(p.allowed, host, port))
    return Status::Error("registry " + ref.registry +
                             " is not one this daemon pulls from (the operator allows it with "
                             "`sbx serve --registry " +
                             ref.registry + "`)",
                         EPERM);
  // Where connections may go whatever their addresses: what the operator named.
  std::vector<std::string> named = p.allowed;
  for (const auto& [from, to] : p.mirrors) named.push_back(to);
  o.check_connect = [named](const std::string& h, uint16_t port_number,
                            const std::vector<std::string>& addresses) -> Status {
    if (Listed(named, h, std::to_string(port_number))) return {};
    for (const auto& a : addresses) {
      boost::system::error_code ec;
      network::address ip = boost::asio::ip::make_address(a, ec);
      if (!ec && ip.is_v6() && ip.to_v6().is_v4_mapped())
        ip = boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, ip.to_v6());
      std::optional<network::Cidr> range;
      if (ec || (range = network::AlwaysDeniedRange(ip))) {
        std::string authority = h.find(':') != std::string::npos ? "[" + h + "]" : h;
        authority += ":" + std::to_string(port_number);
        return Status::Error("the pull was sent to " + authority + ", which is in " +
                                 (range ? range->ToString() : std::string("no public range")) +
                                 " and not a registry the operator named (sbx serve --registry " +
                                 authority + ")",
                             EPERM);
      }
    }
    return {};
  };
  return o;
}

}  // namespace sbx::sandbox
