// Store: everything sbx serve must remember across restarts and crashes, in one SQLite file
// (<data dir>/sbx.db, WAL mode, 0600): sandboxes, API keys (hashed), the audit log, idempotency
// keys and the template registry. The schema, its migrations and the meaning of every column are
// in docs/store.md.
//
// Every method is one transaction, so each either happened completely or not at all, even if the
// process is killed mid-call. Times are int64 milliseconds since the Unix epoch. Errors are
// values: ENOENT for an unknown id, EEXIST for a duplicate, EINVAL for a malformed argument,
// otherwise the SQLite failure mapped to an errno (see db.h).
//
// Thread-safety: a Store is safe to use from any number of threads. Every method holds `mu_` for
// its whole duration on the store's connection, so calls are serialized; VerifyApiKey alone reads
// on a connection of its own (see there).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "store/db.h"

namespace sbx::store {

class AuditQueue;

// The file name of the store inside the data directory.
inline constexpr char kDbFileName[] = "sbx.db";

// Sandbox states. creating, running and paused are "live": a box may exist on the host for them.
// `pooled` is a warm pool's box no key owns yet (sandbox/pool.h): it has a box, but it is no
// tenant's sandbox, so it is not "live", and lists leave it out unless they ask for it.
inline constexpr char kStatePooled[] = "pooled";
inline constexpr char kStateCreating[] = "creating";
inline constexpr char kStateRunning[] = "running";
inline constexpr char kStatePaused[] = "paused";
inline constexpr char kStateKilled[] = "killed";
inline constexpr char kStateFailed[] = "failed";
bool IsValidState(std::string_view state);
bool IsLiveState(std::string_view state);

// What happens when a sandbox's timeout passes.
inline constexpr char kOnTimeoutKill[] = "kill";
inline constexpr char kOnTimeoutPause[] = "pause";

// Resource limits of a sandbox; 0 means "not limited" (or the runtime's default).
struct SandboxLimits {
  int64_t memory_bytes = 0;
  double cpus = 0;  // CPU time as a number of CPUs (1.5 = 150% of one core)
  int64_t cpu_weight = 0;
  int64_t pids = 0;
  int64_t disk_bytes = 0;
  double egress_mbps = 0;  // the egress proxy's rate for the box, Mbit/s each way; 0: unlimited
};

// What a sandbox's template says a command gets when the command says nothing, kept with the
// sandbox at create so a template changed or removed later does not change running sandboxes
// (column `defaults`, version 8). Empty for sandboxes created before: the agent's defaults.
struct TemplateDefaults {
  std::vector<std::string> env;  // "K=V"
  std::string user;              // "" = root
  std::string workdir;           // "" = the user's home
};

// The network column of a sandbox without networking.
inline constexpr char kNoNetwork[] = R"({"mode":"none"})";

// A secret a sandbox was created to use (column `secrets`, version 12): inside, `env` holds
// `placeholder`; the proxy puts the value of the owner's secret `secret` in its place. Not a
// secret by itself, but no API answer shows it.
struct SecretRef {
  std::string env;
  std::string secret;
  std::string placeholder;
  bool operator==(const SecretRef&) const = default;
};

// The runtime a box runs under (runtime/router.h): sandboxes record theirs, templates may name one.
inline constexpr char kRuntimeNative[] = "native";

struct SandboxRecord {
  std::string id;
  std::string template_name;  // column `template`
  std::string state;          // one of kState*
  std::string owner_key_id;   // the API key that created it; "" for the daemon itself
  std::map<std::string, std::string> metadata;
  std::map<std::string, std::string> env;
  SandboxLimits limits;
  int64_t timeout_ms = 0;
  std::string on_timeout = kOnTimeoutKill;  // kOnTimeoutKill or kOnTimeoutPause
  int64_t created_at = 0;                   // PutSandbox sets it to now when 0
  int64_t updated_at = 0;                   // PutSandbox sets it to now when 0
  int64_t expires_at = 0;                   // when the timeout fires; 0 = never
  int64_t ended_at = 0;                     // when it was killed or failed; 0 = not yet
  int64_t init_pid = 0;                     // host pid of the box's sbx-agent
  std::string agent_socket;
  std::string box_dir;
  std::string error;          // why it failed, for state = failed
  bool public_ports = false;  // its ports answer without the traffic token
  int64_t id_base = 0;        // host id of root inside its box (0: not created yet)
  bool idmapped = false;      // its shared layers are idmapped (false: the runtime's fallback)
  TemplateDefaults defaults;  // the template's env, user and workdir at create
  // Its network (version 10): the policy as network::Policy::ToJson writes it (empty: none), and
  // E2B's extras: `rules` (domain -> header transforms, a JSON object, for the secrets' proxy)
  // and maskRequestHost (the Host the ingress relay sends into the box; "" = the client's).
  std::string network = kNoNetwork;
  std::string egress_rules = "{}";
  std::string mask_request_host;
  // Its secret bindings (version 12); cleared when it ends.
  std::vector<SecretRef> secrets;
  // The template layers its box mounts, topmost first (version 15; empty for sandboxes created
  // before): what a snapshot stacks its own layer on, and what a box made again from the
  // filesystem (a paused sandbox without memory, resumed) mounts.
  std::vector<std::string> layers;
  // Paused without memory (version 15): its box is gone, its writable layer became the top of
  // `layers`; resuming makes a new box of them (a new boot).
  bool on_disk = false;
  // What the TTL's pause of an on_timeout=pause sandbox keeps: memory (freeze), or only the
  // filesystem (E2B's autoPauseMemory false).
  bool pause_memory = true;
  // The runtime its box runs under (version 16; kRuntimeNative before).
  std::string runtime = kRuntimeNative;
  // Paused with its memory on disk (version 17; the vm runtime): the directory its box's memory
  // was saved in (runtime::Runtime::SaveMemory), with on_disk set. Empty otherwise.
  std::string saved_memory;
  // A paused sandbox (with memory) is resumed by the first request for its envd or its ports
  // that proves its right to them (E2B's autoResume).
  bool auto_resume = false;
};

struct SandboxFilter {
  std::vector<std::string> states;                            // any of these; empty = every state
  std::string owner_key_id;                                   // empty = every owner
  std::vector<std::pair<std::string, std::string>> metadata;  // all must match exactly
  size_t limit = 100;                                         // clamped to 1..1000
  std::string after;          // the `next` token of the previous page; empty = first page
  bool oldest_first = false;  // order by created_at ascending
  // Only records created at or after this time (ms; inclusive, as E2B's startedAfter); 0 = any.
  int64_t created_since = 0;
  std::optional<std::string> template_name;  // only records of this template ("" = host)
};

struct SandboxPage {
  std::vector<SandboxRecord> items;  // newest first (created_at, then id), or oldest first
  std::string next;                  // opaque; empty when this is the last page
};

// The allowed range of each number a create asks for, a minimum and a maximum per limit; 0: not
// set here. A key's ranges (columns of api_keys, NULL when 0) narrow the daemon's (sbx serve
// --min-memory ...), whose unset bounds are the host's; sandbox/limits.h applies them.
struct LimitRanges {
  int64_t min_memory_bytes = 0;
  int64_t max_memory_bytes = 0;
  double min_cpus = 0;
  double max_cpus = 0;
  int64_t min_pids = 0;
  int64_t max_pids = 0;
  int64_t min_disk_bytes = 0;
  int64_t max_disk_bytes = 0;
  int64_t min_timeout_ms = 0;
  int64_t max_timeout_ms = 0;
  // limits.egress_mbps: the host's range only (no flag or key column narrows it yet).
  double min_egress_mbps = 0;
  double max_egress_mbps = 0;
  bool operator==(const LimitRanges&) const = default;
};

struct ApiKeyRecord {
  std::string id;      // "key_" + 12 random [a-z0-9]
  std::string name;    // for people
  std::string hash;    // SHA-256 of the secret, lowercase hex
  std::string prefix;  // the secret's first 8 characters ("e2b_1a2b"), to recognise it
  int64_t created_at = 0;
  int64_t revoked_at = 0;         // 0 = active
  int64_t max_sandboxes = 0;      // concurrent live sandboxes; 0 = unlimited
  double creates_per_second = 0;  // 0 = unlimited
  // An operator key (column `operator`) may also list, inspect and kill other keys' sandboxes.
  bool is_operator = false;
  LimitRanges ranges;  // this key's own bounds of its sandboxes' limits (0: the daemon's)
  // Runtimes a create of this key may ask for beside its template's own (version 16; operator
  // keys may ask for any).
  std::vector<std::string> runtimes;
  // Bytes of the template cache this key's saved files may hold (version 18): the layers in use
  // of its snapshots (forks' included) and of its sandboxes paused without memory (LayerRecord's
  // owner_key_id; Store::LayerBytesOwnedBy); 0 = unlimited (the cache's bound only).
  int64_t max_saved_bytes = 0;
  // Snapshots it may keep at once (version 18; forks' own, while their forks are made, count
  // too); 0 = unlimited.
  int64_t max_snapshots = 0;
  bool active() const { return revoked_at == 0; }
};

struct NewApiKey {
  ApiKeyRecord record;
  std::string secret;  // "e2b_" + 48 random hex digits (older keys: "sbx_" + 40 [a-z0-9]); shown
                       // once, never stored
};

struct AuditEvent {
  int64_t seq = 0;         // assigned by AppendAudit; increases, never reused
  int64_t time = 0;        // AppendAudit sets it to now when 0
  std::string sandbox_id;  // may be empty (auth.denied, key events)
  std::string key_id;      // the API key that caused it; may be empty
  std::string type;        // "sandbox.create", "command.exit", "auth.denied"...
  nlohmann::json detail = nlohmann::json::object();  // a JSON object (null counts as {})
};

struct AuditQuery {
  std::string sandbox_id;     // empty = any
  std::string key_id;         // empty = any; applied in SQL, before `limit`
  std::string type;           // empty = any
  int64_t since = 0;          // time >= since; 0 = no bound
  int64_t until = 0;          // time < until; 0 = no bound
  int64_t after_seq = 0;      // seq > after_seq: pass the last seq seen to get the next page
  int64_t before_seq = 0;     // seq < before_seq; 0 = no bound (the next page of newest_first)
  bool newest_first = false;  // order by seq descending
  size_t limit = 100;         // clamped to 1..10000
};

struct IdempotencyRecord {
  std::string key_id;        // the API key that sent the request
  std::string key;           // the Idempotency-Key header (column idem_key)
  std::string request_hash;  // of the request body, to tell a retry from a different request
  std::string sandbox_id;    // the sandbox the first request created
  int64_t created_at = 0;    // PutIdempotency sets it to now when 0
};

// Template kinds (column `kind`). See docs/storage.md for what each one is made of.
inline constexpr char kTemplateHost[] = "host";    // the built-in host template
inline constexpr char kTemplateAlias[] = "alias";  // another name of the template `alias_of`
inline constexpr char kTemplateDir[] = "dir";      // a snapshot of a rootfs directory
inline constexpr char kTemplateTar[] = "tar";      // an unpacked rootfs tarball
inline constexpr char kTemplateOci[] = "oci";      // an OCI image (imported or pulled; version 13)
inline constexpr char kTemplateBuild[] = "build";  // a Dockerfile or E2B build's result (v. 13)
// A sandbox's writable layer over the layers its box mounted (v. 15): private to the key that
// took it (its template_owners row), `sandbox_id` says of which sandbox.
inline constexpr char kTemplateSnapshot[] = "snapshot";

// Pins of ids with these prefixes belong to a build ("bld_...") or a pull ("pull_..."), not to a
// sandbox: they hold their layers until UnpinLayers(id). Their maker holds a lease on the id
// (storage::PinLease, a lock file) while it runs, and the cache sweep drops the pins of an id
// whose lease nobody holds (its maker died). DropOrphanPins leaves them alone.
inline constexpr std::string_view kBuildPinPrefix = "bld_";
inline constexpr std::string_view kPullPinPrefix = "pull_";
inline bool IsLeasePinId(std::string_view id) {
  return id.substr(0, kBuildPinPrefix.size()) == kBuildPinPrefix ||
         id.substr(0, kPullPinPrefix.size()) == kPullPinPrefix;
}

// A registered template. Names are checked by storage (storage::IsValidTemplateName); the store
// only refuses empty ones.
struct TemplateRecord {
  std::string name;
  std::string kind;      // one of kTemplate*
  std::string source;    // where it came from, for people: the path given to `sbx template add`
  std::string alias_of;  // kind alias: the template it stands for (never itself an alias)
  std::vector<std::string> layers;  // ids of template_layers rows, topmost first
  int64_t size_bytes = 0;           // of its layers
  int64_t created_at = 0;           // AddTemplate/PutTemplate set it to now when 0
  int64_t last_used_at = 0;         // UseTemplate sets it
  // Kinds oci and build: the image config (storage::ImageConfig as a JSON object, version 13);
  // "" for none. The store only checks that it is a JSON object.
  std::string config;
  std::string sandbox_id;  // kind snapshot: the sandbox it was taken of (version 15)
  std::string runtime;     // what its sandboxes run under; "": the daemon's default (version 16)
};

// Who built a template through an API (version 12): that key, and operator keys, may rebuild or
// delete it; no other key may. The row may exist before the template does (a build in flight or
// one that failed). Templates without a row are the operator's.
struct TemplateOwnerRecord {
  std::string name;
  std::string owner_key_id;
  std::string build_id;  // the latest build's
  int64_t created_at = 0;
  int64_t updated_at = 0;
};

// The SQL condition "the template_layers row `l` is in use" (docs/store.md, layer_pins), shared
// by the store's queries; its tests check that it reads indexes, not every template.
extern const char kLayerInUse[];

// A directory of the template cache (<templates dir>/layers/<id>), counted against its bound.
struct LayerRecord {
  std::string id;
  int64_t size_bytes = 0;
  int64_t created_at = 0;    // PutLayer sets it to now when 0
  int64_t last_used_at = 0;  // PutLayer sets it to created_at when 0; UseTemplate bumps it
  // The key whose sandbox saved it (a snapshot's or a pause without memory's layer, version 18),
  // charged for it against ApiKeyRecord::max_saved_bytes while it is in use, whoever uses it;
  // "" for the others (images, builds, directories: the operator's or shared).
  std::string owner_key_id;
};

// One taken slot of the box id pool (a range of 65536 host ids; the runtime maps slot numbers to
// ids).
struct IdSlot {
  int64_t slot = 0;
  std::string box_id;
  int64_t allocated_at = 0;
};

// A secret of one key (issue 12, item 6): its value only ever sealed (InstallSecret::Seal under
// purpose "secret" with context owner_key_id + '\0' + name), base64 in `sealed`; the store never
// sees the clear value. Names are checked by the sandbox layer; the store refuses empty ones.
struct SecretRecord {
  std::string id;  // "sec_" + random, given by the caller
  std::string owner_key_id;
  std::string name;    // unique per owner
  std::string sealed;  // base64 of the sealed value
  std::vector<std::string> hosts;
  std::string header;
  std::string format = "{}";
  std::map<std::string, std::string> metadata;  // E2B's
  int64_t version = 1;                          // bumped by every replace
  int64_t created_at = 0;                       // set by PutSecret
  int64_t updated_at = 0;
};

// How long an idempotency key is remembered.
inline constexpr int64_t kIdempotencyTtlMs = int64_t{24} * 60 * 60 * 1000;

class Store {
 public:
  // Opens the store at `path` (normally <data dir>/sbx.db), creating the file (0600) and any
  // missing parent directory (0711) and applying pending migrations. Fails with ENOTSUP if the
  // file was written by a newer sbx.
  // Times it stamps (created_at, updated_at, audit times, idempotency expiry) come from `clock`,
  // which must outlive the store.
  static Result<std::unique_ptr<Store>> Open(const std::string& path, Clock& clock = SystemClock());
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;
  ~Store();  // writes what the audit queue still holds, if it can

