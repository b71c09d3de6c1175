// The hostile-image battery (issue 13, "Mounts that hostile layers cannot redirect"; threat row
// 25): real boxes made by the native runtime from layer directories this test makes to redirect
// the runtime's own mounts. Each probe asserts the precise outcome inside the box (or the precise
// failure) and the host side: a world-writable canary directory the layers point at is untouched,
// and no mount point appeared in this process's mount table on any path the layers named.
//
// Layers are plain directories, topmost first, over the host template's layer and binds (so the
// box has a shell); the test adds the binds the sandbox layer adds (the network's resolv.conf and
// hosts, the CA bundle, a directory), made from files of its own.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <iostream>
#include <set>
#include <sstream>

#include "common/fd.h"
#include "common/fs.h"
#include "protocol/client.h"
#include "runtime/native/mount_plan.h"
#include "runtime/native/native_runtime.h"
#include "sbx_process.h"
#include "storage/template.h"
#include "store/store.h"

namespace sbx::runtime {
namespace {

using protocol::Tag;
using protocol::Type;

// The mount points (field 5) of this process's mount table.
std::set<std::string> MountPoints() {
  std::set<std::string> out;
  auto text = ReadFile("/proc/self/mountinfo", 1 << 24);
  if (!text.ok()) return out;
  std::istringstream lines(*text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream f(line);
    std::string id, parent, dev, root, point;
    f >> id >> parent >> dev >> root >> point;
    out.insert(point);
  }
  return out;
}

// Every entry below `dir` with its type, size and content (small files), sorted: a fingerprint.
std::string Listing(const std::string& dir) {
  test::ProcessResult r = test::RunProcess(
      {"/bin/sh", "-c",
       "cd '" + dir + "' && find . -printf '%p %y %s %m\\n' | sort && cat sentinel"});
  return r.out;
}

struct Ran {
  std::string out;
  int64_t code = -1;
};

Ran Sh(const Box& box, const std::string& script) {
  Ran ran;
  auto conn = protocol::AgentConnection::Connect(box.agent_socket);
  if (!conn.ok()) return ran;
  protocol::Writer w;
  w.Str(Tag::kArgv, "/bin/sh").Str(Tag::kArgv, "-c").Str(Tag::kArgv, script);
  w.Str(Tag::kEnv, "PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin");
  if (!conn->Call(Type::kSpawn, w).ok()) return ran;
  for (;;) {
    auto f = conn->Receive(60000);
    if (!f.ok()) return ran;
    if (f->type() == Type::kOutput) ran.out += f->fields.Str(Tag::kData);
    if (f->type() == Type::kExit) {
      ran.code = f->fields.Int(Tag::kExitCode);
      return ran;
    }
  }
}

class HostileImageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-hostile-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    ASSERT_EQ(::chmod(tmpl, 0711), 0);
    dir_ = tmpl;
    // World-writable: anything the runtime (or the box's root, a host id) made by following a
    // layer's symlink out of the box would land here.
    canary_ = dir_ + "/canary";
    ASSERT_EQ(::mkdir(canary_.c_str(), 0777), 0);
    ASSERT_EQ(::chmod(canary_.c_str(), 0777), 0);
    ASSERT_TRUE(WriteFile(canary_ + "/sentinel", "host canary\n", 0666).ok());
    canary_before_ = Listing(canary_);
    ASSERT_EQ(::mkdir((dir_ + "/layers").c_str(), 0755), 0);
    ASSERT_EQ(::mkdir((dir_ + "/files").c_str(), 0755), 0);
    ASSERT_TRUE(WriteFile(dir_ + "/files/resolv.conf", "nameserver 198.18.0.53\n", 0644).ok());
    ASSERT_TRUE(WriteFile(dir_ + "/files/hosts", "198.18.0.7 hostile.test\n", 0644).ok());
    ASSERT_TRUE(WriteFile(dir_ + "/files/ca.crt", "TEST CA\n", 0644).ok());
    ASSERT_EQ(::mkdir((dir_ + "/files/run").c_str(), 0755), 0);
    ASSERT_TRUE(WriteFile(dir_ + "/files/run/marker", "bound dir\n", 0644).ok());

