// Network: the per-daemon network stack that gives boxes a network (issue 12; DESIGN.md
// "Network"; docs/network.md). A box whose policy is not `none` gets a veth pair with an
// address from the pool, one nftables chain in sbx's table (DNS to sbx's resolver, TCP to sbx's
// egress proxy, UDP only by explicit rule, everything else dropped), and an entry in the
// registry the resolver and the proxy decide with. sandbox::Manager (and `sbx run`) own one.
//
// Lifecycle of a box's network, driven by the owner of the box:
//   Prepare(id, net)         before runtime Create: a slot and addresses, the box's files
//                            (resolv.conf, hosts, CA bundle) and env (placeholders, CA vars)
//   Attach(id, init_pid)     at the runtime's sync point (BoxSpec::at_sync_point): the veth into
//                            the box's network namespace, its addresses and route, its chain
//   Update(id, net)          a live policy change: new connections see it at once
//   Release(id)              on destroy, and on any failure after Prepare: chain, veth, slot,
//                            files, registry entry, refusal record. Idempotent.
//   Reconcile(live_ids)      at start: removes what belongs to no live box (after a crash)
// Every step is idempotent and leaves nothing behind when it fails.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/secret.h"
#include "common/status.h"
#include "network/box_net.h"
#include "network/policy.h"
#include "network/refusals.h"
#include "network/slots.h"

namespace sbx::network {

struct StackConfig {
  std::string box_subnet = "10.213.0.0/16";      // --box-subnet; each box takes a /30 of it
  bool ipv6 = false;                             // --ipv6 (off: boxes get IPv4 only)
  std::string box_subnet6 = kDefaultBoxSubnet6;  // --box-subnet6; with ipv6, a /126 per slot
  std::vector<std::string> upstream_dns;  // --upstream-dns ADDR:PORT...; empty: /etc/resolv.conf
  std::string upstream_ca;                // --upstream-ca FILE; empty: the host's CA store
  std::vector<Cidr> opened_ranges;        // --allow-range CIDR (inside an always-denied one)
  std::vector<uint16_t> daemon_ports;     // the daemon's own ports (always denied)
  std::string state_dir;                  // <data dir>/network: CA, per-box files
  EventSink on_event;                     // audit
  // The last sentence of a refused connection's 403 ("{id}": the box's id); empty: the daemon's
  // ("Change it with `sbx net {id}` or PUT /v1/sandboxes/{id}/network.").
  std::string refusal_hint;
  // Several stacks may share a host and a slot pool: sbx serve's (these defaults) and one per
  // `sbx run --net`. Each has its own nftables table and CA bundle and names its boxes' host
  // links <link_prefix><slot>; only a stack that owns every link of its prefix (sbx serve's)
  // guards them in its table (FirewallConfig::box_ifname_prefix) and removes unheld ones in
  // Reconcile, so stacks never drop or delete each other's.
  std::string table = "sbx";
  std::string link_prefix = "sbx";  // [a-z], up to 6
  bool owns_link_prefix = true;
  // Where slots of box_subnet come from: shared by every process on the data directory
  // (sandbox::StoreNetSlotPool). Required; must outlive the stack.
  SlotPool* slots = nullptr;
};

// What a box needs from the network when it is created.
struct BoxNetRequest {
  Policy policy;
  std::vector<SecretBinding> secrets;  // placeholders are made by Prepare when empty
  int64_t egress_bytes_per_s = 0;
  // The last sentence of this box's refused connections' 403 ("{id}": the box's id); empty: the
  // stack's (StackConfig::refusal_hint). A box whose policy is not changed with `sbx net` (a RUN
  // step of a daemon build) says how its policy is changed instead.
  std::string refusal_hint;
};

struct BoxNetPlan {
  // Host files to bind read-only into the box: host path -> path inside.
  std::vector<std::pair<std::string, std::string>> files;
  std::map<std::string, std::string> env;  // secret placeholders, SSL_CERT_FILE & co.
  std::shared_ptr<const BoxNet> net;       // addresses and policy as registered
};

class Stack {
 public:
  virtual ~Stack() = default;
  // The table, the resolver and the proxy (their own I/O threads). Fails, naming what, when the
  // host cannot give networking (no nftables, no veth): creates with a policy then fail with it.
  static Result<std::unique_ptr<Stack>> Start(StackConfig config, const InstallSecret& secret);

  virtual Result<BoxNetPlan> Prepare(const std::string& box_id, const BoxNetRequest& request) = 0;
  virtual Status Attach(const std::string& box_id, pid_t init_pid) = 0;
  virtual Status Update(const std::string& box_id, const BoxNetRequest& request) = 0;
  virtual Status Release(const std::string& box_id) = 0;
  virtual Status Reconcile(const std::set<std::string>& live_ids) = 0;
  // What exists on the host for boxes (veth names, chain names, slots), for the leak checker.
  virtual std::vector<std::string> HostObjects() = 0;
  // What the network refused box `box_id` at or after `since_ms` (wall ms of the system clock,
  // e.g. a command's start; 0: all that is kept): DNS names its policy refused and connections
  // the proxy refused, deduplicated and bounded (refusals.h), and its policy in the words of the
  // refusal page (`policy`, set whenever the box has a network here). Empty for a box without one
  // (or released); the default, for a stack that keeps no record, too. Thread-safe.
  virtual BoxRefusals Refusals(const std::string& box_id, int64_t since_ms) {
    (void)box_id;
    (void)since_ms;
    return {};
  }
};

}  // namespace sbx::network
