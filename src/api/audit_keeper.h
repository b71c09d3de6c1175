// AuditKeeper: the audit log's upkeep in the background of `sbx serve`. It writes the aggregated
// auth.denied counts of windows that ended (DenialLog keeps them in memory until then) and
// deletes events older than the retention (`sbx serve --audit-retention`), once at start and
// then every purge period, in batches so no other store call waits long behind it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

#include "api/auth.h"
#include "common/status.h"
#include "store/store.h"

namespace sbx::api {

inline constexpr int64_t kDefaultAuditRetentionMs = int64_t{30} * 24 * 60 * 60 * 1000;

struct AuditKeeperOptions {
  int64_t retention_ms = kDefaultAuditRetentionMs;  // 0 = keep events forever
  std::chrono::milliseconds purge_period{std::chrono::hours(1)};
  std::chrono::milliseconds flush_period{std::chrono::seconds(15)};  // of denial counts
  std::function<int64_t()> now = store::NowMs;  // ms since the epoch; injectable for tests
};

// Thread-safety: Start/Stop from one thread; PurgeOnce and FlushDenials from any.
class AuditKeeper {
 public:
  AuditKeeper(store::Store& store, DenialLog& denials, AuditKeeperOptions options = {});
  ~AuditKeeper();  // Stop()s
  AuditKeeper(const AuditKeeper&) = delete;
  AuditKeeper& operator=(const AuditKeeper&) = delete;

  // Starts the thread: one purge at once, then the periodic work. Call once.
  void Start();
  // Stops the thread and writes every pending denial count (nothing is lost at shutdown).
  // Idempotent.
  void Stop();

  // One retention pass, as the thread does it: deletes the events older than now - retention.
  // Returns how many were deleted (0 with retention 0).
  Result<int64_t> PurgeOnce();
  // Writes the denial counts of windows that ended (all of them when `all`).
  void FlushDenials(bool all = false);

 private:
  void Loop();

  store::Store& store_;
  DenialLog& denials_;
  const AuditKeeperOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace sbx::api
