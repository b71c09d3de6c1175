#include "store/audit_queue.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <thread>

#include "common/fs.h"
#include "store/small_fs_test.h"

namespace sbx::store {
namespace {

// A store on a 2 MiB tmpfs the test fills and frees.
class AuditQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-audit-queue-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fs_ = std::make_unique<SmallFs>(dir_ + "/data", 2 << 20);
    ASSERT_TRUE(fs_->mounted());
    auto s = Store::Open(dir_ + "/data/" + kDbFileName);
    ASSERT_TRUE(s.ok()) << s.status().message();
    store_ = std::move(*s);
  }
  void TearDown() override {
    store_.reset();
    fs_.reset();
    (void)RemoveTree(dir_);
  }

  static AuditEvent Event(const std::string& type, int64_t time = 0) {
    AuditEvent e;
    e.type = type;
    e.sandbox_id = "sb1";
    e.time = time;
    return e;
  }
  std::vector<AuditEvent> Stored() {
    auto events = store_->QueryAudit(AuditQuery{});
    EXPECT_TRUE(events.ok()) << events.status().message();
    return events.ok() ? *events : std::vector<AuditEvent>{};
  }
  // A bounded poll of the queue thread's work (up to 20 s), which gives tests no event to wait
  // on: Stored() reads through the store's own queue, not the one under test.
  template <typename Done>
  static void PollUntil(Done done) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!done() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  static std::vector<std::string> Types(const std::vector<AuditEvent>& v) {
    std::vector<std::string> out;
    for (const auto& e : v) out.push_back(e.type);
    return out;
  }

  std::string dir_;
  std::unique_ptr<SmallFs> fs_;
  std::unique_ptr<Store> store_;
};

TEST_F(AuditQueueTest, EventsTheStoreCannotTakeAreQueuedAndLandInOrderOnceItCan) {
  AuditQueue q(*store_, {.max_events = 100, .retry_period = std::chrono::hours(1)});
  q.Append(Event("before"));
  ASSERT_EQ(Types(Stored()), std::vector<std::string>{"before"});

  fs_->Fill();
  q.Append(Event("a", 1000));
  q.Append(Event("b", 2000));
  q.Append(Event("c"));  // time set when appended, not when it lands
  auto c = q.counters();
  EXPECT_EQ(c.queued, 3u);
  EXPECT_EQ(c.queued_total, 3u);
  EXPECT_EQ(c.dropped_total, 0u);
  EXPECT_EQ(q.Flush(), 0u);  // still full: nothing written, nothing lost
  EXPECT_EQ(q.counters().queued, 3u);

  fs_->Free();
  int64_t freed_at = NowMs();
  // While events wait, a new one queues behind them instead of overtaking them.
  q.Append(Event("d"));
  EXPECT_EQ(q.counters().queued, 4u);
  EXPECT_EQ(q.Flush(), 4u);
  auto stored = Stored();
  EXPECT_EQ(Types(stored), (std::vector<std::string>{"before", "a", "b", "c", "d"}));
  ASSERT_EQ(stored.size(), 5u);
  EXPECT_EQ(stored[1].time, 1000);
  EXPECT_EQ(stored[2].time, 2000);
  EXPECT_LE(stored[3].time, freed_at);
  for (size_t i = 1; i < stored.size(); ++i) EXPECT_GT(stored[i].seq, stored[i - 1].seq);
  c = q.counters();
  EXPECT_EQ(c.queued, 0u);
  EXPECT_EQ(c.queued_total, 4u);
  EXPECT_EQ(c.dropped_total, 0u);
  // Empty again: the next event is written at once.
  q.Append(Event("e"));
  EXPECT_EQ(Stored().size(), 6u);
  EXPECT_EQ(q.counters().queued_total, 4u);
}

// AppendSoon: the caller does not wait; the order of events is the order of the calls, whichever
// way each came; a reader of the store sees every event appended before it asked.
TEST_F(AuditQueueTest, EventsHandedOverLandInOrderAndReadersSeeThem) {
  AuditQueue& q = store_->audit_queue();
  q.AppendSoon(Event("a"));
  q.AppendSoon(Event("b", 2000));
  q.Append(Event("c"));  // written after what was handed over before it
  q.AppendSoon(Event("d"));
  auto stored = Stored();  // QueryAudit writes what is pending first
  EXPECT_EQ(Types(stored), (std::vector<std::string>{"a", "b", "c", "d"}));
  ASSERT_EQ(stored.size(), 4u);
  EXPECT_EQ(stored[1].time, 2000);
  EXPECT_GT(stored[0].time, 0);  // set when handed over
  for (size_t i = 1; i < stored.size(); ++i) EXPECT_GT(stored[i].seq, stored[i - 1].seq);
  EXPECT_EQ(q.counters().queued_total, 0u);
  // Stopped: written at once.
  q.Stop();
  q.AppendSoon(Event("e"));
  EXPECT_EQ(Types(Stored()).back(), "e");
}

