// The MCP facade: sbx's tools for an agent (create, list and kill sandboxes; run commands; read,
// write and list files; expose ports) over the Model Context Protocol's streamable HTTP transport
// at /mcp, authenticated with the API key like the other facades (docs/mcp.md). `sbx mcp`
// (cli/mcp.cc) bridges a local agent's stdio onto this endpoint, so the tools exist once, here.
//
// It translates MCP onto the manager (lifecycle) and the session (work inside a box) and nothing
// else: no agent frames, no store calls (the key check too goes through the manager), no other
// facade's headers.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "api/auth.h"
#include "api/http/router.h"
#include "common/secret.h"
#include "sandbox/manager.h"

namespace sbx::api {

struct McpOptions {
  // MCP sessions (Mcp-Session-Id) kept at once, in total and per key; past either, the one
  // used longest ago goes (its client gets 404 and initializes again, as the spec says).
  size_t max_sessions = 4096;
  size_t max_sessions_per_key = 128;
  std::chrono::milliseconds session_idle{std::chrono::hours(24)};
  // Origins (scheme://host[:port]) whose browser pages may call /mcp. A request with any other
  // Origin header is refused with 403 (the spec's defence against DNS rebinding); requests
  // without one (every non-browser client) are judged by their key alone.
  std::vector<std::string> allowed_origins;
};

struct McpContext {
  sandbox::Manager& manager;
  boost::asio::thread_pool& blocking;  // lifecycle calls that wait on the kernel run here
  const InstallSecret& secret;         // expose_port's traffic token
  std::shared_ptr<DenialLog> denials;  // shared with the other facades
  McpOptions options = {};
};

// Adds POST, GET and DELETE /mcp. `ctx` must outlive the server.
void RegisterMcp(http::Router& router, McpContext& ctx);

}  // namespace sbx::api
