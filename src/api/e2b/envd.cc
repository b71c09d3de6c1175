// envd, E2B's in-sandbox daemon (spec section 2), as a translation onto the sandbox's agent. This
// file routes: requests reach envd through the router's before hook when they carry
// `E2b-Sandbox-Id` (+ `E2b-Sandbox-Port`) or a Host `<port>-<id>.<domain>`; envd's own port goes
// to the services (envd_process.cc, envd_filesystem.cc, envd_files.cc), another port of the
// sandbox through to that port (api/ingress.h).
// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include "api/e2b/e2b.h"
#include "api/e2b/envd_internal.h"
#include "api/ingress.h"
#include "network/ingress.h"

namespace sbx::api::e2b {
namespace {

using boost::asio::awaitable;
using nlohmann::json;

// A request for another port of a sandbox (`E2b-Sandbox-Port`, or a Host `<port>-<id>.<domain>`):
// relayed to that port on the sandbox's loopback (api/ingress.h), as E2B's edge proxy does, with
// its answers. Unless the sandbox was made with public ports, it must carry the sandbox's traffic
// token (E2B-Traffic-Access-Token) or its envd token (X-Access-Token): knowing an id is not
// enough.
awaitable<void> ProxyPort(ApiContext& ctx, http::Exchange& ex, int port, std::string id) {
  auto target = network::ValidPort(port) ? FindPortTarget(ctx, id) : std::nullopt;
  if (!target) co_return co_await NotFound502(ex, id);
  const std::string& owner = target->owner.id;
  if (!target->rec.public_ports &&
      !network::IsTrafficToken(ctx.secret, owner, id, ex.Header("E2B-Traffic-Access-Token")) &&
      !ConstantTimeEquals(ex.Header("X-Access-Token"), EnvdToken(ctx.secret, owner, id))) {
    json body = {{"sandboxId", id},
                 {"message",
                  "a valid E2B-Traffic-Access-Token (the sandbox's trafficAccessToken) "
                  "is required to reach its ports"},
                 {"code", 403}};
    co_return co_await ex.RespondJson(403, body);
  }
  // The tenant's API key is never handed to a sandbox (a client may send it out of habit); the
  // sandbox-scoped tokens go through, since a server in the box may check them (envd does).
  std::string head = ex.ForwardHead({"X-API-KEY"});  // not beside co_await: GCC 12 miscompiles it
  Status s = co_await RelayToPort(ctx, ex, *target, port, std::move(head));
  if (!s.ok() && !ex.responded()) {
    json body = {{"sandboxId", id},
                 {"message", "The sandbox is running but port is not open"},
                 {"port", port},
                 {"code", 502}};
    co_await ex.RespondJson(502, body);
  }
}

}  // namespace

void RegisterEnvd(http::Router& r, ApiContext& ctx) {
  auto watches = MakePolledWatches();
  r.Post("/process.Process/{method}", [&ctx](http::Exchange& ex) { return ProcessRpc(ctx, ex); });
  r.Post("/filesystem.Filesystem/{method}",
         [&ctx, watches](http::Exchange& ex) { return FilesystemRpc(ctx, ex, watches); });
  r.Get("/files", [&ctx](http::Exchange& ex) { return Download(ctx, ex); });
  r.Post(
      "/files", [&ctx](http::Exchange& ex) { return Upload(ctx, ex); },
      http::RouteOptions{kUploadLimit});
  r.Get("/health", [&ctx](http::Exchange& ex) -> awaitable<void> {
    auto t = co_await Resolve(ctx, ex, Auth::kNone);
    if (!t) co_return;
    co_await ex.Respond(204, "");
  });
}

}  // namespace sbx::api::e2b

namespace sbx::api {

void RegisterE2b(http::Router& router, ApiContext& ctx) {
  e2b::RegisterControlPlane(router, ctx);
  auto envd = std::make_shared<http::Router>();
  e2b::RegisterEnvd(*envd, ctx);
  // envd shares the control plane's port: requests addressed to a sandbox go to envd's routes,
  // or, for another port of the sandbox, through to that port.
  router.SetBefore([envd, &ctx](http::Exchange& ex) -> boost::asio::awaitable<bool> {
    bool presigned = ex.path() == "/files" && ex.query().Has("signature");
    auto address = e2b::EnvdAddress(ex);
    if (!presigned && !address) co_return true;
    if (address && address->first != e2b::kEnvdPort) {
      co_await e2b::ProxyPort(ctx, ex, address->first, address->second);
      co_return false;
    }
    co_await envd->Dispatch(ex);
    co_return false;
  });
}

}  // namespace sbx::api
