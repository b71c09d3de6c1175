// The native API's sandbox lifecycle routes: create, list, get, kill, timeout, pause, resume
// (docs/api.md, "Sandboxes"). A sandbox's network routes are network.cc's.
// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include <openssl/evp.h>

#include <cmath>
#include <set>
#include <string>
#include <tuple>

#include "api/errors.h"
#include "api/v1/internal.h"
#include "storage/template.h"

namespace sbx::api::v1 {
namespace {

// `key` is the caller: an operator looking at another key's sandbox sees no token for it.
json SandboxJson(const ApiContext& ctx, const sandbox::ApiKeyRecord& key,
                 const sandbox::SandboxRecord& r) {
  bool owner = r.owner_key_id == key.id;
  json env_keys = json::array();
  for (const auto& [k, v] : r.env) env_keys.push_back(k);  // values may be secrets: never echoed
  json j = {{"id", r.id},
            {"template", r.template_name},
            {"runtime", r.runtime},
            {"state", r.state},
            {"metadata", r.metadata},
            {"env_keys", env_keys},
            {"limits",
             {{"memory_bytes", r.limits.memory_bytes},
              {"cpus", r.limits.cpus},
              {"cpu_weight", r.limits.cpu_weight},
              {"pids", r.limits.pids},
              {"disk_bytes", r.limits.disk_bytes},
              {"egress_mbps", r.limits.egress_mbps}}},
            {"timeout", static_cast<double>(r.timeout_ms) / 1000.0},
            {"on_timeout", r.on_timeout},
            {"pause_memory", r.pause_memory},
            // Paused without a box: without memory (its resume is a new boot), or a VM's memory
            // saved to disk.
            {"on_disk", r.on_disk},
            {"auto_resume", r.auto_resume},
            {"created_at", IsoTime(r.created_at)},
            {"expires_at", r.expires_at ? json(IsoTime(r.expires_at)) : json(nullptr)},
            {"ended_at", r.ended_at ? json(IsoTime(r.ended_at)) : json(nullptr)},
            {"public_ports", r.public_ports},
            {"network", NetworkJson(r)},
            {"owner_key_id", r.owner_key_id},
            {"id_base", r.id_base},
            {"idmapped", r.idmapped},
            {"traffic_token",
             owner ? json(TrafficToken(ctx.secret, r.owner_key_id, r.id)) : json(nullptr)}};
  if (!r.error.empty()) j["error"] = r.error;
  // What a VM runs on here (KVM when a probe boot showed it works, else TCG).
  if (r.runtime == "vm")
    for (const auto& rt : ctx.manager.Runtimes())
      if (rt.name == r.runtime && !rt.accelerator.empty()) j["accelerator"] = rt.accelerator;
  return j;
}

json SnapshotJson(const sandbox::SnapshotInfo& s) {
  return {{"id", s.id},
          {"names", s.names},
          {"sandbox", s.sandbox_id},
          {"size_bytes", s.size_bytes},
          {"created_at", IsoTime(s.created_at)}};
}

// A sandbox's: at least a second; at most the manager's maximum.
constexpr double kMinSandboxTimeoutS = 1;

Result<sandbox::CreateRequest> ParseCreate(const json& j, int64_t max_timeout_ms) {
  if (!j.is_object()) return Status::Error("body: must be a JSON object", EINVAL);
  static const std::set<std::string> kKnown = {
      "template",     "env",     "metadata", "limits",       "timeout",     "on_timeout",
      "public_ports", "network", "secrets",  "pause_memory", "auto_resume", "runtime"};
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
    static const std::set<std::string> kLimits = {"memory_bytes", "cpus",       "cpu_weight",
                                                  "pids",         "disk_bytes", "egress_mbps"};
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
    // Mbit/s each way through the egress proxy (its range is the manager's check, limits.h).
    if (l.contains("egress_mbps") && !l["egress_mbps"].is_null()) {
      if (!l["egress_mbps"].is_number())
        return Status::Error(
            "limits.egress_mbps: must be a number of Mbit/s, 0 for no limit (got " +
                http::JsonSnippet(l["egress_mbps"]) + ")",
            EINVAL);
      r.limits.egress_mbps = l["egress_mbps"].get<double>();
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
  if (j.contains("pause_memory")) {
    if (!j["pause_memory"].is_boolean())
      return Status::Error("pause_memory: must be true or false", EINVAL);
    r.pause_memory = j["pause_memory"].get<bool>();
  }
  if (j.contains("runtime")) {
    if (!j["runtime"].is_string()) return Status::Error("runtime: must be a string", EINVAL);
    r.runtime = j["runtime"].get<std::string>();
  }
  if (j.contains("auto_resume")) {
    if (!j["auto_resume"].is_boolean())
      return Status::Error("auto_resume: must be true or false", EINVAL);
    r.auto_resume = j["auto_resume"].get<bool>();
  }
  if (j.contains("public_ports")) {
    if (!j["public_ports"].is_boolean())
      return Status::Error("public_ports: must be true or false", EINVAL);
    r.public_ports = j["public_ports"].get<bool>();
  }
  if (j.contains("network") && !j["network"].is_null()) {
    auto policy = ParseNetwork(j["network"]);
    if (!policy.ok()) return policy.status();
    r.network = *policy;
  }
  auto secrets = StringMap(j, "secrets");
  if (!secrets.ok()) return secrets.status();
  r.secrets = *secrets;
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

}  // namespace

void Sandboxes(http::Router& r, ApiContext& ctx) {
  r.Post(
      "/v1/sandboxes",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
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

  r.Get(
      "/v1/sandboxes",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        sandbox::SandboxFilter f;
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

  r.Get(
      "/v1/sandboxes/{id}",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto rec = ctx.manager.Get(key, ex.Param("id"));
        if (!rec.ok()) co_return co_await Fail(ex, rec.status());
        json j = SandboxJson(ctx, key, *rec);
        if (rec->state == sandbox::kStateRunning || rec->state == sandbox::kStatePaused) {
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
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        std::string id = ex.Param("id");
        // The answer comes once the sandbox's processes are dead; with ?wait=true, once its box
        // is gone from the host too (docs/api.md, "Kill").
        bool wait = FlagQuery(ex, "wait");
        Status s = co_await OnPool(ctx.blocking, [&] {
          Status killed = ctx.manager.Kill(key, id);
          if (killed.ok() && wait && !ctx.manager.AwaitCleanup(id, kCleanupWait))
            return Status::Error("sandbox " + id + " is killed, but removing its box takes longer",
                                 ETIMEDOUT);
          return killed;
        });
        if (!s.ok()) co_return co_await Fail(ex, s);
        co_await ex.Respond(204, "");
      }));

  r.Post(
      "/v1/sandboxes/{id}/timeout",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
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
    r.Post(
        std::string("/v1/sandboxes/{id}/") + action,
        Authed(
            ctx,
            [&ctx, pause](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
              std::string id = ex.Param("id");
              // Another key's sandbox is not found, whatever the body says.
              if (auto owned = ctx.manager.Get(key, id); !owned.ok())
                co_return co_await Fail(ex, owned.status());
              // A pause's optional body: {"memory": false} keeps only the filesystem.
              auto body = co_await ex.ReadBody();
              if (!body.ok()) co_return co_await Fail(ex, body.status());
              bool memory = true;
              if (pause && !body->empty()) {
                json j = http::ParseJsonBody(*body);
                if (!j.is_object())
                  co_return co_await ex.RespondError(400, "invalid_argument",
                                                     "body: must be a JSON object");
                for (const auto& [k, v] : j.items())
                  if (k != "memory")
                    co_return co_await ex.RespondError(400, "invalid_argument",
                                                       "unknown field '" + k + "'");
                if (j.contains("memory")) {
                  if (!j["memory"].is_boolean())
                    co_return co_await ex.RespondError(400, "invalid_argument",
                                                       "memory: must be true or false");
                  memory = j["memory"].get<bool>();
                }
              }
              Status s = co_await OnPool(ctx.blocking, [&] {
                return pause ? ctx.manager.Pause(key, id, memory) : ctx.manager.Resume(key, id);
              });
              if (!s.ok()) co_return co_await Fail(ex, s);
              auto rec = ctx.manager.Get(key, id);
              if (!rec.ok()) co_return co_await Fail(ex, rec.status());
              co_await ex.RespondJson(200, SandboxJson(ctx, key, *rec));
            }));
  }

  // Snapshots (docs/api.md "Snapshots"): private to the key that took them.
  r.Post(
      "/v1/sandboxes/{id}/snapshots",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        // Another key's sandbox is not found, whatever the body says.
        if (auto owned = ctx.manager.Get(key, ex.Param("id")); !owned.ok())
          co_return co_await Fail(ex, owned.status());
        auto body = co_await ex.ReadBody();
        if (!body.ok()) co_return co_await Fail(ex, body.status());
        std::string name;
        if (!body->empty()) {
          json j = http::ParseJsonBody(*body);
          if (!j.is_object())
            co_return co_await ex.RespondError(400, "invalid_argument",
                                               "body: must be a JSON object");
          for (const auto& [k, v] : j.items())
            if (k != "name")
              co_return co_await ex.RespondError(400, "invalid_argument",
                                                 "unknown field '" + k + "'");
          if (j.contains("name") && !j["name"].is_null()) {
            if (!j["name"].is_string())
              co_return co_await ex.RespondError(400, "invalid_argument", "name: must be a string");
            name = j["name"].get<std::string>();
          }
        }
        std::string id = ex.Param("id");
        auto snap =
            co_await OnPool(ctx.blocking, [&] { return ctx.manager.Snapshot(key, id, name); });
        if (!snap.ok()) co_return co_await Fail(ex, snap.status());
        co_await ex.RespondJson(201, SnapshotJson(*snap));
      }));

  r.Get(
      "/v1/snapshots",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto list = co_await OnPool(ctx.blocking, [&] {
          return ctx.manager.ListSnapshots(key, ex.query().Get("sandbox").value_or(""),
                                           ex.query().Get("name").value_or(""));
        });
        if (!list.ok()) co_return co_await Fail(ex, list.status());
        json items = json::array();
        for (const auto& s : *list) items.push_back(SnapshotJson(s));
        json body = {{"snapshots", items}};
        co_await ex.RespondJson(200, body);
      }));

