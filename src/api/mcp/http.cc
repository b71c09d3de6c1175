// /mcp: MCP's streamable HTTP transport (specification 2025-06-18, "Transports"), on the
// daemon's HTTP server. POST carries one JSON-RPC message (or, for revisions that have them, a
// batch); the answer is application/json, or text/event-stream for a tools/call that asked for
// progress (the stream then carries notifications/progress before the result). GET answers 405:
// this server never sends a message that is not an answer. DELETE ends a session.
//
// Order of checks on every request: Origin (403), the API key (401), then the transport's own
// rules (406, 415, 400 without a session, 404 for an unknown one).
#include <spdlog/spdlog.h>

#include <chrono>
#include <memory>

#include "api/auth.h"
#include "api/http/exchange.h"
#include "api/http/json.h"
#include "api/mcp/jsonrpc.h"
#include "api/mcp/mcp.h"
#include "api/mcp/protocol.h"
#include "api/mcp/sessions.h"
#include "api/mcp/tools.h"

namespace sbx::api {
namespace {

using boost::asio::awaitable;
using mcp::Message;
using nlohmann::json;

// Bodies of write_file calls carry the file: 8 MiB of JSON covers its 4 MiB of base64.
constexpr size_t kBodyLimit = size_t{8} << 20;
// A JSON-RPC code for transport refusals that have no code of their own (the range -32000 to
// -32099 is the implementation's).
constexpr int kTransportError = -32000;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Transport {
  Transport(McpContext& c)
      : ctx(c),
        server(mcp::SandboxServerInfo(), mcp::SandboxTools(c)),
        sessions(c.options.max_sessions, c.options.max_sessions_per_key,
                 c.options.session_idle.count()) {}
  McpContext& ctx;
  const mcp::Server server;
  mcp::Sessions sessions;
};

// The JSON-RPC error a refused HTTP request carries (id null: the request may not even have
// been read).
awaitable<void> Refuse(http::Exchange& ex, int status, std::string message,
                       const http::Headers& headers = {}) {
  json body = mcp::ErrorResponse(nullptr, kTransportError, message);
  co_await ex.Respond(status, http::JsonText(body), "application/json", headers);
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
  return out;
}

// Browsers send Origin; a page served from anywhere but an allowed origin must not drive the
// API through a rebinding DNS name (the key is the main defence; this is the spec's MUST).
bool OriginAllowed(const McpContext& ctx, const http::Exchange& ex) {
  if (!ex.HasHeader("Origin")) return true;
  std::string origin = Lower(ex.Header("Origin"));
  for (const auto& allowed : ctx.options.allowed_origins)
    if (Lower(allowed) == origin) return true;
  return false;
}

// The key a request carries, as the other facades take it: X-API-Key, or Authorization: Bearer.
std::string Secret(const http::Exchange& ex) {
  std::string secret(ex.Header("X-API-Key"));
  std::string_view auth = ex.Header("Authorization");
  if (secret.empty() && auth.size() > 7 && Lower(auth.substr(0, 7)) == "bearer ")
    secret = std::string(auth.substr(7));
  return secret;
}

// The caller's key, or nullopt after answering 401 (or 500 when the store fails).
awaitable<std::optional<sandbox::ApiKeyRecord>> Authenticate(McpContext& ctx, http::Exchange& ex) {
  static const http::Headers kChallenge = {{"WWW-Authenticate", "Bearer realm=\"sbx\""}};
  std::string secret = Secret(ex);
  if (secret.empty()) {
    co_await Refuse(ex, 401, "an API key is required (Authorization: Bearer <key>, or X-API-Key)",
                    kChallenge);
    co_return std::nullopt;
  }
  auto key = VerifyKey(ctx.manager, *ctx.denials, ex, secret);
  if (!key.ok()) {
    spdlog::error("mcp: key check: {}", key.status().message());
    co_await Refuse(ex, 500, "the key could not be checked; see the daemon log");
    co_return std::nullopt;
  }
  if (!*key) {
    co_await Refuse(ex, 401, "unknown or revoked API key", kChallenge);
    co_return std::nullopt;
  }
  co_return **key;
}

// What the client takes, from its Accept header (a missing one, or */*, takes anything).
struct Accepts {
  bool json = false;
  bool sse = false;
};
Accepts ParseAccept(std::string_view accept) {
  if (accept.empty()) return {true, true};
  std::string a = Lower(accept);
  Accepts out;
  out.json = a.find("application/json") != std::string::npos ||
             a.find("application/*") != std::string::npos || a.find("*/*") != std::string::npos;
  out.sse = a.find("text/event-stream") != std::string::npos ||
            a.find("text/*") != std::string::npos || a.find("*/*") != std::string::npos;
  return out;
}

// "http://HOST[:PORT]" as the client addressed the daemon, or "" for a Host that is not a plain
// host name or address (it is the caller's header: it shapes only the caller's own answer).
std::string BaseUrl(const http::Exchange& ex) {
  std::string_view host = ex.Header("Host");
  if (host.empty() || host.size() > 255) return "";
  for (char c : host)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '-' || c == ':' || c == '[' || c == ']'))
      return "";
  return "http://" + std::string(host);
}

