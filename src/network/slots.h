// The box address pool: the box subnet (`--box-subnet`, default 10.213.0.0/16) cut into /30s.
// Slot s is the /30 at net + 4s: host end net + 4s + 1 (named "sbx<s>"), box end net + 4s + 2.
// With IPv6 (`--ipv6`) the slot is also the /126 at net6 + 4s of the IPv6 box subnet
// (`--box-subnet6`, default fd73:6278::/64): host end net6 + 4s + 1, box end net6 + 4s + 2.
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
inline constexpr int kSlotPrefix6 = 126;
inline constexpr char kDefaultBoxSubnet6[] = "fd73:6278::/64";

struct SlotAddrs {
  address host_ip;
  address box_ip;
  std::string ifname;  // the host end: "sbx" + slot
  address host_ip6;    // with an IPv6 subnet; else unspecified (::)
  address box_ip6;
};

// How many /30 slots `subnet` holds. EINVAL unless it is an IPv4 network of prefix 8..29 with no
// host bits set, outside 0/8, 127/8, 169.254/16 and 224/3 (multicast and reserved).
Result<int> SlotCount(const Cidr& subnet);
// Whether `subnet6` can hold the IPv6 ends of every slot of `subnet`: an IPv6 network with no
// host bits set, room for SlotCount(subnet) /126s, outside ::/8 (loopback, unspecified,
// v4-mapped, NAT64), 2002::/16 (6to4), fe80::/10 (link-local) and ff00::/8 (multicast). EINVAL
// naming what is wrong.
Status CheckSubnet6(const Cidr& subnet, const Cidr& subnet6);
// The addresses and host interface name of slot `slot` (0 <= slot < SlotCount), and its IPv6
// addresses when `subnet6` is given (which CheckSubnet6 accepted).
Result<SlotAddrs> SlotAddresses(const Cidr& subnet, int slot, const Cidr* subnet6 = nullptr);
// The link a box in slot `slot` gets (CreateBoxLink's plan): IPv6 on, with addresses, when
// `subnet6` is given.
Result<LinkPlan> SlotLinkPlan(const Cidr& subnet, int slot, const Cidr* subnet6 = nullptr);

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
