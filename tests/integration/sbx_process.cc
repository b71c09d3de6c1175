#include "sbx_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>

extern char** environ;

namespace sbx::test {

ProcessResult RunProcess(const std::vector<std::string>& argv, const ProcessOptions& opts) {
  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)
    return {};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
  for (const auto& e : opts.env) env_strings.push_back(e);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid;
  int rc = ::posix_spawn(&pid, args[0], &fa, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  ProcessResult r;
  if (rc != 0) {
    r.err = std::string("spawn failed: ") + std::strerror(rc);
    ::close(in[1]);
    ::close(out[0]);
    ::close(err[0]);
    return r;
  }
  ::signal(SIGPIPE, SIG_IGN);
  size_t written = 0;
  int in_fd = in[1];
  if (opts.stdin_data.empty() && opts.close_stdin) {
    ::close(in_fd);
    in_fd = -1;
  }
  auto start = std::chrono::steady_clock::now();
  bool signalled = false;
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    pollfd fds[3] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}, {in_fd, POLLOUT, 0}};
    ::poll(fds, in_fd >= 0 ? 3 : 2, 50);
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
      ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(n));
      } else {
        ::close(fds[i].fd);
        (i == 0 ? out[0] : err[0]) = -1;
        --open_fds;
      }
    }
    if (in_fd >= 0 && (fds[2].revents & (POLLOUT | POLLERR | POLLHUP))) {
      ssize_t n =
          ::write(in_fd, opts.stdin_data.data() + written, opts.stdin_data.size() - written);
      if (n > 0) written += static_cast<size_t>(n);
      if (n < 0 || written == opts.stdin_data.size()) {
        if (opts.close_stdin || n < 0) {
          ::close(in_fd);
          in_fd = -1;
        }
      }
    }
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::steady_clock::now() - start)
                  .count();
    if (opts.signal_after_ms > 0 && !signalled && ms >= opts.signal_after_ms) {
      ::kill(pid, opts.signal);
      signalled = true;
    }
    if (ms > opts.timeout_ms) ::kill(pid, SIGKILL);
  }
  if (in_fd >= 0) ::close(in_fd);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

namespace {

// This process's line per hierarchy of /proc/self/cgroup: its controllers ("name=" dropped) and
// its cgroup there ("" for the root).
std::vector<std::pair<std::string, std::string>> OwnCgroups() {
  std::vector<std::pair<std::string, std::string>> out;
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string ctrls = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (path == "/") path = "";
    if (ctrls.rfind("name=", 0) == 0) ctrls = ctrls.substr(5);
    out.emplace_back(std::move(ctrls), std::move(path));
  }
  return out;
}

}  // namespace

std::vector<std::string> CgroupParentDirs(const std::string& parent) {
  std::vector<std::string> out;
  for (const auto& [ctrls, path] : OwnCgroups()) {
    for (const char* c : {"memory", "pids", "freezer"}) {
      if (ctrls == c) out.push_back(std::string("/sys/fs/cgroup/") + c + path + "/" + parent);
    }
    if (ctrls.find("cpu") != std::string::npos && ctrls.find("cpuset") == std::string::npos)
      out.push_back("/sys/fs/cgroup/" + ctrls + path + "/" + parent);
  }
  return out;
}

namespace {

std::vector<std::string> SubCgroups(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (e->d_type == DT_DIR && e->d_name[0] != '.') out.push_back(dir + "/" + e->d_name);
    ::closedir(d);
  }
  return out;
}

// A frozen task dies only once thawed (in the freezer's hierarchy, whichever one is killing it).
void Thaw(const std::string& cgroup) {
  std::ofstream(cgroup + "/freezer.state") << "THAWED";
  std::ofstream(cgroup + "/cgroup.freeze") << "0";
  for (const auto& c : SubCgroups(cgroup)) Thaw(c);
}

// Kills (and awaits) a cgroup's processes, then removes it, depth first.
void KillAndRemove(const std::string& cgroup) {
  for (const auto& c : SubCgroups(cgroup)) KillAndRemove(c);
  std::ifstream procs(cgroup + "/cgroup.procs");
  for (pid_t pid = 0; procs >> pid;) {
    int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (fd < 0) continue;
    ::syscall(SYS_pidfd_send_signal, fd, SIGKILL, nullptr, 0U);
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, 10000);  // readable once it has exited
    ::close(fd);
  }
  ::rmdir(cgroup.c_str());
}

}  // namespace

void ExpectNoCgroupsAndRemoveParent(const std::string& parent) {
  // What a failed test left (a box still running, a QEMU guest say) is reported, then killed and
  // removed: it must not spend the rest of the suite's CPU.
  const auto dirs = CgroupParentDirs(parent);
  std::vector<std::string> leaked;
  for (const auto& dir : dirs)
    for (const auto& c : SubCgroups(dir)) leaked.push_back(c);
  for (const auto& c : leaked) ADD_FAILURE() << "leaked cgroup " << c;
  for (const auto& c : leaked) Thaw(c);
  for (const auto& c : leaked) KillAndRemove(c);
  for (const auto& dir : dirs) ::rmdir(dir.c_str());
  // The parent in the hierarchies sbx does not limit with but an OCI runtime's box is placed in
  // too (blkio, cpuset, devices, name=systemd, the unified one): removed once empty.
  for (const auto& [ctrls, path] : OwnCgroups()) {
    // The unified hierarchy (no controllers named) is /sys/fs/cgroup/unified on a hybrid host,
    // /sys/fs/cgroup itself on a v2-only one.
    std::vector<std::string> roots = {"/sys/fs/cgroup/" + (ctrls.empty() ? "unified" : ctrls)};
    if (ctrls.empty()) roots.emplace_back("/sys/fs/cgroup");
    for (const auto& root : roots) ::rmdir((root + path + "/" + parent).c_str());
  }
}

std::set<std::string> BoxLinks() {
  // /proc/self/net shows the reading task's namespace; no netlink needed for a read.
  std::set<std::string> out;
  std::ifstream in("/proc/self/net/dev");
  std::string line;
  while (std::getline(in, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    // sbx<N>: the daemon's boxes; sbr<N>: those of `sbx run --net`.
    bool ours = name.rfind("sbx", 0) == 0 || name.rfind("sbr", 0) == 0;
    if (name.size() > 3 && ours && name.find_first_not_of("0123456789", 3) == std::string::npos)
      out.insert(name);
  }
  return out;
}

}  // namespace sbx::test
