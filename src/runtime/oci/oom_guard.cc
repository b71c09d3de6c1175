#include "runtime/oci/oom_guard.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "protocol/client.h"
#include "runtime/native/cgroup_internal.h"

namespace sbx::runtime {
namespace {

using cgroup_internal::Exists;
using cgroup_internal::ReadKeyedUint;
using cgroup_internal::ReadUint;
using cgroup_internal::WriteKnob;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = 1 << 20;
constexpr int kMaxRounds = 4;  // reserves (and kills) for one OOM before the kernel decides

// The box's memory limit (and memory+swap's, where the kernel accounts swap) set to `base` plus
// `extra`: memsw moves first when the limit grows, last when it shrinks (memory <= memory+swap at
// every write). A shrink the kernel cannot reclaim down to is EBUSY.
Status SetMemory(const std::string& memcg, uint64_t base, uint64_t memsw_base, uint64_t extra,
                 bool grows) {
  const std::string memsw = memcg + "/memory.memsw.limit_in_bytes";
  const bool has_memsw = memsw_base != 0;
  if (has_memsw && grows) SBX_RETURN_IF_ERROR(WriteKnob(memsw, std::to_string(memsw_base + extra)));
  SBX_RETURN_IF_ERROR(WriteKnob(memcg + "/memory.limit_in_bytes", std::to_string(base + extra)));
  if (has_memsw && !grows)
    SBX_RETURN_IF_ERROR(WriteKnob(memsw, std::to_string(memsw_base + extra)));
  return {};
}

// Whether an idle connection to an agent is still open: the agent says nothing unasked, so one
// that has anything to read (its end closed, or a stray frame) is not to be asked on.
bool StillOpen(protocol::AgentConnection& agent) {
  pollfd p{agent.fd(), POLLIN | POLLRDHUP, 0};
  return !agent.HasQueued() && ::poll(&p, 1, 0) == 0;
}

// A connection to the box's agent, or null.
std::shared_ptr<protocol::AgentConnection> ConnectAgent(const std::string& socket, int timeout_ms) {
  auto c = protocol::AgentConnection::Connect(socket, timeout_ms);
  if (!c.ok()) return nullptr;
  return std::make_shared<protocol::AgentConnection>(std::move(c).value());
}

}  // namespace

// Calls `reserve(false)`, sends OOM_KILL on `agent` and waits for its answer (the victim's pid),
// calling `reserve(true)` every few milliseconds while waiting; a failure of `reserve` ends the
// wait with it.
Result<pid_t> OomGuard::AskAgent(protocol::AgentConnection& agent, uint64_t limit,
                                 const std::function<Status(bool again)>& reserve) const {
  // The room first: until it is there, the Sentry's own allocations in the host kernel fail.
  SBX_RETURN_IF_ERROR(reserve(false));
  const uint32_t call = agent.NextId();
  SBX_RETURN_IF_ERROR(
      agent.Send(protocol::Type::kOomKill, call,
                 protocol::Writer().Int(protocol::Tag::kMemoryLimit, static_cast<int64_t>(limit))));
  const auto answer_by = Clock::now() + options_.agent_timeout;
  for (;;) {
    auto f = agent.Receive(5);
    if (f.ok()) {
      if (f->id() != call) continue;  // nothing else is asked on this connection
      if (f->type() != protocol::Type::kOk) return protocol::ErrorFromFrame(*f);
      int64_t pid = f->fields.Int(protocol::Tag::kPid, 0);
      if (pid <= 0 || pid > 0x7fffffff) return Status::Error("OOM_KILL answered no pid", EPROTO);
      return static_cast<pid_t>(pid);
    }
    if (f.status().err() != ETIMEDOUT) return f.status();
    if (Clock::now() >= answer_by)
      return Status::Error(
          "no answer within " + std::to_string(options_.agent_timeout.count()) + " ms", ETIMEDOUT);
    SBX_RETURN_IF_ERROR(reserve(true));
  }
}

namespace {

void AppendLine(const std::string& path, const std::string& line) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW));
  if (fd) (void)!::write(fd.get(), line.data(), line.size());
}

}  // namespace

Result<std::unique_ptr<OomGuard>> OomGuard::Start(Options options) {
  std::unique_ptr<OomGuard> g(new OomGuard(options));
  g->epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!g->epoll_) return Status::Errno("oom guard: epoll_create1");
  g->wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!g->wake_) return Status::Errno("oom guard: eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;
  if (::epoll_ctl(g->epoll_.get(), EPOLL_CTL_ADD, g->wake_.get(), &ev) != 0)
    return Status::Errno("oom guard: epoll_ctl");
  g->thread_ = std::thread([p = g.get()] { p->Loop(); });
  return g;
}

