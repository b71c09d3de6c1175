// The native API's audit listing, /v1/audit (docs/api.md, "Audit").
// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include "api/v1/internal.h"

namespace sbx::api::v1 {

void Audit(http::Router& r, ApiContext& ctx) {
  r.Get(
      "/v1/audit",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        sandbox::AuditQuery q;
        q.sandbox_id = ex.query().Get("sandbox").value_or("");
        q.type = ex.query().Get("type").value_or("");
        auto since = IntQuery(ex, "since", 0), until = IntQuery(ex, "until", 0),
             after = IntQuery(ex, "after", 0), before = IntQuery(ex, "before", 0),
             limit = IntQuery(ex, "limit", 100);
        if (!since.ok() || !until.ok() || !after.ok() || !before.ok() || !limit.ok() ||
            *limit < 1 || *limit > 10000)
          co_return co_await ex.RespondError(
              400, "invalid_argument",
              "since, until (ms), after, before (seq) and limit (1..10000) are integers");
        std::string order = ex.query().Get("order").value_or("asc");
        if (order != "asc" && order != "desc")
          co_return co_await ex.RespondError(400, "invalid_argument",
                                             "order: asc or desc (got " + order + ")");
        q.since = *since;
        q.until = *until;
        q.after_seq = *after;
        q.before_seq = *before;
        q.newest_first = order == "desc";
        q.limit = static_cast<size_t>(*limit);
        // A key sees the events of its own sandboxes and its own requests.
        if (!q.sandbox_id.empty()) {
          auto rec = ctx.manager.Get(key, q.sandbox_id);
          if (!rec.ok()) co_return co_await Fail(ex, rec.status());
        }
        // Filtered in SQL, before the limit: another key's flood of events costs nothing here.
        // Operators read every event (sandbox.access_denied is recorded for them alone).
        if (!key.is_operator) q.key_id = key.id;
        auto events = ctx.manager.QueryAudit(q);
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

}  // namespace sbx::api::v1
