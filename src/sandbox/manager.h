// Manager: the one implementation of sandbox lifecycle behind every API facade. It owns the
// state machine (creating -> running <-> paused -> killed, or -> failed), TTLs, per-key quotas,
// idempotent creation, audit events and reconciliation with the host after a restart. Facades
// (native /v1, later E2B) translate requests into these calls and never touch a runtime.
//
// Thread-safe. Create, Kill and the other lifecycle calls block for the time the runtime needs
// (milliseconds): call them off the I/O threads (see api/v1 for how).
//
// Transitions are atomic per sandbox: every call that changes a sandbox (create, kill, pause,
// resume, timeout, connect, the TTL scan's kill or pause, a dead agent's failure) holds that
// sandbox's lock from reading its record to writing it back, host action included, so two of them
// never interleave (a pause racing a TTL kill, a kill during create). The host action and the
// record write are ordered so that a failure of either leaves them consistent (docs/api.md,
// "States"):
// - kill: destroy, then write `killed`; a write that fails is retried once, then kept in memory
//   (calls see the ended record) and retried by every TTL scan; after a crash the reconciler
//   finds the live record without a box and marks it failed. Never left `running`.
// - pause/resume: freeze (thaw), then write; a failed write is undone (thaw, freeze again) and
//   the call fails with the write's errno (ENOSPC on a full disk: the facades' 507). If the undo
//   fails too, the box is destroyed and recorded failed, as for kill.
// - create: the `creating` record is inserted (with the quota check, one transaction) before the
//   box is made; a box whose `running` record cannot be written is destroyed and recorded failed.
#pragma once

// Boost 1.74's awaitable.hpp uses std::exchange without including <utility>.
// clang-format off
#include <utility>
// clang-format on

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/secret.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "network/box_net.h"
#include "network/network.h"
#include "network/policy.h"
#include "runtime/runtime.h"
#include "sandbox/agent_channel.h"
#include "sandbox/cleanups.h"
#include "sandbox/limits.h"
#include "sandbox/metrics.h"
#include "sandbox/metrics_history.h"
#include "sandbox/pool.h"
#include "sandbox/templates.h"
#include "storage/image.h"
#include "storage/template.h"
#include "store/audit_queue.h"
#include "store/store.h"

