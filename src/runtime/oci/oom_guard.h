// OomGuard: the OOM killer of gVisor boxes, in place of the host kernel's (threats.md row 43: the
// offending process dies; the agent and the sandbox keep serving).
//
// A gVisor box's memory cgroup holds the Sentry, its gofer and the host processes behind the
// box's processes (under the ptrace platform, one "stub" each, with the process's memory mapped).
// At the box's limit the host kernel's OOM killer takes one of them, and gVisor ends the whole
// sandbox when any does (its stub or the Sentry dying is fatal to it). So for each watched box
// the kernel's killer is switched off (cgroup v1 `memory.oom_control`) and the box's OOM is
// handled here, with the one who knows the box's processes, its agent:
//
//   1. the kernel reports the OOM (an eventfd registered through `cgroup.event_control`); the
//      box's tasks that need memory wait in the kernel meanwhile;
//   2. the agent is asked to kill the process the kernel would have chosen (OOM_KILL:
//      agent/oom.h; SIGKILL, as the kernel's killer sends), over a connection made when the box
//      was watched (at the limit, gVisor fails the host accept() a new connection needs, and its
//      listening socket with it), and the limit is raised by a reserve (a quarter of it, 16 to
//      64 MiB) so that the Sentry and the agent can run; while the answer is awaited, a box out of
//      memory again gets another reserve;
//   3. once the box's usage is back under its limit (the Sentry has reaped the victim), the limit
//      is written back. A box still out of memory at the raised limit gets another kill, up to
//      four reserves in all; a box that stays out of memory, whose agent does not answer, or
//      whose memory does not come back within 5 s is given back to the kernel's killer (which
//      ends the sandbox, as it would have without the guard), and a line in its agent.log says
//      why.
//
// With its killer off the kernel waits only in page faults: an allocation of the kernel's own for
// the box (a new stub's stack and page tables, a socket buffer) that meets the limit before the
// guard has raised it fails with ENOMEM, and gVisor 20221219 panics on some of them ("error
// initializing first thread: cannot allocate memory"), ending the sandbox with no kill counted.
// Ooms() counts the OOMs the guard heard, so that such an end is still told as out of memory
// (`sbx run` exits 137). Seen in 3 of 79 runs with two gVisor boxes at their limits at once.
//
// Only cgroup v1's memory controller can switch the kernel's killer off; on a v2 host the kernel
// keeps deciding (docs/isolation.md). While the process that owns the guard is not running (a
// daemon killed between two starts), a watched box that runs out of memory waits for it: Watch
// on the next Adopt handles an OOM that is already under way. A clean exit gives every box
// back to the kernel first.
//
// Thread-safe; one thread of its own.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "common/fd.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "protocol/client.h"

namespace sbx::runtime {

class OomGuard {
 public:
  struct Options {
    std::chrono::milliseconds agent_timeout{2000};    // connect, then the OOM_KILL reply
    std::chrono::milliseconds recover_timeout{5000};  // for the usage to come back under the limit
  };
  // A v1 memory limit at or above this is none (the kernel's "-1" reads 9223372036854771712).
  static constexpr uint64_t kNoLimit = uint64_t{1} << 62;

  static Result<std::unique_ptr<OomGuard>> Start(Options options);
  static Result<std::unique_ptr<OomGuard>> Start() { return Start(Options{}); }
  // Stops the thread and gives every box still watched back to the kernel's OOM killer.
  ~OomGuard();
  OomGuard(const OomGuard&) = delete;
  OomGuard& operator=(const OomGuard&) = delete;

  // Takes over the OOM kills of box `id`: `memcg` is its v1 memory cgroup directory, `agent_socket`
  // where its agent listens, `box_dir` the box's directory (root's), where the guard keeps its
  // count of kills (oom_kills, so that it survives the process) and appends what the operator
  // should know to agent.log. An OOM already under way is handled at once. Watching a box again
  // replaces its entry.
  Status Watch(const std::string& id, const std::string& memcg, const std::string& agent_socket,
               const std::string& box_dir);
  // Stops watching box `id` (its cgroup is about to go); nothing of the cgroup is touched.
  void Forget(const std::string& id);
  // Processes of box `id` the guard had killed (the kernel's own kills are in its cgroup).
  uint64_t Kills(const std::string& id) const;
  // OOMs of box `id` the guard has handled since Watch, whatever came of them (a kill, or a
  // sandbox that ended first: the kernel fails the Sentry's own allocations at the limit, rather
  // than wait for the guard, and gVisor 20221219 panics on some of them).
  uint64_t Ooms(const std::string& id) const;

 private:
  struct Entry {
    std::string memcg, socket, dir;
    UniqueFd event;  // the eventfd the kernel signals on an OOM (and on the cgroup's removal)
    // To the box's agent, made by Watch (or again when it broke); used by the guard's thread.
    std::shared_ptr<protocol::AgentConnection> agent;
    uint64_t key = 0;  // its epoll key
    uint64_t kills = 0;
    uint64_t ooms = 0;
    bool given_back = false;  // the kernel's killer decides again
  };
  explicit OomGuard(Options options) : options_(options) {}
  void Loop();
  // Handles an OOM of the box behind `key`, if it is under one.
  void Handle(uint64_t key);
  void AddKills(uint64_t key, int delta);  // +1 or -1
  // The connection the box behind `key` is asked on from now on (null: none yet).
  void SetAgent(uint64_t key, std::shared_ptr<protocol::AgentConnection> agent);
  Result<pid_t> AskAgent(protocol::AgentConnection& agent, uint64_t limit,
                         const std::function<Status(bool again)>& reserve) const;

  const Options options_;
  UniqueFd epoll_, wake_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable Mutex mu_;
  std::map<std::string, Entry> entries_ GUARDED_BY(mu_);
  std::map<uint64_t, std::string> ids_ GUARDED_BY(mu_);  // epoll key -> box id
  uint64_t next_key_ GUARDED_BY(mu_) = 1;                // 0 is the wake eventfd's
};

}  // namespace sbx::runtime
