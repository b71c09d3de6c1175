// End-to-end tests of sbx-agent: the real binary, started with --listen on a temporary socket,
// driven through the daemon's AgentConnection (docs/agent-protocol.md).
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "protocol/client.h"

namespace sbx::protocol {
namespace {

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override { Start({}); }
  void TearDown() override { Stop(); }

  void Start(std::vector<std::string> extra) {
    char tmpl[] = "/tmp/sbx-agent-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    socket_ = dir_ + "/a.sock";
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<const char*> argv{SBX_AGENT_PATH, "--listen", socket_.c_str()};
      for (const auto& e : extra) argv.push_back(e.c_str());
      argv.push_back(nullptr);
      ::execv(SBX_AGENT_PATH, const_cast<char**>(argv.data()));
      _exit(127);
    }
  }
  void Stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int st;
      ::waitpid(pid_, &st, 0);
      pid_ = -1;
    }
    std::string cmd = "rm -rf '" + dir_ + "'";
    ASSERT_EQ(::system(cmd.c_str()), 0);
  }

  AgentConnection Connect() {
    auto c = AgentConnection::Connect(socket_, 5000);
    EXPECT_TRUE(c.ok()) << c.status().message();
    return std::move(c.value());
  }

  struct Run {
    uint32_t id = 0;
    int64_t pid = 0;
    std::string out, err;
    int64_t exit_code = -100, signal = -100, timed_out = -1;
    bool exited = false;
  };

  // Collects OUTPUT and EXIT events for request `id` until EXIT.
  static void Collect(AgentConnection& c, Run* r, int timeout_ms = 20000) {
    uint64_t next[2] = {0, 0};
    for (;;) {
      auto f = c.Receive(timeout_ms);
      ASSERT_TRUE(f.ok()) << f.status().message();
      if (f->id() != r->id) continue;
      if (f->type() == Type::kOutput) {
        int64_t s = f->fields.Int(Tag::kStream);
        ASSERT_TRUE(s == 1 || s == 2);
        EXPECT_GE(static_cast<uint64_t>(f->fields.Int(Tag::kOffset)), next[s - 1]);
        std::string_view d = f->fields.Str(Tag::kData);
        next[s - 1] = static_cast<uint64_t>(f->fields.Int(Tag::kOffset)) + d.size();
        (s == 1 ? r->out : r->err).append(d);
      } else if (f->type() == Type::kExit) {
        r->exit_code = f->fields.Int(Tag::kExitCode);
        r->signal = f->fields.Int(Tag::kSignal);
        r->timed_out = f->fields.Int(Tag::kTimedOut);
        r->exited = true;
        return;
      }
    }
  }

  static Result<Run> Spawn(AgentConnection& c, Writer w) {
    auto ok = c.Call(Type::kSpawn, w);
    if (!ok.ok()) return ok.status();
    Run r;
    r.id = ok->id();
    r.pid = ok->fields.Int(Tag::kPid);
    return r;
  }

  static Writer Argv(std::initializer_list<const char*> args) {
    Writer w;
    for (const char* a : args) w.Str(Tag::kArgv, a);
    return w;
  }

  Run RunToEnd(AgentConnection& c, Writer w) {
    auto r = Spawn(c, w);
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (!r.ok()) return {};
    Collect(c, &r.value());
    return r.value();
  }

  std::string dir_, socket_;
  pid_t pid_ = -1;
};

TEST_F(AgentTest, EchoRunsAndExits) {
  auto c = Connect();
  Run r = RunToEnd(c, Argv({"/bin/echo", "hello", "world"}));
  EXPECT_EQ(r.out, "hello world\n");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.signal, 0);
  EXPECT_EQ(r.timed_out, 0);
}

TEST_F(AgentTest, SeparatesStdoutAndStderrAndReportsExitCode) {
  auto c = Connect();
  Run r = RunToEnd(c, Argv({"sh", "-c", "echo out; echo err >&2; exit 3"}));
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");
  EXPECT_EQ(r.exit_code, 3);
}

TEST_F(AgentTest, ReportsTheKillingSignal) {
  auto c = Connect();
  Run r = RunToEnd(c, Argv({"sh", "-c", "kill -9 $$"}));
  EXPECT_EQ(r.signal, 9);
  EXPECT_EQ(r.exit_code, -1);
}

