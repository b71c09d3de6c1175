// MemoryBudget's pools and the send pool's relief (budget.h): the loop's only signal that
// connections held by the box-wide threshold may have room again.
#include "agent/budget.h"

#include <gtest/gtest.h>

namespace sbx::agent {
namespace {

constexpr size_t kCap = size_t{8} << 20;
constexpr size_t kFloors = size_t{1} << 20;

TEST(MemoryBudget, PoolsAreHalfAndQuartersOfTheCap) {
  MemoryBudget b(kCap, kFloors);
  EXPECT_EQ(b.Limit(MemoryBudget::kRings), kCap / 2);
  EXPECT_EQ(b.Limit(MemoryBudget::kStdin), kCap / 4);
  EXPECT_EQ(b.SendThreshold(), kCap / 4 - kFloors);
  EXPECT_TRUE(b.TryReserve(MemoryBudget::kStdin, kCap / 4));
  EXPECT_FALSE(b.TryReserve(MemoryBudget::kStdin, 1));
  EXPECT_TRUE(b.TryReserve(MemoryBudget::kRings, 1));  // another pool's room is its own
}

TEST(MemoryBudget, ReliefComesOnceAfterTheSendPoolFallsBackUnderItsThreshold) {
  MemoryBudget b(kCap, kFloors);
  const size_t t = b.SendThreshold();
  b.Charge(MemoryBudget::kSend, t - 1);
  b.Release(MemoryBudget::kSend, t - 1);
  EXPECT_FALSE(b.TakeSendRelief()) << "the threshold was never reached";

  b.Charge(MemoryBudget::kSend, t - 100);
  b.Charge(MemoryBudget::kSend, 100);  // reached for an instant...
  EXPECT_FALSE(b.TakeSendRelief()) << "still at the threshold";
  b.Release(MemoryBudget::kSend, 1);  // ...and under it again
  EXPECT_TRUE(b.TakeSendRelief());
  EXPECT_FALSE(b.TakeSendRelief()) << "once per time the threshold is reached";

  b.Charge(MemoryBudget::kSend, 10);  // t + 9: over again
  b.Release(MemoryBudget::kSend, t + 9);
  EXPECT_TRUE(b.TakeSendRelief());
  EXPECT_EQ(b.used(MemoryBudget::kSend), 0u);
}

TEST(MemoryBudget, OtherPoolsNeverHoldTheSendPool) {
  MemoryBudget b(kCap, kFloors);
  ASSERT_TRUE(b.TryReserve(MemoryBudget::kRings, kCap / 2));
  b.Charge(MemoryBudget::kStdin, kCap);
  b.Release(MemoryBudget::kStdin, kCap);
  EXPECT_FALSE(b.TakeSendRelief());
}

}  // namespace
}  // namespace sbx::agent
