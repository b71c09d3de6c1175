// Prometheus text exposition for /metrics: daemon counters, latency histograms and per-sandbox
// gauges. Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

namespace sbx::api {

// A fixed-bucket histogram of seconds.
class Histogram {
 public:
  static constexpr std::array<double, 12> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                     0.1,   0.25,   0.5,   1,    2.5,   10};
  void Observe(double seconds);
  // Appends the _bucket, _sum and _count lines of metric `name`.
  void Render(const std::string& name, const std::string& help, std::string* out) const;

 private:
  mutable std::mutex mu_;
  std::array<uint64_t, kBounds.size() + 1> counts_{};  // guarded by mu_
  double sum_ = 0;                                     // guarded by mu_
  uint64_t count_ = 0;                                 // guarded by mu_
};

struct Metrics {
  Histogram create_seconds;  // sandbox creation, request to running
  Histogram exec_seconds;    // command request to the process running
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> commands{0};
};

}  // namespace sbx::api
