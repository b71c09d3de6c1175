// Policy: parsing, the decision and the JSON shape (policy.h). Every entry comes from an API
// client, so parsing is strict and every error names the entry it is about.
#include "network/policy.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <nlohmann/json.hpp>

namespace sbx::network {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// A v4-mapped IPv6 address (::ffff:a.b.c.d) is the IPv4 address it carries: a dual-stack
// socket reports IPv4 peers that way, and a rule written for 10.0.0.0/8 must see them.
address Unmap(const address& a) {
  if (a.is_v6() && a.to_v6().is_v4_mapped())
    return boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, a.to_v6());
  return a;
}

std::vector<unsigned char> Bytes(const address& a) {
  if (a.is_v4()) {
    auto b = a.to_v4().to_bytes();
    return {b.begin(), b.end()};
  }
  auto b = a.to_v6().to_bytes();
  return {b.begin(), b.end()};
}

address FromBytes(const std::vector<unsigned char>& b) {
  if (b.size() == 4) {
    boost::asio::ip::address_v4::bytes_type v4;
    std::copy(b.begin(), b.end(), v4.begin());
    return boost::asio::ip::address_v4(v4);
  }
  boost::asio::ip::address_v6::bytes_type v6;
  std::copy(b.begin(), b.end(), v6.begin());
  return boost::asio::ip::address_v6(v6);
}

// Strict decimal: digits only, no sign, no leading zeros beyond "0", at most `max`.
std::optional<int> Decimal(std::string_view s, int max) {
  if (s.empty() || s.size() > 5) return std::nullopt;
  if (s.size() > 1 && s[0] == '0') return std::nullopt;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  if (v > max) return std::nullopt;
  return v;
}

// A literal address only: no zone ids ("fe80::1%eth0"), no shorthand that inet_aton would take
// ("10.1", "0x7f.1"): boost's make_address is inet_pton, which takes neither.
std::optional<address> ParseAddress(std::string_view text) {
  if (text.empty() || text.find('%') != std::string_view::npos) return std::nullopt;
  boost::system::error_code ec;
  address a = boost::asio::ip::make_address(std::string(text), ec);
  if (ec) return std::nullopt;
  return a;
}

struct DeniedRange {
  Cidr cidr;
  const char* what;
};

Cidr Must(std::string_view text) { return *ParseCidr(text); }

// Ordered so that the narrowest range names an address first (::1 is "loopback", not "::/96").
const std::vector<DeniedRange>& DeniedRanges() {
  static const std::vector<DeniedRange> ranges = {
      {Must("0.0.0.0/8"), "unspecified range"},
      {Must("127.0.0.0/8"), "loopback range"},
      {Must("10.0.0.0/8"), "private range"},
      {Must("100.64.0.0/10"), "shared (CGNAT) range"},
      {Must("169.254.0.0/16"), "link-local and metadata range"},
      {Must("172.16.0.0/12"), "private range"},
      {Must("192.168.0.0/16"), "private range"},
      {Must("192.0.0.0/24"), "IETF protocol assignments range"},
      {Must("224.0.0.0/4"), "multicast range"},
      {Must("240.0.0.0/4"), "reserved and broadcast range"},
      {Must("::/128"), "unspecified address"},
      {Must("::1/128"), "loopback address"},
      // IPv4-compatible addresses (deprecated): ::a.b.c.d must not be a way around the IPv4 list.
      {Must("::/96"), "IPv4-compatible range"},
      {Must("fe80::/10"), "link-local range"},
      {Must("fc00::/7"), "unique local range"},
      {Must("ff00::/8"), "multicast range"},
  };
  return ranges;
}

// Translation prefixes carry an IPv4 address that a gateway on the host's network would reach:
// NAT64 (64:ff9b::/96, the last 32 bits) and 6to4 (2002::/16, bits 16..47). The embedded
// address is judged as itself, so 64:ff9b::10.0.0.1 is the private address it names.
std::optional<address> Embedded(const address& a) {
  if (!a.is_v6()) return std::nullopt;
  static const Cidr nat64 = Must("64:ff9b::/96");
  static const Cidr six_to_four = Must("2002::/16");
  auto b = a.to_v6().to_bytes();
  boost::asio::ip::address_v4::bytes_type v4;
  if (nat64.Contains(a)) {
    std::copy(b.begin() + 12, b.end(), v4.begin());
    return boost::asio::ip::address_v4(v4);
  }
  if (six_to_four.Contains(a)) {
    std::copy(b.begin() + 2, b.begin() + 6, v4.begin());
    return boost::asio::ip::address_v4(v4);
  }
  return std::nullopt;
}

