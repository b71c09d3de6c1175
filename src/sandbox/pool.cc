// Warm pools: the manager's part (pool.h says what they are).
#include "sandbox/pool.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>

#include "common/fs.h"
#include "sandbox/manager.h"
#include "sandbox/manager_internal.h"
#include "sandbox/start_ready.h"

namespace sbx::sandbox {

using store::SandboxRecord;

namespace {

// How long the refill waits after a claim for the next one (see StartPools).
constexpr auto kRefillQuiet = std::chrono::milliseconds(20);

// ClaimPooled's "no pooled box: make it cold".
const std::optional<SandboxRecord> kNotClaimed;

// The layer ids template `name` (or the target of the alias `name`) lists now: two reads of the
// store, where resolving the template (storage::ResolveTemplate) costs milliseconds.
Result<std::vector<std::string>> TemplateLayers(store::Store& st, const std::string& name) {
  auto rec = st.GetTemplate(name);
  if (!rec.ok()) return rec.status();
  if (*rec && (*rec)->kind == store::kTemplateAlias) rec = st.GetTemplate((*rec)->alias_of);
  if (!rec.ok()) return rec.status();
  if (!*rec) return storage::TemplateNotFound(name);
  return (*rec)->layers;
}

}  // namespace

Result<PoolSpec> ParsePoolSpec(std::string_view text) {
  PoolSpec spec;
  size_t colon = text.rfind(':');
  spec.template_name = std::string(text.substr(0, colon));
  if (colon != std::string_view::npos) {
    std::string_view n = text.substr(colon + 1);
    auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), spec.size);
    if (n.empty() || ec != std::errc() || end != n.data() + n.size())
      return Status::Error("pool '" + std::string(text) + "': SIZE is not a number", EINVAL);
  }
  if (spec.template_name.empty())
    return Status::Error("pool '" + std::string(text) + "': TEMPLATE[:SIZE], a template name first",
                         EINVAL);
  if (spec.size < 0 || spec.size > kMaxPoolSize)
    return Status::Error(
        "pool '" + std::string(text) + "': SIZE from 0 to " + std::to_string(kMaxPoolSize), EINVAL);
  return spec;
}

Status Manager::SetPool(const PoolSpec& spec) {
  if (spec.size < 0 || spec.size > kMaxPoolSize)
    return Status::Error("size: from 0 to " + std::to_string(kMaxPoolSize), EINVAL);
  // A registered template that is no key's own (a snapshot, a tenant's build: those exist only
  // for their key, and a pool's boxes are no key's until claimed).
  auto hidden = builds_->Hidden(store::ApiKeyRecord{}, spec.template_name);
  if (!hidden.ok()) return hidden.status();
  if (*hidden) return storage::TemplateNotFound(spec.template_name);
  if (auto name = RegisteredTemplate(store::ApiKeyRecord{}, spec.template_name); !name.ok())
    return name.status();
  else if (!*name)
    return storage::TemplateNotFound(spec.template_name);
  {
    MutexLock g(mu_);
    pools_[spec.template_name].size = spec.size;
  }
  spdlog::info("pool {}: size {}", spec.template_name, spec.size);
  WakePools();
  return {};
}

