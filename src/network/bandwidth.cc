#include "network/bandwidth.h"

#include <algorithm>

namespace sbx::network {
namespace {

// A pump that waits for the bucket waits for at least this much (or all it wants, if less): not
// a wake-up per byte at low rates.
constexpr int64_t kMinGrant = 4 << 10;

}  // namespace

TokenBucket::TokenBucket(int64_t rate, Time now)
    : rate_(rate), burst_(std::max<int64_t>(rate / 4, 16 << 10)), tokens_(burst_), last_(now) {}

void TokenBucket::Refill(Time now) {
  if (now <= last_) return;
  double seconds = std::chrono::duration<double>(now - last_).count();
  tokens_ = std::min<double>(static_cast<double>(burst_), tokens_ + seconds * rate_);
  last_ = now;
}

int64_t TokenBucket::Take(int64_t want, Time now) {
  Refill(now);
  int64_t floor = std::min(want, kMinGrant);
  if (tokens_ < static_cast<double>(floor)) return 0;
  int64_t got = std::min<int64_t>(want, static_cast<int64_t>(tokens_));
  tokens_ -= static_cast<double>(got);
  granted_ += static_cast<uint64_t>(got);
  return got;
}

void TokenBucket::Give(int64_t unused) {
  if (unused <= 0) return;
  tokens_ = std::min<double>(static_cast<double>(burst_), tokens_ + static_cast<double>(unused));
  granted_ -= std::min<uint64_t>(granted_, static_cast<uint64_t>(unused));
}

std::chrono::nanoseconds TokenBucket::Wait(int64_t want, Time now) const {
  double tokens = tokens_;
  if (now > last_)
    tokens = std::min<double>(static_cast<double>(burst_),
                              tokens + std::chrono::duration<double>(now - last_).count() * rate_);
  double need = static_cast<double>(std::min(want, kMinGrant)) - tokens;
  if (need <= 0) return std::chrono::nanoseconds(0);
  return std::chrono::nanoseconds(static_cast<int64_t>(need / rate_ * 1e9) + 1);
}

void TokenBucket::SetRate(int64_t rate) {
  rate_ = rate;
  burst_ = std::max<int64_t>(rate / 4, 16 << 10);
  tokens_ = std::min<double>(tokens_, static_cast<double>(burst_));
}

BoxBandwidth::BoxBandwidth(int64_t bytes_per_s) { SetRate(bytes_per_s); }

void BoxBandwidth::SetRate(int64_t bytes_per_s) {
  MutexLock g(mu_);
  if (bytes_per_s <= 0) {
    for (std::optional<TokenBucket>* b : {&up_, &down_})
      if (*b) granted_before_ += (*b)->granted();
    up_.reset();
    down_.reset();
    rate_ = 0;
    return;
  }
  if (rate_ == bytes_per_s) return;
  rate_ = bytes_per_s;
  auto now = Clock::now();
  for (std::optional<TokenBucket>* b : {&up_, &down_}) {
    if (*b)
      (*b)->SetRate(bytes_per_s);
    else
      b->emplace(bytes_per_s, now);
  }
}

int64_t BoxBandwidth::rate() const {
  MutexLock g(mu_);
  return rate_;
}

int64_t BoxBandwidth::Take(bool up, int64_t want) {
  MutexLock g(mu_);
  std::optional<TokenBucket>& b = up ? up_ : down_;
  return b ? b->Take(want, Clock::now()) : want;
}

void BoxBandwidth::Give(bool up, int64_t unused) {
  MutexLock g(mu_);
  std::optional<TokenBucket>& b = up ? up_ : down_;
  if (b) b->Give(unused);
}

std::chrono::nanoseconds BoxBandwidth::Wait(bool up, int64_t want) const {
  MutexLock g(mu_);
  const std::optional<TokenBucket>& b = up ? up_ : down_;
  return b ? b->Wait(want, Clock::now()) : std::chrono::nanoseconds(0);
}

uint64_t BoxBandwidth::granted() const {
  MutexLock g(mu_);
  return granted_before_ + (up_ ? up_->granted() : 0) + (down_ ? down_->granted() : 0);
}

}  // namespace sbx::network
