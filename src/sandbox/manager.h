// Manager: the one implementation of sandbox lifecycle behind every API facade. It owns the
// state machine (creating -> running <-> paused -> killed, or -> failed), TTLs, per-key quotas,
// idempotent creation, audit events and reconciliation with the host after a restart. Facades
// (native /v1, later E2B) translate requests into these calls and never touch a runtime.
//
// Thread-safe. Create, Kill and the other lifecycle calls block for the time the runtime needs
// (milliseconds): call them off the I/O threads (see api/v1 for how).
#pragma once

// Boost 1.74's awaitable.hpp uses std::exchange without including <utility>.
// clang-format off
#include <utility>
// clang-format on

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "runtime/runtime.h"
#include "sandbox/agent_channel.h"
#include "storage/template.h"
#include "store/store.h"

namespace sbx::sandbox {

struct ManagerConfig {
  int64_t default_timeout_ms = int64_t{5} * 60 * 1000;  // as E2B: 5 minutes
  int64_t max_timeout_ms = int64_t{24} * 60 * 60 * 1000;
  store::SandboxLimits default_limits{1LL << 30, 1.0, 0, 1024, 0};
  std::string default_template = "host";
};

struct CreateRequest {
  std::string template_name;  // empty: the default
  std::map<std::string, std::string> env;
  std::map<std::string, std::string> metadata;
  store::SandboxLimits limits;  // zero fields take the defaults
  int64_t timeout_ms = 0;       // 0: the default
  std::string on_timeout = store::kOnTimeoutKill;
  bool public_ports = false;    // serve its ports without the traffic token
  std::string idempotency_key;  // optional
  std::string request_hash;     // of the request, to tell a retry from a different request
};

// Why a call failed, for the facades to map onto their protocol: the Status errno says which
// (ENOENT: no such sandbox for this key; EINVAL: bad input; EBUSY: wrong state; EAGAIN: over
// quota, with `retry_after_s`; EEXIST: idempotency key reused with another request).
struct QuotaExceeded {
  double retry_after_s = 1;
};

// Counters for /metrics.
struct ManagerCounters {
  uint64_t creations = 0;
  uint64_t creation_failures = 0;
  std::vector<double> create_seconds;  // recent create latencies (bounded), for the histogram
};

class Manager {
 public:
  Manager(ManagerConfig config, runtime::Runtime& runtime, storage::TemplateStore templates,
          store::Store& store);
  ~Manager();

  // Matches records with what exists on the host: adopts the boxes of live records (their
  // processes kept running while the daemon was down), marks records whose box is gone as
  // failed, destroys boxes no record owns. Call once before serving.
  Status Reconcile();

  // Creates a sandbox for `key`. When the key is over its creation rate, fails with EAGAIN and
  // sets *quota. Blocking.
  Result<store::SandboxRecord> Create(const store::ApiKeyRecord& key, const CreateRequest& req,
                                      QuotaExceeded* quota = nullptr);
  // The sandbox if `key` owns it (ENOENT otherwise: other tenants' ids do not exist).
  Result<store::SandboxRecord> Get(const store::ApiKeyRecord& key, const std::string& id);
  Result<store::SandboxPage> List(const store::ApiKeyRecord& key, store::SandboxFilter filter);
  // The template of a create that names none.
  const std::string& default_template() const { return config_.default_template; }
  Status Kill(const store::ApiKeyRecord& key, const std::string& id);
  Status Pause(const store::ApiKeyRecord& key, const std::string& id);
  Status Resume(const store::ApiKeyRecord& key, const std::string& id);
  // Sets the timeout to `timeout_ms` from now (resets the TTL).
  Result<store::SandboxRecord> SetTimeout(const store::ApiKeyRecord& key, const std::string& id,
                                          int64_t timeout_ms);
  Result<runtime::BoxStats> Stats(const store::ApiKeyRecord& key, const std::string& id);
  // A TCP socket (non-blocking, not connected) in a running sandbox's network namespace, to
  // reach a port on its loopback. EBUSY when the sandbox is paused.
  Result<UniqueFd> TcpSocket(const store::ApiKeyRecord& key, const std::string& id);

  // The agent connection of a running sandbox (EBUSY when paused), shared by every caller and
  // re-established after the agent connection drops. A new connection runs on the calling
  // coroutine's executor.
  boost::asio::awaitable<Result<std::shared_ptr<AgentChannel>>> Channel(
      const store::ApiKeyRecord& key, const std::string& id);

  // Records an audit event (failures are logged, never returned: auditing must not fail a call).
  void Audit(const std::string& type, const std::string& sandbox_id, const std::string& key_id,
             nlohmann::json detail = nlohmann::json::object());

  // Kills or pauses every sandbox whose timeout has passed. Called by the TTL loop; public for
  // tests.
  void ExpireDue();
  // Starts the TTL thread, which calls ExpireDue every `period` until Stop().
  void StartTtlLoop(std::chrono::milliseconds period = std::chrono::milliseconds(500));
  void Stop();

  ManagerCounters counters();
  // Live sandboxes of every key with their stats, for /metrics.
  std::vector<std::pair<store::SandboxRecord, runtime::BoxStats>> LiveStats();

 private:
  Result<store::SandboxRecord> Owned(const store::ApiKeyRecord& key, const std::string& id);
  Status KillLocked(store::SandboxRecord rec, const std::string& reason);
  bool TakeCreateToken(const store::ApiKeyRecord& key, double* retry_after_s);
  Result<runtime::Box> BoxOf(const std::string& id);

  const ManagerConfig config_;
  runtime::Runtime& runtime_;
  const storage::TemplateStore templates_;
  store::Store& store_;

  std::mutex mu_;
  std::map<std::string, runtime::Box> boxes_;                      // guarded by mu_
  std::map<std::string, std::shared_ptr<AgentChannel>> channels_;  // guarded by mu_
  struct Bucket {
    double tokens = 0;
    std::chrono::steady_clock::time_point last;
  };
  std::map<std::string, Bucket> buckets_;  // guarded by mu_
  std::set<std::string> creating_keys_;    // idempotency keys in flight; guarded by mu_
  ManagerCounters counters_;               // guarded by mu_
  std::mutex ttl_mu_;
  std::condition_variable ttl_cv_;
  bool stopping_ = false;  // guarded by ttl_mu_
  std::thread ttl_thread_;
};

}  // namespace sbx::sandbox
