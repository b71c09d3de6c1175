// sbx exec and sbx logs: a command's output streamed from the daemon to this terminal, byte-exact,
// and its exit status handed back as ours (128+N for signal N, 124 on its --timeout, 126/127 when
// it cannot be run or is not found, as docker exec).
//
// Four ways to run, as docker exec: plain (POST .../commands, NDJSON until exit), -i (the command
// starts in the background with stdin open; one thread forwards our stdin, the main thread follows
// its output), -t (a PTY over the WebSocket at .../pty) and -d (started in the background; its pid
// printed for `sbx logs`).
// Boost 1.74's awaitable.hpp uses std::exchange without including <utility>.
// clang-format off
#include <utility>
// clang-format on

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <termios.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <cstdio>
#include <deque>
#include <memory>
#include <optional>
#include <thread>

#include "cli/refusals.h"
#include "cli/terminal.h"
#include "cli/units.h"
#include "cli/verbs.h"
#include "common/fd.h"

namespace sbx::cli {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace websocket = boost::beast::websocket;
using nlohmann::json;

// The exit status an exit event stands for.
int ExitStatusOf(const json& e) {
  if (e.value("timed_out", false)) {
    std::fprintf(stderr, "sbx: the command hit its --timeout and was killed\n");
    return kExitTimeout;
  }
  if (e.contains("signal") && e["signal"].is_number_integer() && e["signal"].get<int>() > 0)
    return 128 + e["signal"].get<int>();
  int code = e.value("exit_code", -1);
  return code < 0 ? kExitSbxError : code;
}

// A command that did not start: 126/127 when the box could not run it (as docker exec), else
// sbx's own 125.
int FailStart(const Status& s) {
  int code = Fail(s);
  return SpawnFailureExit(s.message()).value_or(code);
}

// The last sentence of the refusal block (cli/refusals.h) for sandbox `id`.
std::string NetHint(const std::string& id) { return "Change it with `sbx net " + id + "`."; }

// Tells on stderr what the box's network refused during the command, when its exit says.
void ReportRefusals(const json& exit, const std::string& sandbox) {
  if (auto refused = RefusalsOfExit(exit)) PrintRefusals(*refused, NetHint(sandbox));
}

// Handles a command's NDJSON events: output to our stdout/stderr, the exit remembered (and what
// the network refused meanwhile told, after the output).
class OutputSink {
 public:
  explicit OutputSink(std::string sandbox) : sandbox_(std::move(sandbox)) {}

  // Returns false to stop following.
  bool Handle(const json& e) {
    std::string type = e.value("type", "");
    if (type == "stdout" || type == "stderr") {
      auto data = DecodeBase64(e.value("data", ""));
      if (!data.ok()) {
        error_ = data.status();
        return false;
      }
      Status s = WriteAll(type == "stdout" ? 1 : 2, *data);
      if (!s.ok()) {
        error_ = s.Wrap(type);
        return false;
      }
    } else if (type == "start") {
      pid_ = e.value("pid", int64_t{0});
    } else if (type == "exit") {
      ReportRefusals(e, sandbox_);
      exit_ = ExitStatusOf(e);
      return false;
    } else if (type == "error") {
      error_ = Status::Error(e.value("message", "the output stream failed"));
      return false;
    }
    return true;
  }
  int64_t pid() const { return pid_; }

  // The verb's exit status once the stream is over (`streamed`: how the stream call ended).
  int Finish(const Status& streamed, const std::string& sandbox) const {
    if (exit_) return *exit_;
    if (!error_.ok()) return Fail(error_);
    if (!streamed.ok()) return FailStart(streamed);
    std::string hint = pid_ > 0 ? " (the command may still run: sbx logs " + sandbox + " " +
                                      std::to_string(pid_) + ")"
                                : "";
    return Fail(Status::Error("the output stream ended before the command exited" + hint));
  }

