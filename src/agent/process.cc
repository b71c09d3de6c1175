// Process requests (SPAWN, ATTACH, DETACH, STDIN, CLOSE_STDIN, SIGNAL, RESIZE, LIST_PROCS) and the
// plumbing that moves output from pipes to ring buffers to subscribed connections, with the
// backpressure and EXIT ordering of docs/agent-protocol.md, "Processes".
#include "agent/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <string_view>

#include "agent/log.h"
#include "agent/loop.h"
#include "agent/oom.h"
#include "agent/paths.h"
#include "agent/spawn.h"

namespace sbx::agent {

using protocol::Reader;
using protocol::Tag;
using protocol::Type;
using protocol::Writer;

namespace {

constexpr size_t kDefaultBuffer = 1u << 20;
constexpr size_t kMaxBuffer = 16u << 20;
constexpr size_t kMinBuffer = 4096;
constexpr size_t kPipeChunk = 64u << 10;
// After a process exits, this much more is taken from each pipe before it is closed: what the
// process wrote before exiting sits in the pipe (at most the pipe's capacity); anything beyond is
// descendants writing after it, which is not delivered.
constexpr uint64_t kDrainAfterExit = 1u << 20;
constexpr size_t kMaxWaiters = 16;

const char* kRootPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const char* kUserPath = "/usr/local/bin:/usr/bin:/bin";

bool HasEnv(const std::vector<std::string>& env, std::string_view key) {
  for (const auto& e : env)
    if (e.size() > key.size() && e.compare(0, key.size(), key) == 0 && e[key.size()] == '=')
      return true;
  return false;
}

bool IsDir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The gid a group part of a user ("1000:50", "app:staff") names: a number, or a group of the box's
// /etc/group; nullopt for neither.
std::optional<gid_t> GroupOf(const UserDb& users, std::string_view g) {
  if (auto n = ParseId(g); n && *n <= 0xfffffffeUL) return static_cast<gid_t>(*n);
  if (const GroupEntry* e = g.empty() ? nullptr : users.FindGroup(g)) return e->gid;
  return std::nullopt;
}

}  // namespace

// LIST_PROCS, produced as the connection drains. Walks the table by pid so that processes coming
// and going meanwhile are harmless.
class ProcListStream : public Stream {
 public:
  ProcListStream(Agent& agent, uint32_t id) : agent_(agent), id_(id) {}
  uint32_t id() const override { return id_; }
  bool Pump(FrameSink& sink) override {
    while (!sink.Full()) {
      auto it = agent_.procs_.upper_bound(last_);
      if (it == agent_.procs_.end()) {
        sink.Send(Type::kOk, id_, Writer());
        return true;
      }
      last_ = it->first;
      const Process& p = *it->second;
      Writer w;
      w.Int(Tag::kPid, p.pid);
      for (const auto& a : p.argv) w.Str(Tag::kArgv, a);
      w.Str(Tag::kTag, p.tag)
          .Int(Tag::kPty, p.pty)
          .Int(Tag::kRunning, !p.exited)
          .Int(Tag::kExitCode, p.exit_code)
          .Int(Tag::kSignal, p.signal)
          .Int(Tag::kTimedOut, p.timed_out)
          .Int(Tag::kStartedNs, p.started_ns)
          .Int(Tag::kEndedNs, p.ended_ns)
          .Str(Tag::kCwd, p.cwd);
      sink.Send(Type::kProcEntry, id_, w);
    }
    return false;
  }

