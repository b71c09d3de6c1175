// Unit tests for the cgroup drivers: the probe's parsers on mountinfo/cgroup text from real
// layouts, and both drivers against a scratch directory laid out like cgroupfs (the test plays
// the kernel: it creates the knob files when the driver makes a directory, and removes them when
// the driver removes one). The drivers against the real hierarchy: cgroup_host_test.cc.
#include "runtime/native/cgroup.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "common/fd.h"
#include "runtime/native/cgroup_internal.h"

namespace sbx::runtime::cgroup_internal {
namespace {

namespace fs = std::filesystem;

// ---- Probe ----

// This host: v1 controllers mounted separately, an empty cgroup2 at /sys/fs/cgroup/unified.
constexpr const char* kHybridMountInfo =
    "22 1 0:20 / / rw,relatime - ext4 /dev/vda rw\n"
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
    "34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices\n"
    "37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer\n"
    "38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio\n"
    "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
constexpr const char* kHybridSelf =
    "9:name=systemd:/\n8:pids:/\n7:blkio:/\n6:freezer:/\n5:devices:/\n"
    "4:memory:/process_api/337e\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n0::/\n";

// systemd on a pure v2 host, sbx running as a service with Delegate=yes.
constexpr const char* kV2MountInfo =
    "24 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n"
    "30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n";
constexpr const char* kV2Self = "0::/system.slice/sbx.service\n";

// An older distribution: cpu and cpuacct comounted, a cgroup2 mount with nothing in it.
constexpr const char* kComountMountInfo =
    "25 24 0:22 / /sys/fs/cgroup/unified rw shared:5 - cgroup2 cgroup2 rw,nsdelegate\n"
    "26 24 0:23 / /sys/fs/cgroup/systemd rw shared:6 - cgroup cgroup rw,xattr,name=systemd\n"
    "29 24 0:26 / /sys/fs/cgroup/cpu,cpuacct rw shared:9 - cgroup cgroup rw,cpu,cpuacct\n"
    "30 24 0:27 / /sys/fs/cgroup/memory rw shared:10 - cgroup cgroup rw,memory\n"
    "31 24 0:28 / /sys/fs/cgroup/pids rw shared:11 - cgroup cgroup rw,pids\n"
    "32 24 0:29 / /sys/fs/cgroup/freezer rw shared:12 - cgroup cgroup rw,freezer\n";
constexpr const char* kComountSelf =
    "12:freezer:/\n11:pids:/system.slice/sbx.service\n10:memory:/system.slice/sbx.service\n"
    "9:cpu,cpuacct:/system.slice/sbx.service\n1:name=systemd:/system.slice/sbx.service\n"
    "0::/system.slice/sbx.service\n";

FileReader MapReader(std::map<std::string, std::string> files) {
  return [files = std::move(files)](const std::string& path) -> std::optional<std::string> {
    auto it = files.find(path);
    if (it == files.end()) return std::nullopt;
    return it->second;
  };
}

std::string V1Dir(const CgroupHost& host, const std::string& controller) {
  for (const auto& [c, dir] : host.v1_dirs) {
    if (c == controller) return dir;
  }
  return "<none>";
}

TEST(CgroupProbeTest, ParsesMountInfo) {
  std::vector<CgroupMount> mounts = ParseMountInfo(kHybridMountInfo);
  ASSERT_EQ(mounts.size(), 10u);  // not / nor the tmpfs
  EXPECT_FALSE(mounts[0].v2);
  EXPECT_EQ(mounts[0].mount_point, "/sys/fs/cgroup/cpu");
  EXPECT_EQ(mounts[0].root, "/");
  EXPECT_EQ(mounts[0].controllers, std::vector<std::string>{"cpu"});
  EXPECT_EQ(mounts[8].controllers, std::vector<std::string>{"name=systemd"});
  EXPECT_TRUE(mounts[9].v2);
  EXPECT_EQ(mounts[9].mount_point, "/sys/fs/cgroup/unified");

  std::vector<CgroupMount> comounted = ParseMountInfo(kComountMountInfo);
  ASSERT_EQ(comounted.size(), 6u);
  EXPECT_EQ(comounted[2].mount_point, "/sys/fs/cgroup/cpu,cpuacct");
  EXPECT_EQ(comounted[2].controllers, (std::vector<std::string>{"cpu", "cpuacct"}));
  EXPECT_EQ(comounted[1].controllers, (std::vector<std::string>{"xattr", "name=systemd"}));
}

TEST(CgroupProbeTest, DecodesEscapedMountPoints) {
  std::vector<CgroupMount> mounts =
      ParseMountInfo("40 31 0:37 /a\\040b /mnt/my\\040cgroups rw - cgroup2 cgroup2 rw\n");
  ASSERT_EQ(mounts.size(), 1u);
  EXPECT_EQ(mounts[0].mount_point, "/mnt/my cgroups");
  EXPECT_EQ(mounts[0].root, "/a b");
}

TEST(CgroupProbeTest, ParsesProcSelfCgroup) {
  std::vector<ProcCgroupEntry> entries = ParseProcCgroup(kComountSelf);
  ASSERT_EQ(entries.size(), 6u);
  EXPECT_EQ(entries[3].id, 9);
  EXPECT_EQ(entries[3].controllers, (std::vector<std::string>{"cpu", "cpuacct"}));
  EXPECT_EQ(entries[3].path, "/system.slice/sbx.service");
  EXPECT_EQ(entries[5].id, 0);
  EXPECT_TRUE(entries[5].controllers.empty());
  // A path may hold colons; only the first two separate fields.
  EXPECT_EQ(ParseProcCgroup("0::/a:b\n")[0].path, "/a:b");
}

TEST(CgroupProbeTest, HybridHostWithEmptyUnifiedPicksV1UnderOwnCgroups) {
  auto host = ResolveCgroupHost(kHybridMountInfo, kHybridSelf, "sbx",
                                MapReader({{"/sys/fs/cgroup/unified/cgroup.controllers", "\n"}}));
  ASSERT_TRUE(host.ok()) << host.status().message();
  EXPECT_EQ(host->version, CgroupVersion::kV1);
  ASSERT_EQ(host->v1_dirs.size(), 5u);
  EXPECT_EQ(V1Dir(*host, "memory"), "/sys/fs/cgroup/memory/process_api/337e/sbx");
  EXPECT_EQ(V1Dir(*host, "cpu"), "/sys/fs/cgroup/cpu/sbx");
  EXPECT_EQ(V1Dir(*host, "cpuacct"), "/sys/fs/cgroup/cpuacct/sbx");
  EXPECT_EQ(V1Dir(*host, "pids"), "/sys/fs/cgroup/pids/sbx");
  EXPECT_EQ(V1Dir(*host, "freezer"), "/sys/fs/cgroup/freezer/sbx");
}

TEST(CgroupProbeTest, PureV2HostPicksV2UnderOwnCgroup) {
  auto host = ResolveCgroupHost(
      kV2MountInfo, kV2Self, "sbx/boxes",
      MapReader({{"/sys/fs/cgroup/system.slice/sbx.service/cgroup.controllers",
                  "cpuset cpu io memory hugetlb pids rdma misc\n"},
                 {"/sys/fs/cgroup/system.slice/sbx.service/cgroup.freeze", "0\n"}}));
  ASSERT_TRUE(host.ok()) << host.status().message();
  EXPECT_EQ(host->version, CgroupVersion::kV2);
  EXPECT_EQ(host->v2_dir, "/sys/fs/cgroup/system.slice/sbx.service/sbx/boxes");
}

TEST(CgroupProbeTest, V2RootCgroupHasNoFreezeFileSoTheKernelReleaseDecides) {
  const char* self = "0::/\n";
  auto reader = [](const char* release) {
    return MapReader({{"/sys/fs/cgroup/cgroup.controllers", "cpu memory pids\n"},
                      {"/proc/sys/kernel/osrelease", release}});
  };
  auto host = ResolveCgroupHost(kV2MountInfo, self, "sbx", reader("6.1.0-18-amd64\n"));
  ASSERT_TRUE(host.ok()) << host.status().message();
  EXPECT_EQ(host->v2_dir, "/sys/fs/cgroup/sbx");
  auto old = ResolveCgroupHost(kV2MountInfo, self, "sbx", reader("4.19.0\n"));
  ASSERT_FALSE(old.ok());
  EXPECT_NE(old.status().message().find("freezer"), std::string::npos) << old.status().message();
}

TEST(CgroupProbeTest, ComountedCpuAndCpuacctShareOneDirectory) {
  auto host = ResolveCgroupHost(
      kComountMountInfo, kComountSelf, "sbx",
      MapReader({{"/sys/fs/cgroup/unified/system.slice/sbx.service/cgroup.controllers", ""}}));
  ASSERT_TRUE(host.ok()) << host.status().message();
  EXPECT_EQ(host->version, CgroupVersion::kV1);
  EXPECT_EQ(V1Dir(*host, "cpu"), "/sys/fs/cgroup/cpu,cpuacct/system.slice/sbx.service/sbx");
  EXPECT_EQ(V1Dir(*host, "cpuacct"), V1Dir(*host, "cpu"));
  EXPECT_EQ(V1Dir(*host, "freezer"), "/sys/fs/cgroup/freezer/sbx");
  EXPECT_EQ(V1Dir(*host, "memory"), "/sys/fs/cgroup/memory/system.slice/sbx.service/sbx");
}

TEST(CgroupProbeTest, MountRootIsStrippedFromOwnPath) {
  // A container that sees only its part of the hierarchy, bind-mounted (no cgroup namespace).
  const char* mountinfo =
      "50 40 0:32 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n"
      "51 40 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpu,cpuacct\n"
      "52 40 0:36 /docker/abc /sys/fs/cgroup/pids ro - cgroup cgroup rw,pids\n"
      "53 40 0:34 /docker/abc /sys/fs/cgroup/freezer ro - cgroup cgroup rw,freezer\n";
  const char* self =
      "4:memory:/docker/abc/inner\n2:cpu,cpuacct:/docker/abc\n8:pids:/docker/abc\n"
      "6:freezer:/docker/abc\n";
  auto host = ResolveCgroupHost(mountinfo, self, "sbx", MapReader({}));
  ASSERT_TRUE(host.ok()) << host.status().message();
  EXPECT_EQ(V1Dir(*host, "memory"), "/sys/fs/cgroup/memory/inner/sbx");
  EXPECT_EQ(V1Dir(*host, "cpu"), "/sys/fs/cgroup/cpu,cpuacct/sbx");
}

TEST(CgroupProbeTest, MissingControllerIsNamed) {
  // v1 without a freezer mount, and a unified hierarchy without pids.
  std::string mountinfo = kComountMountInfo;
  mountinfo.erase(mountinfo.find("32 24 0:29"));
  auto host = ResolveCgroupHost(
      mountinfo, kComountSelf, "sbx",
      MapReader(
          {{"/sys/fs/cgroup/unified/system.slice/sbx.service/cgroup.controllers", "cpu memory\n"},
           {"/sys/fs/cgroup/unified/system.slice/sbx.service/cgroup.freeze", "0\n"}}));
  ASSERT_FALSE(host.ok());
  const std::string msg = host.status().message();
  EXPECT_NE(msg.find("'freezer'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lacks pids (cgroup.controllers has 'cpu memory')"), std::string::npos) << msg;

  auto pure_v2 = ResolveCgroupHost(
      kV2MountInfo, kV2Self, "sbx",
      MapReader({{"/sys/fs/cgroup/system.slice/sbx.service/cgroup.controllers", "cpu memory\n"},
                 {"/sys/fs/cgroup/system.slice/sbx.service/cgroup.freeze", "0\n"}}));
  ASSERT_FALSE(pure_v2.ok());
  EXPECT_NE(pure_v2.status().message().find("lacks pids"), std::string::npos)
      << pure_v2.status().message();
}

TEST(CgroupProbeTest, RejectsBadParentNames) {
  for (const char* parent : {"", "/", "a/../b", "./x"}) {
    auto host = ResolveCgroupHost(kHybridMountInfo, kHybridSelf, parent, MapReader({}));
    EXPECT_FALSE(host.ok()) << "parent '" << parent << "'";
  }
  auto nested = ResolveCgroupHost(kHybridMountInfo, kHybridSelf, "/a/b/", MapReader({}));
  ASSERT_TRUE(nested.ok());
  EXPECT_EQ(V1Dir(*nested, "pids"), "/sys/fs/cgroup/pids/a/b");
}

TEST(CgroupValuesTest, WeightMapsToShares) {
  EXPECT_EQ(WeightToShares(0), 1024);
  EXPECT_EQ(WeightToShares(100), 1024);
  EXPECT_EQ(WeightToShares(200), 2048);
  EXPECT_EQ(WeightToShares(1), 10);
  EXPECT_EQ(WeightToShares(10000), 102400);
  EXPECT_EQ(CpuQuotaUs(1.5), 150000);
  EXPECT_EQ(CpuQuotaUs(0), 0);
}

// ---- Drivers on a scratch cgroupfs ----

void Put(const std::string& path, const std::string& text) {
  ASSERT_TRUE(WriteFile(path, text).ok()) << path;
}

std::string Get(const std::string& path) {
  Result<std::string> text = ReadFile(path);
  return text.ok() ? *text : "<" + text.status().message() + ">";
}

class ScratchCgroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-cgroup-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    options_.on_mkdir = [this](const std::string& dir) { LayOut(dir); };
    options_.before_rmdir = [](const std::string& dir) {
      for (const auto& entry : fs::directory_iterator(dir)) {
        if (entry.is_regular_file()) fs::remove(entry.path());
      }
    };
    options_.freeze_timeout = std::chrono::milliseconds(100);
    options_.kill_timeout = std::chrono::milliseconds(100);
  }
  void TearDown() override { fs::remove_all(root_); }

