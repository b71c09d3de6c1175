#include "sandbox/manager.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "common/encoding.h"
#include "common/fd.h"
#include "common/fs.h"
#include "runtime/box_host.h"
#include "runtime/native/layer_copy.h"
#include "sandbox/manager_internal.h"
#include "sandbox/secrets.h"
#include "sandbox/start_ready.h"
#include "store/audit_queue.h"

namespace sbx::sandbox {

Status ForClients(const std::string& id, std::string_view op, const Status& s) {
  if (s.ok()) return s;
  std::string redacted = RedactPaths(s.what());
  if (redacted != s.what()) spdlog::warn("sandbox {}: {}: {}", id, op, s.message());
  return Status::Error(std::move(redacted), s.err());
}

std::vector<std::string> LayerIds(const storage::Template& t) {
  std::vector<std::string> ids;
  for (const auto& dir : t.layers) ids.push_back(dir.substr(dir.rfind('/') + 1));
  return ids;
}

store::SandboxLimits WithDefaults(store::SandboxLimits l, const store::SandboxLimits& d) {
  if (l.memory_bytes == 0) l.memory_bytes = d.memory_bytes;
  if (l.cpus == 0) l.cpus = d.cpus;
  if (l.cpu_weight == 0) l.cpu_weight = d.cpu_weight;
  if (l.pids == 0) l.pids = d.pids;
  if (l.disk_bytes == 0) l.disk_bytes = d.disk_bytes;
  return l;
}

runtime::Limits ToRuntime(const store::SandboxLimits& l) {
  runtime::Limits r;
  r.memory_bytes = l.memory_bytes;
  r.cpus = l.cpus;
  r.cpu_weight = l.cpu_weight;
  r.pids = l.pids;
  r.disk_bytes = l.disk_bytes;
  return r;
}

namespace {

using store::SandboxRecord;

constexpr size_t kMaxMetadataEntries = 64;
constexpr size_t kMaxKeyBytes = 256;
constexpr size_t kMaxValueBytes = 4096;
constexpr size_t kMaxEnvEntries = 256;

Status ValidateMap(const std::map<std::string, std::string>& m, const char* what,
                   size_t max_entries, bool env) {
  if (m.size() > max_entries)
    return Status::Error(
        std::string(what) + ": at most " + std::to_string(max_entries) + " entries", EINVAL);
  for (const auto& [k, v] : m) {
    if (k.empty() || k.size() > kMaxKeyBytes || v.size() > kMaxValueBytes)
      return Status::Error(std::string(what) + ": keys 1.." + std::to_string(kMaxKeyBytes) +
                               " bytes, values up to " + std::to_string(kMaxValueBytes),
                           EINVAL);
    if (env && (k.find('=') != std::string::npos || k.find('\0') != std::string::npos ||
                v.find('\0') != std::string::npos))
      return Status::Error(std::string(what) + ": invalid variable name '" + k + "'", EINVAL);
  }
  return {};
}

// The secrets a create names: env var -> secret name. Their values are bound by the secret
// store (not here); only the shape is checked.
Status ValidateSecrets(const std::map<std::string, std::string>& secrets,
                       const std::map<std::string, std::string>& env) {
  if (secrets.size() > kMaxSecrets)
    return Status::Error("secrets: at most " + std::to_string(kMaxSecrets) + " entries", EINVAL);
  for (const auto& [var, name] : secrets) {
    bool ok = !var.empty() && var.size() <= kMaxKeyBytes &&
              (std::isalpha(static_cast<unsigned char>(var[0])) || var[0] == '_');
    for (char c : var) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
    if (!ok)
      return Status::Error(
          "secrets: '" + var + "' is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)",
          EINVAL);
    if (name.empty() || name.size() > kMaxKeyBytes)
      return Status::Error(
          "secrets." + var + ": a secret name of 1.." + std::to_string(kMaxKeyBytes) + " bytes",
          EINVAL);
    for (char c : name)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
        return Status::Error("secrets." + var + ": the secret name has a control character",
                             EINVAL);
    if (env.count(var))
      return Status::Error("secrets." + var + ": also set in env; a variable is one or the other",
                           EINVAL);
  }
  return {};
}

// Whether a policy lets nothing out: `none`, or an allowlist with nothing in it (E2B's
// allow_internet_access: false). Without networking such a policy is `none`: loopback only is
// what it asks.
bool AllowsNothing(const network::Policy& p) {
  return p.mode == network::Mode::kNone || (p.mode == network::Mode::kAllowlist && p.allow.empty());
}

constexpr int64_t kMaxCpuWeight = 10000;

// "1.5 GiB (1610612736 bytes)": people read the first part, scripts the second.
std::string Bytes(int64_t n) { return FormatSize(n) + " (" + std::to_string(n) + " bytes)"; }

// What Limits (limits.h) does not range-check. 0 means "the kernel's default".
Status ValidateLimits(const store::SandboxLimits& l) {
  if (l.cpu_weight < 0 || l.cpu_weight > kMaxCpuWeight)
    return Status::Error("limits.cpu_weight: from 1 to " + std::to_string(kMaxCpuWeight) +
                             ", 0 for the kernel's default (got " + std::to_string(l.cpu_weight) +
                             ")",
                         EINVAL);
  return {};
}

}  // namespace

Manager::Manager(ManagerConfig config, runtime::Runtime& runtime, storage::TemplateStore templates,
                 store::Store& store)
    : config_(std::move(config)),
      clock_(config_.clock ? *config_.clock : SystemClock()),
      runtime_(runtime),
      templates_(std::move(templates)),
      store_(store),
      limits_(config_.ranges),
      ttl_waiter_(clock_.NewWaiter()) {
  config_.clock = &clock_;
  builds_ = std::make_unique<TemplateBuilds>(
      store_, templates_, config_.data_dir, config_.builder,
      [this](const std::string& type, const std::string& key_id, nlohmann::json detail) {
        Audit(type, "", key_id, std::move(detail));
      },
      clock_);
  builds_->SetDiskReserve(config_.disk_reserve_bytes, config_.disk_reserve_percent);
}

// ---- per-sandbox transitions ----

struct Manager::TransitionEntry {
  std::mutex mu;  // held for the whole transition
  int users = 0;  // Transitions holding or waiting for mu; guarded by Manager::mu_
};

Manager::Transition::Transition(Manager& m, const std::string& id, const char* op)
    : Transition(m, id, op, std::try_to_lock) {
  if (owns_) return;
  entry_->mu.lock();
  owns_ = true;
}

Manager::Transition::Transition(Manager& m, const std::string& id, const char* op,
                                std::try_to_lock_t)
    : m_(m), id_(id) {
  {
    MutexLock g(m_.mu_);
    auto& e = m_.transitions_[id_];
    if (!e) e = std::make_unique<TransitionEntry>();
    ++e->users;
    entry_ = e.get();
  }
  owns_ = entry_->mu.try_lock();
  if (!owns_ && m_.config_.on_transition_wait) m_.config_.on_transition_wait(id_, op);
}

Manager::Transition::~Transition() {
  if (owns_) entry_->mu.unlock();
  MutexLock g(m_.mu_);
  if (--entry_->users == 0) m_.transitions_.erase(id_);
}

Result<std::optional<SandboxRecord>> Manager::Record(const std::string& id) {
  {
    MutexLock g(mu_);
    if (auto it = unwritten_.find(id); it != unwritten_.end())
      return std::optional<SandboxRecord>(it->second);
  }
  return store_.GetSandbox(id);
}

Result<SandboxRecord> Manager::LiveRecord(const std::string& id) {
  auto rec = Record(id);
  if (!rec.ok()) return rec.status();
  if (!*rec) return Status::Error("no sandbox '" + id + "'", ENOENT);
  if (!store::IsLiveState((*rec)->state))
    return Status::Error("sandbox " + id + " has ended (" + (*rec)->state + ")", ENOENT);
  return **rec;
}

void Manager::WriteEnded(const SandboxRecord& rec) {
  // The box is already gone, so the record must not stay live: try twice now (destroying the box
  // may just have freed the space a full disk lacked), then keep it for the TTL scan to retry.
  // Until it is written, this manager answers with it; if the daemon dies first, the reconciler
  // finds a live record without a box and marks it failed.
  history_.Drop(rec.id);
  Status put = store_.PutSandbox(rec);
  if (!put.ok()) put = store_.PutSandbox(rec);
  MutexLock g(mu_);
  if (put.ok()) {
    unwritten_.erase(rec.id);
    return;
  }
  spdlog::error("sandbox {}: recording it {} failed, retried later: {}", rec.id, rec.state,
                put.message());
  unwritten_[rec.id] = rec;
}

void Manager::RetryUnwritten() {
  std::vector<std::string> ids;
  {
    MutexLock g(mu_);
    for (const auto& [id, rec] : unwritten_) ids.push_back(id);
  }
  for (const auto& id : ids) {
    Transition t(*this, id, "retry");
    std::optional<SandboxRecord> rec;
    {
      MutexLock g(mu_);
      if (auto it = unwritten_.find(id); it != unwritten_.end()) rec = it->second;
    }
    if (!rec) continue;
    if (Status put = store_.PutSandbox(*rec); !put.ok()) {
      spdlog::warn("sandbox {}: recording it {} failed again: {}", id, rec->state, put.message());
      continue;
    }
    spdlog::info("sandbox {}: recorded {} after an earlier failed write", id, rec->state);
    MutexLock g(mu_);
    unwritten_.erase(id);
  }
}

Status Manager::CheckHostLimits(const store::SandboxLimits& l) {
  if (l.disk_bytes == 0 || config_.data_dir.empty()) return {};
  struct statvfs fs;
  if (::statvfs(config_.data_dir.c_str(), &fs) != 0)
    return Status::Errno("statvfs " + config_.data_dir);
  auto unit = static_cast<int64_t>(fs.f_frsize);
  int64_t total = static_cast<int64_t>(fs.f_blocks) * unit;
  int64_t free = static_cast<int64_t>(fs.f_bavail) * unit;
  if (l.disk_bytes > total)
    return Status::Error("limits.disk_bytes: at most " + Bytes(total) +
                             ", the size of the data directory's filesystem (got " +
                             std::to_string(l.disk_bytes) + ")",
                         EINVAL);
  int64_t reserve = std::max(
      config_.disk_reserve_bytes,
      static_cast<int64_t>(static_cast<double>(total) * config_.disk_reserve_percent / 100.0));
  int64_t in_flight = 0;
  {
    MutexLock g(mu_);
    in_flight = disk_in_flight_;
  }
  int64_t available = std::max<int64_t>(0, free - reserve - in_flight);
  if (l.disk_bytes > available)
    return Status::Error(
        "limits.disk_bytes: " + Bytes(l.disk_bytes) + " does not fit: " + Bytes(available) +
            " free in the data directory (" + Bytes(free) + " free on its filesystem, less " +
            Bytes(reserve) + " kept in reserve" +
            (in_flight > 0 ? " and " + Bytes(in_flight) + " promised to sandboxes being created"
                           : std::string()) +
            ")",
        ENOSPC);
  return {};
}

Manager::~Manager() { Stop(); }

network::BoxRefusals Manager::NetworkRefusals(const std::string& id, int64_t since_ms) {
  if (!config_.network) return {};
  return config_.network->Refusals(id, since_ms);
}

void Manager::AuditNetwork(const network::NetEvent& e) {
  std::string owner;
  {
    MutexLock g(mu_);
    auto it = networked_.find(e.box_id);
    if (it != networked_.end()) owner = it->second;
  }
  Audit(e.type, e.box_id, owner, e.detail);
}

namespace {
store::AuditEvent MakeAuditEvent(const std::string& type, const std::string& sandbox_id,
                                 const std::string& key_id, nlohmann::json detail) {
  store::AuditEvent e;
  e.type = type;
  e.sandbox_id = sandbox_id;
  e.key_id = key_id;
  e.detail = std::move(detail);
  return e;
}
}  // namespace

void Manager::Audit(const std::string& type, const std::string& sandbox_id,
                    const std::string& key_id, nlohmann::json detail) {
  // Kept and retried when the store cannot write.
  store_.audit_queue().Append(MakeAuditEvent(type, sandbox_id, key_id, std::move(detail)));
}

void Manager::AuditSoon(const std::string& type, const std::string& sandbox_id,
                        const std::string& key_id, nlohmann::json detail) {
  store_.audit_queue().AppendSoon(MakeAuditEvent(type, sandbox_id, key_id, std::move(detail)));
}

Status Manager::Reconcile() {
  // Template layer pins of creates that died before recording their sandbox (none is in flight).
  if (auto dropped = store_.DropOrphanPins(); !dropped.ok())
    return dropped.status().Wrap("reconcile");
  auto live = store_.ListLiveSandboxes();
  if (!live.ok()) return live.status().Wrap("reconcile");
  std::set<std::string> kept, saved;
  std::vector<SandboxRecord> adopted;
  for (auto& rec : *live) {
    std::string why;
    if (rec.state == store::kStatePaused && rec.on_disk) {
      // Paused without memory: no box, by design. One left means the daemon stopped between
      // recording the pause and removing the box; its files are in the recorded layers.
      Status destroyed = runtime_.Destroy(BoxOfRecord(rec));
      if (!destroyed.ok()) spdlog::warn("reconcile: {}", destroyed.message());
      if (rec.saved_memory.empty())
        spdlog::info("reconcile: sandbox {} stays paused without memory", rec.id);
      else
        spdlog::info("reconcile: sandbox {} stays paused, its memory in {}", rec.id,
                     rec.saved_memory);
      saved.insert(rec.saved_memory);
      continue;
    } else if (rec.state == store::kStateCreating) {
      why = "the daemon stopped while it was being created";
    } else if (auto box = runtime_.Adopt(rec.id); box.ok()) {
      // A running sandbox's box may have been left frozen by a snapshot the daemon did not
      // finish: it runs, as its record says.
      if (rec.state == store::kStateRunning) {
        if (Status thawed = runtime_.Thaw(*box); !thawed.ok())
          spdlog::warn("reconcile: sandbox {}: thaw: {}", rec.id, thawed.message());
      }
      MutexLock g(mu_);
      boxes_[rec.id] = *box;
      kept.insert(rec.id);
      adopted.push_back(rec);
      spdlog::info("reconcile: sandbox {} ({}) kept running across the restart", rec.id, rec.state);
      continue;
    } else if (box.status().err() == EBUSY) {
      return Status::Error(
          "sandbox " + rec.id +
              " is held by another live process: is another sbx serve using this data directory?",
          EBUSY);
    } else {
      why =
          "lost while the daemon was down: " + ForClients(rec.id, "adopt", box.status()).message();
    }
    Status destroyed = runtime_.Destroy(BoxOfRecord(rec));
    if (!destroyed.ok()) spdlog::warn("reconcile: {}", destroyed.message());
    // Its network, if it had one, is no live box's: the stack's Reconcile below removes it.
    rec.state = store::kStateFailed;
    rec.error = why;
    rec.ended_at = clock_.NowMs();
    rec.updated_at = 0;
    SBX_RETURN_IF_ERROR(store_.PutSandbox(rec));
    Audit("sandbox.lost", rec.id, rec.owner_key_id, {{"reason", why}});
    spdlog::warn("reconcile: sandbox {} marked failed: {}", rec.id, why);
  }
  // Pooled boxes: adopted into their pools, or removed (before the orphans are reaped below).
  SBX_RETURN_IF_ERROR(ReconcilePooled(kept));
  // The network: what belongs to no adopted box goes (a crash mid-create, a box lost while the
  // daemon was down); each adopted box gets its recorded policy back, so a restart changes
  // nothing of what it may reach.
  if (config_.network) {
    if (Status s = config_.network->Reconcile(kept); !s.ok())
      return s.Wrap("reconcile the network");
    for (const auto& rec : adopted) {
      network::BoxNetRequest want;
      want.policy = PolicyOf(rec);
      want.egress_bytes_per_s = EgressBytesPerSecond(rec.limits);
      // The placeholders its box holds get their values again (version 12), and E2B's rules
      // their headers: a restart changes nothing of what the proxy puts in.
      if (want.policy.mode != network::Mode::kNone) {
        auto bound = SandboxBindings(rec, rec.egress_rules, false);
        if (bound.ok())
          want.secrets = std::move(*bound);
        else
          spdlog::error("reconcile: sandbox {}: its secrets could not be bound again: {}", rec.id,
                        bound.status().message());
      }
      if (Status s = config_.network->Update(rec.id, want); s.ok()) {
        MutexLock g(mu_);
        networked_[rec.id] = rec.owner_key_id;
      } else if (want.policy.mode != network::Mode::kNone) {
        spdlog::error("reconcile: sandbox {}: its network policy could not be restored: {}", rec.id,
                      s.message());
      }
    }
  }
  // Boxes on the host that no live record owns and no live process holds (a crash between
  // creating a box and recording it, a record deleted by hand, a killed `sbx run`) are removed.
  // Boxes locked by a live process (a running `sbx run` or `sbx build`) are not ours to touch.
  for (const char* owner : {"serve", "run", "build"}) {
    auto reaped = runtime_.ReapOrphans(owner);
    if (!reaped.ok()) return reaped.status().Wrap("reconcile");
    if (*reaped > 0)
      spdlog::warn("reconcile: removed {} box(es) no record owns ({})", *reaped, owner);
  }
  // Saved memory no paused sandbox names (a crash between a save and its record, or during a
  // fork) is removed.
  if (!config_.data_dir.empty()) {
    const std::string root = config_.data_dir + "/memory";
    for (const auto& name : runtime::DirNames(root)) {
      if (saved.count(root + "/" + name)) continue;
      spdlog::warn("reconcile: removed saved memory {} no sandbox names", name);
      (void)RemoveTree(root + "/" + name);
    }
  }
  return {};
}

bool Manager::TakeCreateToken(const store::ApiKeyRecord& key, double* retry_after_s) {
  if (key.creates_per_second <= 0) return true;
  MutexLock g(mu_);
  auto now = clock_.Steady();
  auto [it, fresh] = buckets_.try_emplace(key.id);
  Bucket& b = it->second;
  // Burst of one second's worth (at least one).
  double burst = std::max(1.0, key.creates_per_second);
  if (fresh) {
    b.tokens = burst;
  } else {
    double elapsed = std::chrono::duration<double>(now - b.last).count();
    b.tokens = std::min(burst, b.tokens + elapsed * key.creates_per_second);
  }
  b.last = now;
  if (b.tokens >= 1) {
    b.tokens -= 1;
    return true;
  }
  *retry_after_s = (1 - b.tokens) / key.creates_per_second;
  return false;
}

Result<SandboxRecord> Manager::Create(const store::ApiKeyRecord& key, const CreateRequest& asked,
                                      QuotaExceeded* quota) {
  auto started = clock_.Steady();
  // Input first: nothing is made for a bad request. Limits and timeout in the key's ranges, the
  // defaults filled in (limits.h).
  CreateRequest req = asked;
  SBX_RETURN_IF_ERROR(limits_.Apply(key.ranges, config_.default_limits, config_.default_timeout_ms,
                                    &req.limits, &req.timeout_ms));
  SBX_RETURN_IF_ERROR(ValidateMap(req.env, "env", kMaxEnvEntries, true));
  SBX_RETURN_IF_ERROR(ValidateMap(req.metadata, "metadata", kMaxMetadataEntries, false));
  SBX_RETURN_IF_ERROR(ValidateLimits(req.limits));
  if (req.on_timeout != store::kOnTimeoutKill && req.on_timeout != store::kOnTimeoutPause)
    return Status::Error("on_timeout: 'kill' or 'pause'", EINVAL);
  // As E2B: only a sandbox its timeout pauses with memory is resumed by requests.
  if (req.auto_resume && (req.on_timeout != store::kOnTimeoutPause || !req.pause_memory))
    return Status::Error(
        "autoResume: only for a sandbox whose timeout pauses it with its memory (onTimeout "
        "pause, keepMemory true); one paused without memory is resumed by connect",
        EINVAL);
  if (req.idempotency_key.size() > 256)
    return Status::Error("Idempotency-Key: at most 256 bytes", EINVAL);
  SBX_RETURN_IF_ERROR(ValidateSecrets(req.secrets, req.env));
  if (!config_.network) {
    // A name the key has no secret of is the first thing to tell (and the same answer whatever
    // another key's secrets are called).
    if (!req.secrets.empty()) {
      if (auto bound = BindSecrets(key, req.secrets); !bound.ok() && bound.status().err() == EINVAL)
        return bound.status();
      return Status::Error(std::string("secrets: ") + kNetworkingOff, EINVAL);
    }
    if (!AllowsNothing(req.network))
      return Status::Error(std::string("network: ") + kNetworkingOff, EINVAL);
    req.network = network::Policy{};
  }
  if (req.egress_rules.empty()) req.egress_rules = "{}";
  if (req.mask_request_host.size() > kMaxKeyBytes)
    return Status::Error("maskRequestHost: at most 256 bytes", EINVAL);
  for (char c : req.mask_request_host)  // it becomes a header the box receives
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f)
      return Status::Error("maskRequestHost: a host, with no spaces or control characters", EINVAL);
  std::string tmpl_name = req.template_name.empty() ? config_.default_template : req.template_name;

