#include "agent/loop.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>

#include "agent/files.h"
#include "agent/log.h"
#include "agent/paths.h"

namespace sbx::agent {

using protocol::Header;
using protocol::Reader;
using protocol::Tag;
using protocol::Type;
using protocol::Writer;

namespace {
constexpr const char* kAgentVersion = "sbx-agent 0.1.0";
constexpr size_t kReadChunk = 64 << 10;
}  // namespace

int64_t MonotonicMs() {
  struct timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

int64_t RealtimeNs() {
  struct timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

Agent::Agent(AgentOptions options)
    : options_(options),
      budget_(options.memory_cap, kMaxConnections * Connection::kSendQueueFloor),
      listen_fd_(options.listen_fd),
      watcher_(&budget_),
      sudo_(users_, [this](int fd) { EpollDel(fd); }) {}

Status Agent::Init() {
  epoll_fd_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd_) return Status::Errno("epoll_create1");

  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGCHLD, SIGTERM, SIGINT, SIGHUP}) sigaddset(&set, s);
  if (::sigprocmask(SIG_BLOCK, &set, nullptr) != 0) return Status::Errno("sigprocmask");
  ::signal(SIGPIPE, SIG_IGN);
  signal_fd_.reset(::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!signal_fd_) return Status::Errno("signalfd");

  int fl = ::fcntl(listen_fd_.get(), F_GETFL);
  if (fl < 0 || ::fcntl(listen_fd_.get(), F_SETFL, fl | O_NONBLOCK) < 0 ||
      ::fcntl(listen_fd_.get(), F_SETFD, FD_CLOEXEC) < 0)
    return Status::Errno("listen fd");

  if (Status s = watcher_.Init(); !s.ok()) Log("watches unavailable: %s", s.message().c_str());

  if (!EpollSet(listen_fd_.get(), Key(kListen, 0), EPOLLIN, true) ||
      !EpollSet(signal_fd_.get(), Key(kSignal, 0), EPOLLIN, true))
    return Status::Errno("epoll_ctl");
  if (watcher_.fd() >= 0) EpollSet(watcher_.fd(), Key(kInotify, 0), EPOLLIN, true);
  if (!options_.sudo_socket.empty()) {
    Status s = sudo_.Listen(options_.sudo_socket);
    if (s.ok()) EpollSet(sudo_.listen_fd(), Key(kSudo, 0), EPOLLIN, true);
    if (!s.ok()) Log("sudo unavailable: %s", s.message().c_str());
    if (options_.restore_nofile) sudo_.SetChildNofile(options_.child_nofile);
  }
  // Children may already exist (none normally); reap anything pending.
  Reap();
  return {};
}

bool Agent::EpollSet(int fd, uint64_t key, uint32_t events, bool add) {
  struct epoll_event ev {};
  ev.events = events;
  ev.data.u64 = key;
  return ::epoll_ctl(epoll_fd_.get(), add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &ev) == 0;
}

void Agent::EpollDel(int fd) { ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, fd, nullptr); }

int Agent::Run() {
  struct epoll_event events[64];
  while (!stop_) {
    int n = ::epoll_wait(epoll_fd_.get(), events, 64, ComputeTimeoutMs());
    if (n < 0) {
      if (errno == EINTR) continue;
      Log("epoll_wait: %s", strerror(errno));
      return 1;
    }
    for (int i = 0; i < n && !stop_; ++i) OnEvent(events[i].data.u64, events[i].events);
    if (stop_) break;
    CheckDeadlines();
    int64_t now = MonotonicMs();
    if (now - last_prune_ms_ >= 1000) {
      last_prune_ms_ = now;
      PruneFinished();
    }
    FlushAll();
    if (budget_.TakeSendRelief()) OnSendRelief();
  }
  return 0;
}

void Agent::OnSendRelief() {
  std::vector<uint64_t> ids;
  for (const auto& [id, c] : conns_) ids.push_back(id);
  for (uint64_t id : ids) {
    Connection* c = FindConnection(id);
    if (!c || c->Full() || c->closing) continue;
    OnRoom(*c);
    if ((c = FindConnection(id))) FlushConnection(*c);
  }
}

int Agent::ComputeTimeoutMs() {
  int64_t now = MonotonicMs();
  int64_t t = -1;
  bool any_finished = false;
  for (const auto& [pid, p] : procs_) {
    if (p->deadline_ms > 0 && !p->exited) {
      int64_t left = p->deadline_ms - now;
      if (left < 0) left = 0;
      if (t < 0 || left < t) t = left;
    }
    if (p->finished()) any_finished = true;
  }
  if (any_finished && (t < 0 || t > 1000)) t = 1000;
  return static_cast<int>(t);
}

