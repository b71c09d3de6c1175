// The session layer (session.h): every operation on a running sandbox as agent requests
// (docs/agent-protocol.md), with the audit event and metric of each.
#include "sandbox/session.h"

#include <signal.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "common/clock.h"
#include "sandbox/agent_channel.h"
#include "sandbox/manager.h"

namespace sbx::sandbox {
namespace {

namespace asio = boost::asio;
using nlohmann::json;
using protocol::Frame;
using protocol::Tag;
using protocol::Type;
using protocol::Writer;
using Clock = std::chrono::steady_clock;

bool HasNul(std::string_view s) { return s.find('\0') != std::string_view::npos; }

// An environment variable's name as execve takes it: non-empty, no '=' and no NUL.
bool ValidEnvName(std::string_view k) { return !k.empty() && k.find('=') == k.npos && !HasNul(k); }

Status BadEnv(const char* source, std::string_view k) {
  return Status::Error(std::string(source) + ": invalid variable name '" +
                           std::string(k.substr(0, 64)) + "' (no '=', NUL or empty names)",
                       EINVAL);
}

}  // namespace

// ---- SpawnRequest: the one merge of a command's defaults ----

Result<Writer> SpawnRequest(const TemplateDefaults& defaults,
                            const std::map<std::string, std::string>& sandbox_env,
                            const CommandSpec& spec) {
  if (spec.argv.empty() || spec.argv[0].empty())
    return Status::Error("argv: a non-empty list of strings, the program first", EINVAL);
  Writer w;
  for (const auto& a : spec.argv) {
    if (HasNul(a)) return Status::Error("argv: NUL byte in an argument", EINVAL);
    w.Str(Tag::kArgv, a);
  }
  // One value per variable: the command's over the sandbox's over the template's. PATH, HOME,
  // USER... that none of them sets come from the agent, for the user the command runs as.
  std::map<std::string, std::string> env;
  for (const auto& e : defaults.env) {
    size_t eq = e.find('=');
    if (eq == std::string::npos || !ValidEnvName(std::string_view(e).substr(0, eq))) continue;
    env[e.substr(0, eq)] = e.substr(eq + 1);
  }
  for (const auto& [k, v] : sandbox_env) {
    if (!ValidEnvName(k)) return BadEnv("sandbox env", k);
    if (HasNul(v)) return Status::Error("sandbox env: NUL byte in " + k, EINVAL);
    env[k] = v;
  }
  for (const auto& [k, v] : spec.env) {
    if (!ValidEnvName(k)) return BadEnv("env", k);
    if (HasNul(v)) return Status::Error("env: NUL byte in the value of " + k, EINVAL);
    env[k] = v;
  }
  for (const auto& [k, v] : env) w.Str(Tag::kEnv, k + "=" + v);
  const std::string& cwd = spec.cwd.empty() ? defaults.workdir : spec.cwd;
  if (HasNul(cwd)) return Status::Error("cwd: NUL byte", EINVAL);
  if (!cwd.empty()) w.Str(Tag::kCwd, cwd);  // relative: the agent puts it below the home
  const std::string& user = spec.user.empty() ? defaults.user : spec.user;
  if (HasNul(user)) return Status::Error("user: NUL byte", EINVAL);
  // Root needs no lookup, so a rootfs without /etc/passwd still runs as root.
  if (!user.empty() && user != "root" && user != "0") w.Str(Tag::kUser, user);
  if (spec.pty) {
    if (spec.pty->rows < 1 || spec.pty->cols < 1 || spec.pty->rows > kMaxPtySide ||
        spec.pty->cols > kMaxPtySide)
      return Status::Error("pty: rows and cols from 1 to " + std::to_string(kMaxPtySide), EINVAL);
    w.Int(Tag::kPty, 1).Int(Tag::kRows, spec.pty->rows).Int(Tag::kCols, spec.pty->cols);
  }
  if (spec.stdin_open || spec.pty) w.Int(Tag::kStdinOpen, 1);
  if (spec.timeout.count() < 0) return Status::Error("timeout: must not be negative", EINVAL);
  if (spec.timeout.count() > 0) w.Int(Tag::kTimeoutMs, spec.timeout.count());
  if (!spec.tag.empty()) w.Str(Tag::kTag, spec.tag);
  // Headroom for the frame header is not needed (kMaxPayload is the payload's own bound).
  if (w.size() > protocol::kMaxPayload)
    return Status::Error("command: argv and env take more than " +
                             std::to_string(protocol::kMaxPayload >> 10) + " KiB",
                         EINVAL);
  return w;
}

// ---- entries ----

FileEntry EntryFromFields(const protocol::Reader& f) {
  FileEntry e;
  e.path = std::string(f.Str(Tag::kPath));
  e.name = std::string(f.Str(Tag::kName));
  int64_t t = f.Int(Tag::kFileType);
  e.type = (t >= 1 && t <= 4) ? static_cast<FileEntry::Type>(t) : FileEntry::Type::kOther;
  e.size = f.Int(Tag::kSize);
  e.mode = f.Int(Tag::kMode);
  e.mtime_ns = f.Int(Tag::kMtimeNs);
  e.uid = f.Int(Tag::kUid);
  e.gid = f.Int(Tag::kGid);
  e.owner = std::string(f.Str(Tag::kOwner));
  e.group = std::string(f.Str(Tag::kGroupName));
  e.link_target = std::string(f.Str(Tag::kLinkTarget));
  const std::string_view prefix = kMetadataXattrPrefix;
  for (std::string_view x : f.All(Tag::kXattr)) {
    protocol::Reader r;
    if (!r.Parse(x)) continue;
    std::string_view name = r.Str(Tag::kName);
    if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) continue;
    e.metadata.emplace(name.substr(prefix.size()), r.Str(Tag::kData));
  }
  return e;
}

