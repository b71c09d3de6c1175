// The agent's side of sudo (sudo.h): requests, credentials, spawning, answers.
#include "agent/sudo.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstring>

#include "agent/log.h"
#include "agent/spawn.h"

namespace sbx::agent {
namespace {

constexpr char kMagic[] = "sbx-sudo/1";
constexpr size_t kMaxCallers = 64;
// What sudo's env_reset keeps of the caller's environment (besides what it sets itself).
constexpr const char* kKeptEnv[] = {"TERM",   "COLORTERM", "LANG",        "LANGUAGE",
                                    "LC_ALL", "LC_CTYPE",  "LC_MESSAGES", "TZ"};
constexpr char kSecurePath[] = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

bool IsKey(const std::string& e, std::string_view key) {
  return e.size() > key.size() && e.compare(0, key.size(), key) == 0 && e[key.size()] == '=';
}

void SetEnv(std::vector<std::string>& env, std::string_view key, const std::string& value) {
  std::erase_if(env, [&](const std::string& e) { return IsKey(e, key); });
  env.push_back(std::string(key) + "=" + value);
}

// sudo -i/-s with a command: the words joined for `sh -c`, every character but [A-Za-z0-9_-$]
// escaped with a backslash, as sudo does.
std::string ShellCommand(const std::vector<std::string>& argv) {
  std::string out;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (i) out += ' ';
    for (char ch : argv[i]) {
      bool plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                   (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' || ch == '$';
      if (!plain) out += '\\';
      out += ch;
    }
  }
  return out;
}

}  // namespace

std::string EncodeSudoRequest(const SudoRequest& r) {
  std::string out;
  auto put = [&](std::string_view s) {
    out.append(s);
    out.push_back('\0');
  };
  put(kMagic);
  put(r.target);
  std::string flags;
  if (r.preserve_env) flags += 'E';
  if (r.login) flags += 'i';
  if (r.shell) flags += 's';
  put(flags);
  put(r.cwd);
  put(std::to_string(r.argv.size()));
  for (const auto& a : r.argv) put(a);
  put(std::to_string(r.env.size()));
  for (const auto& e : r.env) put(e);
  return out;
}

Result<SudoRequest> ParseSudoRequest(std::string_view msg) {
  std::vector<std::string_view> f;
  while (!msg.empty()) {
    size_t nul = msg.find('\0');
    if (nul == std::string_view::npos) return Status::Error("sudo request: unterminated", EINVAL);
    f.push_back(msg.substr(0, nul));
    msg.remove_prefix(nul + 1);
  }
  if (f.size() < 6 || f[0] != kMagic) return Status::Error("sudo request: bad header", EINVAL);
  SudoRequest r;
  r.target = f[1];
  for (char c : f[2]) {
    if (c == 'E')
      r.preserve_env = true;
    else if (c == 'i')
      r.login = true;
    else if (c == 's')
      r.shell = true;
    else
      return Status::Error("sudo request: bad flags", EINVAL);
  }
  r.cwd = f[3];
  auto argc = ParseId(f[4]);
  if (!argc || *argc > f.size() - 6) return Status::Error("sudo request: bad argc", EINVAL);
  size_t i = 5;
  for (size_t n = 0; n < *argc; ++n) r.argv.emplace_back(f[i++]);
  auto envc = ParseId(f[i++]);
  if (!envc || *envc != f.size() - i) return Status::Error("sudo request: bad envc", EINVAL);
  for (; i < f.size(); ++i) {
    if (f[i].find('=') == std::string_view::npos || f[i].front() == '=')
      return Status::Error("sudo request: bad env entry", EINVAL);
    r.env.emplace_back(f[i]);
  }
  if (r.argv.empty() && !r.login && !r.shell)
    return Status::Error("sudo request: no command", EINVAL);
  if (!r.argv.empty() && r.argv[0].empty())
    return Status::Error("sudo request: empty command", EINVAL);
  return r;
}

Status SudoServer::Listen(const std::string& name) {
  listen_.reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!listen_) return Status::Errno("sudo socket");
  struct sockaddr_un addr {};
  addr.sun_family = AF_UNIX;
  if (name.size() + 1 > sizeof addr.sun_path) return Status::Error("sudo socket name", EINVAL);
  std::memcpy(addr.sun_path + 1, name.data(), name.size());  // abstract: sun_path[0] == 0
  socklen_t len = static_cast<socklen_t>(offsetof(struct sockaddr_un, sun_path) + 1 + name.size());
  if (::bind(listen_.get(), reinterpret_cast<struct sockaddr*>(&addr), len) != 0 ||
      ::listen(listen_.get(), 16) != 0) {
    Status s = Status::Errno("sudo socket @" + name);
    listen_.reset();
    return s;
  }
  return {};
}