  // Plays the kernel: the knob files a new cgroup directory gets, with their initial values.
  void LayOut(const std::string& dir) {
    Put(dir + "/cgroup.procs", "");
    auto in = [&](const char* hierarchy) {
      return dir.find("/" + std::string(hierarchy) + "/") != std::string::npos;
    };
    if (in("memory")) {
      Put(dir + "/memory.limit_in_bytes", "9223372036854771712\n");
      if (with_memsw_) Put(dir + "/memory.memsw.limit_in_bytes", "9223372036854771712\n");
      Put(dir + "/memory.swappiness", "60\n");
      Put(dir + "/memory.usage_in_bytes", "0\n");
      Put(dir + "/memory.max_usage_in_bytes", "0\n");
      Put(dir + "/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n");
    }
    if (in("cpu,cpuacct")) {
      Put(dir + "/cpu.cfs_period_us", "100000\n");
      Put(dir + "/cpu.cfs_quota_us", "-1\n");
      Put(dir + "/cpu.shares", "1024\n");
      Put(dir + "/cpuacct.usage", "0\n");
    }
    if (in("pids")) {
      if (with_pids_max_) Put(dir + "/pids.max", "max\n");
      Put(dir + "/pids.current", "0\n");
    }
    if (in("freezer")) Put(dir + "/freezer.state", "THAWED\n");
    if (in("unified")) {
      Put(dir + "/cgroup.subtree_control", "");
      Put(dir + "/cgroup.events", "populated 0\nfrozen 0\n");
      Put(dir + "/cgroup.freeze", "0\n");
      Put(dir + "/cgroup.kill", "");
      Put(dir + "/memory.max", "max\n");
      if (with_memory_swap_) Put(dir + "/memory.swap.max", "max\n");
      Put(dir + "/cpu.max", "max 100000\n");
      Put(dir + "/cpu.weight", "100\n");
      if (with_pids_max_) Put(dir + "/pids.max", "max\n");
    }
  }

