#include "sandbox/net_slot_pool.h"

namespace sbx::sandbox {

Result<std::unique_ptr<StoreNetSlotPool>> StoreNetSlotPool::Make(store::Store& store,
                                                                 const network::Cidr& subnet) {
  Result<int> slots = network::SlotCount(subnet);
  if (!slots.ok()) return slots.status();
  return std::unique_ptr<StoreNetSlotPool>(new StoreNetSlotPool(store, subnet, *slots));
}

Result<int> StoreNetSlotPool::Acquire(const std::string& box_id) {
  Result<int64_t> slot = store_.AcquireNetSlot(box_id, slots_);
  if (!slot.ok()) return slot.status();
  return static_cast<int>(*slot);
}

Status StoreNetSlotPool::Release(const std::string& box_id) {
  return store_.ReleaseNetSlot(box_id);
}

Result<std::vector<std::pair<std::string, int>>> StoreNetSlotPool::Holders() {
  auto slots = store_.ListNetSlots();
  if (!slots.ok()) return slots.status();
  std::vector<std::pair<std::string, int>> out;
  for (const auto& s : *slots) out.emplace_back(s.box_id, static_cast<int>(s.slot));
  return out;
}

}  // namespace sbx::sandbox
