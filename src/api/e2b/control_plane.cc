// The E2B control-plane REST API (spec section 1) over sandbox::Manager.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>

#include "api/e2b/internal.h"
#include "api/e2b/wire.h"
#include "api/errors.h"
#include "api/http/exchange.h"
#include "common/encoding.h"
#include "storage/template.h"

namespace sbx::api::e2b {
namespace {

using boost::asio::awaitable;
using nlohmann::json;

constexpr int64_t kV2DefaultTimeoutS = 300;
constexpr int64_t kV1DefaultTimeoutS = 15;

bool Live(const sandbox::SandboxRecord& r) { return sandbox::IsLiveState(r.state); }
std::string E2bState(const sandbox::SandboxRecord& r) {
  return r.state == sandbox::kStatePaused ? "paused" : "running";
}

// The sandbox's tokens go to its owner only: an operator key inspecting another key's sandbox
// gets null, since the tokens would let it use the sandbox.
json EnvdTokenJson(const ApiContext& ctx, const sandbox::ApiKeyRecord& key,
                   const sandbox::SandboxRecord& r) {
  if (r.owner_key_id != key.id) return nullptr;
  return EnvdToken(ctx.secret, r.owner_key_id, r.id);
}

json SandboxJson(const ApiContext& ctx, const sandbox::ApiKeyRecord& key,
                 const sandbox::SandboxRecord& r) {
  bool owner = r.owner_key_id == key.id;
  return {{"sandboxID", r.id},
          {"templateID", r.template_name},
          {"clientID", "sbx"},
          {"envdVersion", kEnvdVersion},
          {"envdAccessToken", EnvdTokenJson(ctx, key, r)},
          {"domain", nullptr},
          // As E2B: a token only for a sandbox whose ports are not public.
          {"trafficAccessToken", r.public_ports || !owner
                                     ? json(nullptr)
                                     : json(TrafficToken(ctx.secret, r.owner_key_id, r.id))}};
}

json ListedJson(const sandbox::SandboxRecord& r) {
  int64_t cpus = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(r.limits.cpus)));
  int64_t mem_mb = std::max<int64_t>(128, r.limits.memory_bytes >> 20);
  int64_t end = r.expires_at ? r.expires_at : r.created_at + r.timeout_ms;
  return {{"sandboxID", r.id},
          {"templateID", r.template_name},
          {"clientID", "sbx"},
          {"cpuCount", cpus},
          {"memoryMB", mem_mb},
          {"diskSizeMB", r.limits.disk_bytes >> 20},
          {"startedAt", Rfc3339(r.created_at)},
          {"endAt", Rfc3339(end)},
          {"envdVersion", kEnvdVersion},
          {"state", E2bState(r)},
          {"metadata", r.metadata}};
}

json DetailJson(const ApiContext& ctx, const sandbox::ApiKeyRecord& key,
                const sandbox::SandboxRecord& r) {
  json j = ListedJson(r);
  j["envdAccessToken"] = EnvdTokenJson(ctx, key, r);
  j["domain"] = nullptr;
  j["lifecycle"] = {{"autoResume", r.auto_resume}, {"onTimeout", r.on_timeout}};
  // Paused without memory, a sandbox's resume is a new boot (E2B's keepMemory: false).
  if (r.on_timeout == sandbox::kOnTimeoutPause) j["lifecycle"]["keepMemory"] = r.pause_memory;
  auto policy = network::Policy::FromJson(r.network.empty() ? sandbox::kNoNetwork : r.network);
  network::Policy p = policy.ok() ? *policy : network::Policy{};
  json rules = json::parse(r.egress_rules.empty() ? "{}" : r.egress_rules, nullptr, false);
  json net = EgressJson(p, rules.is_discarded() ? json::object() : rules);
  net["allowPublicTraffic"] = r.public_ports;
  if (!r.mask_request_host.empty()) net["maskRequestHost"] = r.mask_request_host;
  j["network"] = net;
  j["allowInternetAccess"] = AllowsInternet(p);
  return j;
}

}  // namespace

// `X-API-KEY` checked against sbx's own keys (through the manager); internal.h.
awaitable<void> Error(http::Exchange& ex, int status, const std::string& message,
                      const http::Headers& headers) {
  json body = {{"code", status}, {"message", message}};
  co_await ex.RespondJson(status, body, headers);
}

json SnapshotJson(const sandbox::SnapshotInfo& s) {
  return {{"snapshotID", s.id}, {"names", s.names}};
}

awaitable<void> Fail(http::Exchange& ex, const Status& s) {
  int status = AnswerFor(s.err()).status;  // the one errno table, api/errors.h
  if (status == 500) spdlog::error("e2b {} {}: {}", ex.method(), ex.path(), s.message());
  co_await Error(ex, status, s.message());
}

