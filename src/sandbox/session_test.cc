// Session against a real sbx-agent: a Manager (real SQLite store, real template store) whose
// runtime starts each "box" as an sbx-agent process listening on a unix socket, outside any
// namespace (as agent_channel_test does), so the session's frames, merges and waits meet the
// agent itself. Coroutines run on an io_context with two threads, as the daemon runs them.
// Nothing waits by sleeping: a slow reader is a process in the box; an audit event is waited for
// by re-reading the store until it is there (bounded).
#include "sandbox/session.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <thread>

#include "common/fs.h"
#include "sandbox/agent_channel.h"
#include "sandbox/manager.h"

namespace sbx::sandbox {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using nlohmann::json;

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

// Boxes that are sbx-agent processes on the host.
class AgentRuntime : public runtime::Runtime {
 public:
  explicit AgentRuntime(std::string dir) : dir_(std::move(dir)) {}
  ~AgentRuntime() override {
    for (auto& [id, pid] : pids_) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  Result<runtime::Box> Create(const runtime::BoxSpec& spec) override {
    std::string sock = dir_ + "/" + spec.id + ".sock";
    pid_t pid = ::fork();
    if (pid < 0) return Status::Errno("fork");
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a test that dies leaves no agent behind
      ::execl(SBX_AGENT_BIN, "sbx-agent", "--listen", sock.c_str(), nullptr);
      _exit(127);
    }
    std::lock_guard<std::mutex> l(mu_);
    pids_[spec.id] = pid;
    runtime::Box b;
    b.id = spec.id;
    b.init_pid = pid;
    b.agent_socket = sock;
    b.dir = dir_;
    return b;
  }
  Status Freeze(const runtime::Box& b) override { return Signal(b, SIGSTOP); }
  Status Thaw(const runtime::Box& b) override { return Signal(b, SIGCONT); }
  Result<runtime::BoxStats> Stats(const runtime::Box&) override { return runtime::BoxStats{}; }
  // The host's loopback stands in for the box's.
  Result<UniqueFd> OpenSocket(const runtime::Box&, int domain, int type) override {
    UniqueFd fd(::socket(domain, type | SOCK_CLOEXEC, 0));
    if (!fd) return Status::Errno("socket");
    return fd;
  }
  std::optional<std::string> AgentExit(const runtime::Box&) override { return std::nullopt; }
  Status Destroy(const runtime::Box& b) override {
    pid_t pid = -1;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = pids_.find(b.id);
      if (it == pids_.end()) return {};
      pid = it->second;
      pids_.erase(it);
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return {};
  }
  Result<int> ReapOrphans(const std::string&) override { return 0; }
  Result<runtime::Box> Adopt(const std::string& id) override {
    return Status::Error("adopt " + id + ": no", ESRCH);
  }
  Result<std::vector<std::string>> ListBoxes() override { return std::vector<std::string>{}; }
  pid_t AgentPid(const std::string& id) {
    std::lock_guard<std::mutex> l(mu_);
    return pids_.count(id) ? pids_[id] : -1;
  }

 private:
  Status Signal(const runtime::Box& b, int sig) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = pids_.find(b.id);
    if (it == pids_.end()) return Status::Error("no box " + b.id, ESRCH);
    ::kill(it->second, sig);
    return {};
  }
  std::string dir_;
  std::mutex mu_;
  std::map<std::string, pid_t> pids_;
};

asio::awaitable<void> Sleep(std::chrono::steady_clock::duration d) {
  asio::steady_timer t(co_await asio::this_coro::executor, d);
  co_await t.async_wait(asio::use_awaitable);
}

long VmRssKb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

struct Ran {
  std::string out, err;
  ProcessEvent exit;
  Status status;
};

// Follows a process to its end.
asio::awaitable<Ran> Collect(Process& p) {
  Ran r;
  for (;;) {
    auto e = co_await p.Next(30s);
    if (!e.ok()) {
      r.status = e.status();
      co_return r;
    }
    if (e->kind == ProcessEvent::Kind::kOutput) {
      (e->stream == 2 ? r.err : r.out) += e->data;
      continue;
    }
    if (e->kind == ProcessEvent::Kind::kError) r.status = e->error;
    r.exit = *e;
    co_return r;
  }
}

class SessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-session-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ::chmod(dir_.c_str(), 0755);  // other users (nobody) reach what the tests make below it
    rt_ = std::make_unique<AgentRuntime>(dir_);
    auto st = store::Store::Open(dir_ + "/sbx.db");
    ASSERT_TRUE(st.ok()) << st.status().message();
    store_ = std::move(*st);
    auto k = store_->CreateApiKey("tenant", 0, 0);
    ASSERT_TRUE(k.ok()) << k.status().message();
    key_ = k->record;
    ManagerConfig c;
    storage::TemplateStore ts;
    ts.dir = dir_ + "/templates";
    manager_ = std::make_unique<Manager>(c, *rt_, ts, *store_);
  }
  void TearDown() override {
    manager_.reset();
    rt_.reset();
    store_.reset();
    (void)RemoveTree(dir_);
  }

  // A sandbox whose record carries `defaults` (as a template with them would give) and `env`.
  std::string Create(const TemplateDefaults* defaults = nullptr,
                     std::map<std::string, std::string> env = {}) {
    CreateRequest r;
    r.env = std::move(env);
    auto rec = manager_->Create(key_, r);
    EXPECT_TRUE(rec.ok()) << rec.status().message();
    if (!rec.ok()) return "";
    created_.push_back(rec->id);
    if (defaults) {
      store::SandboxRecord changed = *rec;
      changed.defaults = *defaults;
      EXPECT_TRUE(store_->PutSandbox(changed).ok());
    }
    return rec->id;
  }

  // Runs `body` on an io_context with two threads. When it ends, the test's sandboxes are killed,
  // so their channels close and every coroutine still waiting on them (WAIT watchers) ends, and
  // the context runs out of work before it is destroyed (channels live on its strands).
  void Run(std::function<asio::awaitable<void>()> body) {
    asio::io_context ioc;
    asio::steady_timer watchdog(ioc, 120s);
    watchdog.async_wait([&](boost::system::error_code ec) {
      if (ec) return;
      ADD_FAILURE() << "test timed out";
      ioc.stop();
    });
    bool done = false;
    asio::co_spawn(ioc, body(), [&](std::exception_ptr e) {
      if (e) ADD_FAILURE() << "test coroutine threw";
      done = true;
      for (const auto& id : created_) (void)manager_->Kill(key_, id);
      watchdog.cancel();
    });
    std::thread other([&] { ioc.run(); });
    ioc.run();
    other.join();
    EXPECT_TRUE(done);
  }

  asio::awaitable<Result<std::shared_ptr<Session>>> Open(const std::string& id) {
    co_return co_await Session::Open(*manager_, key_, id, "test");
  }

  std::vector<store::AuditEvent> Events(const std::string& id, const std::string& type) {
    store::AuditQuery q;
    q.sandbox_id = id;
    q.type = type;
    auto ev = store_->QueryAudit(q);
    return ev.ok() ? *ev : std::vector<store::AuditEvent>{};
  }
  // The events of `type` once there is one for `pid` (bounded: 30 s).
  asio::awaitable<std::vector<store::AuditEvent>> AwaitEvent(const std::string& id,
                                                             const std::string& type, int64_t pid) {
    auto deadline = std::chrono::steady_clock::now() + 30s;
    for (;;) {
      auto ev = Events(id, type);
      for (const auto& e : ev)
        if (e.detail.value("pid", int64_t{0}) == pid) co_return ev;
      if (std::chrono::steady_clock::now() > deadline) co_return ev;
      co_await Sleep(5ms);
    }
  }

  std::string dir_;
  std::unique_ptr<AgentRuntime> rt_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<Manager> manager_;
  store::ApiKeyRecord key_;
  std::vector<std::string> created_;
};

// ---- SpawnRequest: the one merge ----

std::vector<std::string> Envs(const protocol::Writer& w) {
  protocol::Reader r;
  EXPECT_TRUE(r.Parse(w.payload()));
  std::vector<std::string> out;
  for (auto e : r.All(protocol::Tag::kEnv)) out.emplace_back(e);
  return out;
}