// ---- the exit of a process, audited once ----

// Shared by whoever learns of a process's exit first: the Process following it (which sees the
// EXIT before the facade does, so the event is handed to the audit queue before the client reads
// the exit, and any read of the log after that finds it) and the WAIT watcher its follower starts
// when it stops following before the exit (a detach, a client gone, a dropped channel).
struct ExitOnce {
  ExitOnce(Manager& m, std::string sandbox, std::string key, std::string facade, int64_t p)
      : manager(m),
        sandbox_id(std::move(sandbox)),
        key_id(std::move(key)),
        via(std::move(facade)),
        pid(p) {}
  void Record(int64_t exit_code, int64_t signal, bool timed_out, bool oom) {
    if (done.exchange(true)) return;
    json detail = {{"pid", pid}, {"exit_code", exit_code}, {"via", via}};
    if (signal != 0) detail["signal"] = signal;
    if (timed_out) detail["timed_out"] = true;
    if (oom) detail["oom"] = true;
    manager.AuditSoon("command.exit", sandbox_id, key_id, std::move(detail));
  }
  std::atomic<bool> done{false};
  Manager& manager;
  const std::string sandbox_id, key_id, via;
  const int64_t pid;
};

namespace {

// WAIT for `pid`'s exit (held by the agent until then) and audit it, unless a follower did. A
// dropped channel is retried on a new one a few times (the process may have outlived it).
asio::awaitable<void> WatchExit(std::shared_ptr<Session> s, std::shared_ptr<AgentChannel> ch,
                                int64_t pid, std::shared_ptr<ExitOnce> once) {
  for (int attempt = 0; attempt < 3 && !once->done; ++attempt) {
    auto r = co_await ch->Call(Type::kWait, Writer().Int(Tag::kPid, pid), nullptr,
                               AgentChannel::kForever);
    if (r.ok()) {
      once->Record(r->fields.Int(Tag::kExitCode, -1), r->fields.Int(Tag::kSignal),
                   r->fields.Int(Tag::kTimedOut) != 0, false);
      co_return;
    }
    // ESRCH: it is gone (pruned, or the box restarted); EINVAL: an agent older than WAIT.
    if (r.status().err() != ECONNRESET) co_return;
    auto again = co_await s->Channel();
    if (!again.ok()) co_return;  // the sandbox ended: its end is audited as such
    ch = *again;
  }
}

class ProcessImpl : public Process {
 public:
  ProcessImpl(asio::any_io_executor ex, std::shared_ptr<Session> session,
              std::shared_ptr<AgentChannel> ch, std::shared_ptr<Subscription> sub, int64_t pid,
              bool pty, std::shared_ptr<ExitOnce> once, uint64_t oom_base, int64_t started_ms)
      : ex_(std::move(ex)),
        session_(std::move(session)),
        ch_(std::move(ch)),
        sub_(std::move(sub)),
        pid_(pid),
        pty_(pty),
        once_(std::move(once)),
        oom_base_(oom_base),
        started_ms_(started_ms) {}

  ~ProcessImpl() override {
    if (ended_) return;
    sub_->Cancel();
    // Stop the agent sending what nobody reads; the process goes on.
    asio::co_spawn(ex_, DetachCall(ch_, pid_), asio::detached);
    WatchUnfollowed();
  }