 private:
  const std::string sandbox_;
  int64_t pid_ = 0;
  std::optional<int> exit_;
  Status error_;
};

// A thread that reads our stdin in chunks until EOF or Stop().
class StdinPump {
 public:
  // `on_data` returns false to stop reading; `on_eof` runs at EOF (not after Stop or a false).
  StdinPump(std::function<bool(std::string_view)> on_data, std::function<void()> on_eof)
      : on_data_(std::move(on_data)), on_eof_(std::move(on_eof)) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) == 0) {
      stop_r_.reset(p[0]);
      stop_w_.reset(p[1]);
    }
    thread_ = std::thread([this] { Loop(); });
  }
  ~StdinPump() {
    if (stop_w_) (void)!::write(stop_w_.get(), "x", 1);
    thread_.join();
  }
  StdinPump(const StdinPump&) = delete;
  StdinPump& operator=(const StdinPump&) = delete;

 private:
  void Loop() {
    std::string buf(64 * 1024, '\0');
    for (;;) {
      pollfd fds[2] = {{0, POLLIN, 0}, {stop_r_.get(), POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[1].revents) return;
      ssize_t n = ::read(0, buf.data(), buf.size());
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {
        on_eof_();
        return;
      }
      if (!on_data_(std::string_view(buf.data(), static_cast<size_t>(n)))) return;
    }
  }

  std::function<bool(std::string_view)> on_data_;
  std::function<void()> on_eof_;
  UniqueFd stop_r_, stop_w_;
  std::thread thread_;
};

// Forwards SIGINT, SIGTERM and SIGHUP sent to sbx to the command (through .../signal) while the
// output keeps streaming, so the command decides how to end. Construct it before any other
// thread: it blocks these signals in the calling thread, which later threads inherit.
class SignalForwarder {
 public:
  SignalForwarder(Client& client, std::string sandbox)
      : client_(client), sandbox_(std::move(sandbox)) {
    sigset_t set;
    sigemptyset(&set);
    for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, s);
    ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
    sigfd_.reset(::signalfd(-1, &set, SFD_CLOEXEC));
    int p[2];
    if (::pipe2(p, O_CLOEXEC) == 0) {
      stop_r_.reset(p[0]);
      stop_w_.reset(p[1]);
    }
    thread_ = std::thread([this] { Loop(); });
  }
  ~SignalForwarder() {
    if (stop_w_) (void)!::write(stop_w_.get(), "x", 1);
    thread_.join();
  }
  SignalForwarder(const SignalForwarder&) = delete;
  SignalForwarder& operator=(const SignalForwarder&) = delete;

  void SetPid(int64_t pid) {
    pid_ = pid;
    if (int s = pending_.exchange(0)) Forward(s);
  }

 private:
  void Loop() {
    for (;;) {
      pollfd fds[2] = {{sigfd_.get(), POLLIN, 0}, {stop_r_.get(), POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[1].revents) return;
      signalfd_siginfo si{};
      if (::read(sigfd_.get(), &si, sizeof si) != sizeof si) continue;
      int sig = static_cast<int>(si.ssi_signo);
      if (pid_ > 0)
        Forward(sig);
      else
        pending_ = sig;
    }
  }
  void Forward(int sig) {
    auto r = client_.Send("POST",
                          SandboxPath(sandbox_) + "/commands/" + std::to_string(pid_) + "/signal",
                          {{"signal", sig}});
    if (r.ok() && r->status >= 300) Fail(ApiError(r->status, r->raw).Wrap("forward signal"));
  }

  Client& client_;
  std::string sandbox_;
  std::atomic<int64_t> pid_{0};
  std::atomic<int> pending_{0};
  UniqueFd sigfd_, stop_r_, stop_w_;
  std::thread thread_;
};

// ---- -t: the PTY WebSocket ----

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

