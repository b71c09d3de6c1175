// Policy: what a sandbox may reach on the network (DESIGN.md, "Network"; docs/network.md). One
// value type shared by every enforcer: the nftables rules (UDP), the DNS resolver (which names
// are answered at all) and the egress proxy (every TCP connection). Pure: no I/O, no clock.
//
// Grammar of an entry (allow and deny lists alike; case-insensitive names):
//   pypi.org               one name (any port)
//   *.pythonhosted.org     every name below it (not the name itself); "*" alone: every name
//   140.82.112.0/20        an IPv4 or IPv6 CIDR; a bare address is a /32 or /128
//   pypi.org:443           any of the above, one TCP port only ([v6]:port for IPv6 addresses)
//   198.18.0.0/15:53/udp   UDP: only with an address or CIDR and one port; UDP is never allowed
//                          without such an entry (DNS goes to sbx's own resolver instead)
//
// Decision (E2B's rule, so its configurations map one to one): an always-denied address is
// refused whatever the policy says (unless the operator opened its range); then an address or
// name matching an `allow` entry is allowed; then `allowlist` refuses everything else, and
// `open` refuses what matches a `deny` entry and allows the rest. `none` refuses everything.
#pragma once

#include <boost/asio/ip/address.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace sbx::network {

using boost::asio::ip::address;

enum class Mode { kNone, kAllowlist, kOpen };
const char* ModeName(Mode mode);                // "none", "allowlist", "open"
Result<Mode> ParseMode(std::string_view text);  // EINVAL naming the text

enum class Proto { kTcp, kUdp };

// An address range: an IPv4 or IPv6 network.
struct Cidr {
  address base;  // with the host bits cleared
  int prefix = 0;
  bool Contains(const address& a) const;  // false across families (v4-mapped v6 is unmapped first)
  std::string ToString() const;           // "10.0.0.0/8"
};
// "10.0.0.0/8", "fe80::/10", "1.2.3.4" (/32); EINVAL for anything else (host bits set included).
Result<Cidr> ParseCidr(std::string_view text);

struct Rule {
  enum class Kind { kName, kWildcard, kAnyName, kCidr } kind = Kind::kName;
  std::string name;   // kName: "pypi.org"; kWildcard: the suffix "pythonhosted.org"; lowercase
  Cidr cidr;          // kCidr
  uint16_t port = 0;  // 0: any port (never 0 for UDP)
  Proto proto = Proto::kTcp;
  std::string text;  // as written (normalised), for messages and for the record
};
// Parses one entry; EINVAL with a message that names the entry and says what is wrong.
Result<Rule> ParseRule(std::string_view text);

struct Policy {
  Mode mode = Mode::kNone;
  std::vector<Rule> allow;
  std::vector<Rule> deny;

  // The decision for a connection to `ip`:`port` over `proto`, made for `name` when the client
  // named one (SNI, Host) and the address came from resolving it. `reason` is for the audit
  // event and the refusal message: "always denied (private range 10.0.0.0/8)", "not in the
  // allowlist", "denied by rule 1.2.3.0/24".
  struct Decision {
    bool allowed = false;
    std::string reason;
  };
  Decision Decide(const std::optional<std::string>& name, const address& ip, uint16_t port,
                  Proto proto, const std::vector<Cidr>& opened_ranges = {}) const;
  // Whether a name may be resolved upstream at all: `open` (unless a deny name rule matches),
  // or a name, wildcard or "*" allow entry matches it. Every other name is answered NXDOMAIN
  // with no upstream query.
  bool NameMayResolve(std::string_view name) const;
  // The allow entries that a name rule matches at `port` (for the proxy: a name the client gave).
  bool AllowsName(std::string_view name, uint16_t port) const;

  // {"mode": "allowlist", "allow": [...], "deny": [...]}, the record's and the API's shape.
  std::string ToJson() const;
  // From that shape; EINVAL naming the field. A missing mode is "allowlist" when `allow` is given
  // and "none" otherwise; more than kMaxRules entries in a list is EINVAL.
  static Result<Policy> FromJson(std::string_view json);
  // One line for people: "allowlist: pypi.org, *.pythonhosted.org" / "open" / "none".
  std::string Describe() const;
};

inline constexpr size_t kMaxRules = 256;

// The ranges no policy opens (issue 12, threats.md rows 34-35): loopback, link-local and
// metadata, the private ranges, CGNAT, ULA, multicast, broadcast, unspecified.
const std::vector<Cidr>& AlwaysDenied();
// Whether `ip` is in one of them and not in one of `opened` (an operator's --allow-range).
// Returns the range it is in (for the reason) or nullopt.
std::optional<Cidr> AlwaysDeniedRange(const address& ip, const std::vector<Cidr>& opened = {});

// Lowercases and strips one trailing dot; nullopt for a name that is not a valid DNS name
// (labels 1..63 of [a-z0-9-_], total <= 253).
std::optional<std::string> NormalizeName(std::string_view name);

}  // namespace sbx::network