int SudoServer::Accept() {
  for (;;) {
    UniqueFd fd(::accept4(listen_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) return -1;  // none pending (or a failure: the next readiness retries)
    if (callers_.size() >= kMaxCallers) continue;  // closed: that client reports the hang-up
    int n = fd.get();
    callers_[n].fd = std::move(fd);
    return n;
  }
}

void SudoServer::Close(int fd) {
  auto it = callers_.find(fd);
  if (it == callers_.end()) return;
  unwatch_(fd);
  callers_.erase(it);
}

void SudoServer::Answer(int fd, const std::string& msg) {
  ::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  Close(fd);
}

void SudoServer::OnReadable(int fd) {
  auto it = callers_.find(fd);
  if (it == callers_.end()) return;
  Caller& c = it->second;
  if (c.pid > 0) {
    // A started command: the client relays signals, or hangs up (its command goes with it).
    int sig = 0;
    ssize_t n = ::recv(fd, &sig, sizeof sig, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n == static_cast<ssize_t>(sizeof sig)) {
      if (sig > 0 && sig < NSIG && sig != SIGKILL && sig != SIGSTOP) ::kill(c.pid, sig);
      return;
    }
    ::kill(-c.pid, SIGKILL);  // its own session and process group (Spawn calls setsid)
    ::kill(c.pid, SIGKILL);
    c.pid = -1;  // reaped by the agent like any orphan; nobody to answer
    Close(fd);
    return;
  }
  struct ucred cred {};
  socklen_t cl = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) return Close(fd);
  Start(c, cred.uid);
}

