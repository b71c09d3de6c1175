#include "sandbox/cleanups.h"

#include <algorithm>
#include <utility>

namespace sbx::sandbox {

Cleanups::Cleanups() : worker_([this] { Run(); }) {}

Cleanups::~Cleanups() { Stop(); }

void Cleanups::Add(const std::string& id, std::function<void()> job) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!stopping_) {
      queue_.emplace_back(id, std::move(job));
      ++pending_[id];
      wake_.notify_one();
      return;
    }
  }
  job();
}

bool Cleanups::Await(const std::string& id, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> g(mu_);
  return done_.wait_for(g, timeout, [&] { return pending_.count(id) == 0; });
}

bool Cleanups::AwaitAll(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> g(mu_);
  return done_.wait_for(g, timeout, [&] { return pending_.empty(); });
}

std::vector<std::string> Cleanups::Pending() {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<std::string> out;
  for (const auto& [id, job] : queue_)
    if (out.empty() || out.back() != id) out.push_back(id);
  // A running job is no longer queued, but still pending.
  for (const auto& [id, n] : pending_)
    if (std::find(out.begin(), out.end(), id) == out.end()) out.insert(out.begin(), id);
  return out;
}

void Cleanups::Stop() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void Cleanups::Run() {
  std::unique_lock<std::mutex> g(mu_);
  for (;;) {
    wake_.wait(g, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything ran
    auto [id, job] = std::move(queue_.front());
    queue_.pop_front();
    g.unlock();
    job();
    g.lock();
    if (--pending_[id] == 0) pending_.erase(id);
    done_.notify_all();
  }
}

}  // namespace sbx::sandbox