  // Idempotency before anything that depends on the host's state now: a retried request gets
  // the sandbox the first one created, even when the host could not fit another one (its disk
  // is taken by that very sandbox).
  if (!req.idempotency_key.empty()) {
    auto prior = store_.GetIdempotency(key.id, req.idempotency_key);
    if (!prior.ok()) return prior.status();
    if (*prior) {
      if ((*prior)->request_hash != req.request_hash)
        return Status::Error("Idempotency-Key was used with a different request", EEXIST);
      auto rec = Record((*prior)->sandbox_id);
      if (!rec.ok()) return rec.status();
      if (*rec) return **rec;
    }
    MutexLock g(mu_);
    if (!creating_keys_.insert(key.id + "\n" + req.idempotency_key).second)
      return Status::Error("a request with this Idempotency-Key is in progress", EBUSY);
  }
  struct Release {
    Manager* m;
    std::string k;
    ~Release() {
      if (k.empty()) return;
      MutexLock g(m->mu_);
      m->creating_keys_.erase(k);
    }
  } release{this, req.idempotency_key.empty() ? "" : key.id + "\n" + req.idempotency_key};

  // Against the host: what the request asks for (the defaults are the operator's choice, even on
  // a host smaller than them), and the disk it will get. Checked again below, under the lock
  // that promises the disk; here so that a bad request fails before any quota is spent.
  store::SandboxLimits wanted = req.limits;
  if (wanted.disk_bytes == 0) wanted.disk_bytes = config_.default_limits.disk_bytes;
  SBX_RETURN_IF_ERROR(CheckHostLimits(wanted));