    NativeConfig cfg;
    cfg.run_dir = dir_ + "/run";
    cfg.agent_path = SBX_AGENT_BIN;
    cfg.cgroup_parent = "sbx-hostile-test-" + std::to_string(::getpid());
    auto rt = NativeRuntime::Open(cfg);
    ASSERT_TRUE(rt.ok()) << rt.status().message();
    rt_ = std::move(rt).value();
    auto st = store::Store::Open(dir_ + "/sbx.db");
    ASSERT_TRUE(st.ok()) << st.status().message();
    storage::TemplateStore ts;
    ts.dir = dir_ + "/templates";
    auto t = storage::ResolveTemplate(ts, **st, "host", "");
    ASSERT_TRUE(t.ok()) << t.status().message();
    host_ = *t;
    mounts_before_ = MountPoints();
  }

  void TearDown() override {
    for (auto& box : boxes_) EXPECT_TRUE(rt_->Destroy(box).ok());
    // Host side: the canary is as it was, and no mount point appeared on a path of the test or
    // one the layers named (other tests may mount elsewhere meanwhile).
    EXPECT_EQ(Listing(canary_), canary_before_) << "the host canary changed";
    for (const auto& p : MountPoints()) {
      if (mounts_before_.count(p)) continue;
      EXPECT_NE(p.rfind(dir_, 0), 0u) << "host mount " << p;
      static const std::set<std::string> named = {
          "/", "/etc", "/etc/hosts", "/proc", "/dev", "/tmp", "/sys", "/dev/null", "/etc/shadow"};
      EXPECT_EQ(named.count(p), 0u) << "host mount " << p;
    }
    if (rt_) {
      if (DIR* d = ::opendir((dir_ + "/run").c_str())) {
        while (dirent* e = ::readdir(d)) {
          std::string n = e->d_name;
          EXPECT_TRUE(n == "." || n == "..") << "leaked box directory " << n;
        }
        ::closedir(d);
      }
      for (const auto& [controller, parent] : rt_->cgroup_host().v1_dirs) ::rmdir(parent.c_str());
      if (!rt_->cgroup_host().v2_dir.empty()) ::rmdir(rt_->cgroup_host().v2_dir.c_str());
    }
    (void)RemoveTree(dir_);
  }

  // A new, empty layer directory.
  std::string Layer(const std::string& name) {
    std::string l = dir_ + "/layers/" + name;
    EXPECT_EQ(::mkdir(l.c_str(), 0755), 0) << l;
    return l;
  }
  static void Symlink(const std::string& target, const std::string& at) {
    ASSERT_EQ(::symlink(target.c_str(), at.c_str()), 0) << at;
  }
  static void Whiteout(const std::string& at) {
    ASSERT_EQ(::mknod(at.c_str(), S_IFCHR | 0000, ::makedev(0, 0)), 0) << at;
  }

  // `top` layers (topmost first) over the host template, with the binds the sandbox layer adds.
  BoxSpec Spec(const std::vector<std::string>& top) {
    BoxSpec spec;
    spec.id = RandomId();
    spec.layers = top;
    spec.layers.insert(spec.layers.end(), host_.layers.begin(), host_.layers.end());
    spec.binds = host_.binds;
    spec.binds.push_back({dir_ + "/files/resolv.conf", "/etc/resolv.conf", true});
    spec.binds.push_back({dir_ + "/files/hosts", "/etc/hosts", true});
    spec.binds.push_back({dir_ + "/files/ca.crt", "/etc/sbx/ca-certificates.crt", true});
    spec.binds.push_back({dir_ + "/files/run", "/run/sbx", true});
    spec.limits.memory_bytes = 256 << 20;
    spec.limits.pids = 64;
    return spec;
  }
  Result<Box> Create(const BoxSpec& spec) {
    auto box = rt_->Create(spec);
    if (box.ok()) boxes_.push_back(*box);
    return box;
  }

