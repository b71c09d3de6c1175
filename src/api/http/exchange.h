// Exchange: one HTTP request and its response, as seen by a handler. The server builds it after
// the request header has arrived; the handler reads the body (whole or streamed), then answers
// with a fixed body, a streamed body, or a WebSocket upgrade.
//
// Every error response of the API has one JSON shape (docs/api.md copies it):
//
//   {"error": {"code": "not_found", "message": "no route for GET /v1/nope"}}
//
// `code` is a stable snake_case token for programs, `message` is for humans. Codes used by the
// server itself: bad_request (400), not_found (404), method_not_allowed (405), request_timeout
// (408), payload_too_large (413), uri_too_long (414), header_too_large (431), internal (500),
// not_implemented (501), unavailable (503).
//
// Threading: an Exchange lives on its connection's strand (`executor()`); call its methods only
// from coroutines running there (the handler itself, or ones it co_spawns on `executor()`), one
// at a time. It is valid until the handler returns.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/system/error_code.hpp>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "api/http/json.h"
#include "api/http/router.h"
#include "api/http/url.h"
#include "common/fd.h"
#include "common/status.h"

struct sockaddr_in;

namespace sbx::http {

class Connection;
class WebSocket;
struct WebSocketOptions;

using Headers = std::vector<std::pair<std::string, std::string>>;

// {"error":{"code":code,"message":message}}
nlohmann::json ErrorJson(std::string_view code, std::string_view message);

// The body RespondError writes, chosen per request by the router (Router::SetErrorShape): sbx's
// own {"error":{"code":"not_found","message":...}} (the native /v1 API), or E2B's
// {"code":404,"message":...}, which the E2B SDKs read (they print `code` and `message`).
enum class ErrorShape { kNative, kE2b };

class Exchange {
 public:
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;
  ~Exchange();

  // ---- Request ----
  std::string_view method() const;  // "GET"
  std::string_view target() const;  // raw request-target, "/v1/x?y=1"
  std::string_view path() const;    // raw path without the query, still percent-encoded
  // First value of header `name` (case-insensitive), "" when absent.
  std::string_view Header(std::string_view name) const;
  bool HasHeader(std::string_view name) const;
  // Every header whose name starts with `prefix` (case-insensitive), as (name, value) in request
  // order; names as the client spelled them.
  std::vector<std::pair<std::string, std::string>> HeadersWithPrefix(std::string_view prefix) const;
  const PathParams& params() const { return params_; }
  const std::string& Param(std::string_view name) const { return params_.Get(name); }
  const Query& query() const { return query_; }
  // Declared body length; nullopt for a chunked body (length unknown until the end).
  std::optional<uint64_t> content_length() const;
  std::string_view remote() const;          // "127.0.0.1:5555" or "unix"
  std::string_view remote_address() const;  // "127.0.0.1" (no port) or "unix"
  // The connection's strand: co_spawn helpers here to touch the Exchange or its WebSocket.
  boost::asio::any_io_executor executor() const;
  // True once Server::Stop() began: long handlers may wind down early.
  bool stopping() const;

  // ---- Request body ----
  // Reads the whole body, at most `limit` bytes (default: the route's body_limit). Over the limit
  // it answers 413 payload_too_large itself and returns an error; check responded().
  boost::asio::awaitable<Result<std::string>> ReadBody();
  boost::asio::awaitable<Result<std::string>> ReadBody(size_t limit);
  // ReadBody() then JSON parsing; on a bad body it has already answered 413 or 400 bad_request.
  boost::asio::awaitable<Result<nlohmann::json>> ReadJson();
  // Streams the body: fills up to `n` bytes of `buf`, returns how many, 0 at the end. Works for
  // Content-Length and chunked bodies; sends "100 Continue" first when the client asked for it.
  // An error means the client is gone, or the body is malformed (bad chunk framing: answered 400
  // here), or too slow (a stall past body_read_timeout or under min_body_rate: answered 408 here
  // when no response was started); the connection is closed after the exchange either way.
  boost::asio::awaitable<Result<size_t>> ReadSome(char* buf, size_t n);
  // For a body that is a long-lived stream of messages which may pause (stdin, a client stream):
  // exempts it from min_body_rate; body_read_timeout still applies. Call once authenticated.
  void AllowSlowBody() { slow_body_ok_ = true; }

  // ---- Fixed response ----
  // Write failures are not reported: the connection is simply closed and logged.
  boost::asio::awaitable<void> Respond(int status, std::string body,
                                       std::string_view content_type = "text/plain; charset=utf-8",
                                       const Headers& headers = {});
  boost::asio::awaitable<void> RespondJson(int status, const nlohmann::json& body,
                                           const Headers& headers = {});
  // An error in this request's ErrorShape (`code` is dropped in E2B's, which has the status).
  boost::asio::awaitable<void> RespondError(int status, std::string_view code,
                                            std::string_view message, const Headers& headers = {});
  void set_error_shape(ErrorShape shape) { error_shape_ = shape; }
  ErrorShape error_shape() const { return error_shape_; }

