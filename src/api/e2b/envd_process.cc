// process.Process (spec 2.3) onto the sandbox's session: Start and Connect stream a process's
// events, StreamInput takes a client stream of stdin, the rest are unary.
// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include <csignal>
#include <cstring>

#include "api/e2b/envd_internal.h"
#include "api/http/json.h"

namespace sbx::api::e2b {
namespace {

using boost::asio::awaitable;
using nlohmann::json;
using sandbox::Process;
using sandbox::ProcessEvent;
using sandbox::ProcessInfo;
using sandbox::Session;

// The process a ProcessSelector ({"pid": N} or {"tag": "x"}) names.
awaitable<Result<ProcessInfo>> Select(Session& s, const json& req, bool need_info) {
  const json sel = req.value("process", json::object());
  if (sel.contains("pid") && sel["pid"].is_number_integer() && !need_info) {
    ProcessInfo p;
    p.pid = sel["pid"].get<int64_t>();
    co_return p;
  }
  auto procs = co_await s.ListProcesses();
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

json EndEvent(const ProcessEvent& e) {
  json end = json::object();
  if (e.signal != 0) {
    std::string status = e.signal == SIGKILL   ? "signal: killed"
                         : e.signal == SIGTERM ? "signal: terminated"
                                               : "signal: " + std::string(strsignal(e.signal));
    end = {{"exitCode", -1}, {"status", status}, {"error", status}};
  } else {
    std::string status = "exit status " + std::to_string(e.exit_code);
    end = {{"exited", true}, {"status", status}};
    if (e.exit_code != 0) {
      end["exitCode"] = e.exit_code;
      end["error"] = status;
    }
  }
  return json{{"event", {{"end", end}}}};
}

// Streams a followed process as ProcessEvents: start, data..., end, the end-stream frame;
// keepalives while it is quiet. A client that goes away leaves the process running. A sandbox
// killed meanwhile cuts the response off without an end, as E2B's edge does when a sandbox goes
// away: the SDKs then ask /health, which answers 502, and report the sandbox as killed.
awaitable<void> PumpProcess(http::Exchange& ex, Process& proc) {
  Status begun = co_await ex.BeginStream(200, "application/connect+json");
  if (!begun.ok()) co_return;  // ~Process stops following
  json start = {{"event", {{"start", {{"pid", proc.pid()}}}}}};
  bool alive = co_await SendMessage(ex, start);
  const json keepalive = {{"event", {{"keepalive", json::object()}}}};
  const auto interval = KeepaliveInterval(ex);
  std::string end_code, end_message;
  while (alive) {
    auto e = co_await proc.Next(interval);
    if (!e.ok()) {
      if (e.status().err() == ETIMEDOUT) {
        alive = co_await SendMessage(ex, keepalive);
        continue;
      }
      end_code = ConnectCode(e.status().err());
      end_message = e.status().message();
      break;
    }
    if (e->kind == ProcessEvent::Kind::kOutput) {
      const char* stream = e->stream == 2 ? "stderr" : proc.pty() ? "pty" : "stdout";
      json data = {{"event", {{"data", {{stream, Base64(e->data)}}}}}};
      alive = co_await SendMessage(ex, data);
    } else if (e->kind == ProcessEvent::Kind::kExit) {
      if (e->timed_out) {
        end_code = "deadline_exceeded";
        end_message = "context deadline exceeded: the command timed out and was killed";
      } else {
        json end = EndEvent(*e);
        alive = co_await SendMessage(ex, end);
      }
      break;
    } else {
      if (SandboxEnded(e->error)) co_return;  // no end-stream: the connection is cut
      if (ConnectionLost(e->error)) {
        end_code = "unavailable";
        end_message = "the sandbox's agent connection closed";
      } else {
        end_code = ConnectCode(e->error.err());
        end_message = e->error.message();
      }
      break;
    }
  }
  if (!alive) {
    // The client went away: stop following; the process goes on.
    co_await proc.Detach();
    co_return;
  }
  co_await EndRpcStream(ex, end_code, end_message);
}

awaitable<void> Start(http::Exchange& ex, Session& s, const json& req) {
  const json p = req.value("process", json::object());
  std::string cmd = p.value("cmd", "");
  if (cmd.empty()) co_return co_await EndRpcStream(ex, "invalid_argument", "process.cmd: required");
  auto user = co_await EnvdUser(s, BasicAuthUser(ex.Header("Authorization")));
  if (!user.ok()) co_return co_await EndRpcStream(ex, "unauthenticated", user.status().message());
  sandbox::CommandSpec spec;
  spec.argv.push_back(cmd);
  // The string args only (others are left out, of the command and of its audit event).
  if (p.contains("args") && p["args"].is_array())
    for (const auto& a : p["args"])
      if (a.is_string()) spec.argv.push_back(a.get<std::string>());
  if (p.contains("envs") && p["envs"].is_object())
    for (const auto& [k, v] : p["envs"].items())
      if (v.is_string()) spec.env[k] = v.get<std::string>();
  spec.user = user->name;
  if (p.contains("cwd") && p["cwd"].is_string() && !p["cwd"].get<std::string>().empty())
    spec.cwd = Session::ResolvePath(p["cwd"].get<std::string>(), *user);
  if (req.contains("pty") && req["pty"].is_object()) {
    const json size = req["pty"].value("size", json::object());
    auto rows = IntIn(size, "rows", 24, 1, kMaxPtySide),
         cols = IntIn(size, "cols", 80, 1, kMaxPtySide);
    if (!rows.ok() || !cols.ok())
      co_return co_await EndRpcStream(
          ex, "invalid_argument", (rows.ok() ? cols : rows).status().Wrap("pty.size").message());
    spec.pty = sandbox::PtySize{static_cast<int>(*rows), static_cast<int>(*cols)};
    spec.stdin_open = true;
  } else {
    // An absent `stdin` keeps stdin open (what envd does for old SDKs).
    spec.stdin_open =
        !(req.contains("stdin") && req["stdin"].is_boolean() && !req["stdin"].get<bool>());
  }
  if (req.contains("tag") && req["tag"].is_string()) spec.tag = req["tag"].get<std::string>();
  // Connect-Timeout-Ms on Start is the process's lifetime (spec 2.3).
  if (int64_t timeout = ConnectTimeoutMs(ex); timeout > 0)
    spec.timeout = std::chrono::milliseconds(timeout);
  auto proc = co_await s.Spawn(spec);
  if (!proc.ok()) {
    Status st = proc.status();
    // A missing cwd or program is the caller's mistake, as in envd.
    std::string code = st.err() == ENOENT ? "invalid_argument" : ConnectCode(st.err());
    co_return co_await EndRpcStream(ex, code, st.message());
  }
  co_await PumpProcess(ex, **proc);
}

awaitable<void> ConnectProcess(http::Exchange& ex, Session& s, const json& req) {
  auto info = co_await Select(s, req, true);
  if (!info.ok()) co_return co_await EndRpcStream(ex, "not_found", info.status().message());
  // As in envd, Connect follows from now on: output written before it is not replayed.
  auto proc = co_await s.Attach(info->pid, -1, -1);
  if (!proc.ok())
    co_return co_await EndRpcStream(ex, ConnectCode(proc.status().err()), proc.status().message());
  co_await PumpProcess(ex, **proc);
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
awaitable<Result<json>> ProcessUnary(Session& s, const std::string& method, const json& req) {
  if (method == "List") {
    auto procs = co_await s.ListProcesses();
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
  if (method != "SendInput" && method != "SendSignal" && method != "CloseStdin" &&
      method != "Update")
    co_return Status::Error("process." + method + " is not implemented", ENOSYS);
  auto proc = co_await Select(s, req, false);
  if (!proc.ok()) co_return proc.status();
  int64_t pid = proc->pid;
  Status st;
  if (method == "SendInput") {
    const json input = req.value("input", json::object());
    std::string b64 = input.contains("stdin") ? input.value("stdin", "") : input.value("pty", "");
    auto data = Unbase64(b64);
    if (!data.ok()) co_return data.status();
    st = co_await s.WriteStdin(pid, *data);
  } else if (method == "SendSignal") {
    int sig = SignalOf(req.value("signal", json()));
    if (sig == 0) co_return Status::Error("signal: SIGNAL_SIGKILL or SIGNAL_SIGTERM", EINVAL);
    st = co_await s.Signal(pid, sig, true);
  } else if (method == "CloseStdin") {
    st = co_await s.CloseStdin(pid);
  } else {  // Update
    if (!req.contains("pty") || !req["pty"].is_object()) co_return json::object();
    const json size = req["pty"].value("size", json::object());
    auto rows = IntIn(size, "rows", 24, 1, kMaxPtySide),
         cols = IntIn(size, "cols", 80, 1, kMaxPtySide);
    if (!rows.ok()) co_return rows.status().Wrap("pty.size");
    if (!cols.ok()) co_return cols.status().Wrap("pty.size");
    st = co_await s.Resize(pid, {static_cast<int>(*rows), static_cast<int>(*cols)});
  }
  if (!st.ok()) co_return st;
  co_return json::object();
}

// Input from a client stream (envelopes as they arrive in the request body): a `start` naming the
// process, then `data` (stdin or pty bytes) and `keepalive`s. Answers once the stream ends.
awaitable<void> StreamInput(http::Exchange& ex, Session& s) {
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
        auto proc = co_await Select(s, m["start"], false);
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
        failed = co_await s.WriteStdin(*pid, *data);
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
  if (!t->session) {
    if (streaming || method == "StreamInput")
      co_return co_await EndRpcStream(ex, "unavailable", t->unavailable);
    co_return co_await RpcError(ex, "unavailable", t->unavailable);
  }
  Session& s = *t->session;
  if (method == "StreamInput") co_return co_await StreamInput(ex, s);
  if (method == "Start") co_return co_await Start(ex, s, *req);
  if (method == "Connect") co_return co_await ConnectProcess(ex, s, *req);
  co_await RespondUnary(ex, co_await ProcessUnary(s, method, *req));
}

}  // namespace sbx::api::e2b
