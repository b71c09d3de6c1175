// EgressProxy: every TCP connection a box makes ends here (issue 12, item 4; docs/network.md,
// "Egress proxy"). nftables redirects the box's TCP to the proxy's port; the proxy finds the box
// by the connection's source address, the destination the box asked for by SO_ORIGINAL_DST, and
// the name it meant by peeking at its first bytes (TLS SNI or HTTP Host, sni.h). A name the
// policy allows is resolved again on the host and the connection goes to one of those addresses,
// never to the box's own choice of address just because it asked (no DNS rebinding, no forged
// Host or SNI); without an allowed name the destination address must be allowed by itself. The
// host's own addresses and the always-denied ranges are refused whatever the policy says.
// Refusals are audited and answered with a 403 whose body names the policy: plain HTTP at once,
// TLS after the proxy finishes the handshake itself with a leaf for the name from sbx's CA (which
// every box trusts; never an upstream connection); then closed. Allowed connections are relayed
// with splice(2) and audited on close.
//
// Threading: every socket, timer and per-box count lives on one strand of the executor given to
// Start. Sockets are created on the executor's threads, so those threads must be in the network
// namespace the proxy serves (the host's).
#pragma once

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "network/bandwidth.h"
#include "network/box_net.h"
#include "network/ca.h"
#include "network/intercept.h"
#include "network/policy.h"
#include "network/refusals.h"

namespace sbx::network {

struct ProxyConfig {
  std::vector<Cidr> opened_ranges;     // --allow-range: parts of the always-denied ranges opened
  EventSink on_event;                  // audit (net.connect, net.connect_denied); may be empty
  HostLookup* lookup = nullptr;        // re-resolution of names; must outlive the proxy
  Interceptor* interceptor = nullptr;  // secrets (intercept.h); null: plain relay only
  // Every refused connection is recorded here (its destination and reason) for the command's
  // caller (refusals.h); null: not recorded. Must outlive the proxy.
  RefusalLog* refusals = nullptr;
  // Refused TLS clients: the proxy ends their handshake with a leaf for the SNI (or the address)
  // from this CA and answers the 403 inside it. Null: they are closed without a word.
  std::shared_ptr<Ca> ca;
  // The last sentence of a refusal: how to change the policy; "{id}" stands for the box's id.
  std::string change_hint = "Change it with `sbx net {id}` or PUT /v1/sandboxes/{id}/network.";
  int64_t peek_timeout_ms = 1000;             // how long to wait for a client that speaks first
  int64_t connect_timeout_ms = 10000;         // resolving and connecting upstream, together
  int64_t host_addresses_refresh_ms = 10000;  // how stale the host's own address list may be
};

class EgressProxy {
 public:
  // Listens on `listen` (port 0: any free port; a v6 "any" address also takes IPv4) and serves
  // until Stop. `boxes` must outlive the proxy.
  static Result<std::unique_ptr<EgressProxy>> Start(boost::asio::any_io_executor ex,
                                                    boost::asio::ip::tcp::endpoint listen,
                                                    BoxRegistry& boxes, ProxyConfig config);
  // Stops (see Stop).
  ~EgressProxy();
  EgressProxy(const EgressProxy&) = delete;
  EgressProxy& operator=(const EgressProxy&) = delete;

  uint16_t port() const { return port_; }
  // Closes the listener and every connection it relays (connections handed to the interceptor
  // are the interceptor's). Waits for that to be done on the strand, so call it while the
  // executor still runs (from any thread, its own included). Idempotent.
  void Stop();

  // For tests and metrics (they block on the strand like Stop; before Stop only): connections the
  // proxy holds for `box_id` right now, and the bytes its bandwidth limiter granted that box, both
  // directions (the interceptor's connections included: they share the box's budget).
  int OpenConnections(const std::string& box_id);
  uint64_t LimitedBytes(const std::string& box_id);

  struct State;  // shared with the connections' coroutines, which may outlive this object

 private:
  EgressProxy(std::shared_ptr<State> state, uint16_t port)
      : state_(std::move(state)), port_(port) {}
  std::shared_ptr<State> state_;
  uint16_t port_;
  std::atomic<bool> stopped_{false};  // Stop ran: the executor may be gone, never wait on it again
};

// The 403 a client gets for a refused connection to `destination` (NAME:PORT, or ADDR:PORT without
// a name): its body names the policy, the reason and `hint`, so that curl and pip users see why:
//   sbx: egress to evil.test:443 denied by this sandbox's network policy (mode allowlist;
//   allowed: pypi.org, *.pythonhosted.org): not in the allowlist. Change it with ...
std::string RefusalResponse(const Policy& policy, const std::string& destination,
                            const std::string& reason, const std::string& hint);

}  // namespace sbx::network