  int64_t pid() const override { return pid_; }
  bool pty() const override { return pty_; }

  Awaitable<Result<ProcessEvent>> Next(std::chrono::milliseconds timeout) override {
    if (ended_) co_return Status::Error("pid " + std::to_string(pid_) + ": stream ended", ENODATA);
    for (;;) {
      auto f = co_await sub_->Next(timeout);
      if (!f.ok() && f.status().err() == ETIMEDOUT) co_return f.status();
      ProcessEvent e;
      if (!f.ok()) {
        ended_ = true;
        WatchUnfollowed();  // on a new channel: the process may outlive this one
        e.kind = ProcessEvent::Kind::kError;
        e.error = session_->Ended(f.status());
        co_return e;
      }
      switch (f->type()) {
        case Type::kOutput:
          e.kind = ProcessEvent::Kind::kOutput;
          e.stream = f->fields.Int(Tag::kStream) == 2 ? 2 : 1;
          e.offset = f->fields.Int(Tag::kOffset);
          e.data = std::string(f->fields.Str(Tag::kData));
          co_return e;
        case Type::kExit:
          ended_ = true;
          sub_->Cancel();
          e.kind = ProcessEvent::Kind::kExit;
          e.exit_code = f->fields.Int(Tag::kExitCode, -1);
          e.signal = static_cast<int>(f->fields.Int(Tag::kSignal));
          e.timed_out = f->fields.Int(Tag::kTimedOut) != 0;
          // The kernel's OOM killer sends SIGKILL; the box's cgroup counts its kills.
          if (e.signal == SIGKILL && !e.timed_out)
            e.oom = session_->manager().OomKills(session_->id()) > oom_base_;
          if (once_) once_->Record(e.exit_code, e.signal, e.timed_out, e.oom);
          // The resolver and the proxy record a refusal before the box hears of it, so every
          // refusal the command saw is in by now.
          e.network_refused = session_->manager().NetworkRefusals(session_->id(), started_ms_);
          co_return e;
        case Type::kError:
          ended_ = true;
          sub_->Cancel();
          WatchUnfollowed();
          e.kind = ProcessEvent::Kind::kError;
          e.error = FrameError(*f);
          co_return e;
        default:
          continue;  // the OK of SPAWN or ATTACH
      }
    }
  }

  Awaitable<void> Detach() override {
    if (ended_) co_return;
    ended_ = true;
    sub_->Cancel();
    co_await DetachCall(ch_, pid_);
    WatchUnfollowed();
  }

 private:
  // A process spawned here whose exit this follower will not see: the WAIT watcher audits it
  // (at once when it has exited already: the agent keeps a finished process for minutes). A
  // followed one needs no watcher, and no WAIT round trip to the agent on every exec.
  void WatchUnfollowed() {
    if (once_ && !once_->done)
      asio::co_spawn(ex_, WatchExit(session_, ch_, pid_, once_), asio::detached);
  }

  static asio::awaitable<void> DetachCall(std::shared_ptr<AgentChannel> ch, int64_t pid) {
    (void)co_await ch->Call(Type::kDetach, Writer().Int(Tag::kPid, pid));
  }

  asio::any_io_executor ex_;
  std::shared_ptr<Session> session_;
  std::shared_ptr<AgentChannel> ch_;
  std::shared_ptr<Subscription> sub_;
  const int64_t pid_;
  const bool pty_;
  std::shared_ptr<ExitOnce> once_;  // null when attached (no exit to audit from here)
  const uint64_t oom_base_;
  const int64_t started_ms_;
  bool ended_ = false;  // exit, error or detach seen: nothing more to follow or detach
};

class ReaderImpl : public FileReader {
 public:
  ReaderImpl(std::shared_ptr<Session> s, std::shared_ptr<Subscription> sub)
      : session_(std::move(s)), sub_(std::move(sub)) {}
  ~ReaderImpl() override { sub_->Cancel(); }
  Awaitable<Result<std::string>> Next() override {
    while (!done_) {
      // A minute without a piece: the agent is stuck (a FIFO, a frozen box).
      auto f = co_await sub_->Next(std::chrono::seconds(60));
      if (!f.ok()) {
        done_ = true;
        co_return session_->Ended(f.status());
      }
      if (f->type() == Type::kError) {
        done_ = true;
        co_return FrameError(*f);
      }
      if (f->type() == Type::kOk) break;
      if (f->type() == Type::kData && !f->fields.Str(Tag::kData).empty())
        co_return std::string(f->fields.Str(Tag::kData));
    }
    done_ = true;
    sub_->Cancel();
    co_return std::string();
  }

