#include "network/slots.h"

#include <cerrno>

namespace sbx::network {
namespace {

struct V4Range {
  uint32_t base;
  int prefix;
};

// Ranges a box subnet must not touch: a box address there would be "this network", the host's
// loopback, link-local (the metadata address) or multicast/reserved.
constexpr V4Range kForbidden[] = {
    {0x00000000, 8}, {0x7f000000, 8}, {0xa9fe0000, 16}, {0xe0000000, 3}};

bool Overlaps(uint32_t a, int ap, uint32_t b, int bp) {
  int p = ap < bp ? ap : bp;
  uint32_t mask = p == 0 ? 0 : ~uint32_t{0} << (32 - p);
  return (a & mask) == (b & mask);
}

}  // namespace

Result<int> SlotCount(const Cidr& subnet) {
  const std::string what =
      "box subnet " + subnet.base.to_string() + "/" + std::to_string(subnet.prefix);
  if (!subnet.base.is_v4()) return Status::Error(what + ": must be IPv4", EINVAL);
  if (subnet.prefix < 8 || subnet.prefix > 29)
    return Status::Error(what + ": prefix must be 8..29 (at least two /30s)", EINVAL);
  uint32_t net = subnet.base.to_v4().to_uint();
  uint32_t host_mask = ~(~uint32_t{0} << (32 - subnet.prefix));
  if ((net & host_mask) != 0) return Status::Error(what + ": host bits are set", EINVAL);
  for (const V4Range& r : kForbidden) {
    if (Overlaps(net, subnet.prefix, r.base, r.prefix))
      return Status::Error(what + ": overlaps " + boost::asio::ip::address_v4(r.base).to_string() +
                               "/" + std::to_string(r.prefix),
                           EINVAL);
  }
  return 1 << (kSlotPrefix - subnet.prefix);
}

Result<SlotAddrs> SlotAddresses(const Cidr& subnet, int slot) {
  Result<int> count = SlotCount(subnet);
  if (!count.ok()) return count.status();
  if (slot < 0 || slot >= *count)
    return Status::Error("slot " + std::to_string(slot) + " of box subnet " +
                             subnet.base.to_string() + "/" + std::to_string(subnet.prefix) +
                             ": out of range 0.." + std::to_string(*count - 1),
                         EINVAL);
  uint32_t at = subnet.base.to_v4().to_uint() + 4 * static_cast<uint32_t>(slot);
  return SlotAddrs{boost::asio::ip::address_v4(at + 1), boost::asio::ip::address_v4(at + 2),
                   "sbx" + std::to_string(slot)};
}

Result<LinkPlan> SlotLinkPlan(const Cidr& subnet, int slot, bool ipv6) {
  Result<SlotAddrs> a = SlotAddresses(subnet, slot);
  if (!a.ok()) return a.status();
  LinkPlan plan;
  plan.host_ifname = a->ifname;
  plan.host_ip = a->host_ip;
  plan.box_ip = a->box_ip;
  plan.prefix = kSlotPrefix;
  plan.ipv6 = ipv6;
  return plan;
}

}  // namespace sbx::network