TEST_F(AgentTest, MissingProgramIsENOENT) {
  auto c = Connect();
  auto r = Spawn(c, Argv({"no-such-program-xyz"}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().err(), ENOENT);
  auto r2 = Spawn(c, Argv({"/bin/echo"}).Str(Tag::kCwd, "/no/such/dir"));
  ASSERT_FALSE(r2.ok());
  EXPECT_EQ(r2.status().err(), ENOENT);
  auto r3 = Spawn(c, Writer());
  ASSERT_FALSE(r3.ok());
  EXPECT_EQ(r3.status().err(), EINVAL);
}

TEST_F(AgentTest, AppliesEnvAndCwd) {
  auto c = Connect();
  Run r = RunToEnd(c, Argv({"sh", "-c", "echo $FOO; pwd; echo $HOME"})
                          .Str(Tag::kEnv, "FOO=bar")
                          .Str(Tag::kCwd, "/tmp"));
  EXPECT_EQ(r.out, "bar\n/tmp\n/root\n");
}

TEST_F(AgentTest, TakesANearlyFullFrame) {
  auto c = Connect();
  Writer w = Argv({"sh", "-c", "echo ${#V8}"});
  for (int i = 0; i < 9; ++i)
    w.Str(Tag::kEnv, "V" + std::to_string(i) + "=" + std::string(110000, 'x'));
  ASSERT_GT(w.size(), 990000u);
  Run r = RunToEnd(c, std::move(w));
  EXPECT_EQ(r.out, "110000\n");
}

TEST_F(AgentTest, RunsAsAUserByName) {
  auto c = Connect();
  Run r =
      RunToEnd(c, Argv({"sh", "-c", "id -u; id -g; echo $USER $HOME"}).Str(Tag::kUser, "nobody"));
  EXPECT_EQ(r.out, "65534\n65534\nnobody /nonexistent\n");
  Run r2 = RunToEnd(c, Argv({"id", "-u"}).Int(Tag::kUid, 4321).Int(Tag::kGid, 4321));
  EXPECT_EQ(r2.out, "4321\n");
  auto bad = Spawn(c, Argv({"id"}).Str(Tag::kUser, "no-such-user"));
  EXPECT_FALSE(bad.ok());
}

TEST_F(AgentTest, StdinWriteAndClose) {
  auto c = Connect();
  auto r = Spawn(c, Argv({"cat"}).Int(Tag::kStdinOpen, 1));
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(c.Call(Type::kStdin, Writer().Int(Tag::kPid, r->pid).Str(Tag::kData, "abc\n")).ok());
  ASSERT_TRUE(c.Call(Type::kStdin, Writer().Int(Tag::kPid, r->pid).Str(Tag::kData, "def")).ok());
  ASSERT_TRUE(c.Call(Type::kCloseStdin, Writer().Int(Tag::kPid, r->pid)).ok());
  Collect(c, &r.value());
  EXPECT_EQ(r->out, "abc\ndef");
  EXPECT_EQ(r->exit_code, 0);
  // A finished process has no stdin.
  auto late = c.Call(Type::kStdin, Writer().Int(Tag::kPid, r->pid).Str(Tag::kData, "x"));
  EXPECT_FALSE(late.ok());
}

TEST_F(AgentTest, PtyIsTheControllingTerminalAndResizes) {
  auto c = Connect();
  Run r = RunToEnd(c, Argv({"tty"}).Int(Tag::kPty, 1));
  EXPECT_EQ(r.out.rfind("/dev/pts/", 0), 0u) << r.out;
  EXPECT_EQ(r.exit_code, 0);

  auto s = Spawn(c, Argv({"sh", "-c", "read x; stty size"})
                        .Int(Tag::kPty, 1)
                        .Int(Tag::kRows, 10)
                        .Int(Tag::kCols, 20));
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(
      c.Call(Type::kResize, Writer().Int(Tag::kPid, s->pid).Int(Tag::kRows, 33).Int(Tag::kCols, 77))
          .ok());
  ASSERT_TRUE(c.Call(Type::kStdin, Writer().Int(Tag::kPid, s->pid).Str(Tag::kData, "go\n")).ok());
  Collect(c, &s.value());
  EXPECT_NE(s->out.find("33 77"), std::string::npos) << s->out;

  // CLOSE_STDIN on a PTY is ^D: cat sees EOF.
  auto cat = Spawn(c, Argv({"cat"}).Int(Tag::kPty, 1));
  ASSERT_TRUE(cat.ok());
  ASSERT_TRUE(c.Call(Type::kCloseStdin, Writer().Int(Tag::kPid, cat->pid)).ok());
  Collect(c, &cat.value());
  EXPECT_EQ(cat->exit_code, 0);
}

TEST_F(AgentTest, TimeoutKillsTheProcessGroup) {
  auto c = Connect();
  auto t0 = std::chrono::steady_clock::now();
  Run r = RunToEnd(c, Argv({"sleep", "100"}).Int(Tag::kTimeoutMs, 200));
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  EXPECT_EQ(r.timed_out, 1);
  EXPECT_EQ(r.signal, 9);
  EXPECT_LT(ms, 5000);
}

TEST_F(AgentTest, SignalReachesTheProcess) {
  auto c = Connect();
  auto r = Spawn(c, Argv({"sleep", "100"}));
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(c.Call(Type::kSignal,
                     Writer().Int(Tag::kPid, r->pid).Int(Tag::kSignal, 15).Int(Tag::kGroup, 1))
                  .ok());
  Collect(c, &r.value());
  EXPECT_EQ(r->signal, 15);
  auto gone = c.Call(Type::kSignal, Writer().Int(Tag::kPid, 999999).Int(Tag::kSignal, 15));
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().err(), ESRCH);
}

TEST_F(AgentTest, ReattachReplaysOutputAndExit) {
  int64_t pid;
  {
    auto c = Connect();
    auto r = Spawn(c, Argv({"sh", "-c", "printf 0123456789; read x; printf abc; echo e >&2"})
                          .Int(Tag::kStdinOpen, 1));
    ASSERT_TRUE(r.ok());
    pid = r->pid;
    // Wait for the first output, then detach.
    auto f = c.Receive(5000);
    ASSERT_TRUE(f.ok());
    ASSERT_EQ(f->type(), Type::kOutput);
    ASSERT_TRUE(c.Call(Type::kDetach, Writer().Int(Tag::kPid, pid)).ok());
    ASSERT_TRUE(c.Call(Type::kStdin, Writer().Int(Tag::kPid, pid).Str(Tag::kData, "\n")).ok());
  }  // connection closed; the process carries on
  ::usleep(200 * 1000);
  auto c = Connect();
  auto a = c.Call(Type::kAttach, Writer().Int(Tag::kPid, pid));
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->fields.Int(Tag::kRunning), 0);
  Run r;
  r.id = a->id();
  Collect(c, &r);
  EXPECT_EQ(r.out, "0123456789abc");
  EXPECT_EQ(r.err, "e\n");
  EXPECT_EQ(r.exit_code, 0);

  // From a mid offset, only the tail; from the end (-1), nothing written before, just the exit.
  struct From {
    int64_t out, err;
    const char *want_out, *want_err;
  };
  for (const From& f : {From{7, 2, "789abc", ""}, From{-1, -1, "", ""}}) {
    auto m = c.Call(
        Type::kAttach,
        Writer().Int(Tag::kPid, pid).Int(Tag::kStdoutOffset, f.out).Int(Tag::kStderrOffset, f.err));
    ASSERT_TRUE(m.ok());
    Run from;
    from.id = m->id();
    Collect(c, &from);
    EXPECT_EQ(from.out, f.want_out) << f.out;
    EXPECT_EQ(from.err, f.want_err) << f.err;
    EXPECT_EQ(from.exit_code, 0);
  }

  // LIST_PROCS shows it as finished.
  std::vector<Frame> procs;
  ASSERT_TRUE(c.Call(Type::kListProcs, Writer(), &procs).ok());
  bool found = false;
  for (const auto& p : procs) {
    if (p.fields.Int(Tag::kPid) == pid) {
      found = true;
      EXPECT_EQ(p.fields.Int(Tag::kRunning), 0);
      EXPECT_EQ(p.fields.All(Tag::kArgv).size(), 3u);
    }
  }
  EXPECT_TRUE(found);
}