 private:
  std::shared_ptr<Session> session_;
  std::shared_ptr<Subscription> sub_;
  bool done_ = false;
};

// WRITE_BEGIN (done by Session::Write), WRITE_DATA..., WRITE_END or WRITE_ABORT under one id.
// Every write that began ends with one of them: an abandoned one would keep its temporary file in
// the box until the agent connection closes, and that connection is shared and long-lived.
class WriterImpl : public FileWriter {
 public:
  WriterImpl(asio::any_io_executor ex, std::shared_ptr<Session> s, std::shared_ptr<AgentChannel> ch,
             uint32_t id, std::string path)
      : ex_(std::move(ex)),
        session_(std::move(s)),
        ch_(std::move(ch)),
        id_(id),
        path_(std::move(path)) {}
  ~WriterImpl() override {
    if (open_) asio::co_spawn(ex_, AbortCall(ch_, id_), asio::detached);
  }
  Awaitable<Status> Append(std::string_view data) override {
    if (!open_) co_return Status::Error("write " + path_ + ": not open", EBADF);
    while (!data.empty()) {
      std::string_view chunk = data.substr(0, protocol::kMaxChunk);
      Status s = co_await ch_->Send(Type::kWriteData, id_, Writer().Str(Tag::kData, chunk));
      if (!s.ok()) co_return session_->Ended(s);
      data.remove_prefix(chunk.size());
    }
    co_return Status();
  }
  Awaitable<Result<FileEntry>> End() override {
    if (!open_) co_return Status::Error("write " + path_ + ": not open", EBADF);
    open_ = false;
    auto r = co_await ch_->CallWithId(Type::kWriteEnd, id_, Writer());
    if (!r.ok()) co_return session_->Ended(r.status());
    FileEntry e = EntryFromFields(r->fields);
    session_->Audit("file.write", {{"path", e.path.empty() ? path_ : e.path}, {"size", e.size}});
    co_return e;
  }
  Awaitable<void> Abort() override {
    if (!open_) co_return;
    open_ = false;
    co_await AbortCall(ch_, id_);
  }

 private:
  static asio::awaitable<void> AbortCall(std::shared_ptr<AgentChannel> ch, uint32_t id) {
    (void)co_await ch->CallWithId(Type::kWriteAbort, id, Writer());
  }
  asio::any_io_executor ex_;
  std::shared_ptr<Session> session_;
  std::shared_ptr<AgentChannel> ch_;
  const uint32_t id_;
  const std::string path_;
  bool open_ = true;
};

class WatchImpl : public Watch {
 public:
  WatchImpl(asio::any_io_executor ex, std::shared_ptr<Session> s, std::shared_ptr<AgentChannel> ch,
            std::shared_ptr<Subscription> sub)
      : ex_(std::move(ex)), session_(std::move(s)), ch_(std::move(ch)), sub_(std::move(sub)) {}
  ~WatchImpl() override {
    sub_->Cancel();  // first: while the id is subscribed, UNWATCH with it answers EBUSY
    asio::co_spawn(ex_, Unwatch(ch_, sub_->id()), asio::detached);
  }
  Awaitable<Result<WatchEvent>> Next(std::chrono::milliseconds timeout) override {
    for (;;) {
      auto f = co_await sub_->Next(timeout);
      if (!f.ok()) {
        if (f.status().err() == ETIMEDOUT) co_return f.status();
        co_return session_->Ended(f.status());
      }
      if (f->type() == Type::kError) co_return FrameError(*f);
      if (f->type() != Type::kWatchEvent) continue;
      WatchEvent e;
      int64_t t = f->fields.Int(Tag::kEvent);
      e.type = (t >= 1 && t <= 5) ? static_cast<WatchEvent::Type>(t) : WatchEvent::Type::kWrite;
      e.path = std::string(f->fields.Str(Tag::kPath));
      e.name = std::string(f->fields.Str(Tag::kName));
      if (f->fields.Has(Tag::kEntry)) {
        protocol::Reader inner;
        if (inner.Parse(f->fields.Str(Tag::kEntry))) e.entry = EntryFromFields(inner);
      }
      co_return e;
    }
  }
  void Cancel() override { sub_->Cancel(); }