TEST(SpawnRequestTest, CommandOverSandboxOverTemplateAndNoPathOfItsOwn) {
  TemplateDefaults d{{"A=template", "B=template", "C=template", "junk"}, "user", "/work"};
  CommandSpec spec;
  spec.argv = {"env"};
  spec.env = {{"A", "command"}};
  auto w = SpawnRequest(d, {{"A", "sandbox"}, {"B", "sandbox"}}, spec);
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(Envs(*w), (std::vector<std::string>{"A=command", "B=sandbox", "C=template"}));
  protocol::Reader r;
  ASSERT_TRUE(r.Parse(w->payload()));
  EXPECT_EQ(r.Str(protocol::Tag::kUser), "user");
  EXPECT_EQ(r.Str(protocol::Tag::kCwd), "/work");
  EXPECT_FALSE(r.Has(protocol::Tag::kStdinOpen));

  spec.user = "root";  // root is not looked up (a rootfs without passwd still runs)
  spec.cwd = "src";    // relative: the agent puts it below the home
  spec.pty = PtySize{10, 20};
  w = SpawnRequest(d, {}, spec);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(r.Parse(w->payload()));
  EXPECT_FALSE(r.Has(protocol::Tag::kUser));
  EXPECT_EQ(r.Str(protocol::Tag::kCwd), "src");
  EXPECT_EQ(r.Int(protocol::Tag::kStdinOpen), 1);  // a terminal always has input
  EXPECT_EQ(r.Int(protocol::Tag::kRows), 10);
}

TEST(SpawnRequestTest, RefusesWhatTheAgentWouldGetWrong) {
  TemplateDefaults d;
  auto bad = [&](CommandSpec s, std::map<std::string, std::string> sandbox_env = {}) {
    auto w = SpawnRequest(d, sandbox_env, s);
    EXPECT_FALSE(w.ok());
    return w.ok() ? 0 : w.status().err();
  };
  CommandSpec s;
  EXPECT_EQ(bad(s), EINVAL);  // no argv
  s.argv = {""};
  EXPECT_EQ(bad(s), EINVAL);
  s.argv = {"a", std::string("b\0c", 3)};
  EXPECT_EQ(bad(s), EINVAL);
  s.argv = {"true"};
  s.env = {{"A=B", "x"}};
  EXPECT_EQ(bad(s), EINVAL);
  s.env = {{"", "x"}};
  EXPECT_EQ(bad(s), EINVAL);
  s.env = {};
  EXPECT_EQ(bad(s, {{"X=Y", "1"}}), EINVAL);
  s.pty = PtySize{0, 80};
  EXPECT_EQ(bad(s), EINVAL);
  s.pty = PtySize{24, 1001};
  EXPECT_EQ(bad(s), EINVAL);
  s.pty.reset();
  s.timeout = -1ms;
  EXPECT_EQ(bad(s), EINVAL);
  s.timeout = 0ms;
  s.argv = {"true", std::string(protocol::kMaxPayload, 'x')};
  EXPECT_EQ(bad(s), EINVAL);
}

TEST(SessionPathTest, ResolvePathIsBelowTheHome) {
  User u{"user", 1000, 1000, "/home/user"};
  EXPECT_EQ(Session::ResolvePath("/etc/x", u), "/etc/x");
  EXPECT_EQ(Session::ResolvePath("", u), "/home/user");
  EXPECT_EQ(Session::ResolvePath("~", u), "/home/user");
  EXPECT_EQ(Session::ResolvePath("~/a", u), "/home/user/a");
  EXPECT_EQ(Session::ResolvePath("a/b", u), "/home/user/a/b");
  EXPECT_EQ(Session::ResolvePath("a", User{"root", 0, 0, "/"}), "/a");
}

// ---- against the agent ----

TEST_F(SessionTest, TemplateDefaultsApplyAndTheCommandOverrides) {
  TemplateDefaults d{{"FROM_TEMPLATE=t", "SHARED=template"}, "nobody", dir_};
  std::string id = Create(&d, {{"SHARED", "sandbox"}, {"FROM_SANDBOX", "s"}});
  Run([&]() -> asio::awaitable<void> {
    auto s = co_await Open(id);
    CO_ASSERT_OK(s);
    EXPECT_EQ((*s)->record().defaults.user, "nobody");
    CommandSpec spec;
    spec.argv = {"sh", "-c", "echo $FROM_TEMPLATE $SHARED $FROM_SANDBOX $(id -u) $(pwd) $PATH"};
    auto p = co_await (*s)->Spawn(spec);
    CO_ASSERT_OK(p);
    Ran r = co_await Collect(**p);
    // No PATH from the daemon: the agent's for a user that is not root.
    EXPECT_EQ(r.out, "t sandbox s 65534 " + dir_ + " /usr/local/bin:/usr/bin:/bin\n") << r.err;
    EXPECT_EQ(r.exit.exit_code, 0);

    spec.env = {{"SHARED", "command"}};
    spec.user = "root";
    spec.cwd = "/";
    p = co_await (*s)->Spawn(spec);
    CO_ASSERT_OK(p);
    r = co_await Collect(**p);
    EXPECT_EQ(r.out,
              "t command s 0 / /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n");
  });
  // Every start and exit is audited, with the facade.
  auto starts = Events(id, "command.start");
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_EQ(starts[0].detail["via"], "test");
  EXPECT_EQ(starts[0].detail["argv"][0], "sh");
  EXPECT_EQ(manager_->metrics().commands.load(), 2u);
}