  r.Delete(
      "/v1/snapshots/{snapshot}",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        std::string id = ex.Param("snapshot");
        Status s =
            co_await OnPool(ctx.blocking, [&] { return ctx.manager.DeleteSnapshot(key, id); });
        if (!s.ok()) co_return co_await Fail(ex, s);
        co_await ex.Respond(204, "");
      }));

  // Forks: N sandboxes from one snapshot of a source that keeps running; one answer per fork.
  r.Post(
      "/v1/sandboxes/{id}/fork",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        if (auto owned = ctx.manager.Get(key, ex.Param("id")); !owned.ok())
          co_return co_await Fail(ex, owned.status());
        auto body = co_await ex.ReadBody();
        if (!body.ok()) co_return co_await Fail(ex, body.status());
        json j = body->empty() ? json::object() : http::ParseJsonBody(*body);
        if (!j.is_object())
          co_return co_await ex.RespondError(400, "invalid_argument",
                                             "body: must be a JSON object");
        for (const auto& [k, v] : j.items())
          if (k != "count" && k != "timeout")
            co_return co_await ex.RespondError(400, "invalid_argument",
                                               "unknown field '" + k + "'");
        int count = 1;
        if (j.contains("count")) {
          if (!j["count"].is_number_integer() || j["count"].get<int64_t>() < 1 ||
              j["count"].get<int64_t>() > sandbox::kMaxForks)
            co_return co_await ex.RespondError(
                400, "invalid_argument",
                "count: an integer, 1.." + std::to_string(sandbox::kMaxForks));
          count = j["count"].get<int>();
        }
        int64_t timeout_ms = 0;
        if (j.contains("timeout") && !j["timeout"].is_null()) {
          auto t = SecondsField(j, "timeout", kMinSandboxTimeoutS,
                                static_cast<double>(ctx.manager.max_timeout_ms()) / 1000);
          if (!t.ok()) co_return co_await Fail(ex, t.status());
          timeout_ms = *t;
        }
        std::string id = ex.Param("id");
        auto forks = co_await OnPool(ctx.blocking,
                                     [&] { return ctx.manager.Fork(key, id, count, timeout_ms); });
        if (!forks.ok()) co_return co_await Fail(ex, forks.status());
        json items = json::array();
        for (const auto& f : *forks) {
          if (f.ok()) {
            items.push_back({{"sandbox", SandboxJson(ctx, key, *f)}});
          } else {
            ErrorAnswer a = AnswerFor(f.status().err());
            items.push_back({{"error", {{"code", a.code}, {"message", f.status().what()}}}});
          }
        }
        // A vm sandbox forks with its memory (its processes run on in each fork); the others
        // fork files, not memory: the forks' processes are not running.
        bool memory = false;
        for (const auto& f : *forks)
          if (f.ok() && f->runtime == "vm") memory = true;
        json answer = {{"forks", items}, {"memory", memory}};
        co_await ex.RespondJson(201, answer);
      }));
}

}  // namespace sbx::api::v1