TEST_F(AuditQueueTest, TheThreadWritesHandedOverEventsByItself) {
  AuditQueue q(*store_, {.max_events = 10, .retry_period = std::chrono::hours(1)});
  q.AppendSoon(Event("soon"));
  PollUntil([&] { return !Stored().empty(); });
  EXPECT_EQ(Types(Stored()), std::vector<std::string>{"soon"});
}

// Events handed over wait for others (linger) and share one transaction; a full batch does not
// wait for the rest of the linger.
TEST_F(AuditQueueTest, HandedOverEventsAreWrittenTogetherOnceABatchIsFull) {
  AuditQueue q(*store_, {.max_events = 10,
                         .retry_period = std::chrono::hours(1),
                         .linger = std::chrono::hours(1),
                         .batch = 3});
  q.AppendSoon(Event("a"));
  q.AppendSoon(Event("b"));
  EXPECT_TRUE(Stored().empty());  // an hour of linger left, and the batch is not full
  q.AppendSoon(Event("c"));
  PollUntil([&] { return Stored().size() >= 3; });
  EXPECT_EQ(Types(Stored()), (std::vector<std::string>{"a", "b", "c"}));
  // A reader of q's own events does not wait for the linger either.
  q.AppendSoon(Event("d"));
  q.WritePending();
  EXPECT_EQ(Types(Stored()).back(), "d");
}

TEST_F(AuditQueueTest, HandedOverEventsTheStoreCannotTakeQueueInOrder) {
  AuditQueue q(*store_, {.max_events = 100, .retry_period = std::chrono::hours(1)});
  fs_->Fill();
  q.Append(Event("a"));
  q.AppendSoon(Event("b"));
  q.AppendSoon(Event(""));  // invalid: dropped alone, not with its batch
  q.AppendSoon(Event("c"));
  q.WritePending();
  EXPECT_EQ(q.counters().queued, 4u);  // behind "a", in order (the invalid one too, until tried)
  fs_->Free();
  q.Flush();
  EXPECT_EQ(Types(Stored()), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(q.counters().dropped_total, 1u);
  // With the store writing again, a batch with an invalid event loses that event alone.
  q.AppendSoon(Event("d"));
  q.AppendSoon(Event(""));
  q.AppendSoon(Event("e"));
  q.WritePending();
  EXPECT_EQ(Types(Stored()), (std::vector<std::string>{"a", "b", "c", "d", "e"}));
  EXPECT_EQ(q.counters().dropped_total, 2u);
}

TEST_F(AuditQueueTest, PastTheBoundTheOldestAreDroppedAndCounted) {
  AuditQueue q(*store_, {.max_events = 2, .retry_period = std::chrono::hours(1)});
  fs_->Fill();
  for (const char* t : {"1", "2", "3", "4"}) q.Append(Event(t));
  auto c = q.counters();
  EXPECT_EQ(c.queued, 2u);
  EXPECT_EQ(c.queued_total, 4u);
  EXPECT_EQ(c.dropped_total, 2u);
  fs_->Free();
  EXPECT_EQ(q.Flush(), 2u);
  EXPECT_EQ(Types(Stored()), (std::vector<std::string>{"3", "4"}));
}

TEST_F(AuditQueueTest, AnInvalidEventIsDroppedAndCountedNotRetriedForever) {
  AuditQueue q(*store_, {.max_events = 10, .retry_period = std::chrono::hours(1)});
  q.Append(Event(""));  // no type: the store refuses it (EINVAL) whatever the disk
  auto c = q.counters();
  EXPECT_EQ(c.queued, 0u);
  EXPECT_EQ(c.dropped_total, 1u);
  q.Append(Event("fine"));
  EXPECT_EQ(Types(Stored()), std::vector<std::string>{"fine"});
}

TEST_F(AuditQueueTest, TheRetryThreadWritesTheQueueOnceTheStoreCanWrite) {
  AuditQueue q(*store_, {.max_events = 10, .retry_period = std::chrono::milliseconds(10)});
  fs_->Fill();
  q.Append(Event("late"));
  EXPECT_EQ(q.counters().queued, 1u);
  fs_->Free();
  PollUntil([&] { return q.counters().queued == 0; });  // it retries every 10 ms
  EXPECT_EQ(q.counters().queued, 0u);
  EXPECT_EQ(Types(Stored()), std::vector<std::string>{"late"});
}

TEST_F(AuditQueueTest, EventsStillQueuedAtStopAreCountedDropped) {
  AuditQueue q(*store_, {.max_events = 10, .retry_period = std::chrono::hours(1)});
  fs_->Fill();
  q.Append(Event("x"));
  q.Append(Event("y"));
  q.Stop();
  auto c = q.counters();
  EXPECT_EQ(c.queued, 0u);
  EXPECT_EQ(c.dropped_total, 2u);
}

}  // namespace
}  // namespace sbx::store
