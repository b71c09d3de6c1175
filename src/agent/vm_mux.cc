#include "agent/vm_mux.h"

#include <fcntl.h>
#include <linux/random.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <vector>

#include "agent/log.h"

namespace sbx::agent {
namespace {

// Past this many bytes queued for one stream (or for the channel), it is closed (the channel:
// reading the streams pauses instead).
constexpr size_t kMaxQueued = 16 << 20;

// The host's kReset goes again after this long without a hello, then at twice the interval, up to
// the last.
constexpr int64_t kResendFirstMs = 500;
constexpr int64_t kResendMaxMs = 8000;

// Bytes waiting to be written to a descriptor, written from the front.
struct Queue {
  std::string data;
  size_t off = 0;
  size_t size() const { return data.size() - off; }
  bool empty() const { return off == data.size(); }
  void Append(const char* p, size_t n) { data.append(p, n); }
  // Writes what it can; false on an error other than "would block".
  bool Flush(int fd) {
    while (!empty()) {
      ssize_t n = ::write(fd, data.data() + off, size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
      }
      off += static_cast<size_t>(n);
    }
    data.clear();
    off = 0;
    return true;
  }
};

struct Stream {
  int fd = -1;
  Queue out;             // to the stream's socket
  bool closing = false;  // the other end closed it: close once `out` is written
};

void PutU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

bool SetNonBlocking(int fd) {
  int fl = ::fcntl(fd, F_GETFL);
  return fl >= 0 && ::fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0 &&
         ::fcntl(fd, F_SETFD, FD_CLOEXEC) == 0;
}

int ConnectUnix(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path) return -1;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

class Mux {
 public:
  explicit Mux(const MuxOptions& o) : o_(o), console_fd_(o.console_fd) {}

  int Run() {
    ::signal(SIGPIPE, SIG_IGN);
    if (!SetNonBlocking(o_.channel_fd) || (o_.listen_fd >= 0 && !SetNonBlocking(o_.listen_fd)) ||
        (console_fd_ >= 0 && !SetNonBlocking(console_fd_))) {
      Log("vm mux: fcntl: %s", strerror(errno));
      return 1;
    }
    const bool guest = o_.listen_fd < 0;
    int quiesce_fd = -1;  // the host's end: SIGUSR1 asks it to quiesce
    if (guest) {
      Frame(0, kMuxHello, nullptr, 0);
    } else {
      sigset_t usr1;
      sigemptyset(&usr1);
      sigaddset(&usr1, SIGUSR1);
      ::sigprocmask(SIG_BLOCK, &usr1, nullptr);
      quiesce_fd = ::signalfd(-1, &usr1, SFD_NONBLOCK | SFD_CLOEXEC);
      if (quiesce_fd < 0) {
        Log("vm mux: signalfd: %s", strerror(errno));
        return 1;
      }
      if (o_.reset) SendReset();
    }
    std::vector<pollfd> fds;
    std::vector<uint32_t> ids;
    for (;;) {
      fds.clear();
      ids.clear();
      fds.push_back(
          {o_.channel_fd, static_cast<short>(POLLIN | (chan_out_.empty() ? 0 : POLLOUT)), 0});
      ids.push_back(0);
      const bool accepting = !guest && ready_ && !quiescing_;
      if (accepting) {
        fds.push_back({o_.listen_fd, POLLIN, 0});
        ids.push_back(0);
      }
      const size_t signals = fds.size();
      fds.push_back({quiesce_fd, POLLIN, 0});  // -1 (ignored by poll) in the guest
      ids.push_back(0);
      const size_t console = fds.size();
      fds.push_back({console_fd_, POLLIN, 0});  // -1 (ignored by poll) without a console
      ids.push_back(0);
      const size_t first_stream = fds.size();
      const bool read_streams = chan_out_.size() < kMaxQueued;
      for (auto& [id, s] : streams_) {
        short ev = static_cast<short>((read_streams && !s.closing ? POLLIN : 0) |
                                      (s.out.empty() ? 0 : POLLOUT));
        fds.push_back({s.fd, ev, 0});
        ids.push_back(id);
      }
      if (::poll(fds.data(), fds.size(), ResendWait()) < 0) {
        if (errno == EINTR) continue;
        Log("vm mux: poll: %s", strerror(errno));
        return 1;
      }
      if (ResendWait() == 0) SendReset();
      if ((fds[0].revents & POLLOUT) && !FlushChannel()) {
        if (!guest) return ChannelGone("write");
        AwaitHost();
        continue;
      }
      if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        if (!ReadChannel()) {
          if (!guest) return ChannelGone("read");
          AwaitHost();
          continue;
        }
        if (quiesced_) {
          CloseStreams();
          return 0;
        }
      }
      if (accepting && (fds[1].revents & POLLIN)) Accept();
      if (fds[signals].revents & POLLIN) {
        signalfd_siginfo si;
        while (::read(quiesce_fd, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
        }
        if (!quiescing_) {
          // The daemon's connections end here; the guest's end closes its side of each.
          quiescing_ = true;
          CloseStreams();
          Frame(0, kMuxQuiesce, nullptr, 0);
        }
      }
      if (fds[console].revents != 0) CopyConsole();
      for (size_t i = first_stream; i < fds.size(); ++i) {
        auto it = streams_.find(ids[i]);
        if (it == streams_.end() || fds[i].revents == 0) continue;
        Service(it->first, it->second, fds[i].revents);
      }
      if (!FlushChannel()) {
        if (!guest) return ChannelGone("write");
        AwaitHost();
      }
    }
  }

