// RawTerminal: puts a host terminal in raw mode (for -i -t, as `docker run -it` does) and
// restores it on destruction. Does nothing when the descriptor is not a terminal.
#pragma once

#include <termios.h>
#include <unistd.h>

namespace sbx::cli {

class RawTerminal {
 public:
  explicit RawTerminal(int fd) : fd_(fd) {
    if (!::isatty(fd) || ::tcgetattr(fd, &saved_) != 0) return;
    termios raw = saved_;
    ::cfmakeraw(&raw);
    if (::tcsetattr(fd, TCSANOW, &raw) == 0) active_ = true;
  }
  ~RawTerminal() {
    if (active_) ::tcsetattr(fd_, TCSANOW, &saved_);
  }
  RawTerminal(const RawTerminal&) = delete;
  RawTerminal& operator=(const RawTerminal&) = delete;

 private:
  int fd_;
  termios saved_{};
  bool active_ = false;
};

}  // namespace sbx::cli