TEST_F(AgentTest, BigOutputArrivesCompleteWhileAttached) {
  auto c = Connect();
  auto r = Spawn(c, Argv({"head", "-c", "50000000", "/dev/zero"}));
  ASSERT_TRUE(r.ok());
  uint64_t total = 0, expected_offset = 0;
  for (;;) {
    auto f = c.Receive(30000);
    ASSERT_TRUE(f.ok()) << f.status().message();
    if (f->type() == Type::kOutput) {
      ASSERT_EQ(static_cast<uint64_t>(f->fields.Int(Tag::kOffset)), expected_offset);
      size_t n = f->fields.Str(Tag::kData).size();
      total += n;
      expected_offset += n;
    } else if (f->type() == Type::kExit) {
      EXPECT_EQ(f->fields.Int(Tag::kExitCode), 0);
      break;
    }
  }
  EXPECT_EQ(total, 50000000u);
}

TEST_F(AgentTest, SlowReaderStillGetsEverything) {
  auto c = Connect();
  auto r = Spawn(c, Argv({"head", "-c", "20000000", "/dev/zero"}));
  ASSERT_TRUE(r.ok());
  ::usleep(500 * 1000);  // the agent must stop reading the pipe, not drop bytes
  Collect(c, &r.value(), 30000);
  EXPECT_EQ(r->out.size(), 20000000u);
}

std::vector<pid_t> ZombieChildrenOf(pid_t parent) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  while (struct dirent* de = ::readdir(d)) {
    pid_t p = ::atoi(de->d_name);
    if (p <= 0) continue;
    std::ifstream f("/proc/" + std::to_string(p) + "/stat");
    std::string line;
    std::getline(f, line);
    size_t rp = line.rfind(')');
    if (rp == std::string::npos) continue;
    std::istringstream rest(line.substr(rp + 2));
    char state;
    pid_t ppid;
    rest >> state >> ppid;
    if (ppid == parent && state == 'Z') out.push_back(p);
  }
  ::closedir(d);
  return out;
}

TEST_F(AgentTest, OrphansAreReaped) {
  auto c = Connect();
  Run r = RunToEnd(c, Argv({"sh", "-c", "sleep 0.1 & exit 0"}));
  EXPECT_EQ(r.exit_code, 0);
  ::usleep(600 * 1000);
  EXPECT_TRUE(ZombieChildrenOf(pid_).empty());
}

TEST_F(AgentTest, ProcessBoundIsEAGAIN) {
  Stop();
  Start({"--max-procs", "3"});
  auto c = Connect();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Spawn(c, Argv({"sleep", "100"})).ok());
  auto r = Spawn(c, Argv({"sleep", "100"}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().err(), EAGAIN);
}

// Writes `data` to `path` in chunks through WRITE_BEGIN/DATA/END.
Status WriteFile(AgentConnection& c, const std::string& path, const std::string& data,
                 Writer begin = Writer()) {
  uint32_t id = c.NextId();
  auto b = c.CallWithId(Type::kWriteBegin, id, begin.Str(Tag::kPath, path));
  if (!b.ok()) return b.status();
  for (size_t off = 0; off < data.size(); off += kMaxChunk) {
    SBX_RETURN_IF_ERROR(
        c.Send(Type::kWriteData, id,
               Writer().Str(Tag::kData, std::string_view(data).substr(off, kMaxChunk))));
  }
  auto e = c.CallWithId(Type::kWriteEnd, id, Writer());
  return e.ok() ? Status() : e.status();
}

Result<std::string> ReadFile(AgentConnection& c, const std::string& path, int64_t offset = 0,
                             int64_t length = 0) {
  std::vector<Frame> data;
  auto ok = c.Call(
      Type::kRead,
      Writer().Str(Tag::kPath, path).Int(Tag::kOffset, offset).Int(Tag::kLength, length), &data);
  if (!ok.ok()) return ok.status();
  std::string out;
  for (const auto& f : data) {
    EXPECT_EQ(f.fields.Int(Tag::kOffset), offset + static_cast<int64_t>(out.size()));
    out.append(f.fields.Str(Tag::kData));
  }
  return out;
}

TEST_F(AgentTest, WriteThenReadBack) {
  auto c = Connect();
  std::string data;
  for (int i = 0; i < 300000; ++i) data += static_cast<char>('a' + i % 23);
  data += data + data + data;  // 1.2 MB
  std::string path = dir_ + "/sub/deeper/file.bin";
  ASSERT_TRUE(WriteFile(c, path, data, Writer().Int(Tag::kMode, 0600).Int(Tag::kParents, 1)).ok());
  auto all = ReadFile(c, path);
  ASSERT_TRUE(all.ok()) << all.status().message();
  EXPECT_EQ(all.value(), data);
  auto part = ReadFile(c, path, 1000, 300000);
  ASSERT_TRUE(part.ok());
  EXPECT_EQ(part.value(), data.substr(1000, 300000));
  auto st = c.Call(Type::kStat, Writer().Str(Tag::kPath, path));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->fields.Int(Tag::kSize), static_cast<int64_t>(data.size()));
  EXPECT_EQ(st->fields.Int(Tag::kMode) & 07777, 0600);
  EXPECT_EQ(st->fields.Str(Tag::kOwner), "root");
  EXPECT_EQ(st->fields.Int(Tag::kFileType), static_cast<int64_t>(FileType::kFile));
  // Without a mode, an overwrite keeps the file's permissions; a new file gets 0644.
  ASSERT_EQ(::chmod(path.c_str(), 0750), 0);
  ASSERT_TRUE(WriteFile(c, path, "#!/bin/sh\n").ok());
  struct stat after;
  ASSERT_EQ(::stat(path.c_str(), &after), 0);
  EXPECT_EQ(after.st_mode & 07777, 0750);
  ASSERT_TRUE(WriteFile(c, dir_ + "/fresh", "x").ok());
  ASSERT_EQ(::stat((dir_ + "/fresh").c_str(), &after), 0);
  EXPECT_EQ(after.st_mode & 07777, 0644);
  auto dir = ReadFile(c, dir_);
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.status().err(), EISDIR);
  auto missing = ReadFile(c, dir_ + "/nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().err(), ENOENT);
}