  // What every box must show whatever its layers did: the runtime's mounts, inside.
  void ExpectRuntimeMounts(const Box& box) {
    Ran r = Sh(box,
               "set -e; test \"$(stat -f -c %T /proc)\" = proc; grep -q sbx-agent /proc/1/cmdline;"
               "test -c /dev/null; echo x > /dev/null; test -c /dev/urandom; test -d /dev/pts;"
               "test \"$(stat -f -c %T /sys)\" = sysfs; test \"$(stat -f -c %T /dev)\" = tmpfs;"
               "cat /etc/resolv.conf /etc/hosts /etc/sbx/ca-certificates.crt /run/sbx/marker");
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(r.out, "nameserver 198.18.0.53\n198.18.0.7 hostile.test\nTEST CA\nbound dir\n");
  }

  std::string dir_, canary_, canary_before_;
  std::set<std::string> mounts_before_;
  std::unique_ptr<NativeRuntime> rt_;
  storage::Template host_;
  std::vector<Box> boxes_;
};

// A symlink where the runtime mounts /proc, /dev, /sys, the network's files and the CA bundle,
// and at /tmp, each pointing at the host (/, /etc, the canary): the runtime replaces each mount
// point in the box's own view and mounts there; nothing reaches the canary, also not a write
// through the box's /tmp.
TEST_F(HostileImageTest, SymlinksAtTheRuntimesMountPointsStayInsideTheBox) {
  std::string l = Layer("links");
  Symlink("/", l + "/proc");
  Symlink(canary_, l + "/dev");
  Symlink("/etc", l + "/sys");
  Symlink(canary_, l + "/tmp");
  ASSERT_EQ(::mkdir((l + "/etc").c_str(), 0755), 0);
  Symlink(canary_ + "/resolv.conf", l + "/etc/resolv.conf");
  Symlink("/etc/shadow", l + "/etc/hosts");
  ASSERT_EQ(::mkdir((l + "/etc/sbx").c_str(), 0755), 0);
  Symlink("../../../../../../../.." + canary_ + "/ca.crt", l + "/etc/sbx/ca-certificates.crt");
  Symlink("/", l + "/run");  // /run/sbx is then the box's /sbx
  auto box = Create(Spec({l}));
  ASSERT_TRUE(box.ok()) << box.status().message();
  ExpectRuntimeMounts(*box);
  // /tmp is still the layer's symlink: after pivot_root it resolves inside the box, where the
  // canary's path does not exist.
  Ran r = Sh(*box, "test -L /tmp && echo pwned > /tmp/x; echo $?; ls /tmp/ 2>&1 | head -1");
  EXPECT_NE(r.out.rfind("0\n", 0), 0u) << r.out;
}

// A symlink on the way to a bind's mount point that leads nowhere inside the box (/etc -> the
// canary's host path): the create fails naming the mount point, and nothing is made on the host.
TEST_F(HostileImageTest, ADanglingSymlinkOnTheWayFailsTheCreateClearly) {
  std::string l = Layer("etc-link");
  Symlink(canary_, l + "/etc");
  auto box = Create(Spec({l}));
  ASSERT_FALSE(box.ok());
  EXPECT_EQ(box.status().err(), ELOOP) << box.status().message();
  EXPECT_NE(box.status().message().find("create /etc/resolv.conf"), std::string::npos)
      << box.status().message();
  EXPECT_EQ(box.status().message().find(canary_), std::string::npos) << box.status().message();
}

