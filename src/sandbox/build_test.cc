// Builds with the real native runtime, store and template cache: RUN steps run in real boxes,
// and the built template is then used by a real box to show what the build made.
#include "sandbox/build.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <tuple>

#include "common/fd.h"
#include "common/fs.h"
#include "protocol/client.h"
#include "runtime/native/native_runtime.h"
#include "sandbox/session.h"
#include "storage/dockerfile.h"
#include "storage/template.h"
#include "store/store.h"

namespace sbx::sandbox {
namespace {

using protocol::Tag;
using protocol::Type;

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") out.push_back(n);
    }
    ::closedir(d);
  }
  return out;
}

class BuildTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-build-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    ASSERT_EQ(::chmod(tmpl, 0711), 0);
    dir_ = tmpl;
    runtime::NativeConfig cfg;
    cfg.run_dir = dir_ + "/run";
    cfg.agent_path = SBX_AGENT_BIN;
    cfg.cgroup_parent = "sbx-build-test-" + std::to_string(::getpid());
    auto rt = runtime::NativeRuntime::Open(cfg);
    ASSERT_TRUE(rt.ok()) << rt.status().message();
    rt_ = std::move(rt).value();
    auto st = store::Store::Open(dir_ + "/sbx.db");
    ASSERT_TRUE(st.ok()) << st.status().message();
    st_ = std::move(st).value();
    ts_.dir = dir_ + "/templates";
    ctx_ = dir_ + "/ctx";
    ASSERT_TRUE(MakeDirs(ctx_ + "/dir/sub").ok());
    BuilderConfig bc;
    bc.runtime = rt_.get();
    bc.templates = ts_;
    bc.store = st_.get();
    bc.default_limits.memory_bytes = 512 << 20;
    builder_ = MakeBuilder(bc);
  }

  void TearDown() override {
    builder_.reset();
    // Nothing of any box is left: directories, mounts, cgroups; no staging directory either.
    EXPECT_EQ(Entries(dir_ + "/run"), std::vector<std::string>{}) << "a box was left";
    EXPECT_EQ(Entries(ts_.dir + "/staging"), std::vector<std::string>{})
        << "a staging dir was left";
    auto mounts = ReadFile("/proc/self/mountinfo");
    ASSERT_TRUE(mounts.ok());
    EXPECT_EQ(mounts->find(dir_), std::string::npos) << "a mount was left";
    for (const auto& [controller, parent] : rt_->cgroup_host().v1_dirs) ::rmdir(parent.c_str());
    if (!rt_->cgroup_host().v2_dir.empty()) ::rmdir(rt_->cgroup_host().v2_dir.c_str());
    (void)RemoveTree(dir_);  // the test's scratch directory: a leftover in /tmp harms no result
  }

  void Write(const std::string& rel, const std::string& content, int mode = 0644) {
    if (rel.find('/') != std::string::npos) {
      ASSERT_TRUE(MakeDirs(ctx_ + "/" + rel.substr(0, rel.rfind('/'))).ok());
    }
    ASSERT_TRUE(WriteFile(ctx_ + "/" + rel, content, mode).ok());
  }

  BuildSpec Spec(const std::string& name, const std::string& dockerfile) {
    auto steps = storage::ParseDockerfile(dockerfile, {});
    EXPECT_TRUE(steps.ok()) << steps.status().message();
    BuildSpec s;
    s.name = name;
    s.steps = steps.ok() ? *steps : std::vector<storage::BuildStep>{};
    s.context_dir = ctx_;
    return s;
  }

  struct Built {
    Result<store::TemplateRecord> rec = Status::Error("not run");
    std::vector<std::string> log;
    int Count(const std::string& what) const {
      int n = 0;
      for (const auto& l : log) n += l.find(what) != std::string::npos;
      return n;
    }
  };

  Built Run(BuildSpec spec) {
    Built b;
    b.rec = builder_->Run(std::move(spec), [&](const BuildLogLine& l) { b.log.push_back(l.text); });
    return b;
  }

  // Runs `script` with /bin/sh -c in a fresh box of template `name`, with the template's defaults
  // as every API applies them; returns its stdout (and stderr).
  std::string InBox(const std::string& name, const std::string& script) {
    auto t = storage::ResolveTemplate(ts_, *st_, name, "");
    EXPECT_TRUE(t.ok()) << t.status().message();
    if (!t.ok()) return "";
    runtime::BoxSpec spec;
    spec.id = RandomId();
    spec.layers = t->layers;
    spec.binds = t->binds;
    spec.limits.memory_bytes = 256 << 20;
    auto box = rt_->Create(spec);
    EXPECT_TRUE(box.ok()) << box.status().message();
    if (!box.ok()) return "";
    std::string out;
    {
      auto conn = protocol::AgentConnection::Connect(box->agent_socket);
      EXPECT_TRUE(conn.ok());
      CommandSpec cmd;
      cmd.argv = {"/bin/sh", "-c", script};
      auto w = SpawnRequest({t->env, t->user, t->workdir}, {}, cmd);
      EXPECT_TRUE(w.ok());
      uint32_t id = conn->NextId();
      auto reply = conn->CallWithId(Type::kSpawn, id, *w, nullptr, 10000);
      EXPECT_TRUE(reply.ok()) << reply.status().message();
      for (; reply.ok();) {
        auto f = conn->Receive(30000);
        if (!f.ok()) break;
        if (f->header.id != id) continue;
        if (f->type() == Type::kOutput) out += f->fields.Str(Tag::kData);
        if (f->type() == Type::kExit) break;
      }
    }
    EXPECT_TRUE(rt_->Destroy(*box).ok());
    return out;
  }

  std::string dir_, ctx_;
  std::unique_ptr<runtime::NativeRuntime> rt_;
  std::unique_ptr<store::Store> st_;
  storage::TemplateStore ts_;
  std::unique_ptr<Builder> builder_;
};