  // Quotas: concurrent sandboxes, then the creation rate. This count is only the early answer
  // that spends no creation token; the one that holds is made with the insert, below.
  std::string over_quota =
      "this key may have at most " + std::to_string(key.max_sandboxes) + " live sandboxes";
  if (key.max_sandboxes > 0) {
    auto n = store_.CountSandboxes(
        key.id, {store::kStateCreating, store::kStateRunning, store::kStatePaused});
    if (!n.ok()) return n.status();
    if (*n >= key.max_sandboxes) {
      if (quota) quota->retry_after_s = 1;
      return Status::Error(over_quota, EAGAIN);
    }
  }
  double retry_after = 1;
  if (!TakeCreateToken(key, &retry_after)) {
    if (quota) quota->retry_after_s = retry_after;
    return Status::Error("this key may create at most " + std::to_string(key.creates_per_second) +
                             " sandboxes per second",
                         EAGAIN);
  }

  // Another key's snapshot does not exist for this one.
  auto hidden = builds_->Hidden(key, tmpl_name);
  if (!hidden.ok()) return hidden.status();
  if (*hidden) return storage::TemplateNotFound(tmpl_name);

  // A warm pool's box when one fits (pool.h): its disk is already taken.
  auto claimed = req.restore_memory.empty() ? ClaimPooled(key, req, tmpl_name)
                                            : Result<std::optional<SandboxRecord>>(std::nullopt);
  if (!claimed.ok()) {
    if (claimed.status().err() == EAGAIN && quota) quota->retry_after_s = 1;
    return claimed.status();
  }
  if (*claimed) {
    Created(key, req, **claimed, started, true);
    return **claimed;
  }

  // The disk is promised from the check until the box exists (its image then takes the space),
  // so creates running at the same time cannot all be promised the same free space. The check
  // and the promise happen under one lock.
  int64_t disk = wanted.disk_bytes;
  std::unique_lock<std::mutex> disk_lock(disk_mu_);
  SBX_RETURN_IF_ERROR(CheckHostLimits(wanted));
  struct DiskPromise {
    Manager* m;
    int64_t bytes;
    ~DiskPromise() {
      MutexLock g(m->mu_);
      m->disk_in_flight_ -= bytes;
    }
  } promise{this, disk};
  {
    MutexLock g(mu_);
    disk_in_flight_ += disk;
  }
  disk_lock.unlock();

  // Registered names only (EINVAL "template not found: NAME" otherwise); the layers are pinned
  // for this sandbox id, so removing the template leaves them until the sandbox has ended.
  SandboxRecord rec;
  rec.id = RandomId(20);
  auto tmpl = storage::ResolveTemplate(templates_, store_, tmpl_name, rec.id);
  if (!tmpl.ok()) return tmpl.status();
  rec.template_name = tmpl->name;
  rec.layers = LayerIds(*tmpl);
  if (auto runtime = ChooseRuntime(key, req.runtime, *tmpl); runtime.ok()) {
    rec.runtime = *runtime;
  } else {
    if (Status unpin = store_.UnpinLayers(rec.id); !unpin.ok())
      spdlog::warn("create: {}", unpin.message());
    return runtime.status();
  }
  rec.state = store::kStateCreating;
  rec.owner_key_id = key.id;
  rec.metadata = req.metadata;
  rec.env = req.env;
  rec.limits = WithDefaults(req.limits, config_.default_limits);
  rec.timeout_ms = req.timeout_ms > 0 ? req.timeout_ms : config_.default_timeout_ms;
  rec.on_timeout = req.on_timeout;
  rec.pause_memory = req.pause_memory;
  rec.auto_resume = req.auto_resume;
  rec.public_ports = req.public_ports;
  rec.network = req.network.ToJson();
  rec.egress_rules = req.egress_rules;
  rec.mask_request_host = req.mask_request_host;
  // What a command gets when it says nothing, fixed now: the template may change later.
  rec.defaults.env = tmpl->env;
  rec.defaults.user = tmpl->user == "root" ? "" : tmpl->user;
  rec.defaults.workdir = tmpl->workdir;
  rec.created_at = clock_.NowMs();
  rec.updated_at = rec.created_at;

  // Secrets bound before anything is recorded: a name the key has no secret of is the client's
  // error, and leaves nothing behind.
  std::vector<network::SecretBinding> bound_secrets;
  if (!req.secrets.empty()) {
    auto bound = BindSecrets(key, req.secrets);
    if (!bound.ok()) {
      if (Status unpin = store_.UnpinLayers(rec.id); !unpin.ok())
        spdlog::warn("create: {}", unpin.message());
      return bound.status();
    }
    bound_secrets = std::move(*bound);
  }
  rec.secrets = RefsOf(bound_secrets);
  // E2B's rules: their ${e2b.secrets.NAME} are this key's secrets, checked now like the others.
  if (!req.egress_rules.empty() && req.egress_rules != "{}") {
    SandboxRecord rules_only = rec;
    rules_only.secrets.clear();
    auto rules = SandboxBindings(rules_only, req.egress_rules, true);
    if (!rules.ok()) {
      if (Status unpin = store_.UnpinLayers(rec.id); !unpin.ok())
        spdlog::warn("create: {}", unpin.message());
      return rules.status();
    }
    for (auto& b : *rules) bound_secrets.push_back(std::move(b));
  }

  // The whole creation is one transition: a kill (or anything else) arriving while the box is
  // being made waits for it, then acts on the sandbox as creation left it.
  Transition transition(*this, rec.id, "create");
  if (config_.on_create_insert) config_.on_create_insert(rec.id);
  // The quota check that holds: counted and inserted in one store transaction.
  if (Status put = store_.InsertSandbox(rec, key.max_sandboxes); !put.ok()) {
    if (Status unpin = store_.UnpinLayers(rec.id); !unpin.ok())
      spdlog::warn("create: {}", unpin.message());
    if (put.err() != EDQUOT) return put;
    if (quota) quota->retry_after_s = 1;
    return Status::Error(over_quota, EAGAIN);
  }

  // A create that fails from here on leaves its record failed and frees the box's network.
  bool networked = config_.network && req.network.mode != network::Mode::kNone;
  auto failed = [&](const Status& why, std::string error) {
    if (networked) ReleaseNetwork(rec.id);
    rec.state = store::kStateFailed;
    rec.error = std::move(error);
    rec.ended_at = clock_.NowMs();
    rec.updated_at = 0;
    WriteEnded(rec);
    {
      MutexLock g(mu_);
      ++counters_.creation_failures;
    }
    Audit("sandbox.create_failed", rec.id, key.id, {{"error", rec.error}});
    return why;
  };

  auto box = MakeBox(rec, *tmpl, req.network, std::move(bound_secrets), req.restore_memory);
  int64_t now = clock_.NowMs();
  if (!box.ok()) return failed(box.status(), box.status().message());
  SandboxRecord made = rec;
  made.state = store::kStateRunning;
  made.init_pid = box->init_pid;
  made.agent_socket = box->agent_socket;
  made.box_dir = box->dir;
  made.id_base = box->id_base;
  made.idmapped = box->idmapped;
  made.expires_at = now + rec.timeout_ms;
  made.updated_at = 0;
  {
    MutexLock g(mu_);
    boxes_[made.id] = *box;  // before the record says running: Channel looks for it
  }
  if (Status put = store_.PutSandbox(made); !put.ok()) {
    // A box recorded as `creating` is one the reconciler would remove after a restart, and no
    // call can use it meanwhile: remove it now, and record the sandbox failed.
    Status destroyed = runtime_.Destroy(*box);
    {
      MutexLock g(mu_);
      boxes_.erase(made.id);
    }
    std::string error = "its box was made but could not be recorded: " + put.message();
    if (!destroyed.ok()) error += "; " + ForClients(rec.id, "destroy", destroyed).message();
    return failed(put, error);
  }
  // The template's start command, and the create answers once its ready command says so; a
  // template that never gets ready leaves no box (start_ready.h). A box restored from memory
  // runs what its source ran.
  if (req.restore_memory.empty() && (!tmpl->start_cmd.empty() || !tmpl->ready_cmd.empty())) {
    StartReadySpec sr;
    sr.start_cmd = tmpl->start_cmd;
    sr.ready_cmd = tmpl->ready_cmd;
    sr.defaults = made.defaults;
    sr.env = made.env;
    if (config_.ready_timeout_ms > 0)
      sr.timeout = std::chrono::milliseconds(config_.ready_timeout_ms);
    Status ready = RunStartAndReady(made.agent_socket, sr, clock_);
    if (!ready.ok()) {
      Status destroyed = runtime_.Destroy(*box);
      {
        MutexLock g(mu_);
        boxes_.erase(made.id);
      }
      std::string error = "template " + made.template_name + ": " + ready.message();
      if (!destroyed.ok()) error += "; " + ForClients(rec.id, "destroy", destroyed).message();
      return failed(Status::Error(error, ready.err()), error);
    }
  }
  Created(key, req, made, started, false);
  return made;
}

void Manager::Created(const store::ApiKeyRecord& key, const CreateRequest& req,
                      const SandboxRecord& made, Clock::SteadyTime started, bool pooled) {
  {
    MutexLock g(mu_);
    ++counters_.creations;
    double secs = std::chrono::duration<double>(clock_.Steady() - started).count();
    if (counters_.create_seconds.size() >= 4096)
      counters_.create_seconds.erase(counters_.create_seconds.begin());
    counters_.create_seconds.push_back(secs);
    metrics_.create_seconds.Observe(secs);
  }
  if (!req.idempotency_key.empty()) {
    store::IdempotencyRecord ir{key.id, req.idempotency_key, req.request_hash, made.id, 0};
    if (Status s = store_.PutIdempotency(ir); !s.ok()) spdlog::warn("idempotency: {}", s.message());
  }
  Audit("sandbox.create", made.id, key.id,
        {{"template", made.template_name},
         {"timeout_ms", made.timeout_ms},
         {"memory_bytes", made.limits.memory_bytes},
         {"cpus", made.limits.cpus},
         {"pids", made.limits.pids},
         {"network", network::ModeName(req.network.mode)},
         {"pooled", pooled}});
}

Result<runtime::Box> Manager::MakeBox(SandboxRecord& rec, const storage::Template& tmpl,
                                      const network::Policy& policy,
                                      std::vector<network::SecretBinding> secrets,
                                      const std::string& restore_memory) {
  bool networked = config_.network && policy.mode != network::Mode::kNone;
  runtime::BoxSpec spec;
  spec.id = rec.id;
  spec.runtime = rec.runtime;
  spec.layers = tmpl.layers;
  spec.may_hold_top_layer = true;  // CaptureLayer then replaces that layer
  spec.binds = tmpl.binds;
  spec.limits = ToRuntime(rec.limits);
  spec.owner = "serve";
  if (!networked) {
    for (const auto& [host, inside] : config_.no_network_files)
      spec.binds.push_back(runtime::BindMount{host, inside, true, {}});
  }
  if (networked) {
    // The box's network is planned before the box exists (its files are bound into it) and
    // attached at the runtime's sync point, before anything of the box's own runs.
    network::BoxNetRequest want;
    want.policy = policy;
    // Placeholders for the box, the values for the proxy only (sandbox/secrets.cc).
    want.secrets = std::move(secrets);
    want.egress_bytes_per_s = EgressBytesPerSecond(rec.limits);
    auto plan = config_.network->Prepare(rec.id, want);
    if (!plan.ok()) return plan.status().Wrap("network of sandbox " + rec.id);
    {
      MutexLock g(mu_);
      networked_[rec.id] = rec.owner_key_id;
    }
    for (const auto& [host, inside] : plan->files)
      spec.binds.push_back(runtime::BindMount{host, inside, true, {}});
    // The network's variables (CA bundle paths, secret placeholders) win over the client's.
    for (const auto& [k, v] : plan->env) rec.env[k] = v;
    network::Stack* stack = config_.network;
    spec.at_sync_point = [stack, id = rec.id](pid_t init_pid) {
      return stack->Attach(id, init_pid);
    };
  }
  auto box =
      restore_memory.empty() ? runtime_.Create(spec) : runtime_.RestoreMemory(spec, restore_memory);
  if (!box.ok()) return ForClients(rec.id, "create", box.status());
  return box;
}