void SudoServer::Start(Caller& c, uid_t peer_uid) {
  const int fd = c.fd.get();
  std::string buf(kSudoMaxRequest, '\0');
  char control[CMSG_SPACE(3 * sizeof(int))];
  struct iovec iov {
    buf.data(), buf.size()
  };
  struct msghdr mh {};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof control;
  ssize_t n = ::recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  // The caller's stdio: owned here from the moment they arrive, whatever happens next.
  std::vector<UniqueFd> stdio;
  for (struct cmsghdr* cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; ++i) {
      int got;
      std::memcpy(&got, CMSG_DATA(cm) + i * sizeof(int), sizeof got);
      stdio.emplace_back(got);
    }
  }
  if (n <= 0) return Close(fd);
  if ((mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || stdio.size() != 3)
    return Answer(fd, "e " + std::to_string(E2BIG) + " request too large or without stdio");

  users_.Reload();
  const PasswdEntry* user = users_.FindUser("user");
  if (peer_uid != 0 && !(user && user->uid == peer_uid))
    return Answer(fd, "e " + std::to_string(EPERM) + " " + users_.UserName(peer_uid) +
                          " is not allowed to use sudo in this sandbox (only user and root)");
  auto req = ParseSudoRequest(std::string_view(buf.data(), static_cast<size_t>(n)));
  if (!req.ok()) return Answer(fd, "e " + std::to_string(EINVAL) + " " + req.status().message());

  // The target.
  const PasswdEntry* pw = nullptr;
  uid_t uid = 0;
  if (req->target.empty()) {
    pw = users_.FindUid(0);
  } else if (req->target[0] == '#') {
    auto id = ParseId(std::string_view(req->target).substr(1));
    if (!id || *id > 0xfffffffeUL)
      return Answer(fd, "e " + std::to_string(EINVAL) + " bad uid " + req->target);
    uid = static_cast<uid_t>(*id);
    pw = users_.FindUid(uid);
  } else {
    pw = users_.FindUser(req->target);
    if (!pw) return Answer(fd, "e " + std::to_string(ENOENT) + " unknown user " + req->target);
    uid = pw->uid;
  }
  SpawnPlan plan;
  plan.change_ids = true;
  plan.uid = uid;
  plan.gid = pw ? pw->gid : uid;
  plan.groups = pw ? users_.GroupsOf(pw->name, plan.gid) : std::vector<gid_t>{plan.gid};
  const std::string home = pw && !pw->home.empty() ? pw->home : "/";
  const std::string shell = pw && !pw->shell.empty() ? pw->shell : "/bin/sh";
  const std::string name = pw ? pw->name : std::to_string(uid);
  const PasswdEntry* caller = users_.FindUid(peer_uid);

  // The environment: the caller's with -E, else sudo's env_reset (a few caller variables and the
  // target's own); a secure PATH either way, and SUDO_*.
  if (req->preserve_env) {
    plan.env = req->env;
  } else {
    for (const auto& e : req->env)
      for (const char* k : kKeptEnv)
        if (IsKey(e, k)) plan.env.push_back(e);
    SetEnv(plan.env, "HOME", home);
    SetEnv(plan.env, "SHELL", shell);
  }
  SetEnv(plan.env, "USER", name);
  SetEnv(plan.env, "LOGNAME", name);
  std::erase_if(plan.env, [](const std::string& e) { return IsKey(e, "PATH"); });
  plan.env.emplace_back(kSecurePath);
  SetEnv(plan.env, "SUDO_USER", caller ? caller->name : std::to_string(peer_uid));
  SetEnv(plan.env, "SUDO_UID", std::to_string(peer_uid));
  SetEnv(plan.env, "SUDO_GID", std::to_string(caller ? caller->gid : peer_uid));
  std::string joined;
  for (const auto& a : req->argv) joined += (joined.empty() ? "" : " ") + a;
  if (!joined.empty()) SetEnv(plan.env, "SUDO_COMMAND", joined);

  plan.cwd = req->cwd.empty() ? "/" : req->cwd;
  if (req->login || req->shell) {
    std::string sh = shell;
    if (req->shell && !req->login) {
      for (const auto& e : req->env)
        if (IsKey(e, "SHELL") && e.size() > 6) sh = e.substr(6);
    }
    plan.argv = {sh};
    if (req->login) {
      plan.argv.push_back("-l");
      plan.cwd = home;
    }
    if (!req->argv.empty()) {
      plan.argv.push_back("-c");
      plan.argv.push_back(ShellCommand(req->argv));
    }
  } else {
    plan.argv = req->argv;
  }
  for (int i = 0; i < 3; ++i) plan.stdio[i] = stdio[static_cast<size_t>(i)].get();
  plan.nofile = nofile_;
  plan.restore_nofile = restore_nofile_;
  auto child = Spawn(plan);
  if (!child.ok())
    return Answer(fd, "e " + std::to_string(child.status().err()) + " " + child.status().message());
  c.pid = child->pid;  // the stdio copies here close on return: the command has its own
}

bool SudoServer::OnExit(pid_t pid, int status) {
  for (auto& [fd, c] : callers_) {
    if (c.pid != pid) continue;
    c.pid = -1;
    if (WIFSIGNALED(status)) {
      Answer(fd, "s " + std::to_string(WTERMSIG(status)));
    } else {
      Answer(fd, "x " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : 1));
    }
    return true;
  }
  return false;
}

}  // namespace sbx::agent