TEST_F(AgentTest, ListMkdirMoveRemove) {
  auto c = Connect();
  ASSERT_TRUE(
      c.Call(Type::kMkdir, Writer().Str(Tag::kPath, dir_ + "/t/a/b").Int(Tag::kParents, 1)).ok());
  ASSERT_TRUE(
      c.Call(Type::kMkdir, Writer().Str(Tag::kPath, dir_ + "/t/a/b").Int(Tag::kParents, 1)).ok());
  auto again = c.Call(Type::kMkdir, Writer().Str(Tag::kPath, dir_ + "/t/a/b"));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().err(), EEXIST);
  ASSERT_TRUE(WriteFile(c, dir_ + "/t/a/f1", "1").ok());
  ASSERT_TRUE(WriteFile(c, dir_ + "/t/a/b/f2", "22").ok());
  ASSERT_EQ(::symlink("/etc", (dir_ + "/t/link").c_str()), 0);

  std::vector<Frame> entries;
  ASSERT_TRUE(
      c.Call(Type::kList, Writer().Str(Tag::kPath, dir_ + "/t").Int(Tag::kDepth, 2), &entries)
          .ok());
  std::vector<std::string> paths;
  for (const auto& e : entries) paths.emplace_back(e.fields.Str(Tag::kPath));
  std::string t = dir_ + "/t";
  EXPECT_EQ(paths, (std::vector<std::string>{t + "/a", t + "/a/b", t + "/a/f1", t + "/link"}));
  EXPECT_EQ(entries.back().fields.Int(Tag::kFileType), static_cast<int64_t>(FileType::kSymlink));
  EXPECT_EQ(entries.back().fields.Str(Tag::kLinkTarget), "/etc");

  auto mv =
      c.Call(Type::kMove, Writer().Str(Tag::kPath, t + "/a/f1").Str(Tag::kNewPath, t + "/moved"));
  ASSERT_TRUE(mv.ok()) << mv.status().message();
  EXPECT_EQ(mv->fields.Str(Tag::kPath), t + "/moved");
  EXPECT_EQ(::access((t + "/a/f1").c_str(), F_OK), -1);

  auto nonempty = c.Call(Type::kRemove, Writer().Str(Tag::kPath, t + "/a"));
  ASSERT_FALSE(nonempty.ok());
  EXPECT_EQ(nonempty.status().err(), ENOTEMPTY);
  ASSERT_TRUE(
      c.Call(Type::kRemove, Writer().Str(Tag::kPath, t + "/a").Int(Tag::kRecursive, 1)).ok());
  EXPECT_EQ(::access((t + "/a").c_str(), F_OK), -1);
}

// STAT with follow answers for a symlink's target, as envd's getInfo: the target's type and
// mode, the resolved absolute path, the link's own name and path; a dangling link names itself.
TEST_F(AgentTest, StatFollowResolvesSymlinks) {
  auto c = Connect();
  char real[PATH_MAX];
  ASSERT_NE(::realpath(dir_.c_str(), real), nullptr);
  std::string d = real;
  ASSERT_TRUE(WriteFile(c, d + "/f", "x").ok());
  ASSERT_EQ(::chmod((d + "/f").c_str(), 0600), 0);
  ASSERT_EQ(::symlink("f", (d + "/l1").c_str()), 0);
  ASSERT_EQ(::symlink((d + "/l1").c_str(), (d + "/l2").c_str()), 0);
  ASSERT_EQ(::symlink("missing", (d + "/dangling").c_str()), 0);
  auto st = c.Call(Type::kStat, Writer().Str(Tag::kPath, d + "/l2").Int(Tag::kFollow, 1));
  ASSERT_TRUE(st.ok()) << st.status().message();
  EXPECT_EQ(st->fields.Int(Tag::kFileType), static_cast<int64_t>(FileType::kFile));
  EXPECT_EQ(st->fields.Int(Tag::kMode) & 07777, 0600);
  EXPECT_EQ(st->fields.Str(Tag::kLinkTarget), d + "/f");
  EXPECT_EQ(st->fields.Str(Tag::kPath), d + "/l2");
  EXPECT_EQ(st->fields.Str(Tag::kName), "l2");
  auto plain = c.Call(Type::kStat, Writer().Str(Tag::kPath, d + "/l2"));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->fields.Int(Tag::kFileType), static_cast<int64_t>(FileType::kSymlink));
  EXPECT_EQ(plain->fields.Str(Tag::kLinkTarget), d + "/l1");  // as written
  auto dangling =
      c.Call(Type::kStat, Writer().Str(Tag::kPath, d + "/dangling").Int(Tag::kFollow, 1));
  ASSERT_TRUE(dangling.ok());
  EXPECT_EQ(dangling->fields.Int(Tag::kFileType), static_cast<int64_t>(FileType::kOther));
  EXPECT_EQ(dangling->fields.Int(Tag::kMode), 0);
  EXPECT_EQ(dangling->fields.Str(Tag::kLinkTarget), d + "/dangling");
  // Not a symlink: follow changes nothing.
  auto file = c.Call(Type::kStat, Writer().Str(Tag::kPath, d + "/f").Int(Tag::kFollow, 1));
  ASSERT_TRUE(file.ok());
  EXPECT_FALSE(file->fields.Has(Tag::kLinkTarget));
}

TEST_F(AgentTest, RecursiveRemoveDoesNotFollowSymlinks) {
  auto c = Connect();
  std::string outside = dir_ + "/outside", tree = dir_ + "/tree";
  ASSERT_EQ(::mkdir(outside.c_str(), 0755), 0);
  std::ofstream(outside + "/keep.txt") << "precious";
  ASSERT_EQ(::mkdir(tree.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((tree + "/sub").c_str(), 0755), 0);
  ASSERT_EQ(::symlink(outside.c_str(), (tree + "/sub/link").c_str()), 0);
  ASSERT_TRUE(c.Call(Type::kRemove, Writer().Str(Tag::kPath, tree).Int(Tag::kRecursive, 1)).ok());
  EXPECT_EQ(::access(tree.c_str(), F_OK), -1);
  EXPECT_EQ(::access((outside + "/keep.txt").c_str(), F_OK), 0);
}

TEST_F(AgentTest, AbortedWriteLeavesNoTemporaryFile) {
  std::string d = dir_ + "/w";
  ASSERT_EQ(::mkdir(d.c_str(), 0755), 0);
  {
    auto c = Connect();
    uint32_t id = c.NextId();
    ASSERT_TRUE(c.CallWithId(Type::kWriteBegin, id, Writer().Str(Tag::kPath, d + "/f")).ok());
    ASSERT_TRUE(c.Send(Type::kWriteData, id, Writer().Str(Tag::kData, "partial")).ok());
  }
  ::usleep(200 * 1000);
  auto c = Connect();
  std::vector<Frame> entries;
  ASSERT_TRUE(c.Call(Type::kList, Writer().Str(Tag::kPath, d), &entries).ok());
  EXPECT_TRUE(entries.empty());
  auto end = c.CallWithId(Type::kWriteEnd, 12345, Writer());
  EXPECT_FALSE(end.ok());

  // WRITE_ABORT drops an open write at once, on a connection that stays open.
  uint32_t id = c.NextId();
  ASSERT_TRUE(c.CallWithId(Type::kWriteBegin, id, Writer().Str(Tag::kPath, d + "/g")).ok());
  ASSERT_TRUE(c.Send(Type::kWriteData, id, Writer().Str(Tag::kData, "partial")).ok());
  ASSERT_TRUE(c.CallWithId(Type::kWriteAbort, id, Writer()).ok());
  entries.clear();
  ASSERT_TRUE(c.Call(Type::kList, Writer().Str(Tag::kPath, d), &entries).ok());
  EXPECT_TRUE(entries.empty());
  auto again = c.CallWithId(Type::kWriteAbort, id, Writer());
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().err(), EBADF);
  EXPECT_EQ(c.CallWithId(Type::kWriteEnd, id, Writer()).status().err(), EBADF);
}