void Agent::OnEvent(uint64_t key, uint32_t events) {
  auto kind = static_cast<Kind>(key >> 56);
  uint64_t v = key & ((1ULL << 56) - 1);
  switch (kind) {
    case kListen:
      Accept();
      break;
    case kSudo:
      if (v == 0) {
        // Accept every pending caller; each is watched until its answer.
        for (int fd; (fd = sudo_.Accept()) >= 0;)
          EpollSet(fd, Key(kSudo, static_cast<uint64_t>(fd) + 1), EPOLLIN, true);
      } else {
        sudo_.OnReadable(static_cast<int>(v - 1));
      }
      break;
    case kSignal:
      OnSignals();
      break;
    case kInotify:
      watcher_.OnReadable([this](uint64_t conn, uint32_t id, const WatchOptions& options,
                                 protocol::WatchEvent ev, const std::string& path,
                                 const std::string& name) {
        Connection* c = FindConnection(conn);
        // A client that does not read its events loses them rather than growing the queue.
        if (!c || c->Full()) return;
        Writer w;
        w.Int(Tag::kEvent, static_cast<int64_t>(ev)).Str(Tag::kPath, path).Str(Tag::kName, name);
        if (options.with_entry) {
          Writer entry;
          // An entry that is gone (removed, renamed away) is reported without one.
          if (StatEntry(path, users_, options.xattr_prefix, &entry).ok())
            w.Nested(Tag::kEntry, entry);
        }
        c->Send(Type::kWatchEvent, id, w);
      });
      break;
    case kConn: {
      Connection* c = FindConnection(v);
      if (!c) break;
      if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        ReadConnection(*c);
        c = FindConnection(v);
      }
      // A hung-up peer is noticed by the failing write (or by closing with nothing queued).
      if (c && (events & (EPOLLOUT | EPOLLHUP | EPOLLERR))) FlushConnection(*c);
      break;
    }
    case kProcOut:
    case kProcErr:
      OnProcessOutput(static_cast<pid_t>(v), kind == kProcOut ? 0 : 1);
      break;
    case kProcIn:
      OnProcessStdin(static_cast<pid_t>(v));
      break;
  }
}

void Agent::Accept() {
  for (;;) {
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) Log("accept: %s", strerror(errno));
      return;
    }
    if (conns_.size() >= kMaxConnections) {
      ::close(fd);
      Log("connection refused: %zu connections open", conns_.size());
      continue;
    }
    uint64_t id = next_conn_++;
    auto c = std::make_unique<Connection>(id, UniqueFd(fd), &budget_);
    c->epoll_events = EPOLLIN;
    if (!EpollSet(fd, Key(kConn, id), EPOLLIN, true)) {
      Log("epoll_ctl: %s", strerror(errno));
      continue;
    }
    conns_[id] = std::move(c);
  }
}