 private:
  Agent& agent_;
  uint32_t id_;
  pid_t last_ = -1;
};

Process* Agent::FindProcess(pid_t pid) {
  auto it = procs_.find(pid);
  return it == procs_.end() ? nullptr : it->second.get();
}

void Agent::HandleProcessRequest(Connection& c, const protocol::Header& h, const Reader& r) {
  const uint32_t id = h.id;
  if (h.type == Type::kSpawn) return Spawn(c, id, r);
  if (h.type == Type::kListProcs) return ListProcs(c, id);
  if (h.type == Type::kOutput || h.type == Type::kExit)
    return SendError(c, id, EINVAL, "unexpected event frame from client");
  auto pid_field = r.OptInt(Tag::kPid);
  if (!pid_field || *pid_field <= 0 || *pid_field > 0x7fffffff)
    return SendError(c, id, EINVAL, "missing or invalid pid");
  pid_t pid = static_cast<pid_t>(*pid_field);
  if (h.type == Type::kAttach) return Attach(c, id, r);
  Process* p = FindProcess(pid);
  std::string what = "pid " + std::to_string(pid);
  if (!p) return SendError(c, id, ESRCH, what + ": no such process");
  switch (h.type) {
    case Type::kDetach:
      Unsubscribe(*p, c.id());
      Resume(*p);
      c.Send(Type::kOk, id, Writer());
      return;
    case Type::kStdin:
      return WriteStdin(c, id, *p, r.Str(Tag::kData));
    case Type::kWait:
      if (p->exited) {
        p->waiters.push_back({c.id(), id});
        AnswerWaiters(*p);
        return;
      }
      // One daemon connection waits once per process; a bound keeps a confused client harmless.
      if (p->waiters.size() >= kMaxWaiters)
        return SendError(c, id, EAGAIN, "wait " + what + ": too many waiters");
      p->waiters.push_back({c.id(), id});
      return;
    case Type::kCloseStdin:
      if (p->pty && p->in) {
        WriteStdin(c, id, *p, "\x04");  // EOF for the terminal's line discipline
        return;
      }
      if (p->in_queue.empty() && p->in_held.empty())
        CloseStdin(*p);
      else
        p->in_close_pending = true;
      c.Send(Type::kOk, id, Writer());
      return;
    case Type::kSignal: {
      int64_t sig = r.Int(Tag::kSignal, 0);
      if (sig < 0 || sig >= NSIG)
        return SendError(c, id, EINVAL, "signal " + what + ": bad signal");
      if (p->exited) return SendError(c, id, ESRCH, "signal " + what + ": process has exited");
      pid_t target = r.Int(Tag::kGroup, 0) ? -pid : pid;
      if (::kill(target, static_cast<int>(sig)) != 0)
        return SendError(c, id, errno, "signal " + what);
      c.Send(Type::kOk, id, Writer());
      return;
    }
    case Type::kResize: {
      int64_t rows = r.Int(Tag::kRows, 0), cols = r.Int(Tag::kCols, 0);
      if (!p->pty) return SendError(c, id, ENOTTY, "resize " + what + ": no terminal");
      if (rows < 1 || rows > 65535 || cols < 1 || cols > 65535)
        return SendError(c, id, EINVAL, "resize " + what + ": bad size");
      int fd = p->out[0] ? p->out[0].get() : p->in.get();
      if (fd < 0) return SendError(c, id, ESRCH, "resize " + what + ": process has exited");
      struct winsize ws {};
      ws.ws_row = static_cast<unsigned short>(rows);
      ws.ws_col = static_cast<unsigned short>(cols);
      if (::ioctl(fd, TIOCSWINSZ, &ws) != 0) return SendError(c, id, errno, "resize " + what);
      c.Send(Type::kOk, id, Writer());
      return;
    }
    default:
      SendError(c, id, EINVAL, "unexpected frame type");
  }
}

void Agent::Spawn(Connection& c, uint32_t id, const Reader& r) {
  SpawnPlan plan;
  for (std::string_view a : r.All(Tag::kArgv)) {
    if (a.find('\0') != std::string_view::npos)
      return SendError(c, id, EINVAL, "spawn: NUL byte in argv");
    plan.argv.emplace_back(a);
  }
  if (plan.argv.empty() || plan.argv[0].empty())
    return SendError(c, id, EINVAL, "spawn: empty argv");
  const std::string what = "spawn " + plan.argv[0];
  for (std::string_view e : r.All(Tag::kEnv)) {
    size_t eq = e.find('=');
    if (eq == std::string_view::npos || eq == 0 || e.find('\0') != std::string_view::npos)
      return SendError(c, id, EINVAL, what + ": bad env entry");
    plan.env.emplace_back(e);
  }
  if (procs_.size() >= options_.max_procs)
    return SendError(c, id, EAGAIN, what + ": too many processes tracked");

  // Who runs it.
  users_.Reload();
  const PasswdEntry* pw = nullptr;
  int64_t uid = 0, gid = -1;
  // An image's User may name a group too ("uid:gid", "name:group", as docker takes it).
  std::optional<gid_t> group;
  if (r.Has(Tag::kUser) && !r.Str(Tag::kUser).empty()) {
    std::string_view user = r.Str(Tag::kUser);
    if (size_t colon = user.find(':'); colon != std::string_view::npos) {
      auto g = GroupOf(users_, user.substr(colon + 1));
      if (!g)
        return SendError(c, id, EINVAL, what + ": unknown group in user " + std::string(user));
      group = *g;
      user = user.substr(0, colon);
    }
    if (auto n = ParseId(user)) {
      uid = static_cast<int64_t>(*n);
      pw = users_.FindUid(static_cast<uid_t>(uid));
    } else {
      pw = users_.FindUser(user);
      // The caller's mistake, not a missing program (ENOENT means that to every facade).
      if (!pw) return SendError(c, id, EINVAL, what + ": unknown user " + std::string(user));
      uid = pw->uid;
    }
  } else {
    uid = r.Int(Tag::kUid, 0);
    if (uid < 0 || uid > 0xfffffffeLL) return SendError(c, id, EINVAL, what + ": bad uid");
    pw = users_.FindUid(static_cast<uid_t>(uid));
  }
  if (r.Has(Tag::kGid)) {
    gid = r.Int(Tag::kGid, -1);
    if (gid < 0 || gid > 0xfffffffeLL) return SendError(c, id, EINVAL, what + ": bad gid");
  } else {
    gid = group ? *group : pw ? pw->gid : uid;
  }
  plan.uid = static_cast<uid_t>(uid);
  plan.gid = static_cast<gid_t>(gid);
  plan.groups = pw ? users_.GroupsOf(pw->name, plan.gid) : std::vector<gid_t>{plan.gid};
  plan.change_ids = ::geteuid() == 0 || plan.uid != ::geteuid() || plan.gid != ::getegid();

  std::string home = pw && !pw->home.empty() ? pw->home : "/";
  if (!HasEnv(plan.env, "HOME")) plan.env.push_back("HOME=" + home);
  if (pw && !HasEnv(plan.env, "USER")) plan.env.push_back("USER=" + pw->name);
  if (pw && !HasEnv(plan.env, "LOGNAME")) plan.env.push_back("LOGNAME=" + pw->name);
  if (!HasEnv(plan.env, "SHELL"))
    plan.env.push_back("SHELL=" + (pw && !pw->shell.empty() ? pw->shell : std::string("/bin/sh")));
  if (!HasEnv(plan.env, "PATH"))
    plan.env.push_back(std::string("PATH=") + (plan.uid == 0 ? kRootPath : kUserPath));

  if (r.Has(Tag::kCwd) && !r.Str(Tag::kCwd).empty()) {
    // A relative cwd ("src", "~", "~/src") is below the user's home, which only the agent knows.
    std::string cwd(r.Str(Tag::kCwd));
    if (cwd[0] != '/') {
      if (cwd == "~")
        cwd.clear();
      else if (cwd.rfind("~/", 0) == 0)
        cwd.erase(0, 2);
      cwd = home + "/" + cwd;
    }
    if (!CleanPath(cwd, &plan.cwd)) return SendError(c, id, EINVAL, what + ": bad cwd");
  } else {
    plan.cwd = IsDir(home) ? home : "/";
  }

  plan.pty = r.Int(Tag::kPty, 0) != 0;
  if (plan.pty) {
    int64_t rows = r.Int(Tag::kRows, 24), cols = r.Int(Tag::kCols, 80);
    plan.rows = static_cast<unsigned short>(rows >= 1 && rows <= 65535 ? rows : 24);
    plan.cols = static_cast<unsigned short>(cols >= 1 && cols <= 65535 ? cols : 80);
    if (!HasEnv(plan.env, "TERM")) plan.env.push_back("TERM=xterm-256color");
  }
  plan.stdin_open = r.Int(Tag::kStdinOpen, 0) != 0;
  plan.nofile = options_.child_nofile;
  plan.restore_nofile = options_.restore_nofile;

  int64_t buffer = r.Int(Tag::kBufferBytes, 0);
  size_t buffer_bytes = buffer <= 0
                            ? kDefaultBuffer
                            : std::clamp(static_cast<size_t>(buffer), kMinBuffer, kMaxBuffer);
  int64_t timeout_ms = r.Int(Tag::kTimeoutMs, 0);
  if (timeout_ms < 0) return SendError(c, id, EINVAL, what + ": bad timeout_ms");

  // The rings come out of the box-wide budget before anything starts. The last quarter of the
  // ring pool is kept for processes with the smallest rings (so hundreds can still start when
  // the budget is nearly spent); above it, a process may take at most half of what is left, so
  // rings shrink as the pool fills. Past the point where not even the smallest rings fit, SPAWN
  // is refused (docs/agent-protocol.md, "Memory cap").
  std::string_view tag = r.Str(Tag::kTag);
  size_t record = sizeof(Process) + tag.size() + plan.cwd.size();
  for (const auto& a : plan.argv) record += a.size() + sizeof(std::string);
  const size_t streams = plan.pty ? 1 : 2;  // a PTY has one output stream
  const auto pool = MemoryBudget::kRings;
  const size_t small_reserve = budget_.Limit(pool) / 4;
  const size_t want = small_reserve + 2 * (record + streams * buffer_bytes);
  if (budget_.Room(pool) < want) EvictFinished(want);
  size_t room = budget_.Room(pool);
  if (room < record + streams * kMinBuffer) {
    return SendError(
        c, id, EAGAIN,
        what + ": the agent's buffers are at the box's cap (" + std::to_string(budget_.used(pool)) +
            " of " + std::to_string(budget_.Limit(pool)) + " bytes of rings in use, " +
            std::to_string(procs_.size()) + " processes tracked); wait for processes to end");
  }
  size_t above = room > small_reserve + record ? room - small_reserve - record : 0;
  size_t fair = above / 2 / streams;
  if (buffer_bytes > fair) buffer_bytes = std::max(kMinBuffer, fair & ~size_t{4095});
  Reservation memory(&budget_, pool);
  if (!memory.TryAdd(record + streams * buffer_bytes))
    return SendError(c, id, EAGAIN, what + ": the agent's buffers are at the box's cap");

  auto child = sbx::agent::Spawn(plan);
  if (!child.ok()) {
    Status s = child.status();
    return SendError(c, id, s.err() ? s.err() : EIO, s.what());
  }
  pid_t pid = child->pid;
  RemoveProcess(pid);  // a finished process whose pid the kernel has reused
  auto p = std::make_unique<Process>(buffer_bytes, plan.pty ? 1 : buffer_bytes, std::move(memory),
                                     &budget_);
  p->pid = pid;
  p->argv = std::move(plan.argv);
  p->tag = std::string(tag);
  p->cwd = plan.cwd;
  p->pty = plan.pty;
  p->started_ns = RealtimeNs();
  if (timeout_ms > 0) p->deadline_ms = MonotonicMs() + timeout_ms;
  p->out[0] = std::move(child->stdout_fd);
  p->out[1] = std::move(child->stderr_fd);
  p->in = std::move(child->stdin_fd);
  p->subs.push_back({c.id(), id, {0, 0}, false});
  c.subscriptions++;
  Process& ref = *p;
  procs_[pid] = std::move(p);
  UpdateProcessEvents(ref);
  Writer w;
  w.Int(Tag::kPid, pid).Int(Tag::kBufferBytes, static_cast<int64_t>(buffer_bytes));
  c.Send(Type::kOk, id, w);
}

void Agent::Attach(Connection& c, uint32_t id, const Reader& r) {
  pid_t pid = static_cast<pid_t>(r.Int(Tag::kPid));
  Process* p = FindProcess(pid);
  if (!p) return SendError(c, id, ESRCH, "attach pid " + std::to_string(pid) + ": no such process");
  int64_t so = r.Int(Tag::kStdoutOffset, 0), se = r.Int(Tag::kStderrOffset, 0);
  // -1: from the current end, only what is written from now on.
  if (so == -1) so = static_cast<int64_t>(p->ring[0].end());
  if (se == -1) se = static_cast<int64_t>(p->ring[1].end());
  if (so < 0 || se < 0) return SendError(c, id, EINVAL, "attach: bad offset");
  Unsubscribe(*p, c.id());
  p->subs.push_back({c.id(), id, {static_cast<uint64_t>(so), static_cast<uint64_t>(se)}, false});
  c.subscriptions++;
  Writer w;
  w.Int(Tag::kPid, pid).Int(Tag::kRunning, !p->exited);
  c.Send(Type::kOk, id, w);
  PumpProcess(*p);
}

void Agent::ListProcs(Connection& c, uint32_t id) {
  c.streams().push_back(std::make_unique<ProcListStream>(*this, id));
}

void Agent::OomKill(Connection& c, uint32_t id, const Reader& r) {
  const int64_t limit = r.Int(Tag::kMemoryLimit, 0);
  if (limit < 0) return SendError(c, id, EINVAL, "oom kill: bad memory limit");
  auto victim =
      ChooseOomVictim(ScanOomCandidates("/proc", ::getpid()), static_cast<uint64_t>(limit));
  if (!victim) return SendError(c, id, ESRCH, "oom kill: no process to kill");
  const std::string what = "oom kill: pid " + std::to_string(victim->pid);
  if (::kill(victim->pid, SIGKILL) != 0) return SendError(c, id, errno, what);
  Log("out of memory: killed pid %d (%llu KiB resident, oom_score_adj %d)", victim->pid,
      static_cast<unsigned long long>(victim->rss_bytes >> 10), victim->oom_score_adj);
  c.Send(Type::kOk, id,
         Writer()
             .Int(Tag::kPid, victim->pid)
             .Int(Tag::kSize, static_cast<int64_t>(victim->rss_bytes)));
}

void Agent::WriteStdin(Connection& c, uint32_t id, Process& p, std::string_view data) {
  std::string what = "stdin pid " + std::to_string(p.pid);
  if (!p.in || (p.in_close_pending && !p.pty)) return SendError(c, id, EPIPE, what + ": closed");
  // Writes are taken in order: behind a held one, a write is held too.
  bool hold = !p.in_held.empty() || p.in_queue.size() + data.size() > kStdinQueueLimit;
  if (hold && p.in_held_bytes + data.size() > kStdinQueueLimit)
    return SendError(c, id, EAGAIN, what + ": process is not reading its input");
  if (!p.in_memory.TryAdd(data.size()))
    return SendError(c, id, EAGAIN, what + ": the agent's buffers are at the box's cap");
  if (hold) {
    p.in_held.push_back({c.id(), id, std::string(data)});
    p.in_held_bytes += data.size();
    return;  // answered by AdmitHeldStdin, or EPIPE by CloseStdin
  }
  p.in_queue.append(data);
  FlushStdin(p);
  c.Send(Type::kOk, id, Writer());
}

bool Agent::AdmitHeldStdin(Process& p) {
  bool moved = false;
  while (!p.in_held.empty() &&
         p.in_queue.size() + p.in_held.front().data.size() <= kStdinQueueLimit) {
    Process::HeldStdin h = std::move(p.in_held.front());
    p.in_held.pop_front();
    p.in_held_bytes -= h.data.size();
    p.in_queue.append(h.data);  // its bytes stay reserved in in_memory
    if (Connection* c = FindConnection(h.conn)) c->Send(Type::kOk, h.id, Writer());
    moved = true;
  }
  return moved;
}

void Agent::ForgetConnection(Process& p, uint64_t conn) {
  for (auto it = p.in_held.begin(); it != p.in_held.end();) {
    if (it->conn != conn) {
      ++it;
      continue;
    }
    p.in_held_bytes -= it->data.size();
    p.in_memory.Sub(it->data.size());
    it = p.in_held.erase(it);
  }
  std::erase_if(p.waiters, [&](const Process::Waiter& w) { return w.conn == conn; });
}

void Agent::AnswerWaiters(Process& p) {
  if (p.waiters.empty()) return;
  Writer w;
  w.Int(Tag::kPid, p.pid)
      .Int(Tag::kExitCode, p.exit_code)
      .Int(Tag::kSignal, p.signal)
      .Int(Tag::kTimedOut, p.timed_out)
      .Int(Tag::kEndedNs, p.ended_ns);
  for (const auto& waiter : p.waiters)
    if (Connection* c = FindConnection(waiter.conn)) c->Send(Type::kOk, waiter.id, w);
  p.waiters.clear();
}

void Agent::LookupUser(Connection& c, uint32_t id, const Reader& r) {
  std::string name(r.Str(Tag::kUser));
  if (name.empty() || name.find('\0') != std::string::npos)
    return SendError(c, id, EINVAL, "lookup user: a name or a number is required");
  users_.Reload();
  std::optional<gid_t> group;
  if (size_t colon = name.find(':'); colon != std::string::npos) {
    group = GroupOf(users_, std::string_view(name).substr(colon + 1));
    if (!group) return SendError(c, id, EINVAL, "lookup user " + name + ": unknown group");
    name.resize(colon);
  }
  const PasswdEntry* pw = nullptr;
  auto number = ParseId(name);
  if (number && *number <= 0xfffffffeUL)
    pw = users_.FindUid(static_cast<uid_t>(*number));
  else
    pw = users_.FindUser(name);
  Writer w;
  if (pw) {
    w.Str(Tag::kName, pw->name)
        .Int(Tag::kUid, pw->uid)
        .Int(Tag::kGid, group ? *group : pw->gid)
        .Str(Tag::kPath, pw->home.empty() ? "/" : pw->home);
  } else if (number && *number <= 0xfffffffeUL) {
    // A uid without an entry is still a user to run as (as SPAWN treats it): its own group.
    auto n = static_cast<int64_t>(*number);
    w.Str(Tag::kName, name)
        .Int(Tag::kUid, n)
        .Int(Tag::kGid, group ? static_cast<int64_t>(*group) : n)
        .Str(Tag::kPath, "/");
  } else if (name == "root") {
    // A rootfs without /etc/passwd still has root.
    w.Str(Tag::kName, "root").Int(Tag::kUid, 0).Int(Tag::kGid, 0).Str(Tag::kPath, "/root");
  } else {
    return SendError(c, id, ENOENT, "user " + name + ": not in the sandbox's /etc/passwd");
  }
  c.Send(Type::kOk, id, w);
}

void Agent::FlushStdin(Process& p) {
  while (p.in && !p.in_queue.empty()) {
    ssize_t n = ::write(p.in.get(), p.in_queue.data(), p.in_queue.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) break;
      CloseStdin(p);  // EPIPE: the reader is gone
      return;
    }
    p.in_queue.erase(0, static_cast<size_t>(n));
    p.in_memory.Sub(static_cast<size_t>(n));
  }
  if (p.in_queue.empty()) p.in_queue.shrink_to_fit();  // a drained queue holds no memory
  if (!p.in) return;
  // Room in the queue: the held writes move in (answered now) and go on to the pipe.
  if (AdmitHeldStdin(p)) return FlushStdin(p);
  if (p.in_queue.empty() && p.in_close_pending) {
    CloseStdin(p);
    return;
  }
  bool want = !p.in_queue.empty();
  if (want != p.in_polled) {
    if (want)
      EpollSet(p.in.get(), Key(kProcIn, static_cast<uint64_t>(p.pid)), EPOLLOUT, true);
    else
      EpollDel(p.in.get());
    p.in_polled = want;
  }
}

