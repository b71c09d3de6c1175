#include "daemon_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "common/fd.h"

extern char** environ;

namespace sbx::test {

std::string DaemonProcess::log() const {
  auto text = ReadFile(data_dir_ + "/serve.log");
  return text.ok() ? *text : "";
}

void DaemonProcess::Start() {
  ::unlink((data_dir_ + "/serve.port").c_str());
  std::vector<std::string> args = prefix_;
  for (std::string a :
       {SBX_BIN, "--data-dir", data_dir_.c_str(), "serve", "--listen", "127.0.0.1:0"})
    args.push_back(a);
  if (!prefix_.empty()) {
    ::unlink(unix_socket().c_str());
    args.insert(args.end(), {"--unix-socket", unix_socket()});
  }
  // Networking only inside a namespace the test made: a daemon in the host's own namespace would
  // add its nftables table and box links there.
  if (prefix_.empty() &&
      std::find(serve_flags_.begin(), serve_flags_.end(), "--network") == serve_flags_.end())
    args.insert(args.end(), {"--network", "off"});
  args.insert(args.end(), serve_flags_.begin(), serve_flags_.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string log_path = data_dir_ + "/serve.log";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  int rc = prefix_.empty() ? ::posix_spawn(&pid_, SBX_BIN, &fa, nullptr, argv.data(), environ)
                           : ::posix_spawnp(&pid_, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ASSERT_EQ(rc, 0) << "spawn " << SBX_BIN;
  for (int i = 0; i < 200 && port_ == 0; ++i) {
    auto port = ReadFile(data_dir_ + "/serve.port");
    if (port.ok() && !port->empty()) port_ = static_cast<uint16_t>(std::atoi(port->c_str()));
    if (port_ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_NE(port_, 0) << "daemon did not start: " << log();
  auto key = ReadFile(data_dir_ + "/api-key");
  ASSERT_TRUE(key.ok());
  key_ = key->substr(0, key->find('\n'));
}

void DaemonProcess::Stop(int sig) {
  if (pid_ <= 0) return;
  ::kill(pid_, sig);
  int status;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  port_ = 0;
}

bool DaemonProcess::Alive() {
  if (pid_ <= 0) return false;
  int status;
  if (::waitpid(pid_, &status, WNOHANG) == 0) return true;
  pid_ = -1;
  port_ = 0;
  return false;
}

}  // namespace sbx::test
