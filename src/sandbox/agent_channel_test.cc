// AgentChannel against the real sbx-agent (started with --listen on a temporary socket), driven
// from coroutines on an io_context with two threads, as the daemon runs it.
#include "sandbox/agent_channel.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>

namespace sbx::sandbox {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using protocol::Frame;
using protocol::Tag;
using protocol::Type;
using protocol::Writer;
using Clock = std::chrono::steady_clock;

// ASSERT_* returns, which a coroutine cannot: fail and co_return instead.
#define CO_ASSERT_OK(expr)                                               \
  do {                                                                   \
    const auto& co_assert_r_ = (expr);                                   \
    if (!co_assert_r_.ok()) {                                            \
      ADD_FAILURE() << #expr << ": " << co_assert_r_.status().message(); \
      co_return;                                                         \
    }                                                                    \
  } while (0)
#define CO_ASSERT_TRUE(cond)             \
  do {                                   \
    if (!(cond)) {                       \
      ADD_FAILURE() << "failed: " #cond; \
      co_return;                         \
    }                                    \
  } while (0)

asio::awaitable<void> Sleep(Clock::duration d) {
  asio::steady_timer t(co_await asio::this_coro::executor, d);
  co_await t.async_wait(asio::use_awaitable);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A SPAWN payload. (Variadic: GCC 12 rejects braced lists in an expression that co_awaits.)
template <typename... Args>
Writer SpawnArgs(const Args&... argv) {
  Writer w;
  (w.Str(Tag::kArgv, argv), ...);
  return w;
}

class AgentChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-chan-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    socket_ = dir_ + "/a.sock";
    agent_ = ::fork();
    ASSERT_GE(agent_, 0);
    if (agent_ == 0) {
      ::execl(SBX_AGENT_BIN, "sbx-agent", "--listen", socket_.c_str(), nullptr);
      _exit(127);
    }
  }

  void TearDown() override {
    if (agent_ > 0) {
      ::kill(agent_, SIGKILL);
      ::waitpid(agent_, nullptr, 0);
    }
    std::filesystem::remove_all(dir_);
  }

  // Runs `body` on an io_context with two threads. When it ends (or after a minute), every
  // channel it connected is closed so that the context runs out of work.
  void Run(std::function<asio::awaitable<void>()> body) {
    asio::io_context ioc;
    asio::steady_timer watchdog(ioc, 120s);
    watchdog.async_wait([&](boost::system::error_code ec) {
      if (ec) return;
      ADD_FAILURE() << "test timed out";
      CloseAll();
      ioc.stop();
    });
    asio::co_spawn(ioc, body(), [&](std::exception_ptr e) {
      if (e) ADD_FAILURE() << "test coroutine threw";
      CloseAll();
      watchdog.cancel();
    });
    std::thread other([&] { ioc.run(); });
    ioc.run();
    other.join();
    std::lock_guard lock(mu_);
    channels_.clear();
  }

  asio::awaitable<Result<std::shared_ptr<AgentChannel>>> Connect() {
    auto ch = co_await AgentChannel::Connect(co_await asio::this_coro::executor, socket_, 5s);
    if (ch.ok()) {
      std::lock_guard lock(mu_);
      channels_.push_back(*ch);
    }
    co_return ch;
  }

  void CloseAll() {
    std::lock_guard lock(mu_);
    for (auto& c : channels_) c->Close();
  }

  std::string dir_, socket_;
  pid_t agent_ = -1;
  std::mutex mu_;
  std::vector<std::shared_ptr<AgentChannel>> channels_;
};