TEST_F(SessionTest, CreateKeepsTheTemplatesDefaultsAndCountsTheCreate) {
  std::string id = Create();
  auto rec = manager_->Get(key_, id);
  ASSERT_TRUE(rec.ok());
  EXPECT_NE(std::find(rec->defaults.env.begin(), rec->defaults.env.end(), "LANG=C.UTF-8"),
            rec->defaults.env.end());
  EXPECT_EQ(rec->defaults.user, "");  // root
  std::string out;
  manager_->metrics().create_seconds.Render("x", "x", &out);
  EXPECT_NE(out.find("x_count 1\n"), std::string::npos) << out;
}

TEST_F(SessionTest, MissingOrNonExecutableProgramIsENOENTOrEACCES) {
  std::string id = Create();
  std::string script = dir_ + "/not-executable";
  std::ofstream(script) << "#!/bin/sh\necho hi\n";
  ::chmod(script.c_str(), 0644);
  Run([&]() -> asio::awaitable<void> {
    auto s = co_await Open(id);
    CO_ASSERT_OK(s);
    CommandSpec spec;
    spec.argv = {"no-such-program-anywhere"};
    auto p = co_await (*s)->Spawn(spec);
    CO_ASSERT_TRUE(!p.ok());
    EXPECT_EQ(p.status().err(), ENOENT) << p.status().message();
    spec.argv = {script};
    p = co_await (*s)->Spawn(spec);
    CO_ASSERT_TRUE(!p.ok());
    EXPECT_EQ(p.status().err(), EACCES) << p.status().message();
    spec.argv = {"true"};
    spec.cwd = dir_ + "/no/such/dir";
    p = co_await (*s)->Spawn(spec);
    CO_ASSERT_TRUE(!p.ok());
    EXPECT_EQ(p.status().err(), ENOENT) << p.status().message();
    spec.cwd = "";
    spec.user = "no-such-user";
    p = co_await (*s)->Spawn(spec);
    CO_ASSERT_TRUE(!p.ok());
    EXPECT_EQ(p.status().err(), EINVAL) << p.status().message();  // not "program not found"
  });
  EXPECT_TRUE(Events(id, "command.start").empty());
}

// 32 MiB into a process that reads nothing for a while: the agent holds each STDIN's answer while
// the process's 4 MiB queue is full, so the write completes at the reader's pace with the agent's
// memory bounded, and the session never retries.
TEST_F(SessionTest, StdinIsBackPressuredWithoutPolling) {
  std::string id = Create();
  pid_t agent = rt_->AgentPid(id);
  Run([&]() -> asio::awaitable<void> {
    auto s = co_await Open(id);
    CO_ASSERT_OK(s);
    CommandSpec spec;
    spec.argv = {"sh", "-c", "sleep 0.5; wc -c"};
    spec.stdin_open = true;
    auto p = co_await (*s)->Spawn(spec);
    CO_ASSERT_OK(p);
    long rss_before = VmRssKb(agent);
    std::string chunk(1 << 20, 'x');
    for (int i = 0; i < 32; ++i) {
      Status w = co_await (*s)->WriteStdin((*p)->pid(), chunk);
      CO_ASSERT_TRUE(w.ok());
    }
    long rss_after = VmRssKb(agent);
    CO_ASSERT_TRUE((co_await (*s)->CloseStdin((*p)->pid())).ok());
    Ran r = co_await Collect(**p);
    EXPECT_EQ(r.out, std::to_string(32 << 20) + "\n") << r.err;
    // The queue (4 MiB) and one held write, not the 32 MiB sent.
    EXPECT_LT(rss_after - rss_before, 12 * 1024) << rss_before << " -> " << rss_after << " KiB";
  });
}

