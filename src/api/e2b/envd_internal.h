// What the envd files share (envd.cc routes; envd_auth.cc finds and authenticates the sandbox;
// envd_connect.cc holds the Connect protocol helpers; envd_process.cc, envd_filesystem.cc and
// envd_files.cc translate process.Process, filesystem.Filesystem and /files). Not for the control
// plane: it shares only internal.h.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "api/e2b/internal.h"
#include "api/e2b/wire.h"
#include "api/http/exchange.h"
#include "sandbox/session.h"

namespace sbx::api::e2b {

// ---- auth (envd_auth.cc) ----

// The sandbox and port a request is addressed to, if it is an envd request at all: the
// `E2b-Sandbox-Id` (+ `E2b-Sandbox-Port`) headers, or a Host `<port>-<id>.<domain>`.
std::optional<std::pair<int, std::string>> EnvdAddress(const http::Exchange& ex);

// {"code": status, "message": message}, envd's own error shape outside Connect.
boost::asio::awaitable<void> JsonError(http::Exchange& ex, int status, const std::string& message);
// What the edge proxy answers for a sandbox (or port) that is not there: the SDK reads 502 as
// "the sandbox is gone".
boost::asio::awaitable<void> NotFound502(http::Exchange& ex, const std::string& id);

// The sandbox an envd request works on, its owner's key and its envd access token.
struct Target {
  sandbox::ApiKeyRecord key;
  sandbox::SandboxRecord rec;
  std::string token;
  // The sandbox's session (sandbox/session.h), every route's only way into the box; null for
  // Auth::kNone, and when it could not be opened (`unavailable` says why, without host paths).
  std::shared_ptr<sandbox::Session> session;
  std::string unavailable;
};

// What a route takes as proof: nothing (/health), the X-Access-Token, or (for /files) the token
// or a URL signature for operation `op` ("read", "write").
enum class Auth { kNone, kToken, kTokenOrSignature };

// Finds the sandbox of an envd request and checks its access token (or URL signature). Answers
// 502/401 itself and returns nullopt when the request cannot go on.
boost::asio::awaitable<std::optional<Target>> Resolve(ApiContext& ctx, http::Exchange& ex,
                                                      Auth auth, std::string_view op = {});

// Whether a stream's end `s` (a ProcessEvent's or a watch's error) is its sandbox's end
// (Session::Ended): the response is then cut off without an end, as E2B's edge does.
inline bool SandboxEnded(const Status& s) { return s.err() == ENOENT; }
// Whether `s` is a lost agent connection (the sandbox lives on).
inline bool ConnectionLost(const Status& s) {
  int e = s.err();
  return e == ECONNRESET || e == EPROTO || e == ECANCELED || e == EPIPE;
}
// The message for a failed Manager::Channel(): its state ("sandbox X is paused") as it says, a
// failed connection without the agent socket's host path.
std::string ChannelFailure(const Status& s, const std::string& id);

// ---- Connect helpers (envd_connect.cc) ----

// Every message these send goes through WithoutHostPaths (wire.h).
// A unary RPC's error: {"code", "message"} with the code's HTTP status.
boost::asio::awaitable<void> RpcError(http::Exchange& ex, const std::string& code,
                                      const std::string& message);
// One message envelope of a server stream; false once the client is gone.
boost::asio::awaitable<bool> SendMessage(http::Exchange& ex, const nlohmann::json& msg);
// Ends a server stream: the end-stream envelope (with an error when `code` is set). Starts the
// stream first if needed, since Connect streams report errors in-band with HTTP 200.
boost::asio::awaitable<void> EndRpcStream(http::Exchange& ex, const std::string& code = "",
                                          const std::string& message = "");
// The client's Keepalive-Ping-Interval (90 s when absent or absurd).
std::chrono::milliseconds KeepaliveInterval(const http::Exchange& ex);
// Connect-Timeout-Ms, 0 when absent; at most a year.
int64_t ConnectTimeoutMs(const http::Exchange& ex);

// A terminal's rows or columns (as the native API).
inline constexpr int64_t kMaxPtySide = 1000;
// An integer request field from `min` to `max`, `def` when absent or null; EINVAL naming the
// field and the range for anything else (a string, 1.5, 1e300), where json::value() would throw.
Result<int64_t> IntIn(const nlohmann::json& j, const char* field, int64_t def, int64_t min,
                      int64_t max);

using sandbox::User;
// The user `name` inside the sandbox ("" = envd's default user: the template's, else `user` when
// the box has one, else root). EACCES "invalid username" for a user the box does not have.
boost::asio::awaitable<Result<User>> EnvdUser(sandbox::Session& s, std::string name);

// A request's body as the JSON request message: the first envelope of a streaming RPC, the body
// of a unary one. Answers the error itself (in-band for a stream) and returns nullopt when the
// body is not one.
boost::asio::awaitable<std::optional<nlohmann::json>> ReadRequest(http::Exchange& ex,
                                                                  bool streaming);
// A unary RPC's answer: the message, or the Connect error for its status (ENOSYS:
// "unimplemented").
boost::asio::awaitable<void> RespondUnary(http::Exchange& ex, const Result<nlohmann::json>& out);

// ---- the services (envd_process.cc, envd_filesystem.cc, envd_files.cc) ----

// POST /process.Process/{method}.
boost::asio::awaitable<void> ProcessRpc(ApiContext& ctx, http::Exchange& ex);

// The polled watchers of Python's sync SDK (CreateWatcher...), kept across requests.
class PolledWatches;
std::shared_ptr<PolledWatches> MakePolledWatches();
// POST /filesystem.Filesystem/{method}.
boost::asio::awaitable<void> FilesystemRpc(ApiContext& ctx, http::Exchange& ex,
                                           std::shared_ptr<PolledWatches> watches);

// Uploads stream into the box (bounded by its disk, not by the daemon's memory).
inline constexpr size_t kUploadLimit = size_t{1} << 40;
// GET and POST /files.
boost::asio::awaitable<void> Download(ApiContext& ctx, http::Exchange& ex);
boost::asio::awaitable<void> Upload(ApiContext& ctx, http::Exchange& ex);

}  // namespace sbx::api::e2b