// Pulls a process's frames until EXIT: stdout bytes (checked to be contiguous), exit code.
struct ProcessResult {
  Status status;
  std::string out;
  int64_t exit_code = -2;
  int64_t pid = 0;
};
asio::awaitable<ProcessResult> Drain(Subscription& sub, Clock::duration pause = {}) {
  ProcessResult r;
  for (;;) {
    auto f = co_await sub.Next(10s);
    if (!f.ok()) {
      r.status = f.status();
      co_return r;
    }
    if (f->type() == Type::kOk) {
      r.pid = f->fields.Int(Tag::kPid);
    } else if (f->type() == Type::kError) {
      r.status = Status::Error("spawn", static_cast<int>(f->fields.Int(Tag::kErrno)));
      co_return r;
    } else if (f->type() == Type::kOutput && f->fields.Int(Tag::kStream) == 1) {
      if (f->fields.Int(Tag::kOffset, -1) != static_cast<int64_t>(r.out.size())) {
        r.status = Status::Error("output gap at " + std::to_string(r.out.size()), EIO);
        co_return r;
      }
      r.out += f->fields.Str(Tag::kData);
    } else if (f->type() == Type::kExit) {
      r.exit_code = f->fields.Int(Tag::kExitCode, -2);
      co_return r;
    }
    if (pause.count()) co_await Sleep(pause);
  }
}

// Helpers for coroutines spawned detached. They take everything as parameters, never as lambda
// captures: a capturing lambda's closure dies with the co_spawn() expression, while its coroutine
// goes on running.

// How a detached waiter ended; shared, so that it may outlive the test body on a failure path.
struct Outcome {
  std::atomic<int> err{0};
  std::atomic<Clock::rep> when{0};
  Clock::time_point time() const { return Clock::time_point(Clock::duration(when.load())); }
  void Set(int e) {
    when = Clock::now().time_since_epoch().count();
    err = e;
  }
};

// Takes frames until Next() fails.
asio::awaitable<void> WaitForError(std::shared_ptr<Subscription> sub,
                                   std::shared_ptr<Outcome> out) {
  for (;;) {
    auto f = co_await sub->Next(20s);
    if (f.ok()) continue;
    out->Set(f.status().err());
    co_return;
  }
}

asio::awaitable<void> CallAndWait(std::shared_ptr<AgentChannel> channel,
                                  std::shared_ptr<Outcome> out) {
  auto r = co_await channel->Call(Type::kStat, Writer().Str(Tag::kPath, "/"), nullptr, 20s);
  out->Set(r.ok() ? -1 : r.status().err());
}

// Runs `echo i`; `out` and `left` belong to the test body, which waits for `left` to reach 0.
asio::awaitable<void> SpawnEcho(std::shared_ptr<AgentChannel> channel, int i, ProcessResult* out,
                                std::atomic<int>* left) {
  auto sub = co_await channel->Open(Type::kSpawn,
                                    SpawnArgs("/bin/sh", "-c", "echo $0", std::to_string(i)));
  if (!sub.ok()) {
    out->status = sub.status();
  } else {
    *out = co_await Drain(**sub);
  }
  --*left;
}

TEST_F(AgentChannelTest, ConnectToAMissingSocketFailsAfterTheTimeout) {
  Run([&]() -> asio::awaitable<void> {
    auto start = Clock::now();
    auto ch = co_await AgentChannel::Connect(co_await asio::this_coro::executor,
                                             dir_ + "/none.sock", 300ms);
    auto took = Clock::now() - start;
    CO_ASSERT_TRUE(!ch.ok());
    EXPECT_EQ(ch.status().err(), ENOENT);
    EXPECT_GE(took, 300ms);
    EXPECT_LT(took, 2s);
  });
}

TEST_F(AgentChannelTest, CallReturnsOkOrTheAgentsError) {
  Run([&]() -> asio::awaitable<void> {
    auto ch = co_await Connect();
    CO_ASSERT_OK(ch);
    EXPECT_FALSE((*ch)->agent_version().empty());

    auto st = co_await (*ch)->Call(Type::kStat, Writer().Str(Tag::kPath, dir_));
    CO_ASSERT_OK(st);
    EXPECT_EQ(st->fields.Int(Tag::kFileType), static_cast<int64_t>(protocol::FileType::kDir));

    auto mk = co_await (*ch)->Call(Type::kMkdir,
                                   Writer().Str(Tag::kPath, dir_ + "/sub").Int(Tag::kMode, 0750));
    CO_ASSERT_OK(mk);
    struct stat s;
    EXPECT_EQ(::stat((dir_ + "/sub").c_str(), &s), 0);

    auto missing = co_await (*ch)->Call(Type::kStat, Writer().Str(Tag::kPath, dir_ + "/nope"));
    CO_ASSERT_TRUE(!missing.ok());
    EXPECT_EQ(missing.status().err(), ENOENT);
    EXPECT_NE(missing.status().message().find(dir_ + "/nope"), std::string::npos);

    auto orphan = co_await (*ch)->Call(Type::kMkdir, Writer().Str(Tag::kPath, dir_ + "/x/y/z"));
    CO_ASSERT_TRUE(!orphan.ok());
    EXPECT_EQ(orphan.status().err(), ENOENT);

    std::vector<Frame> entries;
    auto list = co_await (*ch)->Call(Type::kList, Writer().Str(Tag::kPath, dir_), &entries);
    CO_ASSERT_OK(list);
    bool found = false;
    for (auto& e : entries) found |= e.fields.Str(Tag::kName) == "sub";
    EXPECT_TRUE(found);
  });
}