OomGuard::~OomGuard() {
  stop_ = true;
  (void)!::eventfd_write(wake_.get(), 1);
  if (thread_.joinable()) thread_.join();
  MutexLock l(mu_);
  for (auto& [id, e] : entries_)
    if (!e.given_back) (void)WriteKnob(e.memcg + "/memory.oom_control", "0");
}

Status OomGuard::Watch(const std::string& id, const std::string& memcg,
                       const std::string& agent_socket, const std::string& box_dir) {
  const std::string what = "watch the memory of box " + id;
  const std::string control = memcg + "/memory.oom_control";
  UniqueFd event(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!event) return Status::Errno(what + ": eventfd");
  UniqueFd oc(::open(control.c_str(), O_RDONLY | O_CLOEXEC));
  if (!oc) return Status::Errno(what + ": open " + control);
  SBX_RETURN_IF_ERROR(WriteKnob(memcg + "/cgroup.event_control",
                                std::to_string(event.get()) + " " + std::to_string(oc.get()))
                          .Wrap(what));
  // The kernel's killer off only once the notification is registered: an OOM from here on is
  // heard (or was under way, which the first check below finds).
  SBX_RETURN_IF_ERROR(WriteKnob(control, "1").Wrap(what));
  Entry e;
  e.memcg = memcg;
  e.socket = agent_socket;
  e.dir = box_dir;
  // Now, while the box has memory to accept it (else at the first OOM, if the agent can).
  e.agent = ConnectAgent(agent_socket, static_cast<int>(options_.agent_timeout.count()));
  if (auto n = ReadFile(box_dir + "/oom_kills", 64); n.ok())
    e.kills = std::strtoull(n->c_str(), nullptr, 10);
  MutexLock l(mu_);
  if (auto it = entries_.find(id); it != entries_.end()) {
    ids_.erase(it->second.key);
    entries_.erase(it);
  }
  e.key = next_key_++;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = e.key;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, event.get(), &ev) != 0) {
    Status s = Status::Errno(what + ": epoll_ctl");
    (void)WriteKnob(control, "0");
    return s;
  }
  // Checked once at once: an OOM under way before the registration sent no event.
  (void)!::eventfd_write(event.get(), 1);
  e.event = std::move(event);
  ids_[e.key] = id;
  entries_.emplace(id, std::move(e));
  return {};
}

void OomGuard::Forget(const std::string& id) {
  MutexLock l(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  ids_.erase(it->second.key);
  entries_.erase(it);  // closing the eventfd takes it out of the epoll set
}

uint64_t OomGuard::Kills(const std::string& id) const {
  MutexLock l(mu_);
  auto it = entries_.find(id);
  return it == entries_.end() ? 0 : it->second.kills;
}

uint64_t OomGuard::Ooms(const std::string& id) const {
  MutexLock l(mu_);
  auto it = entries_.find(id);
  return it == entries_.end() ? 0 : it->second.ooms;
}

void OomGuard::Loop() {
  // A box out of memory waits on this thread, the Sentry's own kernel allocations failing
  // meanwhile: it must not queue behind the host's busy processes. It sleeps otherwise.
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), -20);
  epoll_event events[16];
  while (!stop_) {
    int n = ::epoll_wait(epoll_.get(), events, 16, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    std::vector<uint64_t> keys;
    {
      MutexLock l(mu_);
      for (int i = 0; i < n; ++i) {
        const uint64_t key = events[i].data.u64;
        uint64_t count;
        if (key == 0) {
          (void)!::eventfd_read(wake_.get(), &count);
          continue;
        }
        auto id = ids_.find(key);
        if (id == ids_.end()) continue;
        (void)!::eventfd_read(entries_.at(id->second).event.get(), &count);
        keys.push_back(key);
      }
    }
    for (uint64_t key : keys)
      if (!stop_) Handle(key);
  }
}

