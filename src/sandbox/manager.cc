#include "sandbox/manager.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/this_coro.hpp>
#include <cmath>
#include <cstdio>

#include "common/encoding.h"
#include "common/fd.h"
#include "common/fs.h"

namespace sbx::sandbox {
namespace {

using store::SandboxRecord;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

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

}  // namespace

Manager::Manager(ManagerConfig config, runtime::Runtime& runtime, storage::TemplateStore templates,
                 store::Store& store)
    : config_(std::move(config)),
      runtime_(runtime),
      templates_(std::move(templates)),
      store_(store),
      limits_(config_.ranges) {}

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
    std::lock_guard<std::mutex> g(mu_);
    in_flight = disk_in_flight_;
  }
  int64_t available = std::max<int64_t>(0, free - reserve - in_flight);
  if (l.disk_bytes > available)
    return Status::Error(
        "limits.disk_bytes: " + Bytes(l.disk_bytes) + " does not fit: " + Bytes(available) +
            " free in " + config_.data_dir + " (" + Bytes(free) + " free on its filesystem, less " +
            Bytes(reserve) + " kept in reserve" +
            (in_flight > 0 ? " and " + Bytes(in_flight) + " promised to sandboxes being created"
                           : std::string()) +
            ")",
        ENOSPC);
  return {};
}

Manager::~Manager() { Stop(); }

void Manager::Audit(const std::string& type, const std::string& sandbox_id,
                    const std::string& key_id, nlohmann::json detail) {
  store::AuditEvent e;
  e.type = type;
  e.sandbox_id = sandbox_id;
  e.key_id = key_id;
  e.detail = std::move(detail);
  if (auto r = store_.AppendAudit(e); !r.ok())
    spdlog::error("audit {} {}: {}", type, sandbox_id, r.status().message());
}

Status Manager::Reconcile() {
  // Template layer pins of creates that died before recording their sandbox (none is in flight).
  if (auto dropped = store_.DropOrphanPins(); !dropped.ok())
    return dropped.status().Wrap("reconcile");
  auto live = store_.ListLiveSandboxes();
  if (!live.ok()) return live.status().Wrap("reconcile");
  std::set<std::string> kept;
  for (auto& rec : *live) {
    std::string why;
    if (rec.state == store::kStateCreating) {
      why = "the daemon stopped while it was being created";
    } else if (auto box = runtime_.Adopt(rec.id); box.ok()) {
      std::lock_guard<std::mutex> g(mu_);
      boxes_[rec.id] = *box;
      kept.insert(rec.id);
      spdlog::info("reconcile: sandbox {} ({}) kept running across the restart", rec.id, rec.state);
      continue;
    } else if (box.status().err() == EBUSY) {
      return Status::Error(
          "sandbox " + rec.id +
              " is held by another live process: is another sbx serve using this data directory?",
          EBUSY);
    } else {
      why = "lost while the daemon was down: " + box.status().message();
    }
    Status destroyed = runtime_.Destroy(runtime::Box{rec.id});
    if (!destroyed.ok()) spdlog::warn("reconcile: {}", destroyed.message());
    rec.state = store::kStateFailed;
    rec.error = why;
    rec.ended_at = NowMs();
    rec.updated_at = 0;
    SBX_RETURN_IF_ERROR(store_.PutSandbox(rec));
    Audit("sandbox.lost", rec.id, rec.owner_key_id, {{"reason", why}});
    spdlog::warn("reconcile: sandbox {} marked failed: {}", rec.id, why);
  }
  // Boxes on the host that no live record owns and no live process holds (a crash between
  // creating a box and recording it, a record deleted by hand, a killed `sbx run`) are removed.
  // Boxes locked by a live process (a running `sbx run`) are not ours to touch.
  for (const char* owner : {"serve", "run"}) {
    auto reaped = runtime_.ReapOrphans(owner);
    if (!reaped.ok()) return reaped.status().Wrap("reconcile");
    if (*reaped > 0)
      spdlog::warn("reconcile: removed {} box(es) no record owns ({})", *reaped, owner);
  }
  return {};
}

