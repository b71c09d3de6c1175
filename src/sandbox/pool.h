// Warm pools (issue 14, item 5; docs/api.md "Warm pools"): boxes made ahead of the creates that
// will want them, per template, so that a create answers in the time it takes to write a record.
//
// A pooled box is made as a create would make it, with the daemon's default limits, no network
// and no owner, and recorded in the store as `pooled` (store.h): a restart adopts it again, and a
// crash at any instant leaves either a record the reconciler removes with its box or a box no
// record owns, which it reaps. A create claims one when it names the pool's template, asks for no
// network and no secrets, and its disk limit is the default one (the box's disk image is made
// with it); its memory, CPU and pids limits are written to the box's cgroups at the claim, and the
// record becomes the key's, running, in one transaction with the quota check. A claimed box is
// never returned to a pool: a destroyed sandbox's box is destroyed.
//
// The manager (manager.h) owns the pools; this file holds what describes them.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>

#include "common/status.h"

namespace sbx::sandbox {

inline constexpr int kMaxPoolSize = 256;

// A pool as the operator asks for it: `sbx serve --pool TEMPLATE[:SIZE]`, PUT /v1/pools/{template}.
struct PoolSpec {
  std::string template_name;  // a registered name, as a create gives it
  int size = 1;               // boxes kept ready, 0..kMaxPoolSize (0: the pool is emptied)
};

// TEMPLATE[:SIZE] (SIZE defaults to 1). EINVAL naming what is wrong.
Result<PoolSpec> ParsePoolSpec(std::string_view text);

// A pool as GET /v1/pools shows it.
struct PoolStatus {
  std::string template_name;
  int size = 0;
  int ready = 0;               // pooled boxes waiting for a create
  int filling = 0;             // being made now
  uint64_t claims = 0;         // creates that got a pooled box
  uint64_t misses = 0;         // creates of this template that found none ready
  uint64_t fill_failures = 0;  // boxes the refill could not make
  std::string last_error;      // the last refill failure, "" after a success
  uint64_t memory_bytes = 0;   // the ready boxes' memory use (their cgroups)
};

// The manager's state of one pool, under its lock.
struct PoolState {
  int size = 0;
  std::deque<std::string> ready;  // sandbox ids, oldest first
  int filling = 0;
  uint64_t claims = 0;
  uint64_t misses = 0;
  uint64_t fill_failures = 0;
  std::string last_error;
};

}  // namespace sbx::sandbox