void Agent::CloseStdin(Process& p) {
  for (const auto& h : p.in_held)
    if (Connection* c = FindConnection(h.conn))
      SendError(*c, h.id, EPIPE, "stdin pid " + std::to_string(p.pid) + ": closed");
  p.in_held.clear();
  p.in_held_bytes = 0;
  if (p.in && p.in_polled) EpollDel(p.in.get());
  p.in_polled = false;
  p.in.reset();
  p.in_queue.clear();
  p.in_queue.shrink_to_fit();
  p.in_memory.Reset();
  p.in_close_pending = false;
}

void Agent::OnProcessStdin(pid_t pid) {
  if (Process* p = FindProcess(pid)) FlushStdin(*p);
}

void Agent::OnProcessOutput(pid_t pid, int stream) {
  Process* p = FindProcess(pid);
  if (!p) return;
  ReadOutput(*p, stream, p->exited);
}

bool Agent::Backpressured(const Process& p) {
  for (const auto& s : p.subs) {
    Connection* c = FindConnection(s.conn);
    if (!c) continue;
    if (c->Full()) return true;
    // A subscriber that has not caught up must not lose bytes to the ring wrapping.
    for (int i = 0; i < 2; ++i)
      if (s.cursor[i] < p.ring[i].end()) return true;
  }
  return false;
}