void OomGuard::Handle(uint64_t key) {
  std::string memcg, socket, dir;
  std::shared_ptr<protocol::AgentConnection> agent;
  {
    MutexLock l(mu_);
    auto id = ids_.find(key);
    if (id == ids_.end()) return;
    const Entry& e = entries_.at(id->second);
    if (e.given_back) return;
    memcg = e.memcg;
    socket = e.socket;
    dir = e.dir;
    agent = e.agent;
  }
  const std::string control = memcg + "/memory.oom_control";
  auto under_oom = [&] {
    auto u = ReadKeyedUint(control, "under_oom");
    return u.ok() && *u != 0;
  };
  if (!under_oom()) return;  // the check at Watch, or the cgroup's removal
  {
    MutexLock l(mu_);
    if (auto id = ids_.find(key); id != ids_.end()) ++entries_.at(id->second).ooms;
  }
  auto limit = ReadUint(memcg + "/memory.limit_in_bytes");
  if (!limit.ok()) return;  // the cgroup is going
  uint64_t memsw = 0;
  if (Exists(memcg + "/memory.memsw.limit_in_bytes")) {
    auto m = ReadUint(memcg + "/memory.memsw.limit_in_bytes");
    if (m.ok() && *m < kNoLimit) memsw = *m;
  }
  const uint64_t reserve = std::clamp<uint64_t>(*limit / 4, 16 * kMiB, 64 * kMiB);
  const int timeout_ms = static_cast<int>(options_.agent_timeout.count());
  uint64_t extra = 0;
  pid_t last = 0;
  int rounds = 0;
  const auto deadline = Clock::now() + options_.recover_timeout;
  // Why the box goes back to the kernel's killer.
  std::string why = *limit >= kNoLimit ? "it has no memory limit of its own to raise" : "";
  while (why.empty()) {
    if (under_oom()) {
      if (rounds == kMaxRounds) {
        why = "it stayed out of memory after " + std::to_string(kMaxRounds) + " reserves";
        break;
      }
      if (!agent || !StillOpen(*agent)) {
        agent = ConnectAgent(socket, timeout_ms);
        if (!agent) {
          why = "its agent could not be reached at " + socket;
          break;
        }
        SetAgent(key, agent);  // the next OOM asks on it too
      }
      // Counted before the kill, so that whoever sees the victim's exit also sees its count;
      // taken back when the agent kills nothing or the same process again.
      AddKills(key, 1);
      Result<pid_t> victim = AskAgent(*agent, *limit, [&](bool again) -> Status {
        // The reserve, and another each time the box is out of memory again while the answer is
        // awaited (the agent and the Sentry need room to kill).
        if (again && !under_oom()) return {};
        if (rounds == kMaxRounds)
          return Status::Error("no answer within " + std::to_string(kMaxRounds) + " reserves",
                               ETIMEDOUT);
        extra += reserve;
        ++rounds;
        return SetMemory(memcg, *limit, memsw, extra, true).Wrap("raise its limit");
      });
      if (!victim.ok() || *victim == last) AddKills(key, -1);
      if (!victim.ok() && victim.status().err() == ESRCH) {
        // Nothing left to kill: the last victim still holds its memory until the Sentry has
        // reaped it. Waited for below (or more reserves, up to the last).
      } else if (!victim.ok()) {
        SetAgent(key, nullptr);  // it may be mid-reply: the next OOM makes a new one
        why = "its agent did not kill: " + victim.status().message();
        break;
      } else {
        last = *victim;
      }
    }
    auto usage = ReadUint(memcg + "/memory.usage_in_bytes");
    if (!usage.ok()) return;  // the cgroup is gone
    // Back under the limit: the limit again (the kernel reclaims the rest, or refuses: EBUSY).
    if (*usage <= *limit && SetMemory(memcg, *limit, memsw, 0, false).ok()) return;
    if (stop_) return;  // the destructor gives the box back
    if (Clock::now() >= deadline) {
      why = "its memory did not come back under the limit within " +
            std::to_string(options_.recover_timeout.count()) + " ms";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  {
    MutexLock l(mu_);
    if (auto id = ids_.find(key); id != ids_.end()) entries_.at(id->second).given_back = true;
  }
  (void)WriteKnob(control, "0");
  std::string line = "sbx: the box is out of memory and " + why +
                     ": the host kernel's OOM killer decides from now on (under gVisor it ends "
                     "the whole sandbox)";
  if (extra > 0) {
    // The limit as asked, if the kernel can reclaim down to it; else it stays raised.
    if (Status s = SetMemory(memcg, *limit, memsw, 0, false); !s.ok())
      line += "; its memory limit stays " + std::to_string(extra / kMiB) +
              " MiB above the one asked for (" + s.message() + ")";
  }
  AppendLine(dir + "/agent.log", line + "\n");
}

void OomGuard::SetAgent(uint64_t key, std::shared_ptr<protocol::AgentConnection> agent) {
  MutexLock l(mu_);
  if (auto id = ids_.find(key); id != ids_.end()) entries_.at(id->second).agent = std::move(agent);
}

void OomGuard::AddKills(uint64_t key, int delta) {
  MutexLock l(mu_);
  auto id = ids_.find(key);
  if (id == ids_.end()) return;
  Entry& e = entries_.at(id->second);
  e.kills = delta > 0 ? e.kills + 1 : e.kills - 1;
  (void)WriteFileAtomic(e.dir + "/oom_kills", std::to_string(e.kills) + "\n", 0600);
}

}  // namespace sbx::runtime
