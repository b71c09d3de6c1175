// envd, E2B's in-sandbox daemon (spec section 2), as a translation onto the sandbox's agent:
// process.Process and filesystem.Filesystem over Connect (JSON codec, unary and server-streaming),
// GET/POST /files and /health. Requests reach it through the router's before hook when they
// carry `E2b-Sandbox-Id` (+ `E2b-Sandbox-Port`) or a Host `<port>-<id>.<domain>`.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <chrono>
#include <csignal>
#include <deque>
#include <memory>
#include <mutex>
#include <set>

#include "api/e2b/e2b.h"
#include "api/e2b/internal.h"
#include "api/e2b/wire.h"
#include "api/errors.h"
#include "api/http/exchange.h"
#include "api/v1/box_files.h"
#include "common/fs.h"
#include "protocol/wire.h"

namespace sbx::api::e2b {
namespace {

namespace asio = boost::asio;
using asio::awaitable;
using nlohmann::json;
using protocol::Tag;
using protocol::Type;
using sandbox::AgentChannel;
using sandbox::FrameError;
using sandbox::Subscription;

// Uploads stream into the box (bounded by its disk, not by the daemon's memory).
constexpr size_t kUploadLimit = size_t{1} << 40;

// The sandbox and port a request is addressed to, if it is an envd request at all.
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

// What the edge proxy answers for a sandbox (or port) that is not there: the SDK reads 502 as
// "the sandbox is gone".
awaitable<void> NotFound502(http::Exchange& ex, const std::string& id) {
  json body = {{"sandboxId", id}, {"message", "The sandbox was not found"}, {"code", 502}};
  co_await ex.RespondJson(502, body);
}

struct Target {
  store::ApiKeyRecord key;
  store::SandboxRecord rec;
  std::string token;
};

enum class Auth { kNone, kToken, kTokenOrSignature };

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

// Finds the sandbox of an envd request and checks its access token (or URL signature). Answers
// 502/401 itself and returns nullopt when the request cannot go on.
awaitable<std::optional<Target>> Resolve(ApiContext& ctx, http::Exchange& ex, Auth auth,
                                         std::string_view op = {}) {
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

// ---- Connect helpers ----

awaitable<void> RpcError(http::Exchange& ex, const std::string& code, const std::string& message) {
  json body = {{"code", code}, {"message", message}};
  co_await ex.RespondJson(ConnectHttpStatus(code), body);
}

awaitable<bool> SendMessage(http::Exchange& ex, const json& msg) {
  std::string env = Envelope(0, http::JsonText(msg));
  Status s = co_await ex.WriteChunk(env);
  co_return s.ok();
}

// Ends a server stream: the end-stream envelope (with an error when `code` is set). Starts the
// stream first if needed, since Connect streams report errors in-band with HTTP 200.
awaitable<void> EndRpcStream(http::Exchange& ex, const std::string& code = "",
                             const std::string& message = "") {
  if (!ex.responded()) {
    Status s = co_await ex.BeginStream(200, "application/connect+json");
    if (!s.ok()) co_return;
  }
  json end = json::object();
  if (!code.empty()) end["error"] = {{"code", code}, {"message", message}};
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

// A terminal's rows or columns (as the native API).
constexpr int64_t kMaxPtySide = 1000;

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

// The passwd entry of `name` inside the sandbox ("" = envd's default user: `user` when the
// template has one, else root).
awaitable<Result<User>> LookupUser(AgentChannel& ch, std::string name) {
  std::vector<protocol::Frame> data;
  auto r = co_await ch.Call(Type::kRead, protocol::Writer().Str(Tag::kPath, "/etc/passwd"), &data);
  std::string passwd;
  if (r.ok())
    for (const auto& f : data) passwd += f.fields.Str(Tag::kData);
  if (name.empty()) {
    if (auto u = FindUser(passwd, "user")) co_return *u;
    name = "root";
  }
  if (auto u = FindUser(passwd, name)) co_return *u;
  if (name == "root") co_return User{"root", 0, 0, "/root"};
  co_return Status::Error("invalid username: '" + name + "'", EACCES);
}

// ---- process.Process ----

struct ProcInfo {
  int64_t pid = 0;
  bool pty = false;
  bool running = false;
  std::vector<std::string> argv;
  std::string tag;
  std::string cwd;
};

awaitable<Result<std::vector<ProcInfo>>> ListProcs(AgentChannel& ch) {
  std::vector<protocol::Frame> entries;
  auto r = co_await ch.Call(Type::kListProcs, protocol::Writer(), &entries);
  if (!r.ok()) co_return r.status();
  std::vector<ProcInfo> out;
  for (const auto& e : entries) {
    ProcInfo p;
    p.pid = e.fields.Int(Tag::kPid);
    p.pty = e.fields.Int(Tag::kPty) != 0;
    p.running = e.fields.Int(Tag::kRunning) != 0;
    for (auto a : e.fields.All(Tag::kArgv)) p.argv.emplace_back(a);
    p.tag = std::string(e.fields.Str(Tag::kTag));
    p.cwd = std::string(e.fields.Str(Tag::kCwd));
    out.push_back(std::move(p));
  }
  co_return out;
}

// The process a ProcessSelector ({"pid": N} or {"tag": "x"}) names.
awaitable<Result<ProcInfo>> Select(AgentChannel& ch, const json& req, bool need_info) {
  const json sel = req.value("process", json::object());
  if (sel.contains("pid") && sel["pid"].is_number_integer() && !need_info) {
    ProcInfo p;
    p.pid = sel["pid"].get<int64_t>();
    co_return p;
  }
  auto procs = co_await ListProcs(ch);
  if (!procs.ok()) co_return procs.status();
  for (const auto& p : *procs) {
    if (sel.contains("pid") && sel["pid"].is_number_integer() && p.pid == sel["pid"].get<int64_t>())
      co_return p;
    if (sel.contains("tag") && sel["tag"].is_string() && p.running &&
        p.tag == sel["tag"].get<std::string>())
      co_return p;
  }
  co_return Status::Error("process with " + http::JsonSnippet(sel) + " not found", ESRCH);
}

json EndEvent(const protocol::Frame& f) {
  int64_t sig = f.fields.Int(Tag::kSignal);
  json end = json::object();
  if (sig != 0) {
    std::string status = sig == SIGKILL ? "signal: killed"
                         : sig == SIGTERM
                             ? "signal: terminated"
                             : "signal: " + std::string(strsignal(static_cast<int>(sig)));
    end = {{"exitCode", -1}, {"status", status}, {"error", status}};
  } else {
    int64_t code = f.fields.Int(Tag::kExitCode, -1);
    std::string status = "exit status " + std::to_string(code);
    end = {{"exited", true}, {"status", status}};
    if (code != 0) {
      end["exitCode"] = code;
      end["error"] = status;
    }
  }
  return json{{"event", {{"end", end}}}};
}

// Streams a subscribed process as ProcessEvents: start, data..., end, the end-stream frame;
// keepalives while it is quiet. A client that goes away leaves the process running.
awaitable<void> PumpProcess(http::Exchange& ex, AgentChannel& ch, Subscription& sub, int64_t pid,
                            bool pty) {
  Status begun = co_await ex.BeginStream(200, "application/connect+json");
  if (!begun.ok()) {
    sub.Cancel();
    co_return;
  }
  json start = {{"event", {{"start", {{"pid", pid}}}}}};
  bool alive = co_await SendMessage(ex, start);
  const json keepalive = {{"event", {{"keepalive", json::object()}}}};
  const auto interval = KeepaliveInterval(ex);
  std::string end_code, end_message;
  while (alive) {
    auto f = co_await sub.Next(interval);
    if (!f.ok()) {
      if (f.status().err() == ETIMEDOUT) {
        alive = co_await SendMessage(ex, keepalive);
        continue;
      }
      end_code = "unavailable";
      end_message = f.status().message();
      break;
    }
    if (f->type() == Type::kOutput) {
      const char* stream = f->fields.Int(Tag::kStream) == 2 ? "stderr" : pty ? "pty" : "stdout";
      json data = {{"event", {{"data", {{stream, Base64(f->fields.Str(Tag::kData))}}}}}};
      alive = co_await SendMessage(ex, data);
    } else if (f->type() == Type::kExit) {
      if (f->fields.Int(Tag::kTimedOut)) {
        end_code = "deadline_exceeded";
        end_message = "context deadline exceeded: the command timed out and was killed";
      } else {
        json end = EndEvent(*f);
        alive = co_await SendMessage(ex, end);
      }
      break;
    } else if (f->type() == Type::kError) {
      Status s = FrameError(*f);
      end_code = ConnectCode(s.err());
      end_message = s.message();
      break;
    }
  }
  sub.Cancel();
  if (!alive) {
    // The client went away: stop following; the process goes on.
    (void)co_await ch.Call(Type::kDetach, protocol::Writer().Int(Tag::kPid, pid));
    co_return;
  }
  co_await EndRpcStream(ex, end_code, end_message);
}

awaitable<void> Start(ApiContext& ctx, http::Exchange& ex, const Target& t, AgentChannel& ch,
                      const json& req) {
  const json p = req.value("process", json::object());
  std::string cmd = p.value("cmd", "");
  if (cmd.empty()) co_return co_await EndRpcStream(ex, "invalid_argument", "process.cmd: required");
  auto user = co_await LookupUser(ch, BasicAuthUser(ex.Header("Authorization")));
  if (!user.ok()) co_return co_await EndRpcStream(ex, "unauthenticated", user.status().message());
  protocol::Writer w;
  w.Str(Tag::kArgv, cmd);
  if (p.contains("args") && p["args"].is_array())
    for (const auto& a : p["args"])
      if (a.is_string()) w.Str(Tag::kArgv, a.get<std::string>());
  w.Str(Tag::kEnv, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
  std::map<std::string, std::string> env = t.rec.env;
  if (p.contains("envs") && p["envs"].is_object())
    for (const auto& [k, v] : p["envs"].items())
      if (v.is_string()) env[k] = v.get<std::string>();
  for (const auto& [k, v] : env) w.Str(Tag::kEnv, k + "=" + v);
  w.Str(Tag::kUser, user->name);
  if (p.contains("cwd") && p["cwd"].is_string() && !p["cwd"].get<std::string>().empty())
    w.Str(Tag::kCwd, ResolvePath(p["cwd"].get<std::string>(), user->home));
  bool pty = req.contains("pty") && req["pty"].is_object();
  if (pty) {
    const json size = req["pty"].value("size", json::object());
    auto rows = IntIn(size, "rows", 24, 1, kMaxPtySide),
         cols = IntIn(size, "cols", 80, 1, kMaxPtySide);
    if (!rows.ok() || !cols.ok())
      co_return co_await EndRpcStream(
          ex, "invalid_argument", (rows.ok() ? cols : rows).status().Wrap("pty.size").message());
    w.Int(Tag::kPty, 1).Int(Tag::kRows, *rows).Int(Tag::kCols, *cols).Int(Tag::kStdinOpen, 1);
  } else {
    // An absent `stdin` keeps stdin open (what envd does for old SDKs).
    bool open = !(req.contains("stdin") && req["stdin"].is_boolean() && !req["stdin"].get<bool>());
    w.Int(Tag::kStdinOpen, open ? 1 : 0);
  }
  if (req.contains("tag") && req["tag"].is_string())
    w.Str(Tag::kTag, req["tag"].get<std::string>());
  // Connect-Timeout-Ms on Start is the process's lifetime (spec 2.3).
  if (int64_t timeout = ConnectTimeoutMs(ex); timeout > 0) w.Int(Tag::kTimeoutMs, timeout);
  auto opened = co_await ch.OpenConfirmed(Type::kSpawn, w);
  if (!opened.ok()) {
    Status s = opened.status();
    // A missing cwd or program is the caller's mistake, as in envd.
    std::string code = s.err() == ENOENT ? "invalid_argument" : ConnectCode(s.err());
    co_return co_await EndRpcStream(ex, code, s.message());
  }
  int64_t pid = opened->reply.fields.Int(Tag::kPid);
  ctx.metrics.commands++;
  json argv = json::array();
  argv.push_back(cmd);
  // What was run: the string args (others were left out of the SPAWN). Never the raw value,
  // which the audit log would dump() however deep it is nested.
  if (p.contains("args") && p["args"].is_array())
    for (const auto& a : p["args"])
      if (a.is_string()) argv.push_back(a);
  ctx.manager.Audit("command.start", t.rec.id, t.key.id,
                    {{"pid", pid}, {"argv", argv}, {"pty", pty}, {"via", "e2b"}});
  co_await PumpProcess(ex, ch, *opened->sub, pid, pty);
}

awaitable<void> ConnectProcess(http::Exchange& ex, AgentChannel& ch, const json& req) {
  auto proc = co_await Select(ch, req, true);
  if (!proc.ok()) co_return co_await EndRpcStream(ex, "not_found", proc.status().message());
  // As in envd, Connect follows from now on: output written before it is not replayed.
  auto opened = co_await ch.OpenConfirmed(Type::kAttach, protocol::Writer()
                                                             .Int(Tag::kPid, proc->pid)
                                                             .Int(Tag::kStdoutOffset, -1)
                                                             .Int(Tag::kStderrOffset, -1));
  if (!opened.ok()) {
    Status s = opened.status();
    co_return co_await EndRpcStream(ex, ConnectCode(s.err()), s.message());
  }
  co_await PumpProcess(ex, ch, *opened->sub, proc->pid, proc->pty);
}

// Sends `data` to a process's stdin in agent-sized chunks, waiting while its queue is full.
awaitable<Status> WriteStdin(AgentChannel& ch, int64_t pid, std::string_view data) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  while (!data.empty()) {
    std::string_view chunk = data.substr(0, protocol::kMaxChunk);
    for (int waited_ms = 0;; waited_ms += 5) {
      auto r = co_await ch.Call(Type::kStdin,
                                protocol::Writer().Int(Tag::kPid, pid).Str(Tag::kData, chunk));
      if (r.ok()) break;
      if (r.status().err() != EAGAIN || waited_ms > 60000) co_return r.status();
      timer.expires_after(std::chrono::milliseconds(5));
      co_await timer.async_wait(asio::use_awaitable);
    }
    data.remove_prefix(chunk.size());
  }
  co_return Status();
}

int SignalOf(const json& s) {
  if (s.is_number_integer()) return s.get<int>();
  if (!s.is_string()) return 0;
  std::string name = s.get<std::string>();
  if (name == "SIGNAL_SIGKILL") return SIGKILL;
  if (name == "SIGNAL_SIGTERM") return SIGTERM;
  return 0;
}

// The unary process RPCs. Returns the response message, or a Status to map onto a Connect error.
awaitable<Result<json>> ProcessUnary(AgentChannel& ch, const std::string& method, const json& req) {
  if (method == "List") {
    auto procs = co_await ListProcs(ch);
    if (!procs.ok()) co_return procs.status();
    json list = json::array();
    for (const auto& p : *procs) {
      if (!p.running) continue;
      json args = json::array();
      for (size_t i = 1; i < p.argv.size(); ++i) args.push_back(p.argv[i]);
      json config = {
          {"cmd", p.argv.empty() ? "" : p.argv[0]}, {"args", args}, {"envs", json::object()}};
      if (!p.cwd.empty()) config["cwd"] = p.cwd;
      json info = {{"config", config}, {"pid", p.pid}};
      if (!p.tag.empty()) info["tag"] = p.tag;
      list.push_back(info);
    }
    co_return json{{"processes", list}};
  }
  auto proc = co_await Select(ch, req, false);
  if (!proc.ok()) co_return proc.status();
  int64_t pid = proc->pid;
  if (method == "SendInput") {
    const json input = req.value("input", json::object());
    std::string b64 = input.contains("stdin") ? input.value("stdin", "") : input.value("pty", "");
    auto data = Unbase64(b64);
    if (!data.ok()) co_return data.status();
    Status s = co_await WriteStdin(ch, pid, *data);
    if (!s.ok()) co_return s;
    co_return json::object();
  }
  protocol::Writer w;
  w.Int(Tag::kPid, pid);
  Type type;
  if (method == "SendSignal") {
    int sig = SignalOf(req.value("signal", json()));
    if (sig == 0) co_return Status::Error("signal: SIGNAL_SIGKILL or SIGNAL_SIGTERM", EINVAL);
    w.Int(Tag::kSignal, sig).Int(Tag::kGroup, 1);
    type = Type::kSignal;
  } else if (method == "CloseStdin") {
    type = Type::kCloseStdin;
  } else if (method == "Update") {
    if (!req.contains("pty") || !req["pty"].is_object()) co_return json::object();
    const json size = req["pty"].value("size", json::object());
    auto rows = IntIn(size, "rows", 24, 1, kMaxPtySide),
         cols = IntIn(size, "cols", 80, 1, kMaxPtySide);
    if (!rows.ok()) co_return rows.status().Wrap("pty.size");
    if (!cols.ok()) co_return cols.status().Wrap("pty.size");
    w.Int(Tag::kRows, *rows).Int(Tag::kCols, *cols);
    type = Type::kResize;
  } else {
    co_return Status::Error("process." + method + " is not implemented", ENOSYS);
  }
  auto r = co_await ch.Call(type, std::move(w));
  if (!r.ok()) co_return r.status();
  co_return json::object();
}

// Input from a client stream (envelopes as they arrive in the request body): a `start` naming the
// process, then `data` (stdin or pty bytes) and `keepalive`s. Answers once the stream ends.
awaitable<void> StreamInput(http::Exchange& ex, AgentChannel& ch) {
  ex.AllowSlowBody();  // keepalives only, while the process is quiet
  EnvelopeReader reader;
  std::optional<int64_t> pid;
  std::string buf(64 << 10, '\0');
  Status failed;
  for (bool end = false; !end && failed.ok();) {
    auto n = co_await ex.ReadSome(buf.data(), buf.size());
    if (!n.ok()) co_return;  // the client is gone
    end = *n == 0;
    reader.Feed(std::string_view(buf.data(), *n));
    for (;;) {
      auto msg = reader.Next();
      if (!msg.ok()) failed = msg.status();
      if (!failed.ok() || !*msg) break;
      const json& m = **msg;
      if (m.contains("start")) {
        auto proc = co_await Select(ch, m["start"], false);
        if (!proc.ok()) {
          failed = proc.status();
          break;
        }
        pid = proc->pid;
      } else if (m.contains("data")) {
        if (!pid) {
          failed = Status::Error("stream input: data before start", EINVAL);
          break;
        }
        const json input = m["data"].value("input", json::object());
        auto data =
            Unbase64(input.contains("stdin") ? input.value("stdin", "") : input.value("pty", ""));
        if (!data.ok()) {
          failed = data.status();
          break;
        }
        failed = co_await WriteStdin(ch, *pid, *data);
      }  // keepalive: nothing to do
    }
    if (end && failed.ok() && !reader.empty())
      failed = Status::Error("stream input: truncated envelope", EINVAL);
  }
  if (!failed.ok()) {
    int err = failed.err();
    co_return co_await EndRpcStream(ex, err == ESRCH ? "not_found" : ConnectCode(err),
                                    failed.message());
  }
  Status begun = co_await ex.BeginStream(200, "application/connect+json");
  if (!begun.ok()) co_return;
  json empty = json::object();
  if (co_await SendMessage(ex, empty)) co_await EndRpcStream(ex);
}

// ---- filesystem.Filesystem ----

awaitable<Result<protocol::Frame>> MakeDir(AgentChannel& ch, const std::string& path,
                                           const User& u) {
  auto r = co_await ch.Call(Type::kMkdir, protocol::Writer()
                                              .Str(Tag::kPath, path)
                                              .Int(Tag::kUid, u.uid)
                                              .Int(Tag::kGid, u.gid)
                                              .Int(Tag::kMode, 0755));
  if (r.ok() || r.status().err() != ENOENT) co_return r;
  co_return co_await ch.Call(Type::kMkdir, protocol::Writer()
                                               .Str(Tag::kPath, path)
                                               .Int(Tag::kParents, 1)
                                               .Int(Tag::kUid, u.uid)
                                               .Int(Tag::kGid, u.gid)
                                               .Int(Tag::kMode, 0755));
}

awaitable<Result<json>> FilesystemUnary(AgentChannel& ch, const std::string& method,
                                        const json& req, const User& u) {
  std::string path = ResolvePath(req.value("path", ""), u.home);
  if (method == "Stat") {
    auto r = co_await ch.Call(
        Type::kStat,
        protocol::Writer().Str(Tag::kPath, path).Str(Tag::kXattrPrefix, kMetadataXattrPrefix));
    if (!r.ok()) co_return r.status();
    co_return json{{"entry", EntryInfo(r->fields)}};
  }
  if (method == "ListDir") {
    // envd walks any depth; the agent at most kMaxListDepth, so deeper is refused, not cut.
    auto depth = IntIn(req, "depth", 1, 1, protocol::kMaxListDepth);
    if (!depth.ok()) co_return depth.status();
    auto st = co_await ch.Call(Type::kStat, protocol::Writer().Str(Tag::kPath, path));
    if (!st.ok()) co_return st.status();
    if (st->fields.Int(Tag::kFileType) != 2)
      co_return Status::Error("path " + path + " is not a directory", ENOTDIR);
    std::vector<protocol::Frame> entries;
    auto r = co_await ch.Call(Type::kList,
                              protocol::Writer()
                                  .Str(Tag::kPath, path)
                                  .Int(Tag::kDepth, *depth)
                                  .Str(Tag::kXattrPrefix, kMetadataXattrPrefix),
                              &entries);
    if (!r.ok()) co_return r.status();
    json list = json::array();
    for (const auto& e : entries)
      if (e.fields.Str(Tag::kPath) != path) list.push_back(EntryInfo(e.fields));
    co_return json{{"entries", list}};
  }
  if (method == "MakeDir") {
    auto r = co_await MakeDir(ch, path, u);
    if (!r.ok()) co_return r.status();
    co_return json{{"entry", EntryInfo(r->fields)}};
  }
  if (method == "Move") {
    std::string to = ResolvePath(req.value("destination", ""), u.home);
    std::string from = ResolvePath(req.value("source", ""), u.home);
    auto r = co_await ch.Call(Type::kMove, protocol::Writer()
                                               .Str(Tag::kPath, from)
                                               .Str(Tag::kNewPath, to)
                                               .Str(Tag::kXattrPrefix, kMetadataXattrPrefix));
    if (!r.ok()) co_return r.status();
    co_return json{{"entry", EntryInfo(r->fields)}};
  }
  if (method == "Remove") {
    auto r = co_await ch.Call(Type::kRemove,
                              protocol::Writer().Str(Tag::kPath, path).Int(Tag::kRecursive, 1));
    // envd removes with os.RemoveAll: a missing path is not an error.
    if (!r.ok() && r.status().err() != ENOENT) co_return r.status();
    co_return json::object();
  }
  co_return Status::Error("filesystem." + method + " is not implemented", ENOSYS);
}

// Starts an agent watch for a WatchDir or CreateWatcher request: the subscription, after the
// agent's OK.
awaitable<Result<std::shared_ptr<Subscription>>> StartWatch(AgentChannel& ch, const json& req,
                                                            const User& u) {
  std::string path = ResolvePath(req.value("path", ""), u.home);
  auto st = co_await ch.Call(Type::kStat, protocol::Writer().Str(Tag::kPath, path));
  if (!st.ok()) co_return st.status();
  if (st->fields.Int(Tag::kFileType) != 2)
    co_return Status::Error("path " + path + " is not a directory", EINVAL);
  // includeEntry (envd 0.6.3): events carry the entry as it is when the agent sees the event.
  // allowNetworkMounts (0.6.4) permits watching NFS and the like; a sandbox has no such mounts.
  auto opened = co_await ch.OpenConfirmed(
      Type::kWatch, protocol::Writer()
                        .Str(Tag::kPath, path)
                        .Int(Tag::kRecursive, BoolField(req, "recursive") ? 1 : 0)
                        .Int(Tag::kWithEntry, BoolField(req, "includeEntry") ? 1 : 0)
                        .Str(Tag::kXattrPrefix, kMetadataXattrPrefix));
  if (!opened.ok()) co_return opened.status();
  co_return opened->sub;
}

// Ends an agent watch whose subscription was cancelled.
awaitable<void> StopWatch(AgentChannel& ch, Subscription& sub) {
  sub.Cancel();
  (void)co_await ch.CallWithId(Type::kUnwatch, sub.id(), protocol::Writer());
}

// A FilesystemEvent for an agent WATCH_EVENT.
json FsEvent(const protocol::Frame& f) {
  static const char* kEvents[] = {"EVENT_TYPE_UNSPECIFIED", "EVENT_TYPE_CREATE",
                                  "EVENT_TYPE_WRITE",       "EVENT_TYPE_REMOVE",
                                  "EVENT_TYPE_RENAME",      "EVENT_TYPE_CHMOD"};
  int64_t e = f.fields.Int(Tag::kEvent);
  json fs = {{"name", std::string(f.fields.Str(Tag::kName))},
             {"type", kEvents[(e >= 1 && e <= 5) ? e : 0]}};
  protocol::Reader entry;
  if (f.fields.Has(Tag::kEntry) && entry.Parse(f.fields.Str(Tag::kEntry)))
    fs["entry"] = EntryInfo(entry);
  return fs;
}

awaitable<void> WatchDir(http::Exchange& ex, AgentChannel& ch, const json& req, const User& u) {
  auto sub = co_await StartWatch(ch, req, u);
  if (!sub.ok())
    co_return co_await EndRpcStream(ex, ConnectCode(sub.status().err()), sub.status().message());
  Status begun = co_await ex.BeginStream(200, "application/connect+json");
  bool alive = begun.ok();
  json start = {{"start", json::object()}};
  if (alive) alive = co_await SendMessage(ex, start);
  const json keepalive = {{"keepalive", json::object()}};
  const auto interval = KeepaliveInterval(ex);
  int64_t timeout_ms = ConnectTimeoutMs(ex);
  auto deadline = std::chrono::steady_clock::now() +
                  (timeout_ms > 0 ? std::chrono::milliseconds(timeout_ms)
                                  : std::chrono::milliseconds(std::chrono::hours(24 * 365)));
  bool expired = false;
  while (alive) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      expired = true;
      break;
    }
    auto f = co_await (*sub)->Next(std::min(left, interval));
    if (!f.ok()) {
      if (f.status().err() != ETIMEDOUT) break;
      if (std::chrono::steady_clock::now() < deadline) alive = co_await SendMessage(ex, keepalive);
      continue;
    }
    if (f->type() != Type::kWatchEvent) continue;
    json msg = {{"filesystem", FsEvent(*f)}};
    alive = co_await SendMessage(ex, msg);
  }
  co_await StopWatch(ch, **sub);
  if (!alive) co_return;
  if (expired)
    co_return co_await EndRpcStream(ex, "deadline_exceeded", "context deadline exceeded");
  co_await EndRpcStream(ex, "unavailable", "the sandbox's agent connection closed");
}

// ---- polled watchers (CreateWatcher, GetWatcherEvents, RemoveWatcher: Python's sync SDK) ----

// A polled watch: a coroutine drains its agent subscription into `events` (so an unpolled
// watcher never stalls the sandbox's agent channel), GetWatcherEvents takes them.
struct PolledWatch {
  // Past it the oldest are dropped: a sandbox has at most 64 watches, so a few MiB at most.
  static constexpr size_t kMaxEvents = 1024;
  std::string sandbox_id;
  std::shared_ptr<AgentChannel> channel;
  std::shared_ptr<Subscription> sub;
  std::mutex mu;
  std::deque<json> events;  // guarded by mu
};

class PolledWatches {
 public:
  void Add(const std::string& id, std::shared_ptr<PolledWatch> w) {
    std::lock_guard<std::mutex> lock(mu_);
    watches_[id] = std::move(w);
  }
  // The watch `id` of `sandbox_id`; with `remove`, also forgets it.
  std::shared_ptr<PolledWatch> Find(const std::string& id, const std::string& sandbox_id,
                                    bool remove) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = watches_.find(id);
    if (it == watches_.end() || it->second->sandbox_id != sandbox_id) return nullptr;
    auto w = it->second;
    if (remove) watches_.erase(it);
    return w;
  }
  void Forget(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    watches_.erase(id);
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<PolledWatch>> watches_;
};

// Drains a polled watch until it is removed or its sandbox's agent connection ends (then the
// watch is forgotten: GetWatcherEvents answers not_found, as envd does once the sandbox is gone).
awaitable<void> DrainWatch(std::shared_ptr<PolledWatches> all, std::string id,
                           std::shared_ptr<PolledWatch> w) {
  for (;;) {
    auto f = co_await w->sub->Next();
    if (!f.ok()) break;
    if (f->type() != Type::kWatchEvent) continue;
    json event = FsEvent(*f);
    std::lock_guard<std::mutex> lock(w->mu);
    if (w->events.size() >= PolledWatch::kMaxEvents) w->events.pop_front();
    w->events.push_back(std::move(event));
  }
  all->Forget(id);
}

awaitable<Result<json>> PolledWatchRpc(const std::shared_ptr<PolledWatches>& all,
                                       const std::shared_ptr<AgentChannel>& ch,
                                       const std::string& sandbox_id, const std::string& method,
                                       const json& req, const User& u) {
  if (method == "CreateWatcher") {
    auto sub = co_await StartWatch(*ch, req, u);
    if (!sub.ok()) co_return sub.status();
    auto w = std::make_shared<PolledWatch>();
    w->sandbox_id = sandbox_id;
    w->channel = ch;
    w->sub = *sub;
    std::string id = RandomId(16);
    all->Add(id, w);
    // No co_await in this statement: GCC 12 mishandles temporaries beside one.
    auto executor = co_await asio::this_coro::executor;
    asio::co_spawn(executor, DrainWatch(all, id, w), asio::detached);
    co_return json{{"watcherId", id}};
  }
  std::string id = req.value("watcherId", "");
  auto w = all->Find(id, sandbox_id, method == "RemoveWatcher");
  if (!w) co_return Status::Error("watcher '" + id + "' not found", ENOENT);
  if (method == "RemoveWatcher") {
    co_await StopWatch(*w->channel, *w->sub);
    co_return json::object();
  }
  json events = json::array();
  {
    std::lock_guard<std::mutex> lock(w->mu);
    for (auto& e : w->events) events.push_back(std::move(e));
    w->events.clear();
  }
  co_return json{{"events", events}};
}

// ---- dispatch of /process.Process/* and /filesystem.Filesystem/* ----

awaitable<void> Rpc(ApiContext& ctx, http::Exchange& ex, bool process,
                    std::shared_ptr<PolledWatches> watches) {
  auto t = co_await Resolve(ctx, ex, Auth::kToken);
  if (!t) co_return;
  std::string method = ex.Param("method");
  bool streaming = process ? (method == "Start" || method == "Connect") : method == "WatchDir";
  if (process && method == "StreamInput") {
    auto ch = co_await ctx.manager.Channel(t->key, t->rec.id);
    if (!ch.ok()) co_return co_await EndRpcStream(ex, "unavailable", ch.status().message());
    co_return co_await StreamInput(ex, **ch);
  }
  auto body = co_await ex.ReadBody();
  if (!body.ok()) {
    if (!ex.responded()) co_await RpcError(ex, "invalid_argument", body.status().message());
    co_return;
  }
  json req;
  if (streaming) {
    auto j = ParseEnvelopeJson(*body);
    if (!j.ok()) co_return co_await EndRpcStream(ex, "invalid_argument", j.status().message());
    req = *j;
  } else {
    req = body->empty() ? json::object() : http::ParseJsonBody(*body);
    if (req.is_discarded() || !req.is_object())
      co_return co_await RpcError(ex, "invalid_argument", "request body: not a JSON object");
  }
  auto ch = co_await ctx.manager.Channel(t->key, t->rec.id);
  if (!ch.ok()) {
    if (streaming) co_return co_await EndRpcStream(ex, "unavailable", ch.status().message());
    co_return co_await RpcError(ex, "unavailable", ch.status().message());
  }
  AgentChannel& channel = **ch;
  if (process && method == "Start") co_return co_await Start(ctx, ex, *t, channel, req);
  if (process && method == "Connect") co_return co_await ConnectProcess(ex, channel, req);
  Result<json> out = Status::Error("unknown method", ENOSYS);
  if (process) {
    out = co_await ProcessUnary(channel, method, req);
  } else {
    auto user = co_await LookupUser(channel, BasicAuthUser(ex.Header("Authorization")));
    if (!user.ok()) {
      if (streaming)
        co_return co_await EndRpcStream(ex, "unauthenticated", user.status().message());
      co_return co_await RpcError(ex, "unauthenticated", user.status().message());
    }
    if (method == "WatchDir") co_return co_await WatchDir(ex, channel, req, *user);
    if (method == "CreateWatcher" || method == "GetWatcherEvents" || method == "RemoveWatcher")
      out = co_await PolledWatchRpc(watches, *ch, t->rec.id, method, req, *user);
    else
      out = co_await FilesystemUnary(channel, method, req, *user);
  }
  if (!out.ok()) {
    int err = out.status().err();
    std::string code = err == ENOSYS ? "unimplemented" : ConnectCode(err);
    co_return co_await RpcError(ex, code, out.status().message());
  }
  co_await ex.RespondJson(200, *out);
}

// ---- /files ----

// WRITE_BEGIN of an upload to `path`: parents created, owned by `u`, with exactly `metadata`.
protocol::Writer WriteBegin(const std::string& path, const User& u, const FileMetadata& metadata) {
  protocol::Writer w;
  w.Str(Tag::kPath, path)
      .Int(Tag::kParents, 1)
      .Int(Tag::kUid, u.uid)
      .Int(Tag::kGid, u.gid)
      .Str(Tag::kXattrPrefix, kMetadataXattrPrefix);
  for (const auto& [key, value] : metadata)
    w.Nested(Tag::kXattr,
             protocol::Writer().Str(Tag::kName, kMetadataXattrPrefix + key).Str(Tag::kData, value));
  return w;
}

// The one errno table (api/errors.h), but for envd's own answer to a permission error: 401, which
// the E2B SDKs expect from /files.
int FilesStatus(int err) {
  if (err == EACCES || err == EPERM) return 401;
  return AnswerFor(err).status;
}

// An upload's answer for one file; its metadata is what the file has now (read back, as envd
// does: a filesystem without xattrs shows none).
json WriteInfo(const std::string& path, const protocol::Frame& entry) {
  json j = {{"path", path}, {"name", path.substr(path.rfind('/') + 1)}, {"type", "file"}};
  if (FileMetadata m = EntryMetadata(entry.fields); !m.empty()) j["metadata"] = m;
  return j;
}

awaitable<void> UploadError(http::Exchange& ex, const Status& s) {
  if (ex.responded()) co_return;  // the body read already answered (413, 408)
  if (IsClientGone(s)) {          // no one to answer, and no server error
    spdlog::info("envd {} {}: {}", ex.method(), ex.path(), s.message());
    co_return;
  }
  co_await JsonError(ex, FilesStatus(s.err()), s.message());
}

// The request body of an upload in pieces, inflated when it is gzip-encoded. Nothing is held
// beyond one piece: an upload of any size streams into the box.
class UploadBody {
 public:
  UploadBody(http::Exchange& ex, bool gzip)
      : ex_(ex),
        gzip_(gzip ? std::make_unique<GzipInflater>() : nullptr),
        // One piece of deflate data inflates to at most ~1000 times its size.
        buf_(gzip ? size_t{16} << 10 : protocol::kMaxChunk, '\0') {}

