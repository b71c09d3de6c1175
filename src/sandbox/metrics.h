// The latency histograms and counters of sandbox operations, kept by the sandbox layer (the
// Manager owns one) so that every facade's creates and commands count, whichever API asked.
// api/v1/metrics renders them for /metrics. Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "common/thread_annotations.h"

namespace sbx::sandbox {

// A fixed-bucket histogram of seconds.
class Histogram {
 public:
  static constexpr std::array<double, 12> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                     0.1,   0.25,   0.5,   1,    2.5,   10};
  void Observe(double seconds);
  // Appends the _bucket, _sum and _count lines of metric `name` (Prometheus text format).
  void Render(const std::string& name, const std::string& help, std::string* out) const;

 private:
  mutable Mutex mu_;
  std::array<uint64_t, kBounds.size() + 1> counts_ GUARDED_BY(mu_){};
  double sum_ GUARDED_BY(mu_) = 0;
  uint64_t count_ GUARDED_BY(mu_) = 0;
};

struct SandboxMetrics {
  Histogram create_seconds;           // Manager::Create: call to a running sandbox
  Histogram exec_seconds;             // Session::Spawn: call to the process running
  std::atomic<uint64_t> commands{0};  // processes Session::Spawn started
};

}  // namespace sbx::sandbox
