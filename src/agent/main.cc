// sbx-agent: PID 1 of every sandbox (docs/agent-protocol.md). Parses the command line, prepares
// the process (descriptors 0-2, subreaper, descriptor limit) and runs the event loop in loop.h.
//
//   sbx-agent --listen-fd N      serve on an inherited listening unix socket
//   sbx-agent --listen PATH      bind PATH itself (tests)
//   --max-procs N                tracked-process bound (default 1024; tests lower it)
//   --memory-cap BYTES           box-wide cap on the agent's buffers (default 64 MiB, at least
//                                8 MiB; a K, M or G suffix multiplies by 1024s)
//   --sudo-socket NAME           serve sudo (sudo.h) on abstract socket NAME (default, as PID 1:
//                                "sbx-sudo"; otherwise none)
//   --vm-port DEV                in a vm box's guest: a thread carries the connections of the
//                                virtio-serial port DEV to the agent's socket (vm_mux.h); needs
//                                --listen
//   --vm-channel-fd N            on the host, for a vm box: no agent, only the host's end of the
//                                port (vm_mux.h), serving the connections of --listen-fd; with
//   --vm-ready-fd N              written and closed once the guest's end says hello, and
//   --vm-console-fd N            the guest's serial console, copied to
//   --vm-console-log-fd N        this file, bounded (vm_mux.h)
//   --vm-reset HOSTNAME          the guest has run before (restored from saved memory): reset
//                                its end first, re-keyed with this hostname (vm_mux.h)
//
// Called as `sudo` (the host template's /usr/local/bin/sudo is this binary), it is sudo's client
// instead (sudo.h).
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "agent/log.h"
#include "agent/loop.h"
#include "agent/sudo.h"
#include "agent/users.h"
#include "agent/vm_mux.h"