bool ValidEnvName(const std::string& k) {
  if (k.empty() || (k[0] >= '0' && k[0] <= '9')) return false;
  for (char c : k)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

// One PTY session: binary messages both ways, resizes and signals as JSON text messages, the exit
// as the last text message. Async Beast on one io_context in the calling thread; our stdin comes
// from a StdinPump thread through net::post.
class PtySession {
 public:
  PtySession(Client& client, std::string sandbox)
      : client_(client),
        sandbox_(std::move(sandbox)),
        ws_(ioc_),
        signals_(ioc_, SIGWINCH, SIGINT, SIGTERM) {
    signals_.add(SIGHUP);
  }

  Status Open(const std::string& target) {
    Status s = client_.ConnectSocket(ws_.next_layer());
    if (!s.ok()) return s;
    std::string key = client_.connection().api_key;
    ws_.set_option(websocket::stream_base::decorator([key](websocket::request_type& req) {
      req.set(beast::http::field::authorization, "Bearer " + key);
    }));
    ws_.binary(true);
    boost::system::error_code ec;
    const auto& e = client_.connection().endpoint;
    ws_.handshake(e.unix_socket.empty() ? e.host : "localhost", target, ec);
    if (ec) {
      // Boost 1.74 hands back the response only on success, so the API's message for a refused
      // upgrade is lost; Exec checks the sandbox beforehand for the common causes (a process
      // that cannot start is told over the accepted socket instead).
      if (ec == websocket::error::upgrade_declined)
        return Status::Error("the daemon refused the terminal session (is the sandbox running?)");
      return client_.Unreachable(Status::Error("WebSocket handshake: " + ec.message()));
    }
    return {};
  }

  // Runs until the exit message (or the connection ends) and returns the exit status.
  int Run(bool forward_stdin) {
    Read();
    WaitSignal();
    std::optional<StdinPump> pump;
    std::optional<RawTerminal> raw;
    if (forward_stdin) {
      bool tty = ::isatty(0);
      if (tty) raw.emplace(0);
      pump.emplace(
          [this](std::string_view d) {
            net::post(ioc_, [this, d = std::string(d)] { Send(true, d); });
            return true;
          },
          [this, tty] {
            // A pipe at EOF: end the input as a terminal would, with ^D.
            if (!tty) net::post(ioc_, [this] { Send(true, "\x04"); });
          });
    }
    ioc_.run();
    pump.reset();
    raw.reset();
    if (exit_) ReportRefusals(*exit_, sandbox_);
    if (exit_) return ExitStatusOf(*exit_);
    if (!start_error_.ok()) return FailStart(start_error_);
    if (!error_.ok()) return Fail(error_);
    return Fail(Status::Error("the terminal session ended before the command exited"));
  }

 private:
  void Read() {
    ws_.async_read(buf_, [this](boost::system::error_code ec, size_t) {
      if (ec) {
        if (!exit_ && ec != websocket::error::closed)
          error_ = Status::Error("terminal session: " + ec.message());
        Finish();
        return;
      }
      std::string data = beast::buffers_to_string(buf_.data());
      buf_.consume(buf_.size());
      if (ws_.got_binary()) {
        Status s = WriteAll(1, data);
        if (!s.ok()) {
          error_ = s.Wrap("stdout");
          Finish();
          return;
        }
      } else {
        json m = json::parse(data, nullptr, false);
        if (m.is_object() && m.value("type", "") == "exit") exit_ = m;
        // The process could not start: the daemon's only message before it closes.
        if (m.is_object() && m.value("type", "") == "error" && m["message"].is_string())
          start_error_ = Status::Error(m["message"].get<std::string>());
      }
      Read();
    });
  }

  void Finish() {
    signals_.cancel();
    ioc_.stop();
  }

  void WaitSignal() {
    signals_.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec) return;
      if (sig == SIGWINCH) {
        winsize ws{};
        if (::ioctl(0, TIOCGWINSZ, &ws) == 0 || ::ioctl(1, TIOCGWINSZ, &ws) == 0)
          Send(false, json{{"type", "resize"}, {"rows", ws.ws_row}, {"cols", ws.ws_col}}.dump());
      } else {
        Send(false, json{{"type", "signal"}, {"signal", sig}}.dump());
      }
      WaitSignal();
    });
  }

  void Send(bool binary, std::string data) {
    queue_.emplace_back(binary, std::move(data));
    if (!writing_) WriteNext();
  }

  void WriteNext() {
    if (queue_.empty()) {
      writing_ = false;
      return;
    }
    writing_ = true;
    ws_.binary(queue_.front().first);
    ws_.async_write(net::buffer(queue_.front().second),
                    [this](boost::system::error_code ec, size_t) {
                      queue_.pop_front();
                      if (ec) {
                        writing_ = false;
                        queue_.clear();
                        return;  // the read side sees the end and says why
                      }
                      WriteNext();
                    });
  }

  Client& client_;
  const std::string sandbox_;
  net::io_context ioc_;
  websocket::stream<net::generic::stream_protocol::socket> ws_;
  net::signal_set signals_;
  beast::flat_buffer buf_;
  std::deque<std::pair<bool, std::string>> queue_;
  bool writing_ = false;
  std::optional<json> exit_;
  Status error_;
  Status start_error_;  // the process could not start (the daemon said why)
};