const char kDockerfile[] =
    "FROM host\n"
    "ARG WHO=builder\n"
    "ENV GREETING=hello\n"
    "RUN echo \"$GREETING from $WHO\" > /opt/run.txt && mkdir /opt/made && echo line one && "
    "echo line two >&2\n"
    "COPY app.txt /opt/app/\n"
    "COPY --chown=user:user dir/ /home/user/app/\n"
    "WORKDIR /srv/work\n"
    "USER user\n"
    "RUN id -un > /tmp/whoami && pwd > /tmp/pwd && rm /opt/run.txt.keep 2>/dev/null; true\n"
    "CMD [\"sleep\", \"1\"]\n";

TEST_F(BuildTest, BuildsATemplateThatABoxRuns) {
  Write("app.txt", "app content\n");
  Write("dir/f", "f content\n", 0755);
  Write("dir/sub/g", "g\n");
  ASSERT_EQ(::symlink("../f", (ctx_ + "/dir/sub/link").c_str()), 0);
  auto b = Run(Spec("built", kDockerfile));
  ASSERT_TRUE(b.rec.ok()) << b.rec.status().message();
  // The log reads as docker build's.
  EXPECT_EQ(b.log.front(), "Step 1/10 : FROM host");
  EXPECT_EQ(b.Count("Step "), 10);
  // The RUN's output, one log line per line (the step line has the words too).
  EXPECT_EQ(std::count(b.log.begin(), b.log.end(), "line one"), 1);
  EXPECT_EQ(std::count(b.log.begin(), b.log.end(), "line two"), 1);
  EXPECT_EQ(b.Count(" ---> Running in "), 2);
  EXPECT_EQ(b.Count("Using cache"), 0);
  EXPECT_EQ(b.log.back().rfind("Successfully built built (", 0), 0u) << b.log.back();
  EXPECT_EQ(b.rec->kind, store::kTemplateBuild);
  // RUN, RUN, COPY, COPY, WORKDIR (the directory was missing), then the host layer.
  ASSERT_EQ(b.rec->layers.size(), 6u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(b.rec->layers[i].rfind("build-", 0), 0u);
  EXPECT_EQ(b.rec->layers[5].rfind("host-", 0), 0u);
  auto config = storage::GetImageConfig(*st_, "built");
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->cmd, (std::vector<std::string>{"sleep", "1"}));
  EXPECT_EQ(config->user, "user");
  EXPECT_EQ(config->workdir, "/srv/work");

  std::string out =
      InBox("built",
            "cat /opt/run.txt /opt/app/app.txt /home/user/app/f /home/user/app/sub/g; "
            "readlink /home/user/app/sub/link; stat -c '%U %a' /home/user/app/f /opt/made "
            "/tmp; echo \"$GREETING $WHO\"; id -un; pwd; cat /tmp/whoami /tmp/pwd");
  EXPECT_EQ(out,
            "hello from builder\napp content\nf content\ng\n../f\nuser 755\nroot 755\nroot 1777\n"
            "hello \nuser\n/srv/work\nuser\n/srv/work\n");
}