http::Handler Authed(ApiContext& ctx, AuthedHandler h) {
  return [&ctx, h = std::move(h)](http::Exchange& ex) -> awaitable<void> {
    ctx.metrics.requests++;
    std::string secret(ex.Header("X-API-Key"));
    if (secret.empty()) co_return co_await Error(ex, 401, "missing X-API-KEY header");
    auto key = VerifyKey(ctx.manager, *ctx.denials, ex, secret);
    if (!key.ok()) co_return co_await Fail(ex, key.status());
    if (!*key) co_return co_await Error(ex, 401, "Invalid API key");
    co_await h(ex, **key);
  };
}

// internal.h.
awaitable<std::optional<json>> BodyObject(http::Exchange& ex) {
  auto body = co_await ex.ReadBody();
  if (!body.ok()) {
    if (!ex.responded()) co_await Error(ex, 400, body.status().message());
    co_return std::nullopt;
  }
  json j = body->empty() ? json::object() : http::ParseJsonBody(*body);
  if (j.is_discarded() || !j.is_object()) {
    co_await Error(ex, 400, "body: expected a JSON object");
    co_return std::nullopt;
  }
  co_return j;
}

namespace {

Result<std::map<std::string, std::string>> StringMap(const json& j, const char* field) {
  std::map<std::string, std::string> out;
  if (!j.contains(field) || j[field].is_null()) return out;
  if (!j[field].is_object())
    return Status::Error(std::string(field) + ": must be an object", EINVAL);
  for (const auto& [k, v] : j[field].items()) {
    if (!v.is_string())
      return Status::Error(std::string(field) + "." + k + ": must be a string", EINVAL);
    out[k] = v.get<std::string>();
  }
  return out;
}

// `field` in whole seconds (E2B's are int32 seconds), `def` when absent or null. The range,
// 1 to the manager's maximum, is checked on the JSON number before any arithmetic: 1e300, -1,
// 0.0001 or 1.5 get a 400 naming the field and the range instead of overflowing or rounding.
Result<int64_t> TimeoutField(const ApiContext& ctx, const json& j, const char* field, int64_t def) {
  if (!j.contains(field) || j[field].is_null()) return def;
  const json& v = j[field];
  int64_t max_s = ctx.manager.max_timeout_ms() / 1000;
  double secs = v.is_number() ? v.get<double>() : std::nan("");
  if (!(secs >= 1 && secs <= static_cast<double>(max_s)) || secs != std::floor(secs))
    return Status::Error(std::string(field) + ": a whole number of seconds from 1 to " +
                             std::to_string(max_s) + " (got " + http::JsonSnippet(v) + ")",
                         EINVAL);
  return static_cast<int64_t>(secs);
}

// A sandbox that exists for E2B: live and owned by `key` (killed ones are 404, as in E2B).
Result<sandbox::SandboxRecord> LiveSandbox(ApiContext& ctx, const sandbox::ApiKeyRecord& key,
                                           const std::string& id) {
  auto rec = ctx.manager.Get(key, id);
  if (!rec.ok() || !Live(*rec))
    return Status::Error("sandbox \"" + id + "\" doesn't exist or you don't have access to it",
                         ENOENT);
  return rec;
}

// `allow_internet_access` of a body: nullopt when absent or null, EINVAL when not a boolean.
Result<std::optional<bool>> InternetField(const json& j) {
  auto it = j.find("allow_internet_access");
  if (it == j.end() || it->is_null()) return std::optional<bool>();
  if (!it->is_boolean())
    return Status::Error("allow_internet_access: must be true or false", EINVAL);
  return std::optional<bool>(it->get<bool>());
}

// The network of a create (spec 6) into `req`: the policy, the rules, maskRequestHost. A create
// that says nothing of egress gets what E2B gives (the internet) when this daemon has
// networking, and loopback only, as before networking existed, when it has none.
Status CreateEgress(const ApiContext& ctx, const json& j, sandbox::CreateRequest* req) {
  auto internet = InternetField(j);
  if (!internet.ok()) return internet.status();
  static const json kNone;
  const json& net = j.contains("network") ? j["network"] : kNone;
  auto egress = ParseEgress(net, *internet);
  if (!egress.ok()) return egress.status();
  if (egress->given) {
    req->network = egress->policy;
  } else if (ctx.manager.networking_enabled()) {
    req->network.mode = network::Mode::kOpen;
  }
  req->egress_rules = egress->rules.dump();
  if (net.is_object()) {
    if (auto p = net.find("allowPublicTraffic");
        p != net.end() && !p->is_null() && !p->is_boolean())
      return Status::Error("network.allowPublicTraffic: must be true or false", EINVAL);
    if (auto m = net.find("maskRequestHost"); m != net.end() && !m->is_null()) {
      if (!m->is_string())
        return Status::Error("network.maskRequestHost: must be a string", EINVAL);
      req->mask_request_host = m->get<std::string>();
    }
  }
  return {};
}

awaitable<void> Create(ApiContext& ctx, http::Exchange& ex, const sandbox::ApiKeyRecord& key,
                       bool v2) {
  auto j = co_await BodyObject(ex);
  if (!j) co_return;
  if (!j->contains("templateID") || !(*j)["templateID"].is_string())
    co_return co_await Error(ex, 400, "templateID: required string");
  sandbox::CreateRequest req;
  req.template_name = (*j)["templateID"].get<std::string>();
  if (req.template_name.empty()) co_return co_await Error(ex, 400, "template not found: ");
  // E2B's "n:default" is the template's default tag: sbx's "n" (api/e2b/template_wire.h).
  if (req.template_name.ends_with(":default"))
    req.template_name.resize(req.template_name.size() - 8);
  auto md = StringMap(*j, "metadata");
  if (!md.ok()) co_return co_await Fail(ex, md.status());
  auto env = StringMap(*j, "envVars");
  if (!env.ok()) co_return co_await Fail(ex, env.status());
  auto timeout = TimeoutField(ctx, *j, "timeout", v2 ? kV2DefaultTimeoutS : kV1DefaultTimeoutS);
  if (!timeout.ok()) co_return co_await Fail(ex, timeout.status());
  req.metadata = *md;
  req.env = *env;
  req.timeout_ms = *timeout * 1000;
  if (BoolField(*j, "autoPause")) {
    req.on_timeout = sandbox::kOnTimeoutPause;
    // autoPauseMemory false: the TTL's pause keeps only the filesystem.
    if (j->contains("autoPauseMemory") && (*j)["autoPauseMemory"].is_boolean())
      req.pause_memory = (*j)["autoPauseMemory"].get<bool>();
  }
  // autoResume {enabled}: a paused sandbox is resumed by a request for its envd or its ports.
  if (j->contains("autoResume") && (*j)["autoResume"].is_object())
    req.auto_resume = BoolField((*j)["autoResume"], "enabled");
  // E2B serves ports publicly unless told otherwise; sbx only when told so (threats.md row 37).
  if (j->contains("network") && (*j)["network"].is_object())
    req.public_ports = BoolField((*j)["network"], "allowPublicTraffic");
  auto egress = CreateEgress(ctx, *j, &req);
  if (!egress.ok()) co_return co_await Fail(ex, egress);
  sandbox::QuotaExceeded quota;
  auto rec = co_await OnPool(ctx.blocking, [&] { return ctx.manager.Create(key, req, &quota); });
  if (storage::IsTemplateNotFound(rec.status()))
    co_return co_await Error(ex, 400, rec.status().what());
  if (!rec.ok()) {
    if (rec.status().err() == EAGAIN) {
      http::Headers h = {
          {"Retry-After", std::to_string(static_cast<int>(std::ceil(quota.retry_after_s)))}};
      co_return co_await Error(ex, 429, rec.status().message(), h);
    }
    co_return co_await Fail(ex, rec.status());
  }
  co_await ex.RespondJson(201, SandboxJson(ctx, key, *rec));
}

// Connect (v1 and v2): resumes a paused sandbox (201) or only extends a running one's TTL (200).
awaitable<void> ConnectSandbox(ApiContext& ctx, http::Exchange& ex,
                               const sandbox::ApiKeyRecord& key) {
  auto j = co_await BodyObject(ex);
  if (!j) co_return;
  auto timeout = TimeoutField(ctx, *j, "timeout", kV2DefaultTimeoutS);
  if (!timeout.ok()) co_return co_await Fail(ex, timeout.status());
  std::string id = ex.Param("id");
  auto rec = LiveSandbox(ctx, key, id);
  if (!rec.ok()) co_return co_await Fail(ex, rec.status());
  // One manager transition: a kill, pause or TTL scan cannot slip between the resume and the
  // timeout, nor between reading the expiry and extending it.
  auto done =
      co_await OnPool(ctx.blocking, [&] { return ctx.manager.Connect(key, id, *timeout * 1000); });
  if (!done.ok()) co_return co_await Fail(ex, done.status());
  co_await ex.RespondJson(done->resumed ? 201 : 200, SandboxJson(ctx, key, done->record));
}

awaitable<void> List(ApiContext& ctx, http::Exchange& ex, const sandbox::ApiKeyRecord& key,
                     bool v2) {
  sandbox::SandboxFilter f;
  std::vector<std::string> states;
  for (const auto& v : ex.query().GetAll("state")) {
    size_t s = 0;
    for (;;) {
      size_t c = v.find(',', s);
      if (std::string part = v.substr(s, c - s); !part.empty()) states.push_back(part);
      if (c == std::string::npos) break;
      s = c + 1;
    }
  }
  if (!v2 || states.empty())
    states =
        v2 ? std::vector<std::string>{"running", "paused"} : std::vector<std::string>{"running"};
  for (const auto& s : states) {
    if (s == "running") {
      f.states.push_back(sandbox::kStateRunning);
      f.states.push_back(sandbox::kStateCreating);
    } else if (s == "paused") {
      f.states.push_back(sandbox::kStatePaused);
    } else {
      co_return co_await Error(ex, 400, "state: 'running' or 'paused', got '" + s + "'");
    }
  }
  if (auto md = ex.query().Get("metadata"); md && !md->empty()) {
    auto pairs = DecodeMetadataFilter(*md);
    if (!pairs.ok()) co_return co_await Fail(ex, pairs.status());
    f.metadata = *pairs;
  }
  int64_t limit = 100;
  if (auto l = ex.query().Get("limit")) {
    char* end = nullptr;
    limit = std::strtoll(l->c_str(), &end, 10);
    if (l->empty() || *end != '\0' || limit < 1 || limit > 100)
      co_return co_await Error(ex, 400, "limit: an integer from 1 to 100");
  }
  f.limit = v2 ? static_cast<size_t>(limit) : 1000;
  f.after = ex.query().Get("nextToken").value_or("");
  if (auto order = ex.query().Get("order"); v2 && order && !order->empty()) {
    if (*order != "asc" && *order != "desc")
      co_return co_await Error(ex, 400, "order: 'asc' or 'desc', got '" + *order + "'");
    f.oldest_first = *order == "asc";
  }
  if (auto since = ex.query().Get("startedAfter"); v2 && since && !since->empty()) {
    auto ms = ParseRfc3339Millis(*since);
    if (!ms.ok()) co_return co_await Error(ex, 400, "startedAfter: " + ms.status().message());
    f.created_since = *ms;  // inclusive, as E2B's
  }
  // The template filter names an E2B template ID: a registered template, or an alias of one
  // (E2B's default "base" is sbx's host template), as in create. One that names no template
  // lists nothing.
  if (auto tmpl = ex.query().Get("template"); v2 && tmpl && !tmpl->empty()) {
    auto known = ctx.manager.RegisteredTemplate(key, *tmpl);
    if (!known.ok()) co_return co_await Fail(ex, known.status());
    if (!*known) co_return co_await ex.RespondJson(200, json::array());
    f.template_name = **known;
  }
  auto page = ctx.manager.List(key, f);
  if (!page.ok()) co_return co_await Fail(ex, page.status());
  json items = json::array();
  for (const auto& rec : page->items) items.push_back(ListedJson(rec));
  http::Headers h;
  if (v2 && !page->next.empty()) h.emplace_back("X-Next-Token", page->next);
  if (v2) {
    auto running = ctx.manager.CountSandboxes(key, {sandbox::kStateRunning});
    if (running.ok()) h.emplace_back("X-Total-Running", std::to_string(*running));
  }
  co_await ex.RespondJson(200, items, h);
}

// One sample of the sandbox's history (sandbox/metrics_history.h) as E2B's SandboxMetric.
json Metric(const sandbox::SandboxRecord& r, const sandbox::MetricSample& m) {
  int64_t cpus = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(r.limits.cpus)));
  auto total = [](uint64_t measured, int64_t limit) {
    return measured > 0 ? static_cast<int64_t>(measured) : limit;
  };
  return {{"timestamp", Rfc3339(m.time_ms)},
          {"timestampUnix", m.time_ms / 1000},
          {"cpuCount", cpus},
          {"cpuUsedPct", m.cpu_used_pct},
          {"memUsed", m.stats.memory_current},
          {"memTotal", r.limits.memory_bytes},
          {"memCache", 0},
          {"diskUsed", m.stats.disk_used},
          {"diskTotal", total(m.stats.disk_total, r.limits.disk_bytes)}};
}

