// Cleanups: work the daemon does after it has answered (a killed sandbox's box and network
// removed), on one worker thread, in the order it was added. A kill answers once the sandbox's
// processes are dead; what remains of its box is removed here. Callers that need that done wait
// for it: for one sandbox (DELETE ...?wait=true) or for everything queued (GET /v1/cleanups).
//
// Nothing is lost if the process dies with jobs queued: a job only removes what the next start
// removes anyway (an orphaned box: Runtime::ReapOrphans; a network no live box owns).
//
// Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace sbx::sandbox {

class Cleanups {
 public:
  Cleanups();
  // Runs every job still queued, then stops the worker.
  ~Cleanups();
  Cleanups(const Cleanups&) = delete;
  Cleanups& operator=(const Cleanups&) = delete;

  // Queues `job`, the cleanup of sandbox `id`. After Stop, runs it on the caller's thread.
  void Add(const std::string& id, std::function<void()> job);
  // Waits until no job of `id` is queued or running. false when `timeout` passed first.
  bool Await(const std::string& id, std::chrono::milliseconds timeout);
  // Waits until no job is queued or running. false when `timeout` passed first.
  bool AwaitAll(std::chrono::milliseconds timeout);
  // Ids with a job queued or running, in order, each once.
  std::vector<std::string> Pending();
  // Runs what is queued, then stops the worker; later jobs run on the caller's thread.
  void Stop();

 private:
  void Run();

  std::mutex mu_;
  std::condition_variable wake_;                                     // a job was added, or Stop
  std::condition_variable done_;                                     // a job finished
  std::deque<std::pair<std::string, std::function<void()>>> queue_;  // guarded by mu_
  std::map<std::string, int> pending_;                               // guarded by mu_: id -> jobs
  bool stopping_ = false;                                            // guarded by mu_
  std::thread worker_;
};

}  // namespace sbx::sandbox
