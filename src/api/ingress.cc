#include "api/ingress.h"

#include <strings.h>

#include <boost/asio/awaitable.hpp>
#include <chrono>

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

// `target` without the signed URL's own parameters: they are for sbx, not for the box.
std::string WithoutSignature(const std::string& target) {
  size_t q = target.find('?');
  if (q == std::string::npos) return target;
  std::string out = target.substr(0, q), sep = "?";
  std::string_view rest = std::string_view(target).substr(q + 1);
  while (!rest.empty()) {
    size_t amp = rest.find('&');
    std::string_view param = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    std::string_view name = param.substr(0, param.find('='));
    if (name == network::kPortUrlExpires || name == network::kPortUrlSignature) continue;
    out += sep;
    out += param;
    sep = "&";
  }
  return out;
}

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
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
  } else if (auto signature = ex.query().Get(network::kPortUrlSignature);
             signature && (!target || !target->rec.public_ports)) {
    // A signed URL (POST .../ports/{port}/url): it opens this port of this sandbox until it
    // expires. Expired and forged get different answers: only the first is worth a new URL.
    // One answer for a sandbox that does not run and a signature that is not its (another
    // sandbox's URL with this id put in): a URL does not tell which ids exist.
    std::string invalid = "the signed URL's signature is not valid for port " +
                          std::to_string(port) + " of a running sandbox " + id;
    if (!target) co_return co_await ex.RespondError(403, "permission_denied", invalid);
    auto check = network::VerifyPortUrl(ctx.secret, target->owner.id, id, port,
                                        ex.query().Get(network::kPortUrlExpires).value_or(""),
                                        *signature, UnixNow());
    if (check == network::PortUrlCheck::kExpired)
      co_return co_await ex.RespondError(
          403, "permission_denied",
          "the signed URL has expired; ask for a new one (sbx port-url " + id + " " +
              std::to_string(port) + ")");
    if (check != network::PortUrlCheck::kValid)
      co_return co_await ex.RespondError(403, "permission_denied", invalid);
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
  head = WithTarget(head, WithoutSignature(TargetAfter(ex.target(), 5)));
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
  auto owned = ctx.manager.OwnedBy(id, /*auto_resumable=*/true);
  if (!owned.ok() || !*owned) return std::nullopt;
  return PortTarget{std::move((*owned)->owner), std::move((*owned)->record)};
}

awaitable<Status> RelayToPort(ApiContext& ctx, http::Exchange& ex, const PortTarget& target,
                              int port, std::string head) {
  if (!network::ValidPort(port)) co_return Status::Error("port " + std::to_string(port), EINVAL);
  // A sandbox paused to be resumed by requests: this one, whose right to the port was checked.
  if (target.rec.state == sandbox::kStatePaused) {
    auto resumed = co_await http::OnPool(
        ctx.blocking, [&] { return ctx.manager.AutoResume(target.owner, target.rec.id); });
    if (!resumed.ok()) co_return resumed.status();
  }
  // Making a socket in the box's network namespace waits on the kernel: off the I/O thread.
  auto socket = co_await http::OnPool(
      ctx.blocking, [&] { return ctx.manager.TcpSocket(target.owner, target.rec.id, port); });
  if (!socket.ok()) co_return socket.status();
  // E2B's maskRequestHost: the box sees this Host (with ${PORT} replaced), not the client's.
  if (!target.rec.mask_request_host.empty()) {
    std::string host = target.rec.mask_request_host;
    for (size_t at; (at = host.find("${PORT}")) != std::string::npos;)
      host.replace(at, 7, std::to_string(port));
    head = WithHost(head, host);
  }
  const sockaddr_in to = network::BoxLoopback(port);
  co_return co_await ex.Relay(std::move(socket->fd), socket->connected ? nullptr : &to,
                              std::move(head));
}

std::string WithTarget(const std::string& head, std::string_view target) {
  size_t space = head.find(' ');
  size_t version = head.find(" HTTP/1.1\r\n");
  if (space == std::string::npos || version == std::string::npos || version < space) return head;
  return head.substr(0, space + 1) + std::string(target) + head.substr(version);
}

std::string WithHost(const std::string& head, std::string_view host) {
  // Every Host field goes (a client may send two); one with `host` follows the request line.
  size_t line_end = head.find("\r\n");
  if (line_end == std::string::npos) return head;
  std::string out = head.substr(0, line_end + 2);
  out += "Host: ";
  out += host;
  out += "\r\n";
  size_t pos = line_end + 2;
  while (pos < head.size()) {
    size_t end = head.find("\r\n", pos);
    if (end == std::string::npos) end = head.size();
    std::string_view field = std::string_view(head).substr(pos, end - pos);
    bool is_host = field.size() >= 5 && strncasecmp(field.data(), "host:", 5) == 0;
    if (!is_host) {
      out += field;
      if (end < head.size()) out += "\r\n";
    }
    pos = end + 2;
  }
  return out;
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