TEST_F(SessionTest, StdinOfAProcessThatEndedIsEPIPE) {
  std::string id = Create();
  Run([&]() -> asio::awaitable<void> {
    auto s = co_await Open(id);
    CO_ASSERT_OK(s);
    CommandSpec spec;
    spec.argv = {"true"};
    spec.stdin_open = true;
    auto p = co_await (*s)->Spawn(spec);
    CO_ASSERT_OK(p);
    (void)co_await Collect(**p);
    Status w = co_await (*s)->WriteStdin((*p)->pid(), "late");
    EXPECT_EQ(w.err(), EPIPE) << w.message();
  });
}

TEST_F(SessionTest, ExitIsAuditedOnceFollowedOrDetached) {
  std::string id = Create();
  int64_t followed = 0, detached = 0, unread = 0;
  Run([&]() -> asio::awaitable<void> {
    auto s = co_await Open(id);
    CO_ASSERT_OK(s);
    CommandSpec spec;
    spec.argv = {"sh", "-c", "exit 3"};
    auto p = co_await (*s)->Spawn(spec);
    CO_ASSERT_OK(p);
    followed = (*p)->pid();
    Ran r = co_await Collect(**p);
    EXPECT_EQ(r.exit.exit_code, 3);
    // The follower saw the exit: its audit event is there already.
    auto exits = Events(id, "command.exit");
    EXPECT_EQ(exits.size(), 1u);
    if (!exits.empty()) {
      EXPECT_EQ(exits[0].detail["pid"], followed);
    }

    spec.argv = {"sh", "-c", "read x; exit 4"};
    spec.stdin_open = true;
    p = co_await (*s)->Spawn(spec);
    CO_ASSERT_OK(p);
    detached = (*p)->pid();
    co_await (*p)->Detach();
    p->reset();
    CO_ASSERT_TRUE((co_await (*s)->WriteStdin(detached, "go\n")).ok());
    (void)co_await AwaitEvent(id, "command.exit", detached);

    // Dropped after its exit without reading it (a client gone at the last moment): the watcher
    // its follower starts then finds the exit the agent kept.
    spec.argv = {"sh", "-c", "exit 5"};
    spec.stdin_open = false;
    p = co_await (*s)->Spawn(spec);
    CO_ASSERT_OK(p);
    unread = (*p)->pid();
    auto other = co_await (*s)->Attach(unread, 0, 0);  // follows it to its end; audits nothing
    CO_ASSERT_OK(other);
    EXPECT_EQ((co_await Collect(**other)).exit.exit_code, 5);
    EXPECT_EQ(Events(id, "command.exit").size(), 2u);
    p->reset();
    (void)co_await AwaitEvent(id, "command.exit", unread);
  });
  auto exits = Events(id, "command.exit");
  ASSERT_EQ(exits.size(), 3u);  // once each: the follower's and the watcher's did not both count
  EXPECT_EQ(exits[0].detail["pid"], followed);
  EXPECT_EQ(exits[0].detail["exit_code"], 3);
  EXPECT_EQ(exits[1].detail["pid"], detached);
  EXPECT_EQ(exits[1].detail["exit_code"], 4);
  EXPECT_EQ(exits[1].detail["via"], "test");
  EXPECT_EQ(exits[2].detail["pid"], unread);
  EXPECT_EQ(exits[2].detail["exit_code"], 5);
}

TEST_F(SessionTest, UsersAreResolvedByTheAgent) {
  TemplateDefaults d{{}, "nobody", ""};
  std::string id = Create(&d);
  Run([&]() -> asio::awaitable<void> {
    auto s = co_await Open(id);
    CO_ASSERT_OK(s);
    auto u = co_await (*s)->ResolveUser("");  // the template's
    CO_ASSERT_OK(u);
    EXPECT_EQ(u->name, "nobody");
    EXPECT_EQ(u->uid, 65534);
    EXPECT_EQ(u->home, "/nonexistent");
    u = co_await (*s)->ResolveUser("0");
    CO_ASSERT_OK(u);
    EXPECT_EQ(u->name, "root");
    EXPECT_EQ(u->home, "/root");
    u = co_await (*s)->ResolveUser("4242");  // a uid without an entry is still a user
    CO_ASSERT_OK(u);
    EXPECT_EQ(u->gid, 4242);
    u = co_await (*s)->ResolveUser("no-such-user");
    EXPECT_EQ(u.status().err(), ENOENT);
    // A relative cwd is below the user's home, which only the agent knows.
    CommandSpec spec;
    spec.argv = {"pwd"};
    spec.user = "root";
    spec.cwd = "~";
    auto p = co_await (*s)->Spawn(spec);
    CO_ASSERT_OK(p);
    EXPECT_EQ((co_await Collect(**p)).out, "/root\n");
  });
}