std::string SseEvent(const json& message) {
  return "event: message\ndata: " + http::JsonText(message) + "\n\n";
}

awaitable<void> RespondJson(http::Exchange& ex, const json& body, const http::Headers& headers) {
  co_await ex.Respond(200, http::JsonText(body), "application/json", headers);
}

awaitable<void> Post(Transport& t, http::Exchange& ex) {
  McpContext& ctx = t.ctx;
  if (!OriginAllowed(ctx, ex)) co_return co_await Refuse(ex, 403, "this Origin may not use /mcp");
  auto key = co_await Authenticate(ctx, ex);
  if (!key) co_return;
  Accepts accepts = ParseAccept(ex.Header("Accept"));
  if (!accepts.json && !accepts.sse)
    co_return co_await Refuse(ex, 406, "Accept must include application/json or text/event-stream");
  std::string content_type = Lower(ex.Header("Content-Type"));
  if (content_type.rfind("application/json", 0) != 0)
    co_return co_await Refuse(ex, 415, "Content-Type must be application/json");
  auto text = co_await ex.ReadBody();
  if (!text.ok()) {
    if (!ex.responded()) co_await Refuse(ex, 400, text.status().message());
    co_return;
  }
  mcp::Body body = mcp::ParseBody(*text);
  if (body.fatal)
    co_return co_await ex.Respond(400, http::JsonText(*body.fatal), "application/json");

  http::Headers headers;
  // initialize opens a session; it must come alone (the spec forbids it in a batch).
  if (!body.batch && body.items[0].message &&
      body.items[0].message->kind == Message::Kind::kRequest &&
      body.items[0].message->method == "initialize") {
    const Message& m = *body.items[0].message;
    auto init = t.server.Initialize(m.params);
    if (!init.ok())
      co_return co_await RespondJson(
          ex, mcp::ErrorResponse(m.id, mcp::kInvalidParams, init.status().what()), headers);
    std::string id = t.sessions.Create(key->id, init->version, NowMs());
    headers.emplace_back("Mcp-Session-Id", id);
    spdlog::info("mcp: session for key {} speaking {}", key->id, init->version);
    co_return co_await RespondJson(ex, mcp::ResultResponse(m.id, init->result), headers);
  }

  std::string sid(ex.Header("Mcp-Session-Id"));
  if (sid.empty())
    co_return co_await Refuse(ex, 400,
                              "Mcp-Session-Id is required: send initialize first and then the id "
                              "it answered with");
  auto session = t.sessions.Use(sid, key->id, NowMs());
  if (!session)
    co_return co_await Refuse(ex, 404, "no such MCP session (ended or expired): initialize again");
  if (std::string_view v = ex.Header("MCP-Protocol-Version");
      !v.empty() && !mcp::SupportedVersion(v))
    co_return co_await Refuse(ex, 400,
                              "MCP-Protocol-Version " + http::JsonSnippet(std::string(v), 64) +
                                  " is not one this server speaks");
  if (body.batch && !mcp::BatchesAllowed(session->version))
    co_return co_await Refuse(ex, 400,
                              "JSON-RPC batches are not part of protocol revision " +
                                  session->version + ": send one message per request");

  mcp::CallContext call{*key, BaseUrl(ex), nullptr};
  call.progress = [](std::string) -> awaitable<void> { co_return; };

  // A lone tools/call that asked for progress, from a client that reads event streams: the
  // answer streams, so a long command tells the client it is alive (its request timer may be
  // reset by progress) before the result.
  if (!body.batch && accepts.sse && body.items[0].message &&
      body.items[0].message->kind == Message::Kind::kRequest &&
      body.items[0].message->method == "tools/call") {
    const Message& m = *body.items[0].message;
    json token = nullptr;
    if (auto meta = m.params.find("_meta"); meta != m.params.end() && meta->is_object())
      if (auto tok = meta->find("progressToken");
          tok != meta->end() && (tok->is_string() || tok->is_number_integer()))
        token = *tok;
    if (!token.is_null()) {
      headers.emplace_back("Cache-Control", "no-cache");
      if (!(co_await ex.BeginStream(200, "text/event-stream", headers)).ok()) co_return;
      auto step = std::make_shared<int64_t>(0);
      call.progress = [&ex, token, step](std::string message) -> awaitable<void> {
        json params = {{"progressToken", token}, {"progress", ++*step}, {"message", message}};
        (void)co_await ex.WriteChunk(SseEvent(mcp::Notification("notifications/progress", params)));
      };
      json response = co_await t.server.Handle(m, call);
      if ((co_await ex.WriteChunk(SseEvent(response))).ok()) (void)co_await ex.EndStream();
      co_return;
    }
  }

  json answers = json::array();
  for (const mcp::Item& item : body.items) {
    if (!item.message) {
      answers.push_back(item.error);
      continue;
    }
    const Message& m = *item.message;
    // Notifications (initialized, cancelled) and responses need nothing from this server: it
    // sends no requests, and a call runs to its end or its own timeout.
    if (m.kind != Message::Kind::kRequest) continue;
    if (m.method == "initialize") {
      answers.push_back(mcp::ErrorResponse(m.id, mcp::kInvalidRequest,
                                           "initialize must be sent alone, not in a batch"));
      continue;
    }
    answers.push_back(co_await t.server.Handle(m, call));
  }
  if (answers.empty()) co_return co_await ex.Respond(202, "");
  if (!accepts.json) {
    // An SSE-only client: the same answers as events.
    headers.emplace_back("Cache-Control", "no-cache");
    if (!(co_await ex.BeginStream(200, "text/event-stream", headers)).ok()) co_return;
    for (const json& a : answers)
      if (!(co_await ex.WriteChunk(SseEvent(a))).ok()) co_return;
    (void)co_await ex.EndStream();
    co_return;
  }
  co_await RespondJson(ex, body.batch ? answers : answers[0], headers);
}