 private:
  void CloseStreams() {
    for (auto& [id, s] : streams_) ::close(s.fd);
    streams_.clear();
  }

  // The guest: the host's end is gone (a virtio port reads EOF and polls as hung up while no host
  // end is connected). Whatever was in flight is moot: wait for a host's end to connect again (it
  // then sends kReset). Polled: a hung-up port is always ready.
  //
  // Between kQuiesced and the hello that answers a kReset, nothing is moot: the hang-up may be the
  // saved host end's, seen late (a restored guest learns of it from a control queue that is not
  // ordered with the port's data), while the new host's kReset is already read or the hello to
  // it is queued. Dropping either would leave both ends waiting for each other.
  void AwaitHost() {
    CloseStreams();
    if (!rekeying_) {
      in_.clear();
      chan_out_ = Queue();
    }
    for (;;) {
      pollfd p{o_.channel_fd, POLLOUT, 0};
      if (::poll(&p, 1, 0) >= 0 && (p.revents & (POLLHUP | POLLERR)) == 0) return;
      timespec pause{0, 20L * 1000 * 1000};
      ::nanosleep(&pause, nullptr);
    }
  }

  // The host: kReset, re-keying a guest that has run before; sent again, at growing intervals,
  // until the guest says hello (it answers each: the channel is ordered, and streams open only
  // after the hello, so a repeated kReset never closes one).
  static int64_t Now() {
    timespec t{};
    ::clock_gettime(CLOCK_MONOTONIC, &t);
    return static_cast<int64_t>(t.tv_sec) * 1000 + t.tv_nsec / 1000000;
  }
  // Milliseconds until kReset is due again (0: now), -1 when it is not to be sent again.
  int ResendWait() const {
    if (o_.listen_fd < 0 || !o_.reset || ready_) return -1;
    return static_cast<int>(std::max<int64_t>(0, resend_at_ - Now()));
  }
  void SendReset() {
    resend_at_ = Now() + resend_ms_;
    resend_ms_ = std::min<int64_t>(resend_ms_ * 2, kResendMaxMs);
    std::string p(8 + kMuxEntropy, '\0');
    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);
    const int64_t ns = static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
    for (int i = 0; i < 8; ++i)
      p[i] = static_cast<char>((static_cast<uint64_t>(ns) >> (8 * i)) & 0xff);
    if (::getrandom(p.data() + 8, kMuxEntropy, 0) != static_cast<ssize_t>(kMuxEntropy))
      Log("vm mux: getrandom: %s", strerror(errno));
    p += o_.reset_hostname;
    Frame(0, kMuxReset, p.data(), p.size());
  }

