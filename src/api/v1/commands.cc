// /v1/sandboxes/{id}/commands and /pty: the native JSON (NDJSON, WebSocket) encoding of the
// session's processes (sandbox/session.h). Nothing here talks to the agent.
// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include <algorithm>
#include <array>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <cctype>
#include <csignal>

#include "api/errors.h"
#include "api/http/websocket.h"
#include "api/v1/internal.h"
#include "common/encoding.h"

namespace sbx::api::v1 {
namespace {

namespace asio = boost::asio;
using Kind = sandbox::ProcessEvent::Kind;

struct CommandRequest {
  sandbox::CommandSpec spec;
  bool background = false;
};

// A command request's JSON: argv or command, env, cwd, user, stdin, background, timeout, tag,
// pty {rows, cols}.
Result<CommandRequest> ParseCommand(const json& j) {
  if (!j.is_object()) return Status::Error("body: must be a JSON object", EINVAL);
  CommandRequest c;
  sandbox::CommandSpec& s = c.spec;
  json argv_audit;
  if (j.contains("argv")) {
    if (!j["argv"].is_array() || j["argv"].empty())
      return Status::Error("argv: a non-empty array of strings", EINVAL);
    for (const auto& a : j["argv"]) {
      if (!a.is_string()) return Status::Error("argv: a non-empty array of strings", EINVAL);
      s.argv.push_back(a.get<std::string>());
    }
  } else if (j.contains("command") && j["command"].is_string()) {
    s.argv = {"/bin/sh", "-c", j["command"].get<std::string>()};
  } else {
    return Status::Error("give argv (an array) or command (a shell string)", EINVAL);
  }
  auto env = StringMap(j, "env");
  if (!env.ok()) return env.status();
  s.env = std::move(*env);
  for (const char* field : {"cwd", "user", "tag"}) {
    if (!j.contains(field)) continue;
    if (!j[field].is_string())
      return Status::Error(std::string(field) + ": must be a string", EINVAL);
    std::string v = j[field].get<std::string>();
    (std::string_view(field) == "cwd"    ? s.cwd
     : std::string_view(field) == "user" ? s.user
                                         : s.tag) = v;
  }
  auto stdin_open = BoolField(j, "stdin", false);
  if (!stdin_open.ok()) return stdin_open.status();
  s.stdin_open = *stdin_open;
  auto bg = BoolField(j, "background", false);
  if (!bg.ok()) return bg.status();
  c.background = *bg;
  auto t = SecondsField(j, "timeout", kMinCommandTimeoutS, kMaxCommandTimeoutS);
  if (!t.ok()) return t.status();
  s.timeout = std::chrono::milliseconds(*t);
  if (j.contains("pty")) {
    const json& p = j["pty"];
    auto rows =
        p.is_object() ? IntField(p, "rows", 24) : Result<int64_t>(Status::Error("", EINVAL));
    auto cols =
        p.is_object() ? IntField(p, "cols", 80) : Result<int64_t>(Status::Error("", EINVAL));
    if (!rows.ok() || !cols.ok() || *rows < 1 || *cols < 1 || *rows > sandbox::kMaxPtySide ||
        *cols > sandbox::kMaxPtySide)
      return Status::Error("pty: an object with rows and cols from 1 to 1000", EINVAL);
    s.pty = sandbox::PtySize{static_cast<int>(*rows), static_cast<int>(*cols)};
  }
  s.audit = {{"background", c.background}};
  return c;
}

json EventJson(const sandbox::ProcessEvent& e) {
  if (e.kind == Kind::kOutput)
    return {{"type", e.stream == 2 ? "stderr" : "stdout"},
            {"offset", e.offset},
            {"data", Base64Encode(e.data)}};
  if (e.kind == Kind::kError) return {{"type", "error"}, {"message", e.error.message()}};
  json j = {{"type", "exit"}, {"exit_code", e.exit_code}};
  if (e.signal) j["signal"] = e.signal;
  if (e.timed_out) j["timed_out"] = true;
  if (e.oom) j["oom"] = true;
  // What the box's network refused during the command (docs/api.md, "Command events").
  const network::BoxRefusals& refused = e.network_refused;
  if (!refused.empty()) {
    json list = json::array();
    for (const network::Refusal& r : refused.refused)
      list.push_back({{"kind", network::RefusalKindName(r.kind)},
                      {"target", r.target},
                      {"reason", r.reason},
                      {"count", r.count}});
    j["network_refused"] = std::move(list);
    if (refused.more > 0) j["network_refused_more"] = refused.more;
    j["network_policy"] = refused.policy;
  }
  return j;
}

// The binary encoding of a command's events (docs/api.md, "Binary output frames"), asked for with
// `Accept: application/vnd.sbx.frames`: each event is a 16-byte header (the kind, three zero
// bytes, the payload's length as a 32-bit big-endian number, the stream offset of an output
// frame's first byte as a 64-bit big-endian number) and the payload: a stdout or stderr frame
// carries the bytes themselves, an event frame the JSON object an NDJSON line would.
constexpr std::string_view kFramesType = "application/vnd.sbx.frames";
constexpr std::string_view kNdjsonType = "application/x-ndjson";
enum class Frame : uint8_t { kStdout = 1, kStderr = 2, kEvent = 3 };

bool WantsFrames(const http::Exchange& ex) {
  std::string accept(ex.Header("Accept"));
  std::transform(accept.begin(), accept.end(), accept.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return accept.find(kFramesType) != std::string::npos;
}

using FrameHeader = std::array<char, 16>;

FrameHeader FrameHead(Frame kind, size_t length, uint64_t offset = 0) {
  FrameHeader h{};
  h[0] = static_cast<char>(kind);
  for (int i = 0; i < 4; ++i) h[4 + i] = static_cast<char>(length >> (8 * (3 - i)));
  for (int i = 0; i < 8; ++i) h[8 + i] = static_cast<char>(offset >> (8 * (7 - i)));
  return h;
}

// One event in the stream's encoding: a JSON line, or a frame's header and its JSON.
struct EncodedEvent {
  FrameHeader head{};
  bool framed = false;
  std::string text;
  std::string_view Head() const { return framed ? std::string_view(head.data(), head.size()) : ""; }
};

EncodedEvent Encode(bool frames, const json& event) {
  EncodedEvent e;
  e.text = http::JsonText(event);
  if (frames) {
    e.framed = true;
    e.head = FrameHead(Frame::kEvent, e.text.size());
  } else {
    e.text += '\n';
  }
  return e;
}

awaitable<Status> WriteEvent(http::Exchange& ex, bool frames, const json& event) {
  EncodedEvent e = Encode(frames, event);
  co_return co_await ex.WriteChunk(e.Head(), e.text);
}

// Streams a process until its exit, as NDJSON or as frames; the last event (exit or error) and
// the end of the body go in one write. A client that goes away leaves the process running (it is
// detached; the agent keeps buffering its output).
awaitable<void> StreamProcess(http::Exchange& ex, sandbox::Process& p, bool frames) {
  for (;;) {
    auto e = co_await p.Next();
    if (frames && e.ok() && e->kind == Kind::kOutput) {
      auto head = FrameHead(e->stream == 2 ? Frame::kStderr : Frame::kStdout, e->data.size(),
                            static_cast<uint64_t>(e->offset));
      if (!(co_await ex.WriteChunk(std::string_view(head.data(), head.size()), e->data)).ok())
        co_return co_await p.Detach();
      continue;
    }
    json event =
        e.ok() ? EventJson(*e) : json{{"type", "error"}, {"message", e.status().message()}};
    if (e.ok() && e->kind == Kind::kOutput) {
      if (!(co_await WriteEvent(ex, frames, event)).ok()) co_return co_await p.Detach();
      continue;
    }
    EncodedEvent last = Encode(frames, event);
    (void)co_await ex.EndStream(last.Head(), last.text);
    co_return;
  }
}

Result<int64_t> PidParam(const http::Exchange& ex) {
  char* end = nullptr;
  const std::string& s = ex.Param("pid");
  long long p = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || p <= 0 || p > 0x7fffffff)
    return Status::Error("pid: a positive integer (got '" + s.substr(0, 32) + "')", EINVAL);
  return static_cast<int64_t>(p);
}

// Forwards a PTY WebSocket's input to the process: binary messages are keystrokes, text messages
// JSON control ({"type":"resize","rows","cols"} or {"type":"signal","signal"}). A free function,
// not a lambda: a lambda coroutine's captures would die with the temporary closure.
awaitable<void> PtyInput(std::shared_ptr<http::WebSocket> sock,
                         std::shared_ptr<sandbox::Session> session, int64_t pid) {
  for (;;) {
    auto m = co_await sock->Read();
    if (!m.ok()) co_return;
    if (m->binary) {
      (void)co_await session->WriteStdin(pid, m->data);
      continue;
    }
    json c = http::ParseJsonBody(m->data);
    std::string what = c.is_object() ? c.value("type", "") : "";
    if (what == "resize") {
      auto rows = IntField(c, "rows", 24), cols = IntField(c, "cols", 80);
      if (rows.ok() && cols.ok())
        (void)co_await session->Resize(
            pid, sandbox::PtySize{static_cast<int>(*rows), static_cast<int>(*cols)});
    } else if (what == "signal" && c.contains("signal")) {
      (void)co_await session->Signal(pid, SignalNumber(c["signal"]));
    }
  }
}

}  // namespace

void Commands(http::Router& r, ApiContext& ctx) {
  r.Post(
      "/v1/sandboxes/{id}/commands",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto s = co_await SessionOrFail(ctx, ex, key);
        if (!s) co_return;
        auto j = co_await ex.ReadJson();
        if (!j.ok()) co_return co_await Fail(ex, j.status());
        auto req = ParseCommand(*j);
        if (!req.ok()) co_return co_await Fail(ex, req.status());
        auto p = co_await s->Spawn(req->spec);
        if (!p.ok()) co_return co_await Fail(ex, p.status());
        int64_t pid = (*p)->pid();
        if (req->background) {
          co_await (*p)->Detach();
          json body = {{"pid", pid}};
          co_return co_await ex.RespondJson(201, body);
        }
        http::Headers headers = {{"X-Sbx-Pid", std::to_string(pid)}};
        bool frames = WantsFrames(ex);
        Status begun = co_await ex.BeginStream(200, frames ? kFramesType : kNdjsonType, headers,
                                               std::nullopt, /*hold_header=*/true);
        if (!begun.ok()) co_return;
        json start = {{"type", "start"}, {"pid", pid}};
        (void)co_await WriteEvent(ex, frames, start);
        co_await StreamProcess(ex, **p, frames);
      }));

  r.Get(
      "/v1/sandboxes/{id}/commands",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto s = co_await SessionOrFail(ctx, ex, key);
        if (!s) co_return;
        auto procs = co_await s->ListProcesses();
        if (!procs.ok()) co_return co_await Fail(ex, procs.status());
        json out = json::array();
        for (const auto& e : *procs) {
          json p = {{"pid", e.pid},         {"argv", e.argv},
                    {"tag", e.tag},         {"pty", e.pty},
                    {"running", e.running}, {"started_at", IsoTime(e.started_ns / 1000000)}};
          if (!e.running) {
            p["exit_code"] = e.exit_code;
            if (e.signal) p["signal"] = e.signal;
          }
          out.push_back(p);
        }
        json body = {{"commands", out}};
        co_await ex.RespondJson(200, body);
      }));

  r.Get(
      "/v1/sandboxes/{id}/commands/{pid}/output",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto pid = PidParam(ex);
        auto so = IntQuery(ex, "stdout_offset", 0), se = IntQuery(ex, "stderr_offset", 0);
        if (!pid.ok() || !so.ok() || !se.ok())
          co_return co_await ex.RespondError(400, "invalid_argument",
                                             "pid and offsets must be integers");
        auto s = co_await SessionOrFail(ctx, ex, key);
        if (!s) co_return;
        auto p = co_await s->Attach(*pid, *so, *se);
        if (!p.ok()) co_return co_await Fail(ex, p.status());
        bool frames = WantsFrames(ex);
        Status begun = co_await ex.BeginStream(200, frames ? kFramesType : kNdjsonType);
        if (!begun.ok()) co_return;
        co_await StreamProcess(ex, **p, frames);
      }));

  r.Post("/v1/sandboxes/{id}/commands/{pid}/stdin",
         Authed(ctx,
                [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
                  auto pid = PidParam(ex);
                  if (!pid.ok()) co_return co_await Fail(ex, pid.status());
                  auto s = co_await SessionOrFail(ctx, ex, key);
                  if (!s) co_return;
                  ex.AllowSlowBody();  // may be typed as it goes
                  std::string buf(protocol::kMaxChunk, '\0');
                  for (;;) {
                    auto n = co_await ex.ReadSome(buf.data(), buf.size());
                    if (!n.ok()) co_return co_await Fail(ex, n.status());
                    if (*n == 0) break;
                    Status sent = co_await s->WriteStdin(*pid, std::string_view(buf.data(), *n));
                    if (!sent.ok()) co_return co_await Fail(ex, sent);
                  }
                  co_await ex.Respond(204, "");
                }),
         http::RouteOptions{size_t{1} << 40});

  r.Post(
      "/v1/sandboxes/{id}/commands/{pid}/stdin/close",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto pid = PidParam(ex);
        if (!pid.ok()) co_return co_await Fail(ex, pid.status());
        auto s = co_await SessionOrFail(ctx, ex, key);
        if (!s) co_return;
        Status closed = co_await s->CloseStdin(*pid);
        if (!closed.ok()) co_return co_await Fail(ex, closed);
        co_await ex.Respond(204, "");
      }));

  r.Post(
      "/v1/sandboxes/{id}/commands/{pid}/signal",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto j = co_await ex.ReadJson();
        if (!j.ok()) co_return co_await Fail(ex, j.status());
        int sig = j->contains("signal") ? SignalNumber((*j)["signal"]) : SIGKILL;
        auto group = BoolField(*j, "group", true);
        if (!group.ok()) co_return co_await Fail(ex, group.status());
        if (sig <= 0 || sig >= 65)
          co_return co_await ex.RespondError(400, "invalid_argument",
                                             "signal: a number or a name like SIGTERM");
        auto pid = PidParam(ex);
        if (!pid.ok()) co_return co_await Fail(ex, pid.status());
        auto s = co_await SessionOrFail(ctx, ex, key);
        if (!s) co_return;
        Status sent = co_await s->Signal(*pid, sig, *group);
        if (!sent.ok()) co_return co_await Fail(ex, sent);
        co_await ex.Respond(204, "");
      }));

  // PTY over WebSocket: binary messages are input, text messages are JSON control
  // ({"type":"resize","rows":R,"cols":C}); output comes as binary messages, the exit as a text
  // message {"type":"exit",...}, then the socket closes.
  r.Get(
      "/v1/sandboxes/{id}/pty",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        // The owner check first, so another key's id is a 404 (and audited) however asked.
        auto s = co_await SessionOrFail(ctx, ex, key);
        if (!s) co_return;
        if (!ex.WantsWebSocket())
          co_return co_await ex.RespondError(400, "invalid_argument",
                                             "this endpoint needs a WebSocket upgrade");
        auto rows = IntQuery(ex, "rows", 24), cols = IntQuery(ex, "cols", 80);
        sandbox::CommandSpec spec;
        spec.argv = {"/bin/sh", "-c", ex.query().Get("command").value_or("/bin/bash -l")};
        spec.pty = sandbox::PtySize{rows.ok() ? static_cast<int>(*rows) : 24,
                                    cols.ok() ? static_cast<int>(*cols) : 80};
        spec.stdin_open = true;
        spec.user = ex.query().Get("user").value_or("");
        spec.cwd = ex.query().Get("cwd").value_or("");
        auto p = co_await s->Spawn(spec);
        auto ws = co_await ex.AcceptWebSocket();
        if (!ws.ok()) {
          if (p.ok()) (void)co_await s->Signal((*p)->pid(), SIGKILL);
          co_return;
        }
        std::shared_ptr<http::WebSocket> sock = std::move(*ws);
        // A process that cannot start is told over the socket, not by refusing the upgrade: a
        // WebSocket client (a browser's, Beast's) never sees the body of a refused upgrade.
        if (!p.ok()) {
          api::ErrorAnswer e = api::AnswerFor(p.status().err());
          json error = {{"type", "error"}, {"status", e.status}, {"code", std::string(e.code)}};
          error["message"] = p.status().message();
          std::string text = error.dump();
          (void)co_await sock->WriteText(text);
          (void)co_await sock->Close();
          co_return;
        }
        int64_t pid = (*p)->pid();
        std::string start = json{{"type", "start"}, {"pid", pid}}.dump();
        (void)co_await sock->WriteText(start);
        // Input: a coroutine of its own, so output never waits for input.
        asio::co_spawn(sock->executor(), PtyInput(sock, s, pid), asio::detached);
        for (;;) {
          auto e = co_await (*p)->Next();
          if (!e.ok() || e->kind == Kind::kError) break;
          if (e->kind == Kind::kOutput) {
            if (!(co_await sock->WriteBinary(e->data)).ok()) break;
          } else {
            (void)co_await sock->WriteText(EventJson(*e).dump());
            break;
          }
        }
        (void)co_await sock->Close();
      }));
}

}  // namespace sbx::api::v1