  const std::string& path() const { return path_; }
  // The schema version of the open database (== LatestSchemaVersion() after Open).
  int schema_version() const { return schema_version_; }
  // PRAGMA quick_check: "ok" or the first problems SQLite finds. Cost grows with the file size
  // and the store is locked meanwhile: not for every request (see Ping).
  Status CheckIntegrity();
  // A trivial read of the database (its schema version): cheap enough for every /healthz.
  Status Ping();
  // For a one-shot process (sbx run, the CLI): its commits checkpoint the WAL once it holds
  // `pages` pages, not SQLite's 1000. The first process to open the database after every other
  // connection closed rebuilds the WAL's index by reading the whole WAL (no connection
  // checkpoints at close, see Db::Open): a WAL kept short keeps that read short, at the cost of
  // a checkpoint (two fdatasyncs) every few runs.
  Status KeepWalShort(int pages = 64);
  // Whether the store could write when it last tried (see WriteHealth in db.h): the error of
  // the last write that failed for want of storage (ENOSPC, EIO, EROFS...), cleared by the next
  // write that commits a change. Costs no I/O.
  store::WriteHealth WriteHealth();
  // WriteHealth, first refreshed with a small write (a row inserted and deleted in one
  // transaction, so nothing is kept) when no write failed or changed anything for `probe_after_ms`:
  // a store that is failing learns when it can write again without waiting for a real write, and an
  // idle one learns that its disk filled. At most one probe per `probe_after_ms`, whoever asks.
  store::WriteHealth CheckWritable(int64_t probe_after_ms);
  // The queue that writes audit events for callers that must not fail (see audit_queue.h).
  AuditQueue& audit_queue() { return *audit_queue_; }