TEST_F(AgentChannelTest, SlowConsumerGetsEveryByteWithBoundedMemoryAndStallsNoOne) {
  constexpr size_t kBytes = 20000000;
  Run([&]() -> asio::awaitable<void> {
    auto ch = co_await Connect();
    CO_ASSERT_OK(ch);
    auto sub = co_await (*ch)->Open(Type::kSpawn,
                                    SpawnArgs("head", "-c", std::to_string(kBytes), "/dev/zero"));
    CO_ASSERT_OK(sub);
    // Nobody reads the output for a while: the subscription fills and is paused, and the rest of
    // the channel goes on (before flow control, this call waited for the consumer).
    co_await Sleep(500ms);
    auto st = co_await (*ch)->Call(Type::kStat, Writer().Str(Tag::kPath, "/"), nullptr, 5s);
    CO_ASSERT_OK(st);
    EXPECT_GE((*ch)->buffered_bytes(), AgentChannel::kPauseBytes);
    EXPECT_LE((*ch)->buffered_bytes(), AgentChannel::kSubscriptionBufferBytes);
    // Then slowly, then at full speed.
    ProcessResult r;
    size_t frames = 0;
    for (;;) {
      auto f = co_await (*sub)->Next(10s);
      CO_ASSERT_OK(f);
      ++frames;
      EXPECT_LE((*ch)->buffered_bytes(), AgentChannel::kSubscriptionBufferBytes);
      if (f->type() == Type::kOutput) {
        CO_ASSERT_TRUE(f->fields.Int(Tag::kOffset, -1) == static_cast<int64_t>(r.out.size()));
        auto data = f->fields.Str(Tag::kData);
        CO_ASSERT_TRUE(data.find_first_not_of('\0') == std::string_view::npos);
        r.out += data;
      } else if (f->type() == Type::kExit) {
        r.exit_code = f->fields.Int(Tag::kExitCode, -2);
        break;
      }
      co_await Sleep(2ms);
    }
    EXPECT_EQ(r.out.size(), kBytes);
    EXPECT_EQ(r.exit_code, 0);
    std::printf("%zu frames, peak %zu bytes buffered\n", frames, (*ch)->peak_buffered_bytes());
    // The consumer was slow enough for flow control to engage, and the bound held.
    EXPECT_GE((*ch)->peak_buffered_bytes(), AgentChannel::kPauseBytes);
    EXPECT_LE((*ch)->peak_buffered_bytes(), AgentChannel::kSubscriptionBufferBytes);
  });
}

TEST_F(AgentChannelTest, ConcurrentSpawnsEachGetTheirOwnOutput) {
  constexpr int kProcs = 50;
  Run([&]() -> asio::awaitable<void> {
    auto ch = co_await Connect();
    CO_ASSERT_OK(ch);
    auto channel = *ch;
    std::atomic<int> left{kProcs};
    std::vector<ProcessResult> results(kProcs);
    auto ex = co_await asio::this_coro::executor;
    for (int i = 0; i < kProcs; ++i) {
      asio::co_spawn(ex, SpawnEcho(channel, i, &results[i], &left), asio::detached);
    }
    while (left > 0) co_await Sleep(5ms);
    for (int i = 0; i < kProcs; ++i) {
      EXPECT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.message();
      EXPECT_EQ(results[i].out, std::to_string(i) + "\n");
      EXPECT_EQ(results[i].exit_code, 0);
      EXPECT_GT(results[i].pid, 0);
    }
    EXPECT_EQ(channel->buffered_bytes(), 0u);
  });
}

