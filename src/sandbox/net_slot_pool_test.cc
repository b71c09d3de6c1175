// The address pool on a real store file: what one pool and two pools on one file (as two sbx
// processes on one data directory) hand out.
#include "sandbox/net_slot_pool.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <set>
#include <thread>

#include "common/fs.h"

namespace sbx::sandbox {
namespace {

network::Cidr Subnet(const char* base, int prefix) {
  return network::Cidr{boost::asio::ip::make_address(base), prefix};
}

class NetSlotPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-net-slot-pool-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { (void)RemoveTree(dir_); }
  std::unique_ptr<store::Store> OpenStore() {
    auto st = store::Store::Open(dir_ + "/sbx.db");
    EXPECT_TRUE(st.ok()) << st.status().message();
    return st.ok() ? std::move(st).value() : nullptr;
  }
  std::string dir_;
};

TEST_F(NetSlotPoolTest, AcquireIsIdempotentReleaseFreesAndAFullPoolSaysSo) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  auto pool = StoreNetSlotPool::Make(*store, Subnet("10.213.0.0", 29));  // two /30s
  ASSERT_TRUE(pool.ok()) << pool.status().message();
  EXPECT_EQ((*pool)->slots(), 2);
  auto a = (*pool)->Acquire("a");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(*a, 0);
  EXPECT_EQ(*(*pool)->Acquire("a"), 0);
  EXPECT_EQ(*(*pool)->Acquire("b"), 1);
  auto c = (*pool)->Acquire("c");
  EXPECT_EQ(c.status().err(), ENOSPC) << c.status().message();
  EXPECT_NE(c.status().message().find("network slots"), std::string::npos);
  auto holders = (*pool)->Holders();
  ASSERT_TRUE(holders.ok());
  EXPECT_EQ(*holders, (std::vector<std::pair<std::string, int>>{{"a", 0}, {"b", 1}}));
  ASSERT_TRUE((*pool)->Release("a").ok());
  ASSERT_TRUE((*pool)->Release("a").ok());  // holding none is fine
  EXPECT_EQ(*(*pool)->Acquire("c"), 0);     // the lowest free slot
  EXPECT_EQ((*pool)->Acquire("").status().err(), EINVAL);
}

TEST_F(NetSlotPoolTest, ASlotSurvivesReopeningTheStore) {
  {
    auto store = OpenStore();
    auto pool = StoreNetSlotPool::Make(*store, Subnet("10.213.0.0", 16));
    ASSERT_TRUE(pool.ok());
    ASSERT_EQ(*(*pool)->Acquire("x"), 0);
    ASSERT_EQ(*(*pool)->Acquire("y"), 1);
  }
  auto store = OpenStore();
  auto pool = StoreNetSlotPool::Make(*store, Subnet("10.213.0.0", 16));
  EXPECT_EQ(*(*pool)->Acquire("y"), 1);
  EXPECT_EQ(*(*pool)->Acquire("z"), 2);
}

TEST_F(NetSlotPoolTest, BadSubnetsAreRefused) {
  auto store = OpenStore();
  EXPECT_EQ(StoreNetSlotPool::Make(*store, Subnet("10.213.0.0", 30)).status().err(), EINVAL);
  EXPECT_EQ(StoreNetSlotPool::Make(*store, Subnet("fd00::", 64)).status().err(), EINVAL);
}

TEST_F(NetSlotPoolTest, TwoPoolsOnOneStoreFileNeverGiveOneSlotTwice) {
  auto s1 = OpenStore();
  auto s2 = OpenStore();
  ASSERT_TRUE(s1 && s2);
  auto p1 = StoreNetSlotPool::Make(*s1, Subnet("10.213.0.0", 24));  // 64 slots
  auto p2 = StoreNetSlotPool::Make(*s2, Subnet("10.213.0.0", 24));
  ASSERT_TRUE(p1.ok() && p2.ok());
  std::vector<int> got1, got2;
  int full1 = 0, full2 = 0;
  auto take = [](StoreNetSlotPool& pool, const char* who, std::vector<int>& got, int& full) {
    for (int i = 0; i < 40; ++i) {
      auto s = pool.Acquire(std::string(who) + std::to_string(i));
      if (s.ok()) {
        got.push_back(*s);
      } else {
        EXPECT_EQ(s.status().err(), ENOSPC) << s.status().message();
        ++full;
      }
    }
  };
  std::thread t1([&] { take(**p1, "one-", got1, full1); });
  std::thread t2([&] { take(**p2, "two-", got2, full2); });
  t1.join();
  t2.join();
  std::set<int> all(got1.begin(), got1.end());
  for (int s : got2) EXPECT_TRUE(all.insert(s).second) << "slot " << s << " given twice";
  EXPECT_EQ(all.size(), 64u);
  EXPECT_EQ(full1 + full2, 16);
  auto holders = (*p1)->Holders();
  ASSERT_TRUE(holders.ok());
  EXPECT_EQ(holders->size(), 64u);
}

}  // namespace
}  // namespace sbx::sandbox
