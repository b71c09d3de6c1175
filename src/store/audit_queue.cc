#include "store/audit_queue.h"

#include <spdlog/spdlog.h>

namespace sbx::store {

AuditQueue::AuditQueue(Store& store, AuditQueueOptions options) : store_(store), options_(options) {
  if (options_.max_events == 0) options_.max_events = 1;
}

AuditQueue::~AuditQueue() { Stop(); }

void AuditQueue::Append(AuditEvent e) {
  if (e.time == 0) e.time = NowMs();
  std::lock_guard<std::mutex> w(write_mu_);
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
  if (!thread_.joinable() && !stopping_) thread_ = std::thread([this] { Loop(); });
  cv_.notify_all();
}

size_t AuditQueue::Flush() {
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
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (queue_.empty()) {
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      continue;
    }
    // The first try waits a period too: the write that queued the event has just failed.
    cv_.wait_for(lock, options_.retry_period, [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    Flush();
    lock.lock();
  }
}

}  // namespace sbx::store