TEST_F(AgentTest, WatchReportsEvents) {
  auto c = Connect();
  std::string d = dir_ + "/watched";
  ASSERT_EQ(::mkdir(d.c_str(), 0755), 0);
  auto w = c.Call(Type::kWatch, Writer().Str(Tag::kPath, d).Int(Tag::kRecursive, 1));
  ASSERT_TRUE(w.ok()) << w.status().message();
  uint32_t wid = w->id();
  std::ofstream(d + "/a.txt") << "x";
  ::chmod((d + "/a.txt").c_str(), 0600);
  ::rename((d + "/a.txt").c_str(), (d + "/b.txt").c_str());
  ::unlink((d + "/b.txt").c_str());
  ::mkdir((d + "/sub").c_str(), 0755);
  ::usleep(100 * 1000);
  std::ofstream(d + "/sub/in.txt") << "y";

  std::vector<std::pair<int64_t, std::string>> want = {
      {1, "a.txt"}, {2, "a.txt"}, {5, "a.txt"},      {4, "a.txt"},     {1, "b.txt"},
      {3, "b.txt"}, {1, "sub"},   {1, "sub/in.txt"}, {2, "sub/in.txt"}};
  std::vector<std::pair<int64_t, std::string>> got;
  while (got.size() < want.size()) {
    auto f = c.Receive(5000);
    ASSERT_TRUE(f.ok()) << f.status().message() << " after " << got.size() << " events";
    ASSERT_EQ(f->type(), Type::kWatchEvent);
    ASSERT_EQ(f->id(), wid);
    got.emplace_back(f->fields.Int(Tag::kEvent), std::string(f->fields.Str(Tag::kName)));
    EXPECT_EQ(f->fields.Str(Tag::kPath), d + "/" + got.back().second);
  }
  EXPECT_EQ(got, want);
  ASSERT_TRUE(c.CallWithId(Type::kUnwatch, wid, Writer()).ok());
  std::ofstream(d + "/after.txt") << "z";
  auto none = c.Receive(300);
  EXPECT_FALSE(none.ok());
}

// The xattr records of an entry, by name.
std::map<std::string, std::string> XattrsOf(const Reader& fields) {
  std::map<std::string, std::string> out;
  for (std::string_view x : fields.All(Tag::kXattr)) {
    Reader r;
    EXPECT_TRUE(r.Parse(x));
    out[std::string(r.Str(Tag::kName))] = std::string(r.Str(Tag::kData));
  }
  return out;
}

Writer Xattr(std::string_view name, std::string_view value) {
  return Writer().Str(Tag::kName, name).Str(Tag::kData, value);
}

TEST_F(AgentTest, WriteSetsXattrsThatEntriesReport) {
  auto c = Connect();
  std::string path = dir_ + "/x/meta.txt";
  uint32_t id = c.NextId();
  ASSERT_TRUE(c.CallWithId(Type::kWriteBegin, id,
                           Writer()
                               .Str(Tag::kPath, path)
                               .Int(Tag::kParents, 1)
                               .Str(Tag::kXattrPrefix, "user.e2b.")
                               .Nested(Tag::kXattr, Xattr("user.e2b.owner", "alice"))
                               .Nested(Tag::kXattr, Xattr("user.e2b.empty", ""))
                               .Nested(Tag::kXattr, Xattr("user.other", "x")))
                  .ok());
  ASSERT_TRUE(c.Send(Type::kWriteData, id, Writer().Str(Tag::kData, "body")).ok());
  auto end = c.CallWithId(Type::kWriteEnd, id, Writer());
  ASSERT_TRUE(end.ok()) << end.status().message();
  std::map<std::string, std::string> want = {{"user.e2b.empty", ""}, {"user.e2b.owner", "alice"}};
  EXPECT_EQ(XattrsOf(end->fields), want);  // the reply reads back what was stored
  char value[64];
  ssize_t n = ::getxattr(path.c_str(), "user.other", value, sizeof value);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(value[0], 'x');

  auto st = c.Call(Type::kStat, Writer().Str(Tag::kPath, path).Str(Tag::kXattrPrefix, "user."));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(XattrsOf(st->fields).size(), 3u);
  auto plain = c.Call(Type::kStat, Writer().Str(Tag::kPath, path));
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->fields.Has(Tag::kXattr));  // only asked-for attributes cost a syscall
  std::vector<Frame> entries;
  ASSERT_TRUE(c.Call(Type::kList,
                     Writer().Str(Tag::kPath, dir_ + "/x").Str(Tag::kXattrPrefix, "user.e2b."),
                     &entries)
                  .ok());
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(XattrsOf(entries[0].fields), want);

  // An overwrite replaces the file, and with it every attribute.
  ASSERT_TRUE(WriteFile(c, path, "new").ok());
  EXPECT_EQ(::listxattr(path.c_str(), value, sizeof value), 0);

  // Only user.* names may be set or asked for, within the size bounds; nothing is created.
  for (const Writer& bad : {Xattr("trusted.x", "1"), Xattr("security.capability", "1"),
                            Xattr("user.", "1"), Xattr("user.big", std::string(20000, 'v')),
                            Xattr(std::string("user.") + std::string(251, 'k'), "1")}) {
    auto b = c.Call(Type::kWriteBegin,
                    Writer().Str(Tag::kPath, dir_ + "/x/bad").Nested(Tag::kXattr, bad));
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().err(), EINVAL);
  }
  EXPECT_EQ(::access((dir_ + "/x/bad").c_str(), F_OK), -1);
  auto prefix =
      c.Call(Type::kStat, Writer().Str(Tag::kPath, path).Str(Tag::kXattrPrefix, "trusted."));
  ASSERT_FALSE(prefix.ok());
  EXPECT_EQ(prefix.status().err(), EINVAL);
}

