// sudo inside a box, without a setuid binary (docs/agent-protocol.md, "sudo").
//
// The box runs with no_new_privs, so a setuid sudo cannot work, and must not (threats.md row 22).
// Instead sbx-agent is a multi-call binary: called as `sudo` (the host template has it as
// /usr/local/bin/sudo) it is a client (SudoMain) that asks the box's agent, PID 1 and root
// inside the box's user namespace, to run the command for it. The agent (SudoServer) checks the
// caller's credentials from the kernel (SO_PEERCRED: only `user`, as E2B's base template lets
// `user` sudo, and root), spawns the command as the target user with the caller's own stdin,
// stdout and stderr (passed with SCM_RIGHTS), forwards the signals the client relays, and
// answers its exit status. The command gets exactly what the agent has: the box's root, its
// seccomp filter, its dropped capability bounding set and no_new_privs. Nothing outside the box
// is reachable that the box's root cannot reach already.
//
// Wire (SOCK_SEQPACKET on the abstract unix socket "@sbx-sudo", private to the box's network
// namespace): one request message, NUL-terminated fields, with three descriptors (0, 1, 2)
//
//   "sbx-sudo/1" TARGET FLAGS CWD ARGC ARGV... ENVC ENV...
//
// (TARGET: a user name, "#UID", or "" for root; FLAGS: any of "E" preserve the environment,
// "i" login shell, "s" shell); then 4-byte signal numbers from the client, each relayed to the
// command. The agent's one answer ends the exchange: "x CODE" (exited), "s SIGNAL" (killed by
// it) or "e ERRNO MESSAGE" (not started). A caller that hangs up first has its command killed.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "agent/users.h"
#include "common/fd.h"
#include "common/status.h"

namespace sbx::agent {

// The socket's name in the abstract namespace (without the leading NUL).
inline constexpr char kSudoSocket[] = "sbx-sudo";
// Largest request: argv and environment together.
inline constexpr size_t kSudoMaxRequest = 128 << 10;

// A parsed request (ParseSudoRequest), for the server and its tests.
struct SudoRequest {
  std::string target;  // "" = root
  bool preserve_env = false, login = false, shell = false;
  std::string cwd;
  std::vector<std::string> argv;
  std::vector<std::string> env;  // the caller's
};
std::string EncodeSudoRequest(const SudoRequest& r);
// nullopt-like failure as a Status (EINVAL naming what is wrong).
Result<SudoRequest> ParseSudoRequest(std::string_view msg);

class SudoServer {
 public:
  // `unwatch(fd)` is called before the server closes one of its descriptors (the epoll set's
  // entry goes first).
  SudoServer(UserDb& users, std::function<void(int fd)> unwatch)
      : users_(users), unwatch_(std::move(unwatch)) {}
  // Binds the abstract socket (name kSudoSocket, or `name` for tests). Non-blocking.
  Status Listen(const std::string& name = kSudoSocket);
  int listen_fd() const { return listen_.get(); }
  // Accepts a pending caller: its descriptor to watch for input, or -1 when none is pending.
  // Past kMaxCallers at once, callers are hung up on.
  int Accept();
  // The caller `fd` sent something or hung up. Handles it; may close `fd`.
  void OnReadable(int fd);
  // Child `pid` ended with wait status `status`: if it was a sudo command, its caller gets the
  // answer and is closed. False if `pid` is no sudo command.
  bool OnExit(pid_t pid, int status);
  // The RLIMIT_NOFILE commands get (the agent raises its own).
  void SetChildNofile(const struct rlimit& rl) {
    nofile_ = rl;
    restore_nofile_ = true;
  }

 private:
  struct Caller {
    UniqueFd fd;
    pid_t pid = -1;  // the command, once started
  };
  void Start(Caller& c, uid_t peer_uid);
  void Answer(int fd, const std::string& msg);  // sends and closes
  void Close(int fd);

  UserDb& users_;
  std::function<void(int)> unwatch_;
  UniqueFd listen_;
  std::map<int, Caller> callers_;  // by descriptor
  struct rlimit nofile_ = {0, 0};
  bool restore_nofile_ = false;
};

// The client: main() of sbx-agent when it is called as `sudo`.
int SudoMain(int argc, char** argv);

}  // namespace sbx::agent
