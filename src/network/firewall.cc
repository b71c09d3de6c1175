#include "network/firewall.h"

#include <arpa/inet.h>
#include <libmnl/libmnl.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_conntrack.h>
#include <netinet/in.h>
#include <nftables/libnftables.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <utility>

#include "common/fd.h"

namespace sbx::network {
namespace {

constexpr char kBoxChainPrefix[] = "box-";

// Everything interpolated into an nft command is checked against one of these first, so no
// input can close a quote or add a statement.
bool ValidName(const std::string& s, size_t max, bool upper_dot) {
  if (s.empty() || s.size() > max) return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
              (upper_dot && ((c >= 'A' && c <= 'Z') || c == '_' || c == '.'));
    if (!ok) return false;
  }
  return true;
}
bool ValidBoxId(const std::string& id) { return ValidName(id, 64, false); }
bool ValidIfname(const std::string& n) { return ValidName(n, 15, true); }  // IFNAMSIZ - 1
bool ValidTable(const std::string& t) {
  if (t.empty() || t.size() > 64) return false;
  return std::all_of(t.begin(), t.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

ino_t CurrentNetns() {
  struct stat st {};
  if (stat("/proc/thread-self/ns/net", &st) != 0) return 0;
  return st.st_ino;
}

__extension__ typedef unsigned __int128 U128;  // addresses of both families
struct Range {
  U128 lo, hi;
};

U128 ToInt(const address& a) {
  if (a.is_v4()) return a.to_v4().to_uint();
  U128 v = 0;
  for (unsigned char b : a.to_v6().to_bytes()) v = (v << 8) | b;
  return v;
}

std::string FromInt(U128 v, bool v6) {
  if (!v6) return boost::asio::ip::address_v4(static_cast<uint32_t>(v)).to_string();
  boost::asio::ip::address_v6::bytes_type bytes;
  for (int i = 15; i >= 0; --i) {
    bytes[i] = static_cast<unsigned char>(v & 0xff);
    v >>= 8;
  }
  return boost::asio::ip::address_v6(bytes).to_string();
}

Range ToRange(const Cidr& c) {
  int bits = c.base.is_v4() ? 32 : 128;
  int host = bits - c.prefix;
  U128 mask = host >= 128 ? ~U128{0} : ((U128{1} << host) - 1);
  U128 lo = ToInt(c.base) & ~mask;
  return {lo, lo | mask};
}

// Sorted, with overlapping and adjacent ranges joined.
std::vector<Range> Merge(std::vector<Range> in) {
  std::sort(in.begin(), in.end(), [](const Range& a, const Range& b) { return a.lo < b.lo; });
  std::vector<Range> out;
  for (const Range& r : in) {
    if (!out.empty() && (r.lo <= out.back().hi || r.lo == out.back().hi + 1)) {
      out.back().hi = std::max(out.back().hi, r.hi);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

std::string Quote(const std::string& s) { return "\"" + s + "\""; }

// The UDP entries of a policy, one nft rule body each ("ip daddr 1.2.3.0/24 udp dport 53").
std::vector<std::string> UdpRules(const Policy& policy, bool ipv6) {
  std::vector<std::string> out;
  if (policy.mode == Mode::kNone) return out;  // `none` refuses everything, allow entries included
  for (const Rule& r : policy.allow) {
    if (r.proto != Proto::kUdp || r.kind != Rule::Kind::kCidr || r.port == 0) continue;
    bool v6 = r.cidr.base.is_v6();
    if (v6 && !ipv6) continue;
    out.push_back(std::string(v6 ? "ip6" : "ip") + " daddr " + r.cidr.ToString() + " udp dport " +
                  std::to_string(r.port));
  }
  return out;
}

// What the table holds for boxes, read back from it (the table is the only record, so a restart
// finds what a previous run made).
struct TableState {
  std::set<std::string> chains;
  std::map<std::string, std::string> iface_chain;  // box_chains: ifname -> chain it jumps to
  std::set<std::string> ifaces;
  std::vector<std::pair<std::string, std::string>> src4, src6;  // ifname . address
  std::set<std::string> addrs4, addrs6;
};

Result<TableState> ParseState(const std::string& json_text) try {
  auto doc = nlohmann::json::parse(json_text, nullptr, false);
  if (doc.is_discarded() || !doc.contains("nftables") || !doc["nftables"].is_array())
    return Status::Error("firewall: unreadable listing of the table", EIO);
  TableState st;
  for (const auto& o : doc["nftables"]) {
    if (o.contains("chain")) {
      st.chains.insert(o["chain"].value("name", ""));
      continue;
    }
    const nlohmann::json* set = o.contains("set")   ? &o["set"]
                                : o.contains("map") ? &o["map"]
                                                    : nullptr;
    if (!set || !set->contains("elem") || !(*set)["elem"].is_array()) continue;
    std::string name = set->value("name", "");
    for (const auto& e : (*set)["elem"]) {
      if (name == "box_chains" && e.is_array() && e.size() == 2 && e[0].is_string()) {
        const auto& v = e[1];
        if (v.contains("jump") && v["jump"].contains("target"))
          st.iface_chain[e[0].get<std::string>()] = v["jump"]["target"].get<std::string>();
      } else if (name == "ifaces" && e.is_string()) {
        st.ifaces.insert(e.get<std::string>());
      } else if ((name == "src4" || name == "src6") && e.contains("concat") &&
                 e["concat"].is_array() && e["concat"].size() == 2) {
        (name == "src4" ? st.src4 : st.src6)
            .emplace_back(e["concat"][0].get<std::string>(), e["concat"][1].get<std::string>());
      } else if ((name == "addrs4" || name == "addrs6") && e.is_string()) {
        (name == "addrs4" ? st.addrs4 : st.addrs6).insert(e.get<std::string>());
      }
    }
  }
  return st;
} catch (const nlohmann::json::exception& e) {  // a field of an unexpected type
  return Status::Error(std::string("firewall: unreadable listing of the table: ") + e.what(), EIO);
}

// The commands that take interfaces `gone` out of every set, from what `st` says they hold. An
// address stays in addrs4/addrs6 while an interface not in `gone` still holds it.
std::string RemoveInterfaces(const TableState& st, const std::set<std::string>& gone,
                             const std::string& t) {
  std::string b;
  for (bool six : {false, true}) {
    std::set<std::string> kept, dropped;
    for (const auto& [i, a] : six ? st.src6 : st.src4) {
      boost::system::error_code ec;
      auto parsed = boost::asio::ip::make_address(a, ec);
      if (ec || !ValidIfname(i)) continue;  // not ours to name in a command
      std::string ad = parsed.to_string();
      if (!gone.count(i)) {
        kept.insert(ad);
        continue;
      }
      b += "delete element " + t + (six ? " src6" : " src4") + " { " + Quote(i) + " . " + ad +
           " }\n";
      dropped.insert(ad);
    }
    for (const auto& ad : dropped)
      if (!kept.count(ad) && (six ? st.addrs6 : st.addrs4).count(ad))
        b += "delete element " + t + (six ? " addrs6" : " addrs4") + " { " + ad + " }\n";
  }
  for (const std::string& i : gone) {
    if (!ValidIfname(i)) continue;
    if (st.iface_chain.count(i)) b += "delete element " + t + " box_chains { " + Quote(i) + " }\n";
    if (st.ifaces.count(i)) b += "delete element " + t + " ifaces { " + Quote(i) + " }\n";
  }
  return b;
}
}  // namespace

namespace {

// `denied` minus `open`, both merged.
std::vector<Range> Subtract(const std::vector<Range>& denied, const std::vector<Range>& open) {
  std::vector<Range> left;
  for (Range d : denied) {
    bool consumed = false;
    for (const Range& o : open) {
      if (o.hi < d.lo || o.lo > d.hi) continue;
      if (o.lo > d.lo) left.push_back({d.lo, o.lo - 1});
      if (o.hi >= d.hi) {
        consumed = true;
        break;
      }
      d.lo = o.hi + 1;
    }
    if (!consumed) left.push_back(d);
  }
  return left;
}

std::vector<Range> Denied(bool v6, const std::vector<Cidr>& opened) {
  std::vector<Range> denied, open;
  for (const Cidr& c : AlwaysDenied())
    if (c.base.is_v6() == v6) denied.push_back(ToRange(c));
  for (const Cidr& c : opened)
    if (c.base.is_v6() == v6) open.push_back(ToRange(c));
  std::vector<Range> left = Subtract(Merge(std::move(denied)), Merge(std::move(open)));
  if (v6) {
    // The IPv4 ranges again in the IPv6 spellings that carry an IPv4 address (the policy judges
    // those as the address inside): v4-mapped, NAT64 64:ff9b::/96 and 6to4 2002:AABB:CCDD::/48.
    const U128 mapped = U128{0xffff} << 32, nat64 = U128{0x0064ff9b} << 96;
    const U128 six_to_four = U128{0x2002} << 112, low80 = (U128{1} << 80) - 1;
    for (const Range& r : Denied(false, opened)) {
      left.push_back({mapped | r.lo, mapped | r.hi});
      left.push_back({nat64 | r.lo, nat64 | r.hi});
      left.push_back({six_to_four | (r.lo << 80), six_to_four | (r.hi << 80) | low80});
    }
    left = Merge(std::move(left));
  }
  return left;
}

}  // namespace

std::vector<std::string> DeniedRanges(bool v6, const std::vector<Cidr>& opened) {
  std::vector<std::string> out;
  for (const Range& r : Denied(v6, opened))
    out.push_back(r.lo == r.hi ? FromInt(r.lo, v6) : FromInt(r.lo, v6) + "-" + FromInt(r.hi, v6));
  return out;
}

namespace {

// Runs `commands` (one transaction) on `ctx`; its output, or libnftables' error buffer.
Result<std::string> RunOn(nft_ctx* ctx, const std::string& commands, bool json_output) {
  nft_ctx_output_set_flags(ctx, json_output ? NFT_CTX_OUTPUT_JSON : 0);
  int rc = nft_run_cmd_from_buffer(ctx, commands.c_str());
  std::string out = nft_ctx_get_output_buffer(ctx);
  std::string err = nft_ctx_get_error_buffer(ctx);
  if (rc == 0) return out;
  // libnftables reports the kernel's errno only as text; the common one is worth a code.
  int code = err.find("No such file or directory") != std::string::npos ? ENOENT : EIO;
  while (!err.empty() && (err.back() == '\n' || err.back() == ' ')) err.pop_back();
  if (err.size() > 2000) err = err.substr(0, 2000) + "...";
  return Status::Error("nftables: " + (err.empty() ? std::string("failed") : err), code);
}

// One command on a context of its own (for the free functions below).
Result<std::string> RunOnce(const std::string& command, bool json_output) {
  nft_ctx* ctx = nft_ctx_new(NFT_CTX_DEFAULT);
  if (!ctx) return Status::Error("firewall: nft_ctx_new failed", ENOMEM);
  std::unique_ptr<nft_ctx, void (*)(nft_ctx*)> owner(ctx, nft_ctx_free);
  if (nft_ctx_buffer_output(ctx) != 0 || nft_ctx_buffer_error(ctx) != 0)
    return Status::Error("firewall: libnftables output buffers", ENOMEM);
  return RunOn(ctx, command, json_output);
}

}  // namespace

// ---- conntrack (ctnetlink through libmnl; no `conntrack` subprocess) ----

namespace {

// One flow's original tuple, as ctnetlink gives it and takes it back to delete it.
struct CtFlow {
  uint8_t family = AF_INET;
  std::array<uint8_t, 16> src{}, dst{};
  uint16_t sport = 0, dport = 0;  // network order
  std::optional<uint16_t> zone;   // network order
  uint8_t proto = 0;
};

address ToAddress(uint8_t family, const std::array<uint8_t, 16>& b) {
  if (family == AF_INET) {
    boost::asio::ip::address_v4::bytes_type v4;
    std::copy(b.begin(), b.begin() + 4, v4.begin());
    return boost::asio::ip::address_v4(v4);
  }
  boost::asio::ip::address_v6::bytes_type v6;
  std::copy(b.begin(), b.end(), v6.begin());
  return boost::asio::ip::address_v6(v6);
}

// Attributes of one nest (or message) by type, up to `kMaxCtAttr`. (libmnl's iteration macros
// assign void* and do not compile as C++: its callbacks instead.)
constexpr int kMaxCtAttr = 32;
using CtAttrs = std::array<const nlattr*, kMaxCtAttr + 1>;
int CollectAttr(const nlattr* a, void* data) {
  int type = mnl_attr_get_type(a);
  if (type <= kMaxCtAttr) (*static_cast<CtAttrs*>(data))[type] = a;
  return MNL_CB_OK;
}
CtAttrs Nested(const nlattr* nest) {
  CtAttrs tb{};
  if (nest) (void)mnl_attr_parse_nested(nest, CollectAttr, &tb);
  return tb;
}

// Reads the original tuple of one conntrack message; false when it is not one we can use.
bool ParseFlow(const nlmsghdr* nlh, CtFlow* f) {
  const auto* nfg = static_cast<const nfgenmsg*>(mnl_nlmsg_get_payload(nlh));
  f->family = nfg->nfgen_family;
  CtAttrs top{};
  if (mnl_attr_parse(nlh, sizeof(nfgenmsg), CollectAttr, &top) < 0) return false;
  if (top[CTA_ZONE] && mnl_attr_get_payload_len(top[CTA_ZONE]) >= 2)
    f->zone = mnl_attr_get_u16(top[CTA_ZONE]);
  if (!top[CTA_TUPLE_ORIG]) return false;
  CtAttrs tuple = Nested(top[CTA_TUPLE_ORIG]);
  CtAttrs ip = Nested(tuple[CTA_TUPLE_IP]);
  CtAttrs proto = Nested(tuple[CTA_TUPLE_PROTO]);
  const size_t len = f->family == AF_INET ? 4 : 16;
  const nlattr* src = ip[f->family == AF_INET ? CTA_IP_V4_SRC : CTA_IP_V6_SRC];
  const nlattr* dst = ip[f->family == AF_INET ? CTA_IP_V4_DST : CTA_IP_V6_DST];
  if (!src || !dst || mnl_attr_get_payload_len(src) != len || mnl_attr_get_payload_len(dst) != len)
    return false;
  std::memcpy(f->src.data(), mnl_attr_get_payload(src), len);
  std::memcpy(f->dst.data(), mnl_attr_get_payload(dst), len);
  if (!proto[CTA_PROTO_NUM] || mnl_attr_get_payload_len(proto[CTA_PROTO_NUM]) < 1) return false;
  f->proto = mnl_attr_get_u8(proto[CTA_PROTO_NUM]);
  for (auto [type, port] :
       {std::pair{CTA_PROTO_SRC_PORT, &f->sport}, std::pair{CTA_PROTO_DST_PORT, &f->dport}})
    if (proto[type] && mnl_attr_get_payload_len(proto[type]) >= 2)
      *port = mnl_attr_get_u16(proto[type]);
  return true;
}

struct MnlSocket {
  mnl_socket* nl = nullptr;
  ~MnlSocket() {
    if (nl) mnl_socket_close(nl);
  }
};

nlmsghdr* CtHeader(char* buf, uint16_t type, uint16_t flags, uint8_t family, uint32_t seq) {
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = (NFNL_SUBSYS_CTNETLINK << 8) | type;
  nlh->nlmsg_flags = NLM_F_REQUEST | flags;
  nlh->nlmsg_seq = seq;
  auto* nfg = static_cast<nfgenmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(nfgenmsg)));
  nfg->nfgen_family = family;
  nfg->version = NFNETLINK_V0;
  nfg->res_id = 0;
  return nlh;
}

}  // namespace

Result<int> FlushDisallowedUdpFlows(const std::vector<address>& box_ips, const Policy& policy,
                                    const std::vector<Cidr>& opened) {
  MnlSocket s;
  s.nl = mnl_socket_open2(NETLINK_NETFILTER, SOCK_CLOEXEC);
  if (!s.nl) return Status::Errno("conntrack: netlink socket");
  if (mnl_socket_bind(s.nl, 0, MNL_SOCKET_AUTOPID) < 0) return Status::Errno("conntrack: bind");
  const uint32_t portid = mnl_socket_get_portid(s.nl);
  std::vector<char> buf(1 << 16);
  std::vector<CtFlow> doomed;
  uint32_t seq = static_cast<uint32_t>(time(nullptr));
  for (uint8_t family : {uint8_t{AF_INET}, uint8_t{AF_INET6}}) {
    std::vector<address> mine;
    for (const address& a : box_ips)
      if (a.is_v4() == (family == AF_INET)) mine.push_back(a);
    if (mine.empty()) continue;
    nlmsghdr* nlh = CtHeader(buf.data(), IPCTNL_MSG_CT_GET, NLM_F_DUMP, family, ++seq);
    if (mnl_socket_sendto(s.nl, nlh, nlh->nlmsg_len) < 0) return Status::Errno("conntrack: dump");
    struct Ctx {
      const std::vector<address>* mine;
      const Policy* policy;
      const std::vector<Cidr>* opened;
      std::vector<CtFlow>* doomed;
    } ctx{&mine, &policy, &opened, &doomed};
    for (;;) {
      ssize_t n = mnl_socket_recvfrom(s.nl, buf.data(), buf.size());
      if (n < 0) return Status::Errno("conntrack: read the dump");
      int r = mnl_cb_run(
          buf.data(), static_cast<size_t>(n), seq, portid,
          [](const nlmsghdr* m, void* data) {
            auto* c = static_cast<Ctx*>(data);
            CtFlow f;
            if (!ParseFlow(m, &f) || f.proto != IPPROTO_UDP) return MNL_CB_OK;
            address src = ToAddress(f.family, f.src), dst = ToAddress(f.family, f.dst);
            if (std::find(c->mine->begin(), c->mine->end(), src) == c->mine->end())
              return MNL_CB_OK;
            uint16_t dport = ntohs(f.dport);
            // DNS is redirected to sbx's resolver whatever the policy: not a forwarded flow.
            if (dport == 53) return MNL_CB_OK;
            if (!c->policy->Decide(std::nullopt, dst, dport, Proto::kUdp, *c->opened).allowed)
              c->doomed->push_back(f);
            return MNL_CB_OK;
          },
          &ctx);
      if (r == MNL_CB_ERROR) return Status::Errno("conntrack: dump");
      if (r <= MNL_CB_STOP) break;
    }
  }
  int deleted = 0;
  for (const CtFlow& f : doomed) {
    nlmsghdr* nlh = CtHeader(buf.data(), IPCTNL_MSG_CT_DELETE, NLM_F_ACK, f.family, ++seq);
    nlattr* tuple = mnl_attr_nest_start(nlh, CTA_TUPLE_ORIG);
    nlattr* ip = mnl_attr_nest_start(nlh, CTA_TUPLE_IP);
    size_t len = f.family == AF_INET ? 4 : 16;
    mnl_attr_put(nlh, f.family == AF_INET ? CTA_IP_V4_SRC : CTA_IP_V6_SRC, len, f.src.data());
    mnl_attr_put(nlh, f.family == AF_INET ? CTA_IP_V4_DST : CTA_IP_V6_DST, len, f.dst.data());
    mnl_attr_nest_end(nlh, ip);
    nlattr* proto = mnl_attr_nest_start(nlh, CTA_TUPLE_PROTO);
    mnl_attr_put_u8(nlh, CTA_PROTO_NUM, f.proto);
    mnl_attr_put_u16(nlh, CTA_PROTO_SRC_PORT, f.sport);
    mnl_attr_put_u16(nlh, CTA_PROTO_DST_PORT, f.dport);
    mnl_attr_nest_end(nlh, proto);
    mnl_attr_nest_end(nlh, tuple);
    if (f.zone) mnl_attr_put_u16(nlh, CTA_ZONE, *f.zone);
    if (mnl_socket_sendto(s.nl, nlh, nlh->nlmsg_len) < 0)
      return Status::Errno("conntrack: delete a flow");
    ssize_t n = mnl_socket_recvfrom(s.nl, buf.data(), buf.size());
    if (n < 0) return Status::Errno("conntrack: delete a flow");
    int r = mnl_cb_run(buf.data(), static_cast<size_t>(n), seq, portid, nullptr, nullptr);
    if (r == MNL_CB_ERROR && errno != ENOENT) return Status::Errno("conntrack: delete a flow");
    if (r != MNL_CB_ERROR) ++deleted;  // ENOENT: it expired meanwhile
  }
  return deleted;
}

Result<std::vector<std::string>> ListTables(const std::string& prefix) {
  auto out = RunOnce("list tables inet", true);
  if (!out.ok()) return out.status().Wrap("firewall: list tables");
  nlohmann::json doc = nlohmann::json::parse(*out, nullptr, false);
  std::vector<std::string> names;
  if (doc.is_discarded() || !doc.contains("nftables") || !doc["nftables"].is_array())
    return names;  // no tables: libnftables prints nothing
  for (const auto& o : doc["nftables"]) {
    if (!o.is_object() || !o.contains("table") || !o["table"].is_object()) continue;
    std::string name = o["table"].value("name", "");
    if (name.rfind(prefix, 0) == 0) names.push_back(name);
  }
  return names;
}

Status DeleteTable(const std::string& table) {
  if (!ValidTable(table)) return Status::Error("firewall: bad table name '" + table + "'", EINVAL);
  auto out = RunOnce("delete table inet " + table, false);
  if (!out.ok() && out.status().err() != ENOENT)
    return out.status().Wrap("firewall: delete table " + table);
  return Status();
}

Result<std::unique_ptr<Firewall>> Firewall::Open(FirewallConfig config) {
  if (!ValidTable(config.table))
    return Status::Error("firewall: bad table name '" + config.table + "'", EINVAL);
  if (!config.box_ifname_prefix.empty() &&
      (config.box_ifname_prefix.size() > 12 || !ValidName(config.box_ifname_prefix, 12, false) ||
       config.box_ifname_prefix.find('-') != std::string::npos))
    return Status::Error("firewall: bad interface prefix '" + config.box_ifname_prefix + "'",
                         EINVAL);
  if (config.dns_port == 0 || config.proxy_port == 0 || config.dns_port == config.proxy_port)
    return Status::Error("firewall: the resolver's and the proxy's ports must be two ports",
                         EINVAL);
  ino_t netns = CurrentNetns();
  if (netns == 0) return Status::Errno("firewall: stat /proc/thread-self/ns/net");
  nft_ctx* ctx = nft_ctx_new(NFT_CTX_DEFAULT);
  if (!ctx) return Status::Error("firewall: nft_ctx_new failed", ENOMEM);
  if (nft_ctx_buffer_output(ctx) != 0 || nft_ctx_buffer_error(ctx) != 0) {
    nft_ctx_free(ctx);
    return Status::Error("firewall: libnftables output buffers", ENOMEM);
  }
  std::unique_ptr<Firewall> fw(new Firewall(std::move(config), ctx, netns));

  const FirewallConfig& c = fw->config_;
  const std::string t = fw->Family();
  const std::string dns = std::to_string(c.dns_port), proxy = std::to_string(c.proxy_port);
  std::string b;
  auto add = [&b](const std::string& line) { b += line + "\n"; };
  add("add table " + t);
  // Keyed by a box's interface (its addresses for the masquerade: postrouting has no input
  // interface). Declared with `add`, so an existing table keeps the boxes' elements.
  add("add set " + t + " ifaces { type ifname; }");
  add("add set " + t + " src4 { type ifname . ipv4_addr; }");
  add("add set " + t + " src6 { type ifname . ipv6_addr; }");
  add("add set " + t + " addrs4 { type ipv4_addr; }");
  add("add set " + t + " addrs6 { type ipv6_addr; }");
  add("add set " + t + " denied4 { type ipv4_addr; flags interval; }");
  add("add set " + t + " denied6 { type ipv6_addr; flags interval; }");
  add("add map " + t + " box_chains { type ifname : verdict; }");
  // Priority raw: before conntrack, so a spoofed packet never even makes an entry.
  add("add chain " + t +
      " prerouting { type filter hook prerouting priority raw; policy accept; }");
  add("add chain " + t +
      " nat_prerouting { type nat hook prerouting priority dstnat; policy accept; }");
  add("add chain " + t + " input { type filter hook input priority filter; policy accept; }");
  add("add chain " + t + " from_box");
  add("add chain " + t + " forward { type filter hook forward priority filter; policy accept; }");
  add("add chain " + t +
      " nat_postrouting { type nat hook postrouting priority srcnat; policy accept; }");
  for (const char* chain :
       {"prerouting", "nat_prerouting", "input", "from_box", "forward", "nat_postrouting"})
    add("flush chain " + t + " " + chain);

  const std::string pre = "add rule " + t + " prerouting ";
  const std::string unknown_box =
      c.box_ifname_prefix.empty() ? "" : Quote(c.box_ifname_prefix + "*");
  if (!unknown_box.empty())
    add(pre + "iifname " + unknown_box + " iifname != @ifaces counter drop");
  add(pre + "iifname != @ifaces return");
  if (c.ipv6) {
    // Neighbour discovery (from link-local or unspecified sources, so before the address check);
    // hop limit 255 proves it was not routed.
    add(pre + "icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } ip6 hoplimit 255 accept");
    add(pre + "iifname . ip6 saddr != @src6 counter drop");
  } else {
    add(pre + "meta nfproto ipv6 counter drop");
  }
  add(pre + "iifname . ip saddr != @src4 counter drop");
  add(pre + "meta pkttype != host counter drop");
  add(pre + "fib daddr type { broadcast, multicast, anycast } counter drop");

  const std::string nat = "add rule " + t + " nat_prerouting ";
  add(nat + "iifname != @ifaces return");
  add(nat + "meta l4proto { tcp, udp } th dport 53 redirect to :" + dns);
  add(nat + "meta l4proto tcp redirect to :" + proxy);

  // `ct status dnat`: the ports are reachable only through the redirection, so a box cannot
  // talk to them at an address of its choosing.
  const std::string in = "add rule " + t + " from_box ";
  add(in + "ct state established,related accept");
  add(in + "ct status dnat meta l4proto { tcp, udp } th dport " + dns + " accept");
  add(in + "ct status dnat tcp dport " + proxy + " accept");
  // Ping of the box's own gateway (the address of the interface it came in on) answers "is the
  // network up?"; rate-limited, and nothing further (forwarded ICMP is dropped).
  add(in + "icmp type echo-request fib daddr . iif type local limit rate 10/second accept");
  if (c.ipv6) {
    add(in + "icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } ip6 hoplimit 255 accept");
    add(in + "icmpv6 type echo-request fib daddr . iif type local limit rate 10/second accept");
  }
  add(in + "counter drop");
  add("add rule " + t + " input iifname @ifaces jump from_box");
  // Other hosts never reach the resolver or the proxy. The host's own processes (loopback) may,
  // never as a box (a box's source address leaving the host is masqueraded, below): the table
  // outlives the daemon for its boxes, and a drop of ports a dead daemon no longer holds would
  // swallow the SYNs of whatever binds them next.
  add("add rule " + t + " input iif != lo meta l4proto { tcp, udp } th dport { " + dns + ", " +
      proxy + " } counter drop");

  const std::string fwd = "add rule " + t + " forward ";
  add(fwd + "oifname @ifaces ct state established,related accept");
  add(fwd + "oifname @ifaces counter drop");
  if (!unknown_box.empty()) add(fwd + "oifname " + unknown_box + " counter drop");
  add(fwd + "iifname vmap @box_chains");
  add(fwd + "iifname @ifaces counter drop");

  const std::string post = "add rule " + t + " nat_postrouting ";
  add(post + "ip saddr @addrs4 oifname != @ifaces masquerade");
  if (c.ipv6) add(post + "ip6 saddr @addrs6 oifname != @ifaces masquerade");

  for (bool v6 : {false, true}) {
    std::string set = v6 ? "denied6" : "denied4";
    add("flush set " + t + " " + set);
    std::vector<std::string> ranges = DeniedRanges(v6, c.opened_ranges);
    std::string elems;
    for (const auto& r : ranges) elems += (elems.empty() ? "" : ", ") + r;
    if (!elems.empty()) add("add element " + t + " " + set + " { " + elems + " }");
  }

  MutexLock lock(fw->mu_);
  auto run = fw->Run(b);
  if (!run.ok()) return run.status().Wrap("firewall: open table " + c.table);
  return fw;
}

Firewall::Firewall(FirewallConfig config, nft_ctx* ctx, ino_t netns)
    : config_(std::move(config)), netns_(netns), ctx_(ctx) {}

Firewall::~Firewall() { nft_ctx_free(ctx_); }

Status Firewall::CheckNetns() const {
  if (CurrentNetns() != netns_)
    return Status::Error("firewall: called from another network namespace than Open's", EXDEV);
  return Status();
}

Result<std::string> Firewall::Run(const std::string& commands, bool json_output) {
  return RunOn(ctx_, commands, json_output);
}

Status Firewall::EnableForwarding(bool v6) {
  bool& done = v6 ? forwarding6_ : forwarding4_;
  if (done) return Status();
  // /proc/sys/net is the opener's namespace's, which CheckNetns made Open's.
  const std::string path =
      v6 ? "/proc/sys/net/ipv6/conf/all/forwarding" : "/proc/sys/net/ipv4/ip_forward";
  auto cur = ReadFile(path, 16);
  if (!cur.ok()) return cur.status().Wrap("firewall: turn on forwarding");
  bool already = cur->rfind("1", 0) == 0;
  if (!already) SBX_RETURN_IF_ERROR(WriteFile(path, "1\n").Wrap("firewall: turn on forwarding"));
  done = true;
  if (!already)
    spdlog::warn(
        "firewall: turned on {} forwarding in sbx's network namespace (a box has a UDP "
        "rule); sbx's table forwards only boxes' allowed UDP, other interfaces' "
        "forwarding is up to the host's own firewall",
        v6 ? "IPv6" : "IPv4");
  return Status();
}

Status Firewall::AddBox(const std::string& box_id, const std::string& ifname,
                        const std::vector<address>& box_ips, const Policy& policy) {
  if (!ValidBoxId(box_id)) return Status::Error("firewall: bad box id '" + box_id + "'", EINVAL);
  if (!ValidIfname(ifname))
    return Status::Error("firewall: box " + box_id + ": bad interface name", EINVAL);
  std::vector<std::string> v4, v6;
  for (const address& a : box_ips) {
    if (a.is_unspecified() || a.is_multicast() || a.is_loopback())
      return Status::Error("firewall: box " + box_id + ": bad address " + a.to_string(), EINVAL);
    if (a.is_v4()) {
      v4.push_back(a.to_string());
    } else if (config_.ipv6) {
      v6.push_back(a.to_string());
    }
  }
  if (v4.size() != 1)
    return Status::Error("firewall: box " + box_id + ": needs exactly one IPv4 address", EINVAL);
  SBX_RETURN_IF_ERROR(CheckNetns());
  MutexLock lock(mu_);
  auto listing = Run("list table " + Family(), true);
  if (!listing.ok()) return listing.status().Wrap("firewall: add box " + box_id);
  auto st = ParseState(*listing);
  if (!st.ok()) return st.status();

  const std::string t = Family(), chain = kBoxChainPrefix + box_id;
  std::string b;
  auto add = [&b](const std::string& line) { b += line + "\n"; };
  // What this box held before (a second AddBox), and what another box held on this interface.
  std::set<std::string> old_ifaces{ifname};
  for (const auto& [i, target] : st->iface_chain)
    if (target == chain) old_ifaces.insert(i);
  b += RemoveInterfaces(*st, old_ifaces, t);
  add("add chain " + t + " " + chain);
  add("flush chain " + t + " " + chain);
  std::vector<std::string> udp = UdpRules(policy, config_.ipv6);
  add("add rule " + t + " " + chain + " ip daddr @denied4 counter drop");
  add("add rule " + t + " " + chain + " ip6 daddr @denied6 counter drop");
  for (const auto& r : udp) add("add rule " + t + " " + chain + " " + r + " accept");
  add("add rule " + t + " " + chain + " counter drop");
  add("add element " + t + " ifaces { " + Quote(ifname) + " }");
  for (const auto& a : v4) {
    add("add element " + t + " src4 { " + Quote(ifname) + " . " + a + " }");
    add("add element " + t + " addrs4 { " + a + " }");
  }
  for (const auto& a : v6) {
    add("add element " + t + " src6 { " + Quote(ifname) + " . " + a + " }");
    add("add element " + t + " addrs6 { " + a + " }");
  }
  add("add element " + t + " box_chains { " + Quote(ifname) + " : jump " + chain + " }");
  auto run = Run(b);
  if (!run.ok()) return run.status().Wrap("firewall: add box " + box_id);
  for (const auto& r : udp) SBX_RETURN_IF_ERROR(EnableForwarding(r.rfind("ip6 ", 0) == 0));
  return Status();
}

Status Firewall::UpdateBox(const std::string& box_id, const Policy& policy) {
  if (!ValidBoxId(box_id)) return Status::Error("firewall: bad box id '" + box_id + "'", EINVAL);
  SBX_RETURN_IF_ERROR(CheckNetns());
  MutexLock lock(mu_);
  const std::string t = Family(), chain = kBoxChainPrefix + box_id;
  std::vector<std::string> udp = UdpRules(policy, config_.ipv6);
  // `flush chain` fails on a missing chain, so the whole batch does: no chain is made here.
  std::string b = "flush chain " + t + " " + chain + "\n";
  b += "add rule " + t + " " + chain + " ip daddr @denied4 counter drop\n";
  b += "add rule " + t + " " + chain + " ip6 daddr @denied6 counter drop\n";
  for (const auto& r : udp) b += "add rule " + t + " " + chain + " " + r + " accept\n";
  b += "add rule " + t + " " + chain + " counter drop\n";
  auto run = Run(b);
  if (!run.ok()) return run.status().Wrap("firewall: update box " + box_id);
  for (const auto& r : udp) SBX_RETURN_IF_ERROR(EnableForwarding(r.rfind("ip6 ", 0) == 0));
  // Replies of a flow the new policy no longer allows would still pass as `established` until
  // conntrack forgets it: the box's flows are deleted now (its addresses: the table's record).
  auto listing = Run("list table " + t, true);
  if (!listing.ok()) return listing.status().Wrap("firewall: update box " + box_id);
  auto st = ParseState(*listing);
  if (!st.ok()) return st.status();
  std::vector<address> ips;
  for (const auto& [i, target] : st->iface_chain) {
    if (target != chain) continue;
    for (const auto* src : {&st->src4, &st->src6})
      for (const auto& [ifname, a] : *src) {
        boost::system::error_code ec;
        address ip = boost::asio::ip::make_address(a, ec);
        if (ifname == i && !ec) ips.push_back(ip);
      }
  }
  auto flushed = FlushDisallowedUdpFlows(ips, policy, config_.opened_ranges);
  if (!flushed.ok()) return flushed.status().Wrap("firewall: update box " + box_id);
  if (*flushed > 0)
    spdlog::debug("firewall: box {}: {} UDP flow(s) the new policy refuses ended", box_id,
                  *flushed);
  return Status();
}

Status Firewall::RemoveBox(const std::string& box_id) {
  if (!ValidBoxId(box_id)) return Status::Error("firewall: bad box id '" + box_id + "'", EINVAL);
  SBX_RETURN_IF_ERROR(CheckNetns());
  MutexLock lock(mu_);
  auto listing = Run("list table " + Family(), true);
  if (!listing.ok()) {
    if (listing.status().err() == ENOENT) return Status();  // no table: nothing of the box left
    return listing.status().Wrap("firewall: remove box " + box_id);
  }
  auto st = ParseState(*listing);
  if (!st.ok()) return st.status();
  const std::string t = Family(), chain = kBoxChainPrefix + box_id;
  std::string b;
  auto add = [&b](const std::string& line) { b += line + "\n"; };
  std::set<std::string> gone;
  for (const auto& [i, target] : st->iface_chain)
    if (target == chain) gone.insert(i);
  b += RemoveInterfaces(*st, gone, t);
  if (st->chains.count(chain)) add("delete chain " + t + " " + chain);
  if (b.empty()) return Status();
  auto run = Run(b);
  if (!run.ok()) return run.status().Wrap("firewall: remove box " + box_id);
  return Status();
}

Result<std::vector<std::string>> Firewall::Boxes() {
  SBX_RETURN_IF_ERROR(CheckNetns());
  MutexLock lock(mu_);
  auto listing = Run("list table " + Family(), true);
  if (!listing.ok()) return listing.status().Wrap("firewall: list boxes");
  auto st = ParseState(*listing);
  if (!st.ok()) return st.status();
  std::vector<std::string> ids;
  const std::string prefix = kBoxChainPrefix;
  for (const auto& c : st->chains)
    if (c.rfind(prefix, 0) == 0) ids.push_back(c.substr(prefix.size()));
  return ids;
}

Result<std::string> Firewall::Ruleset() {
  SBX_RETURN_IF_ERROR(CheckNetns());
  MutexLock lock(mu_);
  auto listing = Run("list table " + Family());
  if (!listing.ok()) return listing.status().Wrap("firewall: list table");
  return listing;
}

}  // namespace sbx::network