TEST_F(AgentTest, EntriesReportAtMost16KiBOfXattrs) {
  // ext4 keeps a file's xattrs in one 4 KiB block; tmpfs takes more.
  std::string mnt = dir_ + "/tmpfs";
  ASSERT_EQ(::mkdir(mnt.c_str(), 0755), 0);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=1m") != 0)
    GTEST_SKIP() << "cannot mount tmpfs: " << std::strerror(errno);
  struct Unmount {
    std::string dir;
    ~Unmount() { ::umount2(dir.c_str(), MNT_DETACH); }
  } unmount{mnt};
  auto c = Connect();
  std::string path = mnt + "/fat";
  std::ofstream(path) << "x";
  // As a process in a box could set them: nothing bounded them.
  std::string big(3000, 'b');
  for (int i = 0; i < 8; ++i) {
    std::string name = "user.k" + std::to_string(i);
    ASSERT_EQ(::setxattr(path.c_str(), name.c_str(), big.data(), big.size(), 0), 0)
        << std::strerror(errno);
  }
  auto st = c.Call(Type::kStat, Writer().Str(Tag::kPath, path).Str(Tag::kXattrPrefix, "user."));
  ASSERT_TRUE(st.ok());
  auto got = XattrsOf(st->fields);
  EXPECT_EQ(got.size(), 5u);  // 5 × 3007 bytes fit in 16384, a sixth does not
  for (const auto& [name, value] : got) EXPECT_EQ(value, big) << name;
}

TEST_F(AgentTest, WatchEventsCarryTheEntryWhenAsked) {
  auto c = Connect();
  std::string d = dir_ + "/we";
  ASSERT_EQ(::mkdir(d.c_str(), 0755), 0);
  auto w = c.Call(
      Type::kWatch,
      Writer().Str(Tag::kPath, d).Int(Tag::kWithEntry, 1).Str(Tag::kXattrPrefix, "user.e2b."));
  ASSERT_TRUE(w.ok()) << w.status().message();
  std::ofstream(d + "/a.txt") << "hello";
  ASSERT_EQ(::setxattr((d + "/a.txt").c_str(), "user.e2b.k", "v", 1, 0), 0);
  // Setting an xattr is an attribute change (event 5): its entry shows the attribute.
  for (;;) {
    auto f = c.Receive(5000);
    ASSERT_TRUE(f.ok()) << f.status().message();
    ASSERT_EQ(f->type(), Type::kWatchEvent);
    ASSERT_TRUE(f->fields.Has(Tag::kEntry));  // the file is still there
    Reader e;
    ASSERT_TRUE(e.Parse(f->fields.Str(Tag::kEntry)));
    EXPECT_EQ(e.Str(Tag::kPath), d + "/a.txt");
    EXPECT_EQ(e.Int(Tag::kFileType), static_cast<int64_t>(FileType::kFile));
    if (f->fields.Int(Tag::kEvent) == 5 && XattrsOf(e).count("user.e2b.k")) break;
  }
  ::unlink((d + "/a.txt").c_str());
  auto f = c.Receive(5000);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->fields.Int(Tag::kEvent), 3);
  EXPECT_FALSE(f->fields.Has(Tag::kEntry));  // gone: no entry
}

TEST_F(AgentTest, PauseHoldsOneSubscriptionAndNoOther) {
  auto c = Connect();
  constexpr int64_t kBig = 20000000;
  auto a = Spawn(c, Argv({"head", "-c", "20000000", "/dev/zero"}));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(c.Send(Type::kPause, a->id, Writer()).ok());
  auto b = Spawn(c, Argv({"sh", "-c", "for i in 1 2 3; do echo b$i; sleep 0.05; done"}));
  ASSERT_TRUE(b.ok());
  // B runs to its end while A is held; what A had sent before the PAUSE arrived still comes.
  int64_t a_bytes = 0;
  std::string b_out;
  bool b_done = false, a_done = false;
  auto take = [&](const Frame& f) {
    if (f.type() == Type::kOutput && f.id() == a->id) a_bytes += f.fields.Str(Tag::kData).size();
    if (f.type() == Type::kOutput && f.id() == b->id) b_out += f.fields.Str(Tag::kData);
    if (f.type() == Type::kExit) (f.id() == a->id ? a_done : b_done) = true;
  };
  while (!b_done) {
    auto f = c.Receive(5000);
    ASSERT_TRUE(f.ok()) << f.status().message();
    take(*f);
  }
  EXPECT_EQ(b_out, "b1\nb2\nb3\n");
  for (auto f = c.Receive(300); f.ok(); f = c.Receive(300)) take(*f);
  int64_t held = a_bytes;
  // Meanwhile requests are answered, and a READ can be paused just the same. The file is larger
  // than what the agent may queue (4 MiB) before it reads the PAUSE that follows the READ.
  constexpr int64_t kFile = 32 << 20;
  std::string file = dir_ + "/big.bin";
  std::ofstream(file) << std::string(kFile, 'r');
  uint32_t rid = c.NextId();
  ASSERT_TRUE(c.Send(Type::kRead, rid, Writer().Str(Tag::kPath, file)).ok());
  ASSERT_TRUE(c.Send(Type::kPause, rid, Writer()).ok());
  auto st = c.Call(Type::kStat, Writer().Str(Tag::kPath, file));
  ASSERT_TRUE(st.ok()) << st.status().message();
  int64_t read_bytes = 0;
  bool read_done = false;
  auto take_read = [&](const Frame& f) {
    if (f.id() == rid && f.type() == Type::kData) read_bytes += f.fields.Str(Tag::kData).size();
    if (f.id() == rid && f.type() == Type::kOk) read_done = true;
    take(f);
  };
  for (auto f = c.Receive(300); f.ok(); f = c.Receive(300)) take_read(*f);
  EXPECT_EQ(a_bytes, held) << "A sent output while paused";
  EXPECT_LT(a_bytes, kBig);
  EXPECT_FALSE(a_done);
  EXPECT_FALSE(read_done);
  // RESUME: everything comes, nothing lost.
  ASSERT_TRUE(c.Send(Type::kResume, a->id, Writer()).ok());
  ASSERT_TRUE(c.Send(Type::kResume, rid, Writer()).ok());
  while (!a_done || !read_done) {
    auto f = c.Receive(10000);
    ASSERT_TRUE(f.ok()) << f.status().message();
    take_read(*f);
  }
  EXPECT_EQ(a_bytes, kBig);
  EXPECT_EQ(read_bytes, kFile);
}

