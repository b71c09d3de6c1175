#include "api/v1/api.h"

#include <openssl/evp.h>
#include <spdlog/spdlog.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <ctime>
#include <limits>
#include <mutex>
#include <optional>
#include <tuple>

#include "api/errors.h"
#include "api/http/exchange.h"
#include "api/http/websocket.h"
#include "api/v1/box_files.h"
#include "common/encoding.h"
#include "protocol/wire.h"
#include "storage/template.h"
#include "store/audit_queue.h"

namespace sbx::api {
namespace {

namespace asio = boost::asio;
using asio::awaitable;
using nlohmann::json;
using protocol::Tag;
using protocol::Type;
using Clock = std::chrono::steady_clock;

// ---- encoding helpers ----

std::string Base64(std::string_view in) { return Base64Encode(in); }
std::string IsoTime(int64_t ms) { return Rfc3339Millis(ms); }

// `key` is the caller: an operator looking at another key's sandbox sees no token for it.
json SandboxJson(const ApiContext& ctx, const store::ApiKeyRecord& key,
                 const store::SandboxRecord& r) {
  bool owner = r.owner_key_id == key.id;
  json env_keys = json::array();
  for (const auto& [k, v] : r.env) env_keys.push_back(k);  // values may be secrets: never echoed
  json j = {{"id", r.id},
            {"template", r.template_name},
            {"state", r.state},
            {"metadata", r.metadata},
            {"env_keys", env_keys},
            {"limits",
             {{"memory_bytes", r.limits.memory_bytes},
              {"cpus", r.limits.cpus},
              {"cpu_weight", r.limits.cpu_weight},
              {"pids", r.limits.pids},
              {"disk_bytes", r.limits.disk_bytes}}},
            {"timeout", static_cast<double>(r.timeout_ms) / 1000.0},
            {"on_timeout", r.on_timeout},
            {"created_at", IsoTime(r.created_at)},
            {"expires_at", r.expires_at ? json(IsoTime(r.expires_at)) : json(nullptr)},
            {"ended_at", r.ended_at ? json(IsoTime(r.ended_at)) : json(nullptr)},
            {"public_ports", r.public_ports},
            {"owner_key_id", r.owner_key_id},
            {"id_base", r.id_base},
            {"idmapped", r.idmapped},
            {"traffic_token",
             owner ? json(TrafficToken(ctx.secret, r.owner_key_id, r.id)) : json(nullptr)}};
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

json EntryJson(const protocol::Reader& f) {
  static const char* kTypes[] = {"", "file", "dir", "symlink", "other"};
  int64_t t = f.Int(Tag::kFileType);
  json j = {{"name", std::string(f.Str(Tag::kName))},
            {"path", std::string(f.Str(Tag::kPath))},
            {"type", kTypes[(t >= 1 && t <= 4) ? t : 4]},
            {"size", f.Int(Tag::kSize)},
            {"mode", f.Int(Tag::kMode) & 07777},
            {"uid", f.Int(Tag::kUid)},
            {"gid", f.Int(Tag::kGid)},
            {"owner", std::string(f.Str(Tag::kOwner))},
            {"group", std::string(f.Str(Tag::kGroupName))},
            {"modified_at", IsoTime(f.Int(Tag::kMtimeNs) / 1000000)}};
  if (f.Has(Tag::kLinkTarget)) j["link_target"] = std::string(f.Str(Tag::kLinkTarget));
  return j;
}

// ---- errors ----

// What each errno answers is the one table of api/errors.h.

awaitable<void> Fail(http::Exchange& ex, const Status& s, const http::Headers& headers = {}) {
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

// Runs blocking `f` on the blocking pool and resumes the caller with its result.
template <typename F>
awaitable<decltype(std::declval<F>()())> OnPool(asio::thread_pool& pool, F f) {
  using R = decltype(f());
  std::optional<R> out;
  co_await asio::co_spawn(
      pool,
      [&]() -> awaitable<void> {
        out.emplace(f());
        co_return;
      },
      asio::use_awaitable);
  co_return std::move(*out);
}

using AuthedHandler = std::function<awaitable<void>(http::Exchange&, const store::ApiKeyRecord&)>;

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
    auto key = VerifyKey(ctx.store, *ctx.denials, ex, secret);
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

// ---- request parsing helpers ----

Result<std::map<std::string, std::string>> StringMap(const json& j, const char* field) {
  std::map<std::string, std::string> out;
  if (!j.contains(field) || j[field].is_null()) return out;
  if (!j[field].is_object())
    return Status::Error(std::string(field) + ": must be an object of strings", EINVAL);
  for (const auto& [k, v] : j[field].items()) {
    if (!v.is_string())
      return Status::Error(std::string(field) + "." + k + ": must be a string", EINVAL);
    out[k] = v.get<std::string>();
  }
  return out;
}

// "86400", "0.001": a bound as people write it.
std::string Number(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.15g", v);
  return b;
}

// A whole number of `unit` (bytes, processes) for limits.<field>, 0 when absent. Only the type is
// checked here; the manager says the allowed range (which for memory and disk is the host's).
Result<int64_t> SizeField(const json& j, const char* field, const char* unit) {
  if (!j.contains(field) || j[field].is_null()) return int64_t{0};
  const json& v = j[field];
  std::string name = std::string("limits.") + field;
  // An unsigned above INT64_MAX would wrap to a negative int64: say what is wrong with it.
  if (v.is_number_unsigned() &&
      v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return Status::Error(name + ": " + http::JsonSnippet(v) + " " + unit + " is out of range",
                         EINVAL);
  if (!v.is_number_integer())
    return Status::Error(name + ": must be a whole number of " + unit +
                             ", 0 for the default (got " + http::JsonSnippet(v) + ")",
                         EINVAL);
  return v.get<int64_t>();
}

// A number of seconds from `min_s` to `max_s`, as milliseconds; 0 when absent. The range is
// checked on the double before any arithmetic, so no value (1e300, -1, 0.0001) can overflow or
// round to 0 (which would mean "the default").
Result<int64_t> SecondsField(const json& j, const char* field, double min_s, double max_s) {
  if (!j.contains(field) || j[field].is_null()) return int64_t{0};
  const json& v = j[field];
  double secs = v.is_number() ? v.get<double>() : std::nan("");
  if (!(secs >= min_s && secs <= max_s))  // also false for NaN and a non-number
    return Status::Error(std::string(field) + ": a number of seconds from " + Number(min_s) +
                             " to " + Number(max_s) + " (got " + http::JsonSnippet(v) + ")",
                         EINVAL);
  return std::max<int64_t>(1, static_cast<int64_t>(std::llround(secs * 1000)));
}

// A command's timeout: a millisecond at least (less would round to 0, "no timeout").
constexpr double kMinCommandTimeoutS = 0.001;
constexpr double kMaxCommandTimeoutS = 1e7;
// A sandbox's: at least a second; at most the manager's maximum.
constexpr double kMinSandboxTimeoutS = 1;

Result<sandbox::CreateRequest> ParseCreate(const json& j, int64_t max_timeout_ms) {
  if (!j.is_object()) return Status::Error("body: must be a JSON object", EINVAL);
  static const std::set<std::string> kKnown = {"template", "env",        "metadata",    "limits",
                                               "timeout",  "on_timeout", "public_ports"};
  for (const auto& [k, v] : j.items())
    if (!kKnown.count(k)) return Status::Error("unknown field '" + k + "'", EINVAL);
  sandbox::CreateRequest r;
  if (j.contains("template")) {
    if (!j["template"].is_string()) return Status::Error("template: must be a string", EINVAL);
    r.template_name = j["template"].get<std::string>();
  }
  auto env = StringMap(j, "env");
  if (!env.ok()) return env.status();
  r.env = *env;
  auto md = StringMap(j, "metadata");
  if (!md.ok()) return md.status();
  r.metadata = *md;
  if (j.contains("limits")) {
    const json& l = j["limits"];
    if (!l.is_object()) return Status::Error("limits: must be an object", EINVAL);
    static const std::set<std::string> kLimits = {"memory_bytes", "cpus", "cpu_weight", "pids",
                                                  "disk_bytes"};
    for (const auto& [k, v] : l.items())
      if (!kLimits.count(k)) return Status::Error("limits: unknown field '" + k + "'", EINVAL);
    for (auto [name, unit, dst] :
         {std::tuple{"memory_bytes", "bytes", &r.limits.memory_bytes},
          std::tuple{"pids", "processes", &r.limits.pids},
          std::tuple{"disk_bytes", "bytes", &r.limits.disk_bytes},
          std::tuple{"cpu_weight", "weight units", &r.limits.cpu_weight}}) {
      auto v = SizeField(l, name, unit);
      if (!v.ok()) return v.status();
      *dst = *v;
    }
    if (l.contains("cpus") && !l["cpus"].is_null()) {
      if (!l["cpus"].is_number())
        return Status::Error("limits.cpus: must be a number of CPUs, 0 for the default (got " +
                                 http::JsonSnippet(l["cpus"]) + ")",
                             EINVAL);
      r.limits.cpus = l["cpus"].get<double>();
    }
  }
  auto timeout =
      SecondsField(j, "timeout", kMinSandboxTimeoutS, static_cast<double>(max_timeout_ms) / 1000);
  if (!timeout.ok()) return timeout.status();
  r.timeout_ms = *timeout;
  if (j.contains("on_timeout")) {
    if (!j["on_timeout"].is_string()) return Status::Error("on_timeout: 'kill' or 'pause'", EINVAL);
    r.on_timeout = j["on_timeout"].get<std::string>();
  }
  if (j.contains("public_ports")) {
    if (!j["public_ports"].is_boolean())
      return Status::Error("public_ports: must be true or false", EINVAL);
    r.public_ports = j["public_ports"].get<bool>();
  }
  return r;
}

std::string Sha256Hex(std::string_view s) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(s.data(), s.size(), md, &n, EVP_sha256(), nullptr);
  std::string out;
  char b[3];
  for (unsigned i = 0; i < n; ++i) {
    std::snprintf(b, sizeof b, "%02x", md[i]);
    out += b;
  }
  return out;
}

Result<bool> BoolField(const json& j, const char* field, bool def) {
  if (!j.contains(field) || j[field].is_null()) return def;
  if (!j[field].is_boolean())
    return Status::Error(std::string(field) + ": must be true or false", EINVAL);
  return j[field].get<bool>();
}

Result<int64_t> IntField(const json& j, const char* field, int64_t def) {
  if (!j.contains(field) || j[field].is_null()) return def;
  if (!j[field].is_number_integer())
    return Status::Error(std::string(field) + ": must be an integer", EINVAL);
  return j[field].get<int64_t>();
}

// ---- agent helpers ----

// The SPAWN payload for a command request (native JSON).
Result<protocol::Writer> SpawnPayload(const json& j, const store::SandboxRecord& sb,
                                      bool* background) {
  if (!j.is_object()) return Status::Error("body: must be a JSON object", EINVAL);
  protocol::Writer w;
  if (j.contains("argv")) {
    if (!j["argv"].is_array() || j["argv"].empty())
      return Status::Error("argv: a non-empty array of strings", EINVAL);
    for (const auto& a : j["argv"]) {
      if (!a.is_string()) return Status::Error("argv: a non-empty array of strings", EINVAL);
      w.Str(Tag::kArgv, a.get<std::string>());
    }
  } else if (j.contains("command") && j["command"].is_string()) {
    w.Str(Tag::kArgv, "/bin/sh")
        .Str(Tag::kArgv, "-c")
        .Str(Tag::kArgv, j["command"].get<std::string>());
  } else {
    return Status::Error("give argv (an array) or command (a shell string)", EINVAL);
  }
  // One value per variable: the command's env over the sandbox's over the default PATH.
  std::map<std::string, std::string> merged = {
      {"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}};
  for (const auto& [k, v] : sb.env) merged[k] = v;
  auto env = StringMap(j, "env");
  if (!env.ok()) return env.status();
  for (const auto& [k, v] : *env) merged[k] = v;
  for (const auto& [k, v] : merged) w.Str(Tag::kEnv, k + "=" + v);
  if (j.contains("cwd")) {
    if (!j["cwd"].is_string()) return Status::Error("cwd: must be a string", EINVAL);
    w.Str(Tag::kCwd, j["cwd"].get<std::string>());
  }
  if (j.contains("user")) {
    if (!j["user"].is_string()) return Status::Error("user: must be a string", EINVAL);
    w.Str(Tag::kUser, j["user"].get<std::string>());
  }
  auto stdin_open = BoolField(j, "stdin", false);
  auto bg = BoolField(j, "background", false);
  if (!stdin_open.ok()) return stdin_open.status();
  if (!bg.ok()) return bg.status();
  if (*stdin_open) w.Int(Tag::kStdinOpen, 1);
  auto t = SecondsField(j, "timeout", kMinCommandTimeoutS, kMaxCommandTimeoutS);
  if (!t.ok()) return t.status();
  if (*t > 0) w.Int(Tag::kTimeoutMs, *t);
  if (j.contains("tag")) {
    if (!j["tag"].is_string()) return Status::Error("tag: must be a string", EINVAL);
    w.Str(Tag::kTag, j["tag"].get<std::string>());
  }
  if (j.contains("pty")) {
    const json& p = j["pty"];
    auto rows =
        p.is_object() ? IntField(p, "rows", 24) : Result<int64_t>(Status::Error("", EINVAL));
    auto cols =
        p.is_object() ? IntField(p, "cols", 80) : Result<int64_t>(Status::Error("", EINVAL));
    if (!rows.ok() || !cols.ok() || *rows < 1 || *cols < 1 || *rows > 1000 || *cols > 1000)
      return Status::Error("pty: an object with rows and cols from 1 to 1000", EINVAL);
    w.Int(Tag::kPty, 1).Int(Tag::kRows, *rows).Int(Tag::kCols, *cols);
  }
  *background = *bg;
  return w;
}

// The Status of a reply that should have been OK: the agent's ERROR, or the channel's failure.
// Computed outside co_await expressions: GCC 12 destroys the class temporaries of a ?: inside a
// co_await expression twice.
std::string UnpackError(const std::string& path, const std::string& tar_stderr) {
  return "unpack into " + path + ": " +
         (tar_stderr.empty() ? std::string("tar failed") : tar_stderr);
}

json OutputEvent(const protocol::Frame& f) {
  return {{"type", f.fields.Int(Tag::kStream) == 2 ? "stderr" : "stdout"},
          {"offset", f.fields.Int(Tag::kOffset)},
          {"data", Base64(f.fields.Str(Tag::kData))}};
}

json ExitEvent(const protocol::Frame& f) {
  json j = {{"type", "exit"}, {"exit_code", f.fields.Int(Tag::kExitCode, -1)}};
  if (int64_t sig = f.fields.Int(Tag::kSignal)) j["signal"] = sig;
  if (f.fields.Int(Tag::kTimedOut)) j["timed_out"] = true;
  return j;
}

// Streams a process subscription as NDJSON until EXIT. A client that goes away leaves the
// process running (the subscription is dropped; the agent keeps buffering its output).
// `on_exit` sees the EXIT event (for the audit log).
awaitable<void> StreamProcess(http::Exchange& ex, sandbox::AgentChannel& ch,
                              sandbox::Subscription& sub, int64_t pid,
                              std::function<void(const protocol::Frame&)> on_exit = nullptr) {
  for (;;) {
    auto f = co_await sub.Next();
    if (!f.ok()) {
      std::string line =
          http::JsonText(json{{"type", "error"}, {"message", f.status().message()}}) + "\n";
      (void)co_await ex.WriteChunk(line);
      break;
    }
    json line;
    if (f->type() == Type::kOutput)
      line = OutputEvent(*f);
    else if (f->type() == Type::kExit) {
      line = ExitEvent(*f);
      if (on_exit) on_exit(*f);
    } else if (f->type() == Type::kError)
      line = {{"type", "error"}, {"message", std::string(f->fields.Str(Tag::kMessage))}};
    else
      continue;  // the OK reply of SPAWN/ATTACH
    std::string text = http::JsonText(line) + "\n";
    if (!(co_await ex.WriteChunk(text)).ok()) {
      // The client went away: stop following; the process goes on.
      (void)co_await ch.Call(Type::kDetach, protocol::Writer().Int(Tag::kPid, pid));
      sub.Cancel();
      co_return;
    }
    if (f->type() == Type::kExit || f->type() == Type::kError) break;
  }
  sub.Cancel();
  (void)co_await ex.EndStream();
}

awaitable<std::shared_ptr<sandbox::AgentChannel>> ChannelOrFail(ApiContext& ctx, http::Exchange& ex,
                                                                const store::ApiKeyRecord& key) {
  auto ch = co_await ctx.manager.Channel(key, ex.Param("id"));
  if (!ch.ok()) {
    co_await Fail(ex, ch.status());
    co_return nullptr;
  }
  co_return *ch;
}

Result<std::string> PathQuery(const http::Exchange& ex, const char* name = "path") {
  auto p = ex.query().Get(name);
  if (!p || p->empty())
    return Status::Error(std::string("query parameter '") + name + "' is required", EINVAL);
  return *p;
}

Result<int64_t> IntQuery(const http::Exchange& ex, const char* name, int64_t def) {
  auto v = ex.query().Get(name);
  if (!v) return def;
  char* end = nullptr;
  long long n = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0')
    return Status::Error(std::string(name) + ": must be an integer", EINVAL);
  return static_cast<int64_t>(n);
}

// A flag in the query: "true" or "1" set it.
bool FlagQuery(const http::Exchange& ex, const char* name) {
  auto v = ex.query().Get(name).value_or("");
  return v == "true" || v == "1";
}

int SignalNumber(const json& j) {
  if (j.is_number_integer()) return j.get<int>();
  if (!j.is_string()) return 0;
  std::string s = j.get<std::string>();
  if (s.rfind("SIG", 0) == 0) s = s.substr(3);
  static const std::map<std::string, int> kSignals = {
      {"HUP", SIGHUP},   {"INT", SIGINT},    {"QUIT", SIGQUIT}, {"KILL", SIGKILL},
      {"TERM", SIGTERM}, {"USR1", SIGUSR1},  {"USR2", SIGUSR2}, {"STOP", SIGSTOP},
      {"CONT", SIGCONT}, {"WINCH", SIGWINCH}};
  auto it = kSignals.find(s);
  return it == kSignals.end() ? 0 : it->second;
}

// Forwards a PTY WebSocket's input to the process: binary messages are keystrokes, text messages
// JSON control ({"type":"resize","rows","cols"} or {"type":"signal","signal"}).
awaitable<void> PtyInput(std::shared_ptr<http::WebSocket> sock,
                         std::shared_ptr<sandbox::AgentChannel> channel, int64_t pid) {
  for (;;) {
    auto m = co_await sock->Read();
    if (!m.ok()) co_return;
    protocol::Writer w;
    w.Int(Tag::kPid, pid);
    Type type = Type::kStdin;
    if (m->binary) {
      w.Str(Tag::kData, m->data);
    } else {
      json c = http::ParseJsonBody(m->data);
      std::string what = c.is_object() ? c.value("type", "") : "";
      if (what == "resize") {
        type = Type::kResize;
        w.Int(Tag::kRows, c.value("rows", 24)).Int(Tag::kCols, c.value("cols", 80));
      } else if (what == "signal" && c.contains("signal")) {
        type = Type::kSignal;
        w.Int(Tag::kSignal, SignalNumber(c["signal"])).Int(Tag::kGroup, 1);
      } else {
        continue;
      }
    }
    (void)co_await channel->Call(type, std::move(w));
  }
}

// Sends `data` to a process's stdin. The agent queues at most 4 MiB per process and answers
// EAGAIN past that; we then wait for the process to read, so uploads are paced by the consumer.
awaitable<Status> WriteStdin(sandbox::AgentChannel& ch, int64_t pid, std::string_view data) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  for (int waited_ms = 0;; waited_ms += 5) {
    auto r = co_await ch.Call(Type::kStdin,
                              protocol::Writer().Int(Tag::kPid, pid).Str(Tag::kData, data));
    if (r.ok()) co_return Status();
    if (r.status().err() != EAGAIN || waited_ms > 60000) co_return r.status();
    timer.expires_after(std::chrono::milliseconds(5));
    co_await timer.async_wait(asio::use_awaitable);
  }
}

// ---- routes ----

void Sandboxes(http::Router& r, ApiContext& ctx) {
  r.Post("/v1/sandboxes",
         Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
           auto body = co_await ex.ReadBody();
           if (!body.ok()) co_return co_await Fail(ex, body.status());
           json j = body->empty() ? json::object() : http::ParseJsonBody(*body);
           if (j.is_discarded())
             co_return co_await ex.RespondError(400, "invalid_argument", "body: not valid JSON");
           auto req = ParseCreate(j, ctx.manager.max_timeout_ms());
           if (!req.ok()) co_return co_await Fail(ex, req.status());
           req->idempotency_key = std::string(ex.Header("Idempotency-Key"));
           req->request_hash = Sha256Hex(j.dump());
           sandbox::QuotaExceeded quota;
           auto rec =
               co_await OnPool(ctx.blocking, [&] { return ctx.manager.Create(key, *req, &quota); });
           if (storage::IsTemplateNotFound(rec.status()))
             co_return co_await ex.RespondError(400, "invalid_argument", rec.status().what());
           if (!rec.ok()) {
             http::Headers h;
             if (rec.status().err() == EAGAIN)
               h.emplace_back("Retry-After",
                              std::to_string(static_cast<int>(std::ceil(quota.retry_after_s))));
             co_return co_await Fail(ex, rec.status(), h);
           }
           co_await ex.RespondJson(201, SandboxJson(ctx, key, *rec));
         }));

  r.Get("/v1/sandboxes",
        Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
          store::SandboxFilter f;
          for (const auto& s : ex.query().GetAll("state")) f.states.push_back(s);
          for (const auto& [k, v] : ex.query().items())
            if (k.rfind("metadata.", 0) == 0) f.metadata.emplace_back(k.substr(9), v);
          auto limit = IntQuery(ex, "limit", 100);
          if (!limit.ok() || *limit < 1 || *limit > 1000)
            co_return co_await ex.RespondError(400, "invalid_argument", "limit: 1 to 1000");
          f.limit = static_cast<size_t>(*limit);
          f.after = ex.query().Get("cursor").value_or("");
          // Operator keys see every key's sandboxes, or one key's with ?owner=key_...; for
          // other keys the manager ignores it.
          f.owner_key_id = ex.query().Get("owner").value_or("");
          auto page = ctx.manager.List(key, f);
          if (!page.ok()) co_return co_await Fail(ex, page.status());
          json items = json::array();
          for (const auto& rec : page->items) items.push_back(SandboxJson(ctx, key, rec));
          json body = {{"sandboxes", items},
                       {"next_cursor", page->next.empty() ? json(nullptr) : json(page->next)}};
          co_await ex.RespondJson(200, body);
        }));

