// The Connect protocol as envd speaks it (JSON codec; unary, and server streams of envelopes), and
// the request helpers every envd service shares.
// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include "api/e2b/envd_internal.h"
#include "api/http/json.h"

namespace sbx::api::e2b {

namespace asio = boost::asio;
using asio::awaitable;
using nlohmann::json;

awaitable<void> RpcError(http::Exchange& ex, const std::string& code, const std::string& message) {
  json body = {{"code", code}, {"message", WithoutHostPaths(message)}};
  co_await ex.RespondJson(ConnectHttpStatus(code), body);
}

awaitable<bool> SendMessage(http::Exchange& ex, const json& msg) {
  std::string env = Envelope(0, http::JsonText(msg));
  Status s = co_await ex.WriteChunk(env);
  co_return s.ok();
}

// Ends a server stream: the end-stream envelope (with an error when `code` is set). Starts the
// stream first if needed, since Connect streams report errors in-band with HTTP 200.
awaitable<void> EndRpcStream(http::Exchange& ex, const std::string& code,
                             const std::string& message) {
  if (!ex.responded()) {
    Status s = co_await ex.BeginStream(200, "application/connect+json");
    if (!s.ok()) co_return;
  }
  json end = json::object();
  if (!code.empty()) end["error"] = {{"code", code}, {"message", WithoutHostPaths(message)}};
  std::string env = Envelope(2, http::JsonText(end));
  (void)co_await ex.WriteChunk(env);
  (void)co_await ex.EndStream();
}

std::chrono::milliseconds KeepaliveInterval(const http::Exchange& ex) {
  int s = std::atoi(std::string(ex.Header("Keepalive-Ping-Interval")).c_str());
  if (s <= 0 || s > 3600) s = 90;
  return std::chrono::seconds(s);
}

int64_t ConnectTimeoutMs(const http::Exchange& ex) {
  std::string_view v = ex.Header("Connect-Timeout-Ms");
  if (v.empty()) return 0;
  // At most a year: a deadline of now + LLONG_MAX ms would overflow the clock's nanoseconds.
  constexpr int64_t kMaxMs = int64_t{366} * 24 * 3600 * 1000;
  return std::clamp<int64_t>(std::strtoll(std::string(v).c_str(), nullptr, 10), 0, kMaxMs);
}

// An integer request field from `min` to `max`, `def` when absent or null; 400 naming the field
// and the range for anything else (a string, 1.5, 1e300), where json::value() would throw.
Result<int64_t> IntIn(const json& j, const char* field, int64_t def, int64_t min, int64_t max) {
  if (!j.is_object() || !j.contains(field) || j[field].is_null()) return def;
  const json& v = j[field];
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(max)) ||
      v.get<int64_t>() < min || v.get<int64_t>() > max)
    return Status::Error(std::string(field) + ": a whole number from " + std::to_string(min) +
                             " to " + std::to_string(max) + " (got " + http::JsonSnippet(v) + ")",
                         EINVAL);
  return v.get<int64_t>();
}

// ---- users ----

awaitable<Result<User>> EnvdUser(sandbox::Session& s, std::string name) {
  if (name.empty()) {
    if (!s.record().defaults.user.empty()) co_return co_await s.ResolveUser("");
    if (auto u = co_await s.ResolveUser("user"); u.ok() || u.status().err() != ENOENT) co_return u;
    name = "root";
  }
  auto u = co_await s.ResolveUser(name);
  if (!u.ok() && (u.status().err() == ENOENT || u.status().err() == EINVAL))
    co_return Status::Error("invalid username: '" + name + "'", EACCES);
  co_return u;
}

awaitable<std::optional<json>> ReadRequest(http::Exchange& ex, bool streaming) {
  auto body = co_await ex.ReadBody();
  if (!body.ok()) {
    if (!ex.responded()) co_await RpcError(ex, "invalid_argument", body.status().message());
    co_return std::nullopt;
  }
  if (streaming) {
    auto j = ParseEnvelopeJson(*body);
    if (!j.ok()) {
      co_await EndRpcStream(ex, "invalid_argument", j.status().message());
      co_return std::nullopt;
    }
    co_return *j;
  }
  json req = body->empty() ? json::object() : http::ParseJsonBody(*body);
  if (req.is_discarded() || !req.is_object()) {
    co_await RpcError(ex, "invalid_argument", "request body: not a JSON object");
    co_return std::nullopt;
  }
  co_return req;
}

awaitable<void> RespondUnary(http::Exchange& ex, const Result<json>& out) {
  if (!out.ok()) {
    int err = out.status().err();
    std::string code = err == ENOSYS ? "unimplemented" : ConnectCode(err);
    co_return co_await RpcError(ex, code, out.status().message());
  }
  co_await ex.RespondJson(200, *out);
}

}  // namespace sbx::api::e2b
