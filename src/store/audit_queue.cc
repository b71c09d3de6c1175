#include "store/audit_queue.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <iterator>
#include <vector>

namespace sbx::store {

AuditQueue::AuditQueue(Store& store, AuditQueueOptions options) : store_(store), options_(options) {
  if (options_.max_events == 0) options_.max_events = 1;
}

AuditQueue::~AuditQueue() { Stop(); }

void AuditQueue::Append(AuditEvent e) {
  if (e.time == 0) e.time = NowMs();
  std::lock_guard<std::mutex> w(write_mu_);
  WritePendingLocked();  // what was appended before goes first
  WriteOrQueue(std::move(e));
}

void AuditQueue::AppendSoon(AuditEvent e) {
  if (e.time == 0) e.time = NowMs();
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!stopping_) {
      // Bounded as the retry queue is: a store that takes long to write (a held lock) must not
      // make the daemon's memory the log.
      if (pending_.size() >= options_.max_events) {
        if (counters_.dropped_total % 1000 == 0)
          spdlog::error("audit: {} events wait for the writer thread: dropping the oldest ({} {})",
                        pending_.size(), pending_.front().type, pending_.front().sandbox_id);
        pending_.pop_front();
        ++counters_.dropped_total;
      }
      if (pending_.empty()) pending_since_ = std::chrono::steady_clock::now();
      pending_.push_back(std::move(e));
      StartLocked();
      // The thread needs waking for the first (its linger starts) and a full batch only.
      if (pending_.size() == 1 || pending_.size() == options_.batch) cv_.notify_all();
      return;
    }
  }
  Append(std::move(e));  // stopped: no thread to hand it to
}

void AuditQueue::WritePending() {
  std::lock_guard<std::mutex> w(write_mu_);
  WritePendingLocked();
}

void AuditQueue::WritePendingLocked() {
  std::deque<AuditEvent> batch;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (pending_.empty()) return;
    batch.swap(pending_);
    if (!queue_.empty()) {
      // The store is failing: behind the events already waiting, in order.
      for (auto& e : batch) PushLocked(std::move(e));
      return;
    }
  }
  std::vector<AuditEvent> events(std::make_move_iterator(batch.begin()),
                                 std::make_move_iterator(batch.end()));
  if (store_.AppendAudits(events).ok()) return;
  // One at a time instead: an invalid event is dropped alone, the rest queue if the store fails.
  for (auto& e : events) WriteOrQueue(std::move(e));
}

void AuditQueue::WriteOrQueue(AuditEvent e) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!queue_.empty()) {
      PushLocked(std::move(e));
      return;
    }
  }
  auto r = store_.AppendAudit(e);
  if (r.ok()) return;
  std::lock_guard<std::mutex> g(mu_);
  if (r.status().err() == EINVAL) {
    // The event itself is wrong (a caller's bug): no retry would ever take it.
    ++counters_.dropped_total;
    spdlog::error("audit {} {}: dropped: {}", e.type, e.sandbox_id, r.status().message());
    return;
  }
  spdlog::error(
      "audit {} {}: {}; queued in memory (up to {} events) until the store can write again", e.type,
      e.sandbox_id, r.status().message(), options_.max_events);
  PushLocked(std::move(e));
}

void AuditQueue::PushLocked(AuditEvent e) {
  if (queue_.size() >= options_.max_events) {
    const AuditEvent& old = queue_.front();
    // The first drop and every thousandth are logged; the counter says the rest.
    if (counters_.dropped_total % 1000 == 0)
      spdlog::error(
          "audit queue full ({} events): dropping the oldest ({} {} at {} ms); {} dropped so far",
          options_.max_events, old.type, old.sandbox_id, old.time, counters_.dropped_total + 1);
    queue_.pop_front();
    ++counters_.dropped_total;
  }
  queue_.push_back(std::move(e));
  ++counters_.queued_total;
  StartLocked();
  cv_.notify_all();
}

void AuditQueue::StartLocked() {
  if (!thread_.joinable() && !stopping_) thread_ = std::thread([this] { Loop(); });
}

size_t AuditQueue::Flush() {
  WritePending();
  size_t written = 0;
  for (;;) {
    // One event per hold of write_mu_: an Append meanwhile queues behind the front (which stays
    // queued until it is written), and waits for one write at most, not for the whole queue.
    std::lock_guard<std::mutex> w(write_mu_);
    AuditEvent e;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (queue_.empty()) break;
      e = queue_.front();
    }
    auto r = store_.AppendAudit(e);
    if (!r.ok() && r.status().err() != EINVAL) break;  // still failing: the thread retries
    std::lock_guard<std::mutex> g(mu_);
    queue_.pop_front();
    if (r.ok()) {
      ++written;
    } else {
      ++counters_.dropped_total;
      spdlog::error("audit {} {}: dropped: {}", e.type, e.sandbox_id, r.status().message());
    }
  }
  if (written > 0) {
    std::lock_guard<std::mutex> g(mu_);
    spdlog::info("audit: {} queued event(s) written; {} still queued", written, queue_.size());
  }
  return written;
}

AuditQueueCounters AuditQueue::counters() {
  std::lock_guard<std::mutex> g(mu_);
  AuditQueueCounters c = counters_;
  c.queued = queue_.size();
  return c;
}

void AuditQueue::Stop() {
  std::thread t;
  {
    std::lock_guard<std::mutex> g(mu_);
    stopping_ = true;
    t = std::move(thread_);
  }
  cv_.notify_all();
  if (t.joinable()) t.join();
  Flush();
  std::lock_guard<std::mutex> g(mu_);
  if (queue_.empty()) return;
  spdlog::error("audit: {} event(s) could not be written before stopping and are lost",
                queue_.size());
  counters_.dropped_total += queue_.size();
  queue_.clear();
}

void AuditQueue::Loop() {
  using SteadyClock = std::chrono::steady_clock;
  constexpr auto kNone = SteadyClock::time_point::max();
  std::unique_lock<std::mutex> lock(mu_);
  // When the queue of refused events is tried next: a period after the write that queued them
  // failed, and a period after each retry that failed, however many pending events come between.
  auto retry_at = kNone;
  while (!stopping_) {
    if (!pending_.empty()) {
      // Others arriving meanwhile share the transaction (a reader or an Append writes them
      // sooner: pending_ is then empty when the wait ends).
      cv_.wait_until(lock, pending_since_ + options_.linger, [this] {
        return stopping_ || pending_.empty() || pending_.size() >= options_.batch;
      });
      if (pending_.empty() || stopping_) continue;
      lock.unlock();
      WritePending();
      lock.lock();
      continue;
    }
    if (queue_.empty()) {
      retry_at = kNone;
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty() || !pending_.empty(); });
      continue;
    }
    if (retry_at == kNone) retry_at = SteadyClock::now() + options_.retry_period;
    cv_.wait_until(lock, retry_at, [this] { return stopping_ || !pending_.empty(); });
    if (stopping_) break;
    if (!pending_.empty() && SteadyClock::now() < retry_at) continue;
    lock.unlock();
    Flush();
    lock.lock();
    retry_at = kNone;
  }
}

}  // namespace sbx::store