TEST_F(BuildTest, ARebuildReusesEveryStepAndAChangedFileInvalidatesFromItsStep) {
  Write("app.txt", "v1\n");
  Write("dir/f", "f\n");
  auto first = Run(Spec("cached", kDockerfile));
  ASSERT_TRUE(first.rec.ok()) << first.rec.status().message();
  auto second = Run(Spec("cached", kDockerfile));
  ASSERT_TRUE(second.rec.ok()) << second.rec.status().message();
  EXPECT_EQ(second.Count("Using cache"), 5);  // RUN, COPY, COPY, WORKDIR, RUN
  EXPECT_EQ(second.Count("Running in"), 0);   // no RUN ran
  EXPECT_EQ(second.rec->layers, first.rec->layers);

  // A changed COPY source: the steps before it are reused, it and every later one are not.
  Write("app.txt", "v2\n");
  auto third = Run(Spec("cached", kDockerfile));
  ASSERT_TRUE(third.rec.ok()) << third.rec.status().message();
  EXPECT_EQ(third.Count("Using cache"), 1);  // the first RUN only
  EXPECT_EQ(third.Count("Running in"), 1);   // the RUN after the COPY
  ASSERT_EQ(third.rec->layers.size(), first.rec->layers.size());
  EXPECT_EQ(third.rec->layers.back(), first.rec->layers.back());
  EXPECT_EQ(third.rec->layers[4], first.rec->layers[4]);  // the first RUN's layer
  for (size_t i = 0; i < 4; ++i) EXPECT_NE(third.rec->layers[i], first.rec->layers[i]);
  EXPECT_EQ(InBox("cached", "cat /opt/app/app.txt"), "v2\n");

  // --no-cache runs every step again.
  auto spec = Spec("cached", kDockerfile);
  spec.no_cache = true;
  auto fourth = Run(std::move(spec));
  ASSERT_TRUE(fourth.rec.ok()) << fourth.rec.status().message();
  EXPECT_EQ(fourth.Count("Using cache"), 0);
  EXPECT_EQ(fourth.Count("Running in"), 2);
}

// A key's builds never reuse a step another key's build ran: that "Using cache" would answer a
// guess of what another key built (its ARG values included), and hand over a layer that another
// key's RUN made with its own network. The operator's builds (key "") share a cache.
TEST_F(BuildTest, AKeysBuildsDoNotReuseAnotherKeysSteps) {
  const char* dockerfile = "FROM host\nARG TOKEN=guess\nRUN echo \"$TOKEN\" > /opt/token\n";
  auto build = [&](const std::string& name, const std::string& key) {
    auto spec = Spec(name, dockerfile);
    spec.owner_key_id = key;
    return Run(std::move(spec));
  };
  auto a = build("a-first", "key_a");
  ASSERT_TRUE(a.rec.ok()) << a.rec.status().message();
  EXPECT_EQ(a.Count("Running in"), 1);
  auto b = build("b-first", "key_b");
  ASSERT_TRUE(b.rec.ok()) << b.rec.status().message();
  EXPECT_EQ(b.Count("Using cache"), 0);
  EXPECT_EQ(b.Count("Running in"), 1);
  EXPECT_NE(b.rec->layers.front(), a.rec->layers.front());
  auto op = build("op-first", "");
  ASSERT_TRUE(op.rec.ok()) << op.rec.status().message();
  EXPECT_EQ(op.Count("Using cache"), 0);
  // Each reuses its own.
  for (const auto& [name, key, first] :
       {std::tuple{"a-again", "key_a", &a}, {"b-again", "key_b", &b}, {"op-again", "", &op}}) {
    SCOPED_TRACE(name);
    auto again = build(name, key);
    ASSERT_TRUE(again.rec.ok()) << again.rec.status().message();
    EXPECT_EQ(again.Count("Using cache"), 1);
    EXPECT_EQ(again.Count("Running in"), 0);
    EXPECT_EQ(again.rec->layers, first->rec->layers);
  }
}

