#include "agent/vm_mux.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

namespace sbx::agent {
namespace {

// A bound on every wait here, so that a broken mux fails the test instead of hanging it; the
// waits themselves end on the event.
constexpr int kGuardMs = 30000;

struct Frame {
  uint32_t id = 0;
  uint8_t type = 0;
  std::string payload;
};

std::string Encode(uint32_t id, uint8_t type, const std::string& payload = "") {
  std::string f(kMuxHeader, '\0');
  for (int i = 0; i < 4; ++i) f[i] = static_cast<char>((id >> (8 * i)) & 0xff);
  f[4] = static_cast<char>(type);
  const auto n = static_cast<uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) f[5 + i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return f + payload;
}

void WriteAll(int fd, const std::string& s) {
  ASSERT_EQ(::write(fd, s.data(), s.size()), static_cast<ssize_t>(s.size()));
}

// The far end of a channel: reads whole frames as they come.
class Peer {
 public:
  explicit Peer(int fd) : fd_(fd) {}
  void set_fd(int fd) {
    fd_ = fd;
    in_.clear();
  }
  // The next frame, or false when none came within kGuardMs or the channel ended.
  bool Next(Frame* f) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kGuardMs);
    for (;;) {
      if (in_.size() >= kMuxHeader) {
        auto u32 = [&](size_t at) {
          uint32_t v = 0;
          for (int i = 0; i < 4; ++i)
            v |= static_cast<uint32_t>(static_cast<unsigned char>(in_[at + i])) << (8 * i);
          return v;
        };
        const uint32_t len = u32(5);
        if (in_.size() >= kMuxHeader + len) {
          f->id = u32(0);
          f->type = static_cast<uint8_t>(in_[4]);
          f->payload = in_.substr(kMuxHeader, len);
          in_.erase(0, kMuxHeader + len);
          return true;
        }
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
      char buf[4096];
      ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n <= 0) return false;
      in_.append(buf, static_cast<size_t>(n));
    }
  }

 private:
  int fd_;
  std::string in_;
};

TEST(VmMuxTest, TheHostSendsResetAgainUntilTheGuestSaysHello) {
  int ch[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ch), 0);
  // The box's agent socket: an abstract address the kernel picks.
  int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(sa_family_t)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t addr_len = sizeof addr;
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &addr_len), 0);
  int ready[2];
  ASSERT_EQ(::pipe2(ready, O_CLOEXEC), 0);

  MuxOptions o;
  o.channel_fd = ch[0];
  o.listen_fd = listener;
  o.ready_fd = ready[1];
  o.reset = true;
  o.reset_hostname = "fork-1";
  int status = -1;
  std::thread host([&] { status = RunMux(o); });
  struct Join {  // also when an assertion returns early: QEMU goes, the host's end exits
    std::thread& t;
    int fd;
    ~Join() {
      if (fd >= 0) ::close(fd);
      if (t.joinable()) t.join();
    }
  } join{host, ch[1]};

  // The first kReset is lost (the guest never reads it): the host sends it again.
  Peer guest(ch[1]);
  Frame f;
  ASSERT_TRUE(guest.Next(&f));
  EXPECT_EQ(f.type, kMuxReset);
  EXPECT_EQ(f.payload.substr(8 + kMuxEntropy), "fork-1");
  ASSERT_TRUE(guest.Next(&f)) << "no second kReset";
  EXPECT_EQ(f.type, kMuxReset);
  EXPECT_EQ(f.payload.substr(8 + kMuxEntropy), "fork-1");

  // The hello to it makes the host ready; a connection then becomes a stream.
  WriteAll(ch[1], Encode(0, kMuxHello));
  pollfd p{ready[0], POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, kGuardMs), 1);
  char b = 0;
  EXPECT_EQ(::read(ready[0], &b, 1), 1);
  EXPECT_EQ(b, '1');
  int client = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&addr), addr_len), 0);
  do {
    ASSERT_TRUE(guest.Next(&f)) << "no kOpen for the connection";
  } while (f.type == kMuxReset);  // one may have left before the hello was read
  EXPECT_EQ(f.type, kMuxOpen);

  ::close(ch[1]);  // QEMU is gone: the host's end exits
  join.fd = -1;
  host.join();
  EXPECT_EQ(status, 0);
  for (int fd : {client, listener, ready[0], ch[0]}) ::close(fd);
}

