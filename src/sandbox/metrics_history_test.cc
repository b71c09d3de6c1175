#include "sandbox/metrics_history.h"

#include <gtest/gtest.h>

namespace sbx::sandbox {
namespace {

runtime::BoxStats Cpu(uint64_t ns) {
  runtime::BoxStats s;
  s.cpu_usage_ns = ns;
  return s;
}

TEST(MetricsHistoryTest, CpuShareIsSinceThePreviousSample) {
  MetricsHistory h;
  h.Add("a", 10'000, 5'000, 2, Cpu(5'000'000'000));   // 5 s of CPU over 5 s of two CPUs
  h.Add("a", 15'000, 5'000, 2, Cpu(5'000'000'000));   // idle since
  h.Add("a", 20'000, 5'000, 2, Cpu(20'000'000'000));  // more than both CPUs: clamped
  auto w = h.Window("a", 0, INT64_MAX);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_DOUBLE_EQ(w[0].cpu_used_pct, 50.0);
  EXPECT_DOUBLE_EQ(w[1].cpu_used_pct, 0.0);
  EXPECT_DOUBLE_EQ(w[2].cpu_used_pct, 100.0);
  h.Add("a", 19'000, 5'000, 2, Cpu(0));  // out of order: ignored
  EXPECT_EQ(h.Window("a", 0, INT64_MAX).size(), 3u);
}

TEST(MetricsHistoryTest, WindowIsInclusiveAndHistoryBounded) {
  MetricsHistory h(3);
  for (int64_t t = 1; t <= 5; ++t) h.Add("a", t * 5000, 0, 1, Cpu(0));
  auto w = h.Window("a", 0, INT64_MAX);
  ASSERT_EQ(w.size(), 3u);  // the oldest two went
  EXPECT_EQ(w.front().time_ms, 15000);
  w = h.Window("a", 15000, 20000);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[1].time_ms, 20000);
  EXPECT_TRUE(h.Window("a", 25001, 30000).empty());
  EXPECT_TRUE(h.Window("nope", 0, INT64_MAX).empty());
}

TEST(MetricsHistoryTest, EndedSandboxesAreForgotten) {
  MetricsHistory h;
  h.Add("a", 1, 0, 1, Cpu(0));
  h.Add("b", 1, 0, 1, Cpu(0));
  h.Add("c", 1, 0, 1, Cpu(0));
  h.Drop("a");
  EXPECT_FALSE(h.Has("a"));
  h.Retain({"b"});
  EXPECT_TRUE(h.Has("b"));
  EXPECT_FALSE(h.Has("c"));
  EXPECT_EQ(h.sandboxes(), 1u);
}

}  // namespace
}  // namespace sbx::sandbox
