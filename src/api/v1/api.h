// The native REST API under /v1, /healthz and /metrics (docs/api.md, docs/openapi.yaml). It
// translates HTTP into calls on the sandbox manager and frames for the sandbox's agent; it holds
// no behaviour of its own beyond encoding.
#pragma once

// Boost 1.74's awaitable.hpp uses std::exchange without including <utility>.
// clang-format off
#include <utility>
// clang-format on

#include <boost/asio/thread_pool.hpp>
#include <memory>

#include "api/auth.h"
#include "api/http/router.h"
#include "api/v1/metrics.h"
#include "common/secret.h"
#include "sandbox/manager.h"
#include "store/store.h"

namespace sbx::api {

struct ApiContext {
  sandbox::Manager& manager;
  store::Store& store;
  Metrics& metrics;
  boost::asio::thread_pool& blocking;  // lifecycle calls that wait on the kernel run here
  const InstallSecret& secret;         // every token the API hands out is an HMAC under it
  // auth.denied aggregation shared by every facade (api/auth.h); AuditKeeper flushes it.
  std::shared_ptr<DenialLog> denials = std::make_shared<DenialLog>();
};

// Adds every route. `ctx` must outlive the server.
void RegisterV1(http::Router& router, ApiContext& ctx);

// A sandbox's traffic token: what a request relayed to one of its ports must carry
// (E2B-Traffic-Access-Token). HMAC-SHA256 under the install secret of the owner key's id and the
// sandbox id: it needs no storage, survives restarts, is useless once the owner key is revoked
// (the owner check fails first), and cannot be computed from the database alone. Compare it
// with ConstantTimeEquals.
inline std::string TrafficToken(const InstallSecret& secret, const std::string& owner_key_id,
                                const std::string& sandbox_id) {
  return secret.HmacHex("sbx-traffic-token\n" + owner_key_id + "\n" + sandbox_id);
}

}  // namespace sbx::api