// A symlink on the way that stays inside (/etc -> /var/lib/etc-elsewhere, relative ../ beyond the
// root): followed as the box sees it, the mount lands inside the box at the resolved place.
TEST_F(HostileImageTest, ASymlinkOnTheWayIsFollowedInsideTheRoot) {
  std::string l = Layer("etc-inside");
  ASSERT_EQ(::mkdir((l + "/srv").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((l + "/srv/etc").c_str(), 0755), 0);
  Symlink("../../../../../../srv/etc", l + "/etc");
  auto box = Create(Spec({l}));
  ASSERT_TRUE(box.ok()) << box.status().message();
  ExpectRuntimeMounts(*box);
  Ran r = Sh(*box, "cat /srv/etc/hosts");
  EXPECT_EQ(r.out, "198.18.0.7 hostile.test\n");
}

// Whiteouts (0/0 character devices) of every path the runtime mounts: it still mounts them.
TEST_F(HostileImageTest, WhiteoutsOfTheRuntimesMountPointsAreMountedAnyway) {
  std::string l = Layer("whiteouts");
  for (const char* p : {"/proc", "/dev", "/sys", "/run"}) Whiteout(l + p);
  ASSERT_EQ(::mkdir((l + "/etc").c_str(), 0755), 0);
  for (const char* p : {"/etc/resolv.conf", "/etc/hosts", "/etc/sbx"}) Whiteout(l + p);
  auto box = Create(Spec({l}));
  ASSERT_TRUE(box.ok()) << box.status().message();
  ExpectRuntimeMounts(*box);
}

// 200 layers, each adding a file and overriding one: every file is visible and the topmost wins.
// Then the kernel's most (kMaxLayers) works too, and one more is refused before anything is made.
TEST_F(HostileImageTest, TwoHundredLayersAndTheMostOneOverlayStacks) {
  std::vector<std::string> layers;
  for (size_t i = 0; i < kMaxLayers + 1; ++i) {
    std::string l = Layer("l" + std::to_string(i));
    ASSERT_EQ(::mkdir((l + "/stack").c_str(), 0755), 0);
    ASSERT_TRUE(WriteFile(l + "/stack/" + std::to_string(i), std::to_string(i) + "\n", 0644).ok());
    ASSERT_TRUE(WriteFile(l + "/top", std::to_string(i) + "\n", 0644).ok());
    layers.push_back(l);
  }
  auto run = [&](size_t n) {
    std::vector<std::string> top(layers.begin(), layers.begin() + static_cast<ptrdiff_t>(n));
    auto box = Create(Spec(top));
    ASSERT_TRUE(box.ok()) << n << " layers: " << box.status().message();
    Ran r = Sh(*box, "ls /stack | wc -l; cat /top; cat /stack/" + std::to_string(n - 1));
    EXPECT_EQ(r.out, std::to_string(n) + "\n0\n" + std::to_string(n - 1) + "\n") << n;
    ExpectRuntimeMounts(*box);
  };
  run(200);
  // With the host template's own layer below, kMaxLayers - 1 of ours fill the stack.
  run(kMaxLayers - host_.layers.size());
  auto over = Create(Spec(layers));
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().err(), E2BIG) << over.status().message();
}

// The same stack without lowerdir+ (kernels before 6.8): the layers as one option string, named
// relative to lower/, still fit the page mount(2) takes at overlayfs' most.
TEST_F(HostileImageTest, TheMostLayersFitTheOptionStringWithoutLowerdirPlus) {
  NativeConfig cfg = rt_->config();
  cfg.overlay_lowerdir_plus = false;
  auto legacy = NativeRuntime::Open(cfg);
  ASSERT_TRUE(legacy.ok()) << legacy.status().message();
  std::vector<std::string> layers;
  for (size_t i = 0; i + host_.layers.size() < kMaxLayers; ++i) {
    std::string l = Layer("l" + std::to_string(i));
    ASSERT_TRUE(WriteFile(l + "/hl-" + std::to_string(i), "x", 0644).ok());
    layers.push_back(l);
  }
  auto box = (*legacy)->Create(Spec(layers));
  ASSERT_TRUE(box.ok()) << box.status().message();
  boxes_.push_back(*box);
  Ran r = Sh(*box, "ls / | grep -c '^hl-'");
  EXPECT_EQ(r.out, std::to_string(layers.size()) + "\n");
  ExpectRuntimeMounts(*box);
}

