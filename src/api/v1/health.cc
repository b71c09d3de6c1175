// The daemon's own health: /healthz (no key), /metrics (operator keys) in the Prometheus text
// format (docs/api.md, "Health and metrics").
// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "api/v1/internal.h"
#include "common/encoding.h"

namespace sbx::api::v1 {
namespace {

using Clock = std::chrono::steady_clock;

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
Status CannotWrite(const sandbox::WriteHealth& h) {
  std::string reason = h.error.err() != 0 ? std::strerror(h.error.err()) : h.error.what();
  return Status::Error("store cannot write: " + reason + " (since " + IsoTime(h.failing_since) +
                           "; the last failure: " + h.error.message() + ")",
                       h.error.err());
}

}  // namespace

void Health(http::Router& r, ApiContext& ctx) {
  // What this host can run boxes under (any key: it is the same answer for all).
  r.Get("/v1/runtimes",
        Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord&) -> awaitable<void> {
          json out = json::array();
          for (const auto& rt : ctx.manager.Runtimes()) {
            json j = {{"name", rt.name}, {"available", rt.available}};
            if (!rt.available) j["reason"] = rt.why;
            if (!rt.accelerator.empty()) {
              j["accelerator"] = rt.accelerator;
              j["accelerator_reason"] = rt.accelerator_why;
            }
            out.push_back(j);
          }
          json body = {{"runtimes", out}};
          co_await ex.RespondJson(200, body);
        }));
  auto cache = std::make_shared<IntegrityCache>();
  r.Get("/healthz", [&ctx, cache](http::Exchange& ex) -> awaitable<void> {
    Status s = co_await OnPool(ctx.blocking, [&] {
      Status read = ctx.manager.PingStore();
      if (!read.ok()) return read;
      sandbox::WriteHealth h = ctx.manager.CheckStoreWritable(kWriteProbeAfterMs);
      return h.ok() ? Status() : CannotWrite(h);
    });
    {
      std::lock_guard<std::mutex> g(cache->mu);
      auto now = Clock::now();
      if (!cache->running && (!cache->checked || now - *cache->checked >= cache->kMaxAge)) {
        cache->running = true;
        boost::asio::post(ctx.blocking, [&ctx, cache] {
          Status checked = ctx.manager.CheckStoreIntegrity();
          if (!checked.ok()) spdlog::error("store integrity: {}", checked.message());
          std::lock_guard<std::mutex> g2(cache->mu);
          cache->last = checked;
          cache->checked = Clock::now();
          cache->running = false;
        });
      }
      if (s.ok()) s = cache->last;
    }
    // /healthz answers anyone: the store's path (in its errors) goes to the log only.
    if (!s.ok()) spdlog::warn("healthz: {}", s.message());
    json body = s.ok() ? json{{"status", "ok"}}
                       : json{{"status", "unhealthy"}, {"error", RedactPaths(s.message())}};
    co_await ex.RespondJson(s.ok() ? 200 : 503, body);
  });
  // Per-sandbox series name every live sandbox: only for operator keys.
  r.Get(
      "/metrics",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        if (!key.is_operator)
          co_return co_await ex.RespondError(
              403, "permission_denied",
              "/metrics needs an operator key (sbx key create --operator)");
        std::string out;
        auto live = co_await OnPool(ctx.blocking, [&] { return ctx.manager.LiveStats(); });
        std::map<std::string, int> by_state = {{"creating", 0}, {"running", 0}, {"paused", 0}};
        if (auto recs = ctx.manager.LiveRecords(); recs.ok())
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
        auto audit = ctx.manager.AuditCounters();
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
            std::string(ctx.manager.StoreWriteHealth().ok() ? "1" : "0") + "\n";
        out += "# HELP sbx_commands_total Commands started.\n# TYPE sbx_commands_total counter\n";
        // Until every facade spawns through the session, the E2B facade counts its own.
        out += "sbx_commands_total " + std::to_string(ctx.manager.metrics().commands.load()) + "\n";
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
        out +=
            "# HELP sbx_cleanups_pending Killed sandboxes whose boxes are still being removed.\n"
            "# TYPE sbx_cleanups_pending gauge\nsbx_cleanups_pending " +
            std::to_string(ctx.manager.PendingCleanups().size()) + "\n";
        // Warm pools (sandbox/pool.h): what they hold, and what their boxes use while they wait.
        auto pools = co_await OnPool(ctx.blocking, [&] { return ctx.manager.Pools(); });
        auto series = [&](const char* name, const char* type, const char* help, auto value) {
          out +=
              std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
          for (const auto& p : pools)
            out += std::string(name) + "{template=\"" + p.template_name + "\"} " +
                   std::to_string(value(p)) + "\n";
        };
        series("sbx_pool_size", "gauge", "Boxes a warm pool keeps ready.",
               [](const sandbox::PoolStatus& p) { return p.size; });
        series("sbx_pool_ready", "gauge", "Boxes of a warm pool ready for a create.",
               [](const sandbox::PoolStatus& p) { return p.ready; });
        series("sbx_pool_memory_bytes", "gauge", "Memory used by a warm pool's ready boxes.",
               [](const sandbox::PoolStatus& p) { return p.memory_bytes; });
        series("sbx_pool_claims_total", "counter", "Creates that took a warm pool's box.",
               [](const sandbox::PoolStatus& p) { return p.claims; });
        series("sbx_pool_misses_total", "counter",
               "Creates of a pooled template that found no box ready.",
               [](const sandbox::PoolStatus& p) { return p.misses; });
        series("sbx_pool_fill_failures_total", "counter", "Boxes a warm pool could not make.",
               [](const sandbox::PoolStatus& p) { return p.fill_failures; });
        co_await ex.Respond(200, out, "text/plain; version=0.0.4");
      }));
}

}  // namespace sbx::api::v1