bool Manager::TakeCreateToken(const store::ApiKeyRecord& key, double* retry_after_s) {
  if (key.creates_per_second <= 0) return true;
  std::lock_guard<std::mutex> g(mu_);
  auto now = std::chrono::steady_clock::now();
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
  auto started = std::chrono::steady_clock::now();
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
  std::string tmpl_name = req.template_name.empty() ? config_.default_template : req.template_name;

  // Against the host: what the request asks for (the defaults are the operator's choice, even on
  // a host smaller than them), and the disk it will get. Checked again below, under the lock
  // that promises the disk; here so that a bad request fails before any quota is spent.
  store::SandboxLimits wanted = req.limits;
  if (wanted.disk_bytes == 0) wanted.disk_bytes = config_.default_limits.disk_bytes;
  SBX_RETURN_IF_ERROR(CheckHostLimits(wanted));
  // Idempotency: a retried request gets the sandbox the first one created.
  if (!req.idempotency_key.empty()) {
    if (req.idempotency_key.size() > 256)
      return Status::Error("Idempotency-Key: at most 256 bytes", EINVAL);
    auto prior = store_.GetIdempotency(key.id, req.idempotency_key);
    if (!prior.ok()) return prior.status();
    if (*prior) {
      if ((*prior)->request_hash != req.request_hash)
        return Status::Error("Idempotency-Key was used with a different request", EEXIST);
      auto rec = store_.GetSandbox((*prior)->sandbox_id);
      if (!rec.ok()) return rec.status();
      if (*rec) return **rec;
    }
    std::lock_guard<std::mutex> g(mu_);
    if (!creating_keys_.insert(key.id + "\n" + req.idempotency_key).second)
      return Status::Error("a request with this Idempotency-Key is in progress", EBUSY);
  }
  struct Release {
    Manager* m;
    std::string k;
    ~Release() {
      if (k.empty()) return;
      std::lock_guard<std::mutex> g(m->mu_);
      m->creating_keys_.erase(k);
    }
  } release{this, req.idempotency_key.empty() ? "" : key.id + "\n" + req.idempotency_key};

  // Quotas: concurrent sandboxes, then the creation rate.
  if (key.max_sandboxes > 0) {
    auto n = store_.CountSandboxes(
        key.id, {store::kStateCreating, store::kStateRunning, store::kStatePaused});
    if (!n.ok()) return n.status();
    if (*n >= key.max_sandboxes) {
      if (quota) quota->retry_after_s = 1;
      return Status::Error(
          "this key may have at most " + std::to_string(key.max_sandboxes) + " live sandboxes",
          EAGAIN);
    }
  }
  double retry_after = 1;
  if (!TakeCreateToken(key, &retry_after)) {
    if (quota) quota->retry_after_s = retry_after;
    return Status::Error("this key may create at most " + std::to_string(key.creates_per_second) +
                             " sandboxes per second",
                         EAGAIN);
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
      std::lock_guard<std::mutex> g(m->mu_);
      m->disk_in_flight_ -= bytes;
    }
  } promise{this, disk};
  {
    std::lock_guard<std::mutex> g(mu_);
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
  rec.state = store::kStateCreating;
  rec.owner_key_id = key.id;
  rec.metadata = req.metadata;
  rec.env = req.env;
  rec.limits = WithDefaults(req.limits, config_.default_limits);
  rec.timeout_ms = req.timeout_ms > 0 ? req.timeout_ms : config_.default_timeout_ms;
  rec.on_timeout = req.on_timeout;
  rec.public_ports = req.public_ports;
  rec.created_at = NowMs();
  SBX_RETURN_IF_ERROR(store_.PutSandbox(rec));

  runtime::BoxSpec spec;
  spec.id = rec.id;
  spec.layers = tmpl->layers;
  spec.binds = tmpl->binds;
  spec.limits = ToRuntime(rec.limits);
  spec.owner = "serve";
  auto box = runtime_.Create(spec);
  int64_t now = NowMs();
  if (!box.ok()) {
    rec.state = store::kStateFailed;
    rec.error = box.status().message();
    rec.ended_at = now;
    rec.updated_at = 0;
    (void)store_.PutSandbox(rec);
    {
      std::lock_guard<std::mutex> g(mu_);
      ++counters_.creation_failures;
    }
    Audit("sandbox.create_failed", rec.id, key.id, {{"error", rec.error}});
    return box.status();
  }
  rec.state = store::kStateRunning;
  rec.init_pid = box->init_pid;
  rec.agent_socket = box->agent_socket;
  rec.box_dir = box->dir;
  rec.id_base = box->id_base;
  rec.idmapped = box->idmapped;
  rec.expires_at = now + rec.timeout_ms;
  rec.updated_at = 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    boxes_[rec.id] = *box;
    ++counters_.creations;
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (counters_.create_seconds.size() >= 4096)
      counters_.create_seconds.erase(counters_.create_seconds.begin());
    counters_.create_seconds.push_back(secs);
  }
  Status put = store_.PutSandbox(rec);
  if (!put.ok()) {
    // Without a record nothing could ever find the box again: remove it.
    (void)runtime_.Destroy(*box);
    std::lock_guard<std::mutex> g(mu_);
    boxes_.erase(rec.id);
    return put;
  }
  if (!req.idempotency_key.empty()) {
    store::IdempotencyRecord ir{key.id, req.idempotency_key, req.request_hash, rec.id, 0};
    if (Status s = store_.PutIdempotency(ir); !s.ok()) spdlog::warn("idempotency: {}", s.message());
  }
  Audit("sandbox.create", rec.id, key.id,
        {{"template", rec.template_name},
         {"timeout_ms", rec.timeout_ms},
         {"memory_bytes", rec.limits.memory_bytes},
         {"cpus", rec.limits.cpus},
         {"pids", rec.limits.pids}});
  return rec;
}