namespace sbx::sandbox {

// The records the facades take and give through the manager, named here so that a facade never
// names (or includes) the store: they are the store's types, not copies.
using store::ApiKeyRecord;
using store::AuditEvent;
using store::AuditQuery;
using store::AuditQueueCounters;
using store::IsLiveState;
using store::kNoNetwork;
using store::kOnTimeoutKill;
using store::kOnTimeoutPause;
using store::kStateCreating;
using store::kStateFailed;
using store::kStateKilled;
using store::kStatePaused;
using store::kStateRunning;
using store::NowMs;
using store::SandboxFilter;
using store::SandboxPage;
using store::SandboxRecord;
using store::SecretRecord;
using store::Sha256Hex;
using store::WriteHealth;

struct ManagerConfig {
  int64_t default_timeout_ms = int64_t{5} * 60 * 1000;  // as E2B: 5 minutes
  // What a create without a limit gets, moved into its key's range (limits.h).
  store::SandboxLimits default_limits{1LL << 30, 1.0, 0, 1024, 0};
  // The daemon-wide minimum and maximum of memory, cpus, pids, disk and timeouts (sbx serve
  // --min-memory/--max-memory ...); 0 fields: the host's (sandbox::HostRanges). Keys narrow them.
  store::LimitRanges ranges;
  std::string default_template = "host";
  // How long a create waits for its template's ready command (start_ready.h); 0: its default.
  int64_t ready_timeout_ms = 0;
  // Where disk images live (the data directory): a create with a disk limit must fit in its
  // filesystem's free space minus the reserve, or it is refused with ENOSPC (HTTP 507). Empty:
  // no free-space check.
  std::string data_dir;
  // Free space kept for the daemon itself (store, logs, templates): this many bytes, or
  // disk_reserve_percent of the filesystem when that is larger.
  int64_t disk_reserve_bytes = int64_t{1} << 30;
  double disk_reserve_percent = 0;
  // Where time comes from: record times, expiry, the creation-rate buckets and the TTL loop's
  // period. Null: the system clock. Must outlive the manager.
  Clock* clock = nullptr;
  // For tests: called when a call (`op`: "kill", "pause", "ttl"...) on sandbox `id` finds another
  // transition of it in progress, just before it waits for that one to finish.
  std::function<void(const std::string& id, const char* op)> on_transition_wait;
  // For tests: called by Create for sandbox `id` after the early quota count and before the
  // insert that decides (see Create).
  std::function<void(const std::string& id)> on_create_insert;
  // The daemon's network stack (network/network.h; sbx serve --network on), which must outlive
  // the manager. Null: networking is off, and a create or a policy change asking for any network
  // is refused (EINVAL kNetworkingOff); a policy that allows nothing is then taken as `none`.
  network::Stack* network = nullptr;
  // Files bound read-only into every box without a network (network::WriteNoNetworkFiles: the
  // resolv.conf that says so): host path -> path inside.
  std::vector<std::pair<std::string, std::string>> no_network_files;
  // Seals and opens secret values (sandbox/secrets.cc). Null: the secret calls fail with ENOTSUP.
  // Must outlive the manager.
  const InstallSecret* install_secret = nullptr;
  // Runs template builds (sandbox/build.h); must outlive the manager. Null: builds are refused
  // (ENOSYS) until templates().SetBuilder gives one.
  Builder* builder = nullptr;
  // The network of the RUN steps of E2B template builds, whose wire has no policy (sbx serve
  // --build-network; default none). docs/build.md "Network".
  network::Policy e2b_build_network;
  // Warm pools kept filled once StartPools() runs (sbx serve --pool; pool.h).
  std::vector<PoolSpec> pools;
};

// A secret as a facade gives it (sandbox/secrets.cc). `value` is write-only: no answer of the
// manager ever holds it (a SecretRecord it returns has `sealed` cleared).
struct SecretInput {
  std::string name;                // [A-Za-z0-9][A-Za-z0-9_.-]{0,63}
  std::string value;               // 1..16384 bytes, no CR, LF or NUL (it goes into HTTP headers)
  std::vector<std::string> hosts;  // "api.example.com", "*.example.com"; at most 64
  std::string header;              // an HTTP header name, or "" for none
  std::string format = "{}";       // the header's value; must hold "{}" when header is set
  std::map<std::string, std::string> metadata;
  bool replace = false;  // replace a secret of that name instead of EEXIST
};

// What a create or a policy change asking for a network gets from a daemon without networking.
inline constexpr char kNetworkingOff[] =
    "networking is not enabled on this daemon (sbx serve --network on)";

// What Manager::Connect did.
struct Connected {
  store::SandboxRecord record;  // as it is now
  bool resumed = false;         // it was paused and is running again
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
  network::Policy network;      // mode none by default: loopback only
  // Secrets the box may use without seeing them: env var -> secret name (issue 12). Names
  // [A-Za-z_][A-Za-z0-9_]*, at most kMaxSecrets; they need networking.
  std::map<std::string, std::string> secrets;
  // E2B's extras (store::SandboxRecord): `rules` as a JSON object, and maskRequestHost.
  std::string egress_rules = "{}";
  std::string mask_request_host;
  // With on_timeout pause: whether the TTL's pause keeps memory (E2B's autoPauseMemory).
  bool pause_memory = true;
  // Resumed by the first request for its envd or ports (E2B's autoResume): needs on_timeout
  // pause with memory.
  bool auto_resume = false;
  // The runtime to run under instead of the template's (runtime::kRuntimeNames): operator keys,
  // and keys whose ApiKeyRecord::runtimes name it. "": the template's, else native.
  std::string runtime;
  // Internal, never from a client: a box's saved memory (runtime::Runtime::SaveMemory) to start
  // from instead of a boot (a fork of a vm sandbox). No pool, no start command.
  std::string restore_memory;
};
inline constexpr size_t kMaxSecrets = 64;
inline constexpr int kMaxForks = 100;  // per fork call, as E2B
// A sandbox's own layers (one per pause without memory) stacked before they are merged into one
// (Manager::MergeOwnLayers): enough that a merge, a copy of all of them, is rare; few enough
// that lookups through the stack stay quick.
inline constexpr size_t kMostOwnLayers = 16;

// Why a call failed, for the facades to map onto their protocol: the Status errno says which
// (ENOENT: no such sandbox for this key; EINVAL: bad input; EBUSY: wrong state; EAGAIN: over
// quota, with `retry_after_s`; EEXIST: idempotency key reused with another request; ENOSPC: the
// disk limit does not fit in the data directory's free space).
//
// Ownership: a key reaches only its own sandboxes; another key's id is ENOENT, as if it did not
// exist, and is audited as sandbox.access_denied. An operator key (ApiKeyRecord::is_operator)
// may also list, inspect (Get, Stats) and kill any key's sandbox, but never use one (commands,
// files, ports, pause, resume, timeout): those stay with the owner.
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
  // sets *quota. Limits and a timeout out of the key's range (limits.h: the key's bounds within
  // the daemon's within the host's) are EINVAL naming the field and its bounds; a disk limit
  // that does not fit is ENOSPC saying how much is free. Nothing is recorded or made on the host
  // for a request refused this way. Blocking.
  Result<store::SandboxRecord> Create(const store::ApiKeyRecord& key, const CreateRequest& req,
                                      QuotaExceeded* quota = nullptr);
  // The sandbox if `key` owns it or is an operator key (ENOENT otherwise: other tenants' ids do
  // not exist).
  Result<store::SandboxRecord> Get(const store::ApiKeyRecord& key, const std::string& id);
  // The key's own sandboxes; for an operator key every key's, or those of filter.owner_key_id
  // when set (a tenant's filter.owner_key_id is ignored).
  Result<store::SandboxPage> List(const store::ApiKeyRecord& key, store::SandboxFilter filter);
  // The template of a create that names none.
  const std::string& default_template() const { return config_.default_template; }
  // The daemon-wide maximum timeout (a key's is within it): what the facades check a timeout
  // against before any arithmetic.
  int64_t max_timeout_ms() const { return limits_.daemon().max_timeout_ms; }
  // Kills a live sandbox of `key` (any key's for an operator key).
  Status Kill(const store::ApiKeyRecord& key, const std::string& id);
  // Pauses a running sandbox. With `keep_memory` its box is frozen (resumed as it was); without,
  // only its filesystem is kept: its writable layer becomes the top of its recorded layers and
  // its box (processes, memory, network) goes, so a resume makes a new box of them (a new boot:
  // a new boot id; E2B's pause({keepMemory: false})). ENOTSUP without memory for a sandbox
  // created before snapshots existed (it has no recorded layers).
  Status Pause(const store::ApiKeyRecord& key, const std::string& id, bool keep_memory = true);
  Status Resume(const store::ApiKeyRecord& key, const std::string& id);

