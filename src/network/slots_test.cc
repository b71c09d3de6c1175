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
}  // namespace sbx::network