void Agent::OnSignals() {
  struct signalfd_siginfo si;
  bool reap = false;
  while (::read(signal_fd_.get(), &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
    switch (si.ssi_signo) {
      case SIGCHLD:
        reap = true;
        break;
      case SIGTERM:
      case SIGINT:
        Shutdown();
        return;
      default:
        break;  // SIGHUP: nothing to reload
    }
  }
  if (reap) Reap();
}

void Agent::Shutdown() {
  Log("shutting down: killing all processes");
  for (const auto& [pid, p] : procs_) {
    if (!p->exited) ::kill(-pid, SIGKILL);
  }
  if (options_.pid1) ::kill(-1, SIGKILL);
  stop_ = true;
}

Connection* Agent::FindConnection(uint64_t id) {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : it->second.get();
}

void Agent::CloseConnection(uint64_t id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  std::unique_ptr<Connection> c = std::move(it->second);
  conns_.erase(it);
  EpollDel(c->fd());
  watcher_.RemoveConnection(id);
  // Held STDIN writes and WAITs of `c` go: nobody is left to answer.
  for (const auto& [pid, p] : procs_) ForgetConnection(*p, id);
  if (c->subscriptions > 0) {
    std::vector<pid_t> pids;
    for (const auto& [pid, p] : procs_) pids.push_back(pid);
    for (pid_t pid : pids) {
      if (Process* p = FindProcess(pid)) {
        Unsubscribe(*p, id);
        Resume(*p);  // a slow subscriber leaving may let the process run again
      }
    }
  }
  // Streams and pending writes (with their temporary files) go with `c`.
}

void Agent::ReadConnection(Connection& c) {
  uint64_t id = c.id();
  char buf[kReadChunk];
  // Read only while requests can be answered: a full send queue stops reading (backpressure).
  // What stays buffered after ProcessFrames() is at most one partial frame, so this is bounded.
  while (!c.closing && !c.Full()) {
    ssize_t n = ::read(c.fd(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      CloseConnection(id);
      return;
    }
    if (n == 0) {
      CloseConnection(id);
      return;
    }
    c.in().Append(buf, static_cast<size_t>(n));
    if (!ProcessFrames(c)) {
      CloseConnection(id);
      return;
    }
  }
  UpdateConnectionEvents(c);
}

bool Agent::ProcessFrames(Connection& c) {
  Header h;
  std::string payload;
  while (!c.closing && !c.Full()) {
    int r = c.in().Next(&h, &payload);
    if (r < 0) {
      Log("connection %llu: oversized frame, closing", static_cast<unsigned long long>(c.id()));
      return false;
    }
    if (r == 0) break;
    if (!HandleFrame(c, h, payload)) return false;
  }
  return true;
}

bool Agent::HandleFrame(Connection& c, const Header& h, const std::string& payload) {
  Reader r;
  bool parsed = r.Parse(payload);
  if (!c.hello_done) {
    if (h.type != Type::kHello || !parsed) {
      Log("connection %llu: first frame is not HELLO, closing",
          static_cast<unsigned long long>(c.id()));
      return false;
    }
    c.hello_done = true;
    int64_t version = r.Int(Tag::kVersion, -1);
    if (version != protocol::kProtocolVersion) {
      SendError(c, h.id, EPROTONOSUPPORT,
                "hello: unsupported protocol version " + std::to_string(version));
      c.closing = true;
      return true;
    }
    Writer w;
    w.Int(Tag::kVersion, protocol::kProtocolVersion)
        .Str(Tag::kAgentVersion, kAgentVersion)
        .Int(Tag::kMemoryCap, static_cast<int64_t>(budget_.cap()))
        .Int(Tag::kMemoryUsed, static_cast<int64_t>(budget_.used()));
    c.Send(Type::kHello, h.id, w);
    return true;
  }
  if (!parsed) {
    SendError(c, h.id, EINVAL, "malformed payload");
    return true;
  }
  auto t = static_cast<uint16_t>(h.type);
  if (h.type == Type::kPause || h.type == Type::kResume) {
    SetPaused(c, h.id, h.type == Type::kPause);  // no reply: it would land in the paused stream
  } else if ((t >= static_cast<uint16_t>(Type::kSpawn) &&
              t <= static_cast<uint16_t>(Type::kListProcs)) ||
             h.type == Type::kWait) {
    HandleProcessRequest(c, h, r);
  } else if (h.type == Type::kLookupUser) {
    LookupUser(c, h.id, r);
  } else if (h.type == Type::kOomKill) {
    OomKill(c, h.id, r);
  } else if (h.type == Type::kTcpConnect) {
    return ConnectPort(c, h.id, r);
  } else if (t >= static_cast<uint16_t>(Type::kStat) &&
             t <= static_cast<uint16_t>(Type::kWriteAbort) && h.type != Type::kEntry &&
             h.type != Type::kData && h.type != Type::kWatchEvent) {
    HandleFileRequest(c, h, r);
  } else {
    SendError(c, h.id, EINVAL, "unexpected frame type " + std::to_string(t));
  }
  return true;
}

void Agent::HandleFileRequest(Connection& c, const Header& h, const Reader& r) {
  const uint32_t id = h.id;
  std::string path;
  bool needs_path = h.type != Type::kWriteData && h.type != Type::kWriteEnd &&
                    h.type != Type::kWriteAbort && h.type != Type::kUnwatch;
  if (needs_path && !CleanPath(r.Str(Tag::kPath), &path)) {
    SendError(c, id, EINVAL, "missing or invalid path");
    return;
  }
  auto fail = [&](const Status& s) { SendError(c, id, s.err() ? s.err() : EIO, s.what()); };
  // Entries carry the xattrs under this prefix; only user.* attributes may be asked for.
  std::string xattr_prefix(r.Str(Tag::kXattrPrefix));
  if (!xattr_prefix.empty() && xattr_prefix.rfind("user.", 0) != 0)
    return SendError(c, id, EINVAL, "xattr_prefix: must start with \"user.\"");
  auto reply_entry = [&](const std::string& p, const std::string& prefix) {
    users_.Reload();
    Writer w;
    if (Status s = StatEntry(p, users_, prefix, &w); !s.ok()) return fail(s);
    c.Send(Type::kOk, id, w);
  };
  auto ids_ok = [&](int64_t v) { return v >= 0 && v <= 0xfffffffeLL; };
  switch (h.type) {
    case Type::kStat: {
      users_.Reload();
      Writer w;
      if (Status s = StatEntry(path, users_, xattr_prefix, &w, r.Int(Tag::kFollow) != 0); !s.ok())
        return fail(s);
      c.Send(Type::kOk, id, w);
      return;
    }
    case Type::kList: {
      users_.Reload();
      auto s = StartList(path, r.Int(Tag::kDepth, 1), id, users_, xattr_prefix);
      if (!s.ok()) return fail(s.status());
      c.streams().push_back(std::move(s.value()));
      return;
    }
    case Type::kRead: {
      auto s = StartRead(path, r.Int(Tag::kOffset, 0), r.Int(Tag::kLength, 0), id);
      if (!s.ok()) return fail(s.status());
      c.streams().push_back(std::move(s.value()));
      return;
    }
    case Type::kWriteBegin: {
      if (c.writes().size() >= Connection::kMaxOpenWrites)
        return SendError(c, id, EMFILE, "write " + path + ": too many open writes");
      if (c.writes().count(id)) return SendError(c, id, EBUSY, "write " + path + ": id in use");
      // Without a mode, an overwrite keeps the file's permissions (a script stays executable).
      int64_t mode = r.Int(Tag::kMode, -1), uid = r.Int(Tag::kUid, 0), gid = r.Int(Tag::kGid, 0);
      if (!ids_ok(uid) || !ids_ok(gid) || (r.Has(Tag::kMode) && (mode < 0 || mode > 07777)))
        return SendError(c, id, EINVAL, "write " + path + ": bad mode or owner");
      if (!r.Has(Tag::kMode)) {
        struct stat st;
        mode = ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) ? st.st_mode & 07777 : 0644;
      }
      Xattrs xattrs;
      for (std::string_view x : r.All(Tag::kXattr)) {
        Reader xr;
        if (!xr.Parse(x) || !xr.Has(Tag::kName))
          return SendError(c, id, EINVAL, "write " + path + ": malformed xattr");
        xattrs.emplace_back(xr.Str(Tag::kName), xr.Str(Tag::kData));
      }
      auto w = PendingWrite::Begin(path, static_cast<mode_t>(mode), static_cast<uid_t>(uid),
                                   static_cast<gid_t>(gid), r.Int(Tag::kParents, 0) != 0,
                                   std::move(xattrs));
      if (!w.ok()) return fail(w.status());
      w.value()->xattr_prefix = xattr_prefix;
      c.writes()[id] = std::move(w.value());
      c.Send(Type::kOk, id, Writer());
      return;
    }
    case Type::kWriteData: {
      auto it = c.writes().find(id);
      if (it != c.writes().end()) it->second->Append(r.Str(Tag::kData));
      return;  // no reply; an unknown id is reported by WRITE_END
    }
    case Type::kWriteEnd: {
      auto it = c.writes().find(id);
      if (it == c.writes().end()) return SendError(c, id, EBADF, "write: no open write");
      std::unique_ptr<PendingWrite> w = std::move(it->second);
      c.writes().erase(it);
      if (Status s = w->Finish(); !s.ok()) return fail(s);
      return reply_entry(w->path(), w->xattr_prefix);
    }
    case Type::kWriteAbort: {
      // The client gave up (its upload failed): the temporary file goes now, not at disconnect.
      if (c.writes().erase(id) == 0) return SendError(c, id, EBADF, "write: no open write");
      c.Send(Type::kOk, id, Writer());
      return;
    }
    case Type::kMkdir: {
      int64_t mode = r.Int(Tag::kMode, 0755), uid = r.Int(Tag::kUid, 0), gid = r.Int(Tag::kGid, 0);
      if (!ids_ok(uid) || !ids_ok(gid) || mode < 0 || mode > 07777)
        return SendError(c, id, EINVAL, "mkdir " + path + ": bad mode or owner");
      Status s = MakeDir(path, static_cast<mode_t>(mode), static_cast<uid_t>(uid),
                         static_cast<gid_t>(gid), r.Int(Tag::kParents, 0) != 0);
      if (!s.ok()) return fail(s);
      return reply_entry(path, xattr_prefix);
    }
    case Type::kMove: {
      std::string to;
      if (!CleanPath(r.Str(Tag::kNewPath), &to))
        return SendError(c, id, EINVAL, "move " + path + ": missing or invalid new_path");
      if (Status s = MovePath(path, to); !s.ok()) return fail(s);
      return reply_entry(to, xattr_prefix);
    }
    case Type::kRemove: {
      if (Status s = RemovePath(path, r.Int(Tag::kRecursive, 0) != 0); !s.ok()) return fail(s);
      c.Send(Type::kOk, id, Writer());
      return;
    }
    case Type::kWatch: {
      WatchOptions options;
      options.recursive = r.Int(Tag::kRecursive, 0) != 0;
      options.with_entry = r.Int(Tag::kWithEntry, 0) != 0;
      options.xattr_prefix = xattr_prefix;
      Status s = watcher_.Add(c.id(), id, path, options);
      if (!s.ok()) return fail(s);
      c.Send(Type::kOk, id, Writer());
      return;
    }
    case Type::kUnwatch:
      if (!watcher_.Remove(c.id(), id)) return SendError(c, id, ENOENT, "unwatch: no such watch");
      c.Send(Type::kOk, id, Writer());
      return;
    default:
      SendError(c, id, EINVAL, "unexpected frame type " + std::to_string(static_cast<int>(h.type)));
  }
}

void Agent::FlushAll() {
  std::vector<uint64_t> ids;
  for (const auto& [id, c] : conns_) ids.push_back(id);
  for (uint64_t id : ids) {
    if (Connection* c = FindConnection(id)) FlushConnection(*c);
  }
}

void Agent::FlushConnection(Connection& c) {
  uint64_t id = c.id();
  // Bounded rounds: flush, then let streams and processes refill the room that was made.
  for (int round = 0; round < 16; ++round) {
    bool would_block = false;
    if (!c.Flush(&would_block)) {
      CloseConnection(id);
      return;
    }
    if (c.closing && !c.HasOutput()) {
      CloseConnection(id);
      return;
    }
    if (c.Full() || would_block) break;
    OnRoom(c);
    if (!c.HasOutput()) break;  // nothing new to send
  }
  UpdateConnectionEvents(c);
}

void Agent::SetPaused(Connection& c, uint32_t id, bool paused) {
  for (auto& s : c.streams())
    if (s->id() == id) s->paused = paused;
  watcher_.SetPaused(c.id(), id, paused);
  std::vector<pid_t> pids;
  for (const auto& [pid, p] : procs_) {
    for (auto& s : p->subs) {
      if (s.conn != c.id() || s.id != id || s.paused == paused) continue;
      s.paused = paused;
      pids.push_back(pid);
    }
  }
  if (paused) return;
  for (pid_t pid : pids) {
    if (Process* p = FindProcess(pid)) Resume(*p);
  }
  OnRoom(c);  // a resumed stream may be all there is to send
}

void Agent::OnRoom(Connection& c) {
  // Every stream that is not paused gets its turn; a paused one holds up no other.
  auto& streams = c.streams();
  for (auto it = streams.begin(); it != streams.end() && !c.Full();) {
    if ((*it)->paused) {
      ++it;
    } else if ((*it)->Pump(c)) {
      it = streams.erase(it);
    } else {
      break;  // the queue is full again
    }
  }
  if (c.subscriptions > 0 && !c.Full()) {
    std::vector<pid_t> pids;
    for (const auto& [pid, p] : procs_) {
      for (const auto& s : p->subs)
        if (s.conn == c.id()) pids.push_back(pid);
    }
    for (pid_t pid : pids) {
      if (Process* p = FindProcess(pid)) Resume(*p);
    }
  }
  // Requests that were waiting for room in the send queue.
  if (!c.Full() && !c.closing && c.in().buffered() > 0) {
    if (!ProcessFrames(c)) c.closing = true;
  }
}

void Agent::UpdateConnectionEvents(Connection& c) {
  uint32_t want = 0;
  if (!c.closing && !c.Full()) want |= EPOLLIN;
  if (c.HasOutput()) want |= EPOLLOUT;
  if (want != c.epoll_events) {
    EpollSet(c.fd(), Key(kConn, c.id()), want, false);
    c.epoll_events = want;
  }
}

}  // namespace sbx::agent
