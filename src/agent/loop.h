// Agent: the single-threaded epoll loop of sbx-agent. It owns the listening socket, the client
// connections, the signalfd (SIGCHLD reaping, SIGTERM shutdown), the tracked processes and the
// inotify watcher, and dispatches every request of docs/agent-protocol.md. Request handlers for
// processes and the output plumbing are in process.cc; everything else is in loop.cc.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "agent/budget.h"
#include "agent/connection.h"
#include "agent/process.h"
#include "agent/sudo.h"
#include "agent/users.h"
#include "agent/watch.h"
#include "common/fd.h"
#include "common/status.h"
#include "protocol/wire.h"

namespace sbx::agent {

struct AgentOptions {
  int listen_fd = -1;       // listening unix stream socket (the agent takes ownership)
  size_t max_procs = 1024;  // tracked processes, running or finished
  bool pid1 = false;        // running as the sandbox's init
  struct rlimit child_nofile = {RLIM_INFINITY, RLIM_INFINITY};  // restored in children
  bool restore_nofile = false;
  // Box-wide cap on the agent's buffers (MemoryBudget); at least MemoryBudget::kMinCap.
  size_t memory_cap = MemoryBudget::kDefaultCap;
  // The abstract socket sudo is served on (sudo.h); empty: no sudo.
  std::string sudo_socket;
};

class Agent {
 public:
  static constexpr size_t kMaxConnections = 64;
  static constexpr size_t kMaxFinished = 256;
  static constexpr int64_t kFinishedTtlMs = int64_t{10} * 60 * 1000;
  static constexpr size_t kStdinQueueLimit = 4u << 20;

  explicit Agent(AgentOptions options);
  // Creates the epoll set, the signalfd (blocking the signals it reads) and the inotify watcher.
  Status Init();
  // Serves until SIGTERM/SIGINT; returns the exit status.
  int Run();

 private:
  enum Kind : uint64_t {
    kListen = 1,
    kSignal,
    kInotify,
    kConn,
    kProcOut,
    kProcErr,
    kProcIn,
    kSudo  // value 0: the sudo socket; fd + 1: a sudo caller
  };
  static uint64_t Key(Kind k, uint64_t v) { return (static_cast<uint64_t>(k) << 56) | v; }

  // loop.cc
  void OnEvent(uint64_t key, uint32_t events);
  void Accept();
  void OnSignals();
  void Shutdown();
  void ReadConnection(Connection& c);
  bool ProcessFrames(Connection& c);  // false: protocol error, close
  bool HandleFrame(Connection& c, const protocol::Header& h, const std::string& payload);
  void HandleFileRequest(Connection& c, const protocol::Header& h, const protocol::Reader& r);
  // port_relay.cc: TCP_CONNECT. false: the connection is the relay's now (or broken), close it.
  bool ConnectPort(Connection& c, uint32_t id, const protocol::Reader& r);
  void FlushAll();
  void FlushConnection(Connection& c);
  void OnRoom(Connection& c);
  // PAUSE / RESUME: flow control of one subscription (a process's events, a stream, a watch).
  void SetPaused(Connection& c, uint32_t id, bool paused);
  void UpdateConnectionEvents(Connection& c);
  void CloseConnection(uint64_t id);
  Connection* FindConnection(uint64_t id);
  int ComputeTimeoutMs();
  bool EpollSet(int fd, uint64_t key, uint32_t events, bool add);
  void EpollDel(int fd);

  // process.cc
  void HandleProcessRequest(Connection& c, const protocol::Header& h, const protocol::Reader& r);
  void Spawn(Connection& c, uint32_t id, const protocol::Reader& r);
  void Attach(Connection& c, uint32_t id, const protocol::Reader& r);
  // Queues `data` for the process's stdin and answers OK; past kStdinQueueLimit the OK is held
  // (with the data, in Process::in_held) until the queue has room for it.
  void WriteStdin(Connection& c, uint32_t id, Process& p, std::string_view data);
  // Moves held STDIN writes into the queue while they fit, answering each; true if any moved.
  bool AdmitHeldStdin(Process& p);
  // Drops what connection `conn` left waiting on `p`: held STDIN writes and WAITs.
  void ForgetConnection(Process& p, uint64_t conn);
  // Answers every WAIT of an exited process.
  void AnswerWaiters(Process& p);
  // LOOKUP_USER: a user of the box's /etc/passwd (users_), by name or number.
  void LookupUser(Connection& c, uint32_t id, const protocol::Reader& r);
  void ListProcs(Connection& c, uint32_t id);
  // OOM_KILL: SIGKILLs the process the kernel's OOM killer would choose (oom.h).
  void OomKill(Connection& c, uint32_t id, const protocol::Reader& r);
  Process* FindProcess(pid_t pid);
  void OnProcessOutput(pid_t pid, int stream);
  void OnProcessStdin(pid_t pid);
  // Reads one chunk (or, after exit, everything that is left) from a stream unless backpressured.
  void ReadOutput(Process& p, int stream, bool drain);
  void CloseOutput(Process& p, int stream);
  void CloseStdin(Process& p);
  void FlushStdin(Process& p);
  // Moves buffered output to every subscriber with room, sends EXIT to those that have it all,
  // and pauses or resumes reading the process's pipes accordingly.
  void PumpProcess(Process& p);
  // PumpProcess, then drain an exited process's pipes if they are no longer paused.
  void Resume(Process& p);
  bool Backpressured(const Process& p);
  void UpdateProcessEvents(Process& p);
  void Unsubscribe(Process& p, uint64_t conn);
  void Reap();
  // The send pool fell back under its threshold: every connection it held (its processes paused,
  // its requests unread) gets its turn again, whether or not its own socket has room.
  void OnSendRelief();
  void CheckDeadlines();
  void PruneFinished();
  // Drops finished processes no connection is receiving, oldest first, until `bytes` fit under
  // the ring ceiling (or none is left to drop).
  void EvictFinished(size_t bytes);
  void RemoveProcess(pid_t pid);

  AgentOptions options_;
  MemoryBudget budget_;  // before everything that holds reservations on it
  UniqueFd listen_fd_, epoll_fd_, signal_fd_;
  Watcher watcher_;
  UserDb users_;
  SudoServer sudo_;
  std::map<uint64_t, std::unique_ptr<Connection>> conns_;
  uint64_t next_conn_ = 1;
  std::map<pid_t, std::unique_ptr<Process>> procs_;
  bool stop_ = false;
  int64_t last_prune_ms_ = 0;

  friend class ProcListStream;
};

// CLOCK_MONOTONIC milliseconds and CLOCK_REALTIME nanoseconds.
int64_t MonotonicMs();
int64_t RealtimeNs();

}  // namespace sbx::agent
