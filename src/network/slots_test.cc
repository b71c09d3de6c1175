#include "network/slots.h"

#include <gtest/gtest.h>

namespace sbx::network {
namespace {

Cidr C(const char* base, int prefix) { return Cidr{boost::asio::ip::make_address(base), prefix}; }

TEST(Slots, TheDefaultSubnetHoldsSixteenThousandSlashThirties) {
  auto n = SlotCount(C("10.213.0.0", 16));
  ASSERT_TRUE(n.ok()) << n.status().message();
  EXPECT_EQ(*n, 16384);
  EXPECT_EQ(*SlotCount(C("192.168.7.0", 29)), 2);
}

TEST(Slots, SlotSIsTheSlashThirtyAtNetPlusFourS) {
  auto a = SlotAddresses(C("10.213.0.0", 16), 0);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host_ip.to_string(), "10.213.0.1");
  EXPECT_EQ(a->box_ip.to_string(), "10.213.0.2");
  EXPECT_EQ(a->ifname, "sbx0");
  a = SlotAddresses(C("10.213.0.0", 16), 16383);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host_ip.to_string(), "10.213.255.253");
  EXPECT_EQ(a->box_ip.to_string(), "10.213.255.254");
  EXPECT_EQ(a->ifname, "sbx16383");
  a = SlotAddresses(C("10.213.0.0", 16), 70);
  EXPECT_EQ(a->host_ip.to_string(), "10.213.1.25");
  auto plan = SlotLinkPlan(C("10.213.0.0", 16), 70);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->host_ifname, "sbx70");
  EXPECT_EQ(plan->box_ip.to_string(), "10.213.1.26");
  EXPECT_EQ(plan->prefix, 30);
  EXPECT_FALSE(plan->ipv6);
  // Even the largest pool's names fit IFNAMSIZ.
  auto big = SlotAddresses(C("10.0.0.0", 8), *SlotCount(C("10.0.0.0", 8)) - 1);
  ASSERT_TRUE(big.ok());
  EXPECT_LT(big->ifname.size(), 16u);
}

TEST(Slots, SlotsOutOfRangeAreRefused) {
  EXPECT_EQ(SlotAddresses(C("10.213.0.0", 16), 16384).status().err(), EINVAL);
  EXPECT_EQ(SlotAddresses(C("10.213.0.0", 16), -1).status().err(), EINVAL);
}

TEST(Slots, BadSubnetsAreRefused) {
  EXPECT_EQ(SlotCount(C("10.213.0.0", 30)).status().err(), EINVAL);  // one /30: no pool
  EXPECT_EQ(SlotCount(C("10.213.0.0", 32)).status().err(), EINVAL);
  EXPECT_EQ(SlotCount(C("10.0.0.0", 7)).status().err(), EINVAL);
  EXPECT_EQ(SlotCount(C("fd00::", 64)).status().err(), EINVAL);
  EXPECT_EQ(SlotCount(C("10.213.0.1", 16)).status().err(), EINVAL);  // host bits
  EXPECT_EQ(SlotCount(C("127.0.0.0", 16)).status().err(), EINVAL);
  EXPECT_EQ(SlotCount(C("169.254.0.0", 16)).status().err(), EINVAL);
  EXPECT_EQ(SlotCount(C("169.0.0.0", 8)).status().err(), EINVAL);  // contains link-local
  EXPECT_EQ(SlotCount(C("224.0.0.0", 8)).status().err(), EINVAL);
  EXPECT_EQ(SlotCount(C("0.0.0.0", 8)).status().err(), EINVAL);
  auto st = SlotCount(C("127.0.0.0", 16)).status();
  EXPECT_NE(st.message().find("127.0.0.0/8"), std::string::npos) << st.message();
}

}  // namespace
TEST(Slots, WithAnIpv6SubnetSlotSIsAlsoTheSlash126AtNet6PlusFourS) {
  Cidr six = C("fd73:6278::", 64);
  auto a = SlotAddresses(C("10.213.0.0", 16), 70, &six);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->host_ip6.to_string(), "fd73:6278::119");  // 4 * 70 + 1 = 0x119
  EXPECT_EQ(a->box_ip6.to_string(), "fd73:6278::11a");
  EXPECT_EQ(a->box_ip.to_string(), "10.213.1.26");
  auto plan = SlotLinkPlan(C("10.213.0.0", 16), 70, &six);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->ipv6);
  EXPECT_EQ(plan->box_ip6.to_string(), "fd73:6278::11a");
  EXPECT_EQ(plan->prefix6, 126);
  // Without one: no IPv6 addresses, IPv6 off.
  auto v4 = SlotAddresses(C("10.213.0.0", 16), 70);
  ASSERT_TRUE(v4.ok());
  EXPECT_TRUE(v4->box_ip6.is_unspecified());
  // The last slot of the largest IPv4 pool still fits a /104.
  Cidr wide = C("fd00:1::", 104);
  auto last = SlotAddresses(C("10.0.0.0", 8), *SlotCount(C("10.0.0.0", 8)) - 1, &wide);
  ASSERT_TRUE(last.ok()) << last.status().message();
  EXPECT_EQ(last->box_ip6.to_string(), "fd00:1::ff:fffe");
}

TEST(Slots, BadIpv6SubnetsAreRefusedNamingWhy) {
  const Cidr v4 = C("10.213.0.0", 16);  // 16384 slots: 14 bits + 2 for the /126
  EXPECT_TRUE(CheckSubnet6(v4, C("fd73:6278::", 64)).ok());
  EXPECT_TRUE(CheckSubnet6(v4, C("2001:db8:5::", 112)).ok());
  auto too_small = CheckSubnet6(v4, C("fd73:6278::", 113));
  EXPECT_EQ(too_small.err(), EINVAL);
  EXPECT_NE(too_small.message().find("16..112"), std::string::npos) << too_small.message();
  EXPECT_EQ(CheckSubnet6(v4, C("10.1.0.0", 16)).err(), EINVAL);
  EXPECT_EQ(CheckSubnet6(v4, C("fd73:6278::1", 64)).err(), EINVAL);  // host bits
  for (const char* bad : {"::", "::ffff:0:0", "64:ff9b::", "2002::", "fe80::", "ff02::"}) {
    Status st = CheckSubnet6(v4, C(bad, 96));
    EXPECT_EQ(st.err(), EINVAL) << bad;
    EXPECT_NE(st.message().find("overlaps"), std::string::npos) << bad << ": " << st.message();
  }
  Cidr bad = C("fe80::", 64);
  EXPECT_FALSE(SlotAddresses(v4, 1, &bad).ok());
}

}  // namespace sbx::network
