#include "sandbox/metrics_history.h"

#include <algorithm>

namespace sbx::sandbox {

MetricsHistory::MetricsHistory(size_t max_samples)
    : max_samples_(std::max<size_t>(1, max_samples)) {}

void MetricsHistory::Add(const std::string& id, int64_t time_ms, int64_t created_ms, double cpus,
                         const runtime::BoxStats& stats) {
  MutexLock g(mu_);
  auto& q = samples_[id];
  if (!q.empty() && time_ms < q.back().time_ms) return;
  int64_t since_ms = q.empty() ? created_ms : q.back().time_ms;
  uint64_t since_ns = q.empty() ? 0 : q.back().stats.cpu_usage_ns;
  MetricSample s;
  s.time_ms = time_ms;
  s.stats = stats;
  double interval_ns = static_cast<double>(std::max<int64_t>(1, time_ms - since_ms)) * 1e6;
  double used_ns =
      stats.cpu_usage_ns >= since_ns ? static_cast<double>(stats.cpu_usage_ns - since_ns) : 0;
  s.cpu_used_pct = std::clamp(100.0 * used_ns / interval_ns / std::max(1.0, cpus), 0.0, 100.0);
  q.push_back(s);
  while (q.size() > max_samples_) q.pop_front();
}

std::vector<MetricSample> MetricsHistory::Window(const std::string& id, int64_t start_ms,
                                                 int64_t end_ms) const {
  std::vector<MetricSample> out;
  MutexLock g(mu_);
  auto it = samples_.find(id);
  if (it == samples_.end()) return out;
  for (const auto& s : it->second)
    if (s.time_ms >= start_ms && s.time_ms <= end_ms) out.push_back(s);
  return out;
}

bool MetricsHistory::Has(const std::string& id) const {
  MutexLock g(mu_);
  return samples_.contains(id);
}

void MetricsHistory::Drop(const std::string& id) {
  MutexLock g(mu_);
  samples_.erase(id);
}

void MetricsHistory::Retain(const std::set<std::string>& live) {
  MutexLock g(mu_);
  std::erase_if(samples_, [&](const auto& kv) { return !live.contains(kv.first); });
}

size_t MetricsHistory::sandboxes() const {
  MutexLock g(mu_);
  return samples_.size();
}

}  // namespace sbx::sandbox