 private:
  static asio::awaitable<void> Unwatch(std::shared_ptr<AgentChannel> ch, uint32_t id) {
    (void)co_await ch->CallWithId(Type::kUnwatch, id, Writer());
  }
  asio::any_io_executor ex_;
  std::shared_ptr<Session> session_;
  std::shared_ptr<AgentChannel> ch_;
  std::shared_ptr<Subscription> sub_;
};

}  // namespace

// ---- Session ----

Session::Session(Manager& manager, store::ApiKeyRecord key, store::SandboxRecord record,
                 std::string via, std::shared_ptr<AgentChannel> channel)
    : manager_(manager),
      key_(std::move(key)),
      record_(std::move(record)),
      via_(std::move(via)),
      channel_(std::move(channel)) {}

Awaitable<Result<std::shared_ptr<Session>>> Session::Open(Manager& manager,
                                                          const store::ApiKeyRecord& key,
                                                          const std::string& id, std::string via) {
  // The channel is the owner and state check for use (ENOENT, EBUSY when paused).
  store::SandboxRecord rec;
  auto ch = co_await manager.Channel(key, id, &rec);
  if (!ch.ok()) co_return ch.status();
  co_return std::make_shared<Session>(manager, key, std::move(rec), std::move(via), std::move(*ch));
}

Awaitable<Result<std::shared_ptr<AgentChannel>>> Session::Channel() {
  {
    MutexLock g(mu_);
    if (channel_ && !channel_->closed()) co_return channel_;
  }
  auto ch = co_await manager_.Channel(key_, record_.id);
  if (!ch.ok()) co_return ch.status();
  MutexLock g(mu_);
  channel_ = *ch;
  co_return *ch;
}

Status Session::Ended(const Status& s) {
  int err = s.err();
  if (err != ECONNRESET && err != EPROTO && err != ECANCELED && err != EPIPE) return s;
  // Once a transition in flight is done: a kill closes the agent connection before it records
  // the end, so the record read at once could still say running. (Blocks only while one is.)
  auto rec = manager_.Settled(key_, record_.id);
  if (!rec.ok()) return s;
  if (rec->state == store::kStateKilled)
    return Status::Error("sandbox " + record_.id + " was killed", ENOENT);
  if (rec->state == store::kStateFailed)
    return Status::Error("sandbox " + record_.id + " failed", ENOENT);
  return s;
}

void Session::Audit(const std::string& type, json detail) {
  if (!detail.is_object()) detail = json::object();
  detail["via"] = via_;
  manager_.AuditSoon(type, record_.id, key_.id, std::move(detail));
}

Awaitable<Result<Frame>> Session::Call(Type type, Writer w, std::vector<Frame>* stream) {
  auto ch = co_await Channel();
  if (!ch.ok()) co_return ch.status();
  auto r = co_await (*ch)->Call(type, std::move(w), stream);
  if (!r.ok()) co_return Ended(r.status());
  co_return r;
}

// ---- users ----

Awaitable<Result<User>> Session::ResolveUser(const std::string& name) {
  std::string who = name.empty() ? record_.defaults.user : name;
  if (who.empty()) who = "root";
  if (HasNul(who)) co_return Status::Error("user: NUL byte", EINVAL);
  auto r = co_await Call(Type::kLookupUser, Writer().Str(Tag::kUser, who));
  if (!r.ok()) co_return r.status();
  User u;
  u.name = std::string(r->fields.Str(Tag::kName));
  u.uid = r->fields.Int(Tag::kUid);
  u.gid = r->fields.Int(Tag::kGid);
  u.home = std::string(r->fields.Str(Tag::kPath, "/"));
  if (u.home.empty()) u.home = "/";
  co_return u;
}

std::string Session::ResolvePath(std::string_view path, const User& u) {
  if (!path.empty() && path[0] == '/') return std::string(path);
  if (path == "~") path = "";
  if (path.substr(0, 2) == "~/") path.remove_prefix(2);
  std::string home = u.home.empty() ? "/" : u.home;
  if (path.empty()) return home;
  if (home.back() != '/') home += '/';
  return home + std::string(path);
}

// ---- processes ----

Awaitable<Result<std::unique_ptr<Process>>> Session::Follow(std::shared_ptr<AgentChannel> ch,
                                                            std::shared_ptr<Subscription> sub,
                                                            int64_t pid, bool pty,
                                                            std::shared_ptr<ExitOnce> once,
                                                            int64_t started_ms) {
  uint64_t oom_base = manager_.OomKills(record_.id);
  auto ex = co_await asio::this_coro::executor;
  co_return std::unique_ptr<Process>(
      std::make_unique<ProcessImpl>(ex, shared_from_this(), std::move(ch), std::move(sub), pid, pty,
                                    std::move(once), oom_base, started_ms));
}