  r.Get("/v1/sandboxes/{id}",
        Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
          auto rec = ctx.manager.Get(key, ex.Param("id"));
          if (!rec.ok()) co_return co_await Fail(ex, rec.status());
          json j = SandboxJson(ctx, key, *rec);
          if (rec->state == store::kStateRunning || rec->state == store::kStatePaused) {
            auto st = ctx.manager.Stats(key, rec->id);
            if (st.ok())
              j["stats"] = {{"cpu_usage_ns", st->cpu_usage_ns},
                            {"memory_bytes", st->memory_current},
                            {"memory_peak_bytes", st->memory_peak},
                            {"pids", st->pids_current},
                            {"oom_kills", st->oom_kills}};
          }
          co_await ex.RespondJson(200, j);
        }));

  r.Delete(
      "/v1/sandboxes/{id}",
      Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
        std::string id = ex.Param("id");
        Status s = co_await OnPool(ctx.blocking, [&] { return ctx.manager.Kill(key, id); });
        if (!s.ok()) co_return co_await Fail(ex, s);
        co_await ex.Respond(204, "");
      }));

  r.Post("/v1/sandboxes/{id}/timeout",
         Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
           auto j = co_await ex.ReadJson();
           if (!j.ok()) co_return co_await Fail(ex, j.status());
           if (!j->contains("timeout") || (*j)["timeout"].is_null())
             co_return co_await ex.RespondError(400, "invalid_argument", "timeout: required");
           auto t = SecondsField(*j, "timeout", kMinSandboxTimeoutS,
                                 static_cast<double>(ctx.manager.max_timeout_ms()) / 1000);
           if (!t.ok()) co_return co_await Fail(ex, t.status());
           auto rec = ctx.manager.SetTimeout(key, ex.Param("id"), *t);
           if (!rec.ok()) co_return co_await Fail(ex, rec.status());
           co_await ex.RespondJson(200, SandboxJson(ctx, key, *rec));
         }));

  for (const char* action : {"pause", "resume"}) {
    bool pause = std::string(action) == "pause";
    r.Post(std::string("/v1/sandboxes/{id}/") + action,
           Authed(ctx,
                  [&ctx, pause](http::Exchange& ex,
                                const store::ApiKeyRecord& key) -> awaitable<void> {
                    std::string id = ex.Param("id");
                    Status s = co_await OnPool(ctx.blocking, [&] {
                      return pause ? ctx.manager.Pause(key, id) : ctx.manager.Resume(key, id);
                    });
                    if (!s.ok()) co_return co_await Fail(ex, s);
                    auto rec = ctx.manager.Get(key, id);
                    if (!rec.ok()) co_return co_await Fail(ex, rec.status());
                    co_await ex.RespondJson(200, SandboxJson(ctx, key, *rec));
                  }));
  }
}