// A key's build layers are charged to it, as its snapshots are: past what it may save the build
// fails (EDQUOT, 507 at the API) with nothing of the step recorded.
TEST_F(BuildTest, AKeysBuildLayersAreChargedToItWithinWhatItMaySave) {
  auto spec = Spec("charged", "FROM host\nRUN head -c 300000 /dev/urandom > /opt/big\n");
  spec.owner_key_id = "key_a";
  spec.max_saved_bytes = 100000;
  auto over = Run(spec);
  EXPECT_EQ(over.rec.status().err(), EDQUOT) << over.rec.status().message();
  EXPECT_NE(over.rec.status().message().find("key_a may save"), std::string::npos)
      << over.rec.status().message();
  EXPECT_EQ(*st_->LayerBytesOwnedBy("key_a"), 0);
  for (const auto& l : *st_->ListLayers()) EXPECT_NE(l.owner_key_id, "key_a") << l.id;
  spec.max_saved_bytes = 10 << 20;
  auto fits = Run(spec);
  ASSERT_TRUE(fits.rec.ok()) << fits.rec.status().message();
  EXPECT_EQ((*st_->GetLayer(fits.rec->layers.front()))->owner_key_id, "key_a");
  EXPECT_GE(*st_->LayerBytesOwnedBy("key_a"), 300000);
  // The operator's builds are nobody's to charge.
  auto op = Run(Spec("operators", "FROM host\nRUN echo op > /opt/op\n"));
  ASSERT_TRUE(op.rec.ok()) << op.rec.status().message();
  EXPECT_EQ((*st_->GetLayer(op.rec->layers.front()))->owner_key_id, "");
}

// A build has a time limit (an API build: kBuildTimeoutMs): a RUN step still running at it is
// stopped, output or not, its box removed (TearDown checks) and the build failed. And a key runs
// at most max_builds_per_key builds at once, each holding a box, however many it starts.
TEST_F(BuildTest, ABuildStopsAtItsTimeLimitAndAKeyRunsFewBuildsAtOnce) {
  for (const char* run : {"sleep 600", "while :; do echo tick; sleep 0.01; done"}) {
    SCOPED_TRACE(run);
    auto spec = Spec("slow", std::string("FROM host\nRUN ") + run + "\n");
    spec.timeout_ms = 300;
    auto r = Run(spec);
    EXPECT_EQ(r.rec.status().err(), ETIMEDOUT) << r.rec.status().message();
    EXPECT_NE(r.rec.status().message().find("the build passed its time limit of 0.3 s"),
              std::string::npos)
        << r.rec.status().message();
  }

  auto held = Spec("held", "FROM host\nRUN sleep 600\n");
  held.timeout_ms = 1500;
  auto start = [&](const std::string& key) {
    auto spec = held;
    spec.owner_key_id = key;
    return builder_->Start(std::move(spec));
  };
  std::vector<std::string> ids;
  for (const char* key : {"key_a", "key_a", "key_b", ""}) {
    auto id = start(key);
    ASSERT_TRUE(id.ok()) << key << ": " << id.status().message();
    ids.push_back(*id);
  }
  auto third = start("key_a");
  EXPECT_EQ(third.status().err(), EAGAIN);
  EXPECT_NE(third.status().message().find("key_a runs 2 builds: at most 2 at once"),
            std::string::npos)
      << third.status().message();
  // Once they have ended (at their limit), key_a starts again.
  for (const std::string& id : ids) {
    Result<BuildStatus> st = Status::Error("none");
    for (int i = 0; i < 6000; ++i) {  // a bounded poll, as above
      st = builder_->Get(id, 0);
      ASSERT_TRUE(st.ok());
      if (st->state != BuildState::kBuilding) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(st->state, BuildState::kError);
    EXPECT_NE(st->error.find("time limit"), std::string::npos) << st->error;
  }
  auto again = Spec("again", "FROM host\nRUN true\n");
  again.owner_key_id = "key_a";
  auto id = builder_->Start(std::move(again));
  EXPECT_TRUE(id.ok()) << id.status().message();
}

TEST_F(BuildTest, AFailingRunReportsItsStepAndExitCodeAndLeavesNothing) {
  auto b = Run(
      Spec("failing", "FROM host\nRUN echo before > /opt/x\nRUN echo oops; exit 3\nRUN true\n"));
  ASSERT_FALSE(b.rec.ok());
  EXPECT_EQ(b.rec.status().what(), "step 3/4 (RUN echo oops; exit 3): returned a non-zero code: 3");
  EXPECT_EQ(b.Count("oops"), 3);  // the step line, the output, the error line
  auto t = st_->GetTemplate("failing");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->has_value());
  // TearDown checks boxes, mounts and staging directories; the pins of the build are gone too:
  // the first step's layer is in the cache but unused.
  auto unused = st_->UnusedLayers();
  ASSERT_TRUE(unused.ok());
  bool found = false;
  for (const auto& l : *unused) found = found || l.id.rfind("build-", 0) == 0;
  EXPECT_TRUE(found);
}