// ---- the verbs ----

struct ExecFlags {
  ConnectionFlags conn;
  std::string id;
  bool interactive = false;
  bool tty = false;
  bool detach = false;
  std::vector<std::string> env;
  std::string workdir, user, timeout;
  std::vector<std::string> command;
};

int ExecTty(Client& client, const ExecFlags& f,
            const std::vector<std::pair<std::string, std::string>>& env) {
  if (!f.timeout.empty()) return Fail(Status::Error("--timeout does not apply with -t"));
  std::string command;
  for (const auto& [k, v] : env) {
    if (!ValidEnvName(k)) return Fail(Status::Error("--env: with -t, '" + k + "' is not a name"));
    command += k + "=" + ShellQuote(v) + " ";
  }
  for (size_t i = 0; i < f.command.size(); ++i)
    command += (i ? " " : "") + ShellQuote(f.command[i]);
  winsize ws{};
  if (::ioctl(0, TIOCGWINSZ, &ws) != 0 && ::ioctl(1, TIOCGWINSZ, &ws) != 0) ws = {24, 80, 0, 0};
  std::string target = SandboxPath(f.id) + "/pty?command=" + Q(command) +
                       "&rows=" + std::to_string(ws.ws_row ? ws.ws_row : 24) +
                       "&cols=" + std::to_string(ws.ws_col ? ws.ws_col : 80);
  if (!f.user.empty()) target += "&user=" + Q(f.user);
  if (!f.workdir.empty()) target += "&cwd=" + Q(f.workdir);
  PtySession session(client, f.id);
  Status s = session.Open(target);
  if (!s.ok()) return Fail(s);
  return session.Run(f.interactive);
}

// The sandbox's OOM kills so far, -1 when its stats do not say (a paused sandbox's do).
int64_t OomKills(const json& sandbox) {
  if (!sandbox.contains("stats") || !sandbox["stats"].is_object()) return -1;
  return sandbox["stats"].value("oom_kills", int64_t{-1});
}

// A command killed by SIGKILL while the sandbox's OOM count went up was (most likely: another
// process of the sandbox may have been the one) an OOM kill: say so, as sbx run does.
int ReportOom(Client& client, const ExecFlags& f, const json& before, int status) {
  if (status != 128 + SIGKILL || OomKills(before) < 0) return status;
  auto after = client.Call("GET", SandboxPath(f.id));
  if (!after.ok() || OomKills(*after) <= OomKills(before)) return status;
  int64_t limit = 0;
  if ((*after)["limits"].is_object()) limit = (*after)["limits"].value("memory_bytes", int64_t{0});
  std::fprintf(
      stderr,
      "sbx: out of memory: the sandbox hit its memory limit%s and its OOM killer killed %lld "
      "process(es)\n",
      limit > 0 ? (" of " + FormatSize(limit)).c_str() : "",
      static_cast<long long>(OomKills(*after) - OomKills(before)));
  return status;
}

