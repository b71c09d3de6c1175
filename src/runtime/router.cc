#include "runtime/router.h"

#include <cerrno>
#include <tuple>
#include <utility>

namespace sbx::runtime {

Router::Router(Runtime& native) {
  for (const char* name : kRuntimeNames) slots_.push_back(Slot{name, nullptr, nullptr, ""});
  slots_[0].runtime = &native;
  for (size_t i = 1; i < slots_.size(); ++i)
    slots_[i].why = "this sbx serve was started without it";
}

void Router::Add(const std::string& name, std::unique_ptr<Runtime> runtime) {
  Slot* s = Find(name);
  if (s == nullptr || s == &slots_[0]) return;
  s->owned = std::move(runtime);
  s->runtime = s->owned.get();
  s->why.clear();
}

void Router::SetUnavailable(const std::string& name, const std::string& why) {
  Slot* s = Find(name);
  if (s == nullptr || s == &slots_[0]) return;
  s->owned.reset();
  s->runtime = nullptr;
  s->why = why;
}

std::vector<RuntimeInfo> Router::Runtimes() const {
  std::vector<RuntimeInfo> out;
  for (const auto& s : slots_) {
    RuntimeInfo info{s.name, s.runtime != nullptr, s.why, "", ""};
    if (s.runtime != nullptr)
      std::tie(info.accelerator, info.accelerator_why) = s.runtime->Accelerator();
    out.push_back(std::move(info));
  }
  return out;
}

Router::Slot* Router::Find(const std::string& name) {
  for (auto& s : slots_)
    if (s.name == name) return &s;
  return nullptr;
}

const Router::Slot* Router::Find(const std::string& name) const {
  for (const auto& s : slots_)
    if (s.name == name) return &s;
  return nullptr;
}

Status Router::CanCreate(const std::string& name) const {
  const Slot* s = Find(name.empty() ? slots_[0].name : name);
  if (s == nullptr) return UnknownRuntime(name);
  if (s->runtime == nullptr)
    return Status::Error("runtime " + s->name + " is not available here: " + s->why, ENOTSUP);
  return {};
}

Runtime& Router::Of(const Box& box) {
  if (const Slot* s = Find(box.runtime); s != nullptr && s->runtime != nullptr) return *s->runtime;
  return *slots_[0].runtime;
}

std::vector<Runtime*> Router::Candidates(const Box& box) {
  std::vector<Runtime*> out;
  for (const auto& s : slots_)
    if (s.runtime != nullptr && (box.runtime.empty() || s.name == box.runtime))
      out.push_back(s.runtime);
  if (out.empty()) out.push_back(slots_[0].runtime);
  return out;
}

Result<Box> Router::Create(const BoxSpec& spec) {
  SBX_RETURN_IF_ERROR(CanCreate(spec.runtime));
  const std::string name = spec.runtime.empty() ? slots_[0].name : spec.runtime;
  auto box = Find(name)->runtime->Create(spec);
  if (box.ok()) box->runtime = name;
  return box;
}

Status Router::Freeze(const Box& box) { return Of(box).Freeze(box); }
Status Router::Thaw(const Box& box) { return Of(box).Thaw(box); }
Result<BoxStats> Router::Stats(const Box& box) { return Of(box).Stats(box); }
Result<uint64_t> Router::OomKills(const Box& box) { return Of(box).OomKills(box); }
Status Router::SetLimits(const Box& box, const Limits& limits) {
  return Of(box).SetLimits(box, limits);
}
Result<UniqueFd> Router::OpenSocket(const Box& box, int domain, int type) {
  return Of(box).OpenSocket(box, domain, type);
}
std::optional<std::string> Router::AgentExit(const Box& box) { return Of(box).AgentExit(box); }
Status Router::DestroyKeepingUpper(const Box& box, const std::string& dest) {
  return Of(box).DestroyKeepingUpper(box, dest);
}
size_t Router::MaxLayers(const Box& box) { return Of(box).MaxLayers(box); }

Status Router::CopyWritableLayer(const Box& box, const std::string& dest, int64_t limit_bytes) {
  return Of(box).CopyWritableLayer(box, dest, limit_bytes);
}

Status Router::SaveMemory(const Box& box, const std::string& dest, bool stop) {
  return Of(box).SaveMemory(box, dest, stop);
}

Result<Box> Router::RestoreMemory(const BoxSpec& spec, const std::string& src) {
  SBX_RETURN_IF_ERROR(CanCreate(spec.runtime));
  const std::string name = spec.runtime.empty() ? slots_[0].name : spec.runtime;
  auto box = Find(name)->runtime->RestoreMemory(spec, src);
  if (box.ok()) box->runtime = name;
  return box;
}

// A box known by its id alone (a record's, after a restart) may be any runtime's: each one's
// Stop and Destroy of an id it has no box of does nothing.
Status Router::Stop(const Box& box) {
  Status first;
  for (Runtime* r : Candidates(box))
    if (Status s = r->Stop(box); !s.ok() && first.ok()) first = s;
  return first;
}

Status Router::Destroy(const Box& box) {
  Status first;
  for (Runtime* r : Candidates(box))
    if (Status s = r->Destroy(box); !s.ok() && first.ok()) first = s;
  return first;
}

Result<int> Router::ReapOrphans(const std::string& owner) {
  int n = 0;
  for (Runtime* r : Candidates(Box{})) {
    auto reaped = r->ReapOrphans(owner);
    if (!reaped.ok()) return reaped.status();
    n += *reaped;
  }
  return n;
}

Result<Box> Router::Adopt(const std::string& id) {
  Status last = Status::Error("adopt " + id + ": no runtime has it", ESRCH);
  for (const auto& s : slots_) {
    if (s.runtime == nullptr) continue;
    auto box = s.runtime->Adopt(id);
    if (box.ok()) {
      box->runtime = s.name;
      return box;
    }
    // Another process holds it, or its files are wrong: that is the answer, not "not here".
    if (box.status().err() != ESRCH && box.status().err() != ENOENT) return box.status();
    last = box.status();
  }
  return last;
}

Result<std::vector<std::string>> Router::ListBoxes() {
  std::vector<std::string> ids;
  for (Runtime* r : Candidates(Box{})) {
    auto some = r->ListBoxes();
    if (!some.ok()) return some.status();
    ids.insert(ids.end(), some->begin(), some->end());
  }
  return ids;
}

}  // namespace sbx::runtime
