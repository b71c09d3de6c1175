// Router: every runtime of this host behind one Runtime. A create goes to the runtime its spec
// names (BoxSpec::runtime; "" is native), every other call to the box's own (Box::runtime, set
// by Create and Adopt). A runtime this host lacks is listed with the reason, and a create that
// names it fails with that reason: never a fallback to another runtime (docs/isolation.md,
// "Runtimes").
//
// Thread-safe once set up: Add and SetUnavailable before the first call, then only reads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/runtime.h"

namespace sbx::runtime {

class Router : public Runtime {
 public:
  // `native` (not owned; must outlive the router) is always there.
  explicit Router(Runtime& native);

  // Runtime `name` (one of kRuntimeNames but native) makes boxes here.
  void Add(const std::string& name, std::unique_ptr<Runtime> runtime);
  // Runtime `name` cannot: `why` says so to whoever asks for it ("runsc is not installed ...").
  void SetUnavailable(const std::string& name, const std::string& why);

  std::vector<RuntimeInfo> Runtimes() const override;
  Status CanCreate(const std::string& name) const override;
  Result<Box> Create(const BoxSpec& spec) override;
  Status Freeze(const Box& box) override;
  Status Thaw(const Box& box) override;
  Result<BoxStats> Stats(const Box& box) override;
  Result<uint64_t> OomKills(const Box& box) override;
  Status SetLimits(const Box& box, const Limits& limits) override;
  Result<UniqueFd> OpenSocket(const Box& box, int domain, int type) override;
  std::optional<std::string> AgentExit(const Box& box) override;
  Status Stop(const Box& box) override;
  Status Destroy(const Box& box) override;
  Status DestroyKeepingUpper(const Box& box, const std::string& dest) override;
  size_t MaxLayers(const Box& box) override;
  Status CopyWritableLayer(const Box& box, const std::string& dest, int64_t limit_bytes) override;
  Status SaveMemory(const Box& box, const std::string& dest, bool stop) override;
  Result<Box> RestoreMemory(const BoxSpec& spec, const std::string& src) override;
  Result<int> ReapOrphans(const std::string& owner) override;
  Result<Box> Adopt(const std::string& id) override;
  Result<std::vector<std::string>> ListBoxes() override;

 private:
  struct Slot {
    std::string name;
    Runtime* runtime = nullptr;  // null: unavailable
    std::unique_ptr<Runtime> owned;
    std::string why;
  };
  Slot* Find(const std::string& name);
  const Slot* Find(const std::string& name) const;
  // The runtime of `box` (native for a Box without one).
  Runtime& Of(const Box& box);
  // The available runtimes: the one of `box` when it names one, else every one.
  std::vector<Runtime*> Candidates(const Box& box);

  std::vector<Slot> slots_;  // one per kRuntimeNames entry, in that order
};

}  // namespace sbx::runtime
