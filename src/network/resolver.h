// Resolver: the DNS server inside the daemon that every box's DNS goes to (issue 12 item 3;
// docs/network.md, "DNS"). nftables redirects a box's UDP and TCP port 53 to port(); the box is
// the registry entry of the query's source address. What it answers:
//
//   unknown source address          REFUSED, nothing forwarded
//   past the box's rate or in-flight cap   REFUSED (counted as "limited" in the audit event)
//   malformed                       FORMERR (opcode other than QUERY: NOTIMP; class not IN:
//                                   REFUSED); a response or a runt is dropped
//   AXFR / IXFR                     REFUSED (no zone transfers through sbx)
//   a name Policy::NameMayResolve refuses, or one that is not a DNS name
//                                   NXDOMAIN, and no upstream query of any kind: this is what
//                                   keeps data from leaving through DNS (random subdomains).
//                                   A query with EDNS gets an Extended DNS Error in the answer's
//                                   OPT (RFC 8914: INFO-CODE 15 "Blocked", EXTRA-TEXT naming
//                                   sbx's policy and its mode, never its entries); the name goes
//                                   into the config's RefusalLog
//   AAAA with IPv6 off              NOERROR with no record (NODATA), not forwarded
//   anything else (A, TXT, MX, PTR, ANY, ...) for an allowed name
//                                   forwarded upstream with c-ares as a fresh query holding only
//                                   the question; the answer relayed with the client's ID,
//                                   truncated (TC) past the client's UDP size; no answer within
//                                   the configured tries: SERVFAIL
//
// PTR needs no rule of its own: its name (4.3.2.1.in-addr.arpa) passes NameMayResolve only in
// `open` mode or under an allow entry naming it, so an allowlist box gets NXDOMAIN for reverse
// lookups. Denied queries are audited aggregated: at most one net.dns_denied event per box per
// audit period (on the config's Clock), {"names": {name: count} (at most max_names_per_event),
// "dropped": denied queries whose names did not fit, "limited": queries refused for the caps}.
//
// Threads: one I/O thread of its own (Asio) and the c-ares channel's; on_event runs on the I/O
// thread.
#pragma once

#include <boost/asio/ip/address.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "network/box_net.h"
#include "network/refusals.h"

namespace sbx::network {

struct ResolverConfig {
  std::vector<std::string> upstream;  // "ADDR:PORT" (--upstream-dns); empty: /etc/resolv.conf
  bool ipv6 = false;                  // off: AAAA answered NODATA
  EventSink on_event;                 // net.dns_denied; may be empty
  RefusalLog* refusals = nullptr;     // names refused by policy; null: not recorded
  Clock* clock = nullptr;             // audit periods and rate buckets; nullptr: SystemClock()
  int64_t audit_period_ms = 10'000;
  size_t max_names_per_event = 64;
  int upstream_timeout_ms = 2000;  // c-ares: first try per server
  int upstream_tries = 2;          // c-ares: rounds over the servers, then SERVFAIL
  int max_inflight_per_box = 64;   // upstream queries of one box at once
  double queries_per_s = 200;      // per box, a token bucket on the clock's steady time
  double burst = 400;
  int max_tcp_connections = 128;  // all sources
  int max_tcp_per_box = 16;
  int64_t tcp_idle_ms = 10'000;  // real time: a TCP connection with no query for this long closes
};

class Resolver {
 public:
  // Binds UDP and TCP on `listen`:`port` (0: one free port, the same for both) and starts
  // answering. EINVAL for a bad upstream, the bind's errno otherwise; nothing is left running on
  // failure. `boxes` must outlive the Resolver.
  static Result<std::unique_ptr<Resolver>> Start(const address& listen, uint16_t port,
                                                 BoxRegistry& boxes, ResolverConfig config);
  ~Resolver();  // Stop()
  Resolver(const Resolver&) = delete;
  Resolver& operator=(const Resolver&) = delete;

  uint16_t port() const;
  // Closes the sockets, ends queries in flight (their clients get nothing), emits the pending
  // audit events and joins the threads. Blocks; idempotent; not from on_event.
  void Stop();

 private:
  struct Impl;
  explicit Resolver(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sbx::network