  // ---- sandboxes ----
  // Inserts `r` or replaces the record with the same id. EINVAL for an unknown state or
  // on_timeout, an empty id, or strings that are not valid UTF-8 in metadata/env.
  Status PutSandbox(const SandboxRecord& r);
  // Inserts a new record (EEXIST if the id is taken) in one transaction with a quota check: when
  // `max_live` > 0 and r.owner_key_id already has that many live sandboxes, nothing is written
  // and the answer is EDQUOT. Concurrent creates at the quota therefore never exceed it.
  Status InsertSandbox(const SandboxRecord& r, int64_t max_live = 0);
  // Writes `r` over the `pooled` record of the same id (a warm pool's box claimed by a create) in
  // one transaction with the quota check of InsertSandbox: EDQUOT as there, ENOENT when there is
  // no such pooled record (another create claimed it, or it was removed).
  Status ClaimSandbox(const SandboxRecord& r, int64_t max_live = 0);
  Result<std::optional<SandboxRecord>> GetSandbox(const std::string& id);
  // Reads, changes and writes back one record atomically: `change` runs under the store's lock
  // with the current record (it must not call the Store). If it returns an error nothing is
  // written and that error is returned. updated_at is set to now. ENOENT for an unknown id.
  Result<SandboxRecord> UpdateSandbox(const std::string& id,
                                      const std::function<Status(SandboxRecord&)>& change);
  // Newest first with a cursor that stays correct while sandboxes are created between pages.
  // EINVAL for a malformed `after` token. `pooled` records only when f.states names them.
  Result<SandboxPage> ListSandboxes(const SandboxFilter& f);
  // Every sandbox in a live state (creating, running, paused), oldest first: for reconciliation
  // after a restart and for the TTL scanner.
  Result<std::vector<SandboxRecord>> ListLiveSandboxes();
  // ENOENT if there is no such sandbox.
  Status DeleteSandbox(const std::string& id);
  // Sandboxes of `owner_key_id` ("" = every owner) in any of `states` (empty = every state).
  Result<int64_t> CountSandboxes(const std::string& owner_key_id,
                                 const std::vector<std::string>& states);

