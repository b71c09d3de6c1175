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
#include "network/ingress.h"
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

// A sandbox's traffic token: network/ingress.h (ingress owns what reaching a port takes).
using network::TrafficToken;

}  // namespace sbx::api