// `field` of the query as unix seconds (E2B's metrics window), `def` when absent.
Result<int64_t> UnixSeconds(const http::Exchange& ex, const char* field, int64_t def) {
  auto v = ex.query().Get(field);
  if (!v || v->empty()) return def;
  char* end = nullptr;
  errno = 0;
  long long n = std::strtoll(v->c_str(), &end, 10);
  // Up to year 9999, so that the milliseconds below cannot overflow.
  if (*end != '\0' || errno != 0 || n < 0 || n > 253402300799LL)
    return Status::Error(std::string(field) + ": unix seconds, got '" + *v + "'", EINVAL);
  return static_cast<int64_t>(n);
}

// The sandbox's audit trail (lifecycle, commands, file writes) as E2B log entries; ENOENT when
// `key` may not see the sandbox.
Result<json> LogEntries(ApiContext& ctx, const sandbox::ApiKeyRecord& key, const std::string& id,
                        size_t limit) {
  auto events = ctx.manager.AuditTrail(key, id, limit);
  if (!events.ok()) return events.status();
  json out = json::array();
  for (const auto& e : *events) {
    json fields = json::object();
    for (const auto& [k, v] : e.detail.items())
      fields[k] = v.is_string() ? v.get<std::string>() : v.dump();
    out.push_back({{"timestamp", Rfc3339(e.time)},
                   {"level", e.type == "auth.denied" ? "warn" : "info"},
                   {"message", e.type},
                   {"fields", fields}});
  }
  return out;
}

}  // namespace