std::optional<DeniedRange> DeniedRangeOf(const address& raw, const std::vector<Cidr>& opened) {
  address ip = Unmap(raw);
  for (const address& candidate : {ip, Embedded(ip).value_or(ip)}) {
    for (const DeniedRange& r : DeniedRanges()) {
      if (!r.cidr.Contains(candidate)) continue;
      bool open = std::any_of(opened.begin(), opened.end(),
                              [&](const Cidr& o) { return o.Contains(candidate); });
      if (!open) return r;
    }
  }
  return std::nullopt;
}

bool NameMatches(const Rule& rule, const std::string& name) {
  switch (rule.kind) {
    case Rule::Kind::kAnyName:
      return true;
    case Rule::Kind::kName:
      return name == rule.name;
    case Rule::Kind::kWildcard:
      return name.size() > rule.name.size() + 1 && name.ends_with(rule.name) &&
             name[name.size() - rule.name.size() - 1] == '.';
    case Rule::Kind::kCidr:
      return false;
  }
  return false;
}

bool IsNameRule(const Rule& rule) { return rule.kind != Rule::Kind::kCidr; }

// Whether `rule` covers a connection: its protocol and port, then its address or name.
bool Matches(const Rule& rule, const std::optional<std::string>& name, const address& ip,
             uint16_t port, Proto proto) {
  if (rule.proto != proto) return false;
  if (rule.port != 0 && rule.port != port) return false;
  if (rule.kind == Rule::Kind::kCidr) return rule.cidr.Contains(ip);
  return name.has_value() && NameMatches(rule, *name);
}

Status Invalid(std::string_view entry, const std::string& why) {
  return Status::Error("network rule \"" + std::string(entry) + "\": " + why, EINVAL);
}

}  // namespace

const char* ModeName(Mode mode) {
  switch (mode) {
    case Mode::kNone:
      return "none";
    case Mode::kAllowlist:
      return "allowlist";
    case Mode::kOpen:
      return "open";
  }
  return "none";
}

Result<Mode> ParseMode(std::string_view text) {
  if (text == "none") return Mode::kNone;
  if (text == "allowlist") return Mode::kAllowlist;
  if (text == "open") return Mode::kOpen;
  std::string shown(text.substr(0, 64));
  return Status::Error(
      "network mode \"" + shown + "\": not one of \"none\", \"allowlist\", \"open\"", EINVAL);
}

bool Cidr::Contains(const address& raw) const {
  address a = Unmap(raw);
  if (a.is_v4() != base.is_v4()) return false;
  std::vector<unsigned char> x = Bytes(a), y = Bytes(base);
  int bits = prefix;
  for (size_t i = 0; i < x.size() && bits > 0; ++i, bits -= 8) {
    unsigned mask = bits >= 8 ? 0xffu : (0xffu << (8 - bits)) & 0xffu;
    if ((x[i] & mask) != (y[i] & mask)) return false;
  }
  return true;
}

std::string Cidr::ToString() const { return base.to_string() + "/" + std::to_string(prefix); }