// The guest's end on a pseudo-terminal, which hangs up like a virtio port: the master reads what
// was written, then EIO and polls as hung up while no slave is open; opening one connects again.
class GuestOnAPty : public ::testing::Test {
 protected:
  void SetUp() override {
    master_ = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    ASSERT_GE(master_, 0);
    ASSERT_EQ(::grantpt(master_), 0);
    ASSERT_EQ(::unlockpt(master_), 0);
    slave_path_ = ::ptsname(master_);
    Connect();
  }
  void TearDown() override {
    if (guest_ > 0) {
      ::kill(guest_, SIGKILL);
      ::waitpid(guest_, nullptr, 0);
    }
    if (slave_ >= 0) ::close(slave_);
    ::close(master_);
  }
  // A host's end connects: the slave opens, raw.
  void Connect() {
    slave_ = ::open(slave_path_.c_str(), O_RDWR | O_NOCTTY | O_CLOEXEC);
    ASSERT_GE(slave_, 0);
    termios t{};
    ASSERT_EQ(::tcgetattr(slave_, &t), 0);
    ::cfmakeraw(&t);
    ASSERT_EQ(::tcsetattr(slave_, TCSANOW, &t), 0);
  }
  void StartGuest() {
    guest_ = ::fork();
    ASSERT_GE(guest_, 0);
    if (guest_ == 0) {
      ::close(slave_);  // the host's end is the test's alone: closing it hangs up
      MuxOptions o;
      o.channel_fd = master_;
      o.agent_path = "/nonexistent/agent.sock";
      ::_exit(RunMux(o));
    }
  }
  // Whether the guest's end sleeps in its wait for a host (AwaitHost), i.e. it saw the hang-up.
  bool GuestAwaitsHost() const {
    std::ifstream in("/proc/" + std::to_string(guest_) + "/syscall");
    long nr = -1;
    in >> nr;
    return nr == SYS_clock_nanosleep || nr == SYS_nanosleep;
  }

  int master_ = -1;
  int slave_ = -1;
  std::string slave_path_;
  pid_t guest_ = -1;
};

TEST_F(GuestOnAPty, AResetReadWithTheSavedHostsHangUpIsAnswered) {
  StartGuest();
  Peer host(slave_);
  Frame f;
  ASSERT_TRUE(host.Next(&f));
  EXPECT_EQ(f.type, kMuxHello);
  WriteAll(slave_, Encode(0, kMuxQuiesce));
  ASSERT_TRUE(host.Next(&f));
  EXPECT_EQ(f.type, kMuxQuiesced);

  // A restored guest: the new host's kReset is there when the saved host's hang-up is seen. The
  // guest is stopped meanwhile, so that it reads both at once.
  ASSERT_EQ(::kill(guest_, SIGSTOP), 0);
  int st = 0;
  ASSERT_EQ(::waitpid(guest_, &st, WUNTRACED), guest_);
  ASSERT_TRUE(WIFSTOPPED(st));
  WriteAll(slave_, Encode(0, kMuxReset));
  ::close(slave_);
  slave_ = -1;
  ASSERT_EQ(::kill(guest_, SIGCONT), 0);
  // No event tells that the guest has read the hang-up; its system call does.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kGuardMs);
  while (!GuestAwaitsHost()) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the guest never saw the hang-up";
    std::this_thread::yield();
  }

  Connect();
  host.set_fd(slave_);
  ASSERT_TRUE(host.Next(&f)) << "the kReset read with the hang-up was dropped: no hello";
  EXPECT_EQ(f.type, kMuxHello);
}

}  // namespace
}  // namespace sbx::agent
