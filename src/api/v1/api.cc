#include "api/v1/api.h"

#include <openssl/evp.h>
#include <spdlog/spdlog.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <ctime>
#include <limits>
#include <mutex>
#include <optional>
#include <tuple>

#include "api/errors.h"
#include "api/ingress.h"
#include "api/http/exchange.h"
#include "api/v1/box_files.h"  // kClientGone
#include "api/v1/internal.h"
#include "common/encoding.h"
#include "storage/template.h"
#include "store/audit_queue.h"

namespace sbx::api::v1 {

namespace asio = boost::asio;
using asio::awaitable;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// ---- encoding helpers ----

std::string IsoTime(int64_t ms) { return Rfc3339Millis(ms); }

// `key` is the caller: an operator looking at another key's sandbox sees no token for it.
json SandboxJson(const ApiContext& ctx, const store::ApiKeyRecord& key,
                 const store::SandboxRecord& r) {
  bool owner = r.owner_key_id == key.id;
  json env_keys = json::array();
  for (const auto& [k, v] : r.env) env_keys.push_back(k);  // values may be secrets: never echoed
  json j = {{"id", r.id},
            {"template", r.template_name},
            {"state", r.state},
            {"metadata", r.metadata},
            {"env_keys", env_keys},
            {"limits",
             {{"memory_bytes", r.limits.memory_bytes},
              {"cpus", r.limits.cpus},
              {"cpu_weight", r.limits.cpu_weight},
              {"pids", r.limits.pids},
              {"disk_bytes", r.limits.disk_bytes}}},
            {"timeout", static_cast<double>(r.timeout_ms) / 1000.0},
            {"on_timeout", r.on_timeout},
            {"created_at", IsoTime(r.created_at)},
            {"expires_at", r.expires_at ? json(IsoTime(r.expires_at)) : json(nullptr)},
            {"ended_at", r.ended_at ? json(IsoTime(r.ended_at)) : json(nullptr)},
            {"public_ports", r.public_ports},
            {"owner_key_id", r.owner_key_id},
            {"id_base", r.id_base},
            {"idmapped", r.idmapped},
            {"traffic_token",
             owner ? json(TrafficToken(ctx.secret, r.owner_key_id, r.id)) : json(nullptr)}};
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

// ---- errors ----

// What each errno answers is the one table of api/errors.h.

awaitable<void> Fail(http::Exchange& ex, const Status& s, const http::Headers& headers) {
  // A client that went away (mid-upload) is no server error. The answer goes nowhere; it is there
  // for the access log (499, nginx's "client closed request").
  if (IsClientGone(s)) {
    spdlog::info("{} {}: {}", ex.method(), ex.path(), s.message());
    co_return co_await ex.RespondError(kClientGoneStatus, "client_closed_request", s.message());
  }
  ErrorAnswer e = AnswerFor(s.err());
  if (e.status == 500) spdlog::error("{} {}: {}", ex.method(), ex.path(), s.message());
  co_await ex.RespondError(e.status, e.code, s.message(), headers);
}

// Wraps a handler with API key authentication: `Authorization: Bearer <key>` or `X-API-Key`.
http::Handler Authed(ApiContext& ctx, AuthedHandler h) {
  return [&ctx, h = std::move(h)](http::Exchange& ex) -> awaitable<void> {
    ctx.metrics.requests++;
    std::string secret(ex.Header("X-API-Key"));
    std::string_view auth = ex.Header("Authorization");
    if (secret.empty() && auth.size() > 7 &&
        (auth.substr(0, 7) == "Bearer " || auth.substr(0, 7) == "bearer "))
      secret = std::string(auth.substr(7));
    if (secret.empty()) {
      co_await ex.RespondError(401, "unauthenticated",
                               "an API key is required (Authorization: Bearer <key>)");
      co_return;
    }
    auto key = VerifyKey(ctx.store, *ctx.denials, ex, secret);
    if (!key.ok()) {
      co_await Fail(ex, key.status());
      co_return;
    }
    if (!*key) {
      co_await ex.RespondError(401, "unauthenticated", "unknown or revoked API key");
      co_return;
    }
    co_await h(ex, **key);
  };
}

// ---- request parsing helpers ----

Result<std::map<std::string, std::string>> StringMap(const json& j, const char* field) {
  std::map<std::string, std::string> out;
  if (!j.contains(field) || j[field].is_null()) return out;
  if (!j[field].is_object())
    return Status::Error(std::string(field) + ": must be an object of strings", EINVAL);
  for (const auto& [k, v] : j[field].items()) {
    if (!v.is_string())
      return Status::Error(std::string(field) + "." + k + ": must be a string", EINVAL);
    out[k] = v.get<std::string>();
  }
  return out;
}

// "86400", "0.001": a bound as people write it.
std::string Number(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.15g", v);
  return b;
}

// A whole number of `unit` (bytes, processes) for limits.<field>, 0 when absent. Only the type is
// checked here; the manager says the allowed range (which for memory and disk is the host's).
Result<int64_t> SizeField(const json& j, const char* field, const char* unit) {
  if (!j.contains(field) || j[field].is_null()) return int64_t{0};
  const json& v = j[field];
  std::string name = std::string("limits.") + field;
  // An unsigned above INT64_MAX would wrap to a negative int64: say what is wrong with it.
  if (v.is_number_unsigned() &&
      v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return Status::Error(name + ": " + http::JsonSnippet(v) + " " + unit + " is out of range",
                         EINVAL);
  if (!v.is_number_integer())
    return Status::Error(name + ": must be a whole number of " + unit +
                             ", 0 for the default (got " + http::JsonSnippet(v) + ")",
                         EINVAL);
  return v.get<int64_t>();
}

// A number of seconds from `min_s` to `max_s`, as milliseconds; 0 when absent. The range is
// checked on the double before any arithmetic, so no value (1e300, -1, 0.0001) can overflow or
// round to 0 (which would mean "the default").
Result<int64_t> SecondsField(const json& j, const char* field, double min_s, double max_s) {
  if (!j.contains(field) || j[field].is_null()) return int64_t{0};
  const json& v = j[field];
  double secs = v.is_number() ? v.get<double>() : std::nan("");
  if (!(secs >= min_s && secs <= max_s))  // also false for NaN and a non-number
    return Status::Error(std::string(field) + ": a number of seconds from " + Number(min_s) +
                             " to " + Number(max_s) + " (got " + http::JsonSnippet(v) + ")",
                         EINVAL);
  return std::max<int64_t>(1, static_cast<int64_t>(std::llround(secs * 1000)));
}

// A sandbox's: at least a second; at most the manager's maximum.
constexpr double kMinSandboxTimeoutS = 1;

Result<sandbox::CreateRequest> ParseCreate(const json& j, int64_t max_timeout_ms) {
  if (!j.is_object()) return Status::Error("body: must be a JSON object", EINVAL);
  static const std::set<std::string> kKnown = {"template", "env",        "metadata",    "limits",
                                               "timeout",  "on_timeout", "public_ports"};
  for (const auto& [k, v] : j.items())
    if (!kKnown.count(k)) return Status::Error("unknown field '" + k + "'", EINVAL);
  sandbox::CreateRequest r;
  if (j.contains("template")) {
    if (!j["template"].is_string()) return Status::Error("template: must be a string", EINVAL);
    r.template_name = j["template"].get<std::string>();
  }
  auto env = StringMap(j, "env");
  if (!env.ok()) return env.status();
  r.env = *env;
  auto md = StringMap(j, "metadata");
  if (!md.ok()) return md.status();
  r.metadata = *md;
  if (j.contains("limits")) {
    const json& l = j["limits"];
    if (!l.is_object()) return Status::Error("limits: must be an object", EINVAL);
    static const std::set<std::string> kLimits = {"memory_bytes", "cpus", "cpu_weight", "pids",
                                                  "disk_bytes"};
    for (const auto& [k, v] : l.items())
      if (!kLimits.count(k)) return Status::Error("limits: unknown field '" + k + "'", EINVAL);
    for (auto [name, unit, dst] :
         {std::tuple{"memory_bytes", "bytes", &r.limits.memory_bytes},
          std::tuple{"pids", "processes", &r.limits.pids},
          std::tuple{"disk_bytes", "bytes", &r.limits.disk_bytes},
          std::tuple{"cpu_weight", "weight units", &r.limits.cpu_weight}}) {
      auto v = SizeField(l, name, unit);
      if (!v.ok()) return v.status();
      *dst = *v;
    }
    if (l.contains("cpus") && !l["cpus"].is_null()) {
      if (!l["cpus"].is_number())
        return Status::Error("limits.cpus: must be a number of CPUs, 0 for the default (got " +
                                 http::JsonSnippet(l["cpus"]) + ")",
                             EINVAL);
      r.limits.cpus = l["cpus"].get<double>();
    }
  }
  auto timeout =
      SecondsField(j, "timeout", kMinSandboxTimeoutS, static_cast<double>(max_timeout_ms) / 1000);
  if (!timeout.ok()) return timeout.status();
  r.timeout_ms = *timeout;
  if (j.contains("on_timeout")) {
    if (!j["on_timeout"].is_string()) return Status::Error("on_timeout: 'kill' or 'pause'", EINVAL);
    r.on_timeout = j["on_timeout"].get<std::string>();
  }
  if (j.contains("public_ports")) {
    if (!j["public_ports"].is_boolean())
      return Status::Error("public_ports: must be true or false", EINVAL);
    r.public_ports = j["public_ports"].get<bool>();
  }
  return r;
}

std::string Sha256Hex(std::string_view s) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(s.data(), s.size(), md, &n, EVP_sha256(), nullptr);
  std::string out;
  char b[3];
  for (unsigned i = 0; i < n; ++i) {
    std::snprintf(b, sizeof b, "%02x", md[i]);
    out += b;
  }
  return out;
}

Result<bool> BoolField(const json& j, const char* field, bool def) {
  if (!j.contains(field) || j[field].is_null()) return def;
  if (!j[field].is_boolean())
    return Status::Error(std::string(field) + ": must be true or false", EINVAL);
  return j[field].get<bool>();
}

Result<int64_t> IntField(const json& j, const char* field, int64_t def) {
  if (!j.contains(field) || j[field].is_null()) return def;
  if (!j[field].is_number_integer())
    return Status::Error(std::string(field) + ": must be an integer", EINVAL);
  return j[field].get<int64_t>();
}

Result<std::string> PathQuery(const http::Exchange& ex, const char* name) {
  auto p = ex.query().Get(name);
  if (!p || p->empty())
    return Status::Error(std::string("query parameter '") + name + "' is required", EINVAL);
  return *p;
}

Result<int64_t> IntQuery(const http::Exchange& ex, const char* name, int64_t def) {
  auto v = ex.query().Get(name);
  if (!v) return def;
  char* end = nullptr;
  long long n = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0')
    return Status::Error(std::string(name) + ": must be an integer", EINVAL);
  return static_cast<int64_t>(n);
}

// A flag in the query: "true" or "1" set it.
bool FlagQuery(const http::Exchange& ex, const char* name) {
  auto v = ex.query().Get(name).value_or("");
  return v == "true" || v == "1";
}

int SignalNumber(const json& j) {
  if (j.is_number_integer()) return j.get<int>();
  if (!j.is_string()) return 0;
  std::string s = j.get<std::string>();
  if (s.rfind("SIG", 0) == 0) s = s.substr(3);
  static const std::map<std::string, int> kSignals = {
      {"HUP", SIGHUP},   {"INT", SIGINT},    {"QUIT", SIGQUIT}, {"KILL", SIGKILL},
      {"TERM", SIGTERM}, {"USR1", SIGUSR1},  {"USR2", SIGUSR2}, {"STOP", SIGSTOP},
      {"CONT", SIGCONT}, {"WINCH", SIGWINCH}};
  auto it = kSignals.find(s);
  return it == kSignals.end() ? 0 : it->second;
}

// ---- routes ----

void Sandboxes(http::Router& r, ApiContext& ctx) {
  r.Post("/v1/sandboxes",
         Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
           auto body = co_await ex.ReadBody();
           if (!body.ok()) co_return co_await Fail(ex, body.status());
           json j = body->empty() ? json::object() : http::ParseJsonBody(*body);
           if (j.is_discarded())
             co_return co_await ex.RespondError(400, "invalid_argument", "body: not valid JSON");
           auto req = ParseCreate(j, ctx.manager.max_timeout_ms());
           if (!req.ok()) co_return co_await Fail(ex, req.status());
           req->idempotency_key = std::string(ex.Header("Idempotency-Key"));
           req->request_hash = Sha256Hex(j.dump());
           sandbox::QuotaExceeded quota;
           auto rec =
               co_await OnPool(ctx.blocking, [&] { return ctx.manager.Create(key, *req, &quota); });
           if (storage::IsTemplateNotFound(rec.status()))
             co_return co_await ex.RespondError(400, "invalid_argument", rec.status().what());
           if (!rec.ok()) {
             http::Headers h;
             if (rec.status().err() == EAGAIN)
               h.emplace_back("Retry-After",
                              std::to_string(static_cast<int>(std::ceil(quota.retry_after_s))));
             co_return co_await Fail(ex, rec.status(), h);
           }
           co_await ex.RespondJson(201, SandboxJson(ctx, key, *rec));
         }));

