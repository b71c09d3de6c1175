#include "network/refusals.h"

#include <algorithm>

namespace sbx::network {

const char* RefusalKindName(RefusalKind kind) {
  return kind == RefusalKind::kDns ? "dns" : "connect";
}

std::string PolicySummary(const Policy& policy) {
  // Bounded: a policy may hold 2 x 256 entries.
  constexpr size_t kShown = 8;
  auto list = [&](const std::vector<Rule>& rules) {
    std::string out;
    for (size_t i = 0; i < rules.size() && i < kShown; ++i) out += (i ? ", " : "") + rules[i].text;
    if (rules.size() > kShown) out += ", ... (" + std::to_string(rules.size() - kShown) + " more)";
    return out.empty() ? std::string("nothing") : out;
  };
  std::string summary = policy.mode == Mode::kOpen ? "mode open"
                        : policy.mode == Mode::kAllowlist
                            ? "mode allowlist; allowed: " + list(policy.allow)
                            : "mode none";
  if (policy.mode == Mode::kOpen && !policy.deny.empty())
    summary += "; denied: " + list(policy.deny);
  if (policy.mode == Mode::kOpen && !policy.allow.empty())
    summary += "; allowed: " + list(policy.allow);
  return summary;
}

void RefusalLog::Open(const std::string& box_id) {
  MutexLock g(mu_);
  boxes_.try_emplace(box_id);
}

void RefusalLog::Forget(const std::string& box_id) {
  MutexLock g(mu_);
  boxes_.erase(box_id);
}

size_t RefusalLog::open_boxes() const {
  MutexLock g(mu_);
  return boxes_.size();
}

void RefusalLog::Add(const std::string& box_id, RefusalKind kind, std::string target,
                     std::string reason) {
  if (target.size() > kMaxTarget) target.resize(kMaxTarget);
  if (reason.size() > kMaxReason) reason.resize(kMaxReason);
  int64_t now = clock_.NowMs();
  MutexLock g(mu_);
  auto box = boxes_.find(box_id);
  if (box == boxes_.end()) return;
  // A wall clock stepped back must not unsort the times the windows are searched in.
  now = box->second.latest = std::max(now, box->second.latest);
  std::vector<Entry>& entries = box->second.entries;
  auto it = std::find_if(entries.begin(), entries.end(), [&](const Entry& e) {
    return e.kind == kind && e.target == target && e.reason == reason;
  });
  if (it == entries.end()) {
    if (entries.size() >= kMaxEntries) {
      // The entry seen least recently makes room; its occurrences still count, as "more".
      auto lru = std::min_element(
          entries.begin(), entries.end(),
          [](const Entry& a, const Entry& b) { return a.times.back() < b.times.back(); });
      std::deque<int64_t>& evicted = box->second.evicted;
      evicted.insert(evicted.end(), lru->times.begin(), lru->times.end());
      std::sort(evicted.begin(), evicted.end());
      while (evicted.size() > kMaxMoreTimes) evicted.pop_front();
      entries.erase(lru);
    }
    entries.push_back(Entry{kind, std::move(target), std::move(reason), now, 0, {}});
    it = entries.end() - 1;
  }
  it->total++;
  it->times.push_back(now);
  if (it->times.size() > kTimesPerEntry) it->times.pop_front();
}

BoxRefusals RefusalLog::Since(const std::string& box_id, int64_t since_ms) const {
  BoxRefusals out;
  MutexLock g(mu_);
  auto box = boxes_.find(box_id);
  if (box == boxes_.end()) return out;
  std::vector<std::pair<int64_t, Refusal>> found;  // (first occurrence in the window, refusal)
  for (const Entry& e : box->second.entries) {
    auto from = std::lower_bound(e.times.begin(), e.times.end(), since_ms);
    if (from == e.times.end()) continue;
    // Every occurrence is in the window when the first is; otherwise only the kept times count.
    int64_t count = e.first_ms >= since_ms ? e.total : e.times.end() - from;
    found.push_back({*from, Refusal{e.kind, e.target, e.reason, count, e.times.back()}});
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [first, r] : found) out.refused.push_back(std::move(r));
  const std::deque<int64_t>& evicted = box->second.evicted;
  out.more = evicted.end() - std::lower_bound(evicted.begin(), evicted.end(), since_ms);
  return out;
}

}  // namespace sbx::network
