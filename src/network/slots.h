// The box address pool: the box subnet (`--box-subnet`, default 10.213.0.0/16) cut into /30s.
// Slot s is the /30 at net + 4s: host end net + 4s + 1 (named "sbx<s>"), box end net + 4s + 2.
// The arithmetic is pure; who holds which slot is a SlotPool, shared by every sbx process on one
// data directory (sandbox/net_slot_pool.h keeps it in the store). docs/network.md, "Links and
// addresses".
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "network/netlink.h"
#include "network/policy.h"

namespace sbx::network {

inline constexpr int kSlotPrefix = 30;

struct SlotAddrs {
  address host_ip;
  address box_ip;
  std::string ifname;  // the host end: "sbx" + slot
};

// How many /30 slots `subnet` holds. EINVAL unless it is an IPv4 network of prefix 8..29 with no
// host bits set, outside 0/8, 127/8, 169.254/16 and 224/3 (multicast and reserved).
Result<int> SlotCount(const Cidr& subnet);
// The addresses and host interface name of slot `slot` (0 <= slot < SlotCount).
Result<SlotAddrs> SlotAddresses(const Cidr& subnet, int slot);
// The link a box in slot `slot` gets (CreateBoxLink's plan).
Result<LinkPlan> SlotLinkPlan(const Cidr& subnet, int slot, bool ipv6 = false);

// Who holds which slot. Implementations are thread-safe and shared by processes as they say.
class SlotPool {
 public:
  virtual ~SlotPool() = default;
  // The slot `box_id` holds, or else a free one taken for it (idempotent per box id). ENOSPC when
  // every slot is taken.
  virtual Result<int> Acquire(const std::string& box_id) = 0;
  // Frees the slot of `box_id`; a box id holding none is fine.
  virtual Status Release(const std::string& box_id) = 0;
  // (box id, slot) of every slot taken, by slot.
  virtual Result<std::vector<std::pair<std::string, int>>> Holders() = 0;
};

}  // namespace sbx::network
