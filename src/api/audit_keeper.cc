#include "api/audit_keeper.h"

#include <spdlog/spdlog.h>

namespace sbx::api {
namespace {

// Rows deleted per transaction: small enough that a request waiting for the store is held up for
// milliseconds, not for the whole first purge of a large log.
constexpr int64_t kPurgeBatch = 5000;

}  // namespace

AuditKeeper::AuditKeeper(store::Store& store, DenialLog& denials, AuditKeeperOptions options)
    : store_(store), denials_(denials), options_(std::move(options)) {}

AuditKeeper::~AuditKeeper() { Stop(); }

void AuditKeeper::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void AuditKeeper::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  FlushDenials(true);
}

Result<int64_t> AuditKeeper::PurgeOnce() {
  if (options_.retention_ms <= 0) return int64_t{0};
  int64_t before = options_.now() - options_.retention_ms;
  int64_t total = 0;
  for (;;) {
    auto n = store_.PurgeAuditBefore(before, kPurgeBatch);
    if (!n.ok()) return n.status().Wrap("audit retention");
    total += *n;
    if (*n < kPurgeBatch) return total;
    std::lock_guard lock(mu_);
    if (stopping_) return total;
  }
}

void AuditKeeper::FlushDenials(bool all) {
  WriteDenials(store_, denials_.Sweep(options_.now(), all));
}

void AuditKeeper::Loop() {
  using Clock = std::chrono::steady_clock;
  auto next_purge = Clock::now();
  std::unique_lock lock(mu_);
  while (!stopping_) {
    lock.unlock();
    if (Clock::now() >= next_purge) {
      auto n = PurgeOnce();
      if (!n.ok()) {
        spdlog::error("{}", n.status().message());
      } else if (*n > 0) {
        spdlog::info("audit retention: deleted {} events older than {} days", *n,
                     options_.retention_ms / (24 * 3600 * 1000.0));
      }
      next_purge = Clock::now() + options_.purge_period;
    }
    FlushDenials(false);
    lock.lock();
    cv_.wait_until(lock, std::min(next_purge, Clock::now() + options_.flush_period),
                   [this] { return stopping_; });
  }
}

}  // namespace sbx::api