void Agent::ReadOutput(Process& p, int stream, bool drain) {
  char buf[kPipeChunk];
  size_t chunk = std::min(sizeof buf, p.ring[stream].capacity());
  pid_t pid = p.pid;
  do {
    if (!p.out[stream]) return;
    if (Backpressured(p)) {
      UpdateProcessEvents(p);
      return;
    }
    size_t want = chunk;
    if (p.exited) want = static_cast<size_t>(std::min<uint64_t>(want, p.drain_left[stream]));
    ssize_t n = want == 0 ? 0 : ::read(p.out[stream].get(), buf, want);
    if (n < 0 && errno == EINTR) continue;
    if (n > 0) {
      p.ring[stream].Append(std::string_view(buf, static_cast<size_t>(n)));
      if (p.exited) p.drain_left[stream] -= static_cast<uint64_t>(n);
      PumpProcess(p);
      if (!FindProcess(pid)) return;
      continue;
    }
    // EOF, EIO (a PTY whose other side is closed), or nothing left after exit.
    if (n == 0 || errno != EAGAIN || p.exited) {
      CloseOutput(p, stream);
      PumpProcess(p);
    }
    return;
  } while (drain);
}

void Agent::CloseOutput(Process& p, int stream) {
  if (p.out[stream] && p.out_polled[stream]) EpollDel(p.out[stream].get());
  p.out_polled[stream] = false;
  p.out[stream].reset();
  if (p.finished() && p.finished_ms == 0) p.finished_ms = MonotonicMs();
}