void Commands(http::Router& r, ApiContext& ctx) {
  r.Post("/v1/sandboxes/{id}/commands",
         Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
           auto started = Clock::now();
           auto rec = ctx.manager.Get(key, ex.Param("id"));
           if (!rec.ok()) co_return co_await Fail(ex, rec.status());
           auto j = co_await ex.ReadJson();
           if (!j.ok()) co_return co_await Fail(ex, j.status());
           bool background = false;
           auto w = SpawnPayload(*j, *rec, &background);
           if (!w.ok()) co_return co_await Fail(ex, w.status());
           auto ch = co_await ChannelOrFail(ctx, ex, key);
           if (!ch) co_return;
           auto opened = co_await ch->OpenConfirmed(Type::kSpawn, *w);
           if (!opened.ok()) co_return co_await Fail(ex, opened.status());
           auto sub = opened->sub;
           int64_t pid = opened->reply.fields.Int(Tag::kPid);
           ctx.manager.metrics().commands++;
           ctx.manager.metrics().exec_seconds.Observe(
               std::chrono::duration<double>(Clock::now() - started).count());
           json argv = j->contains("argv") ? (*j)["argv"] : json((*j).value("command", ""));
           ctx.manager.Audit("command.start", rec->id, key.id,
                             {{"pid", pid}, {"argv", argv}, {"background", background}});
           if (background) {
             (void)co_await ch->Call(Type::kDetach, protocol::Writer().Int(Tag::kPid, pid));
             sub->Cancel();
             json body = {{"pid", pid}};
             co_return co_await ex.RespondJson(201, body);
           }
           http::Headers headers = {{"X-Sbx-Pid", std::to_string(pid)}};
           Status s = co_await ex.BeginStream(200, "application/x-ndjson", headers);
           if (!s.ok()) co_return;
           std::string start = json{{"type", "start"}, {"pid", pid}}.dump() + "\n";
           (void)co_await ex.WriteChunk(start);
           // A named local, not a temporary in the co_await expression (GCC 12 destroys those
           // twice).
           std::function<void(const protocol::Frame&)> on_exit =
               [&ctx, sandbox_id = rec->id, key_id = key.id, pid](const protocol::Frame& f) {
                 json detail = ExitEvent(f);
                 detail["pid"] = pid;
                 ctx.manager.Audit("command.exit", sandbox_id, key_id, detail);
               };
           co_await StreamProcess(ex, *ch, *sub, pid, std::move(on_exit));
         }));

  r.Get("/v1/sandboxes/{id}/commands",
        Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
          auto ch = co_await ChannelOrFail(ctx, ex, key);
          if (!ch) co_return;
          std::vector<protocol::Frame> entries;
          auto r2 = co_await ch->Call(Type::kListProcs, protocol::Writer(), &entries);
          if (!r2.ok()) co_return co_await Fail(ex, r2.status());
          json out = json::array();
          for (const auto& e : entries) {
            json argv = json::array();
            for (auto a : e.fields.All(Tag::kArgv)) argv.push_back(std::string(a));
            json p = {{"pid", e.fields.Int(Tag::kPid)},
                      {"argv", argv},
                      {"tag", std::string(e.fields.Str(Tag::kTag))},
                      {"pty", e.fields.Int(Tag::kPty) != 0},
                      {"running", e.fields.Int(Tag::kRunning) != 0},
                      {"started_at", IsoTime(e.fields.Int(Tag::kStartedNs) / 1000000)}};
            if (!e.fields.Int(Tag::kRunning)) {
              p["exit_code"] = e.fields.Int(Tag::kExitCode, -1);
              if (int64_t sig = e.fields.Int(Tag::kSignal)) p["signal"] = sig;
            }
            out.push_back(p);
          }
          json body = {{"commands", out}};
          co_await ex.RespondJson(200, body);
        }));

  r.Get("/v1/sandboxes/{id}/commands/{pid}/output",
        Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
          auto pid = IntQuery(ex, "pid", 0);
          char* end = nullptr;
          int64_t p = std::strtoll(ex.Param("pid").c_str(), &end, 10);
          auto so = IntQuery(ex, "stdout_offset", 0), se = IntQuery(ex, "stderr_offset", 0);
          if (*end != '\0' || p <= 0 || !so.ok() || !se.ok() || !pid.ok())
            co_return co_await ex.RespondError(400, "invalid_argument",
                                               "pid and offsets must be integers");
          auto ch = co_await ChannelOrFail(ctx, ex, key);
          if (!ch) co_return;
          auto opened =
              co_await ch->OpenConfirmed(Type::kAttach, protocol::Writer()
                                                            .Int(Tag::kPid, p)
                                                            .Int(Tag::kStdoutOffset, *so)
                                                            .Int(Tag::kStderrOffset, *se));
          if (!opened.ok()) co_return co_await Fail(ex, opened.status());
          Status s = co_await ex.BeginStream(200, "application/x-ndjson");
          if (!s.ok()) co_return;
          co_await StreamProcess(ex, *ch, *opened->sub, p);
        }));

  r.Post("/v1/sandboxes/{id}/commands/{pid}/stdin",
         Authed(ctx,
                [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
                  int64_t pid = std::atoll(ex.Param("pid").c_str());
                  auto ch = co_await ChannelOrFail(ctx, ex, key);
                  if (!ch) co_return;
                  ex.AllowSlowBody();  // may be typed as it goes
                  std::string buf(protocol::kMaxChunk, '\0');
                  for (;;) {
                    auto n = co_await ex.ReadSome(buf.data(), buf.size());
                    if (!n.ok()) co_return co_await Fail(ex, n.status());
                    if (*n == 0) break;
                    Status sent = co_await WriteStdin(*ch, pid, std::string_view(buf.data(), *n));
                    if (!sent.ok()) co_return co_await Fail(ex, sent);
                  }
                  co_await ex.Respond(204, "");
                }),
         http::RouteOptions{size_t{1} << 40});

  r.Post("/v1/sandboxes/{id}/commands/{pid}/stdin/close",
         Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
           auto ch = co_await ChannelOrFail(ctx, ex, key);
           if (!ch) co_return;
           auto r2 = co_await ch->Call(
               Type::kCloseStdin,
               protocol::Writer().Int(Tag::kPid, std::atoll(ex.Param("pid").c_str())));
           if (!r2.ok()) co_return co_await Fail(ex, r2.status());
           co_await ex.Respond(204, "");
         }));

  r.Post("/v1/sandboxes/{id}/commands/{pid}/signal",
         Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
           auto j = co_await ex.ReadJson();
           if (!j.ok()) co_return co_await Fail(ex, j.status());
           int sig = j->contains("signal") ? SignalNumber((*j)["signal"]) : SIGKILL;
           auto group_field = BoolField(*j, "group", true);
           if (!group_field.ok()) co_return co_await Fail(ex, group_field.status());
           bool group = *group_field;
           if (sig <= 0 || sig >= 65)
             co_return co_await ex.RespondError(400, "invalid_argument",
                                                "signal: a number or a name like SIGTERM");
           auto ch = co_await ChannelOrFail(ctx, ex, key);
           if (!ch) co_return;
           auto r2 = co_await ch->Call(Type::kSignal,
                                       protocol::Writer()
                                           .Int(Tag::kPid, std::atoll(ex.Param("pid").c_str()))
                                           .Int(Tag::kSignal, sig)
                                           .Int(Tag::kGroup, group ? 1 : 0));
           if (!r2.ok()) co_return co_await Fail(ex, r2.status());
           co_await ex.Respond(204, "");
         }));

  // PTY over WebSocket: binary messages are input, text messages are JSON control
  // ({"type":"resize","rows":R,"cols":C}); output comes as binary messages, the exit as a text
  // message {"type":"exit",...}, then the socket closes.
  r.Get("/v1/sandboxes/{id}/pty",
        Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
          // The owner check first, so another key's id is a 404 (and audited) however asked.
          auto rec = ctx.manager.Get(key, ex.Param("id"));
          if (!rec.ok()) co_return co_await Fail(ex, rec.status());
          if (!ex.WantsWebSocket())
            co_return co_await ex.RespondError(400, "invalid_argument",
                                               "this endpoint needs a WebSocket upgrade");
          json spec = {{"command", ex.query().Get("command").value_or("/bin/bash -l")},
                       {"pty",
                        {{"rows", IntQuery(ex, "rows", 24).ok() ? *IntQuery(ex, "rows", 24) : 24},
                         {"cols", IntQuery(ex, "cols", 80).ok() ? *IntQuery(ex, "cols", 80) : 80}}},
                       {"stdin", true}};
          if (auto u = ex.query().Get("user")) spec["user"] = *u;
          if (auto c = ex.query().Get("cwd")) spec["cwd"] = *c;
          bool bg = false;
          auto w = SpawnPayload(spec, *rec, &bg);
          if (!w.ok()) co_return co_await Fail(ex, w.status());
          auto ch = co_await ChannelOrFail(ctx, ex, key);
          if (!ch) co_return;
          auto opened = co_await ch->OpenConfirmed(Type::kSpawn, *w);
          if (!opened.ok()) co_return co_await Fail(ex, opened.status());
          auto sub = opened->sub;
          int64_t pid = opened->reply.fields.Int(Tag::kPid);
          ctx.manager.Audit("command.start", rec->id, key.id, {{"pid", pid}, {"pty", true}});
          auto ws = co_await ex.AcceptWebSocket();
          if (!ws.ok()) {
            (void)co_await ch->Call(Type::kSignal, protocol::Writer()
                                                       .Int(Tag::kPid, pid)
                                                       .Int(Tag::kSignal, SIGKILL)
                                                       .Int(Tag::kGroup, 1));
            co_return;
          }
          std::shared_ptr<http::WebSocket> sock = std::move(*ws);
          std::string start = json{{"type", "start"}, {"pid", pid}}.dump();
          (void)co_await sock->WriteText(start);
          // Input: a coroutine of its own, so output never waits for input. A free function, not a
          // lambda: a lambda coroutine's captures would die with the temporary closure.
          asio::co_spawn(sock->executor(), PtyInput(sock, ch, pid), asio::detached);
          for (;;) {
            auto f = co_await sub->Next();
            if (!f.ok()) break;
            if (f->type() == Type::kOutput) {
              if (!(co_await sock->WriteBinary(f->fields.Str(Tag::kData))).ok()) break;
            } else if (f->type() == Type::kExit) {
              (void)co_await sock->WriteText(ExitEvent(*f).dump());
              break;
            }
          }
          sub->Cancel();
          (void)co_await sock->Close();
        }));
}

