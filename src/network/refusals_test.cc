#include "network/refusals.h"

#include <gtest/gtest.h>

#include <thread>

namespace sbx::network {
namespace {

using std::chrono::milliseconds;

TEST(RefusalLogTest, DeduplicatesWithCountsInOrderOfFirstOccurrence) {
  FakeClock clock;
  RefusalLog log(clock);
  log.Open("b1");
  log.Add("b1", RefusalKind::kDns, "files.example", "not in the allowlist");
  clock.Advance(milliseconds(5));
  log.Add("b1", RefusalKind::kConnect, "198.18.0.5:443", "not in the allowlist");
  log.Add("b1", RefusalKind::kDns, "files.example", "not in the allowlist");
  log.Add("b1", RefusalKind::kDns, "files.example", "not in the allowlist");
  // The same target for another kind or reason is another entry.
  log.Add("b1", RefusalKind::kConnect, "files.example", "not in the allowlist");
  log.Add("b1", RefusalKind::kDns, "files.example", "the network policy is none");
  BoxRefusals r = log.Since("b1", 0);
  ASSERT_EQ(r.refused.size(), 4u);
  EXPECT_EQ(r.refused[0].kind, RefusalKind::kDns);
  EXPECT_EQ(r.refused[0].target, "files.example");
  EXPECT_EQ(r.refused[0].count, 3);
  EXPECT_EQ(r.refused[0].last_ms, clock.NowMs());
  EXPECT_EQ(r.refused[1].target, "198.18.0.5:443");
  EXPECT_EQ(r.refused[1].count, 1);
  EXPECT_EQ(r.more, 0);
  EXPECT_STREQ(RefusalKindName(r.refused[1].kind), "connect");
}

TEST(RefusalLogTest, SinceCountsOnlyTheWindow) {
  FakeClock clock;
  RefusalLog log(clock);
  log.Open("b1");
  log.Add("b1", RefusalKind::kDns, "old.example", "not in the allowlist");
  log.Add("b1", RefusalKind::kDns, "both.example", "not in the allowlist");
  log.Add("b1", RefusalKind::kDns, "both.example", "not in the allowlist");
  clock.Advance(milliseconds(10));
  int64_t start = clock.NowMs();
  log.Add("b1", RefusalKind::kDns, "both.example", "not in the allowlist");
  log.Add("b1", RefusalKind::kDns, "new.example", "not in the allowlist");
  BoxRefusals r = log.Since("b1", start);
  ASSERT_EQ(r.refused.size(), 2u);
  EXPECT_EQ(r.refused[0].target, "both.example");
  EXPECT_EQ(r.refused[0].count, 1);  // not the two before the window
  EXPECT_EQ(r.refused[1].target, "new.example");
  EXPECT_TRUE(log.Since("b1", start + 1).empty());
  EXPECT_EQ(log.Since("b1", 0).refused.size(), 3u);
}

TEST(RefusalLogTest, BoundedEntriesLeastRecentMakeRoomAndCountAsMore) {
  FakeClock clock;
  RefusalLog log(clock);
  log.Open("b1");
  int64_t start = clock.NowMs();
  for (size_t i = 0; i < RefusalLog::kMaxEntries + 4; i++) {
    log.Add("b1", RefusalKind::kDns, "n" + std::to_string(i) + ".example", "not in the allowlist");
    if (i == 0) log.Add("b1", RefusalKind::kDns, "n0.example", "not in the allowlist");
    clock.Advance(milliseconds(1));
  }
  BoxRefusals r = log.Since("b1", start);
  ASSERT_EQ(r.refused.size(), RefusalLog::kMaxEntries);
  EXPECT_EQ(r.refused.front().target, "n4.example");  // n0..n3 made room
  EXPECT_EQ(r.more, 5);                               // n0 twice, n1, n2, n3
  // After the window of those, nothing is "more".
  EXPECT_EQ(log.Since("b1", start + 4).more, 0);

  // One entry repeated past its kept times: exact when all of it is in the window.
  log.Forget("b1");
  log.Open("b1");
  for (size_t i = 0; i < RefusalLog::kTimesPerEntry * 3; i++)
    log.Add("b1", RefusalKind::kConnect, "x.example:443", "not in the allowlist");
  r = log.Since("b1", 0);
  ASSERT_EQ(r.refused.size(), 1u);
  EXPECT_EQ(r.refused[0].count, static_cast<int64_t>(RefusalLog::kTimesPerEntry * 3));

  // Long fields are cut.
  log.Add("b1", RefusalKind::kDns, std::string(1000, 'a'), std::string(1000, 'r'));
  r = log.Since("b1", 0);
  ASSERT_EQ(r.refused.size(), 2u);
  EXPECT_EQ(r.refused[1].target.size(), RefusalLog::kMaxTarget);
  EXPECT_EQ(r.refused[1].reason.size(), RefusalLog::kMaxReason);
}

TEST(RefusalLogTest, OnlyOpenBoxesAreRecordedAndForgetDropsEverything) {
  FakeClock clock;
  RefusalLog log(clock);
  log.Add("gone", RefusalKind::kDns, "a.example", "not in the allowlist");
  EXPECT_EQ(log.open_boxes(), 0u);
  EXPECT_TRUE(log.Since("gone", 0).empty());
  log.Open("b1");
  log.Open("b2");
  log.Add("b1", RefusalKind::kDns, "a.example", "not in the allowlist");
  log.Add("b2", RefusalKind::kDns, "b.example", "not in the allowlist");
  log.Open("b1");  // idempotent: keeps what it has
  EXPECT_EQ(log.Since("b1", 0).refused.size(), 1u);
  EXPECT_EQ(log.Since("b2", 0).refused.at(0).target, "b.example");
  log.Forget("b1");
  log.Forget("b1");
  EXPECT_TRUE(log.Since("b1", 0).empty());
  log.Add("b1", RefusalKind::kDns, "late.example", "not in the allowlist");  // after release
  EXPECT_EQ(log.open_boxes(), 1u);
  EXPECT_TRUE(log.Since("b1", 0).empty());
}

TEST(RefusalLogTest, ConcurrentWritersAndReadersStayBounded) {
  RefusalLog log;
  log.Open("b1");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; t++)
    threads.emplace_back([&log, t] {
      for (int i = 0; i < 500; i++) {
        log.Add("b1", RefusalKind::kDns, std::to_string(t) + "-" + std::to_string(i % 40),
                "not in the allowlist");
        if (i % 50 == 0) (void)log.Since("b1", 0);
      }
    });
  for (auto& th : threads) th.join();
  BoxRefusals r = log.Since("b1", 0);
  EXPECT_EQ(r.refused.size(), RefusalLog::kMaxEntries);
  int64_t listed = 0;
  for (const auto& e : r.refused) listed += e.count;
  EXPECT_GT(r.more, 0);
  EXPECT_LE(listed + r.more, 2000);
}

TEST(PolicySummaryTest, NamesTheModeAndTheEntriesAsTheRefusalPageDoes) {
  auto allow = Policy::FromJson(R"({"mode":"allowlist","allow":["pypi.test","*.pypi.test"]})");
  ASSERT_TRUE(allow.ok());
  EXPECT_EQ(PolicySummary(*allow), "mode allowlist; allowed: pypi.test, *.pypi.test");
  auto open = Policy::FromJson(R"({"mode":"open","deny":["evil.test"]})");
  ASSERT_TRUE(open.ok());
  EXPECT_EQ(PolicySummary(*open), "mode open; denied: evil.test");
  EXPECT_EQ(PolicySummary(Policy{}), "mode none");
  std::string many = R"({"mode":"allowlist","allow":[)";
  for (int i = 0; i < 10; i++)
    many += std::string(i ? "," : "") + "\"n" + std::to_string(i) + ".test\"";
  auto big = Policy::FromJson(many + "]}");
  ASSERT_TRUE(big.ok());
  EXPECT_NE(PolicySummary(*big).find("n7.test, ... (2 more)"), std::string::npos);
}

}  // namespace
}  // namespace sbx::network
