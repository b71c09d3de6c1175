// What every facade's routes are given by `sbx serve`: the manager, the counters, the blocking
// pool, the install secret and the shared auth.denied log. Shared by the facades (native /v1,
// E2B, MCP) so that none includes another's headers.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include <atomic>
#include <boost/asio/thread_pool.hpp>
#include <cstdint>
#include <memory>

#include "api/auth.h"
#include "common/secret.h"
#include "network/ingress.h"
#include "sandbox/manager.h"
#include "sandbox/metrics.h"

namespace sbx::api {

using sandbox::Histogram;

// Counters of the API layer itself. Those of sandbox operations (creates, commands) are the
// sandbox layer's (Manager::metrics()), so that every facade counts.
struct Metrics {
  std::atomic<uint64_t> requests{0};
};

struct ApiContext {
  sandbox::Manager& manager;
  Metrics& metrics;
  boost::asio::thread_pool& blocking;  // lifecycle calls that wait on the kernel run here
  const InstallSecret& secret;         // every token the API hands out is an HMAC under it
  // auth.denied aggregation shared by every facade (api/auth.h); AuditKeeper flushes it.
  std::shared_ptr<DenialLog> denials = std::make_shared<DenialLog>();
};

// A sandbox's traffic token: network/ingress.h (ingress owns what reaching a port takes).
using network::TrafficToken;

}  // namespace sbx::api