  // v1 as on a host with cpu,cpuacct comounted; our own cgroup is "own" in memory only.
  CgroupHost V1Host() {
    for (const char* h : {"memory/own", "cpu,cpuacct", "pids", "freezer"}) {
      fs::create_directories(root_ + "/" + h);
    }
    CgroupHost host;
    host.version = CgroupVersion::kV1;
    host.v1_dirs = {{"memory", root_ + "/memory/own/sbx"},
                    {"cpu", root_ + "/cpu,cpuacct/sbx"},
                    {"cpuacct", root_ + "/cpu,cpuacct/sbx"},
                    {"pids", root_ + "/pids/sbx"},
                    {"freezer", root_ + "/freezer/sbx"}};
    return host;
  }

  CgroupHost V2Host() {
    fs::create_directories(root_ + "/unified/own");
    Put(root_ + "/unified/own/cgroup.subtree_control", "");
    CgroupHost host;
    host.version = CgroupVersion::kV2;
    host.v2_dir = root_ + "/unified/own/sbx";
    return host;
  }

  std::string root_;
  DriverOptions options_;
  bool with_memsw_ = true;
  bool with_pids_max_ = true;
  bool with_memory_swap_ = true;
};

Limits TypicalLimits() {
  Limits limits;
  limits.memory_bytes = 64 << 20;
  limits.cpus = 1.5;
  limits.cpu_weight = 200;
  limits.pids = 100;
  return limits;
}

