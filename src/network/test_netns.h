// For tests only: network namespaces a test makes and owns, so that no test touches the host's
// own interfaces, routes or rules. A TestNetns lives while its descriptor is open (and nothing
// else is in it): what the test made inside goes with it, even when the test fails. A NetnsChild
// is a process of its own in a new network namespace (a stand-in for a box's init), killed and
// reaped when it goes out of scope.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "common/fd.h"
#include "common/status.h"

namespace sbx::network::testing {

// Runs `fn` on a new thread that joined the namespace `netns_fd` (setns changes only the calling
// thread) and returns what it returned. Sockets it makes stay in that namespace for good.
template <typename F>
auto RunInNetns(int netns_fd, F&& fn) -> decltype(fn()) {
  std::optional<decltype(fn())> out;
  std::thread t([&] {
    if (::setns(netns_fd, CLONE_NEWNET) != 0) std::abort();  // a test setup bug, not a result
    out.emplace(fn());
  });
  t.join();
  return std::move(*out);
}

// A shell command run in the namespace `netns_fd` (its process inherits the namespace of the
// thread that forks it). Returns its stdout; empty on failure.
inline std::string ShInNetns(int netns_fd, const std::string& cmd) {
  return RunInNetns(netns_fd, [&] {
    std::string out;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (p == nullptr) return out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    if (::pclose(p) != 0) out.clear();
    return out;
  });
}

// Namespace teardown is asynchronous in the kernel: a bounded wait (60 s) for `cond`.
template <typename F>
bool Eventually(F&& cond) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

class TestNetns {
 public:
  // A new, empty network namespace with lo up.
  static Result<TestNetns> Make() {
    Result<TestNetns> out = Status::Error("make a test network namespace");
    std::thread t([&] {
      if (::unshare(CLONE_NEWNET) != 0) {
        out = Status::Errno("unshare(CLONE_NEWNET)");
        return;
      }
      UniqueFd fd(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
      if (!fd) {
        out = Status::Errno("open /proc/thread-self/ns/net");
        return;
      }
      if (std::system("ip link set lo up") != 0) {
        out = Status::Error("ip link set lo up in a test namespace");
        return;
      }
      out = TestNetns(std::move(fd));
    });
    t.join();
    return out;
  }

  int fd() const { return fd_.get(); }
  template <typename F>
  auto Run(F&& fn) const -> decltype(fn()) {
    return RunInNetns(fd_.get(), std::forward<F>(fn));
  }
  // A shell command run inside (ShInNetns).
  std::string Sh(const std::string& cmd) const { return ShInNetns(fd_.get(), cmd); }

 private:
  explicit TestNetns(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

class NetnsChild {
 public:
  // Forks a child that unshares its network namespace and waits to be killed.
  static Result<NetnsChild> Start() {
    int ready[2];
    if (::pipe2(ready, O_CLOEXEC) != 0) return Status::Errno("pipe");
    pid_t pid = ::fork();
    if (pid < 0) return Status::Errno("fork");
    if (pid == 0) {
      // Only async-signal-safe calls between fork and _exit: the test process has threads.
      ::close(ready[0]);
      char c = ::unshare(CLONE_NEWNET) == 0 ? 'y' : 'n';
      if (::write(ready[1], &c, 1) != 1) ::_exit(1);
      for (;;) ::pause();
    }
    ::close(ready[1]);
    NetnsChild child(pid);
    char c = 0;
    ssize_t n = ::read(ready[0], &c, 1);
    ::close(ready[0]);
    if (n != 1 || c != 'y') return Status::Error("child could not unshare its network namespace");
    return child;
  }
  NetnsChild(NetnsChild&& o) noexcept : pid_(std::exchange(o.pid_, -1)) {}
  NetnsChild& operator=(NetnsChild&&) = delete;
  ~NetnsChild() { Kill(); }

  pid_t pid() const { return pid_; }
  // Its namespace (the caller closes it before waiting for the namespace to die).
  UniqueFd OpenNetns() const {
    return UniqueFd(
        ::open(("/proc/" + std::to_string(pid_) + "/ns/net").c_str(), O_RDONLY | O_CLOEXEC));
  }
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }

 private:
  explicit NetnsChild(pid_t pid) : pid_(pid) {}
  pid_t pid_;
};

}  // namespace sbx::network::testing