awaitable<void> Delete(Transport& t, http::Exchange& ex) {
  if (!OriginAllowed(t.ctx, ex)) co_return co_await Refuse(ex, 403, "this Origin may not use /mcp");
  auto key = co_await Authenticate(t.ctx, ex);
  if (!key) co_return;
  std::string sid(ex.Header("Mcp-Session-Id"));
  if (sid.empty()) co_return co_await Refuse(ex, 400, "Mcp-Session-Id is required");
  if (!t.sessions.End(sid, key->id)) co_return co_await Refuse(ex, 404, "no such MCP session");
  co_await ex.Respond(204, "");
}

// This server sends nothing but answers, so there is no stream to open (the spec's 405).
awaitable<void> Get(Transport& t, http::Exchange& ex) {
  static const http::Headers kAllow = {{"Allow", "POST, DELETE"}};
  if (!OriginAllowed(t.ctx, ex)) co_return co_await Refuse(ex, 403, "this Origin may not use /mcp");
  co_await Refuse(ex, 405, "this server sends no messages of its own: POST requests to /mcp",
                  kAllow);
}

}  // namespace

void RegisterMcp(http::Router& router, McpContext& ctx) {
  auto t = std::make_shared<Transport>(ctx);
  router.Post(
      "/mcp", [t](http::Exchange& ex) { return Post(*t, ex); }, http::RouteOptions{kBodyLimit});
  router.Delete("/mcp", [t](http::Exchange& ex) { return Delete(*t, ex); });
  router.Get("/mcp", [t](http::Exchange& ex) { return Get(*t, ex); });
}

}  // namespace sbx::api