TEST_F(ScratchCgroupTest, V1WritesEveryLimit) {
  auto cg = CreateV1(V1Host(), "box1", TypicalLimits(), options_);
  ASSERT_TRUE(cg.ok()) << cg.status().message();
  const std::string mem = root_ + "/memory/own/sbx/box1";
  const std::string cpu = root_ + "/cpu,cpuacct/sbx/box1";
  EXPECT_EQ(Get(mem + "/memory.limit_in_bytes"), "67108864");
  EXPECT_EQ(Get(mem + "/memory.memsw.limit_in_bytes"), "67108864");
  EXPECT_EQ(Get(mem + "/memory.swappiness"), "60\n");  // memsw does the job
  EXPECT_EQ(Get(mem + "/memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n");
  EXPECT_EQ(Get(cpu + "/cpu.cfs_period_us"), "100000");
  EXPECT_EQ(Get(cpu + "/cpu.cfs_quota_us"), "150000");
  EXPECT_EQ(Get(cpu + "/cpu.shares"), "2048");
  EXPECT_EQ(Get(root_ + "/pids/sbx/box1/pids.max"), "100");
  EXPECT_EQ(Get(root_ + "/freezer/sbx/box1/freezer.state"), "THAWED\n");
  // cpu and cpuacct share a directory: four distinct ones.
  EXPECT_EQ((*cg)->Paths(), (std::vector<std::string>{mem, cpu, root_ + "/pids/sbx/box1",
                                                      root_ + "/freezer/sbx/box1"}));
  EXPECT_EQ((*cg)->DirFd(), -1);
}

// A warm pool's box gets its create's limits at the claim (sandbox/pool.h): grown, shrunk, and 0
// fields written back as no limit.
TEST_F(ScratchCgroupTest, V1SetLimitsRewritesEveryLimit) {
  auto cg = CreateV1(V1Host(), "box1", TypicalLimits(), options_);
  ASSERT_TRUE(cg.ok()) << cg.status().message();
  const std::string mem = root_ + "/memory/own/sbx/box1";
  Limits bigger = TypicalLimits();
  bigger.memory_bytes = 128 << 20;
  bigger.pids = 0;
  bigger.cpu_weight = 0;
  ASSERT_TRUE((*cg)->SetLimits(bigger).ok());
  EXPECT_EQ(Get(mem + "/memory.limit_in_bytes"), "134217728");
  EXPECT_EQ(Get(mem + "/memory.memsw.limit_in_bytes"), "134217728");
  EXPECT_EQ(Get(root_ + "/pids/sbx/box1/pids.max"), "max");
  EXPECT_EQ(Get(root_ + "/cpu,cpuacct/sbx/box1/cpu.shares"), "1024");
  ASSERT_TRUE((*cg)->SetLimits(TypicalLimits()).ok());
  EXPECT_EQ(Get(mem + "/memory.limit_in_bytes"), "67108864");
  EXPECT_EQ(Get(mem + "/memory.memsw.limit_in_bytes"), "67108864");
  EXPECT_EQ(Get(root_ + "/pids/sbx/box1/pids.max"), "100");
}

TEST_F(ScratchCgroupTest, V1WithoutSwapAccountingSetsSwappiness) {
  with_memsw_ = false;
  auto cg = CreateV1(V1Host(), "box1", TypicalLimits(), options_);
  ASSERT_TRUE(cg.ok()) << cg.status().message();
  EXPECT_EQ(Get(root_ + "/memory/own/sbx/box1/memory.swappiness"), "0");
  EXPECT_EQ(Get(root_ + "/memory/own/sbx/box1/memory.limit_in_bytes"), "67108864");
}

TEST_F(ScratchCgroupTest, V1NoLimitsLeavesDefaultsButSwapOff) {
  auto cg = CreateV1(V1Host(), "box1", Limits{}, options_);
  ASSERT_TRUE(cg.ok()) << cg.status().message();
  const std::string mem = root_ + "/memory/own/sbx/box1";
  EXPECT_EQ(Get(mem + "/memory.limit_in_bytes"), "9223372036854771712\n");
  EXPECT_EQ(Get(mem + "/memory.swappiness"), "0");
  EXPECT_EQ(Get(root_ + "/cpu,cpuacct/sbx/box1/cpu.cfs_quota_us"), "-1");
  EXPECT_EQ(Get(root_ + "/cpu,cpuacct/sbx/box1/cpu.shares"), "1024\n");
  EXPECT_EQ(Get(root_ + "/pids/sbx/box1/pids.max"), "max\n");
}

TEST_F(ScratchCgroupTest, V1AddProcessJoinsEveryHierarchy) {
  auto cg = CreateV1(V1Host(), "box1", TypicalLimits(), options_);
  ASSERT_TRUE(cg.ok()) << cg.status().message();
  ASSERT_TRUE((*cg)->AddProcess(4242).ok());
  for (const std::string& dir : (*cg)->Paths()) EXPECT_EQ(Get(dir + "/cgroup.procs"), "4242");
}

TEST_F(ScratchCgroupTest, V1FreezeThawAndStats) {
  auto cg = CreateV1(V1Host(), "box1", TypicalLimits(), options_);
  ASSERT_TRUE(cg.ok()) << cg.status().message();
  const std::string state = root_ + "/freezer/sbx/box1/freezer.state";
  ASSERT_TRUE((*cg)->Freeze().ok());  // the scratch file reads back FROZEN at once
  EXPECT_EQ(Get(state), "FROZEN");
  ASSERT_TRUE((*cg)->Thaw().ok());
  EXPECT_EQ(Get(state), "THAWED");

  const std::string mem = root_ + "/memory/own/sbx/box1";
  Put(root_ + "/cpu,cpuacct/sbx/box1/cpuacct.usage", "123456789\n");
  Put(mem + "/memory.usage_in_bytes", "1048576\n");
  Put(mem + "/memory.max_usage_in_bytes", "2097152\n");
  Put(mem + "/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n");
  Put(root_ + "/pids/sbx/box1/pids.current", "7\n");
  auto stats = (*cg)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  EXPECT_EQ(stats->cpu_usage_ns, 123456789u);
  EXPECT_EQ(stats->memory_current, 1048576u);
  EXPECT_EQ(stats->memory_peak, 2097152u);
  EXPECT_EQ(stats->pids_current, 7u);
  EXPECT_EQ(stats->oom_kills, 3u);
}

TEST_F(ScratchCgroupTest, V1DestroyRemovesOnlyTheBoxAndIsIdempotent) {
  CgroupHost host = V1Host();
  auto cg = CreateV1(host, "box1", TypicalLimits(), options_);
  ASSERT_TRUE(cg.ok()) << cg.status().message();
  ASSERT_TRUE((*cg)->Destroy().ok());
  for (const std::string& dir : (*cg)->Paths()) EXPECT_FALSE(fs::exists(dir)) << dir;
  for (const auto& [controller, parent] : host.v1_dirs) EXPECT_TRUE(fs::exists(parent)) << parent;
  EXPECT_TRUE((*cg)->Destroy().ok());
  EXPECT_TRUE(OpenV1(host, "never-made", options_)->Destroy().ok());
}

TEST_F(ScratchCgroupTest, V1FailedWriteNamesFileAndValueAndCleansUp) {
  with_pids_max_ = false;
  CgroupHost host = V1Host();
  auto cg = CreateV1(host, "box1", TypicalLimits(), options_);
  ASSERT_FALSE(cg.ok());
  const std::string msg = cg.status().message();
  EXPECT_NE(msg.find("write '100' to " + root_ + "/pids/sbx/box1/pids.max"), std::string::npos)
      << msg;
  EXPECT_EQ(cg.status().err(), ENOENT);
  EXPECT_FALSE(fs::exists(root_ + "/memory/own/sbx/box1"));
  EXPECT_FALSE(fs::exists(root_ + "/pids/sbx/box1"));
  EXPECT_TRUE(fs::exists(root_ + "/pids/sbx"));
}

TEST_F(ScratchCgroupTest, V1ExistingBoxDirIsAnErrorAndIsLeftAlone) {
  CgroupHost host = V1Host();
  fs::create_directories(root_ + "/pids/sbx/box1");
  auto cg = CreateV1(host, "box1", TypicalLimits(), options_);
  ASSERT_FALSE(cg.ok());
  EXPECT_EQ(cg.status().err(), EEXIST) << cg.status().message();
  EXPECT_TRUE(fs::exists(root_ + "/pids/sbx/box1"));
  EXPECT_FALSE(fs::exists(root_ + "/memory/own/sbx/box1"));  // made before, then removed
}

TEST_F(ScratchCgroupTest, InvalidRequestsTouchNothing) {
  CgroupHost v1 = V1Host();
  CgroupHost v2 = V2Host();
  Limits tiny;
  tiny.memory_bytes = 1 << 20;
  Limits sliver;
  sliver.cpus = 0.001;
  Limits heavy;
  heavy.cpu_weight = 20000;
  Limits negative;
  negative.pids = -1;
  for (const Limits& limits : {tiny, sliver, heavy, negative}) {
    auto a = CreateV1(v1, "box1", limits, options_);
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().err(), EINVAL) << a.status().message();
    auto b = CreateV2(v2, "box1", limits, options_);
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().err(), EINVAL) << b.status().message();
  }
  EXPECT_NE(CreateV1(v1, "box1", tiny, options_).status().message().find("4194304"),
            std::string::npos);
  for (const char* name : {"", ".", "..", "a/b"}) {
    EXPECT_FALSE(CreateV1(v1, name, Limits{}, options_).ok()) << name;
  }
  EXPECT_FALSE(fs::exists(root_ + "/pids/sbx"));
  EXPECT_FALSE(fs::exists(root_ + "/unified/own/sbx"));
}