TEST_F(SessionTest, FilesAreWrittenAsTheirOwnerAndAudited) {
  std::string id = Create();
  std::string home = dir_ + "/home-of-nobody";
  ASSERT_EQ(::mkdir(home.c_str(), 0755), 0);
  ASSERT_EQ(::chown(home.c_str(), 65534, 65534), 0);
  Run([&]() -> asio::awaitable<void> {
    auto s = co_await Open(id);
    CO_ASSERT_OK(s);
    auto nobody = co_await (*s)->ResolveUser("nobody");
    CO_ASSERT_OK(nobody);
    // Given the owner.
    WriteOptions o;
    o.owner = *nobody;
    o.metadata = {{"k", "v"}};
    auto w = co_await (*s)->Write(dir_ + "/given", o);
    CO_ASSERT_OK(w);
    CO_ASSERT_TRUE((co_await (*w)->Append("hello")).ok());
    auto e = co_await (*w)->End();
    CO_ASSERT_OK(e);
    EXPECT_EQ(e->uid, 65534);
    EXPECT_EQ(e->size, 5);
    EXPECT_EQ(e->metadata["k"], "v");
    // Not given: the nearest existing parent's, through directories it makes.
    w = co_await (*s)->Write(home + "/new/dir/file", WriteOptions{});
    CO_ASSERT_OK(w);
    CO_ASSERT_TRUE((co_await (*w)->Append("x")).ok());
    e = co_await (*w)->End();
    CO_ASSERT_OK(e);
    EXPECT_EQ(e->uid, 65534);
    auto dir = co_await (*s)->Stat(home + "/new/dir");
    CO_ASSERT_OK(dir);
    EXPECT_EQ(dir->uid, 65534);
    // Into /tmp-like root-owned directories: root's.
    w = co_await (*s)->Write(dir_ + "/roots", WriteOptions{});
    CO_ASSERT_OK(w);
    e = co_await (*w)->End();
    CO_ASSERT_OK(e);
    EXPECT_EQ(e->uid, 0);
    // An aborted write leaves nothing.
    w = co_await (*s)->Write(dir_ + "/aborted", WriteOptions{});
    CO_ASSERT_OK(w);
    CO_ASSERT_TRUE((co_await (*w)->Append("partial")).ok());
    co_await (*w)->Abort();
    auto gone = co_await (*s)->Stat(dir_ + "/aborted");
    EXPECT_EQ(gone.status().err(), ENOENT);
    // And read back in pieces.
    auto r = co_await (*s)->Read(dir_ + "/given");
    CO_ASSERT_OK(r);
    std::string all;
    for (;;) {
      auto piece = co_await (*r)->Next();
      CO_ASSERT_OK(piece);
      if (piece->empty()) break;
      all += *piece;
    }
    EXPECT_EQ(all, "hello");
    auto missing = co_await (*s)->Read(dir_ + "/missing");
    CO_ASSERT_OK(missing);
    auto first = co_await (*missing)->Next();
    EXPECT_EQ(first.status().err(), ENOENT);
  });
  EXPECT_EQ(Events(id, "file.write").size(), 3u);
}

