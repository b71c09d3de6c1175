// The bundle's config.json as OciRuntime writes it, field by field: pure, no runtime binary.
#include "runtime/oci/oci_spec.h"

#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sched.h>

#include <nlohmann/json.hpp>

#include "runtime/native/capabilities.h"

namespace sbx::runtime {
namespace {

using nlohmann::json;

OciSpecInput Input(OciKind kind) {
  OciSpecInput in;
  in.kind = kind;
  in.root = "/run/box/rootfs";
  in.args = {"/.sbx/sbx-agent", "--listen-fd", "3"};
  in.binds = {{"/run/box/binds/0", "/usr", true}, {"/data", "/data", false}};
  in.id_base = 268435456;
  in.userns_path = "/proc/42/ns/user";
  in.limits.memory_bytes = 256 << 20;
  in.limits.cpus = 0.5;
  in.limits.cpu_weight = 200;
  in.limits.pids = 64;
  in.cgroups_path = "sbx/box";
  return in;
}

json Spec(const OciSpecInput& in) { return json::parse(BuildOciSpec(in)); }

const json* MountAt(const json& spec, const std::string& target) {
  for (const auto& m : spec["mounts"])
    if (m["destination"] == target) return &m;
  return nullptr;
}

TEST(OciSpecTest, RootProcessAndIdsAreTheBoxes) {
  json s = Spec(Input(OciKind::kRunc));
  EXPECT_EQ(s["root"]["path"], "/run/box/rootfs");
  EXPECT_EQ(s["root"]["readonly"], false);
  EXPECT_EQ(s["process"]["args"], json({"/.sbx/sbx-agent", "--listen-fd", "3"}));
  EXPECT_EQ(s["process"]["user"]["uid"], 0);
  EXPECT_EQ(s["process"]["noNewPrivileges"], true);
  EXPECT_EQ(s["hostname"], "sbx");
  json map = json::array({{{"containerID", 0}, {"hostID", 268435456}, {"size", 65536}}});
  EXPECT_EQ(s["linux"]["uidMappings"], map);
  EXPECT_EQ(s["linux"]["gidMappings"], map);
  bool joined = false;
  for (const auto& ns : s["linux"]["namespaces"])
    if (ns["type"] == "user") joined = ns.value("path", "") == "/proc/42/ns/user";
  EXPECT_TRUE(joined);
  EXPECT_EQ(s["linux"]["cgroupsPath"], "sbx/box");
}

TEST(OciSpecTest, CapabilitiesAreTheNativeOnes) {
  json s = Spec(Input(OciKind::kRunc));
  json kept = CapabilityNames(KeptCapabilities());
  EXPECT_EQ(s["process"]["capabilities"]["bounding"], kept);
  EXPECT_EQ(s["process"]["capabilities"]["effective"], kept);
  EXPECT_EQ(s["process"]["capabilities"]["permitted"], kept);
  EXPECT_TRUE(s["process"]["capabilities"]["inheritable"].empty());
  EXPECT_TRUE(s["process"]["capabilities"]["ambient"].empty());
  EXPECT_EQ(CapabilityNames(uint64_t{1} << CAP_CHOWN | uint64_t{1} << CAP_SETFCAP),
            (std::vector<std::string>{"CAP_CHOWN", "CAP_SETFCAP"}));
  for (const auto& name : kept) {
    EXPECT_NE(name, "CAP_SYS_ADMIN");
    EXPECT_NE(name, "CAP_NET_RAW");
    EXPECT_NE(name, "CAP_MKNOD");
  }
}

TEST(OciSpecTest, BindsKeepTheirOrderModeAndLockedFlags) {
  json s = Spec(Input(OciKind::kRunc));
  const json* usr = MountAt(s, "/usr");
  ASSERT_NE(usr, nullptr);
  EXPECT_EQ((*usr)["source"], "/run/box/binds/0");
  EXPECT_EQ((*usr)["options"], json({"rbind", "ro", "nosuid", "nodev"}));
  const json* data = MountAt(s, "/data");
  ASSERT_NE(data, nullptr);
  EXPECT_EQ((*data)["options"], json({"rbind", "rw", "nosuid", "nodev"}));
  // Binds come after /proc, /dev and /sys, in the spec's order.
  std::vector<std::string> order;
  for (const auto& m : s["mounts"]) order.push_back(m["destination"]);
  EXPECT_EQ(order.front(), "/proc");
  EXPECT_EQ(order[order.size() - 2], "/usr");
  EXPECT_EQ(order.back(), "/data");
}

TEST(OciSpecTest, LimitsAreResources) {
  json r = Spec(Input(OciKind::kRunc))["linux"]["resources"];
  EXPECT_EQ(r["memory"]["limit"], 256 << 20);
  EXPECT_EQ(r["memory"]["swap"], 256 << 20) << "memory+swap = memory: no swap";
  EXPECT_EQ(r["cpu"]["period"], 100000);
  EXPECT_EQ(r["cpu"]["quota"], 50000);
  EXPECT_EQ(r["cpu"]["shares"], 2048);
  EXPECT_EQ(r["pids"]["limit"], 64);
  EXPECT_EQ(r["devices"][0]["allow"], false);
  // No limits: no memory, cpu or pids entries at all.
  OciSpecInput none = Input(OciKind::kRunc);
  none.limits = {};
  json n = Spec(none)["linux"]["resources"];
  EXPECT_FALSE(n.contains("memory"));
  EXPECT_FALSE(n.contains("cpu"));
  EXPECT_FALSE(n.contains("pids"));
}

TEST(OciSpecTest, GvisorDiffersWhereItMust) {
  json g = Spec(Input(OciKind::kGvisor));
  json r = Spec(Input(OciKind::kRunc));
  // The sandbox's host threads, not the box's processes.
  EXPECT_EQ(g["linux"]["resources"]["pids"]["limit"], GvisorHostPids(64));
  EXPECT_GT(GvisorHostPids(64), 64);
  EXPECT_EQ(GvisorHostPids(0), 0);
  // The native limit (the agent lists its descriptors where close_range is missing).
  EXPECT_EQ(g["process"]["rlimits"][0]["soft"], 65536);
  EXPECT_EQ(g["process"]["rlimits"][0]["hard"], 65536);
  // runc in a namespace of its own making sets them as native does; joining one, it cannot
  // (the box inherits them from runc instead).
  OciSpecInput own = Input(OciKind::kRunc);
  own.userns_path.clear();
  json o = Spec(own);
  EXPECT_EQ(o["process"]["rlimits"][0]["soft"], 65536);
  EXPECT_EQ(o["process"]["rlimits"][1]["type"], "RLIMIT_CORE");
  EXPECT_FALSE(r["process"].contains("rlimits"));
  // A networked gVisor box joins the namespace its link was put in; others get a new one.
  auto net_ns = [](const json& spec) {
    for (const auto& ns : spec["linux"]["namespaces"])
      if (ns["type"] == "network") return ns;
    return json();
  };
  EXPECT_FALSE(net_ns(g).contains("path"));
  OciSpecInput networked = Input(OciKind::kGvisor);
  networked.netns_path = "/proc/43/ns/net";
  EXPECT_EQ(net_ns(Spec(networked))["path"], "/proc/43/ns/net");
  // Its /proc and /sys are gVisor's own: nothing to mask.
  EXPECT_FALSE(g["linux"].contains("maskedPaths"));
  EXPECT_TRUE(r["linux"]["maskedPaths"].size() > 10);
  EXPECT_NE(std::find(r["linux"]["readonlyPaths"].begin(), r["linux"]["readonlyPaths"].end(),
                      "/proc/sys"),
            r["linux"]["readonlyPaths"].end());
}

TEST(OciSpecTest, SeccompIsTheNativePolicy) {
  const auto& rules = DefaultSeccompRules();
  ASSERT_TRUE(rules.ok()) << rules.status().message();
  OciSpecInput in = Input(OciKind::kRunc);
  in.seccomp = &*rules;
  json sc = Spec(in)["linux"]["seccomp"];
  EXPECT_EQ(sc["defaultAction"], "SCMP_ACT_ERRNO");
  EXPECT_EQ(sc["defaultErrnoRet"], ENOSYS);
  EXPECT_EQ(sc["architectures"], json({"SCMP_ARCH_X86_64"}));
  // Every rule is there, in order: the merged entries expand back to the builder's list.
  size_t n = 0;
  bool mount_denied = false, read_allowed = false, clone_checked = false;
  for (const auto& e : sc["syscalls"]) {
    for (const auto& name : e["names"]) {
      ASSERT_LT(n, rules->rules.size());
      const SeccompRule& r = rules->rules[n++];
      EXPECT_EQ(name, r.name);
      EXPECT_EQ(e["action"] == "SCMP_ACT_ALLOW", r.allow) << r.name;
      if (!r.allow) {
        EXPECT_EQ(e["errnoRet"], r.err) << r.name;
      }
      EXPECT_EQ(e.contains("args"), r.has_arg) << r.name;
      if (r.has_arg) {
        EXPECT_EQ(e["names"].size(), 1u);
        EXPECT_EQ(e["args"][0]["index"], r.arg);
        EXPECT_EQ(e["args"][0]["value"], r.mask);
        EXPECT_EQ(e["args"][0]["valueTwo"], r.value);
        EXPECT_EQ(e["args"][0]["op"], "SCMP_CMP_MASKED_EQ");
      }
      if (name == "mount") mount_denied = e["action"] == "SCMP_ACT_ERRNO" && e["errnoRet"] == EPERM;
      if (name == "read") read_allowed = e["action"] == "SCMP_ACT_ALLOW";
      if (name == "clone" && e.contains("args") && e["action"] == "SCMP_ACT_ERRNO")
        clone_checked = clone_checked || e["args"][0]["value"] == CLONE_NEWUSER;
    }
  }
  EXPECT_EQ(n, rules->rules.size());
  EXPECT_TRUE(mount_denied);
  // gVisor: none (runsc 20221219 would turn every refusal, clone3's too, into EPERM).
  in.kind = OciKind::kGvisor;
  EXPECT_FALSE(Spec(in)["linux"].contains("seccomp"));
  EXPECT_TRUE(read_allowed);
  EXPECT_TRUE(clone_checked) << "clone(CLONE_NEWUSER) is refused with EPERM";
}

}  // namespace
}  // namespace sbx::runtime
