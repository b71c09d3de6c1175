// envd's door: which sandbox a request is for (headers or Host), and whether it may use it (the
// sandbox's envd access token, or a pre-signed /files URL's signature).
// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include <algorithm>
#include <map>

#include "api/e2b/envd_internal.h"

namespace sbx::api::e2b {
namespace {

using boost::asio::awaitable;
using nlohmann::json;

// What a pre-signed URL's signature says, checked in envd's order (validateSigning): a signature
// that does not match is invalid whatever its expiry; one that matches may have expired.
enum class Signature { kMissing, kInvalid, kExpired, kValid };

Signature CheckSignature(const http::Exchange& ex, const std::string& token, std::string_view op) {
  auto sig = ex.query().Get("signature");
  if (!sig) return Signature::kMissing;
  std::optional<int64_t> expiry;
  if (auto e = ex.query().Get("signature_expiration"); e && !e->empty())
    expiry = std::strtoll(e->c_str(), nullptr, 10);
  std::string want = FileSignature(ex.query().Get("path").value_or(""), op,
                                   ex.query().Get("username").value_or(""), token, expiry);
  if (!ConstantTimeEquals(*sig, want)) return Signature::kInvalid;
  // Seconds, compared as seconds: an absurd expiry must not overflow into the past.
  if (expiry && *expiry < sandbox::NowMs() / 1000) return Signature::kExpired;
  return Signature::kValid;
}

// envd's 401 messages (envd/internal/api/auth.go), word for word: the SDKs show them as they are.
constexpr char kBadToken[] =
    "unauthorized access, please provide a valid access token or method signing if supported";
constexpr char kHeaderTokenMismatch[] = "access token present in header but does not match";
const char* SignatureMessage(Signature s) {
  switch (s) {
    case Signature::kMissing:
      return "missing signature query parameter";
    case Signature::kExpired:
      return "signature is already expired";
    default:
      return "invalid signature";
  }
}

}  // namespace

std::optional<std::pair<int, std::string>> EnvdAddress(const http::Exchange& ex) {
  std::string_view id = ex.Header("E2b-Sandbox-Id");
  if (!id.empty()) {
    std::string_view port = ex.Header("E2b-Sandbox-Port");
    int p = port.empty() ? kEnvdPort : std::atoi(std::string(port).c_str());
    return std::make_pair(p, std::string(id));
  }
  return ParseSandboxHost(ex.Header("Host"));
}

awaitable<void> JsonError(http::Exchange& ex, int status, const std::string& message) {
  json body = {{"code", status}, {"message", WithoutHostPaths(message)}};
  co_await ex.RespondJson(status, body);
}

awaitable<void> NotFound502(http::Exchange& ex, const std::string& id) {
  json body = {{"sandboxId", id}, {"message", "The sandbox was not found"}, {"code", 502}};
  co_await ex.RespondJson(502, body);
}

awaitable<std::optional<Target>> Resolve(ApiContext& ctx, http::Exchange& ex, Auth auth,
                                         std::string_view op) {
  auto addr = EnvdAddress(ex);
  // The best a signature did against any sandbox, for the message when none accepts it.
  Signature best = Signature::kMissing;
  if (!addr && auth == Auth::kTokenOrSignature) {
    // A pre-signed URL built on E2B_SANDBOX_URL names no sandbox (spec 3.2: it is
    // `<sandbox url>/files?path=...&signature=...`): the sandbox is the one whose token made the
    // signature.
    auto live = ctx.manager.LiveRecords();
    if (live.ok()) {
      for (const auto& rec : *live) {
        if (rec.state != sandbox::kStateRunning) continue;
        // The owner key must still be active: OwnedBy answers only then.
        auto owned = ctx.manager.OwnedBy(rec.id);
        if (!owned.ok() || !*owned) continue;
        Signature s = CheckSignature(ex, EnvdToken(ctx.secret, rec.owner_key_id, rec.id), op);
        if (s == Signature::kValid) {
          addr = std::make_pair(kEnvdPort, rec.id);
          break;
        }
        best = std::max(best, s);
      }
    }
    if (!addr) {
      if (best == Signature::kMissing && ex.query().Has("signature")) best = Signature::kInvalid;
      co_await JsonError(ex, 401, SignatureMessage(best));
      co_return std::nullopt;
    }
  }
  std::string id = addr ? addr->second : "";
  if (!addr || addr->first != kEnvdPort) {
    co_await NotFound502(ex, id);
    co_return std::nullopt;
  }
  // A sandbox paused to be resumed by requests (E2B's autoResume) is found too, and resumed
  // below once the request has proven its right to it; a health check proves nothing, so it
  // sees such a sandbox as not running.
  auto owned = ctx.manager.OwnedBy(id, /*auto_resumable=*/auth != Auth::kNone);
  if (!owned.ok() || !*owned) {
    co_await NotFound502(ex, id);
    co_return std::nullopt;
  }
  Target t{(*owned)->owner, (*owned)->record, EnvdToken(ctx.secret, (*owned)->owner.id, id),
           nullptr, ""};
  if (auth == Auth::kNone) co_return t;
  std::string_view header = ex.Header("X-Access-Token");
  if (auth == Auth::kToken && !ConstantTimeEquals(header, t.token)) {
    co_await JsonError(ex, 401, kBadToken);
    co_return std::nullopt;
  }
  if (auth == Auth::kTokenOrSignature) {
    // As envd: a token in the header is the proof, right or wrong; without one, the signature.
    if (!header.empty() && !ConstantTimeEquals(header, t.token)) {
      co_await JsonError(ex, 401, kHeaderTokenMismatch);
      co_return std::nullopt;
    }
    if (header.empty()) {
      Signature s = CheckSignature(ex, t.token, op);
      if (s != Signature::kValid) {
        co_await JsonError(ex, 401, SignatureMessage(s));
        co_return std::nullopt;
      }
    }
  }
  if (t.rec.state == sandbox::kStatePaused) {
    auto resumed =
        co_await http::OnPool(ctx.blocking, [&] { return ctx.manager.AutoResume(t.key, id); });
    if (!resumed.ok()) {
      co_await NotFound502(ex, id);
      co_return std::nullopt;
    }
    t.rec = *resumed;
  }
  auto session = co_await sandbox::Session::Open(ctx.manager, t.key, id, "e2b");
  if (session.ok())
    t.session = std::move(*session);
  else
    t.unavailable = ChannelFailure(session.status(), id);
  co_return t;
}

std::string ChannelFailure(const Status& s, const std::string& id) {
  // Manager::Channel's own messages say what state the sandbox is in; a failed connection names
  // the agent socket, a host path: the client learns only that the agent is not reachable.
  if (s.message().rfind("sandbox " + id + " is ", 0) == 0) return s.message();
  return "sandbox " + id + ": its agent is not reachable";
}

}  // namespace sbx::api::e2b
