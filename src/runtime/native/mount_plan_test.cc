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

TEST(MountPlan, OverlayRootThenProcSysDev) {
  MountPlanInput in{"/r", "/b/upper", "/b/work", {"/t/top", "/t/base"}, {{"/usr", "/usr", true}}};
  auto ops = BuildMountPlan(in);
  ASSERT_FALSE(ops.empty());
  EXPECT_EQ(ops[0].fstype, "overlay");
  EXPECT_EQ(ops[0].target, "/r");
  EXPECT_EQ(ops[0].data, "lowerdir=/t/top:/t/base,upperdir=/b/upper,workdir=/b/work,userxattr");
  EXPECT_TRUE(ops[0].flags & MS_NOSUID);

  // /usr is bound, then remounted read-only.
  bool bound = false, ro = false;
  for (const auto& op : ops) {
    if (op.target != "/r/usr" || op.kind != MountOp::Kind::kMount) continue;
    if ((op.flags & MS_BIND) && !(op.flags & MS_REMOUNT)) bound = true;
    if ((op.flags & MS_REMOUNT) && (op.flags & MS_RDONLY)) ro = bound;
  }
  EXPECT_TRUE(ro);

  const MountOp* proc = Find(ops, "/r/proc", "proc");
  ASSERT_NE(proc, nullptr);
  EXPECT_TRUE(proc->flags & MS_NOEXEC);
  const MountOp* sys = Find(ops, "/r/sys", "sysfs");
  ASSERT_NE(sys, nullptr);
  EXPECT_TRUE(sys->flags & MS_RDONLY);
  const MountOp* kcore = Find(ops, "/r/proc/kcore");
  ASSERT_NE(kcore, nullptr);
  EXPECT_EQ(kcore->source, "/dev/null");
  const MountOp* pts = Find(ops, "/r/dev/pts", "devpts");
  ASSERT_NE(pts, nullptr);
  EXPECT_NE(pts->data.find("newinstance"), std::string::npos);

  // Every /proc/sys remount is read-only, and comes after the proc mount.
  size_t proc_at = static_cast<size_t>(proc - ops.data());
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].target == "/r/proc/sys" && (ops[i].flags & MS_REMOUNT)) {
      EXPECT_GT(i, proc_at);
      EXPECT_TRUE(ops[i].flags & MS_RDONLY);
    }
  }
}

TEST(MountPlan, NoHostDeviceBeyondTheHarmlessOnes) {
  auto ops = BuildMountPlan({"/r", "/u", "/w", {"/l"}, {}});
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
  op.target = "/r/proc";
  EXPECT_EQ(op.Describe("/r"), "mount proc on /proc");
}

}  // namespace
}  // namespace sbx::runtime
