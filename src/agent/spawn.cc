#include "agent/spawn.h"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace sbx::agent {
namespace {

constexpr const char* kDefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

// Steps of the child, reported with errno through the exec-status pipe.
enum ChildStage : int { kStageSetup = 1, kStageIds, kStageChdir, kStageExec, kStageOomScore };

struct ChildReport {
  int stage;
  int err;
};

// Everything the child touches, as raw pointers prepared before fork.
struct ChildArgs {
  char* const* argv;
  char* const* envp;
  const char* const* candidates;
  const char* cwd;
  bool change_ids;
  uid_t uid;
  gid_t gid;
  const gid_t* groups;
  size_t ngroups;
  int in_fd, out_fd, err_fd;  // become 0, 1, 2
  int pty_slave;              // -1 without a PTY
  int report_fd;              // close-on-exec write end of the exec-status pipe
  const struct rlimit* nofile;
};

[[noreturn]] void ChildFail(int report_fd, int stage) {
  ChildReport r{stage, errno};
  ssize_t ignored = ::write(report_fd, &r, sizeof r);
  (void)ignored;
  _exit(127);
}

// What the agent spawns is the OOM killer's first choice in the box: +500 (raising is always
// allowed, lowering below the inherited minimum never is). Where the runtime could protect the
// agent (-1000, see native_runtime.cc) a child would otherwise inherit that and be unkillable,
// leaving the killer no victim; where it could not (no CAP_SYS_RESOURCE on the host), the agent
// at 0 would be the victim of a box full of processes each smaller than it. Also, under memory
// pressure on the host, a box's processes go before the host's own. Done before the ids change:
// afterwards the process is no longer dumpable and its /proc files are no longer its own.
// False (errno set) when it cannot.
bool RaiseOomScore() {
  int fd = ::open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t n;
  do {
    n = ::write(fd, "500", 3);
  } while (n < 0 && errno == EINTR);
  int saved = errno;
  ::close(fd);
  errno = saved;
  return n == 3;
}

// Runs in the child. Async-signal-safe calls only.
[[noreturn]] void ChildMain(const ChildArgs& a) {
  sigset_t none;
  sigemptyset(&none);
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  // Ignored dispositions survive exec; the agent ignores SIGPIPE and blocks the signals it reads
  // through signalfd, so restore both.
  for (int sig = 1; sig < NSIG; ++sig) ::sigaction(sig, &dfl, nullptr);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);

  if (!RaiseOomScore()) ChildFail(a.report_fd, kStageOomScore);

  if (::setsid() < 0) ChildFail(a.report_fd, kStageSetup);
  int in = a.in_fd, out = a.out_fd, err = a.err_fd;
  if (a.pty_slave >= 0) {
    if (::ioctl(a.pty_slave, TIOCSCTTY, 0) < 0) ChildFail(a.report_fd, kStageSetup);
    in = out = err = a.pty_slave;
  }
  if (::dup2(in, 0) < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0)
    ChildFail(a.report_fd, kStageSetup);

  if (a.change_ids) {
    if (::setgroups(a.ngroups, a.groups) < 0) ChildFail(a.report_fd, kStageIds);
    if (::setresgid(a.gid, a.gid, a.gid) < 0) ChildFail(a.report_fd, kStageIds);
    if (::setresuid(a.uid, a.uid, a.uid) < 0) ChildFail(a.report_fd, kStageIds);
  }
  if (::chdir(a.cwd) < 0) ChildFail(a.report_fd, kStageChdir);
  if (a.nofile) ::setrlimit(RLIMIT_NOFILE, a.nofile);

  // Every descriptor above 2 goes, except the report pipe, which is close-on-exec.
  CloseAllBut(a.report_fd);