TEST_F(AgentChannelTest, ReadStreamsALargeFileInChunks) {
  constexpr size_t kBytes = 10u << 20;
  std::string content(kBytes, '\0');
  uint32_t x = 12345;
  for (auto& c : content) c = static_cast<char>((x = x * 1103515245 + 12345) >> 24);
  std::string path = dir_ + "/big";
  std::ofstream(path, std::ios::binary) << content;
  Run([&]() -> asio::awaitable<void> {
    auto ch = co_await Connect();
    CO_ASSERT_OK(ch);
    auto sub = co_await (*ch)->Open(Type::kRead, Writer().Str(Tag::kPath, path));
    CO_ASSERT_OK(sub);
    std::string got;
    size_t chunks = 0;
    for (;;) {
      auto f = co_await (*sub)->Next(10s);
      CO_ASSERT_OK(f);
      if (f->type() == Type::kData) {
        CO_ASSERT_TRUE(f->fields.Int(Tag::kOffset, -1) == static_cast<int64_t>(got.size()));
        auto data = f->fields.Str(Tag::kData);
        EXPECT_LE(data.size(), protocol::kMaxChunk);
        got += data;
        ++chunks;
        continue;
      }
      CO_ASSERT_TRUE(f->type() == Type::kOk);
      EXPECT_EQ(f->fields.Int(Tag::kSize), static_cast<int64_t>(kBytes));
      break;
    }
    EXPECT_GE(chunks, kBytes / protocol::kMaxChunk);
    EXPECT_TRUE(got == content);
  });
}

TEST_F(AgentChannelTest, WritesAFileWithSendAndCall) {
  constexpr size_t kBytes = 3u << 20;
  std::string content(kBytes, '\0');
  for (size_t i = 0; i < kBytes; ++i) content[i] = static_cast<char>(i * 7 + i / 1000);
  std::string path = dir_ + "/new/file.bin";
  Run([&]() -> asio::awaitable<void> {
    auto ch = co_await Connect();
    CO_ASSERT_OK(ch);
    uint32_t id = (*ch)->NextId();
    auto begin = co_await (*ch)->CallWithId(
        Type::kWriteBegin, id,
        Writer().Str(Tag::kPath, path).Int(Tag::kMode, 0600).Int(Tag::kParents, 1));
    CO_ASSERT_OK(begin);
    for (size_t off = 0; off < kBytes; off += protocol::kMaxChunk) {
      std::string_view chunk = std::string_view(content).substr(off, protocol::kMaxChunk);
      Status sent = co_await (*ch)->Send(Type::kWriteData, id, Writer().Str(Tag::kData, chunk));
      CO_ASSERT_TRUE(sent.ok());
    }
    auto end = co_await (*ch)->CallWithId(Type::kWriteEnd, id, Writer());
    CO_ASSERT_OK(end);
    EXPECT_EQ(end->fields.Int(Tag::kSize), static_cast<int64_t>(kBytes));
    // Ending it twice: the agent has no open write under that id any more.
    auto again = co_await (*ch)->CallWithId(Type::kWriteEnd, id, Writer());
    EXPECT_EQ(again.status().err(), EBADF);
  });
  EXPECT_TRUE(ReadFile(path) == content);
  struct stat s;
  ASSERT_EQ(::stat(path.c_str(), &s), 0);
  EXPECT_EQ(s.st_mode & 07777, 0600u);
}