Result<SandboxRecord> Manager::Owned(const store::ApiKeyRecord& key, const std::string& id,
                                     Access access) {
  auto rec = Record(id);
  if (!rec.ok()) return rec.status();
  // A warm pool's box is no sandbox yet, not even for an operator (pool.h).
  if (*rec && (*rec)->state == store::kStatePooled)
    return Status::Error("no sandbox '" + id + "'", ENOENT);
  bool allowed =
      *rec && ((*rec)->owner_key_id == key.id || (key.is_operator && access != Access::kUse));
  if (!allowed) {
    // Recorded for operators, not under the asking key: its own audit log must not tell it
    // which ids exist (only ids that exist are recorded).
    static const char* kAccess[] = {"inspect", "kill", "use"};
    if (*rec)
      Audit("sandbox.access_denied", id, "",
            {{"key_id", key.id}, {"access", kAccess[static_cast<int>(access)]}});
    return Status::Error("no sandbox '" + id + "'", ENOENT);
  }
  return **rec;
}

Result<SandboxRecord> Manager::Get(const store::ApiKeyRecord& key, const std::string& id) {
  return Owned(key, id, Access::kInspect);
}

Result<store::SandboxPage> Manager::List(const store::ApiKeyRecord& key,
                                         store::SandboxFilter filter) {
  if (!key.is_operator) filter.owner_key_id = key.id;
  for (const auto& s : filter.states) {
    if (!store::IsValidState(s)) return Status::Error("unknown state '" + s + "'", EINVAL);
  }
  auto page = store_.ListSandboxes(filter);
  if (!page.ok()) return page;
  // Ended records still waiting for their write (WriteEnded) are shown as they are.
  MutexLock g(mu_);
  if (unwritten_.empty()) return page;
  auto& items = page->items;
  for (auto& item : items)
    if (auto it = unwritten_.find(item.id); it != unwritten_.end()) item = it->second;
  if (!filter.states.empty())
    items.erase(std::remove_if(items.begin(), items.end(),
                               [&](const SandboxRecord& r) {
                                 return std::find(filter.states.begin(), filter.states.end(),
                                                  r.state) == filter.states.end();
                               }),
                items.end());
  return page;
}

runtime::Box Manager::BoxOfRecord(const SandboxRecord& rec) {
  runtime::Box box;
  box.id = rec.id;
  box.runtime = rec.runtime;
  return box;
}

Result<std::string> Manager::ChooseRuntime(const store::ApiKeyRecord& key, const std::string& asked,
                                           const storage::Template& tmpl) {
  std::string own = tmpl.runtime.empty() ? store::kRuntimeNative : tmpl.runtime;
  std::string name = asked.empty() ? own : asked;
  Status can = runtime_.CanCreate(name);
  if (can.err() == EINVAL) return can;
  if (name != own && !key.is_operator &&
      std::find(key.runtimes.begin(), key.runtimes.end(), name) == key.runtimes.end()) {
    return Status::Error("runtime: this key may not choose " + name + " (template " + tmpl.name +
                             " runs under " + own + "; sbx key create --runtime allows it)",
                         EPERM);
  }
  // The client's to change (another runtime, another host): an invalid request here.
  if (!can.ok()) return Status::Error(can.message(), EINVAL);
  return name;
}

Result<runtime::Box> Manager::BoxOf(const std::string& id) {
  MutexLock g(mu_);
  auto it = boxes_.find(id);
  if (it == boxes_.end()) return Status::Error("sandbox " + id + " has no box on this host", ESRCH);
  return it->second;
}

void Manager::ReleaseNetwork(const std::string& id) {
  {
    MutexLock g(mu_);
    if (!networked_.erase(id)) return;
  }
  if (!config_.network) return;
  if (Status s = config_.network->Release(id); !s.ok())
    spdlog::error("sandbox {}: releasing its network: {}", id, s.message());
}

int64_t Manager::EgressBytesPerSecond(const store::SandboxLimits& l) {
  if (!(l.egress_mbps > 0)) return 0;
  return std::max<int64_t>(1, static_cast<int64_t>(l.egress_mbps * 125000.0));  // 1e6 / 8
}

network::Policy Manager::PolicyOf(const store::SandboxRecord& rec) {
  auto p = network::Policy::FromJson(rec.network.empty() ? store::kNoNetwork : rec.network);
  if (p.ok()) return *p;
  spdlog::error("sandbox {}: its recorded network policy does not parse ({}); taken as none",
                rec.id, p.status().message());
  return {};
}

void Manager::CloseChannel(const std::string& id) {
  std::shared_ptr<AgentChannel> channel;
  {
    MutexLock g(mu_);
    if (auto it = channels_.find(id); it != channels_.end()) channel = it->second;
    channels_.erase(id);
  }
  if (channel) channel->Close();
}

void Manager::RemovePausedBox(const runtime::Box& box, const char* how) {
  if (Status s = runtime_.Destroy(box); !s.ok())
    spdlog::error("sandbox {}: paused {}, but its box was not removed: {}", box.id, how,
                  s.message());
  {
    MutexLock g(mu_);
    boxes_.erase(box.id);
  }
  ReleaseNetwork(box.id);
}

Status Manager::KillLocked(SandboxRecord rec, const std::string& reason, nlohmann::json detail,
                           const char* end_state) {
  runtime::Box box{rec.id};
  if (auto b = BoxOf(rec.id); b.ok()) box = *b;
  CloseChannel(rec.id);
  // The host first: a sandbox must never be recorded ended while its box still runs (nothing
  // would ever stop it). Its processes are killed here; the rest of the box (files, cgroups,
  // network) is removed after the answer (cleanups.h), or here when the store cannot write:
  // a kill on a full disk must free the box's disk before anything is recorded. The record
  // follows; WriteEnded keeps it consistent if that write fails.
  bool later = StoreWriteHealth().ok();
  Status s = ForClients(rec.id, "destroy", later ? runtime_.Stop(box) : runtime_.Destroy(box));
  if (!s.ok() && later) {
    later = false;
    s = ForClients(rec.id, "destroy", runtime_.Destroy(box));
  }
  {
    MutexLock g(mu_);
    boxes_.erase(rec.id);
  }
  const std::string memory = std::exchange(rec.saved_memory, "");
  if (later) {
    box.init_pid = 0;  // reaped: the pid may be another process's by the time the job runs
    cleanups_.Add(rec.id, [this, box, memory] {
      if (Status d = runtime_.Destroy(box); !d.ok())
        spdlog::error("sandbox {}: killed, but its box was not removed: {}", box.id, d.message());
      if (!memory.empty()) (void)RemoveTree(memory);
      ReleaseNetwork(box.id);
    });
  } else {
    if (!memory.empty()) (void)RemoveTree(memory);
    ReleaseNetwork(rec.id);
  }
  rec.state = end_state;
  rec.ended_at = clock_.NowMs();
  rec.expires_at = 0;
  rec.updated_at = 0;
  if (!s.ok()) rec.error = rec.error.empty() ? s.message() : rec.error + "; " + s.message();
  WriteEnded(rec);
  detail["reason"] = reason;
  Audit("sandbox.kill", rec.id, rec.owner_key_id, std::move(detail));
  return s;
}

Status Manager::Kill(const store::ApiKeyRecord& key, const std::string& id) {
  auto owned = Owned(key, id, Access::kKill);
  if (!owned.ok()) return owned.status();
  Transition t(*this, id, "kill");
  auto rec = LiveRecord(id);
  if (!rec.ok()) return rec.status();
  if (rec->owner_key_id != key.id) return KillLocked(*rec, "operator", {{"by_key_id", key.id}});
  return KillLocked(*rec, "requested");
}

Status Manager::FailUnrecordable(SandboxRecord rec, const Status& why, const Status& undo) {
  spdlog::error("sandbox {}: {}; undoing it failed: {}", rec.id, why.message(), undo.message());
  rec.error = RedactPaths(why.message() + "; undoing it failed: " + undo.message());
  (void)KillLocked(rec, "unrecordable", {{"error", rec.error}}, store::kStateFailed);
  return why;
}

Status Manager::RecordPause(const SandboxRecord& rec, const SandboxRecord& paused,
                            const runtime::Box& box) {
  Status put = store_.PutSandbox(paused);
  if (put.ok()) return {};
  Status why = put.Wrap("pause " + rec.id + ": not recorded, so not paused");
  if (Status thawed = runtime_.Thaw(box); !thawed.ok()) return FailUnrecordable(rec, why, thawed);
  return why;
}

Status Manager::PauseLocked(SandboxRecord& rec, const std::string& key_id) {
  if (rec.runtime == "vm" && !config_.data_dir.empty()) {
    // A VM's memory goes to disk: a paused VM then costs the host nothing but the file.
    Status s = PauseMemoryLocked(rec, key_id);
    if (s.err() != ENOTSUP) return s;
    spdlog::info("sandbox {}: frozen, not saved: {}", rec.id, s.message());
  }
  auto box = BoxOf(rec.id);
  if (!box.ok()) return box.status();
  // Freeze, then record. A pause the store cannot record (a full disk) is undone: a `running`
  // record over a frozen box would hang every command until its timeout.
  SBX_RETURN_IF_ERROR(ForClients(rec.id, "freeze", runtime_.Freeze(*box)));
  SandboxRecord paused = rec;
  paused.state = store::kStatePaused;
  paused.expires_at = 0;  // a paused sandbox waits for resume, however long
  paused.updated_at = 0;
  SBX_RETURN_IF_ERROR(RecordPause(rec, paused, *box));
  rec = paused;
  Audit("sandbox.pause", rec.id, key_id);
  return {};
}

Result<std::string> Manager::NewMemoryDir(const std::string& name) {
  const std::string root = config_.data_dir + "/memory";
  SBX_RETURN_IF_ERROR(MakeDirs(root, 0700));
  std::string dir = root + "/" + name + "-" + RandomId(8);
  if (::mkdir(dir.c_str(), 0700) != 0) return Status::Errno("mkdir " + dir);
  return dir;
}

Status Manager::PauseMemoryLocked(SandboxRecord& rec, const std::string& key_id) {
  auto box = BoxOf(rec.id);
  if (!box.ok()) return box.status();
  auto dir = NewMemoryDir(rec.id);
  if (!dir.ok()) return dir.status().Wrap("pause " + rec.id);
  // Saved, then stopped; a save that fails leaves the box running (SaveMemory).
  if (Status s = runtime_.SaveMemory(*box, *dir, /*stop=*/true); !s.ok()) {
    (void)RemoveTree(*dir);
    return s.err() == ENOTSUP ? s : ForClients(rec.id, "pause", s);
  }
  SandboxRecord paused = rec;
  paused.state = store::kStatePaused;
  paused.on_disk = true;
  paused.saved_memory = *dir;
  paused.expires_at = 0;
  paused.init_pid = 0;
  paused.agent_socket.clear();
  paused.box_dir.clear();
  paused.updated_at = 0;
  CloseChannel(rec.id);
  if (Status put = store_.PutSandbox(paused); !put.ok()) {
    // Not recorded: it runs again from what was saved, as its record says.
    Status why = put.Wrap("pause " + rec.id + ": not recorded, so not paused");
    (void)runtime_.Destroy(*box);
    auto tmpl = storage::TemplateOfLayers(templates_, rec.layers);
    Result<runtime::Box> again =
        tmpl.ok() ? MakeBox(rec, *tmpl, network::Policy{}, {}, *dir) : tmpl.status();
    (void)RemoveTree(*dir);
    if (!again.ok()) {
      {
        MutexLock g(mu_);
        boxes_.erase(rec.id);
      }
      return FailUnrecordable(rec, why, again.status());
    }
    MutexLock g(mu_);
    boxes_[rec.id] = *again;
    return why;
  }
  RemovePausedBox(*box, "with its memory on disk");
  rec = paused;
  Audit("sandbox.pause", rec.id, key_id, {{"memory", true}, {"on_disk", true}});
  return {};
}