  int saved = ENOENT;
  bool eacces = false;
  for (const char* const* c = a.candidates; *c; ++c) {
    ::execve(*c, a.argv, a.envp);
    switch (errno) {
      case EACCES:
        eacces = true;
        [[fallthrough]];
      case ENOENT:
      case ENOTDIR:
      case ESTALE:
      case ENODEV:
      case ETIMEDOUT:
        saved = errno;
        continue;
      default:
        ChildFail(a.report_fd, kStageExec);
    }
  }
  errno = eacces ? EACCES : saved;
  ChildFail(a.report_fd, kStageExec);
}

Status SetNonBlocking(int fd) {
  int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || ::fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return Status::Errno("fcntl");
  return {};
}

const char* StageName(int stage) {
  switch (stage) {
    case kStageIds:
      return "set user";
    case kStageChdir:
      return "chdir";
    case kStageExec:
      return "exec";
    case kStageOomScore:
      return "set oom_score_adj";
    default:
      return "set up";
  }
}

}  // namespace

// Closes every descriptor from 3 on except `keep`. close_range where the kernel has it; else
// (gVisor 20221219 has none) each descriptor /proc/self/fd lists, read with raw getdents64 into
// a buffer on the stack (procfs positions that listing by descriptor number, so closing as it
// goes skips nothing); else one by one up to the soft limit. Closing only up to the soft limit
// would miss the agent's own descriptors above it: the agent raises its limit, its children get
// the one it was given.
void CloseAllBut(int keep) {
  const unsigned k = static_cast<unsigned>(keep);
  if ((k <= 3 || ::syscall(SYS_close_range, 3U, k - 1, 0U) == 0) &&
      ::syscall(SYS_close_range, k + 1, ~0U, 0U) == 0)
    return;
  int dir = ::open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    alignas(8) char buf[4096];
    long n;
    while ((n = ::syscall(SYS_getdents64, dir, buf, sizeof buf)) > 0) {
      for (long off = 0; off < n;) {
        // struct linux_dirent64: d_ino (8), d_off (8), d_reclen (2), d_type (1), d_name.
        unsigned short reclen;
        std::memcpy(&reclen, buf + off + 16, sizeof reclen);
        const char* name = buf + off + 19;
        off += reclen;
        int fd = 0;
        bool number = *name != '\0';
        for (const char* c = name; *c != '\0'; ++c) {
          if (*c < '0' || *c > '9' || fd > 100000000) {
            number = false;
            break;
          }
          fd = fd * 10 + (*c - '0');
        }
        if (number && fd > 2 && fd != keep && fd != dir) ::close(fd);
      }
    }
    ::close(dir);
    if (n == 0) return;
  }
  struct rlimit rl;
  long max = 65536;
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur > 65536 &&
      rl.rlim_cur < 1048576)
    max = static_cast<long>(rl.rlim_cur);
  for (long fd = 3; fd < max; ++fd)
    if (fd != keep) ::close(static_cast<int>(fd));
}

std::vector<std::string> ExecCandidates(const std::string& argv0, const std::string& path_env) {
  if (argv0.find('/') != std::string::npos) return {argv0};
  std::vector<std::string> out;
  std::string_view path = path_env.empty() ? std::string_view(kDefaultPath) : path_env;
  size_t i = 0;
  for (;;) {
    size_t j = path.find(':', i);
    std::string_view dir = path.substr(i, j == std::string_view::npos ? j : j - i);
    std::string c(dir.empty() ? "." : dir);
    c += '/';
    c += argv0;
    out.push_back(std::move(c));
    if (j == std::string_view::npos) break;
    i = j + 1;
  }
  return out;
}