  // The next piece; empty at the end of the body.
  awaitable<Result<std::string>> Next() {
    for (;;) {
      auto n = co_await ex_.ReadSome(buf_.data(), buf_.size());
      if (!n.ok()) co_return BodyReadFailure(ex_, n.status(), received_);
      received_ += static_cast<int64_t>(*n);
      if (*n == 0) {
        if (gzip_) {
          Status s = gzip_->Finish();
          if (!s.ok()) co_return s;
        }
        co_return std::string();
      }
      if (!gzip_) co_return std::string(buf_.data(), *n);
      std::string out;
      Status s = gzip_->Feed(std::string_view(buf_.data(), *n), &out);
      if (!s.ok()) co_return s;
      if (!out.empty()) co_return out;
    }
  }

 private:
  http::Exchange& ex_;
  std::unique_ptr<GzipInflater> gzip_;
  std::string buf_;
  int64_t received_ = 0;
};

// A multipart upload: each `file` part streams into its own BoxWrite as it arrives.
awaitable<Status> UploadParts(UploadBody& body, BoxWrite& w, const std::string& boundary,
                              const std::string& query_path, const User& user,
                              const FileMetadata& metadata, json* written) {
  MultipartParser parser(boundary);
  std::set<std::string> seen;
  bool in_file = false;
  std::string dest;
  for (;;) {
    auto piece = co_await body.Next();
    if (!piece.ok()) co_return piece.status();
    if (piece->empty()) co_return parser.Finish();
    std::vector<MultipartParser::Event> events;
    Status s = parser.Feed(*piece, &events);
    if (!s.ok()) co_return s;
    for (auto& e : events) {
      if (e.kind == MultipartParser::Event::kPartBegin) {
        in_file = e.name == "file";  // other form fields are ignored, as by envd
        if (!in_file) continue;
        dest = ResolvePath(query_path.empty() ? e.filename : query_path, user.home);
        if (!seen.insert(dest).second)
          co_return Status::Error("cannot upload " + dest + " twice in one request", EINVAL);
        s = co_await w.Begin(WriteBegin(dest, user, metadata));
      } else if (e.kind == MultipartParser::Event::kData) {
        if (in_file) s = co_await w.Append(e.data);
      } else if (in_file) {
        auto entry = co_await w.End();
        if (!entry.ok()) co_return entry.status();
        written->push_back(WriteInfo(dest, *entry));
        in_file = false;
      }
      if (!s.ok()) co_return s;
    }
  }
}

// What a /files request works on: its sandbox, the agent channel, and the user it acts as
// (`username`). Answers 502/401 itself and returns nullopt when the request cannot go on.
struct FilesTarget {
  Target t;
  std::shared_ptr<AgentChannel> ch;
  User user;
};
awaitable<std::optional<FilesTarget>> ResolveFiles(ApiContext& ctx, http::Exchange& ex,
                                                   std::string_view op) {
  auto t = co_await Resolve(ctx, ex, Auth::kTokenOrSignature, op);
  if (!t) co_return std::nullopt;
  auto ch = co_await ctx.manager.Channel(t->key, t->rec.id);
  if (!ch.ok()) {
    co_await NotFound502(ex, t->rec.id);
    co_return std::nullopt;
  }
  auto user = co_await LookupUser(**ch, ex.query().Get("username").value_or(""));
  if (!user.ok()) {
    co_await JsonError(ex, 401, user.status().message());
    co_return std::nullopt;
  }
  FilesTarget target{std::move(*t), *ch, std::move(*user)};
  co_return target;
}

awaitable<void> Upload(ApiContext& ctx, http::Exchange& ex) {
  auto target = co_await ResolveFiles(ctx, ex, "write");
  if (!target) co_return;
  const Target& t = target->t;
  AgentChannel& ch = *target->ch;
  const User& user = target->user;
  auto metadata = UploadMetadata(ex.HeadersWithPrefix("X-Metadata-"));
  if (!metadata.ok()) co_return co_await JsonError(ex, 400, metadata.status().message());
  std::string encoding(ex.Header("Content-Encoding"));
  if (!encoding.empty() && encoding != "gzip" && encoding != "identity")
    co_return co_await JsonError(ex, 400, "unsupported Content-Encoding: " + encoding);
  std::string query_path = ex.query().Get("path").value_or("");
  std::string content_type(ex.Header("Content-Type"));
  UploadBody body(ex, encoding == "gzip");
  BoxWrite w(ch);
  json written = json::array();
  Status s;
  if (content_type.rfind("multipart/", 0) == 0) {
    auto boundary = MultipartParser::Boundary(content_type);
    if (!boundary.ok()) co_return co_await JsonError(ex, 400, boundary.status().message());
    s = co_await UploadParts(body, w, *boundary, query_path, user, *metadata, &written);
  } else {
    if (query_path.empty()) co_return co_await JsonError(ex, 400, "path: required");
    std::string dest = ResolvePath(query_path, user.home);
    s = co_await w.Begin(WriteBegin(dest, user, *metadata));
    while (s.ok()) {
      auto piece = co_await body.Next();
      if (!piece.ok()) s = piece.status();
      if (!s.ok() || piece->empty()) break;
      s = co_await w.Append(*piece);
    }
    if (s.ok()) {
      auto entry = co_await w.End();
      if (entry.ok())
        written.push_back(WriteInfo(dest, *entry));
      else
        s = entry.status();
    }
  }
  if (!s.ok()) {
    co_await w.Abort();  // the file being written keeps its old content
    co_return co_await UploadError(ex, s);
  }
  ctx.manager.Audit("file.write", t.rec.id, t.key.id, {{"files", written.size()}, {"via", "e2b"}});
  co_await ex.RespondJson(200, written);
}

awaitable<void> Download(ApiContext& ctx, http::Exchange& ex) {
  auto target = co_await ResolveFiles(ctx, ex, "read");
  if (!target) co_return;
  AgentChannel& ch = *target->ch;
  auto qp = ex.query().Get("path");
  if (!qp || qp->empty()) co_return co_await JsonError(ex, 400, "path: required");
  std::string path = ResolvePath(*qp, target->user.home);
  auto st = co_await ch.Call(Type::kStat, protocol::Writer().Str(Tag::kPath, path));
  if (!st.ok()) {
    int status = FilesStatus(st.status().err());
    std::string msg = status == 404 ? "path '" + path + "' does not exist" : st.status().message();
    co_return co_await JsonError(ex, status, msg);
  }
  if (st->fields.Int(Tag::kFileType) == 2)
    co_return co_await JsonError(ex, 400, "path '" + path + "' is a directory");
  std::string name = path.substr(path.rfind('/') + 1);
  http::Headers headers = {{"Content-Disposition", "inline; filename=\"" + name + "\""},
                           {"Vary", "Accept-Encoding"}};
  auto encoding = DownloadEncoding(ex.Header("Accept-Encoding"));
  if (!encoding) co_return co_await JsonError(ex, 406, "no acceptable content encoding");
  std::unique_ptr<GzipDeflater> gzip;
  if (*encoding == "gzip") {
    headers.emplace_back("Content-Encoding", "gzip");
    gzip = std::make_unique<GzipDeflater>();
  }
  const std::string content_type = ContentTypeFor(name);
  std::string out;
  // The empty answer only for an empty regular file: a socket or a FIFO (size 0 too) goes to the
  // agent's READ, which says what it is (ENXIO: 400).
  if (st->fields.Int(Tag::kSize) == 0 &&
      st->fields.Int(Tag::kFileType) == static_cast<int64_t>(protocol::FileType::kFile)) {
    if (gzip) (void)gzip->Finish(&out);
    co_return co_await ex.Respond(200, out, content_type, headers);
  }
  auto sub = co_await ch.Open(Type::kRead, protocol::Writer().Str(Tag::kPath, path));
  if (!sub.ok()) co_return co_await JsonError(ex, 500, sub.status().message());
  bool started = false;
  for (;;) {
    auto f = co_await (*sub)->Next(std::chrono::seconds(60));
    if (!f.ok() || f->type() == Type::kError) {
      if (!started) {
        Status s = FrameError(f);
        co_await JsonError(ex, FilesStatus(s.err()), s.message());
      }
      break;  // after the first byte the transfer is cut short
    }
    if (!started) {
      if (!(co_await ex.BeginStream(200, content_type, headers)).ok()) break;
      started = true;
    }
    if (f->type() == Type::kData) {
      std::string_view data = f->fields.Str(Tag::kData);
      if (gzip) {
        out.clear();
        if (!gzip->Feed(data, &out).ok()) break;
        data = out;
      }
      if (!(co_await ex.WriteChunk(data)).ok()) break;
    } else if (f->type() == Type::kOk) {
      out.clear();
      if (gzip && !gzip->Finish(&out).ok()) break;
      Status last = co_await ex.WriteChunk(out);  // empty: a no-op
      if (last.ok()) (void)co_await ex.EndStream();
      break;
    }
  }
  (*sub)->Cancel();
}

// ---- other ports ----

// A request for another port of a sandbox (`E2b-Sandbox-Port`, or a Host `<port>-<id>.<domain>`):
// relayed to that port on the sandbox's loopback, as E2B's edge proxy does. Unless the sandbox
// was made with public ports, it must carry the sandbox's traffic token (E2B-Traffic-Access-Token)
// or its envd token (X-Access-Token): knowing an id is not enough.
awaitable<void> ProxyPort(ApiContext& ctx, http::Exchange& ex, int port, std::string id) {
  auto rec = ctx.store.GetSandbox(id);
  if (port < 1 || port > 65535 || !rec.ok() || !*rec || (*rec)->state != store::kStateRunning)
    co_return co_await NotFound502(ex, id);
  auto key = ctx.store.GetApiKey((*rec)->owner_key_id);
  if (!key.ok() || !*key || !(*key)->active()) co_return co_await NotFound502(ex, id);
  const store::ApiKeyRecord& owner = **key;
  if (!(*rec)->public_ports &&
      !ConstantTimeEquals(ex.Header("E2B-Traffic-Access-Token"),
                          TrafficToken(ctx.secret, owner.id, id)) &&
      !ConstantTimeEquals(ex.Header("X-Access-Token"), EnvdToken(ctx.secret, owner.id, id))) {
    json body = {{"sandboxId", id},
                 {"message",
                  "a valid E2B-Traffic-Access-Token (the sandbox's trafficAccessToken) "
                  "is required to reach its ports"},
                 {"code", 403}};
    co_return co_await ex.RespondJson(403, body);
  }
  auto socket = co_await OnPool(ctx.blocking, [&] { return ctx.manager.TcpSocket(owner, id); });
  if (!socket.ok()) co_return co_await NotFound502(ex, id);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // The tenant's API key is never handed to a sandbox (a client may send it out of habit); the
  // sandbox-scoped tokens go through, since a server in the box may check them (envd does).
  std::string head = ex.ForwardHead({"X-API-KEY"});
  Status s = co_await ex.Relay(std::move(*socket), to, std::move(head));
  if (!s.ok() && !ex.responded()) {
    json body = {{"sandboxId", id},
                 {"message", "The sandbox is running but port is not open"},
                 {"port", port},
                 {"code", 502}};
    co_await ex.RespondJson(502, body);
  }
}

}  // namespace

void RegisterEnvd(http::Router& r, ApiContext& ctx) {
  auto watches = std::make_shared<PolledWatches>();
  r.Post("/process.Process/{method}",
         [&ctx, watches](http::Exchange& ex) { return Rpc(ctx, ex, true, watches); });
  r.Post("/filesystem.Filesystem/{method}",
         [&ctx, watches](http::Exchange& ex) { return Rpc(ctx, ex, false, watches); });
  r.Get("/files", [&ctx](http::Exchange& ex) { return Download(ctx, ex); });
  r.Post(
      "/files", [&ctx](http::Exchange& ex) { return Upload(ctx, ex); },
      http::RouteOptions{kUploadLimit});
  r.Get("/health", [&ctx](http::Exchange& ex) -> awaitable<void> {
    auto t = co_await Resolve(ctx, ex, Auth::kNone);
    if (!t) co_return;
    co_await ex.Respond(204, "");
  });
}

}  // namespace sbx::api::e2b

namespace sbx::api {

void RegisterE2b(http::Router& router, ApiContext& ctx) {
  e2b::RegisterControlPlane(router, ctx);
  auto envd = std::make_shared<http::Router>();
  e2b::RegisterEnvd(*envd, ctx);
  // envd shares the control plane's port: requests addressed to a sandbox go to envd's routes,
  // or, for another port of the sandbox, through to that port.
  router.SetBefore([envd, &ctx](http::Exchange& ex) -> boost::asio::awaitable<bool> {
    bool presigned = ex.path() == "/files" && ex.query().Has("signature");
    auto address = e2b::EnvdAddress(ex);
    if (!presigned && !address) co_return true;
    if (address && address->first != e2b::kEnvdPort) {
      co_await e2b::ProxyPort(ctx, ex, address->first, address->second);
      co_return false;
    }
    co_await envd->Dispatch(ex);
    co_return false;
  });
}

}  // namespace sbx::api