Awaitable<Result<std::unique_ptr<Process>>> Session::Spawn(const CommandSpec& spec) {
  auto started = Clock::now();
  const int64_t started_ms = NowMs();  // the system clock, as the network stack's record
  auto w = SpawnRequest(record_.defaults, record_.env, spec);
  if (!w.ok()) co_return w.status();
  auto ch = co_await Channel();
  if (!ch.ok()) co_return ch.status();
  auto opened = co_await (*ch)->OpenConfirmed(Type::kSpawn, std::move(*w));
  if (!opened.ok()) co_return Ended(opened.status());
  int64_t pid = opened->reply.fields.Int(Tag::kPid);
  SandboxMetrics& m = manager_.metrics();
  m.commands++;
  m.exec_seconds.Observe(std::chrono::duration<double>(Clock::now() - started).count());
  json detail = spec.audit.is_object() ? spec.audit : json::object();
  detail["pid"] = pid;
  detail["argv"] = spec.argv;
  if (spec.pty) detail["pty"] = true;
  Audit("command.start", std::move(detail));
  auto once = std::make_shared<ExitOnce>(manager_, record_.id, key_.id, via_, pid);
  co_return co_await Follow(*ch, std::move(opened->sub), pid, spec.pty.has_value(), once,
                            started_ms);
}

Awaitable<Result<std::unique_ptr<Process>>> Session::Attach(int64_t pid, int64_t stdout_offset,
                                                            int64_t stderr_offset) {
  if (pid <= 0) co_return Status::Error("pid: a positive number", EINVAL);
  if (stdout_offset < -1 || stderr_offset < -1)
    co_return Status::Error("offsets: -1 (from now) or a byte offset", EINVAL);
  auto ch = co_await Channel();
  if (!ch.ok()) co_return ch.status();
  auto opened =
      co_await (*ch)->OpenConfirmed(Type::kAttach, Writer()
                                                       .Int(Tag::kPid, pid)
                                                       .Int(Tag::kStdoutOffset, stdout_offset)
                                                       .Int(Tag::kStderrOffset, stderr_offset));
  if (!opened.ok()) co_return Ended(opened.status());
  // Whether it has a terminal, and when it started: the process list says.
  bool pty = false;
  int64_t started_ms = NowMs();
  if (auto procs = co_await ListProcesses(); procs.ok())
    for (const auto& p : *procs)
      if (p.pid == pid) {
        pty = p.pty;
        if (p.started_ns > 0) started_ms = p.started_ns / 1'000'000;
      }
  co_return co_await Follow(*ch, std::move(opened->sub), pid, pty, nullptr, started_ms);
}

Awaitable<Result<std::vector<ProcessInfo>>> Session::ListProcesses() {
  std::vector<Frame> entries;
  auto r = co_await Call(Type::kListProcs, Writer(), &entries);
  if (!r.ok()) co_return r.status();
  std::vector<ProcessInfo> out;
  for (const auto& e : entries) {
    ProcessInfo p;
    p.pid = e.fields.Int(Tag::kPid);
    p.pty = e.fields.Int(Tag::kPty) != 0;
    p.running = e.fields.Int(Tag::kRunning) != 0;
    for (auto a : e.fields.All(Tag::kArgv)) p.argv.emplace_back(a);
    p.tag = std::string(e.fields.Str(Tag::kTag));
    p.cwd = std::string(e.fields.Str(Tag::kCwd));
    p.exit_code = e.fields.Int(Tag::kExitCode, -1);
    p.signal = static_cast<int>(e.fields.Int(Tag::kSignal));
    p.timed_out = e.fields.Int(Tag::kTimedOut) != 0;
    p.started_ns = e.fields.Int(Tag::kStartedNs);
    p.ended_ns = e.fields.Int(Tag::kEndedNs);
    out.push_back(std::move(p));
  }
  co_return out;
}

Awaitable<Status> Session::WriteStdin(int64_t pid, std::string_view data) {
  auto ch = co_await Channel();
  if (!ch.ok()) co_return ch.status();
  // One STDIN at a time: the agent answers each once its data is in the process's queue, and
  // holds the answer while the queue is full, so this loop goes at the pace the process reads.
  while (!data.empty()) {
    std::string_view chunk = data.substr(0, protocol::kMaxChunk);
    auto r = co_await (*ch)->Call(
        Type::kStdin, Writer().Int(Tag::kPid, pid).Str(Tag::kData, chunk), nullptr,
        std::chrono::duration_cast<std::chrono::milliseconds>(kStdinStall));
    if (!r.ok()) {
      Status s = r.status();
      if (s.err() == ETIMEDOUT)
        co_return Status::Error("stdin pid " + std::to_string(pid) + ": the process read none of " +
                                    "its input for " + std::to_string(kStdinStall.count()) +
                                    " minutes",
                                ETIMEDOUT);
      co_return Ended(s);
    }
    data.remove_prefix(chunk.size());
  }
  co_return Status();
}