int ExecDetached(Client& client, const ExecFlags& f, const json& body) {
  auto started = client.Call("POST", SandboxPath(f.id) + "/commands", body);
  if (!started.ok()) return FailStart(started.status());
  int64_t pid = started->value("pid", int64_t{0});
  std::printf("%lld\n", static_cast<long long>(pid));
  if (::isatty(2))
    std::fprintf(stderr, "sbx: started in the background; follow it with: sbx logs %s %lld\n",
                 f.id.c_str(), static_cast<long long>(pid));
  return 0;
}

int Exec(const GlobalOptions& g, const ExecFlags& f) {
  if (f.detach && (f.interactive || f.tty))
    return Fail(Status::Error("-d does not go with -i or -t"));
  auto env = ParsePairs(f.env, "--env");
  if (!env.ok()) return Fail(env.status());
  auto client = MakeClient(g, f.conn);
  if (!client.ok()) return Fail(client.status());
  ::signal(SIGPIPE, SIG_IGN);
  // The sandbox first: an unknown id or a wrong key gets the API's own message (the answer to a
  // refused PTY upgrade does not reach us, see PtySession::Open), and its OOM count before the
  // command tells an OOM kill from another SIGKILL afterwards.
  json sandbox;
  if (!f.detach) {
    auto got = client->Call("GET", SandboxPath(f.id));
    if (!got.ok()) return Fail(got.status());
    sandbox = std::move(*got);
  }
  if (f.tty) return ReportOom(*client, f, sandbox, ExecTty(*client, f, *env));

  json body = {{"argv", f.command}};
  for (const auto& [k, v] : *env) body["env"][k] = v;
  if (!f.workdir.empty()) body["cwd"] = f.workdir;
  if (!f.user.empty()) body["user"] = f.user;
  if (!f.timeout.empty()) {
    auto ms = ParseDuration(f.timeout);
    if (!ms.ok()) return Fail(ms.status().Wrap("--timeout"));
    if (*ms <= 0) return Fail(Status::Error("--timeout: must be positive"));
    body["timeout"] = static_cast<double>(*ms) / 1000.0;
  }
  if (f.detach) {
    body["background"] = true;
    return ExecDetached(*client, f, body);
  }
  SignalForwarder signals(*client, f.id);
  OutputSink sink(f.id);
  std::string commands = SandboxPath(f.id) + "/commands";
  if (!f.interactive) {
    Status s = client->StreamEvents("POST", commands, body, [&](const json& e) {
      bool more = sink.Handle(e);
      if (e.value("type", "") == "start") signals.SetPid(sink.pid());
      return more;
    });
    return ReportOom(*client, f, sandbox, sink.Finish(s, f.id));
  }

  // -i: start in the background with stdin open, feed stdin from a thread, follow the output.
  body["stdin"] = true;
  body["background"] = true;
  auto started = client->Call("POST", commands, body);
  if (!started.ok()) return FailStart(started.status());
  int64_t pid = started->value("pid", int64_t{0});
  signals.SetPid(pid);
  std::string proc = commands + "/" + std::to_string(pid);
  Client& c = *client;
  StdinPump pump(
      [&c, proc](std::string_view data) {
        auto r = c.SendBytes("POST", proc + "/stdin", data);
        return r.ok() && r->status < 300;  // a command that has exited takes no more input
      },
      [&c, proc] { (void)c.Send("POST", proc + "/stdin/close"); });
  Status s = client->StreamEvents("GET", proc + "/output?stdout_offset=0&stderr_offset=0", nullptr,
                                  [&](const json& e) { return sink.Handle(e); });
  return ReportOom(*client, f, sandbox, sink.Finish(s, f.id));
}