TEST_F(ScratchCgroupTest, V2EnablesControllersAndWritesEveryLimit) {
  auto cg = CreateV2(V2Host(), "box1", TypicalLimits(), options_);
  ASSERT_TRUE(cg.ok()) << cg.status().message();
  const std::string own = root_ + "/unified/own";
  const std::string box = own + "/sbx/box1";
  EXPECT_EQ(Get(own + "/cgroup.subtree_control"), "+memory +cpu +pids");
  EXPECT_EQ(Get(own + "/sbx/cgroup.subtree_control"), "+memory +cpu +pids");
  EXPECT_EQ(Get(box + "/cgroup.subtree_control"), "");  // a leaf
  EXPECT_EQ(Get(box + "/memory.max"), "67108864");
  EXPECT_EQ(Get(box + "/memory.swap.max"), "0");
  EXPECT_EQ(Get(box + "/cpu.max"), "150000 100000");
  EXPECT_EQ(Get(box + "/cpu.weight"), "200");
  EXPECT_EQ(Get(box + "/pids.max"), "100");
  EXPECT_EQ((*cg)->Paths(), std::vector<std::string>{box});
  EXPECT_GE((*cg)->DirFd(), 0);
}

TEST_F(ScratchCgroupTest, V2SetLimitsRewritesEveryLimit) {
  auto cg = CreateV2(V2Host(), "box1", TypicalLimits(), options_);
  ASSERT_TRUE(cg.ok()) << cg.status().message();
  const std::string box = root_ + "/unified/own/sbx/box1";
  Limits other;  // every field 0: no limits, the default weight
  ASSERT_TRUE((*cg)->SetLimits(other).ok());
  EXPECT_EQ(Get(box + "/memory.max"), "max");
  EXPECT_EQ(Get(box + "/cpu.max"), "max 100000");
  EXPECT_EQ(Get(box + "/cpu.weight"), "100");
  EXPECT_EQ(Get(box + "/pids.max"), "max");
  ASSERT_TRUE((*cg)->SetLimits(TypicalLimits()).ok());
  EXPECT_EQ(Get(box + "/memory.max"), "67108864");
  EXPECT_EQ(Get(box + "/cpu.max"), "150000 100000");
  EXPECT_EQ(Get(box + "/pids.max"), "100");
}