namespace {

// ---- Secrets (spec section 6): values write-only, used through ${e2b.secrets.NAME} ----

json SecretInfoJson(const sandbox::SecretRecord& r) {
  return {{"secretID", r.id},
          {"name", r.name},
          {"currentVersion", r.version},
          {"metadata", r.metadata},
          {"createdAt", Rfc3339(r.created_at)},
          {"updatedAt", Rfc3339(r.updated_at)}};
}

// E2B's bounds on a secret's metadata: 32 entries, keys <= 128 bytes, values <= 1024, 8192 total.
Result<std::map<std::string, std::string>> SecretMetadata(const json& j) {
  auto md = StringMap(j, "metadata");
  if (!md.ok()) return md.status();
  size_t total = 0;
  for (const auto& [k, v] : *md) {
    if (k.empty() || k.size() > 128 || v.size() > 1024)
      return Status::Error("metadata: keys of 1 to 128 bytes, values of at most 1024", EINVAL);
    total += k.size() + v.size();
  }
  if (md->size() > 32 || total > 8192)
    return Status::Error("metadata: at most 32 entries and 8192 bytes", EINVAL);
  return md;
}

Result<std::string> SecretValue(const json& j) {
  auto it = j.find("value");
  if (it == j.end() || !it->is_string()) return Status::Error("value: a string, required", EINVAL);
  return it->get<std::string>();
}

awaitable<void> ListSecrets(ApiContext& ctx, http::Exchange& ex, const sandbox::ApiKeyRecord& key) {
  int64_t limit = 100;
  if (auto l = ex.query().Get("limit")) {
    char* end = nullptr;
    limit = std::strtoll(l->c_str(), &end, 10);
    if (l->empty() || *end != '\0' || limit < 1 || limit > 100)
      co_return co_await Error(ex, 400, "limit: an integer from 1 to 100");
  }
  std::string after;
  if (auto t = ex.query().Get("nextToken"); t && !t->empty()) {
    auto name = Base64Decode(*t);
    if (!name.ok()) co_return co_await Error(ex, 400, "nextToken: not a token this API gave");
    after = *name;
  }
  auto all = ctx.manager.ListSecrets(key);  // by name
  if (!all.ok()) co_return co_await Fail(ex, all.status());
  json items = json::array();
  http::Headers h;
  for (const auto& rec : *all) {
    if (!after.empty() && rec.name <= after) continue;
    if (static_cast<int64_t>(items.size()) == limit) {
      h.emplace_back("X-Next-Token", Base64Encode(items.back()["name"].get<std::string>()));
      break;
    }
    items.push_back(SecretInfoJson(rec));
  }
  co_await ex.RespondJson(200, items, h);
}

void RegisterSecrets(http::Router& r, ApiContext& ctx) {
  r.Get("/secrets", Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) {
          return ListSecrets(ctx, ex, key);
        }));
  r.Post(
      "/secrets",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto j = co_await BodyObject(ex);
        if (!j) co_return;
        sandbox::SecretInput in;
        if (!j->contains("name") || !(*j)["name"].is_string())
          co_return co_await Error(ex, 400, "name: a string, required");
        in.name = (*j)["name"].get<std::string>();
        auto value = SecretValue(*j);
        if (!value.ok()) co_return co_await Fail(ex, value.status());
        in.value = std::move(*value);
        auto md = SecretMetadata(*j);
        if (!md.ok()) co_return co_await Fail(ex, md.status());
        in.metadata = std::move(*md);
        // No hosts: E2B reaches a value only through ${e2b.secrets.NAME} in network.rules,
        // whose domains say where it goes.
        auto rec = co_await OnPool(ctx.blocking, [&] { return ctx.manager.AddSecret(key, in); });
        if (!rec.ok()) co_return co_await Fail(ex, rec.status());
        co_await ex.RespondJson(201, SecretInfoJson(*rec));
      }));
  r.Get(
      "/secrets/{id}",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto rec = ctx.manager.GetSecret(key, ex.Param("id"));
        if (!rec.ok()) co_return co_await Fail(ex, rec.status());
        co_await ex.RespondJson(200, SecretInfoJson(*rec));
      }));
  // A new version: the value replaced, the name, hosts and header kept; metadata replaced when
  // given.
  r.Post(
      "/secrets/{id}",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto j = co_await BodyObject(ex);
        if (!j) co_return;
        auto value = SecretValue(*j);
        if (!value.ok()) co_return co_await Fail(ex, value.status());
        auto md = SecretMetadata(*j);
        if (!md.ok()) co_return co_await Fail(ex, md.status());
        auto old = ctx.manager.GetSecret(key, ex.Param("id"));
        if (!old.ok()) co_return co_await Fail(ex, old.status());
        sandbox::SecretInput in;
        in.name = old->name;
        in.value = std::move(*value);
        in.hosts = old->hosts;
        in.header = old->header;
        in.format = old->format;
        in.metadata = j->contains("metadata") ? std::move(*md) : old->metadata;
        in.replace = true;
        auto rec = co_await OnPool(ctx.blocking, [&] { return ctx.manager.AddSecret(key, in); });
        if (!rec.ok()) co_return co_await Fail(ex, rec.status());
        co_await ex.RespondJson(200, SecretInfoJson(*rec));
      }));
  r.Delete(
      "/secrets/{id}",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        Status s = ctx.manager.DeleteSecret(key, ex.Param("id"));
        if (!s.ok()) co_return co_await Fail(ex, s);
        co_await ex.Respond(204, "");
      }));
}

}  // namespace

