// Authentication shared by every facade (native /v1 and the E2B control plane): checks the key a
// request carries, and records the requests whose key is wrong as `auth.denied` audit events,
// aggregated per remote address and time window so that a flood of bad keys costs a bounded
// amount of memory and at most two audit rows per address and window (docs/api.md,
// "Authentication"). Each facade still takes the secret from its own headers; everything after
// that is here, once.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "store/store.h"

namespace sbx::http {
class Exchange;
}
namespace sbx::sandbox {
class Manager;
}

namespace sbx::api {

struct DenialLogOptions {
  int64_t window_ms = 60'000;   // one window per address
  size_t max_addresses = 256;   // tracked at once; past it, new addresses share "other"
  size_t max_path_bytes = 256;  // of the path recorded (a query string is never recorded)
};

// The bookkeeping of auth.denied, with no I/O of its own: it returns the events to write and the
// caller writes them (so it is cheap to test and never blocks on the store while holding its
// lock). Per address and window it yields at most two events: the first denial at once (count 1),
// and, once the window has ended, one event standing for the rest of it. Every event's detail:
//
//   {"remote": "203.0.113.7", "path": "/v1/sandboxes", "count": 41, "since": <ms>}
//
// `count` is how many denials the event stands for, `since` when the first of them happened,
// `path` the latest one's path (printable ASCII only, at most max_path_bytes).
//
// Thread-safe.
class DenialLog {
 public:
  explicit DenialLog(DenialLogOptions options = {});

  // One denied request from `address` (no port; "unix" for the unix socket) at `now_ms`. Returns
  // the events to write now (none while the address's window is open and already reported).
  std::vector<nlohmann::json> Record(std::string_view address, std::string_view path,
                                     int64_t now_ms);
  // The events of windows that ended by `now_ms`, or of every window when `all` (at shutdown);
  // those windows are forgotten.
  std::vector<nlohmann::json> Sweep(int64_t now_ms, bool all = false);
  // How many addresses have an open window.
  size_t tracked() const;

  const DenialLogOptions& options() const { return options_; }

 private:
  struct Window {
    int64_t start = 0;          // the window's first denial, already reported
    int64_t pending = 0;        // denials since, not yet reported
    int64_t pending_since = 0;  // the first of those
    std::string path;           // the latest one's
  };
  void SweepLocked(int64_t now_ms, bool all, std::vector<nlohmann::json>& out);

  const DenialLogOptions options_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Window> windows_;  // GUARDED_BY(mu_)
};

// What a facade's Authed wrapper does once it has the secret, for a caller with the store and no
// manager (auth_test): the facades use the manager overload below: the active key it names, or
// nullopt when it names none (unknown or revoked), which is recorded in `denials` and written to
// the audit log as it says. An error only when the store fails.
Result<std::optional<store::ApiKeyRecord>> VerifyKey(store::Store& store, DenialLog& denials,
                                                     const http::Exchange& ex,
                                                     const std::string& secret);

// The same through the sandbox manager, what every facade calls (they never call the store):
// the manager verifies the key and records the denials.
Result<std::optional<store::ApiKeyRecord>> VerifyKey(sandbox::Manager& manager, DenialLog& denials,
                                                     const http::Exchange& ex,
                                                     const std::string& secret);

// Appends `events` (from DenialLog) as auth.denied audit events under no key, through the store's
// AuditQueue (kept and retried when the store cannot write).
void WriteDenials(store::Store& store, const std::vector<nlohmann::json>& events);

}  // namespace sbx::api