TEST_F(ScratchCgroupTest, V2NoLimitsStillTurnsSwapOff) {
  auto cg = CreateV2(V2Host(), "box1", Limits{}, options_);
  ASSERT_TRUE(cg.ok()) << cg.status().message();
  const std::string box = root_ + "/unified/own/sbx/box1";
  EXPECT_EQ(Get(box + "/memory.max"), "max\n");
  EXPECT_EQ(Get(box + "/memory.swap.max"), "0");
  EXPECT_EQ(Get(box + "/cpu.max"), "max 100000");
  EXPECT_EQ(Get(box + "/cpu.weight"), "100\n");
  EXPECT_EQ(Get(box + "/pids.max"), "max\n");
}

TEST_F(ScratchCgroupTest, V2WithoutSwapAccountingSkipsSwapMax) {
  with_memory_swap_ = false;
  auto cg = CreateV2(V2Host(), "box1", TypicalLimits(), options_);
  ASSERT_TRUE(cg.ok()) << cg.status().message();
  EXPECT_FALSE(fs::exists(root_ + "/unified/own/sbx/box1/memory.swap.max"));
}

TEST_F(ScratchCgroupTest, V2EnablesOnlyMissingControllers) {
  CgroupHost host = V2Host();
  Put(root_ + "/unified/own/cgroup.subtree_control", "cpuset cpu io memory pids\n");
  fs::create_directories(host.v2_dir);
  Put(host.v2_dir + "/cgroup.subtree_control", "memory\n");
  auto cg = CreateV2(host, "box1", TypicalLimits(), options_);
  ASSERT_TRUE(cg.ok()) << cg.status().message();
  EXPECT_EQ(Get(root_ + "/unified/own/cgroup.subtree_control"), "cpuset cpu io memory pids\n");
  EXPECT_EQ(Get(host.v2_dir + "/cgroup.subtree_control"), "+cpu +pids");
}