  // ---- API keys ----
  // Generates a key with a fresh secret. The secret is in the result only; the store keeps its
  // hash. EINVAL for negative quotas, and for ranges with a negative or non-finite bound or a
  // minimum above its maximum (naming the field).
  Result<NewApiKey> CreateApiKey(const std::string& name, int64_t max_sandboxes,
                                 double creates_per_second, bool is_operator = false,
                                 const LimitRanges& ranges = {}, int64_t max_saved_bytes = 0,
                                 int64_t max_snapshots = 0);
  // Sets the runtimes key `id` may ask for beside its templates' own (names as runtime/router.h
  // knows them; EINVAL for another). ENOENT for an unknown id.
  Status SetApiKeyRuntimes(const std::string& id, const std::vector<std::string>& runtimes);
  // The key whose secret this is, if it exists and is not revoked; nullopt otherwise. Every HTTP
  // request asks this on the server's I/O thread: it reads on a second connection (opened at
  // the first call), so it never waits for the store's other calls, however slow (a commit that
  // checkpoints the WAL, a long transaction): WAL readers do not wait for the writer. A revoked
  // key is refused from the revocation's commit on, as each call reads the newest commit.
  Result<std::optional<ApiKeyRecord>> VerifyApiKey(const std::string& secret);
  Result<std::optional<ApiKeyRecord>> GetApiKey(const std::string& id);
  // Every key, revoked ones included, oldest first.
  Result<std::vector<ApiKeyRecord>> ListApiKeys();
  // Revokes a key for good (revoking twice keeps the first time). ENOENT for an unknown id.
  // The key's live sandboxes are not touched here: the daemon's manager kills them on its next
  // scan (sandbox::Manager::ExpireDue), whichever process revoked the key.
  Status RevokeApiKey(const std::string& id);