void RegisterControlPlane(http::Router& r, ApiContext& ctx) {
  RegisterSecrets(r, ctx);
  RegisterTemplates(r, ctx);  // templates.cc
  // The port is shared: sbx's own paths (/v1 and below, /healthz, /metrics) keep the native API's
  // error body; every other path, including one nothing serves, is an E2B client's (control
  // plane or envd), which gets E2B's {"code": <status>, "message": ...} (docs/api.md, "Errors").
  r.SetErrorShape([](std::string_view path) {
    bool native =
        path == "/v1" || path.starts_with("/v1/") || path == "/healthz" || path == "/metrics";
    return native ? http::ErrorShape::kNative : http::ErrorShape::kE2b;
  });
  r.Post("/v2/sandboxes", Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) {
           return Create(ctx, ex, key, true);
         }));
  r.Post("/sandboxes", Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) {
           return Create(ctx, ex, key, false);
         }));
  r.Get("/v2/sandboxes", Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) {
          return List(ctx, ex, key, true);
        }));
  r.Get("/sandboxes", Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) {
          return List(ctx, ex, key, false);
        }));
  for (const char* p : {"/v2/sandboxes/{id}/connect", "/sandboxes/{id}/connect"})
    r.Post(p, Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) {
             return ConnectSandbox(ctx, ex, key);
           }));

  r.Get(
      "/sandboxes/{id}",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto rec = LiveSandbox(ctx, key, ex.Param("id"));
        if (!rec.ok()) co_return co_await Fail(ex, rec.status());
        co_await ex.RespondJson(200, DetailJson(ctx, key, *rec));
      }));

  r.Delete(
      "/sandboxes/{id}",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        std::string id = ex.Param("id");
        auto rec = LiveSandbox(ctx, key, id);
        if (!rec.ok()) co_return co_await Fail(ex, rec.status());
        Status s = co_await OnPool(ctx.blocking, [&] { return ctx.manager.Kill(key, id); });
        if (!s.ok()) co_return co_await Fail(ex, s);
        co_await ex.Respond(204, "");
      }));

  // updateNetwork: replaces the whole egress configuration (omitted fields are cleared), 204.
  r.Put(
      "/sandboxes/{id}/network",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto j = co_await BodyObject(ex);
        if (!j) co_return;
        std::string id = ex.Param("id");
        auto rec = LiveSandbox(ctx, key, id);
        if (!rec.ok()) co_return co_await Fail(ex, rec.status());
        auto internet = InternetField(*j);
        if (!internet.ok()) co_return co_await Fail(ex, internet.status());
        auto egress = ParseEgress(*j, *internet);
        if (!egress.ok()) co_return co_await Fail(ex, egress.status());
        std::string rules = egress->rules.dump();
        auto set = co_await OnPool(
            ctx.blocking, [&] { return ctx.manager.SetNetwork(key, id, egress->policy, &rules); });
        if (!set.ok()) co_return co_await Fail(ex, set.status());
        co_await ex.Respond(204, "");
      }));

  r.Post(
      "/sandboxes/{id}/timeout",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto j = co_await BodyObject(ex);
        if (!j) co_return;
        if (!j->contains("timeout")) co_return co_await Error(ex, 400, "timeout: required");
        auto t = TimeoutField(ctx, *j, "timeout", 0);
        if (!t.ok()) co_return co_await Fail(ex, t.status());
        std::string id = ex.Param("id");
        auto rec = LiveSandbox(ctx, key, id);
        if (!rec.ok()) co_return co_await Fail(ex, rec.status());
        auto set = ctx.manager.SetTimeout(key, id, *t * 1000);
        if (!set.ok()) co_return co_await Fail(ex, set.status());
        co_await ex.Respond(204, "");
      }));

  r.Post(
      "/sandboxes/{id}/refreshes",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto j = co_await BodyObject(ex);
        if (!j) co_return;
        auto d = TimeoutField(ctx, *j, "duration", kV2DefaultTimeoutS);
        if (!d.ok()) co_return co_await Fail(ex, d.status());
        std::string id = ex.Param("id");
        // A refresh only ever extends the sandbox's life: the expiry is compared and moved in
        // one manager transition.
        auto set = ctx.manager.SetTimeout(key, id, *d * 1000, /*extend_only=*/true);
        if (!set.ok()) co_return co_await Fail(ex, set.status());
        co_await ex.Respond(204, "");
      }));

  r.Post(
      "/sandboxes/{id}/pause",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        std::string id = ex.Param("id");
        auto rec = LiveSandbox(ctx, key, id);
        if (!rec.ok()) co_return co_await Fail(ex, rec.status());
        if (rec->state == sandbox::kStatePaused)
          co_return co_await Error(ex, 409, "sandbox \"" + id + "\" is already paused");
        // {"memory": false} (the SDK's keepMemory: false): only the filesystem is kept.
        auto j = co_await BodyObject(ex);
        if (!j) co_return;
        bool memory =
            !(j->contains("memory") && (*j)["memory"].is_boolean() && !(*j)["memory"].get<bool>());
        Status s =
            co_await OnPool(ctx.blocking, [&] { return ctx.manager.Pause(key, id, memory); });
        if (!s.ok()) co_return co_await Fail(ex, s);
        co_await ex.Respond(204, "");
      }));

  r.Post(
      "/sandboxes/{id}/resume",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto j = co_await BodyObject(ex);
        if (!j) co_return;
        auto t = TimeoutField(ctx, *j, "timeout", kV1DefaultTimeoutS);
        if (!t.ok()) co_return co_await Fail(ex, t.status());
        std::string id = ex.Param("id");
        auto rec = LiveSandbox(ctx, key, id);
        if (!rec.ok()) co_return co_await Fail(ex, rec.status());
        if (rec->state != sandbox::kStatePaused)
          co_return co_await Error(ex, 409, "sandbox \"" + id + "\" is already running");
        // The timeout and the thaw in one manager transition (Connect resumes a paused one).
        auto done =
            co_await OnPool(ctx.blocking, [&] { return ctx.manager.Connect(key, id, *t * 1000); });
        if (!done.ok()) co_return co_await Fail(ex, done.status());
        co_await ex.RespondJson(201, SandboxJson(ctx, key, done->record));
      }));

  // The window is E2B's: unix seconds, both ends inclusive (an end second covers all of it);
  // without start the sandbox's whole kept history, without end up to now.
  r.Get(
      "/sandboxes/{id}/metrics",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto start = UnixSeconds(ex, "start", 0);
        if (!start.ok()) co_return co_await Fail(ex, start.status());
        auto end = UnixSeconds(ex, "end", 253402300799LL);
        if (!end.ok()) co_return co_await Fail(ex, end.status());
        if (*start > *end) co_return co_await Error(ex, 400, "start: after end");
        auto rec = LiveSandbox(ctx, key, ex.Param("id"));
        if (!rec.ok()) co_return co_await Fail(ex, rec.status());
        auto samples = ctx.manager.Metrics(key, rec->id, *start * 1000, *end * 1000 + 999);
        if (!samples.ok()) co_return co_await Fail(ex, samples.status());
        json out = json::array();
        for (const auto& m : *samples) out.push_back(Metric(*rec, m));
        co_await ex.RespondJson(200, out);
      }));

  r.Get(
      "/sandboxes/metrics",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        json out = json::object();
        std::string ids = ex.query().Get("sandbox_ids").value_or("");
        size_t s = 0;
        while (s <= ids.size() && !ids.empty()) {
          size_t c = ids.find(',', s);
          std::string id = ids.substr(s, c - s);
          auto rec = LiveSandbox(ctx, key, id);
          if (rec.ok() && rec->state == sandbox::kStateRunning) {
            auto samples = ctx.manager.Metrics(key, id, 0, INT64_MAX);  // the latest
            if (samples.ok() && !samples->empty()) out[id] = Metric(*rec, samples->back());
          }
          if (c == std::string::npos) break;
          s = c + 1;
        }
        json body = {{"sandboxes", out}};
        co_await ex.RespondJson(200, body);
      }));

  // Logs: sbx keeps no console log of a sandbox; its audit trail (lifecycle, commands, file
  // writes) is what it has to say about it.
  r.Get(
      "/sandboxes/{id}/logs",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto entries = LogEntries(ctx, key, ex.Param("id"), 1000);
        if (!entries.ok()) co_return co_await Fail(ex, entries.status());
        json lines = json::array();
        for (const auto& e : *entries)
          lines.push_back({{"timestamp", e["timestamp"]}, {"line", e["message"]}});
        json body = {{"logs", lines}, {"logEntries", *entries}};
        co_await ex.RespondJson(200, body);
      }));
  r.Get(
      "/v2/sandboxes/{id}/logs",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto entries = LogEntries(ctx, key, ex.Param("id"), 1000);
        if (!entries.ok()) co_return co_await Fail(ex, entries.status());
        json body = {{"logs", *entries}};
        co_await ex.RespondJson(200, body);
      }));

  // createSnapshot: a template private to this key (sandbox/templates.h); its id is what
  // Sandbox.create(snapshotID) names, DELETE /templates/{id} removes it.
  r.Post(
      "/sandboxes/{id}/snapshots",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto j = co_await BodyObject(ex);
        if (!j) co_return;
        std::string name;
        if (j->contains("name") && !(*j)["name"].is_null()) {
          if (!(*j)["name"].is_string())
            co_return co_await Error(ex, 400, "name: must be a string");
          name = (*j)["name"].get<std::string>();
        }
        std::string id = ex.Param("id");
        auto rec = LiveSandbox(ctx, key, id);
        if (!rec.ok()) co_return co_await Fail(ex, rec.status());
        auto snap =
            co_await OnPool(ctx.blocking, [&] { return ctx.manager.Snapshot(key, id, name); });
        if (!snap.ok()) co_return co_await Fail(ex, snap.status());
        co_await ex.RespondJson(201, SnapshotJson(*snap));
      }));

  // listSnapshots: newest first, `limit` (1..100, default 100) a page, the next page's token in
  // X-Next-Token (absent on the last page).
  r.Get(
      "/snapshots",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        int64_t limit = 100;
        if (auto l = ex.query().Get("limit")) {
          char* end = nullptr;
          limit = std::strtoll(l->c_str(), &end, 10);
          if (l->empty() || *end != '\0' || limit < 1 || limit > 100)
            co_return co_await Error(ex, 400, "limit: an integer from 1 to 100");
        }
        auto list = co_await OnPool(ctx.blocking, [&] {
          return ctx.manager.ListSnapshots(key, ex.query().Get("sandboxID").value_or(""),
                                           ex.query().Get("name").value_or(""));
        });
        if (!list.ok()) co_return co_await Fail(ex, list.status());
        size_t from = 0;
        if (auto token = ex.query().Get("nextToken"); token && !token->empty()) {
          from = list->size();
          for (size_t i = 0; i < list->size(); ++i)
            if ((*list)[i].id == *token) from = i + 1;
        }
        json items = json::array();
        size_t end = std::min(list->size(), from + static_cast<size_t>(limit));
        for (size_t i = from; i < end; ++i) items.push_back(SnapshotJson((*list)[i]));
        http::Headers h;
        if (end < list->size() && end > 0) h.emplace_back("X-Next-Token", (*list)[end - 1].id);
        co_await ex.RespondJson(200, items, h);
      }));

  // Sandbox.fork: one snapshot of the source (which keeps running), then `count` creates; one
  // entry per fork, {sandbox} or {error}. On sbx's native runtime a fork has the source's files,
  // not its memory (docs/api.md "Forks").
  r.Post(
      "/sandboxes/{id}/fork",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto j = co_await BodyObject(ex);
        if (!j) co_return;
        int64_t count = 1;
        if (j->contains("count") && !(*j)["count"].is_null()) {
          if (!(*j)["count"].is_number_integer() || (*j)["count"].get<int64_t>() < 1 ||
              (*j)["count"].get<int64_t>() > sandbox::kMaxForks)
            co_return co_await Error(ex, 400, "count: 1.." + std::to_string(sandbox::kMaxForks));
          count = (*j)["count"].get<int64_t>();
        }
        auto timeout = TimeoutField(ctx, *j, "timeout", kV1DefaultTimeoutS);
        if (!timeout.ok()) co_return co_await Fail(ex, timeout.status());
        std::string id = ex.Param("id");
        auto rec = LiveSandbox(ctx, key, id);
        if (!rec.ok()) co_return co_await Fail(ex, rec.status());
        auto forks = co_await OnPool(ctx.blocking, [&] {
          return ctx.manager.Fork(key, id, static_cast<int>(count), *timeout * 1000);
        });
        if (!forks.ok()) co_return co_await Fail(ex, forks.status());
        json out = json::array();
        for (const auto& f : *forks) {
          if (f.ok()) {
            out.push_back({{"sandbox", SandboxJson(ctx, key, *f)}});
          } else {
            int status = AnswerFor(f.status().err()).status;
            out.push_back({{"error", {{"code", status}, {"message", f.status().what()}}}});
          }
        }
        co_await ex.RespondJson(201, out);
      }));

  // Template.exists(name): a registered template or an alias of one (E2B's "base" is sbx's host
  // template) answers 200, anything else 404 (the SDK's "does not exist").
  r.Get(
      "/templates/aliases/{alias}",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        const std::string& alias = ex.Param("alias");
        // Checked before the registry is asked: never a path, nothing unbounded.
        if (!storage::IsValidTemplateName(alias))
          co_return co_await Error(ex, 400, "alias: [a-z0-9][a-z0-9._-]{0,63}, optionally :TAG");
        auto known = co_await http::OnPool(
            ctx.blocking, [&] { return ctx.manager.RegisteredTemplate(key, alias); });
        if (!known.ok()) co_return co_await Fail(ex, known.status());
        if (!*known) co_return co_await Error(ex, 404, "template '" + alias + "' not found");
        json body = {{"templateID", **known}, {"public", true}};
        co_await ex.RespondJson(200, body);
      }));
  // E2B routes whose feature sbx does not have yet answer 501 in E2B's shape, not the 404 of an
  // unknown path, which the SDK reports as "sandbox not found" for a sandbox that exists.
  struct NotYet {
    const char* method;
    const char* path;
    const char* what;
  };
  static constexpr NotYet kNotYet[] = {
      {"GET", "/volumes", "volumes"},
      {"POST", "/volumes", "volumes"},
  };
  for (const NotYet& n : kNotYet) {
    r.Handle(n.method, n.path, [what = n.what](http::Exchange& ex) -> awaitable<void> {
      co_await Error(ex, 501, std::string("sbx does not implement ") + what + " yet");
    });
  }

  r.Get("/health", [](http::Exchange& ex) -> awaitable<void> { co_await ex.Respond(204, ""); });
}

}  // namespace sbx::api::e2b