  r.Get("/v1/sandboxes",
        Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
          store::SandboxFilter f;
          for (const auto& s : ex.query().GetAll("state")) f.states.push_back(s);
          for (const auto& [k, v] : ex.query().items())
            if (k.rfind("metadata.", 0) == 0) f.metadata.emplace_back(k.substr(9), v);
          auto limit = IntQuery(ex, "limit", 100);
          if (!limit.ok() || *limit < 1 || *limit > 1000)
            co_return co_await ex.RespondError(400, "invalid_argument", "limit: 1 to 1000");
          f.limit = static_cast<size_t>(*limit);
          f.after = ex.query().Get("cursor").value_or("");
          // Operator keys see every key's sandboxes, or one key's with ?owner=key_...; for
          // other keys the manager ignores it.
          f.owner_key_id = ex.query().Get("owner").value_or("");
          auto page = ctx.manager.List(key, f);
          if (!page.ok()) co_return co_await Fail(ex, page.status());
          json items = json::array();
          for (const auto& rec : page->items) items.push_back(SandboxJson(ctx, key, rec));
          json body = {{"sandboxes", items},
                       {"next_cursor", page->next.empty() ? json(nullptr) : json(page->next)}};
          co_await ex.RespondJson(200, body);
        }));

  r.Get("/v1/sandboxes/{id}",
        Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
          auto rec = ctx.manager.Get(key, ex.Param("id"));
          if (!rec.ok()) co_return co_await Fail(ex, rec.status());
          json j = SandboxJson(ctx, key, *rec);
          if (rec->state == store::kStateRunning || rec->state == store::kStatePaused) {
            auto st = ctx.manager.Stats(key, rec->id);
            if (st.ok())
              j["stats"] = {{"cpu_usage_ns", st->cpu_usage_ns},
                            {"memory_bytes", st->memory_current},
                            {"memory_peak_bytes", st->memory_peak},
                            {"pids", st->pids_current},
                            {"oom_kills", st->oom_kills}};
          }
          co_await ex.RespondJson(200, j);
        }));

  r.Delete(
      "/v1/sandboxes/{id}",
      Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
        std::string id = ex.Param("id");
        Status s = co_await OnPool(ctx.blocking, [&] { return ctx.manager.Kill(key, id); });
        if (!s.ok()) co_return co_await Fail(ex, s);
        co_await ex.Respond(204, "");
      }));

  r.Post("/v1/sandboxes/{id}/timeout",
         Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
           auto j = co_await ex.ReadJson();
           if (!j.ok()) co_return co_await Fail(ex, j.status());
           if (!j->contains("timeout") || (*j)["timeout"].is_null())
             co_return co_await ex.RespondError(400, "invalid_argument", "timeout: required");
           auto t = SecondsField(*j, "timeout", kMinSandboxTimeoutS,
                                 static_cast<double>(ctx.manager.max_timeout_ms()) / 1000);
           if (!t.ok()) co_return co_await Fail(ex, t.status());
           auto rec = ctx.manager.SetTimeout(key, ex.Param("id"), *t);
           if (!rec.ok()) co_return co_await Fail(ex, rec.status());
           co_await ex.RespondJson(200, SandboxJson(ctx, key, *rec));
         }));

  for (const char* action : {"pause", "resume"}) {
    bool pause = std::string(action) == "pause";
    r.Post(std::string("/v1/sandboxes/{id}/") + action,
           Authed(ctx,
                  [&ctx, pause](http::Exchange& ex,
                                const store::ApiKeyRecord& key) -> awaitable<void> {
                    std::string id = ex.Param("id");
                    Status s = co_await OnPool(ctx.blocking, [&] {
                      return pause ? ctx.manager.Pause(key, id) : ctx.manager.Resume(key, id);
                    });
                    if (!s.ok()) co_return co_await Fail(ex, s);
                    auto rec = ctx.manager.Get(key, id);
                    if (!rec.ok()) co_return co_await Fail(ex, rec.status());
                    co_await ex.RespondJson(200, SandboxJson(ctx, key, *rec));
                  }));
  }
}

