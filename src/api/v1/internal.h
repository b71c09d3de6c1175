// What the route files of the native API share (api.cc, sandboxes.cc, commands.cc, files.cc,
// archives.cc, audit.cc, health.cc): authentication, the error answer, the blocking pool
// (api/http/pool.h), request parsing (api/request.h), and the session of the sandbox a request
// names. Internal to api/v1.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "api/http/exchange.h"
#include "api/http/pool.h"
#include "api/request.h"
#include "api/v1/api.h"
#include "common/status.h"
#include "network/policy.h"
#include "sandbox/session.h"

namespace sbx::api::v1 {

using boost::asio::awaitable;
using nlohmann::json;

std::string IsoTime(int64_t ms);

// Answers `s` as the one errno table of api/errors.h says (499 for a client that went away).
awaitable<void> Fail(http::Exchange& ex, const Status& s, const http::Headers& headers = {});

using AuthedHandler = std::function<awaitable<void>(http::Exchange&, const sandbox::ApiKeyRecord&)>;
// Wraps a handler with API key authentication: `Authorization: Bearer <key>` or `X-API-Key`.
http::Handler Authed(ApiContext& ctx, AuthedHandler h);

// The session of the sandbox {id} of the request for `key`, or nullptr once the error is answered.
awaitable<std::shared_ptr<sandbox::Session>> SessionOrFail(ApiContext& ctx, http::Exchange& ex,
                                                           const sandbox::ApiKeyRecord& key);

using http::OnPool;  // api/http/pool.h
// Request fields and query parameters: api/request.h (StringMap, SecondsField, IntQuery...).

// A command's timeout: a millisecond at least (less would round to 0, "no timeout").
// How long a request that asks to wait for a kill's cleanup (?wait=true) waits at most.
inline constexpr std::chrono::seconds kCleanupWait{60};
inline constexpr double kMinCommandTimeoutS = 0.001;
inline constexpr double kMaxCommandTimeoutS = 1e7;

// ---- route groups ----
void Sandboxes(http::Router& r, ApiContext& ctx);  // sandboxes.cc: the lifecycle
void Commands(http::Router& r, ApiContext& ctx);   // commands.cc, with the PTY
void Files(http::Router& r, ApiContext& ctx);      // files.cc
void Archives(http::Router& r, ApiContext& ctx);   // archives.cc
void Audit(http::Router& r, ApiContext& ctx);      // audit.cc: /v1/audit
void Health(http::Router& r, ApiContext& ctx);     // health.cc: /healthz, /metrics
void Secrets(http::Router& r, ApiContext& ctx);    // secrets.cc: /v1/secrets
void Network(http::Router& r, ApiContext& ctx);    // network.cc: policies and signed port URLs
void Templates(http::Router& r, ApiContext& ctx);  // templates.cc: /v1/templates and builds
void Cleanups(http::Router& r, ApiContext& ctx);   // pools.cc: /v1/cleanups (after kills)
void Pools(http::Router& r, ApiContext& ctx);      // pools.cc: /v1/pools (warm pools)
// network.cc: a record's policy as the API shows it, and the create field / PUT body parsed
// (EINVAL naming the bad entry).
json NetworkJson(const sandbox::SandboxRecord& r);
Result<network::Policy> ParseNetwork(const json& j);

}  // namespace sbx::api::v1