TEST_F(BuildTest, StartAndGetRunInTheBackgroundWithPagedLogs) {
  auto id = builder_->Start(Spec("bg", "FROM host\nRUN echo one; echo two\n"));
  ASSERT_TRUE(id.ok()) << id.status().message();
  EXPECT_EQ(id->rfind("bld_", 0), 0u);
  Result<BuildStatus> st = Status::Error("none");
  // A bounded poll of the build's state (it runs a real box).
  for (int i = 0; i < 6000; ++i) {
    st = builder_->Get(*id, 0);
    ASSERT_TRUE(st.ok());
    if (st->state != BuildState::kBuilding) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(st->state, BuildState::kReady) << st->error;
  EXPECT_GT(st->size_bytes, 0);
  ASSERT_GE(st->logs.size(), 4u);
  auto tail = builder_->Get(*id, static_cast<int64_t>(st->logs.size()) - 1);
  ASSERT_TRUE(tail.ok());
  ASSERT_EQ(tail->logs.size(), 1u);
  EXPECT_EQ(tail->logs[0].text, st->logs.back().text);
  EXPECT_EQ(builder_->Get("bld_nope", 0).status().err(), ENOENT);
  // A bad spec is refused at once.
  EXPECT_EQ(builder_->Start(Spec("bg2", "FROM nosuchtemplate\n")).status().err(), EINVAL);
  // So is a network policy on a builder without a network stack (a policy that lets nothing
  // out is none).
  BuildSpec open = Spec("bg3", "FROM host\nRUN true\n");
  open.network.mode = network::Mode::kOpen;
  auto refused = builder_->Start(open);
  EXPECT_EQ(refused.status().err(), EINVAL);
  EXPECT_NE(refused.status().message().find("networking is not enabled"), std::string::npos)
      << refused.status().message();
  BuildSpec nothing = Spec("bg3", "FROM host\nRUN true\n");
  nothing.network.mode = network::Mode::kAllowlist;
  auto r = Run(nothing);
  EXPECT_TRUE(r.rec.ok()) << r.rec.status().message();
}

TEST_F(BuildTest, CopyStaysInsideTheContext) {
  ASSERT_EQ(::symlink("/etc", (ctx_ + "/etc-link").c_str()), 0);
  ASSERT_EQ(::symlink("/etc/passwd", (ctx_ + "/passwd-link").c_str()), 0);
  // Lexically outside: refused before anything runs.
  EXPECT_EQ(builder_->Start(Spec("escape", "FROM host\nCOPY ../x /x\n")).status().err(), EINVAL);
  // Through symlinks: they resolve inside the context, where there is no /etc/passwd.
  auto b = Run(Spec("escape", "FROM host\nCOPY etc-link/passwd /x\n"));
  EXPECT_FALSE(b.rec.ok());
  EXPECT_EQ(b.rec.status().err(), ENOENT) << b.rec.status().message();
  b = Run(Spec("escape", "FROM host\nCOPY passwd-link /x\n"));
  EXPECT_EQ(b.rec.status().err(), ENOENT) << b.rec.status().message();
  // A symlink below a copied directory is copied as a link, never followed.
  ASSERT_TRUE(MakeDirs(ctx_ + "/d").ok());
  ASSERT_EQ(::symlink("/etc/shadow", (ctx_ + "/d/s").c_str()), 0);
  b = Run(Spec("escape", "FROM host\nCOPY d /d\n"));
  ASSERT_TRUE(b.rec.ok()) << b.rec.status().message();
  EXPECT_EQ(InBox("escape", "readlink /d/s"), "/etc/shadow\n");
}

// .dockerignore: excluded files never reach a layer (nor the step's cache key), `!` brings one
// back inside an excluded directory, and naming an excluded file is an error.
TEST_F(BuildTest, DockerignoreKeepsFilesOutOfTheLayers) {
  Write(".dockerignore", "# local state\n.env\n**/*.log\nnode_modules\ndocs\n!docs/README.md\n");
  Write(".env", "SECRET=1\n");
  Write("app/main.py", "print(1)\n");
  Write("app/debug.log", "noise\n");
  Write("app/deep/x.log", "noise\n");
  Write("node_modules/pkg/index.js", "x\n");
  Write("docs/README.md", "readme\n");
  Write("docs/internal.md", "internal\n");
  auto b = Run(Spec("ignored", "FROM host\nCOPY . /ctx/\n"));
  ASSERT_TRUE(b.rec.ok()) << b.rec.status().message();
  EXPECT_EQ(InBox("ignored", "cd /ctx && find . | sort"),
            ".\n./.dockerignore\n./app\n./app/deep\n./app/main.py\n./dir\n./dir/sub\n./docs\n"
            "./docs/README.md\n");
  // A change to an excluded file is not a change of the step.
  Write("app/debug.log", "more noise\n");
  auto again = Run(Spec("ignored", "FROM host\nCOPY . /ctx/\n"));
  ASSERT_TRUE(again.rec.ok()) << again.rec.status().message();
  EXPECT_EQ(again.Count("Using cache"), 1);
  auto named = Run(Spec("ignored2", "FROM host\nCOPY .env /\n"));
  ASSERT_FALSE(named.rec.ok());
  EXPECT_NE(named.rec.status().what().find("COPY .env: excluded by .dockerignore"),
            std::string::npos)
      << named.rec.status().what();
}

// E2B's COPY (BuildStep::copy_links) copies a source that is a link as the link, dangling or
// absolute alike; a Dockerfile's follows it inside the context and fails on a dangling one.
TEST_F(BuildTest, E2bCopyKeepsSourceLinksAsLinks) {
  Write("folder/file.txt", "content\n");
  ASSERT_EQ(::symlink("/etc/hostname", (ctx_ + "/folder/absolute").c_str()), 0);
  ASSERT_EQ(::symlink("missing.txt", (ctx_ + "/folder/dangling").c_str()), 0);
  auto docker = Run(Spec("links", "FROM host\nCOPY folder/* /dst/\n"));
  EXPECT_EQ(docker.rec.status().err(), ENOENT) << docker.rec.status().message();
  BuildSpec spec = Spec("links", "FROM host\nCOPY folder/* /dst/\n");
  spec.steps[1].copy_links = true;
  auto e2b = Run(std::move(spec));
  ASSERT_TRUE(e2b.rec.ok()) << e2b.rec.status().message();
  EXPECT_EQ(InBox("links", "cat /dst/file.txt; readlink /dst/absolute /dst/dangling"),
            "content\n/etc/hostname\nmissing.txt\n");
}

TEST_F(BuildTest, AddOfALocalArchiveIsRefused) {
  Write("a.tar.gz", std::string("\x1f\x8b\x08\x00", 4) + "rest");
  auto b = Run(Spec("add", "FROM host\nADD a.tar.gz /x/\n"));
  ASSERT_FALSE(b.rec.ok());
  EXPECT_NE(b.rec.status().what().find("unpacking a local archive is not supported"),
            std::string::npos)
      << b.rec.status().what();
  Write("plain.txt", "plain\n");
  b = Run(Spec("add", "FROM host\nADD plain.txt /x/\n"));
  ASSERT_TRUE(b.rec.ok()) << b.rec.status().message();
  EXPECT_EQ(InBox("add", "cat /x/plain.txt"), "plain\n");
}

TEST_F(BuildTest, ABuilderKilledMidRunLeavesNothingTheNextBuildDoesNotRemove) {
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The builder's process: killed below while its RUN step's box runs.
    auto b = Run(Spec("killed", "FROM host\nRUN sleep 600\n"));
    ::_exit(b.rec.ok() ? 0 : 1);
  }
  struct Reap {
    pid_t pid;
    ~Reap() {
      if (pid <= 0) return;  // reaped already (never kill(-1))
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reap{child};
  // A bounded poll until the step's box has its agent (its pid file is written then).
  bool running = false;
  for (int i = 0; i < 3000 && !running; ++i) {
    for (const auto& n : Entries(dir_ + "/run")) {
      struct stat sb {};
      running = running || ::stat((dir_ + "/run/" + n + "/pid").c_str(), &sb) == 0;
    }
    if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(running);
  EXPECT_FALSE(Entries(ts_.dir + "/staging").empty());
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  reap.pid = -1;
  EXPECT_TRUE(WIFSIGNALED(status));
  // The next build removes the dead one's box; the cache's sweep its staging directory and pins.
  auto b = Run(Spec("next", "FROM host\nRUN true\n"));
  ASSERT_TRUE(b.rec.ok()) << b.rec.status().message();
  auto owners = st_->LeasePinOwners();
  ASSERT_TRUE(owners.ok());
  EXPECT_EQ(*owners, std::vector<std::string>{});
  // TearDown checks that no box directory, mount or staging directory is left.
}

}  // namespace
}  // namespace sbx::sandbox