TEST_F(ScratchCgroupTest, V2FreezeWaitsForFrozenEvent) {
  auto cg = CreateV2(V2Host(), "box1", TypicalLimits(), options_);
  ASSERT_TRUE(cg.ok()) << cg.status().message();
  const std::string box = root_ + "/unified/own/sbx/box1";
  // Nothing reports frozen: the wait times out and the cgroup is thawed again.
  Status timeout = (*cg)->Freeze();
  EXPECT_EQ(timeout.err(), ETIMEDOUT) << timeout.message();
  EXPECT_EQ(Get(box + "/cgroup.freeze"), "0");
  Put(box + "/cgroup.events", "populated 1\nfrozen 1\n");
  ASSERT_TRUE((*cg)->Freeze().ok());
  EXPECT_EQ(Get(box + "/cgroup.freeze"), "1");
  ASSERT_TRUE((*cg)->Thaw().ok());
  EXPECT_EQ(Get(box + "/cgroup.freeze"), "0");
}

TEST_F(ScratchCgroupTest, V2StatsReadsTheV2Files) {
  auto cg = CreateV2(V2Host(), "box1", TypicalLimits(), options_);
  ASSERT_TRUE(cg.ok()) << cg.status().message();
  const std::string box = root_ + "/unified/own/sbx/box1";
  Put(box + "/cpu.stat", "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n");
  Put(box + "/memory.current", "4096\n");
  Put(box + "/memory.peak", "8192\n");
  Put(box + "/pids.current", "2\n");
  Put(box + "/memory.events", "low 0\nhigh 0\nmax 5\noom 2\noom_kill 1\noom_group_kill 0\n");
  auto stats = (*cg)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  EXPECT_EQ(stats->cpu_usage_ns, 1500000u);
  EXPECT_EQ(stats->memory_current, 4096u);
  EXPECT_EQ(stats->memory_peak, 8192u);
  EXPECT_EQ(stats->pids_current, 2u);
  EXPECT_EQ(stats->oom_kills, 1u);
  EXPECT_EQ(stats->ooms, 2u);
}

