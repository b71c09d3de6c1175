// MetricsHistory: a bounded history of each live sandbox's resource figures, sampled every
// kMetricsPeriodMs as E2B samples its sandboxes, so that a facade can answer E2B's
// `getMetrics({start, end})` for a window instead of only "now". The manager feeds it from its
// TTL loop (Manager::SampleMetrics) and drops a sandbox's samples when the sandbox ends.
//
// Memory is bounded: at most `max_samples` per sandbox (the oldest go first; the default keeps an
// hour), and only sandboxes the manager still runs.
//
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/thread_annotations.h"
#include "runtime/runtime.h"

namespace sbx::sandbox {

// E2B samples a sandbox's metrics every 5 seconds.
constexpr int64_t kMetricsPeriodMs = 5000;

struct MetricSample {
  int64_t time_ms = 0;      // wall time of the sample
  double cpu_used_pct = 0;  // of the sandbox's CPUs, since the previous sample (0..100)
  runtime::BoxStats stats;  // as the runtime measured them
};

class MetricsHistory {
 public:
  explicit MetricsHistory(size_t max_samples = 720);

  // Records `stats` of sandbox `id` at `time_ms`; `cpus` (>= 1) is what its CPU share is
  // counted against. The CPU percentage is the CPU time used since the sandbox's previous
  // sample, or since `created_ms` for its first one. Samples come in time order; one older
  // than the newest kept is ignored.
  void Add(const std::string& id, int64_t time_ms, int64_t created_ms, double cpus,
           const runtime::BoxStats& stats);
  // The samples of `id` with start_ms <= time_ms <= end_ms, oldest first.
  std::vector<MetricSample> Window(const std::string& id, int64_t start_ms, int64_t end_ms) const;
  // Whether `id` has any sample.
  bool Has(const std::string& id) const;
  // Forgets `id` (it ended).
  void Drop(const std::string& id);
  // Forgets every sandbox not in `live`.
  void Retain(const std::set<std::string>& live);
  size_t sandboxes() const;

 private:
  const size_t max_samples_;
  mutable Mutex mu_;
  std::map<std::string, std::deque<MetricSample>> samples_ GUARDED_BY(mu_);
};

}  // namespace sbx::sandbox