Result<Cidr> ParseCidr(std::string_view text) {
  std::string shown(text.substr(0, 128));
  auto bad = [&](const std::string& why) {
    return Status::Error("address range \"" + shown + "\": " + why, EINVAL);
  };
  size_t slash = text.find('/');
  std::optional<address> a = ParseAddress(text.substr(0, slash));
  if (!a) return bad("not an IPv4 or IPv6 address");
  int max = a->is_v4() ? 32 : 128;
  int prefix = max;
  if (slash != std::string_view::npos) {
    std::optional<int> p = Decimal(text.substr(slash + 1), max);
    if (!p) return bad("the prefix length is not 0.." + std::to_string(max));
    prefix = *p;
  }
  // ::ffff:a.b.c.d/120 is the IPv4 range it carries, so that it matches what Contains unmaps.
  if (a->is_v6() && a->to_v6().is_v4_mapped() && prefix >= 96) {
    a = Unmap(*a);
    prefix -= 96;
  }
  std::vector<unsigned char> b = Bytes(*a);
  int bits = prefix;
  for (size_t i = 0; i < b.size(); ++i, bits -= 8) {
    unsigned mask = bits >= 8 ? 0xffu : bits <= 0 ? 0u : (0xffu << (8 - bits)) & 0xffu;
    if ((b[i] & ~mask & 0xffu) != 0) {
      // Say what was probably meant: the same range with the host bits cleared.
      for (size_t j = i; j < b.size(); ++j, bits -= 8) {
        unsigned m = bits >= 8 ? 0xffu : bits <= 0 ? 0u : (0xffu << (8 - bits)) & 0xffu;
        b[j] = static_cast<unsigned char>(b[j] & m);
      }
      return bad("host bits are set (did you mean " + FromBytes(b).to_string() + "/" +
                 std::to_string(prefix) + "?)");
    }
  }
  return Cidr{*a, prefix};
}