struct LogsFlags {
  ConnectionFlags conn;
  std::string id;
  int64_t pid = 0;
  int64_t stdout_offset = 0, stderr_offset = 0;
};

int Logs(const GlobalOptions& g, const LogsFlags& f) {
  auto client = MakeClient(g, f.conn);
  if (!client.ok()) return Fail(client.status());
  ::signal(SIGPIPE, SIG_IGN);
  OutputSink sink(f.id);
  std::string target = SandboxPath(f.id) + "/commands/" + std::to_string(f.pid) +
                       "/output?stdout_offset=" + std::to_string(f.stdout_offset) +
                       "&stderr_offset=" + std::to_string(f.stderr_offset);
  Status s =
      client->StreamEvents("GET", target, nullptr, [&](const json& e) { return sink.Handle(e); });
  return sink.Finish(s, f.id);
}

}  // namespace

void RegisterExecVerbs(CLI::App& app, const GlobalOptions& g, ClientVerbs& verbs) {
  auto f = std::make_shared<ExecFlags>();
  CLI::App* v = app.add_subcommand(
      "exec", "Run a command in a sandbox, streaming its output; exits with its status");
  v->add_option("id", f->id, "Sandbox id")->required();
  v->add_flag("-i,--interactive", f->interactive, "Pass stdin to the command");
  v->add_flag("-d,--detach", f->detach,
              "Start the command in the background, print its pid and return (follow it with "
              "sbx logs ID PID)");
  v->add_flag("-t,--tty", f->tty,
              "Run the command on a terminal (with -i, this terminal goes raw, like docker exec "
              "-it)");
  v->add_option("-e,--env", f->env, "Environment variable K=V (repeatable)");
  v->add_option("-w,--workdir", f->workdir, "Working directory inside the sandbox");
  v->add_option("-u,--user", f->user, "User name or uid inside the sandbox (default root)");
  v->add_option("--timeout", f->timeout, "Kill the command after this long, e.g. 30s, 5m");
  v->add_option("command", f->command, "Command and arguments (after --)")->required();
  v->positionals_at_end(true);
  AddConnectionFlags(v, &f->conn, false);
  v->footer(
      "Ctrl-C (without -t) sends SIGINT to the command and keeps streaming until it exits.\n"
      "Exit status: the command's; 128+N if signal N killed it; 124 on --timeout; 126 if it\n"
      "cannot be run, 127 if it is not found; 125 if sbx itself failed.\n"
      "Example: sbx exec ID -- sh -c 'echo hi; exit 3'");
  verbs.Add(v, [f, &g] {
    // CLI11 keeps the "--" that follows the id among the positionals.
    if (!f->command.empty() && f->command[0] == "--") f->command.erase(f->command.begin());
    if (f->command.empty()) return Fail(Status::Error("exec: give a command after --"));
    return Exec(g, *f);
  });

  auto l = std::make_shared<LogsFlags>();
  CLI::App* lv = app.add_subcommand(
      "logs",
      "Follow a command's output from a byte offset until it exits (also for finished commands)");
  lv->alias("attach");
  lv->add_option("id", l->id, "Sandbox id")->required();
  lv->add_option("pid", l->pid, "Command pid (from exec, ps or the API)")->required();
  lv->add_option("--stdout-offset", l->stdout_offset, "Start stdout at this byte")
      ->check(CLI::NonNegativeNumber);
  lv->add_option("--stderr-offset", l->stderr_offset, "Start stderr at this byte")
      ->check(CLI::NonNegativeNumber);
  AddConnectionFlags(lv, &l->conn, false);
  verbs.Add(lv, [l, &g] { return Logs(g, *l); });
}

}  // namespace sbx::cli
