// AuditQueue: how audit events reach the store when a caller must not fail for them (a kill, a
// command, a denied key). An event the store cannot take (a full disk, an I/O error, a lock held
// too long) is kept in memory, in order, and written by a retry thread once the store can write
// again; events that come while others wait queue behind them, so the log keeps the order in
// which things happened (each event keeps the time it happened, and gets its seq when it lands).
// The queue is bounded: past the bound the oldest event is dropped. Nothing is lost silently:
// every queued and every dropped event is counted (sbx_audit_queued, sbx_audit_queued_total,
// sbx_audit_dropped_total in /metrics) and logged.
//
// Hot paths (a command's start and exit, several per second per box) do not wait for the store:
// AppendSoon hands the event to the queue's thread, which gathers what comes within `linger`
// of the first pending event (or until `batch` are pending) and writes it in one transaction: a
// daemon running commands back to back writes a few transactions a second, not two per command.
// Order and visibility hold as if every write were synchronous: Append, Flush and
// Store::QueryAudit write what is pending before anything else. The price: events handed over in
// the last `linger` before the process is SIGKILLed are lost, as a synchronous write in flight
// would be; a clean stop writes them.
//
// The Store owns one (Store::audit_queue()); tests may make their own.
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>

#include "store/store.h"

namespace sbx::store {

struct AuditQueueOptions {
  // Events kept while the store cannot write. At a few hundred bytes each, the default holds
  // minutes of a busy daemon's events in a few MiB.
  size_t max_events = 10000;
  // How often the retry thread tries the oldest queued event while the store cannot write.
  std::chrono::milliseconds retry_period{1000};
  // AppendSoon's events wait at most this long for others to share their transaction...
  std::chrono::milliseconds linger{5};
  // ... and no longer once this many are pending.
  size_t batch = 256;
};

struct AuditQueueCounters {
  uint64_t queued = 0;         // in memory now, waiting for the store
  uint64_t queued_total = 0;   // events that could not be written at once (since start)
  uint64_t dropped_total = 0;  // events lost: past the bound, invalid, or still queued at Stop
};

class AuditQueue {
 public:
  AuditQueue(Store& store, AuditQueueOptions options = {});
  ~AuditQueue();  // Stop()s
  AuditQueue(const AuditQueue&) = delete;
  AuditQueue& operator=(const AuditQueue&) = delete;

  // Writes `e` (its time set to now when 0), or queues it when events are already waiting or
  // the store fails. Never fails. Blocks for one store write at most.
  void Append(AuditEvent e);
  // Hands `e` (its time set to now when 0) to the queue's thread, which writes it at once with
  // whatever else is pending, in one transaction. Never fails, never waits for the store; past
  // max_events waiting for the thread, the oldest is dropped and counted, as in the retry queue.
  void AppendSoon(AuditEvent e);
  // Writes what AppendSoon has pending, now (events the store refuses join the retry queue, in
  // order). The thread does it by itself; readers call it to see every event appended before.
  void WritePending();
  // Writes queued events, oldest first, until the queue is empty or the store fails; returns how
  // many were written. The retry thread calls it; tests and shutdown may too.
  size_t Flush();
  AuditQueueCounters counters();
  // Stops the retry thread after a last Flush. Events still queued are counted dropped and
  // logged with their number. Idempotent; Append still works after it (without retries).
  void Stop();

 private:
  // Queues `e` (mu_ held), dropping the oldest past the bound, and wakes the retry thread.
  void PushLocked(AuditEvent e);
  // Starts the thread if it is not running (mu_ held).
  void StartLocked();
  // Writes `e`, or queues it behind the ones waiting (write_mu_ held).
  void WriteOrQueue(AuditEvent e);
  // WritePending with write_mu_ held.
  void WritePendingLocked();
  void Loop();

  Store& store_;
  AuditQueueOptions options_;  // max_events at least 1
  // Held for each write to the store, so events land in the order they were appended.
  std::mutex write_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<AuditEvent> queue_;    // guarded by mu_; oldest first
  std::deque<AuditEvent> pending_;  // guarded by mu_: AppendSoon's, not written yet
  std::chrono::steady_clock::time_point pending_since_;  // guarded by mu_: the first's arrival
  AuditQueueCounters counters_;                          // guarded by mu_ (queued is queue_.size())
  bool stopping_ = false;                                // guarded by mu_
  std::thread thread_;  // started with the first queued or pending event
};

}  // namespace sbx::store
