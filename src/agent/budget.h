// MemoryBudget: the box-wide cap on the agent's own buffers (docs/agent-protocol.md, "Bounds"):
// the output ring buffers and bookkeeping of every tracked process, the stdin queues, the
// directories the watcher keeps, and the send queues of every connection (which carry process
// output, streaming replies and watch events). The agent is PID 1 and the box's memory limit
// covers it: whatever a box makes it buffer must stop at a fixed figure, so that a box using all
// its memory kills its own processes, never the agent.
//
// The cap is split in three pools, so that no kind of use can starve another (a flood nobody
// reads must not stop new processes from starting, nor a process holding big rings stop input):
//   * kRings, half of the cap: each process's rings (at full capacity) and record, and the
//     directories the watcher keeps; reserved, and refused past the pool;
//   * kStdin, a quarter: queued stdin; reserved, and refused past the pool;
//   * kSend, a quarter: the connections' send queues; charged as they fill, never refused. A
//     connection is held (Full()) once its own queue passes a small floor while the pool is at
//     SendThreshold(); the floors of all connections are set aside below the pool's size, so every
//     connection can always make progress. A connection held that way is not woken by its own
//     socket, so the pool remembers reaching the threshold and TakeSendRelief() tells the loop
//     when it has fallen back under it.
// Single-threaded, like the rest of the agent.
#pragma once

#include <cstddef>
#include <utility>

namespace sbx::agent {

class MemoryBudget {
 public:
  static constexpr size_t kDefaultCap = size_t{64} << 20;
  static constexpr size_t kMinCap = size_t{8} << 20;
  enum Pool { kRings = 0, kStdin = 1, kSend = 2 };

  // `floors` is set aside in the send pool (connections x their floor); it must be under a
  // quarter of kMinCap.
  MemoryBudget(size_t cap, size_t floors) : cap_(cap), floors_(floors) {}

  size_t cap() const { return cap_; }
  size_t used() const { return used_[0] + used_[1] + used_[2]; }
  size_t used(Pool p) const { return used_[p]; }
  size_t Limit(Pool p) const { return p == kRings ? cap_ / 2 : cap_ / 4; }
  size_t Room(Pool p) const { return used_[p] >= Limit(p) ? 0 : Limit(p) - used_[p]; }
  // Past this much in all send queues, a connection over its floor is Full().
  size_t SendThreshold() const { return Limit(kSend) - floors_; }

  // Takes `n` bytes of pool `p` if they fit.
  bool TryReserve(Pool p, size_t n) {
    if (n > Room(p)) return false;
    used_[p] += n;
    return true;
  }
  // Unconditional (send queues); bounded by the connections' own limits.
  void Charge(Pool p, size_t n) {
    used_[p] += n;
    if (p == kSend && used_[p] >= SendThreshold()) send_held_ = true;
  }
  void Release(Pool p, size_t n) { used_[p] -= n <= used_[p] ? n : used_[p]; }

  // True once after the send pool, having reached SendThreshold() (even for an instant: a reply
  // queued and flushed in one turn of the loop), is back under it: connections it held may have
  // room again.
  bool TakeSendRelief() {
    if (!send_held_ || used_[kSend] >= SendThreshold()) return false;
    send_held_ = false;
    return true;
  }

 private:
  size_t cap_, floors_;
  size_t used_[3] = {0, 0, 0};
  bool send_held_ = false;
};

// Bytes taken from a MemoryBudget, given back when the owner goes.
class Reservation {
 public:
  // An empty reservation of pool `pool` of `budget`, to grow with TryAdd.
  Reservation(MemoryBudget* budget, MemoryBudget::Pool pool) : budget_(budget), pool_(pool) {}
  Reservation(Reservation&& o) noexcept
      : budget_(std::exchange(o.budget_, nullptr)),
        pool_(o.pool_),
        bytes_(std::exchange(o.bytes_, 0)) {}
  Reservation& operator=(Reservation&& o) noexcept {
    if (this != &o) {
      Reset();
      budget_ = std::exchange(o.budget_, nullptr);
      pool_ = o.pool_;
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  ~Reservation() { Reset(); }

  size_t bytes() const { return bytes_; }
  // Grows the reservation by `n` bytes if they fit in the pool.
  bool TryAdd(size_t n) {
    if (!budget_ || !budget_->TryReserve(pool_, n)) return false;
    bytes_ += n;
    return true;
  }
  void Sub(size_t n) {
    n = n <= bytes_ ? n : bytes_;
    bytes_ -= n;
    if (budget_) budget_->Release(pool_, n);
  }
  void Reset() {
    if (budget_) budget_->Release(pool_, bytes_);
    bytes_ = 0;
  }

 private:
  MemoryBudget* budget_ = nullptr;
  MemoryBudget::Pool pool_ = MemoryBudget::kRings;
  size_t bytes_ = 0;
};

}  // namespace sbx::agent
