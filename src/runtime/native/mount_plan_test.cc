#include "runtime/native/mount_plan.h"

#include <gtest/gtest.h>
#include <sys/mount.h>

#include <set>

namespace sbx::runtime {
namespace {

const MountOp* Find(const std::vector<MountOp>& ops, const std::string& target,
                    const std::string& fstype = "") {
  for (const auto& op : ops) {
    if (op.kind == MountOp::Kind::kMount && op.target == target &&
        (fstype.empty() || op.fstype == fstype))
      return &op;
  }
  return nullptr;
}

// The host template's /usr/local/bin: the topmost layer's copy laid over the bind, read-only.
TEST(MountPlan, OverlaidSubdirOfABind) {
  MountPlanInput in{"r", "upper", "work", {"/t/top"}, {{"/usr", "/usr", true, {"local/bin"}}}};
  auto ops = BuildMountPlan(in);
  size_t bind_at = ops.size(), over_at = ops.size();
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind == MountOp::Kind::kAttach && ops[i].target == "r/usr") bind_at = i;
    if (ops[i].target == "r/usr/local/bin") over_at = i;
  }
  ASSERT_LT(bind_at, over_at);
  ASSERT_LT(over_at, ops.size());
  const MountOp& o = ops[over_at];
  EXPECT_EQ(o.fstype, "overlay");
  EXPECT_EQ(o.data, "lowerdir=lower/0/usr/local/bin:r/usr/local/bin,userxattr");
  EXPECT_TRUE(o.flags & MS_RDONLY);
  EXPECT_TRUE(o.flags & MS_NOSUID);
  EXPECT_TRUE(o.optional);  // a host without /usr/local/bin keeps the plain bind
}

TEST(MountPlan, OverlayRootThenProcSysDev) {
  MountPlanInput in{"r", "upper", "work", {"/t/top", "/t/base"}, {{"/usr", "/usr", true}}};
  auto ops = BuildMountPlan(in);
  ASSERT_FALSE(ops.empty());
  // Each layer is attached from its detached mount, in order, before the overlay uses it.
  std::vector<std::pair<int, std::string>> attached;
  size_t overlay_at = ops.size();
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind == MountOp::Kind::kAttach) attached.push_back({ops[i].fd_index, ops[i].target});
    if (ops[i].fstype == "overlay" && overlay_at == ops.size()) overlay_at = i;
  }
  ASSERT_LT(overlay_at, ops.size());
  const MountOp& overlay = ops[overlay_at];
  EXPECT_EQ(overlay.target, "r");
  EXPECT_EQ(overlay.data, "lowerdir=lower/0:lower/1,upperdir=upper,workdir=work,userxattr");
  EXPECT_TRUE(overlay.flags & MS_NOSUID);
  // Layers 0 and 1, then /usr as mount 2 (after the overlay, on top of it).
  std::vector<std::pair<int, std::string>> want = {{0, "lower/0"}, {1, "lower/1"}, {2, "r/usr"}};
  EXPECT_EQ(attached, want);
  EXPECT_EQ(ops[overlay_at - 1].target, "lower/1");

  const MountOp* proc = Find(ops, "r/proc", "proc");
  ASSERT_NE(proc, nullptr);
  EXPECT_TRUE(proc->flags & MS_NOEXEC);
  const MountOp* sys = Find(ops, "r/sys", "sysfs");
  ASSERT_NE(sys, nullptr);
  EXPECT_TRUE(sys->flags & MS_RDONLY);
  const MountOp* kcore = Find(ops, "r/proc/kcore");
  ASSERT_NE(kcore, nullptr);
  EXPECT_EQ(kcore->source, "/dev/null");
  const MountOp* pts = Find(ops, "r/dev/pts", "devpts");
  ASSERT_NE(pts, nullptr);
  EXPECT_NE(pts->data.find("newinstance"), std::string::npos);

  // Every /proc/sys remount is read-only, and comes after the proc mount.
  size_t proc_at = static_cast<size_t>(proc - ops.data());
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].target == "r/proc/sys" && (ops[i].flags & MS_REMOUNT)) {
      EXPECT_GT(i, proc_at);
      EXPECT_TRUE(ops[i].flags & MS_RDONLY);
    }
  }
}

TEST(MountPlan, BindMountPointsGetTheirParents) {
  MountPlanInput in{"r", "upper", "work", {"/t/base"}, {{"/srv/data", "/a/b/c", false}}};
  auto ops = BuildMountPlan(in);
  std::vector<std::string> made;
  for (const auto& op : ops) {
    if (op.kind == MountOp::Kind::kMkdir && op.target.rfind("r/a", 0) == 0)
      made.push_back(op.target);
    if (op.kind == MountOp::Kind::kAttach && op.fd_index == 1) {
      EXPECT_EQ(op.target, "r/a/b/c");
      break;
    }
  }
  EXPECT_EQ(made, (std::vector<std::string>{"r/a", "r/a/b", "r/a/b/c"}));
}

TEST(MountPlan, AFileIsBoundOnAFile) {
  MountPlanInput in{"r", "upper", "work", {"/t/base"}, {{"/etc/hostname", "/etc/resolv.conf"}}};
  auto ops = BuildMountPlan(in);
  bool touched = false;
  for (const auto& op : ops) {
    if (op.target == "r/etc/resolv.conf") {
      EXPECT_NE(op.kind, MountOp::Kind::kMkdir);
      touched = touched || op.kind == MountOp::Kind::kTouch;
    }
  }
  EXPECT_TRUE(touched);
}

TEST(MountPlan, NoHostDeviceBeyondTheHarmlessOnes) {
  auto ops = BuildMountPlan({"r", "u", "w", {"/l"}, {}});
  for (const auto& op : ops) {
    if (op.kind == MountOp::Kind::kMount && (op.flags & MS_BIND) &&
        op.source.rfind("/dev/", 0) == 0) {
      static const std::set<std::string> ok = {"/dev/null",   "/dev/zero",    "/dev/full",
                                               "/dev/random", "/dev/urandom", "/dev/tty"};
      EXPECT_TRUE(ok.count(op.source)) << op.source;
    }
  }
}

TEST(MountPlan, EscapesOverlayOptions) {
  EXPECT_EQ(OverlayEscape("/a,b:c\\d"), "/a\\,b\\:c\\\\d");
  MountOp op;
  op.kind = MountOp::Kind::kMount;
  op.fstype = "proc";
  op.target = "r/proc";
  EXPECT_EQ(op.Describe("r"), "mount proc on /proc");
}

}  // namespace
}  // namespace sbx::runtime