Status Manager::ResumeLocked(SandboxRecord& rec, const std::string& key_id) {
  if (rec.on_disk) return ResumeFromDiskLocked(rec, key_id);
  auto box = BoxOf(rec.id);
  if (!box.ok()) return box.status();
  SBX_RETURN_IF_ERROR(ForClients(rec.id, "thaw", runtime_.Thaw(*box)));
  SandboxRecord running = rec;
  running.state = store::kStateRunning;
  running.expires_at = clock_.NowMs() + rec.timeout_ms;
  running.updated_at = 0;
  if (Status put = store_.PutSandbox(running); !put.ok()) {
    // Frozen again, as its record still says: a running box recorded paused would never expire.
    Status why = put.Wrap("resume " + rec.id + ": not recorded, so not resumed");
    if (Status frozen = runtime_.Freeze(*box); !frozen.ok())
      return FailUnrecordable(rec, why, frozen);
    return why;
  }
  rec = running;
  Audit("sandbox.resume", rec.id, key_id);
  return {};
}

Status Manager::Pause(const store::ApiKeyRecord& key, const std::string& id, bool keep_memory) {
  auto owned = Owned(key, id, Access::kUse);
  if (!owned.ok()) return owned.status();
  Transition t(*this, id, "pause");
  auto rec = Record(id);
  if (!rec.ok()) return rec.status();
  if (!*rec) return Status::Error("no sandbox '" + id + "'", ENOENT);
  if ((*rec)->state == store::kStatePaused)
    return Status::Error("sandbox " + id + " is already paused", EBUSY);
  if ((*rec)->state != store::kStateRunning)
    return Status::Error(
        "sandbox " + id + " is " + (*rec)->state + "; only a running sandbox can be paused", EBUSY);
  return keep_memory ? PauseLocked(**rec, key.id) : PauseToDiskLocked(**rec, key.id);
}

Status Manager::Resume(const store::ApiKeyRecord& key, const std::string& id) {
  auto owned = Owned(key, id, Access::kUse);
  if (!owned.ok()) return owned.status();
  Transition t(*this, id, "resume");
  auto rec = Record(id);
  if (!rec.ok()) return rec.status();
  if (!*rec || (*rec)->state != store::kStatePaused)
    return Status::Error("sandbox " + id + " is not paused; there is nothing to resume", EBUSY);
  return ResumeLocked(**rec, key.id);
}

// ---- pause without memory, snapshots, forks ----

Result<std::vector<std::string>> Manager::CaptureLayer(const SandboxRecord& rec,
                                                       const std::string& layer_id,
                                                       bool stay_frozen, const std::string& charged,
                                                       bool merges) {
  auto box = BoxOf(rec.id);
  if (!box.ok()) return box.status();
  // The sandbox's layers grow by one (unless its box holds its top layer): past what its runtime
  // stacks, neither it (resumed) nor a sandbox of the snapshot could start. A pause merges its
  // own layers, if it has any, back below that.
  const size_t most = runtime_.MaxLayers(*box);
  if (!box->holds_top_layer && rec.layers.size() + 1 > most &&
      !(merges && !rec.layers.empty() && IsOwnLayer(rec, rec.layers.front())))
    return Status::Error("sandbox " + rec.id + " has " + std::to_string(rec.layers.size()) +
                             " layers, and a box of runtime " + rec.runtime + " stacks at most " +
                             std::to_string(most) +
                             ": its files take no other layer (a pause with its memory still "
                             "works)",
                         E2BIG);
  // The copy goes into the template cache: within its bound, and never into the daemon's disk
  // reserve.
  int64_t limit = templates_.cache_bytes;
  struct statvfs vfs {};
  if (::statvfs(templates_.dir.c_str(), &vfs) == 0) {
    int64_t total = static_cast<int64_t>(vfs.f_blocks) * static_cast<int64_t>(vfs.f_frsize);
    int64_t free = static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
    int64_t reserve = std::max(config_.disk_reserve_bytes,
                               static_cast<int64_t>(config_.disk_reserve_percent / 100 * total));
    limit = std::min(limit, free - reserve);
  }
  if (limit <= 0)
    return Status::Error("the template cache's filesystem has no room above the disk reserve",
                         ENOSPC);
  const int64_t cache_limit = limit;
  // And within what the key may save: AddLayerFromDir checks that for good, under the cache's
  // lock; this stops the copy early.
  auto key = store_.GetApiKey(charged);
  if (!key.ok()) return key.status();
  storage::LayerCharge charge{charged, *key ? (*key)->max_saved_bytes : 0};
  bool key_bound = false;
  if (charge.max_bytes > 0) {
    auto held = store_.LayerBytesOwnedBy(charged);
    if (!held.ok()) return held.status();
    const int64_t left = charge.max_bytes - *held;
    if (left <= 0)
      return Status::Error("key " + charged + " may save " + std::to_string(charge.max_bytes) +
                               " bytes of snapshots and pauses without memory and holds " +
                               std::to_string(*held) +
                               " already (delete a snapshot, or kill a sandbox paused without "
                               "memory)",
                           EDQUOT);
    if (left < limit) {
      limit = left;
      key_bound = true;
    }
  }
  auto staging = storage::MakeStagingDir(templates_);
  if (!staging.ok()) return staging.status();
  bool froze = rec.state == store::kStateRunning;
  if (froze) SBX_RETURN_IF_ERROR(ForClients(rec.id, "freeze", runtime_.Freeze(*box)));
  Status copied = ForClients(rec.id, "copy", runtime_.CopyWritableLayer(*box, *staging, limit));
  if (froze && (!stay_frozen || !copied.ok())) {
    if (Status thawed = runtime_.Thaw(*box); !thawed.ok()) {
      (void)RemoveTree(*staging);
      return FailUnrecordable(rec, copied.ok() ? Status::Error("snapshot", EIO) : copied, thawed);
    }
  }
  if (!copied.ok()) {
    (void)RemoveTree(*staging);
    if (key_bound && copied.err() == ENOSPC)
      return Status::Error("sandbox " + rec.id + "'s files are more than the " +
                               std::to_string(limit) + " bytes that key " + charged +
                               " may still save (of the " + std::to_string(charge.max_bytes) +
                               " it may keep in snapshots and pauses without memory)",
                           EDQUOT);
    return copied;
  }
  // Pinned for the sandbox: the layer stays while it lives, and after only while a template
  // (the snapshot) lists it.
  auto added = storage::AddLayerFromDir(templates_, store_, *staging, layer_id, box->LayerIdShift(),
                                        rec.id, charge);
  if (!added.ok()) {
    (void)RemoveTree(*staging);
    if (froze && stay_frozen) (void)runtime_.Thaw(*box);
    return added.status();
  }
  std::vector<std::string> layers = rec.layers;
  if (box->holds_top_layer && !layers.empty())
    layers.front() = layer_id;
  else
    layers.insert(layers.begin(), layer_id);
  if (!merges || box->holds_top_layer) return layers;
  auto merged = MergeOwnLayers(rec, layers, most, cache_limit, charge);
  if (merged.ok()) return merged;
  // Unmerged, the layers still do where the runtime stacks them all.
  if (layers.size() <= most) {
    spdlog::warn("sandbox {}: its layers stay as they are: {}", rec.id, merged.status().message());
    return layers;
  }
  if (Status s = store_.UnpinLayer(rec.id, layer_id); !s.ok())
    spdlog::warn("sandbox {}: {}", rec.id, s.message());
  if (froze && stay_frozen) (void)runtime_.Thaw(*box);
  return merged.status();
}

bool Manager::IsOwnLayer(const SandboxRecord& rec, const std::string& layer) {
  const std::string prefix = "disk-" + rec.id + "-";
  return layer.compare(0, prefix.size(), prefix) == 0;
}

Result<std::vector<std::string>> Manager::MergeOwnLayers(const SandboxRecord& rec,
                                                         std::vector<std::string> layers,
                                                         size_t most, int64_t limit,
                                                         storage::LayerCharge charge) {
  size_t own = 0;
  while (own < layers.size() && IsOwnLayer(rec, layers[own])) ++own;
  if (own < 2 || (own <= kMostOwnLayers && layers.size() <= most)) return layers;
  std::vector<std::string> dirs;
  for (size_t i = 0; i < own; ++i) {
    dirs.push_back(storage::LayerDir(templates_, layers[i]));
    auto l = store_.GetLayer(layers[i]);
    if (!l.ok()) return l.status();
    if (*l && (*l)->owner_key_id == charge.key_id) charge.credit_bytes += (*l)->size_bytes;
  }
  const std::string what = "merge the " + std::to_string(own) + " layers of sandbox " + rec.id;
  auto staging = storage::MakeStagingDir(templates_);
  if (!staging.ok()) return staging.status().Wrap(what);
  const std::string id = "disk-" + rec.id + "-" + RandomId(8);
  auto copied = runtime::MergeLayerDirs(dirs, *staging, limit);
  auto added = copied.ok() ? storage::AddLayerFromDir(templates_, store_, *staging, id,
                                                      std::nullopt, rec.id, charge)
                           : Result<store::LayerRecord>(copied.status());
  if (!added.ok()) {
    (void)RemoveTree(*staging);
    return added.status().Wrap(what);
  }
  spdlog::info("sandbox {}: merged its {} own layers into {} ({} bytes)", rec.id, own, id,
               added->size_bytes);
  if (Status s = store_.UnpinLayer(rec.id, layers.front()); !s.ok())
    spdlog::warn("sandbox {}: {}", rec.id, s.message());
  layers.erase(layers.begin(), layers.begin() + static_cast<std::ptrdiff_t>(own));
  layers.insert(layers.begin(), id);
  return layers;
}

void Manager::UnpinReplaced(const SandboxRecord& rec, const std::vector<std::string>& layers) {
  // A box that held its top layer (on btrfs) left it behind in its capture (CaptureLayer): only
  // its pin would keep it, until the sandbox ends, through every pause.
  for (const auto& l : rec.layers) {
    if (std::find(layers.begin(), layers.end(), l) != layers.end()) continue;
    if (Status s = store_.UnpinLayer(rec.id, l); !s.ok())
      spdlog::warn("sandbox {}: {}", rec.id, s.message());
  }
}

Status Manager::PauseToDiskLocked(SandboxRecord& rec, const std::string& key_id) {
  if (rec.layers.empty())
    return Status::Error("sandbox " + rec.id +
                             " was created before sbx recorded its layers: it can only be "
                             "paused with its memory",
                         ENOTSUP);
  std::string layer_id = "disk-" + rec.id + "-" + RandomId(8);
  // Frozen from the copy on: what is written after it would be lost.
  // Charged to the sandbox's owner, whoever pauses it.
  auto layers = CaptureLayer(rec, layer_id, /*stay_frozen=*/true, rec.owner_key_id,
                             /*merges=*/true);
  if (!layers.ok()) return layers.status();
  auto box = BoxOf(rec.id);
  if (!box.ok()) return box.status();
  SandboxRecord paused = rec;
  paused.state = store::kStatePaused;
  paused.on_disk = true;
  paused.layers = std::move(layers).value();
  paused.expires_at = 0;
  paused.init_pid = 0;
  paused.agent_socket.clear();
  paused.box_dir.clear();
  paused.updated_at = 0;
  // Recorded before the box goes: a crash in between leaves a record the reconciler completes
  // (it destroys the box of a sandbox paused on disk); the other order would lose the box's
  // files with a record that still says running.
  SBX_RETURN_IF_ERROR(RecordPause(rec, paused, *box));
  CloseChannel(rec.id);
  RemovePausedBox(*box, "on disk");
  UnpinReplaced(rec, paused.layers);
  rec = paused;
  Audit("sandbox.pause", rec.id, key_id, {{"memory", false}, {"layer", layer_id}});
  return {};
}

