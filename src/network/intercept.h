// Interceptor: the egress proxy hands it the connections of a box that has secrets (issue 12,
// item 6), so that placeholders can be replaced in requests to the hosts a secret is bound to,
// and a placeholder sent anywhere else is audited (it goes out unreplaced). HTTPS is terminated
// with a leaf certificate for the client's SNI under the per-install CA every box trusts; the
// upstream connection is TLS again, verified against the host's CA store (or --upstream-ca).
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <memory>
#include <string>
#include <string_view>

#include "network/bandwidth.h"
#include "network/box_net.h"

namespace sbx::network {

class Interceptor {
 public:
  virtual ~Interceptor() = default;
  // Whether a connection of `box` to `name` (the SNI or Host the client gave; empty for none)
  // goes through Serve rather than a plain relay.
  virtual bool Wants(const BoxNet& box, std::string_view name) const = 0;
  // Takes over a connection the proxy has already allowed and connected: `client` is the box's
  // end, with `peeked` the bytes already read from it (a TLS ClientHello when `tls`, else the
  // start of an HTTP request); `upstream` is connected to the allowed destination for `name`.
  // `bandwidth` is the box's budget (limits.egress_mbps), shared with its other connections: what
  // moves on both sockets is paced by it (null: unlimited). `hold` keeps the connection counted
  // against the box's connection cap: keep it until both sockets are closed. Runs on the
  // sockets' executor; closes both when done; audits through the box's sink.
  virtual void Serve(boost::asio::ip::tcp::socket client, std::string peeked,
                     boost::asio::ip::tcp::socket upstream, std::string name, bool tls,
                     std::shared_ptr<const BoxNet> box, std::shared_ptr<BoxBandwidth> bandwidth,
                     std::shared_ptr<void> hold) = 0;
};

}  // namespace sbx::network