std::vector<PoolStatus> Manager::Pools() {
  std::vector<PoolStatus> out;
  std::vector<std::vector<std::string>> ready;
  {
    MutexLock g(mu_);
    for (const auto& [name, p] : pools_) {
      PoolStatus st;
      st.template_name = name;
      st.size = p.size;
      st.ready = static_cast<int>(p.ready.size());
      st.filling = p.filling;
      st.claims = p.claims;
      st.misses = p.misses;
      st.fill_failures = p.fill_failures;
      st.last_error = p.last_error;
      out.push_back(std::move(st));
      ready.emplace_back(p.ready.begin(), p.ready.end());
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    for (const auto& id : ready[i]) {
      auto box = BoxOf(id);
      if (!box.ok()) continue;
      if (auto st = runtime_.Stats(*box); st.ok()) out[i].memory_bytes += st->memory_current;
    }
  }
  return out;
}

bool Manager::PoolsLow() {
  MutexLock g(mu_);
  for (const auto& [name, p] : pools_)
    if (static_cast<int>(p.ready.size()) + p.filling < (p.size + 1) / 2) return true;
  return false;
}

void Manager::WakePools(bool claimed) {
  {
    std::lock_guard<std::mutex> g(pool_wake_mu_);
    pool_wake_ = true;
    if (claimed) last_claim_ = std::chrono::steady_clock::now();
  }
  pool_cv_.notify_all();
}

Status Manager::StartPools() {
  for (const auto& spec : config_.pools)
    SBX_RETURN_IF_ERROR(SetPool(spec).Wrap("--pool " + spec.template_name));
  pool_thread_ = std::thread([this] {
    auto backoff = std::chrono::seconds(1);
    std::unique_lock<std::mutex> lk(pool_wake_mu_);
    while (!pool_stop_) {
      pool_wake_ = false;
      // A burst of creates is served before the refill takes the CPU: it waits until the claims
      // pause, unless its pools run low.
      while (!pool_stop_ && !PoolsLow()) {
        auto quiet = last_claim_ + kRefillQuiet;
        if (std::chrono::steady_clock::now() >= quiet) break;
        pool_cv_.wait_until(lk, quiet);
      }
      lk.unlock();
      bool failed = false;
      bool worked = RefillPass(&failed);
      lk.lock();
      if (failed) {
        // A template that cannot be made now (removed, a full disk) is tried again later, less
        // and less often, or at once when the operator changes a pool.
        pool_cv_.wait_for(lk, backoff, [&] { return pool_stop_ || pool_wake_; });
        backoff = std::min(backoff * 2, std::chrono::seconds(60));
      } else {
        backoff = std::chrono::seconds(1);
        if (!worked) pool_cv_.wait(lk, [&] { return pool_stop_ || pool_wake_; });
      }
    }
  });
  return {};
}

bool Manager::RefillPass(bool* failed) {
  std::vector<std::string> fill, surplus;
  {
    MutexLock g(mu_);
    for (auto it = pools_.begin(); it != pools_.end();) {
      PoolState& p = it->second;
      while (static_cast<int>(p.ready.size()) > p.size) {
        surplus.push_back(p.ready.back());
        p.ready.pop_back();
      }
      if (static_cast<int>(p.ready.size()) + p.filling < p.size) {
        ++p.filling;
        fill.push_back(it->first);
      }
      // An emptied pool is forgotten once nothing of it is left.
      if (p.size == 0 && p.ready.empty() && p.filling == 0)
        it = pools_.erase(it);
      else
        ++it;
    }
  }
  for (const auto& id : surplus) DiscardPooled(id);
  for (const auto& name : fill) {
    auto made = FillOne(name);
    if (!made.ok()) {
      *failed = true;
      spdlog::warn("pool {}: {}", name, made.status().message());
    }
    MutexLock g(mu_);
    PoolState& p = pools_[name];
    --p.filling;
    if (made.ok()) {
      p.ready.push_back(*made);
      p.last_error.clear();
    } else {
      ++p.fill_failures;
      p.last_error = made.status().message();
    }
  }
  return !fill.empty() || !surplus.empty();
}

Result<std::string> Manager::FillOne(const std::string& tmpl_name) {
  SandboxRecord rec;
  rec.id = RandomId(20);
  rec.state = store::kStatePooled;
  rec.limits = config_.default_limits;
  // A pooled box must not take the disk the daemon keeps for itself, as a create would not.
  {
    std::lock_guard<std::mutex> disk_lock(disk_mu_);
    SBX_RETURN_IF_ERROR(CheckHostLimits(rec.limits));
  }
  auto tmpl = storage::ResolveTemplate(templates_, store_, tmpl_name, rec.id);
  if (!tmpl.ok()) return tmpl.status();
  rec.template_name = tmpl->name;
  rec.layers = LayerIds(*tmpl);
  rec.runtime = tmpl->runtime.empty() ? store::kRuntimeNative : tmpl->runtime;
  rec.defaults.env = tmpl->env;
  rec.defaults.user = tmpl->user == "root" ? "" : tmpl->user;
  rec.defaults.workdir = tmpl->workdir;
  rec.created_at = clock_.NowMs();
  // Recorded before the box is made: a crash in between leaves a record the reconciler removes.
  if (Status put = store_.InsertSandbox(rec); !put.ok()) {
    (void)store_.UnpinLayers(rec.id);
    return put;
  }
  auto undo = [&](const Status& why) {
    (void)store_.DeleteSandbox(rec.id);
    (void)store_.UnpinLayers(rec.id);
    return why;
  };
  auto box = MakeBox(rec, *tmpl, network::Policy{}, {});
  if (!box.ok()) return undo(box.status());
  // The template's start command runs now, with the template's env (as it runs at build time on
  // E2B): a claim answers at once.
  Status s;
  if (!tmpl->start_cmd.empty() || !tmpl->ready_cmd.empty()) {
    StartReadySpec sr;
    sr.start_cmd = tmpl->start_cmd;
    sr.ready_cmd = tmpl->ready_cmd;
    sr.defaults = rec.defaults;
    if (config_.ready_timeout_ms > 0)
      sr.timeout = std::chrono::milliseconds(config_.ready_timeout_ms);
    s = RunStartAndReady(box->agent_socket, sr, clock_);
    if (!s.ok()) s = Status::Error("template " + rec.template_name + ": " + s.message(), s.err());
  }
  if (s.ok()) {
    rec.init_pid = box->init_pid;
    rec.agent_socket = box->agent_socket;
    rec.box_dir = box->dir;
    rec.id_base = box->id_base;
    rec.idmapped = box->idmapped;
    s = store_.PutSandbox(rec);
  }
  if (!s.ok()) {
    (void)runtime_.Destroy(*box);
    return undo(s);
  }
  MutexLock g(mu_);
  boxes_[rec.id] = *box;
  return rec.id;
}

void Manager::DiscardPooled(const std::string& id) {
  runtime::Box box{id};
  {
    MutexLock g(mu_);
    if (auto it = boxes_.find(id); it != boxes_.end()) {
      box = it->second;
      boxes_.erase(it);
    }
  }
  // The box first: a crash after it leaves a record without a box, which the reconciler removes.
  if (Status s = runtime_.Destroy(box); !s.ok()) {
    spdlog::error("pool: box {}: {}", id, s.message());
    return;  // its record stays, so the next start tries again
  }
  if (Status s = store_.DeleteSandbox(id); !s.ok() && s.err() != ENOENT)
    spdlog::warn("pool: {}", s.message());
  if (Status s = store_.UnpinLayers(id); !s.ok()) spdlog::warn("pool: {}", s.message());
}

Result<std::optional<SandboxRecord>> Manager::ClaimPooled(const store::ApiKeyRecord& key,
                                                          const CreateRequest& req,
                                                          const std::string& tmpl_name) {
  store::SandboxLimits limits = WithDefaults(req.limits, config_.default_limits);
  // What a pooled box has: no network, no secrets, the default disk.
  bool plain = req.network.mode == network::Mode::kNone && req.secrets.empty() &&
               (req.egress_rules.empty() || req.egress_rules == "{}");
  if (!plain || !req.runtime.empty() || limits.disk_bytes != config_.default_limits.disk_bytes)
    return kNotClaimed;
  std::string id;
  {
    MutexLock g(mu_);
    auto it = pools_.find(tmpl_name);
    if (it == pools_.end() || it->second.size == 0) return kNotClaimed;
    if (it->second.ready.empty()) {
      ++it->second.misses;
      return kNotClaimed;
    }
    id = it->second.ready.front();
    it->second.ready.pop_front();
  }
  WakePools(true);
  Transition transition(*this, id, "claim");
  auto box = BoxOf(id);
  auto rec = store_.GetSandbox(id);
  // A box that died, or a template changed since the box was made: removed, and the create is
  // made cold.
  std::string stale;
  if (!box.ok() || !rec.ok() || !*rec || (*rec)->state != store::kStatePooled) {
    stale = "its record or box is gone";
  } else if (auto exit = runtime_.AgentExit(*box)) {
    stale = "its agent exited: " + *exit;
  } else if (auto now = TemplateLayers(store_, tmpl_name); !now.ok() || *now != (*rec)->layers) {
    stale = "its template changed";
  }
  if (stale.empty() &&
      (limits.memory_bytes != (*rec)->limits.memory_bytes || limits.cpus != (*rec)->limits.cpus ||
       limits.cpu_weight != (*rec)->limits.cpu_weight || limits.pids != (*rec)->limits.pids)) {
    if (Status s = runtime_.SetLimits(*box, ToRuntime(limits)); !s.ok())
      stale = "its limits could not be set: " + s.message();
  }
  if (!stale.empty()) {
    spdlog::warn("pool {}: box {} not used ({}); made cold", tmpl_name, id, stale);
    DiscardPooled(id);
    return kNotClaimed;
  }
  SandboxRecord made = **rec;
  made.state = store::kStateRunning;
  made.owner_key_id = key.id;
  made.metadata = req.metadata;
  made.env = req.env;
  made.limits = limits;
  made.timeout_ms = req.timeout_ms > 0 ? req.timeout_ms : config_.default_timeout_ms;
  made.on_timeout = req.on_timeout;
  made.pause_memory = req.pause_memory;
  made.auto_resume = req.auto_resume;
  made.public_ports = req.public_ports;
  made.network = network::Policy{}.ToJson();
  made.egress_rules = req.egress_rules.empty() ? "{}" : req.egress_rules;
  made.mask_request_host = req.mask_request_host;
  made.created_at = clock_.NowMs();
  made.expires_at = made.created_at + made.timeout_ms;
  made.updated_at = 0;
  if (Status put = store_.ClaimSandbox(made, key.max_sandboxes); !put.ok()) {
    // Over quota (another create won the race), or the store failed: the box is no one's yet,
    // so it goes back to its pool with the pool's limits, or is removed when that fails.
    bool back = runtime_.SetLimits(*box, ToRuntime((*rec)->limits)).ok();
    if (back) {
      MutexLock g(mu_);
      pools_[tmpl_name].ready.push_front(id);
    } else {
      DiscardPooled(id);
    }
    if (put.err() == EDQUOT)
      return Status::Error(
          "this key may have at most " + std::to_string(key.max_sandboxes) + " live sandboxes",
          EAGAIN);
    return put;
  }
  {
    MutexLock g(mu_);
    ++pools_[tmpl_name].claims;
  }
  return std::optional<SandboxRecord>(std::move(made));
}

Status Manager::ReconcilePooled(std::set<std::string>& kept) {
  store::SandboxFilter f;
  f.states = {store::kStatePooled};
  f.limit = 1000;
  f.oldest_first = true;
  auto page = store_.ListSandboxes(f);
  if (!page.ok()) return page.status().Wrap("reconcile the pools");
  std::map<std::string, int> wanted;
  for (const auto& spec : config_.pools) wanted[spec.template_name] = spec.size;
  size_t adopted = 0;
  for (const auto& rec : page->items) {
    auto box = runtime_.Adopt(rec.id);
    if (!box.ok() && box.status().err() == EBUSY)
      return Status::Error(
          "pooled box " + rec.id +
              " is held by another live process: is another sbx serve using this data directory?",
          EBUSY);
    bool keep = box.ok() && rec.limits.disk_bytes == config_.default_limits.disk_bytes &&
                wanted[rec.template_name] > 0;
    if (keep) {
      --wanted[rec.template_name];
      MutexLock g(mu_);
      boxes_[rec.id] = *box;
      pools_[rec.template_name].ready.push_back(rec.id);
      kept.insert(rec.id);
      ++adopted;
      continue;
    }
    if (box.ok()) {
      MutexLock g(mu_);
      boxes_[rec.id] = *box;
    }
    DiscardPooled(rec.id);
  }
  if (!page->items.empty())
    spdlog::info("reconcile: {} pooled box(es) kept of {}", adopted, page->items.size());
  return {};
}

}  // namespace sbx::sandbox
