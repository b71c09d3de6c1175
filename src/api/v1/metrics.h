// Counters of the API layer itself for /metrics. The histograms and counters of sandbox
// operations (creates, commands) are the sandbox layer's (sandbox/metrics.h), so that every
// facade counts. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>

#include "sandbox/metrics.h"

namespace sbx::api {

using sandbox::Histogram;

struct Metrics {
  std::atomic<uint64_t> requests{0};
  // Unused: commands are counted by sandbox::Session (Manager::metrics()). Kept until every
  // facade spawns through the session, so that older code compiles.
  std::atomic<uint64_t> commands{0};
};

}  // namespace sbx::api