std::optional<std::string> NormalizeName(std::string_view raw) {
  if (raw.ends_with('.')) raw.remove_suffix(1);
  if (raw.empty() || raw.size() > 253) return std::nullopt;
  std::string name = Lower(raw);
  size_t start = 0;
  while (true) {
    size_t dot = name.find('.', start);
    size_t end = dot == std::string::npos ? name.size() : dot;
    size_t len = end - start;
    if (len < 1 || len > 63) return std::nullopt;
    for (size_t i = start; i < end; ++i) {
      char c = name[i];
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_'))
        return std::nullopt;
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return name;
}

Result<Rule> ParseRule(std::string_view entry) {
  if (entry.empty()) return Status::Error("network rule \"\": empty", EINVAL);
  if (entry.size() > 300) return Invalid(entry.substr(0, 64), "longer than 300 characters");
  for (char c : entry) {
    if (std::isspace(static_cast<unsigned char>(c))) return Invalid(entry, "contains white space");
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f)
      return Invalid(entry, "contains a character that is not printable ASCII");
  }
  std::string text = Lower(entry);
  Rule rule;
  std::string_view rest = text;
  if (rest.ends_with("/udp")) {
    rule.proto = Proto::kUdp;
    rest.remove_suffix(4);
  } else if (rest.ends_with("/tcp")) {
    rest.remove_suffix(4);
  }

  // Split the target from the port: "[v6 or v6/64]:443", "host:443", or a bare IPv6 literal
  // (two or more colons, no brackets: no port).
  std::string_view target = rest, port_text;
  bool bracketed = false, has_port = false;
  if (rest.starts_with('[')) {
    size_t close = rest.find(']');
    if (close == std::string_view::npos) return Invalid(entry, "'[' without ']'");
    target = rest.substr(1, close - 1);
    std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return Invalid(entry, "expected \":port\" after ']'");
      port_text = after.substr(1);
      has_port = true;
    }
    bracketed = true;
  } else if (std::count(rest.begin(), rest.end(), ':') == 1) {
    size_t colon = rest.find(':');
    target = rest.substr(0, colon);
    port_text = rest.substr(colon + 1);
    has_port = true;
  }
  if (has_port) {
    std::optional<int> port = Decimal(port_text, 65535);
    if (!port || *port == 0) return Invalid(entry, "the port is not a number 1..65535");
    rule.port = static_cast<uint16_t>(*port);
  }
  if (target.empty()) return Invalid(entry, "no name or address");

  std::string_view host_part = target.substr(0, target.find('/'));
  bool looks_like_address = bracketed || target.find('/') != std::string_view::npos ||
                            target.find(':') != std::string_view::npos ||
                            ParseAddress(host_part).has_value();
  if (looks_like_address) {
    Result<Cidr> cidr = ParseCidr(target);
    if (!cidr.ok()) return Invalid(entry, cidr.status().what());
    if (bracketed && target.find(':') == std::string_view::npos)
      return Invalid(entry, "brackets are for IPv6 only");
    rule.kind = Rule::Kind::kCidr;
    rule.cidr = *cidr;
  } else if (target == "*") {
    rule.kind = Rule::Kind::kAnyName;
  } else {
    bool wildcard = target.starts_with("*.");
    std::string_view name_text = wildcard ? target.substr(2) : target;
    if (name_text.find('*') != std::string_view::npos)
      return Invalid(entry, "'*' is allowed only as \"*\" or a leading \"*.\"");
    std::optional<std::string> name = NormalizeName(name_text);
    if (!name)
      return Invalid(entry,
                     "not a valid name (labels of 1..63 letters, digits, '-' or '_', at most 253 "
                     "characters) nor an address");
    // A last label of digits only is no host name: "1.2.3.256" is a mistyped address.
    size_t last_dot = name->rfind('.');
    std::string_view tld = last_dot == std::string::npos
                               ? std::string_view(*name)
                               : std::string_view(*name).substr(last_dot + 1);
    if (std::all_of(tld.begin(), tld.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return Invalid(entry, "neither a valid address nor a name (its last label is a number)");
    rule.kind = wildcard ? Rule::Kind::kWildcard : Rule::Kind::kName;
    rule.name = *name;
  }
  if (rule.proto == Proto::kUdp) {
    if (rule.kind != Rule::Kind::kCidr)
      return Invalid(entry,
                     "UDP rules take an address or CIDR, not a name (\"198.18.0.0/15:53/udp\")");
    if (rule.port == 0) return Invalid(entry, "UDP rules need one port (\"198.18.0.0/15:53/udp\")");
  }

  // The normalised text: what the record keeps and what messages show.
  std::string shown;
  switch (rule.kind) {
    case Rule::Kind::kName:
      shown = rule.name;
      break;
    case Rule::Kind::kWildcard:
      shown = "*." + rule.name;
      break;
    case Rule::Kind::kAnyName:
      shown = "*";
      break;
    case Rule::Kind::kCidr: {
      bool whole = rule.cidr.prefix == (rule.cidr.base.is_v4() ? 32 : 128);
      shown = whole ? rule.cidr.base.to_string() : rule.cidr.ToString();
      if (rule.port != 0 && rule.cidr.base.is_v6()) shown = "[" + shown + "]";
      break;
    }
  }
  if (rule.port != 0) shown += ":" + std::to_string(rule.port);
  if (rule.proto == Proto::kUdp) shown += "/udp";
  rule.text = shown;
  return rule;
}

const std::vector<Cidr>& AlwaysDenied() {
  static const std::vector<Cidr> cidrs = [] {
    std::vector<Cidr> out;
    for (const DeniedRange& r : DeniedRanges()) out.push_back(r.cidr);
    return out;
  }();
  return cidrs;
}

std::optional<Cidr> AlwaysDeniedRange(const address& ip, const std::vector<Cidr>& opened) {
  std::optional<DeniedRange> r = DeniedRangeOf(ip, opened);
  if (!r) return std::nullopt;
  return r->cidr;
}

Policy::Decision Policy::Decide(const std::optional<std::string>& raw_name, const address& raw_ip,
                                uint16_t port, Proto proto,
                                const std::vector<Cidr>& opened_ranges) const {
  address ip = Unmap(raw_ip);
  if (std::optional<DeniedRange> r = DeniedRangeOf(ip, opened_ranges))
    return {false, std::string("always denied (") + r->what + " " + r->cidr.ToString() + ")"};
  if (mode == Mode::kNone) return {false, "the network policy is none"};
  std::optional<std::string> name;
  if (raw_name) name = NormalizeName(*raw_name);
  for (const Rule& rule : allow)
    if (Matches(rule, name, ip, port, proto)) return {true, "allowed by rule " + rule.text};
  if (proto == Proto::kUdp) return {false, "UDP needs an explicit CIDR:port/udp rule"};
  if (mode == Mode::kAllowlist) return {false, "not in the allowlist"};
  for (const Rule& rule : deny)
    if (Matches(rule, name, ip, port, proto)) return {false, "denied by rule " + rule.text};
  return {true, "open"};
}

bool Policy::NameMayResolve(std::string_view raw) const {
  std::optional<std::string> name = NormalizeName(raw);
  if (!name || mode == Mode::kNone) return false;
  for (const Rule& rule : allow)
    if (IsNameRule(rule) && NameMatches(rule, *name)) return true;
  if (mode != Mode::kOpen) return false;
  // Only a deny rule for every port keeps a name from resolving: "evil.test:25" still lets
  // evil.test resolve for its other ports.
  for (const Rule& rule : deny)
    if (IsNameRule(rule) && rule.port == 0 && NameMatches(rule, *name)) return false;
  return true;
}

bool Policy::AllowsName(std::string_view raw, uint16_t port) const {
  std::optional<std::string> name = NormalizeName(raw);
  if (!name || mode == Mode::kNone) return false;
  for (const Rule& rule : allow)
    if (IsNameRule(rule) && rule.proto == Proto::kTcp && (rule.port == 0 || rule.port == port) &&
        NameMatches(rule, *name))
      return true;
  return false;
}

std::string Policy::ToJson() const {
  nlohmann::json j = {{"mode", ModeName(mode)},
                      {"allow", nlohmann::json::array()},
                      {"deny", nlohmann::json::array()}};
  for (const Rule& r : allow) j["allow"].push_back(r.text);
  for (const Rule& r : deny) j["deny"].push_back(r.text);
  return j.dump();
}

Result<Policy> Policy::FromJson(std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Error("network policy: not valid JSON", EINVAL);
  if (!j.is_object()) return Status::Error("network policy: not a JSON object", EINVAL);
  for (const auto& [key, value] : j.items()) {
    (void)value;
    if (key != "mode" && key != "allow" && key != "deny")
      return Status::Error("network policy: unknown field \"" + key.substr(0, 64) + "\"", EINVAL);
  }
  Policy p;
  for (const char* field : {"allow", "deny"}) {
    if (!j.contains(field) || j[field].is_null()) continue;
    const nlohmann::json& list = j[field];
    if (!list.is_array())
      return Status::Error(std::string("network policy: \"") + field + "\" is not an array",
                           EINVAL);
    if (list.size() > kMaxRules)
      return Status::Error(std::string("network policy: \"") + field + "\" has more than " +
                               std::to_string(kMaxRules) + " entries",
                           EINVAL);
    std::vector<Rule>& rules = std::string_view(field) == "allow" ? p.allow : p.deny;
    for (size_t i = 0; i < list.size(); ++i) {
      std::string where = std::string("network policy: ") + field + "[" + std::to_string(i) + "]";
      if (!list[i].is_string()) return Status::Error(where + " is not a string", EINVAL);
      Result<Rule> rule = ParseRule(list[i].get<std::string>());
      if (!rule.ok()) return rule.status().Wrap(where);
      rules.push_back(std::move(*rule));
    }
  }
  if (j.contains("mode") && !j["mode"].is_null()) {
    if (!j["mode"].is_string())
      return Status::Error("network policy: \"mode\" is not a string", EINVAL);
    Result<Mode> mode = ParseMode(j["mode"].get<std::string>());
    if (!mode.ok()) return mode.status().Wrap("network policy");
    p.mode = *mode;
  } else {
    p.mode = j.contains("allow") && j["allow"].is_array() ? Mode::kAllowlist : Mode::kNone;
  }
  return p;
}

std::string Policy::Describe() const {
  // Bounded: it goes into a 403 body and a log line, and a policy may hold 2 x 256 entries.
  constexpr size_t kShown = 8;
  auto list = [&](const std::vector<Rule>& rules) {
    std::string out;
    for (size_t i = 0; i < rules.size() && i < kShown; ++i) out += (i ? ", " : "") + rules[i].text;
    if (rules.size() > kShown) out += ", ... (" + std::to_string(rules.size() - kShown) + " more)";
    return out;
  };
  switch (mode) {
    case Mode::kNone:
      return "none";
    case Mode::kAllowlist:
      return allow.empty() ? "allowlist: nothing" : "allowlist: " + list(allow);
    case Mode::kOpen: {
      std::string out = "open";
      if (!deny.empty()) out += ", deny: " + list(deny);
      if (!allow.empty()) out += ", allow: " + list(allow);
      return out;
    }
  }
  return "none";
}

}  // namespace sbx::network
