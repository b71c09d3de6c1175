// A process started by SPAWN, as the agent tracks it (docs/agent-protocol.md, "Processes"): its
// pipes or PTY, the ring buffer of each output stream, its exit, and the connections subscribed
// to it with their delivery cursors. The I/O that moves bytes between pipes, rings and
// connections is in process.cc (methods of Agent, which owns the descriptors' epoll set).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "agent/budget.h"
#include "agent/ring_buffer.h"
#include "common/fd.h"

namespace sbx::agent {

struct Subscriber {
  uint64_t conn;
  uint32_t id;          // request id the events carry
  uint64_t cursor[2];   // next offset to deliver, per stream
  bool paused = false;  // PAUSE: nothing is sent; the process waits for it like for a full queue
};

struct Process {
  // `rings_and_record` holds the rings' capacity and the record's strings (argv, tag, cwd) from
  // the box-wide budget; `budget` is where queued stdin is reserved.
  Process(size_t out_bytes, size_t err_bytes, Reservation rings_and_record, MemoryBudget* budget)
      : ring{RingBuffer(out_bytes), RingBuffer(err_bytes)},
        memory(std::move(rings_and_record)),
        in_memory(budget, MemoryBudget::kStdin) {}

  pid_t pid = -1;
  std::vector<std::string> argv;
  std::string tag, cwd;
  bool pty = false;
  int64_t started_ns = 0, ended_ns = 0;

  UniqueFd out[2];              // stdout (or the PTY master), stderr
  bool out_polled[2] = {};      // registered in epoll (false while paused)
  uint64_t drain_left[2] = {};  // after exit: bytes still taken from the pipe before closing it
  UniqueFd in;                  // stdin pipe, or a dup of the PTY master
  std::string in_queue;         // STDIN bytes the pipe has not taken yet
  // STDIN requests past the queue's limit, whose OK waits until their data fits in in_queue
  // (their bytes are reserved in in_memory too): back-pressure without the client polling.
  struct HeldStdin {
    uint64_t conn;
    uint32_t id;
    std::string data;
  };
  std::deque<HeldStdin> in_held;
  size_t in_held_bytes = 0;
  bool in_close_pending = false;
  bool in_polled = false;

  RingBuffer ring[2];

  bool exited = false;
  int exit_code = -1;
  int signal = 0;
  bool timed_out = false;
  int64_t deadline_ms = 0;  // CLOCK_MONOTONIC ms; 0 = none
  int64_t finished_ms = 0;  // when it became finished (exited and output drained)

  std::vector<Subscriber> subs;
  // WAIT requests, answered when the process exits.
  struct Waiter {
    uint64_t conn;
    uint32_t id;
  };
  std::vector<Waiter> waiters;

  Reservation memory;     // rings and record
  Reservation in_memory;  // in_queue's bytes

  bool finished() const { return exited && !out[0].valid() && !out[1].valid(); }
};

}  // namespace sbx::agent
