#include "sandbox/net_slot_pool.h"

namespace sbx::sandbox {

Result<std::unique_ptr<StoreNetSlotPool>> StoreNetSlotPool::Make(store::Store& store,
                                                                 const network::Cidr& subnet,
                                                                 const std::string& scope) {
  Result<int> slots = network::SlotCount(subnet);
  if (!slots.ok()) return slots.status();
  for (char c : scope)
    if (c < 'a' || c > 'z') return Status::Error("network slot scope '" + scope + "'", EINVAL);
  return std::unique_ptr<StoreNetSlotPool>(
      new StoreNetSlotPool(store, subnet, *slots, scope.empty() ? "" : scope + ":"));
}

Result<int> StoreNetSlotPool::Acquire(const std::string& box_id) {
  Result<int64_t> slot = store_.AcquireNetSlot(Holder(box_id), slots_);
  if (!slot.ok()) return slot.status();
  return static_cast<int>(*slot);
}

Status StoreNetSlotPool::Release(const std::string& box_id) {
  return store_.ReleaseNetSlot(Holder(box_id));
}

Result<std::vector<std::pair<std::string, int>>> StoreNetSlotPool::Holders() {
  auto slots = store_.ListNetSlots();
  if (!slots.ok()) return slots.status();
  std::vector<std::pair<std::string, int>> out;
  for (const auto& s : *slots) {
    // Box ids are [a-z0-9-]: a ':' is a scope's.
    bool mine =
        prefix_.empty() ? s.box_id.find(':') == std::string::npos : s.box_id.rfind(prefix_, 0) == 0;
    if (mine) out.emplace_back(s.box_id.substr(prefix_.size()), static_cast<int>(s.slot));
  }
  return out;
}

}  // namespace sbx::sandbox