// A 10 GB sparse file in a layer: the create copies nothing (the box's writable layer stays
// small), the file reads back with its size and its last bytes.
TEST_F(HostileImageTest, ATenGigabyteSparseFileCostsNothing) {
  std::string l = Layer("sparse");
  constexpr off_t kSize = off_t{10} << 30;
  {
    UniqueFd fd(::open((l + "/big").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    ASSERT_TRUE(fd);
    ASSERT_EQ(::pwrite(fd.get(), "end\n", 4, kSize - 4), 4);
  }
  struct stat st {};
  ASSERT_EQ(::stat((l + "/big").c_str(), &st), 0);
  ASSERT_LT(st.st_blocks * 512, 1 << 20);
  auto t0 = std::chrono::steady_clock::now();
  auto box = Create(Spec({l}));
  ASSERT_TRUE(box.ok()) << box.status().message();
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  std::cout << "create with a 10 GB sparse file: " << ms << " ms\n";
  Ran r = Sh(*box,
             "stat -c %s /big; tail -c 4 /big; dd if=/big bs=1M skip=5000 count=1 2>/dev/null"
             " | wc -c");
  EXPECT_EQ(r.out, std::to_string(kSize) + "\nend\n1048576\n");
  test::ProcessResult du = test::RunProcess({"/usr/bin/du", "-sk", box->dir + "/fs/upper"});
  EXPECT_LT(std::atol(du.out.c_str()), 1024) << du.out;
}

// A million small files: `sbx template add` of a directory holding them is bounded by the cache
// size (each entry counts), refused with ENOSPC past the bound, leaving nothing in the cache; a
// few of them fit. The files are empty and live on tmpfs (/dev/shm, about 1 GB of kernel memory
// while the test runs): on this 2-core machine ext4 made ~4000 files a second under load, tmpfs
// makes the million in about a minute. SBX_HOSTILE_MANY_FILES sets another count. The bound is
// hit after ~8000 entries whatever the count, so the add's own time does not grow with it.
TEST_F(HostileImageTest, ManySmallFilesAreBoundedByTheCacheSize) {
  size_t count = 1000000;
  if (const char* env = std::getenv("SBX_HOSTILE_MANY_FILES"))
    count = std::strtoul(env, nullptr, 10);
  std::string many = "/dev/shm/sbx-hostile-many-" + std::to_string(::getpid());
  struct Remove {
    std::string path;
    ~Remove() { (void)RemoveTree(path); }
  } remove{many};
  ASSERT_EQ(::mkdir(many.c_str(), 0755), 0);
  UniqueFd root(::open(many.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(root);
  for (size_t d = 0; d * 1000 < count; ++d) {
    std::string sub = std::to_string(d);
    ASSERT_EQ(::mkdirat(root.get(), sub.c_str(), 0755), 0);
    UniqueFd dfd(::openat(root.get(), sub.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(dfd);
    for (size_t i = 0; i < 1000 && d * 1000 + i < count; ++i) {
      // Empty: a file's data would take a page of memory on tmpfs; the cache counts the entry.
      UniqueFd f(::openat(dfd.get(), std::to_string(i).c_str(),
                          O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
      ASSERT_TRUE(f);
    }
  }
  std::string data = dir_ + "/data";
  ASSERT_EQ(::mkdir(data.c_str(), 0711), 0);
  constexpr int64_t kBound = 4 << 20;
  auto sbx = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {SBX_BIN, "--data-dir", data});
    return test::RunProcess(args);
  };
  test::ProcessResult r =
      sbx({"template", "add", "many", many, "--template-cache-size=" + std::to_string(kBound)});
  EXPECT_EQ(r.exit_code, 125) << r.err;
  EXPECT_NE(r.err.find("exceeds the template cache's free room"), std::string::npos) << r.err;
  test::ProcessResult left = test::RunProcess(
      {"/bin/sh", "-c", "find '" + data + "/templates' -mindepth 2 -not -name .lock | head"});
  EXPECT_EQ(left.out, "") << "a refused add left files in the cache";
  EXPECT_EQ(sbx({"template", "ls"}).out.find("many"), std::string::npos);

  // 2000 of them fit in the bound (about 1 MB as the cache counts entries).
  std::string few = dir_ + "/few";
  ASSERT_EQ(::mkdir(few.c_str(), 0755), 0);
  for (int i = 0; i < 2000; ++i)
    ASSERT_TRUE(WriteFile(few + "/" + std::to_string(i), "x", 0644).ok());
  r = sbx({"template", "add", "few", few, "--template-cache-size=" + std::to_string(kBound)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
}

}  // namespace
}  // namespace sbx::runtime