void Audit(http::Router& r, ApiContext& ctx) {
  r.Get("/v1/audit",
        Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
          store::AuditQuery q;
          q.sandbox_id = ex.query().Get("sandbox").value_or("");
          q.type = ex.query().Get("type").value_or("");
          auto since = IntQuery(ex, "since", 0), until = IntQuery(ex, "until", 0),
               after = IntQuery(ex, "after", 0), limit = IntQuery(ex, "limit", 100);
          if (!since.ok() || !until.ok() || !after.ok() || !limit.ok() || *limit < 1 ||
              *limit > 10000)
            co_return co_await ex.RespondError(
                400, "invalid_argument",
                "since, until (ms), after (seq) and limit (1..10000) are integers");
          q.since = *since;
          q.until = *until;
          q.after_seq = *after;
          q.limit = static_cast<size_t>(*limit);
          // A key sees the events of its own sandboxes and its own requests.
          if (!q.sandbox_id.empty()) {
            auto rec = ctx.manager.Get(key, q.sandbox_id);
            if (!rec.ok()) co_return co_await Fail(ex, rec.status());
          }
          // Filtered in SQL, before the limit: another key's flood of events costs nothing here.
          // Operators read every event (sandbox.access_denied is recorded for them alone).
          if (!key.is_operator) q.key_id = key.id;
          auto events = ctx.store.QueryAudit(q);
          if (!events.ok()) co_return co_await Fail(ex, events.status());
          json out = json::array();
          for (const auto& e : *events) {
            out.push_back({{"seq", e.seq},
                           {"time", IsoTime(e.time)},
                           {"time_ms", e.time},
                           {"sandbox_id", e.sandbox_id},
                           {"type", e.type},
                           {"detail", e.detail}});
          }
          json body = {{"events", out}};
          co_await ex.RespondJson(200, body);
        }));
}