Result<SandboxRecord> Manager::Owned(const store::ApiKeyRecord& key, const std::string& id,
                                     Access access) {
  auto rec = store_.GetSandbox(id);
  if (!rec.ok()) return rec.status();
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
  return store_.ListSandboxes(filter);
}

Result<runtime::Box> Manager::BoxOf(const std::string& id) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = boxes_.find(id);
  if (it == boxes_.end()) return Status::Error("sandbox " + id + " has no box on this host", ESRCH);
  return it->second;
}

Status Manager::KillLocked(SandboxRecord rec, const std::string& reason, nlohmann::json detail,
                           const char* end_state) {
  runtime::Box box{rec.id};
  if (auto b = BoxOf(rec.id); b.ok()) box = *b;
  std::shared_ptr<AgentChannel> channel;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (auto it = channels_.find(rec.id); it != channels_.end()) channel = it->second;
    channels_.erase(rec.id);
  }
  if (channel) channel->Close();
  Status s = runtime_.Destroy(box);
  {
    std::lock_guard<std::mutex> g(mu_);
    boxes_.erase(rec.id);
  }
  rec.state = end_state;
  rec.ended_at = NowMs();
  rec.expires_at = 0;
  rec.updated_at = 0;
  if (!s.ok()) rec.error = rec.error.empty() ? s.message() : rec.error + "; " + s.message();
  SBX_RETURN_IF_ERROR(store_.PutSandbox(rec));
  detail["reason"] = reason;
  Audit("sandbox.kill", rec.id, rec.owner_key_id, std::move(detail));
  return s;
}