  // ---- audit log ----
  // Appends `e` and returns its seq. EINVAL if `type` is empty or `detail` is not an object.
  Result<int64_t> AppendAudit(const AuditEvent& e);
  // Appends `events` in one transaction, in order (all or none). EINVAL when one is invalid.
  Status AppendAudits(const std::vector<AuditEvent>& events);
  // Matching events in seq order, at most q.limit of them.
  Result<std::vector<AuditEvent>> QueryAudit(const AuditQuery& q);
  // Deletes events older than `before` (ms), at most `max_rows` of them (0 = all, in one
  // transaction); returns how many. Retention deletes in batches so other calls are not held up
  // behind one long delete. Seqs are never reused.
  Result<int64_t> PurgeAuditBefore(int64_t before, int64_t max_rows = 0);

  // ---- idempotency keys ----
  // The record for (key_id, key) if one was stored in the last 24 hours.
  Result<std::optional<IdempotencyRecord>> GetIdempotency(const std::string& key_id,
                                                          const std::string& key);
  // Stores `r`, first forgetting records older than 24 hours. EEXIST if (key_id, key) is
  // already stored: the caller lost a race with an earlier request and should read that one.
  Status PutIdempotency(const IdempotencyRecord& r);
  // Forgets (key_id, key), e.g. when the create it guarded failed. Missing is fine.
  Status DeleteIdempotency(const std::string& key_id, const std::string& key);