TEST_F(AgentChannelTest, WatchDeliversEventsUntilUnwatched) {
  Run([&]() -> asio::awaitable<void> {
    auto ch = co_await Connect();
    CO_ASSERT_OK(ch);
    auto sub = co_await (*ch)->Open(Type::kWatch, Writer().Str(Tag::kPath, dir_));
    CO_ASSERT_OK(sub);
    auto ok = co_await (*sub)->Next(5s);
    CO_ASSERT_OK(ok);
    CO_ASSERT_TRUE(ok->type() == Type::kOk);
    // Nothing happened yet.
    auto none = co_await (*sub)->Next(50ms);
    EXPECT_EQ(none.status().err(), ETIMEDOUT);

    std::ofstream(dir_ + "/hello.txt") << "hi";
    bool created = false, written = false;
    while (!(created && written)) {
      auto ev = co_await (*sub)->Next(5s);
      CO_ASSERT_OK(ev);
      CO_ASSERT_TRUE(ev->type() == Type::kWatchEvent);
      EXPECT_EQ(ev->fields.Str(Tag::kName), "hello.txt");
      auto event = static_cast<protocol::WatchEvent>(ev->fields.Int(Tag::kEvent));
      created |= event == protocol::WatchEvent::kCreate;
      written |= event == protocol::WatchEvent::kWrite;
    }

    // UNWATCH answers under the WATCH's id, which is busy while subscribed.
    uint32_t id = (*sub)->id();
    auto busy = co_await (*ch)->CallWithId(Type::kUnwatch, id, Writer());
    EXPECT_EQ(busy.status().err(), EBUSY);
    (*sub)->Cancel();
    auto next = co_await (*sub)->Next(1s);
    EXPECT_EQ(next.status().err(), ECANCELED);
    auto unwatch = co_await (*ch)->CallWithId(Type::kUnwatch, id, Writer());
    EXPECT_TRUE(unwatch.ok()) << unwatch.status().message();
  });
}

TEST_F(AgentChannelTest, CancelMidStreamLeavesOthersAlone) {
  Run([&]() -> asio::awaitable<void> {
    auto ch = co_await Connect();
    CO_ASSERT_OK(ch);
    auto channel = *ch;
    // A big stream nobody reads fills its subscription (and is paused)...
    auto big =
        co_await channel->Open(Type::kSpawn, SpawnArgs("head", "-c", "50000000", "/dev/zero"));
    CO_ASSERT_OK(big);
    auto small = co_await channel->Open(
        Type::kSpawn, SpawnArgs("/bin/sh", "-c", "sleep 0.2; echo one; echo two"));
    CO_ASSERT_OK(small);
    // ...and a waiter on it is woken by Cancel() from elsewhere.
    auto first = co_await (*big)->Next(5s);
    CO_ASSERT_OK(first);
    auto woken = std::make_shared<Outcome>();
    auto ex = co_await asio::this_coro::executor;
    auto waiter = *big;
    while (channel->buffered_bytes() < AgentChannel::kPauseBytes) co_await Sleep(5ms);
    // Take frames until the buffer is empty, so that the next Next() really waits.
    for (;;) {
      auto f = co_await waiter->Next(200ms);
      if (!f.ok()) break;
    }
    asio::co_spawn(ex, WaitForError(waiter, woken), asio::detached);
    co_await Sleep(20ms);
    waiter->Cancel();
    for (int i = 0; i < 200 && woken->err == 0; ++i) co_await Sleep(5ms);
    EXPECT_EQ(woken->err.load(), ECANCELED);

    auto r = co_await Drain(**small);
    EXPECT_TRUE(r.status.ok()) << r.status.message();
    EXPECT_EQ(r.out, "one\ntwo\n");
    EXPECT_EQ(r.exit_code, 0);
    auto stat = co_await channel->Call(Type::kStat, Writer().Str(Tag::kPath, "/"));
    EXPECT_TRUE(stat.ok()) << stat.status().message();
    // The cancelled stream's frames are discarded as they come, not buffered.
    co_await Sleep(100ms);
    EXPECT_EQ(channel->buffered_bytes(), 0u);
  });
}

