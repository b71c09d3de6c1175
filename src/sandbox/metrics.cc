#include "sandbox/metrics.h"

#include <cstdio>

namespace sbx::sandbox {

void Histogram::Observe(double seconds) {
  MutexLock g(mu_);
  size_t i = 0;
  while (i < kBounds.size() && seconds > kBounds[i]) ++i;
  ++counts_[i];
  sum_ += seconds;
  ++count_;
}

void Histogram::Render(const std::string& name, const std::string& help, std::string* out) const {
  MutexLock g(mu_);
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cumulative = 0;
  char line[160];
  for (size_t i = 0; i < kBounds.size(); ++i) {
    cumulative += counts_[i];
    std::snprintf(line, sizeof line, "%s_bucket{le=\"%g\"} %llu\n", name.c_str(), kBounds[i],
                  static_cast<unsigned long long>(cumulative));
    *out += line;
  }
  cumulative += counts_[kBounds.size()];
  std::snprintf(line, sizeof line, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n",
                name.c_str(), static_cast<unsigned long long>(cumulative), name.c_str(), sum_,
                name.c_str(), static_cast<unsigned long long>(count_));
  *out += line;
}

}  // namespace sbx::sandbox
