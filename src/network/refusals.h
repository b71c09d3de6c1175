// RefusalLog: what the network refused each box lately, so that the person or agent who ran a
// command learns why it failed (issue 12: "fails with a message that names the policy"). A DNS
// name the policy refuses is answered NXDOMAIN (resolver.h) and a raw-address TLS connection is
// closed without a word (proxy.h): inside the box nothing can say "policy", so the command's
// caller is told instead, from here (docs/network.md, "Refusals"; the /v1 exit event's
// network_refused, docs/api.md).
//
// Per box, bounded: at most kMaxEntries distinct (kind, target, reason) entries, each with the
// times of its last kTimesPerEntry occurrences; when a new entry does not fit, the entry seen
// least recently makes room and its occurrences are counted as "more" (kMaxMoreTimes of their
// times are kept for the window). A box's log exists from Open (its network registered) to
// Forget (released): refusals for a box not open are dropped, so a connection refused after its
// box went cannot bring the log back.
//
// Times are wall milliseconds of the log's Clock (the stack's: SystemClock), so that a caller can
// ask "since this command started" with the process's own start time (CLOCK_REALTIME).
//
// Thread-safe: the resolver's and the proxy's threads add, the API's read.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/thread_annotations.h"
#include "network/policy.h"

namespace sbx::network {

enum class RefusalKind { kDns, kConnect };
const char* RefusalKindName(RefusalKind kind);  // "dns", "connect"

struct Refusal {
  RefusalKind kind = RefusalKind::kDns;
  // dns: the name ("files.example"); connect: the name asked for and the port
  // ("files.example:443"), or the address without a name ("198.18.0.5:443").
  std::string target;
  std::string reason;  // the policy's words: "not in the allowlist"
  int64_t count = 0;   // occurrences in the window asked for
  int64_t last_ms = 0;
};

// A box's refusals in a window, and its policy in the words of the proxy's 403 page.
struct BoxRefusals {
  std::vector<Refusal> refused;  // by first occurrence in the window
  int64_t more = 0;              // refusals in the window whose entries did not fit
  std::string policy;            // PolicySummary (filled by Stack::Refusals)
  bool empty() const { return refused.empty() && more == 0; }
};

// "mode allowlist; allowed: pypi.org, *.pythonhosted.org" / "mode open; denied: evil.test" /
// "mode none": at most 8 entries of each list shown, then "... (N more)". The refusal page's
// words (RefusalResponse in proxy.h).
std::string PolicySummary(const Policy& policy);

class RefusalLog {
 public:
  static constexpr size_t kMaxEntries = 16;
  static constexpr size_t kTimesPerEntry = 64;
  static constexpr size_t kMaxMoreTimes = 256;
  static constexpr size_t kMaxTarget = 262;  // a 255-byte escaped name, ':' and a port
  static constexpr size_t kMaxReason = 200;

  explicit RefusalLog(Clock& clock = SystemClock()) : clock_(clock) {}

  // Starts (or keeps) the log of `box_id`. Idempotent.
  void Open(const std::string& box_id);
  // Drops the log of `box_id` and everything in it. Idempotent.
  void Forget(const std::string& box_id);
  // Records a refusal now; nothing when the box's log is not open. `target` and `reason` are
  // cut to kMaxTarget and kMaxReason bytes.
  void Add(const std::string& box_id, RefusalKind kind, std::string target, std::string reason);
  // The refusals of `box_id` at or after `since_ms` (empty for a box not open). A count is exact
  // up to kTimesPerEntry occurrences in the window; past that it is at least kTimesPerEntry.
  BoxRefusals Since(const std::string& box_id, int64_t since_ms) const;
  size_t open_boxes() const;

 private:
  struct Entry {
    RefusalKind kind;
    std::string target, reason;
    int64_t first_ms = 0;
    int64_t total = 0;
    std::deque<int64_t> times;  // the last kTimesPerEntry occurrences, oldest first
  };
  struct Box {
    std::vector<Entry> entries;   // at most kMaxEntries
    std::deque<int64_t> evicted;  // times of occurrences whose entries made room, sorted
    int64_t latest = 0;           // the last time added: times never go back (sorted searches)
  };

  Clock& clock_;
  mutable Mutex mu_;
  std::map<std::string, Box> boxes_ GUARDED_BY(mu_);
};

}  // namespace sbx::network