Awaitable<Status> Session::CloseStdin(int64_t pid) {
  auto r = co_await Call(Type::kCloseStdin, Writer().Int(Tag::kPid, pid));
  co_return r.ok() ? Status() : r.status();
}

Awaitable<Status> Session::Signal(int64_t pid, int signal, bool process_group) {
  if (signal <= 0 || signal >= 65) co_return Status::Error("signal: from 1 to 64", EINVAL);
  auto r = co_await Call(
      Type::kSignal,
      Writer().Int(Tag::kPid, pid).Int(Tag::kSignal, signal).Int(Tag::kGroup, process_group));
  co_return r.ok() ? Status() : r.status();
}

Awaitable<Status> Session::Resize(int64_t pid, PtySize size) {
  if (size.rows < 1 || size.cols < 1 || size.rows > kMaxPtySide || size.cols > kMaxPtySide)
    co_return Status::Error("pty: rows and cols from 1 to " + std::to_string(kMaxPtySide), EINVAL);
  auto r = co_await Call(
      Type::kResize,
      Writer().Int(Tag::kPid, pid).Int(Tag::kRows, size.rows).Int(Tag::kCols, size.cols));
  co_return r.ok() ? Status() : r.status();
}

// ---- files ----

Awaitable<Result<FileEntry>> Session::Stat(const std::string& path, bool follow) {
  Writer w;
  w.Str(Tag::kPath, path).Str(Tag::kXattrPrefix, kMetadataXattrPrefix);
  if (follow) w.Int(Tag::kFollow, 1);
  auto r = co_await Call(Type::kStat, std::move(w));
  if (!r.ok()) co_return r.status();
  co_return EntryFromFields(r->fields);
}

Awaitable<Result<std::vector<FileEntry>>> Session::List(const std::string& path, int depth) {
  if (depth < 1 || depth > protocol::kMaxListDepth)
    co_return Status::Error("depth: a whole number from 1 to " +
                                std::to_string(protocol::kMaxListDepth) + " (got " +
                                std::to_string(depth) + ")",
                            EINVAL);
  std::vector<Frame> entries;
  auto r = co_await Call(Type::kList,
                         Writer()
                             .Str(Tag::kPath, path)
                             .Int(Tag::kDepth, depth)
                             .Str(Tag::kXattrPrefix, kMetadataXattrPrefix),
                         &entries);
  if (!r.ok()) co_return r.status();
  std::vector<FileEntry> out;
  out.reserve(entries.size());
  for (const auto& e : entries) out.push_back(EntryFromFields(e.fields));
  co_return out;
}

Awaitable<Result<FileEntry>> Session::MakeDir(const std::string& path, std::optional<User> owner,
                                              bool parents, int64_t mode) {
  Writer w;
  w.Str(Tag::kPath, path).Int(Tag::kParents, parents).Int(Tag::kMode, mode);
  if (owner) w.Int(Tag::kUid, owner->uid).Int(Tag::kGid, owner->gid);
  auto r = co_await Call(Type::kMkdir, std::move(w));
  if (!r.ok()) co_return r.status();
  Audit("file.mkdir", {{"path", path}});
  co_return EntryFromFields(r->fields);
}

Awaitable<Result<FileEntry>> Session::Move(const std::string& from, const std::string& to) {
  auto r = co_await Call(Type::kMove, Writer()
                                          .Str(Tag::kPath, from)
                                          .Str(Tag::kNewPath, to)
                                          .Str(Tag::kXattrPrefix, kMetadataXattrPrefix));
  if (!r.ok()) co_return r.status();
  Audit("file.move", {{"from", from}, {"to", to}});
  co_return EntryFromFields(r->fields);
}

Awaitable<Status> Session::Remove(const std::string& path, bool recursive) {
  auto r =
      co_await Call(Type::kRemove, Writer().Str(Tag::kPath, path).Int(Tag::kRecursive, recursive));
  if (!r.ok()) co_return r.status();
  Audit("file.remove", {{"path", path}});
  co_return Status();
}