Status Manager::ResumeFromDiskLocked(SandboxRecord& rec, const std::string& key_id) {
  auto tmpl = storage::TemplateOfLayers(templates_, rec.layers);
  if (!tmpl.ok()) return tmpl.status().Wrap("resume " + rec.id);
  network::Policy policy = config_.network ? PolicyOf(rec) : network::Policy{};
  std::vector<network::SecretBinding> secrets;
  if (policy.mode != network::Mode::kNone) {
    // The placeholders its files may hold get their values again, as after a daemon restart.
    auto bound = SandboxBindings(rec, rec.egress_rules, false);
    if (!bound.ok()) return bound.status().Wrap("resume " + rec.id);
    secrets = std::move(*bound);
  }
  SandboxRecord running = rec;
  auto box = MakeBox(running, *tmpl, policy, std::move(secrets), rec.saved_memory);
  if (!box.ok()) {
    ReleaseNetwork(rec.id);
    return box.status().Wrap("resume " + rec.id);
  }
  running.state = store::kStateRunning;
  running.on_disk = false;
  running.saved_memory.clear();
  running.init_pid = box->init_pid;
  running.agent_socket = box->agent_socket;
  running.box_dir = box->dir;
  running.id_base = box->id_base;
  running.idmapped = box->idmapped;
  running.expires_at = clock_.NowMs() + rec.timeout_ms;
  running.updated_at = 0;
  {
    MutexLock g(mu_);
    boxes_[rec.id] = *box;
  }
  if (Status put = store_.PutSandbox(running); !put.ok()) {
    // Still paused on disk, as its record says: the new box goes.
    (void)runtime_.Destroy(*box);
    {
      MutexLock g(mu_);
      boxes_.erase(rec.id);
    }
    ReleaseNetwork(rec.id);
    return put.Wrap("resume " + rec.id + ": not recorded, so not resumed");
  }
  // Running from it now: the saved memory has served (its disk was copied).
  if (!rec.saved_memory.empty()) (void)RemoveTree(rec.saved_memory);
  Audit("sandbox.resume", rec.id, key_id, {{"memory", !rec.saved_memory.empty()}});
  rec = running;
  return {};
}

Result<SnapshotInfo> Manager::SnapshotLocked(const store::ApiKeyRecord& key,
                                             const SandboxRecord& rec, const std::string& name,
                                             bool files) {
  if (rec.state != store::kStateRunning && rec.state != store::kStatePaused)
    return Status::Error("sandbox " + rec.id + " is " + rec.state + "; try again once it runs",
                         EBUSY);
  if (rec.layers.empty())
    return Status::Error("sandbox " + rec.id +
                             " was created before sbx recorded its layers: it cannot be "
                             "snapshotted",
                         ENOTSUP);
  // Within the key's count before anything is copied (its claim counts again, for good).
  if (key.max_snapshots > 0) {
    auto n = store_.CountSnapshots(key.id);
    if (!n.ok()) return n.status();
    if (*n >= key.max_snapshots) return store::Store::SnapshotsAtBound(key.id, key.max_snapshots);
  }
  std::string id = kSnapshotPrefix + RandomId(20);
  std::vector<std::string> layers = rec.layers;
  // Paused without memory, its files are its layers already.
  if (files && !rec.on_disk) {
    auto captured = CaptureLayer(rec, id, /*stay_frozen=*/false, key.id);  // the snapshot's
    if (!captured.ok()) return captured.status();
    layers = std::move(captured).value();
  }
  // What a command gets when it says nothing, as the sandbox has it; the start and ready
  // commands of its template, when that still exists.
  storage::ImageConfig config;
  if (auto c = storage::GetImageConfig(store_, rec.template_name); c.ok()) config = *c;
  config.env = rec.defaults.env;
  config.user = rec.defaults.user;
  config.workdir = rec.defaults.workdir;
  auto added = builds_->AddSnapshot(key, id, rec.id, layers, config, name, rec.runtime);
  // The snapshot's template holds its layer now; the sandbox's pin (CaptureLayer's, against
  // eviction until then) would keep it, whole, until the sandbox ends, however often it is
  // snapshotted and the snapshots deleted.
  if (added.ok() && files && !rec.on_disk) {
    if (Status s = store_.UnpinLayer(rec.id, id); !s.ok())
      spdlog::warn("snapshot {} of {}: {}", id, rec.id, s.message());
  }
  return added;
}

Result<SnapshotInfo> Manager::Snapshot(const store::ApiKeyRecord& key, const std::string& id,
                                       const std::string& name) {
  auto owned = Owned(key, id, Access::kUse);
  if (!owned.ok()) return owned.status();
  Transition t(*this, id, "snapshot");
  auto rec = LiveRecord(id);
  if (!rec.ok()) return rec.status();
  return SnapshotLocked(key, *rec, name);
}

Result<std::vector<SnapshotInfo>> Manager::ListSnapshots(const store::ApiKeyRecord& key,
                                                         const std::string& sandbox_id,
                                                         const std::string& name) {
  return builds_->Snapshots(key, sandbox_id, name);
}

Status Manager::DeleteSnapshot(const store::ApiKeyRecord& key, const std::string& id_or_name) {
  return builds_->DeleteSnapshot(key, id_or_name);
}

Result<std::vector<Result<SandboxRecord>>> Manager::Fork(const store::ApiKeyRecord& key,
                                                         const std::string& id, int count,
                                                         int64_t timeout_ms) {
  if (count < 1 || count > kMaxForks)
    return Status::Error("count: 1.." + std::to_string(kMaxForks), EINVAL);
  if (timeout_ms != 0) SBX_RETURN_IF_ERROR(limits_.CheckTimeout(key.ranges, timeout_ms));
  auto owned = Owned(key, id, Access::kUse);
  if (!owned.ok()) return owned.status();
  SandboxRecord src;
  SnapshotInfo snap;
  // A vm sandbox forks with its memory: saved here (it runs on) or where its pause saved it; the
  // forks start from that, and the snapshot is its layers alone.
  std::string memory, made_memory;
  {
    Transition t(*this, id, "fork");
    auto rec = LiveRecord(id);
    if (!rec.ok()) return rec.status();
    bool with_memory = rec->runtime == "vm" && !config_.data_dir.empty();
    if (with_memory && !rec->saved_memory.empty()) {
      // Paused on disk: linked, not copied (a resume of the source meanwhile removes its own).
      auto dir = NewMemoryDir("fork-" + rec->id);
      if (!dir.ok()) return dir.status().Wrap("fork " + id);
      for (const char* f : {"memory", "disk.img", "cfg.img", "shape"}) {
        std::string from = rec->saved_memory + "/" + f, to = *dir + "/" + f;
        if (::link(from.c_str(), to.c_str()) != 0) {
          Status s = Status::Errno("fork " + id + ": link its saved " + f);
          (void)RemoveTree(*dir);
          return s;
        }
      }
      memory = made_memory = *dir;
    } else if (with_memory && rec->state == store::kStateRunning) {
      auto box = BoxOf(rec->id);
      if (!box.ok()) return box.status();
      auto dir = NewMemoryDir("fork-" + rec->id);
      if (!dir.ok()) return dir.status().Wrap("fork " + id);
      if (Status s = runtime_.SaveMemory(*box, *dir, /*stop=*/false); !s.ok()) {
        (void)RemoveTree(*dir);
        return ForClients(id, "fork", s);
      }
      memory = made_memory = *dir;
    } else if (with_memory) {
      return Status::Error("sandbox " + id + " is paused in memory; resume it to fork it", EBUSY);
    }
    auto taken = SnapshotLocked(key, *rec, "", /*files=*/memory.empty());
    if (!taken.ok()) {
      if (!made_memory.empty()) (void)RemoveTree(made_memory);
      return taken.status();
    }
    src = *rec;
    snap = *taken;
  }
  CreateRequest req;
  req.restore_memory = memory;
  req.template_name = snap.id;
  req.env = src.env;
  for (const auto& ref : src.secrets) {
    req.secrets[ref.env] = ref.secret;
    req.env.erase(ref.env);  // the fork's own placeholder takes its place
  }
  req.metadata = src.metadata;
  req.limits = src.limits;
  req.timeout_ms = timeout_ms != 0 ? timeout_ms : src.timeout_ms;
  req.on_timeout = src.on_timeout;
  req.pause_memory = src.pause_memory;
  req.auto_resume = src.auto_resume;
  req.public_ports = src.public_ports;
  req.network = PolicyOf(src);
  req.egress_rules = src.egress_rules;
  req.mask_request_host = src.mask_request_host;
  std::vector<Result<SandboxRecord>> out;
  out.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) out.push_back(Create(key, req));
  // Each fork copied what it needed of the saved memory.
  if (!made_memory.empty()) (void)RemoveTree(made_memory);
  // Only the forks needed it: their pins keep its layer while they live.
  if (Status s = builds_->DeleteSnapshot(key, snap.id); !s.ok())
    spdlog::warn("fork of {}: its snapshot {} stays: {}", id, snap.id, s.message());
  Audit("sandbox.fork", id, key.id,
        {{"count", count}, {"memory", !memory.empty()}, {"forks", [&] {
                                                           nlohmann::json ids =
                                                               nlohmann::json::array();
                                                           for (const auto& r : out)
                                                             ids.push_back(r.ok() ? r->id : "");
                                                           return ids;
                                                         }()}});
  return out;
}

Result<SandboxRecord> Manager::SetTimeout(const store::ApiKeyRecord& key, const std::string& id,
                                          int64_t timeout_ms, bool extend_only) {
  SBX_RETURN_IF_ERROR(limits_.CheckTimeout(key.ranges, timeout_ms));
  auto owned = Owned(key, id, Access::kUse);
  if (!owned.ok()) return owned.status();
  Transition t(*this, id, "timeout");
  auto rec = LiveRecord(id);
  if (!rec.ok()) return rec.status();
  if (extend_only && rec->state == store::kStateRunning &&
      rec->expires_at >= clock_.NowMs() + timeout_ms)
    return *rec;
  rec->timeout_ms = timeout_ms;
  if (rec->state == store::kStateRunning) rec->expires_at = clock_.NowMs() + timeout_ms;
  rec->updated_at = 0;
  SBX_RETURN_IF_ERROR(store_.PutSandbox(*rec));
  Audit("sandbox.timeout_set", id, key.id, {{"timeout_ms", timeout_ms}});
  return *rec;
}

