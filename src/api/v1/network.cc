// The native API's network routes (docs/api.md, "Network"): a sandbox's policy, read and
// replaced whole (GET/PUT /v1/sandboxes/{id}/network), and signed, expiring URLs of its ports
// (POST /v1/sandboxes/{id}/ports/{port}/url). The policy's grammar and decision are
// network/policy.h's; what a change does to a live box is the manager's (Manager::SetNetwork).
// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include <chrono>
#include <string>

#include "api/v1/internal.h"
#include "network/ingress.h"
#include "network/policy.h"

namespace sbx::api::v1 {

json NetworkJson(const sandbox::SandboxRecord& r) {
  json j = json::parse(r.network.empty() ? sandbox::kNoNetwork : r.network, nullptr, false);
  if (!j.is_object()) j = json::parse(sandbox::kNoNetwork);
  return j;
}

Result<network::Policy> ParseNetwork(const json& j) {
  if (!j.is_object())
    return Status::Error(
        "network: an object {\"mode\": \"none\"|\"allowlist\"|\"open\", \"allow\": [...], "
        "\"deny\": [...]}",
        EINVAL);
  auto p = network::Policy::FromJson(j.dump());
  if (!p.ok()) return Status::Error("network: " + p.status().message(), EINVAL);
  return *p;
}

void Network(http::Router& r, ApiContext& ctx) {
  r.Get(
      "/v1/sandboxes/{id}/network",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto rec = ctx.manager.Get(key, ex.Param("id"));
        if (!rec.ok()) co_return co_await Fail(ex, rec.status());
        co_await ex.RespondJson(200, NetworkJson(*rec));
      }));

  r.Put(
      "/v1/sandboxes/{id}/network",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        std::string id = ex.Param("id");
        // Another key's sandbox is unknown (and audited) whatever the body says.
        if (auto rec = ctx.manager.Get(key, id); !rec.ok())
          co_return co_await Fail(ex, rec.status());
        auto j = co_await ex.ReadJson();
        if (!j.ok()) co_return co_await Fail(ex, j.status());
        auto policy = ParseNetwork(*j);
        if (!policy.ok()) co_return co_await Fail(ex, policy.status());
        // A live change reaches the network stack (nftables, the registry): off the I/O thread.
        auto rec =
            co_await OnPool(ctx.blocking, [&] { return ctx.manager.SetNetwork(key, id, *policy); });
        if (!rec.ok()) co_return co_await Fail(ex, rec.status());
        co_await ex.RespondJson(200, NetworkJson(*rec));
      }));

  r.Post(
      "/v1/sandboxes/{id}/ports/{port}/url",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        std::string id = ex.Param("id");
        // The owner's only (an operator key does not open another key's ports), and live;
        // another key's sandbox is unknown (and audited) whatever the rest of the request says.
        auto rec = ctx.manager.Get(key, id);
        if (!rec.ok()) co_return co_await Fail(ex, rec.status());
        if (rec->owner_key_id != key.id)
          co_return co_await ex.RespondError(404, "not_found", "no sandbox '" + id + "'");
        int port = network::ParsePort(ex.Param("port"));
        if (!network::ValidPort(port))
          co_return co_await ex.RespondError(400, "invalid_argument",
                                             "port: a whole number from 1 to 65535 (got '" +
                                                 ex.Param("port").substr(0, 16) + "')");
        auto body = co_await ex.ReadBody();
        if (!body.ok()) co_return co_await Fail(ex, body.status());
        json j = body->empty() ? json::object() : http::ParseJsonBody(*body);
        if (j.is_discarded() || !j.is_object())
          co_return co_await ex.RespondError(400, "invalid_argument",
                                             "body: a JSON object {\"ttl_s\": seconds}");
        for (const auto& [k, v] : j.items())
          if (k != "ttl_s")
            co_return co_await Fail(ex, Status::Error("unknown field '" + k + "'", EINVAL));
        auto ttl = SecondsField(j, "ttl_s", 1, static_cast<double>(network::kMaxPortUrlTtlS));
        if (!ttl.ok()) co_return co_await Fail(ex, ttl.status());
        int64_t ttl_s = *ttl > 0 ? *ttl / 1000 : 600;
        if (!sandbox::IsLiveState(rec->state))
          co_return co_await Fail(
              ex, Status::Error("sandbox " + id + " is " + rec->state + "; its ports are closed",
                                EBUSY));
        int64_t expires = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count() +
                          ttl_s;
        std::string path = "/v1/sandboxes/" + id + "/ports/" + std::to_string(port) + "/?" +
                           network::SignPortUrl(ctx.secret, key.id, id, port, expires);
        std::string host(ex.Header("Host"));
        json out = {{"path", path},
                    {"url", host.empty() ? json(nullptr) : json("http://" + host + path)},
                    {"port", port},
                    {"expires_at", IsoTime(expires * 1000)}};
        ctx.manager.Audit("sandbox.port_url", id, key.id, {{"port", port}, {"ttl_s", ttl_s}});
        co_await ex.RespondJson(201, out);
      }));
}

}  // namespace sbx::api::v1