Status Manager::Kill(const store::ApiKeyRecord& key, const std::string& id) {
  auto rec = Owned(key, id, Access::kKill);
  if (!rec.ok()) return rec.status();
  if (!store::IsLiveState(rec->state))
    return Status::Error("sandbox " + id + " is " + rec->state, ENOENT);
  if (rec->owner_key_id != key.id) return KillLocked(*rec, "operator", {{"by_key_id", key.id}});
  return KillLocked(*rec, "requested");
}

Status Manager::Pause(const store::ApiKeyRecord& key, const std::string& id) {
  auto rec = Owned(key, id, Access::kUse);
  if (!rec.ok()) return rec.status();
  if (rec->state == store::kStatePaused)
    return Status::Error("sandbox " + id + " is already paused", EBUSY);
  if (rec->state != store::kStateRunning)
    return Status::Error("sandbox " + id + " is " + rec->state, EBUSY);
  auto box = BoxOf(id);
  if (!box.ok()) return box.status();
  SBX_RETURN_IF_ERROR(runtime_.Freeze(*box));
  rec->state = store::kStatePaused;
  rec->expires_at = 0;  // a paused sandbox waits for resume, however long
  rec->updated_at = 0;
  SBX_RETURN_IF_ERROR(store_.PutSandbox(*rec));
  Audit("sandbox.pause", id, key.id);
  return {};
}

Status Manager::Resume(const store::ApiKeyRecord& key, const std::string& id) {
  auto rec = Owned(key, id, Access::kUse);
  if (!rec.ok()) return rec.status();
  if (rec->state != store::kStatePaused)
    return Status::Error("sandbox " + id + " is not paused", EBUSY);
  auto box = BoxOf(id);
  if (!box.ok()) return box.status();
  SBX_RETURN_IF_ERROR(runtime_.Thaw(*box));
  rec->state = store::kStateRunning;
  rec->expires_at = NowMs() + rec->timeout_ms;
  rec->updated_at = 0;
  SBX_RETURN_IF_ERROR(store_.PutSandbox(*rec));
  Audit("sandbox.resume", id, key.id);
  return {};
}

Result<SandboxRecord> Manager::SetTimeout(const store::ApiKeyRecord& key, const std::string& id,
                                          int64_t timeout_ms) {
  SBX_RETURN_IF_ERROR(limits_.CheckTimeout(key.ranges, timeout_ms));
  auto rec = Owned(key, id, Access::kUse);
  if (!rec.ok()) return rec.status();
  if (!store::IsLiveState(rec->state))
    return Status::Error("sandbox " + id + " is " + rec->state, ENOENT);
  rec->timeout_ms = timeout_ms;
  if (rec->state == store::kStateRunning) rec->expires_at = NowMs() + timeout_ms;
  rec->updated_at = 0;
  SBX_RETURN_IF_ERROR(store_.PutSandbox(*rec));
  Audit("sandbox.timeout_set", id, key.id, {{"timeout_ms", timeout_ms}});
  return *rec;
}

Result<UniqueFd> Manager::TcpSocket(const store::ApiKeyRecord& key, const std::string& id) {
  auto rec = Owned(key, id, Access::kUse);
  if (!rec.ok()) return rec.status();
  if (rec->state != store::kStateRunning)
    return Status::Error("sandbox " + id + " is " + rec->state, EBUSY);
  auto box = BoxOf(id);
  if (!box.ok()) return box.status();
  return runtime_.OpenSocket(*box, AF_INET, SOCK_STREAM | SOCK_NONBLOCK);
}

Result<runtime::BoxStats> Manager::Stats(const store::ApiKeyRecord& key, const std::string& id) {
  auto rec = Owned(key, id, Access::kInspect);
  if (!rec.ok()) return rec.status();
  auto box = BoxOf(id);
  if (!box.ok()) return box.status();
  return runtime_.Stats(*box);
}

