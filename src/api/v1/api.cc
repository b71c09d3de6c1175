// RegisterV1 and what the route files of the native API share (internal.h): the error answer,
// API key authentication and the session of the sandbox a request names. The routes are in
// sandboxes.cc, network.cc, commands.cc, files.cc, archives.cc, audit.cc and health.cc.
#include "api/v1/api.h"

#include <spdlog/spdlog.h>

#include <string>

#include "api/errors.h"
#include "api/http/exchange.h"
#include "api/ingress.h"
#include "api/v1/internal.h"
#include "common/encoding.h"

namespace sbx::api::v1 {

std::string IsoTime(int64_t ms) { return Rfc3339Millis(ms); }

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
    auto key = VerifyKey(ctx.manager, *ctx.denials, ex, secret);
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

awaitable<std::shared_ptr<sandbox::Session>> SessionOrFail(ApiContext& ctx, http::Exchange& ex,
                                                           const sandbox::ApiKeyRecord& key) {
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
  Network(router, ctx);
  Commands(router, ctx);
  Files(router, ctx);
  Archives(router, ctx);
  Audit(router, ctx);
  Secrets(router, ctx);
  Templates(router, ctx);
  Pools(router, ctx);
  Cleanups(router, ctx);
  RegisterPortRoutes(router, ctx);  // api/ingress.h
}

}  // namespace sbx::api