void Agent::UpdateProcessEvents(Process& p) {
  bool paused = Backpressured(p);
  for (int s = 0; s < 2; ++s) {
    bool want = p.out[s].valid() && !paused;
    if (want == p.out_polled[s]) continue;
    if (want)
      EpollSet(p.out[s].get(), Key(s == 0 ? kProcOut : kProcErr, static_cast<uint64_t>(p.pid)),
               EPOLLIN, true);
    else
      EpollDel(p.out[s].get());
    p.out_polled[s] = want;
  }
}

void Agent::PumpProcess(Process& p) {
  std::string buf;
  for (size_t i = 0; i < p.subs.size();) {
    Subscriber& s = p.subs[i];
    Connection* c = FindConnection(s.conn);
    if (!c) {
      p.subs.erase(p.subs.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    if (s.paused) {
      ++i;
      continue;
    }
    for (int st = 0; st < 2; ++st) {
      while (s.cursor[st] < p.ring[st].end() && !c->Full()) {
        uint64_t from = p.ring[st].Read(s.cursor[st], protocol::kMaxChunk, &buf);
        Writer w;
        w.Int(Tag::kPid, p.pid)
            .Int(Tag::kStream, st + 1)
            .Int(Tag::kOffset, static_cast<int64_t>(from))
            .Str(Tag::kData, buf);
        c->Send(Type::kOutput, s.id, w);
        s.cursor[st] = from + buf.size();
      }
    }
    if (p.finished() && s.cursor[0] >= p.ring[0].end() && s.cursor[1] >= p.ring[1].end()) {
      Writer w;
      w.Int(Tag::kPid, p.pid)
          .Int(Tag::kExitCode, p.exit_code)
          .Int(Tag::kSignal, p.signal)
          .Int(Tag::kTimedOut, p.timed_out)
          .Int(Tag::kEndedNs, p.ended_ns);
      c->Send(Type::kExit, s.id, w);
      c->subscriptions--;
      p.subs.erase(p.subs.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    ++i;
  }
  UpdateProcessEvents(p);
}

void Agent::Resume(Process& p) {
  pid_t pid = p.pid;
  PumpProcess(p);
  // An exited process's pipes get no more readiness events once empty, so drain them actively.
  for (int s = 0; s < 2; ++s) {
    Process* q = FindProcess(pid);
    if (q && q->exited && q->out[s]) ReadOutput(*q, s, true);
  }
}

void Agent::Unsubscribe(Process& p, uint64_t conn) {
  for (size_t i = 0; i < p.subs.size();) {
    if (p.subs[i].conn == conn) {
      if (Connection* c = FindConnection(conn)) c->subscriptions--;
      p.subs.erase(p.subs.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
}

void Agent::Reap() {
  for (;;) {
    int st;
    pid_t pid = ::waitpid(-1, &st, WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) return;
    Process* p = FindProcess(pid);
    if (!p || p->exited) {
      sudo_.OnExit(pid, st);  // a sudo command (sudo.h), or an orphan re-parented to us
      continue;
    }
    p->exited = true;
    p->ended_ns = RealtimeNs();
    if (WIFEXITED(st)) {
      p->exit_code = WEXITSTATUS(st);
    } else if (WIFSIGNALED(st)) {
      p->exit_code = -1;
      p->signal = WTERMSIG(st);
    }
    CloseStdin(*p);
    AnswerWaiters(*p);
    for (int s = 0; s < 2; ++s) {
      p->drain_left[s] = kDrainAfterExit;
      if (p->out[s]) ReadOutput(*p, s, true);
    }
    if ((p = FindProcess(pid)) != nullptr) {
      if (p->finished() && p->finished_ms == 0) p->finished_ms = MonotonicMs();
      PumpProcess(*p);
    }
  }
}

void Agent::CheckDeadlines() {
  int64_t now = MonotonicMs();
  for (const auto& [pid, p] : procs_) {
    if (p->exited || p->deadline_ms == 0 || now < p->deadline_ms) continue;
    p->deadline_ms = 0;
    p->timed_out = true;
    ::kill(-pid, SIGKILL);
    ::kill(pid, SIGKILL);
  }
}

void Agent::PruneFinished() {
  int64_t now = MonotonicMs();
  std::vector<std::pair<int64_t, pid_t>> finished;
  for (const auto& [pid, p] : procs_) {
    if (p->finished() && p->subs.empty()) finished.push_back({p->finished_ms, pid});
  }
  std::sort(finished.begin(), finished.end());
  size_t excess = finished.size() > kMaxFinished ? finished.size() - kMaxFinished : 0;
  for (size_t i = 0; i < finished.size(); ++i) {
    if (i < excess || now - finished[i].first > kFinishedTtlMs) RemoveProcess(finished[i].second);
  }
}

void Agent::EvictFinished(size_t bytes) {
  std::vector<std::pair<int64_t, pid_t>> finished;
  for (const auto& [pid, p] : procs_) {
    if (p->finished() && p->subs.empty()) finished.push_back({p->finished_ms, pid});
  }
  std::sort(finished.begin(), finished.end());
  for (const auto& [when, pid] : finished) {
    if (budget_.Room(MemoryBudget::kRings) >= bytes) return;
    RemoveProcess(pid);
  }
}

void Agent::RemoveProcess(pid_t pid) {
  auto it = procs_.find(pid);
  if (it == procs_.end()) return;
  Process& p = *it->second;
  for (int s = 0; s < 2; ++s)
    if (p.out[s] && p.out_polled[s]) EpollDel(p.out[s].get());
  if (p.in && p.in_polled) EpollDel(p.in.get());
  for (const auto& s : p.subs)
    if (Connection* c = FindConnection(s.conn)) c->subscriptions--;
  procs_.erase(it);
}

}  // namespace sbx::agent
