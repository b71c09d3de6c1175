// The `sudo` client (sudo.h): parses sudo's command line, hands the request and its own stdio to
// the box's agent, relays signals and exits as the command did.
//
//   sudo [-u USER] [-E] [-n] [-H] [-i | -s] [--] [COMMAND [ARG...]]
//
// -n and -H are accepted and change nothing: no password is ever asked, and HOME is the
// target's unless -E keeps the caller's. Every other option is refused with a clear message.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>

#include "agent/sudo.h"

extern char** environ;

namespace sbx::agent {
namespace {

int g_sock = -1;

void Relay(int sig) {
  int saved = errno;
  ::send(g_sock, &sig, sizeof sig, MSG_NOSIGNAL | MSG_DONTWAIT);
  errno = saved;
}

int Fail(const std::string& msg) {
  std::fprintf(stderr, "sudo: %s\n", msg.c_str());
  return 1;
}

int Usage() {
  std::fprintf(stderr,
               "usage: sudo [-u USER] [-E] [-n] [-H] [-i | -s] [--] [COMMAND [ARG...]]\n"
               "(sbx's sudo: runs COMMAND as root, or USER, inside this sandbox)\n");
  return 1;
}

}  // namespace

int SudoMain(int argc, char** argv) {
  SudoRequest req;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.size() < 2 || a[0] != '-') break;
    if (a == "--user" || a.rfind("--user=", 0) == 0) {
      if (a == "--user") {
        if (++i >= argc) return Usage();
        req.target = argv[i];
      } else {
        req.target = a.substr(7);
      }
      continue;
    }
    if (a == "--preserve-env") {
      req.preserve_env = true;
      continue;
    }
    if (a == "--non-interactive" || a == "--set-home") continue;
    if (a == "--login") {
      req.login = true;
      continue;
    }
    if (a == "--shell") {
      req.shell = true;
      continue;
    }
    if (a == "--help" || a == "-h") {
      Usage();
      return 0;
    }
    if (a[1] == '-')
      return Fail("option " + a + " is not supported by sbx's sudo (-u USER, -E, -n, -H, -i, -s)");
    // Bundled short options: -En, -iu root, -uUSER.
    for (size_t k = 1; k < a.size(); ++k) {
      char c = a[k];
      if (c == 'E') {
        req.preserve_env = true;
      } else if (c == 'n' || c == 'H') {
      } else if (c == 'i') {
        req.login = true;
      } else if (c == 's') {
        req.shell = true;
      } else if (c == 'u') {
        if (k + 1 < a.size()) {
          req.target = a.substr(k + 1);
        } else {
          if (++i >= argc) return Usage();
          req.target = argv[i];
        }
        break;
      } else {
        return Fail(std::string("option -") + c +
                    " is not supported by sbx's sudo (-u USER, -E, -n, -H, -i, -s)");
      }
    }
  }
  if (req.login && req.shell) return Fail("-i and -s are exclusive");
  for (; i < argc; ++i) req.argv.emplace_back(argv[i]);
  if (req.argv.empty() && !req.login && !req.shell) return Usage();
  if (req.target == "root" || req.target == "#0") req.target.clear();
  char cwd[4096];
  if (::getcwd(cwd, sizeof cwd) != nullptr) req.cwd = cwd;
  for (char** e = environ; e && *e; ++e) req.env.emplace_back(*e);
  std::string msg = EncodeSudoRequest(req);
  if (msg.size() > kSudoMaxRequest) return Fail("argument list and environment too long");

  g_sock = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (g_sock < 0) return Fail(std::string("socket: ") + std::strerror(errno));
  struct sockaddr_un addr {};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, kSudoSocket, sizeof kSudoSocket - 1);
  socklen_t len =
      static_cast<socklen_t>(offsetof(struct sockaddr_un, sun_path) + sizeof kSudoSocket);
  if (::connect(g_sock, reinterpret_cast<struct sockaddr*>(&addr), len) != 0)
    return Fail(std::string("cannot reach the sandbox's agent (sbx's sudo works only inside an "
                            "sbx sandbox): ") +
                std::strerror(errno));

  int fds[3] = {0, 1, 2};
  char control[CMSG_SPACE(sizeof fds)] = {};
  struct iovec iov {
    msg.data(), msg.size()
  };
  struct msghdr mh {};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof control;
  struct cmsghdr* cm = CMSG_FIRSTHDR(&mh);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof fds);
  std::memcpy(CMSG_DATA(cm), fds, sizeof fds);
  if (::sendmsg(g_sock, &mh, MSG_NOSIGNAL) < 0)
    return Fail(std::string("send to the sandbox's agent: ") + std::strerror(errno));

  // The command is the agent's child: signals that would reach sudo go on to it.
  struct sigaction sa {};
  sa.sa_handler = Relay;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGWINCH, SIGCONT})
    ::sigaction(sig, &sa, nullptr);

  char reply[4096];
  ssize_t n;
  do {
    n = ::recv(g_sock, reply, sizeof reply - 1, 0);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return Fail("the sandbox's agent hung up");
  reply[n] = '\0';
  int code = std::atoi(reply + 2);
  switch (reply[0]) {
    case 'x':
      return code;
    case 's':
      ::signal(code, SIG_DFL);
      ::raise(code);
      return 128 + code;
    case 'e': {
      const char* text = std::strchr(reply + 2, ' ');
      std::string what = text ? text + 1 : "failed";
      if (code == ENOENT && !req.argv.empty() && what.rfind("spawn ", 0) == 0)
        return Fail(req.argv[0] + ": command not found");
      return Fail(what + (code ? std::string(": ") + std::strerror(code) : ""));
    }
    default:
      return Fail("unexpected answer from the sandbox's agent");
  }
}

}  // namespace sbx::agent
