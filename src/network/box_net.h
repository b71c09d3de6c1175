// What every enforcer knows of one box with networking: its addresses, its policy and the secrets
// it may use. The registry maps a packet's source address to it (the DNS resolver and the egress
// proxy see only the box's address) and its id to it (live policy changes). Entries are
// immutable: a policy change puts a new entry, and a connection keeps the entry it started with
// while new ones see the new policy at once.
#pragma once

#include <boost/asio/ip/address.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/thread_annotations.h"
#include "network/policy.h"

namespace sbx::network {

// A secret a box may use without seeing it (issue 12, item 6): inside, env var `env` holds
// `placeholder`; the egress proxy replaces the placeholder by `value` in headers and the query
// of requests to `hosts` (policy name entries: "api.openai.com", "*.example.com") and nowhere else.
// With `header` set, requests to those hosts also get `header: format` with "{}" in `format`
// replaced by the value (E2B's `rules` header transforms map onto this).
struct SecretBinding {
  std::string name;  // the secret's name, for audit events (never the value); for a header of
                     // E2B's rules, the names it uses joined by ',' ("" for none)
  std::string env;   // the variable inside the box; empty for a header-only binding
  std::string placeholder;  // random, unique per box and secret
  std::string value;        // the real value: never logged, never returned, never in the box
  std::vector<std::string> hosts;
  std::string header;
  std::string format = "{}";
};

struct BoxNet {
  std::string id;
  address box_ip;   // the box's end of its veth
  address host_ip;  // the host's end: the box's gateway, resolver and proxy address
  // With IPv6 (--ipv6): the same ends' IPv6 addresses; unspecified (::) without.
  address box_ip6 = boost::asio::ip::address_v6();
  address host_ip6 = boost::asio::ip::address_v6();
  Policy policy;
  std::vector<SecretBinding> secrets;
  int64_t egress_bytes_per_s = 0;  // limits.egress_mbps; 0: unlimited
  std::string refusal_hint;        // BoxNetRequest::refusal_hint; empty: the proxy's own
  int max_connections = 256;       // open proxied connections at once
};

// Thread-safe. A box is found by each of its addresses (box_ip, and box_ip6 when set).
class BoxRegistry {
 public:
  void Put(std::shared_ptr<const BoxNet> box);
  void Remove(const std::string& id);
  std::shared_ptr<const BoxNet> ByAddress(const address& box_ip) const;
  std::shared_ptr<const BoxNet> ById(const std::string& id) const;
  std::vector<std::shared_ptr<const BoxNet>> All() const;

 private:
  void Unmap(const BoxNet& box) REQUIRES(mu_);
  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<const BoxNet>> by_id_ GUARDED_BY(mu_);
  std::map<address, std::shared_ptr<const BoxNet>> by_address_ GUARDED_BY(mu_);
};

// Something the network did that goes into the audit trail. Types:
//   net.dns_denied     {"names": {"x.evil.test": 3, ...}, "dropped": N} aggregated per box per
//   period net.connect_denied {"dst": "1.2.3.4:443", "name": "sni-or-host", "reason": "..."}
//   net.connect        {"dst": ..., "name": ..., "sent": N, "received": N, "ms": N} on close
//   secret.use         {"secret": "openai", "host": "api.openai.com"}
//   secret.leak        {"secret": "openai", "host": "evil.test"}  placeholder sent elsewhere,
//   unreplaced
struct NetEvent {
  std::string type;
  std::string box_id;
  nlohmann::json detail = nlohmann::json::object();
};
using EventSink = std::function<void(NetEvent)>;

// Resolves a name on the host, for the proxy's re-resolution (no rebinding): the host's
// resolvers or --upstream-dns. Calls `done` exactly once, on any thread.
class HostLookup {
 public:
  virtual ~HostLookup() = default;
  virtual void Resolve(const std::string& name,
                       std::function<void(Result<std::vector<address>>)> done) = 0;
};

}  // namespace sbx::network
