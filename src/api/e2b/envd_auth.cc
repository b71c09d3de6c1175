// envd's door: which sandbox a request is for (headers or Host), and whether it may use it (the
// sandbox's envd access token, or a pre-signed /files URL's signature).
// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include <map>

#include "api/e2b/envd_internal.h"

namespace sbx::api::e2b {
namespace {

using boost::asio::awaitable;
using nlohmann::json;

bool ValidSignature(const http::Exchange& ex, const std::string& token, std::string_view op) {
  auto sig = ex.query().Get("signature");
  if (!sig) return false;
  std::optional<int64_t> expiry;
  if (auto e = ex.query().Get("signature_expiration"); e && !e->empty()) {
    expiry = std::strtoll(e->c_str(), nullptr, 10);
    if (*expiry * 1000 < store::NowMs()) return false;
  }
  std::string want = FileSignature(ex.query().Get("path").value_or(""), op,
                                   ex.query().Get("username").value_or(""), token, expiry);
  return ConstantTimeEquals(*sig, want);
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
  json body = {{"code", status}, {"message", message}};
  co_await ex.RespondJson(status, body);
}

awaitable<void> NotFound502(http::Exchange& ex, const std::string& id) {
  json body = {{"sandboxId", id}, {"message", "The sandbox was not found"}, {"code", 502}};
  co_await ex.RespondJson(502, body);
}

awaitable<std::optional<Target>> Resolve(ApiContext& ctx, http::Exchange& ex, Auth auth,
                                         std::string_view op) {
  auto addr = EnvdAddress(ex);
  if (!addr && auth == Auth::kTokenOrSignature) {
    // A pre-signed URL built on E2B_SANDBOX_URL names no sandbox (spec 3.2: it is
    // `<sandbox url>/files?path=...&signature=...`): the sandbox is the one whose token made the
    // signature.
    auto live = ctx.store.ListLiveSandboxes();
    if (live.ok()) {
      std::map<std::string, std::optional<store::ApiKeyRecord>> keys;
      for (const auto& rec : *live) {
        if (rec.state != store::kStateRunning) continue;
        if (!keys.count(rec.owner_key_id)) {
          auto k = ctx.store.GetApiKey(rec.owner_key_id);
          keys[rec.owner_key_id] =
              (k.ok() && *k && (*k)->active()) ? **k : std::optional<store::ApiKeyRecord>();
        }
        const auto& key = keys[rec.owner_key_id];
        if (key && ValidSignature(ex, EnvdToken(ctx.secret, rec.owner_key_id, rec.id), op)) {
          addr = std::make_pair(kEnvdPort, rec.id);
          break;
        }
      }
    }
  }
  if (!addr && auth == Auth::kTokenOrSignature) {
    co_await JsonError(ex, 401, "invalid or expired signature");
    co_return std::nullopt;
  }
  std::string id = addr ? addr->second : "";
  if (!addr || addr->first != kEnvdPort) {
    co_await NotFound502(ex, id);
    co_return std::nullopt;
  }
  auto rec = ctx.store.GetSandbox(id);
  if (!rec.ok() || !*rec ||
      ((*rec)->state != store::kStateRunning && (*rec)->state != store::kStateCreating)) {
    co_await NotFound502(ex, id);
    co_return std::nullopt;
  }
  auto key = ctx.store.GetApiKey((*rec)->owner_key_id);
  if (!key.ok() || !*key || !(*key)->active()) {
    co_await NotFound502(ex, id);
    co_return std::nullopt;
  }
  Target t{**key, **rec, EnvdToken(ctx.secret, (*key)->id, id)};
  bool ok = auth == Auth::kNone || ConstantTimeEquals(ex.Header("X-Access-Token"), t.token) ||
            (auth == Auth::kTokenOrSignature && ValidSignature(ex, t.token, op));
  if (!ok) {
    co_await JsonError(ex, 401, "unauthorized access, please provide a valid access token");
    co_return std::nullopt;
  }
  co_return t;
}

}  // namespace sbx::api::e2b