  // ---- Snapshots and forks (issue 14; docs/api.md "Snapshots") ----
  // A snapshot of a running or paused sandbox of `key` (use access): the box is frozen while its
  // writable layer is copied (a paused one already is; one paused without memory needs no copy),
  // and the copy, over the layers the box mounts, becomes a template private to `key`
  // (TemplateBuilds::AddSnapshot, with `name` when not empty) that any create of `key` may name.
  // EBUSY while it is being created; ENOTSUP for a sandbox created before snapshots existed;
  // ENOSPC when the copy does not fit in the template cache's bound or the free space above the
  // disk reserve.
  Result<SnapshotInfo> Snapshot(const store::ApiKeyRecord& key, const std::string& id,
                                const std::string& name);
  Result<std::vector<SnapshotInfo>> ListSnapshots(const store::ApiKeyRecord& key,
                                                  const std::string& sandbox_id,
                                                  const std::string& name);
  Status DeleteSnapshot(const store::ApiKeyRecord& key, const std::string& id_or_name);
  // `count` (1..kMaxForks) new sandboxes of `key` from one snapshot of sandbox `id`, which keeps
  // running: each a create with the source's env, metadata, limits, network policy, E2B rules,
  // secrets, port access and on-timeout action, and a timeout of `timeout_ms` (0: the source's).
  // The snapshot is not kept as a template (the forks' pins keep its layer while they live). On
  // this runtime a fork carries the filesystem, not memory: its processes are not running. Each
  // fork succeeds or fails on its own (quota, rate, host): one answer per fork, in order.
  Result<std::vector<Result<store::SandboxRecord>>> Fork(const store::ApiKeyRecord& key,
                                                         const std::string& id, int count,
                                                         int64_t timeout_ms);
  // Replaces the network policy of a live sandbox of `key` (use access) and, when given, its E2B
  // egress rules, in one transition: a running or paused box's new connections see it at once
  // (network::Stack::Update), and the record says it, so it survives pause, resume and restarts.
  // EINVAL for a policy the daemon cannot give (no networking: kNetworkingOff); EBUSY for a
  // policy with a network on a sandbox created without one (its namespace has no interface).
  Result<store::SandboxRecord> SetNetwork(const store::ApiKeyRecord& key, const std::string& id,
                                          const network::Policy& policy,
                                          const std::string* egress_rules = nullptr);
  // An event of the network stack (a refused connection, denied DNS names, a secret's use) as an
  // audit event of its sandbox, with the sandbox's owner key. Cheap (no store read): the stack's
  // threads call it.
  void AuditNetwork(const network::NetEvent& e);
  // What the network refused sandbox `id` at or after `since_ms` (wall ms of the system clock)
  // and its policy's summary (network::Stack::Refusals); empty without networking.
  network::BoxRefusals NetworkRefusals(const std::string& id, int64_t since_ms);
  // Whether this daemon has networking (a stack): the E2B facade's default depends on it.
  bool networking_enabled() const { return config_.network != nullptr; }
  // The policy of E2B builds' RUN steps (ManagerConfig::e2b_build_network).
  const network::Policy& e2b_build_network() const { return config_.e2b_build_network; }

