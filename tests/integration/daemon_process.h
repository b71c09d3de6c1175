// Test helper: a real `sbx serve` process on 127.0.0.1 with a free port, in a given data
// directory; its log goes to <data dir>/serve.log. Shared by the serve, CLI and OpenAPI tests.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace sbx::test {

class DaemonProcess {
 public:
  explicit DaemonProcess(std::string data_dir) : data_dir_(std::move(data_dir)) {}
  ~DaemonProcess() { Stop(); }
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  // Starts the daemon and waits for its port and API key (fails the test when it does not come
  // up within 10 s).
  void Start();
  // Sends `sig` and reaps the daemon. Sandboxes keep running (as with any daemon stop).
  void Stop(int sig = 15 /* SIGTERM */);
  // False once the daemon process has exited (crashed, or stopped).
  bool Alive();

  // Before Start: a command the daemon runs under (e.g. {"ip", "netns", "exec", NS}: then the
  // test reaches it only through `unix_socket`, which Start adds), and more `serve` flags.
  void set_prefix(std::vector<std::string> prefix) { prefix_ = std::move(prefix); }
  void set_serve_flags(std::vector<std::string> flags) { serve_flags_ = std::move(flags); }
  // <data dir>/api.sock when a prefix is set, else empty.
  std::string unix_socket() const { return prefix_.empty() ? "" : data_dir_ + "/api.sock"; }

  uint16_t port() const { return port_; }
  const std::string& key() const { return key_; }
  const std::string& data_dir() const { return data_dir_; }
  std::string log() const;

 private:
  std::string data_dir_;
  std::vector<std::string> prefix_, serve_flags_;
  pid_t pid_ = -1;
  uint16_t port_ = 0;
  std::string key_;
};

}  // namespace sbx::test
