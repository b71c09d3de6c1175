#include "api/ingress.h"

#include <boost/asio/awaitable.hpp>

#include "api/auth.h"
#include "api/context.h"
#include "api/http/pool.h"
#include "network/ingress.h"

namespace sbx::api {
namespace {

namespace asio = boost::asio;
using asio::awaitable;

// The raw request-target after the first `segments` path segments: "/v1/sandboxes/X/ports/80/a?b"
// with 5 is "/a?b"; "/" when nothing follows them.
std::string TargetAfter(std::string_view target, int segments) {
  size_t pos = 0;
  for (int i = 0; i < segments; ++i) {
    size_t next = target.find_first_of("/?", pos + 1);
    if (next == std::string_view::npos || target[next] == '?') {
      pos = next;
      break;
    }
    pos = next;
  }
  if (pos == std::string_view::npos) return "/";
  std::string_view rest = target.substr(pos);
  if (rest.empty() || rest[0] == '?') return "/" + std::string(rest);
  return std::string(rest);
}

awaitable<void> RelayPort(ApiContext& ctx, http::Exchange& ex) {
  ctx.metrics.requests++;
  const std::string& id = ex.Param("id");
  int port = network::ParsePort(ex.Param("port"));
  if (!network::ValidPort(port))
    co_return co_await ex.RespondError(
        400, "bad_request",
        "port: a whole number from 1 to 65535 (got '" + ex.Param("port").substr(0, 16) + "')");
  // The API key, as every /v1 route takes it.
  std::string key_secret(ex.Header("X-API-Key"));
  bool key_in_authorization = false;
  std::string_view authorization = ex.Header("Authorization");
  if (key_secret.empty() && authorization.size() > 7 &&
      (authorization.substr(0, 7) == "Bearer " || authorization.substr(0, 7) == "bearer ")) {
    key_secret = std::string(authorization.substr(7));
    key_in_authorization = true;
  }
  std::optional<sandbox::ApiKeyRecord> key;
  if (!key_secret.empty()) {
    auto k = VerifyKey(ctx.manager, *ctx.denials, ex, key_secret);
    if (!k.ok()) co_return co_await ex.RespondError(500, "internal", "the store failed");
    if (!*k)
      co_return co_await ex.RespondError(401, "unauthenticated", "unknown or revoked API key");
    key = **k;
  }
  auto target = FindPortTarget(ctx, id);
  if (key) {
    // Another key's sandbox is as unknown as one that does not exist, and audited as
    // sandbox.access_denied (docs/api.md, "Tenants"): the manager's owner check says so.
    if (!target || key->id != target->owner.id) {
      auto owned = co_await http::OnPool(ctx.blocking, [&] { return ctx.manager.Get(*key, id); });
      if (!owned.ok() || !target) {
        // Built before the co_await: GCC 12 destroys a conditional's temporary twice in one.
        std::string why = owned.ok() ? "no sandbox '" + id + "'" : owned.status().what();
        co_return co_await ex.RespondError(404, "not_found", why);
      }
    }
  } else if (!target || !target->rec.public_ports) {
    // Without a key nothing tells whether the sandbox exists: no proof is 401, a token that is not
    // a running sandbox's is 403.
    std::string_view token = ex.Header("E2B-Traffic-Access-Token");
    if (token.empty())
      co_return co_await ex.RespondError(
          401, "unauthenticated",
          "an API key (Authorization: Bearer <key>) or the sandbox's traffic token "
          "(E2B-Traffic-Access-Token) is required");
    if (!target || !network::IsTrafficToken(ctx.secret, target->owner.id, id, token))
      co_return co_await ex.RespondError(
          403, "permission_denied",
          "E2B-Traffic-Access-Token is not the token of a running sandbox " + id);
  }
  // The API key is never handed to a sandbox; an Authorization that carried something else is
  // the application's own and goes through.
  std::string head = key_in_authorization ? ex.ForwardHead({"X-API-Key", "Authorization"})
                                          : ex.ForwardHead({"X-API-Key"});
  head = WithTarget(head, TargetAfter(ex.target(), 5));
  Status s = co_await RelayToPort(ctx, ex, *target, port, std::move(head));
  if (!s.ok() && !ex.responded())
    co_await ex.RespondError(
        502, "bad_gateway",
        "nothing is listening on port " + std::to_string(port) + " of sandbox " + id);
}

}  // namespace

std::optional<PortTarget> FindPortTarget(ApiContext& ctx, const std::string& id) {
  // Trusted lookup: the caller proves ownership (the owner's key, its traffic token) or the
  // sandbox has public ports.
  auto owned = ctx.manager.OwnedBy(id);
  if (!owned.ok() || !*owned) return std::nullopt;
  return PortTarget{std::move((*owned)->owner), std::move((*owned)->record)};
}

awaitable<Status> RelayToPort(ApiContext& ctx, http::Exchange& ex, const PortTarget& target,
                              int port, std::string head) {
  if (!network::ValidPort(port)) co_return Status::Error("port " + std::to_string(port), EINVAL);
  // Making a socket in the box's network namespace waits on the kernel: off the I/O thread.
  auto socket = co_await http::OnPool(
      ctx.blocking, [&] { return ctx.manager.TcpSocket(target.owner, target.rec.id); });
  if (!socket.ok()) co_return socket.status();
  co_return co_await ex.Relay(std::move(*socket), network::BoxLoopback(port), std::move(head));
}

std::string WithTarget(const std::string& head, std::string_view target) {
  size_t space = head.find(' ');
  size_t version = head.find(" HTTP/1.1\r\n");
  if (space == std::string::npos || version == std::string::npos || version < space) return head;
  return head.substr(0, space + 1) + std::string(target) + head.substr(version);
}

void RegisterPortRoutes(http::Router& router, ApiContext& ctx) {
  for (const char* method : {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}) {
    // {path...} matches no segment too: /ports/8000 reaches "/".
    router.Handle(
        method, "/v1/sandboxes/{id}/ports/{port}/{path...}",
        [&ctx](http::Exchange& ex) { return RelayPort(ctx, ex); },
        // The body is relayed as it arrives, never read whole.
        http::RouteOptions{0});
  }
}

}  // namespace sbx::api