  // The guest: a restored copy of a running system takes the host's clock (its own stood still
  // while it was saved), fresh entropy for its kernel's generator (each fork of one saved state
  // would otherwise draw the same numbers) and its new hostname.
  static void ApplyReset(const char* p, uint32_t len) {
    if (len < 8 + kMuxEntropy) return;
    uint64_t ns = 0;
    for (int i = 0; i < 8; ++i)
      ns |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    if (::clock_settime(CLOCK_REALTIME, &ts) != 0)
      Log("vm mux: set the clock: %s", strerror(errno));
    struct {
      int entropy_count;
      int buf_size;
      uint32_t buf[kMuxEntropy / 4];
    } seed{static_cast<int>(kMuxEntropy * 8), static_cast<int>(kMuxEntropy), {}};
    std::memcpy(seed.buf, p + 8, kMuxEntropy);
    int fd = ::open("/dev/urandom", O_WRONLY | O_CLOEXEC);
    if (fd < 0 || ::ioctl(fd, RNDADDENTROPY, &seed) != 0 || ::ioctl(fd, RNDRESEEDCRNG) != 0)
      Log("vm mux: reseed: %s", strerror(errno));
    if (fd >= 0) ::close(fd);
    if (len > 8 + kMuxEntropy && ::sethostname(p + 8 + kMuxEntropy, len - 8 - kMuxEntropy) != 0)
      Log("vm mux: sethostname: %s", strerror(errno));
  }

  // Writes what the channel can take; the guest's hello to a kReset is out once it all is.
  bool FlushChannel() {
    if (!chan_out_.Flush(o_.channel_fd)) return false;
    if (hello_queued_ && chan_out_.empty()) rekeying_ = hello_queued_ = false;
    return true;
  }

  int ChannelGone(const char* what) {
    // The other end is gone (QEMU exited, or the host's end was killed): so is every stream.
    if (errno != 0) Log("vm mux: channel %s: %s", what, strerror(errno));
    for (auto& [id, s] : streams_) ::close(s.fd);
    return 0;
  }

  // Appends what the console has to its log, dropping the log's older part past kMuxConsoleMax.
  void CopyConsole() {
    char buf[kMuxMaxPayload];
    ssize_t n = ::read(console_fd_, buf, sizeof buf);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      ::close(console_fd_);
      console_fd_ = -1;
      return;
    }
    if (n < 0 || o_.console_log_fd < 0) return;
    off_t size = ::lseek(o_.console_log_fd, 0, SEEK_END);
    if (size >= 0 && static_cast<size_t>(size) + static_cast<size_t>(n) > kMuxConsoleMax) {
      std::string keep(kMuxConsoleKeep, '\0');
      ssize_t got = ::pread(o_.console_log_fd, keep.data(), keep.size(),
                            size > static_cast<off_t>(kMuxConsoleKeep)
                                ? size - static_cast<off_t>(kMuxConsoleKeep)
                                : 0);
      if (::ftruncate(o_.console_log_fd, 0) == 0 && got > 0)
        (void)!::write(o_.console_log_fd, keep.data(), static_cast<size_t>(got));
    }
    (void)!::write(o_.console_log_fd, buf, static_cast<size_t>(n));
  }

  void Frame(uint32_t id, uint8_t type, const char* p, size_t n) {
    char h[kMuxHeader];
    PutU32(h, id);
    h[4] = static_cast<char>(type);
    PutU32(h + 5, static_cast<uint32_t>(n));
    chan_out_.Append(h, sizeof h);
    if (n) chan_out_.Append(p, n);
  }

  void Drop(uint32_t id, bool tell) {
    auto it = streams_.find(id);
    if (it == streams_.end()) return;
    ::close(it->second.fd);
    streams_.erase(it);
    if (tell) Frame(id, kMuxClose, nullptr, 0);
  }

