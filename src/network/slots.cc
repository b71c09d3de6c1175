#include "network/slots.h"

#include <algorithm>
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

__extension__ typedef unsigned __int128 U128;

U128 ToU128(const boost::asio::ip::address_v6& a) {
  U128 v = 0;
  for (unsigned char b : a.to_bytes()) v = (v << 8) | b;
  return v;
}

boost::asio::ip::address_v6 FromU128(U128 v) {
  boost::asio::ip::address_v6::bytes_type b;
  for (int i = 15; i >= 0; --i, v >>= 8) b[static_cast<size_t>(i)] = static_cast<uint8_t>(v);
  return boost::asio::ip::address_v6(b);
}

U128 PrefixMask(int prefix) { return prefix == 0 ? 0 : ~U128{0} << (128 - prefix); }

// Where no box address may be: "this network", loopback, v4-mapped and NAT64 (::/8), 6to4
// (whose addresses the policy reads as the IPv4 address inside), link-local, multicast.
struct V6Range {
  uint16_t top;  // the first 16 bits
  int prefix;
};
constexpr V6Range kForbidden6[] = {{0x0000, 8}, {0x2002, 16}, {0xfe80, 10}, {0xff00, 8}};

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

Status CheckSubnet6(const Cidr& subnet, const Cidr& subnet6) {
  const std::string what = "IPv6 box subnet " + subnet6.ToString();
  if (!subnet6.base.is_v6()) return Status::Error(what + ": must be IPv6", EINVAL);
  Result<int> count = SlotCount(subnet);
  if (!count.ok()) return count.status();
  int bits = 0;  // a /126 per slot: 2 bits each, plus enough for the slot number
  while ((1LL << bits) < *count) ++bits;
  if (subnet6.prefix < 16 || subnet6.prefix > kSlotPrefix6 - bits)
    return Status::Error(what + ": prefix must be 16.." + std::to_string(kSlotPrefix6 - bits) +
                             " to hold a /126 for each of the " + std::to_string(*count) +
                             " slots of " + subnet.ToString(),
                         EINVAL);
  U128 net = ToU128(subnet6.base.to_v6());
  if ((net & ~PrefixMask(subnet6.prefix)) != 0)
    return Status::Error(what + ": host bits are set", EINVAL);
  for (const V6Range& r : kForbidden6) {
    int p = std::min(subnet6.prefix, r.prefix);
    U128 range = U128{r.top} << 112;
    if ((net & PrefixMask(p)) == (range & PrefixMask(p)))
      return Status::Error(
          what + ": overlaps " + FromU128(range).to_string() + "/" + std::to_string(r.prefix),
          EINVAL);
  }
  return Status();
}

Result<SlotAddrs> SlotAddresses(const Cidr& subnet, int slot, const Cidr* subnet6) {
  Result<int> count = SlotCount(subnet);
  if (!count.ok()) return count.status();
  if (slot < 0 || slot >= *count)
    return Status::Error("slot " + std::to_string(slot) + " of box subnet " +
                             subnet.base.to_string() + "/" + std::to_string(subnet.prefix) +
                             ": out of range 0.." + std::to_string(*count - 1),
                         EINVAL);
  uint32_t at = subnet.base.to_v4().to_uint() + 4 * static_cast<uint32_t>(slot);
  SlotAddrs out{boost::asio::ip::address_v4(at + 1), boost::asio::ip::address_v4(at + 2),
                "sbx" + std::to_string(slot), boost::asio::ip::address_v6(),
                boost::asio::ip::address_v6()};
  if (subnet6) {
    SBX_RETURN_IF_ERROR(CheckSubnet6(subnet, *subnet6));
    U128 at6 = ToU128(subnet6->base.to_v6()) + 4 * static_cast<U128>(slot);
    out.host_ip6 = FromU128(at6 + 1);
    out.box_ip6 = FromU128(at6 + 2);
  }
  return out;
}

Result<LinkPlan> SlotLinkPlan(const Cidr& subnet, int slot, const Cidr* subnet6) {
  Result<SlotAddrs> a = SlotAddresses(subnet, slot, subnet6);
  if (!a.ok()) return a.status();
  LinkPlan plan;
  plan.host_ifname = a->ifname;
  plan.host_ip = a->host_ip;
  plan.box_ip = a->box_ip;
  plan.prefix = kSlotPrefix;
  plan.ipv6 = subnet6 != nullptr;
  if (subnet6) {
    plan.host_ip6 = a->host_ip6;
    plan.box_ip6 = a->box_ip6;
    plan.prefix6 = kSlotPrefix6;
  }
  return plan;
}

}  // namespace sbx::network
