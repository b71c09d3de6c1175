// Ingress, the HTTP-facing half (the sandbox-facing half is network/ingress.h): reaching a port
// inside a sandbox through the daemon. Shared by the facades that relay to ports: E2B's edge
// proxy (`E2b-Sandbox-Port`, or a Host `<port>-<id>.<domain>`; api/e2b/envd.cc decides when a
// request is one) and the native route /v1/sandboxes/{id}/ports/{port}/... registered here.
// Either way the request goes to the port on the box's own loopback through a socket made in
// the box's network namespace, and its bytes are relayed both ways (http::Exchange::Relay),
// WebSocket and other upgrades included.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include <boost/asio/awaitable.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "api/http/exchange.h"
#include "api/http/router.h"
#include "common/status.h"
#include "sandbox/manager.h"  // ApiKeyRecord, SandboxRecord

namespace sbx::api {

struct ApiContext;

// A running sandbox a port request is for, and its owner's key (active).
struct PortTarget {
  sandbox::ApiKeyRecord owner;
  sandbox::SandboxRecord rec;
};

// The running sandbox `id` with an active owner key, or a paused one a request resumes (E2B's
// autoResume: RelayToPort resumes it); nullopt when there is none (unknown, paused otherwise,
// ended, or its owner key revoked).
std::optional<PortTarget> FindPortTarget(ApiContext& ctx, const std::string& id);

// Relays `ex` to `port` (ValidPort) on the target's loopback, sending `head` first (built from
// Exchange::ForwardHead). An error means nothing was sent to the client (no such box any more,
// nothing listening on the port): the caller answers in its protocol's shape.
boost::asio::awaitable<Status> RelayToPort(ApiContext& ctx, http::Exchange& ex,
                                           const PortTarget& target, int port, std::string head);

// `head` (a request line and fields) with its request-target replaced by `target`.
std::string WithTarget(const std::string& head, std::string_view target);

// `head` with its Host field(s) replaced by one `Host: host` (E2B's maskRequestHost). `host`
// comes from the record, checked at create to be a header value.
std::string WithHost(const std::string& head, std::string_view host);

// `/v1/sandboxes/{id}/ports/{port}/{path...}` for every method: the request reaches `port` with
// target `/{path...}?{query}`, authenticated by the owner's API key (Authorization: Bearer or
// X-API-Key, never passed on) or the sandbox's traffic token (E2B-Traffic-Access-Token); a
// sandbox with public ports needs neither, and a signed URL (network::SignPortUrl: its
// sbx_expires and sbx_signature parameters, not passed on) stands for both. docs/api.md, "Ports".
void RegisterPortRoutes(http::Router& router, ApiContext& ctx);

}  // namespace sbx::api
