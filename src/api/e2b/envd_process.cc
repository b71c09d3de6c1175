// process.Process (spec 2.3) onto the sandbox's agent: Start and Connect stream a process's
// events, StreamInput takes a client stream of stdin, the rest are unary.
// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include <algorithm>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <csignal>
#include <cstring>

#include "api/e2b/envd_internal.h"
#include "api/http/json.h"
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
// keepalives while it is quiet. A client that goes away leaves the process running. A sandbox
// killed meanwhile cuts the response off without an end, as E2B's edge does when a sandbox goes
// away: the SDKs then ask /health, which answers 502, and report the sandbox as killed.
awaitable<void> PumpProcess(ApiContext& ctx, const Target& t, http::Exchange& ex, AgentChannel& ch,
                            Subscription& sub, int64_t pid, bool pty) {
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
      // The agent connection ended: a kill, or the agent went away while the sandbox lives.
      sub.Cancel();
      if (co_await SandboxEnded(ctx, t)) co_return;  // no end-stream: the connection is cut
      end_code = "unavailable";
      end_message = "the sandbox's agent connection closed";
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
  co_await PumpProcess(ctx, t, ex, ch, *opened->sub, pid, pty);
}

awaitable<void> ConnectProcess(ApiContext& ctx, const Target& t, http::Exchange& ex,
                               AgentChannel& ch, const json& req) {
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
  co_await PumpProcess(ctx, t, ex, ch, *opened->sub, proc->pid, proc->pty);
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

}  // namespace

awaitable<void> ProcessRpc(ApiContext& ctx, http::Exchange& ex) {
  auto t = co_await Resolve(ctx, ex, Auth::kToken);
  if (!t) co_return;
  std::string method = ex.Param("method");
  bool streaming = method == "Start" || method == "Connect";
  std::optional<json> req;
  if (method != "StreamInput") {  // a client stream: read as it arrives
    req = co_await ReadRequest(ex, streaming);
    if (!req) co_return;
  }
  auto ch = co_await ctx.manager.Channel(t->key, t->rec.id);
  if (!ch.ok()) {
    if (streaming || method == "StreamInput")
      co_return co_await EndRpcStream(ex, "unavailable", ChannelFailure(ch.status(), t->rec.id));
    co_return co_await RpcError(ex, "unavailable", ChannelFailure(ch.status(), t->rec.id));
  }
  AgentChannel& channel = **ch;
  if (method == "StreamInput") co_return co_await StreamInput(ex, channel);
  if (method == "Start") co_return co_await Start(ctx, ex, *t, channel, *req);
  if (method == "Connect") co_return co_await ConnectProcess(ctx, *t, ex, channel, *req);
  co_await RespondUnary(ex, co_await ProcessUnary(channel, method, *req));
}

}  // namespace sbx::api::e2b