void Files(http::Router& r, ApiContext& ctx) {
  r.Get("/v1/sandboxes/{id}/files",
        Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
          auto path = PathQuery(ex);
          if (!path.ok()) co_return co_await Fail(ex, path.status());
          auto ch = co_await ChannelOrFail(ctx, ex, key);
          if (!ch) co_return;
          auto sub = co_await ch->Open(Type::kRead, protocol::Writer().Str(Tag::kPath, *path));
          if (!sub.ok()) co_return co_await Fail(ex, sub.status());
          bool started = false;
          for (;;) {
            auto f = co_await (*sub)->Next(std::chrono::seconds(60));
            if (!f.ok()) {
              if (!started) co_await Fail(ex, f.status());
              break;
            }
            if (f->type() == Type::kError) {
              if (!started)
                co_await Fail(ex, Status::Error(std::string(f->fields.Str(Tag::kMessage)),
                                                static_cast<int>(f->fields.Int(Tag::kErrno, EIO))));
              break;
            }
            if (!started) {
              if (!(co_await ex.BeginStream(200, "application/octet-stream")).ok()) break;
              started = true;
            }
            if (f->type() == Type::kData) {
              if (!(co_await ex.WriteChunk(f->fields.Str(Tag::kData))).ok()) break;
            } else if (f->type() == Type::kOk) {
              (void)co_await ex.EndStream();
              break;
            }
          }
          (*sub)->Cancel();
        }));

  r.Put("/v1/sandboxes/{id}/files",
        Authed(ctx,
               [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
                 auto path = PathQuery(ex);
                 if (!path.ok()) co_return co_await Fail(ex, path.status());
                 // Only octal digits, at most 07777: "0100644" or "9" must not become another mode.
                 int64_t mode = 0;
                 if (auto m = ex.query().Get("mode")) {
                   char* end = nullptr;
                   errno = 0;
                   mode = std::strtoll(m->c_str(), &end, 8);
                   if (m->empty() || *end != '\0' || errno != 0 || mode < 0 || mode > 07777)
                     co_return co_await ex.RespondError(
                         400, "invalid_argument", "mode: octal from 0 to 7777 (got " + *m + ")");
                 }
                 auto uid = IntQuery(ex, "uid", 0), gid = IntQuery(ex, "gid", 0);
                 if (!uid.ok() || !gid.ok() || *uid < 0 || *gid < 0 || *uid > 65535 || *gid > 65535)
                   co_return co_await ex.RespondError(400, "invalid_argument",
                                                      "uid and gid: from 0 to 65535");
                 auto ch = co_await ChannelOrFail(ctx, ex, key);
                 if (!ch) co_return;
                 protocol::Writer begin;
                 begin.Str(Tag::kPath, *path)
                     .Int(Tag::kParents, 1)
                     .Int(Tag::kUid, *uid)
                     .Int(Tag::kGid, *gid);
                 if (mode > 0) begin.Int(Tag::kMode, mode);
                 auto r2 = co_await WriteBoxFileFromBody(ex, *ch, std::move(begin));
                 if (!r2.ok()) co_return co_await Fail(ex, r2.status());
                 ctx.manager.Audit("file.write", ex.Param("id"), key.id,
                                   {{"path", *path}, {"size", r2->fields.Int(Tag::kSize)}});
                 co_await ex.RespondJson(200, EntryJson(r2->fields));
               }),
        http::RouteOptions{size_t{1} << 40});

  r.Get("/v1/sandboxes/{id}/files/stat",
        Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
          auto path = PathQuery(ex);
          if (!path.ok()) co_return co_await Fail(ex, path.status());
          auto ch = co_await ChannelOrFail(ctx, ex, key);
          if (!ch) co_return;
          auto r2 = co_await ch->Call(Type::kStat, protocol::Writer().Str(Tag::kPath, *path));
          if (!r2.ok()) co_return co_await Fail(ex, r2.status());
          co_await ex.RespondJson(200, EntryJson(r2->fields));
        }));

  r.Get("/v1/sandboxes/{id}/files/list",
        Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
          auto path = PathQuery(ex);
          auto depth = IntQuery(ex, "depth", 1);
          if (!path.ok()) co_return co_await Fail(ex, path.status());
          if (!depth.ok() || *depth < 1 || *depth > protocol::kMaxListDepth)
            co_return co_await ex.RespondError(
                400, "invalid_argument",
                "depth: a whole number from 1 to " + std::to_string(protocol::kMaxListDepth) +
                    " (got " + std::string(ex.query().Get("depth").value_or("")) + ")");
          auto ch = co_await ChannelOrFail(ctx, ex, key);
          if (!ch) co_return;
          std::vector<protocol::Frame> entries;
          auto r2 = co_await ch->Call(
              Type::kList, protocol::Writer().Str(Tag::kPath, *path).Int(Tag::kDepth, *depth),
              &entries);
          if (!r2.ok()) co_return co_await Fail(ex, r2.status());
          json out = json::array();
          for (const auto& e : entries) out.push_back(EntryJson(e.fields));
          json body = {{"entries", out}};
          co_await ex.RespondJson(200, body);
        }));

  r.Post("/v1/sandboxes/{id}/files/mkdir",
         Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
           auto j = co_await ex.ReadJson();
           if (!j.ok()) co_return co_await Fail(ex, j.status());
           if (!j->contains("path") || !(*j)["path"].is_string())
             co_return co_await ex.RespondError(400, "invalid_argument", "path: required");
           auto parents_field = BoolField(*j, "parents", true);
           if (!parents_field.ok()) co_return co_await Fail(ex, parents_field.status());
           bool parents = *parents_field;
           auto ch = co_await ChannelOrFail(ctx, ex, key);
           if (!ch) co_return;
           auto r2 =
               co_await ch->Call(Type::kMkdir, protocol::Writer()
                                                   .Str(Tag::kPath, (*j)["path"].get<std::string>())
                                                   .Int(Tag::kParents, parents ? 1 : 0));
           if (!r2.ok()) co_return co_await Fail(ex, r2.status());
           co_await ex.RespondJson(200, EntryJson(r2->fields));
         }));

  r.Post("/v1/sandboxes/{id}/files/move",
         Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
           auto j = co_await ex.ReadJson();
           if (!j.ok()) co_return co_await Fail(ex, j.status());
           if (!j->contains("from") || !j->contains("to") || !(*j)["from"].is_string() ||
               !(*j)["to"].is_string())
             co_return co_await ex.RespondError(400, "invalid_argument",
                                                "from and to: required strings");
           auto ch = co_await ChannelOrFail(ctx, ex, key);
           if (!ch) co_return;
           auto r2 = co_await ch->Call(Type::kMove,
                                       protocol::Writer()
                                           .Str(Tag::kPath, (*j)["from"].get<std::string>())
                                           .Str(Tag::kNewPath, (*j)["to"].get<std::string>()));
           if (!r2.ok()) co_return co_await Fail(ex, r2.status());
           co_await ex.RespondJson(200, EntryJson(r2->fields));
         }));

  r.Delete(
      "/v1/sandboxes/{id}/files",
      Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
        auto path = PathQuery(ex);
        if (!path.ok()) co_return co_await Fail(ex, path.status());
        bool recursive = FlagQuery(ex, "recursive");
        auto ch = co_await ChannelOrFail(ctx, ex, key);
        if (!ch) co_return;
        auto r2 = co_await ch->Call(
            Type::kRemove,
            protocol::Writer().Str(Tag::kPath, *path).Int(Tag::kRecursive, recursive ? 1 : 0));
        if (!r2.ok()) co_return co_await Fail(ex, r2.status());
        co_await ex.Respond(204, "");
      }));

  r.Get("/v1/sandboxes/{id}/files/watch",
        Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
          auto path = PathQuery(ex);
          if (!path.ok()) co_return co_await Fail(ex, path.status());
          bool recursive = FlagQuery(ex, "recursive");
          auto ch = co_await ChannelOrFail(ctx, ex, key);
          if (!ch) co_return;
          auto opened = co_await ch->OpenConfirmed(
              Type::kWatch,
              protocol::Writer().Str(Tag::kPath, *path).Int(Tag::kRecursive, recursive ? 1 : 0));
          if (!opened.ok()) co_return co_await Fail(ex, opened.status());
          auto sub = opened->sub;
          if (!(co_await ex.BeginStream(200, "application/x-ndjson")).ok()) co_return;
          static const char* kEvents[] = {"", "create", "write", "remove", "rename", "chmod"};
          uint32_t watch_id = sub->id();
          // Keepalives every 15 s also tell us when the client went away.
          for (;;) {
            auto f = co_await sub->Next(std::chrono::seconds(15));
            std::string line;
            if (!f.ok() && f.status().err() == ETIMEDOUT) {
              line = json{{"type", "keepalive"}}.dump() + "\n";
            } else if (!f.ok()) {
              break;
            } else if (f->type() == Type::kWatchEvent) {
              int64_t e = f->fields.Int(Tag::kEvent);
              json event = {{"type", kEvents[(e >= 1 && e <= 5) ? e : 0]},
                            {"path", std::string(f->fields.Str(Tag::kPath))},
                            {"name", std::string(f->fields.Str(Tag::kName))}};
              line = http::JsonText(event) + "\n";
            } else {
              continue;
            }
            if (!(co_await ex.WriteChunk(line)).ok()) break;
          }
          sub->Cancel();
          (void)co_await ch->CallWithId(Type::kUnwatch, watch_id, protocol::Writer());
        }));
}

