// Clock: the one source of time for the daemon's lifecycle code (the sandbox manager, its TTL
// loop and the store's timestamps). Production code uses SystemClock(); tests pass a FakeClock,
// which moves only when told to, so a TTL can pass in a test without the test sleeping for it.
//
// Two times: wall time (milliseconds since the Unix epoch, what records and the API show) and
// steady time (monotonic, for rate buckets and waits). A FakeClock advances both together.
//
// Thread-safety: every Clock and Waiter method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace sbx {

class Clock {
 public:
  using SteadyTime = std::chrono::steady_clock::time_point;

  // A thread's way to wait on this clock's steady time, interruptibly. One waiter per waiting
  // thread (the TTL loop owns one).
  class Waiter {
   public:
    virtual ~Waiter() = default;
    // Blocks until the clock's steady time reaches `deadline` or Wake() is called; returns true
    // when woken. A Wake() before the call makes it return at once (wakes are not lost).
    virtual bool WaitUntil(SteadyTime deadline) = 0;
    // Wakes the current or next WaitUntil, for good: every later WaitUntil returns at once too.
    virtual void Wake() = 0;
  };

  virtual ~Clock() = default;
  virtual int64_t NowMs() const = 0;      // wall time, ms since the Unix epoch
  virtual SteadyTime Steady() const = 0;  // monotonic
  virtual std::unique_ptr<Waiter> NewWaiter() = 0;
};

// The real clocks (std::chrono::system_clock and steady_clock). Lives for the whole process.
Clock& SystemClock();

// Milliseconds since the Unix epoch from the system clock (SystemClock().NowMs()), for code that
// shows or stores a time and has no Clock of its own (the CLI, the API facades).
int64_t NowMs();

// A clock for tests: it starts at `start_ms` (wall) and moves only in Advance(), which also wakes
// every Waiter whose deadline it passes. waits() counts the WaitUntil calls that started blocking,
// so a test can tell when a loop has finished its pass and waits again (AwaitWaits).
class FakeClock : public Clock {
 public:
  explicit FakeClock(int64_t start_ms = int64_t{1700000000000});
  int64_t NowMs() const override;
  SteadyTime Steady() const override;
  std::unique_ptr<Waiter> NewWaiter() override;

  void Advance(std::chrono::milliseconds by);
  uint64_t waits() const;
  // Blocks (on real time, at most `timeout`) until waits() >= n; false on timeout.
  bool AwaitWaits(uint64_t n, std::chrono::milliseconds timeout = std::chrono::seconds(30));

 private:
  struct State;  // shared with the waiters, which may outlive neither but are not owned here
  class FakeWaiter;
  std::shared_ptr<State> state_;
};

}  // namespace sbx