Result<SandboxRecord> Manager::SetNetwork(const store::ApiKeyRecord& key, const std::string& id,
                                          const network::Policy& asked,
                                          const std::string* egress_rules) {
  network::Policy policy = asked;
  if (!config_.network) {
    if (!AllowsNothing(policy))
      return Status::Error(std::string("network: ") + kNetworkingOff, EINVAL);
    policy = network::Policy{};
  }
  auto owned = Owned(key, id, Access::kUse);
  if (!owned.ok()) return owned.status();
  Transition t(*this, id, "network");
  auto rec = LiveRecord(id);
  if (!rec.ok()) return rec.status();
  bool has_net;
  {
    MutexLock g(mu_);
    has_net = networked_.count(id) > 0;
  }
  // Paused without memory, it has no box: the policy is for the one its resume makes.
  if (rec->on_disk) has_net = false;
  if (!has_net && !rec->on_disk && policy.mode != network::Mode::kNone)
    return Status::Error("sandbox " + id +
                             " was created without a network (mode none), so its network "
                             "namespace has no interface to open; create it with the policy",
                         EBUSY);
  network::Policy before = PolicyOf(*rec);
  SandboxRecord next = *rec;
  next.network = policy.ToJson();
  // The bandwidth limit in force today (sbx serve --max-egress-mbps may have come down since).
  next.limits.egress_mbps = limits_.EgressWithin(key.ranges, next.limits.egress_mbps);
  if (egress_rules) next.egress_rules = egress_rules->empty() ? "{}" : *egress_rules;
  next.updated_at = 0;
  // New rules name this key's secrets, checked as at create; the env bindings stay as they are
  // (the box holds their placeholders), opened again with the rules' into the new entry.
  std::vector<network::SecretBinding> bindings;
  if (egress_rules || has_net) {
    auto b = SandboxBindings(next, next.egress_rules, egress_rules != nullptr);
    if (!b.ok()) return b.status();
    bindings = std::move(*b);
  }
  // The box first, then the record; a record that cannot be written puts the old policy back,
  // so the two never disagree for longer than this call.
  if (has_net) {
    network::BoxNetRequest want;
    want.policy = policy;
    want.secrets = std::move(bindings);
    want.egress_bytes_per_s = EgressBytesPerSecond(next.limits);
    SBX_RETURN_IF_ERROR(config_.network->Update(id, want).Wrap("network of sandbox " + id));
  }
  if (Status put = store_.PutSandbox(next); !put.ok()) {
    if (has_net) {
      network::BoxNetRequest old;
      old.policy = before;
      if (auto b = SandboxBindings(*rec, rec->egress_rules, false); b.ok())
        old.secrets = std::move(*b);
      old.egress_bytes_per_s = EgressBytesPerSecond(rec->limits);
      if (Status undo = config_.network->Update(id, old); !undo.ok())
        spdlog::error("sandbox {}: the policy change was not recorded and not undone: {}", id,
                      undo.message());
    }
    return put.Wrap("network of sandbox " + id + ": not recorded, so not changed");
  }
  Audit("sandbox.network_set", id, key.id, {{"network", policy.Describe()}});
  return next;
}

Result<Connected> Manager::Connect(const store::ApiKeyRecord& key, const std::string& id,
                                   int64_t timeout_ms) {
  SBX_RETURN_IF_ERROR(limits_.CheckTimeout(key.ranges, timeout_ms));
  auto owned = Owned(key, id, Access::kUse);
  if (!owned.ok()) return owned.status();
  Transition t(*this, id, "connect");
  auto rec = LiveRecord(id);
  if (!rec.ok()) return rec.status();
  Connected out;
  if (rec->state == store::kStatePaused) {
    rec->timeout_ms = timeout_ms;
    SBX_RETURN_IF_ERROR(ResumeLocked(*rec, key.id));
    out.resumed = true;
  } else if (rec->state == store::kStateRunning) {
    int64_t until = clock_.NowMs() + timeout_ms;
    if (rec->expires_at < until) {
      rec->timeout_ms = timeout_ms;
      rec->expires_at = until;
      rec->updated_at = 0;
      SBX_RETURN_IF_ERROR(store_.PutSandbox(*rec));
      Audit("sandbox.timeout_set", id, key.id, {{"timeout_ms", timeout_ms}});
    }
  } else {
    return Status::Error("sandbox " + id + " is " + rec->state + "; try again once it runs", EBUSY);
  }
  out.record = *rec;
  return out;
}

Result<Manager::PortSocket> Manager::TcpSocket(const store::ApiKeyRecord& key,
                                               const std::string& id, int port) {
  auto rec = Owned(key, id, Access::kUse);
  if (!rec.ok()) return rec.status();
  if (rec->state != store::kStateRunning)
    return Status::Error(
        "sandbox " + id + " is " + rec->state +
            (rec->state == store::kStatePaused ? "; resume it first" : "; it does not run"),
        EBUSY);
  auto box = BoxOf(id);
  if (!box.ok()) return box.status();
  auto socket = runtime_.OpenSocket(*box, AF_INET, SOCK_STREAM | SOCK_NONBLOCK);
  if (socket.ok()) return PortSocket{std::move(socket).value(), false};
  if (socket.status().err() != ENOTSUP) return ForClients(id, "socket", socket.status());
  // Through the agent (TCP_CONNECT): its connection becomes the port's stream.
  auto stream = protocol::AgentConnection::ConnectPort(box->agent_socket, port);
  if (!stream.ok()) {
    // Nothing listening, or the port refused: the client's to know, as a refused connect.
    int err = stream.status().err();
    if (err == ECONNREFUSED || err == ETIMEDOUT || err == EHOSTUNREACH) return stream.status();
    return ForClients(id, "port", stream.status());
  }
  int flags = ::fcntl(stream->get(), F_GETFL);
  if (flags < 0 || ::fcntl(stream->get(), F_SETFL, flags | O_NONBLOCK) != 0)
    return Status::Errno("port stream of sandbox " + id);
  return PortSocket{std::move(stream).value(), true};
}

Result<store::SandboxRecord> Manager::Settled(const store::ApiKeyRecord& key,
                                              const std::string& id) {
  auto owned = Owned(key, id, Access::kInspect);
  if (!owned.ok()) return owned.status();
  { Transition t(*this, id, "settle"); }
  return Owned(key, id, Access::kInspect);
}

Result<runtime::BoxStats> Manager::Stats(const store::ApiKeyRecord& key, const std::string& id) {
  auto rec = Owned(key, id, Access::kInspect);
  if (!rec.ok()) return rec.status();
  auto box = BoxOf(id);
  if (!box.ok()) return box.status();
  auto stats = runtime_.Stats(*box);
  if (!stats.ok()) return ForClients(id, "stats", stats.status());
  return stats;
}

uint64_t Manager::OomKills(const std::string& id) {
  auto box = BoxOf(id);
  if (!box.ok()) return 0;
  auto n = runtime_.OomKills(*box);
  return n.ok() ? *n : 0;
}

Result<std::vector<MetricSample>> Manager::Metrics(const store::ApiKeyRecord& key,
                                                   const std::string& id, int64_t start_ms,
                                                   int64_t end_ms) {
  auto rec = Owned(key, id, Access::kInspect);
  if (!rec.ok()) return rec.status();
  if (rec->state == store::kStateRunning && !history_.Has(id)) {
    if (auto box = BoxOf(id); box.ok()) {
      if (auto st = runtime_.Stats(*box); st.ok())
        history_.Add(id, clock_.NowMs(), rec->created_at, std::ceil(rec->limits.cpus), *st);
    }
  }
  return history_.Window(id, start_ms, end_ms);
}

void Manager::SampleMetrics() {
  auto live = store_.ListLiveSandboxes();
  if (!live.ok()) return;
  std::set<std::string> ids;
  for (const auto& rec : *live) {
    ids.insert(rec.id);
    if (rec.state != store::kStateRunning) continue;  // a paused sandbox's figures stand still
    auto box = BoxOf(rec.id);
    if (!box.ok()) continue;
    if (auto st = runtime_.Stats(*box); st.ok())
      history_.Add(rec.id, clock_.NowMs(), rec.created_at, std::ceil(rec.limits.cpus), *st);
  }
  history_.Retain(ids);
}

Result<std::optional<store::ApiKeyRecord>> Manager::VerifyKey(const std::string& secret) {
  return store_.VerifyApiKey(secret);
}

Result<std::optional<std::string>> Manager::RegisteredTemplate(const store::ApiKeyRecord& key,
                                                               const std::string& name) {
  auto hidden = builds_->Hidden(key, name);
  if (!hidden.ok()) return hidden.status();
  if (*hidden) return std::optional<std::string>();
  auto rec = store_.GetTemplate(name);
  if (!rec.ok()) return rec.status();
  if (!*rec) return std::optional<std::string>();
  return std::optional<std::string>((*rec)->kind == store::kTemplateAlias ? (*rec)->alias_of
                                                                          : name);
}

Result<int64_t> Manager::CountSandboxes(const store::ApiKeyRecord& key,
                                        const std::vector<std::string>& states) {
  return store_.CountSandboxes(key.is_operator ? "" : key.id, states);
}

Result<std::vector<store::AuditEvent>> Manager::AuditTrail(const store::ApiKeyRecord& key,
                                                           const std::string& id, size_t limit) {
  auto rec = Owned(key, id, Access::kInspect);
  if (!rec.ok()) return rec.status();
  store::AuditQuery q;
  q.sandbox_id = id;
  q.limit = limit;
  return store_.QueryAudit(q);
}

Result<std::vector<store::AuditEvent>> Manager::QueryAudit(const store::AuditQuery& q) {
  return store_.QueryAudit(q);
}

Result<std::optional<Manager::OwnedSandbox>> Manager::OwnedBy(const std::string& id,
                                                              bool auto_resumable) {
  auto rec = Record(id);
  if (!rec.ok()) return rec.status();
  bool resumable = auto_resumable && *rec && (*rec)->state == store::kStatePaused &&
                   (*rec)->auto_resume && (!(*rec)->on_disk || !(*rec)->saved_memory.empty());
  if (!*rec || ((*rec)->state != store::kStateRunning && !resumable))
    return std::optional<OwnedSandbox>();
  auto key = store_.GetApiKey((*rec)->owner_key_id);
  if (!key.ok()) return key.status();
  if (!*key || !(*key)->active()) return std::optional<OwnedSandbox>();
  return std::optional<OwnedSandbox>(OwnedSandbox{std::move(**rec), std::move(**key)});
}

Result<SandboxRecord> Manager::AutoResume(const store::ApiKeyRecord& owner, const std::string& id) {
  auto owned = Owned(owner, id, Access::kUse);
  if (!owned.ok()) return owned.status();
  Transition t(*this, id, "auto_resume");
  auto rec = LiveRecord(id);
  if (!rec.ok()) return rec.status();
  if (rec->state == store::kStateRunning) return *rec;
  if (rec->state != store::kStatePaused || !rec->auto_resume ||
      (rec->on_disk && rec->saved_memory.empty()))
    return Status::Error("sandbox " + id + " is " + rec->state + " and not resumed by requests",
                         EBUSY);
  SBX_RETURN_IF_ERROR(ResumeLocked(*rec, owner.id));
  Audit("sandbox.auto_resume", id, owner.id);
  return *rec;
}

Status Manager::PingStore() { return store_.Ping(); }

store::WriteHealth Manager::CheckStoreWritable(int64_t probe_after_ms) {
  return store_.CheckWritable(probe_after_ms);
}

store::WriteHealth Manager::StoreWriteHealth() { return store_.WriteHealth(); }

Status Manager::CheckStoreIntegrity() { return store_.CheckIntegrity(); }

store::AuditQueueCounters Manager::AuditCounters() { return store_.audit_queue().counters(); }

Result<std::vector<store::SandboxRecord>> Manager::LiveRecords() {
  return store_.ListLiveSandboxes();
}

// One connect in flight for a sandbox: the caller that started it publishes its result, and every
// caller that arrived meanwhile waits for it (on its own executor).
struct Manager::Connecting {
  // A waiting coroutine's completion handler, posted to its executor when the result is in.
  struct Wake {
    virtual ~Wake() = default;
    virtual void Post() = 0;
  };
  template <typename Handler>
  struct WakeHandler : Wake {
    explicit WakeHandler(Handler h) : handler(std::move(h)) {}
    void Post() override {
      auto ex = boost::asio::get_associated_executor(handler);
      boost::asio::post(ex, std::move(handler));
    }
    Handler handler;
  };