  // Sets the timeout to `timeout_ms` from now (resets the TTL); EINVAL outside the key's range.
  // With `extend_only`, a running sandbox's expiry only ever moves later (E2B's refresh), read
  // and written in one transition.
  Result<store::SandboxRecord> SetTimeout(const store::ApiKeyRecord& key, const std::string& id,
                                          int64_t timeout_ms, bool extend_only = false);
  // E2B's connect, as one transition: a paused sandbox is resumed with a timeout of
  // `timeout_ms` from now; a running one's timeout is set to `timeout_ms` from now only if that
  // is later than its current expiry (connect never shortens a sandbox's life). EINVAL for a
  // timeout out of range, ENOENT for an ended sandbox; one being created is waited for. Blocking.
  Result<Connected> Connect(const store::ApiKeyRecord& key, const std::string& id,
                            int64_t timeout_ms);
  Result<runtime::BoxStats> Stats(const store::ApiKeyRecord& key, const std::string& id);
  // The OOM kills so far of sandbox `id`'s box (BoxStats::oom_kills alone), for a Session, whose
  // owner was checked when it opened: read on every command, so no store read here. 0 when it
  // cannot be known (no box any more, a runtime that cannot say).
  uint64_t OomKills(const std::string& id);
  // The sampled history of a sandbox's figures (sandbox/metrics_history.h) from start_ms to
  // end_ms, inclusive, oldest first; a running sandbox not sampled yet is sampled now, so a new
  // sandbox has one. Who may read it: as Get.
  Result<std::vector<MetricSample>> Metrics(const store::ApiKeyRecord& key, const std::string& id,
                                            int64_t start_ms, int64_t end_ms);
  // Samples every running sandbox into the history and forgets the ended ones. The TTL loop
  // calls it every kMetricsPeriodMs of the config's clock; public for tests.
  void SampleMetrics();

  // ---- Warm pools (pool.h; sandbox/pool.cc) ----
  // Sets the size of the pool of `spec.template_name` (0 empties it), made if new: the refill
  // makes or removes boxes in the background. EINVAL for a name that is no registered template
  // (or a snapshot: those are their key's alone) or a size out of 0..kMaxPoolSize. Not kept
  // across restarts: the pools of `sbx serve --pool` are the lasting ones.
  Status SetPool(const PoolSpec& spec);
  std::vector<PoolStatus> Pools();
  // Starts the refill thread (after Reconcile, which adopts the pooled boxes a restart found);
  // Stop() ends it. EINVAL when a pool of the config names no template.
  Status StartPools();
  // One pass of the refill: a box for each pool short of its size, surplus ones removed. Whether
  // it did anything; `failed` when a box could not be made. The refill thread's; public for tests.
  bool RefillPass(bool* failed);

  // ---- What the facades need of the store, through the manager (they never call it) ----
  // The active key whose secret this is; nullopt for an unknown or revoked one (api/auth.h).
  Result<std::optional<store::ApiKeyRecord>> VerifyKey(const std::string& secret);
  // The registered template a create of `key` naming `name` would use (an alias resolved to its
  // target), or nullopt when no template has that name (or it is another key's snapshot).
  Result<std::optional<std::string>> RegisteredTemplate(const store::ApiKeyRecord& key,
                                                        const std::string& name);
  // How many sandboxes `key` sees (every key's for an operator key) in any of `states`.
  Result<int64_t> CountSandboxes(const store::ApiKeyRecord& key,
                                 const std::vector<std::string>& states);
  // The newest `limit` audit events of sandbox `id`, which `key` may inspect (as Get).
  Result<std::vector<store::AuditEvent>> AuditTrail(const store::ApiKeyRecord& key,
                                                    const std::string& id, size_t limit);
  // Audit events as `q` says (/v1/audit). No ownership check here: the caller scopes the query
  // (q.key_id for a tenant key, a sandbox_id the key may inspect).
  Result<std::vector<store::AuditEvent>> QueryAudit(const store::AuditQuery& q);

  // The running sandbox `id` and its owner's key (active), for checks of tokens derived from the
  // owner key (traffic tokens, envd tokens) ONLY: no key is verified here, so the caller must prove
  // ownership with such a token before acting on what this returns. nullopt when there is none
  // (unknown, paused, ended, or its owner key revoked). With `auto_resumable`, also a sandbox
  // paused with its memory that a request resumes (auto_resume): AutoResume it once the request
  // has proven its right.
  struct OwnedSandbox {
    store::SandboxRecord record;
    store::ApiKeyRecord owner;
  };
  Result<std::optional<OwnedSandbox>> OwnedBy(const std::string& id, bool auto_resumable = false);
  // Resumes sandbox `id` of `owner` if it is paused with its memory and made to be resumed by a
  // request (E2B's autoResume), with its timeout from now; a running one is returned as it is.
  // EBUSY otherwise. Blocking.
  Result<store::SandboxRecord> AutoResume(const store::ApiKeyRecord& owner, const std::string& id);

