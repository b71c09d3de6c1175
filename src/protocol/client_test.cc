#include "protocol/client.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <thread>

namespace sbx::protocol {
namespace {

std::string TempSocketDir() {
  char tmpl[] = "/tmp/sbx-client-test-XXXXXX";
  char* d = ::mkdtemp(tmpl);
  return d ? d : "/tmp";
}

// Runs the real sbx-agent on a socket in a fresh directory.
class AgentProcess {
 public:
  explicit AgentProcess(int start_delay_ms = 0) {
    dir_ = TempSocketDir();
    socket_ = dir_ + "/a.sock";
    pid_ = ::fork();
    if (pid_ == 0) {
      if (start_delay_ms) ::usleep(static_cast<useconds_t>(start_delay_ms) * 1000);
      ::execl(SBX_AGENT_PATH, "sbx-agent", "--listen", socket_.c_str(), nullptr);
      _exit(127);
    }
  }
  ~AgentProcess() {
    ::kill(pid_, SIGTERM);
    int st;
    ::waitpid(pid_, &st, 0);
    ::unlink(socket_.c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& socket() const { return socket_; }

 private:
  std::string dir_, socket_;
  pid_t pid_;
};

TEST(AgentConnection, ConnectRetriesUntilTheAgentListens) {
  AgentProcess agent(/*start_delay_ms=*/200);
  auto conn = AgentConnection::Connect(agent.socket(), 5000);
  ASSERT_TRUE(conn.ok()) << conn.status().message();
  EXPECT_FALSE(conn->agent_version().empty());
}

TEST(AgentConnection, ConnectTimesOutWithoutAnAgent) {
  std::string dir = TempSocketDir();
  auto conn = AgentConnection::Connect(dir + "/none.sock", 100);
  ASSERT_FALSE(conn.ok());
  EXPECT_EQ(conn.status().err(), ENOENT);
  ::rmdir(dir.c_str());
}

TEST(AgentConnection, CallReturnsOkOrTheAgentsError) {
  AgentProcess agent;
  auto conn = AgentConnection::Connect(agent.socket());
  ASSERT_TRUE(conn.ok()) << conn.status().message();
  auto ok = conn->Call(Type::kStat, Writer().Str(Tag::kPath, "/"));
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->fields.Int(Tag::kFileType), static_cast<int64_t>(FileType::kDir));
  auto err = conn->Call(Type::kStat, Writer().Str(Tag::kPath, "/no/such/path"));
  ASSERT_FALSE(err.ok());
  EXPECT_EQ(err.status().err(), ENOENT);
  EXPECT_NE(err.status().message().find("/no/such/path"), std::string::npos);
}

TEST(AgentConnection, EventsArrivingDuringACallAreQueued) {
  AgentProcess agent;
  auto conn = AgentConnection::Connect(agent.socket());
  ASSERT_TRUE(conn.ok());
  auto spawn =
      conn->Call(Type::kSpawn, Writer().Str(Tag::kArgv, "/bin/echo").Str(Tag::kArgv, "hi"));
  ASSERT_TRUE(spawn.ok()) << spawn.status().message();
  uint32_t spawn_id = spawn->id();
  ::usleep(100 * 1000);  // let the output and exit arrive while the next call waits
  std::vector<Frame> entries;
  auto list = conn->Call(Type::kList, Writer().Str(Tag::kPath, "/").Int(Tag::kDepth, 1), &entries);
  ASSERT_TRUE(list.ok()) << list.status().message();
  EXPECT_FALSE(entries.empty());
  std::string out;
  for (;;) {
    auto f = conn->Receive(5000);
    ASSERT_TRUE(f.ok()) << f.status().message();
    ASSERT_EQ(f->id(), spawn_id);
    if (f->type() == Type::kOutput) out += f->fields.Str(Tag::kData);
    if (f->type() == Type::kExit) break;
  }
  EXPECT_EQ(out, "hi\n");
}

TEST(AgentConnection, ReceiveTimesOut) {
  AgentProcess agent;
  auto conn = AgentConnection::Connect(agent.socket());
  ASSERT_TRUE(conn.ok());
  auto f = conn->Receive(50);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().err(), ETIMEDOUT);
}

// A fake agent that answers HELLO and then sends `reply`.
class FakeAgent {
 public:
  explicit FakeAgent(std::string reply) {
    dir_ = TempSocketDir();
    socket_ = dir_ + "/fake.sock";
    listen_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a {};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, socket_.c_str(), sizeof a.sun_path - 1);
    ::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(listen_, 1);
    thread_ = std::thread([this, reply] {
      int c = ::accept(listen_, nullptr, nullptr);
      char buf[64];
      ssize_t n = ::read(c, buf, sizeof buf);  // HELLO
      (void)n;
      std::string hello = EncodeFrame(
          Type::kHello, 1, Writer().Int(Tag::kVersion, ::sbx::protocol::kProtocolVersion));
      std::string all = hello + reply;
      n = ::write(c, all.data(), all.size());
      ::usleep(200 * 1000);
      ::close(c);
    });
  }
  ~FakeAgent() {
    thread_.join();
    ::close(listen_);
    ::unlink(socket_.c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& socket() const { return socket_; }

 private:
  std::string dir_, socket_;
  int listen_;
  std::thread thread_;
};

TEST(AgentConnection, OversizedFrameFromTheAgentIsAnError) {
  std::string bad = EncodeFrame(Type::kOk, 2, std::string_view());
  bad[0] = bad[1] = bad[2] = bad[3] = '\x7f';
  FakeAgent fake(bad);
  auto conn = AgentConnection::Connect(fake.socket());
  ASSERT_TRUE(conn.ok()) << conn.status().message();
  auto f = conn->Receive(2000);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().err(), EPROTO);
}

TEST(AgentConnection, MalformedPayloadFromTheAgentIsAnError) {
  FakeAgent fake(EncodeFrame(Type::kOk, 2, std::string_view("\x01\x00\xff\xff\xff\x00", 6)));
  auto conn = AgentConnection::Connect(fake.socket());
  ASSERT_TRUE(conn.ok());
  auto f = conn->Receive(2000);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().err(), EPROTO);
}

TEST(AgentConnection, ClosedConnectionIsReported) {
  FakeAgent fake("");
  auto conn = AgentConnection::Connect(fake.socket());
  ASSERT_TRUE(conn.ok());
  auto f = conn->Receive(2000);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().err(), ECONNRESET);
}

TEST(Frame, SurvivesMoves) {
  Frame a;
  a.payload = Writer().Str(Tag::kPath, "/x").payload();
  ASSERT_TRUE(a.fields.Parse(a.payload));
  Frame b(std::move(a));
  std::vector<Frame> v;
  v.push_back(std::move(b));
  for (int i = 0; i < 20; ++i) v.emplace_back();  // force reallocation
  EXPECT_EQ(v[0].fields.Str(Tag::kPath), "/x");
}

}  // namespace
}  // namespace sbx::protocol