  void Accept() {
    for (;;) {
      int fd = ::accept4(o_.listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      uint32_t id = next_id_++;
      streams_[id].fd = fd;
      Frame(id, kMuxOpen, nullptr, 0);
    }
  }

  void Service(uint32_t id, Stream& s, short revents) {
    if (revents & POLLOUT) {
      if (!s.out.Flush(s.fd)) return Drop(id, !s.closing);
    }
    if (s.closing && s.out.empty()) return Drop(id, false);
    if (revents & (POLLIN | POLLHUP | POLLERR)) {
      if (s.closing) return;
      char buf[kMuxMaxPayload];
      ssize_t n = ::read(s.fd, buf, sizeof buf);
      if (n > 0) {
        Frame(id, kMuxData, buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        Drop(id, true);
      }
    }
  }

  // Reads what the channel has and acts on every whole frame, also those read before it hung up;
  // false once it is gone.
  bool ReadChannel() {
    char buf[kMuxMaxPayload];
    bool gone = false;
    int gone_errno = 0;
    for (;;) {
      ssize_t n = ::read(o_.channel_fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n <= 0) {
        gone = true;
        gone_errno = n == 0 ? 0 : errno;
        break;
      }
      in_.append(buf, static_cast<size_t>(n));
    }
    size_t pos = 0;
    while (in_.size() - pos >= kMuxHeader) {
      const char* h = in_.data() + pos;
      uint32_t id = GetU32(h);
      uint8_t type = static_cast<uint8_t>(h[4]);
      uint32_t len = GetU32(h + 5);
      if (len > kMuxMaxPayload || type > kMuxReset) {
        Log("vm mux: bad frame (type %u, length %u)", type, len);
        in_.clear();
        errno = EPROTO;
        return false;
      }
      if (in_.size() - pos - kMuxHeader < len) break;
      OnFrame(id, type, h + kMuxHeader, len);
      pos += kMuxHeader + len;
      if (quiesced_) break;
    }
    in_.erase(0, pos);
    errno = gone_errno;
    return !gone;
  }

  void OnFrame(uint32_t id, uint8_t type, const char* p, uint32_t len) {
    const bool guest = o_.listen_fd < 0;
    switch (type) {
      case kMuxHello:
        if (!guest && !ready_) {
          ready_ = true;
          if (o_.ready_fd >= 0) {
            (void)!::write(o_.ready_fd, "1", 1);
            ::close(o_.ready_fd);
          }
        }
        return;
      case kMuxOpen: {
        if (!guest || streams_.count(id)) return;
        int fd = ConnectUnix(o_.agent_path);
        if (fd < 0 || !SetNonBlocking(fd)) {
          if (fd >= 0) ::close(fd);
          Frame(id, kMuxClose, nullptr, 0);
          return;
        }
        streams_[id].fd = fd;
        return;
      }
      case kMuxData: {
        auto it = streams_.find(id);
        if (it == streams_.end() || it->second.closing) return;
        it->second.out.Append(p, len);
        if (it->second.out.size() > kMuxMaxPayload && !it->second.out.Flush(it->second.fd))
          return Drop(id, true);
        if (it->second.out.size() > kMaxQueued) Drop(id, true);
        return;
      }
      case kMuxClose: {
        auto it = streams_.find(id);
        if (it == streams_.end()) return;
        if (it->second.out.empty() || !it->second.out.Flush(it->second.fd) ||
            it->second.out.empty()) {
          Drop(id, false);
        } else {
          it->second.closing = true;
        }
        return;
      }
      case kMuxQuiesce:
        if (!guest) return;
        CloseStreams();
        Frame(0, kMuxQuiesced, nullptr, 0);
        rekeying_ = true;
        return;
      case kMuxQuiesced:
        if (!guest && quiescing_) quiesced_ = true;
        return;
      case kMuxReset:
        if (!guest) return;
        CloseStreams();
        ApplyReset(p, len);
        Frame(0, kMuxHello, nullptr, 0);
        hello_queued_ = rekeying_;
        return;
      default:
        return;
    }
  }

  const MuxOptions o_;
  Queue chan_out_;
  std::string in_;
  std::map<uint32_t, Stream> streams_;
  uint32_t next_id_ = 1;
  bool ready_ = false;
  bool quiescing_ = false;  // the host: kQuiesce sent
  bool quiesced_ = false;   // the host: the guest answered it
  int64_t resend_at_ = 0;   // the host: when kReset goes again without a hello
  int64_t resend_ms_ = kResendFirstMs;
  bool rekeying_ = false;      // the guest: from kQuiesced until its hello to a kReset is out
  bool hello_queued_ = false;  // ... and that hello is queued
  int console_fd_;
};

}  // namespace

int RunMux(const MuxOptions& options) { return Mux(options).Run(); }

}  // namespace sbx::agent
