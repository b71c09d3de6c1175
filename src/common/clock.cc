#include "common/clock.h"

namespace sbx {
namespace {

class RealWaiter : public Clock::Waiter {
 public:
  bool WaitUntil(Clock::SteadyTime deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, deadline, [this] { return woken_; });
  }
  void Wake() override {
    {
      std::lock_guard<std::mutex> g(mu_);
      woken_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool woken_ = false;
};

class RealClock : public Clock {
 public:
  int64_t NowMs() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  SteadyTime Steady() const override { return std::chrono::steady_clock::now(); }
  std::unique_ptr<Waiter> NewWaiter() override { return std::make_unique<RealWaiter>(); }
};

}  // namespace

Clock& SystemClock() {
  static RealClock* clock = new RealClock();  // never destroyed: used until the process ends
  return *clock;
}

int64_t NowMs() { return SystemClock().NowMs(); }

// ---- FakeClock ----

// One waiter's wake-up state. Lock order: a waiter's `mu`, then State::mu (never the reverse:
// Advance copies the waiter list and lets go of State::mu before it takes any waiter's).
struct WaiterState {
  std::mutex mu;
  std::condition_variable cv;
  bool woken = false;
};

struct FakeClock::State {
  mutable std::mutex mu;
  std::condition_variable waits_cv;  // signalled when `waits` grows
  int64_t wall_ms = 0;
  int64_t steady_ms = 0;
  uint64_t waits = 0;
  std::vector<std::weak_ptr<WaiterState>> waiters;
};

class FakeClock::FakeWaiter : public Clock::Waiter {
 public:
  FakeWaiter(std::shared_ptr<State> clock, std::shared_ptr<WaiterState> self)
      : clock_(std::move(clock)), self_(std::move(self)) {}

  bool WaitUntil(SteadyTime deadline) override {
    std::unique_lock<std::mutex> lock(self_->mu);
    bool counted = false;
    while (!self_->woken) {
      {
        std::lock_guard<std::mutex> g(clock_->mu);
        if (SteadyTime(std::chrono::milliseconds(clock_->steady_ms)) >= deadline) return false;
        if (!counted) {
          // Counted while self_->mu is held: an Advance that follows the count needs that mutex
          // to notify, so it cannot slip in between this check and the wait below.
          ++clock_->waits;
          counted = true;
          clock_->waits_cv.notify_all();
        }
      }
      self_->cv.wait(lock);
    }
    return true;
  }
  void Wake() override {
    {
      std::lock_guard<std::mutex> g(self_->mu);
      self_->woken = true;
    }
    self_->cv.notify_all();
  }

 private:
  std::shared_ptr<State> clock_;
  std::shared_ptr<WaiterState> self_;
};

FakeClock::FakeClock(int64_t start_ms) : state_(std::make_shared<State>()) {
  state_->wall_ms = start_ms;
  state_->steady_ms = int64_t{3600} * 1000;  // well clear of the epoch, so Steady() - x is valid
}

int64_t FakeClock::NowMs() const {
  std::lock_guard<std::mutex> g(state_->mu);
  return state_->wall_ms;
}

Clock::SteadyTime FakeClock::Steady() const {
  std::lock_guard<std::mutex> g(state_->mu);
  return SteadyTime(std::chrono::milliseconds(state_->steady_ms));
}

std::unique_ptr<Clock::Waiter> FakeClock::NewWaiter() {
  auto self = std::make_shared<WaiterState>();
  {
    std::lock_guard<std::mutex> g(state_->mu);
    state_->waiters.push_back(self);
  }
  return std::make_unique<FakeWaiter>(state_, std::move(self));
}

void FakeClock::Advance(std::chrono::milliseconds by) {
  std::vector<std::shared_ptr<WaiterState>> wake;
  {
    std::lock_guard<std::mutex> g(state_->mu);
    state_->wall_ms += by.count();
    state_->steady_ms += by.count();
    auto& ws = state_->waiters;
    for (auto it = ws.begin(); it != ws.end();) {
      if (auto w = it->lock()) {
        wake.push_back(std::move(w));
        ++it;
      } else {
        it = ws.erase(it);
      }
    }
  }
  for (auto& w : wake) {
    std::lock_guard<std::mutex> g(w->mu);  // see FakeWaiter::WaitUntil
    w->cv.notify_all();
  }
}

uint64_t FakeClock::waits() const {
  std::lock_guard<std::mutex> g(state_->mu);
  return state_->waits;
}

bool FakeClock::AwaitWaits(uint64_t n, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(state_->mu);
  return state_->waits_cv.wait_for(lock, timeout, [&] { return state_->waits >= n; });
}

}  // namespace sbx