Awaitable<Result<std::unique_ptr<FileReader>>> Session::Read(const std::string& path) {
  auto ch = co_await Channel();
  if (!ch.ok()) co_return ch.status();
  auto sub = co_await (*ch)->Open(Type::kRead, Writer().Str(Tag::kPath, path));
  if (!sub.ok()) co_return Ended(sub.status());
  co_return std::unique_ptr<FileReader>(
      std::make_unique<ReaderImpl>(shared_from_this(), std::move(*sub)));
}

Awaitable<Result<std::unique_ptr<FileWriter>>> Session::Write(const std::string& path,
                                                              WriteOptions options) {
  if (options.mode < 0 || options.mode > 07777)
    co_return Status::Error("mode: from 0 to 07777", EINVAL);
  if (!options.owner) {
    // The owner of the nearest directory that exists on the way up: a file copied into a
    // user's home is theirs, as is a directory made for it there.
    std::string dir = path;
    for (int up = 0; up < 256; ++up) {
      size_t slash = dir.find_last_of('/');
      dir = slash == 0 || slash == std::string::npos ? "/" : dir.substr(0, slash);
      auto st = co_await Stat(dir);
      if (st.ok()) {
        options.owner = User{st->owner, st->uid, st->gid, ""};
        break;
      }
      if (st.status().err() != ENOENT || dir == "/") break;
    }
  }
  Writer begin;
  begin.Str(Tag::kPath, path).Int(Tag::kParents, options.parents);
  if (options.owner) begin.Int(Tag::kUid, options.owner->uid).Int(Tag::kGid, options.owner->gid);
  if (options.mode > 0) begin.Int(Tag::kMode, options.mode);
  if (!options.metadata.empty()) {
    begin.Str(Tag::kXattrPrefix, kMetadataXattrPrefix);
    for (const auto& [k, v] : options.metadata)
      begin.Nested(
          Tag::kXattr,
          Writer().Str(Tag::kName, std::string(kMetadataXattrPrefix) + k).Str(Tag::kData, v));
  }
  auto ch = co_await Channel();
  if (!ch.ok()) co_return ch.status();
  uint32_t id = (*ch)->NextId();
  auto b = co_await (*ch)->CallWithId(Type::kWriteBegin, id, std::move(begin));
  if (!b.ok()) co_return Ended(b.status());
  co_return std::unique_ptr<FileWriter>(std::make_unique<WriterImpl>(
      co_await asio::this_coro::executor, shared_from_this(), *ch, id, path));
}

Awaitable<Result<std::unique_ptr<Watch>>> Session::WatchDir(const std::string& path, bool recursive,
                                                            bool with_entries) {
  auto ch = co_await Channel();
  if (!ch.ok()) co_return ch.status();
  auto opened = co_await (*ch)->OpenConfirmed(Type::kWatch,
                                              Writer()
                                                  .Str(Tag::kPath, path)
                                                  .Int(Tag::kRecursive, recursive)
                                                  .Int(Tag::kWithEntry, with_entries)
                                                  .Str(Tag::kXattrPrefix, kMetadataXattrPrefix));
  if (!opened.ok()) co_return Ended(opened.status());
  co_return std::unique_ptr<Watch>(std::make_unique<WatchImpl>(
      co_await asio::this_coro::executor, shared_from_this(), *ch, std::move(opened->sub)));
}

// ---- ports ----

Awaitable<Result<UniqueFd>> Session::ConnectPort(int port) {
  if (port < 1 || port > 65535) co_return Status::Error("port: from 1 to 65535", EINVAL);
  auto fd = manager_.TcpSocket(key_, record_.id, port);
  if (!fd.ok()) co_return fd.status();
  if (fd->connected) co_return std::move(fd->fd);  // the agent's stream to the port (gVisor)
  asio::ip::tcp::socket sock(co_await asio::this_coro::executor);
  boost::system::error_code ec;
  sock.assign(asio::ip::tcp::v4(), fd->fd.release(), ec);
  if (ec) co_return Status::Error("connect to port " + std::to_string(port), ec.value());
  asio::ip::tcp::endpoint to(asio::ip::address_v4::loopback(), static_cast<uint16_t>(port));
  co_await sock.async_connect(to, asio::redirect_error(asio::use_awaitable, ec));
  if (ec)
    co_return Status::Error("connect to port " + std::to_string(port) + " in sandbox " +
                                record_.id + ": " + ec.message(),
                            ec.value());
  co_return UniqueFd(sock.release());
}

}  // namespace sbx::sandbox