  // ---- templates ----
  // Registers `t`. EEXIST if the name is taken; EINVAL for an empty name, an unknown kind, an
  // alias of a missing template or of an alias; ENOENT if one of its layers is not recorded.
  Status AddTemplate(const TemplateRecord& t);
  // As AddTemplate, but replaces a template of the same name (the host template's layer).
  Status PutTemplate(const TemplateRecord& t);
  Result<std::optional<TemplateRecord>> GetTemplate(const std::string& name);
  Result<std::vector<TemplateRecord>> ListTemplates();  // by name
  // ENOENT if missing; EBUSY while aliases point to it.
  Status DeleteTemplate(const std::string& name);
  // Sets the runtime template `name`'s sandboxes run under ("": the daemon's default). ENOENT if
  // missing; EINVAL for an alias (its template's is the one that counts) or a name not of 1 to 16
  // [a-z0-9] (which runtimes exist is the caller's to check: runtime::kRuntimeNames).
  Status SetTemplateRuntime(const std::string& name, const std::string& runtime);
  // The template `name` stands for (an alias is followed), in one transaction with: pinning its
  // layers for sandbox `pin_for` (unless empty) and noting the use (last_used_at) of the
  // template, the alias and the layers. nullopt for an unknown name.
  Result<std::optional<TemplateRecord>> UseTemplate(const std::string& name,
                                                    const std::string& pin_for);