int RawConnect(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un a {};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return -1;
  return fd;
}

// True when the agent closes `fd` within a second.
bool ClosedByPeer(int fd) {
  struct timeval tv {
    1, 0
  };
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[256];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
}

// The runtime makes the agent unkillable by the OOM killer (oom_score_adj -1000); what it spawns
// must not be, or a memory bomb would be unkillable too.
TEST_F(AgentTest, SpawnedProcessesAreTheOomKillersFirstChoice) {
  auto c = Connect();  // the agent is up
  std::string adj = "/proc/" + std::to_string(pid_) + "/oom_score_adj";
  auto agent_score = [&] {
    std::ifstream in(adj);
    std::string v;
    in >> v;
    return v;
  };
  // Whatever the agent's own score, what it spawns is at +500, nested children included, and as
  // another user too (the score is set before the ids change).
  for (const char* score : {"0", "300", "-1000"}) {
    { std::ofstream(adj) << score; }
    if (agent_score() != score) {
      // A negative score needs CAP_SYS_RESOURCE, which some hosts withhold even from root.
      EXPECT_EQ(score[0], '-') << "could not set the agent's score to " << score;
      continue;
    }
    Run r = RunToEnd(
        c,
        Argv({"sh", "-c", "cat /proc/self/oom_score_adj; sh -c 'cat /proc/self/oom_score_adj'"}));
    EXPECT_EQ(r.out, "500\n500\n") << "agent at " << score;
    EXPECT_EQ(r.exit_code, 0) << r.err;
    r = RunToEnd(c, Argv({"cat", "/proc/self/oom_score_adj"}).Str(Tag::kUser, "65534"));
    EXPECT_EQ(r.out, "500\n") << "agent at " << score;
    EXPECT_EQ(agent_score(), score);
  }
}

// The rings of the processes come out of the box-wide budget: they shrink as it fills, then SPAWN
// is refused with EAGAIN; a finished process nobody is receiving gives its room back.
TEST_F(AgentTest, RingsShrinkThenSpawnIsRefusedAtTheMemoryCap) {
  Stop();
  Start({"--memory-cap", "8M"});
  auto c = Connect();
  EXPECT_EQ(c.memory_cap(), 8 << 20);
  // The record counts too: a 300 KiB tag makes each process cost at least that.
  std::string tag(300 << 10, 't');
  std::vector<Run> runs;
  std::vector<int64_t> sizes;
  Status refused;
  for (int i = 0; i < 20; ++i) {
    auto ok = c.Call(Type::kSpawn, Argv({"sleep", "100"}).Str(Tag::kTag, tag));
    if (!ok.ok()) {
      refused = ok.status();
      break;
    }
    Run r;
    r.id = ok->id();
    r.pid = ok->fields.Int(Tag::kPid);
    runs.push_back(r);
    sizes.push_back(ok->fields.Int(Tag::kBufferBytes));
  }
  ASSERT_FALSE(refused.ok()) << "20 spawns with 300 KiB records each fit under an 8 MiB cap";
  EXPECT_EQ(refused.err(), EAGAIN);
  EXPECT_NE(refused.message().find("at the box's cap"), std::string::npos) << refused.message();
  ASSERT_GE(sizes.size(), 2u);
  EXPECT_LT(sizes[0], 1 << 20) << "the default 1 MiB rings do not fit twice in the ring ceiling";
  for (size_t i = 1; i < sizes.size(); ++i) {
    EXPECT_LE(sizes[i], sizes[i - 1]);
    EXPECT_GE(sizes[i], 4096);
  }
  EXPECT_LT(sizes[1], sizes[0]);
  EXPECT_EQ(sizes.back(), 4096) << "the last ones before the refusal get the smallest rings";
  int64_t rings = 0;
  for (int64_t s : sizes) rings += 2 * s;
  EXPECT_LE(rings, 8 << 20);

  // The first one ends and its EXIT is delivered: the next SPAWN may drop it to make room.
  ASSERT_TRUE(
      c.Call(Type::kSignal, Writer().Int(Tag::kPid, runs[0].pid).Int(Tag::kSignal, 9)).ok());
  Collect(c, &runs[0]);
  EXPECT_EQ(runs[0].signal, 9);
  auto again = c.Call(Type::kSpawn, Argv({"/bin/echo", "room"}).Str(Tag::kTag, tag));
  ASSERT_TRUE(again.ok()) << again.status().message();
  std::vector<Frame> entries;
  ASSERT_TRUE(c.Call(Type::kListProcs, Writer(), &entries).ok());
  for (const auto& e : entries) EXPECT_NE(e.fields.Int(Tag::kPid), runs[0].pid);
}

// Queued stdin is reserved from the same budget: one process that does not read its input cannot
// take the room of every other.
TEST_F(AgentTest, StdinQueuesStopAtTheMemoryCap) {
  Stop();
  Start({"--memory-cap", "8M"});
  auto c = Connect();
  auto a = Spawn(c, Argv({"sleep", "100"}).Int(Tag::kStdinOpen, 1));
  auto b = Spawn(c, Argv({"cat"}).Int(Tag::kStdinOpen, 1));
  ASSERT_TRUE(a.ok() && b.ok());
  std::string chunk(256 << 10, 'x');
  Status full;
  int64_t queued = 0;
  for (int i = 0; i < 64 && full.ok(); ++i) {
    auto r = c.Call(Type::kStdin, Writer().Int(Tag::kPid, a->pid).Str(Tag::kData, chunk));
    if (r.ok())
      queued += static_cast<int64_t>(chunk.size());
    else
      full = r.status();
  }
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.err(), EAGAIN);
  // Under the 4 MiB per-process bound: the cap (8 MiB minus the connections' floors) came first.
  EXPECT_NE(full.message().find("at the box's cap"), std::string::npos) << full.message();
  EXPECT_LT(queued, 4 << 20);
  auto refused = c.Call(Type::kStdin, Writer().Int(Tag::kPid, b->pid).Str(Tag::kData, chunk));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().err(), EAGAIN);

  // The process that holds it ends: its queue goes, and the other one's input flows.
  ASSERT_TRUE(c.Call(Type::kSignal, Writer().Int(Tag::kPid, a->pid).Int(Tag::kSignal, 9)).ok());
  Collect(c, &a.value());
  ASSERT_TRUE(c.Call(Type::kStdin, Writer().Int(Tag::kPid, b->pid).Str(Tag::kData, "tail")).ok());
  ASSERT_TRUE(c.Call(Type::kCloseStdin, Writer().Int(Tag::kPid, b->pid)).ok());
  Collect(c, &b.value());
  EXPECT_EQ(b->out, "tail");
}

