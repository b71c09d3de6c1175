// Firewall: the kernel's half of every box's network policy (issue 12 item 2; threats.md rows 34,
// 35 and 37; docs/network.md "Firewall"). One nftables table (family inet) owned by sbx holds
// what all boxes share (base chains, and sets keyed by a box's interface); each box adds one
// chain, "box-<id>", with the UDP its policy allows, and its interface and addresses to the sets.
// For traffic from a box interface:
//   - a source that is not the box's own address is dropped before conntrack sees it: the DNS
//     resolver and the egress proxy identify the box by its source address;
//   - TCP and UDP to port 53 (any destination) are redirected to sbx's resolver, every other TCP
//     to sbx's egress proxy, which decides by the policy (always-denied ranges, the host's other
//     ports and other boxes included);
//   - to the host itself only those two redirected ports, replies, and ping of the box's gateway;
//   - forwarded only: UDP that a `CIDR:port/udp` allow entry permits and that is not to an
//     always-denied range, masqueraded on the way out;
//   - IPv6 (unless FirewallConfig::ipv6), broadcast and multicast: dropped.
// Nothing reaches a box interface from elsewhere but replies; the resolver's and the proxy's ports
// are refused from every interface that is not a box's.
//
// Every change is one libnftables batch, so a failure or a crash leaves the table as it was. The
// table outlives the process (boxes keep running across a daemon restart): Open adopts it and
// Boxes() lists the chains of boxes so the owner can remove those that are gone.
//
// libnftables and /proc/sys/net act on the network namespace of the calling thread: every call
// must come from a thread in the namespace Open was called in (checked: EXDEV otherwise).
// Thread-safe.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "network/policy.h"

struct nft_ctx;

namespace sbx::network {

struct FirewallConfig {
  std::string table = "sbx";        // the inet table sbx owns; [a-z0-9_-], up to 64 characters
  uint16_t dns_port = 0;            // sbx's resolver: where port 53 is redirected
  uint16_t proxy_port = 0;          // sbx's egress proxy: where every other TCP is redirected
  bool ipv6 = false;                // --ipv6; off: every IPv6 packet from a box is dropped
  std::vector<Cidr> opened_ranges;  // --allow-range: cut out of the always-denied ranges
  // How the host ends of boxes' veths are named ("sbx" for sbx0, sbx1...; [a-z0-9], up to 12).
  // Set: an interface so named that has no box (before AddBox, after RemoveBox) passes nothing,
  // so the order of veth and firewall steps opens no window. Empty: no such rule.
  std::string box_ifname_prefix;
};

class Firewall {
 public:
  // Makes the table, its sets and its base chains, or adopts them: the base chains are rebuilt
  // from `config` in one batch while the boxes' chains and set elements stay. EINVAL for a bad
  // config; the libnftables error otherwise (no nf_tables in the kernel, no CAP_NET_ADMIN).
  static Result<std::unique_ptr<Firewall>> Open(FirewallConfig config);
  ~Firewall();  // leaves the table in place (see the top)
  Firewall(const Firewall&) = delete;
  Firewall& operator=(const Firewall&) = delete;

  // Gives box `box_id` ([a-z0-9-]) its chain and registers `ifname` (the host's end of its veth)
  // with its addresses (one IPv4; IPv6 ones only with config.ipv6). Idempotent: a box added again
  // is replaced, and an interface name that a stale box still holds is taken over (that box's
  // chain stays until RemoveBox). Turns on IPv4 (IPv6) forwarding in the namespace the first time
  // a box has a UDP rule of that family, and logs that it did.
  Status AddBox(const std::string& box_id, const std::string& ifname,
                const std::vector<address>& box_ips, const Policy& policy);
  // Replaces the UDP rules of a box's chain, then ends (deletes from conntrack) the box's UDP
  // flows that `policy` no longer allows, so that their replies stop at once too. ENOENT when the
  // box has no chain.
  Status UpdateBox(const std::string& box_id, const Policy& policy);
  // Removes the box's chain, interface and addresses in one batch. Idempotent.
  Status RemoveBox(const std::string& box_id);
  // The ids of the boxes that have a chain (for reconciliation after a restart).
  Result<std::vector<std::string>> Boxes();
  // The table as `nft list table` prints it (diagnostics, tests, docs).
  Result<std::string> Ruleset();

 private:
  Firewall(FirewallConfig config, nft_ctx* ctx, ino_t netns);
  Status CheckNetns() const;
  // Runs `commands` (nft syntax, one transaction); the output when `json_output`.
  Result<std::string> Run(const std::string& commands, bool json_output = false) REQUIRES(mu_);
  Status EnableForwarding(bool v6) REQUIRES(mu_);
  std::string Family() const { return "inet " + config_.table; }

  const FirewallConfig config_;
  const ino_t netns_;  // the namespace Open ran in
  Mutex mu_;
  nft_ctx* const ctx_ PT_GUARDED_BY(mu_);
  bool forwarding4_ GUARDED_BY(mu_) = false;
  bool forwarding6_ GUARDED_BY(mu_) = false;
};

// Deletes from conntrack (ctnetlink, in the calling thread's namespace) every UDP flow from one
// of `box_ips` that `policy` does not allow (DNS, redirected to sbx's resolver, excepted); the
// number deleted. UpdateBox calls it.
Result<int> FlushDisallowedUdpFlows(const std::vector<address>& box_ips, const Policy& policy,
                                    const std::vector<Cidr>& opened);

// Tables of processes that are gone (a killed `sbx run --net` leaves its own table): the inet
// tables whose names start with `prefix`, and the deletion of one with all it holds (a table
// that is not there is success). Same namespace rule as Firewall.
Result<std::vector<std::string>> ListTables(const std::string& prefix);
Status DeleteTable(const std::string& table);

// The always-denied ranges minus `opened`, as disjoint inclusive ranges in nft syntax ("10.0.0.0-
// 10.255.255.255", "127.0.0.1"), for one family. Exposed for its test.
std::vector<std::string> DeniedRanges(bool v6, const std::vector<Cidr>& opened);

}  // namespace sbx::network