TEST_F(AgentChannelTest, KilledAgentFailsEveryWaiterPromptly) {
  Run([&]() -> asio::awaitable<void> {
    auto ch = co_await Connect();
    CO_ASSERT_OK(ch);
    auto channel = *ch;
    auto ex = co_await asio::this_coro::executor;
    // A stream being consumed, a process that will not exit soon, a watch with no events, and
    // a call the stopped agent never answers.
    auto stream = co_await channel->Open(Type::kSpawn,
                                         SpawnArgs("/bin/sh", "-c", "while :; do echo line; done"));
    CO_ASSERT_OK(stream);
    auto sleeper =
        co_await channel->Open(Type::kSpawn, SpawnArgs("sleep", "3").Int(Tag::kTimeoutMs, 5000));
    CO_ASSERT_OK(sleeper);
    auto watch = co_await channel->Open(Type::kWatch, Writer().Str(Tag::kPath, dir_));
    CO_ASSERT_OK(watch);

    std::vector<std::shared_ptr<Outcome>> outs;
    for (auto& sub : {*stream, *sleeper, *watch}) {
      outs.push_back(std::make_shared<Outcome>());
      asio::co_spawn(ex, WaitForError(sub, outs.back()), asio::detached);
    }
    co_await Sleep(100ms);
    ::kill(agent_, SIGSTOP);
    co_await Sleep(50ms);
    outs.push_back(std::make_shared<Outcome>());
    asio::co_spawn(ex, CallAndWait(channel, outs.back()), asio::detached);
    co_await Sleep(100ms);
    auto finished = [&] {
      return std::count_if(outs.begin(), outs.end(), [](auto& o) { return o->err != 0; });
    };
    EXPECT_EQ(finished(), 0);
    auto killed = Clock::now();
    ::kill(agent_, SIGKILL);
    for (int i = 0; i < 400 && finished() < 4; ++i) co_await Sleep(5ms);
    for (size_t i = 0; i < outs.size(); ++i) {
      EXPECT_EQ(outs[i]->err.load(), ECONNRESET) << i;
      EXPECT_LT(outs[i]->time() - killed, 1s) << i;
    }
    EXPECT_TRUE(channel->closed());
    auto late = co_await channel->Call(Type::kStat, Writer().Str(Tag::kPath, "/"));
    EXPECT_EQ(late.status().err(), ECONNRESET);
    auto late_open = co_await channel->Open(Type::kWatch, Writer().Str(Tag::kPath, "/"));
    EXPECT_EQ(late_open.status().err(), ECONNRESET);
  });
}

TEST_F(AgentChannelTest, CallTimesOutAndTheChannelStaysUsable) {
  Run([&]() -> asio::awaitable<void> {
    auto ch = co_await Connect();
    CO_ASSERT_OK(ch);
    ::kill(agent_, SIGSTOP);
    auto start = Clock::now();
    auto r = co_await (*ch)->Call(Type::kStat, Writer().Str(Tag::kPath, "/"), nullptr, 200ms);
    auto took = Clock::now() - start;
    ::kill(agent_, SIGCONT);
    EXPECT_EQ(r.status().err(), ETIMEDOUT);
    EXPECT_GE(took, 200ms);
    EXPECT_LT(took, 2s);
    // The late reply is discarded; the next call gets its own.
    auto ok = co_await (*ch)->Call(Type::kStat, Writer().Str(Tag::kPath, dir_));
    CO_ASSERT_OK(ok);
    EXPECT_EQ(ok->fields.Int(Tag::kFileType), static_cast<int64_t>(protocol::FileType::kDir));
  });
}

TEST_F(AgentChannelTest, CloseFailsWaitersWithConnReset) {
  Run([&]() -> asio::awaitable<void> {
    auto ch = co_await Connect();
    CO_ASSERT_OK(ch);
    auto watch = co_await (*ch)->Open(Type::kWatch, Writer().Str(Tag::kPath, dir_));
    CO_ASSERT_OK(watch);
    auto ok = co_await (*watch)->Next(5s);
    CO_ASSERT_OK(ok);
    auto out = std::make_shared<Outcome>();
    asio::co_spawn(co_await asio::this_coro::executor, WaitForError(*watch, out), asio::detached);
    co_await Sleep(20ms);
    (*ch)->Close();
    EXPECT_TRUE((*ch)->closed());
    for (int i = 0; i < 200 && out->err == 0; ++i) co_await Sleep(5ms);
    EXPECT_EQ(out->err.load(), ECONNRESET);
  });
}

