#include "runtime/native/mount_plan.h"

#include <gtest/gtest.h>
#include <sys/mount.h>

#include <algorithm>
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
    if (ops[i].kind == MountOp::Kind::kAttach && ops[i].target == "/usr") bind_at = i;
    if (ops[i].target == "/usr/local/bin") over_at = i;
  }
  ASSERT_LT(bind_at, over_at);
  ASSERT_LT(over_at, ops.size());
  const MountOp& o = ops[over_at];
  // The layer's directory is named inside the layer (lower/0), resolved there by the child.
  EXPECT_EQ(o.kind, MountOp::Kind::kOverlaySub);
  EXPECT_EQ(o.source, "/usr/local/bin");
  EXPECT_EQ(o.fd_index, 0);
  EXPECT_TRUE(o.in_root);
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
    if (ops[i].kind == MountOp::Kind::kOverlay && overlay_at == ops.size()) overlay_at = i;
  }
  ASSERT_LT(overlay_at, ops.size());
  const MountOp& overlay = ops[overlay_at];
  EXPECT_EQ(overlay.target, "r");
  EXPECT_EQ(overlay.fd_index, 2);  // lower/0 and lower/1
  EXPECT_EQ(overlay.source, "upper");
  EXPECT_EQ(overlay.data, "work");
  EXPECT_FALSE(overlay.in_root);
  EXPECT_TRUE(overlay.flags & MS_NOSUID);
  EXPECT_EQ(overlay.Describe("r"), "mount the overlay of 2 layers on /");
  // Layers 0 and 1, then /usr as mount 2 (after the overlay, on top of it).
  std::vector<std::pair<int, std::string>> want = {{0, "lower/0"}, {1, "lower/1"}, {2, "/usr"}};
  EXPECT_EQ(attached, want);
  EXPECT_EQ(ops[overlay_at - 1].target, "lower/1");

  const MountOp* proc = Find(ops, "/proc", "proc");
  ASSERT_NE(proc, nullptr);
  EXPECT_TRUE(proc->flags & MS_NOEXEC);
  const MountOp* sys = Find(ops, "/sys", "sysfs");
  ASSERT_NE(sys, nullptr);
  EXPECT_TRUE(sys->flags & MS_RDONLY);
  const MountOp* kcore = Find(ops, "/proc/kcore");
  ASSERT_NE(kcore, nullptr);
  EXPECT_EQ(kcore->source, "/dev/null");
  const MountOp* pts = Find(ops, "/dev/pts", "devpts");
  ASSERT_NE(pts, nullptr);
  EXPECT_NE(pts->data.find("newinstance"), std::string::npos);

  // Every /proc/sys remount is read-only, and comes after the proc mount.
  size_t proc_at = static_cast<size_t>(proc - ops.data());
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].target == "/proc/sys" && (ops[i].flags & MS_REMOUNT)) {
      EXPECT_GT(i, proc_at);
      EXPECT_TRUE(ops[i].flags & MS_RDONLY);
    }
  }
}

// Layers on the writable layer's btrfs are stacked first: one read-only overlay of lower/0..n-1
// over an empty directory, which the root's overlay then takes as its one lower layer.
TEST(MountPlan, StackedLayersAreTheRootsOneLowerLayer) {
  MountPlanInput in{"r", "layer/upper", "layer/work", {"/t/top", "/t/base"}, {}};
  in.stack_layers = true;
  auto ops = BuildMountPlan(in);
  auto at = [&](MountOp::Kind kind) {
    for (size_t i = 0; i < ops.size(); ++i)
      if (ops[i].kind == kind) return i;
    return ops.size();
  };
  size_t stack_at = at(MountOp::Kind::kLowerStack), overlay_at = at(MountOp::Kind::kOverlay);
  ASSERT_LT(stack_at, overlay_at);
  ASSERT_LT(overlay_at, ops.size());
  const MountOp& stack = ops[stack_at];
  EXPECT_EQ(stack.target, "lowers");
  EXPECT_EQ(stack.fd_index, 2);
  EXPECT_EQ(stack.data, "lowers.empty");
  EXPECT_TRUE(stack.source.empty());
  EXPECT_TRUE(stack.flags & MS_RDONLY);
  EXPECT_TRUE(stack.flags & MS_NOSUID);
  EXPECT_EQ(stack.Describe("r"), "stack the 2 layers on lowers");
  // Its mount point and bottom are made before it, and every layer is attached before it.
  for (const char* dir : {"lowers", "lowers.empty", "lower/1"}) {
    auto made = std::find_if(ops.begin(), ops.begin() + static_cast<long>(stack_at),
                             [&](const MountOp& op) { return op.target == dir; });
    EXPECT_NE(made, ops.begin() + static_cast<long>(stack_at)) << dir;
  }
  const MountOp& overlay = ops[overlay_at];
  EXPECT_EQ(overlay.stacked, "lowers");
  EXPECT_EQ(overlay.source, "layer/upper");
  EXPECT_EQ(overlay.data, "layer/work");
  // Without stacking there is no stack, and the root's overlay takes the layers themselves.
  in.stack_layers = false;
  ops = BuildMountPlan(in);
  EXPECT_EQ(at(MountOp::Kind::kLowerStack), ops.size());
  ASSERT_LT(at(MountOp::Kind::kOverlay), ops.size());
  EXPECT_TRUE(ops[at(MountOp::Kind::kOverlay)].stacked.empty());
}

