// Mitm: the Interceptor (intercept.h) that puts secret values into a box's requests (issue 12,
// item 6; docs/network.md, "Secrets"). The egress proxy hands it every allowed connection of a
// box that has at least one SecretBinding, so that a placeholder sent to any host is seen.
//
// For TLS it terminates the box's connection with a leaf for the name (the SNI; the upstream
// address when the client gave none) minted by the per-install Ca, ALPN http/1.1 only, and opens
// TLS upstream with SNI = name, verified against the host's CA store (or MitmConfig::upstream_ca)
// with the host name checked; an upstream that fails verification is never spoken to: the box's
// connection is closed and net.connect_denied audited. Then HTTP/1.1, request by request
// (keep-alive, bounded headers, bodies streamed in both directions as they come, chunked ones
// re-chunked): in each request's header values and the query of its target, every placeholder of
// a binding whose hosts match the name (policy name matching: exact, or "*.suffix" for names
// below the suffix, "*" for any) is replaced by the value (audited secret.use {secret, host});
// with the binding's `header` set, that header is set to its format with "{}" replaced. A
// placeholder of a binding not bound to the name is left as it is and audited secret.leak.
// Bodies are relayed unchanged: a placeholder in a body is neither replaced nor reported. A
// response 101 (a WebSocket) turns the connection into a plain two-way relay. Plain HTTP (!tls)
// is the same without TLS. Every byte read from either socket (TLS records as they are on the
// wire) is paced by the box's bandwidth budget, the one its relayed connections share.
//
// No value is ever logged or audited: events carry the secret's name and the host.
//
// Thread-safety: Wants and Serve may be called from any thread; each connection runs on a strand
// of its sockets' executor.
#pragma once

#include <boost/asio/ssl/context.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "network/box_net.h"
#include "network/ca.h"
#include "network/intercept.h"

namespace sbx::network {

struct MitmConfig {
  std::string upstream_ca;                         // --upstream-ca FILE; empty: the host's CA store
  size_t max_header_bytes = 64 << 10;              // per request and per response head
  std::chrono::milliseconds idle_timeout{120000};  // no byte either way for this long: closed
  std::chrono::milliseconds handshake_timeout{15000};
};

// Whether `name` matches a secret's host entry: "api.example.com" (exactly, case-insensitive),
// "*.example.com" (any name below it, not itself), "*" (any name).
bool SecretHostMatches(std::string_view entry, std::string_view name);

class Mitm : public Interceptor {
 public:
  // EINVAL/ENOENT naming the upstream CA file when it cannot be loaded.
  static Result<std::shared_ptr<Mitm>> Make(MitmConfig config, std::shared_ptr<Ca> ca,
                                            EventSink on_event);

  bool Wants(const BoxNet& box, std::string_view name) const override;
  void Serve(boost::asio::ip::tcp::socket client, std::string peeked,
             boost::asio::ip::tcp::socket upstream, std::string name, bool tls,
             std::shared_ptr<const BoxNet> box, std::shared_ptr<BoxBandwidth> bandwidth,
             std::shared_ptr<void> hold) override;

  struct Impl;

 private:
  explicit Mitm(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace sbx::network