Result<SpawnedChild> Spawn(const SpawnPlan& plan) {
  const std::string& prog = plan.argv[0];
  // Prepare everything the child needs before fork.
  std::vector<char*> argv, envp;
  for (const auto& s : plan.argv) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  std::string path_env;
  for (const auto& s : plan.env) {
    envp.push_back(const_cast<char*>(s.c_str()));
    if (s.compare(0, 5, "PATH=") == 0) path_env = s.substr(5);
  }
  envp.push_back(nullptr);
  std::vector<std::string> cands = ExecCandidates(prog, path_env);
  std::vector<const char*> cand_ptrs;
  for (const auto& c : cands) cand_ptrs.push_back(c.c_str());
  cand_ptrs.push_back(nullptr);

  SpawnedChild out;
  UniqueFd child_in, child_out, child_err, slave;
  if (plan.pty) {
    UniqueFd master(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!master) return Status::Errno("spawn " + prog + ": posix_openpt");
    if (::grantpt(master.get()) < 0 || ::unlockpt(master.get()) < 0)
      return Status::Errno("spawn " + prog + ": unlockpt");
    char name[128];
    if (::ptsname_r(master.get(), name, sizeof name) != 0)
      return Status::Errno("spawn " + prog + ": ptsname");
    struct winsize ws {};
    ws.ws_row = plan.rows;
    ws.ws_col = plan.cols;
    ::ioctl(master.get(), TIOCSWINSZ, &ws);
    slave.reset(::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!slave) return Status::Errno(std::string("spawn ") + prog + ": open " + name);
    out.stdin_fd.reset(::fcntl(master.get(), F_DUPFD_CLOEXEC, 3));
    if (!out.stdin_fd) return Status::Errno("spawn " + prog + ": dup");
    out.stdout_fd = std::move(master);
  } else if (plan.stdio[0] >= 0) {
    // Used as they are; the child dup2()s them (the originals stay the caller's).
  } else {
    int p[2];
    if (plan.stdin_open) {
      if (::pipe2(p, O_CLOEXEC) < 0) return Status::Errno("spawn " + prog + ": pipe");
      child_in.reset(p[0]);
      out.stdin_fd.reset(p[1]);
    } else {
      child_in.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
      if (!child_in) return Status::Errno("spawn " + prog + ": open /dev/null");
    }
    if (::pipe2(p, O_CLOEXEC) < 0) return Status::Errno("spawn " + prog + ": pipe");
    out.stdout_fd.reset(p[0]);
    child_out.reset(p[1]);
    if (::pipe2(p, O_CLOEXEC) < 0) return Status::Errno("spawn " + prog + ": pipe");
    out.stderr_fd.reset(p[0]);
    child_err.reset(p[1]);
  }
  for (UniqueFd* fd : {&out.stdin_fd, &out.stdout_fd, &out.stderr_fd}) {
    if (fd->valid()) SBX_RETURN_IF_ERROR(SetNonBlocking(fd->get()));
  }

  int rp[2];
  if (::pipe2(rp, O_CLOEXEC) < 0) return Status::Errno("spawn " + prog + ": pipe");
  UniqueFd report_r(rp[0]), report_w(rp[1]);

  ChildArgs a{argv.data(),
              envp.data(),
              cand_ptrs.data(),
              plan.cwd.c_str(),
              plan.change_ids,
              plan.uid,
              plan.gid,
              plan.groups.data(),
              plan.groups.size(),
              plan.stdio[0] >= 0 ? plan.stdio[0] : child_in.get(),
              plan.stdio[0] >= 0 ? plan.stdio[1] : child_out.get(),
              plan.stdio[0] >= 0 ? plan.stdio[2] : child_err.get(),
              slave.get(),
              report_w.get(),
              plan.restore_nofile ? &plan.nofile : nullptr};
  pid_t pid = ::fork();
  if (pid < 0) return Status::Errno("spawn " + prog + ": fork");
  if (pid == 0) ChildMain(a);

  report_w.reset();
  child_in.reset();
  child_out.reset();
  child_err.reset();
  slave.reset();
  ChildReport r{};
  ssize_t n;
  do {
    n = ::read(report_r.get(), &r, sizeof r);
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof r)) {
    int st;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    std::string what = "spawn " + prog;
    if (r.stage != kStageExec) what += std::string(": ") + StageName(r.stage);
    if (r.stage == kStageChdir) what += " " + plan.cwd;
    return Status::Error(what, r.err);
  }
  out.pid = pid;
  return out;
}

}  // namespace sbx::agent