  // ---- Secrets (issue 12, item 6; sandbox/secrets.cc). A key names only its own. ----
  // EINVAL naming the field, EEXIST for a taken name (unless in.replace). Audited secret.put.
  Result<store::SecretRecord> AddSecret(const store::ApiKeyRecord& key, const SecretInput& in);
  Result<std::vector<store::SecretRecord>> ListSecrets(const store::ApiKeyRecord& key);
  // By name or id; ENOENT when the key has none such.
  Result<store::SecretRecord> GetSecret(const store::ApiKeyRecord& key,
                                        const std::string& name_or_id);
  Status DeleteSecret(const store::ApiKeyRecord& key, const std::string& name_or_id);
  // The bindings of a create's "secrets" (env var -> secret name) for network::BoxNetRequest:
  // values opened, a fresh random placeholder ("sbx_secret_" + 32 hex) per variable. EINVAL
  // naming every unknown name (or bad variable name) at once.
  Result<std::vector<network::SecretBinding>> BindSecrets(
      const store::ApiKeyRecord& key, const std::map<std::string, std::string>& env_to_name);

  // ---- Templates built through the API: ownership, builds, uploads (sandbox/templates.h) ----
  TemplateBuilds& templates() { return *builds_; }

  // ---- Health of the store, for /healthz and /metrics ----
  // A trivial read of the store.
  Status PingStore();
  // Whether the store can write; after `probe_after_ms` without a write, a small probe write
  // refreshes the answer (Store::CheckWritable).
  store::WriteHealth CheckStoreWritable(int64_t probe_after_ms);
  // Whether the store's last write succeeded (no probe).
  store::WriteHealth StoreWriteHealth();
  // PRAGMA quick_check: slow and locks the store meanwhile; never once per request.
  Status CheckStoreIntegrity();
  // The audit queue's counters (store/audit_queue.h).
  store::AuditQueueCounters AuditCounters();
  // Every key's live records (creating, running, paused), for /metrics.
  Result<std::vector<store::SandboxRecord>> LiveRecords();

  // The sandbox as Get() says, once no transition of it is in flight: a kill closes the agent
  // connection before it records the end, so a facade whose stream from the box ended asks this
  // to tell a killed sandbox from a dropped connection. Blocking (for the transition).
  Result<store::SandboxRecord> Settled(const store::ApiKeyRecord& key, const std::string& id);
  // A way to `port` on a running sandbox's loopback (EBUSY when it is paused): a TCP socket in
  // its network namespace, not connected yet (connected false: connect it to 127.0.0.1:port);
  // or, where the runtime has no namespace the host can open one in (gVisor), a stream the
  // box's agent connected there (connected true: bytes go as they are; the agent's errno, such
  // as ECONNREFUSED, when it could not connect).
  struct PortSocket {
    UniqueFd fd;
    bool connected = false;
  };
  Result<PortSocket> TcpSocket(const store::ApiKeyRecord& key, const std::string& id, int port);

  // The agent connection of a running sandbox (EBUSY when paused), shared by every caller and
  // re-established after the agent connection drops. Single-flight: while one caller connects,
  // the others wait for its result, so a sandbox never has more than one connection from the
  // daemon. A new connection runs on the executor of the caller that made it. `record`, when
  // given, gets the record the owner and state checks read (a Session's, without a second read).
  boost::asio::awaitable<Result<std::shared_ptr<AgentChannel>>> Channel(
      const store::ApiKeyRecord& key, const std::string& id,
      store::SandboxRecord* record = nullptr);

  // Records an audit event through the store's AuditQueue: never fails a call; an event the
  // store cannot take is counted, kept in memory and retried (store/audit_queue.h).
  void Audit(const std::string& type, const std::string& sandbox_id, const std::string& key_id,
             nlohmann::json detail = nlohmann::json::object());
  // The same for the data plane's events (a command's start and exit, a file written or moved):
  // handed to the queue's thread instead of written before the call goes on (AppendSoon: the
  // order holds and readers see them; a SIGKILL in the moment after loses them).
  void AuditSoon(const std::string& type, const std::string& sandbox_id, const std::string& key_id,
                 nlohmann::json detail);

  // Kills or pauses every sandbox whose timeout has passed, and kills every live sandbox whose
  // owner key has been revoked (`sbx key revoke` writes the store directly, from another
  // process: this scan is how the daemon learns of it). Also retries the record writes that
  // failed after a box was destroyed. A sandbox busy with another call (a snapshot's copy, say)
  // is left to the next scan rather than waited for. Called by the TTL loop; public for tests.
  void ExpireDue();
  // Starts the TTL thread, which calls ExpireDue every `period` (of the config's clock) until
  // Stop(), and the worker that makes the pauses without memory timeouts ask for, one at a time
  // off that thread: a copy of a box's files, and now and then a merge of its layers, can take
  // seconds no other sandbox's timeout should wait. (Without the loop, as in tests that call
  // ExpireDue, the scan makes them itself.)
  void StartTtlLoop(std::chrono::milliseconds period = std::chrono::milliseconds(500));
  // Stops the TTL and pool threads and finishes the queued cleanups.
  void Stop();

