// A box's egress bandwidth budget (issue 12, item 4: limits.egress_mbps; docs/network.md, "Egress
// proxy"). One budget per box, shared by every connection it has, however it is relayed: the
// proxy's spliced pumps (proxy.h) and the interceptor's sessions (mitm.h), on whatever threads
// they run. So a box cannot multiply its limit by opening connections, nor get around it through
// a host a secret is bound to.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

#include "common/thread_annotations.h"

namespace sbx::network {

// A token bucket for one direction. `rate` bytes per second, at most `burst` (a quarter of a
// second's worth, at least 16 KiB) saved up. Not thread-safe (BoxBandwidth locks around it). Over
// any interval of length T it grants at most burst + rate * T bytes.
class TokenBucket {
 public:
  using Time = std::chrono::steady_clock::time_point;
  TokenBucket(int64_t rate, Time now);
  // Up to `want` bytes that may be sent now (0 when empty); they are taken.
  int64_t Take(int64_t want, Time now);
  // Returns what a Take granted and was not used.
  void Give(int64_t unused);
  // How long until at least one chunk (min(want, burst)) can be taken.
  std::chrono::nanoseconds Wait(int64_t want, Time now) const;
  // A new rate (a registry change); keeps what is saved up, capped at the new burst.
  void SetRate(int64_t rate);
  int64_t rate() const { return rate_; }
  int64_t burst() const { return burst_; }
  uint64_t granted() const { return granted_; }  // all bytes taken and not given back

 private:
  void Refill(Time now);
  int64_t rate_;
  int64_t burst_;
  double tokens_;
  Time last_;
  uint64_t granted_ = 0;
};

// Both directions of one box: `up` is what the box sends, the other what it receives. Thread-safe.
class BoxBandwidth {
 public:
  using Clock = std::chrono::steady_clock;
  // `bytes_per_s` 0 (or less): unlimited.
  explicit BoxBandwidth(int64_t bytes_per_s);
  // The box's entry changed (a live policy or limits change): the new rate for every connection
  // from now on, those under way included. 0: unlimited.
  void SetRate(int64_t bytes_per_s) EXCLUDES(mu_);
  int64_t rate() const EXCLUDES(mu_);
  // Up to `want` bytes that may be moved now in the direction, and they are taken: `want` itself
  // when unlimited, 0 when the budget is spent (try again after Wait).
  int64_t Take(bool up, int64_t want) EXCLUDES(mu_);
  // Gives back what a Take granted and was not used.
  void Give(bool up, int64_t unused) EXCLUDES(mu_);
  // How long until a Take(up, want) grants something (0 when unlimited).
  std::chrono::nanoseconds Wait(bool up, int64_t want) const EXCLUDES(mu_);
  // Bytes granted while limited, both directions (for tests and metrics).
  uint64_t granted() const EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  int64_t rate_ GUARDED_BY(mu_) = 0;
  std::optional<TokenBucket> up_ GUARDED_BY(mu_), down_ GUARDED_BY(mu_);
  uint64_t granted_before_ GUARDED_BY(mu_) = 0;  // by buckets since dropped (unlimited again)
};

}  // namespace sbx::network
