// TCP_CONNECT (docs/agent-protocol.md, "Ports"): a connection to a port on the box's loopback,
// for runtimes whose boxes have no network namespace the host can open a socket in (gVisor's
// stack is its own; a VM's is the guest kernel's). The agent connects, answers OK, and a process
// of its own copies bytes between that socket and the client's connection until both ends close.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "agent/log.h"
#include "agent/loop.h"
#include "agent/spawn.h"
#include "agent/stream.h"

namespace sbx::agent {
namespace {

using protocol::Reader;
using protocol::Tag;
using protocol::Type;
using protocol::Writer;

constexpr int kConnectTimeoutMs = 5000;

// A connected TCP socket to 127.0.0.1:port, or the errno why not.
Result<UniqueFd> ConnectLoopback(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return Status::Errno("socket");
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const std::string what = "connect to 127.0.0.1:" + std::to_string(port);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    if (errno != EINPROGRESS) return Status::Errno(what);
    pollfd p{fd.get(), POLLOUT, 0};
    int r;
    while ((r = ::poll(&p, 1, kConnectTimeoutMs)) < 0 && errno == EINTR) {
    }
    if (r == 0) return Status::Error(what, ETIMEDOUT);
    int err = 0;
    socklen_t len = sizeof err;
    if (r < 0 || ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0)
      return Status::Errno(what);
    if (err != 0) return Status::Error(what, err);
  }
  return fd;
}

// Writes all of `n` bytes, waiting while the socket is full. false when the peer is gone.
bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) {
      pollfd pfd{fd, POLLOUT, 0};
      (void)::poll(&pfd, 1, -1);
      continue;
    }
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// The relay process: descriptors 0 (the client's connection) and 1 (the port's socket), each
// direction copied until its reader sees EOF, which is passed on as a half close.
[[noreturn]] void Relay() {
  (void)::prctl(PR_SET_NAME, "sbx-port-relay");
  char buf[64 << 10];
  bool open[2] = {true, true};  // [0]: 0 -> 1, [1]: 1 -> 0
  while (open[0] || open[1]) {
    pollfd p[2] = {{open[0] ? 0 : -1, POLLIN, 0}, {open[1] ? 1 : -1, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (!open[i] || p[i].revents == 0) continue;
      const int from = i, to = 1 - i;
      ssize_t n = ::read(from, buf, sizeof buf);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0 || !WriteAll(to, buf, static_cast<size_t>(n))) {
        open[i] = false;
        (void)::shutdown(to, SHUT_WR);
        if (n < 0) open[1 - i] = false;  // a reset ends both ways
      }
    }
  }
  ::_exit(0);
}

}  // namespace

bool Agent::ConnectPort(Connection& c, uint32_t id, const Reader& r) {
  const int64_t port = r.Int(Tag::kPort, 0);
  if (port < 1 || port > 65535) {
    SendError(c, id, EINVAL, "port: from 1 to 65535");
    return true;
  }
  if (c.subscriptions > 0 || !c.streams().empty() || !c.writes().empty()) {
    SendError(c, id, EBUSY, "TCP_CONNECT: only on a connection with nothing else open");
    return true;
  }
  auto tcp = ConnectLoopback(static_cast<int>(port));
  if (!tcp.ok()) {
    SendError(c, id, tcp.status().err() ? tcp.status().err() : EIO, tcp.status().what());
    return true;
  }
  // The OK (and anything queued before it) reaches the client before the first relayed byte;
  // the client sends none before it has read the OK.
  c.Send(Type::kOk, id, Writer());
  for (bool would_block = false; c.HasOutput();) {
    if (!c.Flush(&would_block)) return false;
    if (would_block) {
      pollfd p{c.fd(), POLLOUT, 0};
      if (::poll(&p, 1, kConnectTimeoutMs) <= 0) return false;
    }
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    Log("port %lld: fork the relay: %s", static_cast<long long>(port), strerror(errno));
    return false;
  }
  if (pid == 0) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; ++sig) (void)::sigaction(sig, &dfl, nullptr);
    (void)::signal(SIGPIPE, SIG_IGN);  // a peer gone shows as a failed write
    sigset_t none;
    sigemptyset(&none);
    (void)::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (::dup2(c.fd(), 0) < 0 || ::dup2(tcp->get(), 1) < 0) ::_exit(127);
    CloseAllBut(2);
    Relay();
  }
  // The relay holds both now; the agent forgets the connection (closing its copies). The
  // relay's exit is reaped with the other children that are not commands (Reap).
  return false;
}

}  // namespace sbx::agent