  // A kill answers once the sandbox's processes are dead (its record says so); its box's files,
  // cgroups and network are removed after, in the background (cleanups.h). These wait for that:
  // for one sandbox, or for everything queued. false when `timeout` passed first.
  bool AwaitCleanup(const std::string& id, std::chrono::milliseconds timeout);
  bool AwaitCleanups(std::chrono::milliseconds timeout);
  // Sandboxes whose box is still being removed.
  std::vector<std::string> PendingCleanups();

  ManagerCounters counters();
  // The runtimes sbx knows and whether this host has each (runtime/router.h).
  std::vector<runtime::RuntimeInfo> Runtimes() const { return runtime_.Runtimes(); }
  // The latency histograms and counters of creates (observed here) and commands (by Session),
  // whichever facade asked.
  SandboxMetrics& metrics() { return metrics_; }
  // Live sandboxes of every key with their stats, for /metrics.
  std::vector<std::pair<store::SandboxRecord, runtime::BoxStats>> LiveStats();

 private:
  // What a caller wants to do with a sandbox (see "Ownership" above).
  enum class Access { kInspect, kKill, kUse };
  Result<store::SandboxRecord> Owned(const store::ApiKeyRecord& key, const std::string& id,
                                     Access access);
  // The record of `id` as the manager knows it: an ended record whose write is still pending
  // (unwritten_) wins over the store's.
  Result<std::optional<store::SandboxRecord>> Record(const std::string& id);

  // Holds the per-sandbox lock of one id for one transition (see the top of this file). Lock
  // order: a Transition, then mu_, then the store's own lock; never two Transitions at once.
  struct TransitionEntry;
  class Transition {
   public:
    Transition(Manager& m, const std::string& id, const char* op);
    // Takes the lock only if it is free: owns() says whether it did. (The hook
    // on_transition_wait is called when it is not, as when a caller waits.)
    Transition(Manager& m, const std::string& id, const char* op, std::try_to_lock_t);
    ~Transition();
    Transition(const Transition&) = delete;
    Transition& operator=(const Transition&) = delete;
    bool owns() const { return owns_; }