long VmRssKb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

// Send queues have their pool of the budget: connections that never read their floods hold the
// agent at the pool's bound (not 4 MiB each), new processes still start (their rings have their
// own pool), and a connection that reads is still served.
TEST_F(AgentTest, UnreadConnectionsStopAtTheMemoryCap) {
  Stop();
  Start({"--memory-cap", "8M"});
  std::vector<AgentConnection> floods;
  int64_t rings = 0;  // what the floods' rings and records reserved
  for (int i = 0; i < 6; ++i) {
    floods.push_back(Connect());
    auto ok = floods.back().Call(Type::kSpawn, Argv({"head", "-c", "256M", "/dev/zero"}));
    ASSERT_TRUE(ok.ok()) << i << ": " << ok.status().message();
    rings += 2 * ok->fields.Int(Tag::kBufferBytes) + 1024;
  }
  // The floods fill their queues until the send pool (a quarter of the cap) reaches its threshold
  // (the pool minus 64 connections x 16 KiB).
  const int64_t threshold = (2 << 20) - 64 * (16 << 10);
  int64_t sent = 0;
  for (int i = 0; i < 2000; ++i) {
    sent = Connect().memory_used() - rings;
    if (sent >= threshold) break;
    ::usleep(10000);
  }
  ASSERT_GE(sent, threshold) << "the floods never filled the send pool";
  auto c = Connect();
  Run r = RunToEnd(c, Argv({"/bin/echo", "served"}));
  EXPECT_EQ(r.out, "served\n");
  sent = Connect().memory_used() - rings;
  // At most its floor and one frame (256 KiB of data) more per connection.
  EXPECT_LE(sent, threshold + 8 * (kMaxChunk + (16 << 10) + 4096)) << sent;
  // Without the cap: 6 x (4 MiB queue + 2 x 1 MiB rings) = 36 MiB.
  long rss = VmRssKb(pid_);
  EXPECT_GT(rss, 0);
  EXPECT_LT(rss, 14 * 1024) << "agent RSS " << rss << " KiB";
}

TEST_F(AgentTest, MemoryCapFlagIsChecked) {
  Stop();
  for (const char* bad : {"1M", "abc", "9999999999999G"}) {
    Start({"--memory-cap", bad});
    int st;
    ASSERT_EQ(::waitpid(pid_, &st, 0), pid_);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2) << bad;
    pid_ = -1;
    Stop();
  }
  Start({});
}

TEST_F(AgentTest, GarbageClosesTheConnectionButNotTheAgent) {
  { auto warm = Connect(); }
  int fd = RawConnect(socket_);
  ASSERT_GE(fd, 0);
  std::string junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::write(fd, junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
  EXPECT_TRUE(ClosedByPeer(fd));
  ::close(fd);

  // A well-formed first frame that is not HELLO.
  fd = RawConnect(socket_);
  std::string stat = EncodeFrame(Type::kStat, 1, Writer().Str(Tag::kPath, "/"));
  ASSERT_EQ(::write(fd, stat.data(), stat.size()), static_cast<ssize_t>(stat.size()));
  EXPECT_TRUE(ClosedByPeer(fd));
  ::close(fd);

  // Oversized frame after a good handshake.
  fd = RawConnect(socket_);
  std::string hello = EncodeFrame(Type::kHello, 1, Writer().Int(Tag::kVersion, kProtocolVersion));
  ASSERT_EQ(::write(fd, hello.data(), hello.size()), static_cast<ssize_t>(hello.size()));
  std::string big = EncodeFrame(Type::kStat, 2, std::string_view());
  uint32_t len = kMaxPayload + 1;
  std::memcpy(big.data(), &len, 4);
  ASSERT_EQ(::write(fd, big.data(), big.size()), static_cast<ssize_t>(big.size()));
  EXPECT_TRUE(ClosedByPeer(fd));
  ::close(fd);

  // Malformed payload after the handshake is EINVAL, not a crash.
  auto c = Connect();
  std::string bad = "\x30\x00\xff\xff\x00\x00";
  Writer raw;
  ASSERT_TRUE(c.Send(Type::kStat, 77, raw).ok());
  {
    int rfd = c.fd();
    std::string frame = EncodeFrame(Type::kStat, 78, std::string_view(bad));
    ASSERT_EQ(::write(rfd, frame.data(), frame.size()), static_cast<ssize_t>(frame.size()));
  }
  for (int i = 0; i < 2; ++i) {
    auto f = c.Receive(2000);
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(f->type(), Type::kError);
    EXPECT_EQ(f->fields.Int(Tag::kErrno), EINVAL);
  }
  // Wrong protocol version is EPROTONOSUPPORT.
  fd = RawConnect(socket_);
  std::string v2 = EncodeFrame(Type::kHello, 1, Writer().Int(Tag::kVersion, 99));
  ASSERT_EQ(::write(fd, v2.data(), v2.size()), static_cast<ssize_t>(v2.size()));
  char hdr[512];
  ssize_t n = ::read(fd, hdr, sizeof hdr);
  ASSERT_GE(n, static_cast<ssize_t>(kHeaderSize));
  Header h;
  ASSERT_TRUE(DecodeHeader(hdr, &h));
  EXPECT_EQ(h.type, Type::kError);
  EXPECT_TRUE(ClosedByPeer(fd));
  ::close(fd);

  // Still serving.
  Run r = RunToEnd(c, Argv({"/bin/echo", "alive"}));
  EXPECT_EQ(r.out, "alive\n");
}

}  // namespace
}  // namespace sbx::protocol