namespace {

using sbx::agent::Log;

int Usage() {
  Log("usage: sbx-agent (--listen-fd N | --listen PATH) [--max-procs N] [--memory-cap BYTES] "
      "[--sudo-socket NAME] [--vm-port DEV | --vm-channel-fd N [--vm-ready-fd N] [--vm-reset "
      "HOST]]");
  return 2;
}

int BindPath(const std::string& path) {
  struct sockaddr_un addr {};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    Log("socket path too long: %s", path.c_str());
    return -1;
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  ::unlink(path.c_str());
  mode_t old = ::umask(077);  // the socket is created 0600
  int rc = ::bind(fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof addr);
  ::umask(old);
  if (rc != 0 || ::listen(fd, 128) != 0) {
    Log("bind %s: %s", path.c_str(), strerror(errno));
    ::close(fd);
    return -1;
  }
  return fd;
}

// "64M" and the like; nullopt for anything else or past 1 TiB.
std::optional<size_t> ParseBytes(std::string v) {
  size_t shift = 0;
  if (!v.empty()) {
    switch (v.back()) {
      case 'K':
        shift = 10;
        break;
      case 'M':
        shift = 20;
        break;
      case 'G':
        shift = 30;
        break;
      default:
        break;
    }
    if (shift) v.pop_back();
  }
  auto n = sbx::agent::ParseId(v);
  if (!n || *n > (uint64_t{1} << 40) >> shift) return std::nullopt;
  return static_cast<size_t>(*n << shift);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 0 && argv[0] != nullptr) {
    const char* base = std::strrchr(argv[0], '/');
    if (std::strcmp(base ? base + 1 : argv[0], "sudo") == 0)
      return sbx::agent::SudoMain(argc, argv);
  }
  // Descriptors 0-2 must exist, or pipes created later could land on them.
  for (int fd = 0; fd < 3; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0) {
      int n = ::open("/dev/null", O_RDWR);
      if (n >= 0 && n != fd) {
        ::dup2(n, fd);
        ::close(n);
      }
    }
  }

  sbx::agent::AgentOptions opts;
  std::string listen_path;
  std::string vm_port;
  int vm_channel_fd = -1, vm_ready_fd = -1, vm_console_fd = -1, vm_console_log_fd = -1;
  bool vm_reset = false;
  std::string vm_hostname;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) return Usage();
    std::string v = argv[++i];
    if (a == "--listen-fd") {
      auto n = sbx::agent::ParseId(v);
      if (!n || *n < 3 || *n > 1u << 20) return Usage();
      opts.listen_fd = static_cast<int>(*n);
    } else if (a == "--listen") {
      listen_path = v;
    } else if (a == "--max-procs") {
      auto n = sbx::agent::ParseId(v);
      if (!n || *n == 0) return Usage();
      opts.max_procs = *n;
    } else if (a == "--sudo-socket") {
      if (v.empty() || v.size() > 100) return Usage();
      opts.sudo_socket = v;
    } else if (a == "--memory-cap") {
      auto n = ParseBytes(v);
      if (!n || *n < sbx::agent::MemoryBudget::kMinCap) return Usage();
      opts.memory_cap = *n;
    } else if (a == "--vm-reset") {
      if (v.size() > 64) return Usage();
      vm_reset = true;
      vm_hostname = v;
    } else if (a == "--vm-port") {
      if (v.empty() || v[0] != '/') return Usage();
      vm_port = v;
    } else if (a == "--vm-channel-fd" || a == "--vm-ready-fd" || a == "--vm-console-fd" ||
               a == "--vm-console-log-fd") {
      auto n = sbx::agent::ParseId(v);
      if (!n || *n < 3 || *n > 1u << 20) return Usage();
      int& fd = a == "--vm-channel-fd"   ? vm_channel_fd
                : a == "--vm-ready-fd"   ? vm_ready_fd
                : a == "--vm-console-fd" ? vm_console_fd
                                         : vm_console_log_fd;
      fd = static_cast<int>(*n);
    } else {
      return Usage();
    }
  }
  if ((opts.listen_fd >= 0) == !listen_path.empty()) return Usage();
  if (vm_channel_fd >= 0) {
    if (opts.listen_fd < 0 || !vm_port.empty()) return Usage();
    sbx::agent::MuxOptions mux;
    mux.channel_fd = vm_channel_fd;
    mux.listen_fd = opts.listen_fd;
    mux.ready_fd = vm_ready_fd;
    mux.console_fd = vm_console_fd;
    mux.console_log_fd = vm_console_log_fd;
    mux.reset = vm_reset;
    mux.reset_hostname = vm_hostname;
    return sbx::agent::RunMux(mux);
  }
  if (!vm_port.empty() && listen_path.empty()) return Usage();
  if (!listen_path.empty()) {
    opts.listen_fd = BindPath(listen_path);
    if (opts.listen_fd < 0) return 1;
  }
  // The guest's end of a vm box's port: a thread of the agent's own process, started once the
  // agent's socket listens, so that the first stream it opens connects. A thread, not a child: as
  // PID 1 of the guest it is out of reach of kill(-1) and of the guest's OOM killer, which a
  // child of the agent was not, and the guest's root may use both at will.
  if (!vm_port.empty()) {
    // As in every other runtime's box, nothing the box runs gains privileges by exec (a setuid
    // file, file capabilities): its root is the guest's, its other users stay what they are. The
    // host template's sudo is the agent's own (sudo.h), which needs none.
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
      Log("prctl(PR_SET_NO_NEW_PRIVS): %s", strerror(errno));
      return 1;
    }
    int port = ::open(vm_port.c_str(), O_RDWR | O_CLOEXEC);
    if (port < 0) {
      Log("open %s: %s", vm_port.c_str(), strerror(errno));
      return 1;
    }
    static sbx::agent::MuxOptions mux;
    mux.channel_fd = port;
    mux.agent_path = listen_path;
    // Every signal blocked in the thread (it inherits the mask): the agent reads its signals
    // through a signalfd, and one delivered to a thread that does not block it would be lost.
    sigset_t all, old;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t thread;
    int err = ::pthread_create(
        &thread, nullptr,
        [](void*) -> void* {
          int rc = sbx::agent::RunMux(mux);
          Log("vm mux: the guest's end stopped (%d)", rc);
          return nullptr;
        },
        nullptr);
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (err != 0) {
      Log("pthread_create: %s", strerror(err));
      return 1;
    }
  }

  opts.pid1 = ::getpid() == 1;
  if (opts.pid1 && opts.sudo_socket.empty()) opts.sudo_socket = sbx::agent::kSudoSocket;
  // Outside a pid namespace (tests), orphans of spawned processes are re-parented to the agent.
  if (!opts.pid1) ::prctl(PR_SET_CHILD_SUBREAPER, 1);

  // Room for 64 connections and 1024 processes with three pipes each; children get the old limit.
  struct rlimit rl;
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    opts.child_nofile = rl;
    opts.restore_nofile = true;
    struct rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > 65536 ? 65536 : rl.rlim_max;
    if (raised.rlim_cur > rl.rlim_cur) ::setrlimit(RLIMIT_NOFILE, &raised);
  }

  sbx::agent::Agent agent(opts);
  if (sbx::Status s = agent.Init(); !s.ok()) {
    Log("init: %s", s.message().c_str());
    return 1;
  }
  return agent.Run();
}