   private:
    void Release();  // forgets this user of the entry
    Manager& m_;
    std::string id_;
    TransitionEntry* entry_;
    bool owns_ = false;
  };
  // Under the sandbox's Transition: kills or pauses (as its on_timeout says) the running
  // sandbox `rec` whose timeout has passed. A pause without memory that fails pauses with memory.
  void TimeoutLocked(store::SandboxRecord& rec);
  // The worker of StartTtlLoop: makes the queued pauses without memory until Stop().
  void TtlPauseWorker();
  // Under the sandbox's Transition: the record as it is now, if it is still live (ENOENT "is
  // killed" otherwise, with the state).
  Result<store::SandboxRecord> LiveRecord(const std::string& id);
  // Writes a record that ends a sandbox whose box is gone; see the top of this file for what a
  // failed write does. Under the sandbox's Transition.
  void WriteEnded(const store::SandboxRecord& rec);
  // Writes the ended records kept by WriteEnded; those written are forgotten.
  void RetryUnwritten();
  // Destroys the box of `rec` and records it ended, in `end_state` (killed, or failed for a box
  // that lost its agent), in one write; rec.error, if set, is kept. Under the sandbox's
  // Transition.
  Status KillLocked(store::SandboxRecord rec, const std::string& reason,
                    nlohmann::json detail = nlohmann::json::object(),
                    const char* end_state = store::kStateKilled);
  // Freeze and thaw with their record writes (undone when the write fails). Under the sandbox's
  // Transition; `rec` is its live record, updated on success.
  Status PauseLocked(store::SandboxRecord& rec, const std::string& key_id);
  Status ResumeLocked(store::SandboxRecord& rec, const std::string& key_id);
  // Pause without memory, and the resume that makes a new box of the recorded layers. Under the
  // sandbox's Transition.
  // Drops the pins of `rec` on its layers that `layers` (its new ones) no longer lists.
  void UnpinReplaced(const store::SandboxRecord& rec, const std::vector<std::string>& layers);
  Status PauseToDiskLocked(store::SandboxRecord& rec, const std::string& key_id);
  Status ResumeFromDiskLocked(store::SandboxRecord& rec, const std::string& key_id);
  // Copies the writable layer of the box of `rec` (frozen meanwhile when it runs; left frozen
  // with `stay_frozen`) into the template cache as layer `layer_id`, pinned for the sandbox and
  // charged to key `charged` (EDQUOT past its max_saved_bytes, before anything is frozen when it
  // has no room left at all). Returns the sandbox's layers with it: on top, or in place of the
  // topmost when the box's writable layer began as a copy of that one
  // (runtime::Box::holds_top_layer).
  // With `merges` (a pause without memory), the sandbox's own layers are merged after
  // (MergeOwnLayers), and a sandbox at its runtime's most layers may take one more if they are.
  Result<std::vector<std::string>> CaptureLayer(const store::SandboxRecord& rec,
                                                const std::string& layer_id, bool stay_frozen,
                                                const std::string& charged, bool merges = false);
  // A sandbox paused without memory again and again gains a layer of its own each time
  // ("disk-<id>-..." at the top of `layers`, the first just captured and pinned): past
  // kMostOwnLayers, or past `most` layers in all, they become one new layer (pinned for it,
  // charged to `charge`, copied within `limit` bytes). Returns the layers with it, or `layers`
  // as they were when there is nothing to merge. The newest layer's pin goes; the caller drops
  // those of the older ones (UnpinReplaced).
  // Whether `layer` is one of `rec`'s own (a pause without memory's: "disk-<id>-...").
  static bool IsOwnLayer(const store::SandboxRecord& rec, const std::string& layer);
  Result<std::vector<std::string>> MergeOwnLayers(const store::SandboxRecord& rec,
                                                  std::vector<std::string> layers, size_t most,
                                                  int64_t limit, storage::LayerCharge charge);
  // Snapshot under the sandbox's Transition. Without `files` the snapshot is the sandbox's
  // layers alone (a vm fork's: its files travel with its saved memory).
  Result<SnapshotInfo> SnapshotLocked(const store::ApiKeyRecord& key,
                                      const store::SandboxRecord& rec, const std::string& name,
                                      bool files = true);
  // Makes the box of `rec` from `tmpl`'s layers and binds, with a network for `policy` (its
  // `secrets` bound) when the daemon has one; rec.env gets the network's variables. A network
  // prepared for it is the caller's to release when this fails. With `restore_memory` the box
  // starts from that saved memory instead of a boot.
  Result<runtime::Box> MakeBox(store::SandboxRecord& rec, const storage::Template& tmpl,
                               const network::Policy& policy,
                               std::vector<network::SecretBinding> secrets,
                               const std::string& restore_memory = "");
  // Closes the agent channel of sandbox `id` (its box is going).
  void CloseChannel(const std::string& id);
  // The box of a sandbox whose pause was recorded without one goes (processes, files, network);
  // `how` for the log when it cannot.
  void RemovePausedBox(const runtime::Box& box, const char* how);
  // Pauses a vm sandbox with its memory saved to disk (its box stops: the host's memory is
  // freed). ENOTSUP, before anything changes, for a box QEMU cannot save.
  Status PauseMemoryLocked(store::SandboxRecord& rec, const std::string& key_id);
  // A new directory for a box's saved memory, under <data_dir>/memory.
  Result<std::string> NewMemoryDir(const std::string& name);
  // Writes `paused`, the record of the pause of `rec` whose box is frozen; a write that fails
  // thaws the box again (the pause did not happen), or, when that fails too, fails the sandbox.
  Status RecordPause(const store::SandboxRecord& rec, const store::SandboxRecord& paused,
                     const runtime::Box& box);
  // The record write of a pause or resume failed (`why`) and could not be undone (`undo`): the
  // box and its record would disagree, so the box is destroyed and the record fails.
  Status FailUnrecordable(store::SandboxRecord rec, const Status& why, const Status& undo);
  // The limits checks of Create that depend on the host's disk space.
  Status CheckHostLimits(const store::SandboxLimits& l);
  // The box of `rec` lost its agent (`how`): its resources are freed and the record fails.
  void MarkAgentExited(store::SandboxRecord rec, const std::string& how);
  bool TakeCreateToken(const store::ApiKeyRecord& key, double* retry_after_s);
  Result<runtime::Box> BoxOf(const std::string& id);
  // A box known only by its record (after a restart, or never made): its id and runtime.
  static runtime::Box BoxOfRecord(const store::SandboxRecord& rec);
  // The runtime a create of `key` gets: `asked`, or the template's own, or native. EINVAL for a
  // name sbx does not know or one this host lacks (saying why), EPERM for one the key may not
  // choose.
  Result<std::string> ChooseRuntime(const store::ApiKeyRecord& key, const std::string& asked,
                                    const storage::Template& tmpl);
  // ---- Warm pools (sandbox/pool.cc) ----
  // A pooled box for the create `req` (its limits and timeout filled in) of `key`, template
  // `tmpl_name`, when a pool has one that fits (pool.h); nullopt to make one cold. The answer is
  // the create's: the running record, or why the claim failed (quota).
  Result<std::optional<store::SandboxRecord>> ClaimPooled(const store::ApiKeyRecord& key,
                                                          const CreateRequest& req,
                                                          const std::string& tmpl_name);
  // Makes one pooled box of `tmpl_name` and records it; its id.
  Result<std::string> FillOne(const std::string& tmpl_name);
  // Removes the pooled box `id`: its box, then its record and pins.
  void DiscardPooled(const std::string& id);
  // Reconcile's part for the pooled records: adopted into their pools (as many as each wants),
  // the rest removed. The ids kept are added to `kept`.
  Status ReconcilePooled(std::set<std::string>& kept);
  // Wakes the refill; `claimed`: a create just took a box (the refill waits for a pause in them).
  void WakePools(bool claimed = false);
  // Whether a pool holds (or is making) less than half its size.
  bool PoolsLow();
  // What a successful create (cold or claimed) records: counters, latency, idempotency, audit.
  void Created(const store::ApiKeyRecord& key, const CreateRequest& req,
               const store::SandboxRecord& made, Clock::SteadyTime started, bool pooled);