TEST_F(SessionTest, StatListMoveRemoveAndSymlinks) {
  std::string id = Create();
  ASSERT_EQ(::symlink("target", (dir_ + "/link").c_str()), 0);
  std::ofstream(dir_ + "/target") << "abc";
  Run([&]() -> asio::awaitable<void> {
    auto s = co_await Open(id);
    CO_ASSERT_OK(s);
    auto l = co_await (*s)->Stat(dir_ + "/link");
    CO_ASSERT_OK(l);
    EXPECT_EQ(l->type, FileEntry::Type::kSymlink);
    EXPECT_EQ(l->link_target, "target");
    auto d = co_await (*s)->MakeDir(dir_ + "/a/b", std::nullopt);
    CO_ASSERT_OK(d);
    EXPECT_EQ(d->type, FileEntry::Type::kDir);
    auto m = co_await (*s)->Move(dir_ + "/target", dir_ + "/a/moved");
    CO_ASSERT_OK(m);
    EXPECT_EQ(m->size, 3);
    auto list = co_await (*s)->List(dir_ + "/a", 2);
    CO_ASSERT_OK(list);
    std::set<std::string> names;
    for (const auto& e : *list) names.insert(e.name);
    EXPECT_TRUE(names.count("b") && names.count("moved"));
    auto deep = co_await (*s)->List(dir_, 17);
    EXPECT_EQ(deep.status().err(), EINVAL);
    CO_ASSERT_TRUE((co_await (*s)->Remove(dir_ + "/a")).ok());
    EXPECT_EQ((co_await (*s)->Stat(dir_ + "/a")).status().err(), ENOENT);
  });
  EXPECT_EQ(Events(id, "file.mkdir").size(), 1u);
  EXPECT_EQ(Events(id, "file.move").size(), 1u);
  EXPECT_EQ(Events(id, "file.remove").size(), 1u);
}

TEST_F(SessionTest, AKilledSandboxEndsItsCommandsStreamSayingSo) {
  std::string id = Create();
  Run([&]() -> asio::awaitable<void> {
    auto s = co_await Open(id);
    CO_ASSERT_OK(s);
    CommandSpec spec;
    spec.argv = {"sleep", "100"};
    auto p = co_await (*s)->Spawn(spec);
    CO_ASSERT_OK(p);
    CO_ASSERT_TRUE(manager_->Kill(key_, id).ok());
    Ran r = co_await Collect(**p);
    EXPECT_EQ(r.exit.kind, ProcessEvent::Kind::kError);
    EXPECT_EQ(r.status.err(), ENOENT);
    EXPECT_EQ(r.status.what(), "sandbox " + id + " was killed");
    auto again = co_await Open(id);
    EXPECT_EQ(again.status().err(), ENOENT);
  });
}

TEST_F(SessionTest, OperatorKeysAndOtherTenantsCannotOpen) {
  std::string id = Create();
  auto other = store_->CreateApiKey("other", 0, 0);
  ASSERT_TRUE(other.ok());
  Run([&]() -> asio::awaitable<void> {
    auto s = co_await Session::Open(*manager_, other->record, id, "test");
    EXPECT_EQ(s.status().err(), ENOENT);
    CO_ASSERT_TRUE(manager_->Pause(key_, id).ok());
    s = co_await Open(id);
    EXPECT_EQ(s.status().err(), EBUSY);
  });
}

TEST_F(SessionTest, AttachReplaysAndSignalsReachTheProcess) {
  std::string id = Create();
  Run([&]() -> asio::awaitable<void> {
    auto s = co_await Open(id);
    CO_ASSERT_OK(s);
    CommandSpec spec;
    spec.argv = {"sh", "-c", "echo ready; exec sleep 100"};
    spec.tag = "sleeper";
    auto p = co_await (*s)->Spawn(spec);
    CO_ASSERT_OK(p);
    int64_t pid = (*p)->pid();
    auto first = co_await (*p)->Next(30s);
    CO_ASSERT_OK(first);
    EXPECT_EQ(first->data, "ready\n");
    co_await (*p)->Detach();
    auto procs = co_await (*s)->ListProcesses();
    CO_ASSERT_OK(procs);
    bool listed = false;
    for (const auto& i : *procs) listed |= i.pid == pid && i.tag == "sleeper" && i.running;
    EXPECT_TRUE(listed);
    auto a = co_await (*s)->Attach(pid, 0, 0);
    CO_ASSERT_OK(a);
    CO_ASSERT_TRUE((co_await (*s)->Signal(pid, SIGTERM)).ok());
    Ran r = co_await Collect(**a);
    EXPECT_EQ(r.out, "ready\n");  // replayed from offset 0
    EXPECT_EQ(r.exit.signal, SIGTERM);
    EXPECT_EQ((co_await (*s)->Attach(424242)).status().err(), ESRCH);
  });
}

}  // namespace
}  // namespace sbx::sandbox