  // ---- Streamed response ----
  // Sends the header. With `content_length` the body is sent raw and must be exactly that long
  // (file downloads); without, it uses chunked encoding (NDJSON, tar streams). `hold_header`:
  // the header waits for the first chunk (or the end) and goes in its write, for a stream whose
  // first piece follows at once (a command's start event): one write and one wake-up of the
  // client instead of two.
  boost::asio::awaitable<Status> BeginStream(int status, std::string_view content_type,
                                             const Headers& headers = {},
                                             std::optional<uint64_t> content_length = {},
                                             bool hold_header = false);
  // Writes one piece and returns once the socket took it, so a slow client slows the producer.
  // Returns an error when the client went away, stalled past write_timeout, or the server is
  // stopping: the producer must stop then. Empty `data` is a no-op.
  boost::asio::awaitable<Status> WriteChunk(std::string_view data);
  // The same for a piece in two parts (a frame's header and its payload) sent as one chunk in
  // one write, without joining them first.
  boost::asio::awaitable<Status> WriteChunk(std::string_view head, std::string_view data);
  // Terminates the body. A stream the handler never ends is treated as aborted: the connection
  // is closed so the client sees a truncated transfer rather than a clean end.
  boost::asio::awaitable<Status> EndStream();
  // A last chunk (`head` then `data`) and the end of the body in one write (a command's exit
  // event): the client is woken once, with all of it.
  boost::asio::awaitable<Status> EndStream(std::string_view head, std::string_view data);

  // ---- Relay (reverse proxy) ----
  // The request header as it should reach another server: request line and fields without the
  // hop-by-hop ones and those named in `drop` (case-insensitive), and "Connection: close" (or the
  // upgrade it asked for).
  std::string ForwardHead(std::initializer_list<std::string_view> drop = {}) const;
  // Connects `socket` (a non-blocking TCP socket) to `address`; an error then means nothing was
  // sent to the client, so the caller still answers. Once connected, sends `head` and then the
  // client's raw bytes upstream and the upstream's bytes back unchanged, until the upstream
  // closes (a WebSocket upgrade passes through too); the connection closes after. `address`
  // null: `socket` is a stream connected already (any family), used as it is.
  boost::asio::awaitable<Status> Relay(UniqueFd socket, const sockaddr_in* address,
                                       std::string head);

  // ---- WebSocket ----
  bool WantsWebSocket() const;
  // Completes the upgrade handshake (101). The WebSocket keeps the connection alive and must not
  // outlive the Server. On failure the connection is closed.
  boost::asio::awaitable<Result<std::unique_ptr<WebSocket>>> AcceptWebSocket();
  boost::asio::awaitable<Result<std::unique_ptr<WebSocket>>> AcceptWebSocket(
      const WebSocketOptions& options);

  // True once a response, a stream header or an upgrade has been sent (or attempted).
  bool responded() const { return state_ != State::kNone; }
  int status() const { return status_; }

 private:
  friend class Connection;
  friend class Router;
  enum class State { kNone, kResponded, kStreaming, kStreamEnded, kUpgraded };

  explicit Exchange(Connection& conn);
  void SetRoute(PathParams params, const RouteOptions& options) {
    params_ = std::move(params);
    body_limit_ = options.body_limit;
  }
  boost::asio::awaitable<Status> SendContinueIfExpected();
  // A failed body read: answers 400 (framing) or 408 (too slow) when it still can.
  boost::asio::awaitable<Status> BodyReadFailed(boost::system::error_code ec);

  Connection& conn_;
  PathParams params_;
  Query query_;
  size_t body_limit_;
  State state_ = State::kNone;
  int status_ = 0;
  bool continue_sent_ = false;
  bool slow_body_ok_ = false;
  ErrorShape error_shape_ = ErrorShape::kNative;
  std::optional<uint64_t> stream_length_;  // for a fixed-length stream: bytes still owed
  std::string held_header_;                // BeginStream's hold_header: not sent yet
  // Writes `body` (a buffer sequence), after the header BeginStream held if it holds one still.
  template <typename Buffers>
  boost::asio::awaitable<Status> SendBody(const Buffers& body, const char* what);
  void StreamEnded();  // the body's end is written: the connection may read the next request
  // Time spent waiting for the client's body, not the handler's own: what min_body_rate judges.
  std::chrono::steady_clock::duration body_wait_{};
};

}  // namespace sbx::http
