// IdPool: where a box's private range of host ids comes from. Each box gets kIdRange (65536)
// consecutive host uids/gids; a pool hands out non-overlapping ranges and remembers who holds
// them across restarts and between processes (`sbx run` and `sbx serve` share one), so no two
// live boxes ever map the same host id. The runtime acquires a range once the box's directory
// exists and releases it only after that directory is gone (docs/isolation.md, "Id ranges").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace sbx::runtime {

class IdPool {
 public:
  virtual ~IdPool() = default;
  // The first host id of `box_id`'s range. Idempotent: the same box id gets the same range until
  // it is released. ENOSPC when every range is taken.
  virtual Result<uint32_t> Acquire(const std::string& box_id) = 0;
  // Gives the range of `box_id` back. A box id holding no range is fine.
  virtual Status Release(const std::string& box_id) = 0;
  // The box ids that hold a range, for reconciliation.
  virtual Result<std::vector<std::string>> Holders() = 0;
};

}  // namespace sbx::runtime