// Reads one whole frame from a blocking socket (the fake agent's side).
bool ReadFrame(int fd, protocol::Header* h) {
  char head[protocol::kHeaderSize];
  if (::recv(fd, head, sizeof head, MSG_WAITALL) != static_cast<ssize_t>(sizeof head)) return false;
  if (!protocol::DecodeHeader(head, h)) return false;
  std::string payload(h->len, '\0');
  return h->len == 0 || ::recv(fd, payload.data(), h->len, MSG_WAITALL) == h->len;
}

// A fake agent that answers HELLO, then answers the next request with `garbage`.
void ServeGarbage(const std::string& socket_path, std::string garbage) {
  int lfd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a {};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, socket_path.c_str(), sizeof a.sun_path - 1);
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(lfd, 1) != 0) {
    ::close(lfd);
    return;
  }
  int fd = ::accept(lfd, nullptr, nullptr);
  protocol::Header h;
  if (fd >= 0 && ReadFrame(fd, &h)) {
    std::string hello = protocol::EncodeFrame(
        Type::kHello, h.id,
        Writer().Int(Tag::kVersion, protocol::kProtocolVersion).Str(Tag::kAgentVersion, "fake"));
    (void)!::write(fd, hello.data(), hello.size());
    if (ReadFrame(fd, &h)) {
      std::string_view g = garbage;
      std::string bytes(g.substr(0, 4));
      bytes.append(g.substr(4, 4));
      uint32_t id = h.id;  // the reply carries the request's id, little endian
      for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>(id >> (8 * i)));
      bytes.append(g.substr(8));
      (void)!::write(fd, bytes.data(), bytes.size());
      char c;
      (void)!::read(fd, &c, 1);  // until the channel hangs up
    }
  }
  if (fd >= 0) ::close(fd);
  ::close(lfd);
}

TEST_F(AgentChannelTest, CorruptStreamClosesTheChannel) {
  // Header without its id (the fake agent inserts the request's): len, type, flags.
  auto header = [](uint32_t len, Type type) {
    std::string h;
    for (int i = 0; i < 4; ++i) h.push_back(static_cast<char>(len >> (8 * i)));
    h.push_back(static_cast<char>(static_cast<uint16_t>(type) & 0xff));
    h.push_back(static_cast<char>(static_cast<uint16_t>(type) >> 8));
    h.append(2, '\0');
    return h;
  };
  std::string oversized = header(protocol::kMaxPayload + 1, Type::kOk);
  // A field announcing 100 bytes in a 6-byte payload.
  std::string malformed = header(6, Type::kOk) + std::string("\x30\x00\x64\x00\x00\x00", 6);
  for (const std::string& garbage : {oversized, malformed}) {
    std::string path = dir_ + "/fake.sock";
    ::unlink(path.c_str());
    std::thread fake(ServeGarbage, path, garbage);
    Run([&]() -> asio::awaitable<void> {
      auto ch = co_await AgentChannel::Connect(co_await asio::this_coro::executor, path, 5s);
      CO_ASSERT_OK(ch);
      EXPECT_EQ((*ch)->agent_version(), "fake");
      auto r = co_await (*ch)->Call(Type::kStat, Writer().Str(Tag::kPath, "/"), nullptr, 5s);
      EXPECT_EQ(r.status().err(), EPROTO) << r.status().message();
      EXPECT_TRUE((*ch)->closed());
    });
    fake.join();
  }
}

TEST_F(AgentChannelTest, OneNextAtATime) {
  Run([&]() -> asio::awaitable<void> {
    auto ch = co_await Connect();
    CO_ASSERT_OK(ch);
    auto sub = co_await (*ch)->Open(Type::kSpawn, SpawnArgs("sleep", "0.3"));
    CO_ASSERT_OK(sub);
    auto ok = co_await (*sub)->Next(5s);
    CO_ASSERT_OK(ok);
    asio::co_spawn(co_await asio::this_coro::executor,
                   WaitForError(*sub, std::make_shared<Outcome>()), asio::detached);
    co_await Sleep(50ms);
    auto busy = co_await (*sub)->Next(5s);
    EXPECT_EQ(busy.status().err(), EBUSY);
  });
}

}  // namespace
}  // namespace sbx::sandbox