boost::asio::awaitable<Result<std::shared_ptr<AgentChannel>>> Manager::Channel(
    const store::ApiKeyRecord& key, const std::string& id) {
  auto rec = Owned(key, id, Access::kUse);
  if (!rec.ok()) co_return rec.status();
  if (rec->state == store::kStatePaused)
    co_return Status::Error("sandbox " + id + " is paused", EBUSY);
  if (rec->state != store::kStateRunning)
    co_return Status::Error("sandbox " + id + " is " + rec->state, ENOENT);
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = channels_.find(id);
    if (it != channels_.end() && !it->second->closed()) co_return it->second;
  }
  auto ex = co_await boost::asio::this_coro::executor;
  auto ch = co_await AgentChannel::Connect(ex, rec->agent_socket, std::chrono::milliseconds(5000));
  if (!ch.ok()) co_return ch.status().Wrap("sandbox " + id);
  // Callers that raced here each connected: the first to get here keeps its channel and the
  // others close theirs (the agent serves a bounded number of connections, so none may be left
  // open unused). A sandbox killed meanwhile gets none.
  std::shared_ptr<AgentChannel> kept;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = channels_.find(id);
    if (!boxes_.count(id)) {
      kept = nullptr;
    } else if (it != channels_.end() && !it->second->closed()) {
      kept = it->second;
    } else {
      kept = channels_[id] = *ch;
    }
  }
  if (kept != *ch) (*ch)->Close();
  if (!kept) co_return Status::Error("sandbox " + id + " is gone", ENOENT);
  co_return kept;
}

void Manager::MarkAgentExited(SandboxRecord rec, const std::string& how) {
  spdlog::warn("sandbox {}: {}", rec.id, how);
  rec.error = how;
  Status s = KillLocked(rec, "agent_exited", {{"error", how}}, store::kStateFailed);
  if (!s.ok()) spdlog::error("sandbox {}: after its agent exited: {}", rec.id, s.message());
}

void Manager::ExpireDue() {
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
  int64_t now = NowMs();
  for (auto& rec : *live) {
    // A sandbox still being created is left to its create; the next scan sees it running.
    if (rec.state != store::kStateCreating && revoked.count(rec.owner_key_id)) {
      Status s = KillLocked(rec, "key_revoked");
      if (!s.ok())
        spdlog::error("revoked key {}: sandbox {}: {}", rec.owner_key_id, rec.id, s.message());
      else
        spdlog::info("sandbox {} killed: its key {} was revoked", rec.id, rec.owner_key_id);
      continue;
    }
    // A box whose agent died (killed from the host, crashed) is of no use: it fails, and what it
    // held is freed now rather than at its timeout.
    if (rec.state != store::kStateCreating) {
      if (auto box = BoxOf(rec.id); box.ok()) {
        if (auto exit = runtime_.AgentExit(*box)) {
          MarkAgentExited(rec, *exit);
          continue;
        }
      }
    }
    if (rec.state != store::kStateRunning || rec.expires_at == 0 || rec.expires_at > now) continue;
    store::ApiKeyRecord owner;
    owner.id = rec.owner_key_id;
    Status s;
    if (rec.on_timeout == store::kOnTimeoutPause) {
      s = Pause(owner, rec.id);
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
}

void Manager::StartTtlLoop(std::chrono::milliseconds period) {
  ttl_thread_ = std::thread([this, period] {
    std::unique_lock<std::mutex> lock(ttl_mu_);
    while (!stopping_) {
      ttl_cv_.wait_for(lock, period, [this] { return stopping_; });
      if (stopping_) break;
      lock.unlock();
      ExpireDue();
      lock.lock();
    }
  });
}

void Manager::Stop() {
  {
    std::lock_guard<std::mutex> g(ttl_mu_);
    stopping_ = true;
  }
  ttl_cv_.notify_all();
  if (ttl_thread_.joinable()) ttl_thread_.join();
}

ManagerCounters Manager::counters() {
  std::lock_guard<std::mutex> g(mu_);
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