  // Frees the network of box `id` (network::Stack::Release) if it has one; logs a failure.
  void ReleaseNetwork(const std::string& id);
  // The policy a record holds (a record's JSON that does not parse: none, logged).
  static network::Policy PolicyOf(const store::SandboxRecord& rec);
  // The secret bindings of sandbox `rec` for its network (sandbox/secrets.cc): its recorded env
  // bindings opened again with their placeholders, and the header bindings of E2B `rules`
  // (`egress_rules`, a JSON object). `strict`: a rule naming a secret its owner has not is
  // EINVAL; otherwise it is left out (logged), as are deleted secrets (audited secret.missing).
  Result<std::vector<network::SecretBinding>> SandboxBindings(const store::SandboxRecord& rec,
                                                              const std::string& egress_rules,
                                                              bool strict);
  // limits.egress_mbps as the proxy's bytes per second (0: unlimited).
  static int64_t EgressBytesPerSecond(const store::SandboxLimits& l);

  ManagerConfig config_;  // clock filled in by the constructor
  Clock& clock_;
  runtime::Runtime& runtime_;
  const storage::TemplateStore templates_;
  store::Store& store_;
  const Limits limits_;  // from config_.ranges

  Mutex mu_;
  std::map<std::string, std::unique_ptr<TransitionEntry>> transitions_ GUARDED_BY(mu_);
  std::map<std::string, runtime::Box> boxes_ GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<AgentChannel>> channels_ GUARDED_BY(mu_);
  // A connect in flight per sandbox (Channel's single flight).
  struct Connecting;
  std::map<std::string, std::shared_ptr<Connecting>> connecting_ GUARDED_BY(mu_);
  // Ended records whose write failed after their box was destroyed, by id.
  std::map<std::string, store::SandboxRecord> unwritten_ GUARDED_BY(mu_);
  struct Bucket {
    double tokens = 0;
    Clock::SteadyTime last;
  };
  std::map<std::string, Bucket> buckets_ GUARDED_BY(mu_);
  std::set<std::string> creating_keys_ GUARDED_BY(mu_);  // idempotency keys in flight
  // Boxes with a network of the stack's (prepared at create, or found at reconcile).
  std::map<std::string, std::string> networked_ GUARDED_BY(mu_);  // box id -> owner key id
  std::mutex disk_mu_;  // held from a create's free-space check until its disk is promised
  // Disk limits of creates between the space check and the box existing (its image then shows
  // in statvfs).
  int64_t disk_in_flight_ GUARDED_BY(mu_) = 0;
  ManagerCounters counters_ GUARDED_BY(mu_);
  MetricsHistory history_;                     // thread-safe on its own
  SandboxMetrics metrics_;                     // thread-safe itself
  std::unique_ptr<TemplateBuilds> builds_;     // thread-safe itself
  std::unique_ptr<Clock::Waiter> ttl_waiter_;  // woken by Stop()
  std::thread ttl_thread_;
  // Pauses without memory that timeouts asked for (StartTtlLoop): the ids queued, and those
  // queued or being paused, which the scan passes by.
  std::mutex ttl_work_mu_;
  std::condition_variable ttl_work_cv_;
  std::vector<std::string> ttl_work_;  // under ttl_work_mu_, oldest first
  std::set<std::string> ttl_pausing_;  // under ttl_work_mu_
  bool ttl_work_stop_ = false;         // under ttl_work_mu_
  bool ttl_async_ = false;             // set by StartTtlLoop before its threads start
  std::thread ttl_worker_;
  std::map<std::string, PoolState> pools_ GUARDED_BY(mu_);  // by template name
  std::mutex pool_wake_mu_;
  std::condition_variable pool_cv_;
  bool pool_wake_ = false;                            // under pool_wake_mu_
  bool pool_stop_ = false;                            // under pool_wake_mu_
  std::chrono::steady_clock::time_point last_claim_;  // under pool_wake_mu_
  std::thread pool_thread_;
  // Last: destroyed first, finishing its jobs while everything they use is still here.
  Cleanups cleanups_;
};

}  // namespace sbx::sandbox