// Directories travel as tar streams made and unpacked by `tar` inside the box, as the box's user:
// whatever an archive contains (`..`, absolute names, symlink tricks) can only reach what that
// user can reach inside the box.
void Archives(http::Router& r, ApiContext& ctx) {
  r.Get("/v1/sandboxes/{id}/files/archive",
        Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
          auto path = PathQuery(ex);
          if (!path.ok()) co_return co_await Fail(ex, path.status());
          auto rec = ctx.manager.Get(key, ex.Param("id"));
          if (!rec.ok()) co_return co_await Fail(ex, rec.status());
          json spec = {{"argv", {"tar", "-C", *path, "-cf", "-", "."}}};
          if (auto u = ex.query().Get("user")) spec["user"] = *u;
          bool bg = false;
          auto w = SpawnPayload(spec, *rec, &bg);
          if (!w.ok()) co_return co_await Fail(ex, w.status());
          auto ch = co_await ChannelOrFail(ctx, ex, key);
          if (!ch) co_return;
          auto sub = co_await ch->Open(Type::kSpawn, *w);
          if (!sub.ok()) co_return co_await Fail(ex, sub.status());
          bool started = false;
          std::string err;
          for (;;) {
            auto f = co_await (*sub)->Next(std::chrono::seconds(60));
            if (!f.ok()) break;
            if (f->type() == Type::kError) {
              err = std::string(f->fields.Str(Tag::kMessage));
              break;
            }
            if (f->type() == Type::kOutput && f->fields.Int(Tag::kStream) == 2) {
              if (err.size() < 4096) err += f->fields.Str(Tag::kData);
            } else if (f->type() == Type::kOutput) {
              if (!started) {
                if (!(co_await ex.BeginStream(200, "application/x-tar")).ok()) break;
                started = true;
              }
              if (!(co_await ex.WriteChunk(f->fields.Str(Tag::kData))).ok()) break;
            } else if (f->type() == Type::kExit) {
              if (f->fields.Int(Tag::kExitCode, -1) == 0 && started) {
                (void)co_await ex.EndStream();
                started = false;
                err.clear();
              } else if (err.empty()) {
                err = "tar exited with " + std::to_string(f->fields.Int(Tag::kExitCode, -1));
              }
              break;
            }
          }
          (*sub)->Cancel();
          // A failure before any byte is an error answer; after the first byte the stream is cut
          // short (no final chunk), which a client sees as a broken transfer.
          if (!started && !ex.responded()) {
            int code = err.find("No such file") != std::string::npos ? ENOENT : EINVAL;
            co_await Fail(ex, Status::Error("archive " + *path + ": " + err, code));
          }
        }));

  r.Put("/v1/sandboxes/{id}/files/archive",
        Authed(ctx,
               [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
                 auto path = PathQuery(ex);
                 if (!path.ok()) co_return co_await Fail(ex, path.status());
                 auto rec = ctx.manager.Get(key, ex.Param("id"));
                 if (!rec.ok()) co_return co_await Fail(ex, rec.status());
                 auto ch = co_await ChannelOrFail(ctx, ex, key);
                 if (!ch) co_return;
                 auto made = co_await ch->Call(
                     Type::kMkdir, protocol::Writer().Str(Tag::kPath, *path).Int(Tag::kParents, 1));
                 if (!made.ok()) co_return co_await Fail(ex, made.status());
                 json spec = {
                     {"argv",
                      {"tar", "-C", *path, "-xf", "-", "--no-same-owner", "--no-overwrite-dir"}},
                     {"stdin", true}};
                 if (auto u = ex.query().Get("user")) spec["user"] = *u;
                 bool bg = false;
                 auto w = SpawnPayload(spec, *rec, &bg);
                 if (!w.ok()) co_return co_await Fail(ex, w.status());
                 auto opened = co_await ch->OpenConfirmed(Type::kSpawn, *w);
                 if (!opened.ok()) co_return co_await Fail(ex, opened.status());
                 auto sub = opened->sub;
                 int64_t pid = opened->reply.fields.Int(Tag::kPid);
                 std::string buf(protocol::kMaxChunk, '\0');
                 Status fed;
                 for (;;) {
                   auto n = co_await ex.ReadSome(buf.data(), buf.size());
                   if (!n.ok()) {
                     fed = n.status();
                     break;
                   }
                   if (*n == 0) break;
                   if (!(co_await WriteStdin(*ch, pid, std::string_view(buf.data(), *n))).ok())
                     break;  // tar stopped reading: its exit status says why
                 }
                 (void)co_await ch->Call(Type::kCloseStdin, protocol::Writer().Int(Tag::kPid, pid));
                 std::string err;
                 int64_t code = -1;
                 for (;;) {
                   auto f = co_await sub->Next(std::chrono::seconds(120));
                   if (!f.ok()) break;
                   if (f->type() == Type::kOutput && err.size() < 4096)
                     err += f->fields.Str(Tag::kData);
                   if (f->type() == Type::kExit) {
                     code = f->fields.Int(Tag::kExitCode, -1);
                     break;
                   }
                 }
                 sub->Cancel();
                 if (!fed.ok()) co_return;  // the client went away mid-upload
                 if (code != 0)
                   co_return co_await ex.RespondError(400, "invalid_argument",
                                                      UnpackError(*path, err));
                 ctx.manager.Audit("file.write", ex.Param("id"), key.id,
                                   {{"path", *path}, {"archive", true}});
                 co_await ex.Respond(204, "");
               }),
        http::RouteOptions{size_t{1} << 40});
}