  // ---- template owners (version 12) ----
  // Claims `name` for `owner_key_id` with build `build_id`, in one transaction: inserts the row,
  // or notes the new build (build_id, updated_at) when `owner_key_id` or, with `override`, any
  // key holds it (the row then names `owner_key_id`). EPERM when another key holds it, or when
  // a template of that name exists that no key holds (the operator's or a built-in), unless
  // `override` and it is not the host template or an alias. EINVAL for empty arguments.
  Result<TemplateOwnerRecord> ClaimTemplate(const std::string& name,
                                            const std::string& owner_key_id,
                                            const std::string& build_id, bool override = false);
  // Claims the new snapshot id `id` (its row names itself as its build) for `owner_key_id`,
  // counted in the same transaction against `max_snapshots` of that key's snapshot rows (0: no
  // bound): EDQUOT at the bound, EEXIST for a taken id.
  Status ClaimSnapshot(const std::string& id, const std::string& owner_key_id,
                       int64_t max_snapshots);
  // The snapshots `owner_key_id` holds (its rows of ClaimSnapshot).
  Result<int64_t> CountSnapshots(const std::string& owner_key_id);
  // ClaimSnapshot's EDQUOT, for a check made before it.
  static Status SnapshotsAtBound(const std::string& owner_key_id, int64_t max_snapshots);
  Result<std::optional<TemplateOwnerRecord>> GetTemplateOwner(const std::string& name);
  // The rows of `owner_key_id` ("" = every key's), by name.
  Result<std::vector<TemplateOwnerRecord>> ListTemplateOwners(const std::string& owner_key_id);
  // Forgets the row of `name` (missing is fine).
  Status DeleteTemplateOwner(const std::string& name);

  // ---- template layers ----
  // Records a layer (or updates its size; its owner stays the first one's). EINVAL for an empty
  // id or a negative size. With `pin_for`, the layer is pinned for it in the same transaction.
  Status PutLayer(const LayerRecord& l, const std::string& pin_for = "");
  // Pins the recorded layer `layer_id` for `pin_for` (a sandbox, build or pull id) and notes its
  // use. ENOENT if the layer is not recorded (checked in the same transaction).
  Status PinLayer(const std::string& pin_for, const std::string& layer_id);
  // The distinct ids of lease pins (IsLeasePinId) that hold any layer.
  Result<std::vector<std::string>> LeasePinOwners();
  Result<std::optional<LayerRecord>> GetLayer(const std::string& id);
  Result<std::vector<LayerRecord>> ListLayers();  // least recently used first
  Result<int64_t> LayerBytes();                   // the sum of every layer's size
  // The sum of the sizes of the layers in use (not UnusedLayers: those go first when the cache
  // needs room) that `owner_key_id` owns (LayerRecord::owner_key_id; not "").
  Result<int64_t> LayerBytesOwnedBy(const std::string& owner_key_id);
  // Layers that no template references and no pin of a live sandbox (or of a sandbox that has
  // no record yet: a create in flight) holds, least recently used first. Pins of sandboxes that
  // are no longer live are forgotten on the way.
  Result<std::vector<LayerRecord>> UnusedLayers();
  // Forgets an unused layer (see UnusedLayers), checked in the same transaction. ENOENT if
  // missing, EBUSY if it is in use.
  Status DeleteLayer(const std::string& id);
  // Forgets the pins of `sandbox_id` (missing is fine).
  Status UnpinLayers(const std::string& sandbox_id);
  // Forgets the pin of `sandbox_id` on layer `layer_id` (missing is fine).
  Status UnpinLayer(const std::string& sandbox_id, const std::string& layer_id);
  // Forgets pins of sandboxes that have no record: creates that died before recording their
  // sandbox. Only correct while no create is in flight (the daemon calls it before serving).
  // Lease pins (IsLeasePinId) are not a sandbox's and stay.
  Result<int64_t> DropOrphanPins();