// A writable layer that arrives as a detached mount (an idmapped btrfs subvolume) is the last
// descriptor, after the layers and the binds, and is attached on its directory before the
// overlay that uses it; without one, nothing is attached there.
TEST(MountPlan, AWritableLayerMountIsAttachedBeforeTheOverlay) {
  MountPlanInput in{"r", "layer/upper", "layer/work", {"/t/top", "/t/base"}, {}};
  in.binds = {BindMount{"/h/data", "/data", false, {}}};
  in.writable_mount = "layer";
  auto ops = BuildMountPlan(in);
  auto attach = std::find_if(ops.begin(), ops.end(), [](const MountOp& op) {
    return op.kind == MountOp::Kind::kAttach && op.target == "layer";
  });
  auto overlay = std::find_if(ops.begin(), ops.end(),
                              [](const MountOp& op) { return op.kind == MountOp::Kind::kOverlay; });
  ASSERT_NE(attach, ops.end());
  ASSERT_NE(overlay, ops.end());
  EXPECT_LT(attach, overlay);
  EXPECT_EQ(attach->fd_index, 3);
  EXPECT_FALSE(attach->in_root);
  EXPECT_EQ(attach->Describe("r"), "attach the writable layer on layer");
  in.writable_mount.clear();
  ops = BuildMountPlan(in);
  EXPECT_EQ(
      std::count_if(ops.begin(), ops.end(), [](const MountOp& op) { return op.target == "layer"; }),
      0);
}

// The box's boot id (a file of its own directory) is bound over the kernel's once /proc is there,
// then made read-only; without one the kernel's stays.
TEST(MountPlan, TheBoxsOwnBootIdIsBoundReadOnlyOverTheKernels) {
  MountPlanInput in{"r", "upper", "work", {"/t/top"}, {}, "boot_id"};
  auto ops = BuildMountPlan(in);
  const std::string path = "/proc/sys/kernel/random/boot_id";
  size_t proc_ro = ops.size(), bind = ops.size(), ro = ops.size();
  for (size_t i = 0; i < ops.size(); ++i) {
    const MountOp& op = ops[i];
    if (op.target == "/proc/sys" && (op.flags & MS_REMOUNT)) proc_ro = i;
    if (op.target == path && (op.flags & MS_BIND) && !(op.flags & MS_REMOUNT)) bind = i;
    if (op.target == path && (op.flags & MS_REMOUNT)) ro = i;
  }
  ASSERT_LT(bind, ops.size());
  ASSERT_LT(ro, ops.size());
  EXPECT_GT(bind, proc_ro);
  EXPECT_EQ(ro, bind + 1);
  EXPECT_EQ(ops[bind].source, "boot_id");
  EXPECT_TRUE(ops[bind].in_root);
  EXPECT_FALSE(ops[bind].source_in_root);  // the box's directory, which only the host writes
  EXPECT_FALSE(ops[bind].optional);
  EXPECT_TRUE(ops[ro].flags & MS_RDONLY);

  in.boot_id.clear();
  for (const auto& op : BuildMountPlan(in)) EXPECT_NE(op.target, path) << op.Describe("r");
}

// The mount point is one op: the child makes its missing parents itself, one component at a time
// below the root's descriptor.
TEST(MountPlan, BindMountPointsAreMadeInsideTheRoot) {
  MountPlanInput in{"r", "upper", "work", {"/t/base"}, {{"/srv/data", "/a/b/c", false}}};
  auto ops = BuildMountPlan(in);
  size_t made = ops.size(), attached = ops.size();
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind == MountOp::Kind::kMkdir && ops[i].target == "/a/b/c") made = i;
    if (ops[i].kind == MountOp::Kind::kAttach && ops[i].fd_index == 1) attached = i;
  }
  ASSERT_LT(made, attached);
  ASSERT_LT(attached, ops.size());
  EXPECT_TRUE(ops[made].in_root);
  EXPECT_TRUE(ops[attached].in_root);
  EXPECT_EQ(ops[attached].target, "/a/b/c");
}

// Everything after the root's overlay is a path the layers made: every such target (and every
// source that is not a host device or the detached mounts) is resolved inside the root.
TEST(MountPlan, EveryPathAfterTheOverlayIsResolvedInsideTheRoot) {
  MountPlanInput in{"r",
                    "upper",
                    "work",
                    {"/t/top", "/t/base"},
                    {{"/usr", "/usr", true, {"local/bin"}}, {"/etc/hostname", "/etc/hosts"}},
                    "boot_id"};
  auto ops = BuildMountPlan(in);
  bool after = false;
  for (const auto& op : ops) {
    if (op.kind == MountOp::Kind::kOverlay) {
      after = true;
      continue;
    }
    if (!after) {
      EXPECT_FALSE(op.in_root) << op.Describe("r");
      EXPECT_EQ(op.target.rfind("lower", 0), 0u) << op.Describe("r");
      continue;
    }
    EXPECT_TRUE(op.in_root) << op.Describe("r");
    EXPECT_EQ(op.target[0], '/') << op.Describe("r");
    if (op.kind == MountOp::Kind::kMount && (op.flags & MS_BIND) && !(op.flags & MS_REMOUNT) &&
        !op.source_in_root && op.source != in.boot_id) {
      EXPECT_EQ(op.source.rfind("/dev/", 0), 0u) << op.Describe("r");
    }
  }
  EXPECT_TRUE(after);
}

TEST(MountPlan, AFileIsBoundOnAFile) {
  MountPlanInput in{"r", "upper", "work", {"/t/base"}, {{"/etc/hostname", "/etc/resolv.conf"}}};
  auto ops = BuildMountPlan(in);
  bool touched = false;
  for (const auto& op : ops) {
    if (op.target == "/etc/resolv.conf") {
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
  op.target = "/proc";
  op.in_root = true;
  EXPECT_EQ(op.Describe("r"), "mount proc on /proc");
}

}  // namespace
}  // namespace sbx::runtime