void Audit(http::Router& r, ApiContext& ctx) {
  r.Get("/v1/audit",
        Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
          store::AuditQuery q;
          q.sandbox_id = ex.query().Get("sandbox").value_or("");
          q.type = ex.query().Get("type").value_or("");
          auto since = IntQuery(ex, "since", 0), until = IntQuery(ex, "until", 0),
               after = IntQuery(ex, "after", 0), limit = IntQuery(ex, "limit", 100);
          if (!since.ok() || !until.ok() || !after.ok() || !limit.ok() || *limit < 1 ||
              *limit > 10000)
            co_return co_await ex.RespondError(
                400, "invalid_argument",
                "since, until (ms), after (seq) and limit (1..10000) are integers");
          q.since = *since;
          q.until = *until;
          q.after_seq = *after;
          q.limit = static_cast<size_t>(*limit);
          // A key sees the events of its own sandboxes and its own requests.
          if (!q.sandbox_id.empty()) {
            auto rec = ctx.manager.Get(key, q.sandbox_id);
            if (!rec.ok()) co_return co_await Fail(ex, rec.status());
          }
          // Filtered in SQL, before the limit: another key's flood of events costs nothing here.
          // Operators read every event (sandbox.access_denied is recorded for them alone).
          if (!key.is_operator) q.key_id = key.id;
          auto events = ctx.store.QueryAudit(q);
          if (!events.ok()) co_return co_await Fail(ex, events.status());
          json out = json::array();
          for (const auto& e : *events) {
            out.push_back({{"seq", e.seq},
                           {"time", IsoTime(e.time)},
                           {"time_ms", e.time},
                           {"sandbox_id", e.sandbox_id},
                           {"type", e.type},
                           {"detail", e.detail}});
          }
          json body = {{"events", out}};
          co_await ex.RespondJson(200, body);
        }));
}