  std::mutex mu;
  bool done = false;                                                               // guarded by mu
  Result<std::shared_ptr<AgentChannel>> result = std::shared_ptr<AgentChannel>();  // by mu
  std::vector<std::unique_ptr<Wake>> waiters;                                      // guarded by mu

  void Publish(Result<std::shared_ptr<AgentChannel>> r) {
    std::vector<std::unique_ptr<Wake>> wake;
    {
      std::lock_guard<std::mutex> g(mu);
      if (done) return;
      done = true;
      result = std::move(r);
      wake.swap(waiters);
    }
    for (auto& w : wake) w->Post();
  }

  // Completes (on the awaiting coroutine's executor) once the result is published.
  boost::asio::awaitable<Result<std::shared_ptr<AgentChannel>>> Await() {
    co_await boost::asio::async_initiate<decltype(boost::asio::use_awaitable), void()>(
        [this](auto handler) {
          std::unique_lock<std::mutex> lock(mu);
          if (done) {
            lock.unlock();
            WakeHandler<decltype(handler)>(std::move(handler)).Post();
            return;
          }
          waiters.push_back(std::make_unique<WakeHandler<decltype(handler)>>(std::move(handler)));
        },
        boost::asio::use_awaitable);
    std::lock_guard<std::mutex> g(mu);
    co_return result;
  }
};

boost::asio::awaitable<Result<std::shared_ptr<AgentChannel>>> Manager::Channel(
    const store::ApiKeyRecord& key, const std::string& id, store::SandboxRecord* record) {
  auto rec = Owned(key, id, Access::kUse);
  if (!rec.ok()) co_return rec.status();
  if (record != nullptr) *record = *rec;
  if (rec->state == store::kStatePaused)
    co_return Status::Error("sandbox " + id + " is paused; resume it first", EBUSY);
  if (rec->state != store::kStateRunning)
    co_return Status::Error("sandbox " + id + " has ended (" + rec->state + ")", ENOENT);
  std::shared_ptr<Connecting> flight;
  bool leader = false;
  {
    MutexLock g(mu_);
    auto it = channels_.find(id);
    if (it != channels_.end() && !it->second->closed()) co_return it->second;
    auto& f = connecting_[id];
    if (!f) {
      f = std::make_shared<Connecting>();
      leader = true;
    }
    flight = f;
  }
  if (!leader) co_return co_await flight->Await();

  // This caller connects for everyone. Whatever ends this coroutine (a result, an exception, the
  // executor being destroyed) ends the flight, so no waiter is left waiting.
  struct EndFlight {
    Manager& m;
    const std::string& id;
    std::shared_ptr<Connecting> flight;
    Result<std::shared_ptr<AgentChannel>> result =
        Status::Error("connect abandoned (the daemon is stopping)", ECANCELED);
    ~EndFlight() {
      {
        MutexLock g(m.mu_);
        if (auto it = m.connecting_.find(id); it != m.connecting_.end() && it->second == flight)
          m.connecting_.erase(it);
      }
      flight->Publish(std::move(result));
    }
  } end{*this, id, flight};

  auto ex = co_await boost::asio::this_coro::executor;
  auto ch = co_await AgentChannel::Connect(ex, rec->agent_socket, std::chrono::milliseconds(5000));
  if (!ch.ok()) {
    end.result = ch.status().Wrap("sandbox " + id);
    co_return end.result;
  }
  // A sandbox killed meanwhile gets none (its kill closed the channels it knew of).
  bool alive;
  {
    MutexLock g(mu_);
    alive = boxes_.count(id) > 0;
    if (alive) channels_[id] = *ch;
  }
  if (!alive) {
    (*ch)->Close();
    end.result = Status::Error("sandbox " + id + " has ended", ENOENT);
  } else {
    end.result = *ch;
  }
  co_return end.result;
}

void Manager::MarkAgentExited(SandboxRecord rec, const std::string& how) {
  spdlog::warn("sandbox {}: {}", rec.id, how);
  rec.error = how;
  Status s = KillLocked(rec, "agent_exited", {{"error", how}}, store::kStateFailed);
  if (!s.ok()) spdlog::error("sandbox {}: after its agent exited: {}", rec.id, s.message());
}

void Manager::ExpireDue() {
  RetryUnwritten();
  auto live = store_.ListLiveSandboxes();
  if (!live.ok()) {
    spdlog::error("ttl: {}", live.status().message());
    return;
  }
  // Keys revoked (by `sbx key revoke`, which writes the store from another process): their
  // sandboxes are killed, so nothing keeps running that no key can manage.
  std::set<std::string> revoked;
  if (auto keys = store_.ListApiKeys(); keys.ok()) {
    for (const auto& k : *keys)
      if (!k.active()) revoked.insert(k.id);
  } else {
    spdlog::error("ttl: {}", keys.status().message());
  }
  for (const auto& listed : *live) {
    // A sandbox still being created is left to its create; the next scan sees it running.
    if (listed.state == store::kStateCreating) continue;
    {
      std::lock_guard<std::mutex> g(ttl_work_mu_);
      if (ttl_pausing_.count(listed.id)) continue;  // the worker's now
    }
    // Decided on the record as it is under the sandbox's lock, not as listed: a pause, resume,
    // timeout or kill may have happened since. A sandbox busy with another call is the next
    // scan's: this one goes on to the others.
    Transition t(*this, listed.id, "ttl", std::try_to_lock);
    if (!t.owns()) continue;
    auto cur = LiveRecord(listed.id);
    if (!cur.ok() || cur->state == store::kStateCreating) continue;
    SandboxRecord& rec = *cur;
    if (revoked.count(rec.owner_key_id)) {
      Status s = KillLocked(rec, "key_revoked");
      if (!s.ok())
        spdlog::error("revoked key {}: sandbox {}: {}", rec.owner_key_id, rec.id, s.message());
      else
        spdlog::info("sandbox {} killed: its key {} was revoked", rec.id, rec.owner_key_id);
      continue;
    }
    // A box whose agent died (killed from the host, crashed) is of no use: it fails, and what it
    // held is freed now rather than at its timeout.
    if (auto box = BoxOf(rec.id); box.ok()) {
      if (auto exit = runtime_.AgentExit(*box)) {
        // The OOM killer may take the box's own kernel with a process over the limit (gVisor's
        // Sentry is in the box's cgroup), or the kernel fail the Sentry's own allocation there
        // (BoxStats::ooms): its record says so first.
        std::string how = *exit;
        if (auto st = runtime_.Stats(*box); st.ok() && (st->oom_kills > 0 || st->ooms > 0))
          how = "out of memory: the box hit its memory limit of " +
                FormatSize(rec.limits.memory_bytes) + "; " + how;
        MarkAgentExited(rec, how);
        continue;
      }
    }
    int64_t now = clock_.NowMs();
    if (rec.state != store::kStateRunning || rec.expires_at == 0 || rec.expires_at > now) continue;
    if (ttl_async_ && rec.on_timeout == store::kOnTimeoutPause && !rec.pause_memory) {
      {
        std::lock_guard<std::mutex> g(ttl_work_mu_);
        if (ttl_pausing_.insert(rec.id).second) ttl_work_.push_back(rec.id);
      }
      ttl_work_cv_.notify_one();
      continue;
    }
    TimeoutLocked(rec);
  }
}

void Manager::TimeoutLocked(SandboxRecord& rec) {
  Status s;
  if (rec.on_timeout == store::kOnTimeoutPause) {
    s = rec.pause_memory ? PauseLocked(rec, rec.owner_key_id)
                         : PauseToDiskLocked(rec, rec.owner_key_id);
    // A pause to disk that fails (the box's files do not fit in the template cache, say) would
    // be retried on every scan, each time freezing and copying the box, while it ran on past
    // its timeout: it is paused with its memory instead, which keeps its files as well.
    if (!s.ok() && !rec.pause_memory) {
      if (auto current = LiveRecord(rec.id);
          current.ok() && current->state == store::kStateRunning) {
        spdlog::warn(
            "ttl: sandbox {}: pause without memory failed ({}); pausing it with its "
            "memory",
            rec.id, s.message());
        rec = *current;
        s = PauseLocked(rec, rec.owner_key_id);
      }
    }
    Audit("sandbox.timeout", rec.id, rec.owner_key_id, {{"action", "pause"}});
  } else {
    s = KillLocked(rec, "timeout");
    Audit("sandbox.timeout", rec.id, rec.owner_key_id, {{"action", "kill"}});
  }
  if (!s.ok())
    spdlog::error("ttl: sandbox {}: {}", rec.id, s.message());
  else
    spdlog::info("ttl: sandbox {} timed out ({})", rec.id, rec.on_timeout);
}

void Manager::TtlPauseWorker() {
  std::unique_lock<std::mutex> g(ttl_work_mu_);
  for (;;) {
    ttl_work_cv_.wait(g, [this] { return ttl_work_stop_ || !ttl_work_.empty(); });
    if (ttl_work_stop_) return;
    const std::string id = ttl_work_.front();
    ttl_work_.erase(ttl_work_.begin());
    g.unlock();
    {
      // As the scan found it, unless a call came first (a resume's new timeout, a kill).
      Transition t(*this, id, "ttl");
      auto rec = LiveRecord(id);
      if (rec.ok() && rec->state == store::kStateRunning && rec->expires_at != 0 &&
          rec->expires_at <= clock_.NowMs())
        TimeoutLocked(*rec);
    }
    g.lock();
    ttl_pausing_.erase(id);
  }
}

void Manager::StartTtlLoop(std::chrono::milliseconds period) {
  ttl_async_ = true;
  ttl_worker_ = std::thread([this] { TtlPauseWorker(); });
  ttl_thread_ = std::thread([this, period] {
    auto next_sample = clock_.Steady();
    while (!ttl_waiter_->WaitUntil(std::min(clock_.Steady() + period, next_sample))) {
      if (clock_.Steady() >= next_sample) {
        SampleMetrics();
        next_sample = clock_.Steady() + std::chrono::milliseconds(kMetricsPeriodMs);
      }
      ExpireDue();
    }
  });
}

bool Manager::AwaitCleanup(const std::string& id, std::chrono::milliseconds timeout) {
  return cleanups_.Await(id, timeout);
}

bool Manager::AwaitCleanups(std::chrono::milliseconds timeout) {
  return cleanups_.AwaitAll(timeout);
}

std::vector<std::string> Manager::PendingCleanups() { return cleanups_.Pending(); }

void Manager::Stop() {
  ttl_waiter_->Wake();
  if (ttl_thread_.joinable()) ttl_thread_.join();
  {
    // A pause queued and not begun is the next start's scan's (its record still says running).
    std::lock_guard<std::mutex> g(ttl_work_mu_);
    ttl_work_stop_ = true;
  }
  ttl_work_cv_.notify_all();
  if (ttl_worker_.joinable()) ttl_worker_.join();
  {
    std::lock_guard<std::mutex> g(pool_wake_mu_);
    pool_stop_ = true;
  }
  pool_cv_.notify_all();
  if (pool_thread_.joinable()) pool_thread_.join();
  cleanups_.Stop();
}

ManagerCounters Manager::counters() {
  MutexLock g(mu_);
  return counters_;
}

std::vector<std::pair<SandboxRecord, runtime::BoxStats>> Manager::LiveStats() {
  std::vector<std::pair<SandboxRecord, runtime::BoxStats>> out;
  auto live = store_.ListLiveSandboxes();
  if (!live.ok()) return out;
  for (auto& rec : *live) {
    auto box = BoxOf(rec.id);
    if (!box.ok()) continue;
    auto st = runtime_.Stats(*box);
    if (st.ok()) out.emplace_back(std::move(rec), *st);
  }
  return out;
}

}  // namespace sbx::sandbox
