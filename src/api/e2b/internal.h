// Shared between the E2B control plane (control_plane.cc) and envd (envd.cc).
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "api/context.h"
#include "api/http/exchange.h"
#include "api/http/pool.h"
#include "api/http/router.h"

namespace sbx::api::e2b {

using http::OnPool;  // api/http/pool.h

// The envdAccessToken of a sandbox: HMAC-SHA256 under the install secret of the owner key's id
// and the sandbox id, like network::TrafficToken (see there). It also keys the sandbox's pre-signed
// /files URLs (FileSignature), which the E2B SDK computes from it on the client side.
inline std::string EnvdToken(const InstallSecret& secret, const std::string& owner_key_id,
                             const std::string& sandbox_id) {
  return secret.HmacHex("sbx-envd-token\n" + owner_key_id + "\n" + sandbox_id);
}
// The trafficAccessToken is network::TrafficToken (shared with the native API): sbx never serves
// ports publicly (threats.md row 37).
using network::TrafficToken;

// A route of the control plane for a request with a valid `X-API-KEY` (checked against sbx's own
// keys through the manager; 401 otherwise).
using AuthedHandler =
    std::function<boost::asio::awaitable<void>(http::Exchange&, const sandbox::ApiKeyRecord&)>;
http::Handler Authed(ApiContext& ctx, AuthedHandler h);
// E2B's error body: {"code": <status>, "message": ...}; the SDK reads `code`, not the status.
boost::asio::awaitable<void> Error(http::Exchange& ex, int status, const std::string& message,
                                   const http::Headers& headers = {});
// The error answer for `s`, its status from the one errno table (api/errors.h); a 500 is logged.
boost::asio::awaitable<void> Fail(http::Exchange& ex, const Status& s);
// The request body as a JSON object; an empty body is {}. Answers 400 itself on failure.
boost::asio::awaitable<std::optional<nlohmann::json>> BodyObject(http::Exchange& ex);

void RegisterControlPlane(http::Router& router, ApiContext& ctx);
void RegisterEnvd(http::Router& router, ApiContext& ctx);
// E2B's template build API (templates.cc), registered by RegisterControlPlane.
void RegisterTemplates(http::Router& router, ApiContext& ctx);

}  // namespace sbx::api::e2b
