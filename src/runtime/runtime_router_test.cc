// Router: each call reaches the box's own runtime; an unavailable runtime is refused with its
// reason, never replaced by another.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "runtime/router.h"

namespace sbx::runtime {
namespace {

// Remembers the boxes it made and the calls it got.
class Recording : public Runtime {
 public:
  explicit Recording(std::string name) : name_(std::move(name)) {}
  Result<Box> Create(const BoxSpec& spec) override {
    boxes.insert(spec.id);
    Box b;
    b.id = spec.id;
    return b;
  }
  Status CanCreate(const std::string&) const override { return {}; }
  Status Freeze(const Box& box) override { return Call("freeze", box); }
  Status Thaw(const Box& box) override { return Call("thaw", box); }
  Result<BoxStats> Stats(const Box& box) override {
    SBX_RETURN_IF_ERROR(Call("stats", box));
    return BoxStats{};
  }
  Result<UniqueFd> OpenSocket(const Box& box, int, int) override {
    return Status::Error(name_ + " " + box.id, ENOTSUP);
  }
  std::optional<std::string> AgentExit(const Box&) override { return std::nullopt; }
  Status Destroy(const Box& box) override {
    boxes.erase(box.id);
    return Call("destroy", box);
  }
  Result<int> ReapOrphans(const std::string&) override { return 1; }
  Result<Box> Adopt(const std::string& id) override {
    if (!boxes.count(id)) return Status::Error("adopt " + id + ": open owner", ENOENT);
    Box b;
    b.id = id;
    return b;
  }
  Result<std::vector<std::string>> ListBoxes() override {
    return std::vector<std::string>(boxes.begin(), boxes.end());
  }

  std::set<std::string> boxes;
  std::vector<std::string> calls;

 private:
  Status Call(const std::string& what, const Box& box) {
    calls.push_back(what + " " + box.id);
    return {};
  }
  std::string name_;
};

TEST(RouterTest, EachCallReachesTheBoxsOwnRuntime) {
  Recording native("native");
  auto gv = std::make_unique<Recording>("gvisor");
  Recording* gvisor = gv.get();
  Router r(native);
  r.Add("gvisor", std::move(gv));
  BoxSpec a, b;
  a.id = "a";
  b.id = "b";
  b.runtime = "gvisor";
  auto ba = r.Create(a), bb = r.Create(b);
  ASSERT_TRUE(ba.ok() && bb.ok());
  EXPECT_EQ(ba->runtime, "native");
  EXPECT_EQ(bb->runtime, "gvisor");
  EXPECT_TRUE(native.boxes.count("a") && gvisor->boxes.count("b"));
  ASSERT_TRUE(r.Freeze(*bb).ok());
  EXPECT_EQ(gvisor->calls, std::vector<std::string>{"freeze b"});
  EXPECT_TRUE(native.calls.empty());
  // Adopted boxes say whose they are; every runtime's boxes are listed and reaped.
  auto adopted = r.Adopt("b");
  ASSERT_TRUE(adopted.ok());
  EXPECT_EQ(adopted->runtime, "gvisor");
  EXPECT_EQ(r.Adopt("nobody").status().err(), ENOENT);
  EXPECT_EQ(r.ListBoxes()->size(), 2u);
  EXPECT_EQ(*r.ReapOrphans("serve"), 2);
  // A box known by its id alone is destroyed wherever it is.
  ASSERT_TRUE(r.Destroy(Box{"b"}).ok());
  EXPECT_FALSE(gvisor->boxes.count("b"));
  EXPECT_TRUE(native.boxes.count("a"));
}

TEST(RouterTest, AnUnavailableRuntimeIsRefusedWithItsReasonNeverReplaced) {
  Recording native("native");
  Router r(native);
  r.SetUnavailable("gvisor", "runsc is not installed");
  BoxSpec spec;
  spec.id = "x";
  spec.runtime = "gvisor";
  auto made = r.Create(spec);
  EXPECT_EQ(made.status().err(), ENOTSUP);
  EXPECT_NE(made.status().message().find("runsc is not installed"), std::string::npos);
  EXPECT_TRUE(native.boxes.empty()) << "fell back to native";
  EXPECT_EQ(r.CanCreate("vm").err(), ENOTSUP);
  EXPECT_EQ(r.CanCreate("docker").err(), EINVAL);
  EXPECT_NE(r.CanCreate("docker").message().find("native, runc, gvisor, vm"), std::string::npos);
  EXPECT_TRUE(r.CanCreate("").ok());
  EXPECT_TRUE(r.CanCreate("native").ok());
  auto list = r.Runtimes();
  ASSERT_EQ(list.size(), 4u);
  EXPECT_EQ(list[0].name, "native");
  EXPECT_TRUE(list[0].available);
  EXPECT_EQ(list[2].name, "gvisor");
  EXPECT_FALSE(list[2].available);
  EXPECT_EQ(list[2].why, "runsc is not installed");
}

}  // namespace
}  // namespace sbx::runtime
