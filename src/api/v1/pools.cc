// Operator routes for what the daemon does beside sandboxes: warm pools, /v1/pools, and the
// cleanups after kills, /v1/cleanups (operator keys; docs/api.md, "Warm pools" and "Kill").
// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include "api/v1/internal.h"

namespace sbx::api::v1 {
namespace {

json PoolJson(const sandbox::PoolStatus& p) {
  return {{"template", p.template_name},
          {"size", p.size},
          {"ready", p.ready},
          {"filling", p.filling},
          {"claims", p.claims},
          {"misses", p.misses},
          {"fill_failures", p.fill_failures},
          {"last_error", p.last_error},
          {"memory_bytes", p.memory_bytes}};
}

// Pools and cleanups are the operator's: the boxes they hold are no tenant's.
awaitable<bool> OperatorOrFail(http::Exchange& ex, const sandbox::ApiKeyRecord& key,
                               const char* what = "pools") {
  if (key.is_operator) co_return true;
  co_await ex.RespondError(403, "permission_denied",
                           std::string(what) + " need an operator key (sbx key create --operator)");
  co_return false;
}

// The pool of {template} as it is after a change (an emptied one may be gone already). Plain
// function: no co_await beside the temporaries (GCC 12 mishandles them in coroutines).
json PoolAfterChange(ApiContext& ctx, const std::string& name) {
  for (const auto& p : ctx.manager.Pools())
    if (p.template_name == name) return PoolJson(p);
  sandbox::PoolStatus none;
  none.template_name = name;
  return PoolJson(none);
}

bool HasPool(ApiContext& ctx, const std::string& name) {
  for (const auto& p : ctx.manager.Pools())
    if (p.template_name == name) return true;
  return false;
}

}  // namespace

void Cleanups(http::Router& r, ApiContext& ctx) {
  r.Get(
      "/v1/cleanups",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        if (!co_await OperatorOrFail(ex, key, "cleanups")) co_return;
        bool wait = FlagQuery(ex, "wait");
        auto pending = co_await OnPool(ctx.blocking, [&] {
          if (wait) (void)ctx.manager.AwaitCleanups(kCleanupWait);
          return ctx.manager.PendingCleanups();
        });
        if (wait && !pending.empty())
          co_return co_await ex.RespondError(
              504, "timeout",
              std::to_string(pending.size()) + " killed sandboxes' boxes are still being removed");
        json body = {{"pending", pending}};
        co_await ex.RespondJson(200, body);
      }));
}

void Pools(http::Router& r, ApiContext& ctx) {
  r.Get(
      "/v1/pools",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        if (!co_await OperatorOrFail(ex, key)) co_return;
        auto pools = co_await OnPool(ctx.blocking, [&] { return ctx.manager.Pools(); });
        json out = json::array();
        for (const auto& p : pools) out.push_back(PoolJson(p));
        json body = {{"pools", out}};
        co_await ex.RespondJson(200, body);
      }));

  r.Put(
      "/v1/pools/{template}",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        if (!co_await OperatorOrFail(ex, key)) co_return;
        auto j = co_await ex.ReadJson();
        if (!j.ok()) co_return co_await Fail(ex, j.status());
        if (!j->is_object() || !(*j)["size"].is_number_integer())
          co_return co_await ex.RespondError(
              400, "invalid_argument",
              "body: {\"size\": N}, N from 0 to " + std::to_string(sandbox::kMaxPoolSize));
        int64_t size = (*j)["size"].get<int64_t>();
        if (size < 0 || size > sandbox::kMaxPoolSize)
          co_return co_await ex.RespondError(
              400, "invalid_argument", "size: from 0 to " + std::to_string(sandbox::kMaxPoolSize));
        sandbox::PoolSpec spec{ex.Param("template"), static_cast<int>(size)};
        Status s = co_await OnPool(ctx.blocking, [&] { return ctx.manager.SetPool(spec); });
        if (!s.ok()) co_return co_await Fail(ex, s);
        json body = PoolAfterChange(ctx, spec.template_name);
        co_await ex.RespondJson(200, body);
      }));

  r.Delete(
      "/v1/pools/{template}",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        if (!co_await OperatorOrFail(ex, key)) co_return;
        std::string name = ex.Param("template");
        if (!HasPool(ctx, name))
          co_return co_await ex.RespondError(404, "not_found", "no pool of template " + name);
        Status s = co_await OnPool(ctx.blocking, [&] {
          return ctx.manager.SetPool(sandbox::PoolSpec{name, 0});
        });
        if (!s.ok()) co_return co_await Fail(ex, s);
        co_await ex.Respond(204, "");
      }));
}

}  // namespace sbx::api::v1