  // ---- secrets (one owner's each; another owner's do not exist) ----
  // Inserts `r`; with `replace`, a secret of the same owner and name is replaced instead (its id
  // and created_at kept, version + 1). EEXIST for a taken name without `replace`. Returns the
  // record as stored.
  Result<SecretRecord> PutSecret(const SecretRecord& r, bool replace);
  // The owner's secret whose name or id is `name_or_id`.
  Result<std::optional<SecretRecord>> GetSecret(const std::string& owner_key_id,
                                                const std::string& name_or_id);
  Result<std::vector<SecretRecord>> ListSecrets(const std::string& owner_key_id);  // by name
  // Whether a secret of id `id` exists under some owner (not its name or value): only for the
  // audit of a key naming another key's secret by id.
  Result<bool> SecretIdExists(const std::string& id);
  // ENOENT when the owner has no such secret.
  Status DeleteSecret(const std::string& owner_key_id, const std::string& name_or_id);

  // ---- id ranges (the box id pool, shared by sbx serve and sbx run) ----
  // The slot `box_id` holds, or else the lowest free slot below `slots`, taken for it; in one
  // transaction, so concurrent processes never get the same slot. ENOSPC when all are taken.
  Result<int64_t> AcquireIdSlot(const std::string& box_id, int64_t slots);
  // Frees the slot of `box_id`; a box id holding none is fine.
  Status ReleaseIdSlot(const std::string& box_id);
  Result<std::vector<IdSlot>> ListIdSlots();  // by slot

  // ---- net slots (the box address pool, shared by sbx serve and sbx run; version 11) ----
  // As the id slots above, in their own table: the slot `box_id` holds, or the lowest free one
  // below `slots` taken for it, in one transaction; ENOSPC when all are taken.
  Result<int64_t> AcquireNetSlot(const std::string& box_id, int64_t slots);
  Status ReleaseNetSlot(const std::string& box_id);  // a box id holding none is fine
  Result<std::vector<IdSlot>> ListNetSlots();        // by slot

 private:
  Store(std::unique_ptr<Db> db, std::string path, int version, Clock& clock);

  Result<std::optional<SandboxRecord>> GetSandboxLocked(const std::string& id) REQUIRES(mu_);
  Status PutSandboxLocked(const SandboxRecord& r) REQUIRES(mu_);
  // An audit event's detail as stored JSON text; EINVAL for an event no retry would take.
  static Result<std::string> AuditDetailText(const AuditEvent& e);
  Status InsertAuditLocked(const AuditEvent& e, const std::string& detail) REQUIRES(mu_);
  Result<int64_t> CountSandboxesLocked(const std::string& owner_key_id,
                                       const std::vector<std::string>& states) REQUIRES(mu_);
  // EDQUOT when max_live > 0 and r's owner already has that many live sandboxes.
  Status CheckQuotaLocked(const SandboxRecord& r, int64_t max_live, const std::string& what)
      REQUIRES(mu_);

  const std::string path_;
  const int schema_version_;
  Clock* const clock_;
  Mutex mu_;
  std::unique_ptr<Db> db_ GUARDED_BY(mu_);
  Mutex auth_mu_;
  std::unique_ptr<Db> auth_db_ GUARDED_BY(auth_mu_);  // VerifyApiKey's reads only
  // Declared after db_: destroyed (and flushed) while the database is still open.
  std::unique_ptr<AuditQueue> audit_queue_;
};

// Milliseconds since the Unix epoch, from the system clock: common/clock.h's, named here too for
// the callers that have always found it in the store.
using ::sbx::NowMs;
// SHA-256 of `data` as lowercase hex (used for key secrets; callers may use it for request
// hashes of idempotent creates).
std::string Sha256Hex(std::string_view data);

}  // namespace sbx::store