TEST_F(ScratchCgroupTest, V2KillAllUsesCgroupKillAndDestroyKeepsParent) {
  CgroupHost host = V2Host();
  auto cg = CreateV2(host, "box1", TypicalLimits(), options_);
  ASSERT_TRUE(cg.ok()) << cg.status().message();
  const std::string box = host.v2_dir + "/box1";
  ASSERT_TRUE((*cg)->KillAll().ok());
  EXPECT_EQ(Get(box + "/cgroup.kill"), "1");
  ASSERT_TRUE((*cg)->Destroy().ok());
  EXPECT_FALSE(fs::exists(box));
  EXPECT_TRUE(fs::exists(host.v2_dir));
  EXPECT_EQ((*cg)->DirFd(), -1);
  EXPECT_TRUE((*cg)->Destroy().ok());
  EXPECT_TRUE(OpenV2(host, "never-made", options_)->Destroy().ok());
}

TEST_F(ScratchCgroupTest, V2FailedWriteNamesFileAndValueAndCleansUp) {
  with_pids_max_ = false;
  CgroupHost host = V2Host();
  auto cg = CreateV2(host, "box1", TypicalLimits(), options_);
  ASSERT_FALSE(cg.ok());
  EXPECT_NE(cg.status().message().find("write '100' to " + host.v2_dir + "/box1/pids.max"),
            std::string::npos)
      << cg.status().message();
  EXPECT_FALSE(fs::exists(host.v2_dir + "/box1"));
  EXPECT_TRUE(fs::exists(host.v2_dir));
}

}  // namespace
}  // namespace sbx::runtime::cgroup_internal