// The store's full integrity check (PRAGMA quick_check) costs time that grows with the file and
// locks the store meanwhile, so /healthz never waits for it: each call does a trivial read of the
// store and reports the last integrity result, which a call refreshes on the blocking pool when it
// is older than a minute.
struct IntegrityCache {
  static constexpr auto kMaxAge = std::chrono::minutes(1);
  std::mutex mu;
  std::optional<Clock::time_point> checked;  // guarded by mu
  bool running = false;                      // guarded by mu
  Status last;                               // guarded by mu
};

// How long /healthz trusts the store's last write to say whether it can write: a daemon that
// wrote nothing for longer gets a small probe write (Store::CheckWritable), so a disk that filled
// while it was idle shows within this time, and one that was freed too.
constexpr int64_t kWriteProbeAfterMs = 2000;

// "store cannot write: No space left on device (since ...; the last failure: ...)".
Status CannotWrite(const store::WriteHealth& h) {
  std::string reason = h.error.err() != 0 ? std::strerror(h.error.err()) : h.error.what();
  return Status::Error("store cannot write: " + reason + " (since " + IsoTime(h.failing_since) +
                           "; the last failure: " + h.error.message() + ")",
                       h.error.err());
}

void Health(http::Router& r, ApiContext& ctx) {
  auto cache = std::make_shared<IntegrityCache>();
  r.Get("/healthz", [&ctx, cache](http::Exchange& ex) -> awaitable<void> {
    Status s = co_await OnPool(ctx.blocking, [&] {
      Status read = ctx.store.Ping();
      if (!read.ok()) return read;
      store::WriteHealth h = ctx.store.CheckWritable(kWriteProbeAfterMs);
      return h.ok() ? Status() : CannotWrite(h);
    });
    {
      std::lock_guard<std::mutex> g(cache->mu);
      auto now = Clock::now();
      if (!cache->running && (!cache->checked || now - *cache->checked >= cache->kMaxAge)) {
        cache->running = true;
        asio::post(ctx.blocking, [&ctx, cache] {
          Status checked = ctx.store.CheckIntegrity();
          if (!checked.ok()) spdlog::error("store integrity: {}", checked.message());
          std::lock_guard<std::mutex> g2(cache->mu);
          cache->last = checked;
          cache->checked = Clock::now();
          cache->running = false;
        });
      }
      if (s.ok()) s = cache->last;
    }
    json body =
        s.ok() ? json{{"status", "ok"}} : json{{"status", "unhealthy"}, {"error", s.message()}};
    co_await ex.RespondJson(s.ok() ? 200 : 503, body);
  });
  // Per-sandbox series name every live sandbox: only for operator keys.
  r.Get(
      "/metrics",
      Authed(ctx, [&ctx](http::Exchange& ex, const store::ApiKeyRecord& key) -> awaitable<void> {
        if (!key.is_operator)
          co_return co_await ex.RespondError(
              403, "permission_denied",
              "/metrics needs an operator key (sbx key create --operator)");
        std::string out;
        auto live = co_await OnPool(ctx.blocking, [&] { return ctx.manager.LiveStats(); });
        std::map<std::string, int> by_state = {{"creating", 0}, {"running", 0}, {"paused", 0}};
        if (auto recs = ctx.store.ListLiveSandboxes(); recs.ok())
          for (const auto& rec : *recs) by_state[rec.state]++;
        out += "# HELP sbx_sandboxes Live sandboxes by state.\n# TYPE sbx_sandboxes gauge\n";
        for (const auto& [state, n] : by_state)
          out += "sbx_sandboxes{state=\"" + state + "\"} " + std::to_string(n) + "\n";
        auto c = ctx.manager.counters();
        out +=
            "# HELP sbx_sandbox_creations_total Sandboxes created.\n# TYPE "
            "sbx_sandbox_creations_total "
            "counter\n";
        out += "sbx_sandbox_creations_total " + std::to_string(c.creations) + "\n";
        out +=
            "# HELP sbx_sandbox_creation_failures_total Sandbox creations that failed.\n# TYPE "
            "sbx_sandbox_creation_failures_total counter\n";
        out += "sbx_sandbox_creation_failures_total " + std::to_string(c.creation_failures) + "\n";
        auto audit = ctx.store.audit_queue().counters();
        out +=
            "# HELP sbx_audit_queued Audit events in memory, waiting for the store to write "
            "again.\n# TYPE sbx_audit_queued gauge\nsbx_audit_queued " +
            std::to_string(audit.queued) + "\n";
        out +=
            "# HELP sbx_audit_queued_total Audit events the store could not take at once "
            "(queued and retried).\n# TYPE sbx_audit_queued_total counter\n"
            "sbx_audit_queued_total " +
            std::to_string(audit.queued_total) + "\n";
        out +=
            "# HELP sbx_audit_dropped_total Audit events lost (the queue was full, or held "
            "them at shutdown).\n# TYPE sbx_audit_dropped_total counter\n"
            "sbx_audit_dropped_total " +
            std::to_string(audit.dropped_total) + "\n";
        out +=
            "# HELP sbx_store_writable 1 when the store's last write succeeded, 0 when it failed "
            "for want of storage.\n# TYPE sbx_store_writable gauge\nsbx_store_writable " +
            std::string(ctx.store.WriteHealth().ok() ? "1" : "0") + "\n";
        out += "# HELP sbx_commands_total Commands started.\n# TYPE sbx_commands_total counter\n";
        // Until every facade spawns through the session, the E2B facade counts its own.
        out += "sbx_commands_total " +
               std::to_string(ctx.manager.metrics().commands.load() + ctx.metrics.commands.load()) +
               "\n";
        ctx.manager.metrics().create_seconds.Render(
            "sbx_create_seconds", "Time from create request to a running sandbox.", &out);
        ctx.manager.metrics().exec_seconds.Render(
            "sbx_exec_seconds", "Time from command request to the process running.", &out);
        out +=
            "# HELP sbx_sandbox_cpu_seconds_total CPU time used by a sandbox.\n# TYPE "
            "sbx_sandbox_cpu_seconds_total counter\n";
        for (const auto& [rec, st] : live) {
          char line[200];
          std::snprintf(line, sizeof line, "sbx_sandbox_cpu_seconds_total{sandbox=\"%s\"} %.6f\n",
                        rec.id.c_str(), st.cpu_usage_ns / 1e9);
          out += line;
        }
        out +=
            "# HELP sbx_sandbox_memory_bytes Memory used by a sandbox.\n# TYPE "
            "sbx_sandbox_memory_bytes gauge\n";
        for (const auto& [rec, st] : live)
          out += "sbx_sandbox_memory_bytes{sandbox=\"" + rec.id + "\"} " +
                 std::to_string(st.memory_current) + "\n";
        co_await ex.Respond(200, out, "text/plain; version=0.0.4");
      }));
}

}  // namespace

void RegisterV1(http::Router& router, ApiContext& ctx) {
  Health(router, ctx);
  Sandboxes(router, ctx);
  Commands(router, ctx);
  Files(router, ctx);
  Archives(router, ctx);
  Audit(router, ctx);
}

}  // namespace sbx::api