// The store's full integrity check (PRAGMA quick_check) costs time that grows with the file and
// locks the store meanwhile, so /healthz never waits for it: each call does a trivial read of the
// store and reports the last integrity result, which a call refreshes on the blocking pool when it
// is older than a minute.
struct IntegrityCache {
  static constexpr auto kMaxAge = std::chrono::minutes(1);
  std::mutex mu;
  std::optional<Clock::time_point> checked;  // guarded by mu
  bool running = false;                      // guarded by mu
  Status last;                               // guarded by mu
};

// How long /healthz trusts the store's last write to say whether it can write: a daemon that
// wrote nothing for longer gets a small probe write (Store::CheckWritable), so a disk that filled
// while it was idle shows within this time, and one that was freed too.
constexpr int64_t kWriteProbeAfterMs = 2000;

// "store cannot write: No space left on device (since ...; the last failure: ...)".
Status CannotWrite(const store::WriteHealth& h) {
  std::string reason = h.error.err() != 0 ? std::strerror(h.error.err()) : h.error.what();
  return Status::Error("store cannot write: " + reason + " (since " + IsoTime(h.failing_since) +
                           "; the last failure: " + h.error.message() + ")",
                       h.error.err());
}

void Health(http::Router& r, ApiContext& ctx) {
  auto cache = std::make_shared<IntegrityCache>();
  r.Get("/healthz", [&ctx, cache](http::Exchange& ex) -> awaitable<void> {
    Status s = co_await OnPool(ctx.blocking, [&] {
      Status read = ctx.store.Ping();
      if (!read.ok()) return read;
      store::WriteHealth h = ctx.store.CheckWritable(kWriteProbeAfterMs);
      return h.ok() ? Status() : CannotWrite(h);
    });
    {
      std::lock_guard<std::mutex> g(cache->mu);
      auto now = Clock::now();
      if (!cache->running && (!cache->checked || now - *cache->checked >= cache->kMaxAge)) {
        cache->running = true;
        asio::post(ctx.blocking, [&ctx, cache] {
          Status checked = ctx.store.CheckIntegrity();
          if (!checked.ok()) spdlog::error("store integrity: {}", checked.message());
          std::lock_guard<std::mutex> g2(cache->mu);
          cache->last = checked;
          cache->checked = Clock::now();
          cache->running = false;
        });
      }
      if (s.ok()) s = cache->last;
    }
    json body =
        s.ok() ? json{{"status", "ok"}} : json{{"status", "unhealthy"}, {"error", s.message()}};
    co_await ex.RespondJson(s.ok() ? 200 : 503, body);
  });
  // Per-sandbox series name every live sandbox: only for operator keys.
  r.Get(
      "/metrics",
      Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
        if (!key.is_operator)
          co_return co_await ex.RespondError(
              403, "permission_denied",
              "/metrics needs an operator key (sbx key create --operator)");
        std::string out;
        auto live = co_await OnPool(ctx.blocking, [&] { return ctx.manager.LiveStats(); });
        std::map<std::string, int> by_state = {{"creating", 0}, {"running", 0}, {"paused", 0}};
        if (auto recs = ctx.store.ListLiveSandboxes(); recs.ok())
          for (const auto& rec : *recs) by_state[rec.state]++;
        out += "# HELP sbx_sandboxes Live sandboxes by state.\n# TYPE sbx_sandboxes gauge\n";
        for (const auto& [state, n] : by_state)
          out += "sbx_sandboxes{state=\"" + state + "\"} " + std::to_string(n) + "\n";
        auto c = ctx.manager.counters();
        out +=
            "# HELP sbx_sandbox_creations_total Sandboxes created.\n# TYPE "
            "sbx_sandbox_creations_total "
            "counter\n";
        out += "sbx_sandbox_creations_total " + std::to_string(c.creations) + "\n";
        out +=
            "# HELP sbx_sandbox_creation_failures_total Sandbox creations that failed.\n# TYPE "
            "sbx_sandbox_creation_failures_total counter\n";
        out += "sbx_sandbox_creation_failures_total " + std::to_string(c.creation_failures) + "\n";
        auto audit = ctx.store.audit_queue().counters();
        out +=
            "# HELP sbx_audit_queued Audit events in memory, waiting for the store to write "
            "again.\n# TYPE sbx_audit_queued gauge\nsbx_audit_queued " +
            std::to_string(audit.queued) + "\n";
        out +=
            "# HELP sbx_audit_queued_total Audit events the store could not take at once "
            "(queued and retried).\n# TYPE sbx_audit_queued_total counter\n"
            "sbx_audit_queued_total " +
            std::to_string(audit.queued_total) + "\n";
        out +=
            "# HELP sbx_audit_dropped_total Audit events lost (the queue was full, or held "
            "them at shutdown).\n# TYPE sbx_audit_dropped_total counter\n"
            "sbx_audit_dropped_total " +
            std::to_string(audit.dropped_total) + "\n";
        out +=
            "# HELP sbx_store_writable 1 when the store's last write succeeded, 0 when it failed "
            "for want of storage.\n# TYPE sbx_store_writable gauge\nsbx_store_writable " +
            std::string(ctx.store.WriteHealth().ok() ? "1" : "0") + "\n";
        out += "# HELP sbx_commands_total Commands started.\n# TYPE sbx_commands_total counter\n";
        // Until every facade spawns through the session, the E2B facade counts its own.
        out += "sbx_commands_total " +
               std::to_string(ctx.manager.metrics().commands.load() + ctx.metrics.commands.load()) +
               "\n";
        ctx.manager.metrics().create_seconds.Render(
            "sbx_create_seconds", "Time from create request to a running sandbox.", &out);
        ctx.manager.metrics().exec_seconds.Render(
            "sbx_exec_seconds", "Time from command request to the process running.", &out);
        out +=
            "# HELP sbx_sandbox_cpu_seconds_total CPU time used by a sandbox.\n# TYPE "
            "sbx_sandbox_cpu_seconds_total counter\n";
        for (const auto& [rec, st] : live) {
          char line[200];
          std::snprintf(line, sizeof line, "sbx_sandbox_cpu_seconds_total{sandbox=\"%s\"} %.6f\n",
                        rec.id.c_str(), st.cpu_usage_ns / 1e9);
          out += line;
        }
        out +=
            "# HELP sbx_sandbox_memory_bytes Memory used by a sandbox.\n# TYPE "
            "sbx_sandbox_memory_bytes gauge\n";
        for (const auto& [rec, st] : live)
          out += "sbx_sandbox_memory_bytes{sandbox=\"" + rec.id + "\"} " +
                 std::to_string(st.memory_current) + "\n";
        co_await ex.Respond(200, out, "text/plain; version=0.0.4");
      }));
}

awaitable<std::shared_ptr<sandbox::Session>> SessionOrFail(ApiContext& ctx, http::Exchange& ex,
                                                           const store::ApiKeyRecord& key) {
  auto s = co_await sandbox::Session::Open(ctx.manager, key, ex.Param("id"), "v1");
  if (!s.ok()) {
    co_await Fail(ex, s.status());
    co_return nullptr;
  }
  co_return *s;
}

}  // namespace sbx::api::v1

namespace sbx::api {

void RegisterV1(http::Router& router, ApiContext& ctx) {
  using namespace v1;
  Health(router, ctx);
  Sandboxes(router, ctx);
  Commands(router, ctx);
  Files(router, ctx);
  Archives(router, ctx);
  Audit(router, ctx);
  RegisterPortRoutes(router, ctx);  // api/ingress.h
}

}  // namespace sbx::api
